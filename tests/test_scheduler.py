"""The scheduler (sim/scheduler.py): admission, allocation, retraction and recency as
SGLang 0.5.23's scheduler does them, observed through the engine's op-traces and trees."""

import filecmp
import json
from unittest.mock import patch

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from conftest import ROOT, STEP_BY_STEP
from sim import constants as C
from sim.config import SimConfig
from sim.events import Simulation
from sim.runner import run_scenario
from sim.scenario import load_scenario
from sim.scheduler import (SchedState, page_ceil, ratio_after_retract, retraction_order,
                           steps_without_event)
from sim.steprec import StepRecorder, read_records
from sim.workloads.base import Request

from test_engine import chat_stream


def req(rid, t, first_block, n_blocks, block, input_len, output_len):
    return Request(rid, t, tuple(range(first_block, first_block + n_blocks)), block,
                   input_len, output_len, rid)


def run(cfg, stream):
    sim = Simulation(cfg, stream)
    sim.run()
    return sim


def ops_of(sim, cohort=0):
    return sim.group.cohorts[cohort].ops


# ------------------------------------------------------------------ admission
def test_a_batch_evicts_once_for_all_its_requests_after_every_match():
    """`alloc_for_extend`: one eviction of extend tokens plus a page per request, after
    the whole batch was admitted; nothing is reserved at admission."""
    ps = 4
    cfg = SimConfig(page_size=ps, device_tokens=64, host_tokens=0, record_ops=True, ids="optrace",
                    chunked_prefill_tokens=None)
    stream = [req(0, 0.0, 0, 10, ps, 40, 1),      # fills 40 of 64 tokens, then finishes
              req(1, 1.0, 100, 3, ps, 12, 1),
              req(2, 1.0, 200, 3, ps, 12, 1)]
    ops = ops_of(run(cfg, stream))
    i = next(k for k, op in enumerate(ops) if op.get("id") == "q1")
    j = next(k for k in range(i, len(ops)) if ops[k]["op"] == "insert")
    assert [(op["op"], op.get("id"), op.get("n")) for op in ops[i:j]] == [
        ("lock", "q1", None), ("lock", "q2", None),
        # 24 extend tokens + 2 pages, 24 free: one eviction of 8
        ("evict_device", None, 8)]
    assert all(op["reserved"] % ps == 0 for op in ops)
    # the match stops a token short of the input: 11 tokens, 2 whole pages
    assert ops[i]["key"] == [100, 101]


def test_the_request_that_does_not_fit_is_matched_and_unpinned():
    """`init_next_round_input` matches the head before `add_one_req` rejects it; its
    pin is dropped and it waits (`batch_is_full`) until a running request leaves."""
    ps = 4
    cfg = SimConfig(page_size=ps, device_tokens=128, host_tokens=0, record_ops=True,
                    chunked_prefill_tokens=None)
    stream = [req(0, 0.0, 0, 10, ps, 40, 60),     # decodes for a while
              req(1, 0.01, 100, 20, ps, 80, 1)]   # 80 + 1 + 4 does not fit beside it
    sim = run(cfg, stream)
    ops = ops_of(sim)
    tries = [k for k, op in enumerate(ops) if op.get("id") == "q1"]
    assert ops[tries[0]]["op"] == "lock" and ops[tries[0] + 1] == {**ops[tries[0] + 1], "op": "unlock", "id": "q1"}
    # refused once, then not retried while the batch is full (no arrival, no finish)
    first_insert_of_0 = next(k for k, op in enumerate(ops) if op["op"] == "insert" and k > tries[0])
    assert [k for k in tries if k < first_insert_of_0] == tries[:2]
    assert sim.metrics.done == 2


def test_the_budget_is_checked_before_any_load_back():
    """`add_one_req` checks `check_prefill` with the host hit counted as extend before
    `init_load_back`: a refused request never starts a load. Observed on SGLang's own
    replay outputs: locks whose match had a host tail and were released unloaded."""
    from sim.optrace import Replayer, engine_ops_to_trace

    deferred_host_hits = loads = 0
    for seed in range(6):
        cfg = SimConfig(page_size=16, device_tokens=40 * 16, host_tokens=200 * 16,
                        load_back_threshold=1, record_ops=True, seed=seed, max_running=8,
                        chunked_prefill_tokens=None)
        sim = run(cfg, chat_stream(160, seed, sessions=4, rate=40.0))
        ops = ops_of(sim)
        trace = engine_ops_to_trace(ops, device_capacity=cfg.device_tokens,
                                    host_capacity=cfg.host_tokens, page_size=16,
                                    write_policy="write_back", load_back_threshold=1,
                                    ids=cfg.ids)
        rep = Replayer(trace[0])
        outs = [rep.apply(i, op) for i, op in enumerate(trace[1:], 1)]
        for k, (op, out) in enumerate(zip(ops, outs)):
            if op["op"] == "load_back":
                loads += 1
                # a started load always belongs to an admitted request
                assert out.get("started") is not False or out.get("reason")
                nxt = ops[k + 1]
                if out.get("started"):
                    assert nxt["op"] == "lock" and nxt["id"] == op["id"].replace("r", "q", 1) + ".l"
            if op["op"] == "lock" and out["host_len"] > 0 and ops[k + 1]["op"] == "unlock" \
                    and ops[k + 1]["id"] == op["id"]:
                deferred_host_hits += 1
    assert loads > 0 and deferred_host_hits > 0


def test_every_32nd_priority_pass_touches_128_waiting_prefixes_head_last():
    ps = 4
    cfg = SimConfig(page_size=ps, device_tokens=1 << 14, host_tokens=0, record_ops=True)
    sim = Simulation(cfg, [])
    for rid in range(200):
        sim.submit(req(rid, 0.0, 1000 * rid, 3, ps, 12, 4))
    c = sim.group.cohorts[0]
    touched = []
    for call in range(C.WAITING_PREFIX_REFRESH_INTERVAL + 1):
        before = len(c.ops)
        sim._calc_priority(c)
        touched.append(c.ops[before:])
    first = touched[0]
    assert [op["op"] for op in first] == ["match"] * C.WAITING_QUEUE_PREFIX_MATCH_MAX
    # head last, so LRU evicts in reverse admission order; the whole prompt is touched
    assert [op["key"][0] // 1000 for op in first] == list(range(127, -1, -1))
    assert first[-1]["key"] == [0, 1, 2]
    assert all(not t for t in touched[1:-1]) and touched[-1] == first
    assert c.sched.priority_calls == C.WAITING_PREFIX_REFRESH_INTERVAL + 1


# ------------------------------------------------------------------ results
@pytest.mark.parametrize("eviction_policy", ["lru", "priority"])
def test_a_finished_request_splits_its_leaf_at_the_prompt(eviction_policy):
    """`checkpoint_into_tree` re-inserts the prompt at priority + 1: the output pages
    become their own leaf, which the priority policy evicts before the prompt."""
    ps = 4
    cfg = SimConfig(page_size=ps, device_tokens=256, host_tokens=0, record_ops=True,
                    eviction_policy=eviction_policy)
    sim = run(cfg, [req(0, 0.0, 0, 5, ps, 20, 13)])  # committed 20 + 12: 8 pages
    ops = ops_of(sim)
    inserts = [op for op in ops if op["op"] == "insert"]
    assert inserts[-1] == {**inserts[-1], "key": [0, 1, 2, 3, 4], "priority": 1}
    assert len(inserts[-2]["key"]) == 8 and "priority" not in inserts[-2]
    tree = sim.group.cohorts[0].tree
    leaf = next(iter(tree.d_leaves))
    assert leaf.parent.parent is tree.root and len(leaf.parent.key) == 5 and len(leaf.key) == 3
    assert (leaf.parent.priority, leaf.priority) == (1, 0)
    if eviction_policy == "priority":
        tree.evict_device(ps)
        assert tree.device_prefix_len([0, 1, 2, 3, 4]) == 5  # the prompt stays


# ------------------------------------------------------------------ decode
def test_decode_allocates_page_by_page_and_the_tree_takes_what_it_caches():
    """Running requests hold whole pages outside the tree (`reserved`), allocated as
    their committed length crosses a page; at the end the committed sequence's whole
    pages pass to the tree and the partial page is freed."""
    ps = 4
    cfg = SimConfig(page_size=ps, device_tokens=256, host_tokens=0, record_ops=True)
    sim = Simulation(cfg, [req(0, 0.0, 0, 3, ps, 10, 9)])
    seen = []
    orig = sim._decode

    def spy():
        rq = sim.running[0]
        seen.append((rq.kv, sim.group.cohorts[0].tree.reserved))
        return orig()

    sim._decode = spy
    sim._decode_headroom = lambda limit: 0  # one step per iteration
    sim.run()
    # 10 input tokens: 3 pages allocated, 2 in the tree, 1 held; each step at kv % 4 == 0
    assert seen == [(kv, page_ceil(kv, ps) - 8) for kv in range(10, 18)]
    tree = sim.group.cohorts[0].tree
    assert tree.reserved == 0 and tree.dev_used == 16  # committed 18 tokens: 4 whole pages


PRESSURED = ["workload.num_requests=150", "workload.arrival.rate=20",
             "scheduler.max_running_requests=64", "workload.output_tokens.mean=800"]


def pressured(*extra):
    return load_scenario(ROOT / "scenarios" / "quickstart.yaml", PRESSURED + list(extra))


def test_retraction_under_pressure_still_finishes_everything():
    """Decode memory pressure on the time clock: requests are retracted, every one of
    them still finishes (none aborted), and no reservation is left behind."""
    res = run_scenario(pressured(), None)
    s = res.summary
    assert s["retracted_requests"] > 0
    assert s["requests"] == 150 and s["aborted_requests"] == 0
    for c in res.sim.instances[0].group.cohorts if hasattr(res.sim, "instances") else res.sim.group.cohorts:
        assert c.tree.reserved == 0


# The server harness's retraction cases (tests/test_server_engine.py), whose step
# records the engine reproduces step for step: 64 requests, retracting only under
# SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION=64.
SERVER = ROOT / "data" / "conformance" / "server_engine"


class _RatioRecorder(StepRecorder):
    """The run's step recorder, also noting the new-token ratio of each replica as a
    retracting step's batch decodes (what `retract_decode` recalibrated it to; these
    cases set ignore_eos, under which no admission reads it)."""

    made: list = []

    def __init__(self, tp: int):
        super().__init__(tp)
        self.ratios: dict[int, set] = {}
        _RatioRecorder.made.append(self)

    def decode(self, cohorts, batch) -> None:
        super().decode(cohorts, batch)
        for c in cohorts:
            if self.rec(c).get("retracted"):
                self.ratios.setdefault(self.step, set()).add(c.sched.ratio)


class _Kept:
    """A kept request as `ratio_after_retract` reads it: its outputs, its lengths."""

    def __init__(self, outputs: int, input_len: int, output_len: int):
        self.generated = outputs
        self.r = type("r", (), {"input_len": input_len, "output_len": output_len})


@pytest.mark.parametrize("case", ["w3_wt_clip64", "w3_wt_clip64_overlap"])
def test_retraction_requeues_the_fewest_outputs_and_everything_still_finishes(case, tmp_path):
    """`retract_decode`, read from the run's step records (``--record-steps``): the
    requests a step releases are the least preferred of its batch (fewest outputs,
    then longest input); each goes to the back of the queue (until it is admitted
    again, no request that was already waiting is tried after it) keeping its outputs
    (its next prefill ends at its input plus those outputs), the new-token ratio is
    recalibrated over the requests kept (`estimate_new_token_ratio_after_retract`),
    and every request still finishes. A request's outputs are its steps that made a
    token: each decode step and the prefill that completes it. Under the overlap loop the previous step's
    token is still in flight, not among its outputs yet (`output_ids`), and a
    retracted request loses it."""
    scn = load_scenario(str(SERVER / f"{case}.yaml"))
    rows = [json.loads(line) for line in (SERVER / "w3_retract.jsonl").read_text().splitlines()]
    inp = {f"r{i}": r["input_len"] for i, r in enumerate(rows)}
    arrived = {f"r{i}": r["arrival_step"] for i, r in enumerate(rows)}
    out_len = {f"r{i}": r["output_len"] for i, r in enumerate(rows)}
    with patch("sim.runner.StepRecorder", _RatioRecorder):
        res = run_scenario(scn, None, record_steps=str(tmp_path / "steps.jsonl"))
    ratios = _RatioRecorder.made.pop().ratios
    steps, reqs = read_records(tmp_path / "steps.jsonl")
    overlap = scn.scheduler.overlap
    order = sorted(steps)
    made, last, refill, retracted = {}, set(), {}, []
    for s in order:
        d = steps[s]
        gone = [r for g in d["retracted"] for r in g]
        if gone:
            kept = d.get("rids", [])
            outs = {r: made[r] - (overlap and r in last) for r in gone + kept}
            key = lambda r: (outs[r], -inp[r])  # noqa: E731
            assert not kept or max(map(key, gone)) <= min(map(key, kept)), s
            if kept:
                stand_ins = [_Kept(outs[r], inp[r], out_len[r]) for r in kept]
                assert ratios.pop(s) == {ratio_after_retract(stand_ins)}, s
            for r in gone:
                made[r] = outs[r]  # the token in flight is dropped
                refill[r] = inp[r] + outs[r]
                retracted.append((s, r))
        now = set()
        if d.get("mode") == "decode":
            now = set(d["rids"])
        elif d.get("mode") == "extend":
            for r, prefix, extend in zip(d["rids"], d["prefix"], d["extend"]):
                if r != d["chunked"]:
                    now.add(r)
                    if r in refill:
                        assert prefix + extend == refill.pop(r), (s, r)
        for r in now:
            made[r] = made.get(r, 0) + 1
        last = now
    assert retracted and not refill  # each retracted request was prefilled again
    assert not ratios
    for s, r in retracted:
        waiting = {q for q in reqs if arrived[q] <= s < reqs[q]["first_sched_step"]}
        for s2 in order[order.index(s) + 1:]:
            d = steps[s2]
            tried = [a[0] for a in d["adds"]]
            if r in tried:
                behind = tried[tried.index(r) + 1:]
                assert not [q for q in behind if q in waiting
                            and reqs[q]["first_sched_step"] >= s2], (s, s2, r)
            if d.get("mode") == "extend" and r in d["rids"]:
                break
    s = res.summary
    assert s["retracted_requests"] == len(retracted)
    assert s["requests"] == len(rows) and s["aborted_requests"] == 0
    for c in res.sim.group.cohorts if hasattr(res.sim, "group") else res.sim.instances[0].group.cohorts:
        assert c.tree.reserved == 0


def test_retraction_order_and_the_ratio_estimate_follow_sglang():
    class R:
        def __init__(self, gen, inp, out):
            self.generated = gen
            self.r = type("r", (), {"input_len": inp, "output_len": out})

    batch = [R(5, 100, 50), R(2, 100, 50), R(2, 300, 50), R(9, 10, 50)]
    # most preferred to keep first: most outputs, then shortest input; stable on ties
    assert retraction_order(batch) == [3, 0, 1, 2]
    kept = batch[:2]
    assert ratio_after_retract(kept) == min(1.0, (7 + 2 * C.RETRACT_DECODE_STEPS) / 101)
    s = SchedState(1.0)
    assert (s.ratio, s.ratio_min) == (0.7, 0.7 * 0.14)
    s.decay(10**6)
    assert s.ratio == s.ratio_min
    s2 = SchedState(1.0)
    for _ in range(37):
        s2.decay(1)
    s3 = SchedState(1.0)
    s3.decay(37)
    assert s2.ratio == s3.ratio  # a run decays as its steps would, bit for bit


@settings(max_examples=200, deadline=None)
@given(avail=st.integers(0, 4000), ps=st.sampled_from([1, 2, 4, 16, 64]),
       kvs=st.lists(st.integers(1, 500), min_size=1, max_size=12), evictable=st.booleans(),
       limit=st.integers(1, 400))
def test_the_first_memory_event_matches_stepping(avail, ps, kvs, evictable, limit):
    phases = [0] * ps
    for kv in kvs:
        phases[kv % ps] += 1
    b = len(kvs)
    a, j, kv = avail, 0, list(kvs)
    while j < limit:
        need = ps * sum(1 for x in kv if x % ps == 0)
        if a < need or (evictable and a < b * ps):
            break
        a -= need
        kv = [x + 1 for x in kv]
        j += 1
    assert steps_without_event(avail, evictable, phases, b, ps, limit) == j


# ------------------------------------------------------------------ fast path
FAST_PATH_SCENARIOS = ["quickstart", "capacity_wb_vs_wt", "storage_mooncake", "storage_slow_rank",
                       "storage_buffer_only",
                       "hybrid_mamba", "hybrid_swa", "hybrid_swa_host", "regressions/sglang_34519",
                       "regressions/sglang_40512"] + sorted(
    p.stem for p in (ROOT / "scenarios").glob("jitter_*.yaml"))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), name=st.sampled_from(FAST_PATH_SCENARIOS))
def test_decode_runs_write_what_a_step_by_step_loop_writes(seed, name, tmp_path_factory):
    """The decode fast path (runs of steps priced at once, stopped before a step that
    evicts or retracts) against one step per iteration: byte-identical results."""
    sets = ["workload.num_requests=60", f"seed={seed}"]
    scn = load_scenario(ROOT / "scenarios" / f"{name}.yaml", sets)
    fast = tmp_path_factory.mktemp("fast") / "r"
    run_scenario(scn, fast)
    plain = tmp_path_factory.mktemp("plain") / "r"
    run_scenario(load_scenario(ROOT / "scenarios" / f"{name}.yaml", sets + [STEP_BY_STEP]), plain)
    names = sorted(p.name for p in fast.iterdir())
    assert names == sorted(p.name for p in plain.iterdir())
    match, mismatch, errors = filecmp.cmpfiles(fast, plain, [n for n in names if (fast / n).is_file()],
                                               shallow=False)
    assert not mismatch and not errors


# ------------------------------------------------------------------ knobs
def test_conservativeness_and_max_prefill_tokens_change_the_run():
    ref = run_scenario(pressured(), None).summary
    careful = run_scenario(pressured("scheduler.schedule_conservativeness=3"), None).summary
    assert 0 < careful["retracted_requests"] < ref["retracted_requests"]
    small = run_scenario(pressured("scheduler.max_prefill_tokens=512",
                                   "scheduler.chunked_prefill_tokens=null"), None).summary
    nochunk = run_scenario(pressured("scheduler.chunked_prefill_tokens=null"), None).summary
    assert small["ttft_p50_s"] != nochunk["ttft_p50_s"]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), page=st.sampled_from([1, 4, 16]),
       dev_pages=st.integers(30, 120), policy=st.sampled_from(["write_back", "write_through"]),
       chunk=st.sampled_from([None, 64, 256]), tp=st.integers(1, 3))
def test_every_replica_holds_exactly_its_running_requests_pages(seed, page, dev_pages, policy,
                                                                chunk, tp):
    """At every iteration, each replica's pages outside the tree are exactly its live
    requests' whole pages past what the tree owns (plus frees still in flight)."""
    cfg = SimConfig(tp=tp, page_size=page, device_tokens=dev_pages * 16, host_tokens=4000,
                    write_policy=policy, chunked_prefill_tokens=chunk, seed=seed,
                    load_back_threshold=1, max_running=12)
    sim = Simulation(cfg, chat_stream(90, seed, sessions=5, rate=60.0))
    checked = [0]
    orig = sim._sync

    def check():
        for c in sim.group.cohorts:
            held = 0
            for rq in sim._live():
                slot = rq.slots.get(id(c))
                if slot is not None:
                    kv = rq.kv if rq in sim.running else slot.done
                    held += page_ceil(kv, page) - slot.in_tree
            assert c.tree.reserved == held + c.kv.late
            assert c.tree.reserved % page == 0
            assert c.tree.dev_used + c.tree.reserved <= c.tree.device_capacity
        checked[0] += 1
        orig()

    sim._sync = check
    sim.run()
    assert checked[0] > 0 and sim.finished
    assert sim.metrics.done + sim.metrics.rejected + sim.metrics.aborted == 90
