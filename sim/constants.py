"""Every constant taken from SGLang, in one place, each with its source.

Sources are SGLang 0.5.23 (the wheel that contains PR #33777) as paraphrased in
shared/reference/hicache-semantics.md (cited below as "sem §x").
"""

# Reclaim digest: `(d * 1000003 + id + 1) & (2**42 - 1)`.
# unified_tree_core.py `_RECLAIM_DIGEST_MASK` and the multiplier (sem §4.4).
DIGEST_MULTIPLIER = 1000003
DIGEST_MASK = (1 << 42) - 1  # 4398046511103

# Rust core digest event: (handle + 1) * 3 + component_index, FULL index 0 (sem §4.6;
# `release_coexisting_host_value` in rust_tree_core/mem_cache*.so, recovered term by term
# by shared/oracle/rust/digest_terms.py: `3 * (id + 1)` for every FULL reclaim).
RUST_COMPONENT_TYPES = 3
RUST_FULL_COMPONENT_INDEX = 0
# The tree core a server builds: SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND defaults to
# "rust" (unified_cache/tree_core_registry.py select_tree_core_backend), and none of
# `_rust_fallback_reason`'s fallbacks applies to a FULL-only model on Linux.
DEFAULT_TREE_CORE = "rust"
# Rust core handles are per core, with no sentinels: the binding's constructor mints
# root 0 and `RustUnifiedTreeCore.reset` a fresh root ("Node handles are never
# re-minted", rust_tree_core/adapter.py). UnifiedRadixCache.__init__ ends with
# `self.reset()` (-> _reset_full -> tree_core.reset()), so a server's root is 1 and its
# first node 2: one root minted before the live one.
RUST_SERVER_ROOTS_BEFORE = 1

# Logical clock: a process-global float64 starting at 1.0, +1.0 per draw (sem §1.4).
CLOCK_START = 1.0
# match_prefix stamps the ancestor k levels above best_match_node with t - k * 1e-5 (sem §1.4).
MATCH_ANCESTOR_STEP = 0.00001

# reset() consumes 1 (root) + 4 per component (device and host LRU head/tail
# sentinels) node ids in the Python core (sem §1.3). FULL-only: first real node is 5.
SENTINEL_IDS_PER_COMPONENT = 4

# --- Hybrid trees (sim/hybrid, docs/HYBRID.md) ----------------------------------------
# Internal-node cascade-eviction priorities: components/base.py
# TreeComponent.eviction_priority docstring, full.py / swa.py eviction_priority
# (full=2 > swa=1 > mamba=0; every component is 0 on a leaf). Evicting a component
# from an internal node also evicts the node's components of lower or equal priority.
EVICTION_PRIORITY_INTERNAL = {"full": 2, "swa": 1, "mamba": 0}
# SWA window-lock boundary marks come from components/base.py next_component_uuid:
# a process-global counter per component starting at (range index + 1) * 1e14
# (_COMPONENT_UUID_RANGE_SIZE, SWA's range index 0) and incremented before use.
SWA_UUID_START = 1 * 100_000_000_000_000

# --- Hybrid pool sizing (sim/hybrid/pools.py, SGLang 0.5.23) -------------------------
# arg_groups/fields/schedule.py: --swa-full-tokens-ratio falls back to 0.8 (SWA tokens /
# full tokens, whatever the layer counts), --mamba-full-memory-ratio to 0.9 (Mamba
# state memory / full KV memory: kv_cache_configurator.py _handle_max_mamba_cache gives
# the state pool rest * r / (1 + r)).
SWA_FULL_TOKENS_RATIO_DEFAULT = 0.8
MAMBA_FULL_MEMORY_RATIO_DEFAULT = 0.9
# kv_cache_configurator.py: state slots per running request that cap
# max_running_requests (max_mamba_cache_size // ratio, _calculate_mamba_ratio): base 3,
# one less under SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK, which without the extra buffer adds
# it back (MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_BUFFER); with --enable-mamba-extra-buffer
# the tracking slots (allocation_sizing.py get_mamba_tracking_slots: 2 with the overlap
# scheduler, 1 without or lazy) are added.
MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3
MAMBA_CACHE_BASE_RATIO_DROP_ON_SKIP = 1
MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_BUFFER = 1
# Each device pool keeps one padding slot: the Mamba pool (size + 1) states
# (_handle_max_mamba_cache "+1 accounts for each pool's padding slot").
MAMBA_POOL_PADDING_SLOTS = 1

# Default `load_back_threshold` of the HiCache controller: minimum FULL tokens for
# a load-back (unified_radix_cache.py UnifiedRadixCache.init_hicache:
# `self.load_back_threshold = 10`; sem §3.6, §7).
LOAD_BACK_THRESHOLD = 10

# Write-through hit thresholds: 1 for write_through, 2 otherwise (sem §7).
WRITE_THROUGH_THRESHOLD = {"write_through": 1, "write_through_selective": 2}

# --hicache-ratio resolves to 2.0 in cache mode (sem §7).
HICACHE_RATIO_DEFAULT = 2.0
# Host pool geometry: pages = size // page_size + 1 (one extra page, sem §6.2).
HOST_POOL_EXTRA_PAGES = 1

# page_first D->H staging buffer: at most 64 pages per chunk (sem §6.3).
STAGING_MAX_PAGES = 64

# CPU cost of one reclaim-map entry visit per pass, measured with the real method:
# 0.3-0.5 us (sem §9.1). The midpoint is the default charge.
RECLAIM_SCAN_SECONDS_PER_ENTRY = 0.4e-6

# Assertion text of the per-step digest check (sem §5.2).
DIGEST_MISMATCH_MESSAGE = "write_back duplicate-reclaim victims diverged across PP/TP ranks"

# LayerDoneCounter (managers/cache_controller.py): `num_counters = 3` producer slots
# ("extra producer and consumer counters for overlap mode"); `start_loading` takes the
# next one per merged load op (`update_producer`), asserting that the load which last
# used it has finished (its last layer's event).
LAYER_DONE_COUNTERS = 3
PRODUCER_REUSE_MESSAGE = "Producer finish event should be ready before being reused."

# --hicache-size is in GB of 1e9 bytes: host size = floor(GB * 1e9 / size_per_token) (sem §6.2).
HICACHE_SIZE_BYTES_PER_GB = 10**9

# --- Device pool sizing (SGLang 0.5.23) ----------------------------------------------
# KV budget: mem_cache/kv_cache_configurator.py KVCacheConfigurator._profile_available_bytes:
#   rest_memory = available_gpu_memory - pre_model_load_memory * (1 - mem_fraction_static)
# (GiB, from torch.cuda.mem_get_info after / before the weights load), then
# model_executor/pool_configurator.py DefaultPoolConfigurator.calculate_pool_sizes:
#   max_total_num_tokens = available_bytes // cell_size // page_size * page_size.
# The default mem_fraction_static: arg_groups/memory_hook.py handle_gpu_memory_settings
# (the non-post-capture branch; SGLANG_ENABLE_POST_CAPTURE_KV_SIZING defaults to False,
# environ.py), all figures in MiB:
#   reserved = 512 + max(chunked_prefill_size, 2048) * 1.5 + tp * pp / 8 * 1024
#              + reserve_for_graph_mb (decode max_bs * 2, prefill graph len(bs) * 8 or
#                1.5 GiB with MLA), at least 10 GiB on a GPU over 60 GiB;
#   mem_fraction_static = round((gpu_mem - reserved) / gpu_mem, 3)
MEM_FRACTION_BASE_MB = 512
MEM_FRACTION_ACTIVATION_MB_PER_TOKEN = 1.5
MEM_FRACTION_MIN_ACTIVATION_TOKENS = 2048
MEM_FRACTION_TP_MB_PER_8_RANKS = 1024
MEM_FRACTION_DECODE_GRAPH_MB_PER_BS = 2
MEM_FRACTION_PREFILL_GRAPH_MB_PER_BS = 8
MEM_FRACTION_PREFILL_GRAPH_MLA_MB = 1.5 * 1024
MEM_FRACTION_FLOOR_MB = 10 * 1024  # applies when gpu_mem > 60 GiB
MEM_FRACTION_FLOOR_ABOVE_MB = 60 * 1024
# Decode CUDA-graph max batch size by GPU memory (MiB upper bound, tp < 4, tp >= 4),
# memory_hook.handle_gpu_memory_settings; above the last bound: 512.
DECODE_GRAPH_MAX_BS = ((20 * 1024, 8, 8), (35 * 1024, 48, 160), (60 * 1024, 32, 160),
                       (90 * 1024, 256, 512), (160 * 1024, 256, 512))
DECODE_GRAPH_MAX_BS_LARGE = 512
# SGLang's chunked_prefill_size when unset on GPUs of 35-160 GiB (memory_hook).
CHUNKED_PREFILL_DEFAULT = 8192

# --- Host pool sizing (SGLang 0.5.23) ------------------------------------------------
# mem_cache/pool_host/base.py HICACHE_HOST_MEMORY_RESERVE_BYTES: host RAM kept free;
# host_memory_budget_bytes = (available host RAM - reserve) // ranks_per_host, and
# HostKVCache._allocate_host_buffer raises "Not enough host memory available" when a
# rank's pool (size * size_per_token) exceeds it (sem §6.2).
HOST_MEMORY_RESERVE_BYTES = 10 * (1 << 30)
# --hicache-host-memory-fraction default (arg_groups/fields/memory.py); applies only when
# neither --hicache-ratio nor --hicache-size is set (hicache_hook.handle_hicache_ratio_default).
HICACHE_HOST_MEMORY_FRACTION_DEFAULT = 0.8
# mem_cache/hicache_auto_size.py _ALLOCATION_SLACK_FRACTION: the auto-sized ratio is
# min(requested, budget * fraction * (1 - slack) / device_pool_bytes).
HICACHE_AUTO_SIZE_SLACK = 0.05

# --- The scheduler (SGLang 0.5.23 managers/) -----------------------------------------
# schedule_policy.py CLIP_MAX_NEW_TOKENS (env SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION):
# admission's estimate of a request's decode tokens is clipped to this.
CLIP_MAX_NEW_TOKENS = 4096

# kv_cache_configurator.py resolve_max_num_reqs: with no --max-running-requests, the
# running-request cap is token_capacity / context_len * 512, clamped to
# [2048, 4096] (and to token_capacity // 2).
MAX_NUM_REQS_PER_CONTEXT = 512
MAX_NUM_REQS_MIN = 2048
MAX_NUM_REQS_MAX = 4096
# schedule_policy.py IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD / _DEPRIORITIZE_THRESHOLD
# (env vars of those names, default 32), read by `_compute_prefix_matches`: a request
# whose device match is at most the first is matched against the waiting queue's own
# radix tree, and one matching at least the second there is sent to the back.
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32
# --schedule-policy default (arg_groups/fields/schedule.py `schedule_policy`).
SCHEDULE_POLICY_DEFAULT = "fcfs"
# schedule_policy.py WAITING_PREFIX_REFRESH_INTERVAL / WAITING_QUEUE_PREFIX_MATCH_MAX:
# every 32nd calc_priority call touches up to 128 waiting requests' prefixes
# (`_touch_waiting_prefixes`, on while SGLANG_ENABLE_WAITING_PREFIX_REFRESH, default
# True, and the tree's eviction policy is LRU).
WAITING_PREFIX_REFRESH_INTERVAL = 32
WAITING_QUEUE_PREFIX_MATCH_MAX = 128
# environ.py SGLANG_INIT_NEW_TOKEN_RATIO / SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR /
# SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS (scheduler_components/new_token_ratio_tracker.py):
# the running requests' decode-token estimate starts at 0.7 x conservativeness and
# decays to 0.14 of that over 600 decode steps; a retraction re-estimates it.
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
# environ.py SGLANG_RETRACT_DECODE_STEPS: a retraction makes room for this many decode
# steps of every request left (schedule_batch.release_req) and enters the new ratio.
RETRACT_DECODE_STEPS = 20
# arg_groups/fields/schedule.py max_prefill_tokens: extend tokens one prefill batch
# may add (PrefillAdder.rem_input_tokens).
MAX_PREFILL_TOKENS_DEFAULT = 16384

# --- Storage tier (L3; sim/storage, docs/STORAGE.md), SGLang 0.5.23 ------------------
# hybrid_cache/hybrid_cache_controller.py HybridCacheController.parse_storage_backend_extra_config:
# defaults of the keys popped from --hicache-storage-backend-extra-config.
PREFETCH_THRESHOLD_DEFAULT = 256          # tokens; also UnifiedRadixCache.__init__'s value
PREFETCH_TIMEOUT_BASE_S = 1.0             # "prefetch_timeout_base", seconds
PREFETCH_TIMEOUT_PER_KI_TOKEN_S = 0.25    # "prefetch_timeout_per_ki_token", seconds per 1024 tokens
# managers/cache_controller.py attach_storage_backend: cache mode caps the tokens that
# in-flight prefetches reserve at int(0.5 * mem_pool_host.logical_size) ("leave half the
# pool for write-back"); buffer_only at int(HICACHE_LOAD_POOL_USAGE_FRACTION * size).
PREFETCH_CAPACITY_FRACTION_CACHE = 0.5
# arg_groups/fields/memory.py (ServerArgs defaults).
HOST_MEMORY_MODE_DEFAULT = "cache"                 # --hicache-host-memory-mode {cache, buffer_only}
PREFETCH_POLICY_DEFAULT = "timeout"                # --hicache-storage-prefetch-policy
HICACHE_WRITE_POLICY_DEFAULT = "write_through"     # --hicache-write-policy
# arg_groups/hicache_hook.py handle_hicache_ratio_default: --hicache-ratio defaults to
# 1.2 under buffer_only (2.0 in cache mode: HICACHE_RATIO_DEFAULT above).
HICACHE_RATIO_BUFFER_ONLY = 1.2
# mem_cache/storage/sim_storage.py SimHiCacheStorage.__init__: extra_config defaults
# (per scheduler rank; <= 0 GB/s means infinite bandwidth; latency also per exists query).
SIM_STORAGE_WRITE_GBPS = 5.0
SIM_STORAGE_OP_LATENCY_US = 100.0
# unified_radix_cache.py _sync_hicache_ready_counts: with storage on, the sync vector
# carries these four queue sizes (then one per extra host-release pool) between the
# write/load ack counts and the [digest, -digest] pair.
SYNC_STORAGE_QUEUES = ("prefetch_hit", "ack_prefetch", "ack_backup", "host_mem_release")
HICACHE_LOAD_POOL_USAGE_FRACTION = 0.9  # managers/cache_controller.py: buffer_only prefetch cap, fraction of the host pool
# buffer_only's write path (mem_cache/buffer_mode/pipeline.py flush_pending_writes): the
# write staging window is max(HICACHE_WRITE_STAGING_POOL_FRACTION * pool,
# pool - prefetch_tokens_occupied - pool // BUFFER_WRITE_LOADS_MARGIN_DIV) (loads first);
# managers/cache_controller.py HICACHE_WRITE_STAGING_POOL_FRACTION.
HICACHE_WRITE_STAGING_POOL_FRACTION = 0.2
BUFFER_WRITE_LOADS_MARGIN_DIV = 10
# unified_radix_cache.py init_hicache: BufferModePipeline(write_backlog_cap=2 * device
# pool size): queued write intents beyond it are dropped at admission.
BUFFER_WRITE_BACKLOG_FACTOR = 2
# environ.py SGLANG_HICACHE_BUFFER_ANCHOR_LOCK_CAP (0.5): BufferModePipeline.__init__'s
# anchor_lock_cap_tokens = max(0, min(int(0.5 * device pool), device pool - max_context_len)).
BUFFER_ANCHOR_LOCK_CAP = 0.5
# buffer_mode/storage_existence_cache.py HICACHE_EXISTENCE_CACHE_MAX_ENTRIES: page keys
# believed stored, per pool (an LRU).
EXISTENCE_CACHE_MAX_ENTRIES = 512 * 1024
# mem_cache/hicache_storage.py STORAGE_BATCH_SIZE: a prefetch reads (and
# HiCacheController._page_transfer acks) its hit pages 128 at a time; each batch is one
# backend call and one progressive PrefetchAck (completed tokens, MIN-reduced).
STORAGE_BATCH_PAGES = 128

# MLA host dedup (mem_cache/mla_host_dedup.py). The broadcast stages at most
# SGLANG_MLA_DEDUP_CHUNK_TOKENS x layer_num token rows per NCCL broadcast call
# (environ.py SGLANG_MLA_DEDUP_CHUNK_TOKENS = EnvInt(2048);
# MLAHostDedupBroadcaster.__init__ kv_staging, _bcast_layer rows_per_chunk).
MLA_DEDUP_CHUNK_TOKENS = 2048
# Storage backends the dedup tolerates on buffer-less peer ranks
# (mla_host_dedup.py _DEDUP_COMPATIBLE_STORAGE = {None, "", "file"}).
MLA_DEDUP_STORAGE_BACKENDS = (None, "file")

# What every rank logs before os._exit(1) when the rank consensus checker's hashes of a
# drained event batch differ (utils/rank_consensus_checker.py _check_for_consensus:
# "Found rank divergence for {n} events(s)! local hash: ..., events = ...").
RANK_DIVERGENCE_MESSAGE = "Found rank divergence"

# KV cache event media (disaggregation/kv_events.py StorageMedium: GPU = "GPU",
# CPU = "CPU_PINNED"), as BlockStored / BlockRemoved carry them on the wire.
KV_MEDIUM_GPU = "GPU"
KV_MEDIUM_CPU = "CPU_PINNED"

# configs/model_config.py AttentionArch: MLA = auto(), the first member (1); a crash
# dump's ModelConfig pickles the enum as its value.
ATTENTION_ARCH_MLA = 1
