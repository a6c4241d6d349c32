"""Replaying every case in shared/conformance must reproduce SGLang's outputs exactly."""

import json

import pytest

from conftest import SHARED
from sim.optrace import Replayer, read_trace, replay

CASES = sorted(p for p in (SHARED / "conformance").glob("*.jsonl") if not p.name.endswith(".out.jsonl"))


def test_cases_found():
    assert len(CASES) >= 33


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_replay_matches_sglang(case):
    expected = [json.loads(line) for line in case.with_suffix(".out.jsonl").open() if line.strip()]
    got = list(replay(case))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g == e, f"line {e['i']} ({e['op']}) differs"


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_invariants_hold_after_every_op(case):
    replayer = None
    for idx, _, op in read_trace(case):
        if replayer is None:
            replayer = Replayer(op)
            continue
        replayer.apply(idx, op)
        replayer.tree.check()
