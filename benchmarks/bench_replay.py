"""Op-trace replay against SGLang's own Python tree core, at page sizes 1 and 16.

Usage: python benchmarks/bench_replay.py [--ops 10000] [--repeats 5] [--pages 1,16]
       [--sim-root CHECKOUT] [--profile PAGE]

A seeded write_back trace with host pressure (sim.optrace_gen, the conformance
cases' shapes) is replayed by ``replay-ops`` (this project's command, in a fresh
process) and by the shared oracle's replayer on SGLang 0.5.23's ``UnifiedTreeCore``
(tools/sglang_oracle/time_replay.py, in the oracle venv: $SGLANG_ORACLE_VENV,
default sglang-oracle-venv in the temp dir; the oracle's folder from
$HICACHE_SGLANG_ORACLE, default ../shared/oracle). Each side reads the trace, replays
it and writes its output file; both are timed after their imports (SGLang's takes
seconds and is not the work compared). The runs alternate, sim then SGLang, repeat
after repeat, and each pair's ratio SGLang/sim is taken, so a machine whose speed
drifts moves both sides of a pair alike. The two outputs are checked to be the same
bytes. Reported: each side's median seconds, and the ratio's min, median and max.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def oracle_python() -> Path:
    venv = os.environ.get("SGLANG_ORACLE_VENV") or str(Path(tempfile.gettempdir()) / "sglang-oracle-venv")
    return Path(venv) / "bin" / "python"


def write_trace(path: Path, n_ops: int, ps: int, seed: int) -> None:
    from sim.optrace import _dumps
    from sim.optrace_gen import generate

    ops = generate(n_ops, seed=seed, page_size=ps, device_capacity=48 * ps, host_capacity=20 * ps)
    path.write_text("".join(_dumps(op) + "\n" for op in ops))


def time_sim(trace: str, out: str) -> float:
    """``replay-ops TRACE -o OUT`` in this process (for --profile)."""
    from sim.commands import replay_ops

    args = argparse.Namespace(trace=trace, out=out, ids="optrace", host_policy="duplicate_first",
                              summary=False)
    t0 = time.perf_counter()
    replay_ops.run(args)
    return time.perf_counter() - t0


# The timed side of a run, in a fresh process over the checkout at sys.argv[1].
# The command's own imports (it loads them when it runs) come before the clock starts,
# as SGLang's do on its side: what is timed is reading, replaying and writing.
SIM_ONE = """
import argparse, json, sys, time
sys.path.insert(0, sys.argv[1])
from sim.commands import replay_ops
import msgspec, sim.atomic, sim.optrace, sim.policies.host  # noqa: F401
args = argparse.Namespace(trace=sys.argv[2], out=sys.argv[3], ids="optrace",
                          host_policy="duplicate_first", summary=False)
t0 = time.perf_counter()
replay_ops.run(args)
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def run_sim(root: Path, trace: Path, out: Path) -> float:
    """``replay-ops TRACE -o OUT`` of the checkout at ``root``, timed after its imports."""
    r = subprocess.run([sys.executable, "-c", SIM_ONE, str(root), str(trace), str(out)],
                       capture_output=True, text=True, check=True, cwd=root)
    return json.loads(r.stdout.strip().splitlines()[-1])["seconds"]


def run_sglang(py: Path, trace: Path, out: Path) -> float:
    r = subprocess.run([str(py), str(ROOT / "tools" / "sglang_oracle" / "time_replay.py"),
                        str(trace), str(out)], capture_output=True, text=True, check=True)
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["errors"] == 0, "SGLang refused ops of the generated trace"
    return res["seconds"]


def spread(xs: list[float]) -> str:
    return f"{min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pages", default="1,16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sim-root", type=Path, action="append",
                    help="time the replay-ops of this checkout instead (repeatable: each "
                         "one in the same interleaving, e.g. before and after a change)")
    ap.add_argument("--profile", type=int, metavar="PAGE",
                    help="cProfile replay-ops on the trace at this page size, nothing else")
    args = ap.parse_args()
    pages = [int(p) for p in args.pages.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench_replay_") as tmp:
        tmp = Path(tmp)
        traces = {}
        for ps in pages:
            traces[ps] = tmp / f"trace_ps{ps}.jsonl"
            write_trace(traces[ps], args.ops, ps, args.seed)
        if args.profile is not None:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.runcall(time_sim, str(traces[args.profile]), str(tmp / "out.jsonl"))
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            return 0
        py = oracle_python()
        if not py.is_file():
            print(f"{py}: found no oracle venv; expected one built by ../shared/oracle/setup.sh "
                  "(or set $SGLANG_ORACLE_VENV)", file=sys.stderr)
            return 2
        roots = args.sim_root or [ROOT]
        sims = {(root, ps): [] for root in roots for ps in pages}
        sgls = {ps: [] for ps in pages}
        for _ in range(args.repeats):
            for ps in pages:
                b = tmp / f"sgl{ps}.jsonl"
                sgls[ps].append(run_sglang(py, traces[ps], b))
                for k, root in enumerate(roots):
                    a = tmp / f"sim{k}_{ps}.jsonl"
                    sims[root, ps].append(run_sim(root, traces[ps], a))
                    assert a.read_bytes() == b.read_bytes(), f"{root}, page {ps}: outputs differ"
        print(f"op-trace replay, {args.ops:,} ops, write_back with host pressure, "
              f"{args.repeats} interleaved runs; the same output bytes on every side")
        print(f"{'page':>5} {'out MB':>7} {'sglang s':>9} {'sim s':>7}  {'sglang/sim min / median / max':>30}  checkout")
        for ps in pages:
            mb = (tmp / f"sgl{ps}.jsonl").stat().st_size / 1e6
            for root in roots:
                ratios = [b / a for a, b in zip(sims[root, ps], sgls[ps])]
                print(f"{ps:>5} {mb:>7.1f} {statistics.median(sgls[ps]):>9.2f} "
                      f"{statistics.median(sims[root, ps]):>7.2f}  {spread(ratios):>30}  {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
