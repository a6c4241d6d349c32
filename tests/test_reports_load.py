"""Reading results and sweep folders: contents, the partial flag, one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from reports.load import Results, flatten, load_many, load_run, load_sweep
from sim.errors import InputFormatError, UserError
from test_reports_fixture import build_run, build_sweep


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("load") / "wt-lru-x2", ratio=2.0)


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_load_run_reads_every_file(run_dir):
    run = load_run(run_dir)
    assert run.label == "wt-lru-x2" and run.name == "write_through-lru-x2"
    assert len(run.requests) == 240 and run.requests["rid"].is_monotonic_increasing
    req = run.requests
    # The fixture honours the contract the plots rely on.
    assert (req["device_hit_tokens"] + req["host_hit_tokens"] + req["miss_tokens"]
            == req["input_tokens"]).all()
    assert np.allclose(req["ttft_s"], req["first_token"] - req["arrival"])
    assert run.timeseries["t"].is_monotonic_increasing
    assert run.scenario["cache"]["write_policy"] == "write_through"
    assert "write_policy: write_through" in run.scenario_text
    assert run.meta["seed"] == 0 and run.partial is False
    assert run.display_label == "wt-lru-x2"
    assert run.divergence["verdict"] == "agree"
    assert 0 < run.summary["hit_rate"] < 1


def test_partial_run_loads_with_flag(tmp_path):
    run = load_run(build_run(tmp_path / "cut", partial=True))
    assert run.partial is True
    assert run.display_label == "cut (partial)"
    assert run.requests["ttft_s"].isna().any()


def test_missing_folder_is_one_line_user_error(tmp_path):
    with pytest.raises(UserError) as err:
        load_run(tmp_path / "nope")
    msg = _one_line(err)
    assert str(tmp_path / "nope") in msg and "no such folder" in msg


def test_file_is_not_a_results_folder(tmp_path):
    f = tmp_path / "x.parquet"
    f.write_text("x")
    with pytest.raises(UserError, match="is a file; expected a results folder"):
        load_run(f)


def test_empty_folder_is_not_a_results_folder(tmp_path):
    with pytest.raises(UserError) as err:
        load_run(tmp_path)
    assert "not a results folder" in _one_line(err)


def test_parent_of_results_folders_suggests_them(tmp_path):
    build_run(tmp_path / "a")
    with pytest.raises(UserError) as err:
        load_many([tmp_path])
    msg = _one_line(err)
    assert "not a results folder" in msg and "1 results folder(s)" in msg
    assert str(tmp_path / "a") in msg


def test_incomplete_folder_names_the_missing_files(tmp_path):
    d = build_run(tmp_path / "r")
    (d / "summary.json").unlink()
    (d / "divergence.json").unlink()
    with pytest.raises(UserError) as err:
        load_run(d)
    msg = _one_line(err)
    assert "missing divergence.json, summary.json" in msg and str(d) in msg


def test_missing_column_is_named(tmp_path):
    d = build_run(tmp_path / "r")
    df = pd.read_parquet(d / "requests.parquet").drop(columns=["ttft_s"])
    df.to_parquet(d / "requests.parquet")
    with pytest.raises(UserError) as err:
        load_run(d)
    msg = _one_line(err)
    assert "requests.parquet" in msg and "missing column(s) ttft_s" in msg


@pytest.mark.parametrize("name, text, expected", [
    ("meta.json", '{"partial": tru', "not valid JSON"),
    ("summary.json", "[1, 2]", "a JSON list"),
    ("scenario.yaml", "cache: [unclosed\n", "not valid YAML"),
    ("scenario.yaml", "- a\n- b\n", "a YAML list"),
])
def test_malformed_files_are_input_format_errors(tmp_path, name, text, expected):
    d = build_run(tmp_path / "r")
    (d / name).write_text(text)
    with pytest.raises(InputFormatError) as err:
        load_run(d)
    msg = _one_line(err)
    assert name in msg and expected in msg


def test_unreadable_parquet(tmp_path):
    d = build_run(tmp_path / "r")
    (d / "timeseries.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputFormatError, match="timeseries.parquet.*unreadable"):
        load_run(d)


def test_counter_that_decreases_breaks_the_contract(tmp_path):
    d = build_run(tmp_path / "r")
    ts = pd.read_parquet(d / "timeseries.parquet")
    ts.loc[5, "backup_tokens"] = ts.loc[4, "backup_tokens"] - 64
    ts.to_parquet(d / "timeseries.parquet")
    with pytest.raises(UserError, match="backup_tokens decreases at row 5"):
        load_run(d)


def test_load_many_mixes_runs_and_sweeps_and_dedupes(tmp_path):
    sweep = build_sweep(tmp_path / "sw", ratios=(1.0, 2.0), seeds=(0,),
                        host_policies=("lru",), requests=60)
    a = build_run(tmp_path / "x" / "run")
    b = build_run(tmp_path / "y" / "run", ratio=4.0)
    res = load_many([a, sweep, b, tmp_path / "x" / ".." / "x" / "run"])
    assert isinstance(res, Results) and len(res) == 3
    assert [r.label for r in res.runs] == ["x/run", "y/run"]  # same name: parent added
    (sw,) = res.sweeps
    assert len(sw.table) == 4 and sw.label == "sw"
    assert sw.parameter_columns == ["cache.host_policy", "cache.write_policy",
                                    "host.ratio", "workload.kind"]


def test_sweep_without_capacity_column_is_rejected(tmp_path):
    d = tmp_path / "sw"
    d.mkdir()
    pd.DataFrame({"device_hit_rate": [0.2], "host_hit_rate": [0.1],
                  "miss_rate": [0.7]}).to_parquet(d / "sweep.parquet")
    with pytest.raises(UserError, match="host_tokens"):
        load_sweep(d)
    with pytest.raises(UserError, match="is a sweep folder"):
        load_run(d)


def test_no_paths_is_a_user_error():
    with pytest.raises(UserError, match="no results folders"):
        load_many([])


def test_flatten_keeps_order_and_lists():
    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None, "f": {}}) == {
        "a.b": 1, "a.c.d": [1, 2], "e": None, "f": {}}


def test_fixture_summary_matches_rows(run_dir):
    """The fixture's summary.json is computed from its rows (so plots can be checked)."""
    req = pd.read_parquet(run_dir / "requests.parquet")
    summary = json.loads((run_dir / "summary.json").read_text())
    total = req["input_tokens"].sum()
    assert summary["device_hit_rate"] == pytest.approx(req["device_hit_tokens"].sum() / total)
    assert summary["load_back_bytes"] == req["load_back_bytes"].sum()
