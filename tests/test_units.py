"""Every parquet column hicache-sim writes carries its unit in the file's metadata."""

import pandas as pd
import pytest

from conftest import ROOT
from sim.atomic import write_parquet
from sim.census import build_table, table_units
from sim.metrics import REQUEST_COLUMNS, REQUEST_UNITS, TIMESERIES_COLUMNS, TIMESERIES_UNITS
from sim.units import SUMMARY_UNITS, VOCABULARY, guess_unit, read_units


def _check(path):
    units = read_units(path)
    columns = list(pd.read_parquet(path).columns)
    assert list(units) == columns  # every column, in order
    assert all(u in VOCABULARY for u in units.values()), units
    return units


def test_the_metrics_declare_a_unit_for_every_column():
    assert list(REQUEST_UNITS) == REQUEST_COLUMNS
    assert list(TIMESERIES_UNITS) == TIMESERIES_COLUMNS


def test_the_metrics_tables_are_written_with_their_units(tmp_path):
    from sim.metrics import Metrics

    m = Metrics(cfg=None)
    write_parquet(tmp_path / "requests.parquet", m.requests_df(), REQUEST_UNITS)
    write_parquet(tmp_path / "timeseries.parquet", m.timeseries_df(), TIMESERIES_UNITS)
    assert _check(tmp_path / "requests.parquet") == REQUEST_UNITS
    assert _check(tmp_path / "timeseries.parquet") == TIMESERIES_UNITS


def test_a_results_folder_has_units_in_both_tables(tmp_path):
    from sim.runner import run_scenario
    from sim.scenario import load_scenario

    scn = load_scenario(ROOT / "scenarios" / "quickstart.yaml", ["limits.max_requests=20"])
    run_scenario(scn, tmp_path / "r")
    req = _check(tmp_path / "r" / "requests.parquet")
    ts = _check(tmp_path / "r" / "timeseries.parquet")
    assert req["ttft_s"] == "s" and req["load_back_bytes"] == "bytes" and req["rid"] == "id"
    assert ts["host_used"] == "tokens" and ts["hit_rate"] == "1"


def test_a_census_table_has_units(tmp_path):
    rec = {"seed": 3, "verdict": "detected", "halted": "digest_mismatch", "steps": 812,
           "detection_delay_s": 0.4, "first_true_divergence": {"t": 14.4, "step": 800},
           "digest_mismatch": {"t": 14.8, "step": 812}, "perturbations": {"host_alloc_failure": 2}}
    table = build_table([rec])
    write_parquet(tmp_path / "census.parquet", table, table_units(table))
    units = _check(tmp_path / "census.parquet")
    assert units["detection_delay_s"] == "s" and units["perturbation_host_alloc_failure_count"] == "1"


def test_a_sweep_table_has_units_and_keeps_its_attrs(tmp_path):
    table = pd.DataFrame({"cache.host_policy": ["lru"], "host.ratio": [2.0],
                          "workload.arrival.rate": [4.0], "device.gib": [16.0],
                          "workload.zipf_s": [1.1], "seed": [0], "hit_rate": [0.7],
                          "ttft_p99_s": [0.2], "host_tokens": [32832], "verdict": ["agree"]})
    table.attrs["parameter_columns"] = ["cache.host_policy", "host.ratio"]
    write_parquet(tmp_path / "sweep.parquet", table,
                  {c: guess_unit(c, table[c]) for c in table.columns})
    assert _check(tmp_path / "sweep.parquet") == {
        "cache.host_policy": "text", "host.ratio": "1", "workload.arrival.rate": "1/s",
        "device.gib": "GiB", "workload.zipf_s": "1", "seed": "id", "hit_rate": "1",
        "ttft_p99_s": "s", "host_tokens": "tokens", "verdict": "text"}
    assert pd.read_parquet(tmp_path / "sweep.parquet").attrs["parameter_columns"] == [
        "cache.host_policy", "host.ratio"]


def test_every_summary_field_has_a_unit():
    import types

    from sim.metrics import Metrics

    stats = types.SimpleNamespace(load_tokens=0, backup_tokens=0, reclaim_pass1_tokens=0,
                                  reclaim_pass2_tokens=0, drop_tokens=0)
    tree = types.SimpleNamespace(stats=stats, device_capacity=64, host_capacity=128)
    from sim.metrics import summarize

    summary = summarize([Metrics(cfg=None)], [tree], [1.0])  # with busy times: every field
    summary.update(verdict="agree", skipped_trace_lines=0, dp=2, router="round_robin",
                   router_decisions={})  # added by sim.runner and sim.cluster
    assert [k for k in summary if k not in SUMMARY_UNITS] == []
    assert all(u in VOCABULARY for u in SUMMARY_UNITS.values())


def test_a_column_without_a_unit_is_a_bug_not_a_silent_gap(tmp_path):
    with pytest.raises(ValueError, match="no unit declared for column"):
        write_parquet(tmp_path / "x.parquet", pd.DataFrame({"a": [1], "b": [2]}), {"a": "1"})
    assert not list(tmp_path.iterdir())  # nothing half-written
