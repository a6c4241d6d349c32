"""Op-trace replay: the differential-testing contract with SGLang's own tree.

Reads an op-trace (shared/reference/op-trace.md), drives a ``Tree`` (the unified
core with FULL alone, as SGLang's ``UnifiedTreeCore`` with ``components=(FULL,)``)
and yields one output object per trace line, in exactly the form SGLang's reference
replayer wrote the expected outputs in shared/conformance/.

What the core records and what the FULL oracle (``shared/oracle/oracle.py``
``TracedCore``) reports are two observers of the same core methods; rendering maps
one onto the other: the oracle reports ``drop_subtree_no_host``'s host-only nodes
sorted by path before the dropped node (it builds that list before the method runs),
where the core records them in removal order, children first; a ``split`` and a
``tombstone`` carry no size; every event carries the node's path from the root. The simulator's repro bundles write
per-rank op-traces in the same format, so any divergence the simulator finds can be
checked against SGLang's code too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator

from sim import jsonl, optrace_check, safeio
from sim.errors import InputFormatError
from sim.hybrid import replay as hybrid_replay
from sim.storage.prefetch import PrefetchBook, PrefetchError
from sim.tree import Tree, TreeError

OPS = {
    # op -> required fields and their kinds
    "insert": {"tokens": "tokens"},
    "match": {"tokens": "tokens"},
    "evict_device": {"n": "int"},
    "evict_host": {"n": "int"},
    "load_back": {"tokens": "tokens", "id": "id"},
    "load_back_ack": {"id": "id"},
    "lock": {"tokens": "tokens", "id": "id"},
    "unlock": {"id": "id"},
    "dump": {},
    # Extensions written by hicache-sim's repro bundles (absent from SGLang's format):
    "skip_ids": {"n": "int"},  # the rank built n other node objects (id drift)
    # op-trace v2 (docs/OPTRACE.md §2): the write_through ack SGLang's
    # `writing_check` pops (unified_radix_cache.py, `_finish_write_through_ack`).
    "write_ack": {"id": "id"},
    # op-trace v2, storage (L3) ops (docs/OPTRACE.md §14): what SGLang's tree sees of a
    # prefetch (unified_radix_cache.py `prefetch_from_storage`, the storage-hit drain,
    # `_handle_prefetch_result` -> `insert_host`, `revoke_pending_prefetch`) and of a
    # storage write (`write_backup_storage`, `_drain_backup`).
    "prefetch": {"tokens": "tokens", "id": "id"},
    "prefetch_hit": {"id": "id", "n": "int"},
    "prefetch_done": {"id": "id", "n": "int"},
    "prefetch_revoke": {"id": "id"},
    "storage_write": {"node": "int", "id": "id"},
    "storage_write_ack": {"id": "id"},
    # op-trace v2, buffer_only (docs/OPTRACE.md §15): the tree-visible steps of
    # buffer_mode/pipeline.py: a write's D2H launch device-locks its node until the
    # write_ack (`_stage_backup_intent`); a prefetch's anchor pin
    # (`try_lock_anchor`: `match_full_device_prefix`, a read, then a device pin) and
    # its release (`release_anchor_lock`).
    "buffer_stage": {"tokens": "tokens"},
    "pin": {"tokens": "tokens", "id": "id"},
    "unpin": {"id": "id"},
}
HEADER_INTS = ("device_capacity", "host_capacity", "page_size", "load_back_threshold",
               "prefetch_threshold")
WRITE_POLICIES = ("write_back", "write_through")
# Nodes whose paths a replayer keeps (Replayer.path): far more than a tree's live nodes.
PATH_CACHE = 1 << 16


# One compact JSON line (json.dumps with no spaces), at msgspec's speed (sim.jsonl).
_dumps = jsonl.dumps


def node_at(tree, units: list):
    """The node of ``tree`` whose path is exactly ``units`` (a read), or TreeError:
    the node a buffer_only op names (docs/OPTRACE.md §15), on either tree."""
    node, pos = tree.root, 0
    while pos < len(units):
        node = node.children.get(units[pos])
        if node is None or units[pos:pos + len(node.key)] != list(node.key):
            raise TreeError("unknown_node")
        pos += len(node.key)
    if node is tree.root:
        raise TreeError("unknown_node")
    return node


class Replayer:
    """Applies op-trace operations to one tree and renders SGLang-format outputs."""

    def __init__(self, header: dict, *, ids: str = "optrace", host_policy: str = "duplicate_first"):
        self.header = header
        self.page_size = header.get("page_size", 1)
        # hicache-sim's repro bundles name the tree variant the engine ran and the
        # host allocations that failed on that rank (op-trace v1 has no op for an
        # allocator failure): header extensions, ignored by SGLang's replayer.
        ids = header.get("ids", ids)
        host_policy = header.get("host_policy", host_policy)
        self.version = header.get("version", 1)
        self.write_acks = header.get("write_acks", "op" if self.version >= 2 else "end_of_op")
        # ids "server" (a real 0.5.23 server: root 5, first node 10) is the tree's own
        # scheme (sim.tree.ID_SCHEMES).
        self._alloc_failures = {(int(i), int(a)) for i, a in header.get("host_alloc_failures", ())}
        self._op_index = 0
        self._attempt = 0
        self.tree = Tree(
            device_capacity=header["device_capacity"],
            host_capacity=header["host_capacity"],
            page_size=self.page_size,
            write_policy=header.get("write_policy", "write_back"),
            load_back_threshold=header.get("load_back_threshold", 1),
            host_policy=host_policy,
            eviction_policy=header.get("eviction_policy", "lru"),
            ids=ids,
            record=True,
        )
        if self._alloc_failures:
            self.tree.host_alloc_fail = self._host_alloc_fails
        self.locks: dict = {}
        # Storage (L3) prefetches and writes (§14); SGLang's default threshold 256.
        self.storage = PrefetchBook(self.tree, header.get("prefetch_threshold", 256))
        # "storage_writes": "auto" (§14): every acknowledged D->H backup is written to
        # storage at once, its node host-locked under the next id "s1", "s2", ...
        self._auto_writes: list = []
        self._n_auto = 0
        if header.get("storage_writes") == "auto":
            self.tree.on_host_backup = self._auto_write
        # "host_memory_mode": "buffer_only" (§15): the tree holds no host values; its
        # write_through triggers back nothing up (the engine's write FIFO does).
        self.tree.buffer_only = header.get("host_memory_mode") == "buffer_only"
        self.pins: dict = {}
        self._paths: dict = {}  # node id -> (node, its tokens from the root)

    def _auto_write(self, node) -> None:
        if node is self.tree.root or not node.host:
            return  # build_storage_backup_spec returns None: nothing written, no id
        n = self._n_auto + 1
        while f"s{n}" in self.storage.writes:  # an explicit write holds that id
            n += 1
        self._n_auto = n
        self.storage.write(f"s{n}", node)
        self._auto_writes.append(f"s{n}")

    def _host_alloc_fails(self) -> bool:
        attempt = self._attempt
        self._attempt += 1
        return (self._op_index, attempt) in self._alloc_failures

    # -- conversions between tokens and page units
    def units(self, tokens: list) -> list:
        ps = self.page_size
        if ps == 1:
            return list(tokens)
        n = len(tokens) - len(tokens) % ps
        return [tuple(tokens[i:i + ps]) for i in range(0, n, ps)]

    def path(self, node) -> list:
        """The node's tokens from the root. A node's path never changes (a split keeps
        the lower fragment's), so it is kept by node id, checked by identity (a
        rebuilt tree may reuse an id), and built on its nearest kept ancestor's; the
        outputs share the lists and never change them."""
        paths = self._paths
        hit = paths.get(node.id)
        if hit is not None and hit[0] is node:
            return hit[1]
        if len(paths) >= PATH_CACHE:
            paths.clear()  # bounded: a long replay's dead nodes are let go
        chain = []
        tokens: list = []
        x = node
        while x.parent is not None:
            hit = paths.get(x.id)
            if hit is not None and hit[0] is x:
                tokens = hit[1]
                break
            chain.append(x)
            x = x.parent
        flat = self.page_size != 1
        for y in reversed(chain):
            tokens = tokens + ([t for u in y.key for t in u] if flat else y.key)
            paths[y.id] = (y, tokens)
        return tokens

    def key_tokens(self, node) -> list:
        return list(node.key) if self.page_size == 1 else [t for u in node.key for t in u]

    # -- one op
    def apply(self, i: int, op: dict) -> dict:
        kind = op["op"]
        out = {"i": i, "op": kind}
        tree = self.tree
        tree.rec.clear()
        self._auto_writes = []
        self._op_index, self._attempt = i, 0
        try:
            # Extension: device tokens that running requests hold outside the tree,
            # set before the op runs; they must fit beside the tree's own tokens.
            reserved = op.get("reserved", 0)
            if tree.dev_used + reserved > tree.device_capacity:
                raise TreeError("reserved_overflow")
            tree.reserved = reserved
            out.update(getattr(self, f"_op_{kind}")(op))
        except (TreeError, PrefetchError) as err:
            out = {"i": i, "op": kind, "error": err.code}
            tree.rec.clear()
        if self.write_acks == "end_of_op":
            # v1: the reference replayer acknowledges every write issued by an op at
            # the end of that op, in issue order (op-trace §9).
            for ack in list(tree.pending_writes):
                tree.finish_write_through(ack)
        if self._auto_writes:
            out["storage_writes"] = self._auto_writes
            self._auto_writes = []
        out["events"] = self._events(tree.rec)
        out.update(digest=tree.digest, dev=tree.dev_used, host=tree.host_used,
                   evictable=tree.evictable, protected=tree.protected, nodes=tree.n_nodes)
        return out

    def _events(self, rec: list) -> list:
        """The op's event record as the oracle reports it (module docstring)."""
        out = []
        drop_host: list = []
        for kind, node, extra in rec:
            ev = {"k": kind, "id": node.id, "path": self.path(node)}
            if kind == "split":
                ev["child"] = extra["child"]
            elif kind != "tombstone":
                ev.update(extra)
            if kind == "drop_host":
                drop_host.append(ev)
                continue
            if drop_host:
                # drop_subtree_no_host's host-only subtree, reported by path before the
                # dropped node (oracle.py TracedCore.drop_subtree_no_host)
                drop_host.sort(key=lambda e: e["path"])
                out.extend(drop_host)
                drop_host = []
            out.append(ev)
        out.extend(drop_host)
        return out

    def header_output(self) -> dict:
        t = self.tree
        return {"i": 0, "op": "header", "events": [], "digest": t.digest, "dev": t.dev_used,
                "host": t.host_used, "evictable": t.evictable, "protected": t.protected,
                "nodes": t.n_nodes}

    def _op_insert(self, op):
        # v2: `priority` (docs/OPTRACE.md), checkpoint_into_tree's prompt re-insert;
        # `inserted`, the request's `cache_inserted_len` (write_through hit counts).
        res = self.tree.insert(self.units(op["tokens"]), op.get("priority", 0),
                               inserted=op.get("inserted", 0))
        return {"prefix_len": res.prefix_tokens, "new": res.new_device_tokens}

    def _op_match(self, op):
        m = self.tree.match_prefix(self.units(op["tokens"]))
        return {"device_len": m.device_len, "host_len": m.host_len}

    def _op_evict_device(self, op):
        return {"freed": self.tree.evict_device(op["n"]).freed}

    def _op_evict_host(self, op):
        return {"freed": self.tree.evict_host(op["n"]).freed}

    def _op_load_back(self, op):
        lid = op["id"]
        if lid in self.tree.loads:
            raise TreeError("duplicate_load_back_id")
        m = self.tree.match_prefix(self.units(op["tokens"]))
        res = self.tree.load_back(m, lid)
        out = {"device_len": m.device_len, "host_len": m.host_len}
        if res.ok:
            out.update(started=True, loaded=res.tokens)
        else:
            out.update(started=False, loaded=0, reason=res.reason)
        return out

    def _op_load_back_ack(self, op):
        if op["id"] not in self.tree.loads:
            raise TreeError("unknown_load_back_id")
        self.tree.finish_load_back(op["id"])
        return {}

    def _op_lock(self, op):
        if op["id"] in self.locks:
            raise TreeError("duplicate_lock_id")
        m = self.tree.match_prefix(self.units(op["tokens"]))
        self.tree.inc_lock(m.last_device)
        self.locks[op["id"]] = m.last_device
        return {"device_len": m.device_len, "host_len": m.host_len}

    def _op_unlock(self, op):
        node = self.locks.pop(op["id"], None)
        if node is None:
            raise TreeError("unknown_lock_id")
        self.tree.dec_lock(node)
        return {}

    def _op_write_ack(self, op):
        # SGLang's `_finish_write_through_ack(ack_id)`: `finish_write_through` on the
        # published nodes, then the backup's device lock is released.
        if op["id"] not in self.tree.pending_writes:
            raise TreeError("unknown_write_id")
        self.tree.finish_write_through(op["id"])
        return {}

    # -- buffer_only, docs/OPTRACE.md §15
    def _node_at(self, units):
        return node_at(self.tree, units)

    def _op_buffer_stage(self, op):
        if not self.tree.buffer_only:
            raise TreeError("not_buffer_only")
        node = self._node_at(self.units(op["tokens"]))
        if not node.dev or node.id in self.tree.pending_writes:
            raise TreeError("bad_buffer_stage")
        self.tree.stage_buffer_backup(node)
        return {"node": node.id}

    def _op_pin(self, op):
        if op["id"] in self.pins:
            raise TreeError("duplicate_pin_id")
        node = self._node_at(self.units(op["tokens"]))
        if not node.dev:
            raise TreeError("bad_pin")
        self.tree.inc_lock(node)
        self.pins[op["id"]] = node
        return {"node": node.id}

    def _op_unpin(self, op):
        node = self.pins.pop(op["id"], None)
        if node is None:
            raise TreeError("unknown_pin_id")
        self.tree.dec_lock(node)
        return {}

    # -- storage (L3), docs/OPTRACE.md §14
    def _held(self) -> int:
        """Host slots staged prefetches hold (each storage op's ``held``)."""
        return self.tree.host_reserved

    def _op_prefetch(self, op):
        units = self.units(op["tokens"])
        if op["id"] in self.storage.prefetches:
            raise PrefetchError("duplicate_prefetch_id")
        m = self.tree.match_prefix(units)
        res = self.storage.issue(op["id"], m, units)
        out = {"device_len": m.device_len, "host_len": m.host_len, "anchor": res.anchor.id,
               "requested": res.requested, "issued": res.reason is None}
        if res.reason is not None:
            out["reason"] = res.reason
        return out

    def _op_prefetch_hit(self, op):
        res = self.storage.hit(op["id"], op["n"])
        out = {"staged": res.staged, "freed": res.host.freed}
        if res.reason is not None:
            out["reason"] = res.reason
        out["held"] = self._held()
        return out

    def _op_prefetch_done(self, op):
        res, loaded = self.storage.done(op["id"], op["n"])
        return {"prefix_len": res.prefix_tokens, "loaded": loaded,
                "node": None if res.node is None else res.node.id, "dropped": res.dropped,
                "held": self._held()}

    def _op_prefetch_revoke(self, op):
        self.storage.revoke(op["id"])
        return {"held": self._held()}

    def _op_storage_write(self, op):
        if op["id"] in self.storage.writes:
            raise PrefetchError("duplicate_storage_write_id")
        node = self.tree.node_by_id(op["node"])
        if node is None:
            raise TreeError("unknown_node")
        return {"written": self.storage.write(op["id"], node)}

    def _op_storage_write_ack(self, op):
        self.storage.write_ack(op["id"])
        return {}

    def _op_skip_ids(self, op):
        self.tree.skip_ids(op["n"])
        return {}

    def _op_dump(self, op):
        tree = self.tree
        # a pinned node names the load-back pinning it (its anchor's load id)
        anchors = {lb.anchor.id: lid for lid, lb in tree.loads.items()}
        nodes = []
        stack = [(tree.root, 0)]
        while stack:  # depth-first, children by key (oracle.py op_dump)
            x, start = stack.pop()
            if x is not tree.root:
                nodes.append((x, start))
                start += len(x.key) * self.page_size
            kids = sorted(x.children.values(), key=lambda c: c.key[0], reverse=True)
            stack.extend((c, start) for c in kids)
        rank = {x.id: r for r, (x, _) in
                enumerate(sorted(nodes, key=lambda e: (e[0].last_access, e[0].id)))}
        rows = []
        for x, start in nodes:
            rows.append({
                "id": x.id, "parent": x.parent.id, "start": start,
                "key": self.key_tokens(x), "dev": x.dev, "host": x.host,
                "lock": x.lock, "host_lock": x.host_lock,
                "pinned_by": None if x.lb is None else anchors.get(x.lb.id, x.lb.id),
                "recency": rank[x.id],
            })
        return {"tree": rows, "duplicates": list(tree.dups),
                "d_leaves": sorted(x.id for x in tree.d_leaves),
                "h_leaves": sorted(x.id for x in tree.h_leaves)}


# ----------------------------------------------------------------- parsing
_INT = {int}


def _check_tokens(path, line, key, value):
    # the set of the element types, built in C: a token list is long
    if not isinstance(value, list) or (value and set(map(type, value)) != _INT):
        raise InputFormatError(path, line, f"{key}={_short(value)}", f"'{key}' as a list of ints")


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_line(path, line_no: int, text: str, first: bool, header: dict | None = None) -> dict:
    """Parse and validate one op-trace line; any problem is a one-line error.
    ``header``: the trace's parsed header, for the ops a version allows."""
    return check_line(path, line_no, optrace_check.load_line(path, line_no, text), first, header)


def check_line(path, line_no: int, obj, first: bool, header: dict | None = None) -> dict:
    """Validate one parsed op-trace line (``parse_line`` after the JSON)."""
    if not isinstance(obj, dict):
        raise InputFormatError(path, line_no, type(obj).__name__, "a JSON object")
    op = obj.get("op")
    # Hybrid traces (a header naming "components"): sim/hybrid/replay.py.
    if first and op == "header" and "components" in obj:
        return hybrid_replay.check_header(path, line_no, obj)
    if not first and header is not None and "components" in header:
        return hybrid_replay.check_op(path, line_no, obj, header)
    if first:
        if op != "header":
            raise InputFormatError(path, line_no, f"op={_short(op)}", 'the header ({"op":"header",...}) on the first line')
        for key in ("device_capacity", "host_capacity"):
            if key not in obj:
                raise InputFormatError(path, line_no, f"no '{key}'", f"'{key}' (an int) in the header")
        for key in HEADER_INTS:
            if key in obj and (type(obj[key]) is not int or obj[key] < (1 if key == "page_size" else 0)):
                raise InputFormatError(path, line_no, f"{key}={_short(obj[key])}",
                                       f"'{key}' as a {'positive' if key == 'page_size' else 'non-negative'} int")
        wp = obj.get("write_policy", "write_back")
        if wp not in WRITE_POLICIES:
            raise InputFormatError(path, line_no, f"write_policy={_short(wp)}", f"one of {', '.join(WRITE_POLICIES)}")
        optrace_check.check_header(path, line_no, obj)
        return obj
    if not isinstance(op, str) or op not in OPS:
        raise InputFormatError(path, line_no, f"op={_short(op)}", f"one of {', '.join(OPS)}")
    if "reserved" in obj and (type(obj["reserved"]) is not int or obj["reserved"] < 0):
        raise InputFormatError(path, line_no, f"reserved={_short(obj['reserved'])}",
                               "'reserved' as a non-negative int")
    for key, kind in OPS[op].items():
        if key not in obj:
            raise InputFormatError(path, line_no, f"no '{key}' in a {op} op", f"'{key}'")
        value = obj[key]
        if kind == "tokens":
            _check_tokens(path, line_no, key, value)
        elif kind == "int" and type(value) is not int:
            raise InputFormatError(path, line_no, f"{key}={_short(value)}", f"'{key}' as an int")
        elif kind == "id" and not (type(value) is int or isinstance(value, str)):
            raise InputFormatError(path, line_no, f"{key}={_short(value)}", f"'{key}' as a string or int")
    optrace_check.check_op(path, line_no, obj, header)
    return obj


def read_trace(path) -> Iterator[tuple[int, int, dict]]:
    """Yield ``(output index, file line number, op)`` for each non-blank line."""
    path = Path(path)
    # Regular files only, bounded lines, .gz read transparently (sim.safeio).
    lines = safeio.open_lines(path, "an op-trace file")
    idx = 0
    header = None
    try:
        for line_no, raw in lines:
            obj = jsonl.loads(raw)
            if obj is None:  # not JSON msgspec reads (a blank line too): the plain path
                text = raw.decode("utf-8")
                if not text.strip():
                    continue
                obj = parse_line(path, line_no, text, idx == 0, header)
            else:
                obj = check_line(path, line_no, obj, idx == 0, header)
            if idx == 0:
                header = obj
            yield idx, line_no, obj
            idx += 1
    except UnicodeDecodeError:
        raise InputFormatError(path, None, "bytes that are not UTF-8", "a UTF-8 JSON Lines file") from None
    if idx == 0:
        raise InputFormatError(path, None, "an empty file", "a header line and operations")


def replay(path, **kwargs) -> Iterator[dict]:
    """Replay an op-trace file; yields one output dict per non-blank line."""
    replayer = None
    for idx, line_no, op in read_trace(path):
        if replayer is None:
            if "components" in op:
                # Hybrid trees number nodes one way and have no host tier (docs/HYBRID.md §6).
                for key, default in (("ids", "optrace"), ("host_policy", "duplicate_first")):
                    if kwargs.get(key, default) != default:
                        raise InputFormatError(path, line_no, f"a hybrid trace with {key}="
                                               f"{_short(kwargs[key])}", f"{key} {default!r} "
                                               "(hybrid traces have no other)")
                replayer = hybrid_replay.HybridReplayer(op)
            else:
                replayer = Replayer(op, **kwargs)
            yield replayer.header_output()
        else:
            yield replayer.apply(idx, op)


def replay_lines(path, **kwargs) -> Iterable[str]:
    for out in replay(path, **kwargs):
        yield _dumps(out)


def engine_ops_to_trace(ops: list[dict], *, device_capacity: int, host_capacity: int,
                        page_size: int, write_policy: str, load_back_threshold: int,
                        note: str = "", version: int | None = None, ids: str | None = None,
                        host_policy: str | None = None, eviction_policy: str | None = None,
                        host_alloc_failures: list | None = None,
                        storage: int | None = None,
                        host_memory_mode: str | None = None) -> list[dict]:
    """A replica's recorded engine ops as an op-trace.

    The engine keys its tree with one int unit per page; unit ``u`` becomes a page of
    ``page_size`` copies of ``u``, so distinct pages stay distinct and the trace is
    replayable at the engine's own page size.

    ``version``: 2 writes a v2 header (docs/OPTRACE.md) with explicit write acks; None
    picks 2 only when the ops hold a ``write_ack`` (a write_through recording, which
    has no v1 form), so write_back recordings keep their v1 bytes. The other keywords
    are header fields, written only when given. ``storage``: the prefetch threshold of
    a run with the L3 tier; the header then says ``storage_writes: auto`` (§14).
    """
    if version is None:
        version = 2 if any(op.get("op") == "write_ack" for op in ops) else 1
    header = {"op": "header", "device_capacity": device_capacity, "host_capacity": host_capacity,
              "page_size": page_size, "write_policy": write_policy,
              "load_back_threshold": load_back_threshold}
    if version >= 2:
        header.update(version=version, write_acks="op")
    for key, value in (("ids", ids), ("host_policy", host_policy),
                       ("eviction_policy", eviction_policy),
                       ("host_alloc_failures", host_alloc_failures or None)):
        if value is not None:
            header[key] = value
    if host_memory_mode == "buffer_only":
        # §15: no storage ops (nothing of a prefetch or a storage write is tree state)
        header["host_memory_mode"] = host_memory_mode
    elif storage is not None:
        header.update(prefetch_threshold=storage, storage_writes="auto")
    if note:
        header["note"] = note
    out = [header]
    for op in ops:
        op = dict(op)
        key = op.pop("key", None)
        if key is not None:
            op["tokens"] = list(key) if page_size == 1 else [u for u in key for _ in range(page_size)]
        out.append(op)
    return out
