"""The L3 storage tier in the engine (docs/STORAGE.md §7): the shipped storage scenario
end to end at TP 2 with jitter, its op-traces replayed, shared vs eager replicas, and
every storage knob changing the run."""

from __future__ import annotations

import json

from unittest.mock import patch

import pytest

from conftest import ROOT
from sim.errors import UserError
from sim.events import Simulation
from sim.runner import run_scenario
from sim.scenario import load_scenario
from test_optrace_v2 import check_replays, main

SCN = ROOT / "scenarios" / "storage_mooncake.yaml"
STORAGE_KEYS = {"l3_hit_tokens", "l3_hit_rate", "prefetch_issued", "prefetch_declined",
                "prefetch_revoked", "l3_read_bytes", "l3_write_bytes", "hit_tokens_by_tier"}


def run(*sets, out=None, requests=60):
    return run_scenario(load_scenario(SCN, [f"workload.num_requests={requests}", *sets]), out)


def test_storage_scenario_runs_end_to_end_at_tp2_with_jitter():
    s = run(requests=120).summary
    assert STORAGE_KEYS <= set(s)
    assert s["verdict"] == "absorbed"
    assert s["l3_hit_tokens"] > 0 and s["prefetch_issued"] > 0
    assert s["l3_read_bytes"] > 0 and s["l3_write_bytes"] > 0
    tiers = s["hit_tokens_by_tier"]
    assert tiers["storage"] > 0
    assert sum(tiers.values()) >= s["hit_rate"] * s["input_tokens"] - 1


def test_no_storage_block_means_no_storage_figures():
    s = run_scenario(load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                                   ["workload.num_requests=20"]), None).summary
    assert not STORAGE_KEYS & set(s)


@pytest.mark.parametrize("sets", [(), ("cache.write_policy=write_back",),
                                  ("storage.prefetch_policy=best_effort",),
                                  ("storage.prefetch_policy=wait_complete", "seed=5")])
def test_storage_op_traces_replay_to_the_engines_trees(tmp_path, sets):
    ops = tmp_path / "ops"
    argv = ["run", SCN, "-o", tmp_path / "res", "--quiet", "--record-ops", ops,
            "--set", "workload.num_requests=80"]
    for x in sets:
        argv += ["--set", x]
    rc, _, err = main(argv)
    assert rc == 0, err
    index = json.loads((ops / "index.json").read_text())
    heads = check_replays(ops, index)
    assert all(h["storage_writes"] == "auto" and h["prefetch_threshold"] == 256 for h in heads)
    kinds = {json.loads(x)["op"] for x in (ops / "rank0.jsonl").read_text().splitlines()[1:]}
    assert {"prefetch", "prefetch_hit", "storage_write_ack"} <= kinds
    assert kinds & {"prefetch_done", "prefetch_revoke"}


@pytest.mark.parametrize("sets", [("seed=2",), ("seed=4", "cache.write_policy=write_back"),
                                  ("seed=6", "storage.prefetch_policy=wait_complete"),
                                  ("seed=8", "storage.prefetch_policy=best_effort",
                                   "storage.read_gbps=0.05"),
                                  ("seed=3", "storage.capacity_gb=0.5")])
def test_decode_runs_with_storage_write_what_a_step_by_step_loop_writes(sets, tmp_path):
    """The decode fast path stops at every storage completion and timeout deadline."""
    fast, plain = tmp_path / "fast", tmp_path / "plain"
    run(*sets, out=fast)
    with patch.object(Simulation, "_decode_headroom", lambda self, limit: 0):
        run(*sets, out=plain)
    names = sorted(p.name for p in fast.iterdir())
    assert names == sorted(p.name for p in plain.iterdir())
    for f in names:
        assert (fast / f).read_bytes() == (plain / f).read_bytes(), f


@pytest.mark.parametrize("sets", [("seed=1",), ("seed=7", "cache.write_policy=write_back"),
                                  ("seed=3", "jitter.request_order.swap_probability=0.2", "jitter.request_order.ranks=[1]"),
                                  ("seed=5", "storage.capacity_gb=0.5")])
def test_shared_and_eager_replicas_write_byte_identical_results(sets, tmp_path):
    folders = []
    for mode in ("shared", "eager"):
        out = tmp_path / mode
        run(*sets, f"engine.replicas={mode}", out=out)
        folders.append(out)
    a, b = folders
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for f in names:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


SLOW = ("storage.read_gbps=0.05",)  # reads slow enough for the timeout to matter


@pytest.mark.parametrize("knob", [
    ("storage.backend=3fs",),
    ("storage.read_gbps=0.5",),
    ("storage.write_gbps=0.2",),
    ("storage.op_latency_us=20000",),
    ("storage.prefetch_policy=best_effort",),
    ("storage.prefetch_policy=wait_complete",),
    ("storage.prefetch_threshold=1024",),
    SLOW + ("storage.prefetch_timeout_base=0.01",),
    SLOW + ("storage.prefetch_timeout_base=0.0", "storage.prefetch_timeout_per_ki_token=0.05"),
    ("storage.capacity_gb=0.5",),
])
def test_every_storage_knob_changes_the_run(knob):
    base = SLOW if knob[0] in SLOW else ()
    if "per_ki_token" in knob[-1]:
        base = SLOW + ("storage.prefetch_timeout_base=0.0",)
    ref, got = run(*base).summary, run(*knob).summary
    assert ref != got


@pytest.mark.parametrize("sets, where", [
    (["storage.backend=tape"], "storage.backend"),
    (["storage.prefetch_threshold=-1"], "storage.prefetch_threshold"),
    (["storage.prefetch_policy=never"], "storage.prefetch_policy"),
    (["collective.discipline=local"], "storage"),
    (["jitter.storage_fail.ranks=[2]"], "jitter.storage_fail.ranks"),
    (["jitter.storage_miss.probability=2"], "jitter.storage_miss.probability"),
    (["storage.capacity_gb=-1"], "storage.capacity_gb"),
])
def test_bad_storage_values_are_one_line_errors(sets, where):
    with pytest.raises(UserError) as e:
        load_scenario(SCN, sets)
    msg = str(e.value)
    assert where in msg and "\n" not in msg.strip()


def test_storage_faults_on_one_rank_cut_every_ranks_hit_and_are_absorbed():
    clean = run("jitter.storage_miss.probability=0", requests=120)
    miss = run("jitter.storage_miss.probability=0.2", requests=120)
    fail = run("jitter.storage_fail.ranks=[1]", requests=120)
    assert 0 < miss.summary["l3_hit_tokens"] < clean.summary["l3_hit_tokens"]
    assert fail.summary["l3_hit_tokens"] == 0
    for res, name in ((miss, "storage_miss"), (fail, "storage_fail")):
        assert res.summary["verdict"] == "absorbed"
        assert res.divergence["perturbations"][name] > 0
    # the knobs' other values change the run too
    assert run("jitter.storage_miss.ranks=[0]").summary != run().summary
    assert run("jitter.storage_fail.ranks=[0]").summary != run().summary


def test_storage_jitter_needs_a_storage_block():
    with pytest.raises(UserError) as e:
        load_scenario(ROOT / "scenarios" / "quickstart.yaml", ["jitter.storage_fail.ranks=[1]"])
    assert "storage" in str(e.value)


def test_storage_capacity_bounds_what_l3_gives_back():
    """``storage.capacity_gb`` per rank: 65,536 bytes per token per rank (8B at TP 2) x
    64-token pages is 4.19 MB a page. Less room, fewer L3 hits; none at all with room
    for no page, while the writes go on."""
    from sim.storage.view import capacity_pages

    assert capacity_pages(0.5, 65536, 64) == 119
    assert capacity_pages(119 * 65536 * 64 / 1e9, 65536, 64) == 119  # a size in whole pages
    got = {cap: run(*([] if cap is None else [f"storage.capacity_gb={cap}"]), requests=120).summary
           for cap in (None, 1.0, 0.5, 0.0)}
    l3 = [got[c]["l3_hit_tokens"] for c in (None, 1.0, 0.5, 0.0)]
    assert l3[0] > l3[1] > l3[2] > l3[3] == 0
    assert got[0.0]["l3_write_bytes"] > 0 and got[0.0]["hit_tokens_by_tier"]["storage"] == 0
    # the device and host tiers do not see the store's size
    assert {got[c]["hit_tokens_by_tier"]["device"] for c in got} == {got[None]["hit_tokens_by_tier"]["device"]}


def test_a_prefetch_read_refreshes_its_pages_in_a_bounded_store():
    """The engine touches the pages a transfer landed (the file backend's ``touch`` on a
    read hit): without it, at the same capacity, hot prefixes age out by write order."""
    from sim.storage.view import StorageView

    sets = ("storage.capacity_gb=0.5",)
    touched = run(*sets, requests=120).summary["l3_hit_tokens"]
    with patch.object(StorageView, "read", lambda self, keys: None):
        untouched = run(*sets, requests=120).summary["l3_hit_tokens"]
    assert touched > untouched > 0


TRACE_SCN = ROOT / "scenarios" / "storage_mooncake_trace.yaml"


def test_three_tier_trace_scenario_fast_path_and_storage_size(tmp_path):
    """The Mooncake-trace storage scenario: the decode fast path writes what a step-by-step
    loop writes, and a smaller store (16 GB per rank: full within 300 requests, which the
    shipped 256 GB is not) gives back less, but more than none."""
    sets = ["limits.max_requests=300"]
    fast, plain = tmp_path / "fast", tmp_path / "plain"
    run_scenario(load_scenario(TRACE_SCN, sets), fast)
    with patch.object(Simulation, "_decode_headroom", lambda self, limit: 0):
        run_scenario(load_scenario(TRACE_SCN, sets), plain)
    for f in sorted(p.name for p in fast.iterdir()):
        assert (fast / f).read_bytes() == (plain / f).read_bytes(), f
    sized = json.loads((fast / "summary.json").read_text())
    small = run_scenario(load_scenario(TRACE_SCN, sets + ["storage.capacity_gb=16"])).summary
    none = run_scenario(load_scenario(TRACE_SCN, sets + ["storage=null"])).summary
    assert none["hit_rate"] < small["hit_rate"] < sized["hit_rate"]
