"""Per-rank request state (sim/lanes.py): once the ranks admit different requests, each
goes on with its own queue and batches, still meeting the others in every iteration's
sync, until what really stops the group."""

import json
import sys
from pathlib import Path

import yaml

from sim.runner import run_scenario
from sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "sglang_server"))

import conformance_tp2 as ct  # noqa: E402
from runconfig import engine_scenario  # noqa: E402

GROUP = "t02_hostpress_ps16.host_alloc_fail_at40"


def _scenario(tmp_path, replicas=None, **over) -> Path:
    g = next(g for g in ct.load_groups() if g["run"] == GROUP)
    scn = engine_scenario(g["config"], str(ct.FOLDER / g["trace"]))
    for k, v in over.items():
        scn[k] = v
    if replicas is not None:
        scn["engine"]["replicas"] = replicas
    p = tmp_path / f"s{len(list(tmp_path.glob('*.yaml')))}.yaml"
    p.write_text(yaml.safe_dump(scn, sort_keys=False))
    return p


def _steps(path: Path) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "step"]


def test_after_the_split_each_rank_runs_its_own_batches_until_the_digest_asserts(tmp_path):
    rec = tmp_path / "steps.jsonl"
    res = run_scenario(load_scenario(str(_scenario(tmp_path))), None, record_steps=str(rec))
    d = res.divergence
    split = d["request_split"]
    assert split["lanes"] == [[0], [1]]
    r0, r1 = (_steps(tmp_path / f"steps.rank{r}.jsonl") for r in range(2))
    at = split["clock_step"]
    before = [(a.get("rids"), b.get("rids")) for a, b in zip(r0, r1) if a["step"] < at]
    after = [(a.get("rids"), b.get("rids")) for a, b in zip(r0, r1) if a["step"] >= at]
    # the same batches while they share one request state, different ones after
    assert before and all(x == y for x, y in before)
    assert sum(x != y for x, y in after) > 1
    # both ranks keep iterating in lockstep (one record per step each) to the assertion
    assert [a["step"] for a in r0] == [b["step"] for b in r1]
    # the metrics are rank 0's lane's: each finished request counted once
    reqs = [json.loads(x) for x in (tmp_path / "steps.rank0.jsonl").read_text().splitlines()
            if '"type": "req"' in x]
    assert res.summary["requests"] == sum("finish_step" in r for r in reqs) > 0
    o = d["outcome"]
    assert o["class"] == "assertion" and o["step"] > at and d["halted"] == "digest_mismatch"


def test_a_split_run_is_deterministic(tmp_path):
    p = _scenario(tmp_path)
    a = run_scenario(load_scenario(str(p)), tmp_path / "a")
    b = run_scenario(load_scenario(str(p)), tmp_path / "b")
    for f in ("divergence.json", "summary.json", "requests.parquet"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert a.divergence["request_split"] is not None


def test_a_run_that_never_splits_reports_no_split(tmp_path):
    d = run_scenario(load_scenario(str(_scenario(tmp_path, faults=[]))), None).divergence
    assert "request_split" not in d and d["outcome"]["class"] == "agree"


def test_at_tp_4_lanes_of_several_replicas_split_alike_shared_and_eager(tmp_path):
    """Two faulted ranks at TP 4: the lanes hold several replicas each and can split
    again; one tree per rank from t=0 (``replicas: eager``) reports byte-identically."""
    faults = [{"rank": 1, "kind": "host_alloc_fail", "step": 40},
              {"rank": 3, "kind": "host_alloc_fail", "step": 70}]
    out = {}
    for mode in ("shared", "eager"):
        p = _scenario(tmp_path, tp=4, faults=faults, replicas=mode)
        res = run_scenario(load_scenario(str(p)), tmp_path / mode)
        out[mode] = res.divergence
    assert out["shared"]["request_split"]["lanes"] == [[0, 2, 3], [1]]
    assert out["shared"]["outcome"]["class"] == "assertion"
    for f in ("divergence.json", "summary.json", "requests.parquet"):
        assert (tmp_path / "shared" / f).read_bytes() == (tmp_path / "eager" / f).read_bytes(), f


def test_ranks_that_retract_different_requests_go_on_each_with_its_own_batch():
    """A smaller device pool on rank 1: its decode step retracts where rank 0's does
    not. With no forward collective each goes on with its own batch, to the end of the
    trace (the digest assertion, recorded, fired before); with the model's forward
    all_reduce the step's token counts differ there, at the split's step."""
    path = ROOT / "scenarios" / "jitter_device_capacity_skew.yaml"
    sets = ["seed=14", "jitter.device_capacity_skew={1: -64}"]
    stub = run_scenario(load_scenario(path, sets + ["collective.forward=none"]), None).divergence
    split = stub["request_split"]
    assert split["why"] == "retraction" and split["lanes"] == [[0], [1]]
    assert stub["halted"] is None and stub["finished"] and stub["verdict"] == "detected"
    model = run_scenario(load_scenario(path, sets), None).divergence
    ce = model["collective_error"]
    assert ce["kind"] == "size_mismatch" and ce["site"] == "forward" and ce["step"] == split["step"]
