"""``hicache-sim plot``: write the PNG/SVG plots of results or sweep folders."""

from __future__ import annotations

import sys
from pathlib import Path

from sim.errors import UserError

NAME = "plot"
HELP = "Plot results folders (hit rate vs host capacity, occupancy, TTFT, traffic)."


def add_arguments(parser) -> None:
    parser.add_argument("results", nargs="+", metavar="RESULTS",
                        help="results folders of runs, or sweep folders (with sweep.parquet)")
    parser.add_argument("-o", "--out", metavar="DIR",
                        help="folder for the plots (default: RESULTS/plots for one folder; "
                             "required for several)")
    parser.add_argument("--format", default="png,svg", metavar="FMT[,FMT]",
                        help="comma-separated image formats: png, svg (default: png,svg)")


def parse_formats(text: str) -> tuple[str, ...]:
    from reports.plots import FORMATS

    formats = tuple(dict.fromkeys(f.strip().lower() for f in text.split(",") if f.strip()))
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise UserError(f"found {text!r}; expected a comma-separated list of "
                        f"{', '.join(FORMATS)}", where="--format")
    return formats


def run(args) -> int:
    from reports.load import load_many
    from reports.plots import plot_runs

    formats = parse_formats(args.format)
    if args.out is None and len(args.results) > 1:
        raise UserError(f"{len(args.results)} folders given; expected -o DIR saying where "
                        "their plots go", where="-o")
    results = load_many(args.results)
    out = Path(args.out) if args.out else Path(args.results[0]) / "plots"
    if out.exists() and not out.is_dir():
        raise UserError("is a file; expected a folder for the plots", where=str(out))
    notes: list[str] = []
    written = plot_runs(results, out, formats=formats, notes=notes)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    for path in written:
        print(path)
    if not written:
        print("note: nothing to plot", file=sys.stderr)
    return 0
