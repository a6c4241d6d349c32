"""The storage tier (L3) of HiCache, as SGLang 0.5.23 runs it: pure pieces the engine
calls (docs/STORAGE.md). None of them keeps time or touches the engine, except
``engine.py``, the tier's process object in a TP group (``StorageEngine``: the
scheduler loop's named storage points and the storage I/O processes).

* ``backends.py``: the cost of one storage op (``sim_storage.py``'s shape:
  ``bytes / bandwidth + op latency``, per rank) and a registry of named backends;
* ``policy.py``: prefetch decisions (threshold, rate limit, stop policies and the
  timeout formula, the storage-hit host allocation) and the host memory modes;
* ``collectives.py``: the MIN all_reduce of prefetch hits and the layout of the
  per-step sync vector with the storage queue sizes (``_sync_hicache_ready_counts``);
* ``prefetch.py``: one replica's in-flight prefetches and storage writes, driving the
  tree (host locks on anchors, staging slots, ``Tree.insert_host``);
* ``view.py``: one rank's storage view (the page keys it holds, ``batch_exists``).
"""

from sim.storage.backends import BACKENDS, StorageBackend, backend  # noqa: F401
from sim.storage.collectives import min_hits, sync_vector, unpack_sync_vector  # noqa: F401
from sim.storage.prefetch import PrefetchBook, PrefetchError  # noqa: F401
from sim.storage.view import StorageView, page_keys, rank_hits  # noqa: F401
