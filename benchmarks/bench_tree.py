"""Tree operations per second on a 100k-op random write_back trace with host pressure.

Usage: python benchmarks/bench_tree.py [--ops 100000] [--seeds 1] [--hybrid-ops 20000]
       [--no-sglang]
Reports ops/s at page sizes 1 and 64 and the share of time spent in duplicate
reclaim. The trace is generated first (not timed) and replayed through the Tree API
without event recording, which is how the simulator drives the tree.

Then the CPU time (``time.process_time``) of each replay, min and median of
``--rounds`` (5), which is what two checkouts are compared on (``Tree`` is the
unified core with FULL alone, ``HybridTree(NoComponent())``).

Then the hybrid trees (sim/hybrid, docs/HYBRID.md): ops/s of the (FULL, SWA) and
(FULL, MAMBA) trees on generated hybrid traces (sim/hybrid/gen.py), and, when the
oracle venv exists ($SGLANG_ORACLE_VENV, default sglang-oracle-venv in the temp dir),
the ratio against SGLang 0.5.23's own core on the same trace
(tools/sglang_oracle/bench_hybrid_core.py: the real UnifiedTreeCore with its
component, the oracle's CPU pools, after import and build).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.optrace_gen import generate  # noqa: E402
from sim.hybrid.gen import generate as generate_hybrid  # noqa: E402
from sim.hybrid.replay import HybridReplayer, make_tree  # noqa: E402
from sim.tree import Tree  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# (label, kind, generator options): hybrid traces with the conformance cases' shapes.
HYBRID_BENCHES = [
    ("full+swa   ps1 w8", "swa", dict(page_size=1, window=8, device_cap=300, aux_cap=120)),
    ("full+swa   ps4 w16", "swa", dict(page_size=4, window=16, device_cap=512, aux_cap=192,
                                       max_len=48)),
    ("full+mamba ps1 c4", "mamba", dict(chunk=4, device_cap=300, aux_cap=60)),
    # the host tier (write_back): host pools as large as the device's
    ("full+mamba host ps1", "mamba", dict(chunk=4, device_cap=300, aux_cap=60, hicache=True,
                                          host_cap=300, aux_host_cap=60)),
    ("full+swa host ps1", "swa", dict(page_size=1, window=8, device_cap=300, aux_cap=120,
                                      hicache=True, host_cap=300, aux_host_cap=120)),
]


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
    t0 = time.perf_counter()
    _apply(tree, keyed)
    elapsed = time.perf_counter() - t0
    return len(keyed) / elapsed, reclaim_s / elapsed, tree


def _apply(tree, keyed) -> None:
    """Apply the keyed FULL ops to ``tree`` (``Tree``'s API), in order."""
    locks = {}
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


def _keyed(ops, ps):
    units = (lambda t: t) if ps == 1 else (
        lambda t: [tuple(t[i:i + ps]) for i in range(0, len(t) - len(t) % ps, ps)])
    return [(op["op"], units(op["tokens"]) if "tokens" in op else None, op) for op in ops[1:]]


def cpu_tree(ops, ps):
    """CPU seconds of ``Tree`` replaying ``ops`` (as ``drive``, without its timer hook)."""
    h = ops[0]
    tree = Tree(device_capacity=h["device_capacity"], host_capacity=h["host_capacity"],
                page_size=ps, write_policy=h["write_policy"], load_back_threshold=1)
    keyed = _keyed(ops, ps)
    t0 = time.process_time()
    _apply(tree, keyed)
    return time.process_time() - t0, (tree.dev_used, tree.host_used, tree.n_nodes, tree.digest)


def cpu_main(traces, rounds):
    """``Tree``'s CPU seconds per replay: min / median of ``rounds``, each checked to
    end in the same tree (tokens on each tier, nodes, digest)."""
    print(f"\nTree replay, CPU s, {rounds} rounds")
    print(f"{'page':>5} {'min':>7} {'median':>7}")
    for ps, ops in traces:
        times, ends = [], set()
        for _ in range(rounds):
            t, end = cpu_tree(ops, ps)
            times.append(t)
            ends.add(end)
        assert len(ends) == 1, ends
        print(f"{ps:>5} {min(times):>7.2f} {statistics.median(times):>7.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hybrid-ops", type=int, default=20_000)
    ap.add_argument("--no-sglang", action="store_true",
                    help="skip timing SGLang's core for the hybrid ratio")
    ap.add_argument("--hybrid-only", action="store_true")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds of the CPU-time replay")
    args = ap.parse_args()
    if args.hybrid_only:
        return hybrid_main(args.hybrid_ops, args.seed, not args.no_sglang)
    print(f"tree benchmark: {args.ops} ops, write_back, host pressure (conformance-like shapes)")
    print(f"{'page':>5} {'ops/s':>10} {'reclaim share':>14} {'reclaims':>9} {'backups':>8} {'drops':>6}")
    traces = []
    for ps in (1, 64):
        ops = generate(args.ops, seed=args.seed, page_size=ps, device_capacity=48 * ps,
                       host_capacity=20 * ps, mix={"insert": 526, "evict_device": 299,
                                                   "evict_host": 273, "match": 237,
                                                   "load_back": 220, "lock": 37})
        rate, share, tree = drive(ops, ps)
        s = tree.stats
        print(f"{ps:>5} {rate:>10,.0f} {share:>13.1%} {s.reclaims:>9} {s.backups:>8} {s.drops:>6}")
        traces.append((ps, ops))
    cpu_main(traces, args.rounds)
    hybrid_main(args.hybrid_ops, args.seed, not args.no_sglang)


def drive_hybrid(ops):
    """Replay a hybrid trace through the tree API (no event recording)."""
    h = ops[0]
    tree = make_tree(h)
    ps, kind = h.get("page_size", 1), h["components"][1]
    units = (lambda t: t) if ps == 1 else (
        lambda t: [tuple(t[i:i + ps]) for i in range(0, len(t) - len(t) % ps, ps)])
    keyed = [(op["op"], units(op["tokens"]) if "tokens" in op else None, op) for op in ops[1:]]
    locks, held = {}, set()
    t0 = time.perf_counter()
    for op_kind, key, op in keyed:
        if op_kind == "insert":
            if kind == "swa":
                tree.insert(key, op.get("prev", 0), op.get("swa_evicted", 0))
            else:
                donate = op.get("donate")
                tree.insert(key, op.get("prev", 0), donated=donate is not None)
                held.discard(donate)
        elif op_kind == "match":
            m = tree.match_prefix(key)
            if "cow" in op and tree.cow(m, op["cow"] in held).copied:
                held.add(op["cow"])
        elif op_kind == "release":
            held.discard(op["id"])
            tree.release()
        elif op_kind in ("evict", "evict_for_alloc"):
            tree.evict(op.get("full", 0), op.get(kind, 0))
        elif op_kind == "lock":
            locks[op["id"]] = tree.inc_lock(tree.match_prefix(key).dnode,
                                            skip_aux=bool(op.get("skip")))
        elif op_kind == "evict_host":
            comp = "full" if "full" in op else kind
            tree.evict_host(op[comp], comp)
        elif op_kind == "load_back":
            rid = op.get("req")
            r = tree.load_back(tree.match_prefix(key), op["id"],
                               None if rid is None else rid in held)
            if r.slot_granted:
                held.add(rid)
        elif op_kind == "load_back_ack":
            tree.finish_load_back(op["id"])
        elif op_kind == "unlock":
            tree.dec_lock(locks.pop(op["id"]))
        elif op_kind == "release_swa":
            tree.release_swa(locks[op["id"]])
    rate = len(keyed) / (time.perf_counter() - t0)
    tree.check()
    return rate, tree


def sglang_missing() -> str | None:
    """Why SGLang's column cannot be measured here, or None: it needs the oracle venv and
    the oracle's folder (oracle/ of the project's shared/ folder beside the repository,
    not in it), which a plain clone has neither of."""
    venv = os.environ.get("SGLANG_ORACLE_VENV") or str(Path(tempfile.gettempdir()) / "sglang-oracle-venv")
    oracle = Path(os.environ.get("HICACHE_SGLANG_ORACLE") or ROOT.parent / "shared" / "oracle")
    if not (oracle / "oracle_ext.py").is_file():
        return (f"no SGLang oracle at {oracle} (shared/oracle beside the repository; set "
                "HICACHE_SGLANG_ORACLE=DIR)")
    if not (Path(venv) / "bin" / "python").is_file():
        return f"no oracle venv at {venv} (build it with bash {oracle}/setup.sh)"
    return None


def sglang_rate(ops):
    """SGLang's core on the same trace, in the oracle venv; None when it is absent."""
    if sglang_missing() is not None:
        return None
    venv = os.environ.get("SGLANG_ORACLE_VENV") or str(Path(tempfile.gettempdir()) / "sglang-oracle-venv")
    py = Path(venv) / "bin" / "python"
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for op in ops:
            f.write(json.dumps(op) + "\n")
        path = f.name
    try:
        out = subprocess.run([str(py), str(ROOT / "tools/sglang_oracle/bench_hybrid_core.py"), path],
                             capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)
    r = json.loads(out.strip().splitlines()[-1])
    assert r["errors"] == 0, "SGLang refused ops the sim accepted"
    return r["ops"] / r["seconds"]


def hybrid_main(n_ops, seed, with_sglang):
    print(f"\nhybrid trees: {n_ops} ops each (sim/hybrid/gen.py), device tier, and the host "
          f"tier (write_back) of each pair")
    if with_sglang and sglang_missing():
        print(f"sglang column skipped: {sglang_missing()}")
    print(f"{'components':<20} {'sim ops/s':>10} {'sglang ops/s':>13} {'ratio':>6}")
    for label, kind, opts in HYBRID_BENCHES:
        # dumps are diagnostics, not tree work: both sides skip them
        ops = [op for op in generate_hybrid(kind, seed=seed, ops=n_ops, **opts)
               if op["op"] != "dump"]
        runs = [drive_hybrid(ops) for _ in range(3)]
        rate = max(r for r, _ in runs)
        # the untimed replayer (what the conformance cases check) ends on the same tree
        replayer = HybridReplayer(ops[0])
        for i, op in enumerate(ops[1:], start=1):
            assert "error" not in replayer.apply(i, op)
        assert runs[0][1].fingerprint() == replayer.tree.fingerprint()
        ref = sglang_rate(ops) if with_sglang else None
        ref_s = f"{ref:>13,.0f}" if ref else f"{'-':>13}"
        ratio = f"{rate / ref:>5.1f}x" if ref else f"{'-':>6}"
        print(f"{label:<20} {rate:>10,.0f} {ref_s} {ratio}")


if __name__ == "__main__":
    main()
