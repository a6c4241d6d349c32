"""The report says why two policies gave identical results, from the results alone."""

import shutil

import pandas as pd
import yaml

from reports.html import render_report
from reports.identical import Case, find_identical
from reports.load import load_run, load_sweep
from test_reports_fixture import build_run, build_sweep

HEAD = {"hit_rate": 0.8, "device_hit_rate": 0.6, "host_hit_rate": 0.2, "ttft_p50_s": 0.01,
        "ttft_p99_s": 0.2}


def _twin(src, dst, **cache):
    """A copy of run ``src`` whose scenario differs only in the given cache keys (and its
    name): the same numbers, as two policies that took the same victims would give."""
    shutil.copytree(src, dst)
    scn = yaml.safe_load((dst / "scenario.yaml").read_text())
    scn["cache"].update(cache)
    scn["name"] = dst.name
    (dst / "scenario.yaml").write_text(yaml.safe_dump(scn, sort_keys=False))
    return dst


def _set_counter(folder, **values):
    ts = pd.read_parquet(folder / "timeseries.parquet")
    for k, v in values.items():
        ts[k] = v
    ts.to_parquet(folder / "timeseries.parquet", index=False)


def test_duplicate_first_twins_without_pass_2_are_explained(tmp_path):
    a = build_run(tmp_path / "df", write_policy="write_back", host_policy="duplicate_first")
    _set_counter(a, reclaim_pass2_tokens=0, reclaim_pass1_tokens=4096, host_evict_tokens=8192)
    b = _twin(a, tmp_path / "sp", host_policy="duplicate_first_single_pass")
    other = build_run(tmp_path / "lru", write_policy="write_back", host_policy="lru")
    html = render_report([load_run(a), load_run(b), load_run(other)])
    section = html.split('id="identical-results"')[1].split("<h2")[0]
    assert "cache.host_policy: duplicate_first vs duplicate_first_single_pass" in section
    assert "pass 2 never ran" in section and "reclaim_pass2_tokens = 0" in section
    assert "the two policies took the same victims" in section
    assert "lru" not in section.split("Why:")[0]  # the lru run differs: not listed


def test_runs_whose_numbers_differ_are_not_reported(tmp_path):
    a = build_run(tmp_path / "df", write_policy="write_back", host_policy="duplicate_first")
    b = build_run(tmp_path / "sp", write_policy="write_back",
                  host_policy="duplicate_first_single_pass")
    assert "identical-results" not in render_report([load_run(a), load_run(b)])


def test_pass_2_that_ran_is_not_called_the_reason(tmp_path):
    a = build_run(tmp_path / "df", write_policy="write_back", host_policy="duplicate_first")
    _set_counter(a, reclaim_pass2_tokens=640, host_evict_tokens=8192)
    b = _twin(a, tmp_path / "sp", host_policy="duplicate_first_single_pass")
    html = render_report([load_run(a), load_run(b)])
    assert "pass 2 freed tokens" in html and "do not establish why" in html


def test_no_host_eviction_is_the_reason_for_any_host_policy(tmp_path):
    a = build_run(tmp_path / "lru", write_policy="write_back", host_policy="lru")
    _set_counter(a, host_evict_tokens=0, reclaim_pass1_tokens=0, reclaim_pass2_tokens=0)
    b = _twin(a, tmp_path / "df", host_policy="duplicate_first")
    assert "no host eviction ever ran" in render_report([load_run(a), load_run(b)])


def test_other_keys_that_differ_make_runs_incomparable():
    params = {"cache.host_policy": "duplicate_first", "host.ratio": 1.0, "seed": 0}
    cases = [Case("a", params, HEAD), Case("b", {**params, "host.ratio": 2.0,
                                                  "cache.host_policy": "lru"}, HEAD)]
    assert find_identical(cases) == []


def test_a_sweep_with_identical_policies_at_every_point_is_explained(tmp_path):
    out = build_sweep(tmp_path / "sw", write_policies=("write_back",),
                      host_policies=("duplicate_first", "duplicate_first_single_pass"),
                      ratios=(1.0, 2.0), seeds=(0,), requests=60)
    table = pd.read_parquet(out / "sweep.parquet")
    # Make the single-pass rows copies of the duplicate_first ones: pass 2 never ran.
    first = table[table["cache.host_policy"] == "duplicate_first"].reset_index(drop=True)
    single = table["cache.host_policy"] == "duplicate_first_single_pass"
    for col in ("hit_rate", "device_hit_rate", "host_hit_rate", "ttft_p50_s", "ttft_p99_s"):
        table.loc[single, col] = first[col].to_numpy()
    table["reclaim_pass2_tokens"] = 0
    table["reclaim_pass1_tokens"] = 128
    table.to_parquet(out / "sweep.parquet", index=False)
    html = render_report([load_sweep(out)])
    assert "Policies with identical results" in html
    assert "in 2 point pair(s)" in html and "pass 2 never ran" in html
