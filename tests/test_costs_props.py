"""Properties of the cost formulas over every profile, preset, TP and I/O configuration:
more work is never cheaper, concurrency is never faster, stalls stay within the load."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.costs import IO_BACKENDS, MEM_LAYOUTS, MODEL_PRESETS, PROFILES, CostModel

# TP sizes each preset accepts (split or replicate; MLA accepts all).
_TP = {name: [tp for tp in (1, 2, 4, 8, 16)
              if m.is_mla or m.kv_heads % tp == 0 or tp % m.kv_heads == 0]
       for name, m in MODEL_PRESETS.items()}


@st.composite
def cost_models(draw):
    model = draw(st.sampled_from(sorted(MODEL_PRESETS)))
    return CostModel(
        draw(st.sampled_from(sorted(PROFILES))), model,
        tp=draw(st.sampled_from(_TP[model])),
        page_size=draw(st.sampled_from([1, 16, 32, 64, 128])),
        io_backend=draw(st.sampled_from(IO_BACKENDS)),
        mem_layout=draw(st.sampled_from(MEM_LAYOUTS)),
    )


tokens = st.integers(min_value=0, max_value=2_000_000)


@given(cost_models(), tokens, tokens, st.booleans())
def test_moving_more_tokens_is_never_cheaper(cm, a, b, concurrent):
    lo, hi = sorted((a, b))
    for fn in (cm.h2d_time, cm.d2h_time):
        assert 0.0 <= fn(lo, concurrent) <= fn(hi, concurrent)


@given(cost_models(), tokens)
def test_concurrency_is_never_faster(cm, n):
    assert cm.h2d_time(n, concurrent=True) >= cm.h2d_time(n)
    assert cm.d2h_time(n, concurrent=True) >= cm.d2h_time(n)


@given(cost_models(), st.integers(1, 2_000_000))
def test_no_transfer_beats_the_link(cm, n):
    # Whatever the backend, the bytes cannot cross faster than the copy-engine link.
    p = cm.profile
    nbytes = n * cm.bytes_per_token
    assert cm.h2d_time(n) >= nbytes / (p.bw_h2d_gbps * 1e9)
    assert cm.d2h_time(n) >= nbytes / (p.bw_d2h_gbps * 1e9)


@given(cost_models(), tokens, tokens, st.integers(0, 100_000), st.integers(0, 100_000))
def test_load_stall_bounds_and_monotonicity(cm, a, b, new, cached):
    lo, hi = sorted((a, b))
    s_lo, s_hi = cm.load_stall(lo, new, cached), cm.load_stall(hi, new, cached)
    assert 0.0 <= s_lo <= s_hi
    # Overlap can hide the load, never lengthen it.
    assert s_hi <= cm.h2d_time(hi) * (1 + 1e-12)
    # More compute to overlap with never makes the stall longer.
    assert cm.load_stall(hi, new + 1000, cached) <= s_hi * (1 + 1e-12)


@given(cost_models(), st.integers(0, 50_000), st.integers(0, 50_000),
       st.integers(0, 200_000), st.integers(0, 200_000))
def test_prefill_is_monotone(cm, n1, n2, c1, c2):
    n_lo, n_hi = sorted((n1, n2))
    c_lo, c_hi = sorted((c1, c2))
    assert 0.0 <= cm.prefill_time(n_lo, c_lo) <= cm.prefill_time(n_hi, c_lo)
    assert cm.prefill_time(n_hi, c_lo) <= cm.prefill_time(n_hi, c_hi)


@given(cost_models(), st.integers(0, 4096), st.integers(0, 4096),
       st.integers(0, 10_000_000), st.integers(0, 10_000_000))
def test_decode_step_is_monotone(cm, b1, b2, x1, x2):
    b_lo, b_hi = sorted((b1, b2))
    x_lo, x_hi = sorted((x1, x2))
    assert 0.0 <= cm.decode_step_time(b_lo, x_lo) <= cm.decode_step_time(b_hi, x_lo)
    assert cm.decode_step_time(b_hi, x_lo) <= cm.decode_step_time(b_hi, x_hi)


@given(cost_models(), st.integers(1, 64), st.integers(0, 10**6))
def test_sync_and_scan_are_monotone(cm, world, entries):
    assert cm.sync_time(world) <= cm.sync_time(world + 1)
    assert cm.sync_time(world, "nccl") <= cm.sync_time(world + 1, "nccl")
    assert 0.0 <= cm.reclaim_scan_time(entries) <= cm.reclaim_scan_time(entries + 1)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_prices_every_preset(name):
    for model, tps in _TP.items():
        for tp in tps:
            cm = CostModel(name, model, tp, 64)
            assert cm.h2d_time(64) > 0 and cm.d2h_time(64) > 0 and cm.prefill_time(64) > 0
