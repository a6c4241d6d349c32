"""`hicache-sim import`: SGLang 0.5.23's crash and request dumps in, read safely.

The dumps under data/dumps/ were written by SGLang's own code
(tools/sglang_dumps/make_dumps.py calls the real TokenizerManager
dump_requests_before_crash / dump_requests); crash_dump_tp8.expected.json is what
SGLang's own unpickler read from the crash dump.
"""

import json
import os
import pickle
import subprocess
import sys

import pandas as pd
import pytest

from conftest import ROOT
from sim.imports import crashdump, unpickle
from sim.imports.build import page_ids

CLI = [sys.executable, str(ROOT / "cli.py")]
DUMPS = ROOT / "data" / "dumps"
CRASH = DUMPS / "crash_dump_tp8.pkl"


def cli(*args):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, cwd=ROOT)


def test_crash_dump_reads_as_sglang_reads_it():
    exp = json.loads((DUMPS / "crash_dump_tp8.expected.json").read_text())
    d = crashdump.read(CRASH)
    assert d.kind == "crash"
    assert d.server_args["tp_size"] == exp["tp_size"] == 8
    assert d.server_args["page_size"] == exp["page_size"]
    assert d.launch_command == exp["launch_command"]
    want = sorted(exp["requests"], key=lambda r: (r["created"], r["rid"]))
    assert [r.rid for r in d.requests] == [r["rid"] for r in want]
    for got, w in zip(d.requests, want):
        assert list(got.input_ids) == w["input_ids"]
        assert got.created == w["created"] and got.finished == w["finished"]
        assert got.cached_tokens == w["cached_tokens"]
        assert got.output_len == w["output_len"]
    # the one request in flight at the crash: output so far, no meta_info
    assert [r.done for r in d.requests] == [True] * 5 + [False]


def test_request_dump_folder_reads_every_file():
    d = crashdump.read(DUMPS / "request_dumps")
    assert d.kind == "requests" and len(d.requests) == 6 and all(r.done for r in d.requests)
    crash = crashdump.read(CRASH)
    assert [r.input_ids for r in d.requests] == [r.input_ids for r in crash.requests]


def test_page_ids_are_prefix_ids():
    a = tuple(range(40))
    b = tuple(range(32)) + (99,) * 8
    pa, pb = page_ids(a, 16), page_ids(b, 16)
    assert len(pa) == 2 and pa[:2] == pb[:2]  # the tail (8 tokens) is not a full page
    c = (7,) * 16 + tuple(range(16, 32))
    assert page_ids(c, 16)[1] != pa[1]  # same page tokens, other prefix: other id


def test_import_then_run_reproduces_the_traffic(tmp_path):
    out = tmp_path / "imp"
    p = cli("import", CRASH, "-o", out)
    assert p.returncode == 0, p.stderr
    text = (out / "scenario.yaml").read_text()
    assert "tp_size = 8 -> tp: 8" in text and "schedule_policy = 'lpm'" in text
    unmapped = json.loads((out / "unmapped.json").read_text())
    assert any(u["field"] == "schedule_policy" for u in unmapped)
    res = tmp_path / "res"
    p = cli("run", out / "scenario.yaml", "-o", res, "--quiet")
    assert p.returncode == 0, p.stderr
    req = pd.read_parquet(res / "requests.parquet").sort_values("arrival")
    d = crashdump.read(CRASH)
    t0 = d.requests[0].created
    assert list(req["input_tokens"]) == [len(r.input_ids) for r in d.requests]
    assert req["arrival"].tolist() == pytest.approx([r.created - t0 for r in d.requests], abs=1e-5)
    assert list(req["miss_tokens"] + req["device_hit_tokens"] + req["host_hit_tokens"]) == \
        [len(r.input_ids) for r in d.requests]
    # The shared 160-token document prefix (10 pages of 16) hits for the 4 later requests.
    hit = (req["device_hit_tokens"] + req["host_hit_tokens"]).tolist()
    assert hit == [0, 0, 160, 160, 160, 160]


@pytest.mark.parametrize("name, words", [
    ("hostile_unknown_class.pkl", "evil.module.Gadget"),
    ("hostile_reduce.pkl", "open"),
    ("hostile_truncated.pkl", "not a complete pickle"),
    ("hostile_deep.pkl", "nested deeper"),
])
def test_hostile_dumps_are_refused_in_one_line(tmp_path, name, words):
    p = cli("import", DUMPS / name, "-o", tmp_path / "o")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and str(DUMPS / name) in lines[0], p.stderr
    assert not (tmp_path / "o").exists()


def test_vendored_reduce_payload_never_runs(tmp_path):
    target = "/tmp/hicache_sim_pwned_by_dump"
    assert not os.path.exists(target)
    with pytest.raises(unpickle.Refused):
        crashdump.read(DUMPS / "hostile_reduce.pkl")
    assert not os.path.exists(target)


class _Payload:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_live_file_writing_payload_is_refused_and_never_executed(tmp_path):
    live = tmp_path / "live"
    pickle.loads(pickle.dumps(_Payload(str(live)))).close()  # the payload is real:
    assert live.exists()  # a plain pickle.load writes the file
    target = tmp_path / "never"
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(pickle.dumps({"server_args": None, "requests": [_Payload(str(target))]}))
    p = cli("import", bad, "-o", tmp_path / "o")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "builtins.open" in p.stderr or "io.open" in p.stderr
    assert not target.exists()
    # find_class is the boundary on its own too (no pre-scan): still refused, not run
    import io
    with pytest.raises(pickle.UnpicklingError):
        unpickle._Restricted(io.BytesIO(bad.read_bytes())).load()
    assert not target.exists()


def test_huge_list_is_refused_by_the_element_bound(tmp_path):
    huge = tmp_path / "huge.pkl"
    huge.write_bytes(pickle.dumps({"server_args": None, "requests": [0] * 300_000}))
    p = cli("import", huge, "-o", tmp_path / "o", "--max-items", 200_000)
    assert p.returncode == 2 and "more than 200,000 pickle opcodes" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_size_bound_is_checked_before_parsing(tmp_path):
    p = cli("import", CRASH, "-o", tmp_path / "o", "--max-bytes", 1000)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert str(CRASH) in p.stderr


def test_a_value_with_a_newline_stays_in_the_comment(tmp_path):
    d = crashdump.read(CRASH)
    d.launch_command = "python -m sglang.launch_server\nname: injected"
    d.server_args = dict(d.server_args, schedule_policy="lpm\ntp: 64")
    from sim.imports.build import write
    from sim.scenario import load_scenario
    write(d, tmp_path / "o")
    s = load_scenario(tmp_path / "o" / "scenario.yaml")
    assert s.name == "dump_crash_dump_tp8" and s.tp == 8


def test_dump_without_server_args_is_refused(tmp_path):
    bad = tmp_path / "none.pkl"
    bad.write_bytes(pickle.dumps({"server_args": None, "resolved_config": None, "requests": []}))
    p = cli("import", bad, "-o", tmp_path / "o")
    assert p.returncode == 2 and "no server args" in p.stderr


from hypothesis import given, strategies as st  # noqa: E402

_RAW = CRASH.read_bytes()


@given(st.lists(st.tuples(st.integers(0, len(_RAW) - 1), st.integers(0, 255)), min_size=1,
                max_size=8), st.integers(16, len(_RAW)))
def test_a_damaged_dump_is_read_or_refused_never_a_traceback(edits, cut):
    data = bytearray(_RAW[:cut])
    for pos, byte in edits:
        if pos < len(data):
            data[pos] = byte
    try:
        obj = unpickle.loads(bytes(data), "fuzz.pkl")
    except unpickle.Refused as err:
        assert "\n" not in str(err) and str(err).startswith("fuzz.pkl: ")
        return
    # what loads holds only plain values and stand-ins
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif isinstance(o, unpickle.StandIn):
            stack.extend(o.__dict__.values())
        else:
            assert o is None or isinstance(o, (bool, int, float, str, bytes, bytearray, complex)), type(o)


def test_a_field_shadowing_the_readers_methods_is_refused(tmp_path):
    # GLOBAL GenerateReqInput, EMPTY_TUPLE, NEWOBJ, {"get": None}, BUILD: a stand-in whose
    # state would replace the .get the reader calls
    payload = (b"\x80\x02}X\x08\x00\x00\x00requests]"
               b"csglang.srt.managers.io_struct\nGenerateReqInput\n)\x81}X\x03\x00\x00\x00getNsbas.")
    with pytest.raises(unpickle.Refused, match="a field 'get'"):
        unpickle.loads(payload, "x.pkl")


def test_an_mla_servers_dump_gives_an_mla_model(tmp_path):
    """DeepSeek-V3 geometry (tools/sglang_dumps/deepseek_v3_tiny): the ModelConfig's MLA
    dims, so the host pool is sized as SGLang's MLATokenToKVPoolHost (576 dims x 2 bytes x
    2 layers per token; --hicache-size 4: int(4e9 // 2304) tokens, whole pages + 1)."""
    out = tmp_path / "o"
    p = cli("import", DUMPS / "crash_dump_dsv3_tp8.pkl", "-o", out)
    assert p.returncode == 0, p.stderr
    from sim.scenario import load_scenario, resolve_sizing
    s = load_scenario(out / "scenario.yaml")
    assert s.model.mla.kv_lora_rank == 512 and s.model.mla.qk_rope_head_dim == 64
    assert s.model.head_dim == 192 and s.model.layers == 2 and s.tp == 8
    info = resolve_sizing(s)
    assert info["bytes_per_token"] == 2 * 576 * 2
    assert info["host_tokens"] == (int(4e9 // 2304) // 64 + 1) * 64


def test_import_is_deterministic(tmp_path):
    for d in ("a", "b"):
        p = cli("import", CRASH, "-o", tmp_path / d, "--name", "same")
        assert p.returncode == 0, p.stderr
    for f in ("scenario.yaml", "trace.jsonl", "unmapped.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()


def test_import_replaces_only_its_own_output(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    p = cli("import", CRASH, "-o", other)
    assert p.returncode == 2 and "import.json" in p.stderr and (other / "keep.txt").exists()
    assert cli("import", CRASH, "-o", tmp_path / "o").returncode == 0
    assert cli("import", CRASH, "-o", tmp_path / "o").returncode == 0  # again: replaced
