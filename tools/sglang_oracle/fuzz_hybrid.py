#!/usr/bin/env python3
"""Differential fuzzing of the hybrid trees against SGLang's core: random configs and
seeds, each trace generated on the sim's tree (sim/hybrid/gen.py), replayed on
SGLang 0.5.23's core (oracle_hybrid.py) and through the sim's replayer, outputs
compared line by line. Stops at the first difference and writes the trace there.

Usage (in the oracle venv):

    $SGLANG_ORACLE_VENV/bin/python tools/sglang_oracle/fuzz_hybrid.py \
        [--traces 200] [--ops 400] [--seed 0] [--check] [--keep DIR] \
        [--hicache [--kind mamba|swa|both]
                   [--write-policy write_through|write_through_selective|any]]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from oracle_hybrid import HostHybridOracle, HybridOracle  # noqa: E402

from sim.hybrid.gen import generate  # noqa: E402
from sim.hybrid.replay import HybridReplayer  # noqa: E402


def config(rng: random.Random, kind: str, n_ops: int) -> dict:
    ps = rng.choice([1, 1, 2, 4])
    max_len = rng.choice([8, 16, 24, 40])
    dev = rng.randint(2, 12) * max_len // ps * ps + ps * 8
    opts = dict(seed=rng.randrange(1 << 30), ops=n_ops, page_size=ps, max_len=max_len,
                device_cap=dev)
    if kind == "swa":
        opts.update(window=rng.randint(1, 20), aux_cap=rng.randint(2, dev // ps) * ps)
    else:
        opts.update(chunk=rng.randint(1, 16), aux_cap=rng.randint(1, 40),
                    max_states=rng.choice([-1, -1, 1, 2, 3, 5]))
    return opts


def host_config(rng: random.Random, n_ops: int, kind: str = "mamba") -> dict:
    """The host tier: host pools from a few tokens to twice the device's, so backups
    fail, reclaim and host eviction run; the component's host pool from one slot (one
    page of SWA) to twice its device pool."""
    opts = config(rng, kind, n_ops)
    ps = opts["page_size"]
    dev = opts["device_cap"]
    host = max(ps, rng.choice([dev // 4, dev // 2, dev, 2 * dev]) // ps * ps)
    if kind == "swa":
        cap = opts["aux_cap"]
        aux_host = max(ps, rng.choice([ps, 4 * ps, cap // 2, cap, 2 * cap]) // ps * ps)
    else:
        aux_host = rng.choice([1, 2, 4, opts["aux_cap"], 2 * opts["aux_cap"]])
    opts.update(hicache=True, host_cap=host, aux_host_cap=aux_host,
                load_back_threshold=rng.choice([1, 1, 4]))
    return opts


def dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=200)
    ap.add_argument("--ops", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="SGLang's sanity_check after every op")
    ap.add_argument("--keep", help="write a differing trace here")
    ap.add_argument("--hicache", action="store_true",
                    help="traces with the host tier only (see --kind)")
    ap.add_argument("--kind", default="mamba", choices=("mamba", "swa", "both"),
                    help="with --hicache: the component pair ((FULL, SWA) under "
                         "write_back; both: alternating)")
    ap.add_argument("--write-policy", default="write_back",
                    choices=("write_back", "write_through", "write_through_selective", "any"),
                    help="the host tier's write policy (any: drawn per trace)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    n_ops = 0
    for t in range(args.traces):
        if args.hicache:
            kind = args.kind if args.kind != "both" else ("swa" if t % 2 == 0 else "mamba")
        else:
            kind = "swa" if t % 2 == 0 else "mamba"
        opts = host_config(rng, args.ops, kind) if args.hicache else config(rng, kind, args.ops)
        if args.hicache and args.write_policy != "write_back":
            # Drawn after the pools, so write_back runs keep their configs per seed.
            opts["write_policy"] = (rng.choice(["write_back", "write_through",
                                                "write_through", "write_through_selective"])
                                    if args.write_policy == "any" else args.write_policy)
        trace = generate(kind, **opts)
        oracle = (HostHybridOracle if args.hicache else HybridOracle)(trace[0])
        sim = HybridReplayer(trace[0])
        for i, op in enumerate(trace[1:], start=1):
            want = dumps({"i": i, **oracle.apply(op)})
            got = dumps(sim.apply(i, op))
            if args.check:
                oracle.check()
            sim.tree.check()
            if want != got:
                if args.keep:
                    Path(args.keep).write_text("".join(dumps(o) + "\n" for o in trace[:i + 1]))
                print(f"trace {t} ({kind}, {opts}) differs at op {i}:\n sim    {got[:400]}\n"
                      f" sglang {want[:400]}")
                return 1
        n_ops += len(trace) - 1
    print(f"{args.traces} traces, {n_ops} ops: every output line identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
