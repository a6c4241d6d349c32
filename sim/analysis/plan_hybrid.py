"""Capacity planning for a (FULL, MAMBA) hybrid: host hit rate against host KV GB and
host Mamba state slots per rank, and the slot count below which the host tier goes
inert.

What this is for: ``hicache-sim plan SCENARIO`` on a scenario with a Mamba
``model.hybrid_preset`` answers "how many host Mamba state slots does a host KV tier of
this size need before it gives any hits?" (sglang #39851, #32373, #39436: 0.5.23's
``--hicache-size`` is split between the KV and Mamba host pools by device bytes,
``hybrid_pool_assembler.py`` ``_split_hicache_size``, which can leave too few slots).

Why engine runs only
--------------------
A hybrid match needs a Mamba state at its boundary (``mamba.py``'s match validator,
docs/HYBRID.md §4.2, §5.2): KV on host whose state was evicted from the Mamba host pool
matches nothing there. The FULL-only plan's one-pass LRU model (``sim.analysis.plan``)
sees token reuse only, not states: its host hit rate is the same at every slot count.
It is reported beside the engine's figures (``model_host_hit_rate``, a FULL-only LRU of
device + host KV tokens under write_back, of max(device, host) under the write_through
policies) as what the KV tier alone would give, and everything else comes from
``sim.runner.run_scenario`` at each (KV, slots) point, under the scenario's
``cache.write_policy`` (write_back for a scenario with ``host: off``).

The grid
--------
``kv_points`` host KV sizes per rank, evenly spaced up to ``max_host_gb`` (default:
twice the scenario's host KV, or twice the device's FULL pool with ``host: off``), plus
the scenario's own; at each, ``slot_points`` slot counts spaced geometrically from 1 to
``max_slots`` (default: the states the workload's prefills can create, one per prefill
chunk, the last at the prompt's end), plus the scenario's own slot count (at its KV size), the
slots SGLang's ``--hicache-size`` split gives beside that KV size
(``sglang_split_slots``, ``sim.hybrid.pools.hybrid_host_pools``), and the **unbounded**
count ``device FULL tokens + host KV tokens``: at page 1 every node holds at least one
token and lives only while its FULL is on a tier, so no more states than that can be
held, and the Mamba host pool never evicts.

The inert threshold
-------------------
At one KV size, the **plateau** is the host hit tokens at the unbounded slot count. A
slot count is **inert** when its host hit tokens are below ``INERT_FRACTION`` (1%) of
the plateau. The threshold ``T`` is found by bisection over engine runs between the
largest grid slot count below the first non-inert one and that one: ``T`` is inert
and ``T + 1`` is not (``T`` = 0 when one slot is already not inert; none when the
plateau is 0, i.e. this KV size gives no host hits at any slot count). Every grid
count below ``T`` is inert; the curve need not be monotone above it (LRU), and the
grid shows it. ``T`` is per rank; ``T / host KV GB`` is the slots per KV GB a sizing
rule needs at least.

Warm-up as in ``sim.analysis.plan``: hit tokens count only requests from
``warm_requests(n, warmup)`` on.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from sim.errors import UserError

INERT_FRACTION = 0.01
KV_POINTS = 3
SLOT_POINTS = 8


@dataclass
class HybridPoint:
    host_tokens: int
    host_gb: float
    slots: int
    input_tokens: int         # measured (after warm-up)
    host_hit_tokens: int
    device_hit_tokens: int
    hit_rate: float
    device_hit_rate: float
    host_hit_rate: float
    host_states_used: int
    state_host_frees: int
    host_hits_with_state: int
    verdict: str | None
    probe: str = "grid"       # "grid", "plateau" (the unbounded count) or "bisect"


def plan_write_policy(scenario) -> str:
    """The write policy the plan's engine runs use: the scenario's own when it has a
    host tier (each is modelled for (FULL, MAMBA), docs/HYBRID.md §5.9, §10), else
    write_back (the plan adds a host tier the scenario does not configure)."""
    return "write_back" if scenario.host.off else scenario.cache.write_policy


def hybrid_point(scenario, host_tokens: int, slots: int, warm: int, bpt: int,
                 probe: str = "grid") -> HybridPoint:
    """One engine run of ``scenario`` with ``host_tokens`` FULL host tokens and
    ``slots`` host Mamba state slots per rank, under ``plan_write_policy``."""
    from sim.runner import run_scenario
    from sim.scenario import Host

    s = scenario.model_copy(update={
        "host": Host(tokens=host_tokens, mamba_states=slots),
        "cache": scenario.cache.model_copy(update={"write_policy": plan_write_policy(scenario)}),
    })
    res = run_scenario(s)
    df = res.sim.requests_df()
    df = df[df["rid"] >= warm]
    inp = int(df["input_tokens"].sum())
    host = int(df["host_hit_tokens"].sum())
    dev = int(df["device_hit_tokens"].sum())
    hit = int((df["input_tokens"] - df["miss_tokens"]).sum())
    hy = res.summary.get("hybrid") or {}
    rate = (lambda v: v / inp) if inp else (lambda v: 0.0)
    return HybridPoint(host_tokens, host_tokens * bpt / 1e9, slots, inp, host, dev, rate(hit),
                       rate(dev), rate(host), int(hy.get("host_states_used", 0)),
                       int(hy.get("state_host_frees", 0)), int(hy.get("host_hits_with_state", 0)),
                       res.summary.get("verdict"), probe)


def _point_job(args):
    return hybrid_point(*args)


def bisect_inert(scenario, host_tokens: int, lo: int, hi: int, limit: float, warm: int,
                 bpt: int) -> tuple[int, list]:
    """The largest ``T`` in ``[lo, hi)`` with ``T`` inert and ``T + 1`` not, given ``lo``
    inert (or 0) and ``hi`` not: bisection over engine runs. Returns ``T`` and the
    points it ran."""
    ran = []
    while hi - lo > 1:
        mid = (lo + hi) // 2
        p = hybrid_point(scenario, host_tokens, mid, warm, bpt, "bisect")
        ran.append(p)
        if p.host_hit_tokens < limit:
            lo = mid
        else:
            hi = mid
    return lo, ran


def _bisect_job(args):
    return bisect_inert(*args)


def _map(fn, jobs_args, jobs: int, progress, done0: int = 0, total: int | None = None):
    """``fn`` over ``jobs_args`` in submission order, ``jobs`` processes at a time."""
    total = len(jobs_args) if total is None else total
    if jobs <= 1 or len(jobs_args) <= 1:
        out = []
        for i, a in enumerate(jobs_args):
            out.append(fn(a))
            if progress:
                progress(done0 + i + 1, total)
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed

    out = [None] * len(jobs_args)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(fn, a): i for i, a in enumerate(jobs_args)}
        done = done0
        for f in as_completed(futures):
            out[futures[f]] = f.result()
            done += 1
            if progress:
                progress(done, total)
    return out


def workload_states(trace, chunk: int | None) -> int:
    """States the workload's requests can create: one per prefill chunk, the last one
    at the request's finish (``cache_unfinished_req`` after each chunk but the last,
    ``cache_finished_req`` at the end); one per request without chunking."""
    if not chunk:
        return len(trace.input_len)
    return int(np.sum(-(-trace.input_len // chunk)))


def slot_grid(max_slots: int, points: int) -> list[int]:
    """``points`` slot counts from 1 to ``max_slots``, geometrically spaced, unique."""
    if points <= 1:
        return [max_slots]
    return sorted({round(float(v)) for v in np.geomspace(1, max_slots, points)})


def split_slots(kv_tokens: int, page: int, bpt: int, device_full: int, device_states: int,
                state_bytes: int) -> int:
    """Host Mamba slots that SGLang's ``--hicache-size`` split gives beside a KV host
    pool of ``kv_tokens``: the size ``G`` whose KV share is ``kv_tokens`` tokens
    (``_split_hicache_size`` by device pool bytes), then ``MambaPoolHost``'s count
    for the Mamba share (``sim.hybrid.pools.hybrid_host_pools``)."""
    from sim.hybrid import pools

    kv_b = pools.kv_pool_bytes(device_full, page, bpt)
    m_b = pools.mamba_pool_bytes(device_states, state_bytes)
    g = kv_tokens * bpt / 1e9 * (kv_b + m_b) / kv_b
    return pools.hybrid_host_pools("mamba", device_full, device_states, page, bpt, state_bytes,
                                   hicache_gb=g)[1]


@dataclass
class HybridPlan:
    doc: dict          # everything plan.json holds
    points: list       # [HybridPoint], grid first, then the bisection probes


def check_hybrid(scenario) -> None:
    """The hybrid plan sizes host KV against host Mamba state slots; a (FULL, SWA)
    hybrid's host tier runs in the engine (docs/HYBRID.md §10.3), but its plan axis
    (host SWA tokens) is not built (§10.6)."""
    h = scenario.model.hybrid()
    if h is not None and h.kind != "mamba":
        raise UserError(f"found the (FULL, SWA) hybrid {scenario.model.hybrid_preset!r}; "
                        "expected a (FULL, MAMBA) hybrid (plan sizes host KV and Mamba state "
                        "slots; a host SWA axis is not built)",
                        where=f"{scenario.source}: model.hybrid_preset")


def make_hybrid_plan(scenario, *, warmup: float = 0.0, max_host_gb: float | None = None,
                     kv_points: int = KV_POINTS, slot_points: int = SLOT_POINTS,
                     max_slots: int | None = None, jobs: int = 1,
                     inert_fraction: float = INERT_FRACTION, progress=None) -> HybridPlan:
    from sim.analysis.plan import make_plan, plan_trace, warm_requests
    from sim.scenario import _ranks_per_node, resolve_sizing
    from sim.sizing import host_tokens_for_gb

    check_hybrid(scenario)
    if not 0.0 <= warmup < 1.0:
        raise UserError(f"found {warmup!r}; expected a fraction in [0, 1)", where="--warmup")
    if not 0.0 < inert_fraction < 1.0:
        raise UserError(f"found {inert_fraction!r}; expected a fraction in (0, 1)",
                        where="--inert-fraction")
    info = resolve_sizing(scenario)
    D, H0, bpt = info["device_tokens"], info["host_tokens"], info["bytes_per_token"]
    hy = info["hybrid"]
    dev_states, state_b = hy["aux_device"], hy["aux_bytes"]
    S0 = hy["aux_host"] if H0 else 0
    ps = scenario.page_size
    trace = plan_trace(scenario)
    n = len(trace.paths)
    warm = warm_requests(n, warmup)

    base = H0 if H0 else D
    top = host_tokens_for_gb(max_host_gb, bpt, ps) if max_host_gb is not None else 2 * base
    if max_host_gb is not None and top < ps:
        raise UserError(f"found {max_host_gb!r}; expected at least one page of host KV",
                        where="--max-host-gb")
    kvs = sorted({max(ps, int(top * (i + 1) / kv_points) // ps * ps) for i in range(kv_points)}
                 | ({H0} if H0 else set()))
    made = workload_states(trace, scenario.scheduler.chunked_prefill_tokens)
    if max_slots is None:
        max_slots = max(made, 2 * S0, 1)
    grid_slots = slot_grid(max_slots, slot_points)

    plan_slots = {}
    for kv in kvs:
        unbounded = D + kv
        extra = {split_slots(kv, ps, bpt, D, dev_states, state_b), unbounded}
        if kv == H0 and S0:
            extra.add(S0)
        plan_slots[kv] = (sorted({s for s in grid_slots if s < unbounded} | extra), unbounded)
    jobs_args = [(scenario, kv, s, warm, bpt, "plateau" if s == unb else "grid")
                 for kv, (ss, unb) in plan_slots.items() for s in ss]
    points = _map(_point_job, jobs_args, jobs, progress)

    # The inert threshold per KV size: a bracket from the grid, then bisection.
    rows, bis_args, bis_kv = [], [], []
    for kv, (ss, unb) in plan_slots.items():
        pts = sorted((p for p in points if p.host_tokens == kv), key=lambda p: p.slots)
        plateau = next(p for p in pts if p.slots == unb)
        limit = inert_fraction * plateau.host_hit_tokens
        row = {"host_kv_tokens_per_rank": kv, "host_kv_gb_per_rank": kv * bpt / 1e9,
               "unbounded_slots": unb, "plateau_host_hit_tokens": plateau.host_hit_tokens,
               "plateau_host_hit_rate": plateau.host_hit_rate,
               "inert_below_host_hit_tokens": limit}
        if plateau.host_hit_tokens == 0:
            row.update(status="no host hits at any slot count", inert_threshold_slots=None)
            rows.append(row)
            continue
        first = next(i for i, p in enumerate(pts) if p.host_hit_tokens >= limit)
        hi = pts[first].slots
        lo = pts[first - 1].slots if first else 0
        row["_bracket"] = (lo, hi)
        rows.append(row)
        if hi - lo > 1:
            bis_args.append((scenario, kv, lo, hi, limit, warm, bpt))
            bis_kv.append(kv)
    found = dict(zip(bis_kv, _map(_bisect_job, bis_args, jobs, progress, len(points),
                                  len(points) + len(bis_args))))
    for row in rows:
        br = row.pop("_bracket", None)
        if br is None:
            continue
        kv = row["host_kv_tokens_per_rank"]
        if kv in found:
            t, ran = found[kv]
            points.extend(ran)
        else:
            t = br[0]
        row["inert_threshold_slots"] = t
        row["status"] = ("never inert: one slot already gives host hits" if t == 0 else
                         f"inert at {t} slots and below, not at {t + 1}")

    # The FULL-only one-pass model at the same KV sizes (it cannot see states).
    model = make_plan(_with_host(scenario, H0 or kvs[0]), warmup=warmup, check_points=0, opt_points=0, grid_points=max(3, len(kvs) + 1),
        max_host_gb=kvs[-1] * bpt / 1e9, policies=[("write_back", "duplicate_first")])
    # the one-pass model's curves: write_back (device + host) or write_through (the
    # larger tier; also the bound for write_through_selective, which it has no curve for)
    curve = "write_back" if plan_write_policy(scenario) == "write_back" else "write_through"
    ranks = _ranks_per_node(scenario)
    by = {(p.host_tokens, p.slots): p for p in points}
    for row in rows:
        kv, g = row["host_kv_tokens_per_rank"], row["host_kv_gb_per_rank"]
        row["model_host_hit_rate"] = float(
            np.interp(g, model.grid_gb, model.model[curve]) - model.model["dev"][0])
        sp = split_slots(kv, ps, bpt, D, dev_states, state_b)
        row["sglang_split_slots"] = sp
        row["sglang_split_host_hit_rate"] = by[(kv, sp)].host_hit_rate
        t = row.get("inert_threshold_slots")
        row["inert_threshold_slots_per_kv_gb"] = None if t is None else t / g
        row["inert_threshold_slots_per_node"] = None if t is None else t * ranks
        row["sglang_split_inert"] = (None if t is None else sp <= t)
    points.sort(key=lambda p: (p.host_tokens, p.slots))
    own = by.get((H0, S0)) if H0 else None
    doc = {
        "scenario": scenario.name,
        "kind": "hybrid_mamba",
        "hybrid_preset": scenario.model.hybrid_preset,
        "requests": n,
        "warmup_fraction": warmup,
        "warmup_requests": warm,
        "page_size": ps,
        "bytes_per_token": bpt,
        "state_bytes_per_rank": state_b,
        "device_tokens_per_rank": D,
        "device_gb_per_rank": D * bpt / 1e9,
        "device_state_slots_per_rank": dev_states,
        "scenario_host_tokens_per_rank": H0,
        "scenario_host_state_slots_per_rank": S0,
        "ranks_per_node": ranks,
        "workload_states": made,
        "slot_grid": grid_slots,
        "inert_fraction": inert_fraction,
        "inert_rule": (f"a slot count is inert when its host hit tokens are below "
                       f"{inert_fraction:.0%} of the plateau (the host hit tokens with unbounded "
                       f"slots, device FULL + host KV tokens); the threshold T is inert and "
                       f"T + 1 is not, found by bisection from the grid's first non-inert count"),
        "model_note": ("the one-pass model is FULL-only (token reuse, an LRU of device + host "
                       "KV under write_back, of the larger tier under write_through): it "
                       "cannot see Mamba states, so model_host_hit_rate is the same at every "
                       "slot count; every other figure is an engine run"),
        "write_policy": plan_write_policy(scenario),
        "kv_sizes": rows,
        "scenario_engine": None if own is None else asdict(own),
        "verdicts": sorted({str(p.verdict) for p in points}),
    }
    return HybridPlan(doc, points)


def _with_host(scenario, kv: int):
    """``scenario`` with a host tier of ``kv`` tokens (for the model, which reads only
    the device and the host range)."""
    from sim.scenario import Host

    return scenario.model_copy(update={
        "host": Host(tokens=kv, mamba_states=1),
        "cache": scenario.cache.model_copy(update={"write_policy": "write_back"})})


def hybrid_plan_table(plan: HybridPlan):
    """Every engine point as a DataFrame (plan.parquet)."""
    import pandas as pd

    ranks = plan.doc["ranks_per_node"]
    df = pd.DataFrame([asdict(p) for p in plan.points])
    df = df.rename(columns={"host_tokens": "host_kv_tokens_per_rank",
                            "host_gb": "host_kv_gb_per_rank", "slots": "host_state_slots_per_rank"})
    df["host_kv_gb_per_node"] = df["host_kv_gb_per_rank"] * ranks
    return df


def fmt_int(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,}"
