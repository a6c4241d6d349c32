"""Sizing as SGLang does it: the device pool from mem_fraction_static, the host pool's
auto-sizing, the node's RAM limit, --set switching units, host: off, cache_replay."""

from __future__ import annotations

import json

import pytest

import cli
from sim.errors import UserError
from sim.scenario import load_scenario, resolve_capacities, resolve_sizing
from sim.sizing import fmt_capacity, prefill_graph_sizes, sglang_mem_fraction_static

BASE = """\
name: t
model: {preset: llama-3.1-8b}
tp: 1
page_size: 64
cost: {profile: h100-sxm}
device:
  tokens: 16384
host:
  ratio: 2
workload:
  kind: multi_turn_chat
  num_requests: 20
  arrival: {process: poisson, rate: 5.0}
scheduler:
  max_running_requests: 8
"""


def scen(tmp_path, text=BASE, sets=()):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return load_scenario(p, list(sets))


def test_device_pool_from_mem_fraction_static_matches_a_hand_computation(tmp_path):
    s = scen(tmp_path, sets=["device.mem_fraction_static=0.9"])
    # H100 profile: 80 GiB. Llama-3.1-8B: 8.03e9 params x 2 bytes on one rank.
    # rest = 0.9 * 80 GiB - 16.06e9 B = 77,309,411,328 - 16,060,000,000 = 61,249,411,328 B;
    # 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 131,072 B/token
    # -> 467,296 tokens -> 7,301 pages of 64 = 467,264 tokens.
    dev, _ = resolve_capacities(s)
    assert dev == 467_264
    info = resolve_sizing(s)
    assert info["device_sizing"]["mem_fraction_static"] == 0.9
    assert info["device_sizing"]["weights_gb_per_rank"] == pytest.approx(16.06)


def test_sglang_default_mem_fraction_by_hand():
    # memory_hook.handle_gpu_memory_settings on an 80 GiB GPU at TP 8, chunked prefill
    # 8192: 512 + 8192 * 1.5 + 8 / 8 * 1024 + decode graph 512 * 2 + prefill graph
    # 58 buckets * 8 = 15,312 MiB (over the 10 GiB floor); (81,920 - 15,312) / 81,920.
    assert len(prefill_graph_sizes(8192)) == 58
    assert sglang_mem_fraction_static(80, 8, 8192, None, mla=False) == 0.813
    # A small max_running_requests caps the decode graph: 512 + 6144 + 128 + 2 * 16 + 464.
    f = sglang_mem_fraction_static(80, 1, 4096, 16, mla=False)
    assert f == round((81920 - max(512 + 6144 + 128 + 32 + 42 * 8, 10240)) / 81920, 3)


def test_weights_that_leave_no_kv_are_one_line(tmp_path):
    with pytest.raises(UserError) as e:
        scen(tmp_path, sets=["device.mem_fraction_static=0.1"])
    msg = str(e.value)
    assert "\n" not in msg and "device.mem_fraction_static" in msg and "raise it above" in msg


def test_host_auto_sized_from_the_node_ram(tmp_path):
    s = scen(tmp_path, sets=["device.tokens=262144", "host.host_memory_fraction=0.8",
                             "node={host_ram_gb: 60, gpus: 8}"])
    # One rank on the node (tp 1): budget = 60e9 - 10 GiB = 49.26e9 B; device buffers
    # (262,144 + 64) x 131,072 B = 34.37e9 B; ratio = min(2, budget x 0.8 x 0.95 / that) = 1.089.
    budget = 60e9 - 10 * 2**30
    ratio = min(2.0, budget * 0.8 * 0.95 / ((262_144 + 64) * 131_072))
    assert ratio == pytest.approx(1.0893, abs=1e-3)
    _, host = resolve_capacities(s)
    assert host == (int(262_144 * ratio) // 64 + 1) * 64
    # No explicit unit and a node: SGLang's default fraction 0.8 applies.
    s2 = scen(tmp_path, sets=["device.tokens=262144", "node={host_ram_gb: 60}"],
              text=BASE.replace("host:\n  ratio: 2\n", ""))
    assert resolve_capacities(s2)[1] == host
    # Without a node, a fraction has nothing to be a fraction of.
    with pytest.raises(UserError, match="node.host_ram_gb"):
        scen(tmp_path, sets=["host.host_memory_fraction=0.5"])


def test_node_ram_exceeded_refuses_with_one_line(tmp_path, capsys):
    p = tmp_path / "s.yaml"
    p.write_text(BASE.replace("tp: 1", "tp: 8").replace("llama-3.1-8b", "llama-3.1-70b"))
    # 8 ranks x 64 GB = 512 GB of host pools on a 256 GB node: SGLang refuses to start.
    rc = cli.main(["validate", str(p), "--set", "host.size_gb=64", "--set", "node={host_ram_gb: 256}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert "host.size_gb" in err and "Not enough host memory available" in err


def test_node_ram_exceeded_warns_in_the_console_and_summary(tmp_path, capsys):
    p = tmp_path / "s.yaml"
    p.write_text(BASE)
    out = tmp_path / "run"
    rc = cli.main(["run", str(p), "-o", str(out), "--quiet", "--set", "host.size_gb=20",
                   "--set", "node={host_ram_gb: 25, on_exceed: warn}"])
    cap = capsys.readouterr()
    assert rc == 0
    assert "warning: host pools of 20.0 GB per rank" in cap.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sizing_warnings"] and "exceed node.host_ram_gb" in summary["sizing_warnings"][0]
    assert summary["sizing"]["node"]["exceeds"] is True
    for key in ("device_gb", "host_gb", "bytes_per_token", "device_pages_mean", "host_pages_mean",
                "duplicate_pages_mean", "unique_pages_mean", "backup_failures", "diagnosis"):
        assert key in summary
    assert summary["bytes_per_token"] == 131_072
    assert summary["host_gb"] == pytest.approx(summary["host_tokens"] * 131_072 / 1e9)


def test_set_switches_the_sizing_unit(tmp_path):
    s = scen(tmp_path, sets=["host.size_gb=4"])  # the file says host.ratio
    assert s.host.ratio is None and s.host.size_gb == 4
    assert resolve_capacities(s)[1] == (int(4e9 // 131_072) // 64 + 1) * 64
    s = scen(tmp_path, sets=["device.gib=2"])  # the file says device.tokens
    assert s.device.tokens is None and resolve_capacities(s)[0] == 2 * 2**30 // 131_072
    s = scen(tmp_path, sets=["host=off"])
    assert s.host.off and resolve_capacities(s)[1] == 0
    s = scen(tmp_path, sets=["host=off", "host.ratio=3"])  # a unit on an off host turns it on
    assert s.host.ratio == 3
    # Two units in the file itself are still an error.
    with pytest.raises(UserError, match="one of tokens, gib, ratio, size_gb"):
        scen(tmp_path, BASE.replace("  ratio: 2\n", "  ratio: 2\n  size_gb: 4\n"))


def test_capacities_read_in_gb_with_tokens_beside():
    assert fmt_capacity(300_032, 40_960) == "12.3 GB (300,032 tokens)"


def test_cache_replay_is_a_preset_of_existing_knobs(tmp_path):
    s = scen(tmp_path, BASE.replace("  max_running_requests: 8\n", "  mode: cache_replay\n"))
    assert s.scheduler.max_running_requests == 1 and s.scheduler.decode is False
    with pytest.raises(UserError, match="cache_replay"):
        scen(tmp_path, BASE.replace("  max_running_requests: 8\n", "  mode: cache_replay\n  decode: true\n"))
    with pytest.raises(UserError, match="max_running_requests 8 with mode cache_replay"):
        scen(tmp_path, sets=["scheduler.mode=cache_replay"])
    # The preset is exactly those knobs: the same run, and not the serving run.
    from sim.runner import run_scenario

    preset = run_scenario(s).summary
    knobs = run_scenario(scen(tmp_path, sets=["scheduler.max_running_requests=1",
                                              "scheduler.decode=false"])).summary
    serving = run_scenario(scen(tmp_path)).summary
    assert preset == knobs
    assert preset["ttft_p99_s"] != serving["ttft_p99_s"]


def test_host_off_is_a_single_tier(tmp_path):
    from sim.runner import run_scenario

    s = scen(tmp_path, sets=["host=off"])
    out = run_scenario(s).summary
    assert out["host_tokens"] == 0 and out["host_hit_rate"] == 0.0
    assert out["diagnosis"].startswith("single tier")
