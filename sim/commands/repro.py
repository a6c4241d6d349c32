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
    p.add_argument("scenario", nargs="?", help="scenario YAML with jitter (see scenarios/jitter_*.yaml)")
    p.add_argument("--from-dump", metavar="DUMP",
                   help="instead of a scenario: an SGLang crash dump (or dump_requests_folder), "
                        "imported as `hicache-sim import` does, and its traffic searched over a "
                        "space of per-rank perturbations for --assertion (docs/SERVER_ARTEFACTS.md)")
    p.add_argument("--assertion", metavar="TEXT",
                   help="with --from-dump: the line the server died with, matched as a substring "
                        "of the run's failure line (default: SGLang's digest assertion)")
    p.add_argument("--model", metavar="PRESET",
                   help="with --from-dump: the model preset when the dump's ModelConfig is missing")
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
    from sim.errors import UserError
    from sim.scenario import load_scenario

    if (args.scenario is None) == (args.from_dump is None):
        raise UserError("found " + ("both a scenario and --from-dump" if args.scenario else
                                    "neither a scenario nor --from-dump")
                        + "; expected exactly one")
    if args.from_dump is None and (args.assertion or args.model):
        raise UserError("found --assertion or --model without --from-dump; expected them only "
                        "with a dump")
    if args.from_dump is not None:
        return _from_dump(args)
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


def _from_dump(args) -> int:
    """--from-dump: import into a scratch folder, search the perturbation space, bundle.
    The scratch folder sits beside the bundle, as the bundle's own staging folder does
    (sim.repro.bundle.write_bundle), and is removed when the command ends."""
    import os
    import shutil
    from pathlib import Path

    from sim import repro
    from sim.imports import build, crashdump
    from sim.constants import DIGEST_MISMATCH_MESSAGE
    from sim.repro.from_dump import search_dump
    from sim.scenario import load_scenario

    t0 = time.perf_counter()
    dump = crashdump.read(args.from_dump)
    dest = Path(args.out)
    scratch = dest.parent / f".{dest.name}.import-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        tmp = str(scratch)
        summary = build.write(dump, tmp, model=args.model)
        scenario = load_scenario(f"{tmp}/scenario.yaml", args.sets, trace_roots=args.trace_roots)
        base = scenario.seed if args.seed is None else args.seed
        print(f"dump: {summary['requests']} requests at TP {scenario.tp} "
              f"({len(summary['mapped'])} server args mapped); searching for: "
              f"{args.assertion or DIGEST_MISMATCH_MESSAGE}", flush=True)

        def on_try(name, seed, out, line):
            print(f"{name} seed {seed}: {out.verdict}" + ("" if not out.failed else f" ({line})"),
                  flush=True)

        found = search_dump(scenario, tries=args.tries, base_seed=base,
                            assertion=args.assertion, on_try=on_try, budget_s=args.budget)
        for name, why in found.skipped:
            print(f"skipped {name}: {why}")
        if found.outcome is None:
            others = (f"; {len(found.other_failures)} runs failed otherwise (first: "
                      f"{found.other_failures[0][0]} seed {found.other_failures[0][1]}: "
                      f"{found.other_failures[0][2]})") if found.other_failures else ""
            stop = (f", stopped by the {args.budget:g} s budget" if found.stopped == "budget"
                    else "")
            print(f"not reproduced: no perturbation in the space gave {found.assertion!r} in "
                  f"{found.runs} runs ({args.tries} seeds from {base} per perturbation{stop})"
                  f"{others}; nothing written")
            return 0
        first = found.outcome
        print(f"found: {found.candidate} on rank 1, seed {found.seed}: {failure(first)}")
        before = repro.sizes(first)
        final, info = (first, None)
        if args.shrink_runs > 0:
            final, info = repro.shrink(first, max_runs=args.shrink_runs)
        out = repro.write_bundle(args.out, final, repro.BundleInfo(
            source=args.from_dump, search=found.as_search(base), before=before, shrink=info,
            extra={"overrides": list(args.sets), "from_dump": str(args.from_dump),
                   "perturbation": found.candidate, "assertion": found.assertion}))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    res = repro.verify_bundle(out, trace_roots=args.trace_roots)
    print(f"bundle: {out} ({duration(time.perf_counter() - t0)}); replay: hicache-sim replay {out}")
    print(f"failure: {res.line}")
    return 3


def failure(outcome) -> str:
    from sim.repro.case import failure_line

    return failure_line(outcome.divergence)
