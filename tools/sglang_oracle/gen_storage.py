#!/usr/bin/env python3
"""Seeded random op-traces with storage (L3) ops, each op checked on SGLang's tree.

Usage (in the oracle venv):

    $SGLANG_ORACLE_VENV/bin/python tools/sglang_oracle/gen_storage.py --seed 7 \
        --ops 800 -o t.jsonl [--page-size 2] [--policy write_through] [--stats]

It extends the shared generator (``gen.Gen``: inserts, matches, locks, load-backs,
evictions tilted towards host pressure and splits) with the ops of docs/OPTRACE.md
§14 and, under explicit write acks, ``write_ack`` followed by SGLang's storage write
of every published node (``_finish_write_through_ack`` -> ``write_backup_storage``).
Every candidate op is applied to ``oracle_storage.StorageOracle`` first, with
SGLang's ``sanity_check`` after it; an op SGLang refuses is dropped.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import oracle_storage  # noqa: E402  (puts the shared oracle on sys.path)
import gen as base_gen  # noqa: E402
from oracle import FULL  # noqa: E402


class StorageGen(base_gen.Gen):
    def __init__(self, rng: random.Random, header: dict):
        super().__init__(rng, header)
        # Replace the shared generator's oracle (a fresh core resets SGLang's counters).
        self.oracle = oracle_storage.StorageOracle(header)
        self.outputs = [{"op": "header", "events": [], **self.oracle.summary()}]
        self.explicit_acks = header.get("write_acks", "op") == "op"
        self.pending: list[str] = []   # issued, not staged
        self.staged: list[str] = []
        self.swrites: list[str] = []

    def emit(self, op):
        out = self.oracle.apply(op)
        self.oracle.check()
        if "error" in out:
            assert out["events"] == [], out
            self.stats["dropped_" + out["error"]] += 1
            return None
        self.trace.append(op)
        self.outputs.append(out)
        self.stats[op["op"]] += 1
        for wid in out.get("storage_writes", ()):  # storage_writes auto
            self.swrites.append(wid)
            self.stats["auto_storage_write"] += 1
        for e in out["events"]:
            self.stats["ev_" + e["k"] + (f"_pass{e['pass']}" if "pass" in e else "")] += 1
        for key in ("reason",):
            if key in out:
                self.stats[f"{op['op']}_{out[key]}"] += 1
        if op["op"] == "prefetch_done":
            self.stats["done_dropped" if out["dropped"] else
                       ("done_node" if out["node"] is not None else "done_no_node")] += 1
        return out

    # -- storage ops
    def do_prefetch(self):
        seq = self._pick_seq()
        r = self.rng.random()
        if r < 0.6:   # storage holds more than the tree: a longer conversation
            seq = seq + self._tokens(self._len(1, 6))
        elif r < 0.8:
            seq = self._cut(seq) + self._tokens(self._len(0, 4))
        pid = self.fresh_id("p")
        out = self.emit({"op": "prefetch", "tokens": seq, "id": pid})
        if out is not None and out["issued"]:
            self.pending.append(pid)

    def do_hit(self):
        pid = self.pending.pop(self.rng.randrange(len(self.pending)))
        requested = self.oracle.prefetches[pid][3]
        pages = requested // self.ps
        r = self.rng.random()
        n = pages if r < 0.55 else (0 if r < 0.65 else self.rng.randint(0, pages))
        out = self.emit({"op": "prefetch_hit", "id": pid, "n": n * self.ps})
        if out is not None and out["staged"]:
            self.staged.append(pid)

    def do_done(self):
        pid = self.staged.pop(self.rng.randrange(len(self.staged)))
        staged = len(self.oracle.prefetches[pid][4]) // self.ps
        r = self.rng.random()
        n = staged if r < 0.6 else (0 if r < 0.68 else self.rng.randint(0, staged))
        self.emit({"op": "prefetch_done", "id": pid, "n": n * self.ps})

    def do_revoke(self):
        pool = self.pending + self.staged
        pid = self.rng.choice(pool)
        (self.pending if pid in self.pending else self.staged).remove(pid)
        self.emit({"op": "prefetch_revoke", "id": pid})

    def _storage_write(self, node_id):
        wid = self.fresh_id("w")
        out = self.emit({"op": "storage_write", "node": node_id, "id": wid})
        if out is not None and out["written"]:
            self.swrites.append(wid)

    def do_storage_write(self):
        core = self.oracle.core
        ids = [nid for nid, n in core._node_arena.items() if n is not core.root_node]
        if not ids:
            return
        host = [nid for nid in ids if core._node_arena[nid].component_data[FULL].host_value is not None]
        self._storage_write(self.rng.choice(host if host and self.rng.random() < 0.85 else ids))

    def do_storage_ack(self):
        wid = self.swrites.pop(self.rng.randrange(len(self.swrites)))
        self.emit({"op": "storage_write_ack", "id": wid})

    def do_write_ack(self):
        ack = self.rng.choice(list(self.oracle.writes))
        published = list(self.oracle.writes[ack][2])
        if self.emit({"op": "write_ack", "id": ack}) is not None:
            for nid in published:  # _finish_write_through_ack -> write_backup_storage
                if nid in self.oracle.core._node_arena and self.rng.random() < 0.7:
                    self._storage_write(nid)

    def step(self):
        if len(self.pending) + len(self.staged) >= 4:
            return self.rng.choice([self.do_hit] * bool(self.pending) + [self.do_done] * bool(self.staged))()
        if len(self.swrites) >= 6:
            return self.do_storage_ack()
        if self.explicit_acks and len(self.oracle.writes) >= 6:
            return self.do_write_ack()
        choices = [(14, self.do_prefetch), (4, self.do_storage_write), (60, super().step)]
        if self.pending:
            choices += [(10, self.do_hit), (2, self.do_revoke)]
        if self.staged:
            choices += [(10, self.do_done), (1, self.do_revoke)]
        if self.swrites:
            choices.append((4, self.do_storage_ack))
        if self.explicit_acks and self.oracle.writes:
            choices.append((12, self.do_write_ack))
        total = sum(w for w, _ in choices)
        x = self.rng.uniform(0, total)
        for w, fn in choices:
            x -= w
            if x <= 0:
                return fn()
        return choices[-1][1]()


def generate(seed: int, n_ops: int, page_size: int = 1, policy: str = "write_back",
             device_cap=None, host_cap=None, threshold=None, explicit_acks=None,
             auto_writes=False):
    rng = random.Random(seed)
    device_cap = device_cap or rng.choice([32, 48, 64]) * page_size
    host_cap = host_cap or max(page_size, int(device_cap * rng.choice([0.5, 0.75, 1.0, 1.5])))
    host_cap -= host_cap % page_size
    threshold = threshold if threshold is not None else page_size * rng.choice([1, 1, 2, 3])
    if explicit_acks is None:
        explicit_acks = policy == "write_through" and rng.random() < 0.7
    header = {"op": "header", "page_size": page_size, "device_capacity": device_cap,
              "host_capacity": host_cap, "write_policy": policy, "load_back_threshold": 1,
              "version": 2, "write_acks": "op" if explicit_acks else "end_of_op",
              "prefetch_threshold": threshold, "seed": seed}
    if auto_writes:
        header["storage_writes"] = "auto"
    g = StorageGen(rng, header)
    while len(g.trace) - 1 < n_ops:
        g.step()
    g.emit({"op": "dump"})
    return g


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", type=int, default=500)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--policy", default="write_back", choices=["write_back", "write_through"])
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--stats", action="store_true")
    args = ap.parse_args()
    g = generate(args.seed, args.ops, args.page_size, args.policy)
    with open(args.out, "w") as f:
        for op in g.trace:
            f.write(json.dumps(op, separators=(",", ":")) + "\n")
    if args.stats:
        for k, v in sorted(g.stats.items()):
            print(f"{k:32s} {v}")


if __name__ == "__main__":
    main()
