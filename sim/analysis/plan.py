"""Capacity planning: hit rate and TTFT against host GB per rank, one answer.

What this is for: ``hicache-sim plan SCENARIO`` answers "how much host RAM per rank
(and per node) does this traffic need for a hit rate of X, or a TTFT p99 of S?".

How the curves are made
-----------------------
* **Model (shape)**: one pass of LRU stack distances (``curves``; equal to
  ``stack_distance.lru_hit_curve``) gives the single-tier LRU hit units at every
  capacity. Two tiers map onto it by write policy: under ``write_back`` the tiers are
  nearly disjoint (a device eviction demotes the page to host), so the union behaves
  as one LRU of ``D + H`` pages, and device hits are the LRU hits at ``D``; under
  ``write_through`` every page is mirrored on host, so the union is the larger tier,
  ``max(D, H)``. The model cannot tell the host policies apart (duplicate_first vs lru
  differ in which duplicates they keep), which is what the engine points are for.
* **Engine (check)**: ``sim.runner.run_scenario`` at a few host sizes for each
  write policy x host policy. The figure states the measured error: the largest
  absolute hit-rate difference between the engine and its write policy's model at
  those points.
* **Planning curve** per policy pair: the model plus the engine's residual
  (engine - model at the check points, linearly interpolated between them, held
  flat beyond). With no engine points it is the model alone. TTFT comes only from
  the engine points, linearly interpolated between them (the figure says so).
* **Offline optimum**: ``OPT(D + H)`` of the single-tier model at a few host sizes
  (``optimum``'s union bound; exact in that model): no policy beats it.

The knee
--------
The marginal gain ``g(H) = d hit / d GB`` is taken on the 50-point grid of the
planning curve. The knee is the smallest host size, at or past the steepest point,
where ``g`` falls below ``KNEE_FRACTION`` (10%) of its steepest value: beyond it each
GB buys less than a tenth of what the best GB did. (The steepest point, not the
first: under write_through the curve is flat until the host outgrows the device.) A
curve whose gain never falls that low has no knee in the range: it still climbs at the
range's end, and the plan says so (``knee_beyond_range``) instead of calling the end a
knee.

With storage (a ``storage:`` block)
------------------------------------
The one-pass model is one LRU tier: it cannot say what the L3 tier gives back (what
storage holds depends on what the host wrote and when, and a prefetch needs host room
and time). So for a scenario with storage the model curve is drawn as what it is, the
L1+L2 hit rate without storage, and the planning curve is the engine's own L1+L2+L3
hit rate, linearly interpolated between the check points (no residual on the model).
Each engine point carries its per-tier split (``hit_tokens_by_tier``: device, host,
storage, the storage share counted once, not also as host); the storage size is the
scenario's (``storage.capacity_gb``, per rank; ``--set`` it to plan another).

Warm-up: ``warmup`` is a fraction of the requests in arrival order; hit rates and
TTFTs count only the requests after it, in the model and the engine alike (the
engine's ``rid`` is the arrival index).
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass, field

import numpy as np

from sim.analysis import curves
from sim.errors import UserError
from sim.sizing import host_tokens_for_gb
from sim.workloads.keys import page_units

# Imported where they are used, not here: the figure-writing process unpickles a Plan
# with this module and should load only numpy for it, and a model-only plan
# (``--check-points 0``) never runs the engine, whose import (``sim.runner``: the
# cluster, the metrics, pandas) costs about a second.

KNEE_FRACTION = 0.10
GRID_POINTS = 50
OPT_POINTS = 5
CHECK_POINTS = 4
WRITE_POLICIES = ("write_back", "write_through")
HOST_POLICIES = ("duplicate_first", "lru")


@dataclass
class PlanTrace:
    """The scenario's request stream keyed as the engine keys it, with arrivals: the
    pages of request ``i`` are ``units[starts[i]:starts[i + 1]]`` (``page_key``'s ids,
    back to back; one array, not a list per request)."""

    units: np.ndarray
    starts: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    arrival: np.ndarray
    page_size: int

    @property
    def requests(self) -> int:
        return len(self.starts) - 1

    @property
    def paths(self) -> list:
        """Each request's page key as a list (the plain form ``curves.compress`` takes)."""
        flat, st = self.units.tolist(), self.starts.tolist()
        return [flat[st[i]:st[i + 1]] for i in range(self.requests)]

    def subset(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(units, starts) of the requests ``idx`` (sorted indices), in that order."""
        lens = np.diff(self.starts)[idx]
        starts = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(lens, out=starts[1:])
        pos = np.arange(int(starts[-1]), dtype=np.int64) + np.repeat(self.starts[idx] - starts[:-1], lens)
        return self.units[pos], starts


def plan_trace(scenario) -> PlanTrace:
    from sim.workloads import build_workload

    ps = scenario.page_size
    stream = build_workload(scenario)
    arr = stream.arrays()  # a whole Mooncake trace at once, or None: then request by request
    if arr is not None:
        if not len(arr):
            raise UserError("found no requests; expected a workload with at least one",
                            where=scenario.source)
        units, starts = page_units(arr.blocks, arr.counts, np.full(len(arr), arr.block_size),
                                   ps, arr.input_len)
        return PlanTrace(units, starts, arr.input_len.astype(np.int64),
                         arr.output_len.astype(np.int64), arr.arrival.astype(float), ps)
    blocks, counts, sizes, lens, outs, arrivals = [], [], [], [], [], []
    for r in stream:
        blocks += r.blocks
        counts.append(len(r.blocks))
        sizes.append(r.block_size)
        lens.append(r.input_len)
        outs.append(r.output_len)
        arrivals.append(r.arrival)
    if not counts:
        raise UserError("found no requests; expected a workload with at least one", where=scenario.source)
    units, starts = page_units(blocks, counts, sizes, ps, lens)
    return PlanTrace(units, starts, np.asarray(lens, dtype=np.int64), np.asarray(outs, dtype=np.int64),
                     np.asarray(arrivals, dtype=float), ps)


def _instance_parts(scenario, n: int) -> list[np.ndarray]:
    """The requests each data-parallel instance serves, as sorted request indices.

    One instance: all of them. Several: the router decides at run time from the
    instances' loads, so one engine run of the scenario as it is records the
    assignment (``requests.parquet``'s ``instance``); each instance then caches only
    its own stream. Requests that run never served (rejected, past a limit) go
    round robin: they are never cached either way."""
    dp = scenario.dp
    if dp <= 1:
        return [np.arange(n)]

    from sim.runner import run_scenario

    df = run_scenario(scenario, None).sim.requests_df()
    inst = np.arange(n) % dp
    served = df[df["rid"] < n]
    inst[served["rid"].to_numpy()] = served["instance"].to_numpy()
    return [np.flatnonzero(inst == i) for i in range(dp) if (inst == i).any()]


def warm_requests(n: int, warmup: float) -> int:
    """Requests excluded by ``warmup`` (a fraction in [0, 1))."""
    return min(n - 1, math.floor(n * warmup)) if n else 0


def knee(x: np.ndarray, y: np.ndarray, fraction: float = KNEE_FRACTION) -> int | None:
    """Index of the knee of ``y(x)`` (module docstring); None for a flat curve and for
    one still climbing at the range's end (:func:`still_rising`)."""
    if len(x) < 3:
        return None
    gain = np.diff(y) / np.diff(x)  # gain[i]: between x[i] and x[i+1]
    peak = int(np.argmax(gain))
    if not gain[peak] > 0:
        return None
    below = np.flatnonzero(gain[peak:] < fraction * gain[peak])
    return int(peak + below[0]) if len(below) else None


def still_rising(x: np.ndarray, y: np.ndarray, fraction: float = KNEE_FRACTION) -> bool:
    """Whether ``y(x)`` rises and its gain per GB never falls below ``fraction`` of the
    steepest: the knee, if any, lies beyond the range's end."""
    if len(x) < 3:
        return False
    gain = np.diff(y) / np.diff(x)
    peak = int(np.argmax(gain))
    return bool(gain[peak] > 0 and not (gain[peak:] < fraction * gain[peak]).any())


def check_sizes(x: np.ndarray, y: np.ndarray, n: int) -> list[float]:
    """``n`` sizes for engine checks: the range's start, then where ``y`` first reaches
    evenly spaced shares (up to 95%) of its rise over ``x``; duplicates dropped."""
    if n <= 0:
        return []
    if n == 1:
        return [float(x[-1])]
    lo, hi = float(y[0]), float(y[-1])
    out = [float(x[0])]
    for f in np.linspace(0.0, 0.95, n)[1:]:
        at = smallest_meeting(x, y, lo + f * (hi - lo)) if hi > lo else None
        v = float(x[-1]) if at is None else at
        if v not in out:
            out.append(v)
    return out


def smallest_meeting(x: np.ndarray, y: np.ndarray, target: float, *, rising: bool = True) -> float | None:
    """The smallest x where ``y`` reaches ``target`` (>= when rising, <= otherwise),
    linearly interpolated between grid points; None when no point does."""
    ok = y >= target if rising else y <= target
    hit = np.flatnonzero(ok)
    if not len(hit):
        return None
    i = int(hit[0])
    if i == 0 or y[i] == y[i - 1]:
        return float(x[i])
    return float(x[i - 1] + (target - y[i - 1]) * (x[i] - x[i - 1]) / (y[i] - y[i - 1]))


@dataclass
class EnginePoint:
    write_policy: str
    host_policy: str
    host_gb: float
    host_tokens: int
    hit_rate: float
    device_hit_rate: float
    host_hit_rate: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    requests: int
    extra: dict = field(default_factory=dict)
    # Of ``host_hit_rate``, the share that came from storage (L3); None without storage.
    storage_hit_rate: float | None = None


def engine_point(scenario, write_policy: str, host_policy: str, host_tokens: int,
                 warm: int, bpt: int, tier: str = "host") -> EnginePoint:
    """One engine run of ``scenario`` with this size of ``tier`` (tokens) and policy pair."""
    from sim.runner import run_scenario
    from sim.scenario import Device, Host

    update = {
        "node": None,  # the plan reports the node limit itself, per size
        "cache": scenario.cache.model_copy(update={"write_policy": write_policy,
                                                   "host_policy": host_policy}),
    }
    if tier == "device":
        update.update(device=Device(tokens=host_tokens), host=Host(tokens=0))
    else:
        update["host"] = Host(tokens=host_tokens)
    s = scenario.model_copy(update=update)
    res = run_scenario(s)
    df = res.sim.requests_df()
    df = df[df["rid"] >= warm]
    inp = float(df["input_tokens"].sum())
    dev = float(df["device_hit_tokens"].sum()) / inp if inp else 0.0
    host = float(df["host_hit_tokens"].sum()) / inp if inp else 0.0
    hit = float((df["input_tokens"] - df["miss_tokens"]).sum()) / inp if inp else 0.0
    l3 = None
    if s.storage is not None:
        insts = getattr(res.sim, "instances", None) or [res.sim]
        l3 = sum(n for i in insts for rid, n in i.metrics.l3_by_rid.items() if rid >= warm)
        l3 = l3 / inp if inp else 0.0
    ttft = df["ttft_s"].to_numpy(dtype=float)
    ttft = ttft[np.isfinite(ttft)]
    fields = res.summary  # run_scenario adds the per-tier fields (sim.diagnostics)
    extra = {k: fields[k] for k in ("device_pages_mean", "host_pages_mean", "duplicate_pages_mean",
                                    "unique_pages_mean", "backup_failures")}
    extra["verdict"] = res.summary.get("verdict")
    return EnginePoint(write_policy, host_policy, host_tokens * bpt / 1e9, host_tokens, hit, dev,
                       host, float(np.percentile(ttft, 50)) if len(ttft) else None,
                       float(np.percentile(ttft, 99)) if len(ttft) else None, len(df), extra, l3)


def _engine_job(args):
    return engine_point(*args)


@dataclass
class Plan:
    doc: dict  # everything plan.json holds
    grid_gb: np.ndarray
    model: dict  # write policy -> (hit, device_hit) arrays on the grid
    planning: dict  # (wp, hp) -> hit array on the grid
    opt: list  # [(host_gb, hit_rate)]
    engine: list  # [EnginePoint]


def make_plan(scenario, *, warmup: float = 0.0, max_host_gb: float | None = None,
              check_points: int = CHECK_POINTS, opt_points: int = OPT_POINTS,
              grid_points: int = GRID_POINTS, policies=None, jobs: int = 1,
              target_hit_rate: float | None = None, target_ttft_p99_s: float | None = None,
              progress=None) -> Plan:
    from sim.diagnostics import diagnose
    from sim.scenario import _ranks_per_node, host_copies_per_node, resolve_sizing

    if not 0.0 <= warmup < 1.0:
        raise UserError(f"found {warmup!r}; expected a fraction in [0, 1)", where="--warmup")
    info = resolve_sizing(scenario)
    D, H0, bpt = info["device_tokens"], info["host_tokens"], info["bytes_per_token"]
    ps = scenario.page_size
    # ``host: off``: a single tier, so the plan varies the device instead (a pure
    # cache curve: hit rate against cache capacity, as published curves draw it).
    tier = "device" if scenario.host.off else "host"
    own = (scenario.cache.write_policy, scenario.cache.host_policy)
    if tier == "device":
        policies = [own]
    else:
        policies = list(policies or [(w, h) for w in WRITE_POLICIES for h in HOST_POLICIES])
    was = gc.isenabled()
    gc.disable()  # reading the trace: a record object per request, and none is garbage
    try:
        trace = plan_trace(scenario)
    finally:
        if was:
            gc.enable()
    n = trace.requests
    warm = warm_requests(n, warmup)
    measured_input = int(trace.input_len[warm:].sum())
    if tier == "device":
        # device.gib-like, in GB; the epsilon keeps a GB figure made from tokens on its page.
        tokens_for = lambda g: int(g * 1e9 / bpt + 1e-6) // ps * ps  # noqa: E731
        # A device below the largest request (input + output) rejects it: start there.
        biggest = int((trace.input_len + trace.output_len).max())
        lo_gb = -(-biggest // ps) * ps * bpt / 1e9
    else:
        tokens_for = lambda g: host_tokens_for_gb(g, bpt, ps)  # noqa: E731
        lo_gb = 0.0
    # The analysis builds big arrays over millions of small objects: a full GC pass over
    # the trace's lists in the middle costs seconds and frees nothing.
    was = gc.isenabled()
    gc.disable()
    try:
        parts = _instance_parts(scenario, n)
        per = []  # (compressed trace, LRU pass, warm-up requests) per instance
        for idx in parts:
            sub = (trace.units, trace.starts) if len(parts) == 1 else trace.subset(idx)
            comp_i = curves.compress_units(*sub)
            per.append((comp_i, curves.lru_pass(comp_i, trace.arrival[idx]),
                        int(np.searchsorted(idx, warm))))
        # Each instance caches only what it was routed; per capacity the hit units add.
        part_hits = [lp_i.hits_at(w_i) for _, lp_i, w_i in per]
        size = max(len(h) for h in part_hits)
        hits = np.zeros(size, dtype=np.int64)
        for h in part_hits:
            hits[: len(h)] += h
            hits[len(h):] += h[-1]
        _, lp, warm_big = max(per, key=lambda x: len(x[0].starts))
        d_units = D // ps
        full_units = len(hits) - 1  # every reuse hits from here on
        if max_host_gb is None:
            # Up to where the union (write_back: D + H; one tier: the device) reaches 99%
            # of the reachable hits, at least twice the scenario's size of the tier.
            top = hits[-1]
            c99 = int(np.searchsorted(hits, 0.99 * top)) if top else 0
            if tier == "device":
                units = max(c99, 2 * d_units, 1)
            else:
                units = max(c99 - d_units, 2 * (H0 // ps), d_units, 1)
            max_host_gb = max(units * ps * bpt / 1e9, 2 * lo_gb)
        if not max_host_gb > lo_gb:
            raise UserError(f"found {max_host_gb!r}; expected a size > {lo_gb:.3g} GB",
                            where="--max-host-gb")
        grid = np.linspace(lo_gb, max_host_gb, grid_points)
        grid_units = np.array([tokens_for(g) for g in grid], dtype=np.int64) // ps
        rate = (lambda u: u * ps / measured_input) if measured_input else (lambda u: u * 0.0)
        if tier == "device":
            model = {"single_tier": rate(lp.hit_units(grid_units, hits=hits).astype(float))}
            dev_hit = rate(lp.hit_units(d_units, hits=hits))
            union = lambda g: tokens_for(g) // ps  # noqa: E731
            cap0 = d_units
        else:
            dev_hit = rate(lp.hit_units(d_units, hits=hits))
            model = {
                "write_back": rate(lp.hit_units(d_units + grid_units, hits=hits).astype(float)),
                "write_through": rate(lp.hit_units(np.maximum(d_units, grid_units), hits=hits).astype(float)),
            }
            union = lambda g: d_units + tokens_for(g) // ps  # noqa: E731
            cap0 = d_units + H0 // ps if own[0] != "write_through" else max(d_units, H0 // ps)
        # The offline optimum (union bound, any write policy) at a few sizes.
        nxts = [curves.next_uses(c_i) for c_i, _, _ in per]
        opt = []
        if opt_points:
            for g in np.linspace(lo_gb, max_host_gb, opt_points):
                units = sum(curves.optimum_units(c_i, union(g), nx, w_i)
                            for (c_i, _, w_i), nx in zip(per, nxts))
                opt.append((float(g), rate(units)))
        age_hit, age_evict = lp.ages(cap0, warm_big)  # the busiest instance's
    finally:
        if was:
            gc.enable()

    # Engine check points where the shape is: the range's start (0 GB: no host), then
    # the sizes at which the model has climbed evenly spaced shares (up to 95%) of its
    # rise over the range; the scenario's own policy pair also runs at its own size.
    engine: list[EnginePoint] = []
    shape = model["single_tier" if tier == "device" else "write_back"]
    xs = check_sizes(grid, shape, check_points)
    own_size = D if tier == "device" else H0
    if check_points:
        jobs_args = []
        for wp, hp in policies:
            sizes = [tokens_for(g) for g in xs]
            if (wp, hp) == own and own_size not in sizes and own_size >= tokens_for(lo_gb):
                sizes = sorted(sizes + [own_size])
            jobs_args += [(scenario, wp, hp, t, warm, bpt, tier) for t in sizes]
        engine = _run_jobs(jobs_args, jobs, progress)

    storage = scenario.storage is not None
    planning, errors, ttft = {}, {}, {}
    for wp, hp in policies:
        m = model.get(wp, model.get("single_tier", model.get("write_back")))
        pts = [e for e in engine if (e.write_policy, e.host_policy) == (wp, hp)]
        if pts and storage:
            # The model has no L3: the engine's L1+L2+L3 between its points (docstring).
            planning[(wp, hp)] = np.interp(grid, [e.host_gb for e in pts],
                                           [e.hit_rate for e in pts])
        elif pts:
            px = np.array([e.host_gb for e in pts])
            resid = np.array([e.hit_rate for e in pts]) - np.interp(px, grid, m)
            planning[(wp, hp)] = np.clip(m + np.interp(grid, px, resid), 0.0, 1.0)
            errors[(wp, hp)] = float(np.max(np.abs(resid)))
        if pts:
            p99 = [(e.host_gb, e.ttft_p99_s) for e in pts if e.ttft_p99_s is not None]
            if p99:
                ttft[(wp, hp)] = np.interp(grid, [a for a, _ in p99], [b for _, b in p99])
        else:
            planning[(wp, hp)] = m.copy()

    ranks = _ranks_per_node(scenario)
    rows = []
    for wp, hp in policies:
        curve = planning[(wp, hp)]
        k = knee(grid, curve)
        row = {
            "write_policy": wp, "host_policy": hp,
            "knee_gb_per_rank": None if k is None else float(grid[k]),
            "knee_hit_rate": None if k is None else float(curve[k]),
            # no knee in the range because the curve still climbs at its end
            "knee_beyond_range": still_rising(grid, curve),
            "model_vs_engine_max_abs_error": errors.get((wp, hp)),
            "hit_rate_at_scenario_host": float(np.interp(own_size * bpt / 1e9, grid, curve)),
        }
        if storage:
            pts = [e for e in engine if (e.write_policy, e.host_policy) == (wp, hp)]
            row["engine_tiers"] = [_tiers(e) for e in pts]
        if target_hit_rate is not None:
            row["target_hit_rate_gb_per_rank"] = smallest_meeting(grid, curve, target_hit_rate)
        if target_ttft_p99_s is not None:
            if (wp, hp) not in ttft:
                raise UserError("found no engine check points; expected --check-points >= 2 "
                                "for a TTFT target", where="--target-ttft-p99")
            row["target_ttft_p99_gb_per_rank"] = smallest_meeting(
                grid, ttft[(wp, hp)], target_ttft_p99_s, rising=False)
        rows.append(row)

    own_row = next((r for r in rows if (r["write_policy"], r["host_policy"]) == own), rows[0])

    own_engine = [e for e in engine if (e.write_policy, e.host_policy) == own]
    # The scenario's own configuration: its engine point nearest its host size, if any,
    # else the model's split.
    dev_rate = float(dev_hit)
    all_rate = float(np.interp(own_size * bpt / 1e9, grid,
                               planning[(own_row["write_policy"], own_row["host_policy"])]))
    at_own = next((e for e in own_engine if e.host_tokens == own_size), None)
    st_rate = None  # the engine's storage share (the model has no L3 tier)
    if at_own is not None:  # the engine's own split at the scenario's configuration
        dev_rate, all_rate = at_own.device_hit_rate, at_own.hit_rate
        st_rate = at_own.storage_hit_rate
    diagnosis = diagnose(
        device_hit_rate=dev_rate, host_hit_rate=max(all_rate - dev_rate - (st_rate or 0.0), 0.0),
        storage_hit_rate=st_rate,
        host_buffer_only=storage and scenario.storage.host_memory_mode == "buffer_only",
        device_tokens=D,
        host_tokens=H0, write_policy=own[0],
        backup_failures=next((e.extra.get("backup_failures") for e in own_engine
                              if e.host_tokens == own_size), None) if tier == "host" else None,
        below_knee=(own_row["knee_gb_per_rank"] is not None
                    and own_size * bpt / 1e9 < own_row["knee_gb_per_rank"]),
        knee_gb=own_row["knee_gb_per_rank"], age_at_hit_s=age_hit, age_at_eviction_s=age_evict)
    doc = {
        "scenario": scenario.name,
        "tier": tier,
        "requests": n,
        "warmup_fraction": warmup,
        "warmup_requests": warm,
        "measured_input_tokens": measured_input,
        "page_size": ps,
        "bytes_per_token": bpt,
        "device_tokens_per_rank": D,
        "device_gb_per_rank": D * bpt / 1e9,
        "scenario_host_tokens_per_rank": H0,
        "scenario_host_gb_per_rank": H0 * bpt / 1e9,
        # The size the x-axis varies (host, or the device when the host is off).
        "scenario_size_gb_per_rank": own_size * bpt / 1e9,
        "ranks_per_node": ranks,
        "host_copies_per_node": host_copies_per_node(scenario),
        "mla_dedup": scenario.host.mla_dedup,
        "node": info["node"],
        "max_host_gb_per_rank": float(max_host_gb),
        "full_reuse_capacity_gb": full_units * ps * bpt / 1e9,
        "device_hit_rate_model": dev_rate,
        "age_at_hit_s_median": age_hit,
        "age_at_eviction_s_median": age_evict,
        "knee_rule": (f"smallest host size at or past the steepest point where the marginal "
                      f"hit-rate gain per GB falls below {KNEE_FRACTION:.0%} of the steepest"),
        "targets": {"hit_rate": target_hit_rate, "ttft_p99_s": target_ttft_p99_s},
        # The offline optimum's best hit rate over the range (None: not computed). A
        # target above it is out of reach for every policy at every size in the range.
        "optimum_max_hit_rate": max((h for _, h in opt), default=None),
        "policies": rows,
        "diagnosis": diagnosis,
        # The engine at the scenario's own size and policy pair: the per-tier numbers.
        "scenario_engine": None if at_own is None else {
            "device_hit_rate": at_own.device_hit_rate, "host_hit_rate": at_own.host_hit_rate,
            "hit_rate": at_own.hit_rate, "ttft_p99_s": at_own.ttft_p99_s, **at_own.extra,
            **({"storage_hit_rate": at_own.storage_hit_rate} if storage else {})},
        # The L3 tier the engine points ran with (None: no storage). The model has none.
        "storage": None if not storage else {
            "backend": scenario.storage.backend,
            "capacity_gb_per_rank": scenario.storage.capacity_gb,
            "planning_curve": ("engine L1+L2+L3 hit rate, linear between check points"
                               if engine else "model only: L1+L2, no L3 (no check points)"),
        },
        "scenario_policy": {"write_policy": own[0], "host_policy": own[1]},
    }
    return Plan(doc, grid, {"dev": np.full_like(grid, dev_rate), **model}, planning, opt, engine)


def _tiers(e: EnginePoint) -> dict:
    """An engine point's hit rate per tier (host without the storage share)."""
    st = e.storage_hit_rate or 0.0
    return {"host_gb_per_rank": e.host_gb, "device": e.device_hit_rate,
            "host": max(e.host_hit_rate - st, 0.0), "storage": st, "total": e.hit_rate}


def _run_jobs(jobs_args, jobs: int, progress):
    if jobs <= 1 or len(jobs_args) <= 1:
        out = []
        for i, a in enumerate(jobs_args):
            out.append(_engine_job(a))
            if progress:
                progress(i + 1, len(jobs_args))
        return out

    from concurrent.futures import ProcessPoolExecutor, as_completed  # here: a model-only plan runs none

    out = [None] * len(jobs_args)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(_engine_job, a): i for i, a in enumerate(jobs_args)}
        done = 0

        for f in as_completed(futures):
            out[futures[f]] = f.result()  # results keep the submission order
            done += 1
            if progress:
                progress(done, len(jobs_args))
    return out


def _plan_rows(plan: Plan) -> tuple[list[dict], list[str], str]:
    """The plan's rows (a dict per row, without the columns computed from others),
    plan.parquet's columns in order, and the tier the plan varies."""
    d = plan.doc
    rows = []
    for key, curve in plan.model.items():
        if key == "dev":
            continue
        for g, h in zip(plan.grid_gb, curve):
            rows.append({"series": "model", "write_policy": key, "host_policy": "",
                         "size_gb_per_rank": float(g), "hit_rate": float(h),
                         "device_hit_rate": float(plan.model["dev"][0]), "is_bound": False})
    for (wp, hp), curve in plan.planning.items():
        for g, h in zip(plan.grid_gb, curve):
            rows.append({"series": "planning", "write_policy": wp, "host_policy": hp,
                         "size_gb_per_rank": float(g), "hit_rate": float(h), "is_bound": False})
    for g, h in plan.opt:
        rows.append({"series": "offline_optimum", "write_policy": "", "host_policy": "",
                     "size_gb_per_rank": g, "hit_rate": h, "is_bound": True})
    for e in plan.engine:
        rows.append({"series": "engine", "write_policy": e.write_policy, "host_policy": e.host_policy,
                     "size_gb_per_rank": e.host_gb, "hit_rate": e.hit_rate,
                     "device_hit_rate": e.device_hit_rate, "host_hit_rate": e.host_hit_rate,
                     "storage_hit_rate": e.storage_hit_rate,
                     "ttft_p50_s": e.ttft_p50_s, "ttft_p99_s": e.ttft_p99_s,
                     "requests_measured": e.requests, "is_bound": False,
                     **{k + ("" if k in ("backup_failures", "verdict") else ""): v
                        for k, v in e.extra.items()}})
    # The tier the plan varies: the host, or the device when the host is off.
    tier = d["tier"]
    cols = ["series", "write_policy", "host_policy", f"{tier}_gb_per_rank", f"{tier}_tokens_per_rank",
            f"{tier}_gb_per_node", "hit_rate", "device_hit_rate", "host_hit_rate",
            *(["storage_hit_rate"] if d.get("storage") else []), "ttft_p50_s",
            "ttft_p99_s", "requests_measured", "device_pages_mean", "host_pages_mean",
            "duplicate_pages_mean", "unique_pages_mean", "backup_failures", "verdict", "is_bound"]
    return rows, cols, tier


def _size_columns(tier: str, d: dict):
    """(tokens of a size, the size's copies per node) for the plan's tier."""
    bpt, ps = d["bytes_per_token"], d["page_size"]
    if tier == "host":
        tokens = lambda g: _tokens(g, bpt, ps)  # noqa: E731
    else:
        tokens = lambda g: int(g * 1e9 / bpt) // ps * ps  # noqa: E731
    # Host copies per node: one per rank, or one per TP group under MLA host dedup.
    copies = d.get("host_copies_per_node", d["ranks_per_node"]) if tier == "host" else d["ranks_per_node"]
    return tokens, copies


def plan_table(plan: Plan):
    """The plan's rows as a DataFrame (plan.parquet); units in the column names."""
    import pandas as pd  # here, not at the top: importing the module stays light (pandas is slow to load)

    rows, cols, tier = _plan_rows(plan)
    tokens, copies = _size_columns(tier, plan.doc)
    df = pd.DataFrame(rows)
    df = df.rename(columns={"size_gb_per_rank": f"{tier}_gb_per_rank"})
    df[f"{tier}_tokens_per_rank"] = [tokens(g) for g in df[f"{tier}_gb_per_rank"]]
    df[f"{tier}_gb_per_node"] = df[f"{tier}_gb_per_rank"] * copies
    for c in cols:
        if c not in df.columns:
            df[c] = None
    return df[cols]


_ABSENT = object()  # a row without the column's key


def _arrow_column(values: list):
    """One column of row dicts (``_ABSENT`` where a row lacks the key) as pandas types
    it (``pd.DataFrame(rows)``) and pyarrow then converts it (``Table.from_pandas``:
    NaN and None are nulls): (array, pandas dtype name), or None for a mix of kinds
    whose typing this does not mirror."""
    import pyarrow as pa

    present = [v for v in values if v is not _ABSENT]
    nulls = len(present) < len(values) or any(v is None for v in present)
    vals = [v for v in present if v is not None]
    if not vals:
        if len(present) in (0, len(values)):  # in no row (``df[c] = None``), or None in every row
            return pa.nulls(len(values)), "object"
        return pa.nulls(len(values), type=pa.float64()), "float64"  # None and absent: NaN
    if all(type(v) is str for v in vals):
        return _array(pa.large_string(), [v if isinstance(v, str) else None for v in values]), "str"
    if all(type(v) is bool for v in vals):
        if nulls:  # pandas keeps an object column of bools and NaN
            return None
        return _array(pa.bool_(), vals), "bool"
    if all(isinstance(v, (int, float, np.integer, np.floating))
           and not isinstance(v, (bool, np.bool_)) for v in vals):
        if not nulls and all(isinstance(v, (int, np.integer)) for v in vals):
            if not all(-2**63 <= v < 2**63 for v in vals):
                return None
            return _array(pa.int64(), [int(v) for v in vals]), "int64"
        out = [None if v is _ABSENT or v is None else float(v) for v in values]
        return _array(pa.float64(), [None if x is not None and x != x else x for x in out]), "float64"
    return None


def _array(typ, values: list):
    """An Arrow array of ``values`` (None: null) from its buffers. Not ``pa.array``:
    that asks pandas whether a list is one of its objects, which imports pandas."""
    import pyarrow as pa

    n = len(values)
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=n)
    nulls = n - int(valid.sum())
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    if typ == pa.large_string():
        data = [v.encode("utf8") if v is not None else b"" for v in values]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(b) for b in data], out=offsets[1:])
        buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))]
    elif typ == pa.bool_():
        buffers = [validity, pa.py_buffer(np.packbits(np.array(values, dtype=bool), bitorder="little"))]
    else:
        dtype = np.float64 if typ == pa.float64() else np.int64
        zero = dtype(0)
        buffers = [validity, pa.py_buffer(np.array([zero if v is None else v for v in values], dtype=dtype))]
    return pa.Array.from_buffers(typ, n, buffers, null_count=nulls)


# pyarrow's names of the types above in pandas' metadata (pandas_compat.get_logical_type)
_LOGICAL = {"float64": "float64", "int64": "int64", "bool": "bool", "str": "object",
            "object": "empty"}


def plan_arrow_table(plan: Plan):
    """``plan_table(plan)`` as ``pa.Table.from_pandas(df, preserve_index=False)`` makes
    it (the same columns, types, nulls and ``pandas`` schema metadata: plan.parquet's
    bytes), built without pandas, whose import is about 0.3 s of a model-only plan's
    process. None where a column holds a mix of kinds whose pandas typing
    ``_arrow_column`` does not mirror, or pandas' version cannot be read: the caller
    then writes ``plan_table(plan)`` (tests compare the two files byte for byte)."""
    import json
    from importlib import metadata

    import pyarrow as pa

    try:
        pandas_version = metadata.version("pandas")
    except metadata.PackageNotFoundError:
        return None
    rows, cols, tier = _plan_rows(plan)
    tokens, copies = _size_columns(tier, plan.doc)
    gb = f"{tier}_gb_per_rank"
    key = {gb: "size_gb_per_rank"}
    arrays, dtypes = {}, {}
    for c in cols:
        if c in (f"{tier}_tokens_per_rank", f"{tier}_gb_per_node"):
            continue
        col = _arrow_column([r.get(key.get(c, c), _ABSENT) for r in rows])
        if col is None:
            return None
        arrays[c], dtypes[c] = col
    if dtypes[gb] not in ("float64", "int64") or arrays[gb].null_count:
        return None
    # what iterating the DataFrame's column gives
    sizes = [(float if dtypes[gb] == "float64" else int)(r["size_gb_per_rank"]) for r in rows]
    arrays[f"{tier}_tokens_per_rank"] = _array(pa.int64(), [tokens(g) for g in sizes])
    dtypes[f"{tier}_tokens_per_rank"] = "int64"
    arrays[f"{tier}_gb_per_node"] = _array(arrays[gb].type, [g * copies for g in sizes])
    dtypes[f"{tier}_gb_per_node"] = dtypes[gb]
    meta = {"index_columns": [], "column_indexes": [],
            "columns": [{"name": c, "field_name": c, "pandas_type": _LOGICAL[dtypes[c]],
                         "numpy_type": dtypes[c], "metadata": None} for c in cols],
            "attributes": {}, "creator": {"library": "pyarrow", "version": pa.__version__},
            "pandas_version": pandas_version}
    table = pa.Table.from_arrays([arrays[c] for c in cols], names=cols)
    return table.replace_schema_metadata({b"pandas": json.dumps(meta).encode("utf8")})


def _tokens(g, bpt, ps) -> int:
    return host_tokens_for_gb(float(g), bpt, ps)
