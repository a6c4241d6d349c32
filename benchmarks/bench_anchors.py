"""Each speed measure as a ratio against its anchor, in one run, interleaved.

Usage: python benchmarks/bench_anchors.py [--repeats 5] [--only replay,plan,engine]
       [--requests 5000] [--ops 10000]

* replay: ``replay-ops`` against SGLang 0.5.23's Python tree core on the same
  generated op-trace, page sizes 1 and 16 (benchmarks/bench_replay.py: each side in a
  fresh process, timed after its imports, outputs checked byte for byte); the ratio
  is SGLang's seconds over ours (above 1: faster than SGLang).
* plan: ``hicache-sim plan`` on 30 points of the Mooncake conversation trace (one
  cache, model curve only, figure and files included) against kvcache-simulator's
  C++ core (PyPI ``kvcache-simulator``, the ``bench`` extra; ``$KVCACHE_SIMULATOR``,
  the one on PATH, or the one next to this Python) on the same trace at the grid's sizes above 0, LRU; both whole
  processes, wall clock; the ratio is theirs over ours. Each side runs as installed:
  kvcache-simulator's C++ core is compiled by an untimed first run, and our modules'
  bytecode by ``compileall`` into the checkout's ``__pycache__`` folders (what pip
  does at install and Python at a first import; under ``PYTHONDONTWRITEBYTECODE``
  a checkout would otherwise compile every module from source at every run, about
  0.15 s of CPU that an installed tool never spends). ``--source-each-run`` measures
  that case instead (it removes those ``__pycache__`` folders first).
* engine: the quickstart scenario at TP 2 (``--requests``) against a bare SimPy
  loop that processes the same number of events (one process yielding timeouts),
  each timed in a fresh process after its imports; the ratio is ours over the loop's
  (how many times the floor of any SimPy engine this one costs).

Runs alternate measure by measure, anchor then ours, repeat after repeat; each pair
gives a ratio and the table shows its min / median / max.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_replay  # noqa: E402

TRACE = ROOT / "data" / "traces" / "mooncake-fast25" / "conversation_trace.jsonl.gz"
PLAN_SCENARIO = ROOT / "scenarios" / "mooncake_conversation.yaml"
PLAN_POINTS = 30

ENGINE_ONE = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from sim.runner import prepare
from sim.cluster import Cluster
from sim.scenario import load_scenario
scn = load_scenario(sys.argv[1] + "/scenarios/quickstart.yaml", ["workload.num_requests=" + sys.argv[2]])
scenario, cfg, cost, workload = prepare(scn)
t0 = time.perf_counter()
sim = Cluster(cfg, workload, cost)
sim.run()
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "events": next(sim.env._eid), "requests": sim.done}))
"""

SIMPY_ONE = """
import json, sys, time
import simpy
n = int(sys.argv[1])
env = simpy.Environment()
def loop(env, n):
    for _ in range(n):
        yield env.timeout(1e-3)
t0 = time.perf_counter()
env.process(loop(env, n - 2))  # the process's start and end are events too
env.run()
print(json.dumps({"seconds": time.perf_counter() - t0, "events": next(env._eid)}))
"""


def _json_run(cmd, **kw) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True, check=True, **kw)
    return json.loads(r.stdout.strip().splitlines()[-1])


def _wall(cmd, **kw) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    return time.perf_counter() - t0


def spread(xs) -> str:
    return f"{min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f}"


def plan_sizes_gib() -> list[float]:
    """The host sizes the model curve of ``plan --grid-points 30`` evaluates, in GiB
    of the whole instance (what kvcache-simulator's --budgets-gib takes), from
    plan.parquet: the grid's 29 sizes above 0."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, str(ROOT / "cli.py"), "plan", str(PLAN_SCENARIO), "-o", tmp,
                        *PLAN_ARGS], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        import pandas as pd

        df = pd.read_parquet(Path(tmp) / "plan.parquet")
    gb = sorted(set(float(x) for x in df["host_gb_per_rank"] if x > 0))
    # per rank at TP 8 -> the whole instance's cache, the one cache kvcache-simulator models
    return [g * 8 * 1e9 / 2**30 for g in gb][:PLAN_POINTS]


def compile_checkout() -> None:
    """Bytecode for this checkout's modules in their ``__pycache__`` folders (ignored
    by git), the ones an installed copy has: Python reads them even where
    ``PYTHONDONTWRITEBYTECODE`` keeps it from writing them."""
    import compileall

    for pkg in ("sim", "reports"):
        if not compileall.compile_dir(str(ROOT / pkg), quiet=1):
            raise SystemExit(f"compileall {ROOT / pkg}: failed")


def drop_bytecode() -> None:
    """Remove what ``compile_checkout`` writes (the ``__pycache__`` folders under
    sim/ and reports/), so that a run under ``PYTHONDONTWRITEBYTECODE`` compiles every
    module of ours from source."""
    for pkg in ("sim", "reports"):
        for d in sorted((ROOT / pkg).rglob("__pycache__"), reverse=True):
            shutil.rmtree(d)


PLAN_ARGS = ["--check-points", "0", "--grid-points", str(PLAN_POINTS), "--opt-points", "0",
             "--quiet", "--set", "dp=1"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", default="replay,plan,engine")
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--source-each-run", action="store_true",
                    help="plan: our bytecode removed instead of compiled beforehand (under "
                         "PYTHONDONTWRITEBYTECODE every run then compiles our modules from source)")
    args = ap.parse_args()
    todo = args.only.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_anchors_") as tmp:
        tmp = Path(tmp)
        measures = []
        if "replay" in todo:
            py = bench_replay.oracle_python()
            if not py.is_file():
                print(f"replay: skipped ({py}: no oracle venv; ../shared/oracle/setup.sh builds it)")
            else:
                for ps in (1, 16):
                    trace = tmp / f"trace_ps{ps}.jsonl"
                    bench_replay.write_trace(trace, args.ops, ps, 0)

                    def anchor(trace=trace, ps=ps):
                        return bench_replay.run_sglang(py, trace, tmp / f"sgl{ps}.jsonl")

                    def ours(trace=trace, ps=ps):
                        s = bench_replay.run_sim(ROOT, trace, tmp / f"sim{ps}.jsonl")
                        assert (tmp / f"sim{ps}.jsonl").read_bytes() == (tmp / f"sgl{ps}.jsonl").read_bytes()
                        return s

                    measures.append((f"replay, page {ps} ({args.ops:,} ops)",
                                     "SGLang core", anchor, ours, "anchor/ours"))
        if "plan" in todo:
            here = Path(sys.executable).parent / "kvcache-simulator"  # the venv's, off PATH
            exe = (os.environ.get("KVCACHE_SIMULATOR") or shutil.which("kvcache-simulator")
                   or (str(here) if here.is_file() else None))
            if exe is None:
                print("plan: skipped (no kvcache-simulator: pip install '.[bench]' or set $KVCACHE_SIMULATOR)")
            else:
                budgets = ",".join(f"{g:.6g}" for g in plan_sizes_gib())
                kvs = [exe, "run", "--trace", str(TRACE), "--model", "llama-3.1-70b",
                       "--block-size", "512", "--budgets-gib", budgets, "--policies", "lru",
                       "--no-progress", "--format", "json", "-o", str(tmp / "kvs.json")]
                _wall(kvs)  # its C++ core is compiled on first use: not timed
                if args.source_each_run:
                    drop_bytecode()
                    print("plan: ours compiling its modules from source at each run")
                else:
                    compile_checkout()  # ours, as an install has it: not timed either
                    print("plan: ours with its bytecode compiled beforehand")
                ours_cmd = [sys.executable, str(ROOT / "cli.py"), "plan", str(PLAN_SCENARIO),
                            "-o", str(tmp / "plan"), *PLAN_ARGS]
                measures.append((f"plan, {PLAN_POINTS} points (whole process)", "kvcache-simulator",
                                 lambda: _wall(kvs), lambda: _wall(ours_cmd, cwd=ROOT), "anchor/ours"))
        if "engine" in todo:
            info = _json_run([sys.executable, "-c", ENGINE_ONE, str(ROOT), str(args.requests)])
            events = info["events"]

            def engine():
                return _json_run([sys.executable, "-c", ENGINE_ONE, str(ROOT), str(args.requests)])["seconds"]

            def bare():
                return _json_run([sys.executable, "-c", SIMPY_ONE, str(events)])["seconds"]

            measures.append((f"engine, quickstart TP 2, {args.requests:,} requests ({events:,} events)",
                             "bare SimPy loop", bare, engine, "ours/anchor"))
        times = {m[0]: ([], []) for m in measures}
        for _ in range(args.repeats):
            for name, _, anchor, ours, _ in measures:
                a, o = anchor(), ours()
                times[name][0].append(a)
                times[name][1].append(o)
        print(f"{args.repeats} interleaved pairs per measure (anchor, then ours)")
        print(f"{'measure':<58} {'anchor':<18} {'anchor s':>9} {'ours s':>7} {'ratio':>12}  min / median / max")
        for name, label, _, _, kind in measures:
            a, o = times[name]
            ratios = [x / y for x, y in zip(a, o)] if kind == "anchor/ours" else [y / x for x, y in zip(a, o)]
            rows.append((name, label, statistics.median(a), statistics.median(o), kind, spread(ratios)))
            print(f"{name:<58} {label:<18} {statistics.median(a):>9.2f} {statistics.median(o):>7.2f} "
                  f"{kind:>12}  {spread(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
