#!/usr/bin/env python3
"""SGLang's core (``oracle_hybrid.py``'s ``HostHybridOracle``) on a hybrid op-trace that
``hicache-sim run --record-ops`` wrote, (FULL, MAMBA) with the host tier: the ops the
engine adds to docs/HYBRID.md §6 (§10.5) done as SGLang's scheduler does them around
the cache.

Usage (in the oracle venv):

    $SGLANG_ORACLE_VENV/bin/python tools/sglang_oracle/oracle_hybrid_engine.py \
        ops/rank0.jsonl OUT.jsonl
    hicache-sim replay-ops ops/rank0.jsonl -o SIM.jsonl && cmp SIM.jsonl OUT.jsonl

* ``reserved``: the FULL KV running requests hold outside the tree, taken from the
  FULL pool (page by page) before the op and returned as it shrinks; ``dev`` in the
  output is the tree's own, as the sim's replay reports it.
* ``skip_ids {n}``: ``n`` node ids drawn before the next node (``UnifiedTreeNode``'s
  counter), as the engine's ``cache.ids: sglang`` numbering does.
* ``alloc {id}``: ``alloc_req_slots`` gives the request a fresh Mamba slot.
* ``lock`` with ``exact``: ``inc_lock_ref`` on the node whose path is exactly the
  tokens (an insert's target, a load-back's anchor); with ``cow``: the match's copy on
  write (``op_match``), then ``inc_lock_ref`` on its ``last_device_node``.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_hybrid import HostHybridOracle, OpError, UnifiedTreeNode  # noqa: E402


class EngineOracle(HostHybridOracle):
    """``HostHybridOracle`` with the engine's ops."""

    def __init__(self, header):
        super().__init__(header)
        self._res = []  # FULL pages the running requests hold (the op's ``reserved``)

    def apply(self, op):
        want = int(op.get("reserved", 0)) // self.ps
        pool = self.alloc.full
        if want > len(self._res):
            self._res.extend(pool.alloc_pages(want - len(self._res)))
        while len(self._res) > want:
            pool.free_page(self._res.pop())
        rec = super().apply(op)
        rec["dev"] -= len(self._res) * self.ps  # the tree's own (the pool less what requests hold)
        return rec

    def op_skip_ids(self, op):
        UnifiedTreeNode.counter += int(op["n"])
        return {}

    def op_alloc(self, op):
        # mem_cache/allocation.py alloc_req_slots -> ensure_mamba_capacity: a request
        # without a slot takes a fresh one (the engine evicts the shortfall first)
        rid = op["id"]
        if rid in self.held:
            raise OpError("duplicate_request")
        t = self.req_pool.mamba_allocator.alloc(1)
        if t is None:
            raise OpError("mamba_full")
        self.held[rid] = t.reshape(1)
        return {}

    def op_lock(self, op):
        lid = op["id"]
        if lid in self.locks:
            raise OpError("duplicate_lock_id")
        if op.get("exact"):
            key, node, got = self.key(op["tokens"]), self.core.root_node, 0
            while got < len(key):
                child = node.children.get(key[got:].child_key(self.ps))
                if child is None:
                    raise OpError("unknown_node")
                m = child.key.match(key[got:], page_size=self.ps)
                if m < len(child.key):
                    raise OpError("unknown_node")
                got += m
                node = child
            receipt = self.core.inc_lock_ref(node.id).to_dec_params()
            self.locks[lid] = [node.id, receipt, False]
            return {"node": node.id}
        if "cow" in op:
            out = self.op_match(op)
            node_id = out["dnode"]
            receipt = self.core.inc_lock_ref(node_id).to_dec_params()
            self.locks[lid] = [node_id, receipt, False]
            return out
        return super().op_lock(op)

    OPS = {**HostHybridOracle.OPS, "skip_ids": op_skip_ids, "alloc": op_alloc, "lock": op_lock}


def main(trace, out_path):
    lines = Path(trace).read_text().splitlines()
    orc, errors = None, 0
    with open(out_path, "w") as out:
        for i, line in enumerate(lines):
            op = json.loads(line)
            if orc is None:
                orc = EngineOracle(op)
                rec = {"op": "header", "events": [], **orc.summary()}
            else:
                rec = orc.apply(op)
                errors += "error" in rec
            out.write(json.dumps({"i": i, **rec}, separators=(",", ":")) + "\n")
    if errors:
        print(f"{errors} op(s) rejected (see 'error' fields)", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: oracle_hybrid_engine.py TRACE.jsonl OUT.jsonl")
    sys.exit(main(sys.argv[1], sys.argv[2]))
