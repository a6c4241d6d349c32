"""Scenario -> engine configuration: ``from_scenario`` turns a validated
``sim.scenario.Scenario`` into the plain numbers of ``sim.config`` (and the cost model).

Its own module so that neither side imports the other: ``sim.config`` is the engine's
dataclasses (the engine reads nothing else), ``sim.scenario`` the user-facing schema;
this is the one place that knows both.
"""

from __future__ import annotations

from sim.config import HybridConfig, JitterConfig, SimConfig, StorageConfig
from sim.constants import MLA_DEDUP_CHUNK_TOKENS, SENTINEL_IDS_PER_COMPONENT
from sim.costs import CostModel, load_profile
from sim.hybrid import pools
from sim.hybrid.kinds import HYBRID_KINDS
from sim.scenario import Scenario, hybrid_pools, resolve_capacities
from sim.storage.backends import backend
from sim.storage.collectives import unwritten_ranks
from sim.storage.policy import resolve_host_mode
from sim.storage.view import capacity_pages
from sim.tree import id_scheme


def from_scenario(scn: Scenario) -> tuple[SimConfig, CostModel]:
    """Resolve a validated ``sim.scenario.Scenario`` into (SimConfig, CostModel)."""
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
        overlap=scn.scheduler.overlap, overlap_timing=scn.scheduler.overlap_timing,
        collective=scn.collective.backend, collective_device=scn.collective.device,
        collective_timeout_s=scn.collective.timeout_s, discipline=scn.collective.discipline,
        forward_collective=scn.collective.forward == "all_reduce",
        rank_consensus=scn.collective.rank_consensus,
        replicas=scn.engine.replicas, decode_runs=scn.engine.decode_runs,
        check_invariants=scn.engine.check_invariants,
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
        st = scn.storage
        over = {k: getattr(st, k) for k in ("read_gbps", "write_gbps", "op_latency_us")
                if getattr(st, k) is not None}
        cfg.storage = StorageConfig(backend(st.backend, **over), st.prefetch_policy,
                                    st.prefetch_threshold, st.prefetch_timeout_base,
                                    st.prefetch_timeout_per_ki_token,
                                    unwritten_ranks(scn.tp, st.attn_cp_size,
                                                    scn.model.spec().is_mla))
        if st.host_memory_mode != "cache":
            hm = resolve_host_mode(st.host_memory_mode, storage_backend=st.backend,
                                   write_policy=cfg.write_policy)
            cfg.write_policy = hm.write_policy  # write_back -> write_through
            cfg.storage.host_memory_mode = hm.mode
            # --context-length taken as the workload's context cap, when it has one
            cfg.storage.max_context_len = int(getattr(scn.workload, "max_context_tokens", 0) or 0)
    if scn.model.hybrid_preset is not None:
        cfg.hybrid, cfg.max_running = resolve_hybrid(scn, cfg.max_running)
    cost = CostModel(load_profile(scn.cost.profile), scn.model.spec(), scn.tp, scn.page_size,
                     io_backend=scn.cost.io_backend, mem_layout=scn.cost.mem_layout)
    if scn.host.mla_dedup:
        cost.enable_mla_dedup(MLA_DEDUP_CHUNK_TOKENS)
    if cfg.storage is not None and scn.storage.capacity_gb is not None:
        cfg.storage.capacity_pages = capacity_pages(scn.storage.capacity_gb,
                                                    cost.bytes_per_token, scn.page_size)
    return cfg, cost


def resolve_hybrid(s: Scenario, max_running: int):
    """The engine's ``HybridConfig`` and the running-request cap (a Mamba hybrid's
    is capped by its state pool: ``resolve_max_num_reqs``)."""
    h = s.model.hybrid()
    p = hybrid_pools(s)
    # A bare core's two components draw their LRU sentinels' ids first (ids 1-8,
    # docs/HYBRID.md §1); op-trace numbering moves them out (first node 1).
    offset = 0 if s.cache.ids == "optrace" else 2 * SENTINEL_IDS_PER_COMPONENT
    if HYBRID_KINDS[h.kind].windowed:
        return HybridConfig(kind=h.kind, aux_capacity=p["aux"], window=h.sliding_window,
                            id_offset=offset, aux_host=p["host_aux"], host_tokens=p["host_full"],
                            swa_bytes=p["aux_bytes"] if p["host_full"] else 0,
                            full_bytes=p["full_bytes_per_token"] if p["host_full"] else 0,
                            release_prefill_swa=bool(s.cache.release_prefill_swa)), max_running
    state_b = p["aux_bytes"]
    hc = HybridConfig(kind=h.kind, aux_capacity=p["aux"], aux_host=p["host_aux"],
                      host_tokens=p["host_full"], mamba_chunk=1,
                      state_tokens=-(-state_b // p["full_bytes_per_token"]),
                      state_bytes=state_b, id_offset=offset)
    requested = s.scheduler.max_running_requests
    cap = pools.mamba_max_running(p["aux"], p["full"], requested)
    return hc, min(max_running, cap)
