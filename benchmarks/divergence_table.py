"""Regenerate the divergence table of README.md and docs/REPRO.md.

For every jitter class (every ``scenarios/jitter_*.yaml``) this runs a census over
seeds 0..N-1 (``sim.census.census``; N = 50 by default, ``--jobs 2``), and writes one
row: the verdict distribution over those seeds, the detection delay p50 / p90 over
the detected seeds (inverted-CDF percentiles, as the census reports them: a delay some
seed really had), the outcome of the scenario's shipped seed, the shipped bundle
(``bundles/<class>``) and its size before -> after shrinking (``bundle.json``).

    python benchmarks/divergence_table.py             # print the table
    python benchmarks/divergence_table.py --write     # and replace it in both docs

Census records are kept under ``--out`` (default results/census/<scenario>), so a
second run only aggregates. The output depends on the scenarios, the engine and the
bundles only: the same inputs give the same table, byte for byte.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.verdict import VERDICTS  # noqa: E402

BEGIN = "<!-- divergence-table:begin (benchmarks/divergence_table.py) -->"
END = "<!-- divergence-table:end -->"
DOCS = (ROOT / "README.md", ROOT / "docs" / "REPRO.md")


def _s(x) -> str:
    return "-" if x is None else f"{x:.3g} s"


def row(path: Path, seeds: int, jobs: int, out_root: Path) -> dict:
    from sim.census import census
    from sim.scenario import load_scenario

    scenario = load_scenario(path)
    name = path.stem.removeprefix("jitter_")
    table = census(str(path), seeds, jobs=jobs, out=out_root / path.stem, plots=False,
                   warn=lambda m: None)
    if len(table) < seeds:
        # a seed whose run raised is not a verdict: no table with a hole in it
        sys.exit(f"{path.name}: {seeds - len(table)} of {seeds} seeds failed to run "
                 f"(see {out_root / path.stem / 'failures.json'}); the table is not written")
    agg = table.attrs["aggregate"]
    counts = table["verdict"].value_counts().to_dict()
    dist = " / ".join(f"{v} {counts[v]}" for v in VERDICTS if counts.get(v))
    detected = next((r for r in agg["verdicts"] if r["verdict"] == "detected"), None)
    delay = "-" if detected is None else (f"{_s(detected['detection_delay_s']['p50'])} / "
                                          f"{_s(detected['detection_delay_s']['p90'])}")
    shipped = table[table["seed"] == scenario.seed]
    if len(shipped):
        rec = shipped.iloc[0]
        outcome = f"seed {scenario.seed}: {rec['verdict']}"
        if rec["verdict"] == "detected":
            outcome += f" ({rec['detection_delay_s']:.3g} s late)"
    else:
        outcome = f"seed {scenario.seed}: outside the census"
    bdir = ROOT / "bundles" / name
    bundle, size = "none", "-"
    if (bdir / "bundle.json").is_file():
        meta = json.loads((bdir / "bundle.json").read_text())
        b, a = meta["sizes"]["before"], meta["sizes"]["after"]
        bundle = f"`bundles/{name}` (seed {meta['seeds']['scenario']}: {meta['verdict']})"
        size = (f"{b['requests']} / {b['ranks']} / {b['events']} -> "
                f"{a['requests']} / {a['ranks']} / {a['events']}")
    return {"class": f"`{name}`", "what": scenario.description.rstrip("."), "dist": dist,
            "delay": delay, "shipped": outcome, "bundle": bundle, "size": size}


def render(rows: list[dict], seeds: int) -> str:
    head = ("| jitter class | what it perturbs | verdicts over seeds 0..{n} ({m} seeds) | "
            "detection delay p50 / p90 (detected seeds) | shipped seed | bundle | "
            "size before -> after |").format(n=seeds - 1, m=seeds)
    lines = [BEGIN, head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['class']} | {r['what']} | {r['dist']} | {r['delay']} | {r['shipped']} | "
                     f"{r['bundle']} | {r['size']} |")
    lines.append("")
    lines.append(f"The verdict distribution is over {seeds} seeds (0..{seeds - 1}, scenario and jitter "
                 "seed together; `hicache-sim census SCENARIO --seeds "
                 f"{seeds}`), delays in simulated seconds. Sizes are requests / ranks / events "
                 "(recorded ops over all ranks). Regenerate with "
                 "`python benchmarks/divergence_table.py --write`.")
    lines.append(END)
    return "\n".join(lines)


def replace_in(doc: Path, table: str) -> None:
    from sim.atomic import write_text

    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc}: no {BEGIN!r} ... {END!r} markers; expected the table's place")
    i, j = text.index(BEGIN), text.index(END) + len(END)
    write_text(doc, text[:i] + table + text[j:])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=50)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "census")
    p.add_argument("--write", action="store_true", help="replace the table in README.md and docs/REPRO.md")
    args = p.parse_args(argv)
    rows = []
    for path in sorted((ROOT / "scenarios").glob("jitter_*.yaml")):
        rows.append(row(path, args.seeds, args.jobs, args.out))
        print(f"{path.name}: {rows[-1]['dist']}", file=sys.stderr, flush=True)
    table = render(rows, args.seeds)
    print(table)
    if args.write:
        for doc in DOCS:
            replace_in(doc, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
