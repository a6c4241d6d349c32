"""buffer_only op-traces (docs/OPTRACE.md §15): the tree-visible steps of SGLang
0.5.23's buffer pipeline (a write's D2H staging lock until its ack, a prefetch's anchor
pin, inserts on a tree that holds no host values) replay SGLang's own tree byte for
byte on every case of data/conformance/buffer/, and the tree's invariants hold after
every op. No SGLang at test time: its outputs are vendored."""

from __future__ import annotations

import pytest

from conftest import (ROOT, assert_replays_byte_for_byte, case_id, conformance_cases,
                      expected_outputs, replay_checked, vendored_checksums_match)
from sim.optrace import Replayer, read_trace

BUFFER = ROOT / "data" / "conformance" / "buffer"
CASES = conformance_cases(BUFFER)


def test_vendored_files_match_their_checksums():
    vendored_checksums_match(BUFFER)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_replay_matches_sglang_byte_for_byte(case):
    assert_replays_byte_for_byte(case)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_invariants_hold_after_every_op(case):
    for replayer in replay_checked(case, Replayer):
        assert replayer.tree.buffer_only
        assert replayer.tree.host_used == 0  # the tree never holds host values


def test_cases_cover_every_buffer_op_and_error():
    ops, errors = set(), set()
    for case in CASES:
        for out in expected_outputs(case):
            ops.add(out["op"])
            if "error" in out:
                errors.add((out["op"], out["error"]))
    assert {"buffer_stage", "write_ack", "pin", "unpin", "insert", "evict_device"} <= ops
    assert {("buffer_stage", "unknown_node"), ("buffer_stage", "bad_buffer_stage"),
            ("write_ack", "unknown_write_id"), ("pin", "duplicate_pin_id"),
            ("pin", "unknown_node"), ("unpin", "unknown_pin_id")} <= errors
    # a staged node split while its D2H is in flight (the ack releases the lower piece)
    assert any(e["k"] == "split" for case in CASES for out in expected_outputs(case)
               for e in out.get("events", ()))


def test_engine_cases_are_buffer_only_recordings():
    for case in CASES:
        if case.name.startswith("b"):
            head = next(iter(read_trace(case)))[2]
            assert head["host_memory_mode"] == "buffer_only" and "storage_writes" not in head
