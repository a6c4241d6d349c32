#!/usr/bin/env python3
"""Seeded random hybrid op-traces (docs/HYBRID.md §6), kept only where SGLang's core
accepts each op, with SGLang's outputs beside them. Like the shared oracle's gen.py.

Usage (in the oracle venv):

    $SGLANG_ORACLE_VENV/bin/python tools/sglang_oracle/gen_hybrid.py --kind swa \
        --seed 7 --ops 800 -o t.jsonl --out-oracle t.out.jsonl \
        [--page-size 2] [--window 8] [--device-cap 96] [--aux-cap 40] [--check]

The generator leans on what the components do differently from FULL: prompts that
share prefixes and branch (splits), inserts whose request already freed its SWA below
a cursor (tombstones, split windows), inserts that recompute a prefix the tree holds
as a tombstone (revival, with and without a FULL lock), window locks whose boundary
later splits, early SWA releases, repeated Mamba inserts (``mamba_exist``) and
eviction requests on each component.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: sim/

from oracle_hybrid import HostHybridOracle, HybridOracle  # noqa: E402

from sim.hybrid.gen import Gen  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=("swa", "mamba"), required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", type=int, default=800)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--window", type=int, default=8, help="SWA sliding window (tokens)")
    ap.add_argument("--chunk", type=int, default=4, help="Mamba cache chunk size (tokens)")
    ap.add_argument("--max-states", type=int, default=-1, help="mamba_max_states_per_path")
    ap.add_argument("--device-cap", type=int, default=96)
    ap.add_argument("--aux-cap", type=int, default=40)
    ap.add_argument("--max-len", type=int, default=24)
    ap.add_argument("--hicache", action="store_true",
                    help="the host tier (swa: write_back only)")
    ap.add_argument("--host-cap", type=int, default=0, help="FULL host tokens (0: 2x device)")
    ap.add_argument("--aux-host-cap", type=int, default=0,
                    help="the component's host pool: Mamba states, SWA tokens "
                         "(0: 2x the device pool)")
    ap.add_argument("--load-back-threshold", type=int, default=1)
    ap.add_argument("--write-policy", default="write_back",
                    choices=("write_back", "write_through", "write_through_selective"))
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--out-oracle")
    ap.add_argument("--check", action="store_true",
                    help="run SGLang's sanity_check and the pool accounting after every op")
    args = ap.parse_args()
    g = Gen(args, lambda h: (HostHybridOracle if h.get("hicache") else HybridOracle)(h))
    g.run(args.ops)
    with open(args.out, "w") as f:
        for op in [g.header, *g.ops]:
            f.write(json.dumps(op, separators=(",", ":")) + "\n")
    if args.out_oracle:
        with open(args.out_oracle, "w") as f:
            for rec in g.outs:
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
