"""Where and how TP ranks diverge, read from their op-traces.

What this is for: a repro bundle holds one op-trace per rank. Re-running each through
``sim.optrace.Replayer`` (``rerun_ops``) gives, per op, the tree's events (the eviction, backup and
reclaim *victims*), its occupancy and its digest. Comparing two ranks' states op by
op finds the first divergent event; diffing their trees at that op shows what
differs; the digests per op are the timeline SGLang's per-step check samples.

Two hicache-sim extensions of the op-trace header are honoured here (documented in
docs/REPRO.md): ``host_alloc_failures`` (``[[op index, attempt], ...]``, the host
allocations that failed on this rank: op-trace v1 has no op for an allocator
failure) and ``ids`` / ``host_policy`` / ``eviction_policy`` (the tree variant the
engine ran).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.optrace import Replayer
from sim.tree import Tree

# Tree events that remove, move or copy a node's KV: the victims of a decision.
VICTIM_KINDS = ("backup", "demote", "drop", "drop_host", "drop_declined", "delete",
                "host_evict", "dup_reclaim", "dup_sweep", "tombstone")
# Output fields that depend on node ids only (the id drift changes them, the
# logical state does not).
_ID_FIELDS = ("i", "digest", "events")


@dataclass
class RankState:
    """One rank's op-trace re-run: the per-op outputs and the final tree."""

    header: dict
    ops: list          # the ops (header excluded); ops[j - 1] produced outputs[j]
    outputs: list      # outputs[0] is the header's
    tree: Tree

    @property
    def final_digest(self) -> int:
        return self.outputs[-1]["digest"]


def rerun_ops(trace: list[dict], upto: int | None = None) -> RankState:
    """Re-run ``trace`` (header first) through a fresh tree, up to output ``upto``."""
    header = trace[0]
    r = Replayer(header, ids=header.get("ids", "optrace"),
                 host_policy=header.get("host_policy", "duplicate_first"))
    ops = trace[1:]
    outputs = [r.header_output()]
    last = len(ops) if upto is None else min(upto, len(ops))
    for i in range(1, last + 1):
        outputs.append(r.apply(i, ops[i - 1]))
    return RankState(header, ops, outputs, r.tree)


def _unit_page(unit) -> int:
    """A replayed unit back to the engine's page id (pages are runs of one id)."""
    return unit[0] if isinstance(unit, tuple) else unit


def comparable_output(out: dict) -> tuple:
    """An op's output without node ids: what two logically equal replicas share."""
    events = tuple((e["k"], tuple(e["path"]), tuple(sorted((k, v) for k, v in e.items()
                                                          if k not in ("k", "id", "path", "child"))))
                   for e in out.get("events", ()))
    rest = tuple(sorted((k, str(v)) for k, v in out.items() if k not in _ID_FIELDS))
    return events, rest


def _decision(op: dict) -> dict:
    """An op without ``reserved``: device KV held outside the tree is allocator state,
    and a late free is not a divergence until it changes a decision."""
    return {k: v for k, v in op.items() if k != "reserved"}


def first_divergent_op(a: RankState, b: RankState, times_a: list | None = None,
                       times_b: list | None = None) -> int | None:
    """The first output index where the two ranks' op, its logical result, or (given
    each op's time) when it ran differ."""
    n = min(len(a.ops), len(b.ops))
    for i in range(1, n + 1):
        if (_decision(a.ops[i - 1]) != _decision(b.ops[i - 1])
                or comparable_output(a.outputs[i]) != comparable_output(b.outputs[i])):
            return i
        if times_a is not None and times_b is not None and times_a[i - 1] != times_b[i - 1]:
            return i
    if len(a.ops) != len(b.ops):
        return n + 1
    return None


def summarise_op(op: dict | None) -> str:
    """A short, readable form of an op (token lists abbreviated)."""
    if op is None:
        return "(no op: the trace ended)"
    parts = [op["op"]]
    for k, v in op.items():
        if k == "op":
            continue
        if isinstance(v, list):
            parts.append(f"{k}=[{len(v)} tokens]")
        else:
            parts.append(f"{k}={v}")
    return " ".join(parts)


def victims(out: dict, page_size: int) -> list[dict]:
    """The victim events of one op's output, paths as page counts and tails."""
    rows = []
    for e in out.get("events", ()):
        if e["k"] not in VICTIM_KINDS:
            continue
        row = {"kind": e["k"], "node": e["id"], "depth_pages": len(e["path"]) // max(1, page_size)}
        row.update({k: v for k, v in e.items() if k not in ("k", "id", "path")})
        rows.append(row)
    return rows


def _rows(tree: Tree) -> dict[tuple, dict]:
    out = {}
    for x in tree.iter_nodes():
        path = tuple(_unit_page(u) for u in tree.path_units(x))
        out[path] = {"id": x.id, "pages": len(x.key), "dev": x.dev, "host": x.host,
                     "lock": x.lock, "host_lock": x.host_lock}
    return out


def _show_path(path: tuple) -> str:
    if len(path) <= 4:
        return f"[{', '.join(map(str, path))}]"
    return f"[{path[0]}, {path[1]}, ..., {path[-1]}] ({len(path)} pages)"


def tree_diff(a: Tree, b: Tree, limit: int = 20) -> dict:
    """Nodes (by path from the root) present in one tree only, or with different
    residency or locks, and the pools' occupancy; node ids are ignored."""
    ra, rb = _rows(a), _rows(b)
    only_a = [p for p in ra if p not in rb]
    only_b = [p for p in rb if p not in ra]
    keys = ("pages", "dev", "host", "lock", "host_lock")
    differ = [p for p in ra if p in rb and any(ra[p][k] != rb[p][k] for k in keys)]

    def fmt(p, rows):
        r = rows[p]
        return {"path": _show_path(p), **{k: r[k] for k in ("id",) + keys}}

    def occupancy(t: Tree) -> dict:
        # reserved: device KV running requests hold outside the tree (the engine's too)
        return {"dev": t.dev_used, "host": t.host_used, "nodes": t.n_nodes,
                "evictable": t.evictable, "protected": t.protected, "reserved": t.reserved}

    occ = {"a": occupancy(a), "b": occupancy(b)}
    return {
        "equal": not (only_a or only_b or differ) and occ["a"] == occ["b"],
        "nodes_equal": not (only_a or only_b or differ),
        "occupancy": occ,
        "digest": {"a": a.digest, "b": b.digest},
        "counts": {"only_a": len(only_a), "only_b": len(only_b), "differ": len(differ)},
        "only_a": [fmt(p, ra) for p in only_a[:limit]],
        "only_b": [fmt(p, rb) for p in only_b[:limit]],
        "differ": [{"path": _show_path(p), "a": {k: ra[p][k] for k in ("id",) + keys},
                    "b": {k: rb[p][k] for k in ("id",) + keys}} for p in differ[:limit]],
    }


def digest_timeline(rep: RankState) -> list[list[int]]:
    """``[op index, digest]`` at the start and after every op that changed the digest."""
    out = [[0, rep.outputs[0]["digest"]]]
    for o in rep.outputs[1:]:
        if o["digest"] != out[-1][1]:
            out.append([o["i"], o["digest"]])
    return out
