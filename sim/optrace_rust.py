"""What an output line of SGLang's Rust tree core can be compared on.

The Rust core has no node objects, so the shared Rust oracle
(../shared/oracle/rust/oracle_rust.py) derives its outputs from return values and
by-id queries; its README ("Not observable") lists what it cannot show and its
compare.py `project` what both sides are compared on. `project_rust` is that
projection with the digest left raw: replay-ops under a Rust id scheme (``rust``,
``rust_server``) folds the Rust core's digest event itself, so the values must be equal.
"""

from __future__ import annotations

# What the Rust API cannot show (../shared/oracle/rust/README.md, "Not observable";
# compare.py `project`): these events, per-node lock/recency fields of a dump, and the
# reclaim pass of a dup_reclaim (inferred there), compared as a list of its own.
RUST_UNOBSERVABLE_EVENTS = {"dup_sweep", "tombstone"}
RUST_DUMP_FIELDS = ("id", "parent", "start", "key", "dev", "host")


def _drops_sorted(evs: list) -> list:
    """A drop fallback's ``drop_host`` events sorted by id within each run: the Rust
    core's `drop_subtree_no_host` reports the subtree's host frees in its own walk
    order (measured: jitter_host_alloc_failure, rank 1), the same nodes and sizes, the
    same tree after; the Python core and replay-ops report them in theirs."""
    out, run = [], []
    for e in evs + [None]:
        if e is not None and e["k"] == "drop_host":
            run.append(e)
            continue
        out.extend(sorted(run, key=lambda x: x["id"]))
        run = []
        if e is not None:
            out.append(e)
    return out


def project_rust(rec: dict) -> dict:
    """An output line as ../shared/oracle/rust/compare.py projects both sides, the
    digest left raw (both sides fold the Rust core's digest event)."""
    r = dict(rec)
    for k in ("i", "notes", "partial", "panic"):
        r.pop(k, None)
    evs, passes = [], []
    for e in r.pop("events", []):
        if e["k"] in RUST_UNOBSERVABLE_EVENTS:
            continue
        e = dict(e)
        if e["k"] == "dup_reclaim":
            passes.append(e.pop("pass", None))
            e.pop("pass_inferred", None)
        evs.append(e)
    r["events"], r["_pass"] = _drops_sorted(evs), passes
    if r.get("op") == "dump" and "error" not in r:
        r["tree"] = [{k: n[k] for k in RUST_DUMP_FIELDS} for n in r.get("tree", [])]
        for k in ("duplicates", "d_leaves", "h_leaves"):
            r.pop(k, None)
    return r
