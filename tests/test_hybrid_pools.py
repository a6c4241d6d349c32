"""Hybrid model presets and per-component pool sizing (sim/costs/hybrid_models.py,
sim/hybrid/pools.py), each figure computed by hand from SGLang 0.5.23's formulas.
tools/sglang_oracle/check_hybrid_pools.py checks the same functions against SGLang's
own classes (Mamba2StateShape, mamba_cache_per_req, HybridSWAPoolConfigurator)."""

from __future__ import annotations

import pytest

from sim.costs.hybrid_models import HYBRID_MODEL_PRESETS, resolve_hybrid_model, with_ssm_dtype
from sim.costs.models import MODEL_PRESETS
from sim.errors import UserError
from sim.hybrid.pools import (
    host_pool_size,
    hybrid_host_pools,
    mamba_device_pools,
    mamba_max_running,
    mamba_slots_per_request,
    split_hicache_size,
    swa_device_pools,
)

GIB = 1 << 30


def test_hybrid_presets_leave_the_full_presets_alone():
    assert not set(HYBRID_MODEL_PRESETS) & set(MODEL_PRESETS)
    assert sorted(MODEL_PRESETS) == ["deepseek-v3", "llama-3.1-70b", "llama-3.1-8b",
                                     "qwen3-235b-a22b", "qwen3-32b"]
    assert MODEL_PRESETS["llama-3.1-8b"].bytes_per_token(1) == 131_072


@pytest.mark.parametrize("name, layers, full, swa", [
    # layers x 8 KV heads x (64 + 64) x 2 bytes, half full, half sliding
    ("gpt-oss-20b", 24, 12 * 8 * 128 * 2, 12 * 8 * 128 * 2),
    ("gpt-oss-120b", 36, 18 * 8 * 128 * 2, 18 * 8 * 128 * 2),
    # 1 global layer in 6: 48 -> 8 full + 40 SWA; 8 KV heads x 512 x 2
    ("gemma-3-12b", 48, 8 * 8 * 512 * 2, 40 * 8 * 512 * 2),
    # 62 -> 10 full + 52 SWA; 16 KV heads x 256 x 2
    ("gemma-3-27b", 62, 10 * 16 * 256 * 2, 52 * 16 * 256 * 2),
])
def test_swa_presets_bytes_per_token(name, layers, full, swa):
    m = HYBRID_MODEL_PRESETS[name]
    assert m.components == ("full", "swa")
    assert m.layers == layers
    assert m.full_bytes_per_token(1) == full
    assert m.swa_bytes_per_token(1) == swa
    assert m.mamba_state_bytes(1) == 0
    # 8 or 16 KV heads over tp 8: an eighth a rank; 8 heads over tp 16: one
    # (replicated, get_num_kv_heads)
    assert m.full_bytes_per_token(8) == full // 8
    assert m.swa_bytes_per_token(8) == swa // 8
    if m.full.kv_heads == 8:
        assert m.full_bytes_per_token(16) == full // 8


def test_mamba_state_bytes_by_hand():
    # Qwen3-Next GDN: conv_dim = 32*128 + 2*16*128 = 8192, conv (8192, 3) bf16;
    # temporal (32, 128, 128) float32: (49,152 + 2,097,152) x 36 layers.
    q = HYBRID_MODEL_PRESETS["qwen3-next-80b-a3b"]
    assert q.layers == 48 and q.full.layers == 12
    assert q.mamba_state_bytes(1) == (8192 * 3 * 2 + 32 * 128 * 128 * 4) * 36 == 77_266_944
    assert q.full_bytes_per_token(1) == 12 * 2 * 512 * 2 == 24_576
    # tp 8: conv (1024, 3), temporal (4, 128, 128)
    assert q.mamba_state_bytes(8) == (1024 * 3 * 2 + 4 * 128 * 128 * 4) * 36
    # Nemotron-H-8B: conv_dim = 128*64 + 2*8*128 = 10,240; temporal (128, 64, 128).
    n = HYBRID_MODEL_PRESETS["nemotron-h-8b"]
    assert n.layers == 28  # layers with a cache: 24 Mamba + 4 attention (24 MLP-only)
    assert n.mamba_state_bytes(1) == (10240 * 3 * 2 + 128 * 64 * 128 * 4) * 24
    # Jamba (Mamba-1, create_full_rank): conv (8192, 3), temporal (8192, 1, 16).
    j = HYBRID_MODEL_PRESETS["jamba-v0.1"]
    assert j.mamba_state_bytes(1) == (8192 * 3 * 2 + 8192 * 16 * 4) * 28 == 16_056_320
    # --mamba-ssm-dtype bfloat16 halves the temporal part only
    assert with_ssm_dtype(j, 2).mamba_state_bytes(1) == (8192 * 3 * 2 + 8192 * 16 * 2) * 28


def test_mamba_groups_replicate_when_tp_exceeds_them():
    # Nemotron-H n_groups 8 at tp 16: extra_groups_for_head_shards adds 16 - 8 groups,
    # conv_dim = 8192 + 2 * 16 * 128 = 12,288 -> (768, 3); temporal (8, 64, 128).
    n = HYBRID_MODEL_PRESETS["nemotron-h-8b"]
    assert n.mamba.shapes(16) == ((768, 3), (8, 64, 128))


def test_resolve_hybrid_model_errors_name_the_choices():
    assert resolve_hybrid_model("GPT-OSS-120B").name == "gpt-oss-120b"
    with pytest.raises(UserError, match="expected one of gpt-oss-20b"):
        resolve_hybrid_model("llama-3.1-8b")


def test_swa_device_pools_by_hand():
    # gpt-oss-120b, tp 1: cell = 36,864 + 0.8 * 36,864 = 66,355.2 B; 10 GiB // cell
    # = 161,817 tokens -> 161,808 at page 16; SWA int(161,808 * 0.8) = 129,446 -> 129,440.
    assert swa_device_pools(10 * GIB, 36_864, 36_864, 16, 128) == (161_808, 129_440)
    # Gemma 3 27B at ratio 0.1: cell = 81,920 + 42,598.4; 10 GiB // cell = 86,231.
    full, swa = swa_device_pools(10 * GIB, 81_920, 425_984, 1, 1024, ratio=0.1)
    assert (full, swa) == (86_231, 8_623)


def test_swa_pool_too_small_for_one_request_is_refused():
    # 5,000 full tokens at ratio 0.02 -> 100 SWA tokens <= window 128 + page 1.
    with pytest.raises(UserError, match="cannot hold even one request"):
        swa_device_pools(5_000 * 24_576 * 1.02, 24_576, 24_576, 1, 128, ratio=0.02)
    with pytest.raises(UserError, match="swa_full_tokens_ratio"):
        swa_device_pools(10 * GIB, 1, 1, 1, 1, ratio=0)


def test_mamba_device_pools_by_hand():
    # Qwen3-Next tp 1, 40 GiB: state budget 40 * 0.9 / 1.9 GiB = 20,344,581,928 B
    # -> int((budget - S) // S) = 262 states (S = 77,266,944); FULL from
    # 40 GiB - 263 * S = 22,628,466,688 B // 24,576 = 920,754 -> 920,704 at page 64.
    assert mamba_device_pools(40 * GIB, 24_576, 77_266_944, 64) == (920_704, 262)
    # An explicit --max-mamba-cache-size: 100 states + the padding slot.
    full, states = mamba_device_pools(40 * GIB, 24_576, 77_266_944, 1,
                                      max_mamba_cache_size=100)
    assert states == 100
    assert full == (40 * GIB - 101 * 77_266_944) // 24_576
    with pytest.raises(UserError, match="max_mamba_cache_size"):
        mamba_device_pools(10**8, 24_576, 77_266_944, 1)


def test_mamba_slots_per_request_and_the_running_cap():
    assert mamba_slots_per_request() == 3
    assert mamba_slots_per_request(skip_decode_lock=True) == 3  # 2 + 1 added back
    assert mamba_slots_per_request(extra_buffer=True) == 5
    assert mamba_slots_per_request(extra_buffer=True, overlap=False) == 4
    assert mamba_slots_per_request(extra_buffer=True, skip_decode_lock=True) == 4
    assert mamba_slots_per_request(radix_cache=False) == 1
    # 262 states // 3 = 87 requests, below the 2,048 estimate floor
    assert mamba_max_running(262, 920_704, context_len=262_144) == 87
    assert mamba_max_running(262, 920_704, requested=32) == 32
    with pytest.raises(UserError, match="cannot serve any request"):
        mamba_max_running(2, 1000, requested=8)


def test_host_pools_by_ratio_and_by_size():
    # ratio 2: FULL int(1,000,000 * 2) // 64 + 1 pages = 2,000,064 tokens; Mamba
    # states int(262 * 2) + 1 padding slot = 525.
    assert hybrid_host_pools("mamba", 1_000_000, 262, 64, 24_576, 77_266_944,
                             ratio=2.0) == (2_000_064, 525)
    # --hicache-size 100 GB shared by device bytes: FULL 1,000,064 * 24,576 =
    # 24,577,572,864 B, Mamba 263 * 77,266,944 = 20,321,206,272 B (44,898,779,136 in
    # all); each share // its unit, plus one page. FULL: 100e9 * 1,000,064 /
    # 44,898,779,136 = 2,227,374.6 tokens -> 34,802 + 1 pages of 64 = 2,227,392;
    # Mamba: 100e9 * 263 / 44,898,779,136 = 585.8 states -> 585 + 1 = 586.
    fb, mb = 1_000_064 * 24_576, 263 * 77_266_944
    assert split_hicache_size(100, [fb, mb]) == pytest.approx(
        [100 * 24_577_572_864 / 44_898_779_136, 100 * 20_321_206_272 / 44_898_779_136])
    assert hybrid_host_pools("mamba", 1_000_000, 262, 64, 24_576, 77_266_944,
                             hicache_gb=100) == (2_227_392, 586)
    # SWA: both KV pools by ratio (default 2) at page 16.
    assert hybrid_host_pools("swa", 161_808, 129_440, 16, 36_864, 36_864) == (
        (323_616 // 16 + 1) * 16, (258_880 // 16 + 1) * 16)
    assert host_pool_size(10, 4, ratio=1.0) == 12
    with pytest.raises(UserError):
        hybrid_host_pools("full", 1, 1, 1, 1, 1)
