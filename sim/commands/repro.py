"""`hicache-sim repro SCENARIO -o BUNDLE_DIR [--tries N] [--budget S] [--seed S] [--set k=v]`:
find a seed on which the TP ranks fail, shrink the case, and write a replayable bundle.

Exit codes: 3 when a failure was found and bundled (as ``run`` exits 3
on a TP failure), 0 when no try failed ("no divergence within budget"; nothing is
written), 2 for bad input.
"""

from __future__ import annotations

import json
import time

from sim.fmt import duration

NAME = "repro"
HELP = ("Search seeds until a TP divergence failure appears, shrink it (Hypothesis), and write a "
        "replayable bundle (exit 3: bundled; 0: no divergence within budget).")


def add_arguments(p) -> None:
    p.add_argument("scenario", help="scenario YAML with jitter (see scenarios/jitter_*.yaml)")
    p.add_argument("-o", "--out", required=True, metavar="BUNDLE_DIR",
                   help="bundle folder to write (replaced atomically if it holds a bundle)")
    p.add_argument("--tries", type=_positive, default=20,
                   help="seeds to try: try i uses seed base+i (default 20)")
    p.add_argument("--budget", type=_seconds, metavar="SECONDS",
                   help="stop searching after this much wall time (checked between tries)")
    p.add_argument("--seed", type=_non_negative, help="base seed (default: the scenario's seed)")
    p.add_argument("--trace-root", dest="trace_roots", action="append", default=[], metavar="DIR",
                   help="also resolve the scenario's trace paths under DIR; repeatable")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key before searching (repeatable)")
    p.add_argument("--shrink-runs", type=_non_negative, default=300, metavar="N",
                   help="at most N simulations while shrinking; 0 skips shrinking (default 300)")


def _int_arg(text: str, lo: int, what: str) -> int:
    import argparse

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"found {text!r}; expected {what}") from None
    if v < lo:
        raise argparse.ArgumentTypeError(f"found {v}; expected {what}")
    return v


def _positive(text: str) -> int:
    return _int_arg(text, 1, "a positive integer")


def _non_negative(text: str) -> int:
    return _int_arg(text, 0, "a non-negative integer")


def _seconds(text: str) -> float:
    import argparse
    import math

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"found {text!r}; expected seconds (a positive number)") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"found {text!r}; expected seconds (a positive number)")
    return v


def run(args) -> int:
    from sim import repro
    from sim.scenario import load_scenario

    scenario = load_scenario(args.scenario, args.sets, trace_roots=args.trace_roots)
    if scenario.model.hybrid_preset is not None:
        from sim.errors import UserError

        raise UserError(f"found model.hybrid_preset {scenario.model.hybrid_preset!r}; expected "
                        "a FULL-only model (repro bundles hold FULL op-traces; record a hybrid "
                        "run's traces with `run --record-ops`)", where=args.scenario)
    t0 = time.perf_counter()

    def on_try(i, seed, out):
        print(f"try {i} (seed {seed}): {out.verdict}", flush=True)

    found = repro.search(scenario, tries=args.tries, budget_s=args.budget, base_seed=args.seed,
                         on_try=on_try)
    if found.outcome is None:
        why = "budget" if found.stopped == "budget" else "tries"
        print(f"no divergence within budget: {found.tries} tries (seeds {found.base_seed}.."
              f"{found.base_seed + max(0, found.tries - 1)}, stopped by {why}); nothing written")
        return 0
    first = found.outcome
    before = repro.sizes(first)
    print(f"found: {first.failure_class} at try {found.tries - 1} (seed {found.seed})")
    info = None
    final = first
    if args.shrink_runs > 0:
        final, info = repro.shrink(first, max_runs=args.shrink_runs)
    after = repro.sizes(final)
    if info is not None:
        print(f"shrunk in {info.runs} runs" + (" (run limit reached)" if info.exhausted else "")
              + f": requests {before['requests']} -> {after['requests']}, ranks {before['ranks']} -> "
              f"{after['ranks']}, events {before['events']} -> {after['events']}")
    out = repro.write_bundle(args.out, final, repro.BundleInfo(
        source=args.scenario, search=found, before=before, shrink=info,
        extra={"overrides": list(args.sets)}))
    # A bundle that does not replay is worse than none: check it now.
    res = repro.verify_bundle(out, trace_roots=args.trace_roots)
    print(f"bundle: {out} ({duration(time.perf_counter() - t0)}); replay: hicache-sim replay {out}")
    print(f"failure: {res.line}")
    meta = json.loads((out / "bundle.json").read_text())
    ev = meta["first_divergent_event"]
    if ev is not None:
        print(f"first divergent event: {ev['kind']} at t={ev['t']:.6f}s (step {ev['step']}): "
              f"{ev['summary']} [{ev['sglang']}]")
    return 3
