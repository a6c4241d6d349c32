"""Hybrid-model trees: SGLang 0.5.23's unified radix tree with an SWA or a Mamba
component beside FULL (docs/HYBRID.md): the device tier of both, the host tier of
(FULL, MAMBA) under write_back.

* ``core.py``: the tree core and the FULL component (ids, clock, splits, the device
  leaf set, path locks, FULL leaf eviction, the eviction driver, leaf deletion);
* ``swa.py``: ``SWATree``, components ``(FULL, SWA)``;
* ``mamba.py``: ``MambaTree``, components ``(FULL, MAMBA)``;
* ``replay.py``: hybrid op-traces (docs/HYBRID.md §6);
* ``replica.py``: a hybrid tree as one TP rank's replica in the engine, and the
  engine's hybrid admission and allocation hooks (docs/HYBRID.md §10).
"""

from sim.hybrid.core import (  # noqa: F401
    HybridEviction,
    HybridInsert,
    HybridInvariantError,
    HybridMatch,
    HybridTree,
    HybridTreeError,
    LockReceipt,
)
from sim.hybrid.mamba import MambaTree  # noqa: F401
from sim.hybrid.swa import SWATree  # noqa: F401
