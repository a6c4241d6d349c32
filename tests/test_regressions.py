"""The upstream reports shipped as scenarios/regressions/ (issue 15 item 5): each run's
outcome pinned on summary.json figures. The comment at the top of each scenario says
what the report describes, what hicache-sim gives, and where they differ.

These files are not in tests/test_scenarios_run.py's glob (scenarios/*.yaml). They are
checked here instead: each validates, runs whole and keeps its trees consistent. The
storage ones pin one seed's figures (a few requests, about a second); the host-tier
ones (#34519, #40512) check the report's symptom over seeds, each with a negative control
(the guard removed); the TP classes (#28429, #26921, #33442, LMCache #1467) assert the
report's symptom, or, where a scenario cannot show it, the order of what it does show."""

from __future__ import annotations

import json
from unittest.mock import patch

import pandas as pd
import pytest
from conftest import ROOT, STEP_BY_STEP
from test_optrace_v2 import main

from sim.errors import UserError
from sim.optrace import Replayer
from sim.policies.host import DuplicateFirst
from sim.runner import run_scenario
from sim.scenario import load_scenario
from sim.storage.collectives import unwritten_ranks
from sim.tree import Tree

REG = ROOT / "scenarios" / "regressions"
BYTES_PER_TOKEN = 131072                                  # Llama-3.1-8B, bf16, TP 1
# Scenarios whose trace is fetched (hicache-sim traces fetch), not shipped: the stand-in
# they are checked on here.
STAND_IN = {"sglang_29049": ["workload.path=traces/mooncake-fast25/conversation_trace.jsonl.gz",
                             "limits.max_requests=1500"]}


def check_trees(res):
    for c in (c for inst in res.sim.instances for c in inst.group.cohorts):
        c.tree.check()


def run(name, *sets):
    res = run_scenario(load_scenario(REG / f"{name}.yaml", list(sets)), None)
    check_trees(res)
    assert res.summary["verdict"] == "agree"
    return res.summary


def test_every_regression_scenario_is_listed_and_named_after_its_file():
    paths = sorted(REG.glob("*.yaml"))
    assert {p.stem for p in paths} == {"sglang_40193", "sglang_39444", "sglang_34519", "sglang_40512",
                                        "sglang_37149", "sglang_29049", "sglang_39436",
                                        "sglang_33713", "sglang_28429", "sglang_26921",
                                        "sglang_33442", "lmcache_1467"}
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


def record(tmp_path, name, *sets):
    """Run ``name`` with --record-ops: (summary, rank-0 op records, requests table)."""
    args = ["run", REG / f"{name}.yaml", "-o", tmp_path / "res", "--quiet",
            "--record-ops", tmp_path / "ops"]
    for s in sets:
        args += ["--set", s]
    rc, _, err = main(args)
    assert rc == 0, err
    summary = json.loads((tmp_path / "res" / "summary.json").read_text())
    lines = (tmp_path / "ops" / "rank0.jsonl").read_text().splitlines()[1:]
    return summary, [json.loads(x) for x in lines], pd.read_parquet(tmp_path / "res" / "requests.parquet")


def storage_ops(recs):
    return [(r["op"], r["id"], r.get("n")) for r in recs
            if r["op"] in ("prefetch_hit", "prefetch_done", "prefetch_revoke")]


WRITE_BACK = ("cache.write_policy=write_back", "storage.prefetch_policy=wait_complete")


def replay_hits(recs, header):
    """Replay rank 0's recorded op-trace (the traces replay identically on SGLang's own
    tree, tools/sglang_oracle/oracle_storage.py): per prefetch_hit with a hit, (id, hit
    tokens, the host's free room at that moment, tokens staged); and the replayed tree."""
    r = Replayer(header, ids=header["ids"], host_policy=header["host_policy"])
    hits = []
    for i, op in enumerate(recs, 1):
        t = r.tree
        free = t.host_capacity - t.host_used - t.host_reserved
        out = r.apply(i, op)
        if op["op"] == "prefetch_hit" and op["n"]:
            hits.append((op["id"], op["n"], free, out["staged"]))
    return hits, r.tree


def test_39444_write_through_brings_back_only_part_of_each_prefix(tmp_path):
    s, recs, req = record(tmp_path, "sglang_39444")
    header = json.loads((tmp_path / "ops" / "rank0.jsonl").read_text().splitlines()[0])
    assert s["host_tokens"] == 27127 and s["device_tokens"] == 42763
    assert s["verdict"] == "agree" and s["prefetch_issued"] == 10
    # 0.5.23 backs up each chunk at its own insert: p0's two chunks both reach storage,
    # and its replay (p5) hits all 16,010 pages (the 16,011-token prefix less the last
    # token, which is never cached); p1..p4 only their first chunk (8,192, the
    # chunked-prefill size)
    assert [x for x in storage_ops(recs) if x[0] == "prefetch_hit"][5:] == [
        ("prefetch_hit", f"p{i}", n) for i, n in zip(range(5, 10), (16010, 8192, 8192, 8192, 8192))]
    # What reaches each replay is cut to the host's free room: write_through host
    # copies whose device copy is live cannot be evicted, so a hit stages
    # min(hit, free room); with no room at all it is revoked (host_capacity).
    hits, tree = replay_hits(recs, header)
    assert [h[0] for h in hits] == [f"p{i}" for i in range(5, 10)]
    assert all(staged == min(n, free) for _, n, free, staged in hits), hits
    assert all(staged < n for _, n, _, staged in hits)  # every replay only in part
    staged = {pid: st for pid, _, _, st in hits}
    assert req["host_hit_tokens"].tolist() == [0] * 5 + [staged[f"p{i}"] for i in range(5, 10)]
    assert s["l3_hit_tokens"] == sum(staged.values()) == req["host_hit_tokens"].sum() > 0
    assert s["hit_tokens_by_tier"] == {"device": 0, "host": 0, "storage": s["l3_hit_tokens"]}
    no_room = sum(1 for _, _, free, _ in hits if free == 0)
    assert no_room > 0
    assert s["prefetch_revoked"] == {"below_threshold": 5, "host_capacity": no_room}
    # The backups that found no host room: at least p1..p4's second chunks (that is why
    # storage holds only their first), each attempt counted as SGLang's tree counts it
    # on these ops (inserts carry the request's inserted length, as
    # `_finish_insert_walk_node` walks them).
    assert s["backup_failures"] == tree.stats.backup_failures >= 4


def test_39444_write_back_wait_complete_restores_two_prefixes_whole(tmp_path):
    s, recs, req = record(tmp_path, "sglang_39444", *WRITE_BACK)
    assert s["verdict"] == "agree"
    assert [x for x in storage_ops(recs) if x[0] == "prefetch_done"] == [
        ("prefetch_done", f"p{i}", n) for i, n in zip(range(5, 10), (16010, 16010, 16010, 8192, 8192))]
    assert req["host_hit_tokens"].tolist() == [0] * 5 + [16010, 16010, 0, 8192, 8192]
    assert s["l3_hit_tokens"] == 3 * 16010 + 2 * 8192
    assert s["hit_tokens_by_tier"] == {"device": 0, "host": 0, "storage": 2 * 16010 + 2 * 8192}
    assert s["prefetch_revoked"] == {"below_threshold": 5}


def test_39444_the_stop_policy_matters_only_for_best_effort():
    """The reads end well inside the timeout: timeout gives what wait_complete gives,
    under either write policy. best_effort ends every prefetch at its first admission
    poll, before its hit: nothing comes back."""
    wt = run("sglang_39444", "storage.prefetch_policy=wait_complete")
    assert (wt["l3_hit_tokens"], wt["prefetch_revoked"]) == (5475, {"below_threshold": 5, "host_capacity": 2})
    wb = run("sglang_39444", "cache.write_policy=write_back")
    assert wb["hit_tokens_by_tier"]["storage"] == 2 * 16010 + 2 * 8192
    be = run("sglang_39444", "storage.prefetch_policy=best_effort")
    assert be["l3_hit_tokens"] == 0 and be["prefetch_revoked"] == {"not_staged": 10}


def pinned_reclaims(name, *sets, guard: bool = True):
    """Run ``name``; count, on rank 0's tree, the duplicate-reclaim walks that reached a
    node only its load-back pin kept (on both tiers, mapped, not host-locked, no
    write-through pending: ``Tree.reclaimable`` refuses it for its pin ``lb`` alone),
    and, on every tree, the releases of a pinned node (the #34519 hazard)."""
    walks, released, cur = {}, [0], [None]
    reclaimable, release, walk = Tree.reclaimable, Tree.release_duplicate, DuplicateFirst.reclaim

    def spy_walk(self, tree, n):
        cur[0] = set()
        r = walk(self, tree, n)
        if cur[0]:
            walks[id(tree)] = walks.get(id(tree), 0) + 1
        return r

    def spy_reclaimable(node):
        if (node.lb is not None and node.dev and node.host and node.wp is None
                and not node.host_lock):
            cur[0].add(node.id)
            if not guard:
                # the code before #34519: no load-back pin in the live re-check
                return True
        return reclaimable(node)

    def spy_release(self, node, pass_no):
        released[0] += node.lb is not None
        return release(self, node, pass_no)

    with patch.object(Tree, "reclaimable", staticmethod(spy_reclaimable)), \
            patch.object(Tree, "release_duplicate", spy_release), \
            patch.object(DuplicateFirst, "reclaim", spy_walk):
        res = run_scenario(load_scenario(REG / f"{name}.yaml", list(sets)), None)
    if guard:
        check_trees(res)
    rank0 = res.sim.instances[0].group.cohort_of(0).tree
    return {**res.summary, **res.divergence}, walks.get(id(rank0), 0), released[0]


SEEDS = range(1, 21)


def test_34519_the_load_back_pin_keeps_in_flight_sources_from_reclaim():
    """The report's hazard is a duplicate reclaim freeing the host copy an in-flight
    H->D load-back still reads. With 0.5.23's pin, reclaim walks do reach such sources
    and none is released; the digest agrees on both ranks."""
    per_seed = [pinned_reclaims("sglang_34519", f"seed={k}") for k in SEEDS]
    assert all(s["verdict"] == "absorbed" for s, _, _ in per_seed)
    assert all(s["perturbations"]["ack_delay"] > 0 for s, _, _ in per_seed)
    assert all(s["reclaim_pass1_tokens"] > 0 for s, _, _ in per_seed)  # reclaim runs
    assert any(w > 0 for _, w, _ in per_seed)           # the hazard is reached
    assert all(r == 0 for _, _, r in per_seed)          # no in-flight source released


def test_34519_without_the_pin_reclaim_frees_sources_still_being_loaded():
    """Negative control: the live re-check without the load-back pin (the code before
    #34519) releases the host copy of a node whose load-back is in flight, the
    report's symptom, on the seeds where a walk reaches one."""
    hit = [k for k in SEEDS if pinned_reclaims("sglang_34519", f"seed={k}")[1] > 0][:3]
    assert hit
    for k in hit:
        _, walks, released = pinned_reclaims("sglang_34519", f"seed={k}", guard=False)
        assert walks > 0 and released > 0


def test_34519_write_through_pins_nothing_and_reclaims_nothing():
    for k in (3, 5, 8):   # seeds where write_back's pin does the work
        s, walks, released = pinned_reclaims("sglang_34519", f"seed={k}",
                                             "cache.write_policy=write_through")
        assert s["verdict"] == "absorbed"
        assert s["reclaim_pass1_tokens"] == s["reclaim_pass2_tokens"] == 0
        assert walks == released == 0


def verdicts(name, *sets):
    out = {}
    for k in SEEDS:
        res = run_scenario(load_scenario(REG / f"{name}.yaml", [f"seed={k}", *sets]), None)
        check_trees(res)
        assert res.divergence["perturbations"]["ack_delay"] > 0
        out[res.divergence["verdict"]] = out.get(res.divergence["verdict"], 0) + 1
    return out


def reclaim_victims(name, *sets):
    """Per seed: each rank's sequence of duplicate-reclaim victims (node ids, in
    order), the digest assertion (or None), and how often the late acks fired."""
    out = []
    for k in range(1, 6):
        victims: dict = {}
        release = Tree.release_duplicate

        def spy(self, node, pass_no, victims=victims):
            victims.setdefault(id(self), []).append(node.id)
            return release(self, node, pass_no)

        with patch.object(Tree, "release_duplicate", spy):
            res = run_scenario(load_scenario(REG / f"{name}.yaml", [f"seed={k}", *sets]), None)
        g = res.sim.instances[0].group
        per_rank = [victims.get(id(g.cohort_of(r).tree), []) for r in range(g.tp)]
        out.append((per_rank, res.divergence["digest_mismatch"],
                    res.divergence["perturbations"]["ack_delay"]))
    return out


def test_40512_ranks_that_see_acks_in_another_order_reclaim_alike():
    """The report's symptom is host reclaim victims that depend on the order each rank
    handles its transfers. 0.5.23 drains acks by the MIN-agreed counts in issue
    order: with late acks on ranks 1 and 3, every rank reclaims the same victims in
    the same order, and the digest assertion never fires."""
    for per_rank, mismatch, fired in reclaim_victims("sglang_40512"):
        assert fired > 0 and per_rank[0]                 # acks were late; reclaims ran
        assert all(v == per_rank[0] for v in per_rank)  # replicas may share a tree
        assert mismatch is None


def test_40512_without_the_agreed_drain_victims_follow_each_ranks_ack_order():
    """Negative control: each rank popping its own ready acks (the `local`
    discipline, the agreed drain removed) makes the victims differ across ranks,
    and SGLang's assertion names it."""
    runs = reclaim_victims("sglang_40512", "collective.discipline=local")
    assert any(any(v != per_rank[0] for v in per_rank) for per_rank, _, _ in runs)
    assert all(m is not None and m["message"] ==
               "write_back duplicate-reclaim victims diverged across PP/TP ranks"
               for _, m, _ in runs if m is not None)
    assert any(m is not None for _, m, _ in runs)


def test_37149_under_cp_only_global_rank_0_writes_and_the_min_cuts_every_hit_to_zero(tmp_path):
    s, recs, _ = record(tmp_path, "sglang_37149")
    assert s["verdict"] == "agree" and s["prefetch_issued"] == 4
    assert storage_ops(recs) == [("prefetch_hit", f"p{i}", 0) for i in range(4)]
    assert s["prefetch_revoked"] == {"below_threshold": 4}
    assert s["l3_hit_tokens"] == 0 and s["hit_tokens_by_tier"]["storage"] == 0
    assert s["l3_write_bytes"] > 0          # rank 0 did write (its own CP shard)


def test_37149_plain_tp_or_a_non_mla_model_restores_the_prefix(tmp_path):
    s, recs, _ = record(tmp_path, "sglang_37149", "storage.attn_cp_size=1")
    assert storage_ops(recs)[-2:] == [("prefetch_hit", "p3", 8192), ("prefetch_done", "p3", 8192)]
    assert s["hit_tokens_by_tier"]["storage"] == 8192
    gqa = run("sglang_37149", "model.preset=llama-3.1-8b")       # every rank writes
    assert gqa["l3_hit_tokens"] == 8192 and gqa["hit_tokens_by_tier"]["storage"] == 8192


def test_37149_the_writer_choice_is_0523s():
    """``unwritten_ranks``: 0.5.23's ``is_storage_writer`` with the global TP rank and
    per-CP-coordinate keys for replicated KV, CP-major rank layout."""
    assert unwritten_ranks(8, 2, rank_replicated=True) == {4, 5, 6, 7}
    assert unwritten_ranks(8, 8, rank_replicated=True) == set(range(1, 8))
    assert unwritten_ranks(8, 1, rank_replicated=True) == set()   # plain TP: shared keys
    assert unwritten_ranks(8, 2, rank_replicated=False) == set()  # every rank writes
    with pytest.raises(ValueError):
        unwritten_ranks(8, 3, rank_replicated=True)


def test_37149_an_attn_cp_size_not_dividing_tp_is_a_one_line_error():
    with pytest.raises(UserError) as e:
        load_scenario(REG / "sglang_37149.yaml", ["storage.attn_cp_size=3"])
    msg = str(e.value)
    assert "storage.attn_cp_size" in msg and "tp 8" in msg and "\n" not in msg.strip()


def test_39444_one_chunk_per_prefix_leaves_three_replays_with_nothing(tmp_path):
    """The report's sizes without chunking: host room alone leaves three of five
    replays with nothing from storage under both policies (the scenario's comment
    says which backup or drop lost each)."""
    wt = tmp_path / "wt"
    wt.mkdir()
    s, recs, req = record(wt, "sglang_39444", "scheduler.chunked_prefill_tokens=16384")
    assert req["host_hit_tokens"].tolist()[5:] == [11116, 0, 0, 0, 11116]
    assert [x for x in storage_ops(recs) if x[0] == "prefetch_hit"][5:] == [
        ("prefetch_hit", f"p{i}", n) for i, n in zip(range(5, 10), (16010, 0, 16010, 0, 16010))]
    assert s["backup_failures"] == 5
    wb = tmp_path / "wb"
    wb.mkdir()
    s, recs, req = record(wb, "sglang_39444", "scheduler.chunked_prefill_tokens=16384", *WRITE_BACK)
    assert req["host_hit_tokens"].tolist()[5:] == [16010, 16010, 0, 0, 0]
    assert s["l3_hit_tokens"] == 3 * 16010                 # p2's load lands, unused
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
    assert sel_end == (5993, 4397, 1435, 8955)  # a second hit by another request backs up
    assert round(wt["device_hit_rate"], 4) == round(wb["device_hit_rate"], 4) == 0.1906
    assert (round(wt["hit_rate"], 4), round(wb["hit_rate"], 4), round(sel["hit_rate"], 4)) == \
        (0.2343, 0.2640, 0.2034)
    assert wt["backup_failures"] == wb["backup_failures"] == sel["backup_failures"] == 0


def test_29049_a_host_smaller_than_the_device_is_dead_under_write_through():
    """L2 = 0.5 x L1 (3,000 pages): under write_through the host is full of device
    mirrors it cannot evict, every backup of a new page fails and the host never hits;
    write_back still gains from it, and so does write_through_selective, whose host
    holds only nodes a second request hit (`_finish_insert_walk_node`'s
    `inserted_len`: a request's own nodes count no hit)."""
    wt, wt_end = _29049(1536000, "write_through")
    wb, wb_end = _29049(1536000, "write_back")
    sel, _ = _29049(1536000, "write_through_selective")
    assert wt["host_hit_rate"] == 0.0 and sel["host_hit_rate"] > 0.0
    assert wt["backup_failures"] == 1722 and sel["backup_failures"] == 0
    assert wt_end == (5993, 2997, 2997, 5993)                # the host: device mirrors only
    assert wb_end == (5993, 2992, 0, 8985) and wb["backup_failures"] == 0
    assert (round(wt["hit_rate"], 4), round(wb["hit_rate"], 4)) == (0.1894, 0.2133)
def _replays(name, *sets, first=200):
    """The run's summary and the requests from ``first`` on (the trace's replays)."""
    res = run_scenario(load_scenario(REG / f"{name}.yaml", list(sets)), None)
    for c in (c for inst in res.sim.instances for c in inst.group.cohorts):
        c.tree.check()
    assert res.summary["verdict"] == "agree"
    df = res.sim.requests_df()
    return res.summary, df[df["rid"] >= first].sort_values("rid")


def test_39436_565_host_state_slots_leave_the_host_tier_inert():
    """The report's write_through and SGLang's default device state pool (228 slots):
    all 600 checkpoint states are backed up at their inserts and compete for 565 host
    slots; the oldest prompts' host leaves go whole, FULL included."""
    s, rep = _replays("sglang_39436")
    assert s["host_tokens"] == 2680896
    h = s["hybrid"]
    assert h["aux_capacity"] == 228                       # mamba_full_memory_ratio 0.9
    assert h["host_states"] == 565 and h["host_states_used"] == 565
    assert h["state_backups"] == 624                      # 600 in the fill, 24 re-inserted
    assert s["backup_failures"] == 0
    assert len(rep) == 8
    assert (rep["host_hit_tokens"] == 0).all()            # 0 of 8 replays hit the host
    assert (rep["miss_tokens"] == 8448).all()
    assert h["host_hits_with_state"] == h["state_loads"] == 0


def test_39436_734_host_state_slots_give_8_of_8_host_hits():
    s, rep = _replays("sglang_39436", "host.mamba_states=734")
    h = s["hybrid"]
    assert h["host_states"] == 734 and h["state_host_frees"] == 0
    assert h["host_states_used"] == h["state_backups"] == 600   # 200 prompts x 3 checkpoints
    assert (rep["host_hit_tokens"] == 8192).all()         # 8 of 8, 8,192 tokens from host
    assert h["host_hits_with_state"] == 8


@pytest.mark.parametrize("slots,host_hit", [(597, 0), (598, 4096), (599, 8192)])
def test_39436_the_cutoff_under_write_through(slots, host_hit):
    """A replay needs its 8,192 state: one slot short of 600 drops only the oldest
    prompt's last node, two its last two, three all of it, and each missed replay's
    re-insert evicts the next prompt's nodes as the first miss did."""
    _, rep = _replays("sglang_39436", f"host.mamba_states={slots}")
    assert (rep["host_hit_tokens"] == host_hit).all()


def test_39436_write_back_needs_a_small_device_state_pool_to_go_inert():
    """Under write_back a state reaches the host only at its device eviction: with the
    default 228 device slots 483 do, fewer than 565, and all 8 replays hit; with 16
    device slots nearly every state does, and 565 slots give 0 of 8."""
    s, rep = _replays("sglang_39436", "cache.write_policy=write_back")
    assert s["hybrid"]["state_backups"] == 483
    assert (rep["host_hit_tokens"] == 8192).all()
    s, rep = _replays("sglang_39436", "cache.write_policy=write_back",
                      "device.max_mamba_cache_size=16")
    assert s["hybrid"]["state_host_frees"] > 0
    assert (rep["host_hit_tokens"] == 0).all()


def test_33713_under_write_through_the_sentinel_state_is_backed_up_and_loads_back():
    """The report's write_through on 0.5.23: each of the sentinel's checkpoints is a new
    leaf backed up at its insert with its state, so the state is on host and the
    replay loads it back (not the report's 0 host hits, v0.5.19)."""
    s, rep = _replays("sglang_33713", first=91)
    assert s["device_tokens"] == 375755 and s["host_tokens"] == 1136724
    h = s["hybrid"]
    assert h["aux_capacity"] == 55 and h["host_states"] == 170
    assert h["state_host_frees"] == 0                  # the host pools never filled
    assert h["state_backups"] == 94                    # every checkpoint, at its insert
    (sentinel,) = rep.itertuples()
    assert sentinel.input_tokens == 32727
    assert sentinel.device_hit_tokens == 0             # pushed off the device by the noise
    assert sentinel.host_hit_tokens == 24576           # its state at the 24,576 chunk end
    assert sentinel.load_back_tokens == 24576
    assert h["host_hits_with_state"] == 1 and h["state_loads"] == 1


@pytest.mark.parametrize("policy,backups,host_hit", [("write_back", 52, 24576),
                                                      ("write_through_selective", 0, 0)])
def test_33713_under_the_other_policies(policy, backups, host_hit):
    """write_back backs the sentinel's states up at their device evictions (the same
    24,576 host tokens); write_through_selective backs nothing up (no node is inserted
    twice before the replay), so the sentinel gets 0 host hits as in the report, by
    another mechanism."""
    s, rep = _replays("sglang_33713", f"cache.write_policy={policy}", first=91)
    assert s["hybrid"]["state_backups"] == backups
    (sentinel,) = rep.itertuples()
    assert sentinel.host_hit_tokens == sentinel.load_back_tokens == host_hit


def test_the_hybrid_regressions_decode_fast_path_is_exact(tmp_path):
    """The decode fast path against one step per iteration on the hybrid regression
    scenarios (tests/test_scheduler.py's property, on these traces)."""
    import filecmp

    for name in ("sglang_39436", "sglang_33713"):
        scn = load_scenario(REG / f"{name}.yaml")
        fast, plain = tmp_path / f"{name}_fast", tmp_path / f"{name}_plain"
        run_scenario(scn, fast)
        run_scenario(load_scenario(REG / f"{name}.yaml", [STEP_BY_STEP]), plain)
        names = sorted(p.name for p in fast.iterdir() if p.is_file())
        assert names == sorted(p.name for p in plain.iterdir() if p.is_file())
        _, mismatch, errors = filecmp.cmpfiles(fast, plain, names, shallow=False)
        assert not mismatch and not errors, name


# ------------------------------------------------------------ TP classes (docs/TP.md)
def outcome(name, *sets, steps=None):
    res = run_scenario(load_scenario(REG / f"{name}.yaml", list(sets)), None,
                       record_steps=None if steps is None else str(steps))
    return res.divergence


def test_28429_a_subset_alloc_failure_never_hangs_0523s_cache_sync():
    """The report: write_backup returns 0 on a subset, ongoing_write_through diverges,
    writing_check hangs. Under 0.5.23's MIN-synced checks the fault fires on rank 1
    alone and the ranks' host pools drift apart, yet no rank ever waits in a cache
    sync: whatever blocks later is not the sync."""
    d = outcome("sglang_28429")
    f, = d["faults"]
    assert f["rank"] == 1 and f["fired"] == 1
    o = d["outcome"]
    assert o["first_free_difference"]["differs"].get("host_free")
    assert o["first_free_difference"]["step"] >= f["fired_at"]
    sync_sites = {"sync", "write_check", "load_check"}
    if o["class"] == "hang":
        assert o["site"] not in sync_sites
        assert all(r["pending"]["site"] not in sync_sites for r in o["ranks"].values())


def test_26921_the_early_return_hangs_the_cache_sync():
    """Under the pre-fix code (a named older version) the same fault leaves rank 1 with
    no write in flight: it returns early from writing_check while rank 0 waits in the
    all_reduce alone, the report's hang; 0.5.23's discipline takes it away."""
    d = outcome("sglang_26921")
    o = d["outcome"]
    assert o["class"] == "hang" and o["site"] == "write_check"
    assert o["ranks"]["0"]["pending"]["site"] == "write_check"
    assert o["ranks"]["1"]["pending"]["site"] != "write_check"   # it returned early
    fixed = outcome("sglang_26921", "collective.discipline=synced")["outcome"]
    assert not (fixed["class"] == "hang" and fixed["site"] == "write_check")


def test_1467_unagreed_pools_make_hits_differ_after_an_eviction_difference():
    d = outcome("lmcache_1467")
    assert d["perturbations"]["device_capacity_skew"] > 0
    first, shape = d["first_true_divergence"], d["shape_divergence"]
    assert first["what"] == "tree contents differ"      # an eviction went otherwise
    # then a request served on a cached-prefix hit on rank 0 is not matched alike on 1
    assert shape is not None and shape["step"] > first["step"]
    req = shape["first_request"]
    assert req["rank0_prefix_extend"][0] > 0 and req["prefix_extend"] != req["rank0_prefix_extend"]
    agreed = outcome("lmcache_1467", "jitter.device_capacity_skew={}")
    assert agreed["verdict"] == "agree" and agreed["first_true_divergence"] is None


def test_33442_a_late_free_changes_an_eviction_before_any_load_back():
    for k in (1, 2):
        d = outcome("sglang_33442", f"seed={k}")
        assert d["perturbations"]["device_free_delay"] > 0
        first = d["first_true_divergence"]
        assert first["what"] == "tree contents differ"
        shape = d["shape_divergence"]
        assert shape is None or shape["step"] >= first["step"]
        assert d["verdict"] != "size_mismatch" or d["collective_error"]["step"] > first["step"]
    on_time = outcome("sglang_33442", "seed=1", "jitter.device_free_delay.ranks=[]")
    assert on_time["verdict"] == "agree"
