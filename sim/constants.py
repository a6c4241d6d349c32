"""Every constant taken from SGLang, in one place, each with its source.

Sources are SGLang 0.5.23 (the wheel that contains PR #33777) as paraphrased in
shared/reference/hicache-semantics.md (cited below as "sem §x").
"""

# Reclaim digest: `(d * 1000003 + id + 1) & (2**42 - 1)`.
# unified_tree_core.py `_RECLAIM_DIGEST_MASK` and the multiplier (sem §4.4).
DIGEST_MULTIPLIER = 1000003
DIGEST_MASK = (1 << 42) - 1  # 4398046511103

# Rust core digest event: (handle + 1) * 3 + component_index, FULL index 0 (sem §4.6).
RUST_COMPONENT_TYPES = 3
RUST_FULL_COMPONENT_INDEX = 0

# Logical clock: a process-global float64 starting at 1.0, +1.0 per draw (sem §1.4).
CLOCK_START = 1.0
# match_prefix stamps the ancestor k levels above best_match_node with t - k * 1e-5 (sem §1.4).
MATCH_ANCESTOR_STEP = 0.00001

# reset() consumes 1 (root) + 4 per component (device and host LRU head/tail
# sentinels) node ids in the Python core (sem §1.3). FULL-only: first real node is 5.
SENTINEL_IDS_PER_COMPONENT = 4

# Default `load_back_threshold` of the HiCache controller: minimum FULL tokens for
# a load-back (sem §3.6, §7).
LOAD_BACK_THRESHOLD = 10

# Write-through hit thresholds: 1 for write_through, 2 otherwise (sem §7).
WRITE_THROUGH_THRESHOLD = {"write_through": 1, "write_through_selective": 2}

# --hicache-ratio resolves to 2.0 in cache mode (sem §7).
HICACHE_RATIO_DEFAULT = 2.0
# Host pool geometry: pages = size // page_size + 1 (one extra page, sem §6.2).
HOST_POOL_EXTRA_PAGES = 1

# Layer-done ring of the load path: LayerDoneCounter.num_counters = 3 (sem §6.4).
LOAD_LAYER_RING = 3
# page_first D->H staging buffer: at most 64 pages per chunk (sem §6.3).
STAGING_MAX_PAGES = 64

# CPU cost of one reclaim-map entry visit per pass, measured with the real method:
# 0.3-0.5 us (sem §9.1). The midpoint is the default charge.
RECLAIM_SCAN_SECONDS_PER_ENTRY = 0.4e-6

# Assertion text of the per-step digest check (sem §5.2).
DIGEST_MISMATCH_MESSAGE = "write_back duplicate-reclaim victims diverged across PP/TP ranks"

# SGLANG_HICACHE_SKIP_HOST_DUPLICATE_RECLAIM truthy spellings (sem §7).
SKIP_RECLAIM_TRUE_VALUES = ("true", "1", "yes", "y")

# --hicache-size is in GB of 1e9 bytes: host size = floor(GB * 1e9 / size_per_token) (sem §6.2).
HICACHE_SIZE_BYTES_PER_GB = 10**9
