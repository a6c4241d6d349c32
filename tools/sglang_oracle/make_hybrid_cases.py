#!/usr/bin/env python3
"""Build data/conformance/hybrid/: hand-written and generated hybrid cases, with the
outputs SGLang 0.5.23's core gives for them (oracle_hybrid.py), gzip-compressed, and
SHA256SUMS of the uncompressed files.

Usage (in the oracle venv; about a minute):

    $SGLANG_ORACLE_VENV/bin/python tools/sglang_oracle/make_hybrid_cases.py [--check]

Every case is rebuilt from its definition here, so the folder is reproducible: hand
cases from the op lists below, generated ones from gen_hybrid.py's seeds and options.
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

import gen_hybrid  # noqa: E402
from oracle_hybrid import HybridOracle  # noqa: E402

OUT_DIR = Path(__file__).resolve().parents[2] / "data" / "conformance" / "hybrid"


def swa(dev=64, cap=32, w=4, ps=1, **kw):
    return {"op": "header", "components": ["full", "swa"], "device_capacity": dev,
            "swa_capacity": cap, "page_size": ps, "sliding_window": w, **kw}


def mamba(dev=64, cap=8, chunk=4, **kw):
    return {"op": "header", "components": ["full", "mamba"], "device_capacity": dev,
            "mamba_capacity": cap, "page_size": 1, "mamba_chunk": chunk, **kw}


def ins(tokens, **kw):
    return {"op": "insert", "tokens": list(tokens), **kw}


def match(tokens):
    return {"op": "match", "tokens": list(tokens)}


def lock(tokens, lid):
    return {"op": "lock", "tokens": list(tokens), "id": lid}


def unlock(lid):
    return {"op": "unlock", "id": lid}


def evict(**kw):
    return {"op": "evict", **kw}


DUMP = {"op": "dump"}
R = range

HAND = {
    # --- (FULL, SWA) ------------------------------------------------------------
    "h01_swa_window_splits": (swa(note="a request that freed SWA below 4: clip split, "
                                       "then the fresh leaf capped at one window"), [
        ins(R(1, 11), swa_evicted=4), DUMP,
        match(R(1, 5)), match(R(1, 7)), match(R(1, 10)), match(R(1, 11)), DUMP]),
    "h02_swa_revive_unlocked": (swa(note="recomputing a tombstoned prefix revives its "
                                         "SWA from the fresh KV (FULL ids adopted)"), [
        ins(R(1, 11), swa_evicted=6), match(R(1, 11)), DUMP,
        ins(R(1, 11)), DUMP, match(R(1, 11)), ins(list(R(1, 11)) + [20, 21], prev=10),
        DUMP]),
    "h03_swa_revive_locked_full": (swa(note="revival under a FULL lock keeps the locked "
                                            "FULL ids (RecoverSWAWithLockedFull)"), [
        ins(R(1, 13), swa_evicted=8), lock(R(1, 13), 1), DUMP,
        ins(list(R(1, 13)) + [30]), DUMP, unlock(1), DUMP,
        evict(swa=6), DUMP]),
    "h04_swa_lock_boundary_moves_on_split": (swa(note="a window lock's boundary uuid "
                                                      "moves to the upper fragment"), [
        ins(R(1, 9)), ins(list(R(1, 5)) + [40, 41, 42]), lock(R(1, 9), 1), DUMP,
        match(R(1, 4)), match(R(1, 3)), lock(list(R(1, 5)) + [40, 41, 42], 2), DUMP,
        unlock(1), DUMP, unlock(2), DUMP]),
    "h05_swa_release_early": (swa(note="release_swa drops the window lock; FULL stays "
                                       "locked, so SWA tombstones but nothing is deleted"), [
        ins(R(1, 13)), lock(R(1, 13), 1), evict(swa=40), {
            "op": "release_swa", "id": 1}, DUMP, evict(swa=40), DUMP, evict(full=40),
        unlock(1), DUMP, evict(full=3), DUMP]),
    "h06_swa_evict_leaf_vs_internal": (swa(note="SWA LRU eviction: leaves go whole, "
                                                "internal nodes tombstone"), [
        ins(R(1, 9)), ins(list(R(1, 5)) + [9, 9, 9]), ins(list(R(1, 3)) + [7, 7, 7, 7]),
        DUMP, evict(swa=1), DUMP, evict(swa=4), DUMP, evict(swa=5), DUMP,
        evict(full=2, swa=2), DUMP]),
    "h07_swa_errors": (swa(dev=16, cap=8, ps=2, note="refused ops change nothing"), [
        ins(R(1, 9)), ins(R(1, 21)), ins(R(30, 38), swa_evicted=3), ins(R(1, 9), prev=10),
        ins(R(50, 60), prev=2), ins(R(60, 66), swa_evicted=0), ins(R(70, 74)),
        unlock(9), lock(R(1, 9), 1), lock(R(1, 5), 1), {"op": "release_swa", "id": 1},
        {"op": "release_swa", "id": 1}, {"op": "release_swa", "id": 2}, unlock(1), DUMP]),
    "h08_swa_page2_window3": (swa(dev=80, cap=40, w=3, ps=2, note="window 3 at page 2: "
                                                                 "the leaf tail is 4"), [
        ins(R(1, 16), swa_evicted=6), DUMP, match(R(1, 9)), match(R(1, 12)),
        ins(list(R(1, 9)) + [50, 51, 52], prev=8), lock(R(1, 16), 1), DUMP,
        ins(R(1, 16)), DUMP, unlock(1), evict(swa=7), DUMP]),
    "h09_swa_match_refreshes_window": (swa(w=5, note="a match refreshes the window "
                                                     "ancestors only; eviction order shows it"), [
        ins(R(1, 4)), ins(R(1, 7)), ins(R(1, 10)), ins(R(1, 13)), ins([1, 2, 3, 90, 91]),
        DUMP, match(R(1, 13)), DUMP, match([1, 2, 3, 90, 91]), DUMP,
        evict(swa=3), DUMP, evict(swa=3), DUMP, evict(swa=30), DUMP]),
    "h10_swa_lock_root_reaching": (swa(w=20, note="a lock shorter than the window has no "
                                                  "boundary: its release walks to the root"), [
        ins(R(1, 6)), ins(R(1, 9)), lock(R(1, 9), 1), lock(R(1, 6), 2), DUMP,
        ins(R(1, 4)), DUMP, unlock(1), DUMP, unlock(2), DUMP]),
    "h11_swa_leaf_outside_window": (swa(note="a new leaf wholly below the request's SWA "
                                             "cursor stays a tombstone on FULL alone"), [
        ins(R(1, 9)), ins(list(R(1, 9)) + [20, 21, 22], prev=8, swa_evicted=12), DUMP,
        match(list(R(1, 9)) + [20, 21, 22]), evict(swa=2), DUMP, evict(swa=8), DUMP,
        ins(list(R(1, 9)) + [20, 21, 22, 23, 24, 25, 26, 27], prev=11, swa_evicted=12), DUMP,
        evict(full=3), DUMP]),
    # --- (FULL, MAMBA) ----------------------------------------------------------
    "h01_mamba_leaf_state_and_split": (mamba(note="the state stays on the lower "
                                                  "fragment; a match needs one"), [
        ins(R(1, 9)), match(R(1, 6)), DUMP, match(R(1, 9)), match(R(1, 12)),
        match(list(R(1, 6)) + [7]), DUMP]),
    "h02_mamba_exist": (mamba(note="a second insert keeps the tree's state and frees "
                                   "the request's; an internal node takes one"), [
        ins(R(1, 9)), ins(R(1, 9)), ins(R(1, 9), prev=8), ins(R(1, 13)), match(R(1, 5)),
        ins(R(1, 5)), ins(R(1, 5)), DUMP]),
    "h03_mamba_internal_tombstone": (mamba(note="Mamba LRU eviction: internal states "
                                                "tombstone, leaves go whole"), [
        ins(R(1, 5)), ins(R(1, 9)), ins(list(R(1, 5)) + [20, 21]), DUMP,
        evict(mamba=1), DUMP, evict(mamba=1), DUMP, match(R(1, 9)), evict(mamba=2), DUMP]),
    "h04_mamba_lock": (mamba(note="a lock pins the anchor's state and its FULL path"), [
        ins(R(1, 7)), ins(list(R(1, 4)) + [8, 8]), lock(R(1, 7), 1), evict(mamba=5), DUMP,
        evict(full=20), DUMP, lock(R(1, 4), 2), DUMP, unlock(1), unlock(2),
        evict(mamba=1), DUMP]),
    "h05_mamba_max_states": (mamba(mamba_max_states=2, note="the path cap tombstones "
                                                             "the shallowest states"), [
        ins(R(1, 3)), ins(R(1, 5)), ins(R(1, 7)), DUMP, ins(R(1, 9)), DUMP,
        ins(list(R(1, 3)) + [30]), ins(R(1, 11)), DUMP, lock(R(1, 11), 1),
        ins(R(1, 13)), DUMP, unlock(1), DUMP]),
    "h06_mamba_errors": (mamba(dev=12, cap=2, note="refused ops change nothing"), [
        ins(R(1, 5)), ins(R(10, 13)), ins(R(20, 22)), ins(R(1, 20)), ins(R(1, 7), prev=5),
        ins(R(1, 5), prev=4), unlock(3), lock(R(1, 5), 1), lock(R(1, 5), 1), unlock(1),
        evict(mamba=1), ins(R(20, 22)), DUMP]),
    "h08_mamba_skip_lock": (mamba(note="a lock that skips the state "
                                       "(SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK) leaves it evictable"), [
        ins(R(1, 7)), ins(list(R(1, 4)) + [9, 9]), {"op": "lock", "tokens": list(R(1, 7)),
                                                    "id": 1, "skip": ["mamba"]},
        lock(R(1, 7), 2), DUMP, evict(mamba=2), DUMP, unlock(2), evict(mamba=1), DUMP,
        evict(full=30), DUMP, unlock(1), DUMP, evict(full=30), DUMP]),
    "h09_mamba_copy_on_write": (mamba(cap=2, note="a request copies the matched state "
                                              "into its own slot, evicting one under a "
                                              "lock when the pool is full"), [
        ins(R(1, 5)), ins(R(10, 14)), {"op": "match", "tokens": list(R(1, 6)), "cow": "r1"},
        DUMP, {"op": "match", "tokens": list(R(1, 5)), "cow": "r2"},
        {"op": "match", "tokens": list(R(1, 5)), "cow": "r1"},
        ins(R(1, 5), donate="r1"), {"op": "match", "tokens": list(R(10, 14)), "cow": "r3"},
        {"op": "release", "id": "r3"}, {"op": "match", "tokens": list(R(1, 5)), "cow": "r4"},
        ins(R(20, 23)), ins(list(R(1, 5)) + [7, 7], prev=4, donate="r4"), DUMP,
        {"op": "match", "tokens": list(R(1, 5)), "cow": "r5"}, ins(R(30, 33)),
        {"op": "release", "id": "r5"}, {"op": "evict_for_alloc", "full": 3, "mamba": 1},
        ins(R(1, 5), donate="r9"), DUMP]),
    "h07_mamba_branch": (mamba(chunk=3, note="branching seqlen on the chunk grid"), [
        ins(R(1, 4)), ins(R(1, 11)), match(R(1, 11)), match(R(1, 9)), match(R(1, 7)),
        match(list(R(1, 6)) + [0]), DUMP, ins(R(1, 7)), match(R(1, 9)), DUMP]),
}

# (name, kind, gen_hybrid options)
GENERATED = []
for i, (ps, w, dev, cap, ops) in enumerate([
        (1, 8, 96, 40, 600), (1, 8, 96, 40, 600), (1, 4, 64, 24, 600), (1, 16, 160, 64, 800),
        (1, 3, 48, 16, 500), (1, 8, 200, 30, 800), (2, 6, 96, 40, 600), (2, 8, 128, 48, 600),
        (2, 3, 64, 24, 500), (4, 8, 160, 64, 600), (4, 5, 128, 48, 600), (1, 8, 300, 120, 2000),
        (1, 1, 64, 16, 500), (2, 2, 64, 20, 500), (1, 12, 96, 24, 700), (4, 16, 256, 96, 600),
        (1, 6, 80, 80, 600), (1, 8, 96, 40, 600), (2, 4, 72, 30, 600), (1, 5, 60, 12, 600),
        (1, 8, 120, 50, 1000), (2, 10, 140, 60, 600), (1, 2, 40, 10, 500), (4, 4, 96, 32, 500)],
        start=1):
    GENERATED.append((f"g{i:02d}_swa_ps{ps}_w{w}", "swa",
                      dict(seed=100 + i, ops=ops, page_size=ps, window=w, device_cap=dev,
                           aux_cap=cap)))
for i, (chunk, dev, cap, ms, ops) in enumerate([
        (4, 96, 40, -1, 600), (4, 96, 12, -1, 600), (1, 64, 8, -1, 600), (8, 160, 20, -1, 800),
        (2, 48, 6, -1, 500), (4, 200, 30, -1, 800), (4, 96, 40, 2, 600), (4, 128, 40, 1, 600),
        (3, 96, 16, 3, 600), (16, 160, 24, -1, 600), (4, 300, 60, -1, 2000), (1, 40, 4, -1, 500),
        (4, 80, 80, -1, 600), (5, 96, 10, 2, 600), (4, 120, 20, -1, 1000), (2, 64, 12, 4, 600),
        (6, 96, 16, -1, 600), (4, 50, 5, 1, 500), (8, 256, 64, -1, 700), (4, 96, 3, -1, 500),
        (4, 140, 32, 2, 800), (3, 72, 9, -1, 600), (4, 96, 40, -1, 600), (2, 110, 14, 3, 700)],
        start=1):
    GENERATED.append((f"g{i:02d}_mamba_c{chunk}" + (f"_cap{ms}" if ms > 0 else ""), "mamba",
                      dict(seed=200 + i, ops=ops, chunk=chunk, device_cap=dev, aux_cap=cap,
                           max_states=ms)))
# Mamba past page size 1 (--enable-mamba-extra-buffer): the checkpoint grid is
# lcm(chunk, page).
for i, (ps, chunk, dev, cap, ms, ops) in enumerate([
        (2, 4, 128, 30, -1, 600), (4, 4, 192, 30, -1, 600), (2, 3, 96, 12, 2, 600),
        (4, 6, 256, 40, -1, 800)], start=25):
    GENERATED.append((f"g{i:02d}_mamba_ps{ps}_c{chunk}" + (f"_cap{ms}" if ms > 0 else ""),
                      "mamba", dict(seed=200 + i, ops=ops, page_size=ps, chunk=chunk,
                                    device_cap=dev, aux_cap=cap, max_states=ms,
                                    max_len=12 * ps)))


def dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


def run_hand(header, ops, check):
    o = HybridOracle(header)
    outs = [{"i": 0, "op": "header", "events": [], **o.summary()}]
    for i, op in enumerate(ops, start=1):
        outs.append({"i": i, **o.apply(op)})
        if check:
            o.check()
    return [header, *ops], outs


def run_gen(kind, opts, check):
    defaults = dict(page_size=1, window=8, chunk=4, max_states=-1, max_len=24, check=check)
    args = argparse.Namespace(kind=kind, **{**defaults, **opts})
    g = gen_hybrid.Gen(args, HybridOracle)
    g.run(args.ops)
    return [g.header, *g.ops], g.outs


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
                    help="run SGLang's sanity_check and pool accounting after every op")
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
    for name, kind, opts in GENERATED:
        trace, outs = run_gen(kind, opts, args.check)
        write(name, trace, outs, sums)
        n_ops += len(trace) - 1
    (OUT_DIR / "SHA256SUMS").write_text("".join(f"{d}  {n}\n" for n, d in sorted(sums.items())))
    print(f"{len(HAND) + len(GENERATED)} cases, {n_ops} ops -> {OUT_DIR}")


if __name__ == "__main__":
    main()
