"""Storage (L3) ops of op-trace v2 (docs/OPTRACE.md §14): the tree's ``insert_host``,
the prefetch and storage-write bookkeeping (sim/storage/prefetch.py) replay SGLang
0.5.23's own tree byte for byte on every case of data/conformance/storage/, the tree's
invariants hold after every op, and bad storage lines are one-line input errors.
No SGLang at test time: its outputs are vendored."""

from __future__ import annotations

import contextlib
import gzip
import io
import json

import pytest

import cli
from conftest import (ROOT, assert_replays_byte_for_byte, case_id, conformance_cases,
                      expected_lines, replay_checked, vendored_checksums_match)
from sim.optrace import Replayer, replay
from sim.tree import InvariantError, Tree

STORAGE = ROOT / "data" / "conformance" / "storage"
CASES = conformance_cases(STORAGE)


def test_vendored_files_match_their_checksums():
    vendored_checksums_match(STORAGE)


def test_at_least_twenty_generated_and_ten_hand_cases():
    assert len([c for c in CASES if c.name.startswith("g")]) >= 20
    assert len([c for c in CASES if c.name.startswith("h")]) >= 10


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_replay_matches_sglang_byte_for_byte(case):
    assert_replays_byte_for_byte(case)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_invariants_hold_after_every_op(case):
    for replayer in replay_checked(case, Replayer):
        # every staged slot belongs to an in-flight prefetch
        assert replayer.tree.host_reserved == sum(
            p.staged or 0 for p in replayer.storage.prefetches.values())


def test_cases_cover_every_storage_behaviour():
    """SGLang's outputs exercise each path of the storage ops: both policies, every
    decline and revoke reason, refills, new host leaves, splits inside insert_host,
    host evictions run by a storage hit, storage writes both ways, every error code."""
    seen = set()
    for case in CASES:
        policy = None
        for line, op_line in zip(expected_lines(case), gzip.open(case, "rt")):
            r, op = json.loads(line), json.loads(op_line)
            if r["op"] == "header":
                policy = op.get("write_policy", "write_back")
                continue
            seen.add((policy, "op:" + r["op"]))
            if "error" in r:
                seen.add(("any", "error:" + r["error"]))
                continue
            if "reason" in r:
                seen.add(("any", f"{r['op']}:{r['reason']}"))
            for e in r["events"]:
                seen.add((policy, r["op"] + ":" + e["k"]))
            if r["op"] == "prefetch_done":
                seen.add((policy, "done:node" if r["node"] is not None else "done:no_node"))
                if r["prefix_len"]:
                    seen.add((policy, "done:prefix"))
            if r["op"] == "storage_write":
                seen.add(("any", f"written:{r['written']}"))
            if "storage_writes" in r:
                seen.add((policy, f"auto:{r['op']}"))
                if any(e["k"] == "drop" for e in r["events"]):
                    seen.add((policy, "auto:drop"))
    for policy in ("write_back", "write_through"):
        for what in ("op:prefetch", "op:prefetch_hit", "op:prefetch_done", "op:prefetch_revoke",
                     "op:storage_write", "op:storage_write_ack", "prefetch_done:host_new",
                     "prefetch_done:split", "prefetch_hit:host_evict", "done:node",
                     "done:no_node", "done:prefix"):
            assert (policy, what) in seen, (policy, what)
    assert ("write_through", "prefetch_done:refill") in seen
    # storage_writes auto: eviction backups (write_back), acks (write_through), and a
    # walk whose earlier storage writes force a drop
    assert {("write_back", "auto:evict_device"), ("write_back", "auto:load_back"),
            ("write_back", "auto:drop"), ("write_through", "auto:write_ack"),
            ("write_through", "auto:insert")} <= seen
    assert ("write_through", "op:write_ack") in seen
    for what in ("prefetch:anchor_not_backed", "prefetch:too_short", "prefetch:empty",
                 "prefetch:rate_limited", "prefetch_hit:below_threshold",
                 "prefetch_hit:host_capacity", "written:True", "written:False",
                 "error:duplicate_prefetch_id", "error:unknown_prefetch_id",
                 "error:prefetch_not_staged", "error:prefetch_already_staged",
                 "error:bad_hit", "error:bad_done", "error:unknown_node",
                 "error:duplicate_storage_write_id", "error:unknown_storage_write_id"):
        assert ("any", what) in seen, what


# ------------------------------------------------------------------ unit checks
def _tree(policy="write_back", **kw):
    return Tree(device_capacity=64, host_capacity=64, write_policy=policy, record=True, **kw)


def test_insert_host_write_back_frees_walked_tokens_and_grafts_the_rest():
    t = _tree()
    t.insert([1, 2, 3, 4])
    t.evict_device(4)               # [1..4] host-only
    anchor = t.match_prefix([1, 2, 3, 4]).best
    t.insert([1, 2, 3, 4, 5, 6])    # device-only [5, 6] under the anchor
    clock = t._clock
    t.rec.clear()
    res = t.insert_host(anchor, [5, 6, 7, 8])
    assert (res.prefix_tokens, res.new_tokens, res.refilled_tokens, res.dropped) == (2, 2, 0, False)
    assert res.node.key == [7, 8] and res.node.parent.key == [5, 6] and not res.node.parent.host
    assert [k for k, _, _ in t.rec] == ["host_new"]
    assert t._clock == clock + 4    # touches: anchor, [5, 6]; new node: two draws
    t.check()


def test_insert_host_write_through_refills_and_counts_only_backed_prefix():
    t = Tree(device_capacity=64, host_capacity=4, write_policy="write_through", record=True)
    t.insert([1, 2, 3, 4])          # backed up (host full)
    for ack in list(t.pending_writes):
        t.finish_write_through(ack)
    t.insert([1, 2, 3, 4, 5, 6])    # its backup fails: [5, 6] device-only
    t.host_capacity = 8             # room for the adopted slots
    res = t.insert_host(t.root, [1, 2, 3, 4, 5, 6, 7])
    assert (res.prefix_tokens, res.refilled_tokens, res.new_tokens) == (4, 2, 1)
    assert [(k, n.id) for k, n, _ in t.rec[-2:]] == [("refill", 2), ("host_new", 3)]
    t.check()


def test_insert_host_drops_under_an_unbacked_node_only_under_write_through():
    # Unreachable through SGLang's scheduler gate (a prefetch anchors on a backed
    # node or the root), but insert_host itself drops: host_insert_dropped.
    t = Tree(device_capacity=64, host_capacity=0, write_policy="write_through")
    t.insert([1, 2])
    anchor = t.match_prefix([1, 2]).best
    res = t.insert_host(anchor, [3, 4])
    assert res.dropped and res.node is None and t.host_used == 0 and t.n_nodes == 1
    wb = _tree()
    wb.insert([1, 2])
    res = wb.insert_host(wb.match_prefix([1, 2]).best, [3, 4])
    assert not res.dropped and res.node.key == [3, 4]


def test_insert_host_empty_key_only_touches_the_anchor():
    t = _tree()
    t.insert([1, 2])
    node = t.match_prefix([1, 2]).best
    before = (t._clock, t.n_nodes, t._next_id)
    res = t.insert_host(node, [])
    assert res.node is None and res.prefix_tokens == 0
    assert (t._clock, t.n_nodes, t._next_id) == (before[0] + 1, before[1], before[2])
    assert node.last_access == before[0]


def test_insert_host_backed_node_below_a_refill_is_an_invariant_error():
    t = Tree(device_capacity=64, host_capacity=64, write_policy="write_through")
    t.insert([1, 2])
    t.insert([1, 2, 3, 4])
    a, b = t.root.children[1], t.root.children[1].children[3]
    t._flip_host(a, False, 2)   # a broken state SGLang asserts against
    with pytest.raises(InvariantError, match="host-prefix invariant"):
        t.insert_host(t.root, [1, 2, 3, 4])
    assert b.host


def test_host_reserved_counts_against_backup_room():
    t = Tree(device_capacity=8, host_capacity=4)
    t.insert([1, 2, 3, 4])
    t.stage_host(4)               # a staged prefetch holds the host
    ev = t.evict_device(4)        # the write_back backup finds no room: drop
    assert ev.backups_failed == 1 and ev.dropped == 4
    t2 = Tree(device_capacity=8, host_capacity=4)
    t2.insert([1, 2, 3, 4])
    assert t2.evict_device(4).demoted == 4


def test_default_threshold_is_sglangs_256(tmp_path):
    t = tmp_path / "t.jsonl"
    t.write_text(json.dumps({"op": "header", "device_capacity": 8, "host_capacity": 8,
                             "version": 2}) + "\n"
                 + json.dumps({"op": "prefetch", "tokens": [1, 2, 3], "id": 1}) + "\n")
    out = list(replay(t))
    assert out[1]["issued"] is False and out[1]["reason"] == "too_short"


def _main(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main([str(a) for a in argv])
        except SystemExit as e:
            rc = e.code
    return rc, err.getvalue()


@pytest.mark.parametrize("header, op, found, expected", [
    ({}, {"op": "prefetch", "tokens": [1], "id": 1}, "a prefetch op in a version 1 trace",
     '"version": 2'),
    ({"version": 2}, {"op": "prefetch_hit", "id": 1}, "no 'n' in a prefetch_hit op", "'n'"),
    ({"version": 2}, {"op": "prefetch_hit", "id": 1, "n": -2}, "n=-2", "'n' >= 0"),
    ({"version": 2}, {"op": "prefetch_done", "id": 1, "n": "4"}, "n='4'", "'n' as an int"),
    ({"version": 2}, {"op": "prefetch", "tokens": [1, "a"], "id": 1}, "tokens=", "list of ints"),
    ({"version": 2}, {"op": "storage_write", "node": "3", "id": 1}, "node='3'", "'node' as an int"),
    ({"version": 2, "prefetch_threshold": -1}, None, "prefetch_threshold=-1", "non-negative int"),
    ({"storage_writes": "auto"}, None, "storage_writes='auto' in a version 1 header", '"version": 2'),
    ({"version": 2, "storage_writes": "yes"}, None, "storage_writes='yes'", "one of op, auto"),
])
def test_bad_storage_lines_are_one_line_errors(tmp_path, header, op, found, expected):
    lines = [{"op": "header", "device_capacity": 8, "host_capacity": 8, **header}]
    if op is not None:
        lines.append(op)
    t = tmp_path / "t.jsonl"
    t.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rc, err = _main(["replay-ops", t])
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{t}:{len(lines)}" in err and found in err and expected in err


def test_auto_storage_writes_follow_each_ack_and_skip_taken_ids(tmp_path):
    t = tmp_path / "t.jsonl"
    lines = [{"op": "header", "device_capacity": 16, "host_capacity": 16, "version": 2,
              "write_policy": "write_through", "storage_writes": "auto"},
             {"op": "insert", "tokens": [1, 2]},
             {"op": "storage_write", "node": 1, "id": "s2"},
             {"op": "write_ack", "id": 1},
             {"op": "insert", "tokens": [1, 2, 3]},
             {"op": "write_ack", "id": 2}]
    t.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = list(replay(t))
    assert "storage_writes" not in out[1] and "storage_writes" not in out[2]
    assert out[3]["storage_writes"] == ["s1"] and out[5]["storage_writes"] == ["s3"]
    keys = list(out[3])
    assert keys.index("storage_writes") == keys.index("events") - 1
    r = Replayer(lines[0])
    for i, op in enumerate(lines[1:], 1):
        r.apply(i, op)
    assert sorted(r.storage.writes) == ["s1", "s2", "s3"]
    assert r.tree.node_by_id(1).host_lock == 2
