"""The storage tier's cross-rank collectives (docs/STORAGE.md §5).

* The MIN all_reduce of prefetch hits: every rank queries its own storage view and
  all ranks use the smallest hit, so one rank that misses cuts the hit for all
  (``UnifiedRadixCache.query_storage_hit_length``: MIN over the attention TP group,
  then ``hit -= hit % page_size``; ``HybridCacheController._sync_prefetch_hit_query``:
  one MIN collective of ``[hit] + per-pool page verdicts`` for an issued prefetch;
  ``_reduce_prefetch_ack``: MIN of per-pool completion counts).
* The per-step sync vector (``UnifiedRadixCache._sync_hicache_ready_counts``):
  ``[write_acks, load_acks, *storage_queue_sizes, digest, -digest]`` as int64,
  MIN-reduced over the TP group; with storage on, the queue sizes are
  ``prefetch_hit_queue``, ``ack_prefetch_queue``, ``ack_backup_queue``,
  ``host_mem_release_queue`` and one ``extra_host_mem_release_queues[pool]`` per extra
  host pool, in that order. Each rank then drains exactly the MIN of every queue, so
  ranks stay in lockstep; ``[digest, -digest]`` reduces to ``[min, -max]`` and the
  assert ``digest == min == max`` is the reclaim-divergence check.
"""

from __future__ import annotations

from typing import Sequence

from sim import constants as C


def min_hits(per_rank_hits: Sequence[int], page_size: int = 1, *, align: bool = True) -> int:
    """What every rank uses for a storage hit: the MIN over the ranks' own hits
    (tokens). ``align`` (``query_storage_hit_length``) then drops a trailing partial
    page; the issued prefetch's hits are already whole pages
    (``kv_hit_pages * page_size``), where ``align`` changes nothing."""
    if not per_rank_hits:
        raise ValueError("min_hits needs at least one rank")
    hit = min(per_rank_hits)
    if align:
        hit -= hit % page_size
    return hit


def storage_queue_slots(enable_storage: bool, extra_pools: Sequence[str] = ()) -> int:
    """How many storage queue sizes the vector carries: 4 plus one per extra host
    pool with storage on, 0 without (``extra_pool_names`` is empty then)."""
    return len(C.SYNC_STORAGE_QUEUES) + len(extra_pools) if enable_storage else 0


def sync_vector(write_acks: int, load_acks: int, digest: int, *,
                storage_queues: Sequence[int] | None = None,
                extra_release: Sequence[int] = (), placeholder: bool = False) -> list[int]:
    """One rank's ``ready_counts`` vector, in ``_sync_hicache_ready_counts``'s order.

    ``storage_queues``: ``(prefetch_hit, ack_prefetch, ack_backup, host_mem_release)``
    queue sizes, or None with storage off (the vector is then 4 long);
    ``extra_release``: one size per extra host pool (storage on only).
    ``placeholder``: a PP rank > 0 in cache mode (or a rank without a controller),
    which sends zeros shaped like PP0's vector: ``write_acks = load_acks = 0`` and
    ``(0,) * (4 + extras)``; the digest pair is still its own."""
    if storage_queues is not None and len(storage_queues) != len(C.SYNC_STORAGE_QUEUES):
        raise ValueError(f"storage_queues has {len(storage_queues)} sizes; expected "
                         f"{len(C.SYNC_STORAGE_QUEUES)} ({', '.join(C.SYNC_STORAGE_QUEUES)})")
    if storage_queues is None and extra_release:
        raise ValueError("extra_release sizes need storage on (storage_queues)")
    if placeholder:
        write_acks = load_acks = 0
        queues = (0,) * (len(storage_queues) + len(extra_release)) if storage_queues is not None else ()
    else:
        queues = (*storage_queues, *extra_release) if storage_queues is not None else ()
    return [int(write_acks), int(load_acks), *map(int, queues), int(digest), -int(digest)]


def all_reduce_min(vectors: Sequence[Sequence[int]]) -> list[int]:
    """Element-wise MIN over the ranks' vectors (``torch.distributed.ReduceOp.MIN``)."""
    if not vectors:
        raise ValueError("all_reduce_min needs at least one rank")
    n = len(vectors[0])
    if any(len(v) != n for v in vectors):
        # SGLang would hang or fail in the collective: every rank must build the same shape.
        raise ValueError("sync vectors of different lengths across ranks")
    return [min(col) for col in zip(*vectors)]


def unpack_sync_vector(reduced: Sequence[int]) -> tuple[int, int, tuple[int, ...], bool]:
    """``(write_acks, load_acks, storage_queue_sizes, digests_agree)`` from a reduced
    vector, as ``_sync_hicache_ready_counts`` returns it (``count_values[0]``,
    ``[1]``, ``tuple(count_values[2:-2])``) plus its assertion's verdict
    (``digest == count_values[-2] == -count_values[-1]`` holds on every rank iff
    ``min == max``)."""
    values = list(map(int, reduced))
    return values[0], values[1], tuple(values[2:-2]), values[-2] == -values[-1]


def unwritten_ranks(tp: int, attn_cp_size: int, rank_replicated: bool) -> frozenset[int]:
    """The TP ranks whose storage shard no rank writes, so whose ``batch_exists``
    always misses (and, through the MIN of hits, every rank's hit is 0).

    SGLang 0.5.23's writer choice (``HiCacheStorageConfig.is_storage_writer``,
    mem_cache/hicache_storage.py; ``HiCacheController.backup_skip`` /
    ``backup_thread_func``, managers/cache_controller.py): a rank writes unless its
    KV is rank-replicated (MLA, ``is_mla_model``) and its ``tp_rank`` is not the DCP
    rank (0 without DCP). ``tp_rank`` is the global ``parallel.tp_rank``
    (``_generate_storage_config``; the attention-TP rank only under DP attention).
    Keys: non-replicated KV is keyed per TP rank (``tp_config_suffix``); replicated KV
    once per attention-CP coordinate (``config_suffix`` with ``_cp{attn_cp_rank}``,
    as the file backend builds it), shared by that coordinate's attention-TP ranks.
    Ranks are laid out CP-major: ``attn_cp_rank = tp_rank // attn_tp_size``
    (distributed/parallel_state.py ``initialize_model_parallel``). So under attention
    CP an MLA model has one writer, global rank 0, and every CP coordinate but 0 reads
    a shard nobody wrote: the fault sglang PR #37149 (writer from ``attn_tp_rank``,
    not in 0.5.23) addresses."""
    if tp < 1 or attn_cp_size < 1 or tp % attn_cp_size:
        raise ValueError("attn_cp_size must divide tp")
    if not rank_replicated or attn_cp_size == 1:
        return frozenset()
    attn_tp = tp // attn_cp_size
    return frozenset(r for r in range(tp) if r // attn_tp != 0)
