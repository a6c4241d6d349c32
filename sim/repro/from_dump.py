"""A crash dump's traffic, searched for the perturbation that gives its assertion.

``hicache-sim repro --from-dump DUMP`` imports the dump (``sim.imports``: its
requests at its TP size and server args), then walks a fixed space of per-rank
perturbations, the shipped ``scenarios/jitter_*.yaml`` kinds, each on one rank (rank
1; the dump's traffic is the same on every rank, a perturbation is what makes one rank
differ), over seeds, until a run fails with the assertion asked for. SGLang's dump
holds no exception text (``dump_requests_before_crash`` writes server args, requests
and the launch command), so the assertion is the line from the server's log,
``--assertion``; by default SGLang's digest assertion
(``write_back duplicate-reclaim victims diverged across PP/TP ranks``).

The space, in order (kind, the jitter block; each the shipped scenario's values):
``JITTER_SPACE``. A candidate that does not apply (a perturbation the scenario's
sizes refuse) is skipped and counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sim.constants import DIGEST_MISMATCH_MESSAGE
from sim.repro.case import Outcome, failure_line, run_case
from sim.repro.search import SearchResult, with_seed
from sim.scenario import resolve_sizing


def jitter_space(page: int) -> list[tuple[str, dict]]:
    """(name, jitter block) candidates; the perturbed rank is 1."""
    return [
        ("host_alloc_failure", {"host_alloc_failure": {"probability": 0.005, "ranks": [1]}}),
        ("ack_delay", {"ack_delay": {"dist": "exponential", "mean": 0.002, "ranks": [1],
                                     "acks": "both"}}),
        ("host_capacity_skew", {"host_capacity_skew": {1: -10 * page}}),
        ("device_capacity_skew", {"device_capacity_skew": {1: -page}}),
        ("device_free_delay", {"device_free_delay": {"dist": "exponential", "mean": 0.02,
                                                     "ranks": [1]}}),
        ("request_order", {"request_order": {"ranks": [1], "swap_probability": 0.05,
                                             "window": 2}}),
        ("id_drift", {"id_drift": {"rank": 1, "extra_ids": 1, "after_request": 0}}),
    ]


@dataclass
class DumpSearch:
    assertion: str
    outcome: Outcome | None = None  # the first run giving the assertion, recorded
    candidate: str | None = None
    seed: int | None = None
    runs: int = 0
    tried: list = field(default_factory=list)  # (candidate, seed, failure line)
    skipped: list = field(default_factory=list)  # (candidate, why)
    other_failures: list = field(default_factory=list)  # failures with another line
    stopped: str = "space"  # "space" (every candidate tried) or "budget"

    def as_search(self, base: int) -> SearchResult:
        """The search in ``sim.repro.search``'s terms, for the bundle's record."""
        return SearchResult(self.outcome, self.runs, self.seed, base,
                            [(s, line) for _c, s, line in self.tried],
                            "found" if self.outcome is not None else
                            "budget" if self.stopped == "budget" else "tries")


def search_dump(scenario, *, tries: int, base_seed: int, assertion: str | None = None,
                on_try=None, budget_s: float | None = None, clock=time.monotonic) -> DumpSearch:
    """Each candidate of the space over seeds ``base .. base + tries - 1``; a wall-time
    ``budget_s`` is checked between runs only (a run is never cut short)."""
    res = DumpSearch(assertion or DIGEST_MISMATCH_MESSAGE)
    t0 = clock()
    if scenario.tp < 2:
        res.skipped.append(("all", f"tp {scenario.tp}: one rank cannot diverge from others"))
        return res

    sizes = resolve_sizing(scenario)
    for name, block in jitter_space(scenario.page_size):
        skew = block.get("host_capacity_skew") or block.get("device_capacity_skew")
        if skew is not None:
            have = sizes["host_tokens" if "host_capacity_skew" in block else "device_tokens"]
            if have + skew[1] < scenario.page_size:
                res.skipped.append((name, f"a pool of {have} tokens cannot lose {-skew[1]}"))
                continue
        try:
            jit = type(scenario.jitter).model_validate({**scenario.jitter.model_dump(), **block})
        except ValueError as err:
            res.skipped.append((name, str(err).splitlines()[0][:160]))
            continue
        cand = scenario.model_copy(update={"jitter": jit})
        for i in range(tries):
            if budget_s is not None and res.runs and clock() - t0 >= budget_s:
                res.stopped = "budget"
                return res
            seed = base_seed + i
            out = run_case(with_seed(cand, seed))
            res.runs += 1
            line = failure_line(out.divergence)
            res.tried.append((name, seed, line))
            if on_try is not None:
                on_try(name, seed, out, line)
            if out.failed and res.assertion in line:
                res.outcome = run_case(with_seed(cand, seed), record=True)
                res.candidate, res.seed = name, seed
                return res
            if out.failed:
                res.other_failures.append((name, seed, line))
    return res
