"""The census figure, drawn from a census folder (``census.parquet`` + ``census.json``).

Two panels: how the seeds' verdicts spread (bars, in census.json's verdict order)
and the empirical CDF of the detection delay over the seeds whose digest fired after
a true divergence. Deterministic like every plot here (``reports.plots.STYLE``, no
dates or versions in the metadata): the same folder gives byte-identical PNG and SVG.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from reports.plots import FORMATS, _save
from sim.atomic import atomic_path
from sim.fmt import duration
from sim.errors import UserError

TABLE_FILE = "census.parquet"
AGGREGATE_FILE = "census.json"
STEM = "census"

# One colour per verdict the engine knows; anything newer is grey.
VERDICT_COLORS = {
    "agree": "#59a14f", "absorbed": "#8cd17d", "detected": "#4e79a7", "missed": "#f28e2b",
    "false_alarm": "#b07aa1", "hang": "#e15759", "size_mismatch": "#9c755f",
}
OTHER_COLOR = "#9d9d9d"


def load_census(folder) -> tuple[pd.DataFrame, dict]:
    """(table, aggregate) of a census folder; a missing or broken file is one line."""
    folder = Path(folder)
    table_path, agg_path = folder / TABLE_FILE, folder / AGGREGATE_FILE
    try:
        agg = json.loads(agg_path.read_text())
    except FileNotFoundError:
        raise UserError(f"no {AGGREGATE_FILE}; expected a census folder (hicache-sim census)",
                        where=str(folder)) from None
    except (OSError, ValueError) as err:
        raise UserError(f"found unreadable JSON ({' '.join(str(err).split())}); expected the "
                        "census aggregate", where=str(agg_path)) from None
    if not isinstance(agg, dict) or not isinstance(agg.get("verdicts"), list):
        raise UserError("found no 'verdicts' list; expected the census aggregate", where=str(agg_path))
    try:
        table = pd.read_parquet(table_path)
    except FileNotFoundError:
        raise UserError(f"no {TABLE_FILE}; expected a census folder (hicache-sim census)",
                        where=str(folder)) from None
    except Exception as err:  # noqa: BLE001 - pyarrow raises many kinds for a bad file
        raise UserError(f"found an unreadable table ({' '.join(str(err).split())}); expected "
                        "census.parquet", where=str(table_path)) from None
    for col in ("verdict", "detection_delay_s", "digest_after_true_divergence"):
        if col not in table.columns:
            raise UserError(f"found no column {col!r}; expected a census table", where=str(table_path))
    return table, agg


def _fmt_s(s: float) -> str:
    return duration(s)


def census_figure(table: pd.DataFrame, agg: dict) -> Figure:
    fig = Figure(figsize=(10.0, 4.4), layout="constrained")
    ax_bars, ax_cdf = fig.subplots(1, 2, width_ratios=(1.0, 1.25))

    rows = agg["verdicts"]
    total = agg.get("completed") or 0
    names = [r["verdict"] for r in rows]
    counts = [r["seeds"] for r in rows]
    x = np.arange(len(rows))
    bars = ax_bars.bar(x, counts, color=[VERDICT_COLORS.get(n, OTHER_COLOR) for n in names],
                       width=0.65)
    for bar, r in zip(bars, rows):
        ax_bars.annotate(f"{r['seeds']} ({r['share']:.0%})" if r["share"] is not None else str(r["seeds"]),
                         xy=(bar.get_x() + bar.get_width() / 2, bar.get_height()),
                         xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                         fontsize=8)
    ax_bars.set_xticks(x, names, rotation=20 if len(rows) > 4 else 0)
    ax_bars.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_bars.set_ylim(0, max(counts, default=1) * 1.15 + 0.5)
    ax_bars.set_ylabel("seeds")
    ax_bars.set_title("Verdicts")
    ax_bars.grid(axis="x", visible=False)

    counted = table[table["digest_after_true_divergence"].astype(bool)]
    delays = np.sort(counted["detection_delay_s"].dropna().to_numpy(dtype=float))
    if len(delays):
        # Step ECDF over the seeds: one step per seed (a census has few enough points).
        y = np.arange(1, len(delays) + 1) / len(delays)
        ax_cdf.step(np.concatenate([[delays[0]], delays]), np.concatenate([[0.0], y]),
                    where="post", color=VERDICT_COLORS["detected"])
        d = agg["all"]["detection_delay_s"]
        for key in ("p50", "p90"):
            if d.get(key) is not None:
                ax_cdf.axvline(d[key], color="#888888", linewidth=0.7, linestyle=":")
                ax_cdf.annotate(f"{key} {_fmt_s(d[key])}", xy=(d[key], 0.02),
                                xycoords=("data", "axes fraction"), xytext=(3, 0),
                                textcoords="offset points", fontsize=7.5, color="#666666")
        ax_cdf.set_xlim(left=min(0.0, float(delays[0])))
        ax_cdf.set_title(f"Detection delay (n={len(delays)} of {total} seeds)")
    else:
        ax_cdf.text(0.5, 0.5, "no seed's digest fired after a true divergence",
                    transform=ax_cdf.transAxes, ha="center", va="center", color="#666666")
        ax_cdf.set_title("Detection delay")
    ax_cdf.set_ylim(0, 1.0)
    ax_cdf.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax_cdf.set_xlabel("digest mismatch − first true divergence (simulated s)")
    ax_cdf.set_ylabel("share of those seeds ≤ x")

    s = agg.get("seeds") or {}
    fig.suptitle(f"Census of {agg.get('scenario', '?')}: seeds {s.get('first')}..{s.get('last')}"
                 f" ({total} completed)")
    return fig


def plot_census(folder, out_dir=None, *, formats=FORMATS) -> list[Path]:
    """Write ``census.png`` / ``census.svg`` (into the census folder unless ``out_dir``);
    return the paths written."""
    import matplotlib

    from reports.plots import STYLE

    table, agg = load_census(folder)
    out_dir = Path(out_dir) if out_dir is not None else Path(folder)
    out_dir.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context(STYLE):
        fig = census_figure(table, agg)
    written = []
    for fmt in formats:
        path = out_dir / f"{STEM}.{fmt}"
        with atomic_path(path) as tmp:
            _save(fig, tmp, fmt)
        written.append(path)
    return written
