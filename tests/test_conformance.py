"""Replaying every conformance case must reproduce SGLang's outputs exactly."""

import gzip
import hashlib

import pytest

from conftest import CONFORMANCE, case_id, conformance_cases, expected_outputs, replay_checked
from sim.optrace import Replayer, replay

CASES = conformance_cases()


def test_vendored_cases_are_the_originals():
    """data/conformance holds shared/conformance's files, compressed, byte for byte."""
    sums = dict(line.split()[::-1] for line in (CONFORMANCE / "SHA256SUMS").read_text().splitlines())
    vendored = {p.name[:-3] for p in CONFORMANCE.glob("*.gz")}
    assert set(sums) == vendored and len(vendored) >= 66
    for name, digest in sums.items():
        data = gzip.decompress((CONFORMANCE / f"{name}.gz").read_bytes())
        assert hashlib.sha256(data).hexdigest() == digest, name


def test_cases_found():
    assert len(CASES) >= 33


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_replay_matches_sglang(case):
    expected = expected_outputs(case)
    got = list(replay(case))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g == e, f"line {e['i']} ({e['op']}) differs"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_invariants_hold_after_every_op(case):
    for _ in replay_checked(case, Replayer):
        pass  # the check runs inside, after every op


def test_lfu_under_write_through_follows_sglang():
    """tests/data/one_core: SGLang's own outputs for an lfu write_through trace. A
    write_through insert raises the hit count (lfu's priority) of the leaves it walks
    and makes; SGLang's heap, built at each eviction's start, sees the raised count,
    so the tree's kept heaps must re-push such a leaf (sim.policies.eviction
    READS_HIT_COUNT)."""
    from conftest import ROOT, expected_lines
    from sim.optrace import replay_lines

    case = ROOT / "tests" / "data" / "one_core" / "lfu_wt_s5.jsonl.gz"
    assert list(replay_lines(case)) == expected_lines(case)
