"""`repro` and `replay`: a failing seed is found, shrunk keeping its failure class, and
bundled; every shipped bundle's op-traces replay exactly and `replay` reproduces it;
the report's first divergent event names the SGLang function that acts there; bad
bundles are one-line errors."""

import json
import shutil

import pytest
from conftest import ROOT

import cli
from sim import repro
from sim.analysis.divergence import rerun_ops
from sim.analysis.shrink import Knob, minimise
from sim.optrace import read_trace, replay
from sim.scenario import load_scenario

BUNDLES = ROOT / "bundles"
# Each shipped bundle: its verdict, and the kind and SGLang function of its first
# divergent event (what the report must say; sim/repro/report.py SITES).
SHIPPED = {
    "ack_local": ("detected", "ack_pops", "UnifiedRadixCache.loading_check"),
    "pre_26921": ("hang", "alloc_failure", "UnifiedRadixCache._execute_and_commit_kv_backup"),
    "host_alloc_failure": ("detected", "alloc_failure", "UnifiedRadixCache._evict_components"),
    "host_capacity_skew": ("detected", "op", "UnifiedRadixCache._load_back_transfers"),
    "id_drift": ("false_alarm", "op", "UnifiedTreeNode.__init__"),
    "request_order": ("size_mismatch", "op", "PrefillAdder.add_one_req"),
    "device_capacity_skew": ("detected", "op", "UnifiedRadixCache.evict_for_alloc"),
    "device_free_delay": ("size_mismatch", "op", "UnifiedRadixCache.evict_for_alloc"),
    "write_through_alloc_failure": ("hang", "alloc_failure",
                                    "UnifiedRadixCache._execute_and_commit_kv_backup"),
}
SGLANG_FUNCTIONS = {s["function"] for s in repro.SITES.values()}


def scenario_path(name: str) -> str:
    return str(ROOT / "scenarios" / f"jitter_{name}.yaml")


def one_line(text: str) -> str:
    lines = [x for x in text.splitlines() if x.strip()]
    assert len(lines) == 1, text
    return lines[0]


def meta_of(name: str) -> dict:
    return json.loads((BUNDLES / name / "bundle.json").read_text())


# ----------------------------------------------------------------------------------
# Search and shrink
# ----------------------------------------------------------------------------------


def test_search_finds_a_failing_seed_after_a_passing_one():
    # host_alloc_failure's seed 9 fires nothing (agree); seed 10 is detected
    # (benchmarks/divergence_table.py's census of seeds 0..49).
    scn = load_scenario(scenario_path("host_alloc_failure"))
    res = repro.search(scn, tries=3, base_seed=9)
    assert res.stopped == "found" and res.seed == 10 and res.tries == 2
    assert [v for _, v in res.verdicts] == ["agree", "detected"]
    assert res.outcome.recorded and res.outcome.failed
    assert res.outcome.failure_class == "detected: digest assertion; fired: host_alloc_failure"
    assert repro.jitter_class(res.outcome.divergence, res.outcome.cfg) == "host_alloc_failure"


def test_the_absorbed_class_reports_no_divergence(tmp_path, capsys):
    out = tmp_path / "ack_delay"
    assert cli.main(["repro", scenario_path("ack_delay"), "-o", str(out), "--tries", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.count(": absorbed") == 2
    assert "no divergence within budget: 2 tries" in printed
    assert not out.exists()


@pytest.mark.parametrize("name", ["request_order", "write_through_alloc_failure"])
def test_repro_shrinks_keeping_the_failure_class_and_replays(name, tmp_path, capsys):
    out = tmp_path / name
    assert cli.main(["repro", scenario_path(name), "-o", str(out), "--tries", "2",
                     "--shrink-runs", "80"]) == 3
    printed = capsys.readouterr().out
    assert "found:" in printed and "shrunk in" in printed and "first divergent event:" in printed
    meta = json.loads((out / "bundle.json").read_text())
    original = repro.run_case(load_scenario(scenario_path(name)))
    assert meta["failure_class"] == original.failure_class
    before, after = meta["sizes"]["before"], meta["sizes"]["after"]
    assert after["requests"] < before["requests"] and after["events"] < before["events"]
    assert meta["shrink"]["started_from_original"] and meta["shrink"]["runs"] <= 80
    schedule = [json.loads(x) for x in (out / "schedule.jsonl").read_text().splitlines()]
    assert sum(1 for x in schedule if "op" in x) == after["events"]
    assert any("collective" in x for x in schedule) and any("pop" in x for x in schedule)
    # the minimal scenario alone fails the same way
    res = repro.run_case(load_scenario(out / "scenario.yaml"))
    assert res.failure_class == meta["failure_class"]
    assert cli.main(["replay", str(out)]) == 0
    captured = capsys.readouterr()
    assert one_line(captured.err) == f"hicache-sim replay: {meta['failure']}"
    assert "reproduced" in captured.out


def test_repro_is_deterministic(tmp_path):
    dirs = []
    for k in range(2):
        out = tmp_path / f"b{k}"
        assert cli.main(["repro", scenario_path("pre_26921"), "-o", str(out), "--tries", "1",
                         "--shrink-runs", "30"]) == 3
        dirs.append(out)
    files = sorted(p.relative_to(dirs[0]) for p in dirs[0].rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(dirs[1]) for p in dirs[1].rglob("*") if p.is_file())
    for f in files:
        assert (dirs[0] / f).read_bytes() == (dirs[1] / f).read_bytes(), f


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


def test_search_budget_is_checked_between_tries():
    scn = load_scenario(scenario_path("ack_delay"), ["limits.max_requests=20"])
    ticks = iter(range(0, 1000, 10))  # a fake clock: 10 s pass between readings
    res = repro.search(scn, tries=5, budget_s=15, clock=lambda: next(ticks))
    assert res.outcome is None and res.stopped == "budget" and res.tries == 2
    assert [s for s, _ in res.verdicts] == [scn.seed, scn.seed + 1]


# ----------------------------------------------------------------------------------
# The shipped bundles
# ----------------------------------------------------------------------------------


def test_one_bundle_per_failing_class():
    shipped = {p.name for p in BUNDLES.iterdir() if (p / "bundle.json").is_file()}
    assert shipped == set(SHIPPED)


@pytest.mark.parametrize("name", list(SHIPPED))
def test_shipped_bundle_replays_exactly(name, tmp_path, capsys):
    path = BUNDLES / name
    meta = meta_of(name)
    verdict, _, _ = SHIPPED[name]
    assert meta["jitter_class"] == name and meta["verdict"] == verdict
    # each rank's op-trace, through replay-ops, reaches the engine's digest
    assert sorted(meta["op_traces"], key=int) == [str(r) for r in range(meta["sizes"]["after"]["ranks"])]
    for r, rel in meta["op_traces"].items():
        assert cli.main(["replay-ops", str(path / rel), "-o", str(tmp_path / f"{r}.out")]) == 0
        last = json.loads((tmp_path / f"{r}.out").read_text().splitlines()[-1])
        assert last["digest"] == meta["optrace_final_digests"][r] == meta["expect"]["digests"][r]
        assert not any("error" in json.loads(x) for x in (tmp_path / f"{r}.out").read_text().splitlines())
    # replay re-runs it and reproduces the recorded outcome
    assert cli.main(["replay", str(path)]) == 0
    captured = capsys.readouterr()
    assert one_line(captured.err) == f"hicache-sim replay: {meta['failure']}"
    assert f"{len(meta['op_traces'])} rank op-trace(s)" in captured.out


@pytest.mark.parametrize("name", list(SHIPPED))
def test_report_names_the_sglang_function_of_the_first_divergent_event(name):
    report = json.loads((BUNDLES / name / "report.json").read_text())
    _, kind, function = SHIPPED[name]
    ev = report["first_divergent_event"]
    assert ev["kind"] == kind and ev["sglang"]["function"] == function
    assert ev["sglang"]["file"].startswith("python/sglang/srt/")
    assert set(ev["per_rank"]) <= {str(r) for r in range(meta_of(name)["sizes"]["after"]["ranks"])}
    assert report["failure_site"]["function"] in SGLANG_FUNCTIONS
    # the events are in the order the run met them, and each names an SGLang function
    orders = [e["order"] for e in report["divergent_events"]]
    assert orders == sorted(orders)
    assert all(e["sglang"]["function"] in SGLANG_FUNCTIONS for e in report["divergent_events"])
    assert meta_of(name)["first_divergent_event"]["sglang"] == function
    md = (BUNDLES / name / "report.md").read_text()
    assert f"`{function}`" in md


def test_reports_cover_each_kind_of_difference():
    """Differing ack pops, collective inputs (sync digests, forward numels), host
    allocation failures and prefix lengths each show with their per-rank values."""
    def events(name):
        return {e["kind"]: e for e in json.loads((BUNDLES / name / "report.json").read_text())
                ["divergent_events"]}

    pops = events("ack_local")["ack_pops"]
    assert len({tuple(v) for v in pops["per_rank"].values()}) > 1
    wt = events("write_through_alloc_failure")
    fwd = wt["collective_inputs"]
    # rank 0 has no batch: it runs no forward, only rank 1 enters it
    assert fwd["site"] == "forward" and list(fwd["per_rank"]) == ["1"]
    assert fwd["sglang"]["function"].startswith("RowParallelLinear.forward")
    assert wt["alloc_failure"]["per_rank"] == {"0": "allocated", "1": "failed"}
    prefix = wt["prefix_length"]
    assert prefix["sglang"]["function"] == "PrefillAdder.add_one_req" and None in prefix["per_rank"].values()
    skew = events("host_capacity_skew")
    sync = skew["collective_inputs"]
    assert sync["site"] == "sync" and "digests differ" in sync["summary"]
    assert sync["sglang"]["function"] == "UnifiedRadixCache._sync_hicache_ready_counts"
    drift = json.loads((BUNDLES / "id_drift" / "report.json").read_text())
    pair = drift["divergent_ops"][0]
    # the false alarm: the trees stay logically equal, only the digests differ
    assert pair["tree_diff_at_failure"]["equal"]
    assert pair["tree_diff_at_failure"]["digest"]["a"] != pair["tree_diff_at_failure"]["digest"]["b"]
    hang = json.loads((BUNDLES / "pre_26921" / "report.json").read_text())
    assert hang["failure_site"]["function"] == "UnifiedRadixCache.writing_check"
    assert "skipped" in hang["divergent_events"][-1]["summary"]


def test_bundles_do_not_depend_on_how_ranks_share_replicas():
    """A bundle is keyed by rank: eager replicas (one tree per rank from t=0) give the
    same outcome and the same per-rank op-traces as shared ones."""
    for name in ("request_order", "write_through_alloc_failure"):
        path = BUNDLES / name / "scenario.yaml"
        shared = repro.run_case(load_scenario(path), record=True)
        eager = repro.run_case(load_scenario(path, ["engine.replicas=eager"]), record=True)
        assert repro.expectation(shared) == repro.expectation(eager)
        assert repro.rank_traces(shared) == repro.rank_traces(eager)


def test_replay_ops_honours_a_bundles_host_alloc_failures():
    """The failing rank's op-trace replays to the digest the engine reached, through the
    plain replay-ops machinery (header extensions read by the replayer itself)."""
    meta = meta_of("host_alloc_failure")
    trace = BUNDLES / "host_alloc_failure" / meta["op_traces"]["1"]
    header = next(read_trace(trace))[2]
    assert header.get("host_alloc_failures")
    outs = list(replay(trace))
    assert outs[-1]["digest"] == meta["optrace_final_digests"]["1"]
    rank0 = list(replay(BUNDLES / "host_alloc_failure" / meta["op_traces"]["0"]))
    assert rank0[-1]["digest"] == meta["optrace_final_digests"]["0"] != outs[-1]["digest"]
    assert any(e["k"] == "drop" for o in outs for e in o["events"])  # the failed backup


def test_write_through_op_traces_replay_their_write_acks_where_they_landed():
    """write_through acks land when a rank's sync pops them; the op-traces say so
    (op-trace v2: header version 2, write_acks "op", one write_ack op per acked node)
    and re-run to the
    engine's own trees, op for op."""
    scn = load_scenario(scenario_path("write_through_alloc_failure"),
                        ["limits.max_requests=12", "jitter.host_alloc_failure.probability=0.3"])
    out = repro.run_case(scn, record=True)
    traces = repro.rank_traces(out)
    for r, trace in traces.items():
        assert trace[0]["version"] == 2 and trace[0]["write_acks"] == "op"
        assert any(op["op"] == "write_ack" for op in trace[1:])
        state = rerun_ops(json.loads(json.dumps(trace)))
        assert not any("error" in o for o in state.outputs)
        assert state.final_digest == out.divergence["digests"][str(r)]
    assert any("host_alloc_failures" in t[0] for t in traces.values())


# ----------------------------------------------------------------------------------
# Bad bundles
# ----------------------------------------------------------------------------------


def test_bad_inputs_are_one_line_errors(tmp_path, capsys):
    assert cli.main(["replay", str(tmp_path / "missing")]) == 2
    assert "no such folder" in one_line(capsys.readouterr().err)
    (tmp_path / "empty").mkdir()
    assert cli.main(["replay", str(tmp_path / "empty")]) == 2
    assert "no bundle.json" in one_line(capsys.readouterr().err)
    assert cli.main(["repro", str(tmp_path / "nope.yaml"), "-o", str(tmp_path / "b")]) == 2
    assert "no such file" in one_line(capsys.readouterr().err)
    # a bundle missing its scenario, or with broken metadata, or of the old format
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
    b = tmp_path / "b3"
    shutil.copytree(BUNDLES / "request_order", b)
    meta = json.loads((b / "bundle.json").read_text())
    meta["format"] = 1
    (b / "bundle.json").write_text(json.dumps(meta))
    assert cli.main(["replay", str(b)]) == 2
    assert "found format 1; expected 2" in one_line(capsys.readouterr().err)
    # repro will not overwrite a folder that is not a bundle
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    assert cli.main(["repro", scenario_path("pre_26921"), "-o", str(other), "--tries", "1",
                     "--shrink-runs", "0"]) == 2
    assert "not a repro bundle" in capsys.readouterr().err and (other / "keep.txt").exists()
    with pytest.raises(SystemExit) as err:
        cli.main(["repro", scenario_path("pre_26921"), "-o", str(tmp_path / "x"), "--tries", "0"])
    assert err.value.code == 2


def test_a_bundle_that_no_longer_fails_the_same_way_exits_1(tmp_path, capsys):
    b = tmp_path / "b"
    shutil.copytree(BUNDLES / "host_capacity_skew", b)
    meta = json.loads((b / "bundle.json").read_text())
    meta["expect"]["first_true_divergence"]["step"] += 1
    (b / "bundle.json").write_text(json.dumps(meta))
    assert cli.main(["replay", str(b)]) == 1
    assert "does not reproduce: first_true_divergence" in one_line(capsys.readouterr().err)
    # a rank's op-trace that no longer reaches the recorded digest
    shutil.rmtree(b)
    shutil.copytree(BUNDLES / "host_capacity_skew", b)
    # drop the op that last changed rank 1's digest (line i holds op i: the header is line 0)
    cut = json.loads((b / "report.json").read_text())["digest_timeline"]["1"][-1][0]
    assert cut > 0
    trace = b / "ranks" / "rank1.optrace.jsonl"
    lines = trace.read_text().splitlines()
    trace.write_text("\n".join(lines[:cut] + lines[cut + 1:]) + "\n")
    assert cli.main(["replay", str(b)]) == 1
    assert "rank1.optrace.jsonl replays to digest" in one_line(capsys.readouterr().err)
    # an op-trace whose ops differ from the re-run's but reach the same digest
    shutil.rmtree(b)
    shutil.copytree(BUNDLES / "host_capacity_skew", b)
    trace = b / "ranks" / "rank1.optrace.jsonl"
    lines = trace.read_text().splitlines()
    trace.write_text("\n".join(lines + ['{"op":"dump"}']) + "\n")
    assert cli.main(["replay", str(b)]) == 1
    assert "rank1.optrace.jsonl differs from the re-run's rank 1" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("sets", [
    ["limits.max_requests=60", "engine.replicas=eager"],
    ["limits.max_requests=60", "tp=8", "jitter.ack_delay.ranks=[1,3,5,7]"],
])
def test_a_recorded_schedule_does_not_depend_on_the_sync_by_replica(sets, monkeypatch):
    """The sync by replica (``SyncDiscipline.reduce_replicas``, the collective's
    ``all_reduce_replicas``) records the same collective calls and the same per-rank
    pops, zero pops included, as the sync rank by rank."""
    from sim.policies import sync

    def recorded(by_replica):
        with pytest.MonkeyPatch.context() as m:
            for d in sync.SYNC_DISCIPLINES.values():
                m.setattr(type(d), "by_replica", by_replica and type(d).by_replica)
            o = repro.run_case(load_scenario(scenario_path("ack_local"), sets), record=True)
        return o.sim.calls, o.sim.pops, repro.expectation(o)

    fast, plain = recorded(True), recorded(False)
    assert fast == plain
    assert any(p["write"] == p["load"] == 0 for p in fast[1])  # zero pops are recorded
