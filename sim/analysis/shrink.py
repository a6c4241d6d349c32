"""Shrinking a failing case with Hypothesis's shrinker, deterministically and bounded.

What this is for: ``hicache-sim repro`` finds a scenario whose TP ranks diverge and
wants the smallest scenario that still fails the same way. A case is a flat set of
integer and boolean *knobs* (number of requests, ranks, capacities in pages, jitter
parameters); ``minimise`` hands them to Hypothesis as ``st.integers(lo, hi)`` /
``st.booleans()`` and lets its shrinker reduce them towards their lower bounds (and
booleans towards False) while ``still_fails`` holds. Nothing here knows about the
simulator: the predicate does.

Starting point
==============
Hypothesis normally shrinks a failure its random generation found; we already hold
one (the original case) and the space around it may fail rarely. So the original's
choice sequence is put in a private in-memory example database, in the corpus
Hypothesis keeps for "failed before, not yet minimal" cases (the ``.secondary``
sub-key), and only the reuse and shrink phases run: Hypothesis replays the original
first and shrinks from there. ``ShrinkResult.started_from_original`` reports that it
did (tests check it, so a Hypothesis upgrade that changes this is noticed).

Determinism and bounds
======================
The shrinker draws from the engine's random generator, seeded here with ``@seed``;
the example database is then re-enabled with ``@settings`` (``@seed`` alone turns it
off). The same knobs, predicate and seed give the same result. ``max_runs`` bounds the
predicate's real evaluations: past it every new candidate counts as "does not fail",
which ends shrinking deterministically (never a wall-clock limit).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# The choice-sequence key under which the original case is stored. Any bytes do: the
# database is private to one call.
_DB_KEY = b"hicache-sim.repro.shrink"


@dataclass(frozen=True)
class Knob:
    """One dimension of a failing case: an int in ``[lo, hi]`` or a bool."""

    name: str
    original: int | bool
    lo: int = 0
    hi: int = 1
    kind: str = "int"  # "int" or "bool"

    def strategy(self):
        import hypothesis.strategies as st

        if self.kind == "bool":
            return st.booleans()
        return st.integers(self.lo, self.hi)

    def check(self) -> None:
        if self.kind == "bool":
            if not isinstance(self.original, bool):
                raise ValueError(f"knob {self.name}: a bool knob needs a bool original")
        elif not (self.lo <= self.original <= self.hi):
            raise ValueError(f"knob {self.name}: original {self.original} outside [{self.lo}, {self.hi}]")


@dataclass
class ShrinkResult:
    """The smallest failing case found, and how the search went."""

    case: dict
    original: dict
    runs: int                  # real predicate evaluations (cache misses)
    calls: int                 # predicate calls Hypothesis made, cached ones included
    started_from_original: bool
    exhausted: bool            # max_runs was reached before the shrinker finished
    history: list = field(default_factory=list)  # each accepted (still failing) case


class _Found(Exception):
    """Raised inside the Hypothesis test when the predicate holds."""


def minimise(knobs: list[Knob], still_fails: Callable[[dict], bool], *, max_runs: int = 150,
             seed: int = 0) -> ShrinkResult:
    """The smallest case (a dict knob name -> value) for which ``still_fails`` holds.

    ``still_fails`` must hold for the original case (every knob at ``original``); if
    it does not, the original is returned unshrunk with ``runs`` counting that check.
    """
    # hypothesis (the shrinker) only when shrinking: importing this module stays light
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as hyp_seed
    from hypothesis import strategies as st
    from hypothesis.database import InMemoryExampleDatabase, choices_to_bytes

    for k in knobs:
        k.check()
    names = [k.name for k in knobs]
    original = {k.name: k.original for k in knobs}
    cache: dict[tuple, bool] = {}
    state = {"calls": 0, "first": None, "exhausted": False}
    history: list[dict] = []

    def evaluate(values: tuple) -> bool:
        state["calls"] += 1
        if state["first"] is None:
            state["first"] = values
        if values in cache:
            return cache[values]
        if len(cache) >= max_runs:
            state["exhausted"] = True
            return False  # out of runs: nothing new counts as failing
        ok = bool(still_fails(dict(zip(names, values))))
        cache[values] = ok
        if ok:
            history.append(dict(zip(names, values)))
        return ok

    if not knobs:
        ok = evaluate(())
        return ShrinkResult({}, {}, len(cache), state["calls"], ok, False, history)

    best: list[tuple] = []

    @given(st.tuples(*[k.strategy() for k in knobs]))
    def test(values):
        if evaluate(tuple(values)):
            best[:] = [tuple(values)]
            raise _Found

    # As hypothesis.find does: name the database key, so the stored original is found.
    test._hypothesis_internal_database_key = _DB_KEY
    db = InMemoryExampleDatabase()
    db.save(_DB_KEY + b".secondary", choices_to_bytes(tuple(original[n] for n in names)))
    test = hyp_seed(seed)(test)
    test = settings(database=db, phases=(Phase.reuse, Phase.shrink), max_examples=max(1, max_runs),
                    deadline=None, derandomize=False, report_multiple_bugs=False,
                    verbosity=Verbosity.quiet, suppress_health_check=list(HealthCheck),
                    print_blob=False)(test)
    try:
        test()
    except _Found:
        pass
    except Exception as err:  # SkipTest: the original itself did not fail
        if type(err).__name__ != "SkipTest":
            raise
    orig_tuple = tuple(original[n] for n in names)
    case = dict(zip(names, best[0])) if best else dict(original)
    return ShrinkResult(case=case, original=original, runs=len(cache), calls=state["calls"],
                        started_from_original=state["first"] == orig_tuple,
                        exhausted=state["exhausted"], history=history)
