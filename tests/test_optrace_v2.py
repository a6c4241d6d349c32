"""op-trace v2 (docs/OPTRACE.md): its header, explicit write acks, the server id
scheme, and `run --record-ops` traces that replay to the engine's exact trees.

No SGLang here: the differential test against SGLang's own tree is
`make conformance-sglang` (tools/conformance_sglang.py)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

import cli
from sim.optrace import replay

ROOT = Path(__file__).resolve().parents[1]


def main(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main([str(a) for a in argv])
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def outputs(path: Path) -> list[dict]:
    return list(replay(path))


WT2 = {"op": "header", "device_capacity": 32, "host_capacity": 32,
       "write_policy": "write_through", "version": 2}


# ------------------------------------------------------------------ header
@pytest.mark.parametrize("header, found, expected", [
    ({"version": 3}, "version=3", "'version' one of 1, 2"),
    ({"version": "2"}, "version='2'", "'version' one of 1, 2"),
    ({"write_acks": "op"}, "write_acks='op' in a version 1 header", "only with \"version\": 2"),
    ({"version": 2, "write_acks": "later"}, "write_acks='later'", "one of end_of_op, op"),
    ({"version": 2, "ids": "serve"}, "ids='serve'", "one of optrace, sglang, server, rust, rust_server"),
])
def test_bad_v2_header_fields_are_one_line_errors(tmp_path, header, found, expected):
    t = write(tmp_path / "t.jsonl", [{"op": "header", "device_capacity": 8, "host_capacity": 8, **header}])
    rc, _, err = main(["replay-ops", t])
    assert rc == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{t}:1" in err and found in err and expected in err


@pytest.mark.parametrize("header, op, found", [
    ({}, {"op": "write_ack", "id": 1}, "a write_ack op in a version 1 trace"),
    ({"version": 2, "write_acks": "end_of_op"}, {"op": "write_ack", "id": 1},
     "a write_ack op under write_acks='end_of_op'"),
    ({"version": 2}, {"op": "write_ack"}, "no 'id' in a write_ack op"),
    ({"version": 2}, {"op": "write_ack", "id": [1]}, "id=[1]"),
])
def test_bad_write_ack_lines_are_one_line_errors(tmp_path, header, op, found):
    t = write(tmp_path / "t.jsonl", [{"op": "header", "device_capacity": 8, "host_capacity": 8,
                                      **header}, op])
    rc, _, err = main(["replay-ops", t])
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"{t}:2" in err and found in err


def test_v1_write_through_still_acks_at_the_end_of_each_op(tmp_path):
    t = write(tmp_path / "t.jsonl", [{**WT2, "version": 1}, {"op": "insert", "tokens": [1, 2, 3, 4]}])
    ins = outputs(t)[1]
    assert [e["k"] for e in ins["events"]] == ["new", "backup"]
    assert ins["protected"] == 0 and ins["evictable"] == 4  # acked: the lock is gone


def test_v2_write_through_holds_the_backup_until_its_write_ack(tmp_path):
    t = write(tmp_path / "t.jsonl", [
        WT2,
        {"op": "insert", "tokens": [1, 2, 3, 4]},      # node 1, backed up, un-acked
        {"op": "insert", "tokens": [1, 2, 5, 6]},      # splits node 1: fragment 2, leaf 3
        {"op": "evict_device", "n": 4},                # everything is locked by the writes
        {"op": "write_ack", "id": 1},                  # the ack keeps the original node's id
        {"op": "write_ack", "id": 2},                  # a fragment has no ack of its own
        {"op": "dump"},
    ])
    out = outputs(t)
    assert out[1]["protected"] == 4 and out[2]["protected"] == 6
    assert out[3]["freed"] == 0 and out[3]["events"] == []
    assert out[4]["protected"] == 4 and out[4]["evictable"] == 2 and "error" not in out[4]
    assert out[5]["error"] == "unknown_write_id"
    # node 1 and its fragment 2 are tracked duplicates from the ack on; leaf 3 is not yet
    assert out[6]["duplicates"] == [2, 1]


def test_server_ids_start_at_ten_under_root_five(tmp_path):
    t = write(tmp_path / "t.jsonl", [
        {"op": "header", "device_capacity": 16, "host_capacity": 16, "ids": "server", "version": 2},
        {"op": "insert", "tokens": [1, 2, 3]},
        {"op": "insert", "tokens": [1, 2, 4]},
        {"op": "dump"},
    ])
    out = outputs(t)
    assert [e["id"] for e in out[1]["events"]] == [10]
    assert [(e["k"], e["id"]) for e in out[2]["events"]] == [("split", 11), ("new", 12)]
    assert [(n["id"], n["parent"]) for n in out[3]["tree"]] == [(11, 5), (10, 11), (12, 11)]


def test_reserved_that_does_not_fit_is_an_error_and_changes_nothing(tmp_path):
    t = write(tmp_path / "t.jsonl", [
        {"op": "header", "device_capacity": 8, "host_capacity": 8, "version": 2},
        {"op": "insert", "tokens": [1, 2, 3, 4], "reserved": 4},
        {"op": "insert", "tokens": [5], "reserved": 5},
        {"op": "insert", "tokens": [5], "reserved": 4},
    ])
    out = outputs(t)
    assert out[2]["error"] == "reserved_overflow" and out[2]["dev"] == 4
    assert out[3]["error"] == "device_full"  # 4 in the tree + 4 reserved: no room


# ------------------------------------------------------------ run --record-ops
def record(tmp_path, *sets, tp=2, dp=1, requests=60, name="ops", rc_ok=(0,)):
    ops = tmp_path / name
    argv = ["run", ROOT / "scenarios" / "quickstart.yaml", "-o", tmp_path / "res", "--quiet",
            "--record-ops", ops, "--set", f"limits.max_requests={requests}",
            "--set", f"tp={tp}", "--set", f"dp={dp}"]
    for s in sets:
        argv += ["--set", s]
    rc, out, err = main(argv)
    assert rc in rc_ok, err
    return ops, json.loads((ops / "index.json").read_text())


def check_replays(ops: Path, index: dict) -> list[dict]:
    """Every trace replays with no error to the engine's own final tree."""
    heads = []
    for t in index["traces"]:
        out = outputs(ops / t["file"])
        assert len(out) == t["ops"] + 1
        assert not [o for o in out if "error" in o]
        last = out[-1]
        assert {k: last[k] for k in ("digest", "dev", "host", "nodes")} == t["final"]
        heads.append(json.loads((ops / t["file"]).read_text().splitlines()[0]))
    return heads


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_record_ops_traces_replay_to_the_engines_trees(tmp_path, policy):
    ops, index = record(tmp_path, f"cache.write_policy={policy}", requests=200)
    assert index["kind"] == "hicache-sim op-traces" and index["tp"] == 2
    assert [t["rank"] for t in index["traces"]] == [0, 1]
    heads = check_replays(ops, index)
    assert all(h["version"] == 2 and h["write_acks"] == "op" and h["write_policy"] == policy
               for h in heads)
    kinds = {json.loads(x)["op"] for x in (ops / "rank0.jsonl").read_text().splitlines()[1:]}
    assert ("write_ack" in kinds) == (policy == "write_through")
    if policy == "write_back":
        assert any(t["final"]["digest"] for t in index["traces"])  # reclaims happened


def test_record_ops_is_deterministic_and_replaces_its_own_folder(tmp_path):
    ops, _ = record(tmp_path)
    first = {p.name: p.read_bytes() for p in ops.iterdir()}
    ops, _ = record(tmp_path)  # the same folder again: replaced whole
    assert {p.name: p.read_bytes() for p in ops.iterdir()} == first


def test_record_ops_with_dp_writes_one_folder_per_instance(tmp_path):
    ops, index = record(tmp_path, dp=2, requests=80)
    assert sorted(p.name for p in ops.iterdir()) == ["index.json", "instance0", "instance1"]
    assert [(t["instance"], t["rank"], t["file"]) for t in index["traces"]] == [
        (0, 0, "instance0/rank0.jsonl"), (0, 1, "instance0/rank1.jsonl"),
        (1, 0, "instance1/rank0.jsonl"), (1, 1, "instance1/rank1.jsonl")]
    check_replays(ops, index)


def test_host_alloc_failures_are_in_the_header_and_replay(tmp_path):
    ops, index = record(tmp_path, "jitter.host_alloc_failure.probability=0.2",
                        "jitter.host_alloc_failure.ranks=[1]", "host.ratio=1", requests=120,
                        rc_ok=(0, 3))
    # a run the divergence halts (exit 3) still writes what each replica did up to then
    heads = {h.get("host_alloc_failures") is not None for h in check_replays(ops, index)}
    assert heads == {True, False}  # rank 1 failed some allocations, rank 0 none


@pytest.mark.parametrize("setup, found", [
    ("file", "found a file"),
    ("foreign", "not an op-trace folder"),
    ("same", "expected a --record-ops folder apart from it"),
])
def test_record_ops_folder_rules(tmp_path, setup, found):
    target = tmp_path / "ops"
    if setup == "file":
        target.write_text("x")
    elif setup == "foreign":
        target.mkdir()
        (target / "notes.txt").write_text("mine")
    else:
        target = tmp_path / "res" / "ops"
    rc, _, err = main(["run", ROOT / "scenarios" / "quickstart.yaml", "-o", tmp_path / "res",
                       "--quiet", "--record-ops", target, "--set", "limits.max_requests=5"])
    assert rc == 2 and err.count("\n") == 1 and found in err and "Traceback" not in err
    if setup == "foreign":
        assert (target / "notes.txt").read_text() == "mine"
