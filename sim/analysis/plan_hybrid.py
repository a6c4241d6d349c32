"""Capacity planning for a hybrid: host hit rate against host KV GB and the second
component's host pool per rank (host Mamba state slots for (FULL, MAMBA), host SWA
tokens for (FULL, SWA)), and the size at or below which the host tier goes inert.

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

(FULL, SWA)
-----------
The same plan over one generic axis (``Axis``): the second host pool is
``host.swa_tokens`` per rank (docs/HYBRID.md §5.8, §10). A match may end on host-only
SWA only when the window's SWA is on a tier, and a load-back restores the window's
host-only SWA (``swa.py`` match validator, ``build_hicache_transfers(LOAD_BACK)``):
host FULL whose window was evicted from the SWA host pool gives no host hit there.
The grid runs in whole pages from one page to ``device SWA + the largest host KV``
(no more SWA can sit on host than FULL tokens on the tiers; that count is also the
**unbounded** one at each KV size, where the SWA host pool never evicts); SGLang's
count beside a KV size is its default sizing as the scenario resolves it
(``build_hybrid_swa_group``: each host pool from its own device pool by
``--hicache-ratio``, or by its ``--hicache-size`` share with ``host.size_gb``). The
bisection steps in pages; the threshold ``T`` is in SWA tokens, ``T`` inert and
``T + page`` not. A (FULL, SWA) scenario with ``host: off`` is refused: its host
sizing (which pools, which ratio) is the scenario's to give.

Warm-up as in ``sim.analysis.plan``: hit tokens count only requests from
``warm_requests(n, warmup)`` on.
"""

from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass

import numpy as np

from sim.analysis.plan import make_plan, plan_trace, warm_requests
from sim.errors import UserError
from sim.hybrid import pools
from sim.runner import run_scenario
from sim.scenario import Host, _ranks_per_node, resolve_sizing
from sim.sizing import host_tokens_for_gb

INERT_FRACTION = 0.01
KV_POINTS = 3
SLOT_POINTS = 8


@dataclass(frozen=True)
class Axis:
    """The plan's second axis: the hybrid's other host pool, per rank. The doc's and
    the table's names come from here (a Mamba plan keeps its slot names)."""
    kind: str          # model.hybrid().kind
    key: str           # doc keys: inert_threshold_<key>, unbounded_<key>, ...
    label: str         # figure and table: "host Mamba state slots"
    unit: str          # "slots" / "SWA tokens"
    host_field: str    # the sim.scenario.Host key it sets
    column: str        # plan.parquet's column for it
    sglang: str        # "split" (--hicache-size's split) or "default" (the scenario's sizing)
    device_key: str    # doc key of the device pool's size
    own_key: str       # doc key of the scenario's host pool
    grid_key: str
    bytes_key: str
    summary: tuple     # the run summary's hybrid keys: used, host frees, hits with it
    names: tuple       # their names in plan.json / plan.parquet


AXES = {
    "mamba": Axis("mamba", "slots", "host Mamba state slots", "slots", "mamba_states",
                  "host_state_slots_per_rank", "split", "device_state_slots_per_rank",
                  "scenario_host_state_slots_per_rank", "slot_grid", "state_bytes_per_rank",
                  ("host_states_used", "state_host_frees", "host_hits_with_state"),
                  ("host_states_used", "state_host_frees", "host_hits_with_state")),
    "swa": Axis("swa", "swa_tokens", "host SWA tokens", "SWA tokens", "swa_tokens",
                "host_swa_tokens_per_rank", "default", "device_swa_tokens_per_rank",
                "scenario_host_swa_tokens_per_rank", "swa_token_grid", "swa_bytes_per_token",
                ("host_swa_used", "swa_host_free_tokens", "host_hits_with_swa"),
                ("host_swa_tokens_used", "swa_host_free_tokens", "host_hits_with_swa")),
}


def axis_of(kind: str) -> Axis:
    """The axis of a plan doc's ``kind`` (``hybrid_mamba``) or a hybrid kind."""
    return AXES[kind.removeprefix("hybrid_")]


@dataclass
class HybridPoint:
    host_tokens: int
    host_gb: float
    aux: int                  # host Mamba state slots or host SWA tokens per rank
    input_tokens: int         # measured (after warm-up)
    host_hit_tokens: int
    device_hit_tokens: int
    hit_rate: float
    device_hit_rate: float
    host_hit_rate: float
    host_aux_used: int        # the axis's names: host_states_used / host_swa_tokens_used
    aux_host_frees: int
    host_hits_with_aux: int
    verdict: str | None
    probe: str = "grid"       # "grid", "plateau" (the unbounded count) or "bisect"

    @property
    def slots(self) -> int:
        return self.aux

    def named(self, axis: Axis) -> dict:
        """As plan.json holds it: the axis's own names for the generic fields."""
        d = asdict(self)
        out = {}
        for k, v in d.items():
            k = {"aux": axis.key, "host_aux_used": axis.names[0],
                 "aux_host_frees": axis.names[1], "host_hits_with_aux": axis.names[2]}.get(k, k)
            out[k] = v
        return out


def plan_write_policy(scenario) -> str:
    """The write policy the plan's engine runs use: the scenario's own when it has a
    host tier (each is modelled for (FULL, MAMBA), docs/HYBRID.md §5.9, §10), else
    write_back (the plan adds a host tier the scenario does not configure)."""
    return "write_back" if scenario.host.off else scenario.cache.write_policy


def hybrid_point(scenario, host_tokens: int, aux: int, warm: int, bpt: int,
                 probe: str = "grid") -> HybridPoint:
    """One engine run of ``scenario`` with ``host_tokens`` FULL host tokens and ``aux``
    of the axis's host pool per rank (Mamba state slots, SWA tokens), under
    ``plan_write_policy``."""
    axis = AXES[scenario.model.hybrid().kind]
    s = scenario.model_copy(update={
        "host": Host(tokens=host_tokens, **{axis.host_field: aux}),
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
    used, frees, with_aux = (int(hy.get(k, 0)) for k in axis.summary)
    return HybridPoint(host_tokens, host_tokens * bpt / 1e9, aux, inp, host, dev, rate(hit),
                       rate(dev), rate(host), used, frees, with_aux,
                       res.summary.get("verdict"), probe)


def _point_job(args):
    return hybrid_point(*args)


def bisect_inert(scenario, host_tokens: int, lo: int, hi: int, limit: float, warm: int,
                 bpt: int, step: int = 1) -> tuple[int, list]:
    """The largest ``T`` in ``[lo, hi)`` with ``T`` inert and ``T + step`` not, given
    ``lo`` inert (or 0) and ``hi`` not, both multiples of ``step`` (1 for state slots, a
    page for SWA tokens): bisection over engine runs. Returns ``T`` and the points it
    ran."""
    ran = []
    while hi - lo > step:
        mid = lo + (hi - lo) // step // 2 * step
        p = hybrid_point(scenario, host_tokens, mid, warm, bpt, "bisect")
        ran.append(p)
        if p.host_hit_tokens < limit:
            lo = mid
        else:
            hi = mid
    return lo, ran


def _bisect_job(args):
    return bisect_inert(*args)


def bisect_runs(lo: int, hi: int, step: int = 1) -> int:
    """The most engine runs :func:`bisect_inert` makes on ``[lo, hi)``: each run halves
    the bracket, rounding up, until it is one ``step`` wide."""
    n, runs = (hi - lo) // step, 0
    while n > 1:
        n, runs = n - n // 2, runs + 1
    return runs


def _map(fn, jobs_args, jobs: int, progress, done0: int = 0, total: int | None = None,
         weights=None):
    """``fn`` over ``jobs_args`` in submission order, ``jobs`` processes at a time;
    ``progress(done, total)`` after each, a job counting ``weights[i]`` runs (1 each
    by default)."""
    total = len(jobs_args) if total is None else total
    weights = [1] * len(jobs_args) if weights is None else weights
    if jobs <= 1 or len(jobs_args) <= 1:
        out = []
        done = done0
        for a, w in zip(jobs_args, weights):
            out.append(fn(a))
            done += w
            if progress:
                progress(done, total)
        return out

    out = [None] * len(jobs_args)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(fn, a): i for i, a in enumerate(jobs_args)}
        done = done0
        for f in as_completed(futures):
            out[futures[f]] = f.result()
            done += weights[futures[f]]
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


def slot_grid(max_slots: int, points: int, step: int = 1) -> list[int]:
    """``points`` counts from ``step`` to ``max_slots`` (a multiple of ``step``),
    geometrically spaced, rounded to whole ``step``s (pages for SWA tokens), unique."""
    if points <= 1:
        return [max_slots]
    return sorted({max(step, round(float(v) / step) * step)
                   for v in np.geomspace(step, max_slots, points)})


def split_slots(kv_tokens: int, page: int, bpt: int, device_full: int, device_states: int,
                state_bytes: int) -> int:
    """Host Mamba slots that SGLang's ``--hicache-size`` split gives beside a KV host
    pool of ``kv_tokens``: the size ``G`` whose KV share is ``kv_tokens`` tokens
    (``_split_hicache_size`` by device pool bytes), then ``MambaPoolHost``'s count
    for the Mamba share (``sim.hybrid.pools.hybrid_host_pools``)."""
    kv_b = pools.kv_pool_bytes(device_full, page, bpt)
    m_b = pools.mamba_pool_bytes(device_states, state_bytes)
    g = kv_tokens * bpt / 1e9 * (kv_b + m_b) / kv_b
    return pools.hybrid_host_pools("mamba", device_full, device_states, page, bpt, state_bytes,
                                   hicache_gb=g)[1]


def default_swa_tokens(scenario, kv_tokens: int, page: int, bpt: int, device_full: int,
                       device_swa: int, swa_bytes: int) -> int:
    """Host SWA tokens SGLang's default sizing gives beside a FULL host pool of
    ``kv_tokens``, as the scenario sizes its host (``build_hybrid_swa_group``): with
    ``host.size_gb``, the ``--hicache-size`` whose FULL share is ``kv_tokens``, split
    by device pool bytes (``_split_hicache_size``); otherwise the ``--hicache-ratio``
    whose FULL pool is ``kv_tokens``, applied to the SWA device pool
    (``sim.hybrid.pools.hybrid_host_pools``)."""
    if scenario.host.mode()[0] == "size_gb":
        kv_b = pools.kv_pool_bytes(device_full, page, bpt)
        swa_b = pools.kv_pool_bytes(device_swa, page, swa_bytes)
        g = kv_tokens * bpt / 1e9 * (kv_b + swa_b) / kv_b
        return pools.hybrid_host_pools("swa", device_full, device_swa, page, bpt, swa_bytes,
                                       hicache_gb=g)[1]
    # host_pool_size: (int(D * r) // page + 1) pages; the half token keeps int() off a
    # float just under the page boundary
    r = (kv_tokens - page + 0.5) / device_full
    return pools.hybrid_host_pools("swa", device_full, device_swa, page, bpt, swa_bytes,
                                   ratio=r)[1]


@dataclass
class HybridPlan:
    doc: dict          # everything plan.json holds
    points: list       # [HybridPoint], grid first, then the bisection probes


def check_hybrid(scenario) -> None:
    """The hybrid plan sizes host KV against the other component's host pool. A (FULL,
    SWA) scenario needs its own host tier: how its two host pools are sized (ratio,
    ``--hicache-size``) is the scenario's, and the plan varies them from there."""
    h = scenario.model.hybrid()
    if h is not None and h.kind == "swa" and scenario.host.off:
        raise UserError(f"found host: off for the (FULL, SWA) hybrid "
                        f"{scenario.model.hybrid_preset!r} (model.hybrid_preset); expected a "
                        "host tier (host.ratio, host.size_gb, or host.tokens with "
                        "host.swa_tokens): plan sizes host SWA tokens beside host KV",
                        where=f"{scenario.source}: host")


def make_hybrid_plan(scenario, *, warmup: float = 0.0, max_host_gb: float | None = None,
                     kv_points: int = KV_POINTS, slot_points: int = SLOT_POINTS,
                     max_slots: int | None = None, jobs: int = 1,
                     inert_fraction: float = INERT_FRACTION, progress=None) -> HybridPlan:
    """The plan. ``slot_points`` / ``max_slots`` are the second axis's points and
    end whatever its kind (state slots, or host SWA tokens in a multiple of
    page_size)."""
    check_hybrid(scenario)
    if not 0.0 <= warmup < 1.0:
        raise UserError(f"found {warmup!r}; expected a fraction in [0, 1)", where="--warmup")
    if not 0.0 < inert_fraction < 1.0:
        raise UserError(f"found {inert_fraction!r}; expected a fraction in (0, 1)",
                        where="--inert-fraction")
    axis = AXES[scenario.model.hybrid().kind]
    swa = axis.kind == "swa"
    info = resolve_sizing(scenario)
    D, H0, bpt = info["device_tokens"], info["host_tokens"], info["bytes_per_token"]
    hy = info["hybrid"]
    dev_aux, aux_b = hy["aux_device"], hy["aux_bytes"]
    S0 = hy["aux_host"] if H0 else 0
    ps = scenario.page_size
    step = ps if swa else 1
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
    if swa:
        # no more SWA can be on host than FULL tokens on the tiers (an SWA host slice
        # covers its node, which lives while its FULL is on one): device SWA + host KV
        # at the largest KV size bounds the grid
        made = None
        unbounded_of = lambda kv: dev_aux + kv
        if max_slots is not None and max_slots % ps:
            raise UserError(f"found {max_slots!r}; expected a multiple of page_size {ps} "
                            "(host SWA tokens)", where="--max-aux")
        if max_slots is None:
            max_slots = unbounded_of(kvs[-1])

        def sglang(kv):
            return default_swa_tokens(scenario, kv, ps, bpt, D, dev_aux, aux_b)
    else:
        made = workload_states(trace, scenario.scheduler.chunked_prefill_tokens)
        unbounded_of = lambda kv: D + kv
        if max_slots is None:
            max_slots = max(made, 2 * S0, 1)

        def sglang(kv):
            return split_slots(kv, ps, bpt, D, dev_aux, aux_b)
    grid_slots = slot_grid(max_slots, slot_points, step)

    plan_slots = {}
    for kv in kvs:
        unbounded = unbounded_of(kv)
        extra = {sglang(kv), unbounded}
        if kv == H0 and S0:
            extra.add(S0)
        plan_slots[kv] = (sorted({s for s in grid_slots if s < unbounded} | extra), unbounded)
    jobs_args = [(scenario, kv, s, warm, bpt, "plateau" if s == unb else "grid")
                 for kv, (ss, unb) in plan_slots.items() for s in ss]
    # The runs counted up front, so progress has one total from the first run: the
    # grid, and per KV size the most bisection runs any bracket between its grid
    # points can take (a size that needs fewer, or none, is credited them when known).
    bound = {kv: max(bisect_runs(lo, hi, step) for lo, hi in zip([0] + ss[:-1], ss))
             for kv, (ss, _) in plan_slots.items()}
    total = len(jobs_args) + sum(bound.values())
    points = _map(_point_job, jobs_args, jobs, progress, 0, total)

    k = axis.key
    # The inert threshold per KV size: a bracket from the grid, then bisection.
    rows, bis_args, bis_kv = [], [], []
    for kv, (ss, unb) in plan_slots.items():
        pts = sorted((p for p in points if p.host_tokens == kv), key=lambda p: p.aux)
        plateau = next(p for p in pts if p.aux == unb)
        limit = inert_fraction * plateau.host_hit_tokens
        row = {"host_kv_tokens_per_rank": kv, "host_kv_gb_per_rank": kv * bpt / 1e9,
               f"unbounded_{k}": unb, "plateau_host_hit_tokens": plateau.host_hit_tokens,
               "plateau_host_hit_rate": plateau.host_hit_rate,
               "inert_below_host_hit_tokens": limit}
        if plateau.host_hit_tokens == 0:
            row.update({"status": f"no host hits at any {'host SWA size' if swa else 'slot count'}",
                        f"inert_threshold_{k}": None})
            rows.append(row)
            continue
        first = next(i for i, p in enumerate(pts) if p.host_hit_tokens >= limit)
        hi = pts[first].aux
        lo = pts[first - 1].aux if first else 0
        row["_bracket"] = (lo, hi)
        rows.append(row)
        if hi - lo > step:
            bis_args.append((scenario, kv, lo, hi, limit, warm, bpt, step))
            bis_kv.append(kv)
    done = len(points) + sum(b for kv, b in bound.items() if kv not in bis_kv)
    if progress and bound and done > len(points):
        progress(done, total)
    found = dict(zip(bis_kv, _map(_bisect_job, bis_args, jobs, progress, done, total,
                                  [bound[kv] for kv in bis_kv])))
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
        row[f"inert_threshold_{k}"] = t
        if swa:
            row["status"] = ("never inert: one page of host SWA already gives host hits"
                             if t == 0 else f"inert at {t} host SWA tokens and below, not at "
                             f"{t + step}")
        else:
            row["status"] = ("never inert: one slot already gives host hits" if t == 0 else
                             f"inert at {t} slots and below, not at {t + 1}")

    # The FULL-only one-pass model at the same KV sizes (it cannot see states).
    model = make_plan(_with_host(scenario, H0 or kvs[0]), warmup=warmup, check_points=0, opt_points=0, grid_points=max(3, len(kvs) + 1),
        max_host_gb=kvs[-1] * bpt / 1e9, policies=[("write_back", "duplicate_first")])
    # the one-pass model's curves: write_back (device + host) or write_through (the
    # larger tier; also the bound for write_through_selective, which it has no curve for)
    curve = "write_back" if plan_write_policy(scenario) == "write_back" else "write_through"
    ranks = _ranks_per_node(scenario)
    by = {(p.host_tokens, p.aux): p for p in points}
    sg = f"sglang_{axis.sglang}"
    for row in rows:
        kv, g = row["host_kv_tokens_per_rank"], row["host_kv_gb_per_rank"]
        row["model_host_hit_rate"] = float(
            np.interp(g, model.grid_gb, model.model[curve]) - model.model["dev"][0])
        sp = sglang(kv)
        row[f"{sg}_{k}"] = sp
        row[f"{sg}_host_hit_rate"] = by[(kv, sp)].host_hit_rate
        t = row.get(f"inert_threshold_{k}")
        row[f"inert_threshold_{k}_per_kv_gb"] = None if t is None else t / g
        row[f"inert_threshold_{k}_per_node"] = None if t is None else t * ranks
        row[f"{sg}_inert"] = (None if t is None else sp <= t)
    points.sort(key=lambda p: (p.host_tokens, p.aux))
    own = by.get((H0, S0)) if H0 else None
    if swa:
        rule = (f"a host SWA size is inert when its host hit tokens are below "
                f"{inert_fraction:.0%} of the plateau (the host hit tokens with unbounded host "
                f"SWA, device SWA + host KV tokens); the threshold T is inert and T + one page "
                f"({ps} tokens) is not, found by bisection in pages from the grid's first "
                f"non-inert size")
        note = ("the one-pass model is FULL-only (token reuse, an LRU of device + host KV "
                "under write_back, of the larger tier under write_through): it cannot see "
                "SWA windows, so model_host_hit_rate is the same at every host SWA size; "
                "every other figure is an engine run")
    else:
        rule = (f"a slot count is inert when its host hit tokens are below "
                f"{inert_fraction:.0%} of the plateau (the host hit tokens with unbounded "
                f"slots, device FULL + host KV tokens); the threshold T is inert and "
                f"T + 1 is not, found by bisection from the grid's first non-inert count")
        note = ("the one-pass model is FULL-only (token reuse, an LRU of device + host "
                "KV under write_back, of the larger tier under write_through): it "
                "cannot see Mamba states, so model_host_hit_rate is the same at every "
                "slot count; every other figure is an engine run")
    doc = {
        "scenario": scenario.name,
        "kind": f"hybrid_{axis.kind}",
        "hybrid_preset": scenario.model.hybrid_preset,
        "requests": n,
        "warmup_fraction": warmup,
        "warmup_requests": warm,
        "page_size": ps,
        "bytes_per_token": bpt,
        axis.bytes_key: aux_b,
        "device_tokens_per_rank": D,
        "device_gb_per_rank": D * bpt / 1e9,
        axis.device_key: dev_aux,
        "scenario_host_tokens_per_rank": H0,
        axis.own_key: S0,
        "ranks_per_node": ranks,
    }
    if swa:
        doc["sliding_window"] = scenario.model.hybrid().sliding_window
    else:
        doc["workload_states"] = made
    doc.update({
        axis.grid_key: grid_slots,
        "inert_fraction": inert_fraction,
        "inert_rule": rule,
        "model_note": note,
        "write_policy": plan_write_policy(scenario),
        "kv_sizes": rows,
        "scenario_engine": None if own is None else own.named(axis),
        "verdicts": sorted({str(p.verdict) for p in points}),
    })
    return HybridPlan(doc, points)


def _with_host(scenario, kv: int):
    """``scenario`` with a host tier of ``kv`` tokens (for the model, which reads only
    the device and the host range)."""
    axis = AXES[scenario.model.hybrid().kind]
    return scenario.model_copy(update={
        "host": Host(tokens=kv, **{axis.host_field: scenario.page_size if axis.kind == "swa"
                                   else 1}),
        "cache": scenario.cache.model_copy(update={"write_policy": "write_back"})})


def hybrid_plan_table(plan: HybridPlan):
    """Every engine point as a DataFrame (plan.parquet)."""
    import pandas as pd  # here, not at the top: importing the module stays light (pandas is slow to load)

    axis = axis_of(plan.doc["kind"])
    ranks = plan.doc["ranks_per_node"]
    df = pd.DataFrame([asdict(p) for p in plan.points])
    df = df.rename(columns={"host_tokens": "host_kv_tokens_per_rank",
                            "host_gb": "host_kv_gb_per_rank", "aux": axis.column,
                            "host_aux_used": axis.names[0], "aux_host_frees": axis.names[1],
                            "host_hits_with_aux": axis.names[2]})
    df["host_kv_gb_per_node"] = df["host_kv_gb_per_rank"] * ranks
    return df


def fmt_int(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,}"
