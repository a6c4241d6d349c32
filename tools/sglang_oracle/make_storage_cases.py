#!/usr/bin/env python3
"""Build data/conformance/storage/: hand-written and generated op-traces with storage
(L3) ops (docs/OPTRACE.md §14), with the outputs SGLang 0.5.23's own tree gives for
them (oracle_storage.py), gzip-compressed, and SHA256SUMS of the uncompressed files.

Usage (in the oracle venv; under a minute):

    $SGLANG_ORACLE_VENV/bin/python tools/sglang_oracle/make_storage_cases.py [--check]

Every case is rebuilt from its definition here: hand cases from the op lists below,
generated ones from gen_storage.py's seeds and options.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_storage  # noqa: E402
from oracle_storage import StorageOracle  # noqa: E402

OUT_DIR = Path(__file__).resolve().parents[2] / "data" / "conformance" / "storage"


def hdr(dev=32, host=32, policy="write_back", ps=1, threshold=2, acks="end_of_op", **kw):
    return {"op": "header", "device_capacity": dev, "host_capacity": host, "page_size": ps,
            "write_policy": policy, "load_back_threshold": 1, "version": 2,
            "write_acks": acks, "prefetch_threshold": threshold, **kw}


def ins(tokens):
    return {"op": "insert", "tokens": list(tokens)}


def pf(tokens, pid):
    return {"op": "prefetch", "tokens": list(tokens), "id": pid}


def hit(pid, n):
    return {"op": "prefetch_hit", "id": pid, "n": n}


def done(pid, n):
    return {"op": "prefetch_done", "id": pid, "n": n}


def revoke(pid):
    return {"op": "prefetch_revoke", "id": pid}


def sw(node, wid):
    return {"op": "storage_write", "node": node, "id": wid}


def swack(wid):
    return {"op": "storage_write_ack", "id": wid}


def ev_dev(n):
    return {"op": "evict_device", "n": n}


def ev_host(n):
    return {"op": "evict_host", "n": n}


def wack(i):
    return {"op": "write_ack", "id": i}


def lock(tokens, lid):
    return {"op": "lock", "tokens": list(tokens), "id": lid}


def unlock(lid):
    return {"op": "unlock", "id": lid}


DUMP = {"op": "dump"}
R = range

HAND = {
    "h01_wb_host_leaf_under_device_node": (hdr(note=(
        "write_back: the walk passes a device-only node that an insert made while the "
        "prefetch was in flight; its fetched slots are freed (prefix_len counts it) and "
        "the rest becomes a host-only leaf under it")), [
        ins(R(1, 5)), ev_dev(4), pf(R(1, 9), "p1"), hit("p1", 4), ins(R(1, 7)), DUMP,
        done("p1", 4), DUMP, ev_host(64), DUMP]),
    "h02_wt_refill": (hdr(host=8, policy="write_through", note=(
        "write_through: a device-only node (its backup failed, host held by the staged "
        "prefetch) is walked and refilled with the fetched copy; prefix_len counts only "
        "nodes that were backed already")), [
        ins(R(1, 5)), pf(R(1, 9), "p1"), hit("p1", 4), ins(R(1, 7)), DUMP,
        done("p1", 4), DUMP]),
    "h03_split_in_walk": (hdr(note=(
        "a root-anchored prefetch lands on a key that shares two tokens with a node "
        "inserted meanwhile: insert_host splits it (new upper id, touch before split) "
        "and grafts the rest under the upper fragment")), [
        ins([7, 7]), pf([9, 9, 9, 9], "p1"), hit("p1", 4), ins([9, 9, 5, 5]),
        done("p1", 4), DUMP]),
    "h04_wt_split_of_pending_write": (hdr(policy="write_through", acks="op", note=(
        "explicit write acks: the walk splits a node whose backup is still in flight; "
        "the ack publishes both fragments, and SGLang writes each to storage")), [
        pf([9, 9, 9, 9], "p1"), hit("p1", 4), ins([9, 9, 5, 5]), DUMP,
        done("p1", 4), DUMP, wack(1), sw(3, "w1"), sw(1, "w2"), ev_dev(64), ev_host(64),
        DUMP, swack("w1"), swack("w2"), ev_host(64), DUMP]),
    "h05_anchor_split_in_flight": (hdr(note=(
        "the anchor is split by an insert while its prefetch is in flight: it keeps its "
        "id and lower half, the host lock's top moves to the new upper fragment, and the "
        "release walks both")), [
        ins(R(1, 5)), ev_dev(4), pf([1, 2, 3, 4, 7, 7], "p1"), hit("p1", 2),
        ins([1, 2, 5, 5]), DUMP, ev_dev(64), ev_host(64), DUMP, done("p1", 2), DUMP,
        ev_host(64), DUMP]),
    "h06_alloc_evicts_whole_hit": (hdr(host=7, threshold=1, note=(
        "allocate_storage_hit: when the hit does not fit, it evicts the whole hit from "
        "host (4), not the shortfall (3), so two H-leaves go, not one; a done of fewer "
        "tokens than staged releases the tail")), [
        ins(R(1, 4)), ev_dev(3), ins(R(11, 13)), ev_dev(2), ins([21]), ev_dev(1), DUMP,
        pf(R(31, 35), "p1"), hit("p1", 4), DUMP, done("p1", 4),
        pf(R(41, 47), "p2"), hit("p2", 6), done("p2", 3), DUMP]),
    "h07_partial_rate_limit_host_capacity": (hdr(host=10, policy="write_through", threshold=3, note=(
        "write_through duplicates cannot be host-evicted: a hit of 4 with 3 free gets a "
        "partial 3 (>= threshold 3); the occupied cap int(0.5 * 10) = 5 declines a third "
        "prefetch (rate_limited); a hit with nothing free is revoked (host_capacity)")), [
        ins(R(1, 8)), pf(R(11, 15), "p1"), hit("p1", 4), DUMP,
        pf(R(21, 25), "p2"), pf(R(31, 35), "p3"), hit("p2", 4), done("p1", 3), DUMP,
        pf(R(31, 35), "p3"), DUMP]),
    "h08_anchor_host_lock_and_empty_done": (hdr(note=(
        "the anchor's host lock keeps it off the H-leaf set while the prefetch is in "
        "flight; a done of 0 tokens still touches the anchor (insert_host's first "
        "_touch_node) and inserts nothing")), [
        ins(R(1, 5)), ins(R(11, 15)), ev_dev(8), pf(R(1, 9), "p1"), DUMP, ev_host(4),
        DUMP, hit("p1", 4), done("p1", 0), DUMP, ev_host(4), DUMP]),
    "h09_storage_write_blocks_reclaim": (hdr(host=8, note=(
        "write_backup_storage host-locks a duplicate until the storage ack: reclaim "
        "skips it (not reclaimable) and takes it after the ack; a node without a host "
        "copy is not written")), [
        ins(R(1, 5)), ins(R(11, 15)), ev_dev(8), {"op": "load_back", "tokens": list(R(1, 5)), "id": "l1"},
        {"op": "load_back_ack", "id": "l1"}, ins(R(21, 23)), sw(1, "w1"), sw(3, "w2"),
        DUMP, ev_host(4), DUMP, swack("w1"), ev_host(4), DUMP]),
    "h10_page_size_2": (hdr(ps=2, threshold=4, host=16, note=(
        "page size 2: keys and hits are whole pages; an unaligned prefetch tail is "
        "dropped (page_aligned), a walk splits at a page boundary")), [
        ins([1, 1, 2, 2, 3, 3]), ev_dev(6), pf([1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6], "p1"),
        hit("p1", 4), ins([1, 1, 2, 2, 3, 3, 4, 4, 8, 8]), done("p1", 4), DUMP,
        pf([1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 7], "p2"), hit("p2", 4), done("p2", 4),
        DUMP]),
    "h11_errors": (hdr(note="every storage error code and decline reason; no error changes the state"), [
        ins(R(1, 5)), ev_dev(4), pf(R(1, 9), "p0"), pf(R(31, 39), "p1"), pf(R(31, 39), "p1"),
        done("p1", 4), hit("x", 2), hit("p1", 9), hit("p1", 8), hit("p1", 8), done("p1", 9),
        revoke("x"), done("p1", 8), done("p1", 8), sw(1, "w1"), sw(1, "w1"), sw(99, "w2"),
        swack("w2"), swack("w1"), swack("w1"), pf([41], "p2"), pf([], "p3"),
        ins([51, 52]), pf([51, 52, 53, 54], "p4"), DUMP]),
    "h12_ids_server": (hdr(ids="server", policy="write_through", note=(
        "a real server's numbering (root 5, first node 10): the anchor and the new host "
        "leaf ids follow it")), [
        ins(R(1, 5)), pf(R(1, 9), "p1"), hit("p1", 4), done("p1", 4), DUMP,
        ev_dev(64), ev_host(64), DUMP]),
    "h13_wb_auto_writes_lock_demoted_nodes": (hdr(host=4, storage_writes="auto", note=(
        "storage on (storage_writes auto): each write_back eviction backup is written to "
        "storage before its demote, host-locking the node; the third backup of the same "
        "walk cannot evict the first two from host and is dropped")), [
        ins([1, 2]), ins([3, 4]), ins([5, 6]), ev_dev(6), DUMP, swack("s1"), ev_host(2),
        DUMP, swack("s2"), ev_host(2), DUMP]),
    "h14_wt_auto_writes_after_acks": (hdr(policy="write_through", acks="op",
                                          storage_writes="auto", note=(
        "write_through with explicit acks: the ack publishes both fragments of a split "
        "pending node and each is written; an explicit storage_write holding 's2' makes "
        "the automatic ids skip it")), [
        ins([1, 2, 3, 4]), ins([1, 2, 5, 6]), sw(1, "s2"), DUMP, wack(1), DUMP, wack(3),
        ev_dev(64), ev_host(64), DUMP, swack("s1"), swack("s2"), swack("s3"), swack("s4"),
        ev_host(64), DUMP]),
}

# (name, gen_storage options)
GENERATED = []
for i, (ps, policy, ops, acks) in enumerate([
        (1, "write_back", 600, None), (1, "write_back", 800, None), (1, "write_back", 1000, None),
        (1, "write_through", 600, True), (1, "write_through", 800, False),
        (1, "write_through", 1000, True), (2, "write_back", 600, None), (2, "write_back", 800, None),
        (2, "write_through", 600, True), (2, "write_through", 800, False),
        (4, "write_back", 600, None), (4, "write_back", 800, None), (4, "write_through", 600, True),
        (4, "write_through", 800, True), (1, "write_back", 1500, None),
        (1, "write_through", 1500, True), (2, "write_back", 1200, None),
        (2, "write_through", 1200, True), (1, "write_back", 400, None),
        (1, "write_through", 400, True), (4, "write_back", 1000, None),
        (4, "write_through", 1000, False), (1, "write_back", 700, None),
        (2, "write_through", 700, True)], start=1):
    tag = "wb" if policy == "write_back" else ("wt_acks" if acks else "wt")
    GENERATED.append((f"g{i:02d}_{tag}_ps{ps}", dict(seed=1500 + i, n_ops=ops, page_size=ps,
                                                   policy=policy, explicit_acks=acks)))


# storage on: every D->H ack writes to storage (header "storage_writes": "auto").
for i, (ps, policy, ops, acks) in enumerate([
        (1, "write_back", 800, None), (1, "write_back", 1200, None), (2, "write_back", 800, None),
        (4, "write_back", 800, None), (1, "write_through", 800, True),
        (1, "write_through", 1200, False), (2, "write_through", 800, True),
        (4, "write_through", 800, True)], start=len(GENERATED) + 1):
    tag = "wb" if policy == "write_back" else ("wt_acks" if acks else "wt")
    GENERATED.append((f"g{i:02d}_{tag}_ps{ps}_auto", dict(
        seed=1500 + i, n_ops=ops, page_size=ps, policy=policy, explicit_acks=acks,
        auto_writes=True)))


def dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


def run_hand(header, ops, check):
    o = StorageOracle(header)
    outs = [{"i": 0, "op": "header", "events": [], **o.summary()}]
    for i, op in enumerate(ops, start=1):
        outs.append({"i": i, **o.apply_ext(i, op)})
        if check:
            o.check()
    return [header, *ops], outs


def run_gen(opts):
    g = gen_storage.generate(**opts)
    return g.trace, [{"i": i, **out} for i, out in enumerate(g.outputs)]


def write(name, trace, outs, sums):
    for suffix, rows in ((".jsonl", trace), (".out.jsonl", outs)):
        data = "".join(dumps(r) + "\n" for r in rows).encode()
        sums[name + suffix] = hashlib.sha256(data).hexdigest()
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0) as gz:
            gz.write(data)
        (OUT_DIR / f"{name}{suffix}.gz").write_bytes(buf.getvalue())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="run SGLang's sanity_check and the pool accounting after every "
                         "hand-case op (generated cases always run it)")
    args = ap.parse_args()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for p in OUT_DIR.glob("*.gz"):
        p.unlink()
    sums: dict[str, str] = {}
    n_ops = 0
    for name, (header, ops) in HAND.items():
        trace, outs = run_hand(header, ops, args.check)
        write(name, trace, outs, sums)
        n_ops += len(ops)
    for name, opts in GENERATED:
        trace, outs = run_gen(opts)
        write(name, trace, outs, sums)
        n_ops += len(trace) - 1
    (OUT_DIR / "SHA256SUMS").write_text("".join(f"{d}  {n}\n" for n, d in sorted(sums.items())))
    print(f"{len(HAND) + len(GENERATED)} cases, {n_ops} ops -> {OUT_DIR}")


if __name__ == "__main__":
    main()
