"""The ``plan`` figure: hit rate and TTFT p99 against host GB per rank, one answer.

Deterministic like ``reports.plots`` (same rc style and savers: byte-identical PNG and
SVG for the same plan). Everything drawn comes from ``sim.analysis.plan.Plan``.
"""

from __future__ import annotations

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from reports.style import STYLE, TIER_COLORS
from reports.style import save_figure as _save
from sim.fmt import duration

POLICY_COLORS = {
    ("write_back", "duplicate_first"): "#3b75af",
    ("write_back", "lru"): "#7fb3e0",
    ("write_through", "duplicate_first"): "#c4522b",
    ("write_through", "lru"): "#ef9a6b",
}
MODEL_STYLE = {"write_back": "-", "write_through": "--"}
STORAGE_COLOR = "#2a9d8f"  # the L3 band (device and host as in reports.plots)


def _label(wp, hp) -> str:
    return f"{wp} + host: {hp}"


def draw_plan(plan) -> Figure:
    d = plan.doc
    bpt = d["bytes_per_token"]
    st = d.get("storage")
    with matplotlib.rc_context(STYLE):
        if st:
            fig = Figure(figsize=(9.5, 10.6), layout="constrained")
            top, tiers, bottom = fig.subplots(3, 1, sharex=True, height_ratios=[3, 2.2, 2])
        else:
            fig = Figure(figsize=(9.5, 8.2), layout="constrained")
            top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
        g = plan.grid_gb
        for key, curve in plan.model.items():
            if key == "dev":
                continue
            top.plot(g, curve, color="#888888", linestyle=MODEL_STYLE.get(key, "-"), linewidth=1.1,
                     label=f"model (one-pass LRU), {key.replace('_', ' ')}"
                     + (": L1+L2 only, no L3" if st else ""))
        for (wp, hp), curve in plan.planning.items():
            color = POLICY_COLORS.get((wp, hp), "#555555")
            what = "engine L1+L2+L3" if st and plan.engine else "planning"
            top.plot(g, curve, color=color, linewidth=1.8, label=f"{what}: {_label(wp, hp)}")
            row = next(r for r in d["policies"] if (r["write_policy"], r["host_policy"]) == (wp, hp))
            if row["knee_gb_per_rank"] is not None and not row.get("knee_beyond_range"):
                top.plot([row["knee_gb_per_rank"]], [row["knee_hit_rate"]], marker="D", color=color,
                         markersize=6, markeredgecolor="black", linestyle="none")
        for (wp, hp) in plan.planning:
            pts = [e for e in plan.engine if (e.write_policy, e.host_policy) == (wp, hp)]
            if not pts:
                continue
            color = POLICY_COLORS.get((wp, hp), "#555555")
            top.plot([e.host_gb for e in pts], [e.hit_rate for e in pts], marker="o", color=color,
                     linestyle="none", markersize=5, markeredgecolor="black", markeredgewidth=0.6)
            p99 = [(e.host_gb, e.ttft_p99_s) for e in pts if e.ttft_p99_s is not None]
            if p99:
                bottom.plot([a for a, _ in p99], [b for _, b in p99], marker="o", color=color,
                            linewidth=1.5, markersize=5, markeredgecolor="black",
                            markeredgewidth=0.6, label=_label(wp, hp))
        if plan.opt:
            top.plot([a for a, _ in plan.opt], [b for _, b in plan.opt], color="#111111",
                     linestyle=":", marker="s", markersize=4, linewidth=1.3,
                     label="offline optimum (bound): " + ("OPT(D+H)" if d.get("tier", "host") == "host"
                                                          else "OPT(device)")
                     + (", no L3 (not a bound with storage)" if st else ""))
        _marks(top, d)
        _marks(bottom, d, labels=False)
        if st:
            _marks(tiers, d, labels=False)
        target = d["targets"]["hit_rate"]
        if target is not None:
            top.axhline(target, color="#2a9d3a", linewidth=1.0, linestyle="-.")
            top.annotate(f"target {target:.0%}", xy=(0.0, target), xycoords=("axes fraction", "data"),
                         xytext=(3, 3), textcoords="offset points", fontsize=8, color="#2a9d3a")
        tt = d["targets"]["ttft_p99_s"]
        if tt is not None:
            bottom.axhline(tt, color="#2a9d3a", linewidth=1.0, linestyle="-.")
        top.set_ylim(*hit_limits(plan))
        _answer(top, bottom, plan)
        top.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        top.set_ylabel(("hit rate (device + host + storage)" if st else
                        "hit rate (device + host)" if d.get("tier", "host") == "host" else "hit rate")
                       + f"\nafter {d['warmup_fraction']:.0%} warm-up")
        if st:
            top.set_title("Hit rate  (grey: the model, no L3; colour: engine runs, L1+L2+L3, "
                          "straight lines between them; diamonds: knee)", fontsize=9.5)
            _draw_tiers(tiers, plan)
        else:
            top.set_title("Hit rate  (lines: model shape + engine residual; dots: engine runs; "
                          "diamonds: knee; star: answer)", fontsize=9.5)
        bottom.set_ylabel("TTFT p99 (s)")
        tier = d.get("tier", "host")
        bottom.set_xlabel(f"{tier} KV pool per rank (GB = 1e9 bytes)")
        bottom.set_title("TTFT p99 from the engine runs (straight lines between them: "
                         "interpolated)", fontsize=9.5)
        if not plan.engine:
            bottom.text(0.5, 0.5, "no engine check points (--check-points 0)", ha="center",
                        va="center", transform=bottom.transAxes, color="#777777")
        bottom.set_ylim(bottom=0)
        sec = top.secondary_xaxis("top", functions=(lambda x: x * 1e9 / bpt / 1e6,
                                                     lambda t: t * 1e6 * bpt / 1e9))
        sec.set_xlabel(f"{tier} KV pool per rank (million tokens)")
        top.set_xlim(0, g[-1])
        handles, labels = top.get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=8)
        errs = [f"{r['write_policy']}+{r['host_policy']} {100 * r['model_vs_engine_max_abs_error']:.1f}"
                for r in d["policies"] if r["model_vs_engine_max_abs_error"] is not None]
        n_pts = len(plan.engine)
        err_line = (f"model vs engine at {n_pts} runs, max |Δ hit rate| in points: "
                    + ", ".join(errs[:2]) + (",\n" + ", ".join(errs[2:]) if len(errs) > 2 else "")) \
            if errs else "no engine check: model only"
        if st:
            cap = st["capacity_gb_per_rank"]
            err_line = (f"L3: {st['backend']} storage, "
                        + ("unbounded" if cap is None else f"{cap:g} GB per rank")
                        + (f"; {n_pts} engine runs (the L3 figures are engine-measured only)"
                           if n_pts else "; no engine runs: the model has no L3"))
        what = (f"host capacity plan, device {d['device_gb_per_rank']:.1f} GB per rank"
                if tier == "host" else "single-tier cache curve (host off)")
        fig.suptitle(f"{d['scenario']}: {what}, {d['ranks_per_node']} ranks per node\n{err_line}",
                     fontsize=10.5)
        return fig


def hit_limits(plan) -> tuple[float, float]:
    """The hit-rate axis fitted to what is drawn (model, planning and engine hit rates,
    the optimum, the target), with a margin, within [0, 1]: curves a few points apart
    stay apart instead of flattening into a 0-100% axis."""
    d = plan.doc
    ys = [np.asarray(c, dtype=float) for k, c in plan.model.items() if k != "dev"]
    ys += [np.asarray(c, dtype=float) for c in plan.planning.values()]
    ys.append(np.array([e.hit_rate for e in plan.engine] + [h for _, h in plan.opt]
                       + [t for t in (d["targets"]["hit_rate"],) if t is not None], dtype=float))
    v = np.concatenate([y[np.isfinite(y)] for y in ys]) if ys else np.array([])
    if not len(v):
        return 0.0, 1.0
    lo, hi = float(v.min()), float(v.max())
    pad = max(0.02, 0.08 * (hi - lo))
    return max(0.0, lo - pad), min(1.0, hi + pad)


def _own_row(d) -> dict:
    own = (d["scenario_policy"]["write_policy"], d["scenario_policy"]["host_policy"])
    return next((r for r in d["policies"] if (r["write_policy"], r["host_policy"]) == own),
                d["policies"][0])


ANSWER_COLOR = "#2a9d3a"


def _answer(top, bottom, plan) -> None:
    """The answer marked where it is: a star at the smallest size meeting the target
    on the scenario's policy pair, with its size; or, unreached, a note saying so and
    whether even the offline optimum stays below the target."""
    d = plan.doc
    row, tier = _own_row(d), d.get("tier", "host")
    pol = f"{row['write_policy']} + {row['host_policy']}"
    for ax, key, target, fmt in ((top, "target_hit_rate_gb_per_rank", d["targets"]["hit_rate"],
                                  lambda t: f"{t:.0%} hit rate"),
                                 (bottom, "target_ttft_p99_gb_per_rank", d["targets"]["ttft_p99_s"],
                                  lambda t: f"TTFT p99 {duration(t)}")):
        if target is None or key not in row:
            continue
        gb = row[key]
        if gb is not None:
            ax.plot([gb], [target], marker="*", markersize=15, color=ANSWER_COLOR,
                    markeredgecolor="black", linestyle="none", zorder=5)
            ax.annotate(f"answer: {gb:,.2f} GB per rank\n({pol}, {fmt(target)})",
                        xy=(gb, target), xytext=(8, -6), textcoords="offset points",
                        ha="left", va="top", fontsize=8, color=ANSWER_COLOR, fontweight="bold",
                        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none",
                              "alpha": 0.85})
            continue
        text = (f"no {tier} size up to {d['max_host_gb_per_rank']:,.1f} GB per rank reaches "
                f"{fmt(target)} with {pol}")
        best = d.get("optimum_max_hit_rate")
        if ax is top and best is not None:
            text += (f";\neven the offline optimum reaches only {best:.1%}" if best < target
                     else f";\nthe offline optimum reaches {best:.1%}")
        ax.text(0.99, 0.04, text, transform=ax.transAxes, ha="right", va="bottom", fontsize=8,
                color=ANSWER_COLOR, fontweight="bold")


def _draw_tiers(ax, plan) -> None:
    """The scenario's own policy pair at its engine points, stacked by tier."""
    d = plan.doc
    own = (d["scenario_policy"]["write_policy"], d["scenario_policy"]["host_policy"])
    row = next((r for r in d["policies"] if (r["write_policy"], r["host_policy"]) == own),
               d["policies"][0])
    pts = row.get("engine_tiers") or []
    ax.set_ylabel("hit rate by tier\n(engine)")
    ax.set_ylim(0, 1)
    ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    if not pts:
        ax.text(0.5, 0.5, "no engine check points: no per-tier split", ha="center",
                va="center", transform=ax.transAxes, color="#777777")
        return
    x = [p["host_gb_per_rank"] for p in pts]
    ys = [[p["device"] for p in pts], [p["host"] for p in pts], [p["storage"] for p in pts]]
    ax.stackplot(x, ys, colors=[TIER_COLORS["device"], TIER_COLORS["host"], STORAGE_COLOR],
                 labels=["L1 device hit", "L2 host hit (not from storage)",
                         "L3 storage hit (prefetched to host)"], alpha=0.85)
    for i, p in enumerate(pts):
        ax.plot([x[i]], [p["total"]], marker="o", color="black", markersize=3.5)
    ax.set_title(f"{row['write_policy']} + host: {row['host_policy']}: per tier at the engine "
                 "runs (straight lines between them)", fontsize=9.5)
    ax.legend(loc="upper left", fontsize=7.5)


def _marks(ax, d, labels: bool = True) -> None:
    """Vertical marks: host = device, the scenario's host, the node's RAM limit."""
    tier = d.get("tier", "host")
    marks = [(d["scenario_size_gb_per_rank"], "#9467bd",
              f"scenario {tier} ({d['scenario_size_gb_per_rank']:.1f} GB)")]
    if tier == "host":
        marks.insert(0, (d["device_gb_per_rank"], "#555555",
                         f"host = device ({d['device_gb_per_rank']:.1f} GB)"))
    node = d.get("node")
    if node and tier == "host":
        marks.append((node["host_budget_gb_per_rank"], "#d62728",
                      f"node RAM limit ({node['host_budget_gb_per_rank']:.1f} GB per rank)"))
    for x, color, text in marks:
        if 0 <= x <= d["max_host_gb_per_rank"]:
            ax.axvline(x, color=color, linewidth=0.9, linestyle=(0, (4, 2)))
            if labels:
                ax.annotate(text, xy=(x, 0.02), xycoords=("data", "axes fraction"), rotation=90,
                            xytext=(-3, 0), textcoords="offset points", ha="right", va="bottom",
                            fontsize=7.5, color=color)


def save_plan_figure(fig: Figure, path, fmt: str) -> None:
    from sim.atomic import atomic_path

    with atomic_path(path) as tmp:
        _save(fig, tmp, fmt)
