"""Scenario schema, loading, overrides, capacities, one-line errors and `validate`."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cli
from sim.costs import MODEL_PRESETS
from sim.errors import UserError
from sim.scenario import (
    Scenario,
    dump_resolved,
    load_scenario,
    resolve_capacities,
    scenario_from_dict,
)
from sim.workloads import build_workload

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))

MINIMAL = """\
name: t
model:
  preset: llama-3.1-8b
tp: 2
page_size: 64
device:
  tokens: 16384
workload:
  kind: uniform
  num_requests: 10
"""


def write(tmp_path, text: str, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def error_of(path, overrides=()) -> str:
    with pytest.raises(UserError) as e:
        load_scenario(path, overrides)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# -- shipped scenarios -------------------------------------------------------------------


def test_every_required_scenario_is_shipped():
    names = {p.stem for p in SCENARIOS}
    assert {
        "quickstart", "capacity_wb_vs_wt", "host_pressure_reclaim", "jitter_ack_delay",
        "jitter_ack_local", "jitter_pre_26921", "jitter_host_alloc_failure",
        "jitter_host_capacity_skew", "jitter_id_drift", "jitter_request_order",
        "jitter_device_capacity_skew", "jitter_device_free_delay",
        "jitter_write_through_alloc_failure",
        "mooncake_conversation", "mooncake_synthetic", "agentic_claude_code",
    } <= names
    readme = (ROOT / "scenarios" / "README.md").read_text()
    for n in names:
        assert f"`{n}.yaml`" in readme


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_shipped_scenario_validates_and_starts(path):
    s = load_scenario(path)
    assert s.name == path.stem
    assert path.read_text().startswith("#")  # each file explains what it shows
    dev, host = resolve_capacities(s)
    assert dev % s.page_size == 0 and host % s.page_size == 0
    assert host > 0 or s.host.off  # host: off (mooncake_fig9) is a single tier
    first = next(iter(build_workload(s)))
    assert first.rid == 0


def test_validate_command_on_all_shipped(capsys):
    rc = cli.main(["validate", *map(str, SCENARIOS)])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert len(out) == len(SCENARIOS) and all(line.startswith("OK ") for line in out)


def test_validate_command_reports_each_error_and_exits_2(tmp_path, capsys):
    bad = write(tmp_path, MINIMAL.replace("tp: 2", "tp: 3"), "bad.yaml")
    good = write(tmp_path, MINIMAL, "good.yaml")
    rc = cli.main(["validate", str(bad), str(good)])
    cap = capsys.readouterr()
    assert rc == 2
    assert cap.out.startswith(f"OK {good}") and "(16,384 tokens)" in cap.out
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and f"{bad}:4: tp:" in err[0]


def test_validate_subprocess_exit_code(tmp_path):
    bad = write(tmp_path, MINIMAL + "bogus: 1\n")
    r = subprocess.run([sys.executable, str(ROOT / "cli.py"), "validate", str(bad)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


# -- capacities --------------------------------------------------------------------------


def bpt(preset="llama-3.1-8b", tp=2):
    return MODEL_PRESETS[preset].bytes_per_token(tp)


def caps(tmp_path, extra: str) -> tuple[int, int]:
    return resolve_capacities(load_scenario(write(tmp_path, MINIMAL + extra)))


def test_host_ratio_follows_sglang_geometry(tmp_path):
    # size = floor(16384 * 1.3) = 21299; pages = 21299 // 64 + 1 = 333
    assert caps(tmp_path, "host: {ratio: 1.3}\n") == (16384, 333 * 64)
    # the default ratio is SGLang's 2.0: one extra page on top of 2 x device
    assert caps(tmp_path, "") == (16384, 16384 * 2 + 64)


def test_host_size_gb_uses_1e9_bytes_and_bytes_per_token(tmp_path):
    size = math.floor(3 * 10**9 / bpt())
    assert caps(tmp_path, "host: {size_gb: 3}\n") == (16384, (size // 64 + 1) * 64)


def test_host_tokens_are_taken_as_is(tmp_path):
    assert caps(tmp_path, "host: {tokens: 640}\n") == (16384, 640)


def test_device_gib_rounds_down_to_pages(tmp_path):
    text = MINIMAL.replace("tokens: 16384", "gib: 1.5")
    dev, _ = resolve_capacities(load_scenario(write(tmp_path, text)))
    assert dev == math.floor(1.5 * 2**30 / bpt()) // 64 * 64


def test_mla_and_custom_models(tmp_path):
    text = MINIMAL.replace("  preset: llama-3.1-8b\n",
                           "  layers: 4\n  q_heads: 8\n  head_dim: 64\n  params_b: 1\n"
                           "  mla: {kv_lora_rank: 512, qk_rope_head_dim: 64}\n").replace("tp: 2", "tp: 3")
    s = load_scenario(write(tmp_path, text))
    assert s.model.spec().bytes_per_token(3) == 4 * 576 * 2  # replicated latent
    assert load_scenario(write(tmp_path, MINIMAL.replace("tp: 2", "tp: 6").replace(
        "llama-3.1-8b", "deepseek-v3"))).tp == 6


# -- one-line errors -----------------------------------------------------------------------


def test_unknown_key_names_line_and_suggests(tmp_path):
    p = write(tmp_path, MINIMAL.replace("  tokens: 16384", "  tokens: 16384\n  tokenz: 1"))
    msg = error_of(p)
    assert msg.startswith(f"{p}:8: device.tokenz: found unknown key 'tokenz'")
    assert "did you mean 'tokens'" in msg


def test_bad_enum_lists_the_names(tmp_path):
    p = write(tmp_path, MINIMAL + "cache:\n  write_policy: write_behind\n")
    msg = error_of(p)
    assert f"{p}:12: cache.write_policy: found 'write_behind'" in msg
    for name in ("write_back", "write_through", "write_through_selective"):
        assert name in msg


def test_wrong_type_and_bool_are_rejected(tmp_path):
    assert "found 'two'" in error_of(write(tmp_path, MINIMAL.replace("tp: 2", "tp: two")))
    assert "boolean" in error_of(write(tmp_path, MINIMAL.replace("tp: 2", "tp: yes")))
    assert "found nan" in error_of(write(tmp_path, MINIMAL + "host: {ratio: .nan}\n"))


def test_unknown_workload_kind_lists_kinds(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL.replace("kind: uniform", "kind: chat")))
    assert ":9: workload.kind: found kind 'chat'" in msg and "multi_turn_chat" in msg


def test_missing_required_key(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL.replace("page_size: 64\n", "")))
    assert "page_size: found no value" in msg


def test_missing_trace_file_is_resolved_from_the_scenario_folder(tmp_path):
    text = MINIMAL.replace("  kind: uniform\n  num_requests: 10\n",
                           "  kind: trace\n  format: mooncake\n  path: t.jsonl\n")
    p = write(tmp_path, text)
    msg = error_of(p)
    assert f"{p}:11: workload.path: found 't.jsonl'" in msg and f"root: {tmp_path}," in msg
    (tmp_path / "t.jsonl").write_text("")
    sub = tmp_path / "elsewhere"
    sub.mkdir()
    import os
    old = os.getcwd()
    os.chdir(sub)
    try:
        assert load_scenario(p).workload.path == str(tmp_path / "t.jsonl")
    finally:
        os.chdir(old)


def test_tp_must_divide_or_multiply_kv_heads(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL.replace("tp: 2", "tp: 3")))
    assert ":4: tp: found tp 3 with 8 KV heads" in msg
    assert load_scenario(write(tmp_path, MINIMAL.replace("tp: 2", "tp: 16"))).tp == 16


def test_device_not_a_page_multiple_gives_the_nearest(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL.replace("16384", "16400")))
    assert ":7: device.tokens: found 16400 tokens" in msg and "16384 or 16448" in msg


def test_host_smaller_than_one_page(tmp_path):
    assert "at least one page" in error_of(write(tmp_path, MINIMAL + "host: {ratio: 0.001}\n"))
    assert "host.tokens" in error_of(write(tmp_path, MINIMAL + "host: {tokens: 32}\n"))
    assert "one of tokens" in error_of(write(tmp_path, MINIMAL + "host: {tokens: 640, ratio: 2}\n"))


def test_page_size_must_fit_the_block_size(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL.replace("page_size: 64", "page_size: 48")
                         .replace("16384", "16320")))
    assert "page_size 48 with block_size 64" in msg


def test_jitter_ranks_must_exist(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL + "jitter:\n  host_alloc_failure: {probability: 0.1, ranks: [2]}\n"))
    assert "jitter.host_alloc_failure.ranks: found rank 2" in msg
    msg = error_of(write(tmp_path, MINIMAL + "jitter:\n  ack_delay: {dist: lognormal, mean: 0.1}\n"))
    assert "jitter.ack_delay.cv: found no 'cv'" in msg
    msg = error_of(write(tmp_path, MINIMAL + "jitter:\n  ack_delay: {dist: gamma}\n"))
    assert "'exponential'" in msg and "'lognormal'" in msg


def test_invalid_yaml_and_non_mapping(tmp_path):
    assert re.search(r":2: found invalid YAML", error_of(write(tmp_path, "name: [\n")))
    assert "found a YAML list" in error_of(write(tmp_path, "- 1\n"))
    assert "empty file" in error_of(write(tmp_path, ""))
    assert "no such file" in error_of(tmp_path / "nope.yaml")
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"name: \xff\n")
    assert "UTF-8" in error_of(p)


# -- overrides -----------------------------------------------------------------------------


def test_set_overrides_values_and_creates_sections(tmp_path):
    p = write(tmp_path, MINIMAL)
    s = load_scenario(p, ["workload.rate_scale=2.5", "jitter.ack_delay.dist=exponential",
                          "jitter.ack_delay.mean=0.001", "cache.write_policy=write_back",
                          "jitter.host_capacity_skew.1=-128"])
    assert s.workload.rate_scale == 2.5
    assert s.jitter.ack_delay.dist == "exponential" and s.jitter.ack_delay.mean == 0.001
    assert s.cache.write_policy == "write_back"
    assert s.jitter.host_capacity_skew == {1: -128}


def test_set_unknown_key_lists_close_matches(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL), ["workload.num_request=5"])
    assert msg.startswith("--set workload.num_request: found unknown key 'num_request'")
    assert "did you mean num_requests" in msg


def test_set_bad_value_points_at_the_override(tmp_path):
    p = write(tmp_path, MINIMAL)
    msg = error_of(p, ["tp=5"])
    assert msg.startswith(f"{p} (--set tp): tp: found tp 5")
    assert "KEY.PATH=VALUE" in error_of(p, ["tp"])


def test_set_into_a_mix_part(tmp_path):
    text = MINIMAL.replace("  kind: uniform\n  num_requests: 10\n",
                           "  kind: mix\n  parts:\n    - {kind: uniform, num_requests: 5}\n"
                           "    - {kind: few_shot, num_requests: 5}\n")
    s = load_scenario(write(tmp_path, text), ["workload.parts.1.num_templates=3"])
    assert s.workload.parts[1].num_templates == 3
    assert "num_templates" in error_of(write(tmp_path, text), ["workload.parts.0.num_templates=3"])


# -- dump ------------------------------------------------------------------------------------


# the shipped scenarios, and the regressions that run on the step clock (their
# resolved file must keep it: `engine.clock` changes the run)
STEP_CLOCK = [p for p in sorted((ROOT / "scenarios" / "regressions").glob("*.yaml"))
              if "clock: steps" in p.read_text()]


@pytest.mark.parametrize("path", SCENARIOS + STEP_CLOCK, ids=lambda p: p.stem)
def test_dump_resolved_round_trips(tmp_path, path):
    s = load_scenario(path)
    text = dump_resolved(s)
    assert text == dump_resolved(load_scenario(path))  # deterministic
    # a regression's trace sits beside it, outside the resolved file's roots
    again = load_scenario(write(tmp_path, text, "resolved.yaml"), trace_roots=[path.parent])
    engine = s.engine.model_dump()
    for key in ("replicas", "decode_runs", "check_invariants"):  # bookkeeping: not written
        engine.pop(key)
    assert {k: v for k, v in again.engine.model_dump().items() if k in engine} == engine
    assert again.model_dump(exclude={"engine"}) == s.model_dump(exclude={"engine"})
    assert resolve_capacities(again) == resolve_capacities(s)
    assert f"({resolve_capacities(s)[0]:,} tokens)" in text.splitlines()[1]


def test_scenario_from_dict_matches_the_file(tmp_path):
    p = write(tmp_path, MINIMAL)
    assert scenario_from_dict(yaml.safe_load(MINIMAL)).model_dump() == load_scenario(p).model_dump()
    assert Scenario.model_config["extra"] == "forbid"


# -- fuzzing ---------------------------------------------------------------------------------

QUICK = (ROOT / "scenarios" / "quickstart.yaml").read_text()
FUZZ_HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


def _clean(path, overrides=()):
    try:
        load_scenario(path, overrides)
    except UserError as err:
        assert "\n" not in str(err)


@settings(suppress_health_check=FUZZ_HEALTH)
@given(data=st.binary(max_size=300))
def test_random_bytes_give_one_line(tmp_path, data):
    p = tmp_path / "f.yaml"
    p.write_bytes(data)
    _clean(p)


@settings(suppress_health_check=FUZZ_HEALTH)
@given(edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 2),
                                st.sampled_from(list(":-{}[],'\"#&*!|>% \n\tx0.9"))),
                      min_size=1, max_size=6))
def test_mutated_yaml_gives_one_line(tmp_path, edits):
    s = list(QUICK)
    for pos, op, ch in edits:
        i = pos % max(len(s), 1)
        if op == 0 and s:
            del s[i]
        elif op == 1:
            s.insert(i, ch)
        elif s:
            s[i] = ch
    p = tmp_path / "m.yaml"
    p.write_text("".join(s))
    _clean(p)


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_KEYS = sorted({".".join(k) for k in [
    ("name",), ("seed",), ("tp",), ("page_size",), ("model",), ("model", "preset"),
    ("model", "mla"), ("device", "tokens"), ("device", "gib"), ("host", "ratio"),
    ("host", "size_gb"), ("host",), ("cache", "write_policy"), ("cost", "profile"),
    ("jitter", "ack_delay"), ("jitter", "host_capacity_skew"), ("jitter", "id_drift"),
    ("workload",), ("workload", "kind"), ("workload", "arrival"), ("workload", "turns"),
    ("workload", "user_tokens", "dist"), ("limits", "duration_s"), ("scheduler",),
]})


@settings(suppress_health_check=FUZZ_HEALTH)
@given(key=st.sampled_from(_KEYS), value=_VALUES)
def test_random_values_at_real_keys_give_one_line(tmp_path, key, value):
    data = yaml.safe_load(QUICK)
    cur = data
    parts = key.split(".")
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value
    p = tmp_path / "v.yaml"
    p.write_text(yaml.safe_dump(data))
    _clean(p)


@settings(suppress_health_check=FUZZ_HEALTH)
@given(items=st.lists(st.text(max_size=30), max_size=3))
def test_random_overrides_give_one_line(tmp_path, items):
    p = tmp_path / "o.yaml"
    p.write_text(QUICK)
    _clean(p, items)
