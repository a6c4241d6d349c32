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
# Scenarios whose trace is fetched (hicache-sim traces fetch), not shipped: the stand-in
# they are checked on here.
STAND_IN = {"sglang_29049": ["workload.path=traces/mooncake-fast25/conversation_trace.jsonl.gz",
                             "limits.max_requests=1500"]}


def run(name, *sets):
    res = run_scenario(load_scenario(REG / f"{name}.yaml", list(sets)), None)
    for c in (c for inst in res.sim.instances for c in inst.group.cohorts):
        c.tree.check()
    assert res.summary["verdict"] == "agree"
    return res.summary


def test_every_regression_scenario_is_listed_and_named_after_its_file():
    paths = sorted(REG.glob("*.yaml"))
    assert {"sglang_40193", "sglang_29049"} <= {p.stem for p in paths}
    readme = (REG / "README.md").read_text()
    for p in paths:
        assert load_scenario(p, STAND_IN.get(p.stem, [])).name == p.stem
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


def _29049(host_tokens, write_policy):
    """sglang_29049 on its stand-in (the first 1,500 requests of the shipped Mooncake
    conversation trace): summary.json and the pages held at the end (the report's D / H
    / both / unique)."""
    res = run_scenario(load_scenario(REG / "sglang_29049.yaml", STAND_IN["sglang_29049"] + [
        f"host.tokens={host_tokens}", f"cache.write_policy={write_policy}"]), None)
    assert res.summary["verdict"] == "agree"
    (c,) = res.sim.instances[0].group.cohorts
    t = c.tree
    t.check()
    ends = (t.dev_used // 512, t.host_used // 512, t.dup_tokens // 512,
            (t.dev_used + t.host_used - t.dup_tokens) // 512)
    return res.summary, ends


def test_29049_the_scenario_needs_the_tool_agent_trace_and_has_the_reports_sizes():
    scn = load_scenario(REG / "sglang_29049.yaml", STAND_IN["sglang_29049"])
    assert scn.page_size == 512 and scn.device.tokens == 6000 * 512
    assert scn.host.tokens == 12000 * 512 and scn.scheduler.mode == "cache_replay"
    text = (REG / "sglang_29049.yaml").read_text()
    assert "path: mooncake-toolagent/toolagent_trace.jsonl" in text  # the catalog's workload.path
    from sim.workloads.catalog import TRACES
    assert next(t for t in TRACES if t.name == "mooncake-toolagent").scenario_path == \
        "mooncake-toolagent/toolagent_trace.jsonl"


def test_29049_write_through_mirrors_the_device_write_back_keeps_the_tiers_apart():
    """L2 = 2 x L1 (12,000 pages of 512 tokens): write_through holds every device page on
    host too, so the host adds one L1 of unique pages; write_back (the nearest SGLang
    policy to the report's boundary policy) keeps the tiers disjoint and hits more."""
    wt, wt_end = _29049(6144000, "write_through")
    wb, wb_end = _29049(6144000, "write_back")
    sel, sel_end = _29049(6144000, "write_through_selective")
    assert wt_end == (5993, 11989, 5993, 11989)              # both = D, unique = H
    assert wb_end == (5993, 12000, 0, 17993)                 # both 0, unique = D + H
    assert sel_end == (5988, 11987, 4812, 13163)
    assert round(wt["device_hit_rate"], 4) == round(wb["device_hit_rate"], 4) == 0.1906
    assert (round(wt["hit_rate"], 4), round(wb["hit_rate"], 4), round(sel["hit_rate"], 4)) == \
        (0.2343, 0.2640, 0.2391)
    assert wt["backup_failures"] == wb["backup_failures"] == sel["backup_failures"] == 0


def test_29049_a_host_smaller_than_the_device_is_dead_under_write_through():
    """L2 = 0.5 x L1 (3,000 pages): under write_through the host is full of device
    mirrors it cannot evict, every backup of a new page fails and the host never hits;
    write_back still gains from it."""
    wt, wt_end = _29049(1536000, "write_through")
    wb, wb_end = _29049(1536000, "write_back")
    sel, _ = _29049(1536000, "write_through_selective")
    assert wt["host_hit_rate"] == 0.0 and sel["host_hit_rate"] == 0.0
    assert wt["backup_failures"] == 3747 and sel["backup_failures"] == 1813
    assert wt_end == (5993, 2997, 2997, 5993)                # the host: device mirrors only
    assert wb_end == (5993, 2992, 0, 8985) and wb["backup_failures"] == 0
    assert (round(wt["hit_rate"], 4), round(wb["hit_rate"], 4)) == (0.1894, 0.2133)
