"""`repro` and `replay`: every failing jitter class is found, shrunk, bundled and replayed
exactly; the absorbed class finds nothing; shipped bundles replay; bad input is one line."""

import json
import shutil

import pytest
from conftest import ROOT

import cli
from sim import repro
from sim.analysis.divergence import replay_trace
from sim.analysis.shrink import Knob, minimise
from sim.optrace import read_trace
from sim.scenario import load_scenario

# The failing jitter classes and the verdict the shipped scenario reaches (tests/test_engine.py).
FAILING = {
    "ack_local": "detected",
    "skip_when_idle": "hang",
    "id_drift": "false_alarm",
    "host_alloc_failure": "detected",
    "host_capacity_skew": "detected",
    "request_order": "hang",
}
BUNDLES = ROOT / "bundles"


def scenario_path(name: str) -> str:
    return str(ROOT / "scenarios" / f"jitter_{name}.yaml")


def one_line(text: str) -> str:
    lines = [x for x in text.splitlines() if x.strip()]
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.parametrize("name", list(FAILING))
def test_repro_finds_shrinks_and_replays_each_failing_class(name, tmp_path, capsys):
    out = tmp_path / name
    assert cli.main(["repro", scenario_path(name), "-o", str(out), "--tries", "3"]) == 3
    printed = capsys.readouterr().out
    assert "found:" in printed and "shrunk in" in printed
    meta = json.loads((out / "bundle.json").read_text())
    assert meta["verdict"] == FAILING[name]
    assert meta["jitter_class"] == name
    assert meta["seeds"]["try"] < 3
    before, after = meta["sizes"]["before"], meta["sizes"]["after"]
    assert after["requests"] < before["requests"]
    assert after["ranks"] <= before["ranks"] and after["events"] < before["events"]
    assert meta["shrink"]["started_from_original"] and meta["shrink"]["runs"] <= 300
    # the bundle is complete and consistent with itself
    for f in ("scenario.yaml", "schedule.jsonl", "report.md", "report.json"):
        assert (out / f).is_file()
    schedule = [json.loads(x) for x in (out / "schedule.jsonl").read_text().splitlines()]
    assert sum(1 for x in schedule if "op" in x) == after["events"]
    assert sum(1 for x in schedule if "collective" in x) > 0
    for r in range(after["ranks"]):
        trace = [op for _, _, op in read_trace(out / "ranks" / f"rank{r}.optrace.jsonl")]
        assert replay_trace(trace).final_digest == meta["expect"]["digests"][str(r)]
    # the minimal scenario alone fails the same way
    res = repro.run_case(load_scenario(out / "scenario.yaml"))
    assert res.failure_class == meta["failure_class"]
    assert res.divergence["digests"] == meta["expect"]["digests"]
    # replay reproduces it exactly (exit 0) and prints the recorded one-line failure
    assert cli.main(["replay", str(out)]) == 0
    captured = capsys.readouterr()
    assert one_line(captured.err) == f"hicache-sim replay: {meta['failure']}"
    assert "reproduced" in captured.out


def test_the_absorbed_class_reports_no_divergence(tmp_path, capsys):
    out = tmp_path / "ack_delay"
    assert cli.main(["repro", scenario_path("ack_delay"), "-o", str(out), "--tries", "3"]) == 0
    printed = capsys.readouterr().out
    assert printed.count(": absorbed") == 3
    assert "no divergence within budget: 3 tries" in printed
    assert not out.exists()


def test_repro_is_deterministic(tmp_path):
    dirs = []
    for k in range(2):
        out = tmp_path / f"b{k}"
        assert cli.main(["repro", scenario_path("request_order"), "-o", str(out), "--tries", "2"]) == 3
        dirs.append(out)
    files = sorted(p.relative_to(dirs[0]) for p in dirs[0].rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(dirs[1]) for p in dirs[1].rglob("*") if p.is_file())
    for f in files:
        assert (dirs[0] / f).read_bytes() == (dirs[1] / f).read_bytes(), f


@pytest.mark.parametrize("name", list(FAILING))
def test_shipped_bundles_replay(name, capsys):
    path = BUNDLES / name
    meta = json.loads((path / "bundle.json").read_text())
    assert meta["jitter_class"] == name and meta["verdict"] == FAILING[name]
    assert cli.main(["replay", str(path)]) == 0
    assert one_line(capsys.readouterr().err) == f"hicache-sim replay: {meta['failure']}"


def test_report_names_the_first_divergent_event():
    drift = json.loads((BUNDLES / "id_drift" / "report.json").read_text())
    ev = drift["first_divergent_event"]
    assert ev["kind"] == "op" and ev["sides"][1]["op"].startswith("skip_ids")
    pair = drift["divergent_ops"][0]
    # the false alarm: the trees stay logically equal, only the digests differ
    assert pair["tree_diff_at_failure"]["equal"]
    assert pair["tree_diff_at_failure"]["digest"]["a"] != pair["tree_diff_at_failure"]["digest"]["b"]
    skew = json.loads((BUNDLES / "host_capacity_skew" / "report.json").read_text())
    assert not skew["divergent_ops"][0]["tree_diff_at_failure"]["equal"]
    idle = json.loads((BUNDLES / "skip_when_idle" / "report.json").read_text())
    assert idle["first_divergent_event"]["kind"] == "collective"
    assert "skipped it" in idle["first_divergent_event"]["error"]


def test_write_through_bundles_replay_without_op_traces(tmp_path, capsys):
    out = tmp_path / "wt"
    args = ["repro", scenario_path("request_order"), "-o", str(out), "--tries", "2",
            "--set", "cache.write_policy=write_through", "--shrink-runs", "40"]
    assert cli.main(args) == 3
    meta = json.loads((out / "bundle.json").read_text())
    assert meta["op_traces"] is None and not (out / "ranks").exists()
    assert "write_through" in json.loads((out / "report.json").read_text())["op_traces"]
    assert cli.main(["replay", str(out)]) == 0


def test_search_budget_is_checked_between_tries():
    scn = load_scenario(scenario_path("ack_delay"), ["limits.max_requests=20"])
    ticks = iter(range(0, 1000, 10))  # a fake clock: 10 s pass between readings
    res = repro.search(scn, tries=5, budget_s=15, clock=lambda: next(ticks))
    assert res.outcome is None and res.stopped == "budget" and res.tries == 2
    assert [v for _, v in res.verdicts] == ["absorbed", "absorbed"]
    assert [s for s, _ in res.verdicts] == [scn.seed, scn.seed + 1]


def test_minimise_starts_from_the_original_and_is_deterministic_and_bounded():
    knobs = [Knob("a", 500, 1, 500), Knob("b", True, kind="bool"), Knob("c", 9, 0, 9)]
    calls = []

    def fails(case):
        calls.append(case)
        return case["a"] >= 37 and case["c"] >= 3

    r1 = minimise(knobs, fails, max_runs=200)
    assert calls[0] == {"a": 500, "b": True, "c": 9} and r1.started_from_original
    assert r1.case == {"a": 37, "b": False, "c": 3} and not r1.exhausted
    assert minimise(knobs, fails, max_runs=200).case == r1.case
    short = minimise(knobs, fails, max_runs=4)
    assert short.runs == 4 and short.exhausted and fails(short.case)
    never = minimise(knobs, lambda case: False, max_runs=10)
    assert never.case == never.original and never.runs == 1


def test_bad_inputs_are_one_line_errors(tmp_path, capsys):
    assert cli.main(["replay", str(tmp_path / "missing")]) == 2
    assert "no such folder" in one_line(capsys.readouterr().err)
    (tmp_path / "empty").mkdir()
    assert cli.main(["replay", str(tmp_path / "empty")]) == 2
    assert "no bundle.json" in one_line(capsys.readouterr().err)
    assert cli.main(["repro", str(tmp_path / "nope.yaml"), "-o", str(tmp_path / "b")]) == 2
    assert "no such file" in one_line(capsys.readouterr().err)
    # a bundle missing its scenario, or with broken metadata
    b = tmp_path / "b1"
    shutil.copytree(BUNDLES / "request_order", b)
    (b / "scenario.yaml").unlink()
    assert cli.main(["replay", str(b)]) == 2
    assert "no scenario.yaml" in one_line(capsys.readouterr().err)
    b = tmp_path / "b2"
    shutil.copytree(BUNDLES / "request_order", b)
    (b / "bundle.json").write_text("{not json")
    assert cli.main(["replay", str(b)]) == 2
    assert "invalid JSON" in one_line(capsys.readouterr().err)
    # repro will not overwrite a folder that is not a bundle
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    assert cli.main(["repro", scenario_path("request_order"), "-o", str(other), "--tries", "1",
                     "--shrink-runs", "0"]) == 2
    assert "not a repro bundle" in capsys.readouterr().err and (other / "keep.txt").exists()
    with pytest.raises(SystemExit) as err:
        cli.main(["repro", scenario_path("request_order"), "-o", str(tmp_path / "x"), "--tries", "0"])
    assert err.value.code == 2


def test_a_bundle_that_no_longer_fails_the_same_way_exits_1(tmp_path, capsys):
    b = tmp_path / "b"
    shutil.copytree(BUNDLES / "host_capacity_skew", b)
    meta = json.loads((b / "bundle.json").read_text())
    meta["expect"]["first_true_divergence"]["step"] += 1
    (b / "bundle.json").write_text(json.dumps(meta))
    assert cli.main(["replay", str(b)]) == 1
    line = one_line(capsys.readouterr().err)
    assert "does not reproduce: first_true_divergence" in line
    # a rank's op-trace that no longer reaches the recorded digest
    shutil.rmtree(b)
    shutil.copytree(BUNDLES / "host_capacity_skew", b)
    trace = b / "ranks" / "rank0.optrace.jsonl"
    lines = trace.read_text().splitlines()
    # drop the op that last changed rank 0's digest (line i holds op i: the header is line 0)
    cut = json.loads((b / "report.json").read_text())["digest_timeline"]["0"][-1][0]
    trace.write_text("\n".join(lines[:cut] + lines[cut + 1:]) + "\n")
    assert cli.main(["replay", str(b)]) == 1
    assert "rank0.optrace.jsonl replays to digest" in one_line(capsys.readouterr().err)


def test_replay_ops_honours_a_bundles_host_alloc_failures(tmp_path):
    """The failing rank's op-trace replays to the digest the engine reached, through the
    plain replay-ops command (header extensions read by the replayer itself)."""
    import json as _json

    from sim.optrace import replay

    bundle = ROOT / "bundles" / "host_alloc_failure"
    digests = _json.loads((bundle / "bundle.json").read_text())
    trace = bundle / "ranks" / "rank1.optrace.jsonl"
    header = _json.loads(trace.read_text().splitlines()[0])
    assert header.get("host_alloc_failures")
    outs = list(replay(trace))
    assert outs[-1]["digest"] == digests["optrace_final_digests"]["1"]
    rank0 = list(replay(bundle / "ranks" / "rank0.optrace.jsonl"))
    assert rank0[-1]["digest"] == digests["optrace_final_digests"]["0"] != outs[-1]["digest"]
    assert any(e["k"] == "drop" for o in outs for e in o["events"])  # the failed backup
