"""`hicache-sim sweep SWEEP.yaml [-o OUT] [--executor local|ray] [--workers N]
[--address ADDR] [--dry-run | --gather-only]`: run a parameter sweep.

The sweep format and the resume rules are in ``sim/sweep.py``. Exit codes: 0 all
points have results, 1 some point failed (see OUT/failures.json), 2 a bad sweep file
or flag, 130 interrupted (rerun the same command to resume).
"""

from __future__ import annotations

import sys
import time

from sim.fmt import duration

NAME = "sweep"
HELP = "Run a parameter sweep (grid/zip x seeds) locally or on Ray; resumable; writes sweep.parquet."


def add_arguments(p) -> None:
    p.add_argument("sweep", help="sweep YAML (see scenarios/sweeps/)")
    p.add_argument("-o", "--out", help="output folder (default: results/sweeps/<sweep name>)")
    p.add_argument("--executor", default="local", choices=("local", "ray"),
                   help="local: a process pool; ray: Ray tasks (default: local)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="parallel points (default: the number of CPUs)")
    p.add_argument("--address", metavar="ADDR",
                   help="Ray cluster address (default: start a local Ray instance)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true",
                      help="validate and list the points (and which are complete); run nothing")
    mode.add_argument("--gather-only", action="store_true",
                      help="only rebuild OUT/sweep.parquet from the point folders")
    p.add_argument("--bounds", action="store_true",
                   help="also compute each point's offline-optimal hit rate (bound.json) and "
                        "draw it on the capacity plot")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--trace-root", dest="trace_roots", action="append", default=[], metavar="DIR",
                   help="also resolve base scenarios and their trace paths under DIR; repeatable")


def run(args) -> int:
    from pathlib import Path

    from sim.errors import UserError
    from sim.sweep import (default_out, format_table, gather, load_sweep, point_status,
                           report_failures, run_sweep)

    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers: found {args.workers}; expected a positive number of workers")
    if args.address is not None and args.executor != "ray":
        raise UserError("--address: found an address with --executor local; expected it only "
                        "with --executor ray")
    plan = load_sweep(args.sweep, trace_roots=args.trace_roots)
    out = Path(args.out) if args.out else default_out(plan)
    if out.exists() and not out.is_dir():  # every mode: a dry run lists the folder too
        raise UserError("found a file; expected a sweep output folder (a new one, or an "
                        "earlier run of this sweep)", where=str(out))
    if args.dry_run:
        return _dry_run(plan, out, point_status)
    if args.gather_only:
        complete = sum(point_status(p, out) == "done" for p in plan.points)
        if not complete:  # a table of 0 rows would look like a result
            raise UserError(f"found no complete point (0 of {len(plan.points)}); expected a "
                            "sweep folder holding results (run the sweep without --gather-only "
                            "first)", where=str(out))
        if args.bounds:
            from sim.sweep import add_bounds

            print(f"bounds: {add_bounds(plan, out)} point(s) got bound.json")
        table = gather(plan, out)
        if len(table):
            print(format_table(table))
        missing = len(plan.points) - len(table)
        print(f"{out / 'sweep.parquet'}: {len(table)} row(s)"
              + (f"; {missing} of {len(plan.points)} point(s) have no complete results" if missing else ""))
        return 0
    t0 = time.perf_counter()
    try:
        res = run_sweep(plan, out, executor=args.executor, workers=args.workers,
                        address=args.address, progress=not args.quiet)
    except KeyboardInterrupt:
        print(f"hicache-sim sweep: interrupted; rerun the same command to resume ({out})",
              file=sys.stderr)
        return 130
    if args.bounds:
        from sim.sweep import add_bounds

        n = add_bounds(plan, out)
        res.table = gather(plan, out)
        res.rows = len(res.table)
        print(f"bounds: {n} point(s) got bound.json")
    wall = time.perf_counter() - t0
    if res.table is not None and len(res.table):
        print(format_table(res.table))
    print(f"sweep {plan.name}: {res.total} point(s): {len(res.ran)} ran, {len(res.skipped)} "
          f"already complete, {len(res.failures)} failed; {len(res.halted)} halted on divergence "
          f"({duration(wall)} wall)")
    print(f"table: {out / 'sweep.parquet'} ({res.rows} row(s))")
    return report_failures("sweep", "point", "point_id", res.failures, out / "failures.json")


def _dry_run(plan, out, point_status) -> int:
    counts: dict[str, int] = {}
    print(f"sweep {plan.name}: {len(plan.points)} point(s) -> {out}")
    for p in plan.points:
        status = point_status(p, out)
        counts[status] = counts.get(status, 0) + 1
        print(f"{p.index:>5}  {p.point_id}  {status:<7}  {p.describe()}")
    done = counts.get("done", 0)
    print(f"{done} complete, {len(plan.points) - done} to run")
    return 0
