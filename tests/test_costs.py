"""The cost layer: model presets and TP sharding, profiles, and the cost formulas.

Expected figures are hand computations from shared/reference/transfer-costs.md (§1.7
formulas, §2 KV table, §3 prefill form), not values read back from the code.
"""

import math
import subprocess
import sys
from pathlib import Path

import pytest

from sim.constants import RECLAIM_SCAN_SECONDS_PER_ENTRY, STAGING_MAX_PAGES
from sim.costs import (
    DEFAULT_PROFILE, MODEL_PRESETS, PROFILES, CostModel, ModelSpec, Profile, load_profile,
    resolve_io, resolve_model,
)
from sim.errors import UserError

KIB = 1024
ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------- bytes per token
@pytest.mark.parametrize("name, tp, kib", [
    ("llama-3.1-8b", 1, 128), ("llama-3.1-8b", 2, 64), ("llama-3.1-8b", 4, 32),
    ("llama-3.1-8b", 8, 16),
    ("llama-3.1-70b", 1, 320), ("llama-3.1-70b", 8, 40), ("llama-3.1-70b", 16, 40),
    ("qwen3-32b", 1, 256), ("qwen3-32b", 8, 32),
    ("qwen3-235b-a22b", 1, 188), ("qwen3-235b-a22b", 2, 94), ("qwen3-235b-a22b", 4, 47),
    ("qwen3-235b-a22b", 8, 47),
])
def test_bytes_per_token_matches_the_reference_table(name, tp, kib):
    assert MODEL_PRESETS[name].bytes_per_token(tp) == kib * KIB


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
def test_mla_latent_is_replicated_on_every_rank(tp):
    ds = MODEL_PRESETS["deepseek-v3"]
    assert ds.bytes_per_token(tp) == 61 * 576 * 2  # 68.6 KiB at every TP
    assert ds.kv_heads_per_rank(tp) == 1
    assert ds.kv_parts == 1


@pytest.mark.parametrize("name, tp, heads", [
    ("llama-3.1-8b", 1, 8), ("llama-3.1-8b", 4, 2), ("llama-3.1-8b", 8, 1),
    ("llama-3.1-70b", 16, 1),  # 8 heads over 16 ranks: each head on two ranks
    ("qwen3-235b-a22b", 2, 2), ("qwen3-235b-a22b", 4, 1), ("qwen3-235b-a22b", 8, 1),
])
def test_kv_heads_per_rank_splits_then_replicates(name, tp, heads):
    assert MODEL_PRESETS[name].kv_heads_per_rank(tp) == heads


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_bytes_per_token_follows_the_sglang_formula(name, tp):
    m = MODEL_PRESETS[name]
    if m.is_mla:
        expected = m.layers * (m.kv_lora_rank + m.qk_rope_head_dim) * m.dtype_bytes
    else:
        expected = 2 * m.layers * max(1, m.kv_heads // tp) * m.head_dim * m.dtype_bytes
    assert m.bytes_per_token(tp) == expected


@pytest.mark.parametrize("name, tp, item", [
    ("llama-3.1-8b", 1, 2 * KIB), ("llama-3.1-70b", 8, 256), ("deepseek-v3", 8, 1152),
])
def test_item_bytes_match_the_worked_sizes(name, tp, item):
    # transfer-costs.md §1.7 "worked sizes": bytes per (token, layer, K or V) per rank.
    assert MODEL_PRESETS[name].item_bytes(tp) == item


@pytest.mark.parametrize("name, tp", [
    ("llama-3.1-8b", 3), ("llama-3.1-70b", 12), ("qwen3-235b-a22b", 6), ("llama-3.1-8b", 0),
    ("llama-3.1-8b", -2),
])
def test_tp_that_cannot_shard_the_kv_heads_is_a_one_line_user_error(name, tp):
    with pytest.raises(UserError) as err:
        MODEL_PRESETS[name].bytes_per_token(tp)
    assert f"tp={tp}" in str(err.value) and "\n" not in str(err.value)
    assert name in str(err.value)


def test_mla_accepts_any_tp():
    assert MODEL_PRESETS["deepseek-v3"].bytes_per_token(3) == 61 * 576 * 2


def test_custom_models_from_mappings():
    mha = resolve_model({"name": "toy", "layers": 4, "q_heads": 8, "kv_heads": 2,
                         "head_dim": 64, "dtype_bytes": 1, "active_params": 1e9})
    assert mha.bytes_per_token(1) == 2 * 4 * 2 * 64 * 1
    assert mha.bytes_per_token(4) == 2 * 4 * 1 * 64 * 1  # replicated past 2 heads
    mla = resolve_model({"layers": 3, "q_heads": 16, "head_dim": 96, "kv_lora_rank": 256,
                         "qk_rope_head_dim": 32, "active_params": 2e9})
    assert mla.name == "custom" and mla.bytes_per_token(8) == 3 * 288 * 2
    fp8 = resolve_model({"preset": "llama-3.1-8b", "dtype_bytes": 1})
    assert fp8.bytes_per_token(1) == 64 * KIB
    assert resolve_model("Llama-3.1-8B") is MODEL_PRESETS["llama-3.1-8b"]


@pytest.mark.parametrize("spec, fragment", [
    ("llama-9", "unknown model 'llama-9'"),
    ({"preset": "llama-3.1-8b", "layer": 3}, "unknown key 'layer'"),
    ({"layers": 4, "q_heads": 8, "head_dim": 64, "kv_heads": 2}, "active_params"),
    ({"layers": 4, "q_heads": 8, "head_dim": 64, "active_params": 1e9}, "kv_heads"),
    ({"layers": 4, "q_heads": 8, "head_dim": 64, "kv_heads": 2, "kv_lora_rank": 64,
      "active_params": 1e9}, "not both"),
    ({"layers": 0, "q_heads": 8, "head_dim": 64, "kv_heads": 2, "active_params": 1e9},
     "key 'layers'"),
    ({"layers": 4, "q_heads": 8, "head_dim": 64, "kv_heads": 2, "active_params": 2e9,
      "total_params": 1e9}, "total_params"),
    (12, "expected a preset name or a mapping"),
])
def test_bad_custom_models_are_one_line_user_errors(spec, fragment):
    with pytest.raises(UserError) as err:
        resolve_model(spec)
    assert fragment in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------- profiles
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_shipped_profiles_load_and_cite_every_number(name):
    profile = load_profile(name)
    assert profile.name == name
    for key in Profile.numeric_fields():
        assert profile.sources.get(key, "").strip(), f"{name}: {key} has no source"


def test_default_profile_is_h200_and_loads_by_path():
    assert DEFAULT_PROFILE == "h200-sxm"
    by_name = load_profile()
    by_path = load_profile(str(ROOT / "profiles" / "h200-sxm.yaml"))
    assert by_name == by_path
    assert by_name.bw_h2d_gbps == 53.0 and by_name.hbm_gib == 141.0


def _write_profile(tmp_path, **changes):
    text = (ROOT / "profiles" / "h200-sxm.yaml").read_text()
    lines = []
    for line in text.splitlines():
        key = line.split(":", 1)[0]
        if key in changes:
            value = changes.pop(key)
            if value is None:
                continue
            line = f"{key}: {value}"
        lines.append(line)
    lines += [f"{k}: {v}" for k, v in changes.items()]
    path = tmp_path / "mine.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("changes, fragment", [
    ({"bw_h2d_gbps": "fast"}, "key 'bw_h2d_gbps'"),
    ({"bidir_factor": "1.5"}, "key 'bidir_factor'"),
    ({"c_call_us": "-1"}, "key 'c_call_us'"),
    ({"bw_d2h_gbps": None}, "key 'bw_d2h_gbps' is missing"),
    ({"bw_h2d_gbs": "53"}, "unknown key 'bw_h2d_gbs'"),
    ({"bw_h2d_gbps": None, "bw_h2d_gbs": "53"}, "did you mean 'bw_h2d_gbps'?"),
])
def test_bad_profile_values_name_the_file_and_key(tmp_path, changes, fragment):
    path = _write_profile(tmp_path, **changes)
    with pytest.raises(UserError) as err:
        load_profile(str(path))
    msg = str(err.value)
    assert str(path) in msg and fragment in msg and "\n" not in msg


def test_sources_must_name_real_parameters(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text((ROOT / "profiles" / "a100.yaml").read_text()
                    + "  bandwidth: a typo'd source key\n")
    with pytest.raises(UserError) as err:
        load_profile(path)
    assert "sources" in str(err.value) and "bandwidth" in str(err.value)


@pytest.mark.parametrize("text, fragment", [
    ("name: x\nbw_h2d_gbps: [1,\n", "mine.yaml:"),  # parse error carries a line number
    ("- a\n- b\n", "found list; expected a mapping"),
    ("", "found NoneType; expected a mapping"),
])
def test_malformed_profile_files_are_one_line_errors(tmp_path, text, fragment):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        load_profile(path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_missing_profile_file_and_unknown_name(tmp_path):
    with pytest.raises(UserError, match="nope.yaml: no such file"):
        load_profile(tmp_path / "nope.yaml")
    with pytest.raises(UserError, match="unknown profile 'h300'.*h200-sxm"):
        load_profile("h300")


# --------------------------------------------------------------- I/O resolution
@pytest.mark.parametrize("backend, layout, resolved", [
    ("kernel", "page_first", ("kernel", "page_first")),
    ("kernel", "layer_first", ("kernel", "layer_first")),
    ("kernel", "page_first_direct", ("direct", "page_first_direct")),
    ("direct", "page_first", ("direct", "page_first_direct")),
    ("direct", "layer_first", ("direct", "layer_first")),
    ("direct", "page_first_direct", ("direct", "page_first_direct")),
])
def test_sglang_layout_and_backend_resolutions(backend, layout, resolved):
    assert resolve_io(backend, layout) == resolved
    cm = CostModel("h200-sxm", "llama-3.1-8b", 1, 64, backend, layout)
    assert (cm.io_backend, cm.mem_layout) == resolved


@pytest.mark.parametrize("kwargs, where", [
    (dict(io_backend="dma"), "io_backend"), (dict(mem_layout="page_head"), "mem_layout"),
    (dict(page_size=0), "page_size"), (dict(tp=3), "tp=3"),
])
def test_bad_cost_model_arguments_are_user_errors(kwargs, where):
    args = dict(profile="h200-sxm", model="llama-3.1-8b", tp=1, page_size=64) | kwargs
    with pytest.raises(UserError, match=where):
        CostModel(**args)


# --------------------------------------------------------------- transfer formulas
@pytest.fixture(scope="module")
def h200():
    return load_profile("h200-sxm")


def test_kernel_load_back_of_one_page_by_hand(h200):
    cm = CostModel(h200, "llama-3.1-70b", tp=8, page_size=64)
    bw_k = min(40e9, 53e9) * 256 / (256 + 500)  # item-size-limited kernel bandwidth
    expected = 20e-6 + 80 * 6e-6 + 64 * 40 * KIB / bw_k
    assert cm.h2d_time(64) == pytest.approx(expected, rel=1e-12)


def test_direct_transfers_are_call_bound_at_tp8_by_hand(h200):
    # 160 calls (80 layers x K, V) of 16 KiB per page; 2.5 us each beats 16 KiB / 53 GB/s.
    cm = CostModel(h200, "llama-3.1-70b", tp=8, page_size=64, io_backend="direct")
    assert cm.h2d_time(64) == pytest.approx(20e-6 + 2.5e-6 + 160 * 2.5e-6, rel=1e-12)
    assert cm.d2h_time(640) == pytest.approx(20e-6 + 2.5e-6 + 1600 * 2.5e-6, rel=1e-12)
    # The copy engine at 2.5 us per 16 KiB call: ~6.5 GB/s, well below the link.
    assert cm.asymptotic_bandwidth("h2d") == pytest.approx(16 * KIB / 2.5e-6)


def test_direct_transfers_are_link_bound_with_big_chunks(h200):
    cm = CostModel(h200, "llama-3.1-8b", tp=1, page_size=256, io_backend="direct")
    n = 256 * 1000
    assert cm.h2d_time(n) == pytest.approx(22.5e-6 + n * 128 * KIB / 53e9, rel=1e-12)
    assert cm.asymptotic_bandwidth("h2d") == pytest.approx(53e9)


def test_staged_page_first_backup_pays_per_64_page_chunk(h200):
    cm = CostModel(h200, "llama-3.1-70b", tp=8, page_size=64)
    per_chunk = 6e-6 + 2.5e-6  # one gather launch + one copy-out call
    full = cm.d2h_time(STAGING_MAX_PAGES * 64)
    one_more_page = cm.d2h_time((STAGING_MAX_PAGES + 1) * 64)
    per_token = 40 * KIB * (1 / 53e9 + 2 / (4.8e12 * 0.8))
    assert one_more_page - full == pytest.approx(per_chunk + 64 * per_token, rel=1e-9)
    # Staging makes the backup copy-engine-bound, not item-bound like a layer_first kernel.
    layer_first = CostModel(h200, "llama-3.1-70b", tp=8, page_size=64, mem_layout="layer_first")
    assert cm.d2h_time(10_000) < layer_first.d2h_time(10_000)


@pytest.mark.parametrize("backend, layout", [
    ("kernel", "page_first"), ("kernel", "layer_first"), ("direct", "layer_first"),
    ("direct", "page_first_direct"),
])
@pytest.mark.parametrize("model, tp, page", [
    ("llama-3.1-8b", 1, 256), ("llama-3.1-70b", 8, 64), ("deepseek-v3", 8, 1),
])
def test_large_transfers_approach_bytes_over_bandwidth(h200, backend, layout, model, tp, page):
    cm = CostModel(h200, model, tp, page, backend, layout)
    for direction, fn in (("h2d", cm.h2d_time), ("d2h", cm.d2h_time)):
        for concurrent in (False, True):
            bw = cm.asymptotic_bandwidth(direction, concurrent)
            assert bw <= 53e9 * (1 + 1e-12)  # never faster than the link
            n = 50_000_000 // page * page
            assert fn(n, concurrent) == pytest.approx(n * cm.bytes_per_token / bw, rel=1e-3)


def test_kernel_approaches_its_peak_for_large_items(h200):
    big = resolve_model({"layers": 2, "q_heads": 64, "kv_heads": 64, "head_dim": 256,
                         "active_params": 1e9})  # 32 KiB rows
    cm = CostModel(h200, big, tp=1, page_size=64)
    assert cm.asymptotic_bandwidth("h2d") == pytest.approx(40e9, rel=0.02)
    assert cm.asymptotic_bandwidth("h2d", concurrent=True) == pytest.approx(40e9, rel=0.02)


def test_zero_tokens_cost_nothing(h200):
    cm = CostModel(h200, "qwen3-32b", tp=2, page_size=16)
    assert cm.h2d_time(0) == cm.d2h_time(0) == cm.h2d_time(0, True) == 0.0
    assert cm.load_stall(0, 100, 100) == 0.0
    assert cm.prefill_time(0, 1000) == 0.0
    assert cm.decode_step_time(0, 0) == 0.0
    assert cm.reclaim_scan_time(0) == 0.0
    assert cm.sync_time(1) == cm.sync_time(1, "nccl") == 0.0


def test_mla_transfers_do_not_shrink_with_tp(h200):
    one = CostModel(h200, "deepseek-v3", tp=1, page_size=64)
    eight = CostModel(h200, "deepseek-v3", tp=8, page_size=64)
    assert one.h2d_time(4096) == eight.h2d_time(4096)
    gqa1 = CostModel(h200, "llama-3.1-70b", tp=1, page_size=64)
    gqa8 = CostModel(h200, "llama-3.1-70b", tp=8, page_size=64)
    assert gqa8.h2d_time(4096) < gqa1.h2d_time(4096)


# --------------------------------------------------------------- load-back overlap
def test_load_stall_with_nothing_to_overlap_is_the_whole_load(h200):
    cm = CostModel(h200, "llama-3.1-70b", tp=8, page_size=64)
    assert cm.load_stall(10_000, 0, 10_000) == pytest.approx(cm.h2d_time(10_000), rel=1e-12)


def test_load_stall_hidden_behind_long_compute_is_one_layer(h200):
    cm = CostModel(h200, "llama-3.1-70b", tp=8, page_size=64)
    load = cm.h2d_time(10_000)
    stall = cm.load_stall(10_000, 4096, 10_000)
    assert stall == pytest.approx(20e-6 + (load - 20e-6) / 80, rel=1e-12)


def test_load_stall_partial_overlap_by_hand(h200):
    cm = CostModel(h200, "llama-3.1-70b", tp=8, page_size=64)
    load_layer = (cm.h2d_time(100_000) - 20e-6) / 80
    compute_layer = (cm.prefill_time(64, 100_000) - 178e-6) / 80
    assert 0 < compute_layer < load_layer
    expected = 20e-6 + load_layer + 79 * (load_layer - compute_layer)
    assert cm.load_stall(100_000, 64, 100_000) == pytest.approx(expected, rel=1e-12)


# --------------------------------------------------------------- compute
def test_prefill_by_hand(h200):
    cm = CostModel(h200, "llama-3.1-70b", tp=8, page_size=64)
    n, c = 4096, 0
    flops = 2 * 70.6e9 * n + 4 * 80 * (64 * 128) * n * (c + n / 2)
    expected = 178e-6 + flops / (8 * 989e12 * 0.45)
    assert cm.prefill_time(n, c) == pytest.approx(expected, rel=1e-12)
    # ~40 us per token at short context (transfer-costs.md §3 derived table).
    assert cm.prefill_time(4096) / 4096 == pytest.approx(40e-6, rel=0.05)


def test_prefill_attention_grows_with_cached_context(h200):
    cm = CostModel(h200, "llama-3.1-8b", tp=1, page_size=64)
    extra = cm.prefill_time(1, 32_768) - cm.prefill_time(1, 0)
    # 4 * 32 * 4096 * c FLOPs per token: ~17 GFLOP at c = 32K (§3).
    assert extra == pytest.approx(4 * 32 * 4096 * 32_768 / (989e12 * 0.45), rel=1e-9)


def test_decode_step_by_hand(h200):
    cm = CostModel(h200, "llama-3.1-70b", tp=8, page_size=64)
    batch, ctx = 32, 32 * 4096
    hbm = 4.8e12 * 0.8
    memory = (70.6e9 * 2 / 8 + ctx * 40 * KIB) / hbm
    assert cm.decode_step_time(batch, ctx) == pytest.approx(178e-6 + memory, rel=1e-12)


def test_moe_decode_reads_only_touched_experts(h200):
    cm = CostModel(h200, "qwen3-235b-a22b", tp=4, page_size=64)
    hbm = 4.8e12 * 0.8
    one = cm.decode_step_time(1, 0) - 178e-6
    assert one == pytest.approx(22e9 * 2 / 4 / hbm, rel=1e-12)
    many = cm.decode_step_time(64, 0) - 178e-6  # 64 x 22B > 235B: every expert once
    assert many == pytest.approx(235e9 * 2 / 4 / hbm, rel=1e-12)


def test_decode_turns_compute_bound_at_huge_batches(h200):
    cm = CostModel(h200, "llama-3.1-8b", tp=1, page_size=64)
    batch = 100_000
    compute = 2 * 8.03e9 * batch / (989e12 * 0.30)
    assert cm.decode_step_time(batch, 0) == pytest.approx(178e-6 + compute, rel=1e-12)


# --------------------------------------------------------------- sync and scans
def test_sync_times(h200):
    cm = CostModel(h200, "llama-3.1-8b", tp=8, page_size=64)
    assert cm.sync_time(8) == pytest.approx(200e-6)
    assert cm.sync_time(8, "nccl") == pytest.approx(40e-6)
    assert cm.sync_time(2) == pytest.approx(200e-6 / 3)
    times = [cm.sync_time(w) for w in (1, 2, 3, 4, 8, 16, 64)]
    assert times == sorted(times)
    assert cm.sync_time(8, "nccl") < cm.sync_time(8, "gloo")
    with pytest.raises(UserError, match="'mpi'"):
        cm.sync_time(8, "mpi")


def test_reclaim_scan_charges_the_constant_per_entry(h200):
    cm = CostModel(h200, "llama-3.1-8b", tp=1, page_size=64)
    assert cm.reclaim_scan_time(10_000) == pytest.approx(10_000 * RECLAIM_SCAN_SECONDS_PER_ENTRY)


# --------------------------------------------------------------- import hygiene
def test_importing_costs_pulls_in_neither_torch_nor_numpy():
    code = ("import sys, sim.costs, cli\n"
            "cli.build_parser()\n"
            "cm = sim.costs.CostModel('h200-sxm', 'deepseek-v3', 8, 64)\n"
            "cm.h2d_time(640); cm.load_stall(640, 100, 640); cm.decode_step_time(4, 4000)\n"
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_model_spec_is_hashable_and_frozen():
    m = MODEL_PRESETS["llama-3.1-8b"]
    assert isinstance(m, ModelSpec) and hash(m) == hash(m)
    with pytest.raises(Exception):
        m.layers = 3  # type: ignore[misc]
    assert math.isclose(m.params_total, 8.03e9)


def test_decode_run_is_bit_identical_to_stepping_one_by_one():
    """The engine's fast path over runs of decode steps gives the plain loop's times."""
    import numpy as np

    from sim.costs import CostModel, load_profile
    from sim.costs.models import resolve_model

    for model in ("llama-3.1-8b", "deepseek-v3"):
        _decode_run_matches(CostModel(load_profile("h100-sxm"), resolve_model(model), 8, 16),
                            np.random.default_rng(3))


def _decode_run_matches(cost, rng):
    for i in range(300):
        b, ctx = int(rng.integers(1, 300)), int(rng.integers(0, 10**6))
        k_max = int(rng.integers(0, 50 if i % 2 else 400))
        t0, extra = float(rng.uniform(0, 1e4)), float(rng.uniform(0, 1e-3))
        stop = math.inf if i % 3 == 0 else t0 + float(rng.uniform(0, 0.5))  # inf: every step
        t, k, busy = t0, 0, 1.25
        while k < k_max:
            t1 = t + (extra + cost.decode_step_time(b, ctx + k * b))
            busy += t1 - t  # what a step-by-step loop adds to the GPU's busy time
            t = t1
            k += 1
            if t >= stop:
                break
        assert cost.decode_run(b, ctx, k_max, t0, extra, stop, 1.25) == (t, k, busy)
