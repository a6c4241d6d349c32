"""Runs that differ only in a policy and give identical results: find them, say why.

Two policies that give bit-identical hit rates and TTFTs are either equivalent on that
workload or not exercised by it; a report that shows two equal rows without saying
which leaves the reader guessing (the case that prompted this: ``duplicate_first`` and
``duplicate_first_single_pass`` equal at all 30 points of a capacity sweep). This
module pairs cases (runs, or sweep rows) whose scenarios differ only in policy keys,
keeps the pairs whose headline numbers are identical, and states the reason the
results themselves establish, from the counters every results folder records:

* no host eviction ran, or the duplicate reclaim never freed a token: a host policy
  had nothing to choose;
* ``duplicate_first`` vs ``duplicate_first_single_pass``: they differ only in the D-leaf
  duplicates pass 1 spares (the single pass takes them in map order at once, duplicate
  first only in pass 2). With ``reclaim_pass2_tokens = 0`` pass 2 never ran, and equal
  reclaimed totals say the single pass took no victim the other spared (different
  totals say the victims differed, without changing the outcome);
* otherwise: which counters are equal, and that the results do not establish why.

Everything is read from results folders (``reports.load``), never from the simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Iterable

HEADLINE = ("hit_rate", "device_hit_rate", "host_hit_rate", "ttft_p50_s", "ttft_p99_s")
COUNTERS = ("reclaim_pass1_tokens", "reclaim_pass2_tokens", "host_evict_tokens",
            "drop_tokens", "backup_bytes", "load_back_bytes")
# Keys that name or describe a run without changing what it simulates.
IGNORED = ("name", "description")
RECLAIMING = ("duplicate_first", "duplicate_first_single_pass", "duplicate_first_by_id")


def is_policy_key(key: str) -> bool:
    return key.startswith("cache.") and key.endswith("_policy")


@dataclass
class Case:
    """One run (or one sweep row): its scenario keys and its numbers."""

    label: str
    params: dict[str, Any]
    numbers: dict[str, float]


@dataclass
class Finding:
    """Policies that gave identical results in every one of ``pairs``."""

    differ: dict[str, tuple[Any, Any]]  # policy key -> (value in a, value in b)
    pairs: list[tuple[Case, Case]] = field(default_factory=list)
    reason: str = ""

    def title(self) -> str:
        return "; ".join(f"{k}: {a} vs {b}" for k, (a, b) in self.differ.items())


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        try:
            v = v.item()  # numpy scalars
        except AttributeError:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
    return float(v) if math.isfinite(v) else None


def _same_numbers(a: Case, b: Case) -> bool:
    for k in HEADLINE:
        x, y = a.numbers.get(k), b.numbers.get(k)
        if x is None or y is None or x != y:
            return False
    return True


def _key(params: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in params.items()
                        if k not in IGNORED and not is_policy_key(k)))


def find_identical(cases: Iterable[Case]) -> list[Finding]:
    """Findings in a stable order (first pair's position), one per policy difference."""
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        groups.setdefault(_key(c.params), []).append(c)
    findings: dict[tuple, Finding] = {}
    for members in groups.values():
        for a, b in combinations(members, 2):
            keys = [k for k in dict.fromkeys([*a.params, *b.params]) if is_policy_key(k)
                    and repr(a.params.get(k)) != repr(b.params.get(k))]
            if not keys or not _same_numbers(a, b):
                continue
            # One orientation per difference, so (x vs y) and (y vs x) are one finding.
            if tuple(str(a.params.get(k)) for k in keys) > tuple(str(b.params.get(k)) for k in keys):
                a, b = b, a
            sig = tuple((k, a.params.get(k), b.params.get(k)) for k in keys)
            f = findings.setdefault(sig, Finding({k: (x, y) for k, x, y in sig}))
            f.pairs.append((a, b))
    out = list(findings.values())
    for f in out:
        f.reason = explain(f)
    return out


def _values(f: Finding, policy: str, counter: str) -> list[float | None]:
    """``counter`` in the case of each pair whose host_policy is ``policy``."""
    out = []
    for a, b in f.pairs:
        for c in (a, b):
            if c.params.get("cache.host_policy") == policy:
                out.append(c.numbers.get(counter))
    return out


def _all(values, test) -> bool:
    return bool(values) and all(v is not None and test(v) for v in values)


def _fmt(v: float | None) -> str:
    return "unknown" if v is None else f"{v:,.0f}"


def _span(values) -> str:
    known = sorted({v for v in values if v is not None})
    if not known:
        return "unknown"
    return _fmt(known[0]) if len(known) == 1 else f"{_fmt(known[0])} to {_fmt(known[-1])}"


def _reclaimed(c: Case) -> float | None:
    p1, p2 = c.numbers.get("reclaim_pass1_tokens"), c.numbers.get("reclaim_pass2_tokens")
    return None if p1 is None or p2 is None else p1 + p2


def explain(f: Finding) -> str:
    """The reason the results establish, or a plain statement that they do not."""
    n = len(f.pairs)
    where = "in both runs" if n == 1 else f"in all {n} pairs"
    every = [c for pair in f.pairs for c in pair]
    host = f.differ.get("cache.host_policy")
    if host is not None:
        evict = [c.numbers.get("host_evict_tokens") for c in every]
        if _all(evict, lambda v: v == 0):
            return (f"no host eviction ever ran {where} (host_evict_tokens = 0): a host "
                    "policy only acts when the host pool must free space, so the two had "
                    "nothing to choose")
        reclaiming = [p for p in host if p in RECLAIMING]
        freed = [_reclaimed(c) for c in every if c.params.get("cache.host_policy") in RECLAIMING]
        if reclaiming and _all(freed, lambda v: v == 0):
            return (f"the duplicate reclaim never freed a token {where} "
                    "(reclaim_pass1_tokens = reclaim_pass2_tokens = 0): host evictions "
                    "found no releasable duplicate, so every victim came from the LRU walk "
                    "both policies share")
        if set(host) == {"duplicate_first", "duplicate_first_single_pass"}:
            p2 = _values(f, "duplicate_first", "reclaim_pass2_tokens")
            totals = [(_reclaimed(a), _reclaimed(b)) for a, b in f.pairs]
            same_totals = all(x is not None and x == y for x, y in totals)
            if _all(p2, lambda v: v == 0) and same_totals:
                return (f"pass 2 never ran in the duplicate_first run{'s' if n > 1 else ''} "
                        "(reclaim_pass2_tokens = 0) and each pair reclaimed the same number "
                        f"of tokens ({_span([x for x, _ in totals])}), so the two policies "
                        "took the same victims as far as the counters show: the single pass "
                        "never had to release a D-leaf duplicate that duplicate_first's pass "
                        "1 spares (they part only when such a duplicate comes early in the "
                        "duplicate map, see tests/test_host_policies_differ.py)")
            if not same_totals and all(x is not None and y is not None for x, y in totals):
                return ("the two reclaimed different numbers of tokens "
                        f"({'; '.join(f'{_fmt(x)} vs {_fmt(y)}' for x, y in totals[:4])}), "
                        "so their victims differed, without changing the hit rates or TTFTs")
            return ("duplicate_first's pass 2 freed tokens (reclaim_pass2_tokens "
                    f"{_span(p2)}), so the policies could have chosen differently; the "
                    "results do not establish why they did not")
    equal = [k for k in COUNTERS
             if all(a.numbers.get(k) is not None and a.numbers.get(k) == b.numbers.get(k)
                    for a, b in f.pairs)]
    said = f"equal counters: {', '.join(equal)}" if equal else "no counter recorded"
    return f"the results do not establish why ({said})"


# ------------------------------------------------------------------- from the reports


def run_cases(runs) -> list[Case]:
    """A Case per run (``reports.load.Run``): summary numbers, counters falling back to
    the time series' last value (folders whose summary lacks them)."""
    from reports.load import flatten

    cases = []
    for run in runs:
        numbers = {k: _num(run.summary.get(k)) for k in (*HEADLINE, *COUNTERS)}
        ts = run.timeseries
        for k in COUNTERS:
            if numbers[k] is None and k in getattr(ts, "columns", ()) and len(ts):
                numbers[k] = _num(ts[k].iloc[-1])
        cases.append(Case(run.label, flatten(run.scenario), numbers))
    return cases


def sweep_cases(sweep) -> list[Case]:
    """A Case per sweep row: its parameter columns and seed; the summary columns."""
    table = sweep.table
    params = [c for c in sweep.parameter_columns if c in table.columns]
    if "seed" in table.columns:
        params.append("seed")
    cases = []
    for i, row in enumerate(table.to_dict("records")):
        label = str(row.get("point_id", i))
        cases.append(Case(label, {c: row.get(c) for c in params},
                          {k: _num(row.get(k)) for k in (*HEADLINE, *COUNTERS)}))
    return cases
