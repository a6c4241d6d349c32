"""MLA host dedup (mem_cache/mla_host_dedup.py): sizing, plan's per-node figure, costs.

data/sizing/mla_dedup.json holds SGLang 0.5.23's own pool sizes
(tools/sglang_sizing/mla_dedup_sizing.py builds MLATokenToKVPoolHost).
"""

import json
import subprocess
import sys

import pytest

from conftest import ROOT
from sim.resolve import from_scenario
from sim.runner import run_scenario
from sim.scenario import load_scenario, resolve_sizing

SCN = ROOT / "scenarios" / "deepseek_mla_dedup.yaml"
CASES = json.loads((ROOT / "data" / "sizing" / "mla_dedup.json").read_text())
CLI = [sys.executable, str(ROOT / "cli.py")]


def _scenario(c, dedup: bool):
    host = f"{{size_gb: {c['hicache_size']}}}" if c["hicache_size"] else f"{{ratio: {c['hicache_ratio']}}}"
    sets = [f"tp={c['tp']}", f"page_size={c['page_size']}", f"device={{tokens: {c['device_tokens']}}}",
            f"host={host}", f"host.mla_dedup={str(dedup).lower()}",
            f"node={{host_ram_gb: 4096, gpus: {c['tp']}}}", f"workload.block_size={c['page_size']}"]
    return load_scenario(SCN, sets)


@pytest.mark.parametrize("c", CASES, ids=lambda c: f"tp{c['tp']}-ps{c['page_size']}")
def test_host_sizing_matches_sglangs_pools(c):
    for dedup in (False, True):
        info = resolve_sizing(_scenario(c, dedup))
        assert info["host_tokens"] == c["host_tokens"]
        assert info["bytes_per_token"] == c["size_per_token"]
        want = c["node_bytes_dedup_on"] if dedup else c["node_bytes_dedup_off"]
        assert info["node"]["host_gb_per_node"] * 1e9 == pytest.approx(want, rel=1e-12)


def _plan(tmp_path, dedup: bool) -> dict:
    out = tmp_path / f"plan_{dedup}"
    p = subprocess.run(CLI + ["plan", str(SCN), "--set", f"host.mla_dedup={str(dedup).lower()}",
                              "--check-points", "2", "--policies", "write_back+duplicate_first",
                              "--target-hit-rate", "0.5", "-o", str(out)],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    import pandas as pd
    return {"doc": json.loads((out / "plan.json").read_text()),
            "df": pd.read_parquet(out / "plan.parquet"), "stdout": p.stdout}


def test_plan_per_node_host_with_dedup_on_and_off(tmp_path):
    off, on = _plan(tmp_path, False), _plan(tmp_path, True)
    # per rank the same pool, per node 8 copies vs one
    assert off["doc"]["host_copies_per_node"] == 8 and on["doc"]["host_copies_per_node"] == 1
    # the scenario's own pool, per node, as SGLang's MLATokenToKVPoolHost sizes it
    sg = next(c for c in CASES if (c["device_tokens"], c["hicache_size"]) == (8192, 4))
    for r, key in ((off, "node_bytes_dedup_off"), (on, "node_bytes_dedup_on")):
        d = r["doc"]
        assert d["scenario_host_tokens_per_rank"] == sg["host_tokens"]
        per_node = d["scenario_host_tokens_per_rank"] * d["bytes_per_token"] * d["host_copies_per_node"]
        assert per_node == sg[key]
        assert d["node"]["host_gb_per_node"] * 1e9 == pytest.approx(sg[key], rel=1e-12)
    for r in (off, on):
        df = r["df"]
        k = r["doc"]["host_copies_per_node"]
        assert (df["host_gb_per_node"] == df["host_gb_per_rank"] * k).all()
    v_off = off["doc"]["policies"][0]["target_hit_rate_gb_per_rank"]
    v_on = on["doc"]["policies"][0]["target_hit_rate_gb_per_rank"]
    assert v_off == pytest.approx(v_on)  # dedup changes bytes, not what hits
    assert f"{v_off * 8:,.1f} GB per node of 8 ranks" in off["stdout"]
    assert f"{v_on:,.1f} GB per node of 8 ranks, 1 host copy (MLA host dedup)" in on["stdout"]


def test_dedup_load_back_is_the_owners_h2d_plus_the_broadcast():
    s = load_scenario(SCN)
    _, plain = from_scenario(s)
    _, dd = from_scenario(load_scenario(SCN, ["host.mla_dedup=true"]))
    for tokens in (64, 4096, 200_000):
        h = plain.h2d_time(tokens)
        d = dd.h2d_time(tokens)
        L = dd.layers
        calls = -(-tokens // (L * 2048))
        bcast_layer = calls * dd.profile.allreduce_nccl_us * 1e-6 + \
            tokens * dd.bytes_per_token / L / (dd.profile.nvlink_gbps * 1e9)
        lay = h / L
        assert d == pytest.approx(L * max(lay, bcast_layer) + min(lay, bcast_layer))
        assert d > h
    assert dd.h2d_time(0) == plain.h2d_time(0) == 0.0


def test_dedup_changes_the_run():
    ra = run_scenario(load_scenario(SCN))
    rb = run_scenario(load_scenario(SCN, ["host.mla_dedup=true"]))
    assert ra.summary["hit_rate"] == rb.summary["hit_rate"]  # the same tree on every rank
    a, b = ra.sim.requests_df(), rb.sim.requests_df()
    loaded = a["load_back_tokens"] > 0
    assert loaded.sum() > 10 and (a["load_back_tokens"] == b["load_back_tokens"]).all()
    # every load-back pays the broadcast's last layer on top of the owner's H2D
    assert (b.loc[loaded, "load_back_s"] > a.loc[loaded, "load_back_s"]).all()


@pytest.mark.parametrize("sets, words", [
    (["model={preset: llama-3.1-70b}"], "non-MLA model"),
    (["tp=1", "node={host_ram_gb: 2048, gpus: 8}"], "tp 1"),
    (["host={tokens: 0}"], "host off"),
    (["storage={backend: mooncake}"], "storage backend 'mooncake'"),
])
def test_dedup_refused_where_sglang_would_not_engage_it(sets, words):
    p = subprocess.run(CLI + ["validate", str(SCN)] + [x for s in sets for x in ("--set", s)]
                       + ["--set", "host.mla_dedup=true"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and words in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
