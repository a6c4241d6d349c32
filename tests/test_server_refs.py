"""data/conformance/server/: the vendored outputs of SGLang 0.5.23's real server
(tools/sglang_server/vendor_refs.py), checked without SGLang: they are what the
manifest says, every step and request carries the fields the engine's
``--record-steps`` is compared on, and the comparator reads them."""

import gzip
import json
import sys
from pathlib import Path

import pytest

from conftest import vendored_checksums_match

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "sglang_server"))

import compare_steps as cs  # noqa: E402
from runconfig import engine_scenario, harness_args  # noqa: E402

FOLDER = REPO / "data" / "conformance" / "server"
INDEX = json.loads((FOLDER / "index.json").read_text())
RUNS = INDEX["runs"]


def records(name):
    with gzip.open(FOLDER / name, "rt") as f:
        return [json.loads(line) for line in f]


def test_the_vendored_files_are_the_indexed_ones():
    names = vendored_checksums_match(FOLDER)
    assert names == {r["output"][:-3] for r in RUNS} | {r["trace"][:-3] for r in RUNS}
    assert sum(p.stat().st_size for p in FOLDER.iterdir()) < 2_000_000


def test_the_set_covers_policies_loops_pages_chunking_and_retraction():
    cfgs = [r["config"] for r in RUNS]
    assert {(c["write_policy"], c["overlap"]) for c in cfgs} == {
        (p, o) for p in ("write_back", "write_through", "write_through_selective") for o in (False, True)}
    assert {c["page_size"] for c in cfgs} >= {1, 16, 64}
    assert any(c["clip_max_new_tokens"] == 64 for c in cfgs)
    steps = [r for run in RUNS for r in records(run["output"]) if r.get("type") == "step"]
    assert any(s.get("chunked") for s in steps)  # chunked prefill happened
    assert any(s["retracted"] for s in steps)  # and retraction
    assert any(s["hc"].get("load") for s in steps)  # and load-backs from host


@pytest.mark.parametrize("run", RUNS, ids=[r["run"] for r in RUNS])
def test_a_vendored_run_carries_the_contract_fields(run):
    cfg = run["config"]
    # the mapping from run config to both sides is the one the files were made with
    assert harness_args(cfg) == run["harness_args"]
    assert engine_scenario(cfg, f"conformance/server/{run['trace']}") == run["engine_scenario"]
    rows = records(run["output"])
    config, summary = rows[0], rows[-1]
    assert config["type"] == "config" and summary["type"] == "summary"
    sa = config["server_args"]
    assert (sa["page_size"], sa["max_total_tokens"], sa["hicache_write_policy"], sa["schedule_policy"]) == (
        cfg["page_size"], cfg["device_tokens"], cfg["write_policy"], cfg["schedule_policy"])
    assert sa["disable_overlap_schedule"] is (not cfg["overlap"])
    assert config["resolved"]["enable_overlap"] is cfg["overlap"]
    steps = [r for r in rows if r["type"] == "step"]
    assert [s["step"] for s in steps] == list(range(len(steps)))
    assert len(steps) == summary["steps"] == run["steps"]
    for s in steps:
        assert isinstance(s["adds"], list) and isinstance(s["retracted"], list)
        assert isinstance(s["hc"]["digest"], int)
        if "mode" in s:
            assert s["mode"] in ("extend", "decode") and isinstance(s["rids"], list)
        if s.get("mode") == "extend":
            assert len(s["extend"]) == len(s["prefix"]) == len(s["rids"]) and "chunked" in s
        hc = s["hc"]
        for key in ("write", "load"):
            for node, tokens, ok in hc.get(key, []):
                assert isinstance(node, int) and isinstance(tokens, int) and isinstance(ok, bool)
        assert all(isinstance(n, int) for n in hc.get("write_ack", []))
        for rid, host_hit, loaded in hc.get("init_load_back", []):
            assert isinstance(rid, str) and isinstance(host_hit, int)
        for a in s["adds"]:
            assert {"rid", "res"} <= set(a)
    reqs = [r for r in rows if r["type"] == "req"]
    with gzip.open(FOLDER / run["trace"], "rt") as f:
        trace = [json.loads(line) for line in f]
    assert sorted(r["rid"] for r in reqs) == sorted(f"r{i}" for i in range(len(trace)))
    assert len(reqs) == run["requests"]
    for r in reqs:
        for k in cs.REQ_FIELDS:
            assert isinstance(r[k], int), (r["rid"], k)
    assert [t["arrival_step"] for t in trace] == sorted(t["arrival_step"] for t in trace)
    assert run["error"] is None


def engine_style(rows):
    """The contract fields only, as the engine writes them (every field present)."""
    out = []
    for r in rows:
        if r.get("type") == "step":
            n = cs.norm_step(r)
            out.append({"type": "step", "step": r["step"], **{k: v for k, v in n.items() if "." not in k},
                        "hc": {k[3:]: v for k, v in n.items() if k.startswith("hc.")}})
        elif r.get("type") == "req":
            out.append({"type": "req", "rid": r["rid"], **cs.norm_req(r)})
    return out


@pytest.mark.parametrize("run", RUNS[:4], ids=[r["run"] for r in RUNS[:4]])
def test_the_comparator_reads_a_vendored_run(run):
    rows = records(run["output"])
    res = cs.compare(rows, engine_style(rows))
    assert res.diff is None and res.steps == run["steps"] and res.reqs == run["requests"]
    # one write's ok flag flipped is found at its step
    eng = engine_style(rows)
    step = next(r for r in eng if r.get("type") == "step" and r["hc"]["write"])
    step["hc"]["write"][0][2] = not step["hc"]["write"][0][2]
    res = cs.compare(rows, eng)
    assert res.diff_step == step["step"] and res.diff_fields == ["hc.write"]


def test_the_traces_are_generic_traces_for_the_engine():
    from sim.workloads.traces import GenericReader

    for run in RUNS:
        n = sum(1 for _ in GenericReader(FOLDER / run["trace"]))
        assert n == run["requests"]


def _conformance_with(monkeypatch, tmp_path, perturb=None):
    """tools/conformance_server.py over the vendored runs, with their outputs as the
    harness cache and an engine that writes back what the harness logged (``perturb``
    edits one run's engine records)."""
    import types

    sys.path.insert(0, str(REPO / "tools"))
    import conformance_server as conf
    import run_harness

    by_run = {r["run"]: FOLDER / r["output"] for r in RUNS}
    monkeypatch.setattr(run_harness, "plan", lambda cfgs, wl, cache: [
        types.SimpleNamespace(cfg=c, out=by_run[c["run"]]) for c in cfgs])
    monkeypatch.setattr(run_harness, "ensure", lambda cfgs, wl, cache, jobs: (
        {c["run"]: by_run[c["run"]] for c in cfgs}, []))
    seen = []

    def fake_engine(scenario, out_dir):
        import yaml

        scn = yaml.safe_load(scenario.read_text())
        run = scn["name"]
        seen.append(scn)
        rows = engine_style(records(by_run[run].name))
        if perturb:
            perturb(run, rows)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "steps.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path, None

    monkeypatch.setattr(conf, "run_engine", fake_engine)
    names = [r["run"] for r in RUNS[:3]]
    rc = conf.main(["--work", str(tmp_path), "--only", *names])
    return rc, seen


def test_conformance_server_counts_identical_runs(monkeypatch, tmp_path, capsys):
    rc, seen = _conformance_with(monkeypatch, tmp_path)
    out = capsys.readouterr().out
    assert rc == 0
    steps = sum(r["steps"] for r in RUNS[:3])
    reqs = sum(r["requests"] for r in RUNS[:3])
    assert f"3 of 3 runs compared: {steps} steps and {reqs} requests identical; runs identical: 3, differing: 0" in out
    # the engine ran the scenario made from each run config, under the step clock
    assert [s["name"] for s in seen] == [r["run"] for r in RUNS[:3]]
    assert all(s["engine"]["clock"] == "steps" for s in seen)


def test_conformance_server_stops_at_the_first_difference(monkeypatch, tmp_path, capsys):
    target = RUNS[1]["run"]

    def perturb(run, rows):
        if run == target:
            step = next(r for r in rows if r.get("type") == "step" and r["step"] == 5)
            step["rids"] = list(reversed(step["rids"])) + ["r999"]

    rc, seen = _conformance_with(monkeypatch, tmp_path, perturb)
    out = capsys.readouterr().out
    assert rc == 1
    assert f"{target}" in out and "DIFFERS after 5 identical steps at step 5: rids differ" in out
    assert len(seen) == 2  # the third run is not started
    assert "runs identical: 1, differing: 1" in out
