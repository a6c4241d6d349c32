"""Explicit write_through acks (docs/OPTRACE.md §2), one piece for both oracles' v2
classes (``oracle_v2.V2Oracle`` on the Python core, ``oracle_rust_v2.RustV2Oracle``
on the Rust core): each keeps ``writes`` (ack id -> node id, lock or None, ids) and
says in ``explicit_acks`` whether write_through writes wait for their ``write_ack`` op."""

from __future__ import annotations

from oracle import OpError


class ExplicitAcks:
    def _finish_unlocked_writes(self) -> None:
        """The end of an op under explicit acks: only write_back's eviction backups (no
        lock: ``_backup(write_back=True)``) are acked, as SGLang's blocking
        ``writing_check(write_back=True)`` does; write_through writes wait."""
        for ack_id in [a for a, (_, lock, _) in self.writes.items() if lock is None]:
            _, _, ids = self.writes.pop(ack_id)
            self.core.finish_write_through(ids, ack_id)

    def op_write_ack(self, ack_id) -> dict:
        """UnifiedRadixCache._finish_write_through_ack for one agreed ack: publish,
        then drop the lock."""
        if not self.explicit_acks or ack_id not in self.writes:
            raise OpError("unknown_write_id")
        node_id, lock, ids = self.writes.pop(ack_id)
        self.core.finish_write_through(ids, ack_id)
        if lock is not None:
            self.core.dec_lock_ref(node_id, lock)
        return {}
