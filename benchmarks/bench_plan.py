"""Benchmark of ``hicache-sim plan`` on the Mooncake conversation trace.

The target (issue 13): ``plan scenarios/mooncake_conversation.yaml`` with 50 host
sizes on the model curve and the offline optimum at 5, engine check points aside
(``--check-points 0``), in at most 5 s on the 2-core reference machine. The target
is for the trace as one cache (``--set dp=1``); the scenario as shipped (8
data-parallel instances) adds one engine run that records the router's assignment
and one curve per instance, timed on its own row.

Prints, as a markdown table: the end-to-end wall time of the command in a fresh
process (imports, trace parsing, figure and files included; best of ``--repeat``),
its ratio to the 5 s target, and a per-stage split measured in-process (trace,
chain compression, LRU pass, optimum, figure and files). With ``--profile`` also the
top of a cProfile of the in-process run.

    .venv/bin/python benchmarks/bench_plan.py [--repeat 3] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_S = 5.0
SCENARIO = ROOT / "scenarios" / "mooncake_conversation.yaml"
ARGS = ["--check-points", "0", "--grid-points", "50", "--opt-points", "5", "--quiet"]
ONE_CACHE = ["--set", "dp=1"]


def end_to_end(repeat: int, extra=()) -> float:
    best = float("inf")
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, str(ROOT / "cli.py"), "plan", str(SCENARIO), "-o", tmp,
                            *ARGS, *extra], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
            best = min(best, time.perf_counter() - t0)
    return best


def stages() -> list[tuple[str, float]]:
    import gc

    import numpy as np

    from sim.analysis import curves
    from sim.analysis.plan import make_plan, plan_trace
    from sim.commands.plan import write_plan
    from sim.scenario import load_scenario

    out = []
    t = time.perf_counter()
    s = load_scenario(SCENARIO, ["dp=1"])
    out.append(("load scenario", time.perf_counter() - t))
    t = time.perf_counter()
    tr = plan_trace(s)
    out.append(("read + key the trace", time.perf_counter() - t))
    gc.disable()
    try:
        t = time.perf_counter()
        comp = curves.compress(tr.paths)
        out.append((f"chain compression ({comp.unit_accesses:,} -> {len(comp.group):,} accesses)",
                    time.perf_counter() - t))
        t = time.perf_counter()
        lp = curves.lru_pass(comp, tr.arrival)
        lp.hits_at()
        out.append(("LRU pass (all capacities)", time.perf_counter() - t))
        t = time.perf_counter()
        nxt = curves.next_uses(comp)
        for c in np.linspace(len(lp.hits_at()) // 20, len(lp.hits_at()), 5).astype(int):
            curves.optimum_units(comp, int(c), nxt)
        out.append(("offline optimum x 5", time.perf_counter() - t))
    finally:
        gc.enable()
    t = time.perf_counter()
    plan = make_plan(s, check_points=0)
    out.append(("make_plan (all of the above again)", time.perf_counter() - t))
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        write_plan(plan, tmp)
        out.append(("figure (PNG + SVG) and files", time.perf_counter() - t))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    wall = end_to_end(args.repeat, ONE_CACHE)
    shipped = end_to_end(1)
    print("| measure | seconds |")
    print("|---|---|")
    print(f"| `plan` end to end, one cache (`--set dp=1`), fresh process (best of {args.repeat}) | {wall:.2f} |")
    print(f"| ratio to the {TARGET_S:g} s target | {wall / TARGET_S:.2f} |")
    print(f"| `plan` end to end, as shipped (dp 8: a routing run and 8 curves) | {shipped:.2f} |")
    for name, secs in stages():
        print(f"| {name} | {secs:.3f} |")
    if args.profile:
        from sim.analysis.plan import make_plan
        from sim.commands.plan import write_plan
        from sim.scenario import load_scenario

        prof = cProfile.Profile()
        with tempfile.TemporaryDirectory() as tmp:
            prof.enable()
            write_plan(make_plan(load_scenario(SCENARIO, ["dp=1"]), check_points=0), tmp)
            prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
        print(buf.getvalue())


if __name__ == "__main__":
    main()
