"""Every shipped scenario's results and every conformance replay's output hash to the
table in tests/data/result_hashes.json (tools/result_hashes.py): a speed-up changes no
byte. A change meant to move results regenerates the table with --write."""

import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import result_hashes as rh  # noqa: E402

TABLE = rh.load_table()
ENTRIES = rh.entries()


def test_the_table_covers_exactly_what_ships():
    assert set(TABLE) == set(ENTRIES)
    assert sum(k.startswith("scenario:") for k in ENTRIES) >= 30
    assert sum(k.startswith("replay:") for k in ENTRIES) >= 200


@pytest.mark.parametrize("key", sorted(ENTRIES))
def test_results_are_byte_identical(key):
    got = rh.compute(key)
    want = TABLE[key]
    if isinstance(want, dict):
        assert set(got) == set(want), key
        assert [f for f in sorted(want) if got[f] != want[f]] == [], key
    else:
        assert got == want, key
