"""Hybrid op-traces (docs/HYBRID.md §6): parse, validate and replay them on
``SWATree`` / ``MambaTree``, writing the lines ``tools/sglang_oracle/oracle_hybrid.py``
writes from SGLang's core.

``sim/optrace.py`` hands a trace here when its header names ``components``; FULL
traces never reach this module.
"""

from __future__ import annotations

import json

from sim.policies.write import WRITE_POLICIES
from sim.errors import InputFormatError
from sim.tree.hybrid import HybridInvariantError, HybridTreeError
from sim.tree.components.mamba import MambaTree
from sim.tree.components.swa import SWATree

COMPONENT_PAIRS = {("full", "swa"): "swa", ("full", "mamba"): "mamba"}

# header field -> (required for which kinds, minimum)
HEADER_INTS = {
    "device_capacity": (("swa", "mamba"), 0),
    "page_size": ((), 1),
    "swa_capacity": (("swa",), 0),
    "sliding_window": (("swa",), 1),
    "mamba_capacity": (("mamba",), 0),
    "mamba_chunk": (("mamba",), 1),
    "mamba_max_states": ((), -1),
}

# op -> {field: (kind, required)}; kinds: tokens, int (>= 0), id
OPS = {
    "insert": {"tokens": ("tokens", True), "prev": ("int", False),
               "swa_evicted": ("int", False), "donate": ("id", False),
               "inserted": ("int", False)},
    "match": {"tokens": ("tokens", True), "cow": ("id", False)},
    "lock": {"tokens": ("tokens", True), "id": ("id", True), "skip": ("skip", False),
             "cow": ("id", False), "exact": ("bool", False)},
    "unlock": {"id": ("id", True)},
    "release_swa": {"id": ("id", True)},
    "evict": {"full": ("int", False), "swa": ("int", False), "mamba": ("int", False)},
    "evict_for_alloc": {"full": ("int", False), "swa": ("int", False),
                        "mamba": ("int", False)},
    "release": {"id": ("id", True)},
    "dump": {},
    # written by the engine (`run --record-ops`, docs/HYBRID.md §10.5)
    "alloc": {"id": ("id", True)},
    "skip_ids": {"n": ("int", True)},
    # the host tier ("hicache": true): docs/HYBRID.md §6
    "evict_host": {"full": ("int", False), "swa": ("int", False), "mamba": ("int", False)},
    "load_back": {"tokens": ("tokens", True), "id": ("id", True), "req": ("id", False)},
    "load_back_ack": {"id": ("id", True)},
    # write_through: the ack of one insert-time backup (op-trace v2's write_ack)
    "write_ack": {"id": ("id", True)},
}
HOST_OPS = ("evict_host", "load_back", "load_back_ack", "write_ack")
# header fields of the host tier -> minimum
HOST_HEADER_INTS = {"host_capacity": 0, "mamba_host_capacity": 0, "swa_host_capacity": 0,
                    "load_back_threshold": 0}
# the component's host pool, by kind (HOST_HEADER_INTS' other one is refused)
AUX_HOST_KEY = {"swa": "swa_host_capacity", "mamba": "mamba_host_capacity"}
# Fields an op may carry only in one kind of tree.
KIND_ONLY = {"swa_evicted": "swa", "swa": "swa", "mamba": "mamba", "skip": "mamba",
             "cow": "mamba", "donate": "mamba", "req": "mamba"}
OP_KIND_ONLY = {"release_swa": "swa", "release": "mamba", "alloc": "mamba"}
# The tree records each node removal by the core method that made it (HybridTree
# ``_unlink``); oracle_hybrid.py reports every ``_remove_leaf_from_parent`` as delete.
_KIND = {"drop": "delete", "drop_host": "delete", "host_evict": "delete",
         "tombstone": "delete"}
# Every op may carry the KV running requests hold outside the tree (the engine's
# traces): FULL tokens, and SWA tokens in a (FULL, SWA) trace.
RESERVED = {"reserved": None, "swa_reserved": "swa"}


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def kind_of(header: dict) -> str | None:
    """``"swa"``/``"mamba"`` for a hybrid header, None for a FULL one."""
    comps = header.get("components")
    if comps is None:
        return None
    return COMPONENT_PAIRS.get(tuple(comps) if isinstance(comps, list) else None)


def check_header(path, line_no: int, obj: dict) -> dict:
    comps = obj.get("components")
    kind = kind_of(obj)
    if kind is None:
        raise InputFormatError(path, line_no, f"components={_short(comps)}",
                               '"components" one of ["full","swa"], ["full","mamba"]')
    for key, (need, lo) in HEADER_INTS.items():
        if key not in obj:
            if kind in need:
                raise InputFormatError(path, line_no, f"no '{key}'",
                                       f"'{key}' (an int) in a {kind} header")
            continue
        v = obj[key]
        if type(v) is not int or v < lo or (key == "mamba_max_states" and v == 0):
            want = ("-1 or a positive int" if key == "mamba_max_states"
                    else "a positive int" if lo == 1 else "a non-negative int")
            raise InputFormatError(path, line_no, f"{key}={_short(v)}", f"'{key}' as {want}")
    from sim.optrace_check import MAX_PAGE_SIZE

    if obj.get("page_size", 1) > MAX_PAGE_SIZE:
        raise InputFormatError(path, line_no, f"page_size={_short(obj['page_size'])}",
                               f"'page_size' of at most {MAX_PAGE_SIZE}")
    if "mamba_extra_buffer" in obj and type(obj["mamba_extra_buffer"]) is not bool:
        raise InputFormatError(path, line_no,
                               f"mamba_extra_buffer={_short(obj['mamba_extra_buffer'])}",
                               "'mamba_extra_buffer' as true or false")
    if kind == "swa" and "mamba_extra_buffer" in obj:
        raise InputFormatError(path, line_no, "'mamba_extra_buffer' in a swa header",
                               "'mamba_extra_buffer' only with components [\"full\",\"mamba\"]")
    if kind == "mamba" and obj.get("page_size", 1) != 1 and not obj.get("mamba_extra_buffer"):
        # mamba.py MambaComponent.__init__: page_size 1 without the extra buffer.
        raise InputFormatError(path, line_no, f"page_size={_short(obj['page_size'])}",
                               "page_size 1 in a mamba header without "
                               "\"mamba_extra_buffer\": true (SGLang's MambaComponent)")
    hicache = obj.get("hicache", False)
    if type(hicache) is not bool:
        raise InputFormatError(path, line_no, f"hicache={_short(hicache)}",
                               "'hicache' as true or false")
    if not hicache:
        for key in (*HOST_HEADER_INTS, "write_policy"):
            if key in obj:
                raise InputFormatError(path, line_no, f"'{key}' without \"hicache\": true",
                                       f"'{key}' only in a header with \"hicache\": true")
        return obj
    other = AUX_HOST_KEY["mamba" if kind == "swa" else "swa"]
    if other in obj:
        raise InputFormatError(path, line_no, f"'{other}' in a {kind} header",
                               f"'{AUX_HOST_KEY[kind]}' for the {kind} host pool")
    for key, lo in HOST_HEADER_INTS.items():
        if key == other:
            continue
        if key not in obj:
            if key != "load_back_threshold":
                raise InputFormatError(path, line_no, f"no '{key}'",
                                       f"'{key}' (an int) in a header with \"hicache\": true")
            continue
        v = obj[key]
        if type(v) is not int or v < lo:
            raise InputFormatError(path, line_no, f"{key}={_short(v)}",
                                   f"'{key}' as a non-negative int")
    for key in ("host_capacity", "swa_host_capacity"):
        if key in obj and obj[key] % obj.get("page_size", 1):
            raise InputFormatError(path, line_no, f"{key}={obj[key]}",
                                   f"'{key}' a multiple of page_size")
    if obj.get("write_policy", "write_back") not in WRITE_POLICIES:
        raise InputFormatError(path, line_no, f"write_policy={_short(obj['write_policy'])}",
                               "'write_policy' one of "
                               + ", ".join(f'"{p}"' for p in WRITE_POLICIES))
    return obj


def check_op(path, line_no: int, obj: dict, header: dict) -> dict:
    op = obj.get("op")
    kind = kind_of(header)
    if not isinstance(op, str) or op not in OPS:
        raise InputFormatError(path, line_no, f"op={_short(op)}",
                               f"one of {', '.join(OPS)} in a hybrid trace")
    if OP_KIND_ONLY.get(op, kind) != kind:
        raise InputFormatError(path, line_no, f"a {op} op in a {kind} trace",
                               f"{op} only with components [\"full\",\"{OP_KIND_ONLY[op]}\"]")
    if "inserted" in obj and header.get("write_policy", "write_back") == "write_back":
        # InsertParams.inserted_len only gates write_through's hit counts.
        raise InputFormatError(path, line_no, "'inserted' without a write_through policy",
                               "'inserted' only with \"hicache\": true and \"write_policy\" "
                               "write_through or write_through_selective")
    if op in HOST_OPS:
        if not header.get("hicache"):
            raise InputFormatError(path, line_no, f"a {op} op without the host tier",
                                   f"{op} only in a trace whose header has \"hicache\": true")
        if op == "write_ack" and header.get("write_policy", "write_back") == "write_back":
            raise InputFormatError(path, line_no, "a write_ack op under write_back",
                                   "write_ack only with \"write_policy\" write_through or "
                                   "write_through_selective (write_back acks at once)")
        if op == "evict_host" and ("full" in obj) == (kind in obj):
            raise InputFormatError(path, line_no, "evict_host naming "
                                   + ("both components" if "full" in obj else "no component"),
                                   f"evict_host with exactly one of 'full', '{kind}'")
    for key, (fkind, required) in OPS[op].items():
        if key not in obj:
            if required:
                raise InputFormatError(path, line_no, f"no '{key}' in a {op} op", f"'{key}'")
            continue
        if KIND_ONLY.get(key, kind) != kind:
            raise InputFormatError(path, line_no, f"'{key}' in a {kind} trace",
                                   f"'{key}' only with components [\"full\",\"{KIND_ONLY[key]}\"]")
        value = obj[key]
        if fkind == "tokens":
            if not isinstance(value, list) or not all(type(t) is int for t in value):
                raise InputFormatError(path, line_no, f"{key}={_short(value)}",
                                       f"'{key}' as a list of ints")
        elif fkind == "int":
            if type(value) is not int or value < 0:
                raise InputFormatError(path, line_no, f"{key}={_short(value)}",
                                       f"'{key}' as a non-negative int")
        elif fkind == "bool":
            if type(value) is not bool:
                raise InputFormatError(path, line_no, f"{key}={_short(value)}",
                                       f"'{key}' as true or false")
        elif fkind == "skip":
            if value not in ([], ["mamba"]):
                raise InputFormatError(path, line_no, f"{key}={_short(value)}",
                                       f"'{key}' as [\"mamba\"] or []")
        elif not (type(value) is int or isinstance(value, str)):
            raise InputFormatError(path, line_no, f"{key}={_short(value)}",
                                   f"'{key}' as a string or int")
    for key, only in RESERVED.items():
        if key not in obj:
            continue
        if only is not None and only != kind:
            raise InputFormatError(path, line_no, f"'{key}' in a {kind} trace",
                                   f"'{key}' only with components [\"full\",\"{only}\"]")
        value = obj[key]
        if type(value) is not int or value < 0:
            raise InputFormatError(path, line_no, f"{key}={_short(value)}",
                                   f"'{key}' as a non-negative int")
    return obj


def make_tree(header: dict, record: bool = False):
    kind = kind_of(header)
    ps = header.get("page_size", 1)
    if kind == "swa":
        host = {}
        if header.get("hicache"):
            host = dict(host_capacity=header["host_capacity"],
                        swa_host_capacity=header["swa_host_capacity"],
                        load_back_threshold=header.get("load_back_threshold", 1),
                        write_policy=header.get("write_policy", "write_back"))
        return SWATree(device_capacity=header["device_capacity"],
                       swa_capacity=header["swa_capacity"],
                       sliding_window=header["sliding_window"], page_size=ps, record=record,
                       **host)
    host = {}
    if header.get("hicache"):
        host = dict(host_capacity=header["host_capacity"],
                    mamba_host_capacity=header["mamba_host_capacity"],
                    load_back_threshold=header.get("load_back_threshold", 1),
                    write_policy=header.get("write_policy", "write_back"))
    return MambaTree(device_capacity=header["device_capacity"],
                     mamba_capacity=header["mamba_capacity"],
                     mamba_chunk=header["mamba_chunk"], page_size=ps,
                     max_states=header.get("mamba_max_states", -1),
                     extra_buffer=header.get("mamba_extra_buffer", False), record=record,
                     **host)


class HybridReplayer:
    """Applies hybrid op-trace operations; renders the oracle's output lines."""

    def __init__(self, header: dict):
        self.header = header
        self.kind = kind_of(header)
        self.page_size = header.get("page_size", 1)
        self.tree = make_tree(header, record=True)
        self.hicache = bool(header.get("hicache"))
        self.locks: dict = {}
        self.held: set = set()  # Mamba: requests holding their own state slot

    def units(self, tokens: list) -> list:
        ps = self.page_size
        if ps == 1:
            return list(tokens)
        n = len(tokens) - len(tokens) % ps
        return [tuple(tokens[i:i + ps]) for i in range(0, n, ps)]

    def key_tokens(self, node) -> list:
        return list(node.key) if self.page_size == 1 else [t for u in node.key for t in u]

    def summary(self) -> dict:
        t, a = self.tree, self.kind
        out = {"dev": t.dev_used, a: t.aux_used, "evictable": t.evictable,
               "protected": t.protected, a + "_evictable": t.aux_evictable,
               a + "_protected": t.aux_protected, "nodes": t.n_nodes}
        if a == "mamba":  # the pool's use: the tree's states and the requests' own
            out["mamba"] += t.held
            out["mamba_held"] = t.held
        if self.hicache:
            out["host"] = t.host_used
            out[a + "_host"] = t.aux_host_used
            out["digest"] = t.digest
            if t.ht.wt:
                out["writes"] = len(t.writes)
        return out

    def header_output(self) -> dict:
        return {"i": 0, "op": "header", "events": [], **self.summary()}

    def apply(self, i: int, op: dict) -> dict:
        kind = op["op"]
        tree = self.tree
        tree.rec.clear()
        # KV held outside the tree is not the tree's to use during the op.
        h = self.header
        tree.device_capacity = h["device_capacity"] - op.get("reserved", 0)
        if self.kind == "swa":
            tree.aux_capacity = h["swa_capacity"] - op.get("swa_reserved", 0)
        try:
            out = {"i": i, "op": kind, **getattr(self, f"_op_{kind}")(op)}
        except HybridTreeError as err:
            out = {"i": i, "op": kind, "error": err.code}
            tree.rec.clear()
        out["events"] = [{"k": _KIND.get(k, k), "id": node.id, **extra}
                         for k, node, extra in tree.rec]
        out.update(self.summary())
        return out

    # -- ops
    def _op_insert(self, op):
        donate = op.get("donate")
        if donate is not None and donate not in self.held:
            raise HybridTreeError("unknown_request")
        key = self.units(op["tokens"])
        prev = op.get("prev", 0)
        if self.kind == "swa":
            r = self.tree.insert(key, prev, op.get("swa_evicted", 0), op.get("inserted", 0))
            return {"prefix_len": r.prefix_len, "new": r.new, "swa_new": r.aux_new,
                    "node": r.node.id}
        r = self.tree.insert(key, prev, donated=donate is not None,
                             inserted=op.get("inserted", 0))
        self.held.discard(donate)
        return {"prefix_len": r.prefix_len, "new": r.new, "mamba_exist": r.mamba_exist,
                "node": r.node.id}

    def _match(self, tokens):
        m = self.tree.match_prefix(self.units(tokens))
        out = {"device_len": m.device_len, "full_len": m.full_len, "node": m.best.id,
               "branch": m.branch}
        if self.hicache:
            out.update({"host_len": m.host_len, "dnode": m.dnode.id,
                        self.kind + "_host_len": m.aux_host_len})
        return m, out

    def _op_match(self, op):
        rid = op.get("cow")
        if rid is None:
            return self._match(op["tokens"])[1]
        holds = rid in self.held
        if self.tree.cow_would_fail(self.units(op["tokens"]), holds):
            raise HybridTreeError("mamba_full")
        m, out = self._match(op["tokens"])
        out["cow"] = self._cow(m, holds)
        if out["cow"]:
            self.held.add(rid)
        return out

    def _cow(self, m, holds: bool) -> bool:
        """The copy on write of a match (``cow_would_fail`` refused the op first when
        it could fail, as SGLang would assert)."""
        r = self.tree.cow(m, holds)
        if r.failed:
            raise HybridInvariantError("Can not alloc mamba cache")
        return r.copied

    def _op_release(self, op):
        if op["id"] not in self.held:
            raise HybridTreeError("unknown_request")
        self.held.discard(op["id"])
        self.tree.release()
        return {}

    def _op_lock(self, op):
        lid = op["id"]
        if lid in self.locks:
            raise HybridTreeError("duplicate_lock_id")
        if op.get("exact"):
            # the node whose path is exactly ``tokens`` (an insert's target, a
            # load-back's anchor), locked without a match
            node = self._node_at(self.units(op["tokens"]))
            self.locks[lid] = self.tree.inc_lock(node, skip_aux=bool(op.get("skip")))
            return {"node": node.id}
        rid = op.get("cow")
        if rid is not None:
            holds = rid in self.held
            if self.tree.cow_would_fail(self.units(op["tokens"]), holds):
                raise HybridTreeError("mamba_full")
        m, out = self._match(op["tokens"])
        if rid is not None:
            out["cow"] = self._cow(m, holds)
            if out["cow"]:
                self.held.add(rid)
        self.locks[lid] = self.tree.inc_lock(m.dnode, skip_aux=bool(op.get("skip")))
        return out

    def _node_at(self, key: list):
        node, pos = self.tree.root, 0
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None or key[pos:pos + len(child.key)] != child.key:
                raise HybridTreeError("unknown_node")
            node, pos = child, pos + len(child.key)
        return node

    def _op_alloc(self, op):
        """``alloc_req_slots``: a request takes a fresh state slot."""
        rid = op["id"]
        if rid in self.held:
            raise HybridTreeError("duplicate_request")
        if not self.tree._free_slot():
            raise HybridTreeError("mamba_full")
        self.held.add(rid)
        self.tree.held += 1
        return {}

    def _op_skip_ids(self, op):
        self.tree.skip_ids(op["n"])
        return {}

    def _op_unlock(self, op):
        receipt = self.locks.pop(op["id"], None)
        if receipt is None:
            raise HybridTreeError("unknown_lock_id")
        self.tree.dec_lock(receipt)
        return {}

    def _op_release_swa(self, op):
        receipt = self.locks.get(op["id"])
        if receipt is None:
            raise HybridTreeError("unknown_lock_id")
        self.tree.release_swa(receipt)
        return {}

    def _op_evict(self, op):
        r = self.tree.evict(op.get("full", 0), op.get(self.kind, 0))
        return {"freed": {"full": r.freed, self.kind: r.aux}}

    # cache evict_for_alloc stops each walk where evict does here (docs/HYBRID.md §6)
    _op_evict_for_alloc = _op_evict

    def _op_evict_host(self, op):
        comp = "full" if "full" in op else self.kind
        return {"freed": self.tree.evict_host(op[comp], comp)}

    def _op_load_back(self, op):
        lid, rid = op["id"], op.get("req")
        tree = self.tree
        if lid in tree.loads:
            raise HybridTreeError("duplicate_load_back_id")
        holds = rid in self.held
        if rid is not None and tree.load_back_would_fail(self.units(op["tokens"]), holds):
            raise HybridTreeError("mamba_full")
        m, out = self._match(op["tokens"])
        r = tree.load_back(m, lid, None if rid is None else holds)
        out.update(r.as_dict())
        if r.slot_granted:
            self.held.add(rid)
        return out

    def _op_load_back_ack(self, op):
        if op["id"] not in self.tree.loads:
            raise HybridTreeError("unknown_load_back_id")
        self.tree.finish_load_back(op["id"])
        return {}

    def _op_write_ack(self, op):
        if op["id"] not in self.tree.writes:
            raise HybridTreeError("unknown_write_id")
        self.tree.write_ack(op["id"])
        return {}

    def _op_dump(self, op):
        tree, a = self.tree, self.kind
        nodes = list(tree.iter_nodes())
        rank = {x.id: r for r, x in enumerate(sorted(nodes, key=lambda x: (x.last_access, x.id)))}
        rows = []
        anchors = {lb.anchor.id: lid for lid, lb in tree.loads.items()}
        wt = self.hicache and tree.ht.wt
        stack = [(tree.root, 0)]
        while stack:
            node, start = stack.pop()
            if node is not tree.root:
                row = {"id": node.id, "parent": node.parent.id, "start": start,
                       "key": self.key_tokens(node), "lock": node.lock, a: node.aux,
                       a + "_lock": node.aux_lock, "recency": rank[node.id]}
                if self.hicache:
                    pend = node.lb
                    row.update(dev=node.dev, host=node.host, host_lock=node.host_lock,
                               **{a + "_host": node.aux_host, a + "_host_lock": node.aux_host_lock},
                               pinned_by=None if pend is None else anchors.get(pend.id, pend.id))
                    if wt:
                        row.update(write_pending=node.wp, hits=node.hit_count)
                rows.append(row)
                start += len(node.key) * self.page_size
            kids = sorted(node.children.values(), key=self.key_tokens)
            stack.extend((c, start) for c in reversed(kids))
        out = {"tree": rows, "lru": [x.id for x in tree.lru.order()],
               "d_leaves": sorted(x.id for x in tree.d_leaves)}
        if self.hicache:
            out.update(host_lru=[x.id for x in tree.hlru.order()],
                       h_leaves=sorted(x.id for x in tree.h_leaves),
                       duplicates=list(tree.dups))
            if wt:
                out["write_ids"] = list(tree.writes)
        return out
