"""SGLang 0.5.23's unified radix tree, one TP rank's replica (docs/ARCHITECTURE.md, "Tree").

* ``core.py``: what every tree shares: node ids, the logical clock, the page-wise key
  comparison, paths, the event record (``TreeCore``);
* ``full.py``: ``Tree``, the tree with the FULL component only, on device and host:
  the hot path of every FULL simulation (shared/reference/hicache-semantics.md);
* ``hybrid.py``: ``HybridTree``, the core of a tree with FULL and one more
  component (docs/HYBRID.md), whose nodes are ``hnode.py``'s; it holds the
  component objects of ``components/``: ``base.py`` (``TreeComponent``),
  ``full.py`` (``FullComponent``), ``swa.py`` (``SWAComponent``; ``SWATree``) and
  ``mamba.py`` (``MambaComponent``; ``MambaTree``);
* ``results.py``: the result object each public op returns.
"""

from sim.errors import InvariantError, TreeError  # noqa: F401
from sim.tree.core import Stats  # noqa: F401
from sim.tree.full import (  # noqa: F401
    ID_SCHEMES,
    RUST_ID_SCHEMES,
    HostLock,
    LoadBack,
    Node,
    PendingWrite,
    Tree,
    id_scheme,
)
# every op's result type (the hybrid trees' too: sim.tree.results)
from sim.tree.results import NO_HOST_EVICTION, Backup, Eviction, HostEviction  # noqa: F401
from sim.tree.results import HostInsert, Insert, LoadResult, Match  # noqa: F401
