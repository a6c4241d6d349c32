"""Seeded random hybrid op-traces (docs/HYBRID.md §6), the generator behind
``tools/sglang_oracle/gen_hybrid.py`` (which keeps an op only where SGLang's core
accepts it) and ``benchmarks/bench_tree.py`` (which runs it on the sim's own tree:
both accept the same ops, the conformance cases check that).

It leans on what the components do differently from FULL: prompts that share
prefixes and branch (splits), inserts whose request already freed its SWA below a
cursor (tombstones, split windows), inserts that recompute a prefix the tree holds as
a tombstone (revival, with and without a FULL lock), window locks whose boundary later
splits, early SWA releases, repeated Mamba inserts (``mamba_exist``) and eviction
requests on each component. With ``hicache`` (Mamba; SWA under write_back), the
host tier too: small
host pools so write_back backups, demotes, host evictions of either component and
duplicate reclaims run often, load-backs (with and without a request taking the
state) and their acks, and inserts over evicted prefixes; under a write_through
``write_policy``, inserts that back nodes up (some carrying the request's
``inserted``) and ``write_ack`` ops, mostly in issue order.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

from sim.hybrid.replay import HybridReplayer


class SimDriver:
    """The generator's driver on the sim's tree (``HybridReplayer``)."""

    def __init__(self, header: dict):
        self.r = HybridReplayer(header)
        self.n = 0

    def apply(self, op: dict) -> dict:
        self.n += 1
        out = self.r.apply(self.n, op)
        if "error" in out:
            self.n -= 1
        out.pop("i")
        return out

    def summary(self) -> dict:
        return self.r.summary()

    def check(self) -> None:
        self.r.tree.check()

    def write_ids(self) -> list:
        """write_through: the acks in flight, in issue order."""
        return list(self.r.tree.writes)


def options(kind: str, **kw) -> SimpleNamespace:
    """Generator options with gen_hybrid.py's defaults."""
    base = dict(kind=kind, seed=0, ops=800, page_size=1, window=8, chunk=4, max_states=-1,
                device_cap=96, aux_cap=40, max_len=24, check=False, hicache=False,
                host_cap=0, aux_host_cap=0, load_back_threshold=1, write_policy="write_back")
    base.update(kw)
    return SimpleNamespace(**base)


def generate(kind: str, **kw) -> list[dict]:
    """A trace (header first) the sim's tree accepts op by op."""
    g = Gen(options(kind, **kw), SimDriver)
    g.run(g.n_ops)
    return [g.header, *g.ops]


class Gen:
    """The generator. ``driver(header)`` builds what runs the ops: an object whose
    ``apply(op)`` returns the op's output dict (with ``"error"`` when refused), whose
    ``summary()`` gives the pool counts, and whose ``check()`` checks invariants.
    ``args``: kind, seed, page_size, window, chunk, max_states, device_cap, aux_cap,
    max_len, check (an ``argparse.Namespace`` or any object with them)."""

    def __init__(self, args, driver):
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
            if self.ps > 1:
                self.header["mamba_extra_buffer"] = True
        self.hicache = bool(getattr(args, "hicache", False))
        if self.hicache:
            host_cap = args.host_cap or 2 * args.device_cap
            host_cap -= host_cap % self.ps
            aux_host = args.aux_host_cap or 2 * args.aux_cap
            if args.kind == "swa":
                aux_host -= aux_host % self.ps
            self.header.update(hicache=True, host_capacity=host_cap,
                               **{f"{args.kind}_host_capacity": aux_host})
            if args.load_back_threshold != 1:
                self.header["load_back_threshold"] = args.load_back_threshold
            policy = getattr(args, "write_policy", "write_back")
            if policy != "write_back":
                self.header["write_policy"] = policy
        self.wt = self.hicache and self.header.get("write_policy", "write_back") != "write_back"
        self.loads: set = set()
        self.next_load = 1
        self.window = args.window
        self.caps = (args.device_cap, args.aux_cap)
        self.oracle = driver(self.header)
        self.check = args.check
        self.ops: list[dict] = []
        self.outs: list[dict] = [{"i": 0, "op": "header", "events": [],
                                  **self.oracle.summary()}]
        self.seqs: list[list[int]] = []
        self.locks: dict = {}  # id -> swa released?
        self.next_lock = 1
        self.held: set = set()  # Mamba: requests holding their own state (copy on write)
        self.next_req = 1
        self.max_len = args.max_len
        self.n_ops = getattr(args, "ops", 800)

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
        s = self.oracle.summary()
        return self.caps[0] - s["dev"], self.caps[1] - s[self.kind]

    def op_insert(self):
        r = self.rng
        # Repeat a cached sequence now and then (Mamba: the tree keeps its state and
        # frees the request's fork; SWA: the overlap walk over its windows).
        s = r.choice(self.seqs) if self.seqs and r.random() < 0.15 else self.seq()
        n = len(s) - len(s) % self.ps
        if n == 0:
            return
        prev = 0
        rid = None
        if r.random() < 0.7:
            match = {"op": "match", "tokens": s}
            if self.kind == "mamba" and r.random() < 0.5:
                # admission: the request copies the matched state into its own slot
                rid = match["cow"] = f"r{self.next_req}"
                self.next_req += 1
            rec = self.emit(match)
            prev = rec["device_len"] if rec else 0
            if rec and rec.get("cow"):
                self.held.add(rid)
            if r.random() < 0.2:
                prev = r.randint(0, prev // self.ps) * self.ps
        op = {"op": "insert", "tokens": s}
        if prev:
            op["prev"] = prev
            if self.wt and r.random() < 0.4:
                # A running request's next checkpoint: it inserted its prefix before
                # (InsertParams.inserted_len), so write_through does not recount it.
                op["inserted"] = prev if r.random() < 0.7 else r.randint(0, prev // self.ps) * self.ps
        need_aux = 1
        if rid in self.held and r.random() < 0.6:
            op["donate"] = rid  # a finished request hands the tree its own state
            need_aux = 0
        if self.kind == "swa":
            ev = 0
            if r.random() < 0.6 and n > self.window:
                ev = r.randint(0, (n - 1) // self.ps) * self.ps
            if ev:
                op["swa_evicted"] = ev
            need_aux = max(0, n - max(prev, ev))
        full_free, aux_free = self.free()
        need_full = n - prev
        ev_op = {"op": "evict_for_alloc" if r.random() < 0.5 else "evict"}
        if need_full > full_free:
            ev_op["full"] = need_full - full_free + r.randint(0, 4) * self.ps
        if need_aux > aux_free:
            ev_op[self.kind] = need_aux - aux_free + (r.randint(0, 3) if self.kind == "swa" else 0)
        if len(ev_op) > 1:
            self.emit(ev_op)
        if self.emit(op) is not None:
            self.held.discard(op.get("donate"))
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
        op = {"op": "lock", "tokens": s, "id": lid}
        if self.kind == "mamba" and self.rng.random() < 0.3:
            op["skip"] = ["mamba"]  # the decode hold that leaves the state evictable
        if self.emit(op) is not None:
            self.locks[lid] = False

    def op_release(self):
        if self.held:
            rid = self.rng.choice(sorted(self.held))
            if self.emit({"op": "release", "id": rid}) is not None:
                self.held.discard(rid)

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
        op = {"op": "evict_for_alloc" if r.random() < 0.3 else "evict"}
        if r.random() < 0.5:
            op["full"] = r.randint(1, 4 * self.max_len // 3)
        if r.random() < 0.7 or len(op) == 1:
            op[self.kind] = (r.randint(1, 2 * self.window) if self.kind == "swa"
                             else r.randint(1, 3))
        self.emit(op)

    def op_evict_host(self):
        r = self.rng
        if r.random() < 0.6:
            op = {"op": "evict_host", "full": r.randint(1, 2 * self.max_len)}
        elif self.kind == "swa":
            op = {"op": "evict_host", "swa": r.randint(1, 2 * self.window)}
        else:
            op = {"op": "evict_host", "mamba": r.randint(1, 3)}
        self.emit(op)

    def op_load_back(self):
        r = self.rng
        if len(self.loads) >= 3 or (self.loads and r.random() < 0.4):
            return self.op_load_back_ack()
        lid = self.next_load
        self.next_load += 1
        s = r.choice(self.seqs) if self.seqs and r.random() < 0.85 else self.seq()
        op = {"op": "load_back", "tokens": s, "id": lid}
        if self.kind == "mamba" and r.random() < 0.5:
            if self.held and r.random() < 0.3:
                op["req"] = r.choice(sorted(self.held))
            else:
                op["req"] = f"r{self.next_req}"
                self.next_req += 1
        rec = self.emit(op)
        if rec is not None and rec.get("started"):
            self.loads.add(lid)
            if "req" in op and self.oracle.summary().get("mamba_held", 0) > len(self.held):
                self.held.add(op["req"])

    def op_load_back_ack(self):
        if self.loads:
            lid = self.rng.choice(sorted(self.loads))
            if self.emit({"op": "load_back_ack", "id": lid}) is not None:
                self.loads.discard(lid)

    def op_write_ack(self):
        """Ack one to three write_through backups, mostly the oldest first (SGLang's
        ``writing_check`` pops its ack queue in order), now and then any."""
        ids = self.oracle.write_ids()
        for _ in range(self.rng.randint(1, 3)):
            if not ids:
                return
            ack = ids.pop(0 if self.rng.random() < 0.8 else self.rng.randrange(len(ids)))
            self.emit({"op": "write_ack", "id": ack})

    def run(self, n_ops: int):
        mamba = self.kind == "mamba"
        host = 1 if self.hicache else 0
        wt = 1 if self.wt else 0
        mix = [("insert", 40), ("match", 20), ("lock", 9), ("unlock", 7), ("evict", 16),
               ("release_swa", 0 if mamba else 5), ("release", 3 if mamba else 0), ("dump", 3),
               ("evict_host", 6 * host), ("load_back", 10 * host), ("write_ack", 12 * wt)]
        names = [m for m, _ in mix]
        weights = [w for _, w in mix]
        while len(self.ops) < n_ops:
            m = self.rng.choices(names, weights)[0]
            if m == "dump":
                self.emit({"op": "dump"})
            else:
                getattr(self, f"op_{m}")()
        if self.wt:
            for ack in self.oracle.write_ids():
                self.emit({"op": "write_ack", "id": ack})
        for lid in sorted(self.loads):
            self.emit({"op": "load_back_ack", "id": lid})
        self.loads.clear()
        for lid in sorted(self.locks):  # leave the tree unlocked, then dump it
            self.emit({"op": "unlock", "id": lid})
        self.locks.clear()
        for rid in sorted(self.held):
            self.emit({"op": "release", "id": rid})
        self.held.clear()
        self.emit({"op": "dump"})
