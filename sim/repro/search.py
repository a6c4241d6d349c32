"""Seed search: try seeds until a run of the scenario fails.

Try i runs the scenario with seed ``base + i`` for both the scenario seed and
``jitter.seed`` (every jitter draw is keyed by it, ``sim/jitter.py``), until a run's
verdict is a failure (detected, false_alarm, hang, size_mismatch, missed). An
optional wall-time budget is checked between tries only, so a try is never cut short
and the tries made are a pure function of the scenario and the base seed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sim.repro.case import Outcome, run_case


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
    """Try seeds ``base, base + 1, ...`` until a run fails."""
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
            # Again, recorded: the untraced try is cheaper, and the engine deterministic.
            return SearchResult(run_case(with_seed(scenario, seed), record=True), i + 1, seed, base,
                                verdicts, "found")
    return SearchResult(None, tries, None, base, verdicts, "tries")
