"""Tree operations per second on a 100k-op random write_back trace with host pressure.

Usage: python benchmarks/bench_tree.py [--ops 100000] [--seeds 1]
Reports ops/s at page sizes 1 and 64 and the share of time spent in duplicate
reclaim. The trace is generated first (not timed) and replayed through the Tree API
without event recording, which is how the simulator drives the tree.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.optrace_gen import generate  # noqa: E402
from sim.tree import Tree  # noqa: E402


def drive(ops, ps):
    h = ops[0]
    tree = Tree(device_capacity=h["device_capacity"], host_capacity=h["host_capacity"],
                page_size=ps, write_policy=h["write_policy"], load_back_threshold=1)
    units = (lambda t: t) if ps == 1 else (
        lambda t: [tuple(t[i:i + ps]) for i in range(0, len(t) - len(t) % ps, ps)])
    keyed = [(op["op"], units(op["tokens"]) if "tokens" in op else None, op) for op in ops[1:]]
    reclaim_s = 0.0
    policy = tree.host_policy
    inner = policy.reclaim

    def timed_reclaim(t, n):
        nonlocal reclaim_s
        t0 = time.perf_counter()
        try:
            return inner(t, n)
        finally:
            reclaim_s += time.perf_counter() - t0

    policy.reclaim = timed_reclaim
    locks = {}
    t0 = time.perf_counter()
    for kind, key, op in keyed:
        if kind == "insert":
            tree.insert(key)
        elif kind == "match":
            tree.match_prefix(key)
        elif kind == "evict_device":
            tree.evict_device(op["n"])
        elif kind == "evict_host":
            tree.evict_host(op["n"])
        elif kind == "load_back":
            tree.load_back(tree.match_prefix(key), op["id"])
        elif kind == "load_back_ack":
            tree.finish_load_back(op["id"])
        elif kind == "lock":
            node = tree.match_prefix(key).last_device
            tree.inc_lock(node)
            locks[op["id"]] = node
        elif kind == "unlock":
            tree.dec_lock(locks.pop(op["id"]))
    elapsed = time.perf_counter() - t0
    return len(keyed) / elapsed, reclaim_s / elapsed, tree


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"tree benchmark: {args.ops} ops, write_back, host pressure (conformance-like shapes)")
    print(f"{'page':>5} {'ops/s':>10} {'reclaim share':>14} {'reclaims':>9} {'backups':>8} {'drops':>6}")
    for ps in (1, 64):
        ops = generate(args.ops, seed=args.seed, page_size=ps, device_capacity=48 * ps,
                       host_capacity=20 * ps, mix={"insert": 526, "evict_device": 299,
                                                   "evict_host": 273, "match": 237,
                                                   "load_back": 220, "lock": 37})
        rate, share, tree = drive(ops, ps)
        s = tree.stats
        print(f"{ps:>5} {rate:>10,.0f} {share:>13.1%} {s.reclaims:>9} {s.backups:>8} {s.drops:>6}")


if __name__ == "__main__":
    main()
