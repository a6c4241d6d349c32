"""Three-tier capacity: the L1+L2+L3 hit rate against host GB per rank, for a few
storage sizes and none, on the Mooncake conversation trace (README, "Capacity
planning": the three-tier figure).

Every figure is an engine run (``sim.analysis.plan.engine_point``: the scenario at
that host size, its own policy pair, the per-tier split from summary.json's
``hit_tokens_by_tier``); the grey line is the one-pass LRU model of the L1+L2 tiers
(``plan``'s model: it has no L3, so it is drawn only to show what storage adds). The
scenario's own point also runs at two more seeds: the spread it prints is over them.

    .venv/bin/python benchmarks/three_tier_capacity.py            # writes docs/img/three_tier_capacity.{png,json}
    .venv/bin/python benchmarks/three_tier_capacity.py -o /tmp/x  # elsewhere

About 70 s on 2 cores (27 engine runs of 2,000 requests at TP 8). The PNG and
the JSON are byte-identical from run to run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCENARIO = ROOT / "scenarios" / "storage_mooncake_trace.yaml"
HOST_GB = (8.0, 16.0, 24.0, 32.0, 64.0, 128.0)       # per rank
STORAGE_GB = (None, 64.0, 256.0, "unbounded")         # per rank; None: no storage tier
EXTRA_SEEDS = (4, 5)                                  # the scenario's own point again
COLORS = {None: "#777777", 64.0: "#8ecae6", 256.0: "#2a9d8f", "unbounded": "#1d3557"}


def _label(cap) -> str:
    if cap is None:
        return "no storage"
    return "storage unbounded" if cap == "unbounded" else f"storage {cap:g} GB"


def _scenario_with(scn, cap):
    if cap is None:
        return scn.model_copy(update={"storage": None})
    st = scn.storage.model_copy(update={"capacity_gb": None if cap == "unbounded" else cap})
    return scn.model_copy(update={"storage": st})


def measure(scn, host_gb=HOST_GB, storage_gb=STORAGE_GB, progress=True) -> dict:
    from sim.analysis.plan import engine_point, make_plan, _tiers
    from sim.scenario import resolve_sizing
    from sim.sizing import host_tokens_for_gb

    info = resolve_sizing(scn)
    bpt, ps = info["bytes_per_token"], scn.page_size
    wp, hp = scn.cache.write_policy, scn.cache.host_policy
    rows = []
    t0 = time.perf_counter()
    for cap in storage_gb:
        s = _scenario_with(scn, cap)
        for g in host_gb:
            e = engine_point(s, wp, hp, host_tokens_for_gb(g, bpt, ps), 0, bpt)
            rows.append({"storage_gb_per_rank": cap, **_tiers(e), "ttft_p99_s": e.ttft_p99_s,
                         "host_gb_per_rank": g})
            if progress:
                print(f"{_label(cap):>18}, host {g:5.0f} GB: hit {e.hit_rate:.1%} "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    # The model (no L3) on a fine grid, from plan's one-pass LRU.
    plan = make_plan(_scenario_with(scn, None), check_points=0, opt_points=0,
                     grid_points=60, policies=[(wp, hp)], max_host_gb=max(host_gb))
    own = host_tokens_for_gb(scn.host.size_gb, bpt, ps)
    spread = []
    for seed in (scn.seed, *EXTRA_SEEDS):
        e = engine_point(scn.model_copy(update={"seed": seed}), wp, hp, own, 0, bpt)
        spread.append({"seed": seed, **_tiers(e)})
    return {
        "scenario": scn.name,
        "requests": int(plan.doc["requests"]),
        "policy": f"{wp} + {hp}",
        "device_gb_per_rank": info["device_tokens"] * bpt / 1e9,
        "bytes_per_token": bpt,
        "backend": scn.storage.backend,
        "points": rows,
        "model_no_l3": {"host_gb_per_rank": [float(x) for x in plan.grid_gb],
                        "hit_rate": [float(y) for y in plan.planning[(wp, hp)]]},
        "seed_spread_at_scenario_point": {
            "host_gb_per_rank": scn.host.size_gb, "storage_gb_per_rank": scn.storage.capacity_gb,
            "runs": spread,
            "max_minus_min_total": max(r["total"] for r in spread) - min(r["total"] for r in spread)},
    }


def draw(doc):
    import matplotlib
    import numpy as np
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from reports.plots import STYLE, TIER_COLORS

    pts = doc["points"]
    caps = list(dict.fromkeys(p["storage_gb_per_rank"] for p in pts))
    hosts = sorted({p["host_gb_per_rank"] for p in pts})
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(10, 8.6), layout="constrained")
        top, bottom = fig.subplots(2, 1, height_ratios=[1.15, 1])
        m = doc["model_no_l3"]
        top.plot(m["host_gb_per_rank"], m["hit_rate"], color="#aaaaaa", linestyle="--",
                 linewidth=1.2, label="model: L1+L2, one-pass LRU (no L3)")
        for cap in caps:
            sub = [p for p in pts if p["storage_gb_per_rank"] == cap]
            top.plot([p["host_gb_per_rank"] for p in sub], [p["total"] for p in sub],
                     marker="o", color=COLORS.get(cap, "#333333"), markeredgecolor="black",
                     markeredgewidth=0.5, label=f"engine, {_label(cap)}")
        top.set_xscale("log", base=2)
        top.set_xticks(hosts, [f"{h:g}" for h in hosts])
        top.set_xlim(hosts[0] / 1.25, hosts[-1] * 1.25)
        top.set_ylim(0, max(0.05, max(p["total"] for p in pts) * 1.25))
        top.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        top.set_xlabel("host KV per rank (GB = 1e9 bytes, log scale)")
        top.set_ylabel("hit rate, L1+L2+L3\n(share of input tokens)")
        top.set_title("Hit rate (dots: engine runs; straight lines between them)", fontsize=9.5)
        top.legend(loc="upper left", fontsize=8)
        # Per tier: one group per host size, one stacked bar per storage size.
        width = 0.8 / len(caps)
        for j, cap in enumerate(caps):
            sub = {p["host_gb_per_rank"]: p for p in pts if p["storage_gb_per_rank"] == cap}
            xs = np.arange(len(hosts)) - 0.4 + width * (j + 0.5)
            dev = np.array([sub[h]["device"] for h in hosts])
            host = np.array([sub[h]["host"] for h in hosts])
            st = np.array([sub[h]["storage"] for h in hosts])
            bottom.bar(xs, dev, width * 0.92, color=TIER_COLORS["device"])
            bottom.bar(xs, host, width * 0.92, bottom=dev, color=TIER_COLORS["host"])
            bottom.bar(xs, st, width * 0.92, bottom=dev + host, color=TIER_COLORS["storage"],
                       edgecolor=COLORS.get(cap), linewidth=1.2)
            for x in xs:
                bottom.text(x, -0.004, "none" if cap is None else "∞" if cap == "unbounded" else f"{cap:g}",
                            ha="center", va="top", fontsize=6.5, rotation=90)
        bottom.set_xticks(np.arange(len(hosts)), [f"host {h:g} GB" for h in hosts])
        bottom.tick_params(axis="x", pad=18)
        bottom.set_ylim(0, top.get_ylim()[1])
        bottom.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        bottom.set_ylabel("hit rate by tier")
        bottom.grid(axis="x", visible=False)
        bottom.set_title("Per tier at each host size; bars left to right: storage none, "
                         + ", ".join(f"{c:g} GB" for c in caps if isinstance(c, float))
                         + ", unbounded per rank", fontsize=9.5)
        bottom.legend([Patch(color=TIER_COLORS["device"]), Patch(color=TIER_COLORS["host"]),
                       Patch(color=TIER_COLORS["storage"])],
                      ["L1 device hit", "L2 host hit (not from storage)",
                       "L3 storage hit (prefetched to host)"], loc="upper left", fontsize=8)
        sp = doc["seed_spread_at_scenario_point"]
        seeds = ", ".join(str(r["seed"]) for r in sp["runs"])
        same = ("give identical hit rates" if sp["max_minus_min_total"] == 0 else
                f"differ by {100 * sp['max_minus_min_total']:.2f} points")
        fig.suptitle(f"{doc['scenario']}: first {doc['requests']:,} requests of the Mooncake "
                     f"conversation trace\n{doc['policy']}, device {doc['device_gb_per_rank']:.1f} GB "
                     f"per rank, {doc['backend']} L3\nengine runs, one seed each (seeds {seeds} "
                     f"{same} at host {sp['host_gb_per_rank']:g} GB)", fontsize=10.5)
        return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", default=str(ROOT / "docs" / "img"), metavar="DIR")
    args = ap.parse_args(argv)
    from reports.plots import _save
    from sim.atomic import write_json
    from sim.scenario import load_scenario

    doc = measure(load_scenario(SCENARIO))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _save(draw(doc), out / "three_tier_capacity.png", "png")
    write_json(out / "three_tier_capacity.json", doc)
    for p in doc["points"]:
        print(f"{_label(p['storage_gb_per_rank']):>18}  host {p['host_gb_per_rank']:5.0f} GB: "
              f"L1 {p['device']:.1%}  L2 {p['host']:.1%}  L3 {p['storage']:.1%}  = {p['total']:.1%}")
    sp = doc["seed_spread_at_scenario_point"]
    print(f"seeds {[r['seed'] for r in sp['runs']]} at host {sp['host_gb_per_rank']:g} GB: totals "
          f"{[round(r['total'], 4) for r in sp['runs']]}")
    print(f"written: {out / 'three_tier_capacity.png'}, {out / 'three_tier_capacity.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
