#!/usr/bin/env python3
"""Build data/conformance/hybrid/: hand-written and generated hybrid cases, with the
outputs SGLang 0.5.23's core gives for them (oracle_hybrid.py), gzip-compressed, and
SHA256SUMS of the uncompressed files.

Usage (in the oracle venv; about a minute):

    $SGLANG_ORACLE_VENV/bin/python tools/sglang_oracle/make_hybrid_cases.py [--check] [--only PREFIX]

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
from oracle_hybrid import HostHybridOracle, HybridOracle  # noqa: E402

OUT_DIR = Path(__file__).resolve().parents[2] / "data" / "conformance" / "hybrid"


def swa(dev=64, cap=32, w=4, ps=1, **kw):
    return {"op": "header", "components": ["full", "swa"], "device_capacity": dev,
            "swa_capacity": cap, "page_size": ps, "sliding_window": w, **kw}


def mamba(dev=64, cap=8, chunk=4, **kw):
    return {"op": "header", "components": ["full", "mamba"], "device_capacity": dev,
            "mamba_capacity": cap, "page_size": 1, "mamba_chunk": chunk, **kw}


def hmamba(dev=64, cap=8, chunk=4, host=64, mhost=8, **kw):
    """A (FULL, MAMBA) header with the host tier (write_back)."""
    return mamba(dev=dev, cap=cap, chunk=chunk, hicache=True, host_capacity=host,
                 mamba_host_capacity=mhost, **kw)


def hswa(dev=64, cap=32, w=4, ps=1, host=64, shost=32, **kw):
    """A (FULL, SWA) header with the host tier (write_back)."""
    return swa(dev=dev, cap=cap, w=w, ps=ps, hicache=True, host_capacity=host,
               swa_host_capacity=shost, **kw)


def wswa(policy="write_through", **kw):
    """A (FULL, SWA) header with the host tier under a write_through policy."""
    return hswa(write_policy=policy, **kw)


def wmamba(policy="write_through", **kw):
    """A (FULL, MAMBA) header with the host tier under a write_through policy."""
    return hmamba(write_policy=policy, **kw)


def wack(ack_id):
    return {"op": "write_ack", "id": ack_id}


# In a hand case: one write_ack per write in flight, in issue order (what SGLang's
# writing_check does once they have all completed), expanded when the case is built.
ACK_ALL = "ACK_ALL"


def chunked(first, n_chunks=3, chunk=4):
    """A prompt's chunked prefill: one insert per chunk, each reusing the previous
    checkpoint (``prev``, which the request also inserted: ``inserted``), each bringing
    a state (a checkpoint)."""
    toks = list(R(first, first + n_chunks * chunk))
    return [ins(toks[:(k + 1) * chunk], **({"prev": k * chunk, "inserted": k * chunk}
                                           if k else {}))
            for k in range(n_chunks)]


def fill_and_replay(mhost):
    """sglang #39436 at small scale: 8 prompts of 12 tokens, 3 checkpoints each,
    chunked-prefilled through a device tier of 4 prompts and a FULL host tier of all
    8; the state host pool decides what replays from host."""
    ops = []
    for k in range(8):
        if k >= 4:
            ops.append(evict(full=12))
        ops.extend(chunked(100 * (k + 1)))
        ops.append(ACK_ALL)
    ops.append(DUMP)
    for k in range(4):  # the evicted prompts, replayed
        ops.append(match(R(100 * (k + 1), 100 * (k + 1) + 12)))
    ops.extend([lb(R(100, 112), 1), DUMP, ack(1)])
    return ops


def lb(tokens, lid, req=None):
    op = {"op": "load_back", "tokens": list(tokens), "id": lid}
    if req is not None:
        op["req"] = req
    return op


def ack(lid):
    return {"op": "load_back_ack", "id": lid}


def ehost(**kw):
    return {"op": "evict_host", **kw}


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
    # --- (FULL, MAMBA) with the host tier (write_back) ---------------------------
    "x01_mamba_host_backup_demote": (hmamba(note="write_back: an evicted leaf is backed "
                                                 "up with its state and demoted; a "
                                                 "load-back restores both"), [
        ins(R(1, 7)), ins(list(R(1, 5)) + [7, 8]), DUMP, evict(full=2), DUMP,
        match(list(R(1, 5)) + [5, 6]), evict(full=2), DUMP, match(R(1, 7)),
        lb(R(1, 7), 1), DUMP, ack(1), DUMP, lb(list(R(1, 5)) + [7, 8], 2, req="r1"), DUMP,
        ack(2), {"op": "release", "id": "r1"}, evict(full=40), DUMP]),
    "x02_mamba_state_pruned_on_demote": (hmamba(note="a state that reached the device "
                                                     "after its node's FULL backup has no "
                                                     "host copy: the demote drops it"), [
        ins(R(1, 5)), ins(R(1, 9)), match(R(1, 9)), evict(mamba=1), evict(full=4), DUMP,
        ehost(mamba=1), DUMP, ins(R(1, 5)), DUMP, evict(full=4), DUMP, match(R(1, 5)),
        match(R(1, 9)), lb(R(1, 9), 1), DUMP, ack(1), DUMP]),
    "x03_mamba_internal_backup": (hmamba(note="an internal state evicted under write_back "
                                              "is backed up with its node's FULL first "
                                              "(InternalStateBackup), then tombstoned"), [
        ins(R(1, 5)), ins(R(1, 9)), match(R(1, 9)), DUMP, evict(mamba=1), DUMP,
        match(R(1, 5)), lb(R(1, 5), 1), DUMP, ack(1), evict(mamba=1), DUMP,
        ins(list(R(1, 5)) + [20]), evict(mamba=1), DUMP, match(R(1, 5)), DUMP]),
    "x04_mamba_internal_state_pruned": (hmamba(note="an internal state on a node whose "
                                                    "FULL is already on host is tombstoned "
                                                    "without a backup"), [
        ins(R(1, 5)), ins(R(1, 9)), match(R(1, 9)), evict(mamba=1), ehost(mamba=1), DUMP,
        ins(R(1, 9)), ins(R(1, 5)), match(R(1, 9)), ins(list(R(1, 5)) + [20]), DUMP,
        evict(mamba=1), DUMP, match(R(1, 5)), evict(full=40), DUMP, match(R(1, 5)),
        match(R(1, 9))]),
    "x05_mamba_host_pool_full": (hmamba(host=8, mhost=2, note="host room: FULL reclaims "
                                                               "duplicates then host leaves, "
                                                               "the state pool its own LRU; "
                                                               "a backup that finds none drops"
                                                               " the leaf"), [
        ins(R(1, 5)), ins(R(10, 14)), ins(R(20, 24)), evict(full=4), DUMP, evict(full=4),
        DUMP, evict(full=4), DUMP, ins(R(30, 36)), ins(R(40, 49)), DUMP, evict(full=9), DUMP,
        evict(full=6), DUMP, evict(full=40), DUMP]),
    "x06_mamba_dup_reclaim_and_digest": (hmamba(host=16, note="duplicate reclaim: pass 1 "
                                                              "spares evictable D-leaves, "
                                                              "pass 2 takes them; the digest "
                                                              "folds each victim; stale "
                                                              "entries are swept"), [
        ins(R(1, 5)), ins(R(1, 9)), ins(R(20, 24)), evict(full=40), DUMP,
        ins(R(1, 9)), ins(R(20, 24)), DUMP, lock(R(1, 9), 1), ehost(full=4), DUMP,
        ehost(full=4), DUMP, unlock(1), ehost(full=16), DUMP, evict(full=40), DUMP,
        ehost(full=3), DUMP]),
    "x07_mamba_host_evict_leaf_vs_internal": (hmamba(note="the state host LRU: a host "
                                                          "leaf goes whole, an internal "
                                                          "node loses its host state only"), [
        ins(R(1, 5)), ins(R(1, 9)), ins(list(R(1, 5)) + [30, 31]), evict(full=40), DUMP,
        ehost(mamba=1), DUMP, ehost(mamba=1), DUMP, ehost(mamba=5), DUMP,
        ehost(full=2), DUMP]),
    "x08_mamba_load_back_reasons": (hmamba(dev=24, cap=3, load_back_threshold=3,
                                           note="load-backs refused: nothing on host, "
                                                "under the threshold, no device room, no "
                                                "state slot; a request with no slot "
                                                "to copy into"), [
        ins(R(1, 5)), ins(list(R(1, 5)) + [7, 8]), evict(full=2), lb(R(1, 5), 1),
        lb(list(R(1, 5)) + [7, 8], 2), DUMP, ack(2), lb(R(1, 5), 2), ack(9),
        evict(full=30), lock(R(40, 60), 5), ins(R(40, 60)), lock(R(40, 60), 6),
        lb(list(R(1, 5)) + [7, 8], 3), DUMP, unlock(6), evict(full=20),
        ins(R(50, 54)), ins(R(60, 64)), ins(R(70, 74)), lock(R(50, 54), 7),
        lock(R(60, 64), 8), lock(R(70, 74), 9), DUMP, lb(list(R(1, 5)) + [7, 8], 4),
        lb(list(R(1, 5)) + [7, 8], 4, req="r1"), DUMP, unlock(7), unlock(8), unlock(9),
        lb(list(R(1, 5)) + [7, 8], 4, req="r1"), lb(R(1, 5), 4), DUMP, ack(4), DUMP]),
    "x09_mamba_load_back_pinned": (hmamba(note="a load-back pins the FULL it loads until "
                                               "its ack: another anchor's restore there "
                                               "comes back empty; duplicate reclaim "
                                               "skips pinned nodes"), [
        ins(R(1, 5)), ins(R(1, 9)), evict(full=40), DUMP, lb(R(1, 9), 1), DUMP,
        lb(R(1, 5), 2), ehost(full=8), DUMP, ack(1), lb(R(1, 5), 2), DUMP, ack(2),
        ehost(full=8), DUMP]),
    "x10_mamba_unevict_and_errors": (hmamba(note="an insert over an evicted prefix "
                                                 "un-evicts it with its fresh KV; a reused "
                                                 "prefix must be on device"), [
        ins(R(1, 5)), ins(R(1, 9)), evict(full=40), ins(R(1, 9), prev=4), ins(R(1, 11)),
        DUMP, lock(R(1, 11), 1), evict(full=40), DUMP, lb(R(1, 9), 1), ack(1),
        unlock(1), evict(full=40), DUMP, ehost(full=40), DUMP]),
}

HAND.update({
    # --- (FULL, MAMBA) with the host tier under write_through ----------------------
    "w01_mamba_wt_insert_backup_and_ack": (wmamba(note="write_through: an insert backs "
                                                       "its new leaf up with the state at "
                                                       "once, locked on device until the "
                                                       "ack; a split pending node puts "
                                                       "both fragments under the same ack; "
                                                       "duplicates are tracked at the ack"), [
        ins(R(1, 9)), DUMP, evict(full=8), ins(list(R(1, 5)) + [20, 21]), DUMP,
        wack(2), wack(3), wack(1), DUMP, evict(full=40), DUMP, match(R(1, 9)),
        lb(R(1, 9), 1), DUMP, ack(1), DUMP, wack(1)]),
    "w02_mamba_wt_state_pruned": (wmamba(note="sglang #33713 under write_through: a state "
                                              "set on a node whose FULL write is still in "
                                              "flight is never backed up, and the demote "
                                              "drops it (no host hit at that node); after "
                                              "the ack the same insert backs the state up "
                                              "incrementally"), [
        ins(R(1, 9)), ins(R(1, 5)), DUMP, wack(1), DUMP, ins(R(20, 28)), wack(3),
        ins(R(20, 24)), DUMP, wack(4), evict(full=40), DUMP, match(R(1, 5)),
        match(R(1, 9)), match(R(20, 24)), lb(R(20, 24), 1), DUMP, ack(1), DUMP]),
    "w03_mamba_wt_state_host_pool_too_small": (wmamba(dev=48, cap=40, host=256, mhost=4,
                                                      note="sglang #39436 at small scale: "
                                                           "with 4 state host slots for 8 "
                                                           "prompts of 3 checkpoints, "
                                                           "backups fail whole (FULL too) "
                                                           "or prune older prompts' host "
                                                           "states; replays of the evicted "
                                                           "prompts miss the host"),
                                               fill_and_replay(4)),
    "w04_mamba_wt_state_host_pool_enough": (wmamba(dev=48, cap=40, host=256, mhost=24,
                                                   note="w03 with 24 state host slots: "
                                                        "every evicted prompt replays "
                                                        "whole from host"),
                                            fill_and_replay(24)),
    "w05_mamba_wt_selective": (wmamba(policy="write_through_selective",
                                      note="write_through_selective: a node is backed up "
                                           "on its second hit (a walked node before its "
                                           "state, a new leaf never on its first); an "
                                           "unbacked leaf is deleted on eviction; a "
                                           "tombstoned internal state keeps its host "
                                           "copy"), [
        ins(R(1, 9)), DUMP, ins(R(1, 13), prev=8), DUMP, wack(1), ins(R(1, 13)), DUMP,
        ins(R(30, 36)), ins(list(R(30, 33)) + [50]), DUMP, evict(full=6), DUMP,
        evict(mamba=1), DUMP, wack(2), wack(5), evict(full=40), DUMP, match(R(1, 13)),
        match(R(30, 33))]),
    "w06_mamba_wt_host_full_and_errors": (wmamba(host=8, mhost=2,
                                                 note="write_through with small host pools: "
                                                      "a backup that finds no room is "
                                                      "skipped (the chain stops there) and "
                                                      "its leaf deleted on eviction; an "
                                                      "unbacked internal state is "
                                                      "tombstoned without a backup; host "
                                                      "eviction frees host leaves only (no "
                                                      "duplicate reclaim); write_ack "
                                                      "errors"), [
        ins(R(1, 5)), ins(R(10, 14)), ins(R(20, 24)), ins(R(20, 28), prev=4),
        evict(mamba=1), DUMP, wack(1), wack(2), wack(99),
        ehost(full=4), DUMP, evict(full=8), DUMP, ehost(full=4), DUMP, ins(R(30, 34)),
        DUMP, ehost(mamba=1), ins(R(40, 44)), DUMP, evict(full=40), DUMP, wack(3)]),
})

HAND.update({
    # --- (FULL, SWA) with the host tier (write_back) ----------------------------
    "s01_swa_host_window_backup_demote": (hswa(note="write_back: an evicted leaf is "
                                                    "backed up with every device-only SWA "
                                                    "slice within one window above it, "
                                                    "oldest first, and demoted; a "
                                                    "load-back restores FULL and the "
                                                    "window's host-only SWA"), [
        ins(R(1, 11)), ins(list(R(1, 7)) + [20, 21, 22]), DUMP, evict(full=3), DUMP,
        match(R(1, 11)), match(list(R(1, 7)) + [20, 21, 22]), evict(full=40), DUMP,
        match(list(R(1, 7)) + [20, 21, 22]), lb(list(R(1, 7)) + [20, 21, 22], 1), DUMP,
        ack(1), DUMP, lb(R(1, 11), 2), DUMP, ack(2), DUMP]),
    "s02_swa_internal_backup": (hswa(note="an internal SWA victim without a host copy is "
                                          "backed up first with its unbacked window "
                                          "(InternalStateBackup), then tombstoned; the "
                                          "match ends on host-only SWA "
                                          "(swa_host_hit_length) and a load-back restores "
                                          "it with FULL on device"), [
        ins(R(1, 11)), ins(list(R(1, 5)) + [30, 31, 32, 33]), match(R(1, 11)), DUMP,
        evict(swa=4), DUMP, evict(swa=2), DUMP, match(list(R(1, 5)) + [30, 31]),
        match(R(1, 7)), lb(R(1, 7), 1), DUMP, ack(1), DUMP, evict(swa=30), DUMP,
        match(R(1, 11)), lb(R(1, 11), 2), DUMP, ack(2), DUMP]),
    "s03_swa_host_evict_leaf_vs_internal": (hswa(note="the SWA host LRU: a host leaf "
                                                      "goes whole, an internal node loses "
                                                      "its host slice only; host-locked "
                                                      "slices are skipped"), [
        ins(R(1, 11)), ins(list(R(1, 5)) + [30, 31]), ins(R(40, 46)), evict(full=40),
        DUMP, ehost(swa=2), DUMP, lb(R(40, 46), 1), ehost(swa=4), DUMP, ack(1),
        ehost(swa=5), DUMP, ehost(swa=40), DUMP, ehost(full=4), DUMP, match(R(1, 11))]),
    "s04_swa_load_back_reasons": (hswa(dev=32, cap=12, host=48, shost=16,
                                       load_back_threshold=3,
                                       note="load-backs refused: nothing on host, "
                                            "a spec emptied by another load's pin "
                                            "(under the threshold), no device room, no "
                                            "SWA slots for the window's restore"), [
        ins(R(1, 7)), ins(list(R(1, 7)) + [9, 10], prev=6), ins([1, 2, 50, 51], prev=2),
        evict(full=40), DUMP, lb(R(1, 7), 1), DUMP, lb([1, 2, 50, 51], 2), ack(1),
        lb([1, 2, 50, 51], 2), DUMP, ack(2), lb(R(1, 7), 3), evict(full=40),
        ins(R(40, 68), swa_evicted=24), lock(R(40, 68), 8), DUMP, lb(R(1, 7), 3), DUMP,
        unlock(8), evict(full=40), ins(R(40, 44)), ins(R(50, 54)), ins(R(60, 64)),
        lock(R(40, 44), 5), lock(R(50, 54), 6), lock(R(60, 64), 7), DUMP, lb(R(1, 7), 4),
        DUMP, unlock(5), lb(R(1, 7), 4), DUMP, ack(4), unlock(6), unlock(7), DUMP]),
    "s05_swa_host_lock_window_split": (hswa(w=6, note="a load-back host-locks the window "
                                                      "from its anchor up (tombstones "
                                                      "too) and stamps a host boundary; a "
                                                      "split of a host-locked node copies "
                                                      "the lock and moves the boundary "
                                                      "up; the ack releases to it"), [
        ins(R(1, 5)), ins(R(1, 9)), ins(R(1, 13)), evict(full=40), DUMP, lb(R(1, 13), 1),
        DUMP, match(R(1, 11)), match(R(1, 3)), DUMP, ack(1), DUMP, evict(full=40),
        ehost(swa=2), DUMP, lb(R(1, 11), 2), DUMP, ack(2), DUMP]),
    "s06_swa_unevict_and_revive": (hswa(note="an insert over an evicted prefix un-evicts "
                                             "it with the request's fresh KV and "
                                             "publishes SWA in its window "
                                             "(recover_after_unevict): past swa_evicted "
                                             "only, split at the cursor"), [
        ins(R(1, 13)), evict(full=40), DUMP, ins(R(1, 13), swa_evicted=6), DUMP,
        evict(full=40), ins(R(1, 17)), DUMP, evict(swa=40), DUMP, match(R(1, 17)),
        evict(full=40), ehost(swa=4), DUMP, ins(R(1, 17), swa_evicted=8), DUMP]),
    "s07_swa_host_errors": (hswa(cap=8, note="host-tier errors: a reused prefix must be "
                                             "on device, the SWA pool bounds an insert, "
                                             "load-back ids"), [
        ins(R(1, 9)), evict(full=40), ins(R(1, 13), prev=4), ins(R(20, 30)), DUMP,
        lb(R(1, 9), 1), lb(R(1, 9), 1), ack(2), ack(1), ack(1), DUMP]),
})

HAND.update({
    # --- (FULL, SWA) with the host tier under write_through -------------------------
    "v01_swa_wt_window_backup_and_ack": (wswa(note="write_through: an insert backs its "
                                                   "new leaf and unbacked ancestors up "
                                                   "at once, each with its window's SWA, "
                                                   "locked on device until the ack; a "
                                                   "later insert backs a window slice up "
                                                   "incrementally"), [
        ins(R(1, 11)), DUMP, ACK_ALL, DUMP, ins(list(R(1, 7)) + [20, 21]), DUMP, ACK_ALL,
        evict(swa=6), DUMP, ins(R(1, 11)), DUMP, ACK_ALL, evict(full=40), DUMP,
        match(list(R(1, 7)) + [20, 21]), lb(list(R(1, 7)) + [20, 21], 1), DUMP, ack(1),
        DUMP]),
    "v02_swa_wt_window_stops_at_a_pending_write": (wswa(note="a leaf inserted under a "
                                                             "node whose write is in "
                                                             "flight is backed up with "
                                                             "its own slice (the window "
                                                             "walk ends at the pending "
                                                             "node); a pending node is "
                                                             "locked, never a victim; "
                                                             "internal SWA victims are "
                                                             "tombstoned without a "
                                                             "backup"), [
        ins(R(1, 3)), ins(R(1, 5), prev=2, inserted=2), DUMP, wack(1), wack(2), DUMP,
        ins(R(30, 36)), evict(full=40), DUMP, ACK_ALL, evict(swa=40), DUMP,
        match(R(1, 5)), ehost(swa=2), DUMP]),
    "v03_swa_wt_selective": (wswa(policy="write_through_selective", host=24, shost=8,
                                  note="write_through_selective: a node is backed up at "
                                       "its second hit; small host pools: a backup that "
                                       "finds no SWA host room fails whole"), [
        ins(R(1, 9)), DUMP, ins(R(1, 9)), DUMP, ACK_ALL, ins(R(20, 28)), ins(R(20, 28)),
        ins(R(40, 48)), ins(R(40, 48)), DUMP, ACK_ALL, evict(full=40), DUMP,
        match(R(1, 9)), match(R(40, 48)), wack(77)]),
})

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

# (FULL, MAMBA) with the host tier (write_back): host pools from a fraction of the
# device's to twice it, so backups fail and drop, duplicates are reclaimed and host
# leaves evicted; state host pools from 1 slot.
for i, (ps, chunk, dev, cap, host, mhost, ms, thr, ops) in enumerate([
        (1, 4, 96, 40, 192, 80, -1, 1, 500), (1, 4, 96, 12, 48, 6, -1, 1, 500),
        (1, 1, 64, 8, 32, 2, -1, 1, 500), (1, 8, 160, 20, 320, 40, -1, 1, 600),
        (1, 2, 48, 6, 12, 1, -1, 1, 500), (1, 4, 200, 30, 100, 30, -1, 4, 600),
        (1, 4, 96, 40, 96, 8, 2, 1, 500), (1, 4, 128, 40, 64, 16, 1, 1, 500),
        (1, 3, 96, 16, 24, 4, 3, 1, 500), (1, 16, 160, 24, 320, 48, -1, 1, 500),
        (1, 4, 300, 60, 600, 120, -1, 1, 1200), (1, 1, 40, 4, 20, 2, -1, 1, 500),
        (1, 4, 80, 80, 160, 160, -1, 1, 500), (1, 5, 96, 10, 40, 3, 2, 1, 500),
        (1, 4, 120, 20, 30, 20, -1, 4, 600), (1, 2, 64, 12, 128, 4, 4, 1, 500),
        (1, 6, 96, 16, 16, 16, -1, 1, 500), (1, 4, 50, 5, 100, 10, 1, 1, 500),
        (2, 4, 128, 30, 64, 12, -1, 1, 500), (4, 4, 192, 30, 384, 60, -1, 1, 500),
        (2, 3, 96, 12, 48, 2, 2, 1, 500), (4, 6, 256, 40, 128, 20, -1, 1, 500),
        (1, 4, 96, 3, 96, 6, -1, 1, 500), (1, 3, 72, 9, 36, 9, -1, 1, 500)], start=1):
    name = f"y{i:02d}_mamba_host_ps{ps}_c{chunk}_h{host}_m{mhost}"
    if ms > 0:
        name += f"_cap{ms}"
    GENERATED.append((name, "mamba", dict(
        seed=300 + i, ops=ops, page_size=ps, chunk=chunk, device_cap=dev, aux_cap=cap,
        max_states=ms, max_len=12 * ps if ps > 1 else 24, hicache=True, host_cap=host,
        aux_host_cap=mhost, load_back_threshold=thr)))


# (FULL, MAMBA) with the host tier under write_through (and write_through_selective):
# insert-time backups, acks in flight (write_ack ops), unbacked leaves deleted on
# eviction; host pools from a fifth of the device's to twice it, state host pools
# from 1 slot.
for i, (policy, ps, chunk, dev, cap, host, mhost, ms, thr, ops) in enumerate([
        ("wt", 1, 4, 96, 40, 192, 80, -1, 1, 500), ("wt", 1, 4, 96, 12, 48, 6, -1, 1, 500),
        ("wt", 1, 1, 64, 8, 32, 2, -1, 1, 500), ("wt", 1, 8, 160, 20, 320, 40, -1, 1, 600),
        ("wt", 1, 2, 48, 6, 12, 1, -1, 1, 500), ("wt", 1, 4, 200, 30, 100, 30, -1, 4, 600),
        ("wt", 1, 4, 96, 40, 96, 8, 2, 1, 500), ("wt", 1, 4, 128, 40, 64, 16, 1, 1, 500),
        ("wt", 1, 3, 96, 16, 24, 4, 3, 1, 500), ("wt", 1, 16, 160, 24, 320, 48, -1, 1, 500),
        ("wt", 1, 4, 300, 60, 600, 120, -1, 1, 1200), ("wt", 1, 4, 96, 3, 96, 6, -1, 1, 500),
        ("wt", 2, 4, 128, 30, 64, 12, -1, 1, 500), ("wt", 4, 4, 192, 30, 384, 60, -1, 1, 500),
        ("wt", 2, 3, 96, 12, 48, 2, 2, 1, 500), ("wt", 4, 6, 256, 40, 128, 20, -1, 1, 500),
        ("sel", 1, 4, 96, 40, 192, 80, -1, 1, 500), ("sel", 1, 4, 96, 12, 48, 6, -1, 1, 500),
        ("sel", 1, 2, 64, 12, 128, 4, 4, 1, 500), ("sel", 1, 6, 96, 16, 16, 16, -1, 1, 500),
        ("sel", 1, 4, 120, 20, 30, 20, -1, 4, 600), ("sel", 1, 5, 96, 10, 40, 3, 2, 1, 500),
        ("sel", 2, 4, 128, 30, 64, 12, -1, 1, 500), ("sel", 4, 4, 192, 30, 384, 60, -1, 1, 500)],
        start=1):
    name = f"z{i:02d}_mamba_{policy}_ps{ps}_c{chunk}_h{host}_m{mhost}"
    if ms > 0:
        name += f"_cap{ms}"
    GENERATED.append((name, "mamba", dict(
        seed=400 + i, ops=ops, page_size=ps, chunk=chunk, device_cap=dev, aux_cap=cap,
        max_states=ms, max_len=12 * ps if ps > 1 else 24, hicache=True, host_cap=host,
        aux_host_cap=mhost, load_back_threshold=thr,
        write_policy="write_through" if policy == "wt" else "write_through_selective")))


# (FULL, SWA) with the host tier (write_back): host pools from a fraction of the
# device's to twice it, SWA host pools from one page to twice the SWA pool; windows
# from 1 to 16 tokens.
for i, (ps, w, dev, cap, host, shost, thr, ops) in enumerate([
        (1, 8, 96, 40, 192, 80, 1, 500), (1, 8, 96, 40, 48, 8, 1, 500),
        (1, 4, 64, 24, 32, 4, 1, 500), (1, 16, 160, 64, 320, 64, 1, 600),
        (1, 3, 48, 16, 12, 2, 1, 500), (1, 8, 200, 30, 100, 30, 4, 600),
        (1, 1, 64, 16, 64, 8, 1, 500), (1, 12, 96, 24, 96, 48, 1, 500),
        (1, 6, 80, 80, 40, 160, 1, 500), (1, 5, 60, 12, 120, 6, 1, 500),
        (1, 8, 120, 50, 30, 20, 4, 600), (1, 2, 40, 10, 20, 20, 1, 500),
        (1, 8, 300, 120, 600, 240, 1, 1200), (1, 10, 140, 60, 140, 12, 1, 500),
        (2, 6, 96, 40, 96, 16, 1, 500), (2, 8, 128, 48, 64, 48, 1, 500),
        (2, 3, 64, 24, 128, 4, 1, 500), (2, 2, 64, 20, 32, 40, 1, 500),
        (4, 8, 160, 64, 320, 32, 1, 500), (4, 5, 128, 48, 64, 96, 1, 500),
        (4, 4, 96, 32, 48, 8, 4, 500), (4, 16, 256, 96, 256, 64, 1, 500),
        (1, 8, 96, 40, 96, 40, 1, 500), (1, 4, 50, 20, 100, 10, 1, 500)], start=1):
    GENERATED.append((f"t{i:02d}_swa_host_ps{ps}_w{w}_h{host}_s{shost}", "swa", dict(
        seed=500 + i, ops=ops, page_size=ps, window=w, device_cap=dev, aux_cap=cap,
        max_len=12 * ps if ps > 1 else 24, hicache=True, host_cap=host, aux_host_cap=shost,
        load_back_threshold=thr)))


# (FULL, SWA) with the host tier under write_through (u01-u08) and
# write_through_selective (u09-u12): the t cases' pools.
for i, (policy, ps, w, dev, cap, host, shost, ops) in enumerate([
        ("wt", 1, 8, 96, 40, 192, 80, 500), ("wt", 1, 8, 96, 40, 48, 8, 500),
        ("wt", 1, 4, 64, 24, 32, 4, 500), ("wt", 1, 16, 160, 64, 320, 64, 500),
        ("wt", 1, 3, 48, 16, 12, 2, 500), ("wt", 2, 6, 96, 40, 96, 16, 500),
        ("wt", 4, 8, 160, 64, 320, 32, 500), ("wt", 1, 1, 64, 16, 64, 8, 500),
        ("sel", 1, 8, 96, 40, 192, 80, 500), ("sel", 1, 5, 60, 12, 120, 6, 500),
        ("sel", 2, 8, 128, 48, 64, 48, 500), ("sel", 4, 4, 96, 32, 48, 8, 500)], start=1):
    GENERATED.append((f"u{i:02d}_swa_{policy}_ps{ps}_w{w}_h{host}_s{shost}", "swa", dict(
        seed=600 + i, ops=ops, page_size=ps, window=w, device_cap=dev, aux_cap=cap,
        max_len=12 * ps if ps > 1 else 24, hicache=True, host_cap=host, aux_host_cap=shost,
        write_policy="write_through" if policy == "wt" else "write_through_selective")))


def dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


def oracle_for(header):
    return (HostHybridOracle if header.get("hicache") else HybridOracle)(header)


def run_hand(header, ops, check):
    o = oracle_for(header)
    outs = [{"i": 0, "op": "header", "events": [], **o.summary()}]
    trace = [header]
    for step in ops:
        for op in ([wack(a) for a in o.write_ids()] if step == ACK_ALL else [step]):
            trace.append(op)
            outs.append({"i": len(trace) - 1, **o.apply(op)})
            if check:
                o.check()
    return trace, outs


def run_gen(kind, opts, check):
    defaults = dict(page_size=1, window=8, chunk=4, max_states=-1, max_len=24, check=check,
                    hicache=False, host_cap=0, aux_host_cap=0, load_back_threshold=1,
                    write_policy="write_back")
    args = argparse.Namespace(kind=kind, **{**defaults, **opts})
    g = gen_hybrid.Gen(args, oracle_for)
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
    ap.add_argument("--only", metavar="PREFIX", action="append",
                    help="rebuild only the cases whose names start with PREFIX (repeatable), "
                         "keeping the others and their checksums")
    args = ap.parse_args()
    OUT_DIR.mkdir(parents=True, exist_ok=True)

    def wanted(name):
        return not args.only or any(name.startswith(p) for p in args.only)

    sums: dict[str, str] = {}
    if args.only and (OUT_DIR / "SHA256SUMS").is_file():
        for line in (OUT_DIR / "SHA256SUMS").read_text().splitlines():
            d, n = line.split("  ", 1)
            sums[n] = d
    for p in OUT_DIR.glob("*.gz"):
        if wanted(p.name):
            p.unlink()
            for suffix in (".jsonl", ".out.jsonl"):
                if p.name.endswith(suffix + ".gz"):
                    sums.pop(p.name[:-3], None)
    n_ops = n_cases = 0
    for name, (header, ops) in HAND.items():
        if not wanted(name):
            continue
        trace, outs = run_hand(header, ops, args.check)
        write(name, trace, outs, sums)
        n_ops += len(trace) - 1
        n_cases += 1
    for name, kind, opts in GENERATED:
        if not wanted(name):
            continue
        trace, outs = run_gen(kind, opts, args.check)
        write(name, trace, outs, sums)
        n_ops += len(trace) - 1
        n_cases += 1
    (OUT_DIR / "SHA256SUMS").write_text("".join(f"{d}  {n}\n" for n, d in sorted(sums.items())))
    print(f"{n_cases} cases, {n_ops} ops -> {OUT_DIR}")


if __name__ == "__main__":
    main()
