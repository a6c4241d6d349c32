"""`hicache-sim bound SCENARIO [--capacities C ...] [--tree] [-o DIR] [--results DIR]`.

Prints the scenario's LRU hit rates (stack-distance model, optionally the real tree)
and the offline optimum, a bound no policy can beat (``sim.analysis.bound``).
"""

from __future__ import annotations

import math
import re

from sim.fmt import percent, table

NAME = "bound"
HELP = "LRU hit-rate curve and the offline-optimum bound for a scenario's request stream."

_SPLIT = re.compile(r"[\s,]+")


def add_arguments(p) -> None:
    p.add_argument("scenario", help="scenario YAML (see scenarios/)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set limits.max_requests=2000 (repeatable)")
    p.add_argument("--trace-root", dest="trace_roots", action="append", default=[], metavar="DIR",
                   help="also resolve the scenario's trace paths under DIR; repeatable")
    p.add_argument("--capacities", nargs="+", default=[], metavar="TOKENS",
                   help="extra single-tier capacities in tokens (e.g. 1e6 2e6 or 1e6,2e6)")
    p.add_argument("--tree", action="store_true",
                   help="also replay the real radix tree as a single-tier LRU (slower)")
    p.add_argument("--host-weight", type=str, default="1",
                   help="value of a host hit relative to a device hit, in [0, 1] (default 1)")
    p.add_argument("-o", "--out", metavar="DIR", help="write bound.json and bound.csv into DIR")
    p.add_argument("--results", metavar="DIR",
                   help="an existing results folder: write bound.json there for the reports")


def parse_capacities(items) -> list[int]:
    """Token counts from ``1000000``, ``1e6`` or comma-separated lists of them."""
    from sim.errors import UserError

    out = []
    for item in items:
        for text in filter(None, _SPLIT.split(item)):
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not (math.isfinite(value) and value >= 0 and value.is_integer() and value < 2**62):
                raise UserError(f"found {text!r}; expected a whole, non-negative token count "
                                "such as 1000000 or 1e6", where="--capacities")
            out.append(int(value))
    return out


def _parse_weight(text: str) -> float:
    from sim.errors import UserError

    try:
        w = float(text)
    except ValueError:
        w = math.nan
    if not 0.0 <= w <= 1.0:  # also rejects nan
        raise UserError(f"found {text!r}; expected a number in [0, 1]", where="--host-weight")
    return w


def run(args) -> int:
    from pathlib import Path

    from sim.analysis.bound import write_bound, bound_for_scenario
    from sim.errors import UserError
    from sim.scenario import load_scenario

    capacities = parse_capacities(args.capacities)
    weight = _parse_weight(args.host_weight)
    if args.results is not None and not Path(args.results).is_dir():
        raise UserError("no such folder; expected an existing results folder", where=args.results)
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UserError("found a file; expected a folder for bound.json and bound.csv",
                        where=args.out)
    scenario = load_scenario(args.scenario, args.sets, trace_roots=args.trace_roots)
    doc = bound_for_scenario(scenario, capacities=capacities, host_weight=weight, tree=args.tree)
    _print(doc)
    if args.out is not None:
        paths = write_bound(doc, args.out)
        print(f"written: {', '.join(map(str, paths))}")
    if args.results is not None:
        paths = write_bound(doc, args.results, with_csv=False)
        print(f"written: {paths[0]}")
    return 0


def _pct(x) -> str:
    return percent(x, 2)


def _print(doc: dict) -> None:
    print(f"{doc['scenario']}: {doc['requests']:,} requests, {doc['input_tokens']:,} input "
          f"tokens, page size {doc['page_size']}; hit rates are of all input tokens")
    print("single tier: LRU = one policy (model: stack distances; tree: the real radix "
          "tree); OPT = offline optimum, a BOUND no policy beats")
    from sim.sizing import fmt_capacity

    bpt = doc["bytes_per_token"]
    header = ("capacity", "per rank", "LRU model", "LRU tree", "OPT lower", "OPT upper", "exact")
    rows = [(r["label"], fmt_capacity(r["capacity_tokens"], bpt), _pct(r["lru_hit_rate"]),
             _pct(r["tree_lru_hit_rate"]), _pct(r["opt_lower_hit_rate"]),
             _pct(r["opt_upper_hit_rate"]), "yes" if r["opt_exact"] else "no")
            for r in doc["rows"]]
    print(table(header, rows, indent="  "))
    t = doc["two_tier"]
    print(f"two tiers (BOUND): device {fmt_capacity(t['device_tokens'], bpt)} + host "
          f"{fmt_capacity(t['host_tokens'], bpt)} per rank, "
          f"host weight {t['host_weight']:g}: {_pct(t['upper_hit_rate'])} "
          f"({'exact' if t['exact'] else 'upper; feasible ' + _pct(t['lower_hit_rate'])}; "
          f"device {_pct(t['device_hit_rate'])} + host {_pct(t['host_hit_rate'])})")
    print(f"bound_hit_rate = {doc['bound_hit_rate']:.4f} ({doc['kind']})")
