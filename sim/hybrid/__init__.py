"""Hybrid models around SGLang 0.5.23's unified radix tree with an SWA or a Mamba
component beside FULL (docs/HYBRID.md). The trees themselves are in ``sim/tree/``
(``hybrid.py``: the core, holding component objects; ``components/swa.py``:
``SWAComponent``, ``SWATree``; ``components/mamba.py``: ``MambaComponent``,
``MambaTree``); this package re-exports the trees' names.

* ``gen.py``: generated hybrid op-traces;
* ``pools.py``: per-component pool sizing;
* ``replay.py``: hybrid op-traces (docs/HYBRID.md §6);
* ``replica.py``: a hybrid tree as one TP rank's replica in the engine, and the
  engine's hybrid admission and allocation hooks (docs/HYBRID.md §10).
"""

from sim.tree.hybrid import (  # noqa: F401
    HybridInsert,
    HybridInvariantError,
    HybridMatch,
    HybridTree,
    HybridTreeError,
    LockReceipt,
)
from sim.tree.components.mamba import MambaTree  # noqa: F401
from sim.tree.components.swa import SWATree  # noqa: F401
