#!/usr/bin/env python3
"""SGLang's real tree, driven through op-trace v2 (docs/OPTRACE.md).

Usage (in the oracle venv, see ../../Makefile's conformance-sglang):

    $SGLANG_ORACLE_VENV/bin/python tools/sglang_oracle/oracle_v2.py TRACE.jsonl \
        [-o OUT.jsonl] [--check]

This extends the shared oracle without copying it: ``oracle.py`` drives SGLang
0.5.23's own ``UnifiedTreeCore`` and ``oracle_ext.py`` adds the engine's v1
extensions (``reserved``, ``skip_ids``, ``ids: sglang``, ``host_policy``,
``eviction_policy``, ``host_alloc_failures``). Both are imported from the folder
named by ``$HICACHE_SGLANG_ORACLE`` (default: ``../shared/oracle`` beside the
repository), as ``oracle_ext.py`` imports ``oracle.py``. What v2 adds here:

* ``"version": 2`` with ``"write_acks": "op"`` (the v2 default): a write_through
  backup stays in flight (node write-pending, device path locked) until the trace's
  ``write_ack {id}`` op, which runs SGLang's own
  ``UnifiedRadixCache._finish_write_through_ack`` steps: ``finish_write_through``
  on the published node ids, then ``dec_lock_ref`` of the backup's lock
  (unified_radix_cache.py). write_back's eviction backups stay synchronous, as
  ``writing_check(write_back=True)`` blocks on them. ``"write_acks": "end_of_op"``
  keeps v1's end-of-op acks.
* ``ids: server``: a real server's numbering. ``UnifiedRadixCache.__init__`` calls
  ``reset()`` again after the core's constructor did, so the core is reset a second
  time here too: root 5, sentinels 6-9, first node 10.
* ``reserved`` that does not fit beside the tree is the error ``reserved_overflow``
  (the shared oracle_ext adds the sizes to the code; v2 fixes the code alone).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# The shared oracle's folder: an env var, else ../shared/oracle beside the repository.
ORACLE_ENV = "HICACHE_SGLANG_ORACLE"
REPO = Path(__file__).resolve().parents[2]
ORACLE_DIR = Path(os.environ.get(ORACLE_ENV) or REPO.parent / "shared" / "oracle")
if not (ORACLE_DIR / "oracle_ext.py").is_file():
    raise SystemExit(f"{ORACLE_DIR}: found no oracle_ext.py; expected the shared oracle's "
                     f"folder (set ${ORACLE_ENV})")
sys.path.insert(0, str(ORACLE_DIR))

import oracle as base  # noqa: E402
import oracle_ext as ext  # noqa: E402
from oracle import OpError  # noqa: E402
from oracle_ext import ExtOracle  # noqa: E402
from write_acks import ExplicitAcks  # noqa: E402
from oracle import InsertParams, torch  # noqa: E402
from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeNode  # noqa: E402

SERVER_ROOT_ID = 5
SERVER_FIRST_ID = 10


def build_core_server(page_size: int, write_back: bool, eviction_policy: str):
    """The core as a fresh 0.5.23 server holds it: built (root 0, sentinels 1-4),
    then reset once more by UnifiedRadixCache.__init__ (``reset`` -> ``_reset_full``
    -> ``tree_core.reset()``)."""
    core = ext.build_core_ext(page_size, write_back, "sglang", eviction_policy)
    core.reset()
    assert core.root_node.id == SERVER_ROOT_ID, core.root_node.id
    assert UnifiedTreeNode.counter == SERVER_FIRST_ID, UnifiedTreeNode.counter
    return core


class V2Oracle(ExplicitAcks, ExtOracle):
    def __init__(self, header: dict, reserved_mode: str = "tokens"):
        self.version = int(header.get("version", 1))
        if self.version not in (1, 2):
            raise ValueError(f"unsupported version {self.version!r}")
        self.write_acks = header.get("write_acks", "op" if self.version >= 2 else "end_of_op")
        if self.write_acks not in ("op", "end_of_op"):
            raise ValueError(f"unsupported write_acks {self.write_acks!r}")
        self.explicit_acks = self.write_acks == "op"
        if header.get("ids") == "server":
            ev = header.get("eviction_policy", "lru")
            orig = base.build_core
            base.build_core = lambda ps, wb: build_core_server(ps, wb, ev)
            try:
                # ExtOracle would install its own builder for a non-default scheme;
                # hand it the default so that ours is the one that runs.
                super().__init__({**header, "ids": "optrace", "eviction_policy": "lru"},
                                 reserved_mode)
            finally:
                base.build_core = orig
        else:
            super().__init__(header, reserved_mode)

    def _finish_writes(self) -> None:
        """Acks at the end of an op. Under explicit acks only write_back's eviction
        backups (no lock: ``_backup(write_back=True)``) are acked here, as SGLang's
        blocking ``writing_check(write_back=True)`` does; write_through writes wait
        for their ``write_ack`` op."""
        if self.write_acks == "end_of_op":
            super()._finish_writes()
            return
        self._finish_unlocked_writes()

    def op_insert(self, tokens):
        """The shared oracle's insert, with the v2 ``priority`` field passed to SGLang
        as `InsertParams.priority` (checkpoint_into_tree's prompt re-insert), and
        ``inserted`` as `InsertParams.inserted_len` (the request's cache_inserted_len:
        nodes ending at or below it count no write_through hit)."""
        key = self.key(tokens)
        prefix = self._device_prefix(key)
        need = len(key) - len(prefix)
        if need > self.dev.free_slots:
            raise OpError("device_full")
        fresh = self.dev.alloc(need)
        params = InsertParams(key=key, value=torch.cat([prefix, fresh]),
                              prev_prefix_len=len(prefix), priority=self._priority,
                              inserted_len=self._inserted)
        step = self.core.begin_insert(params)
        while True:
            self._apply_actions(step.actions)
            if step.result is not None:
                break
            step = self.core.resume_insert()
        self._apply_actions(self.core.end_insert())
        self._finish_writes()
        return {"prefix_len": step.result.prefix_len, "new": need}

    def apply(self, op: dict) -> dict:
        self._priority = int(op.get("priority", 0))
        self._inserted = int(op.get("inserted", 0))
        if op["op"] != "write_ack":
            return super().apply(op)
        return self.run_op("write_ack", lambda: self.op_write_ack(op["id"]))

    def run_op(self, name: str, call) -> dict:
        """One op of an extension's own (``call`` returns its fields): its output line,
        the error an ``OpError`` names, then the events and the pools, as the shared
        ops write them."""
        self.core.events = []
        self.core._expected_removals.clear()
        try:
            out = {"op": name, **call()}
        except OpError as e:
            out = {"op": name, "error": str(e)}
        out["events"] = self.core.events
        out.update(self.summary())
        return out

    def check(self) -> None:
        """The shared check, with the write_through acks still in flight handed to
        SGLang's ``sanity_check`` as its ``ongoing_write_through`` (ack id, node id)
        pairs, as UnifiedRadixCache.sanity_check passes them."""
        core = self.core
        ongoing = [(ack, node_id) for ack, (node_id, _, _) in self.writes.items()]
        real = core.sanity_check
        core.sanity_check = lambda _wt, lb: real(ongoing, lb)
        try:
            super().check()
        finally:
            del core.sanity_check

    def apply_ext(self, i: int, op: dict) -> dict:
        out = super().apply_ext(i, op)
        if out.get("error", "").startswith("reserved_overflow"):
            out["error"] = "reserved_overflow"
        return out


def replay(lines, out, check=False, reserved_mode="tokens", oracle_cls=None) -> int:
    """Replay trace lines, one output line per non-blank input line. Returns #errors.
    ``oracle_cls``: the oracle to build from the header (default ``V2Oracle``; the
    storage and other extensions pass their subclass)."""
    oracle, errors, idx = None, 0, 0
    for line in lines:
        line = line.strip()
        if not line:
            continue
        op = json.loads(line)
        if oracle is None:
            if op.get("op") != "header":
                raise SystemExit("trace must start with a header line")
            oracle = (oracle_cls or V2Oracle)(op, reserved_mode)
            rec = {"op": "header", "events": [], **oracle.summary()}
        elif getattr(oracle, "dead", False):
            # the Rust core panicked on an earlier op (oracle_rust_v2): nothing after it
            rec = {"op": op["op"], "error": "skipped_after_panic", "events": []}
        else:
            rec = oracle.apply_ext(idx, op)
            errors += "error" in rec
            if check:
                oracle.check()
        out.write(json.dumps({"i": idx, **rec}, separators=(",", ":")) + "\n")
        idx += 1
    return errors


def main(oracle_cls=None, description=None):
    """The command line: one trace, or ``--batch``, replayed on ``oracle_cls``."""
    ap = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?")
    ap.add_argument("-o", "--out")
    ap.add_argument("--batch", metavar="TSV",
                    help="replay each 'TRACE<TAB>OUT' line of TSV in this one process "
                         "(each trace builds a fresh core, which resets SGLang's counters)")
    ap.add_argument("--check", action="store_true",
                    help="run SGLang's sanity_check and pool accounting after every op")
    ap.add_argument("--reserved-mode", choices=("tokens", "pages", "ignore"), default="tokens",
                    help="tokens: hold exactly 'reserved' slots (the v2 contract); pages: round "
                         "up to whole pages, as a paged allocator would (a sensitivity probe)")
    args = ap.parse_args()
    if args.batch:
        with open(args.batch) as f:
            pairs = [line.rstrip("\n").split("\t") for line in f if line.strip()]
        for trace, out_path in pairs:
            with open(trace) as f, open(out_path, "w") as out:
                replay(f.readlines(), out, check=args.check, reserved_mode=args.reserved_mode,
                       oracle_cls=oracle_cls)
        return
    if not args.trace:
        ap.error("a TRACE or --batch is required")
    with open(args.trace) as f:
        lines = f.readlines()
    out = open(args.out, "w") if args.out else sys.stdout
    try:
        errors = replay(lines, out, check=args.check, reserved_mode=args.reserved_mode,
                        oracle_cls=oracle_cls)
    finally:
        if args.out:
            out.close()
    if errors:
        print(f"{errors} op(s) rejected (see 'error' fields)", file=sys.stderr)


if __name__ == "__main__":
    main()
