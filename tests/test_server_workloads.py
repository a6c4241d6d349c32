"""tools/sglang_server/gen_workloads.py and runconfig.py: the workloads and run configs
the server harness and the engine both run (no SGLang needed)."""

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "sglang_server"))

import gen_workloads as gw  # noqa: E402
import runconfig as rc  # noqa: E402


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("wl")
    assert gw.main(["-o", str(out)]) == 0
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    return out, manifest


def test_generation_is_deterministic(generated, tmp_path):
    out, _ = generated
    names = ["s01_shared_ps1", "m01_multiturn_ps1", "d02_decode_ps1_clip64"]
    assert gw.main(["-o", str(tmp_path), "--only", *names]) == 0
    for n in names:
        assert (tmp_path / f"{n}.jsonl").read_bytes() == (out / f"{n}.jsonl").read_bytes()


def test_the_manifest_covers_what_the_comparison_needs(generated):
    _, manifest = generated
    workloads = {c["workload"] for c in manifest}
    assert len(workloads) >= 40
    per = Counter((c["workload"], c["write_policy"], c["overlap"]) for c in manifest)
    assert len(per) == len(workloads) * 3 * 2 and set(per.values()) == {1}
    assert {c["page_size"] for c in manifest} == {1, 2, 4, 8, 16, 32, 64}
    assert {c["schedule_policy"] for c in manifest} == set(rc.SCHEDULE_POLICIES)
    assert {c["clip_max_new_tokens"] for c in manifest} == {None, 64}
    assert any(0 < c["chunked_prefill_size"] < 128 for c in manifest)
    assert any(c["chunked_prefill_size"] == -1 for c in manifest)


def test_every_trace_is_a_generic_trace_with_prefix_ids(generated):
    from sim.workloads.traces import GenericReader

    out, manifest = generated
    for name in sorted({c["workload"] for c in manifest}):
        path = out / f"{name}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert sum(1 for _ in GenericReader(path)) == len(rows)
        steps = [r["arrival_step"] for r in rows]
        assert steps == sorted(steps) and all(type(s) is int for s in steps)
        assert all(r["arrival_s"] == round(r["arrival_step"] * rc.STEP_SECONDS, 6) for r in rows)
        # prefix ids: an id always sits at one position after one predecessor
        seen = {}
        for r in rows:
            for i, b in enumerate(r["blocks"]):
                key = (i, r["blocks"][i - 1] if i else None)
                assert seen.setdefault(b, key) == key, (name, b)
        # a partial last block is never shared
        partial = Counter(r["blocks"][-1] for r in rows if r["input_len"] % r["block_size"])
        assert all(n == 1 for n in partial.values()), name
        # no two distinct blocks start with the same harness token
        firsts = {}
        for r in rows:
            for b in r["blocks"]:
                assert firsts.setdefault(gw.first_token(b), b) == b, (name, b)


def test_first_token_is_the_harness_token_map():
    import zlib

    # server_oracle.stable_tok("b", b, 0): lo 3, span 30000, crc32 of "b:<id>:0"
    for b in (1, 7, 12345):
        assert gw.first_token(b) == 3 + zlib.crc32(f"b:{b}:0".encode()) % 30000


def test_a_run_config_maps_to_both_sides(generated):
    _, manifest = generated
    cfg = next(c for c in manifest if c["clip_max_new_tokens"] == 64 and c["overlap"])
    args = rc.harness_args(cfg)
    assert "--overlap" in args and "--hicache" in args
    assert args[args.index("--hicache-write-policy") + 1] == cfg["write_policy"]
    assert "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION=64" in args
    assert f"random_seed={cfg['seed']}" in args
    scn = rc.engine_scenario(cfg, cfg["trace"])
    assert scn["engine"] == {"clock": "steps", "ack_delay_steps": {"d2h": cfg["d2h_delay_steps"],
                                                                  "h2d": cfg["h2d_delay_steps"]}}
    assert scn["scheduler"]["overlap"] is True and scn["scheduler"]["clip_max_new_tokens"] == 64
    assert scn["cache"]["tree_core"] == cfg["tree_core"] and scn["page_size"] == cfg["page_size"]
    assert scn["workload"] == {"kind": "trace", "format": "generic", "path": cfg["trace"],
                               "block_size": cfg["block_size"]}
    plain = next(c for c in manifest if c["clip_max_new_tokens"] is None and not c["overlap"]
                 and c["chunked_prefill_size"] == -1)
    assert "--overlap" not in rc.harness_args(plain)
    assert not any(a.startswith("SGLANG_CLIP") for a in rc.harness_args(plain))
    s = rc.engine_scenario(plain, plain["trace"])["scheduler"]
    assert s["chunked_prefill_tokens"] is None and s["clip_max_new_tokens"] == rc.SGLANG_DEFAULT_CLIP


def test_a_bad_run_config_is_one_line():
    cfg = dict(gw.BASE, run="x", workload="x", trace="x.jsonl", seed=1, write_policy="write_around",
               overlap=False)
    with pytest.raises(rc.ConfigError, match=r"^m:3: write_policy = 'write_around'; expected one of"):
        rc.validate(cfg, "m:3")
    cfg.pop("seed")
    with pytest.raises(rc.ConfigError, match="found no seed"):
        rc.validate(cfg, "m:3")


def test_a_missing_harness_is_one_line_naming_where_it_comes_from(monkeypatch, tmp_path):
    monkeypatch.setenv(rc.SERVER_ENV, str(tmp_path / "nowhere"))
    why = rc.check_server()
    assert why.startswith(f"{tmp_path / 'nowhere'}: found no server_oracle.py")
    assert "../shared/oracle/server" in why and "\n" not in why


def test_run_harness_without_a_manifest_or_harness_is_one_line(tmp_path):
    import subprocess

    done = subprocess.run([sys.executable, str(REPO / "tools" / "sglang_server" / "run_harness.py"),
                           "--manifest", str(tmp_path / "absent.jsonl"), "--cache", str(tmp_path / "c")],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "found no" in done.stderr
    assert not (tmp_path / "c").exists()
