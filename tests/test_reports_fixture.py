"""Test data for the reports: realistic results and sweep folders, seeded.

Builds folders with the exact layout of docs/ARCHITECTURE.md ("Results folder") from
a small seeded model of a run: a few policies x host sizes, hits split into
device/host/miss page-aligned so that device_hit + host_hit + miss = input tokens,
times that add up (ttft = first_token - arrival), running-total counters, and a
summary.json computed from the rows. This is test data for the readers and plots,
not a model of HiCache. It holds no tests; the other test_reports*.py files use it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

PAGE = 64
DEVICE_TOKENS = 48_000
BYTES_PER_TOKEN = 65_536  # llama-3-8B KV, bf16, per rank at TP 2
# How much of the reusable prefix each host policy keeps (test data, not a claim).
HOST_POLICY_KEEP = {"lru": 0.75, "duplicate_first": 0.85, "duplicate_first_single_pass": 0.8,
                    "duplicate_first_by_id": 0.82}
WRITE_POLICY_DUP = {"write_through": 0.9, "write_back": 0.25, "write_through_selective": 0.5}


def scenario_for(write_policy: str, host_policy: str, ratio: float, seed: int,
                 name: str | None = None, rate: float = 6.0, requests: int = 240) -> dict:
    """A resolved scenario shaped like sim/scenario.py's (nested mapping, schema order)."""
    return {
        "name": name or f"{write_policy}-{host_policy}-x{ratio:g}",
        "description": "reports test data",
        "seed": seed,
        "model": {"preset": "llama-3.1-8b"},
        "tp": 2,
        "page_size": PAGE,
        "device": {"tokens": DEVICE_TOKENS},
        "host": {"ratio": float(ratio)},
        "cache": {"write_policy": write_policy, "host_policy": host_policy,
                  "eviction_policy": "lru", "load_back_threshold": 10},
        "cost": {"profile": "h200-sxm", "io_backend": "kernel", "mem_layout": "page_first"},
        "workload": {"kind": "multi_turn_chat", "num_requests": requests, "block_size": PAGE,
                     "arrival": {"process": "poisson", "rate": rate},
                     "turns": {"dist": "exponential", "mean": 5.0}},
        "on_divergence": "record",
        "output": {"timeseries_interval_s": 0.5},
    }


def _pages(tokens: np.ndarray) -> np.ndarray:
    return (tokens // PAGE) * PAGE


def build_run(out: Path, *, write_policy: str = "write_through", host_policy: str = "lru",
              ratio: float = 2.0, seed: int = 0, requests: int = 240, rate: float = 6.0,
              partial: bool = False, diverged: bool = False, name: str | None = None,
              scenario_overrides: dict | None = None, bytes_known: bool = True) -> Path:
    """Write one complete results folder at ``out`` and return it."""
    rng = np.random.default_rng(seed * 1009 + int(ratio * 100) + len(host_policy)
                                + 7 * len(write_policy))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    scenario = scenario_for(write_policy, host_policy, ratio, seed, name, rate, requests)
    for dotted, value in (scenario_overrides or {}).items():
        node = scenario
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    host_cap = int(DEVICE_TOKENS * ratio)

    # --- per-request rows
    n = requests
    rid = np.arange(n)
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    session = rng.integers(0, 24, n)
    input_tokens = rng.integers(600, 9000, n)
    output_len = rng.integers(32, 400, n)
    warm = np.minimum(1.0, rid / (0.25 * n))  # the cache fills during the first quarter
    reuse = rng.beta(5, 3, n) * warm  # share of the prompt seen before
    keep = HOST_POLICY_KEEP[host_policy] * (1 - np.exp(-ratio / 1.5))
    device_share = reuse * rng.uniform(0.35, 0.6, n)
    host_share = (reuse - device_share) * keep
    device_hit = _pages(np.floor(input_tokens * device_share).astype(np.int64))
    host_hit = _pages(np.floor(input_tokens * host_share).astype(np.int64))
    miss = input_tokens - device_hit - host_hit
    load_back_tokens = host_hit
    load_back_bytes = load_back_tokens * BYTES_PER_TOKEN
    load_back_s = load_back_bytes / 22e9
    stall_scale = 0.0 if write_policy == "write_through" else 0.004
    backup_stall_s = rng.exponential(stall_scale, n) if stall_scale else np.zeros(n)
    prefill_s = 0.012 + miss * 9e-6 + (device_hit + host_hit) * 4e-7
    queue = rng.exponential(0.03, n) * (1 + 3 * (rid % 17 == 0))
    start = arrival + queue
    first_token = start + load_back_s * 0.35 + backup_stall_s + prefill_s
    finish = first_token + output_len * 0.018
    requests_df = pd.DataFrame({
        "rid": rid, "session": session, "arrival": arrival, "start": start,
        "first_token": first_token, "finish": finish, "input_tokens": input_tokens,
        "device_hit_tokens": device_hit, "host_hit_tokens": host_hit, "miss_tokens": miss,
        "load_back_tokens": load_back_tokens, "load_back_bytes": load_back_bytes,
        "load_back_s": load_back_s, "backup_stall_s": backup_stall_s,
        "prefill_s": prefill_s, "ttft_s": first_token - arrival,
    })
    if partial:  # an interrupted run: the last requests never got a first token
        cut = int(n * 0.8)
        requests_df.loc[cut:, ["first_token", "finish", "ttft_s"]] = np.nan

    # --- time series, every 0.5 s of simulated time
    t_end = float(np.nanmax(requests_df["finish"]))
    t = np.arange(0.0, t_end + 0.5, 0.5)
    fill = 1 - np.exp(-t / (0.3 * t_end))
    device_used = np.floor(DEVICE_TOKENS * (0.93 * fill + 0.03 * np.sin(t / 3) * fill))
    device_used = np.clip(device_used, 0, DEVICE_TOKENS)
    host_used = np.floor(host_cap * 0.97 * (1 - np.exp(-t / (0.45 * t_end))))
    dup = np.floor(np.minimum(device_used, host_used) * WRITE_POLICY_DUP[write_policy])
    effective = device_used + host_used - dup

    def counter(mean: float) -> np.ndarray:
        return np.cumsum(rng.poisson(mean, len(t)) * PAGE).astype(np.int64)

    backup = counter(40 if write_policy == "write_through" else 18)
    done = np.searchsorted(np.sort(requests_df["finish"].dropna().to_numpy()), t,
                           side="right")
    hit_tokens = np.cumsum((device_hit + host_hit)[np.argsort(finish)])
    in_tokens = np.cumsum(input_tokens[np.argsort(finish)])
    hit_rate = np.where(done > 0, hit_tokens[np.maximum(done - 1, 0)] /
                        in_tokens[np.maximum(done - 1, 0)], 0.0)
    lb_cum = np.cumsum(load_back_tokens[np.argsort(start)])
    lb_idx = np.searchsorted(np.sort(start), t, side="right")
    timeseries = pd.DataFrame({
        "t": t, "device_used": device_used.astype(np.int64),
        "host_used": host_used.astype(np.int64), "duplicate_tokens": dup.astype(np.int64),
        "effective_tokens": effective.astype(np.int64),
        "device_capacity": np.full(len(t), DEVICE_TOKENS, dtype=np.int64),
        "host_capacity": np.full(len(t), host_cap, dtype=np.int64),
        "evicted_tokens": counter(30), "backup_tokens": backup,
        "reclaim_pass1_tokens": counter(5 if write_policy == "write_back" else 0),
        "reclaim_pass2_tokens": counter(2 if write_policy == "write_back" else 0),
        "host_evict_tokens": counter(12 / ratio), "drop_tokens": counter(3),
        "load_back_tokens": np.where(lb_idx > 0, lb_cum[np.maximum(lb_idx - 1, 0)], 0),
        "requests_done": done.astype(np.int64), "hit_rate": hit_rate,
    })

    total = int(input_tokens.sum())
    ttft = requests_df["ttft_s"].dropna().to_numpy()
    summary = {
        "requests": int(n),
        "hit_rate": float((device_hit + host_hit).sum() / total),
        "device_hit_rate": float(device_hit.sum() / total),
        "host_hit_rate": float(host_hit.sum() / total),
        "miss_rate": float(miss.sum() / total),
        "ttft_p50_s": float(np.quantile(ttft, 0.5)),
        "ttft_p99_s": float(np.quantile(ttft, 0.99)),
        "effective_tokens_mean": float(effective.mean()),
        "duplicate_share_mean": float(np.mean(np.divide(
            dup, device_used + host_used, out=np.zeros_like(dup),
            where=(device_used + host_used) > 0))),
        "host_tokens": host_cap, "device_tokens": DEVICE_TOKENS,
        "load_back_bytes": int(load_back_bytes.sum()),
        "backup_bytes": int(backup[-1]) * BYTES_PER_TOKEN,
        "bound_hit_rate": float(min(1.0, (device_hit + host_hit).sum() / total + 0.08)),
    }
    # meta.json as `hicache-sim run` writes it (bytes per token under "cost").
    meta = {"hicache_sim": "0.1.0", "seed": seed, "git_revision": "0123abcd",
            "cost_profile": "h200-sxm", "partial": partial, "python": "3.11.7",
            "scenario": scenario["name"], "requests_done": int(n), "halted": None,
            "cost": {"model": "llama-3.1-8b", "tp": 2, "page_size": PAGE,
                     "profile": "h200-sxm", "io_backend": "kernel"}}
    if bytes_known:
        meta["cost"]["bytes_per_token"] = BYTES_PER_TOKEN
    # divergence.json as sim/events.py writes it (the fields the report reads).
    divergence = {"verdict": "agree", "halted": None, "tp": 2, "cohorts": [[0, 1]],
                  "forks": [], "first_fork": None, "first_true_divergence": None,
                  "digest_mismatch": None, "detection_delay_s": None, "mismatch_steps": 0,
                  "collective_error": None, "batch_mismatch": None}
    if diverged:
        divergence.update({
            "verdict": "detected", "cohorts": [[0], [1]],
            "forks": [{"t": 3.0, "rank": 1, "why": "ack_local_drain"}],
            "first_true_divergence": {"t": 3.25, "step": 17, "ranks": [[0], [1]],
                                      "what": "tree contents differ",
                                      "summary": {"ranks 0": [1, 2], "ranks 1": [1, 3]}},
            "digest_mismatch": {"t": 4.5, "step": 22, "min": 11, "max": 12,
                                "digests": {"0": 11, "1": 12}, "message": "diverged"},
            "detection_delay_s": 1.25, "mismatch_steps": 3})
    requests_df.to_parquet(out / "requests.parquet", index=False)
    timeseries.to_parquet(out / "timeseries.parquet", index=False)
    (out / "scenario.yaml").write_text(yaml.safe_dump(scenario, sort_keys=False))
    (out / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    (out / "divergence.json").write_text(json.dumps(divergence, indent=2, sort_keys=True))
    return out


def build_sweep(out: Path, *, write_policies=("write_through", "write_back"),
                host_policies=("lru", "duplicate_first"), ratios=(1.0, 2.0, 4.0),
                seeds=(0, 1), requests: int = 120) -> Path:
    """Write a sweep folder: run folders under ``runs/`` and ``sweep.parquet``."""
    out = Path(out)
    rows = []
    for wp in write_policies:
        for hp in host_policies:
            for ratio in ratios:
                for seed in seeds:
                    run_dir = out / "runs" / f"{wp}-{hp}-x{ratio:g}-s{seed}"
                    build_run(run_dir, write_policy=wp, host_policy=hp, ratio=ratio,
                              seed=seed, requests=requests)
                    summary = json.loads((run_dir / "summary.json").read_text())
                    rows.append({"cache.host_policy": hp, "cache.write_policy": wp,
                                 "host.ratio": float(ratio),
                                 "workload.kind": "multi_turn_chat", "seed": seed,
                                 **summary,
                                 "results_dir": str(run_dir.relative_to(out))})
    pd.DataFrame(rows).to_parquet(out / "sweep.parquet", index=False)
    return out
