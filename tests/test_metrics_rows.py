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
    assert any(i.metrics._rows.n_chunks > 3 for i in many.sim.instances)
    assert many.summary == one.summary
    for f in ("requests.parquet", "timeseries.parquet", "summary.json", "divergence.json"):
        assert (tmp_path / "many" / f).read_bytes() == (tmp_path / "one" / f).read_bytes(), f
    a, b = one.sim.instances[0].metrics, many.sim.instances[0].metrics
    assert a.rows == b.rows and a.ts == b.ts


def _tables(spill_dir, rows_per_table, columns, spill):
    import tempfile

    tables = []
    for rows in rows_per_table:
        t = _Rows(columns)
        if spill:
            t.spill_to(tempfile.TemporaryFile(dir=spill_dir))
        for r in rows:
            t.append(r)
        tables.append(t)
    return tables


SORTABLE = {
    "ints": lambda rng, i: (rng.randrange(50), i, 2 * i),
    "ints then floats": lambda rng, i: (rng.randrange(50), i, i if i < 20 else i + 0.5),
    "floats and nan": lambda rng, i: (rng.randrange(50), 0.25 * i, math.nan if i % 7 else 1.5),
    "bools": lambda rng, i: (rng.randrange(50), i % 3 == 0, i),
    "ints then None": lambda rng, i: (rng.randrange(50), i, None if i == 30 else i),  # plain path
    "strings": lambda rng, i: (rng.randrange(50), f"s{i}", i),  # plain path
}


@pytest.mark.parametrize("spill", [False, True])
@pytest.mark.parametrize("name", SORTABLE)
def test_the_one_pass_sorted_frame_is_pandas_concat_and_sort(name, spill, monkeypatch, tmp_path):
    """_sorted_frame (columns filled chunk by chunk, one stable sort) against pandas'
    concat + sort_values, over several tables (instances), spilled or in memory: the
    same frame and the same parquet bytes; by one key and by several."""
    import random

    from sim.atomic import write_parquet

    monkeypatch.setattr(metrics, "ROW_CHUNK", 8)
    rng = random.Random(len(name))
    make = SORTABLE[name]
    rows = [[make(rng, i) for i in range(k * 37, k * 37 + n)] for k, n in enumerate((37, 9, 0, 61))]
    cols = ["k", "a", "b"]
    for by in (["k"], ["k", "a"]):
        want = metrics._plain_sorted_frame(_tables(tmp_path, rows, cols, spill), cols, by)
        got = metrics._sorted_frame(_tables(tmp_path, rows, cols, spill), cols, by)
        assert list(got.dtypes) == list(want.dtypes)
        pd.testing.assert_frame_equal(got, want, check_exact=True)
        write_parquet(tmp_path / "got.parquet", got)
        write_parquet(tmp_path / "want.parquet", want)
        assert (tmp_path / "got.parquet").read_bytes() == (tmp_path / "want.parquet").read_bytes()


def test_spilled_rows_leave_no_file_in_the_results_folder(monkeypatch, tmp_path):
    """The chunks of a run with a results folder go to unnamed files in the staged
    folder: the folder holds only its results, and the rows read back after the run
    are the ones written."""
    monkeypatch.setattr(metrics, "ROW_CHUNK", 16)
    scn = load_scenario(ROOT / "scenarios" / "quickstart.yaml", ["workload.num_requests=200"])
    res = run_scenario(scn, tmp_path / "out")
    m = res.sim.instances[0].metrics
    assert m._rows.spill is not None and m._rows.n_chunks > 5 and not m._rows._chunks
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "divergence.json", "meta.json", "requests.parquet", "scenario.yaml", "summary.json",
        "timeseries.parquet"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    back = pd.read_parquet(tmp_path / "out" / "requests.parquet")
    pd.testing.assert_frame_equal(res.sim.requests_df(), back, check_exact=True)
