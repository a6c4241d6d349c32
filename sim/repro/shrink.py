"""Hypothesis-driven shrinking of a failing case (``sim.analysis.shrink.minimise``).

The failing scenario becomes knobs: the number of requests, the TP size, device and
host pages, the running-request cap, halting at the first failure, and the jitter's
own parameters (per-rank switches, delay scales, probabilities, skew sizes, id-drift
position). Hypothesis's shrinker reduces them while the run still fails with the
same *failure class* (``sim.repro.case.failure_class``: the verdict, how it shows,
which perturbations fired). Each candidate is a full, deterministic simulation;
``max_runs`` bounds how many.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

from sim.analysis.shrink import Knob, minimise
from sim.errors import UserError
from sim.repro.case import Outcome, failure_time, run_case
from sim.scenario import resolve_capacities, scenario_from_dict
from sim.workloads import build_workload


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
    n = 0
    for req in build_workload(scenario):
        if req.arrival > t:
            break
        n += 1
    return n


def scenario_data(scenario) -> dict:
    """The validated scenario as data that validates again. Router parameters other
    than ``policy`` are dropped unless the policy is cache_aware: the dump fills in
    their defaults, which ``Router`` then rejects as set with another policy
    (``sim.scenario.dump_resolved`` has the same problem)."""
    d = scenario.model_dump(mode="python", exclude_none=True, exclude={"engine"})
    return fix_router(d)


def fix_router(d: dict) -> dict:
    r = d.get("router")
    if isinstance(r, dict) and r.get("policy", "round_robin") != "cache_aware":
        d["router"] = {"policy": r.get("policy", "round_robin")}
    return d


# Distribution parameters a delay scale applies to (``sim.scenario._DistFields``).
_SCALED = ("value", "low", "high", "mean")


@dataclass
class CaseSpace:
    """A failing scenario as knobs: ``scenario(case)`` builds the scenario a case names.

    Ranks named by the jitter are folded into a smaller TP group as ``rank % tp`` (a
    delay on rank 3 of 4 becomes a delay on rank 1 of 2), so shrinking the ranks keeps
    the perturbation. Probabilities shrink towards 1 (the bug fires every time: sooner,
    and without randomness); delays shrink towards zero; skews towards one page.
    """

    base: dict            # the scenario as data, capacities in tokens, seeds explicit
    knobs: list
    tps: list             # the valid TP sizes, ascending (the tp knob indexes them)
    rank_lists: dict      # jitter section -> original ranks it names
    # The scenario's folder: its trace paths resolve there (an imported dump's scratch
    # folder, a scenario beside its trace outside the repository).
    base_dir: str = "."

    def original(self) -> dict:
        return {k.name: k.original for k in self.knobs}

    def scenario(self, case: dict):
        """The scenario for ``case``; raises UserError when it is not a valid one."""
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

        def scale(dist: dict, knob: str) -> None:
            pct = case.get(knob, 100)
            for p in _SCALED:
                if p in dist:
                    dist[p] = dist[p] * pct / 100

        def skews(section: str, prefix: str) -> dict:
            out = {}
            for r in self.rank_lists.get(section, ()):
                delta = self.base["jitter"][section][r]
                if case.get(f"{section}_rank{r}", True) and r % tp not in out:
                    pages = case.get(f"{prefix}{r}", abs(delta) // ps)
                    out[r % tp] = (1 if delta > 0 else -1) * pages * ps
            return out

        if "ack_delay" in self.rank_lists:
            ranks = kept("ack_delay")
            if ranks:
                ad = j["ack_delay"]
                ad["ranks"] = ranks
                scale(ad, "ack_delay_pct")
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
            j["host_capacity_skew"] = skews("host_capacity_skew", "skew_pages")
        if "device_capacity_skew" in self.rank_lists:
            j["device_capacity_skew"] = skews("device_capacity_skew", "device_skew_pages")
        if "device_free_delay" in self.rank_lists:
            ranks = kept("device_free_delay")
            if ranks:
                fd = j["device_free_delay"]
                fd["ranks"] = ranks
                scale(fd, "free_delay_pct")
            else:
                j["device_free_delay"] = {"dist": "none"}
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
        return scenario_from_dict(d, base_dir=self.base_dir, where="<shrunk case>")


def case_space(scenario, requests: int | None) -> CaseSpace:
    """The knobs of a failing (seeded) scenario; ``requests`` is the request count the
    search space starts from (None: keep the scenario's limits, no request knob).

    Knob order matters: Hypothesis prefers simplifying earlier choices, so the request
    count comes first, then ranks, capacities, and the jitter's own parameters.
    """
    d = scenario_data(scenario)
    ps = scenario.page_size
    dev, host = resolve_capacities(scenario)
    d["device"] = {"tokens": dev}
    d["host"] = {"tokens": host}
    if scenario.host.mla_dedup:
        d["host"]["mla_dedup"] = True
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

    def skew_knobs(section: str, prefix: str, skew: dict) -> None:
        ranks = [int(r) for r, v in skew.items() if v]
        if not ranks:
            return
        d["jitter"][section] = {int(r): int(v) for r, v in skew.items()}
        rank_knobs(section, ranks)
        for r in ranks:
            pages = abs(skew[r]) // ps
            if pages > 1:
                knobs.append(Knob(f"{prefix}{r}", pages, 1, pages))

    if j.ack_delay.dist != "none":
        rank_knobs("ack_delay", j.ack_delay.ranks)
        knobs.append(Knob("ack_delay_pct", 100, 1, 100))
        if j.ack_delay.acks == "both":
            knobs.append(Knob("ack_delay_acks", 2, 0, 2))
    if j.host_alloc_failure.probability > 0:
        rank_knobs("host_alloc_failure", j.host_alloc_failure.ranks)
        if j.host_alloc_failure.probability < 1:
            knobs.append(Knob("host_alloc_failure_p", 100, 0, 100))
    skew_knobs("host_capacity_skew", "skew_pages", j.host_capacity_skew)
    skew_knobs("device_capacity_skew", "device_skew_pages", j.device_capacity_skew)
    if j.device_free_delay.dist != "none":
        rank_knobs("device_free_delay", j.device_free_delay.ranks)
        knobs.append(Knob("free_delay_pct", 100, 1, 100))
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
    src = scenario.source
    base_dir = str(Path(src).parent) if src and not src.startswith("<") else "."
    return CaseSpace(d, knobs, tps, lists, base_dir)


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
