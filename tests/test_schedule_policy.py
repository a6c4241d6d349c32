"""Schedule policies (sim/policies/schedule.py) against SGLang 0.5.23's own
`SchedulePolicy.calc_priority`: the orders in data/conformance/schedule/cases.json were
produced by SGLang's code (tools/sglang_oracle/make_schedule_cases.py) on the same
cached sequences and queues; here the engine's policies sort those queues over the
engine's own tree. Plus each knob changes a run."""

import json
import random
from types import SimpleNamespace

import pytest
from conftest import ROOT

from sim.policies.schedule import SCHEDULE_POLICIES, prefix_matches
from sim.tree import Tree

CASES = json.loads((ROOT / "data" / "conformance" / "schedule" / "cases.json").read_text())


def engine_order(case):
    tree = Tree(device_capacity=1 << 20, host_capacity=0, page_size=CASES["page_size"])
    for s in CASES["cached"]:
        tree.insert(list(s))
    reqs = [SimpleNamespace(rid=rid, key=list(tokens), fill_len=len(tokens),
                            r=SimpleNamespace(output_len=max_new))
            for rid, tokens, max_new in case["queue"]]
    policy = SCHEDULE_POLICIES[case["policy"]]
    matches = low = None
    if policy.cache_aware:
        matches, low = prefix_matches(reqs, [rq.key for rq in reqs], tree, tree.page_size)
    new = policy.order(reqs, matches, low, tree, random.Random(case["seed"]))
    return [rq.rid for rq in (reqs if new is None else new)]


@pytest.mark.parametrize("case", CASES["cases"],
                         ids=lambda c: f"{c['queue_name']}-{c['policy']}-{c['seed']}")
def test_order_is_sglangs(case):
    assert engine_order(case) == case["order"]


def test_cases_cover_every_policy_and_reorder():
    assert {c["policy"] for c in CASES["cases"]} == set(SCHEDULE_POLICIES)
    # the fixtures would not catch a policy that does nothing
    for c in CASES["cases"]:
        if c["policy"] != "fcfs":
            assert c["order"] != [q[0] for q in c["queue"]] or c["queue_name"] == "deep"


def test_in_batch_prefix_caching_deprioritizes():
    """`thresholds`: s shares 32 tokens with r (>= the deprioritize threshold) and u 60
    with t; both go to the back under lpm."""
    case = next(c for c in CASES["cases"] if c["queue_name"] == "thresholds"
                and c["policy"] == "lpm")
    assert engine_order(case)[-2:] == ["s", "u"]


def _run(*sets, requests=200):
    from sim.runner import run_scenario
    from sim.scenario import load_scenario

    scn = load_scenario(str(ROOT / "scenarios" / "quickstart.yaml"),
                        [f"limits.max_requests={requests}", *sets])
    return run_scenario(scn, None)


def test_clip_max_new_tokens_changes_retractions():
    """SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION=16: admission charges at most 16 decode
    tokens per request, admits more, and decode has to retract (none at 4096)."""
    # 175 requests: past them, the pipelined timing's one quickstart retraction comes
    # at 4096 too (docs/SCHEDULER.md, "The overlap loop in time")
    base = _run(requests=175).summary["retracted_requests"]
    clipped = _run("scheduler.clip_max_new_tokens=16", requests=175).summary["retracted_requests"]
    assert base == 0 and clipped > 0


@pytest.mark.parametrize("policy", sorted(set(SCHEDULE_POLICIES) - {"fcfs"}))
def test_each_schedule_policy_changes_the_run(policy):
    fcfs = _run().summary
    other = _run(f"scheduler.schedule_policy={policy}").summary
    assert other != fcfs


def test_random_policy_is_deterministic():
    a = _run("scheduler.schedule_policy=random", requests=120).summary
    b = _run("scheduler.schedule_policy=random", requests=120).summary
    assert a == b


def test_rust_core_walks_dfs_weight_alike():
    """The engine orders dfs-weight one way under both tree cores: SGLang's Rust core's
    own `dfs_weight_order` gave the Python policy's order on every vendored queue."""
    dfs = [c for c in CASES["cases"] if c["policy"] == "dfs-weight"]
    assert dfs and all(c["rust_order"] == c["order"] for c in dfs)


def test_cache_aware_policy_refused_for_a_hybrid():
    from sim.errors import UserError
    from sim.scenario import load_scenario

    with pytest.raises(UserError, match="scheduler.schedule_policy"):
        load_scenario(str(ROOT / "scenarios" / "hybrid_swa.yaml"),
                      ["scheduler.schedule_policy=dfs-weight"])
