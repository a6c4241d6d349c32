#!/usr/bin/env python3
"""SGLang's real tree, driven through the tree-visible ops of buffer_only host memory
mode (docs/OPTRACE.md §15).

Usage (in the oracle venv):

    $SGLANG_ORACLE_VENV/bin/python tools/sglang_oracle/oracle_buffer.py TRACE.jsonl \
        [-o OUT.jsonl] [--check] [--batch TSV]

It extends ``oracle_v2.py`` without copying it. A header with ``"host_memory_mode":
"buffer_only"`` calls the core's own ``set_host_memory_buffer_only()`` (as
``UnifiedRadixCache.init_hicache`` does, mem_cache/unified_radix_cache.py), and the
cache-side steps of ``mem_cache/buffer_mode/pipeline.py`` (``BufferModePipeline``)
that touch the tree run on SGLang's ``UnifiedTreeCore``:

* the insert walk's ``BackupKV`` actions go to ``enqueue_backup_intent``
  (``_execute_and_commit_kv_backup``'s buffer branch): no tree state, so nothing runs;
  a split's ``UpdatePendingBackupOnNodeSplit`` carries no ack id in buffer mode
  (``_split_node``): nothing runs either;
* ``buffer_stage {tokens}``: ``_stage_backup_intent``: ``inc_lock_ref`` on the node
  whose path is ``tokens`` (the D2H source stays locked until its ack);
* ``write_ack {id}``: ``finish_backup_ack``: ``dec_lock_ref`` of that lock (the core's
  ``finish_write_through`` is not called in buffer mode: nothing is host-backed);
* ``pin {tokens, id}`` / ``unpin {id}``: ``try_lock_anchor`` -> ``inc_full_pin`` on
  the node whose path is ``tokens``, and ``release_anchor_lock`` -> ``dec_full_pin``.

Everything else (inserts, matches, locks, device evictions) is oracle_v2's. The
storage side (existence beliefs, the staging budget, the storage I/O) is not tree state
and is not driven here.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import oracle_v2 as v2  # noqa: E402  (puts the shared oracle on sys.path)
from oracle import BackupKV, OpError, UpdatePendingBackupOnNodeSplit  # noqa: E402

BUFFER_OPS = ("buffer_stage", "pin", "unpin")


class BufferOracle(v2.V2Oracle):
    def __init__(self, header: dict, reserved_mode: str = "tokens"):
        super().__init__(header, reserved_mode)
        self.buffer = header.get("host_memory_mode") == "buffer_only"
        if self.buffer:
            self.core.set_host_memory_buffer_only()
        self.staged: dict = {}  # D2H ack id (the node id) -> lock params
        self.pins: dict = {}    # pin id -> node id

    def _apply_actions(self, actions: list) -> None:
        if self.buffer:
            actions[:] = [a for a in actions
                          if not isinstance(a, BackupKV)
                          and not (isinstance(a, UpdatePendingBackupOnNodeSplit)
                                   and a.ack_id is None)]
        super()._apply_actions(actions)

    def _node_at(self, tokens):
        """The node whose path is exactly ``tokens`` (a read)."""
        core = self.core
        for node in core._node_arena.values():
            if node is not core.root_node and core.path(node) == list(tokens):
                return node
        raise OpError("unknown_node")

    def op_buffer_stage(self, tokens):
        if not self.buffer:
            raise OpError("not_buffer_only")
        node = self._node_at(tokens)
        if node.evicted or node.id in self.staged:
            raise OpError("bad_buffer_stage")
        self.staged[node.id] = self.core.inc_lock_ref(node.id).to_dec_params()
        return {"node": node.id}

    def op_write_ack(self, ack_id):
        if not self.buffer:
            return super().op_write_ack(ack_id)
        if ack_id not in self.staged:
            raise OpError("unknown_write_id")
        self.core.dec_lock_ref(ack_id, self.staged.pop(ack_id))
        return {}

    def op_pin(self, tokens, pid):
        if pid in self.pins:
            raise OpError("duplicate_pin_id")
        node = self._node_at(tokens)
        if node.evicted:
            raise OpError("bad_pin")
        self.core.inc_full_pin(node.id)
        self.pins[pid] = node.id
        return {"node": node.id}

    def op_unpin(self, pid):
        if pid not in self.pins:
            raise OpError("unknown_pin_id")
        self.core.dec_full_pin(self.pins.pop(pid))
        return {}

    def apply(self, op: dict) -> dict:
        name = op["op"]
        if name not in BUFFER_OPS:
            return super().apply(op)
        self._priority = 0
        calls = {
            "buffer_stage": lambda: self.op_buffer_stage(op["tokens"]),
            "pin": lambda: self.op_pin(op["tokens"], op["id"]),
            "unpin": lambda: self.op_unpin(op["id"]),
        }
        return self.run_op(name, calls[name])


def main():
    v2.main(BufferOracle, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
