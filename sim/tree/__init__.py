"""SGLang 0.5.23's unified radix tree, one TP rank's replica (docs/ARCHITECTURE.md, "Tree").

One core, as SGLang's ``UnifiedTreeCore`` is, parameterised by its components:

* ``core.py``: what every tree shares: node ids and their schemes, the logical clock,
  the page-wise key comparison, paths, the device-prefix read, the storage refill,
  the host-policy API (``TreeCore``);
* ``hybrid.py``: ``HybridTree``, the core: splits, the leaf sets, the ledgers, the
  eviction driver, backups, demotes, drops, load-backs and the leaf deletion that
  cascades to every component, on device and host; its nodes are ``hnode.py``'s;
* ``components/``: what the core calls per component: ``full.py``
  (``FullComponent``: FULL's locks and leaf eviction), ``swa.py`` (``SWAComponent``;
  ``SWATree``), ``mamba.py`` (``MambaComponent``; ``MambaTree``) and ``none.py``
  (``NoComponent``: FULL alone), with ``base.py``'s ``TreeComponent``;
* ``full.py``: ``Tree``, the core with FULL alone (``HybridTree(NoComponent())``)
  under the names the FULL engine calls: the hot path of every FULL simulation
  (shared/reference/hicache-semantics.md);
* ``results.py``: the result object each public op returns.
"""

from sim.errors import InvariantError, TreeError  # noqa: F401
from sim.tree.core import ID_SCHEMES, RUST_ID_SCHEMES, Stats, id_scheme  # noqa: F401
from sim.tree.full import Tree  # noqa: F401
from sim.tree.hnode import HNode  # noqa: F401
from sim.tree.hybrid import LoadBack, PendingWrite  # noqa: F401
# every op's result type (sim.tree.results)
from sim.tree.results import NO_HOST_EVICTION, Backup, Eviction, HostEviction  # noqa: F401
from sim.tree.results import HostInsert, HostLockReceipt, Insert, LoadResult, Match  # noqa: F401
