"""FULL op-traces on the one unified core: ``HybridTree(NoComponent(), ...)``.

SGLang 0.5.23 has one tree core (``UnifiedTreeCore``); a FULL-only tree is that core
with ``components=(FULL,)``. ``sim/tree/hybrid.py``'s ``HybridTree`` is the
simulator's component-generic core, and with ``NoComponent``
(``sim/tree/components/none.py``) it is the FULL-only core. ``CoreReplayer`` drives
a FULL op-trace (docs/OPTRACE.md) on it and writes the lines ``sim/optrace.py``'s
``Replayer`` writes from ``Tree`` (the FULL-only engine path), which are the lines
SGLang's core wrote (``data/conformance/``).

What the core records and what the FULL oracle (``shared/oracle/oracle.py``
``TracedCore``) reports are two observers of the same core methods; rendering maps
one onto the other:

* node removals: the core records each by the method that made it (``delete``,
  ``drop``, ``drop_host``, ``host_evict``, ``tombstone``: ``HybridTree._unlink``);
  the FULL oracle reports ``drop_subtree_no_host``'s host-only nodes sorted by path
  before the dropped node (it builds that list before the method runs), where the
  core records them in removal order, children first; a ``tombstone`` carries no
  size;
* ``split`` carries no size (the hybrid oracle adds the upper fragment's);
* every event carries the node's path from the root.

Every FULL trace feature of docs/OPTRACE.md plays on it: v1 and v2, ``reserved``,
``host_alloc_failures``, every id scheme, ``skip_ids``, the host and eviction
policies, storage (L3) ops with ``storage_writes``, buffer_only, insert priorities.
A hybrid trace is refused with ``UnsupportedByCore`` (``missing_features`` says so
up front).
"""

from __future__ import annotations

from sim.errors import TreeError
from sim.optrace import Replayer, read_trace
from sim.storage.prefetch import PrefetchBook, PrefetchError
from sim.tree.results import NO_HOST_EVICTION, Eviction, HostEviction
from sim.tree.components.none import NoComponent
from sim.tree.hybrid import HybridTree

class UnsupportedByCore(Exception):
    """A trace the unified core does not replay (a hybrid one: sim/hybrid/replay.py)."""

    def __init__(self, feature: str):
        super().__init__(f"the unified core (HybridTree with NoComponent) does not replay "
                         f"a {feature}")
        self.feature = feature


def missing_features(path) -> list[str]:
    """What the trace at ``path`` needs that ``CoreReplayer`` lacks (empty: it replays
    it). Every FULL trace feature of docs/OPTRACE.md is the core's now; a hybrid trace
    is sim/hybrid/replay.py's."""
    for idx, _, op in read_trace(path):
        if "components" in op:
            return ["hybrid trace (sim/hybrid/replay.py)"]
        break
    return []


class _BookTree:
    """What ``PrefetchBook`` (sim/storage/prefetch.py, written against ``Tree``) reads
    of its tree, on the unified core: the host locks are the core's
    ``inc_host_lock`` / ``dec_host_lock``, a host eviction's result the
    ``HostEviction`` the core's FULL eviction filled."""

    def __init__(self, tree: HybridTree):
        self.t = tree
        self.root = tree.root
        self.page_size = tree.page_size
        self.host_capacity = tree.host_capacity
        self.stage_host = tree.stage_host
        self.unstage_host = tree.unstage_host
        self.insert_host = tree.insert_host
        self.host_lock = tree.inc_host_lock
        self.host_unlock = tree.dec_host_lock

    @property
    def host_free(self) -> int:
        ht = self.t.ht
        return ht.host_capacity - ht.host_used - ht.host_reserved

    def evict_host(self, n: int) -> HostEviction:
        if n <= 0:
            return HostEviction()
        ev = Eviction()
        self.t.evict_host(n, res=ev)
        return ev.host if ev.host is not NO_HOST_EVICTION else HostEviction()


class CoreReplayer(Replayer):
    """Applies FULL op-trace operations to ``HybridTree(NoComponent())`` and renders
    ``sim/optrace.py``'s output lines: ``Replayer``'s, with the ops whose tree calls
    differ on the core (its inserts take the request's ``prev``, its locks return
    receipts, its evictions their own results) and its event record's rendering."""

    def __init__(self, header: dict):  # a Replayer of its own: no Tree is built
        if "components" in header:
            raise UnsupportedByCore("hybrid trace (sim/hybrid/replay.py)")
        self.header = header
        self.page_size = header.get("page_size", 1)
        self.version = header.get("version", 1)
        self.write_acks = header.get("write_acks", "op" if self.version >= 2 else "end_of_op")
        self.device_capacity = header["device_capacity"]
        self.tree = HybridTree(
            NoComponent(), device_capacity=self.device_capacity, aux_capacity=0,
            page_size=self.page_size, record=True, host_capacity=header["host_capacity"],
            load_back_threshold=header.get("load_back_threshold", 1),
            write_policy=header.get("write_policy", "write_back"),
            host_policy=header.get("host_policy", "duplicate_first"),
            eviction_policy=header.get("eviction_policy", "lru"),
            ids=header.get("ids", "optrace"))
        # "host_memory_mode": "buffer_only" (docs/OPTRACE.md §15): no host values
        self.tree.ht.buffer_only = header.get("host_memory_mode") == "buffer_only"
        self.locks: dict = {}
        self.pins: dict = {}
        self._paths: dict = {}
        # Storage (L3) prefetches and writes (docs/OPTRACE.md §14); SGLang's default
        # threshold 256. "storage_writes": "auto": every acknowledged D->H backup is
        # written to storage at once, host-locked under the next id "s1", "s2", ...
        # "host_alloc_failures" (docs/OPTRACE.md §4): [op index, attempt] pairs that fail
        self._alloc_failures = {(int(i), int(a)) for i, a in header.get("host_alloc_failures", ())}
        self._op_index = self._attempt = 0
        if self._alloc_failures:
            self.tree.ht.host_alloc_fail = self._host_alloc_fails
        self.storage = PrefetchBook(_BookTree(self.tree), header.get("prefetch_threshold", 256))
        self._auto_writes: list = []
        self._n_auto = 0
        if header.get("storage_writes") == "auto":
            self.tree.ht.on_host_backup = self._auto_write

    def summary(self) -> dict:
        t = self.tree
        return {"digest": t.digest, "dev": t.dev_used, "host": t.host_used,
                "evictable": t.evictable, "protected": t.protected, "nodes": t.n_nodes}

    def apply(self, i: int, op: dict) -> dict:
        kind = op["op"]
        tree = self.tree
        tree.rec.clear()
        self._auto_writes = []
        self._op_index, self._attempt = i, 0
        out = {"i": i, "op": kind}
        try:
            # op-trace v2 §3: device KV running requests hold outside the tree, in
            # every free-space check during the op (the core's room checks read
            # device_capacity).
            reserved = op.get("reserved", 0)
            if tree.dev_used + reserved > self.device_capacity:
                raise TreeError("reserved_overflow")
            tree.device_capacity = self.device_capacity - reserved
            out.update(getattr(self, f"_op_{kind}")(op))
        except (TreeError, PrefetchError) as err:
            out = {"i": i, "op": kind, "error": err.code}
            tree.rec.clear()
        if self.write_acks == "end_of_op":
            # v1: every write an op issued is acknowledged at its end, in issue order.
            for ack in list(tree.writes):
                tree.write_ack(ack)
        if self._auto_writes:
            out["storage_writes"] = self._auto_writes
            self._auto_writes = []
        out["events"] = self._events(tree.rec)
        out.update(self.summary())
        return out

    def _events(self, rec: list) -> list:
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

    # -- ops
    def _op_insert(self, op):
        units = self.units(op["tokens"])
        # the request's own KV ends where the key's device prefix does (oracle.py
        # ``_device_prefix``: ``prev_prefix_len``)
        r = self.tree.insert(units, self.tree.device_prefix_len(units) * self.page_size,
                             inserted=op.get("inserted", 0), priority=op.get("priority", 0))
        return {"prefix_len": r.prefix_len, "new": r.new}

    def _match(self, op):
        m = self.tree.match_prefix(self.units(op["tokens"]))
        return m, {"device_len": m.device_len, "host_len": m.host_len}

    def _op_evict_device(self, op):
        return {"freed": self.tree.evict(op["n"]).freed}

    def _op_evict_host(self, op):
        return {"freed": self.tree.evict_host(op["n"])}

    def _op_load_back(self, op):
        lid = op["id"]
        if lid in self.tree.loads:
            raise TreeError("duplicate_load_back_id")
        m, out = self._match(op)
        out.update(self.tree.load_back(m, lid).as_dict())
        return out

    def _op_lock(self, op):
        if op["id"] in self.locks:
            raise TreeError("duplicate_lock_id")
        m, out = self._match(op)
        self.locks[op["id"]] = self.tree.inc_lock(m.dnode)
        return out

    def _op_write_ack(self, op):
        if op["id"] not in self.tree.writes:
            raise TreeError("unknown_write_id")
        self.tree.write_ack(op["id"])
        return {}

    # -- buffer_only, docs/OPTRACE.md §15
    def _op_buffer_stage(self, op):
        tree = self.tree
        if not tree.ht.buffer_only:
            raise TreeError("not_buffer_only")
        node = self._node_at(self.units(op["tokens"]))
        if not node.dev or node.id in tree.writes:
            raise TreeError("bad_buffer_stage")
        tree.stage_buffer_backup(node)
        return {"node": node.id}

    def _op_pin(self, op):
        if op["id"] in self.pins:
            raise TreeError("duplicate_pin_id")
        node = self._node_at(self.units(op["tokens"]))
        if not node.dev:
            raise TreeError("bad_pin")
        self.pins[op["id"]] = self.tree.inc_lock(node)
        return {"node": node.id}

    # -- storage (L3), docs/OPTRACE.md §14
    def _held(self) -> int:
        return self.tree.ht.host_reserved

    def _op_storage_write(self, op):
        if op["id"] in self.storage.writes:
            raise PrefetchError("duplicate_storage_write_id")
        nid = op["node"]
        tree = self.tree
        node = tree.root if nid == tree.root.id else next(
            (x for x in tree.iter_nodes() if x.id == nid), None)
        if node is None:
            raise TreeError("unknown_node")
        return {"written": self.storage.write(op["id"], node)}

    def _op_dump(self, op):
        tree = self.tree
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


def replay(path, header_override: dict | None = None):
    """Replay a FULL op-trace on the unified core; yields one output dict per line
    (``header_override``: header fields replaced, e.g. another id scheme). Raises
    ``UnsupportedByCore`` for a hybrid trace."""
    replayer = None
    for idx, _, op in read_trace(path):
        if replayer is None:
            if "components" in op:
                raise UnsupportedByCore("hybrid trace (sim/hybrid/replay.py)")
            replayer = CoreReplayer({**op, **(header_override or {})})
            yield replayer.header_output()
        else:
            yield replayer.apply(idx, op)
