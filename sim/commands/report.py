"""``hicache-sim report``: one self-contained HTML file comparing results folders."""

from __future__ import annotations

import sys
from pathlib import Path

from sim.errors import UserError

NAME = "report"
HELP = "Write one self-contained HTML report comparing results (and sweep) folders."


def add_arguments(parser) -> None:
    parser.add_argument("results", nargs="+", metavar="RESULTS",
                        help="results folders of runs, or sweep folders (with sweep.parquet)")
    parser.add_argument("-o", "--out", required=True, metavar="REPORT.html",
                        help="the HTML file to write")
    parser.add_argument("--title", default=None, help="the report's title")


def run(args) -> int:
    from reports.html import write_report
    from reports.load import load_many

    out = Path(args.out)
    if out.is_dir():
        raise UserError("is a folder; expected the path of the HTML file to write",
                        where=str(out))
    results = load_many(args.results)
    notes: list[str] = []
    write_report(results, out, notes=notes, title=args.title)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(out)
    return 0
