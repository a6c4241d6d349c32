"""Metrics rows kept in typed chunks (sim.metrics._Rows) give the frames, summaries
and files that one frame over every row gave."""

import math

import pandas as pd
import pytest

from conftest import ROOT
from sim import metrics
from sim.metrics import _Rows
from sim.runner import run_scenario
from sim.scenario import load_scenario


def _whole(rows, columns):
    return pd.DataFrame(rows, columns=columns)


MIXES = {
    "ints then floats": [(i, i) for i in range(9)] + [(9, 0.5), (10, 2.0)],
    "floats then ints": [(i, 0.5 * i) for i in range(9)] + [(9, 3), (10, 4)],
    "ints then None": [(i, i) for i in range(9)] + [(9, None)],
    "nan in one chunk": [(i, math.nan if i < 5 else 1.5) for i in range(12)],
    "strings": [(i, f"s{i}") for i in range(11)],
    "all ints": [(i, 2 * i) for i in range(13)],
}


@pytest.mark.parametrize("name", MIXES)
def test_chunked_rows_infer_what_one_frame_infers(name, monkeypatch):
    monkeypatch.setattr(metrics, "ROW_CHUNK", 4)
    rows = MIXES[name]
    t = _Rows(["a", "b"])
    for r in rows:
        t.append(r)
    got = metrics._frame([t], ["a", "b"])
    want = _whole(rows, ["a", "b"])
    assert list(got.dtypes) == list(want.dtypes)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert len(t) == len(rows) and t.last()[0] == want.iloc[-1, 0]


def test_no_rows_is_the_empty_frame():
    got = metrics._frame([_Rows(["a", "b"])], ["a", "b"])
    pd.testing.assert_frame_equal(got, _whole([], ["a", "b"]))


@pytest.mark.parametrize("scenario,sets", [
    ("quickstart", ["workload.num_requests=400"]),
    ("mooncake_conversation", ["limits.max_requests=300"]),  # dp 8: eight tables
    ("storage_mooncake", ["workload.num_requests=120"]),
])
def test_a_run_writes_the_same_files_in_small_chunks(scenario, sets, monkeypatch, tmp_path):
    scn = load_scenario(ROOT / "scenarios" / f"{scenario}.yaml", sets)
    monkeypatch.setattr(metrics, "ROW_CHUNK", 10**9)
    one = run_scenario(scn, tmp_path / "one")
    monkeypatch.setattr(metrics, "ROW_CHUNK", 7)
    many = run_scenario(scn, tmp_path / "many")
    assert any(len(i.metrics._rows.chunks) > 3 for i in many.sim.instances)
    assert many.summary == one.summary
    for f in ("requests.parquet", "timeseries.parquet", "summary.json", "divergence.json"):
        assert (tmp_path / "many" / f).read_bytes() == (tmp_path / "one" / f).read_bytes(), f
    a, b = one.sim.instances[0].metrics, many.sim.instances[0].metrics
    assert a.rows == b.rows and a.ts == b.ts
