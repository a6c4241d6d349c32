"""The upstream reports shipped as scenarios/regressions/ (issue 15 item 5): each run's
outcome pinned on summary.json figures. The comment at the top of each scenario says
what the report describes, what hicache-sim gives, and where they differ.

These files are not in tests/test_scenarios_run.py's glob (scenarios/*.yaml). They are
checked here instead: each validates, runs whole (a few requests, about a second) and
keeps its trees consistent."""

from __future__ import annotations

import json

from conftest import ROOT
from test_optrace_v2 import main

from sim.runner import run_scenario
from sim.scenario import load_scenario

REG = ROOT / "scenarios" / "regressions"
BYTES_PER_TOKEN = 131072                                  # Llama-3.1-8B, bf16, TP 1


def run(name, *sets):
    res = run_scenario(load_scenario(REG / f"{name}.yaml", list(sets)), None)
    for c in (c for inst in res.sim.instances for c in inst.group.cohorts):
        c.tree.check()
    assert res.summary["verdict"] == "agree"
    return res.summary


def test_every_regression_scenario_is_listed_and_named_after_its_file():
    paths = sorted(REG.glob("*.yaml"))
    assert {p.stem for p in paths} == {"sglang_40193", "sglang_39436", "sglang_33713"}
    readme = (REG / "README.md").read_text()
    for p in paths:
        assert load_scenario(p).name == p.stem
        assert f"`{p.name}`" in readme
    assert "regressions/" in (ROOT / "scenarios" / "README.md").read_text()


def test_40193_a_full_storage_hit_is_cut_to_the_free_host_room():
    s = run("sglang_40193")
    assert s["host_tokens"] == 18561 and s["device_tokens"] == 20000
    assert s["prefetch_issued"] == 3
    assert s["prefetch_revoked"] == {"below_threshold": 2}   # the two first-seen prompts
    assert s["l3_hit_tokens"] == 2551
    assert s["hit_tokens_by_tier"] == {"device": 0, "host": 0, "storage": 2551}


def test_40193_the_storage_query_hits_all_16010_pages(tmp_path):
    ops = tmp_path / "ops"
    rc, _, err = main(["run", REG / "sglang_40193.yaml", "-o", tmp_path / "res", "--quiet",
                       "--record-ops", ops])
    assert rc == 0, err
    recs = [json.loads(x) for x in (ops / "rank0.jsonl").read_text().splitlines()[1:]]
    hits = [(r["op"], r["n"]) for r in recs if r["op"] in ("prefetch_hit", "prefetch_done")]
    assert hits == [("prefetch_hit", 0), ("prefetch_hit", 0),
                    ("prefetch_hit", 16010), ("prefetch_done", 2551)]


def _replays(name, *sets, first=200):
    """The run's summary and the requests from ``first`` on (the trace's replays)."""
    res = run_scenario(load_scenario(REG / f"{name}.yaml", list(sets)), None)
    for c in (c for inst in res.sim.instances for c in inst.group.cohorts):
        c.tree.check()
    assert res.summary["verdict"] == "agree"
    df = res.sim.requests_df()
    return res.summary, df[df["rid"] >= first].sort_values("rid")


def test_39436_565_host_state_slots_leave_the_host_tier_inert():
    s, rep = _replays("sglang_39436")
    assert s["host_tokens"] == 2680896
    h = s["hybrid"]
    assert h["host_states"] == 565 and h["host_states_used"] == 565
    assert h["state_host_frees"] > 0                     # the Mamba host LRU evicted states
    assert len(rep) == 8
    assert (rep["host_hit_tokens"] == 0).all()            # 0 of 8 replays hit the host
    assert (rep["miss_tokens"] == 8448).all()


def test_39436_734_host_state_slots_give_8_of_8_host_hits():
    s, rep = _replays("sglang_39436", "host.mamba_states=734")
    h = s["hybrid"]
    assert h["host_states"] == 734 and h["state_host_frees"] == 0
    assert h["host_states_used"] == 600                  # 200 prompts x 3 checkpoints
    assert (rep["host_hit_tokens"] == 8192).all()         # 8 of 8, 8,192 tokens from host
    assert h["host_hits_with_state"] == 8


def test_33713_under_write_back_the_sentinel_state_is_backed_up_and_loads_back():
    s, rep = _replays("sglang_33713", first=91)
    assert s["device_tokens"] == 375755 and s["host_tokens"] == 1136724
    h = s["hybrid"]
    assert h["aux_capacity"] == 55 and h["host_states"] == 170
    assert h["state_host_frees"] == 0                  # the host pools never filled
    (sentinel,) = rep.itertuples()
    assert sentinel.input_tokens == 32727
    assert sentinel.device_hit_tokens == 0             # pushed off the device by the noise
    assert sentinel.host_hit_tokens == 24576           # its state at the 24,576 chunk end
    assert sentinel.load_back_tokens == 24576
    assert h["host_hits_with_state"] == 1 and h["state_loads"] == 1


def test_the_hybrid_regressions_decode_fast_path_is_exact(tmp_path):
    """The decode fast path against one step per iteration on the hybrid regression
    scenarios (tests/test_scheduler.py's property, on these traces)."""
    import filecmp
    from unittest.mock import patch

    from sim.events import Simulation

    for name in ("sglang_39436", "sglang_33713"):
        scn = load_scenario(REG / f"{name}.yaml")
        fast, plain = tmp_path / f"{name}_fast", tmp_path / f"{name}_plain"
        run_scenario(scn, fast)
        with patch.object(Simulation, "_decode_headroom", lambda self, limit: 0):
            run_scenario(scn, plain)
        names = sorted(p.name for p in fast.iterdir() if p.is_file())
        assert names == sorted(p.name for p in plain.iterdir() if p.is_file())
        _, mismatch, errors = filecmp.cmpfiles(fast, plain, names, shallow=False)
        assert not mismatch and not errors, name
