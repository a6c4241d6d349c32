"""buffer_only host memory mode in the engine (docs/STORAGE.md §3, §9): the host pool
as a staging buffer between device and storage. Against cache mode on the same
scenario, determinism, the decode fast path, shared vs eager replicas, TP 2 runs with
jitter over several seeds, op-traces replayed, every knob, and the refusals."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, STEP_BY_STEP
from sim.resolve import from_scenario
from sim.errors import UserError
from sim.runner import run_scenario
from sim.scenario import load_scenario
from sim.storage.buffer import ExistenceBeliefs, HostBuffer
from test_optrace_v2 import check_replays, main

SCN = ROOT / "scenarios" / "storage_buffer_only.yaml"
CACHE = ("storage.host_memory_mode=cache", "host.ratio=1.2")  # cache mode, same host
# pins need room: anchor_lock_cap = min(0.5 * pool, pool - max_context_len)
PINS = ("workload.max_context_tokens=4096",)
# a host buffer small enough, and turns close enough, that hits park, bounces wait for
# slots, anchors move under parked hits and writes wait for staging
SMALL = ("host.tokens=2048", "storage.prefetch_threshold=64", "workload.arrival.rate=8",
         "workload.think_time_s.mean=0.5", "storage.read_gbps=1") + PINS


def run(*sets, out=None, requests=80):
    return run_scenario(load_scenario(SCN, [f"workload.num_requests={requests}", *sets]), out)


def same_folders(a, b):
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for f in names:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_buffer_only_has_no_host_hits_and_stages_storage_hits_through_the_buffer():
    buf, cache = run(requests=120).summary, run(*CACHE, requests=120).summary
    assert buf["hit_tokens_by_tier"]["host"] == 0
    assert cache["hit_tokens_by_tier"]["host"] > 0
    assert buf["hit_tokens_by_tier"]["storage"] > 0
    assert buf["hit_tokens_by_tier"] != cache["hit_tokens_by_tier"]
    hb = buf["host_buffer"]
    # every storage hit went through a staged bounce, spliced at admission
    assert hb["spliced_tokens"] == buf["l3_hit_tokens"] == buf["hit_tokens_by_tier"]["storage"]
    assert hb["prefetches_staged"] > 0 and hb["writes_staged"] > 0
    assert hb["writes_deduplicated"] > 0  # re-inserted hot prefixes are not re-written
    assert 0 < hb["peak_tokens"] <= hb["size_tokens"]
    assert hb["used_tokens_at_end"] == 0  # every staging freed at its ack
    assert "host_buffer" not in cache
    assert buf["verdict"] == cache["verdict"] == "absorbed"


def test_the_trees_hold_no_host_values():
    res = run(*SMALL)
    for c in (c for inst in res.sim.instances for c in inst.group.cohorts):
        assert c.tree.buffer_only and c.tree.host_used == 0
        assert c.tree.evict_host(1 << 20).freed == 0
        c.tree.check()


def test_resolution_write_back_becomes_write_through_and_the_host_ratio_is_1_2():
    cfg, _ = from_scenario(load_scenario(SCN, ["cache.write_policy=write_back"]))
    assert cfg.write_policy == "write_through" and cfg.storage.host_memory_mode == "buffer_only"
    assert cfg.host_tokens == (int(8192 * 1.2) // 64 + 1) * 64
    cfg2, _ = from_scenario(load_scenario(SCN, ["storage.host_memory_mode=cache"]))
    assert cfg2.host_tokens == (8192 * 2 // 64 + 1) * 64 and cfg2.storage.host_memory_mode == "cache"


def test_same_scenario_and_seed_write_byte_identical_results(tmp_path):
    run(*SMALL, out=tmp_path / "a")
    run(*SMALL, out=tmp_path / "b")
    same_folders(tmp_path / "a", tmp_path / "b")


@pytest.mark.parametrize("sets", [("seed=2",), ("seed=4",) + SMALL,
                                  ("seed=6", "storage.prefetch_policy=wait_complete") + PINS,
                                  ("seed=8", "storage.prefetch_policy=best_effort"),
                                  ("seed=3", "page_size=16", "workload.block_size=16",
                                   "storage.read_gbps=4", "storage.prefetch_timeout_base=0.03",
                                   "storage.prefetch_timeout_per_ki_token=0",
                                   "jitter.storage_latency={ranks: [1], factor: 4.0}")])
def test_decode_runs_write_what_a_step_by_step_loop_writes(sets, tmp_path):
    run(*sets, out=tmp_path / "fast")
    run(*sets, STEP_BY_STEP, out=tmp_path / "plain")
    same_folders(tmp_path / "fast", tmp_path / "plain")


@pytest.mark.parametrize("sets", [("seed=1",), ("seed=5",) + SMALL,
                                  ("seed=2", "jitter.storage_latency={ranks: [1], factor: 4.0}"),
                                  # a mid-run fork (shared) clones the buffer state; the
                                  # id drift moves the Python core's global node counter
                                  ("seed=3", "cache.tree_core=python",
                                   "jitter.id_drift={rank: 1, extra_ids: 3, "
                                   "after_request: 10}") + SMALL])
def test_shared_and_eager_replicas_write_byte_identical_results(sets, tmp_path):
    run(*sets, "engine.replicas=shared", out=tmp_path / "shared")
    run(*sets, "engine.replicas=eager", out=tmp_path / "eager")
    same_folders(tmp_path / "shared", tmp_path / "eager")


def test_tp2_with_a_slow_rank_and_ack_jitter_is_absorbed_on_every_seed():
    """Every buffer mutation runs at rank-agreed points (MIN-drained queues, the insert
    walk), so rank 1's slow store and late acks delay every rank alike: the verdict is
    ``absorbed`` and the replicas' trees, beliefs and host buffers agree."""
    verdicts, l3 = [], []
    for seed in range(5):
        res = run(f"seed={seed}", "jitter.storage_latency={ranks: [1], factor: 4.0}", *PINS)
        verdicts.append(res.divergence["verdict"])
        l3.append(res.summary["l3_hit_tokens"])
        books = [c.st.book for inst in res.sim.instances for c in inst.group.cohorts]
        assert len(books) == 2  # rank 1 has its own replica (its own store)
        a, b = books
        assert a.beliefs.entries == b.beliefs.entries
        assert a.host.used == b.host.used and a.counts == b.counts
        assert res.divergence["perturbations"].get("storage_latency", 0) > 0
    assert verdicts == ["absorbed"] * 5
    assert all(n > 0 for n in l3)


@pytest.mark.parametrize("sets", [(), SMALL, ("storage.prefetch_policy=best_effort",) + PINS,
                                  ("page_size=16", "workload.block_size=16") + PINS])
def test_buffer_op_traces_replay_to_the_engines_trees(tmp_path, sets):
    ops = tmp_path / "ops"
    argv = ["run", SCN, "-o", tmp_path / "res", "--quiet", "--record-ops", ops,
            "--set", "workload.num_requests=60"]
    for x in sets:
        argv += ["--set", x]
    rc, _, err = main(argv)
    assert rc == 0, err
    heads = check_replays(ops, json.loads((ops / "index.json").read_text()))
    assert all(h["host_memory_mode"] == "buffer_only" and "storage_writes" not in h for h in heads)
    kinds = {json.loads(x)["op"] for x in (ops / "rank0.jsonl").read_text().splitlines()[1:]}
    assert {"buffer_stage", "write_ack"} <= kinds
    assert not kinds & {"prefetch", "prefetch_hit", "prefetch_done", "storage_write_ack"}
    if sets and sets[-1] == PINS[-1]:
        assert {"pin", "unpin"} <= kinds


@pytest.mark.parametrize("knob", [
    ("storage.host_memory_mode=cache",),  # and the host ratio back to 2.0
    ("host.tokens=1024",),                  # the staging budget: writes wait, hits park
])
def test_every_buffer_knob_changes_the_run(knob):
    ref, got = run().summary, run(*knob).summary
    assert ref != got


def test_small_host_buffer_parks_hits_and_replans_moved_anchors():
    s = run(*SMALL, requests=120).summary
    hb = s["host_buffer"]
    assert hb["size_tokens"] == 2048 and 0 < hb["peak_tokens"] <= 2048
    assert hb["hits_parked"] > 0 and s["prefetch_declined"]["rate_limited"] == hb["hits_parked"]
    # try_lock_anchor's outcomes on a parked hit's retry
    assert s["prefetch_revoked"].get("anchor_lost", 0) > 0
    assert s["prefetch_revoked"].get("device_covered", 0) > 0
    assert hb["used_tokens_at_end"] == 0


def test_refusals_are_one_line_errors_naming_the_key():
    with pytest.raises(UserError) as e:
        load_scenario(SCN, ["host=off"])
    msg = str(e.value)
    assert "storage.host_memory_mode" in msg and "\n" not in msg.strip()
    with pytest.raises(UserError) as e:
        load_scenario(SCN, ["storage.host_memory_mode=buffer"])
    assert "storage.host_memory_mode" in str(e.value)


def test_existence_beliefs_lru_and_inflight_refcounts():
    b = ExistenceBeliefs(max_entries=3)
    b.add([1, 2, 3])
    assert b.covered([1, 2, 3]) and not b.covered([4])
    b.track_inflight([4, 4])
    assert b.covered([4])
    b.untrack_inflight([4])
    assert b.covered([4])  # one ref left
    b.untrack_inflight([4])
    assert not b.covered([4])
    b.contains(1)          # touch: 2 is now the oldest
    b.add([5])
    assert not b.contains(2) and b.contains(1) and b.contains(5)
    b.invalidate_beyond([1, 3, 5], 1)
    assert b.contains(1) and not b.contains(3) and not b.contains(5)


def test_host_buffer_is_a_simpy_container():
    import simpy

    env = simpy.Environment()
    h = HostBuffer(env, 100)
    h.take(60)
    assert h.used == 60 and h.fits(40) and not h.fits(41)
    h.give(60)
    assert h.used == 0 and h.peak == 60
