"""Reproducing TP divergence failures: search, shrink, bundle, replay.

What this is for: a jitter scenario fails on some seeds (the ranks' trees diverge and
SGLang's digest assertion fires, a collective hangs, or the divergence goes unseen).
``repro`` turns that into a small, self-contained, replayable case:

1. **search** (``search``): try i runs the scenario with seed ``base + i`` (both the
   scenario seed and ``jitter.seed``) until a run's verdict is a failure (detected,
   false_alarm, hang, size_mismatch, missed). An optional wall-time budget is checked
   between tries only.
2. **shrink** (``shrink``): the failing case becomes knobs (requests, ranks, device
   and host pages, running-request cap, the jitter's own parameters) that
   ``sim.analysis.shrink.minimise`` (Hypothesis's shrinker) reduces while the run still
   fails with the same failure class (verdict, how it failed, first fork's cause).
3. **bundle** (``write_bundle``): the minimal scenario, each rank's schedule and
   op-trace, a report of the first divergent event (victims, tree diff, digest
   timeline) and ``bundle.json`` (verdict, sizes before/after, seeds, version).
4. **replay** (``verify_bundle``): re-run the bundle's scenario and its op-traces and
   check the failure reproduces exactly.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sim import __version__
from sim.atomic import write_json, write_text
from sim.collectives import CollectiveError
from sim.constants import DIGEST_MISMATCH_MESSAGE
from sim.errors import UserError
from sim.events import Simulation

# Verdicts that are failures, as divergence.json spells them (sim/events.py).
FAILURE_VERDICTS = ("detected", "false_alarm", "hang", "size_mismatch", "missed")
# Fork causes (sim/events.py, sim/ranks.py) -> the jitter class that produced them.
CAUSE_CLASS = {"ack_local_drain": "ack_local", "id_drift": "id_drift",
               "request_order": "request_order", "host_capacity_skew": "host_capacity_skew",
               "host_alloc_failure": "host_alloc_failure"}
BUNDLE_FORMAT = 1
# Trace files up to this size are copied into a bundle; larger ones stay absolute.
COPY_INPUT_LIMIT = 32 << 20
# Ops shown before / after the first divergent op in the report's victim window.
WINDOW_BEFORE, WINDOW_AFTER = 5, 15


# ----------------------------------------------------------------------------------
# Running a case, with the schedule recorded
# ----------------------------------------------------------------------------------


class _RecordingCollective:
    """Wraps the engine's collective to log every call: who joined, with what vector
    (ready counts and ``[digest, -digest]``), and the MIN result or the error."""

    def __init__(self, inner, sim: TracingSimulation):
        self.inner = inner
        self.sim = sim

    def all_reduce_min(self, tag: str, vectors: dict) -> list:
        sim = self.sim
        rec = {"call": len(sim.calls) + 1, "t": sim.env.now, "step": sim.step_no, "tag": tag,
               "vectors": {str(r): list(v) for r, v in sorted(vectors.items())}}
        rec["g"] = sim.tick()
        sim.calls.append(rec)
        try:
            out = self.inner.all_reduce_min(tag, vectors)
        except CollectiveError as err:
            rec["error"] = str(err)
            raise
        rec["min"] = list(out)
        return out

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name):
        return getattr(self.inner, name)


class TracingSimulation(Simulation):
    """The engine, plus when each op, fork and collective happened (the schedule) and
    which host allocations failed (a rank-local draw op-traces cannot express)."""

    def __init__(self, cfg, workload, cost=None, **kwargs):
        super().__init__(cfg, workload, cost, **kwargs)
        self._clock = 0
        self.op_at: dict[int, tuple[int, float, int]] = {}  # id(op) -> (order, t, step)
        self.calls: list[dict] = []
        self.fork_order: list[int] = [-1] * len(self.group.forks)  # t=0 forks come first
        self.collective = _RecordingCollective(self.collective, self)
        self.alloc_failures: dict[int, list[list[int]]] = {}
        for c in self.group.cohorts:
            if c.tree.host_alloc_fail is not None and c.ops is not None:
                self._watch_host_allocs(c)

    def tick(self) -> int:
        self._clock += 1
        return self._clock

    def _op(self, c, op):
        Simulation._op(c, op)
        if c.ops is not None:
            self.op_at[id(op)] = (self.tick(), self.env.now, self.step_no)

    def _fork(self, rank, cause, now, detail=""):
        n = len(self.group.forks)
        c = super()._fork(rank, cause, now, detail)
        self.fork_order += [self.tick() for _ in range(len(self.group.forks) - n)]
        return c

    def _watch_host_allocs(self, c) -> None:
        """Log ``[op index, attempt]`` of each failed host allocation of ``c``'s rank.
        The engine records an op before applying it, so the op being applied is the
        last one recorded (op-trace output index ``len(c.ops)``)."""
        draw = c.tree.host_alloc_fail
        log = self.alloc_failures.setdefault(c.ranks[0], [])
        cur = {"i": -1, "a": 0}

        def host_alloc_fail() -> bool:
            i = len(c.ops)
            if cur["i"] != i:
                cur["i"], cur["a"] = i, 0
            a = cur["a"]
            cur["a"] += 1
            failed = draw()
            if failed:
                log.append([i, a])
            return failed

        c.tree.host_alloc_fail = host_alloc_fail


@dataclass
class Outcome:
    """One run of a case: its report (divergence.json) and, when recorded, the sim."""

    scenario: object
    cfg: object
    divergence: dict
    arrived: int          # requests that reached the scheduler before the run ended
    sim: Simulation
    recorded: bool

    @property
    def verdict(self) -> str:
        return self.divergence["verdict"]

    @property
    def failed(self) -> bool:
        return self.verdict in FAILURE_VERDICTS

    @property
    def failure_class(self) -> str | None:
        return failure_class(self.divergence)

    @property
    def events(self) -> int:
        """Recorded ops over every rank (ranks sharing a replica count once each)."""
        if not self.recorded:
            return 0
        return sum(len(c.ops) * len(c.ranks) for c in self.sim.group.cohorts)


def run_case(scenario, *, record: bool = False) -> Outcome:
    """Simulate a validated scenario; ``record`` keeps per-rank ops and the schedule."""
    from sim.runner import prepare

    scenario, cfg, cost, workload = prepare(scenario)
    cfg.record_ops = record
    pulled = _Pulled(workload)
    sim = (TracingSimulation if record else Simulation)(cfg, workload=pulled, cost=cost)
    sim.run()
    div = sim.report()
    # Requests the scheduler saw: a halted batch is in neither waiting nor active, so
    # count arrival times instead (the engine drops arrivals after duration_s).
    end = sim.env.now if cfg.duration_s is None else min(sim.env.now, cfg.duration_s)
    arrived = sum(1 for a in pulled.arrivals if a <= end)
    return Outcome(scenario, cfg, div, arrived, sim, record)


class _Pulled:
    """A request stream that remembers the arrival time of each request it handed out."""

    def __init__(self, workload):
        self._it = iter(workload)
        self.arrivals: list[float] = []

    def __iter__(self):
        return self

    def __next__(self):
        req = next(self._it)
        self.arrivals.append(req.arrival)
        return req


def first_failure(div: dict) -> tuple[str, dict] | None:
    """The failure a real server hits first, as ``(kind, record)``: kind is
    "collective", "digest" or "batch" (the order ``Simulation.report`` ranks them in
    within one step: the sync collective, then its digest check, then admission)."""
    found = []
    for prio, (kind, key) in enumerate((("collective", "collective_error"),
                                        ("digest", "digest_mismatch"), ("batch", "batch_mismatch"))):
        rec = div.get(key)
        if rec:
            found.append((rec["t"], rec["step"], prio, kind, rec))
    if not found:
        return None
    first = min(found, key=lambda x: x[:3])
    return first[3], first[4]


def failure_class(div: dict) -> str | None:
    """What kind of failure a report shows; None for agree/absorbed. Shrinking keeps it."""
    v = div["verdict"]
    if v not in FAILURE_VERDICTS:
        return None
    first = first_failure(div)
    if first is None:
        how = "undetected divergence"
    elif first[0] == "collective":
        how = f"collective {first[1]['kind']}"
    elif first[0] == "batch":
        how = f"batch mismatch ({first[1]['where']})"
    else:
        how = "digest assertion"
    forks = div.get("forks") or []
    cause = forks[0]["cause"] if forks else "none"
    return f"{v}: {how}; first fork: {cause}"


def jitter_class(div: dict, cfg) -> str:
    """The jitter class that caused the failure: the first fork's cause, else the ack
    discipline (a skipped collective forks nothing)."""
    forks = div.get("forks") or []
    if forks:
        return CAUSE_CLASS.get(forks[0]["cause"], forks[0]["cause"])
    if cfg.jitter.ack_discipline != "synced":
        return cfg.jitter.ack_discipline
    return "ack_delay" if cfg.jitter.ack_delay != "none" else "none"


def failure_time(div: dict) -> float:
    """When the first failure became visible (inf for a divergence nothing noticed)."""
    first = first_failure(div)
    return math.inf if first is None else first[1]["t"]


def failure_line(div: dict) -> str:
    """One line saying how the first failure shows, as the real server would fail."""
    v = div["verdict"]
    first = first_failure(div)
    if first is None:
        d = div.get("first_true_divergence")
        if v == "missed" and d:
            return (f"undetected divergence: the trees differ from t={d['t']:.6f}s (step {d['step']}: "
                    f"{d['what']}) and the digest never noticed")
        return f"no failure ({v})"
    kind, rec = first
    if kind == "collective":
        return f"collective {rec['kind']} at t={rec['t']:.6f}s (step {rec['step']}): {rec['message']}"
    if kind == "batch":
        return (f"collective hang at t={rec['t']:.6f}s (step {rec['step']}): ranks took different "
                f"{rec['where']} decisions ({rec['detail']}), so the forward's TP collectives disagree")
    tail = "" if v == "detected" else " (false alarm: the trees are logically equal)"
    return f"AssertionError at t={rec['t']:.6f}s (step {rec['step']}): {DIGEST_MISMATCH_MESSAGE}{tail}"


# ----------------------------------------------------------------------------------
# Search
# ----------------------------------------------------------------------------------


def with_seed(scenario, seed: int):
    """The scenario with both its seed and its jitter's seed set to ``seed``."""
    jit = scenario.jitter.model_copy(update={"seed": seed})
    return scenario.model_copy(update={"seed": seed, "jitter": jit})


@dataclass
class SearchResult:
    outcome: Outcome | None   # the first failing run, recorded; None when none failed
    tries: int                # runs made
    seed: int | None          # the failing seed
    base_seed: int
    verdicts: list            # (seed, verdict) per try
    stopped: str              # "found", "tries" or "budget"


def search(scenario, *, tries: int = 20, budget_s: float | None = None, base_seed: int | None = None,
           clock: Callable[[], float] = time.monotonic, on_try: Callable | None = None) -> SearchResult:
    """Try seeds ``base, base + 1, ...`` until a run fails; the budget is checked
    between tries only, so a try is never cut short."""
    base = scenario.seed if base_seed is None else base_seed
    t0 = clock()
    verdicts = []
    for i in range(tries):
        if budget_s is not None and i > 0 and clock() - t0 >= budget_s:
            return SearchResult(None, i, None, base, verdicts, "budget")
        seed = base + i
        out = run_case(with_seed(scenario, seed))
        verdicts.append((seed, out.verdict))
        if on_try is not None:
            on_try(i, seed, out)
        if out.failed:
            return SearchResult(run_case(with_seed(scenario, seed), record=True), i + 1, seed, base,
                                verdicts, "found")
    return SearchResult(None, tries, None, base, verdicts, "tries")


# ----------------------------------------------------------------------------------
# Shrink
# ----------------------------------------------------------------------------------


def _valid_tps(scenario) -> list[int]:
    spec = scenario.model.spec()
    out = []
    for tp in range(2, scenario.tp + 1):
        try:
            spec.check_tp(tp)
        except UserError:
            continue
        out.append(tp)
    return out


def _arrivals_until(scenario, t: float) -> int:
    from sim.workloads import build_workload

    n = 0
    for req in build_workload(scenario):
        if req.arrival > t:
            break
        n += 1
    return n


@dataclass
class CaseSpace:
    """A failing scenario as knobs: ``scenario(case)`` builds the scenario a case names.

    Ranks named by the jitter are folded into a smaller TP group as ``rank % tp`` (a
    delay on rank 3 of 4 becomes a delay on rank 1 of 2), so shrinking the ranks keeps
    the perturbation. Probabilities shrink towards 1 (the bug fires every time: sooner,
    and without randomness); delays shrink towards zero.
    """

    base: dict            # the scenario as data, capacities in tokens, seeds explicit
    knobs: list
    tps: list             # the valid TP sizes, ascending (the tp knob indexes them)
    rank_lists: dict      # jitter section -> original ranks it names

    def original(self) -> dict:
        return {k.name: k.original for k in self.knobs}

    def scenario(self, case: dict):
        """The scenario for ``case``; raises UserError when it is not a valid one."""
        from sim.scenario import scenario_from_dict

        d = copy.deepcopy(self.base)
        ps = d["page_size"]
        if "requests" in case:
            d["limits"]["max_requests"] = case["requests"]
        tp = self.tps[case["tp"]] if "tp" in case else d["tp"]
        d["tp"] = tp
        if "device_pages" in case:
            d["device"] = {"tokens": case["device_pages"] * ps}
        if "host_pages" in case:
            d["host"] = {"tokens": case["host_pages"] * ps}
        if "max_running" in case:
            d["scheduler"]["max_running_requests"] = case["max_running"]
        if case.get("keep_running") is False:
            d["on_divergence"] = "halt"
        j = d["jitter"]

        def kept(section: str) -> list[int]:
            out = []
            for r in self.rank_lists.get(section, ()):
                if case.get(f"{section}_rank{r}", True) and r % tp not in out:
                    out.append(r % tp)
            return out

        def towards_one(p: float, knob: str) -> float:
            v = case.get(knob, 100)  # 100: the original probability, 0: probability 1
            return p + (1.0 - p) * (100 - v) / 100

        if "ack_delay" in self.rank_lists:
            ranks = kept("ack_delay")
            if ranks:
                ad = j["ack_delay"]
                ad["ranks"] = ranks
                pct = case.get("ack_delay_pct", 100)
                for p in ("value", "low", "high", "mean"):
                    if p in ad:
                        ad[p] = ad[p] * pct / 100
                if "ack_delay_acks" in case:
                    ad["acks"] = ("write", "load", "both")[case["ack_delay_acks"]]
            else:
                j["ack_delay"] = {"dist": "none", "acks": "both"}
        if "host_alloc_failure" in self.rank_lists:
            ranks = kept("host_alloc_failure")
            if ranks:
                hf = j["host_alloc_failure"]
                hf["ranks"] = ranks
                hf["probability"] = towards_one(hf["probability"], "host_alloc_failure_p")
            else:
                j["host_alloc_failure"] = {"probability": 0.0}
        if "host_capacity_skew" in self.rank_lists:
            skew = {}
            for r in self.rank_lists["host_capacity_skew"]:
                delta = self.base["jitter"]["host_capacity_skew"][r]
                if case.get(f"host_capacity_skew_rank{r}", True) and r % tp not in skew:
                    pages = case.get(f"skew_pages{r}", abs(delta) // ps)
                    skew[r % tp] = (1 if delta > 0 else -1) * pages * ps
            j["host_capacity_skew"] = skew
        if j.get("id_drift") is not None:
            j["id_drift"]["rank"] %= tp
            if "drift_after" in case:
                j["id_drift"]["after_request"] = case["drift_after"]
            if "drift_extra" in case:
                j["id_drift"]["extra_ids"] = case["drift_extra"]
        if "request_order" in self.rank_lists:
            ranks = kept("request_order")
            if ranks:
                ro = j["request_order"]
                ro["ranks"] = ranks
                ro["swap_probability"] = towards_one(ro["swap_probability"], "request_order_p")
                if "order_window" in case:
                    ro["window"] = case["order_window"]
            else:
                j["request_order"] = {"swap_probability": 0.0, "window": 2}
        return scenario_from_dict(d, where="<shrunk case>")


def case_space(scenario, requests: int | None) -> CaseSpace:
    """The knobs of a failing (seeded) scenario; ``requests`` is the request count the
    search space starts from (None: keep the scenario's limits, no request knob).

    Knob order matters: Hypothesis prefers simplifying earlier choices, so the request
    count comes first, then ranks, capacities, and the jitter's own parameters.
    """
    from sim.analysis.shrink import Knob
    from sim.scenario import resolve_capacities

    d = scenario.model_dump(mode="python", exclude_none=True)
    ps = scenario.page_size
    dev, host = resolve_capacities(scenario)
    d["device"] = {"tokens": dev}
    d["host"] = {"tokens": host}
    d["jitter"]["seed"] = scenario.seed if scenario.jitter.seed is None else scenario.jitter.seed
    d.setdefault("limits", {})
    knobs = []
    if requests is not None:
        d["limits"]["max_requests"] = requests
        knobs.append(Knob("requests", requests, 1, requests))
    tps = _valid_tps(scenario)
    if len(tps) > 1:
        knobs.append(Knob("tp", tps.index(scenario.tp), 0, len(tps) - 1))
    knobs += [Knob("device_pages", dev // ps, 1, dev // ps), Knob("host_pages", host // ps, 1, host // ps)]
    mr = scenario.scheduler.max_running_requests
    if mr is not None and mr > 1:
        knobs.append(Knob("max_running", mr, 1, mr))
    if scenario.on_divergence == "record":
        knobs.append(Knob("keep_running", True, kind="bool"))  # False: halt at the failure
    j = scenario.jitter
    all_ranks = list(range(scenario.tp))
    lists: dict[str, list[int]] = {}

    def rank_knobs(section: str, ranks) -> None:
        lists[section] = list(ranks) if ranks is not None else all_ranks
        if len(lists[section]) > 1:
            knobs.extend(Knob(f"{section}_rank{r}", True, kind="bool") for r in lists[section])

    if j.ack_delay.dist != "none":
        rank_knobs("ack_delay", j.ack_delay.ranks)
        knobs.append(Knob("ack_delay_pct", 100, 1, 100))
        if j.ack_delay.acks == "both":
            knobs.append(Knob("ack_delay_acks", 2, 0, 2))
    if j.host_alloc_failure.probability > 0:
        rank_knobs("host_alloc_failure", j.host_alloc_failure.ranks)
        if j.host_alloc_failure.probability < 1:
            knobs.append(Knob("host_alloc_failure_p", 100, 0, 100))
    skew = [int(r) for r, v in j.host_capacity_skew.items() if v]
    if skew:
        d["jitter"]["host_capacity_skew"] = {int(r): int(v) for r, v in j.host_capacity_skew.items()}
        rank_knobs("host_capacity_skew", skew)
        for r in skew:
            knobs.append(Knob(f"skew_pages{r}", abs(j.host_capacity_skew[r]) // ps, 1,
                              abs(j.host_capacity_skew[r]) // ps))
    if j.id_drift is not None:
        knobs.append(Knob("drift_after", j.id_drift.after_request, 0, j.id_drift.after_request))
        if j.id_drift.extra_ids > 1:
            knobs.append(Knob("drift_extra", j.id_drift.extra_ids, 1, j.id_drift.extra_ids))
    if j.request_order.swap_probability > 0:
        rank_knobs("request_order", j.request_order.ranks)
        if j.request_order.swap_probability < 1:
            knobs.append(Knob("request_order_p", 100, 0, 100))
        if j.request_order.window > 2:
            knobs.append(Knob("order_window", j.request_order.window, 2, j.request_order.window))
    return CaseSpace(d, knobs, tps, lists)


@dataclass
class ShrinkInfo:
    case: dict
    original: dict
    runs: int
    started_from_original: bool
    exhausted: bool


def shrink(outcome: Outcome, *, max_runs: int = 150, seed: int = 0) -> tuple[Outcome, ShrinkInfo]:
    """The smallest scenario failing with ``outcome``'s failure class, and how it went.

    The request knob starts at the requests that arrived by the failure (later ones
    cannot have caused it) when that still fails the same way, else at all arrived.
    """
    from sim.analysis.shrink import minimise

    want = outcome.failure_class
    scenario = outcome.scenario
    tf = failure_time(outcome.divergence)
    starts = [outcome.arrived]
    if math.isfinite(tf):
        early = min(_arrivals_until(scenario, tf), outcome.arrived)
        if 0 < early < outcome.arrived:
            starts.insert(0, early)
    for n in starts:
        space = case_space(scenario, n)
        if _fails_as(space, space.original(), want):
            break
    else:  # capping the requests changed the run: shrink everything but the requests
        space = case_space(scenario, None)

    res = minimise(space.knobs, lambda case: _fails_as(space, case, want), max_runs=max_runs, seed=seed)
    final = run_case(space.scenario(res.case), record=True)
    if final.failure_class != want:  # cannot happen for a deterministic engine
        raise RuntimeError(f"shrunk case does not fail as {want!r} (got {final.failure_class!r})")
    return final, ShrinkInfo(res.case, res.original, res.runs, res.started_from_original, res.exhausted)


def _fails_as(space: CaseSpace, case: dict, want: str) -> bool:
    try:
        scn = space.scenario(case)
    except UserError:
        return False  # e.g. a skew larger than the shrunk host, a rank >= tp
    return run_case(scn).failure_class == want


# ----------------------------------------------------------------------------------
# Bundles
# ----------------------------------------------------------------------------------


def rank_traces(outcome: Outcome) -> dict[int, list[dict]] | None:
    """Each rank's op-trace (header first), or None for write_through runs: their
    ``write_ack`` ops have no op-trace v1 form."""
    from sim.optrace import engine_ops_to_trace

    cfg, sim = outcome.cfg, outcome.sim
    if cfg.write_policy != "write_back":
        return None
    out = {}
    for c in sim.group.cohorts:
        trace = engine_ops_to_trace(c.ops, device_capacity=cfg.device_tokens,
                                    host_capacity=c.tree.host_capacity, page_size=cfg.page_size,
                                    write_policy=cfg.write_policy,
                                    load_back_threshold=cfg.load_back_threshold,
                                    note=f"hicache-sim {__version__} repro bundle, ranks {c.label}")
        h = trace[0]
        h.update(ids=cfg.ids, host_policy=cfg.host_policy, eviction_policy=cfg.eviction_policy)
        fails = sim.alloc_failures.get(c.ranks[0]) if len(c.ranks) == 1 else None
        if fails:
            h["host_alloc_failures"] = fails
        for r in c.ranks:
            out[r] = trace
    return dict(sorted(out.items()))


def schedule_lines(outcome: Outcome) -> list[dict]:
    """The per-rank event schedule, in the order things happened: one line per recorded
    op per rank, each fork, each collective call."""
    sim = outcome.sim
    rows = []
    for c in sim.group.cohorts:
        for r in c.ranks:
            for i, op in enumerate(c.ops, 1):
                g, t, step = sim.op_at[id(op)]
                rows.append((g, 1, r, i, {"rank": r, "seq": i, "t": t, "step": step, "op": op}))
    for k, f in enumerate(sim.group.forks):
        rows.append((sim.fork_order[k], 0, f["rank"], 0, {"fork": f}))
    for call in sim.calls:
        rec = {k: v for k, v in call.items() if k != "g"}
        rows.append((call["g"], 0, -1, 0, {"collective": rec}))
    rows.sort(key=lambda x: x[:4])
    return [x[4] for x in rows]


def _op_time(sim, op) -> tuple[float, int]:
    _, t, step = sim.op_at[id(op)]
    return t, step


def analyse(outcome: Outcome, traces: dict | None) -> dict:
    """report.json: the first divergent event, victims around it, tree differences,
    digest timelines, the jitter class and the failure."""
    from sim.analysis.divergence import (
        digest_timeline,
        first_divergent_op,
        replay_trace,
        summarise_op,
        tree_diff,
        victims,
    )

    div, cfg, sim = outcome.divergence, outcome.cfg, outcome.sim
    report = {
        "verdict": div["verdict"], "failure_class": outcome.failure_class,
        "failure": failure_line(div), "jitter_class": jitter_class(div, cfg),
        "first_fork": div["forks"][0] if div["forks"] else None,
        "first_true_divergence": div["first_true_divergence"],
        "digest_mismatch": div["digest_mismatch"], "collective_error": div["collective_error"],
        "batch_mismatch": div["batch_mismatch"], "cohorts": div["cohorts"],
    }
    # The collective call where the ranks' vectors first disagree on the digest, or
    # where a rank was missing.
    first_call = None
    for call in sim.calls:
        v = call["vectors"]
        if "error" in call or len(v) != cfg.tp or len({tuple(x[2:]) for x in v.values()}) > 1:
            first_call = call
            break
    report["first_divergent_collective"] = (
        None if first_call is None else {k: first_call[k] for k in first_call if k != "g"})
    if traces is None:
        report["op_traces"] = "omitted: write_through runs record write_ack ops op-trace v1 cannot express"
        # Without replays, compare the recorded ops themselves.
        best = None
        ref = sim.group.cohorts[0]
        for c in sim.group.cohorts[1:]:
            i = next((k for k, (x, y) in enumerate(zip(ref.ops, c.ops), 1)
                      if x != y or _op_time(sim, x) != _op_time(sim, y)),
                     None if len(ref.ops) == len(c.ops) else min(len(ref.ops), len(c.ops)) + 1)
            if i is None:
                continue
            sides = []
            for cc in (ref, c):
                op = cc.ops[i - 1] if i <= len(cc.ops) else None
                t, step = _op_time(sim, op) if op is not None else (None, None)
                sides.append({"ranks": cc.ranks, "t": t, "step": step, "op": summarise_op(op)})
            t, step = min((x["t"], x["step"]) for x in sides if x["t"] is not None)
            ev = {"kind": "op", "op_index": i, "t": t, "step": step, "sides": sides}
            if best is None or (t, step) < (best["t"], best["step"]):
                best = ev
        if best is not None and (first_call is None or (best["t"], best["step"]) <= (first_call["t"], first_call["step"])):
            report["first_divergent_event"] = best
        elif first_call is not None:
            report["first_divergent_event"] = {"kind": "collective", **report["first_divergent_collective"]}
        else:
            report["first_divergent_event"] = best
        return report
    cohorts = sim.group.cohorts
    reps = {c.ranks[0]: replay_trace(traces[c.ranks[0]]) for c in cohorts}
    ref = cohorts[0]
    a = reps[ref.ranks[0]]
    ps = cfg.page_size
    tf = failure_time(div)
    per_pair = []
    for c in cohorts[1:]:
        b = reps[c.ranks[0]]
        i = first_divergent_op(a, b, [_op_time(sim, op) for op in ref.ops],
                               [_op_time(sim, op) for op in c.ops])
        if i is None:
            continue
        entry = {"ranks": [ref.ranks, c.ranks], "op_index": i, "sides": []}
        for cc, rep in ((ref, a), (c, b)):
            op = cc.ops[i - 1] if i <= len(cc.ops) else None
            t, step = _op_time(sim, op) if op is not None else (None, None)
            out = rep.outputs[i] if i < len(rep.outputs) else None
            lo, hi = max(1, i - WINDOW_BEFORE), min(len(cc.ops), i + WINDOW_AFTER)
            window = []
            for j in range(lo, hi + 1):
                tj, sj = _op_time(sim, cc.ops[j - 1])
                window.append({"i": j, "t": tj, "step": sj, "op": summarise_op(rep.ops[j - 1]),
                               "victims": victims(rep.outputs[j], ps)})
            entry["sides"].append({
                "ranks": cc.ranks, "t": t, "step": step, "op": summarise_op(op),
                "output": None if out is None else {k: v for k, v in out.items() if k != "events"},
                "victims": [] if out is None else victims(out, ps), "window": window})
        # The trees right after the divergent op, and at the failure.
        ta = replay_trace(traces[ref.ranks[0]], upto=i).tree
        tb = replay_trace(traces[c.ranks[0]], upto=i).tree
        entry["tree_diff_at_divergence"] = tree_diff(ta, tb)
        ftd = div["first_true_divergence"]
        if ftd is not None:
            ja, jb = _last_op_before(sim, ref.ops, ftd["t"]), _last_op_before(sim, c.ops, ftd["t"])
            entry["true_divergence_op_index"] = [ja, jb]
            entry["tree_diff_at_true_divergence"] = tree_diff(
                replay_trace(traces[ref.ranks[0]], upto=ja).tree,
                replay_trace(traces[c.ranks[0]], upto=jb).tree)
        ia, ib = _last_op_before(sim, ref.ops, tf), _last_op_before(sim, c.ops, tf)
        entry["failure_op_index"] = [ia, ib]
        entry["tree_diff_at_failure"] = tree_diff(replay_trace(traces[ref.ranks[0]], upto=ia).tree,
                                                  replay_trace(traces[c.ranks[0]], upto=ib).tree)
        per_pair.append(entry)
    def when(e):  # the earlier of the two ranks' times for the divergent op
        ts = [(x["t"], x["step"]) for x in e["sides"] if x["t"] is not None]
        return min(ts) if ts else (math.inf, 0)

    per_pair.sort(key=lambda e: (when(e), e["op_index"]))
    report["divergent_ops"] = per_pair
    first_op = per_pair[0] if per_pair else None
    if first_op is not None and (first_call is None
                                 or when(first_op) <= (first_call["t"], first_call["step"])):
        t, step = when(first_op)
        report["first_divergent_event"] = {
            "kind": "op", "op_index": first_op["op_index"], "t": t, "step": step,
            "sides": [{k: x[k] for k in ("ranks", "t", "step", "op")} for x in first_op["sides"]]}
    elif first_call is not None:
        report["first_divergent_event"] = {"kind": "collective",
                                           **report["first_divergent_collective"]}
    else:
        report["first_divergent_event"] = None
    report["digest_timeline"] = {
        ",".join(map(str, c.ranks)): [[i, _op_time(sim, c.ops[i - 1])[0] if i else 0.0, d]
                                      for i, d in digest_timeline(reps[c.ranks[0]])]
        for c in cohorts}
    report["optrace_final_digests"] = {str(r): reps[sim.group.cohort_of(r).ranks[0]].final_digest
                                       for r in range(cfg.tp)}
    return report


def _last_op_before(sim, ops: list, t: float) -> int:
    """Output index of the last op recorded at or before ``t`` (all ops when inf)."""
    n = 0
    for i, op in enumerate(ops, 1):
        if sim.op_at[id(op)][1] > t:
            break
        n = i
    return n


def expectation(outcome: Outcome) -> dict:
    """What a replay must reproduce exactly."""
    d = outcome.divergence

    def at(x, *keys):
        return None if x is None else {k: x[k] for k in keys if k in x}

    return {
        "verdict": d["verdict"], "failure_class": outcome.failure_class,
        "halted": d["halted"],
        "first_true_divergence": at(d["first_true_divergence"], "t", "step", "what"),
        "digest_mismatch": at(d["digest_mismatch"], "t", "step", "min", "max"),
        "collective_error": at(d["collective_error"], "t", "step", "kind"),
        "batch_mismatch": at(d["batch_mismatch"], "t", "step", "where"),
        "forks": [[f["t"], f["rank"], f["cause"]] for f in d["forks"]],
        "digests": d["digests"],
        "steps": d["steps"],
    }


def sizes(outcome: Outcome) -> dict:
    return {"requests": outcome.arrived, "ranks": outcome.cfg.tp, "events": outcome.events}


def _self_contained_yaml(scenario, tmp: Path) -> tuple[str, list]:
    """The resolved scenario YAML; trace files it names are copied next to it (up to
    COPY_INPUT_LIMIT) and referred to relatively."""
    from sim.scenario import dump_resolved

    text = dump_resolved(scenario)
    head = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    data = yaml.safe_load(text)
    copied: list = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "path" and isinstance(v, str) and os.path.isfile(v):
                    src = Path(v)
                    if src.stat().st_size <= COPY_INPUT_LIMIT:
                        name = f"inputs/{len(copied)}-{src.name}"
                        (tmp / "inputs").mkdir(exist_ok=True)
                        shutil.copyfile(src, tmp / name)
                        x[k] = name
                        copied.append({"from": str(src), "to": name})
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(data.get("workload"))
    if not copied:
        return text, copied
    return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=False,
                                 allow_unicode=True, width=100), copied


@dataclass
class BundleInfo:
    """Everything ``write_bundle`` records besides the minimal run itself."""

    source: str | None
    search: SearchResult | None
    before: dict
    shrink: ShrinkInfo | None
    extra: dict = field(default_factory=dict)


def write_bundle(out_dir, outcome: Outcome, info: BundleInfo) -> Path:
    """Write the bundle folder atomically: built beside ``out_dir``, then renamed."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "bundle.json").exists())):
        raise UserError("exists and is not a repro bundle; expected a new or bundle folder",
                        where=str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        _fill_bundle(tmp, outcome, info)
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _fill_bundle(tmp: Path, outcome: Outcome, info: BundleInfo) -> None:
    cfg, div = outcome.cfg, outcome.divergence
    scenario = outcome.scenario
    if info.shrink is not None:
        scenario = scenario.model_copy(update={"description": (
            f"Shrunk by hicache-sim repro ({outcome.failure_class}). Original: "
            f"{scenario.description}").strip()})
    text, copied = _self_contained_yaml(scenario, tmp)
    write_text(tmp / "scenario.yaml", text)
    write_text(tmp / "schedule.jsonl", "".join(json.dumps(x, separators=(",", ":")) + "\n"
                                               for x in schedule_lines(outcome)))
    traces = rank_traces(outcome)
    if traces is not None:
        for r, trace in traces.items():
            write_text(tmp / "ranks" / f"rank{r}.optrace.jsonl",
                       "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in trace))
    report = analyse(outcome, traces)
    write_json(tmp / "report.json", report)
    s = info.search
    bundle = {
        "format": BUNDLE_FORMAT,
        "hicache_sim": __version__,
        "scenario": outcome.scenario.name,
        "source": info.source,
        "verdict": div["verdict"],
        "failure_class": outcome.failure_class,
        "failure": failure_line(div),
        "jitter_class": report["jitter_class"],
        "seeds": {"scenario": outcome.scenario.seed, "jitter": cfg.jitter.seed,
                  "base": s.base_seed if s else None, "try": (s.tries - 1) if s else None},
        "sizes": {"before": info.before, "after": sizes(outcome)},
        "shrink": None if info.shrink is None else {
            "runs": info.shrink.runs, "started_from_original": info.shrink.started_from_original,
            "exhausted": info.shrink.exhausted, "original": info.shrink.original,
            "case": info.shrink.case},
        "expect": expectation(outcome),
        "op_traces": ({str(r): f"ranks/rank{r}.optrace.jsonl" for r in traces} if traces else None),
        "optrace_final_digests": report.get("optrace_final_digests"),
        "inputs_copied": copied,
        "replay_ops_flags": "".join(
            f" --{k.replace('_', '-')} {v}" for k, v in (("ids", cfg.ids), ("host_policy", cfg.host_policy))
            if v != {"ids": "optrace", "host_policy": "duplicate_first"}[k]),
        "host_alloc_failures": bool(traces) and any("host_alloc_failures" in t[0] for t in traces.values()),
        **info.extra,
    }
    if traces is not None and report["optrace_final_digests"] != div["digests"]:
        raise RuntimeError(f"op-trace replay digests {report['optrace_final_digests']} differ "
                           f"from the engine's {div['digests']}")
    write_text(tmp / "report.md", render_report(bundle, report))
    write_json(tmp / "bundle.json", bundle)  # last: a folder with bundle.json is complete


def render_report(bundle: dict, report: dict) -> str:
    """report.md: the report for people."""
    b, a = bundle["sizes"]["before"], bundle["sizes"]["after"]
    lines = [f"# Repro bundle: {bundle['scenario']}", "",
             f"- **failure**: `{bundle['failure']}`",
             f"- **verdict**: {bundle['verdict']} ({bundle['failure_class']})",
             f"- **jitter class**: {bundle['jitter_class']}"]
    if report.get("first_fork"):
        f = report["first_fork"]
        lines.append(f"- **first fork**: rank {f['rank']} at t={f['t']:.6f}s, cause "
                     f"`{f['cause']}` {f['detail']}".rstrip())
    s = bundle["seeds"]
    lines += [f"- **seeds**: scenario {s['scenario']}, jitter {s['jitter']}"
              + (f" (try {s['try']} from base {s['base']})" if s["try"] is not None else ""),
              (f"- **size** (before -> after shrinking): requests {b['requests']} -> {a['requests']}, "
              f"ranks {b['ranks']} -> {a['ranks']}, events {b['events']} -> {a['events']}"),
              "", "Replay: `hicache-sim replay <this folder>` (exit 3 when it reproduces).", ""]
    ev = report.get("first_divergent_event")
    lines += ["## First divergent event", ""]
    if ev is None:
        lines.append("None: every rank ran the same ops with the same results.")
    elif ev["kind"] == "op":
        lines.append(f"Op #{ev['op_index']} of the ranks' op-traces, first at t={ev['t']:.6f}s "
                     f"(step {ev['step']}):")
        for x in ev["sides"]:
            at = "" if x["t"] is None else f" at t={x['t']:.6f}s (step {x['step']})"
            lines.append(f"- ranks {x['ranks']}{at}: `{x['op']}`")
    else:
        lines.append(f"Collective call #{ev['call']} ({ev['tag']}) at t={ev['t']:.6f}s "
                     f"(step {ev['step']}): rank vectors [write acks, load acks, digest, -digest] "
                     f"{ev['vectors']}" + (f"; {ev['error']}" if ev.get("error") else ""))
    lines.append("")
    for pair in report.get("divergent_ops", []):
        lines += ["", (f"## Ranks {pair['ranks'][0]} vs {pair['ranks'][1]}: victims around op "
                  f"#{pair['op_index']}"), ""]
        for side in pair["sides"]:
            lines += [f"Ranks {side['ranks']}:", "", "| op | t (s) | step | op | victims |",
                      "|---:|---:|---:|---|---|"]
            for w in side["window"]:
                vic = "; ".join(f"{v['kind']} node {v['node']} ({v['depth_pages']} pages deep"
                                + (f", {v['n']} tokens" if "n" in v else "") + ")"
                                for v in w["victims"]) or "-"
                mark = " **<**" if w["i"] == pair["op_index"] else ""
                lines.append(f"| {w['i']}{mark} | {w['t']:.6f} | {w['step']} | `{w['op']}` | {vic} |")
            lines.append("")
        for key, title in (("tree_diff_at_divergence", "right after the divergent op"),
                           ("tree_diff_at_true_divergence", "at the engine's first true divergence"),
                           ("tree_diff_at_failure", "at the failure")):
            d = pair.get(key)
            if d is None:
                continue
            if d["equal"]:
                what = "none (logically equal" + (
                    ", digests differ)" if d["digest"]["a"] != d["digest"]["b"] else ")")
            elif d["nodes_equal"]:
                what = (f"the same nodes, different occupancy: {d['occupancy']['a']} vs "
                        f"{d['occupancy']['b']}")
            else:
                what = (f"{d['counts']['only_a']} node(s) only in ranks {pair['ranks'][0]}, "
                        f"{d['counts']['only_b']} only in ranks {pair['ranks'][1]}, "
                        f"{d['counts']['differ']} with different residency or locks; occupancy "
                        f"{d['occupancy']['a']} vs {d['occupancy']['b']}")
            lines.append(f"Tree difference {title}: {what}")
            for row in d["only_a"][:5]:
                lines.append(f"  - only in ranks {pair['ranks'][0]}: {row['path']}: {_node_state(row)}")
            for row in d["only_b"][:5]:
                lines.append(f"  - only in ranks {pair['ranks'][1]}: {row['path']}: {_node_state(row)}")
            for row in d["differ"][:5]:
                lines.append(f"  - {row['path']}: ranks {pair['ranks'][0]} {_node_state(row['a'])}; "
                             f"ranks {pair['ranks'][1]} {_node_state(row['b'])}")
        lines.append("")
    tl = report.get("digest_timeline")
    if tl:
        lines += ["## Digest timeline (last changes per replica)", ""]
        for ranks, rows in tl.items():
            tail = rows[-8:]
            lines.append(f"- ranks {ranks}: " + ", ".join(f"op {i} t={t:.4f}s -> {d}" for i, t, d in tail)
                         + (f" ({len(rows)} changes in all)" if len(rows) > len(tail) else ""))
        lines.append("")
    if report.get("op_traces"):
        lines += [f"Op-traces: {report['op_traces']}", ""]
    lines += ["## Files", "",
              "- `scenario.yaml`: the minimal scenario (`hicache-sim run` it to see the failure);",
              "- `schedule.jsonl`: every rank's ops, the forks and the collective calls, in order;",
              ("- `report.json`: this report as data; `bundle.json`: verdict, sizes, seeds, "
              "what `replay` checks.")]
    if bundle.get("op_traces"):
        flags = bundle.get("replay_ops_flags", "")
        lines.append(f"- `ranks/rank<R>.optrace.jsonl`: each rank's op-trace; replay one with "
                     f"`hicache-sim replay-ops{flags} ranks/rank0.optrace.jsonl --summary`.")
        if bundle.get("host_alloc_failures"):
            lines.append("  Rank-local host allocation failures are listed in the header's "
                         "`host_alloc_failures` (a hicache-sim extension that `replay-ops` honours; "
                         "SGLang's replayer needs the same patch).")
    lines.append("")
    return "\n".join(lines)


def _node_state(row: dict) -> str:
    where = "+".join(k for k in ("dev", "host") if row[k]) or "nowhere"
    return (f"node {row['id']} ({row['pages']} pages) on {where}, lock {row['lock']}, "
            f"host_lock {row['host_lock']}")


# ----------------------------------------------------------------------------------
# Replay
# ----------------------------------------------------------------------------------


class NotReproduced(UserError):
    """The bundle ran but did not fail the same way (exit 1)."""

    exit_code = 1


@dataclass
class ReplayResult:
    outcome: Outcome
    line: str
    checked: list  # what was compared


def load_bundle(path) -> tuple[Path, dict]:
    """The bundle folder and its bundle.json; one-line errors for anything missing."""
    d = Path(path)
    if not d.exists():
        raise UserError("no such folder; expected a repro bundle folder (from hicache-sim repro)",
                        where=str(d))
    if not d.is_dir():
        raise UserError("is a file; expected a repro bundle folder", where=str(d))
    from sim import safeio

    meta = d / "bundle.json"
    if not meta.exists():
        raise UserError("no bundle.json; expected a repro bundle folder (from hicache-sim repro)",
                        where=str(d))
    text = safeio.read_text(meta, "the bundle's metadata (bundle.json)", safeio.LIMIT_JSON_DOC)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        line = getattr(err, "lineno", None)
        raise UserError(f"found invalid JSON ({type(err).__name__}); expected the bundle's metadata",
                        where=f"{meta}:{line}" if line else str(meta)) from None
    if not isinstance(data, dict):
        raise UserError(f"found a JSON {type(data).__name__}; expected an object", where=str(meta))
    for key in ("format", "expect", "verdict"):
        if key not in data:
            raise UserError(f"no '{key}' key; expected a bundle.json written by hicache-sim repro",
                            where=str(meta))
    if data["format"] != BUNDLE_FORMAT:
        raise UserError(f"found format {_short(data['format'])}; expected {BUNDLE_FORMAT}", where=str(meta))
    _check_bundle_fields(data, d, meta)
    if not (d / "scenario.yaml").is_file():
        raise UserError("no scenario.yaml; expected the bundle's minimal scenario", where=str(d))
    return d, data


def _check_bundle_fields(data: dict, d: Path, meta: Path) -> None:
    """The types of the fields ``replay`` reads, and every path confined to the bundle."""
    from sim.paths import PathRejected, confine_in

    def bad(key, found, expected):
        raise UserError(f"{key}: found {found}; expected {expected}", where=str(meta))

    if not isinstance(data["expect"], dict):
        bad("expect", f"a JSON {type(data['expect']).__name__}", "an object of recorded outcome fields")
    if not isinstance(data["verdict"], str):
        bad("verdict", _short(data["verdict"]), "a verdict string")
    for key in ("op_traces", "optrace_final_digests"):
        v = data.get(key)
        if v is None:
            continue
        if not isinstance(v, dict):
            bad(key, f"a JSON {type(v).__name__}", "an object keyed by rank, or null")
        for r, x in v.items():
            if not (r.isdigit() and len(r) <= 4):
                bad(f"{key}.{_short(r)}", "a key that is not a rank", "rank numbers as keys")
            if key == "op_traces":
                if not isinstance(x, str):
                    bad(f"{key}.{r}", _short(x), "a path inside the bundle")
                try:
                    confine_in(d, x, f"rank {r}'s op-trace")
                except PathRejected as e:
                    bad(f"{key}.{r}", e.found, e.expected)
            elif not (type(x) is int or x is None):
                bad(f"{key}.{r}", _short(x), "an integer digest")


def verify_bundle(path, trace_roots=()) -> ReplayResult:
    """Re-run a bundle and check it fails exactly as recorded; NotReproduced if not.

    The bundle's scenario may name files inside the bundle only (plus any
    ``trace_roots`` the command line gives, for traces too large to copy in)."""
    from sim.analysis.divergence import replay_trace
    from sim.optrace import read_trace
    from sim.scenario import load_scenario

    d, meta = load_bundle(path)
    scenario = load_scenario(d / "scenario.yaml",
                             roots=[Path(os.path.abspath(d)), *(Path(r) for r in trace_roots)])
    outcome = run_case(scenario, record=True)
    got, want = expectation(outcome), meta["expect"]
    # JSON turns int keys into strings; compare through the same round trip.
    got = json.loads(json.dumps(got))
    checked = []
    for key in ("verdict", "failure_class", "first_true_divergence", "digest_mismatch",
                "collective_error", "batch_mismatch", "forks", "digests", "steps", "halted"):
        if got.get(key) != want.get(key):
            raise NotReproduced(f"does not reproduce: {key} is {_short(got.get(key))}, "
                                f"the bundle expects {_short(want.get(key))}", where=str(d))
        checked.append(key)
    traces = meta.get("op_traces") or {}
    for r, rel in sorted(traces.items(), key=lambda kv: int(kv[0])):
        p = d / rel  # confined to the bundle by load_bundle
        if not p.is_file():
            raise UserError(f"no {rel}; expected rank {r}'s op-trace", where=str(d))
        trace = [op for _, _, op in read_trace(p)]
        final = replay_trace(trace).final_digest
        expect = (meta.get("optrace_final_digests") or {}).get(r)
        if final != expect:
            raise NotReproduced(f"does not reproduce: {rel} replays to digest {final}, "
                                f"the bundle expects {expect}", where=str(d))
        checked.append(f"optrace rank {r}")
    return ReplayResult(outcome, failure_line(outcome.divergence), checked)


def _short(v) -> str:
    text = json.dumps(v, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."
