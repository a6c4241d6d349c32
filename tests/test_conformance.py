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

