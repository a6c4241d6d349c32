"""Hybrid-model trees: SGLang 0.5.23's unified radix tree with an SWA or a Mamba
component beside FULL (docs/HYBRID.md). Device tier only for now.

* ``core.py``: the tree core and the FULL component (ids, clock, splits, the device
  leaf set, path locks, FULL leaf eviction, the eviction driver, leaf deletion);
* ``swa.py``: ``SWATree``, components ``(FULL, SWA)``;
* ``mamba.py``: ``MambaTree``, components ``(FULL, MAMBA)``;
* ``replay.py``: hybrid op-traces (docs/HYBRID.md §6).
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
