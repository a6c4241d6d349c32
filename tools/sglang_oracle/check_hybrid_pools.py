#!/usr/bin/env python3
"""Check sim/costs/hybrid_models.py and sim/hybrid/pools.py against SGLang 0.5.23's own
code (run in the oracle venv, from the repository root):

    $SGLANG_ORACLE_VENV/bin/python tools/sglang_oracle/check_hybrid_pools.py

* Mamba state bytes: configs/mamba_utils.py ``Mamba2StateShape.create`` /
  ``create_full_rank`` and ``BaseLinearStateParams.mamba_cache_per_req`` for every
  Mamba preset at tp 1, 2, 4, 8 (bf16 conv, float32 SSM);
* SWA pools: model_executor/pool_configurator.py ``HybridSWAPoolConfigurator``'s
  ``_recompute_cell_size`` / ``calculate_pool_sizes`` on a stub holding each SWA
  preset's per-token bytes, over a grid of budgets, page sizes and ratios.

Prints one line per check group and exits 1 on any difference.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import os  # noqa: E402

ORACLE_DIR = Path(os.environ.get("HICACHE_SGLANG_ORACLE") or REPO.parent / "shared" / "oracle")
sys.path.insert(0, str(ORACLE_DIR))
import sglenv  # noqa: E402,F401  (stubs what sglang's imports need; before sglang)
import torch  # noqa: E402
from sglang.srt.configs.mamba_utils import (  # noqa: E402
    Mamba2CacheParams,
    Mamba2StateDType,
    Mamba2StateShape,
)
from sglang.srt.model_executor.pool_configurator import HybridSWAPoolConfigurator  # noqa: E402

from sim.costs.hybrid_models import HYBRID_MODEL_PRESETS  # noqa: E402
from sim.hybrid.pools import swa_device_pools  # noqa: E402


def sglang_state_bytes(spec, tp: int) -> int:
    g = spec.mamba
    if g.full_rank:
        shape = Mamba2StateShape.create_full_rank(
            tp_world_size=tp, intermediate_size=g.intermediate, state_size=g.state_size,
            conv_kernel=g.conv_kernel)
    else:
        shape = Mamba2StateShape.create(
            tp_world_size=tp, intermediate_size=g.intermediate, n_groups=g.n_groups,
            num_heads=g.heads, head_dim=g.head_dim, state_size=g.state_size,
            conv_kernel=g.conv_kernel)
    params = Mamba2CacheParams(
        shape=shape, layers=list(range(spec.mamba_layers)),
        dtype=Mamba2StateDType(conv=torch.bfloat16, temporal=torch.float32))
    return params.mamba_cache_per_req


def sglang_swa_pools(full_layer_bytes, full_layers, swa_layer_bytes, swa_layers,
                     budget, page, ratio, window):
    c = object.__new__(HybridSWAPoolConfigurator)
    c._full_per_token, c._full_layers_num = full_layer_bytes, full_layers
    c._swa_per_token, c._swa_layers_num = swa_layer_bytes, swa_layers
    c._draft_full_layers_num = c._draft_swa_layers_num = c._draft_swa_full_layers_num = 0
    c._draft_cell_size = 0
    c._fused_full_entry = c._fused_swa_entry = None
    c._swa_full_tokens_ratio, c._sliding_window_size = ratio, window
    c._page_size, c._enable_unified_memory = page, False
    c._recompute_cell_size()
    try:
        cfg = c.calculate_pool_sizes(budget, page)
    except ValueError:
        return None
    return cfg.full_max_total_num_tokens, cfg.swa_max_total_num_tokens


def main() -> int:
    bad = 0
    n = 0
    for spec in HYBRID_MODEL_PRESETS.values():
        if spec.kind != "mamba":
            continue
        for tp in (1, 2, 4, 8):
            n += 1
            ours, theirs = spec.mamba_state_bytes(tp), sglang_state_bytes(spec, tp)
            if ours != theirs:
                bad += 1
                print(f"DIFF {spec.name} tp={tp}: sim {ours} sglang {theirs}")
    print(f"mamba state bytes: {n} checks")
    n = 0
    for spec in HYBRID_MODEL_PRESETS.values():
        if spec.kind != "swa":
            continue
        for tp in (1, 2, 8):
            fl = spec.full_bytes_per_token(tp) // spec.full.layers
            sl = spec.swa_bytes_per_token(tp) // spec.swa_layers
            for budget in (10**9, 7 * 10**9 + 12345, 60 * 2**30 + 7):
                for page in (1, 16, 64):
                    for ratio in (0.8, 0.5, 0.1, 0.013):
                        n += 1
                        theirs = sglang_swa_pools(fl, spec.full.layers, sl,
                                                  spec.swa_layers, budget, page, ratio,
                                                  spec.sliding_window)
                        try:
                            ours = swa_device_pools(
                                budget, spec.full_bytes_per_token(tp),
                                spec.swa_bytes_per_token(tp), page,
                                spec.sliding_window, ratio)
                        except Exception:
                            ours = None
                        if ours != theirs:
                            bad += 1
                            print(f"DIFF {spec.name} tp={tp} budget={budget} page={page}"
                                  f" ratio={ratio}: sim {ours} sglang {theirs}")
    print(f"swa pools: {n} checks")
    print("OK" if not bad else f"{bad} difference(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
