"""Do two checkouts' ``plan`` commands write the same bytes? For a speed change to plan's
process layout (who imports, draws and saves what): every file it writes (plan.png,
plan.svg, plan.parquet, plan.json) must stay byte for byte what the other revision
writes, for the FULL-only plan (host and device tier, storage, targets, engine checks, the offline optimum)
and the hybrid ones.

Usage: python tools/plan_outputs_identical.py --base /path/to/other/checkout [--only NAME,...]

Each case runs ``python cli.py plan ...`` in each checkout (its own folder as the working
directory and ``PYTHONPATH``), into a fresh folder, and compares the folders file by
file; the exit code is 1 when any file differs or is missing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SMALL = ["--set", "limits.max_requests=40"]
CASES = {
    # the speed measure (benchmarks/bench_anchors.py PLAN_ARGS)
    "bench": ["scenarios/mooncake_conversation.yaml", "--check-points", "0", "--grid-points", "30",
              "--opt-points", "0", "--quiet", "--set", "dp=1"],
    "target": ["scenarios/mooncake_conversation.yaml", "--check-points", "0", "--grid-points", "12",
               "--opt-points", "0", "--quiet", "--target-hit-rate", "0.3",
               "--set", "node={host_ram_gb: 2048}"],
    "quickstart": ["scenarios/quickstart.yaml", "--check-points", "0", "--grid-points", "8",
                   "--opt-points", "2", "--quiet", "--set", "workload.num_requests=200"],
    "engine": ["scenarios/quickstart.yaml", "--check-points", "2", "--grid-points", "8",
               "--opt-points", "2", "--quiet", "--target-ttft-p99", "5",
               "--set", "workload.num_requests=120"],
    "device_tier": ["scenarios/quickstart.yaml", "--check-points", "2", "--grid-points", "6",
                    "--opt-points", "0", "--quiet", "--set", "host=off",
                    "--set", "workload.num_requests=120"],
    "storage": ["scenarios/storage_mooncake.yaml", "--check-points", "2", "--grid-points", "6",
                "--opt-points", "0", "--policies", "write_through+duplicate_first", "--quiet",
                *SMALL],
    "hybrid_mamba": ["scenarios/hybrid_mamba.yaml", "--kv-points", "1", "--slot-points", "2",
                     "--quiet", *SMALL],
    "hybrid_swa": ["scenarios/hybrid_swa_host.yaml", "--kv-points", "1", "--aux-points", "2",
                   "--quiet", *SMALL],
}


def run_plan(root: Path, args: list[str], out: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(root))
    r = subprocess.run([sys.executable, "cli.py", "plan", *args, "-o", str(out)], cwd=root,
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{root}: plan {' '.join(args)}: exit {r.returncode}\n{r.stderr}")


def compare(a: Path, b: Path) -> list[str]:
    """The differences between two output folders, one line each (none: identical)."""
    names = sorted({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()})
    bad = []
    for n in names:
        pa, pb = a / n, b / n
        if not pa.is_file() or not pb.is_file():
            bad.append(f"{n}: only in {'base' if pa.is_file() else 'this checkout'}")
        elif pa.read_bytes() != pb.read_bytes():
            bad.append(f"{n}: bytes differ ({pa.stat().st_size} vs {pb.stat().st_size})")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, type=Path, help="the other checkout's root")
    ap.add_argument("--only", help="comma-separated case names (default: all)")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(CASES)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="plan_identical_") as tmp:
        for name in names:
            a, b = Path(tmp) / name / "base", Path(tmp) / name / "ours"
            run_plan(args.base.resolve(), CASES[name], a)
            run_plan(ROOT, CASES[name], b)
            bad = compare(a, b)
            files = sorted(p.name for p in b.iterdir())
            print(f"{name:<14} {'identical' if not bad else 'DIFFERENT'}: {', '.join(files)}"
                  + "".join(f"\n  {x}" for x in bad))
            failed += bool(bad)
    print(f"{len(names) - failed} of {len(names)} cases identical")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
