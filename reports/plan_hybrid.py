"""The hybrid ``plan`` figure: host hit rate against the second host pool (Mamba state
slots, or host SWA tokens) at a few host KV sizes, and the inert threshold against host
KV GB (``sim.analysis.plan_hybrid``; labels from its ``Axis``).

Deterministic like ``reports.plots`` (same rc style and savers)."""

from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure

from reports.style import STYLE

COLORS = ["#3b75af", "#c4522b", "#2a9d3a", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22"]


def draw_hybrid_plan(plan) -> Figure:
    from sim.analysis.plan_hybrid import axis_of

    d = plan.doc
    ax = axis_of(d["kind"])
    k, sg = ax.key, f"sglang_{ax.sglang}"
    swa = ax.kind == "swa"
    sg_label = "SGLang's default host sizing" if swa else "SGLang's --hicache-size split"
    rows = d["kv_sizes"]
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(11.5, 5.6), layout="constrained")
        left, right = fig.subplots(1, 2, width_ratios=[3, 2])
        top_slots = d["page_size"] if swa else 1
        for i, row in enumerate(rows):
            c = COLORS[i % len(COLORS)]
            kv = row["host_kv_tokens_per_rank"]
            pts = sorted((p for p in plan.points if p.host_tokens == kv and p.probe != "plateau"),
                         key=lambda p: p.aux)
            xs = [p.aux for p in pts]
            top_slots = max(top_slots, max(xs, default=1))
            left.plot(xs, [p.host_hit_rate for p in pts], color=c, marker="o", markersize=3.5,
                      linewidth=1.5, label=f"host KV {row['host_kv_gb_per_rank']:,.1f} GB "
                                           f"({kv:,} tokens)")
            left.axhline(row["plateau_host_hit_rate"], color=c, linewidth=0.8, linestyle="--")
            left.axhline(row["model_host_hit_rate"], color=c, linewidth=0.8, linestyle=":")
            t = row.get(f"inert_threshold_{k}")
            if t:
                left.axvline(t, color=c, linewidth=0.9, linestyle=(0, (1, 2)))
            sp = row[f"{sg}_{k}"]
            left.plot([sp], [row[f"{sg}_host_hit_rate"]], marker="X", color=c,
                      markersize=8, markeredgecolor="black", linestyle="none")
        left.set_xscale("log")
        left.set_xlim((d["page_size"] if swa else 1) * 0.8, top_slots * 1.25)
        left.set_ylim(bottom=0)
        left.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0, decimals=1))
        left.set_xlabel(f"{ax.label} per rank (log)")
        left.set_ylabel(f"host hit rate (host hit tokens / input)\nafter "
                        f"{d['warmup_fraction']:.0%} warm-up")
        if swa:
            left.set_title(f"Host hit rate vs {ax.unit} (dots: engine runs; dashed: unbounded;\n"
                           f"dotted: FULL-only model; vertical dotted: inert threshold;\n"
                           f"X: {sg_label})", fontsize=9)
        else:
            left.set_title("Host hit rate vs slots (dots: engine runs; dashed: unbounded slots; "
                           "dotted: FULL-only model;\nvertical dotted: inert threshold; X: SGLang's "
                           "--hicache-size split)", fontsize=9)
        left.legend(loc="center left", fontsize=8)

        have = [r for r in rows if r.get(f"inert_threshold_{k}") is not None]
        if have:
            gb = [r["host_kv_gb_per_rank"] for r in have]
            right.plot(gb, [r[f"inert_threshold_{k}"] for r in have], color="#111111",
                       marker="D", markersize=5, linewidth=1.6, label="inert threshold T")
            for r in have:
                right.annotate(f"{r[f'inert_threshold_{k}_per_kv_gb']:,.1f}/GB",
                               xy=(r["host_kv_gb_per_rank"], r[f"inert_threshold_{k}"]),
                               xytext=(4, 4), textcoords="offset points", fontsize=7.5)
        right.plot([r["host_kv_gb_per_rank"] for r in rows], [r[f"{sg}_{k}"] for r in rows],
                   color="#888888", marker="X", markersize=6, linewidth=1.2, linestyle="--",
                   label=("SGLang default sizing" if swa else "SGLang --hicache-size split"))
        if swa:
            # the default sizing is tens of times the threshold: a log axis shows both
            right.set_yscale("log")
        else:
            right.set_ylim(bottom=0)
        right.set_xlim(0, 1.2 * max(r["host_kv_gb_per_rank"] for r in rows))
        right.set_xlabel("host KV pool per rank (GB = 1e9 bytes)")
        right.set_ylabel(f"{ax.label} per rank")
        right.set_title(f"Inert below T {ax.unit} (host hits < {d['inert_fraction']:.0%} of the "
                        f"plateau)\nannotations: T per host KV GB", fontsize=9)
        right.legend(loc="center right" if swa else "lower right", fontsize=8)
        dev_aux = (f"{d[ax.device_key]:,} SWA tokens (window {d['sliding_window']:,})" if swa
                   else f"{d[ax.device_key]:,} state slots")
        fig.suptitle(f"{d['scenario']}: (FULL, {'SWA' if swa else 'MAMBA'}) host capacity plan, "
                     f"{d['hybrid_preset']}, {d['write_policy']}\ndevice "
                     f"{d['device_tokens_per_rank']:,} FULL tokens and {dev_aux} per rank; "
                     f"{d['ranks_per_node']} ranks per node",
                     fontsize=10.5)
        return fig


def save_hybrid_plan_figure(fig: Figure, path, fmt: str) -> None:
    from reports.plan import save_plan_figure

    save_plan_figure(fig, path, fmt)
