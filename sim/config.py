"""Engine configuration: plain, fully resolved numbers (no YAML, no units).

``sim.scenario`` validates what users write; ``from_scenario`` resolves it into these
dataclasses, which are all the engine reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    prefetch_policy: str = "timeout"
    prefetch_threshold: int = 256
    prefetch_timeout_base: float = 1.0
    prefetch_timeout_per_ki_token: float = 0.25
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
    collective: str = "simulated"
    collective_device: str = "cpu"
    collective_timeout_s: float = 10.0  # torch backend: how long a blocked call waits
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


def from_scenario(scn) -> tuple[SimConfig, object]:
    """Resolve a validated ``sim.scenario.Scenario`` into (SimConfig, CostModel)."""
    from sim.costs import CostModel, load_profile
    from sim.scenario import resolve_capacities
    from sim.tree import id_scheme

    device, host = resolve_capacities(scn)
    j = scn.jitter
    all_ranks = tuple(range(scn.tp))

    def ranks(lst):
        return all_ranks if lst is None else tuple(lst)

    fd = j.device_free_delay
    sl = j.storage_latency
    jit = JitterConfig(
        ack_delay=j.ack_delay.dist,
        ack_delay_params=j.ack_delay.params() if j.ack_delay.dist != "none" else {},
        ack_delay_ranks=None if j.ack_delay.ranks is None else tuple(j.ack_delay.ranks),
        ack_delay_acks=j.ack_delay.acks,
        host_alloc_failure_p=j.host_alloc_failure.probability,
        host_alloc_failure_ranks=ranks(j.host_alloc_failure.ranks),
        host_capacity_skew={int(k): int(v) for k, v in j.host_capacity_skew.items()},
        device_capacity_skew={int(k): int(v) for k, v in j.device_capacity_skew.items()},
        device_free_delay=fd.dist,
        device_free_delay_params=fd.params() if fd.dist != "none" else {},
        device_free_delay_ranks=ranks(fd.ranks) if fd.dist != "none" else (),
        id_drift_rank=None if j.id_drift is None else j.id_drift.rank,
        id_drift_extra=0 if j.id_drift is None else j.id_drift.extra_ids,
        id_drift_after=0 if j.id_drift is None else j.id_drift.after_request,
        request_order_ranks=ranks(j.request_order.ranks) if j.request_order.swap_probability > 0 else (),
        request_order_swap_p=j.request_order.swap_probability,
        request_order_window=j.request_order.window,
        storage_miss_p=j.storage_miss.probability,
        storage_miss_ranks=ranks(j.storage_miss.ranks) if j.storage_miss.probability > 0 else (),
        storage_fail_ranks=tuple(j.storage_fail.ranks),
        storage_latency_factor=sl.factor,
        storage_latency=sl.dist,
        storage_latency_params=sl.params() if sl.dist != "none" else {},
        storage_latency_ranks=(ranks(sl.ranks) if sl.factor != 1.0 or sl.dist != "none" else ()),
        seed=scn.seed if j.seed is None else j.seed,
    )
    cfg = SimConfig(
        tp=scn.tp, page_size=scn.page_size, device_tokens=device, host_tokens=host,
        write_policy=scn.cache.write_policy, host_policy=scn.cache.host_policy,
        eviction_policy=scn.cache.eviction_policy,
        load_back_threshold=scn.cache.load_back_threshold,
        ids=id_scheme(scn.cache.tree_core, scn.cache.ids),
        max_running=scn.scheduler.max_running_requests or 1 << 30,
        chunked_prefill_tokens=scn.scheduler.chunked_prefill_tokens,
        max_prefill_tokens=scn.scheduler.max_prefill_tokens,
        schedule_conservativeness=scn.scheduler.schedule_conservativeness,
        schedule_policy=scn.scheduler.schedule_policy,
        clip_max_new_tokens=scn.scheduler.clip_max_new_tokens,
        decode=scn.scheduler.decode, ignore_eos=scn.scheduler.ignore_eos,
        overlap=scn.scheduler.overlap,
        collective=scn.collective.backend, collective_device=scn.collective.device,
        collective_timeout_s=scn.collective.timeout_s, discipline=scn.collective.discipline,
        forward_collective=scn.collective.forward == "all_reduce",
        rank_consensus=scn.collective.rank_consensus,
        replicas=scn.engine.replicas,
        dp=scn.dp, router=scn.router.policy, router_params=scn.router.params(),
        on_divergence=scn.on_divergence, seed=scn.seed,
        max_requests=scn.limits.max_requests, duration_s=scn.limits.duration_s,
        timeseries_interval_s=scn.output.timeseries_interval_s, jitter=jit,
        clock=scn.engine.clock,
    )
    cfg.faults = tuple((f.rank, f.kind, f.step, f.extra_steps) for f in scn.faults)
    if scn.engine.ack_delay_steps is not None:
        cfg.ack_delay_steps = (scn.engine.ack_delay_steps.d2h, scn.engine.ack_delay_steps.h2d)
    if scn.storage is not None:
        from sim.storage.backends import backend

        st = scn.storage
        over = {k: getattr(st, k) for k in ("read_gbps", "write_gbps", "op_latency_us")
                if getattr(st, k) is not None}
        from sim.storage.collectives import unwritten_ranks

        cfg.storage = StorageConfig(backend(st.backend, **over), st.prefetch_policy,
                                    st.prefetch_threshold, st.prefetch_timeout_base,
                                    st.prefetch_timeout_per_ki_token,
                                    unwritten_ranks(scn.tp, st.attn_cp_size,
                                                    scn.model.spec().is_mla))
        if st.host_memory_mode != "cache":
            from sim.storage.policy import resolve_host_mode

            hm = resolve_host_mode(st.host_memory_mode, storage_backend=st.backend,
                                   write_policy=cfg.write_policy)
            cfg.write_policy = hm.write_policy  # write_back -> write_through
            cfg.storage.host_memory_mode = hm.mode
            # --context-length taken as the workload's context cap, when it has one
            cfg.storage.max_context_len = int(getattr(scn.workload, "max_context_tokens", 0) or 0)
    if scn.model.hybrid_preset is not None:
        from sim.scenario import resolve_hybrid

        cfg.hybrid, cfg.max_running = resolve_hybrid(scn, cfg.max_running)
    cost = CostModel(load_profile(scn.cost.profile), scn.model.spec(), scn.tp, scn.page_size,
                     io_backend=scn.cost.io_backend, mem_layout=scn.cost.mem_layout)
    if scn.host.mla_dedup:
        from sim.constants import MLA_DEDUP_CHUNK_TOKENS

        cost.enable_mla_dedup(MLA_DEDUP_CHUNK_TOKENS)
    if cfg.storage is not None and scn.storage.capacity_gb is not None:
        from sim.storage.view import capacity_pages

        cfg.storage.capacity_pages = capacity_pages(scn.storage.capacity_gb,
                                                    cost.bytes_per_token, scn.page_size)
    return cfg, cost
