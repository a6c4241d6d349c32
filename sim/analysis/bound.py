"""Reference hit rates for a scenario: LRU curves and the offline optimum (a bound).

What this is for: ``hicache-sim bound`` prints them, and the reports draw
``bound_hit_rate`` as a ceiling next to the simulated hit rate. The scenario's
request stream (``build_workload``, limits applied) is keyed with ``page_key`` at
its ``page_size``, exactly as the engine keys it, then analysed offline:

* **LRU (model)**: the one-pass stack curve (``stack_distance``), single tier;
* **LRU (tree)**, optional: the real radix tree run as a single tier (``lru_tree``);
* **OPT**: the offline optimum of one tier (``optimum_bounds``: lower, upper, exact);
* **two-tier bound**: the optimum of ``device_hits + host_weight * host_hits`` with
  the scenario's device ``D`` and host ``H`` (``optimum.combine_two_tier``).

LRU rows are what one policy achieves in the model; OPT rows and the two-tier value
are *bounds*: no policy, SGLang's included, can beat them on this stream. They are
optimistic: requests are served one at a time with nothing locked, only input pages
are cached, and write-through's duplicate host copies are not charged.

Every hit rate here is hit tokens (whole pages) over *all* input tokens, partial
last pages included: the rate SGLang and ``summary.json``'s ``hit_rate`` report.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from pathlib import Path

from sim.analysis.optimum import combine_two_tier, optimum_bounds
from sim.analysis.lru_tree import UnitTrace, run_lru_tree, unit_trace
from sim.analysis.stack_distance import lru_hit_curve
from sim.atomic import write_json, write_text
from sim.errors import UserError
from sim.scenario import resolve_capacities
from sim.workloads import build_workload

#: Name of the file ``write_bound`` puts in a folder (the reports read it).
BOUND_FILE = "bound.json"
CSV_FILE = "bound.csv"

# Long format: one measure per line, so each line says whether it is a bound.
CSV_COLUMNS = ("label", "capacity_tokens", "host_tokens", "host_weight", "measure",
               "hit_rate", "is_bound", "exact")


def scenario_trace(scenario) -> UnitTrace:
    """The scenario's request stream keyed at its page size."""
    return unit_trace(build_workload(scenario), scenario.page_size)


def _rate(tokens: float, total: int) -> float:
    return tokens / total if total else 0.0


def bound_for_scenario(
    scenario,
    *,
    capacities: Iterable[int] = (),
    host_weight: float = 1.0,
    tree: bool = False,
    trace: UnitTrace | None = None,
) -> dict:
    """Reference hit rates of ``scenario`` (a validated ``sim.scenario.Scenario``).

    Rows for the device capacity ``D``, for ``D + H``, and for each of ``capacities``
    (tokens). ``bound_hit_rate`` is the two-tier optimum at ``D`` + ``H``, weighted by
    ``host_weight`` (1: a host hit counts as a hit, as in ``summary.json``); ``kind``
    is ``"exact"`` when the optimum's lower and upper values met, else ``"upper"``.
    """
    if isinstance(host_weight, bool) or not 0.0 <= host_weight <= 1.0:
        raise UserError(f"host weight {host_weight!r}; expected a number in [0, 1]",
                        where="--host-weight")
    device, host = resolve_capacities(scenario)
    bpt = scenario.model.spec().bytes_per_token(scenario.tp)
    wanted = [("device", device), ("device+host", device + host)]
    for cap in capacities:
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise UserError(f"found capacity {cap!r}; expected a non-negative token count",
                            where="--capacities")
        if all(cap != c for _, c in wanted):
            wanted.append(("extra", cap))
    if trace is None:
        trace = scenario_trace(scenario)
    ps, total = trace.page_size, trace.input_tokens
    curve = lru_hit_curve(trace.paths)
    rows, opt = [], {}
    for label, cap in wanted:
        b = optimum_bounds(trace.paths, cap // ps, ps)
        opt[cap] = b
        lru = curve.hit_units(cap // ps) * ps
        row = {
            "label": label,
            "capacity_tokens": cap,
            "capacity_gb": cap * bpt / 1e9,
            "lru_hit_tokens": lru,
            "lru_hit_rate": _rate(lru, total),
            "tree_lru_hit_rate": None,
            "opt_lower_hit_rate": _rate(b.lower_hit_tokens, total),
            "opt_upper_hit_rate": _rate(b.upper_hit_tokens, total),
            "opt_exact": b.exact,
        }
        if tree:
            rep = run_lru_tree(trace.paths, cap, ps, input_tokens=total)
            row["tree_lru_hit_rate"] = rep.hit_rate
            row["tree_lru_hit_tokens"] = rep.hit_tokens
        rows.append(row)
    two = combine_two_tier(opt[device], opt[device + host], host_weight)
    two_tier = {
        "device_tokens": device,
        "host_tokens": host,
        "host_weight": host_weight,
        "lower_hit_rate": _rate(two.lower_hit_tokens, total),
        "upper_hit_rate": _rate(two.upper_hit_tokens, total),
        "exact": two.exact,
        "device_hit_rate": _rate(two.device_hit_tokens, total),
        "host_hit_rate": _rate(two.host_hit_tokens, total),
    }
    return {
        "scenario": scenario.name,
        "page_size": ps,
        "requests": len(trace.paths),
        "input_tokens": total,
        "cacheable_tokens": trace.unit_tokens,
        "device_tokens": device,
        "host_tokens": host,
        "bytes_per_token": bpt,
        "device_gb": device * bpt / 1e9,
        "host_gb": host * bpt / 1e9,
        "host_weight": host_weight,
        "bound_hit_rate": two_tier["upper_hit_rate"],
        "kind": "exact" if two.exact else "upper",
        "metric": "(device_hit_tokens + host_weight * host_hit_tokens) / input_tokens",
        "note": ("offline optimum of a two-tier prefix cache (device + host) on this "
                 "request stream, served one at a time: no policy can beat it"),
        "rows": rows,
        "two_tier": two_tier,
    }


def bound_csv(doc: dict) -> str:
    """``doc`` as CSV text, one measure per line (``CSV_COLUMNS``).

    ``measure``: ``lru_model`` / ``lru_tree`` (one policy, not bounds), ``opt_lower`` /
    ``opt_upper`` (single tier) and ``two_tier_lower`` / ``two_tier_upper`` (bounds).
    """
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(CSV_COLUMNS)
    for row in doc["rows"]:
        head = [row["label"], row["capacity_tokens"], 0, ""]
        out.writerow(head + ["lru_model", repr(row["lru_hit_rate"]), False, ""])
        if row["tree_lru_hit_rate"] is not None:
            out.writerow(head + ["lru_tree", repr(row["tree_lru_hit_rate"]), False, ""])
        for side in ("lower", "upper"):
            out.writerow(head + [f"opt_{side}", repr(row[f"opt_{side}_hit_rate"]), True,
                                 row["opt_exact"]])
    t = doc["two_tier"]
    head = ["two_tier", t["device_tokens"], t["host_tokens"], t["host_weight"]]
    for side in ("lower", "upper"):
        out.writerow(head + [f"two_tier_{side}", repr(t[f"{side}_hit_rate"]), True, t["exact"]])
    return buf.getvalue()


def write_bound(doc: dict, folder, *, with_csv: bool = True) -> list[Path]:
    """Write ``bound.json`` (and ``bound.csv``) into ``folder``, atomically."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UserError("found a file; expected a folder to write bound.json into", where=str(folder))
    written = [folder / BOUND_FILE]
    write_json(written[0], doc)
    if with_csv:
        written.append(folder / CSV_FILE)
        write_text(written[1], bound_csv(doc))
    return written
