#!/usr/bin/env python3
"""SGLang 0.5.23's Rust tree core, driven through the engine's op-traces (v2).

Usage (in the oracle venv; `make conformance-sglang` runs it):

    $SGLANG_ORACLE_VENV/bin/python tools/sglang_oracle/oracle_rust_v2.py TRACE.jsonl \
        [-o OUT.jsonl] [--batch TSV]

This extends the shared Rust oracle (``$HICACHE_SGLANG_ORACLE/rust/oracle_rust.py``,
``RustOracle`` over ``RustUnifiedTreeCore``) without copying it. What the engine's
recordings need on top of it (docs/OPTRACE.md):

* ``ids``: ``rust`` / ``optrace`` (a bare core: root 0, first node 1) or
  ``rust_server``: the core reset once more, as ``UnifiedRadixCache.__init__`` ends
  with ``self.reset()`` (-> ``_reset_full`` -> ``tree_core.reset()``); Rust handles are
  never re-minted (``RustUnifiedTreeCore.reset``), so the root is 1 and the first
  node 2. The digest is the core's own, un-normalised.
* ``reserved`` (device slots held outside the tree), ``write_ack {id}`` under
  ``write_acks: "op"``, ``priority`` and ``inserted`` on insert, ``host_alloc_failures`` and
  ``host_policy: lru`` (SGLANG_HICACHE_SKIP_HOST_DUPLICATE_RECLAIM), as
  ``oracle_ext.py`` / ``oracle_v2.py`` add them for the Python core.
* ``skip_ids`` is refused: Rust handles are per core, so another node object in the
  process cannot move them.

The Rust API has no node objects, so some outputs are absent or partial (the shared
README's "Not observable" list); the conformance run compares the projection the
shared ``compare.py`` defines.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ORACLE_ENV = "HICACHE_SGLANG_ORACLE"
REPO = Path(__file__).resolve().parents[2]
ORACLE_DIR = Path(os.environ.get(ORACLE_ENV) or REPO.parent / "shared" / "oracle")
RUST_DIR = ORACLE_DIR / "rust"
if not (RUST_DIR / "oracle_rust.py").is_file():
    raise SystemExit(f"{RUST_DIR}: found no oracle_rust.py; expected the shared oracle's "
                     f"folder (set ${ORACLE_ENV})")
sys.path.insert(0, str(ORACLE_DIR))
sys.path.insert(0, str(RUST_DIR))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import oracle_rust as R  # noqa: E402
from oracle import InsertParams, OpError, torch  # noqa: E402
from write_acks import ExplicitAcks  # noqa: E402

RUST_SERVER_ROOT = 1
ID_SCHEMES = ("optrace", "rust", "rust_server")


def _fold(t: int) -> int:
    return 2 * t if t >= 0 else -2 * t - 1


def _unfold(t: int) -> int:
    return t // 2 if t % 2 == 0 else -(t + 1) // 2


class RustV2Oracle(ExplicitAcks, R.RustOracle):
    def __init__(self, header: dict, reserved_mode: str = "tokens"):
        ids = header.get("ids", "optrace")
        if ids not in ID_SCHEMES:
            raise ValueError(f"ids {ids!r}: the Rust core numbers as one of {ID_SCHEMES}")
        if header.get("eviction_policy", "lru") != "lru":
            raise ValueError("the Rust oracle builds an lru core only")
        hp = header.get("host_policy", "duplicate_first")
        if hp == "duplicate_first":
            os.environ.pop("SGLANG_HICACHE_SKIP_HOST_DUPLICATE_RECLAIM", None)
        elif hp == "lru":
            os.environ["SGLANG_HICACHE_SKIP_HOST_DUPLICATE_RECLAIM"] = "1"
        else:
            raise ValueError(f"host_policy {hp!r} has no SGLang equivalent")
        if header.get("prefetch_threshold") is not None or header.get("components"):
            raise ValueError("storage and hybrid traces are not played on the Rust core")
        super().__init__(header)
        self.root_id = 0
        if ids == "rust_server":
            self.core.reset()
            self.root_id = self.core.root_node_handle(None)
            assert self.root_id == RUST_SERVER_ROOT, self.root_id
            self.next_id = self.root_id + 1
        self.version = int(header.get("version", 1))
        self.explicit_acks = self.version == 2 and header.get("write_acks", "op") == "op"
        self.reserved_mode = reserved_mode
        self._reserved: list = []
        self.reserved = 0
        self._priority = self._inserted = 0
        self._fails = {(int(i), int(a)) for i, a in header.get("host_alloc_failures", ())}
        self._op_index = self._attempt = 0
        if self._fails:
            real_alloc = self.host.alloc

            def alloc(n):
                a = self._attempt
                self._attempt += 1
                if (self._op_index, a) in self._fails:
                    return None
                return real_alloc(n)
            self.host.alloc = alloc

    # -- the root is not always 0 -------------------------------------------------
    def _learn_paths(self, key_tokens, deep_id):
        if deep_id == self.root_id:
            return []
        return super()._learn_paths(key_tokens, deep_id)

    def _device_prefix(self, key):
        m, node, _ = self.core.match_full_device_prefix(key)
        if m == 0:
            return torch.empty((0,), dtype=torch.int64)
        return self.core.collect_full_device_indices(node, self.root_id)[:m]

    def op_dump(self):
        S = self.snap()
        kids = {}
        for nid, v in S.items():
            kids.setdefault(v[0], []).append(nid)
        tree, stack = [], [self.root_id]
        while stack:
            nid = stack.pop()
            if nid != self.root_id:
                par, s, e, dv, nc, host = S[nid]
                p = self.paths.get(nid)
                tree.append({"id": nid, "parent": par, "start": s,
                             "key": list(p[s:e]) if p is not None else None,
                             "dev": dv is not None, "host": bool(host)})
            ch = sorted(kids.get(nid, []),
                        key=lambda c: list(self.paths.get(c, ()))[S[c][1]:S[c][2]])
            stack.extend(reversed(ch))
        return {"tree": tree, "partial": True}

    # -- reserved: device slots held outside the tree (docs/OPTRACE.md §3) ---------
    def _set_reserved(self, want: int) -> None:
        if want > self.reserved:
            t = self.dev.alloc(want - self.reserved)
            if t is None:
                raise OpError("reserved_overflow")
            self._reserved.append(t)
        elif want < self.reserved:
            drop = self.reserved - want
            while drop:
                t = self._reserved.pop()
                if len(t) <= drop:
                    self.dev.free(t)
                    drop -= len(t)
                else:
                    self.dev.free(t[len(t) - drop:])
                    self._reserved.append(t[: len(t) - drop])
                    drop = 0
        self.reserved = want

    def summary(self) -> dict:
        s = super().summary()
        s["dev"] = self.dev.used - self.reserved
        return s

    # -- write_through acks (docs/OPTRACE.md §2) -----------------------------------
    def _finish_writes(self) -> None:
        if not self.explicit_acks:
            return super()._finish_writes()
        self._finish_unlocked_writes()

    def op_insert(self, tokens):
        """The shared Rust insert, with v2's ``priority`` as InsertParams.priority and
        ``inserted`` as InsertParams.inserted_len (the request's cache_inserted_len)."""
        if not self._priority and not self._inserted:
            return super().op_insert(tokens)
        real = R.InsertParams

        def with_priority(**kw):
            return real(**kw, priority=self._priority, inserted_len=self._inserted)
        R.InsertParams = with_priority
        try:
            return super().op_insert(tokens)
        finally:
            R.InsertParams = real

    def apply_ext(self, i: int, op: dict) -> dict:
        """One op with the engine's token ids folded onto the non-negative ints the Rust
        core accepts (it panics on a negative id; SGLang's token ids are vocabulary
        ids), and unfolded in the output's paths and keys."""
        if "tokens" in op:
            op = {**op, "tokens": [_fold(t) for t in op["tokens"]]}
        out = self._apply_ext(i, op)
        for e in out.get("events", ()):
            if e.get("path") is not None:
                e["path"] = [_unfold(t) for t in e["path"]]
        for n in out.get("tree", ()):
            if n.get("key") is not None:
                n["key"] = [_unfold(t) for t in n["key"]]
        return out

    def _apply_ext(self, i: int, op: dict) -> dict:
        self._op_index, self._attempt = i, 0
        self._priority = int(op.get("priority", 0))
        self._inserted = int(op.get("inserted", 0))
        name = op["op"]
        try:
            self._set_reserved(int(op.get("reserved", 0)))
        except OpError as e:
            return {"op": name, "error": str(e), "events": [], **self.summary()}
        if name == "skip_ids":
            return {"op": name, "error": "skip_ids_on_rust_core", "events": [], **self.summary()}
        if name != "write_ack":
            return self.apply(op)
        self.events, self.notes = [], []
        try:
            out = {"op": name, **self.op_write_ack(int(op["id"]))}
        except OpError as e:
            out = {"op": name, "error": str(e)}
        out.update(self.summary())
        self._prune()
        out["events"] = self.events
        return out


def replay(lines, out) -> int:
    """oracle_v2's replay loop on the Rust core (a panic skips the rest of the trace)."""
    import oracle_v2

    return oracle_v2.replay(lines, out, oracle_cls=RustV2Oracle)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?")
    ap.add_argument("-o", "--out")
    ap.add_argument("--batch", metavar="TSV", help="replay each 'TRACE<TAB>OUT' line of TSV")
    args = ap.parse_args()
    pairs = ([line.rstrip("\n").split("\t") for line in open(args.batch) if line.strip()]
             if args.batch else [(args.trace, args.out)])
    for trace, out_path in pairs:
        with open(trace) as f:
            lines = f.readlines()
        out = open(out_path, "w") if out_path else sys.stdout
        try:
            replay(lines, out)
        finally:
            if out_path:
                out.close()


if __name__ == "__main__":
    main()
