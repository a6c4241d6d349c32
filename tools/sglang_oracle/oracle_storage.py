#!/usr/bin/env python3
"""SGLang's real tree, driven through the storage (L3) ops of op-trace v2
(docs/OPTRACE.md §14).

Usage (in the oracle venv):

    $SGLANG_ORACLE_VENV/bin/python tools/sglang_oracle/oracle_storage.py TRACE.jsonl \
        [-o OUT.jsonl] [--check] [--batch TSV]

It extends ``oracle_v2.py`` (and through it the read-only shared oracle) without
copying it. Every storage op runs the steps ``UnifiedRadixCache`` (0.5.23,
mem_cache/unified_radix_cache.py) runs around SGLang's own ``UnifiedTreeCore`` in
cache mode, with the storage backend and its threads left out (the trace says what
storage answered):

* ``prefetch {tokens, id}``: ``Scheduler._prefetch_kvcache``: ``match_prefix``; the
  anchor is the match's ``last_host_node``; only a root or backed-up anchor prefetches;
  ``prefetch_from_storage``: the key after the matched prefix, page-aligned; declined
  below ``prefetch_threshold`` or when ``prefetch_tokens_occupied`` reached
  ``prefetch_capacity_limit = int(0.5 * host size)``; else ``inc_host_lock_ref(anchor)``.
* ``prefetch_hit {id, n}``: ``_drain_and_alloc_storage_hit`` for the rank-agreed hit
  ``n``: below the threshold, ``revoke_pending_prefetch``; else
  ``HybridCacheController.allocate_storage_hit(allow_partial=True,
  min_tokens=prefetch_threshold, evict_host=UnifiedRadixCache.evict_host)`` on the
  host pool (the fake pool of the shared oracle), or revoke (``host_capacity``).
* ``prefetch_done {id, n}``: ``_handle_prefetch_result`` with ``completed_tokens = n``:
  ``tree_core.insert_host(anchor, key[:n], host_indices[:n], hashes)``, its cache
  actions, ``commit_hicache_transfers(PREFETCH)``, ``mem_pool_host.free`` of the first
  ``prefix_len`` slots (all ``n`` if dropped), ``dec_host_lock_ref(anchor)``; the
  staged tail past ``n`` is released at once.
* ``prefetch_revoke {id}``: ``revoke_pending_prefetch`` / ``_retire_ongoing_prefetch``.
* ``storage_write {node, id}`` / ``storage_write_ack {id}``: ``write_backup_storage``
  (``build_storage_backup_spec``; ``inc_host_lock_ref`` until the storage ack) and
  ``_drain_backup`` (``dec_host_lock_ref``).
* header ``"storage_writes": "auto"``: ``_finish_write_through_ack`` as SGLang runs it
  with storage on: after ``finish_write_through`` and the lock release, every
  published node is written (``write_backup_storage``) under the next free id
  ``s1``, ``s2``, ...; the op that acked lists them in ``storage_writes``.

Events: ``refill`` (write_through: a device-only node walked takes the fetched host
copy) and ``host_new`` (the new host-only leaf), both seen through the core's own
``kv_events.record_store(node, medium=CPU)`` calls inside ``insert_host``, plus the
shared oracle's ``split``. ``host`` in the common fields counts the tree's host
slots only; the staged slots are ``held``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import oracle_v2 as v2  # noqa: E402  (puts the shared oracle on sys.path)
from oracle import FULL, OpError, RadixKey, array  # noqa: E402
from sglang.srt.mem_cache.unified_cache.unified_tree_core import (  # noqa: E402
    CacheTransferPhase,
)

STORAGE_OPS = ("prefetch", "prefetch_hit", "prefetch_done", "prefetch_revoke",
               "storage_write", "storage_write_ack")


class _HostView:
    """The host pool as the shared check sees the tree's share of it: staged
    prefetch slots are held outside the tree."""

    def __init__(self, pool, staged):
        self._pool, self._staged = pool, staged

    @property
    def used(self):
        return self._pool.used - self._staged()

    def __getattr__(self, name):
        return getattr(self._pool, name)


class StorageOracle(v2.V2Oracle):
    def __init__(self, header: dict, reserved_mode: str = "tokens"):
        super().__init__(header, reserved_mode)
        self.threshold = int(header.get("prefetch_threshold", 256))
        # cache_controller.attach_storage_backend (cache mode).
        self.capacity_limit = int(0.5 * self.host.capacity)
        self.occupied = 0
        self.prefetches: dict = {}  # id -> [anchor id, lock params, key, requested, staged]
        self.swrites: dict = {}     # id -> (node id, lock params)
        # "storage_writes": "auto": _finish_write_through_ack's write_backup_storage.
        self.auto = header.get("storage_writes") == "auto"
        self._n_auto = 0
        self._auto_out: list = []

    # -- D->H acks (UnifiedRadixCache._finish_write_through_ack)
    def _ack(self, ack_id) -> None:
        """finish_write_through on the published ids, dec_lock_ref of the backup's
        lock, then (storage on) write_backup_storage of every published node."""
        node_id, lock, ids = self.writes.pop(ack_id)
        self.core.finish_write_through(ids, ack_id)
        if lock is not None:
            self.core.dec_lock_ref(node_id, lock)
        if self.auto:
            for nid in ids:
                self._write_backup_storage(nid)

    def _write_backup_storage(self, node_id) -> None:
        core = self.core
        if core.is_root(node_id) or core.build_storage_backup_spec(node_id, False) is None:
            return
        n = self._n_auto + 1
        while f"s{n}" in self.swrites:
            n += 1
        self._n_auto = n
        self.swrites[f"s{n}"] = (node_id, core.inc_host_lock_ref(node_id).to_dec_params())
        self._auto_out.append(f"s{n}")

    def _finish_writes(self) -> None:
        """oracle_v2's acks (all at the end of an op under end_of_op; else only
        write_back's lockless eviction backups), each through ``_ack``."""
        if self.write_acks == "end_of_op":
            while self.writes:
                self._ack(next(iter(self.writes)))
            return
        for ack_id in [a for a, (_, lock, _) in self.writes.items() if lock is None]:
            self._ack(ack_id)

    def op_write_ack(self, ack_id):
        """The ack's storage writes are its own fields: the shared
        ``ExtOracle.apply_ext`` answers ``write_ack`` itself, never through ``apply``,
        so ``apply``'s splice would not see them."""
        if self.write_acks != "op" or ack_id not in self.writes:
            raise OpError("unknown_write_id")
        self._ack(ack_id)
        written, self._auto_out = self._auto_out, []
        return {"storage_writes": written} if written else {}

    # -- helpers
    def _staged_total(self) -> int:
        return sum(len(p[4]) for p in self.prefetches.values() if p[4] is not None)

    def summary(self) -> dict:
        out = super().summary()
        out["host"] -= self._staged_total()
        return out

    def _retire(self, pid) -> None:
        anchor, lock, _key, requested, staged = self.prefetches.pop(pid)
        if staged is not None:
            self.host.free(staged)
        self.core.dec_host_lock_ref(anchor, lock)
        self.occupied -= requested

    def _get(self, pid):
        if pid not in self.prefetches:
            raise OpError("unknown_prefetch_id")
        return self.prefetches[pid]

    # -- ops
    def op_prefetch(self, tokens, pid):
        if pid in self.prefetches:
            raise OpError("duplicate_prefetch_id")
        core = self.core
        r = self._match(tokens)
        anchor = r.last_host_node
        anchor_id = anchor.id if hasattr(anchor, "id") else anchor
        node = core.node_by_id(anchor_id)
        out = {"device_len": r.device_prefix_len, "host_len": r.host_hit_length,
               "anchor": anchor_id}
        # Scheduler._prefetch_kvcache: is_backuped(last_host_node) or is_root(...).
        if not (core.is_root(anchor_id) or core.is_backuped(anchor_id)):
            out.update(requested=0, issued=False, reason="anchor_not_backed")
            return out
        matched = r.device_prefix_len + r.host_hit_length
        key = RadixKey(array("q", tokens[matched:])).page_aligned(self.page_size)
        requested = len(key)
        out["requested"] = requested
        if requested < self.threshold:
            out.update(issued=False, reason="empty" if requested == 0 else "too_short")
            return out
        if self.occupied >= self.capacity_limit:
            out.update(issued=False, reason="rate_limited")
            return out
        lock = core.inc_host_lock_ref(anchor_id).to_dec_params()
        self.prefetches[pid] = [anchor_id, lock, key, requested, None]
        self.occupied += requested
        del node
        out["issued"] = True
        return out

    def op_prefetch_hit(self, pid, n):
        p = self._get(pid)
        if p[4] is not None:
            raise OpError("prefetch_already_staged")
        if n < 0 or n % self.page_size or n > p[3]:
            raise OpError("bad_hit")
        out = {"staged": 0, "freed": 0}
        reason = "below_threshold" if n < self.threshold else None
        if reason is None:
            # HybridCacheController.allocate_storage_hit, non-shared host layout.
            host_indices = self.host.alloc(n)
            if host_indices is None:
                out["freed"] += self.evict_host_tokens(n)
                host_indices = self.host.alloc(n)
            if host_indices is None:
                available = self.host.free_slots
                alloc_len = min(n, available - available % self.page_size)
                if alloc_len >= self.threshold:
                    host_indices = self.host.alloc(alloc_len)
            if host_indices is None:
                reason = "host_capacity"
            else:
                p[4] = host_indices
                out["staged"] = len(host_indices)
        if reason is not None:
            self._retire(pid)
            out["reason"] = reason
        out["held"] = self._staged_total()
        return out

    def op_prefetch_done(self, pid, n):
        p = self._get(pid)
        anchor, lock, key, requested, host_indices = p
        if host_indices is None:
            raise OpError("prefetch_not_staged")
        if n < 0 or n % self.page_size or n > len(host_indices):
            raise OpError("bad_done")
        core = self.core
        events = core.events
        before = set(core._node_arena)
        split_ids = set()
        real_split = core._split_node

        def split(*a, **kw):
            new_node, action = real_split(*a, **kw)
            split_ids.add(new_node.id)
            return new_node, action

        recorder = core.kv_events
        real_store = recorder.record_store

        def record_store(node, *a, **kw):
            kind = "refill" if (node.id in before or node.id in split_ids) else "host_new"
            events.append({"k": kind, "id": node.id, "path": core.path(node),
                           "n": len(node.component_data[FULL].host_value)})
            return real_store(node, *a, **kw)

        core._split_node = split
        recorder.record_store = record_store
        try:
            hashes = [f"h{i}" for i in range(n // self.page_size)]
            res = core.insert_host(anchor, key[:n], host_indices[:n], hashes)
        finally:
            del core._split_node
            del recorder.record_store
        self._apply_actions(res.cache_actions)
        if res.host_insert_dropped:
            self.host.free(host_indices[:n])
            loaded = 0
        else:
            commit_actions = []
            core.commit_hicache_transfers(anchor, CacheTransferPhase.PREFETCH, {},
                                          cache_actions=commit_actions, insert_result=res,
                                          pool_storage_result=None)
            self._apply_actions(commit_actions)
            self.host.free(host_indices[:res.prefix_len])
            loaded = n - res.prefix_len
        if n < len(host_indices):
            self.host.free(host_indices[n:])
        core.dec_host_lock_ref(anchor, lock)
        del self.prefetches[pid]
        self.occupied -= requested
        return {"prefix_len": res.prefix_len, "loaded": loaded,
                "node": res.inserted_host_node, "dropped": bool(res.host_insert_dropped),
                "held": self._staged_total()}

    def op_prefetch_revoke(self, pid):
        self._get(pid)
        self._retire(pid)
        return {"held": self._staged_total()}

    def op_storage_write(self, node_id, wid):
        if wid in self.swrites:
            raise OpError("duplicate_storage_write_id")
        core = self.core
        if node_id not in core._node_arena:
            raise OpError("unknown_node")
        spec = (None if core.is_root(node_id)
                else core.build_storage_backup_spec(node_id, False))
        if spec is None:
            return {"written": False}
        self.swrites[wid] = (node_id, core.inc_host_lock_ref(node_id).to_dec_params())
        return {"written": True}

    def op_storage_write_ack(self, wid):
        if wid not in self.swrites:
            raise OpError("unknown_storage_write_id")
        node_id, lock = self.swrites.pop(wid)
        self.core.dec_host_lock_ref(node_id, lock)
        return {}

    # -- driver
    def apply(self, op: dict) -> dict:
        """The op, with the storage writes its acks issued listed before its events
        (an explicit ``write_ack`` lists its own in ``op_write_ack``)."""
        self._auto_out = []
        out = self._apply(op)
        written, self._auto_out = self._auto_out, []
        if written and "error" not in out:
            keys = list(out)
            at = keys.index("events")
            out = {**{k: out[k] for k in keys[:at]}, "storage_writes": written,
                   **{k: out[k] for k in keys[at:]}}
        return out

    def _apply(self, op: dict) -> dict:
        name = op["op"]
        if name not in STORAGE_OPS:
            return super().apply(op)
        self._priority = 0
        calls = {
            "prefetch": lambda: self.op_prefetch(op["tokens"], op["id"]),
            "prefetch_hit": lambda: self.op_prefetch_hit(op["id"], int(op["n"])),
            "prefetch_done": lambda: self.op_prefetch_done(op["id"], int(op["n"])),
            "prefetch_revoke": lambda: self.op_prefetch_revoke(op["id"]),
            "storage_write": lambda: self.op_storage_write(int(op["node"]), op["id"]),
            "storage_write_ack": lambda: self.op_storage_write_ack(op["id"]),
        }
        return self.run_op(name, calls[name])

    def check(self) -> None:
        """The v2 check, with the pool accounting on the tree's share of the host
        pool and every prefetch anchor's host lock expected."""
        real = self.host
        self.host = _HostView(real, self._staged_total)
        try:
            super().check()
        finally:
            self.host = real


def main():
    v2.main(StorageOracle, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
