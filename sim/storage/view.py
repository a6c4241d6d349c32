"""One rank's view of its storage backend: which page keys it holds (docs/STORAGE.md §1
steps 2 and 6, §7 hook 2).

SGLang keys a page by a hash chain over the request's pages
(``get_storage_hash_str(token_ids, last_hash, page_size)``: each page's key hashes its
tokens with the previous page's key), so a key names the page *and its whole prefix*.
Each TP rank writes its own shard under its own keys and asks only its own backend
(``batch_exists``: the index of the first missing key, sim_storage.py), which is why
the ranks' hits can differ and are MIN-reduced (``collectives.min_hits``).

Here a page key is the same kind of chain over the tree's units (``page_keys``); with
the engine's prefix-unique unit ids the unit itself would do, the chain makes any key
list safe. Units are ints or tuples of ints (the tree's units), which Python hashes
identically in every process (only str and bytes hashing is seeded), so the keys are
deterministic.

``capacity_pages`` (None: unbounded, as sim_storage.py, whose ``SimHiCacheStorage``
keeps every key in a set) bounds the pages a rank holds; a finished write that would
overflow it evicts the least recently written or read pages first, one at a time, until
it fits. What SGLang 0.5.23's backends do:

* ``file`` (``storage/file/lru_file_evictor.py``, ``LRUFileEvictor``): an LRU over the
  rank's own files; ``set`` of a present key and a read hit (``get``) refresh it
  (``touch``), ``exists`` does not. With ``max_size`` set, a write that would exceed the
  cap evicts down to ``eviction_ratio`` (default 0.9) of it first. The order here is
  that one; the batch down to 90% is not modelled (evict-to-fit instead).
* ``mooncake`` (``storage/mooncake_store/mooncake_store.py``): each rank contributes
  ``global_segment_size // (tp_size * pp_size)`` bytes to a pooled store whose master
  (outside SGLang) evicts a share of objects at a high watermark. Neither the order nor
  the pooling across ranks is in SGLang's code: a per-rank LRU is an **assumption**.
* ``sim``: unbounded.

A write becomes visible only when the caller says it finished (``write``), as a
``batch_set`` adds its keys after its transfer; the engine calls ``read`` with the
pages a prefetch transfer landed.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Sequence


def capacity_pages(capacity_gb: float, bytes_per_token: int, page_size: int) -> int:
    """Whole pages of ``page_size`` tokens in ``capacity_gb`` GB (1e9 bytes) of one rank's
    KV shard (``bytes_per_token`` per rank). The epsilon keeps a size given in pages on
    its page."""
    return int(capacity_gb * 1e9 / (bytes_per_token * page_size) + 1e-6)


def page_keys(units: Sequence, parent_key: int = 0) -> list[int]:
    """The storage key of each page of ``units`` after a prefix whose last key is
    ``parent_key`` (0 at the root): ``key_i = hash((key_{i-1}, unit_i))``."""
    out = []
    k = parent_key
    for u in units:
        k = hash((k, u))
        out.append(k)
    return out


class StorageView:
    """The page keys one rank's storage holds."""

    __slots__ = ("capacity_pages", "_keys", "evicted")

    def __init__(self, capacity_pages: int | None = None):
        if capacity_pages is not None and capacity_pages < 0:
            raise ValueError("capacity_pages must be >= 0")
        self.capacity_pages = capacity_pages
        # recency order matters only to a bounded view's evictions; an unbounded one
        # keeps a set (one C-level update per write)
        self._keys = OrderedDict() if capacity_pages is not None else set()
        self.evicted = 0  # pages evicted for capacity (a counter for metrics)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key) -> bool:
        return key in self._keys

    def copy(self) -> "StorageView":
        new = StorageView(self.capacity_pages)
        new._keys = type(self._keys)(self._keys)
        new.evicted = self.evicted
        return new

    def write(self, keys: Iterable[int]) -> None:
        """A finished storage write of these pages (``batch_set``)."""
        ks = self._keys
        cap = self.capacity_pages
        if cap is None:
            ks.update(keys)  # unbounded: recency is never read
            return
        for k in keys:
            if k in ks:
                ks.move_to_end(k)
            else:
                ks[k] = None
        if cap is not None:
            while len(ks) > cap:
                ks.popitem(last=False)
                self.evicted += 1

    def exists(self, keys: Sequence[int]) -> int:
        """``batch_exists``: how many leading pages of ``keys`` this rank holds (the
        index of the first missing one). A query does not refresh recency."""
        ks = self._keys
        for i, k in enumerate(keys):
            if k not in ks:
                return i
        return len(keys)

    def read(self, keys: Iterable[int]) -> None:
        """A finished storage read of these pages refreshes their recency (only read
        by a bounded view's evictions)."""
        if self.capacity_pages is None:
            return
        ks = self._keys
        for k in keys:
            if k in ks:
                ks.move_to_end(k)

    def drop(self, keys: Iterable[int]) -> None:
        """Pages lost on this rank (a fault: a backend that lost or never stored them)."""
        ks = self._keys
        if self.capacity_pages is None:
            ks.difference_update(keys)
            return
        for k in keys:
            ks.pop(k, None)


def rank_hits(views: Sequence[StorageView], keys: Sequence[int], page_size: int) -> list[int]:
    """Each rank's own hit in tokens, before the MIN all_reduce (``collectives.min_hits``)."""
    return [v.exists(keys) * page_size for v in views]
