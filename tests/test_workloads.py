"""Workload generators and page keys: determinism, structure, reuse statistics."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.errors import UserError
from sim.scenario import scenario_from_dict
from sim.workloads import WORKLOADS, IdSpace, build_workload, output_key, page_key
from sim.workloads.keys import page_units

BASE = {
    "name": "t",
    "model": {"preset": "llama-3.1-8b"},
    "tp": 1,
    "page_size": 16,
    "device": {"tokens": 65536},
}


def scenario(workload: dict, seed: int = 0, **top):
    return scenario_from_dict({**BASE, "seed": seed, "workload": workload, **top})


def stream(workload: dict, seed: int = 0, **top):
    return list(build_workload(scenario(workload, seed, **top)))


def check_stream(reqs):
    """The Request contract: rid order, arrival order, block counts, prefix semantics."""
    last = 0.0
    parent: dict[int, int] = {}  # block id -> the id before it (-1 at the root)
    for i, r in enumerate(reqs):
        assert r.rid == i
        assert r.arrival >= last
        last = r.arrival
        assert r.input_len >= 1 and r.output_len >= 0
        assert len(r.blocks) == math.ceil(r.input_len / r.block_size)
        prev = -1
        for b in r.blocks:
            assert b >= 0
            # prefix semantics: an id always follows the same predecessor
            assert parent.setdefault(b, prev) == prev
            prev = b


def reused_blocks(reqs) -> int:
    seen: set[int] = set()
    n = 0
    for r in reqs:
        for b in r.blocks:
            n += b in seen
            seen.add(b)
    return n


# -- page keys -------------------------------------------------------------------------


def test_page_key_pages_inside_blocks():
    # block 64, page 16: four pages per block; the partial tail page is dropped
    assert page_key((7, 9), 64, 16, 100) == [28, 29, 30, 31, 36, 37]
    assert page_key((7, 9), 64, 16, 128) == [28, 29, 30, 31, 36, 37, 38, 39]
    assert page_key((7, 9), 64, 16, 15) == []


def test_page_key_equal_sizes_and_large_pages():
    assert page_key((3, 5, 8), 64, 64, 150) == [3, 5]
    # page 128 over 64-token blocks: a page is named by its last block's prefix id
    assert page_key((3, 5, 8, 13), 64, 128, 250) == [5]
    assert page_key((3, 5, 8, 13), 64, 128, 256) == [5, 13]


@given(blocks=st.lists(st.integers(0, 2**40), min_size=1, max_size=12),
       r=st.sampled_from([2, 4, 16, 64]), cut=st.integers(0, 64))
def test_page_key_pages_of_blocks_are_each_block_id_times_r_plus_j(blocks, r, cut):
    # page j of block b is b * r + j, in block order; the tail past input_len is cut
    ps = 1
    bs = r * ps
    input_len = max(0, len(blocks) * bs - cut)
    want = [b * r + j for b in blocks for j in range(r)][:input_len // ps]
    assert page_key(blocks, bs, ps, input_len) == want


@pytest.mark.parametrize("bs,ps", [(64, 48), (48, 64), (0, 16), (16, 0)])
def test_page_key_rejects_sizes_that_do_not_divide(bs, ps):
    with pytest.raises(UserError) as e:
        page_key((1, 2), bs, ps, 10_000)
    assert "\n" not in str(e.value)


def test_page_key_rejects_too_few_blocks():
    with pytest.raises(UserError):
        page_key((1,), 64, 16, 200)


@given(reqs=st.lists(st.tuples(st.sampled_from([1, 4, 16, 64, 128, 512]), st.integers(0, 1100),
                                st.integers(0, 2)), max_size=8),
       ps=st.sampled_from([1, 4, 16, 64, 128]), seed=st.integers(0, 2**16))
def test_page_units_is_page_key_of_each_request(reqs, ps, seed):
    """The planner's bulk keying (one flat array) against page_key request by request:
    the same ids in the same order, or the same error for the first bad request."""
    rng = np.random.default_rng(seed)
    rows = []
    for bs, n_in, short in reqs:
        n_blocks = max(-(-n_in // bs) - short, 0)  # short > 0: too few blocks, sometimes
        rows.append((rng.integers(0, 10**6, n_blocks).tolist(), bs, n_in))
    flat = [b for blocks, _, _ in rows for b in blocks]
    try:
        want = [page_key(blocks, bs, ps, n_in) for blocks, bs, n_in in rows]
    except UserError as err:
        with pytest.raises(UserError) as got:
            page_units(flat, [len(b) for b, _, _ in rows], [bs for _, bs, _ in rows], ps,
                       [n for _, _, n in rows])
        assert str(got.value) == str(err)
        return
    units, starts = page_units(flat, [len(b) for b, _, _ in rows], [bs for _, bs, _ in rows], ps,
                               [n for _, _, n in rows])
    assert units.dtype == np.int64 and len(starts) == len(rows) + 1
    assert [units[starts[i]:starts[i + 1]].tolist() for i in range(len(rows))] == want


@given(reqs=st.lists(st.tuples(st.integers(0, 1100), st.integers(0, 3)), max_size=10),
       bs_ps=st.sampled_from([(64, 16), (512, 64), (128, 16), (32, 16), (16, 16)]),
       seed=st.integers(0, 2**16))
def test_page_units_of_one_block_size_is_page_key_of_each_request(reqs, bs_ps, seed):
    """One block size of several pages (the Mooncake traces), which page_units keys
    block by block: page_key's ids request by request, with a request's last block
    cut short, requests of no page, and more blocks than its pages use."""
    bs, ps = bs_ps
    rng = np.random.default_rng(seed)
    rows = []
    for n_in, extra in reqs:
        rows.append((rng.integers(0, 10**6, -(-n_in // bs) + extra).tolist(), n_in))
    want = [page_key(blocks, bs, ps, n_in) for blocks, n_in in rows]
    units, starts = page_units([b for blocks, _ in rows for b in blocks], [len(b) for b, _ in rows],
                               [bs] * len(rows), ps, [n for _, n in rows])
    assert units.dtype == np.int64 and starts.tolist()[-1] == len(units)
    assert [units[starts[i]:starts[i + 1]].tolist() for i in range(len(rows))] == want


@given(
    shared=st.integers(0, 6),
    tail_a=st.integers(0, 5),
    tail_b=st.integers(0, 5),
    bs_ps=st.sampled_from([(64, 1), (64, 16), (64, 64), (16, 64), (32, 128)]),
    extra_a=st.integers(0, 63),
)
def test_page_keys_share_exactly_the_shared_prefix(shared, tail_a, tail_b, bs_ps, extra_a):
    """Two requests sharing m prefix blocks share exactly the full pages inside them."""
    bs, ps = bs_ps
    ids = IdSpace()
    common = tuple(ids.new_range(shared))
    a = common + tuple(ids.new_range(tail_a))
    b = common + tuple(ids.new_range(tail_b))
    len_a = max(1, len(a) * bs - (extra_a % bs if a else 0))
    ka = page_key(a, bs, ps, min(len_a, len(a) * bs))
    kb = page_key(b, bs, ps, len(b) * bs)
    n_common = 0
    for x, y in zip(ka, kb):
        if x != y:
            break
        n_common += 1
    full_a = min(len_a, len(a) * bs) // ps
    expect = min(shared * bs // ps, full_a, len(kb))
    assert n_common == expect
    assert len(set(ka)) == len(ka)  # no two pages of one request collide


@given(
    rids=st.lists(st.integers(0, 10**6), min_size=1, max_size=5, unique=True),
    n_in=st.integers(1, 5000),
    n_out=st.integers(0, 5000),
    ps=st.sampled_from([1, 16, 64]),
)
def test_output_pages_never_collide(rids, n_in, n_out, ps):
    bs = 64
    ids = IdSpace()
    blocks = tuple(ids.new_range(math.ceil(n_in / bs)))
    inputs = set(page_key(blocks, bs, ps, n_in))
    seen: set[int] = set()
    for rid in rids:
        out = output_key(rid, n_in, n_out, ps)
        assert len(out) == (n_in + n_out) // ps - n_in // ps
        assert all(o < 0 for o in out)
        assert not (set(out) & inputs) and not (set(out) & seen)
        assert len(set(out)) == len(out)
        seen |= set(out)


# -- generators ------------------------------------------------------------------------

KINDS = {
    "multi_turn_chat": {"kind": "multi_turn_chat", "num_requests": 400,
                        "arrival": {"process": "poisson", "rate": 5.0}},
    "agentic_tool_loop": {"kind": "agentic_tool_loop", "num_requests": 400,
                          "arrival": {"process": "bursty", "rate": 2.0, "cv": 3.0}},
    "few_shot": {"kind": "few_shot", "num_requests": 400},
    "zipf_documents": {"kind": "zipf_documents", "num_requests": 400},
    "uniform": {"kind": "uniform", "num_requests": 400},
}


def test_every_generator_kind_is_registered():
    assert set(KINDS) | {"trace", "mix"} == set(WORKLOADS)


@pytest.mark.parametrize("kind", sorted(KINDS))
@given(seed=st.integers(0, 2**63 - 1))
def test_generators_are_deterministic_per_seed(kind, seed):
    a = stream(KINDS[kind], seed)
    b = stream(KINDS[kind], seed)
    assert a == b
    check_stream(a)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_generators_depend_on_the_seed(kind):
    assert stream(KINDS[kind], 1) != stream(KINDS[kind], 2)


def test_stream_is_reiterable_and_identical():
    w = build_workload(scenario(KINDS["multi_turn_chat"], 5))
    assert list(w) == list(w)


def test_uniform_control_has_no_reuse():
    reqs = stream({"kind": "uniform", "num_requests": 2000})
    assert reused_blocks(reqs) == 0
    assert len(reqs) == 2000


def test_few_shot_shared_prefix_ratio_matches_parameters():
    # 4 templates of exactly 2048 tokens (32 blocks of 64), 100-token suffixes.
    n = 1000
    reqs = stream({"kind": "few_shot", "num_requests": n, "num_templates": 4,
                   "template_tokens": 2048, "suffix_tokens": 100})
    check_stream(reqs)
    firsts = Counter(r.blocks[0] for r in reqs)
    assert len(firsts) == 4  # every request starts with one of the 4 templates
    # every block of a template is shared after that template's first use; suffix
    # blocks never are: exactly (n - 4) * 32 reused blocks
    assert reused_blocks(reqs) == (n - 4) * 32
    shared_tokens = sum(32 * 64 for _ in reqs[4:])
    ratio = shared_tokens / sum(r.input_len for r in reqs[4:])
    assert ratio == pytest.approx(2048 / 2148)
    # uniform popularity: each template near n/4
    assert all(abs(c - n / 4) < 0.2 * n / 4 for c in firsts.values())


def test_few_shot_zipf_popularity_is_skewed():
    reqs = stream({"kind": "few_shot", "num_requests": 4000, "num_templates": 8,
                   "template_zipf_s": 1.5, "template_tokens": 640})
    counts = sorted(Counter(r.blocks[0] for r in reqs).values(), reverse=True)
    assert counts[0] > 4 * counts[-1]


def _doc_frequencies(zipf_s: float, n: int = 20000, docs: int = 200, seed: int = 3):
    reqs = stream({"kind": "zipf_documents", "num_requests": n, "num_documents": docs,
                   "zipf_s": zipf_s, "system_prompt_tokens": 256,
                   "document_tokens": 1024, "question_tokens": 32,
                   "arrival": {"process": "poisson", "rate": 100.0}}, seed)
    check_stream(reqs)
    # with a 256-token instruction (4 blocks), block 4 is the document's first block
    return sorted(Counter(r.blocks[4] for r in reqs).values(), reverse=True)


@pytest.mark.parametrize("zipf_s", [0.7, 1.2])
def test_zipf_documents_follow_the_exponent(zipf_s):
    freq = np.array(_doc_frequencies(zipf_s)[:30], dtype=float)
    slope = np.polyfit(np.log(np.arange(1, 31)), np.log(freq), 1)[0]
    assert -slope == pytest.approx(zipf_s, abs=0.2)


def test_zipf_documents_popularity_orders_with_the_exponent():
    shares = []
    for s in (0.0, 0.6, 1.2):
        freq = _doc_frequencies(s, n=10000)
        shares.append(sum(freq[:10]) / sum(freq))
    assert shares[0] < shares[1] < shares[2]
    assert shares[0] == pytest.approx(10 / 200, abs=0.02)  # s = 0 is uniform


def test_zipf_documents_share_instruction_and_documents():
    reqs = stream({"kind": "zipf_documents", "num_requests": 500, "num_documents": 20,
                   "system_prompt_tokens": 512, "document_tokens": 640})
    # the 8 instruction blocks are shared by every request
    assert len({r.blocks[:8] for r in reqs}) == 1
    # 20 documents: at most 20 distinct (instruction + document) prefixes
    assert len({r.blocks[:18] for r in reqs}) <= 20


def _sessions(reqs):
    by: dict[int, list] = {}
    for r in reqs:
        by.setdefault(r.session, []).append(r)
    return by


@pytest.mark.parametrize("kind", ["multi_turn_chat", "agentic_tool_loop"])
def test_session_turns_extend_the_previous_turn(kind):
    reqs = stream({**KINDS[kind], "num_requests": 1500}, seed=4)
    check_stream(reqs)
    sessions = _sessions(reqs)
    assert len(sessions) > 10
    multi = 0
    for turns in sessions.values():
        for prev, nxt in zip(turns, turns[1:]):
            multi += 1
            assert nxt.arrival >= prev.arrival
            # next input = previous input + previous output + new text (>= 1 token)
            assert nxt.input_len > prev.input_len + prev.output_len
            keep = prev.input_len // prev.block_size
            assert nxt.blocks[:keep] == prev.blocks[:keep]
            # the block after the previous input's full blocks is new content
            assert nxt.blocks[keep] not in set(prev.blocks)
    assert multi > 100


def test_chat_system_prompts_are_shared_across_sessions():
    reqs = stream({"kind": "multi_turn_chat", "num_requests": 600, "num_system_prompts": 3,
                   "system_prompt_tokens": 1024, "block_size": 64}, seed=2)
    firsts = {r.blocks[:16] for r in reqs}
    assert len(firsts) == 3
    assert len(_sessions(reqs)) > 3


def test_chat_context_stays_under_the_limit():
    reqs = stream({"kind": "multi_turn_chat", "num_requests": 1000, "max_context_tokens": 4096,
                   "system_prompt_tokens": 512, "user_tokens": 300, "output_tokens": 300,
                   "turns": 50}, seed=1)
    for turns in _sessions(reqs).values():
        for r in turns[1:]:
            assert r.input_len <= 4096
        assert len(turns) < 50  # the context limit ends sessions first


def test_agentic_tool_loop_shares_a_long_prefix():
    reqs = stream({"kind": "agentic_tool_loop", "num_requests": 500, "num_shared_prefixes": 1,
                   "shared_prefix_tokens": 12800, "block_size": 64}, seed=9)
    assert len({r.blocks[:200] for r in reqs}) == 1  # 12800 / 64 = 200 blocks


def test_rate_scale_compresses_the_timeline_only():
    w = {"kind": "multi_turn_chat", "num_requests": 300}
    a = stream(w, 6)
    b = stream({**w, "rate_scale": 4.0}, 6)
    assert [r.blocks for r in a] == [r.blocks for r in b]
    assert [r.arrival / 4.0 for r in a] == pytest.approx([r.arrival for r in b])


def test_poisson_and_bursty_arrivals_match_their_parameters():
    n = 20000
    p = stream({"kind": "uniform", "num_requests": n, "input_tokens": 64,
                "arrival": {"process": "poisson", "rate": 10.0}}, 1)
    gaps = np.diff([r.arrival for r in p])
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    b = stream({"kind": "uniform", "num_requests": n, "input_tokens": 64,
                "arrival": {"process": "bursty", "rate": 10.0, "cv": 3.0}}, 1)
    gaps = np.diff([r.arrival for r in b])
    assert gaps.mean() == pytest.approx(0.1, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)


def test_trace_arrival_process(tmp_path):
    f = tmp_path / "times.txt"
    f.write_text("# seconds\n0\n0.5\n\n0.5\n2.25\n")
    reqs = list(build_workload(scenario_from_dict(
        {**BASE, "workload": {"kind": "uniform", "num_requests": 10,
                              "arrival": {"process": "trace", "path": "times.txt"}}},
        base_dir=tmp_path)))
    assert [r.arrival for r in reqs] == [0.0, 0.5, 0.5, 2.25]


def test_limits_cut_the_stream():
    w = {"kind": "uniform", "num_requests": 1000, "arrival": {"process": "poisson", "rate": 10.0}}
    assert len(stream(w, limits={"max_requests": 17})) == 17
    reqs = stream(w, limits={"duration_s": 5.0})
    assert reqs and all(r.arrival <= 5.0 for r in reqs)
    assert len(reqs) < 1000


def test_mix_merges_parts_in_disjoint_namespaces():
    reqs = stream({"kind": "mix", "parts": [
        {"kind": "multi_turn_chat", "num_requests": 200},
        {"kind": "few_shot", "num_requests": 200},
        {"kind": "uniform", "num_requests": 100},
    ]}, seed=8)
    assert len(reqs) == 500
    check_stream(reqs)
    chat = [r for r in reqs if r.session >= 0]
    assert len(chat) == 200 and all(r.session % 3 == 0 for r in chat)
    # few_shot and uniform parts never share a block with the chat part
    chat_ids = {b for r in chat for b in r.blocks}
    other = {b for r in reqs if r.session < 0 for b in r.blocks}
    assert not chat_ids & other


def test_trace_id_remap_numbers_new_ids_in_order_of_first_sight():
    """traces._remap (walks only from the first unseen id) against the plain rule: every
    position in turn, a fresh id from the id space for each hash not seen before,
    repeats within a record included."""
    import random

    from sim.workloads.traces import _remap

    def plain(hs, remap, ids):
        out = []
        for h in hs:
            if h not in remap:
                remap[h] = ids.new()
            out.append(remap[h])
        return out

    rng = random.Random(2)
    fast, ref, fast_ids, ref_ids = {}, {}, IdSpace(), IdSpace()
    for _ in range(3000):
        hs = [rng.randrange(200) for _ in range(rng.randrange(0, 12))]
        assert _remap(hs, fast, fast_ids) == plain(hs, ref, ref_ids)
        assert fast == ref and fast_ids.next_id == ref_ids.next_id
