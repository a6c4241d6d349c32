"""The L3 storage tier in the engine (docs/STORAGE.md §7): the shipped storage scenario
end to end at TP 2 with jitter, its op-traces replayed, shared vs eager replicas, and
every storage knob changing the run."""

from __future__ import annotations

import json

from unittest.mock import patch

import pytest

from conftest import ROOT, STEP_BY_STEP
from sim.errors import UserError
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


# A slow backend on rank 1 where it matters: pages of 16 tokens (a hit spans several
# 128-page read batches), reads at 4 GB/s and a 30 ms prefetch timeout, so rank 1's
# transfers are still running when the timeout votes terminate them.
SLOW_RANK = ("page_size=16", "storage.read_gbps=4", "storage.prefetch_timeout_base=0.03",
             "storage.prefetch_timeout_per_ki_token=0", "jitter.storage_miss.probability=0",
             "jitter.storage_latency={ranks: [1], factor: 4.0}")


@pytest.mark.parametrize("sets", [("seed=2",), ("seed=4", "cache.write_policy=write_back"),
                                  ("seed=6", "storage.prefetch_policy=wait_complete"),
                                  ("seed=8", "storage.prefetch_policy=best_effort",
                                   "storage.read_gbps=0.05"),
                                  ("seed=3", "storage.capacity_gb=0.5"),
                                  ("seed=3",) + SLOW_RANK])
def test_decode_runs_with_storage_write_what_a_step_by_step_loop_writes(sets, tmp_path):
    """The decode fast path stops at every storage completion and timeout deadline."""
    fast, plain = tmp_path / "fast", tmp_path / "plain"
    run(*sets, out=fast)
    run(*sets, STEP_BY_STEP, out=plain)
    names = sorted(p.name for p in fast.iterdir())
    assert names == sorted(p.name for p in plain.iterdir())
    for f in names:
        assert (fast / f).read_bytes() == (plain / f).read_bytes(), f


@pytest.mark.parametrize("sets", [("seed=1",), ("seed=7", "cache.write_policy=write_back"),
                                  ("seed=3", "jitter.request_order.swap_probability=0.2", "jitter.request_order.ranks=[1]"),
                                  ("seed=5", "storage.capacity_gb=0.5"),
                                  ("seed=5",) + SLOW_RANK,
                                  ("seed=2", "jitter.storage_latency={dist: exponential, mean: 0.01}")])
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
    SLOW + ("storage.prefetch_policy=wait_complete",),  # only where the timeout fires
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


def test_wait_complete_waits_where_the_timeout_terminates():
    """Reads slow enough that prefetches outlive their deadline: `timeout` terminates
    some before their pages are staged (revoked, the request goes on without them),
    `wait_complete` waits for every one, and the requests' first tokens move."""
    timed, waited = run(*SLOW).summary, run(*SLOW, "storage.prefetch_policy=wait_complete").summary
    assert timed["prefetch_revoked"].get("not_staged", 0) > 0
    assert waited["prefetch_revoked"].get("not_staged", 0) == 0
    assert waited["l3_hit_tokens"] > timed["l3_hit_tokens"]
    assert waited["ttft_p99_s"] != timed["ttft_p99_s"]


@pytest.mark.parametrize("sets, where", [
    (["storage.backend=tape"], "storage.backend"),
    (["storage.prefetch_threshold=-1"], "storage.prefetch_threshold"),
    (["storage.prefetch_policy=never"], "storage.prefetch_policy"),
    (["collective.discipline=local"], "storage"),
    (["jitter.storage_fail.ranks=[2]"], "jitter.storage_fail.ranks"),
    (["jitter.storage_miss.probability=2"], "jitter.storage_miss.probability"),
    (["storage.capacity_gb=-1"], "storage.capacity_gb"),
    (["jitter.storage_latency.ranks=[2]", "jitter.storage_latency.factor=2"],
     "jitter.storage_latency.ranks"),
    (["jitter.storage_latency.factor=0"], "jitter.storage_latency.factor"),
    (["jitter.storage_latency.dist=exponential"], "jitter.storage_latency"),
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


@pytest.mark.parametrize("sets", [["jitter.storage_fail.ranks=[1]"],
                                  ["jitter.storage_latency.factor=4"]])
def test_storage_jitter_needs_a_storage_block(sets):
    with pytest.raises(UserError) as e:
        load_scenario(ROOT / "scenarios" / "quickstart.yaml", ["tp=2", *sets])
    assert "jitter.storage" in str(e.value)


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
    # the device and host tiers do not see the store's size: what they serve together
    # is the same (under the pipelined timing a prefetch's length moves when a forward
    # runs, so a page's hit can land on the host rather than the device: the unbounded
    # store's run serves 576 tokens from the host that the others serve from the device)
    tiers = {c: got[c]["hit_tokens_by_tier"]["device"] + got[c]["hit_tokens_by_tier"]["host"]
             for c in got}
    assert set(tiers.values()) == {tiers[None]} and tiers[None] > 0


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
    shipped 256 GB is not) gives back less (within these 300 requests, nothing: its
    hit rate is then the device's, which the loop order moves either side of the
    storage-less run's)."""
    sets = ["limits.max_requests=300"]
    fast, plain = tmp_path / "fast", tmp_path / "plain"
    run_scenario(load_scenario(TRACE_SCN, sets), fast)
    run_scenario(load_scenario(TRACE_SCN, sets + [STEP_BY_STEP]), plain)
    for f in sorted(p.name for p in fast.iterdir()):
        assert (fast / f).read_bytes() == (plain / f).read_bytes(), f
    sized = json.loads((fast / "summary.json").read_text())
    small = run_scenario(load_scenario(TRACE_SCN, sets + ["storage.capacity_gb=16"])).summary
    none = run_scenario(load_scenario(TRACE_SCN, sets + ["storage=null"])).summary
    assert small["l3_hit_tokens"] < sized["l3_hit_tokens"]
    assert max(none["hit_rate"], small["hit_rate"]) < sized["hit_rate"]


@pytest.mark.parametrize("knob", [
    ("jitter.storage_latency={ranks: [1], factor: 4.0}",),
    ("jitter.storage_latency={ranks: [0], factor: 4.0}",),
    ("jitter.storage_latency={factor: 2.0}",),
    ("jitter.storage_latency={ranks: [1], dist: exponential, mean: 0.005}",),
    ("jitter.storage_latency={ranks: [1], factor: 0.5}",),
])
def test_storage_latency_knobs_change_the_run(knob):
    base = SLOW_RANK[:-1]
    ref, got = run(*base, requests=120), run(*base, *knob, requests=120)
    # (a rank faster than the others changes only when the loop looks: the slowest
    # rank's progress is what every rank uses)
    assert (ref.summary, ref.divergence) != (got.summary, got.divergence)
    assert got.divergence["perturbations"]["storage_latency"] > 0


def _digests_agree(res) -> bool:
    return len(set(res.divergence["digests"].values())) == 1


def test_a_slow_rank_delays_every_ranks_prefetches_and_the_trees_agree():
    """Rank 1's backend is 4x slower. The hits, the transfers' progress and the
    timeout verdicts are all reduced across the ranks (MIN, MIN, MAX), so both ranks
    terminate the same prefetches at the same poll with the same tokens: fewer tokens
    come from L3 on every rank, and the trees never differ (10 seeds)."""
    base = SLOW_RANK[:-1]
    verdicts, cut = [], 0
    for seed in range(10):
        clean = run(*base, f"seed={seed}", requests=120)
        slow = run(*SLOW_RANK, f"seed={seed}", requests=120)
        verdicts.append(slow.summary["verdict"])
        assert slow.divergence["perturbations"]["storage_latency"] > 0
        assert slow.divergence["first_true_divergence"] is None and _digests_agree(slow)
        cut += slow.summary["l3_hit_tokens"] < clean.summary["l3_hit_tokens"]
    assert verdicts == ["absorbed"] * 10
    assert cut >= 8


def rank_ops(ops_dir) -> dict[int, list[dict]]:
    """Each rank's recorded op-trace (``run --record-ops``), header left out."""
    index = json.loads((ops_dir / "index.json").read_text())
    return {t["rank"]: [json.loads(x) for x in (ops_dir / t["file"]).read_text().splitlines()[1:]]
            for t in index["traces"]}


def test_prefetch_queries_and_transfers_complete_in_the_same_order_on_every_rank(tmp_path):
    """SGLang runs each rank's queries on one `prefetch_thread` and its transfers on one
    `prefetch_io_aux_thread`, FIFO, and reduces each hit and each ack in a collective:
    completions reach the scheduler in the same order on every rank, whatever each
    rank's speed. With rank 1's backend 4x slower, each rank's own op-trace shows its
    tree receiving the hits (prefetch_hit) and the transfers' ends (prefetch_done, or
    prefetch_revoke for one stopped by a termination) in the same order and sizes."""
    res = run_scenario(load_scenario(SCN, ["workload.num_requests=120", *SLOW_RANK, "seed=3"]),
                       None, record_ops_dir=tmp_path / "ops")
    assert res.summary["verdict"] == "absorbed"
    assert res.divergence["perturbations"]["storage_latency"] > 0
    ops = rank_ops(tmp_path / "ops")
    assert set(ops) == {0, 1}
    seqs = {r: [(o["op"], o["id"], o.get("n")) for o in recs
                if o["op"] in ("prefetch_hit", "prefetch_done", "prefetch_revoke")]
            for r, recs in ops.items()}
    for kind in ("prefetch_hit", "prefetch_done"):
        assert sum(1 for x in seqs[0] if x[0] == kind) > 10, kind
    assert seqs[0] == seqs[1]


def _vote_calls(*sets):
    from sim.collectives import Collective, SimulatedCollective

    sites = []
    orig, uni = Collective.all_reduce_min, SimulatedCollective.all_reduce_uniform

    def spy(self, step, site=None, inputs=None):
        sites.append(site)
        return orig(self, step, site, inputs)

    def spy_uniform(self, step, site, vector):
        sites.append(site)
        return uni(self, step, site, vector)

    with patch.object(Collective, "all_reduce_min", spy), \
            patch.object(SimulatedCollective, "all_reduce_uniform", spy_uniform):
        res = run(*sets)
    return sites.count("prefetch_terminate"), res


def test_timeout_votes_are_one_max_collective_per_poll():
    """`_can_terminate_prefetch` all-reduces under `timeout` only (best_effort and
    wait_complete decide without a collective), and not at TP 1."""
    n, res = _vote_calls(*SLOW_RANK)
    assert n > 0 and res.summary["verdict"] == "absorbed"
    for policy in ("best_effort", "wait_complete"):
        assert _vote_calls(*SLOW_RANK, f"storage.prefetch_policy={policy}")[0] == 0
    assert _vote_calls(*SLOW_RANK[:-1], "tp=1", "jitter={}")[0] == 0


def test_timeout_votes_of_another_admission_order_pair_other_requests():
    """Rank 1 admits in another order (request-order jitter, fired in every run), so
    its n-th timeout vote can be for another request than rank 0's n-th. Where every
    paired MAX still gives each rank the verdict it used, the run goes on (absorbed:
    the ranks' trees see the same ops); under a short timeout some pairings give other
    verdicts, which the engine reports as untracked."""
    order = ("jitter.request_order.swap_probability=0.2", "jitter.request_order.ranks=[1]")

    def runs(sets, seeds):
        res = [run(*order, *sets, f"seed={seed}", requests=80) for seed in seeds]
        assert all(r.divergence["perturbations"]["request_order"] > 0 for r in res)
        return [(r.summary["verdict"], (r.divergence["untracked"] or {}).get("why", ""))
                for r in res]

    assert [v for v, _ in runs(("storage.read_gbps=0.5",), (0, 2, 3))] == ["absorbed"] * 3
    # seed 3 is absorbed above: the short timeout is what makes its pairings differ
    tight = runs(("storage.read_gbps=0.05", "storage.prefetch_timeout_base=0.01"), (1, 3))
    assert [v for v, _ in tight] == ["missed", "missed"], tight
    assert all("paired collectives gave other verdicts" in w for _, w in tight), tight


@pytest.mark.parametrize("name,sets", [
    ("storage_mooncake", ("seed=3", "workload.num_requests=150")),
    ("storage_mooncake", ("seed=8", "storage.prefetch_policy=best_effort",
                          "storage.read_gbps=0.05", "workload.num_requests=150")),
    ("storage_buffer_only", ("workload.num_requests=150", "storage.read_gbps=0.05")),
    ("storage_slow_rank", ("workload.num_requests=150",)),
])
def test_sweeping_prefetch_bookkeeping_changes_no_result(name, sets, tmp_path):
    """``StorageEngine.sweep`` forgets only ids nothing reads again: sweeping at every
    arrival writes what never sweeping writes (a live id swept would be a KeyError),
    and what the engine keeps stays bounded by what is in flight."""
    from sim.storage.engine import StorageEngine

    kept = []
    sweep = StorageEngine.sweep

    def counted(self):
        sweep(self)
        kept.append(len(self.reqs))

    folders = {}
    for label, every in (("always", 1), ("never", 10**9)):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(StorageEngine, "SWEEP_MIN", every)
            m.setattr(StorageEngine, "sweep", counted)
            out = tmp_path / label
            run_scenario(load_scenario(ROOT / "scenarios" / f"{name}.yaml", list(sets)), out)
            folders[label] = {p.name: p.read_bytes() for p in out.iterdir()}
        if label == "always":
            swept = list(kept)
    assert folders["always"].keys() == folders["never"].keys()
    for f in folders["always"]:
        assert folders["always"][f] == folders["never"][f], f
    # swept at (nearly) every arrival: it keeps a handful, not every request
    assert len(swept) >= 40 and max(swept) < 40, (len(swept), max(swept))
