"""`hicache-sim census SCENARIO --seeds N [--seed-start K] [--set k=v ...] [-o DIR]
[--jobs J] [--executor local|ray]`: run one scenario over many seeds and show how
its TP verdicts spread.

The per-seed records, resume rules and output files are described in
``sim/census.py``. Exit codes: 0 the census is complete (whatever the verdicts: a
census of diverging runs is a successful census), 1 some seed's run raised (see
OUT/failures.json; rerun to retry), 2 bad input, 130 interrupted (rerun the same
command to resume).
"""

from __future__ import annotations

import sys
import time

from sim.fmt import duration

NAME = "census"
HELP = "Run one scenario over many seeds: the spread of its TP verdicts and detection delays; resumable."


def add_arguments(p) -> None:
    p.add_argument("scenario", help="scenario YAML (see scenarios/)")
    p.add_argument("--seeds", type=int, required=True, metavar="N", help="number of seeds to run")
    p.add_argument("--seed-start", type=int, default=0, metavar="K",
                   help="first seed (default 0): runs seeds K..K+N-1")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set limits.max_requests=200 (repeatable)")
    p.add_argument("-o", "--out", help="census folder (default: results/census/<scenario name>)")
    p.add_argument("--jobs", type=int, metavar="J",
                   help="seeds run in parallel (default: the number of CPUs; 1 runs them in "
                        "this process)")
    p.add_argument("--executor", default="local", choices=("local", "ray"),
                   help="local: a process pool; ray: Ray tasks (default: local)")
    p.add_argument("--address", metavar="ADDR",
                   help="Ray cluster address (default: start a local Ray instance)")
    p.add_argument("--no-plots", action="store_true", help="skip census.png / census.svg")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    from sim.census import format_table, pinned_warning, plan_census, run_census
    from sim.errors import UserError
    from sim.sweep import report_failures

    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs: found {args.jobs}; expected a positive number of parallel seeds")
    plan = plan_census(args.scenario, args.seeds, seed_start=args.seed_start,
                       overrides=args.sets, out=args.out)
    if plan.pinned_jitter_seed is not None:
        print(f"hicache-sim census: warning: {pinned_warning(plan)}", file=sys.stderr)
    t0 = time.perf_counter()
    try:
        res = run_census(plan, jobs=args.jobs, executor=args.executor, address=args.address,
                         progress=not args.quiet, plots=not args.no_plots)
    except KeyboardInterrupt:
        print(f"hicache-sim census: interrupted; rerun the same command to resume ({plan.out})",
              file=sys.stderr)
        return 130
    wall = time.perf_counter() - t0
    print(format_table(res.aggregate))
    print(f"{len(res.ran)} seed(s) ran, {len(res.skipped)} already recorded, "
          f"{len(res.failures)} failed ({duration(wall)} wall)")
    print(f"written: {', '.join(str(f) for f in res.files)}")
    return report_failures("census", "seed", "seed", res.failures, plan.out / "failures.json")
