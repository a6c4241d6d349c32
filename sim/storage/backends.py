"""Storage backend cost shapes (docs/STORAGE.md §4).

SGLang 0.5.23 ships a deterministic storage simulator,
``mem_cache/storage/sim_storage.py`` (``SimHiCacheStorage``). Its timing model,
``_sleep_io(num_bytes, gbps)``, is the shape used here for every backend:

    delay = op_latency_s + (num_bytes / (gbps * 1e9) if gbps > 0 else 0)

per call, on the calling rank's backup or prefetch thread, with bandwidth **per
scheduler rank** ("each rank ships its own shard"). Knobs (extra_config):
``sim_write_gbps`` (default 5.0, <= 0 is infinite), ``sim_read_gbps`` (default: the
write figure), ``sim_op_latency_us`` (default 100, charged on ``batch_exists``
queries too, with no bytes). What one call moves: ``batch_set_v1``/``batch_get_v1``
move ``len(host_indices) * size_per_token`` bytes (a get only the hit pages' share),
``batch_exists`` moves none.

The named backends below fill the same two numbers from published figures where
there are any. Every figure says where it is from, and which are assumptions. They
are per rank: a node-level figure is divided by the ranks sharing it (the
``ranks_sharing`` field), since SGLang's ranks each ship their own shard.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim import constants as C


@dataclass(frozen=True)
class StorageBackend:
    """One backend's per-rank cost shape: ``op_latency_us`` per storage call plus
    bytes at ``read_gbps``/``write_gbps`` (GB of 1e9 bytes per second; <= 0 is
    infinite, as in sim_storage.py). ``source``: where the figures come from."""

    name: str
    write_gbps: float
    read_gbps: float
    op_latency_us: float
    source: str
    assumed: bool = False  # True where a figure is our assumption, not published

    def _seconds(self, num_bytes: int, gbps: float) -> float:
        # SimHiCacheStorage._sleep_io: latency first, then bytes / (gbps * 1e9).
        delay = self.op_latency_us * 1e-6
        if gbps > 0:
            delay += num_bytes / (gbps * 1e9)
        return delay

    def write_seconds(self, num_bytes: int) -> float:
        """One storage write call (``batch_set*``) of ``num_bytes`` on one rank."""
        return self._seconds(num_bytes, self.write_gbps)

    def read_seconds(self, num_bytes: int) -> float:
        """One storage read call (``batch_get*``) of ``num_bytes`` on one rank."""
        return self._seconds(num_bytes, self.read_gbps)

    def exists_seconds(self) -> float:
        """One ``batch_exists`` query: the op latency alone (sim_storage.py
        ``batch_exists``: ``_sleep_io(0, read_gbps)``)."""
        return self._seconds(0, self.read_gbps)


def prefetch_batches(hit_pages: int) -> list[int]:
    """Pages per backend call of one prefetch: ``_page_transfer`` walks the hit's
    hashes ``STORAGE_BATCH_SIZE`` (128) at a time, one ``batch_get`` and one
    progressive ack per batch."""
    full, rest = divmod(hit_pages, C.STORAGE_BATCH_PAGES)
    return [C.STORAGE_BATCH_PAGES] * full + ([rest] if rest else [])


def prefetch_read_seconds(b: StorageBackend, hit_pages: int, bytes_per_page: int) -> float:
    """One rank's read time for a prefetch of ``hit_pages``: one call per batch
    (``prefetch_batches``), each ``op latency + bytes / bandwidth``. No loop per page."""
    full, rest = divmod(hit_pages, C.STORAGE_BATCH_PAGES)
    t = full * b.read_seconds(C.STORAGE_BATCH_PAGES * bytes_per_page)
    return t + (b.read_seconds(rest * bytes_per_page) if rest else 0.0)


def sim_backend(extra_config: dict | None = None) -> StorageBackend:
    """SGLang's ``sim`` backend with ``--hicache-storage-backend-extra-config``
    knobs resolved exactly as ``SimHiCacheStorage.__init__`` does."""
    extra = extra_config or {}
    write = float(extra.get("sim_write_gbps", C.SIM_STORAGE_WRITE_GBPS))
    read = float(extra.get("sim_read_gbps", write))
    latency = float(extra.get("sim_op_latency_us", C.SIM_STORAGE_OP_LATENCY_US))
    return StorageBackend("sim", write, read, latency,
                          "sglang 0.5.23 mem_cache/storage/sim_storage.py defaults")


def per_rank(node_gbps: float, ranks_sharing: int) -> float:
    """A node-level (or NIC-level) bandwidth split evenly over the ranks sharing it."""
    if ranks_sharing < 1:
        raise ValueError("ranks_sharing must be >= 1")
    return node_gbps / ranks_sharing


# Published figures (all per-rank derivations assume 8 TP ranks per node sharing the
# node's links evenly; that split is an assumption).
_RANKS = 8
BACKENDS: dict[str, StorageBackend] = {
    "sim": sim_backend(),
    # Mooncake Transfer Engine README / docs (kvcache-ai/Mooncake, "Performance"):
    # 87 GB/s over 4x200 Gbps RoCE and 190 GB/s over 8x400 Gbps RoCE, 40 GB payloads.
    # Per rank: 190 / 8. Latency is an assumption (RDMA round trip plus the store's
    # metadata lookup; no published per-op figure found).
    "mooncake": StorageBackend(
        "mooncake", per_rank(190.0, _RANKS), per_rank(190.0, _RANKS), 50.0,
        "Mooncake Transfer Engine: 190 GB/s on 8x400 Gbps RoCE (README), / 8 ranks; "
        "latency 50 us assumed", assumed=True),
    # 3FS README (deepseek-ai/3FS, "Performance"): KVCache read throughput peaks at
    # 40 GiB/s per client node; write not published for KVCache (assumed = half).
    # Per-op overhead ~1 ms read / ~1.2 ms write measured by maknee.github.io's 3FS
    # performance journal part 3 (third-party microbenchmark).
    "3fs": StorageBackend(
        "3fs", per_rank(40 * 1.073741824 / 2, _RANKS), per_rank(40 * 1.073741824, _RANKS), 1000.0,
        "3FS README: KVCache reads peak at 40 GiB/s per client node, / 8 ranks; write "
        "assumed half; ~1 ms per op (maknee.github.io 3FS journal, part 3)", assumed=True),
    # NIXL: no published throughput for SGLang's HiCache NIXL backend found; the figures
    # assume one 400 Gbps NIC per node (50 GB/s) shared by 8 ranks, 20 us per op.
    "nixl": StorageBackend(
        "nixl", per_rank(50.0, _RANKS), per_rank(50.0, _RANKS), 20.0,
        "assumed: one 400 Gbps NIC per node (50 GB/s) / 8 ranks, 20 us per op", assumed=True),
    # file (mem_cache/storage/file/): a local filesystem. Assumed: one Gen4 NVMe SSD
    # (~7 GB/s read, ~5 GB/s write sequential, vendor class figures) shared by 8 ranks,
    # 100 us per op (a syscall plus a page-cache miss).
    "file": StorageBackend(
        "file", per_rank(5.0, _RANKS), per_rank(7.0, _RANKS), 100.0,
        "assumed: one Gen4 NVMe SSD (7 GB/s read, 5 GB/s write) / 8 ranks, 100 us per op",
        assumed=True),
}


def backend(name: str, **overrides) -> StorageBackend:
    """A registered backend by name, with field overrides (``write_gbps=...``)."""
    try:
        base = BACKENDS[name]
    except KeyError:
        raise KeyError(f"unknown storage backend {name!r}; expected one of "
                       f"{', '.join(sorted(BACKENDS))}") from None
    if not overrides:
        return base
    fields = {**base.__dict__, **overrides}
    return StorageBackend(**fields)
