"""Simulated requests per wall-second, TP=1 vs TP=8, jitter off and on; and what
sharing replicas saves, per jitter class.

Usage: python benchmarks/bench_sim.py [--requests 10000] [--profile] [--no-classes]
       python benchmarks/bench_sim.py --timings ROUNDS [--requests 10000]
The workload is quickstart.yaml's multi-turn chat generator at 10k requests. Jitter
"on" delays every rank's acks (exponential, mean 2 ms): under SGLang's synced ack
discipline that is absorbed, so it measures the cost of per-rank ack bookkeeping.
"storage" adds a Mooncake L3 tier (``storage: {backend: mooncake}``, SGLang's default
``timeout`` prefetch policy) at TP=8: every D->H backup is written to each rank's
store and an arriving turn prefetches what the host lost (target: 3,000 simulated
requests per wall-second).
Then every shipped jitter scenario runs with ``engine.replicas`` shared and eager
(results are byte-identical by construction; only the wall time differs).
``--timings`` runs only the TP=8 jitter-off run under each ``scheduler.overlap_timing``,
alternating, ROUNDS times each, and prints CPU seconds (``time.process_time``): what
the pipelined loop's extra SimPy events and bookkeeping cost against ``serial``.
``--profile --set KEY=VALUE`` profiles that run with a setting changed.
``--eager ROUNDS`` runs the TP=8 and TP=32 jitter-off run with ``engine.replicas``
shared and eager, alternating, ROUNDS times each, and prints CPU seconds and the
eager/shared ratio (min and median), with the plain path that never merges identical
replicas back (``Simulation.coalesce_replicas = False``) as a third column.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.runner import run_scenario  # noqa: E402
from sim.scenario import load_scenario  # noqa: E402

JITTER = ["jitter.ack_delay.dist=exponential", "jitter.ack_delay.mean=0.002"]


STORAGE = ["storage.backend=mooncake"]
STORAGE_TARGET = 3000  # simulated requests per wall-second, TP=8 with storage on


def one(tp: int, jitter: bool, n: int, storage: bool = False, extra: list | None = None):
    sets = [f"tp={tp}", f"workload.num_requests={n}", "scheduler.max_running_requests=64",
            "workload.arrival.rate=20", *(extra or [])]
    if jitter:
        sets += JITTER
    if storage:
        sets += STORAGE
    scn = load_scenario(ROOT / "scenarios" / "quickstart.yaml", sets)
    t0 = time.perf_counter()
    res = run_scenario(scn, None)
    wall = time.perf_counter() - t0
    return res.summary["requests"] / wall, wall, res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--profile", action="store_true", help="cProfile the TP=8 jitter-off run")
    ap.add_argument("--storage", action="store_true",
                    help="only the TP=8 storage run (with --profile: profile it)")
    ap.add_argument("--no-classes", action="store_true", help="skip the shared-vs-eager table")
    ap.add_argument("--timings", type=int, metavar="ROUNDS",
                    help="CPU seconds of the TP=8 run, serial vs pipelined, alternating")
    ap.add_argument("--eager", type=int, metavar="ROUNDS",
                    help="CPU seconds of TP=8, TP=32 and TP=8 with storage, shared vs eager "
                         "replicas, alternating")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="with --profile: a scenario setting for the profiled run")
    args = ap.parse_args()
    if args.timings:
        timings(args.requests, args.timings)
        return
    if args.eager:
        eager(args.requests, args.eager)
        return
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        one(8, False, args.requests, storage=args.storage, extra=args.set)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        return
    rates = {}
    one(1, False, 500)  # warm-up (imports, caches): not timed
    if args.storage:
        storage(args.requests)
        return
    print(f"{args.requests} requests (quickstart multi-turn chat), simulated collective")
    print(f"{'tp':>3} {'jitter':>7} {'req/s':>9} {'wall s':>7} {'hit':>6} {'verdict':>9} {'steps':>7}")
    for tp in (1, 8):
        for jitter in (False, True):
            rate, wall, res = one(tp, jitter, args.requests)
            rates[tp, jitter] = wall
            print(f"{tp:>3} {'on' if jitter else 'off':>7} {rate:>9,.0f} {wall:>7.2f} "
                  f"{res.summary['hit_rate']:>6.1%} {res.divergence['verdict']:>9} {res.divergence['steps']:>7}")
    print(f"TP8/TP1 wall-time ratio, jitter off: {rates[8, False] / rates[1, False]:.2f}")
    print(f"TP8/TP1 wall-time ratio, jitter on:  {rates[8, True] / rates[1, True]:.2f}")
    storage(args.requests, rates[8, False])
    if not args.no_classes:
        replicas()
    cluster()


def _alternate(modes, rounds: int, run, label: str = "") -> dict[str, list[float]]:
    """``run(mode)`` for each of ``modes`` in turn, ``rounds`` times: CPU seconds
    (``time.process_time``) per mode, each round printed as it ends."""
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(rounds):
        for mode in modes:
            t0 = time.process_time()
            run(mode)
            cpu[mode].append(time.process_time() - t0)
        print(label + ", ".join(f"{m} {v[-1]:.2f} CPU s" for m, v in cpu.items()), flush=True)
    return cpu


def timings(n: int, rounds: int):
    """The TP=8 jitter-off run under each overlap timing, alternating: CPU seconds per
    run, then min and median of each and their pipelined/serial ratios."""
    import statistics
    one(1, False, 500)  # warm-up (imports, caches): not timed
    cpu = _alternate(("serial", "pipelined"), rounds,
                     lambda mode: one(8, False, n, extra=[f"scheduler.overlap_timing={mode}"]))
    for f in (min, statistics.median):
        s, p = f(cpu["serial"]), f(cpu["pipelined"])
        print(f"{f.__name__:>6}: serial {s:.2f} s ({n / s:,.0f} req/CPU-s), pipelined {p:.2f} s "
              f"({n / p:,.0f} req/CPU-s), pipelined/serial {p / s:.3f}")


def eager(n: int, rounds: int):
    """Shared against eager replicas at TP 8 and 32, in CPU seconds, alternating;
    "plain" is eager with identical replicas never merged back (what divergence
    costs when every rank runs its own tree to the end)."""
    import statistics
    from sim.events import Simulation

    def run(tp, mode, storage):
        Simulation.coalesce_replicas = mode != "plain"
        try:
            one(tp, False, n, storage=storage,
                extra=[f"engine.replicas={'shared' if mode == 'shared' else 'eager'}"])
        finally:
            Simulation.coalesce_replicas = True

    one(1, False, 500)  # warm-up (imports, caches): not timed
    # TP 8 and 32, then TP 8 with the Mooncake storage tier (its replicas' storage
    # state is compared and merged too)
    for tp, storage in ((8, False), (32, False), (8, True)):
        label = f"tp {tp}{' storage' if storage else ''}"
        cpu = _alternate(("shared", "eager", "plain"), rounds,
                         lambda m: run(tp, m, storage), f"{label}: ")
        for f in (min, statistics.median):
            s = f(cpu["shared"])
            print(f"{label} {f.__name__:>6}: shared {s:.2f} s, eager {f(cpu['eager']):.2f} s "
                  f"({f(cpu['eager']) / s:.2f}x), plain eager {f(cpu['plain']):.2f} s "
                  f"({f(cpu['plain']) / s:.2f}x)")
        ratios = [e / s for e, s in zip(cpu["eager"], cpu["shared"])]
        print(f"{label} eager/shared per round: min {min(ratios):.2f}, median "
              f"{statistics.median(ratios):.2f}, max {max(ratios):.2f}")


def storage(n: int, plain_wall: float | None = None):
    """TP=8 with the Mooncake L3 tier on (same workload)."""
    rate, wall, res = one(8, False, n, storage=True)
    s = res.summary
    print(f"  8 storage {rate:>9,.0f} {wall:>7.2f} {s['hit_rate']:>6.1%} {res.divergence['verdict']:>9} "
          f"{res.divergence['steps']:>7}  (L3 {s['l3_hit_tokens']:,} tokens, {s['prefetch_issued']:,} "
          f"prefetches, {STORAGE_TARGET:,} req/s target: {rate / STORAGE_TARGET:.2f} of it)")
    if plain_wall is not None:
        print(f"TP8 storage/no-storage wall-time ratio: {wall / plain_wall:.2f}")


def cluster():
    """The whole Mooncake conversation trace at dp 8 x tp 8 (64 ranks), as shipped."""
    scn = load_scenario(ROOT / "scenarios" / "mooncake_conversation.yaml", [])
    t0 = time.perf_counter()
    res = run_scenario(scn, None)
    wall = time.perf_counter() - t0
    s = res.summary
    print()
    print(f"mooncake_conversation, dp {scn.dp} x tp {scn.tp} ({scn.dp * scn.tp} ranks), "
          f"{s['requests']:,} requests: {wall:.2f} s wall (target 20 s: {wall / 20:.2f} of it), "
          f"TTFT p50 {s['ttft_p50_s']:.3f} s, hit rate {s['hit_rate']:.1%}")


def replicas():
    """Shared vs eager replicas on every shipped jitter scenario, as shipped."""
    print()
    print(f"{'scenario':<36} {'tp':>3} {'verdict':>13} {'shared s':>9} {'eager s':>8} {'eager/shared':>13}")
    for path in sorted((ROOT / "scenarios").glob("jitter_*.yaml")):
        walls = {}
        for mode in ("shared", "eager"):
            scn = load_scenario(path, [f"engine.replicas={mode}"])
            t0 = time.perf_counter()
            res = run_scenario(scn, None)
            walls[mode] = time.perf_counter() - t0
        print(f"{path.stem:<36} {scn.tp:>3} {res.divergence['verdict']:>13} {walls['shared']:>9.2f} "
              f"{walls['eager']:>8.2f} {walls['eager'] / walls['shared']:>13.2f}")


if __name__ == "__main__":
    main()
