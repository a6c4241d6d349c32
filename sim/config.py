"""Engine configuration: plain, fully resolved numbers (no YAML, no units).

``sim.scenario`` validates what users write; ``sim.resolve.from_scenario`` resolves it
into these dataclasses, which are all the engine reads. This module imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim import constants as C
from sim.collectives import DEFAULT_TIMEOUT_S
from sim.constants import LOAD_BACK_THRESHOLD, MAX_PREFILL_TOKENS_DEFAULT
from sim.constants import CLIP_MAX_NEW_TOKENS, SCHEDULE_POLICY_DEFAULT

REPLICAS = ("shared", "eager")


@dataclass
class JitterConfig:
    """Rank-specific perturbations and faults, all seeded; the defaults inject nothing.

    Every draw is keyed by (seed, rank, event) (``sim.jitter``), so a value never
    depends on which ranks happen to share a replica.
    """

    # Extra completion delay of transfer acks: distribution name (sim.workloads.dists),
    # its params, the ranks delayed (None: every rank) and which acks.
    ack_delay: str = "none"
    ack_delay_params: dict = field(default_factory=dict)
    ack_delay_ranks: tuple[int, ...] | None = None
    ack_delay_acks: str = "both"  # write, load or both
    # A host allocation fails on these ranks with this probability, per attempt.
    host_alloc_failure_p: float = 0.0
    host_alloc_failure_ranks: tuple[int, ...] = ()
    # Per-rank pool capacity deltas, in tokens.
    host_capacity_skew: dict[int, int] = field(default_factory=dict)
    device_capacity_skew: dict[int, int] = field(default_factory=dict)
    # Device frees that land late on some ranks: a finished request's private device
    # KV is returned to that rank's allocator this many seconds later.
    device_free_delay: str = "none"
    device_free_delay_params: dict = field(default_factory=dict)
    device_free_delay_ranks: tuple[int, ...] = ()
    # A rank builds ``id_drift_extra`` extra node objects before request ``id_drift_after``.
    id_drift_rank: int | None = None
    id_drift_extra: int = 1
    id_drift_after: int = 0
    # Per-rank admission order perturbation (a bug mode).
    request_order_ranks: tuple[int, ...] = ()
    request_order_swap_p: float = 0.0
    request_order_window: int = 2
    # L3 storage faults: pages missing on some ranks' storage, or a failing backend.
    storage_miss_p: float = 0.0
    storage_miss_ranks: tuple[int, ...] = ()
    storage_fail_ranks: tuple[int, ...] = ()
    # A slow storage backend on some ranks: each storage call costs ``factor`` times
    # the backend's figure plus a drawn extra delay (distribution name and params).
    storage_latency_factor: float = 1.0
    storage_latency: str = "none"
    storage_latency_params: dict = field(default_factory=dict)
    storage_latency_ranks: tuple[int, ...] = ()
    seed: int | None = None  # the jitter draws' own seed; None: the run's seed

    def physical_ranks(self, tp: int) -> list[int]:
        """Ranks whose own hardware state differs from t=0 (pool sizes, a failing
        allocator, late frees): they get their own replica from the start."""
        out = set(self.host_capacity_skew) | set(self.device_capacity_skew)
        if self.host_alloc_failure_p > 0:
            out |= set(self.host_alloc_failure_ranks)
        if self.device_free_delay != "none":
            out |= set(self.device_free_delay_ranks)
        if self.storage_miss_p > 0:
            out |= set(self.storage_miss_ranks)
        out |= set(self.storage_fail_ranks)
        out |= set(self.storage_latency_ranks)
        return sorted(r for r in out if 0 <= r < tp)


@dataclass
class StorageConfig:
    """The L3 tier (docs/STORAGE.md), resolved: a per-rank backend cost shape and
    SGLang's prefetch knobs."""

    backend: object = None  # sim.storage.backends.StorageBackend
    prefetch_policy: str = C.PREFETCH_POLICY_DEFAULT
    prefetch_threshold: int = C.PREFETCH_THRESHOLD_DEFAULT
    prefetch_timeout_base: float = C.PREFETCH_TIMEOUT_BASE_S
    prefetch_timeout_per_ki_token: float = C.PREFETCH_TIMEOUT_PER_KI_TOKEN_S
    # Ranks whose storage shard nobody writes (attention CP with MLA KV):
    # sim.storage.collectives.unwritten_ranks.
    unwritten_ranks: frozenset = frozenset()
    # Pages each rank's storage holds (storage.capacity_gb / bytes per page); None:
    # unbounded (sim_storage.py keeps every key).
    capacity_pages: int | None = None
    # --hicache-host-memory-mode, resolved (sim.storage.policy.resolve_host_mode):
    # "cache" or "buffer_only" (the host pool is a staging buffer, docs/STORAGE.md §9).
    host_memory_mode: str = "cache"
    # buffer_only: the largest request context (tokens), for the anchor-lock cap
    # (BufferModePipeline.__init__: device pool - max_context_len).
    max_context_len: int = 0


@dataclass
class HybridConfig:
    """A hybrid model's tree (docs/HYBRID.md §10), resolved: the component, its pool,
    its host pool, and a Mamba state's transfer size in FULL tokens."""

    kind: str                  # "mamba" (components FULL, MAMBA) or "swa" (FULL, SWA)
    aux_capacity: int          # Mamba state slots, or SWA tokens (device)
    aux_host: int = 0          # host Mamba state slots or SWA tokens (0: no host tier)
    host_tokens: int = 0       # FULL host tokens (0: no host tier)
    window: int = 0            # SWA: the sliding window (swa_retain_window), tokens
    mamba_chunk: int = 1       # Mamba: mamba_cache_chunk_size (with the page: the grid)
    max_states: int = -1       # Mamba: --mamba-max-states-per-path (-1: off)
    state_tokens: int = 0      # Mamba: ceil(state bytes / FULL bytes per token) per rank
    state_bytes: int = 0       # Mamba: one state's bytes per rank
    id_offset: int = 0         # node ids drawn before the first tree node (cache.ids)
    release_prefill_swa: bool = False  # SWA: SGLANG_OPT_RELEASE_PREFILL_SWA
    # SWA with a host tier: SWA and FULL bytes per token per rank (an SWA transfer's
    # size in FULL-token equivalents is ceil(swa tokens x swa_bytes / full_bytes)).
    swa_bytes: int = 0
    full_bytes: int = 0


@dataclass
class SimConfig:
    tp: int = 1
    # Data-parallel instances (each a TP group) and the router in front of them.
    dp: int = 1
    router: str = "round_robin"
    router_params: dict = field(default_factory=dict)
    page_size: int = 1
    device_tokens: int = 1 << 20   # per rank
    host_tokens: int = 2 << 20     # per rank
    write_policy: str = "write_back"
    host_policy: str = "duplicate_first"
    eviction_policy: str = "lru"
    load_back_threshold: int = LOAD_BACK_THRESHOLD
    ids: str = "optrace"
    max_running: int = 256
    # Extend tokens per prefill forward (SGLang's --chunked-prefill-size); None: no cap.
    chunked_prefill_tokens: int | None = None
    # SGLang's --max-prefill-tokens and --schedule-conservativeness.
    max_prefill_tokens: int = MAX_PREFILL_TOKENS_DEFAULT
    schedule_conservativeness: float = 1.0
    schedule_policy: str = SCHEDULE_POLICY_DEFAULT  # sim/policies/schedule.py
    clip_max_new_tokens: int = CLIP_MAX_NEW_TOKENS  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
    decode: bool = True
    ignore_eos: bool = False
    overlap: bool = False
    overlap_timing: str = "pipelined"  # scheduler.overlap_timing; only with overlap on the time clock
    collective: str = "simulated"
    collective_device: str = "cpu"
    collective_timeout_s: float = DEFAULT_TIMEOUT_S  # torch backend: how long a blocked call waits
    # collective.forward: False is a stub forward with no collective (the server harness's)
    forward_collective: bool = True
    discipline: str = "synced"     # sim.policies.sync.SYNC_DISCIPLINES
    on_divergence: str = "record"   # or "halt"
    seed: int = 0
    max_requests: int | None = None
    duration_s: float | None = None
    timeseries_interval_s: float = 1.0
    jitter: JitterConfig = field(default_factory=JitterConfig)
    # Record each rank's op-trace (repro bundles, run --record-ops).
    record_ops: bool = False
    rank_consensus: bool = False  # collective.rank_consensus (sim.consensus)
    # "shared": ranks share a tree until a rank-specific event forks one off;
    # "eager": every rank has its own tree from t=0. Bookkeeping only: both write
    # byte-identical results, which is how a user checks the optimisation.
    replicas: str = "shared"
    # engine.decode_runs: False prices decode one step per iteration (the reference
    # loop); engine.check_invariants: every replica's check() at each compare point.
    # Both bookkeeping: results are byte-identical either way.
    decode_runs: bool = True
    check_invariants: bool = False
    # The L3 storage tier; None: no storage (the engine does no storage work at all).
    storage: StorageConfig | None = None
    # A hybrid model's tree; None: the FULL-only tree (sim.tree).
    hybrid: HybridConfig | None = None
    # "time": iterations cost what the cost model says; "steps": one iteration is one
    # step, copies are acked ``ack_delay_steps`` (d2h, h2d) polls after their issue.
    clock: str = "time"
    ack_delay_steps: tuple[int, int] = (1, 1)
    # Scripted faults (sim.faults): (rank, kind, step, extra_steps) each.
    faults: tuple[tuple[int, str, int, int | None], ...] = ()
