"""Benchmark of the offline analyses on the Mooncake FAST'25 traces.

Prints, as markdown tables for the project notes:

1. **LRU, single device tier**: the one-pass stack-distance curve next to the real
   radix tree replayed as an LRU (``sim.analysis.lru_tree``), both traces, page size
   512 (= the block size) and 64, token-level hit rate (hit tokens / all input
   tokens, as SGLang reports it). Also the tree's splits and eviction overshoot,
   the two effects that make it differ (see lru_tree.py), and the time of one run
   per capacity against the single pass, as a ratio.
2. **Policies against the optimum** on the conversation trace at page 64 (its
   scenario's page size): for device ``D`` and host ``2D``, the offline optimum
   (single tier at ``D``; the two-tier bound at ``D + 2D``, a host hit counted as a
   hit), the tree's LRU at ``D``, and the simulator (``run_scenario`` on
   scenarios/mooncake_conversation.yaml) under write_back + duplicate_first,
   write_back + lru and write_through, with each one's gap to the bound.

Takes a few minutes. Data: ``shared/`` beside the repository (``HICACHE_SHARED``
overrides), as in the tests.

    .venv/bin/python benchmarks/bench_analysis.py [--max-requests N] [--skip-policies]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.analysis.optimum import combine_two_tier, optimum_bounds  # noqa: E402
from sim.analysis.lru_tree import UnitTrace, compare_lru, mooncake_trace  # noqa: E402
from sim.analysis.stack_distance import hit_rate_curve  # noqa: E402

SHARED = Path(os.environ.get("HICACHE_SHARED", ROOT.parent / "shared"))
MOONCAKE = SHARED / "data" / "traces" / "mooncake-fast25"
TRACES = ("conversation_trace.jsonl", "synthetic_trace.jsonl")
LRU_TOKENS = (1_000_000, 2_000_000, 5_000_000, 10_000_000, 50_000_000)
PAGE_SIZES = (512, 64)
POLICY_DEVICE_TOKENS = (1_000_000, 2_000_000, 5_000_000)
POLICIES = (  # (label, --set overrides)
    ("write_back + duplicate_first", ["cache.write_policy=write_back", "cache.host_policy=duplicate_first"]),
    ("write_back + lru", ["cache.write_policy=write_back", "cache.host_policy=lru"]),
    ("write_through", ["cache.write_policy=write_through"]),
)


def load(name: str, page_size: int, max_requests: int | None) -> UnitTrace:
    path = MOONCAKE / name
    if not path.is_file():
        raise SystemExit(f"Mooncake trace not found at {path}; put shared/ beside the repo "
                         "or set HICACHE_SHARED")
    trace = mooncake_trace(path, page_size)
    if max_requests is not None:
        # The denominator must follow the cut: re-read the lengths of the kept requests.
        from sim.workloads.traces import MooncakeReader

        kept = [r.input_len for r, _ in zip(MooncakeReader(path), range(max_requests))]
        trace = UnitTrace(trace.paths[:max_requests], page_size, sum(kept))
    return trace


def lru_tables(max_requests: int | None) -> None:
    print("## LRU hit rate, single device tier (stack-distance model vs real tree)\n")
    print("| trace | page | capacity (tokens) | model | tree | tree - model | splits "
          "| evictions | mean overshoot (tok) | max overshoot (tok) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in TRACES:
        for ps in PAGE_SIZES:
            trace = load(name, ps, max_requests)
            t0 = time.perf_counter()
            hit_rate_curve(trace.paths, LRU_TOKENS, ps)
            t_curve = time.perf_counter() - t0
            t0 = time.perf_counter()
            rows = compare_lru(trace, LRU_TOKENS)
            t_tree = time.perf_counter() - t0
            for row in rows:
                rep = row.tree
                mean_over = rep.overshoot_tokens / rep.evictions if rep.evictions else 0
                print(f"| {name.split('_')[0]} | {ps} | {row.capacity_tokens:,} | "
                      f"{row.stack_hit_rate:.4f} | {row.tree_hit_rate:.4f} | "
                      f"{row.tree_hit_rate - row.stack_hit_rate:+.4f} | {rep.splits:,} | "
                      f"{rep.evictions:,} | {mean_over:,.0f} | {rep.max_overshoot_tokens:,} |")
            print(f"<!-- {name} page {ps}: {len(trace.paths):,} requests, "
                  f"{trace.input_tokens:,} input tokens; {len(LRU_TOKENS)} LRU tree runs took "
                  f"{t_tree / t_curve:.1f}x the one-pass curve -->", flush=True)
    print()


def policy_table(max_requests: int | None) -> None:
    from sim.analysis.lru_tree import run_lru_tree
    from sim.runner import run_scenario
    from sim.scenario import load_scenario

    scenario_path = ROOT / "scenarios" / "mooncake_conversation.yaml"
    base = load_scenario(scenario_path)
    ps = base.page_size
    limit = [f"limits.max_requests={max_requests}"] if max_requests else []
    trace = load(TRACES[0], ps, max_requests)
    total = trace.input_tokens
    print(f"## Conversation trace: policies against the offline optimum (page {ps}, host = 2 x device)\n")
    print("Hit rate = (device + host hit tokens) / input tokens. OPT rows are bounds; "
          "gap = two-tier bound - policy.\n")
    print("| device D (tokens) | OPT single tier @D | two-tier bound @D+2D | LRU tree @D "
          "| LRU tree @3D | " + " | ".join(label for label, _ in POLICIES) + " |")
    print("|---|---|---|---|---|" + "---|" * len(POLICIES))
    for dev in POLICY_DEVICE_TOKENS:
        host = 2 * dev
        single = optimum_bounds(trace.paths, dev // ps, ps)
        union = optimum_bounds(trace.paths, (dev + host) // ps, ps)
        two = combine_two_tier(single, union, 1.0)
        bound = two.upper_hit_tokens / total
        lru_d = run_lru_tree(trace.paths, dev, ps, input_tokens=total).hit_rate
        lru_u = run_lru_tree(trace.paths, dev + host, ps, input_tokens=total).hit_rate
        cells = []
        for _, sets in POLICIES:
            s = load_scenario(scenario_path, ["device.gib=null", f"device.tokens={dev}",
                                              "host.size_gb=null", f"host.tokens={host}",
                                              *sets, *limit])
            rate = run_scenario(s).summary["hit_rate"]
            cells.append(f"{rate:.4f} (gap {bound - rate:+.4f})")
        exact = "" if single.exact and two.exact else " (not exact)"
        print(f"| {dev:,} | {single.upper_hit_tokens / total:.4f} | {bound:.4f}{exact} | "
              f"{lru_d:.4f} (gap {bound - lru_d:+.4f}) | {lru_u:.4f} | " + " | ".join(cells) + " |",
              flush=True)
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-requests", type=int, help="only the first N requests of each trace")
    parser.add_argument("--skip-policies", action="store_true", help="only the LRU tables")
    args = parser.parse_args()
    lru_tables(args.max_requests)
    if not args.skip_policies:
        policy_table(args.max_requests)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
