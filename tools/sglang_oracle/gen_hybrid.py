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
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oracle_hybrid import HybridOracle  # noqa: E402


class Gen:
    def __init__(self, args):
        self.rng = random.Random(args.seed)
        self.kind = args.kind
        self.ps = args.page_size
        self.header = {"op": "header", "components": ["full", args.kind],
                       "device_capacity": args.device_cap, "page_size": self.ps,
                       "seed": args.seed}
        if args.kind == "swa":
            self.header.update(swa_capacity=args.aux_cap, sliding_window=args.window)
        else:
            self.header.update(mamba_capacity=args.aux_cap, mamba_chunk=args.chunk)
            if args.max_states != -1:
                self.header["mamba_max_states"] = args.max_states
        self.window = args.window
        self.oracle = HybridOracle(self.header)
        self.check = args.check
        self.ops: list[dict] = []
        self.outs: list[dict] = [{"i": 0, "op": "header", "events": [],
                                  **self.oracle.summary()}]
        self.seqs: list[list[int]] = []
        self.locks: dict = {}  # id -> swa released?
        self.next_lock = 1
        self.max_len = args.max_len

    def emit(self, op: dict) -> dict | None:
        rec = self.oracle.apply(op)
        if "error" in rec:
            return None
        if self.check:
            self.oracle.check()
        self.ops.append(op)
        self.outs.append({"i": len(self.ops), **rec})
        return rec

    def seq(self) -> list[int]:
        r = self.rng
        if self.seqs and r.random() < 0.8:
            base = r.choice(self.seqs)
            # Extend a cached sequence whole (its end node turns internal) or branch.
            cut = len(base) if r.random() < 0.3 else r.randint(0, len(base))
            if r.random() < 0.5:
                cut -= cut % self.ps
            s = base[:cut]
        else:
            s = []
        extra = r.randint(0 if s else 1, max(1, self.max_len - len(s)))
        s = s + [r.randint(1, 6) for _ in range(extra)]
        return s[: self.max_len]

    def free(self):
        o = self.oracle
        full = o.alloc.full.free_pages * self.ps
        if self.kind == "swa":
            aux = o.alloc.swa.free_pages * self.ps
        else:
            aux = o.req_pool.mamba_allocator.pool.free_pages
        return full, aux

    def op_insert(self):
        r = self.rng
        # Repeat a cached sequence now and then (Mamba: the tree keeps its state and
        # frees the request's fork; SWA: the overlap walk over its windows).
        s = r.choice(self.seqs) if self.seqs and r.random() < 0.15 else self.seq()
        n = len(s) - len(s) % self.ps
        if n == 0:
            return
        prev = 0
        if r.random() < 0.7:
            rec = self.emit({"op": "match", "tokens": s})
            prev = rec["device_len"] if rec else 0
            if r.random() < 0.2:
                prev = r.randint(0, prev // self.ps) * self.ps
        op = {"op": "insert", "tokens": s}
        if prev:
            op["prev"] = prev
        need_aux = 1
        if self.kind == "swa":
            ev = 0
            if r.random() < 0.6 and n > self.window:
                ev = r.randint(0, (n - 1) // self.ps) * self.ps
            if ev:
                op["swa_evicted"] = ev
            need_aux = max(0, n - max(prev, ev))
        full_free, aux_free = self.free()
        need_full = n - prev
        ev_op = {"op": "evict"}
        if need_full > full_free:
            ev_op["full"] = need_full - full_free + r.randint(0, 4) * self.ps
        if need_aux > aux_free:
            ev_op[self.kind] = need_aux - aux_free + (r.randint(0, 3) if self.kind == "swa" else 0)
        if len(ev_op) > 1:
            self.emit(ev_op)
        if self.emit(op) is not None:
            self.seqs.append(s)
            if len(self.seqs) > 40:
                self.seqs.pop(self.rng.randrange(len(self.seqs)))

    def op_match(self):
        self.emit({"op": "match", "tokens": self.seq()})

    def op_lock(self):
        if len(self.locks) >= 6:
            return self.op_unlock()
        lid = self.next_lock
        self.next_lock += 1
        s = self.rng.choice(self.seqs) if self.seqs and self.rng.random() < 0.8 else self.seq()
        if self.emit({"op": "lock", "tokens": s, "id": lid}) is not None:
            self.locks[lid] = False

    def op_unlock(self):
        if not self.locks:
            return
        lid = self.rng.choice(sorted(self.locks))
        if self.emit({"op": "unlock", "id": lid}) is not None:
            del self.locks[lid]

    def op_release_swa(self):
        cands = [lid for lid, rel in self.locks.items() if not rel]
        if self.kind != "swa" or not cands:
            return
        lid = self.rng.choice(sorted(cands))
        if self.emit({"op": "release_swa", "id": lid}) is not None:
            self.locks[lid] = True

    def op_evict(self):
        r = self.rng
        op = {"op": "evict"}
        if r.random() < 0.5:
            op["full"] = r.randint(1, 4 * self.max_len // 3)
        if r.random() < 0.7 or len(op) == 1:
            op[self.kind] = (r.randint(1, 2 * self.window) if self.kind == "swa"
                             else r.randint(1, 3))
        self.emit(op)

    def run(self, n_ops: int):
        mix = [("insert", 40), ("match", 20), ("lock", 9), ("unlock", 7), ("evict", 16),
               ("release_swa", 5 if self.kind == "swa" else 0), ("dump", 3)]
        names = [m for m, _ in mix]
        weights = [w for _, w in mix]
        while len(self.ops) < n_ops:
            m = self.rng.choices(names, weights)[0]
            if m == "dump":
                self.emit({"op": "dump"})
            else:
                getattr(self, f"op_{m}")()
        for lid in sorted(self.locks):  # leave the tree unlocked, then dump it
            self.emit({"op": "unlock", "id": lid})
        self.locks.clear()
        self.emit({"op": "dump"})


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
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--out-oracle")
    ap.add_argument("--check", action="store_true",
                    help="run SGLang's sanity_check and the pool accounting after every op")
    args = ap.parse_args()
    g = Gen(args)
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
