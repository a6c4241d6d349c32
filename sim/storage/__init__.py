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

from sim.lazy import lazy_exports


# The pieces' names, imported on first use (PEP 562): a scenario's validation reads
# ``policy``'s host memory modes, and that should not load the prefetch book and the
# tree under it for every command that only reads a scenario.
_EXPORTS = {
    "BACKENDS": "sim.storage.backends",
    "StorageBackend": "sim.storage.backends",
    "backend": "sim.storage.backends",
    "min_hits": "sim.storage.collectives",
    "sync_vector": "sim.storage.collectives",
    "unpack_sync_vector": "sim.storage.collectives",
    "PrefetchBook": "sim.storage.prefetch",
    "PrefetchError": "sim.storage.prefetch",
    "StorageView": "sim.storage.view",
    "page_keys": "sim.storage.view",
    "rank_hits": "sim.storage.view",
}
__all__ = list(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
