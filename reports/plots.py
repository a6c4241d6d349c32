"""The plots users look at, drawn from results folders with matplotlib (Agg, no pyplot).

Each figure builder takes a ``Results`` and returns the figures it can draw, or raises
``NoData`` with the reason it cannot (the caller turns that into a note, not an error).
Output is deterministic: the same folders give byte-identical SVG and PNG files
(fixed ``svg.hashsalt``, no dates or software versions in the metadata, figures built
without global pyplot state).
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, PercentFormatter

from reports.load import Results, Run, Sweep, as_results, flatten
# The style and saver every figure shares (reports.style: the plan figure imports them
# without this module's pandas); FORMATS, STYLE and _save keep their callers here.
from reports.style import FORMATS, PNG_METADATA, STYLE, SVG_METADATA, TIER_COLORS  # noqa: F401
from reports.style import save_figure as _save
from sim.atomic import atomic_path
from sim.fmt import duration

BOUND_COLOR = "#222222"
MAX_PANELS = 16
PANEL_TITLE_SIZE = 9.5  # points, bold: a capacity panel's title
MAX_POINTS = 1500  # per line; longer series are thinned evenly (keeps SVGs small)
CDF_POINTS = 400


class NoData(Exception):
    """A plot that does not apply to these results (the message says why)."""


@dataclass
class Plot:
    """A drawn figure and the file stem it is saved under."""

    stem: str
    title: str
    figure: Figure


# --------------------------------------------------------------------------- helpers


def _run_style(i: int) -> dict:
    """Colour (and, past ten runs, dash pattern) of the i-th run: the same in every plot."""
    colors = matplotlib.colormaps["tab10"].colors
    dashes = ["-", "--", ":", "-."]
    return {"color": colors[i % 10], "linestyle": dashes[(i // 10) % len(dashes)]}


def _thin(n: int, limit: int = MAX_POINTS) -> np.ndarray:
    """Indices of at most ``limit`` evenly spaced rows, first and last included."""
    if n <= limit:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, limit).round().astype(int))


def _time_unit(runs: Sequence[Run]) -> tuple[str, float]:
    """Seconds, minutes or hours, whichever keeps the time axis readable."""
    t_max = max((float(r.timeseries["t"].max()) for r in runs if len(r.timeseries)),
                default=0.0)
    if t_max >= 2 * 3600:
        return "h", 3600.0
    if t_max >= 20 * 60:
        return "min", 60.0
    return "s", 1.0


def _fmt_count(x: float, _pos=None) -> str:
    """Token counts as 950, 12K, 3.5M, 1.2G."""
    x = float(x)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            v = x / div
            return f"{v:.0f}{suffix}" if abs(v) >= 100 or v == int(v) else f"{v:.3g}{suffix}"
    return f"{x:.0f}" if x == int(x) else f"{x:.3g}"


def _byte_unit(max_bytes: float) -> tuple[str, float]:
    """Decimal units, as every capacity is given (GB = 1e9 bytes, SGLang's --hicache-size)."""
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if max_bytes >= div:
            return unit, float(div)
    return "B", 1.0


def _fmt_seconds(s: float) -> str:
    return duration(s) if np.isfinite(s) else "n/a"


def _runs_with_timeseries(results: Results) -> list[tuple[int, Run]]:
    if not results.runs:
        raise NoData("no run folders given (sweep tables hold no time series)")
    runs = [(i, r) for i, r in enumerate(results.runs) if len(r.timeseries)]
    if not runs:
        raise NoData("the runs' timeseries.parquet files have no rows")
    return runs


def _text_width_pt(text: str, size: float, weight: str = "normal") -> float:
    """The width in points of one line of ``text`` in the plots' font: measured from the
    glyphs, so a layout decision needs no renderer and is the same on every machine."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import text_to_path

    with matplotlib.rc_context(STYLE):
        prop = FontProperties(size=size, weight=weight)
        width, _, _ = text_to_path.get_text_width_height_descent(text, prop, ismath=False)
    return float(width)


_WORD = re.compile(r"[^ ]* *")
_PART = re.compile(r"[^_/\-]*[_/\-]+|[^_/\-]+")


def _wrap(text: str, width_pt: float, size: float, weight: str = "normal") -> str:
    """``text`` with each line broken so that it fits ``width_pt``: after a space; a
    word too wide alone (a folder name) after an underscore, dash or slash; a part
    still too wide at the character where it must."""
    def fits(piece: str) -> bool:
        return _text_width_pt(piece.rstrip(), size, weight) <= width_pt

    def pieces(para: str):
        for word in filter(None, _WORD.findall(para)):
            if fits(word):
                yield word
                continue
            for part in _PART.findall(word):
                while not fits(part) and len(part) > 1:
                    cut = len(part) - 1
                    while cut > 1 and not fits(part[:cut]):
                        cut -= 1
                    yield part[:cut]
                    part = part[cut:]
                yield part

    out = []
    for para in text.split("\n"):
        line = ""
        for piece in pieces(para):
            if line and not fits(line + piece):
                out.append(line.rstrip())
                line = ""
            line += piece
        out.append(line.rstrip())
    return "\n".join(out)


def _legend_outside(fig: Figure, handles, labels, ncol: int | None = None) -> None:
    """One figure legend below the axes, so it never covers data: as many columns (up to
    ``ncol``, by default 3) as let every entry fit the figure's width, and entries
    wrapped onto more lines when even one column is too narrow for them."""
    size = float(STYLE["legend.fontsize"])
    rc = matplotlib.rcParams
    # what each entry adds to its text: the handle, the pad and the column gap (in em)
    extra = (rc["legend.handlelength"] + rc["legend.handletextpad"]
             + rc["legend.columnspacing"] + 2 * rc["legend.borderpad"]) * size
    avail = fig.get_figwidth() * 72 * 0.96
    widest = max((_text_width_pt(line, size) for label in labels
                  for line in str(label).split("\n")), default=0.0)
    ncol = max(1, min(ncol or 3, len(labels)))
    while ncol > 1 and widest > avail / ncol - extra:
        ncol -= 1
    room = avail / ncol - extra
    labels = [_wrap(str(label), room, size) for label in labels]
    fig.legend(handles, labels, loc="outside lower center", ncol=ncol)


# ------------------------------------------------------------ hit rate vs host capacity


def _policy_of(scenario_flat: dict) -> str:
    """The run's write and host policies as a panel title (when nothing else differs)."""
    values = {k: scenario_flat[k] for k in ("cache.write_policy", "cache.host_policy")
              if scenario_flat.get(k) is not None}
    return _panel_title(values) if values else "policy n/a"


def _storage_rate(tiers, input_tokens) -> float:
    """The L3 share of input tokens from summary.json's ``hit_tokens_by_tier`` (a dict,
    or its JSON text in a sweep table); NaN for a run without storage."""
    if isinstance(tiers, str):
        try:
            tiers = json.loads(tiers)
        except ValueError:
            return np.nan
    if not isinstance(tiers, dict) or not isinstance(input_tokens, (int, float)) \
            or not input_tokens > 0:
        return np.nan
    return float(tiers.get("storage", 0)) / float(input_tokens)


def _rates_of(run: Run) -> dict[str, float]:
    """Hit-rate split of a run: summary.json when it has it, else from requests. With
    storage, ``storage_hit_rate`` is the part of ``host_hit_rate`` that came from L3."""
    s = run.summary
    if all(isinstance(s.get(k), (int, float)) for k in
           ("device_hit_rate", "host_hit_rate", "miss_rate")):
        out = {k: float(s[k]) for k in ("device_hit_rate", "host_hit_rate", "miss_rate")}
        if "hit_tokens_by_tier" in s:
            out["storage_hit_rate"] = _storage_rate(s["hit_tokens_by_tier"], s.get("input_tokens"))
        return out
    req = run.requests
    total = float(req["input_tokens"].sum())
    if total <= 0:
        return {"device_hit_rate": np.nan, "host_hit_rate": np.nan, "miss_rate": np.nan}
    return {"device_hit_rate": float(req["device_hit_tokens"].sum()) / total,
            "host_hit_rate": float(req["host_hit_tokens"].sum()) / total,
            "miss_rate": float(req["miss_tokens"].sum()) / total}


def bytes_per_token(run: Run) -> float | None:
    """KV bytes per token per rank, when the run's files say (meta.json ``cost``)."""
    for source in (run.meta.get("cost"), run.meta, run.summary):
        value = source.get("bytes_per_token") if isinstance(source, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return None


def host_capacity_tokens(run: Run) -> float:
    """The run's host capacity in tokens (time series first, summary.json otherwise)."""
    ts = run.timeseries
    if len(ts) and ts["host_capacity"].notna().any():
        return float(ts["host_capacity"].max())
    value = run.summary.get("host_tokens")
    return float(value) if isinstance(value, (int, float)) else np.nan


def device_capacity_tokens(run: Run) -> float:
    ts = run.timeseries
    if len(ts) and ts["device_capacity"].notna().any():
        return float(ts["device_capacity"].max())
    value = run.summary.get("device_tokens")
    return float(value) if isinstance(value, (int, float)) else np.nan


def _points_from_runs(runs: Sequence[Run]) -> tuple[pd.DataFrame, list[str]]:
    """One row per run in the sweep-table shape, plus the keys that tell panels apart."""
    rows = []
    flats = []
    for run in runs:
        flat = {k: (v if isinstance(v, (str, int, float, bool)) or v is None else repr(v))
                for k, v in flatten(run.scenario).items()}
        flats.append(flat)
        row = {"policy": _policy_of(flat), "label": run.display_label, "partial": run.partial,
               "host_tokens": host_capacity_tokens(run), **_rates_of(run)}
        if isinstance(run.summary.get("bound_hit_rate"), (int, float)):
            row["bound_hit_rate"] = float(run.summary["bound_hit_rate"])
        bpt = bytes_per_token(run)
        if bpt is not None:
            row["host_gb"] = row["host_tokens"] * bpt / 1e9
        if isinstance(flat.get("host.ratio"), (int, float)):
            row["host.ratio"] = float(flat["host.ratio"])
        rows.append(row)
    points = pd.DataFrame(rows)
    # Runs that differ in anything but the host tier, a seed, the name or the output
    # settings get their own panel: averaging different workloads into one bar would
    # mislead. Runs differing only in seeds share a bar (mean, with an error bar).
    keys = list(dict.fromkeys(k for f in flats for k in f))
    panel_keys = []
    for k in keys:
        if (k in ("name", "description") or k.rsplit(".", 1)[-1] == "seed"
                or k.startswith(("host.", "output."))):
            continue
        values = {repr(f.get(k)) for f in flats}
        if len(values) > 1:
            panel_keys.append(k)
            points[k] = [f.get(k) for f in flats]
    if not panel_keys:
        panel_keys = ["policy"]
    return points, panel_keys


def _points_from_sweep(sweep: Sweep) -> tuple[pd.DataFrame, list[str]]:
    table = sweep.table.copy()
    if "host_tokens" not in table.columns:
        table["host_tokens"] = np.nan
    # GB on the axis when the runs say their size in GB (summary.json's host_gb), or
    # when the sweep varies a GB key (host.size_gb, SGLang's --hicache-size).
    if "host_gb" not in table.columns or table["host_gb"].isna().any():
        if "bytes_per_token" in table.columns and table["bytes_per_token"].notna().all() \
                and table["host_tokens"].notna().all():
            table["host_gb"] = table["host_tokens"] * table["bytes_per_token"] / 1e9
        elif "host.size_gb" in table.columns and table["host.size_gb"].notna().all():
            table["host_gb"] = table["host.size_gb"].astype(float)
        elif "host_gb" in table.columns:
            table = table.drop(columns=["host_gb"])
    panel_keys = [c for c in sweep.parameter_columns
                  if not c.startswith("host.") and table[c].astype(str).nunique() > 1]
    if not panel_keys:
        flat = {c: table[c].iloc[0] for c in sweep.parameter_columns if len(table)}
        table["policy"] = _policy_of(flat)
        panel_keys = ["policy"]
    if "hit_tokens_by_tier" in table.columns and "input_tokens" in table.columns:
        table["storage_hit_rate"] = [_storage_rate(t, n) for t, n in
                                     zip(table["hit_tokens_by_tier"], table["input_tokens"])]
    return table, panel_keys


# Policy keys come first in panel titles, with short prefixes: host and eviction
# policies share names (lru), so those two say which they are.
POLICY_KEYS = {"cache.write_policy": "", "cache.host_policy": "host: ",
               "cache.eviction_policy": "evict: ", "policy": ""}


def _order_panel_keys(keys: list[str]) -> list[str]:
    return [k for k in POLICY_KEYS if k in keys] + [k for k in keys if k not in POLICY_KEYS]


def _short_keys(keys) -> dict[str, str]:
    """Each dotted key's shortest last part(s) that no other key ends with: ``mean``
    for one key, ``user_tokens.mean`` and ``output_tokens.mean`` for two."""
    keys = list(keys)
    out = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            tail = ".".join(parts[-n:])
            if not any(k != key and (k == tail or k.endswith("." + tail)) for k in keys):
                break
        out[key] = tail
    return out


def _panel_title(values: dict, width_pt: float | None = None) -> str:
    """Policies on the first line ("write_back + host: lru"), the workload below, each
    wrapped to ``width_pt`` (the panel's width) when given."""
    policy, other = [], []
    short = _short_keys(k for k in values if k not in POLICY_KEYS
                        and k not in ("base", "workload.kind"))
    for key, value in values.items():
        if value is None or (isinstance(value, float) and np.isnan(value)):
            shown = "null"  # a key left null in one run (e.g. storage.capacity_gb: unbounded)
        else:
            shown = f"{value:g}" if isinstance(value, float) else str(value)
        if key in POLICY_KEYS:
            policy.append(POLICY_KEYS[key] + shown)
        elif key == "base":
            other.append(shown.rsplit("/", 1)[-1].removesuffix(".yaml").removesuffix(".yml"))
        elif key == "workload.kind":
            other.append(shown)
        else:
            other.append(f"{short[key]}={shown}")
    lines = [" + ".join(policy)] if policy else []
    if other:
        lines.append(" · ".join(other))
    text = "\n".join(lines)
    if width_pt is None:
        return text
    return _wrap(text, width_pt, PANEL_TITLE_SIZE, "bold")


def _draw_capacity(points: pd.DataFrame, panel_keys: list[str], title: str) -> Figure:
    """Stacked device/host/miss bars per host capacity, one panel per policy combination;
    with storage runs the host bar splits into host and storage (L3, prefetched to host)."""
    if not len(points):
        raise NoData("no rows")
    panel_keys = _order_panel_keys(panel_keys)
    has_tokens = points["host_tokens"].notna().any()
    use_gb = "host_gb" in points.columns and points["host_gb"].notna().all()
    x_col = "host_gb" if use_gb else ("host_tokens" if has_tokens else "host.ratio")
    if x_col not in points.columns or points[x_col].isna().all():
        raise NoData("no host capacity recorded (host_tokens or host.ratio)")
    n_panels = len(points[panel_keys].astype(str).drop_duplicates())
    ncols = {1: 1, 2: 2, 3: 3, 4: 2, 8: 4}.get(min(n_panels, MAX_PANELS),
                                             3 if min(n_panels, MAX_PANELS) <= 9 else 4)
    width = max(7.0, 3.9 * ncols + 0.6)  # room for the legend below a single panel
    # A title as wide as its panel less the y axis' labels and a gap to the next title.
    title_pt = (width - 0.6) / ncols * 72 - 24
    points = points.assign(_panel=[_panel_title(dict(zip(panel_keys, values)), title_pt)
                                   for values in points[panel_keys].itertuples(index=False)])
    panels = list(dict.fromkeys(points["_panel"]))
    shown = panels[:MAX_PANELS]
    nrows = -(-len(shown) // ncols)
    fig = Figure(figsize=(width, 3.3 * nrows + 1.3), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    if x_col == "host_gb":
        xfmt, xlabel = (lambda v: f"{v:.3g} GB"), "host capacity per rank (GB = 1e9 bytes)"
    elif x_col == "host_tokens":
        xfmt, xlabel = _fmt_count, "host capacity (tokens)"
    else:
        xfmt, xlabel = (lambda v: f"{v:g}×"), "host capacity (× device)"
    any_bound = any_err = False
    has_l3 = "storage_hit_rate" in points.columns and points["storage_hit_rate"].notna().any()
    if has_l3:
        points = points.assign(storage_hit_rate=points["storage_hit_rate"].fillna(0.0))
    for ax, panel in zip(axes.flat, shown):
        sub = points[points["_panel"] == panel]
        agg = {"device_hit_rate": "mean", "host_hit_rate": "mean", "miss_rate": "mean"}
        if has_l3:
            agg["storage_hit_rate"] = "mean"
        if "bound_hit_rate" in sub.columns:
            agg["bound_hit_rate"] = "mean"
        grouped = sub.groupby(x_col, sort=True, dropna=True)
        mean = grouped.agg(agg)
        hit = sub["device_hit_rate"] + sub["host_hit_rate"]
        spread = hit.groupby(sub[x_col]).std(ddof=1) if len(sub) else None
        counts = grouped.size()
        xs = np.arange(len(mean))
        dev, host, miss = (mean[c].to_numpy() for c in
                           ("device_hit_rate", "host_hit_rate", "miss_rate"))
        bar_w = 0.7
        ax.bar(xs, dev, bar_w, color=TIER_COLORS["device"])
        if has_l3:
            l3 = mean["storage_hit_rate"].to_numpy()
            ax.bar(xs, host - l3, bar_w, bottom=dev, color=TIER_COLORS["host"])
            ax.bar(xs, l3, bar_w, bottom=dev + host - l3, color=TIER_COLORS["storage"])
        else:
            ax.bar(xs, host, bar_w, bottom=dev, color=TIER_COLORS["host"])
        ax.bar(xs, miss, bar_w, bottom=dev + host, color=TIER_COLORS["miss"])
        if len(xs) <= 10:
            # The hit rate, written at the foot of the bar: clear of the error bar and
            # the bound line, which sit at the top of the hit stack.
            for x, d, h in zip(xs, dev, host):
                if np.isfinite(d + h) and d + h >= 0.06:
                    ax.text(x, 0.015, f"hit {100 * (d + h):.0f}%", ha="center",
                            va="bottom", fontsize=8, color="white", fontweight="bold")
        multi = counts.to_numpy() > 1
        if spread is not None and multi.any():
            err = spread.reindex(mean.index).to_numpy()
            ax.errorbar(xs[multi], (dev + host)[multi], yerr=err[multi], fmt="none",
                        ecolor="#111111", elinewidth=1, capsize=3)
            any_err = True
        if "bound_hit_rate" in mean.columns and mean["bound_hit_rate"].notna().any():
            b = mean["bound_hit_rate"].to_numpy()
            ok = np.isfinite(b)
            ax.hlines(b[ok], xs[ok] - bar_w / 2 - 0.06, xs[ok] + bar_w / 2 + 0.06,
                      colors=BOUND_COLOR, linestyles="--", linewidth=1.4)
            any_bound = True
        ticks = [xfmt(v) for v in mean.index]
        if "partial" in sub.columns:
            partial = sub.groupby(x_col)["partial"].any().reindex(mean.index)
            ticks = [f"{t}\n(partial)" if p else t for t, p in zip(ticks, partial)]
        if x_col in ("host_tokens", "host_gb") and "host.ratio" in sub.columns:
            ratios = sub.groupby(x_col)["host.ratio"].first().reindex(mean.index)
            # "96K" -> "96K\n(2× dev)", before any "(partial)" line.
            ticks = [t if not np.isfinite(r) else
                     t.replace("\n", f"\n({r:g}× dev)\n", 1) if "\n" in t
                     else f"{t}\n({r:g}× dev)"
                     for t, r in zip(ticks, ratios.to_numpy(dtype=float))]
        if x_col == "host_gb" and has_tokens:
            # Tokens beside the GB: "12.3 GB" -> "12.3 GB\n300K tok".
            tok = sub.groupby(x_col)["host_tokens"].first().reindex(mean.index)
            ticks = [t if not np.isfinite(k) else
                     t.replace("\n", f"\n{_fmt_count(k)} tok\n", 1) if "\n" in t
                     else f"{t}\n{_fmt_count(k)} tok"
                     for t, k in zip(ticks, tok.to_numpy(dtype=float))]
        ax.set_xticks(xs, ticks)
        # At least three bar slots wide, so one or two bars are not stretched.
        half, centre = max(len(xs), 3) / 2, (len(xs) - 1) / 2
        ax.set_xlim(centre - half - 0.1, centre + half + 0.1)
        ax.set_ylim(0, 1)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.grid(axis="x", visible=False)
        ax.set_title(panel, fontsize=PANEL_TITLE_SIZE)
        ax.set_xlabel(xlabel)
    for ax in axes[:, 0]:
        ax.set_ylabel("share of input tokens")
    for ax in list(axes.flat)[len(shown):]:
        ax.set_visible(False)
    handles = [Patch(color=TIER_COLORS["device"]), Patch(color=TIER_COLORS["host"]),
               Patch(color=TIER_COLORS["miss"])]
    labels = ["device hit", "host hit (loaded back)", "miss (prefilled)"]
    if has_l3:
        handles.insert(2, Patch(color=TIER_COLORS["storage"]))
        labels[1] = "host hit (loaded back, not from storage)"
        labels.insert(2, "storage hit (L3, prefetched to host)")
    if any_bound:
        handles.append(Line2D([], [], color=BOUND_COLOR, linestyle="--"))
        labels.append("offline bound (hit rate)")
    if any_err:
        handles.append(Line2D([], [], color="#111111", marker="|", linestyle="none",
                              markersize=10))
        labels.append("±1 s.d. of hit rate over seeds")
    _legend_outside(fig, handles, labels, ncol=len(labels) if width >= 11 else 3)
    suffix = f" (first {MAX_PANELS} of {len(panels)} panels)" if len(panels) > len(shown) else ""
    fig.suptitle(f"{title}{suffix}")
    return fig


def plot_hit_rate_vs_capacity(results: Results) -> list[Plot]:
    """Device/host/miss split of input tokens against host capacity, per policy."""
    plots, why = [], []
    if results.runs:
        points, keys = _points_from_runs(results.runs)
        try:
            plots.append(Plot("hit_rate_vs_host_capacity", "Hit rate vs host capacity",
                              _draw_capacity(points, keys, "Hit rate vs host capacity")))
        except NoData as err:
            why.append(f"runs: {err}")
    for sweep in results.sweeps:
        points, keys = _points_from_sweep(sweep)
        stem = "hit_rate_vs_host_capacity_" + _safe_stem(sweep.label)
        title = f"Hit rate vs host capacity — sweep {sweep.label}"
        try:
            plots.append(Plot(stem, title, _draw_capacity(points, keys, title)))
        except NoData as err:
            why.append(f"sweep {sweep.label}: {err}")
    if not plots:
        raise NoData("; ".join(why) or "no runs or sweep rows")
    return plots


def _safe_stem(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in label).strip("_") or "sweep"


# --------------------------------------------------------------------- time series


def plot_effective_capacity(results: Results) -> list[Plot]:
    """Unique tokens held over both tiers, and the share of held tokens that are copies."""
    runs = _runs_with_timeseries(results)
    unit, div = _time_unit([r for _, r in runs])
    fig = Figure(figsize=(8.5, 6.2), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    handles, labels = [], []
    capacities: dict[float, float] = {}  # device + host capacity -> last time it applies
    for i, run in runs:
        ts = run.timeseries
        idx = _thin(len(ts))
        t = ts["t"].to_numpy(dtype=float)[idx] / div
        style = _run_style(i)
        eff = ts["effective_tokens"].to_numpy(dtype=float)[idx]
        (line,) = top.plot(t, eff, **style)
        cap = (ts["device_capacity"] + ts["host_capacity"]).to_numpy(dtype=float)
        if np.all(cap == cap[0]):
            capacities.setdefault(float(cap[0]), float(t[-1]))
            capacities[float(cap[0])] = max(capacities[float(cap[0])], float(t[-1]))
        else:  # a capacity that changes is drawn per run, in the run's colour
            top.plot(t, cap[idx], color=style["color"], linestyle=(0, (1, 2)), linewidth=1.0)
        used = (ts["device_used"] + ts["host_used"]).to_numpy(dtype=float)[idx]
        dup = ts["duplicate_tokens"].to_numpy(dtype=float)[idx]
        share = np.divide(dup, used, out=np.full_like(dup, np.nan), where=used > 0)
        bottom.plot(t, share, **style)
        handles.append(line)
        labels.append(run.display_label)
    for cap in sorted(capacities):
        top.axhline(cap, color="#777777", linestyle=(0, (1, 2)), linewidth=1.0)
        top.annotate(_fmt_count(cap), xy=(1.0, cap), xycoords=("axes fraction", "data"),
                     xytext=(2, 0), textcoords="offset points", va="center", fontsize=7.5,
                     color="#555555")
    handles.append(Line2D([], [], color="#777777", linestyle=(0, (1, 2)), linewidth=1.0))
    labels.append("device + host capacity")
    top.set_ylabel("effective capacity\n(unique tokens, both tiers)")
    top.yaxis.set_major_formatter(FuncFormatter(_fmt_count))
    bpts = {bytes_per_token(r) for _, r in runs}
    if len(bpts) == 1 and None not in bpts:
        # The same axis in GB per rank (one bytes-per-token for every run drawn).
        bpt = bpts.pop()
        sec = top.secondary_yaxis("right", functions=(lambda t, b=bpt: t * b / 1e9,
                                                       lambda g, b=bpt: g * 1e9 / b))
        sec.set_ylabel("GB per rank (1e9 bytes)")
    top.set_ylim(bottom=0)
    top.set_title("Effective capacity")
    bottom.set_ylabel("duplicate share\n(copies / tokens held)")
    bottom.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    bottom.set_ylim(0, None)
    bottom.set_title("Duplicate share (tokens held in both tiers)")
    bottom.set_xlabel(f"simulated time ({unit})")
    _legend_outside(fig, handles, labels)
    fig.suptitle("Effective capacity and duplicate share over time")
    return [Plot("effective_capacity", "Effective capacity and duplicate share", fig)]


def plot_tier_occupancy(results: Results) -> list[Plot]:
    """Device and host used / capacity over time."""
    runs = _runs_with_timeseries(results)
    unit, div = _time_unit([r for _, r in runs])
    fig = Figure(figsize=(8.5, 5.6), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    handles, labels = [], []
    for i, run in runs:
        ts = run.timeseries
        idx = _thin(len(ts))
        t = ts["t"].to_numpy(dtype=float)[idx] / div
        style = _run_style(i)
        for ax, tier in zip(axes, ("device", "host")):
            used = ts[f"{tier}_used"].to_numpy(dtype=float)[idx]
            cap = ts[f"{tier}_capacity"].to_numpy(dtype=float)[idx]
            frac = np.divide(used, cap, out=np.full_like(used, np.nan), where=cap > 0)
            (line,) = ax.plot(t, frac, **style)
        handles.append(line)
        labels.append(run.display_label)
    staging = [run.display_label for _, run in runs
               if run.summary.get("host_memory_mode") == "buffer_only"]
    host_title = "Host tier" if not staging else (
        "Host tier (storage's staging buffer in buffer_only runs, not a cache tier)"
        if len(staging) < len(runs) else "Host pool: storage's staging buffer (buffer_only)")
    for ax, tier in zip(axes, ("Device tier", host_title)):
        ax.set_title(tier)
        ax.set_ylabel("used / capacity")
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_ylim(0, 1.05)
    axes[-1].set_xlabel(f"simulated time ({unit})")
    _legend_outside(fig, handles, labels)
    fig.suptitle("Tier occupancy over time")
    return [Plot("tier_occupancy", "Tier occupancy", fig)]


# ------------------------------------------------------------------------------ TTFT


def plot_ttft_cdf(results: Results) -> list[Plot]:
    """The empirical CDF of time to first token per run, log time axis."""
    if not results.runs:
        raise NoData("no run folders given (sweep tables hold no per-request rows)")
    fig = Figure(figsize=(8.5, 5.2), layout="constrained")
    ax = fig.subplots()
    handles, labels = [], []
    for i, run in enumerate(results.runs):
        ttft = run.requests["ttft_s"].to_numpy(dtype=float)
        ttft = np.sort(ttft[np.isfinite(ttft) & (ttft > 0)])
        if not len(ttft):
            continue
        # Quantiles at fixed probabilities: the same curve as the step ECDF, but with
        # a bounded number of points however many requests the run has.
        q = np.linspace(0.0, 1.0, min(CDF_POINTS, len(ttft)))
        x = np.quantile(ttft, q, method="inverted_cdf")
        (line,) = ax.step(x, q, where="post", **_run_style(i))
        p50, p99 = np.quantile(ttft, [0.5, 0.99])
        handles.append(line)
        labels.append(f"{run.display_label}  (p50 {_fmt_seconds(p50)}, "
                      f"p99 {_fmt_seconds(p99)}, n={len(ttft)})")
    if not handles:
        raise NoData("no request has a finite, positive ttft_s")
    ax.set_xscale("log")
    # Ticks at 1-2-5 steps labelled as durations (20 ms, 1 s): easier than 2×10⁻².
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _fmt_seconds(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(0, 1.0)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    for p in (0.5, 0.99):
        ax.axhline(p, color="#888888", linewidth=0.7, linestyle=":")
        ax.annotate(f"p{p * 100:g}", xy=(0.0, p), xycoords=("axes fraction", "data"),
                    xytext=(3, 2), textcoords="offset points", fontsize=7.5, color="#666666")
    ax.set_xlabel("time to first token (log scale)")
    ax.set_ylabel("share of requests ≤ x")
    _legend_outside(fig, handles, labels, ncol=1 if len(labels) > 3 else len(labels))
    fig.suptitle("Time to first token (CDF)")
    return [Plot("ttft_cdf", "TTFT CDF", fig)]


# -------------------------------------------------------------------------- traffic


def _bytes_scale(run: Run, tokens_col: str, bytes_key: str) -> float | None:
    """Bytes per token moved, from the run's own totals (summary bytes / final counter),
    else the bytes per token in meta.json; None when neither is known."""
    ts = run.timeseries
    tokens = float(ts[tokens_col].iloc[-1]) if len(ts) else 0.0
    total = run.summary.get(bytes_key)
    if isinstance(total, (int, float)) and tokens > 0:
        return float(total) / tokens
    return bytes_per_token(run)


# (panel title, time-series counter, summary.json bytes total)
TRAFFIC = (("Load-back (host → device)", "load_back_tokens", "load_back_bytes"),
           ("Backup (device → host)", "backup_tokens", "backup_bytes"))


def plot_transfer_traffic(results: Results) -> list[Plot]:
    """Cumulative load-back (host -> device) and backup (device -> host) traffic.

    Both come from the time-series counters (what the tiers actually moved), scaled to
    bytes so that the last point equals summary.json's total.
    """
    runs = _runs_with_timeseries(results)
    if all(float(r.timeseries[col].iloc[-1]) <= 0 for _, r in runs for _, col, _ in TRAFFIC):
        raise NoData("no load-back or backup traffic in any run")
    unit, div = _time_unit([r for _, r in runs])
    fig = Figure(figsize=(8.5, 5.8), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    handles, labels = [], []
    for ax, (title, col, bytes_key) in zip(axes, TRAFFIC):
        scales = {i: _bytes_scale(r, col, bytes_key) for i, r in runs}
        in_bytes = all(v is not None for v in scales.values())
        # One unit per panel, from the largest total, so all runs share it.
        top = max(float(r.timeseries[col].iloc[-1]) * (scales[i] if in_bytes else 1.0)
                  for i, r in runs)
        yunit, ydiv = _byte_unit(top) if in_bytes else ("tokens", 1.0)
        for i, run in runs:
            ts = run.timeseries
            idx = _thin(len(ts))
            moved = ts[col].to_numpy(dtype=float)[idx] * (scales[i] if in_bytes else 1.0)
            (line,) = ax.plot(ts["t"].to_numpy(dtype=float)[idx] / div, moved / ydiv,
                              **_run_style(i))
            if ax is axes[0]:
                handles.append(line)
                labels.append(run.display_label)
        ax.set_title(title)
        if in_bytes:
            ax.set_ylabel(f"cumulative bytes ({yunit})")
        else:
            ax.set_ylabel("cumulative tokens")
            ax.yaxis.set_major_formatter(FuncFormatter(_fmt_count))
        ax.set_ylim(bottom=0)
    axes[-1].set_xlabel(f"simulated time ({unit})")
    _legend_outside(fig, handles, labels)
    fig.suptitle("Load-back and backup traffic (cumulative, per rank)")
    return [Plot("transfer_traffic", "Load-back and backup traffic", fig)]


# ------------------------------------------------------------------------ registry

# Every plot, by name, in the order files and report sections appear.
FIGURES: dict[str, Callable[[Results], list[Plot]]] = {
    "hit_rate_vs_host_capacity": plot_hit_rate_vs_capacity,
    "effective_capacity": plot_effective_capacity,
    "tier_occupancy": plot_tier_occupancy,
    "ttft_cdf": plot_ttft_cdf,
    "transfer_traffic": plot_transfer_traffic,
}


def build_plots(results, notes: list[str] | None = None) -> list[Plot]:
    """Draw every plot that applies; a plot without data adds a note instead."""
    results = as_results(results)
    plots: list[Plot] = []
    with matplotlib.rc_context(STYLE):
        for name, builder in FIGURES.items():
            try:
                plots.extend(builder(results))
            except NoData as why:
                if notes is not None:
                    notes.append(f"skipped {name}: {why}")
    return plots


def figure_bytes(fig: Figure, fmt: str) -> bytes:
    """The figure encoded as PNG or SVG, deterministically."""
    buf = io.BytesIO()
    _save(fig, buf, fmt)
    return buf.getvalue()


def plot_runs(runs, out_dir: str | Path, *, formats: Iterable[str] = FORMATS,
              notes: list[str] | None = None) -> list[Path]:
    """Write every applicable plot of ``runs`` (a ``Results`` or list of ``Run``/``Sweep``)
    into ``out_dir`` as ``<name>.png`` / ``<name>.svg``; return the paths written.

    Plots without data are skipped; the reason is appended to ``notes`` when given.
    """
    formats = tuple(formats)
    for fmt in formats:
        if fmt not in FORMATS:
            raise ValueError(f"format {fmt!r}; expected one of {FORMATS}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for plot in build_plots(runs, notes):
        for fmt in formats:
            path = out_dir / f"{plot.stem}.{fmt}"
            with atomic_path(path) as tmp:
                _save(plot.figure, tmp, fmt)
            written.append(path)
    return written
