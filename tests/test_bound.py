"""`hicache-sim bound` and `bound_for_scenario`: the optimum bounds the simulator."""

import csv
import json

import pytest

import cli
from sim.analysis.bound import BOUND_FILE, CSV_FILE, bound_for_scenario
from sim.commands.bound import parse_capacities
from sim.errors import UserError
from sim.scenario import load_scenario

SCENARIO = """\
name: bound_small
seed: 5
model: {preset: llama-3.1-8b}
tp: 1
page_size: 64
device: {tokens: 8192}
host: {ratio: 2.0}
cache: {write_policy: write_back, host_policy: duplicate_first}
workload:
  kind: multi_turn_chat
  num_requests: 120
  block_size: 64
  arrival: {process: poisson, rate: 4.0}
  num_system_prompts: 3
  system_prompt_tokens: 1024
  turns: {dist: exponential, mean: 4}
  user_tokens: {dist: lognormal, mean: 200, cv: 1.0}
  output_tokens: {dist: lognormal, mean: 128, cv: 1.0}
  think_time_s: {dist: exponential, mean: 5}
  max_context_tokens: 8192
scheduler: {max_running_requests: 16}
"""


@pytest.fixture()
def scenario_file(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(SCENARIO)
    return path


def test_bound_document(scenario_file):
    s = load_scenario(scenario_file)
    doc = bound_for_scenario(s, capacities=[4096, 8192], tree=True)
    assert [r["label"] for r in doc["rows"]] == ["device", "device+host", "extra"]
    assert [r["capacity_tokens"] for r in doc["rows"]] == [8192, 8192 + doc["host_tokens"], 4096]
    for r in doc["rows"]:
        assert 0 <= r["lru_hit_rate"] <= r["opt_lower_hit_rate"] <= r["opt_upper_hit_rate"] <= 1
        assert r["opt_exact"]
        assert r["tree_lru_hit_rate"] <= r["opt_upper_hit_rate"]
    union = doc["rows"][1]
    assert doc["bound_hit_rate"] == doc["two_tier"]["upper_hit_rate"] == union["opt_upper_hit_rate"]
    assert doc["kind"] == "exact"
    t = doc["two_tier"]
    assert t["device_hit_rate"] == doc["rows"][0]["opt_lower_hit_rate"]
    assert t["device_hit_rate"] + t["host_hit_rate"] == pytest.approx(t["lower_hit_rate"])
    # A host hit worth nothing: the bound falls to the device's own optimum.
    no_host = bound_for_scenario(s, host_weight=0.0)
    assert no_host["bound_hit_rate"] == pytest.approx(doc["rows"][0]["opt_upper_hit_rate"])
    assert bound_for_scenario(s, capacities=[4096, 8192], tree=True) == doc  # deterministic


@pytest.mark.parametrize("sets", [
    [],
    ["cache.write_policy=write_through"],
    ["device.tokens=2048", "host.ratio=1"],
])
def test_simulated_hit_rate_never_beats_the_bound(scenario_file, sets):
    from sim.runner import run_scenario

    s = load_scenario(scenario_file, sets)
    simulated = run_scenario(s).summary["hit_rate"]
    doc = bound_for_scenario(s)
    assert 0 < simulated <= doc["bound_hit_rate"]


def test_cli_writes_json_csv_and_results_bound(scenario_file, tmp_path, capsys):
    out, results = tmp_path / "out", tmp_path / "results"
    results.mkdir()
    argv = ["bound", str(scenario_file), "--capacities", "2e3,4096", "--tree", "-o", str(out),
            "--results", str(results)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "BOUND" in printed and "bound_hit_rate" in printed
    doc = json.loads((out / BOUND_FILE).read_text())
    assert json.loads((results / BOUND_FILE).read_text()) == doc
    assert doc["kind"] in ("exact", "upper") and 0 < doc["bound_hit_rate"] <= 1
    assert [r["capacity_tokens"] for r in doc["rows"]][2:] == [2000, 4096]
    rows = list(csv.DictReader((out / CSV_FILE).open()))
    measures = {r["measure"] for r in rows}
    assert measures == {"lru_model", "lru_tree", "opt_lower", "opt_upper",
                        "two_tier_lower", "two_tier_upper"}
    assert all(r["is_bound"] == str(r["measure"].startswith(("opt", "two_tier"))) for r in rows)
    first = (out / BOUND_FILE).read_bytes(), (out / CSV_FILE).read_bytes()
    assert cli.main(argv) == 0
    assert ((out / BOUND_FILE).read_bytes(), (out / CSV_FILE).read_bytes()) == first


@pytest.mark.parametrize("extra, message", [
    (["--capacities", "abc"], "--capacities: found 'abc'"),
    (["--capacities", "-5"], "--capacities: found '-5'"),
    (["--capacities", "1.5"], "--capacities: found '1.5'"),
    (["--host-weight", "1.5"], "--host-weight: found '1.5'"),
    (["--host-weight", "nan"], "--host-weight: found 'nan'"),
    (["--results", "/nonexistent/folder"], "expected an existing results folder"),
    (["--set", "device.tokenz=5"], "unknown key 'tokenz'"),
])
def test_bad_input_is_one_line(scenario_file, capsys, extra, message):
    assert cli.main(["bound", str(scenario_file), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_out_must_be_a_folder(scenario_file, tmp_path, capsys):
    target = tmp_path / "a_file"
    target.write_text("x")
    assert cli.main(["bound", str(scenario_file), "-o", str(target)]) == 2
    assert "expected a folder" in capsys.readouterr().err


def test_missing_scenario_is_one_line(tmp_path, capsys):
    assert cli.main(["bound", str(tmp_path / "none.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_parse_capacities():
    assert parse_capacities(["1e6", "2000000,5e6", "0"]) == [1_000_000, 2_000_000, 5_000_000, 0]
    with pytest.raises(UserError):
        parse_capacities(["inf"])
