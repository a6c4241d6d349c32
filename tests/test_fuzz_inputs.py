"""Hostile and careless input, end to end: every bad input gets one line and exit 2.

For each input (a scenario file, a ``--set``, a trace of each format, an op-trace, a
bundle, a sweep file, a command-line value) the command line is run in-process and
the suite asserts: the exit code, ONE line on stderr that names the location, no
traceback, no file written outside the output folder (nor left in the working
folder), and termination. Termination is guarded by an anti-hang watchdog
(``faulthandler``) of a generous 120 s per call: it catches hangs only, it is not a
speed check.

Two kinds of cases: hypothesis strategies that mutate valid inputs (a mutation may
happen to be valid, so those accept exit 0 too, but never a traceback or a stray
file), and the explicit cases of the hardening issue, which must exit 2.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gzip
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cli
from conftest import ROOT

HANG_TIMEOUT_S = 120  # anti-hang only
SCN = ROOT / "scenarios"
BUNDLE = ROOT / "bundles" / "request_order"  # the smallest shipped bundle (3 requests)
# FUZZ_EXAMPLES raises the count for a deeper local run; CI keeps it small.
FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "30")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

MINIMAL = {
    "name": "fz", "seed": 1, "model": {"preset": "llama-3.1-8b"}, "tp": 2, "page_size": 64,
    "device": {"tokens": 4096}, "host": {"ratio": 2.0},
    "workload": {"kind": "multi_turn_chat", "num_requests": 5, "block_size": 64,
                 "arrival": {"process": "poisson", "rate": 2.0}},
}


# ----------------------------------------------------------------------------------
# The harness
# ----------------------------------------------------------------------------------


def _snapshot(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def call(argv, box: Path, out: Path | None = None) -> tuple[int, str]:
    """Run ``hicache-sim argv`` in-process from ``box/cwd``; check the invariants that
    hold for every input. Returns (exit code, stderr)."""
    cwd = box / "cwd"
    cwd.mkdir(exist_ok=True)
    before = _snapshot(box)
    err, outbuf = io.StringIO(), io.StringIO()
    old = os.getcwd()
    faulthandler.dump_traceback_later(HANG_TIMEOUT_S, exit=True)
    try:
        os.chdir(cwd)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(outbuf):
            try:
                rc = cli.main([str(a) for a in argv])
            except SystemExit as e:  # argparse
                rc = e.code
    finally:
        faulthandler.cancel_dump_traceback_later()
        os.chdir(old)
    text = err.getvalue()
    assert "Traceback" not in text, text
    new = _snapshot(box) - before
    allowed = str(out.relative_to(box)) if out is not None else None
    stray = [p for p in new if allowed is None or not (p == allowed or p.startswith(allowed + os.sep))]
    assert not stray, f"files written outside the output folder: {sorted(stray)[:5]}"
    if rc == 2:
        lines = text.strip().splitlines()
        assert len(lines) == 1, text
        assert lines[0].startswith("hicache-sim"), text
    return rc, text


def bad(argv, box: Path, where: str, out: Path | None = None) -> str:
    """An input that must be refused: exit 2, one line naming ``where``."""
    rc, text = call(argv, box, out)
    assert rc == 2, (rc, text)
    assert where in text, (where, text)
    return text


def _box():
    return tempfile.TemporaryDirectory(prefix="fz-")


def write_scenario(folder: Path, data=None, text: str | None = None, name="s.yaml") -> Path:
    p = folder / name
    p.write_text(text if text is not None else yaml.safe_dump(data or MINIMAL, sort_keys=False))
    return p


# ----------------------------------------------------------------------------------
# Strategies
# ----------------------------------------------------------------------------------

HOSTILE = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([10**5000, -1, 0, 2**63, 2**70, float("inf"), float("nan"), True, None,
                     "/etc/passwd", "../../../x", "..", "/", "/proc/self/mem", "/dev/zero",
                     "a\x00b", "x\x1b[31m", "", " ", "é" * 300, [], {}, [[[[]]]]]),
    st.text(max_size=30),
    st.lists(st.integers(-5, 5), max_size=4),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


def _paths(d, prefix=()):
    for k, v in d.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from _paths(v, prefix + (k,))


SCENARIO_PATHS = sorted(_paths(MINIMAL)) + [("output", "trace_out"), ("cost", "profile"),
                                            ("workload", "arrival", "path"), ("limits", "max_requests")]


def _set(d: dict, path: tuple, value) -> dict:
    d = json.loads(json.dumps(d))
    cur = d
    for k in path[:-1]:
        if not isinstance(cur.get(k), dict):
            cur[k] = {}
        cur = cur[k]
    cur[path[-1]] = value
    return d


def _dump(data) -> str:
    try:
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    except (yaml.YAMLError, ValueError, RecursionError):
        return "name: x\n"


_CHARS = st.sampled_from(list('{}[]",:0123456789-.eE \n\t#&*!|>\'%@`anx\x00\xff'))


def mutate(text: str, edits) -> str:
    for pos, mode, ch in edits:
        i = pos % (len(text) + 1)
        text = text[:i] + ch + text[i + (mode == 1):] if mode < 2 else text[:i] + text[i + 1:]
    return text


EDITS = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 2), _CHARS), min_size=1, max_size=6)


# ----------------------------------------------------------------------------------
# Fuzzed: scenario YAML, --set, traces, op-traces, bundles, sweep files
# ----------------------------------------------------------------------------------


@FUZZ
@given(path=st.sampled_from(SCENARIO_PATHS), value=HOSTILE, edits=st.none() | EDITS)
def test_fuzzed_scenarios(path, value, edits):
    with _box() as d:
        box = Path(d)
        text = _dump(_set(MINIMAL, path, value))
        if edits:
            text = mutate(text, edits)
        p = box / "s.yaml"
        p.write_text(text, errors="surrogateescape")
        rc, err = call(["validate", p], box)
        assert rc in (0, 2), err
        if rc == 2:
            assert "s.yaml" in err, err


@FUZZ
@given(key=st.sampled_from([".".join(p) for p in SCENARIO_PATHS] + ["seed", "nope.x", "tp.0", "a..b", ""]),
       value=st.one_of(st.text(max_size=20), st.sampled_from(["9" * 5000, "&a [*a]", "{a: 1, a: 2}",
                                                             "[[[[[[[[", "!!python/object:os.system x"])))
def test_fuzzed_set_overrides(key, value):
    with _box() as d:
        box = Path(d)
        p = write_scenario(box)
        rc, err = call(["validate", p, "--set", f"{key}={value}"], box)
        assert rc in (0, 2), err
        if rc == 2:
            assert "--set" in err or "s.yaml" in err, err


MOONCAKE = ('{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]}\n'
            '{"timestamp": 10, "input_length": 600, "output_length": 5, "hash_ids": [1, 3]}\n')
GENERIC = ('{"arrival_s": 0, "input_len": 100, "output_len": 2, "blocks": [1, 2]}\n'
           '{"arrival_s": 1.5, "input_len": 70, "output_len": 0, "blocks": "1 3"}\n')
CSV = "arrival_s,input_len,output_len,blocks\n0,100,2,1 2\n1.5,70,0,1 3\n"
AGENTIC = json.dumps({"block_size": 64, "requests": [
    {"t": 0, "type": "n", "in": 130, "out": 2, "hash_ids": [1, 2]},
    {"t": 1, "type": "subagent", "requests": [{"t": 0, "in": 64, "out": 1, "hash_ids": [7]}]}]})
LINES = "0\n0.5\n1.25\n"
TRACE_FORMATS = {  # name -> (file name, sample, workload)
    "mooncake": ("t.jsonl", MOONCAKE, {"kind": "trace", "format": "mooncake", "path": "t.jsonl",
                                       "block_size": 512}),
    "generic": ("t.jsonl", GENERIC, {"kind": "trace", "format": "generic", "path": "t.jsonl",
                                     "block_size": 64}),
    "csv": ("t.csv", CSV, {"kind": "trace", "format": "generic", "path": "t.csv", "block_size": 64}),
    "agentic": ("t.json", AGENTIC, {"kind": "trace", "format": "agentic", "path": "t.json"}),
    "lines": ("t.txt", LINES, {"kind": "uniform", "num_requests": 5, "block_size": 64,
                               "arrival": {"process": "trace", "format": "lines", "path": "t.txt"}}),
}


def trace_case(box: Path, fmt: str, content: str | bytes, gz: bool = False) -> Path:
    name, _, workload = TRACE_FORMATS[fmt]
    data = content.encode("utf-8", "surrogateescape") if isinstance(content, str) else content
    if gz:
        name += ".gz"
        data = gzip.compress(data, mtime=0)
        workload = json.loads(json.dumps(workload).replace(TRACE_FORMATS[fmt][0], name))
    (box / name).write_bytes(data)
    page = 512 if fmt == "mooncake" else 64
    return write_scenario(box, dict(MINIMAL, page_size=page, device={"tokens": 65536}, workload=workload))


@FUZZ
@given(fmt=st.sampled_from(sorted(TRACE_FORMATS)), edits=EDITS, gz=st.booleans())
def test_fuzzed_traces(fmt, edits, gz):
    with _box() as d:
        box = Path(d)
        p = trace_case(box, fmt, mutate(TRACE_FORMATS[fmt][1], edits), gz)
        rc, err = call(["validate", "--deep", p], box)
        assert rc in (0, 2), err
        if rc == 2:
            assert "t." in err or "s.yaml" in err, err


OPTRACE = [{"op": "header", "device_capacity": 64, "host_capacity": 64, "page_size": 1,
            "write_policy": "write_back"},
           {"op": "insert", "tokens": [1, 2, 3]}, {"op": "match", "tokens": [1, 2]},
           {"op": "lock", "tokens": [1, 2], "id": "a"}, {"op": "evict_device", "n": 2},
           {"op": "unlock", "id": "a"}, {"op": "skip_ids", "n": 1}, {"op": "dump"}]
OPTRACE_KEYS = [(0, "ids"), (0, "host_alloc_failures"), (0, "host_policy"), (0, "eviction_policy"),
                (0, "device_capacity"), (0, "page_size"), (1, "tokens"), (4, "n"), (6, "n"),
                (3, "id"), (2, "reserved"), (1, "op")]


@FUZZ
@given(which=st.sampled_from(OPTRACE_KEYS), value=HOSTILE, edits=st.none() | EDITS)
def test_fuzzed_op_traces(which, value, edits):
    with _box() as d:
        box = Path(d)
        ops = json.loads(json.dumps(OPTRACE))
        ops[which[0]][which[1]] = value
        try:
            text = "".join(json.dumps(o) + "\n" for o in ops)
        except ValueError:
            text = json.dumps(OPTRACE[0]) + "\n"
        if edits:
            text = mutate(text, edits)
        p = box / "t.jsonl"
        p.write_text(text, errors="surrogateescape")
        out = box / "o.jsonl"
        rc, err = call(["replay-ops", p, "-o", out], box, out)
        assert rc in (0, 2), err
        if rc == 2:
            assert "t.jsonl" in err, err


BUNDLE_KEYS = ["expect", "op_traces", "optrace_final_digests", "verdict", "format"]


@settings(FUZZ, max_examples=max(5, FUZZ.max_examples // 2))
@given(key=st.sampled_from(BUNDLE_KEYS), value=HOSTILE)
def test_fuzzed_bundles(key, value):
    with _box() as d:
        box = Path(d)
        b = box / "b"
        shutil.copytree(BUNDLE, b)
        meta = json.loads((b / "bundle.json").read_text())
        meta[key] = value
        try:
            (b / "bundle.json").write_text(json.dumps(meta))
        except ValueError:
            return
        rc, err = call(["replay", b], box)
        assert rc in (0, 1, 2), err  # 0: the mutation did not change what replays
        assert len(err.strip().splitlines()) == 1, err


SWEEP = {"name": "sw", "base": "s.yaml", "set": {"workload.num_requests": 5},
         "grid": {"host.ratio": [1.0, 2.0]}, "seeds": [1]}


@FUZZ
@given(key=st.sampled_from(["name", "base", "bases", "set", "grid", "zip", "seeds", "nope"]),
       value=HOSTILE, edits=st.none() | EDITS)
def test_fuzzed_sweep_files(key, value, edits):
    with _box() as d:
        box = Path(d)
        write_scenario(box)
        text = _dump(dict(SWEEP, **{key: value}))
        if edits:
            text = mutate(text, edits)
        p = box / "sw.yaml"
        p.write_text(text, errors="surrogateescape")
        out = box / "out"
        rc, err = call(["sweep", p, "--dry-run", "-o", out], box, out)
        assert rc in (0, 2), err
        if rc == 2:
            assert "sw.yaml" in err or "s.yaml" in err, err


# ----------------------------------------------------------------------------------
# The cases: each must be refused with one line
# ----------------------------------------------------------------------------------


@pytest.fixture
def box(tmp_path):
    return tmp_path


@pytest.mark.parametrize("value", ["/tmp/x.json", "../x.json", "a/../../x.json", "t\x01.json"])
def test_trace_out_cannot_leave_the_results_folder(box, value):
    p = write_scenario(box, _set(MINIMAL, ("output", "trace_out"), value))
    bad(["validate", p], box, "output.trace_out")
    out = box / "o"
    bad(["run", p, "-o", out, "--quiet"], box, "output.trace_out", out)


@pytest.mark.parametrize("name", ["../../../x", "a/b", "x\x07y", ".hidden", "..", "a b"])
def test_names_are_slugs(box, name):
    p = write_scenario(box, dict(MINIMAL, name=name))
    bad(["run", p, "--quiet"], box, "name")


def test_scenario_input_paths_stay_in_the_roots(box):
    for value in ["/etc/passwd", "../../../../etc/passwd", "sub/../../x"]:
        wl = {"kind": "trace", "format": "mooncake", "path": value}
        p = write_scenario(box, dict(MINIMAL, workload=wl))
        err = bad(["validate", p], box, "workload.path")
        assert "root:" not in err  # nothing of the file is read
    (box / "link.jsonl").symlink_to("/etc/passwd")
    p = write_scenario(box, dict(MINIMAL, workload={"kind": "trace", "format": "mooncake",
                                                    "path": "link.jsonl"}))
    bad(["validate", p], box, "symlink")


def test_an_explicit_trace_root_is_needed_for_other_folders(box):
    other = box / "elsewhere"
    other.mkdir()
    (other / "t.jsonl").write_text(MOONCAKE)
    wl = {"kind": "trace", "format": "mooncake", "path": "t.jsonl"}
    p = write_scenario(box, dict(MINIMAL, page_size=512, device={"tokens": 65536}, workload=wl))
    bad(["validate", p], box, "not found under any root")
    rc, err = call(["validate", p, "--trace-root", other], box)
    assert rc == 0, err


def test_a_trace_root_holding_a_device_file_is_refused(box):
    wl = {"kind": "trace", "format": "mooncake", "path": "zero"}
    p = write_scenario(box, dict(MINIMAL, workload=wl))
    bad(["validate", "--deep", p, "--trace-root", "/dev"], box, "character device")


def _bundle(box: Path) -> Path:
    b = box / "b"
    shutil.copytree(BUNDLE, b)
    return b


def _edit_bundle(b: Path, **fields) -> None:
    meta = json.loads((b / "bundle.json").read_text())
    meta.update(fields)
    (b / "bundle.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("fields,where", [
    ({"op_traces": {"0": "../../../../etc/passwd"}}, "op_traces.0"),
    ({"op_traces": {"0": "/etc/passwd"}}, "op_traces.0"),
    ({"op_traces": ["ranks/rank0.optrace.jsonl"]}, "op_traces"),
    ({"expect": "detected"}, "expect"),
    ({"optrace_final_digests": "0"}, "optrace_final_digests"),
    ({"optrace_final_digests": {"x": 1}}, "optrace_final_digests"),
])
def test_bundle_fields_are_typed_and_confined(box, fields, where):
    b = _bundle(box)
    _edit_bundle(b, **fields)
    bad(["replay", b], box, where)


def test_a_bundle_scenario_reads_inside_the_bundle_only(box):
    b = _bundle(box)
    text = (b / "scenario.yaml").read_text()
    text = text.replace("  arrival:\n    process: poisson\n    rate: 3.0\n",
                        "  arrival:\n    process: trace\n    format: lines\n    path: /etc/passwd\n")
    assert "/etc/passwd" in text
    (b / "scenario.yaml").write_text(text)
    err = bad(["replay", b], box, "workload.arrival.path")
    assert "root:" not in err


def test_the_shipped_bundle_still_replays(box):
    rc, err = call(["replay", _bundle(box)], box)
    assert rc == 0, err


@pytest.mark.parametrize("header,where", [
    ({"ids": 5}, "ids"), ({"ids": "nope"}, "ids"), ({"host_policy": "nope"}, "host_policy"),
    ({"host_alloc_failures": "x"}, "host_alloc_failures"),
    ({"host_alloc_failures": [[1]]}, "host_alloc_failures"),
    ({"host_alloc_failures": [[-1, 0]]}, "host_alloc_failures"),
    ({"device_capacity": 10**40}, "device_capacity"),
])
def test_op_trace_header_extensions(box, header, where):
    p = box / "t.jsonl"
    p.write_text(json.dumps({**OPTRACE[0], **header}) + "\n" + json.dumps(OPTRACE[1]) + "\n")
    bad(["replay-ops", p], box, f"{p}:1")
    bad(["replay-ops", p], box, where)


@pytest.mark.parametrize("line,where", [
    ("[" * 100_000 + "]" * 100_000, ":2"),
    (json.dumps({"op": "skip_ids", "n": -1}), ":2"),
    ('{"op": "insert", "tokens": [' + "9" * 5000 + "]}", ":2"),
])
def test_op_trace_lines(box, line, where):
    p = box / "t.jsonl"
    p.write_text(json.dumps(OPTRACE[0]) + "\n" + line + "\n")
    bad(["replay-ops", p], box, f"t.jsonl{where}")


def test_huge_integers(box):
    p = write_scenario(box, text=_dump(MINIMAL).replace("seed: 1", "seed: " + "9" * 5000))
    bad(["validate", p], box, "s.yaml:2")
    bad(["validate", write_scenario(box), "--set", "tp=" + "9" * 5000], box, "--set tp")
    p = trace_case(box, "mooncake", MOONCAKE.replace('"timestamp": 10', '"timestamp": 1' + "0" * 400))
    bad(["validate", "--deep", p], box, "t.jsonl:2")


@pytest.mark.parametrize("seed", ["-1", str(2**70), "x"])
def test_seed_goes_through_the_schema(box, seed):
    bad(["run", write_scenario(box), "--seed", seed, "--quiet"], box, "seed")


def test_output_paths(box):
    p = write_scenario(box)
    f = box / "afile"
    f.write_text("keep")
    bad(["run", p, "-o", f, "--quiet"], box, "afile")
    assert f.read_text() == "keep"
    bad(["run", p, "-o", "/", "--quiet"], box, "/")
    bad(["run", p, "-o", "/proc/hicache-x", "--quiet"], box, "/proc/hicache-x")
    keep = box / "mine"
    keep.mkdir()
    (keep / "thesis.tex").write_text("keep")
    bad(["run", p, "-o", keep, "--quiet"], box, "not a results folder")
    assert (keep / "thesis.tex").read_text() == "keep"
    out = box / "o"
    bad(["run", p, "-o", out, "--trace-out", box, "--quiet"], box, "found a folder", out)


def test_special_files_are_refused(box):
    bad(["validate", "/dev/zero"], box, "character device")
    fifo = box / "fifo.yaml"
    os.mkfifo(fifo)
    bad(["validate", fifo], box, "FIFO")
    bad(["sweep", fifo, "--dry-run"], box, "FIFO")
    big = box / "big.yaml"
    with open(big, "wb") as fh:
        fh.truncate(5 << 20)
    bad(["validate", big], box, "over 4 MiB")


ALIAS_BOMB = textwrap.dedent("""\
    a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
    f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
    g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
    h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]
    i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]
""")


@pytest.mark.parametrize("section", ["set", "grid"])
def test_alias_bombs_in_sweeps(box, section):
    write_scenario(box)
    body = ALIAS_BOMB.replace("\n", "\n  ").rstrip()
    key = "workload.num_requests" if section == "set" else "host.ratio"
    text = f"base: s.yaml\nx:\n  {body}\n{section}:\n  {key}: [*i]\n"
    p = box / "sw.yaml"
    p.write_text(text)
    bad(["sweep", p, "--dry-run"], box, "sw.yaml")


def test_alias_bomb_and_self_alias_in_a_scenario(box):
    p = write_scenario(box, text=_dump(MINIMAL) + "description:\n  " + ALIAS_BOMB.replace("\n", "\n  "))
    bad(["validate", p], box, "expand to over")
    p = write_scenario(box, text=_dump(MINIMAL) + "description: &a [*a]\n")
    bad(["validate", p], box, "s.yaml")


def test_duplicate_keys(box):
    p = write_scenario(box, text=_dump(MINIMAL).replace("tp: 2\n", "tp: 2\ntp: 4\n"))
    err = bad(["validate", p], box, "s.yaml:6")
    assert "'tp' twice" in err
    sw = box / "sw.yaml"
    sw.write_text("base: s.yaml\nseeds: [1]\nseeds: [2]\n")
    bad(["sweep", sw, "--dry-run"], box, "sw.yaml:3")


@pytest.mark.parametrize("fmt", sorted(TRACE_FORMATS))
@pytest.mark.parametrize("content", ["", "\n\n", "# only a comment\n"])
def test_empty_traces_are_errors(box, fmt, content):
    if fmt == "agentic":
        content = json.dumps({"block_size": 64, "requests": []}) if content else ""
    if fmt == "csv" and content:
        content = "arrival_s,input_len,output_len,blocks\n"
    p = trace_case(box, fmt, content)
    out = box / "o"
    bad(["run", p, "-o", out, "--quiet"], box, "t.", out)
    assert not out.exists()


def test_a_run_with_no_finished_request_writes_strict_json(box):
    p = write_scenario(box, _set(MINIMAL, ("limits", "duration_s"), 1e-9))
    out = box / "o"
    rc, err = call(["run", p, "-o", out, "--quiet"], box, out)
    assert rc == 0, err
    text = (out / "summary.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


def test_generic_block_size_errors_name_the_line(box):
    p = trace_case(box, "generic", GENERIC.replace('"output_len": 0,', '"output_len": 0, "block_size": 48,'))
    bad(["validate", "--deep", p], box, "t.jsonl:2")


def test_resource_estimates_and_torch_refusal(box):
    p = write_scenario(box, _set(MINIMAL, ("workload", "num_requests"), 10**9))
    rc, _ = call(["validate", p], box)
    assert rc == 0
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        cli.main(["validate", str(p)])
    assert "estimate: 1,000,000,000 requests" in buf.getvalue()
    big = dict(MINIMAL, tp=64, model={"preset": "llama-3.1-8b"}, collective={"backend": "torch"})
    p = write_scenario(box, big)
    bad(["validate", p], box, "collective.backend")
    bad(["run", write_scenario(box, name="t.yaml"), "--collective", "torch", "--set", "tp=64",
         "--quiet"], box, "collective.backend")


# ----------------------------------------------------------------------------------
# Results integrity
# ----------------------------------------------------------------------------------


def test_a_second_writer_fails_with_one_line(box):
    from sim.resultsdir import ResultsFolder

    p = write_scenario(box)
    out = box / "o"
    with ResultsFolder(out):
        bad(["run", p, "-o", out, "--quiet"], box, "another hicache-sim process")
    rc, err = call(["run", p, "-o", out, "--quiet"], box, out)
    assert rc == 0, err
    assert not [n for n in os.listdir(box) if n.startswith(".")]  # no lock or staging left


def test_stale_temporaries_are_cleaned_and_the_folder_is_replaced_whole(box):
    p = write_scenario(box)
    out = box / "o"
    rc, err = call(["run", p, "-o", out, "--quiet"], box, out)
    assert rc == 0, err
    first = sorted(os.listdir(out))
    (out / ".summary.json.abc.tmp").write_text("half")  # a killed file-by-file writer
    (out / "stray-from-an-old-run.txt").write_text("x")
    (box / ".o.tmp-99999").mkdir()  # a killed run's staging folder
    (box / ".o.tmp-99999" / "requests.parquet").write_text("half")
    # the stray file makes it "not a results folder" only without meta.json
    rc, err = call(["run", p, "-o", out, "--quiet"], box, out)
    assert rc == 0, err
    assert sorted(os.listdir(out)) == first  # the old folder's leftovers went with it
    assert not [n for n in os.listdir(box) if n.startswith(".")]


def test_an_interrupted_run_is_renamed_and_marked_partial(box, monkeypatch):
    from sim.cluster import Cluster

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Cluster, "run", interrupted)
    p = write_scenario(box)
    out = box / "o"
    rc, err = call(["run", p, "-o", out, "--quiet"], box, out)
    assert rc == 130, err
    assert json.loads((out / "meta.json").read_text())["partial"] is True
    assert not [n for n in os.listdir(box) if n.startswith(".")]


def test_pool_workers_die_with_their_parent(box):
    script = textwrap.dedent("""
        import multiprocessing, os, sys, time
        from concurrent.futures import ProcessPoolExecutor
        from sim.sweep import _worker_init
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_worker_init, initargs=(os.getpid(),))
        print(pool.submit(os.getpid).result(), flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        worker = int(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + HANG_TIMEOUT_S  # anti-hang bound, not a speed check
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(worker, signal.SIGKILL)
    pytest.fail("a pool worker outlived its killed parent")


def test_a_local_ray_instance_is_configured_for_loopback(monkeypatch):
    import types

    from sim.sweep import _ray_loopback_only

    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    consts = types.SimpleNamespace(ENABLE_RAY_CLUSTER=True)
    fake = types.SimpleNamespace(_private=types.SimpleNamespace(ray_constants=consts))
    _ray_loopback_only(fake)
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert consts.ENABLE_RAY_CLUSTER is False


# ----------------------------------------------------------------------------------
# What a newcomer and a fuzzer tripped on: bad input accepted, or named badly
# ----------------------------------------------------------------------------------


def _sweep(box: Path, **spec) -> Path:
    write_scenario(box)
    p = box / "sw.yaml"
    p.write_text(yaml.safe_dump({"name": "sw", "base": "s.yaml", **spec}, sort_keys=False))
    return p


def test_a_sweep_grid_is_capped_like_seeds(box):
    from sim.sweep import MAX_POINTS

    # 101 x 100 points: refused before a single point is validated
    p = _sweep(box, grid={"host.ratio": [1 + i / 1000 for i in range(101)],
                          "workload.num_requests": list(range(1, 101))})
    err = bad(["sweep", p, "--dry-run"], box, "sw.yaml:3")
    assert "10,100 points" in err and f"{MAX_POINTS:,}" in err
    p = _sweep(box, grid={"host.ratio": [1 + i / 10**6 for i in range(MAX_POINTS + 1)]})
    bad(["sweep", p, "--dry-run"], box, "grid.host.ratio")


def test_census_refuses_a_folder_that_is_not_a_census(box):
    s = write_scenario(box)
    other = box / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    err = bad(["census", s, "--seeds", "1", "-o", other, "--quiet", "--jobs", "1"], box, str(other))
    assert "notes.txt" in err and sorted(os.listdir(other)) == ["notes.txt"]
    f = box / "afile"
    f.write_text("x")
    err = bad(["census", s, "--seeds", "1", "-o", f, "--quiet", "--jobs", "1"], box, str(f))
    assert "found a file" in err and "File exists" not in err


def test_census_resumes_its_own_folder(box):
    s = write_scenario(box)
    out = box / "c"
    for _ in range(2):
        rc, err = call(["census", s, "--seeds", "1", "-o", out, "--quiet", "--jobs", "1",
                        "--no-plots"], box, out)
        assert rc == 0, err


def test_a_bundle_scenario_symlink_out_of_the_bundle_is_refused(box):
    b = _bundle(box)
    outside = box / "elsewhere.yaml"
    shutil.move(b / "scenario.yaml", outside)
    (b / "scenario.yaml").symlink_to(outside)
    bad(["replay", b], box, "scenario.yaml")


@pytest.mark.parametrize("fields,where", [
    ({"inputs_copied": ["/etc/passwd"]}, "inputs_copied.0"),
    ({"inputs_copied": [{"from": "/etc/passwd", "to": "/etc/passwd"}]}, "inputs_copied.0.to"),
    ({"inputs_copied": [{"from": "x", "to": "../../x"}]}, "inputs_copied.0.to"),
    ({"inputs_copied": "x"}, "inputs_copied"),
    ({"verdict": "detected"}, "verdict"),  # the bundle recorded "missed"
    ({"verdict": "nonsense"}, "verdict"),
    ({"seeds": {"scenario": -1, "jitter": 27, "base": 27, "try": 0}}, "seeds.scenario"),
    ({"seeds": {"scenario": 28, "jitter": 27, "base": 27, "try": 0}}, "seeds.scenario"),
    ({"seeds": [27]}, "seeds"),
])
def test_tampered_bundle_fields_are_refused(box, fields, where):
    b = _bundle(box)
    _edit_bundle(b, **fields)
    bad(["replay", b], box, where)


@pytest.mark.parametrize("op", ["evict_device", "evict_host"])
def test_op_trace_evictions_of_negative_tokens(box, op):
    p = box / "t.jsonl"
    p.write_text(json.dumps(OPTRACE[0]) + "\n" + json.dumps({"op": op, "n": -5}) + "\n")
    bad(["replay-ops", p], box, "t.jsonl:2")


@pytest.mark.parametrize("header", [
    {"op": "header", "device_capacity": 64, "host_capacity": 64, "page_size": 10**9},
    {"op": "header", "components": ["full", "swa"], "device_capacity": 64, "swa_capacity": 64,
     "sliding_window": 4, "page_size": 10**9},
])
def test_op_trace_page_size_is_bounded(box, header):
    p = box / "t.jsonl"
    p.write_text(json.dumps(header) + "\n")
    err = bad(["replay-ops", p], box, "t.jsonl:1")
    assert "page_size" in err


BUFFER_HEADER = {"op": "header", "version": 2, "device_capacity": 64, "host_capacity": 64,
                 "page_size": 1, "write_policy": "write_through", "host_memory_mode": "buffer_only",
                 "prefetch_threshold": 1}


@pytest.mark.parametrize("line", [
    {"op": "prefetch", "tokens": [1, 2], "id": "p"}, {"op": "prefetch_hit", "id": "p", "n": 1},
    {"op": "prefetch_done", "id": "p", "n": 1}, {"op": "prefetch_revoke", "id": "p"},
    {"op": "storage_write", "node": 1, "id": "s"}, {"op": "storage_write_ack", "id": "s"},
])
def test_storage_ops_in_a_buffer_only_trace(box, line):
    p = box / "t.jsonl"
    p.write_text(json.dumps(BUFFER_HEADER) + "\n" + json.dumps(line) + "\n")
    err = bad(["replay-ops", p], box, "t.jsonl:2")
    assert "buffer_only" in err


def test_storage_writes_header_in_a_buffer_only_trace(box):
    p = box / "t.jsonl"
    p.write_text(json.dumps({**BUFFER_HEADER, "storage_writes": "auto"}) + "\n")
    bad(["replay-ops", p], box, "t.jsonl:1")


@pytest.mark.parametrize("body,line", [
    ('0,100,2,"1 2\n1.5,70,0,1 3\n', ":2"),  # open to the end
    ('0,100,2,"1 2\n1.5,70,0,1 3\n2,50,1,"4"\n', ":2"),  # swallows a row, closed later
])
def test_a_csv_trace_with_an_unclosed_quote(box, body, line):
    p = trace_case(box, "csv", "arrival_s,input_len,output_len,blocks\n" + body)
    bad(["validate", "--deep", p], box, f"t.csv{line}")


def test_device_gib_must_fit_the_gpu(box):
    s = write_scenario(box, {**MINIMAL, "device": {"gib": 2000}, "cost": {"profile": "h100-sxm"}})
    err = bad(["validate", s], box, "device.gib")
    assert "s.yaml" in err and "80 GiB" in err


def test_sweep_gather_only_on_an_empty_folder(box):
    p = _sweep(box)
    empty = box / "empty"
    bad(["sweep", p, "--bounds", "--gather-only", "-o", empty], box, str(empty))
    assert not empty.exists()


def test_sweep_output_must_be_a_folder(box):
    f = box / "hostname"
    f.write_text("host\n")
    for mode in (["--dry-run"], ["--gather-only"], []):
        bad(["sweep", _sweep(box), "-o", f, *mode], box, str(f))
    assert f.read_text() == "host\n"


@pytest.mark.parametrize("name", ["", " ", "../x", "a/b"])
def test_calibrate_names_are_profile_names(box, name):
    bad(["calibrate", "--device", "cpu", "--out", box / "p.yaml", "--name", name], box, "--name")


def test_binary_yaml_is_not_a_name(box):
    s = write_scenario(box, text=_dump(MINIMAL).replace("name: fz", "name: !!binary aGVsbG8="))
    bad(["validate", s], box, "s.yaml:1")


def test_replay_ops_output_errors_name_the_flag_not_a_temporary(box):
    d = box / "adir"
    d.mkdir()
    p = box / "t.jsonl"
    p.write_text(json.dumps(OPTRACE[0]) + "\n")
    err = bad(["replay-ops", p, "-o", d], box, str(d))
    assert ".tmp" not in err and "folder" in err
    err = bad(["replay-ops", p, "-o", box / "no" / "such" / "o.jsonl"], box, "no such folder")
    assert not (box / "no").exists()


@pytest.mark.parametrize("key,value,what", [
    ("cost.profile", "p.yaml", "cost profile"),
    ("workload.arrival", "{process: trace, path: p.yaml}", "timestamp file"),
])
def test_a_folder_where_a_file_belongs_names_the_key(box, key, value, what):
    (box / "p.yaml").mkdir()
    s = write_scenario(box)
    err = bad(["validate", s, "--set", f"{key}={value}"], box, "s.yaml")
    assert key in err and what in err and "(a folder" in err


def test_a_folder_as_a_sweep_base_names_the_line(box):
    (box / "b.yaml").mkdir()
    p = box / "sw.yaml"
    p.write_text("name: sw\nbase: b.yaml\n")
    err = bad(["sweep", p, "--dry-run"], box, "sw.yaml:2")
    assert "base" in err and "(a folder" in err


@pytest.mark.parametrize("mirror", ["http://user:s3cret@127.0.0.1:9/raw",
                                    "ftp://user:s3cret@example.org/raw",
                                    "https://:s3cret@/raw"])
def test_a_mirrors_credentials_are_never_printed(box, mirror, monkeypatch):
    cache = box / "cache"
    monkeypatch.setenv("HICACHE_TRACE_CACHE", str(cache))
    rc, err = call(["traces", "fetch", "mooncake-toolagent", "--mirror", mirror], box, cache)
    assert rc == 2, err
    assert "s3cret" not in err and "user:" not in err and "***@" in err, err


def test_trace_out_into_a_missing_folder_is_refused(box):
    s = write_scenario(box)
    out = box / "r"
    err = bad(["run", s, "-o", out, "--quiet", "--trace-out", box / "no" / "dir" / "t.json"],
              box, "no such folder")
    assert not (box / "no").exists() and not out.exists()  # refused before the run


# ----------------------------------------------------------------------------------
# The newer schema, case by case: storage, hybrids, dp / router, node and scheduler
# keys, plan / census / sweep flags, bundles and op-trace v2. Each case must exit 2
# with one line naming the file and the key (or line). In-process, so the whole set
# runs in seconds.
# ----------------------------------------------------------------------------------

STORAGE_BASE = {**MINIMAL, "cache": {"write_policy": "write_through"},
                "storage": {"backend": "mooncake", "prefetch_policy": "timeout"}}
HYBRID_MAMBA = {**MINIMAL, "model": {"hybrid_preset": "qwen3-next-80b-a3b"}, "page_size": 1,
                "device": {"tokens": 20000, "max_mamba_cache_size": 48},
                "host": {"tokens": 40000, "mamba_states": 40},
                "workload": {**MINIMAL["workload"], "block_size": 64}}
HYBRID_SWA = {**MINIMAL, "model": {"hybrid_preset": "gpt-oss-20b"}, "page_size": 16,
              "device": {"tokens": 24000, "swa_full_tokens_ratio": 0.2}, "host": {"ratio": 2.0}}
DP_BASE = {**MINIMAL, "dp": 2, "router": {"policy": "cache_aware"}}
NODE_BASE = {**MINIMAL, "node": {"host_ram_gb": 512}}
BASES = {"storage": STORAGE_BASE, "mamba": HYBRID_MAMBA, "swa": HYBRID_SWA, "dp": DP_BASE,
         "node": NODE_BASE, "plain": MINIMAL}

NOT_A_NUMBER = ["x", [1], {"a": 1}, True, float("inf")]
NOT_A_NAME = ["nope", 5, [], {"a": 1}, ""]
NEGATIVE = [-1, -0.5]
# (base, key path, bad values): every value must be refused
SCHEMA_CASES = [
    ("storage", "storage.backend", NOT_A_NAME),
    ("storage", "storage.read_gbps", NOT_A_NUMBER + NEGATIVE + [0]),
    ("storage", "storage.write_gbps", NOT_A_NUMBER + NEGATIVE + [0]),
    ("storage", "storage.op_latency_us", NOT_A_NUMBER + NEGATIVE),
    ("storage", "storage.capacity_gb", NOT_A_NUMBER + NEGATIVE),
    ("storage", "storage.prefetch_policy", NOT_A_NAME),
    ("storage", "storage.prefetch_threshold", NOT_A_NUMBER + NEGATIVE + [1.5]),
    ("storage", "storage.prefetch_timeout_base", NOT_A_NUMBER + NEGATIVE),
    ("storage", "storage.prefetch_timeout_per_ki_token", NOT_A_NUMBER + NEGATIVE),
    ("storage", "storage.attn_cp_size", NOT_A_NUMBER + [0, -1, 1.5]),
    ("storage", "storage.host_memory_mode", NOT_A_NAME),
    ("storage", "storage.nope", [1]),
    ("storage", "jitter.storage_miss.probability", ["x", [1], 2, -0.1, float("inf")]),
    ("storage", "jitter.storage_miss.ranks", ["x", [5], [-1], [1, 1], [True]]),
    ("storage", "jitter.storage_fail.ranks", ["x", [5], [-1], [True], 3]),
    ("storage", "jitter.storage_latency.factor", NOT_A_NUMBER + NEGATIVE),
    ("storage", "jitter.storage_latency.ranks", ["x", [7], [-1], [True]]),
    ("storage", "jitter.storage_latency.dist", NOT_A_NAME),
    ("mamba", "model.hybrid_preset", NOT_A_NAME + ["qwen3-next"]),
    ("mamba", "device.mamba_full_memory_ratio", NOT_A_NUMBER + NEGATIVE),
    ("mamba", "device.max_mamba_cache_size", NOT_A_NUMBER + [0, -1, 1.5]),
    ("mamba", "host.mamba_states", NOT_A_NUMBER + [-1, 1.5]),
    ("mamba", "page_size", [16, 64]),  # a Mamba tree needs page_size 1
    ("swa", "device.swa_full_tokens_ratio", NOT_A_NUMBER + NEGATIVE + [0]),
    ("swa", "host.swa_tokens", NOT_A_NUMBER + [-1, 1.5]),
    ("swa", "model.hybrid_preset", NOT_A_NAME),
    ("dp", "dp", ["x", 0, -1, 257, 1.5, True, [2]]),
    ("dp", "router.policy", NOT_A_NAME),
    ("dp", "router.cache_threshold", NOT_A_NUMBER + [-0.1, 1.5]),
    ("dp", "router.balance_abs_threshold", NOT_A_NUMBER + [-1, 1.5]),
    ("dp", "router.balance_rel_threshold", NOT_A_NUMBER + NEGATIVE),
    ("dp", "router.max_tree_tokens", NOT_A_NUMBER + [0, -1, 1.5]),
    ("dp", "router.nope", [1]),
    ("node", "node.host_ram_gb", NOT_A_NUMBER + NEGATIVE + [0]),
    ("node", "node.gpus", NOT_A_NUMBER + [0, -1, 1.5]),
    ("node", "node.on_exceed", NOT_A_NAME),
    ("plain", "engine.replicas", NOT_A_NAME),
    ("plain", "collective.backend", NOT_A_NAME),
    ("plain", "collective.device", NOT_A_NAME),
    ("plain", "collective.discipline", NOT_A_NAME),
    ("plain", "collective.timeout_s", NOT_A_NUMBER + NEGATIVE + [0]),
    ("plain", "scheduler.mode", NOT_A_NAME),
    ("plain", "scheduler.max_running_requests", NOT_A_NUMBER + [0, -1, 1.5]),
    ("plain", "scheduler.chunked_prefill_tokens", NOT_A_NUMBER + [0, -1, 1.5]),
    ("plain", "scheduler.max_prefill_tokens", NOT_A_NUMBER + [0, -1, 1.5]),
    ("plain", "scheduler.schedule_conservativeness", NOT_A_NUMBER + NEGATIVE),
    ("plain", "scheduler.decode", ["x", 5, [True]]),
    ("plain", "limits.max_requests", NOT_A_NUMBER + [0, -1, 1.5]),
    ("plain", "limits.duration_s", NOT_A_NUMBER + NEGATIVE + [0]),
    ("plain", "device.mem_fraction_static", ["x", [1], True, 0, 1.5, -0.1, "autox"]),
    ("plain", "host.host_memory_fraction", NOT_A_NUMBER + [0, 1.5, -0.1]),
    ("plain", "on_divergence", NOT_A_NAME),
]
SCHEMA_PARAMS = [pytest.param(base, key, value, id=f"{key}={value!r}")
                 for base, key, values in SCHEMA_CASES for value in values]


def _with(data: dict, key: str, value) -> dict:
    out = json.loads(json.dumps(data))
    node = out
    parts = key.split(".")
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value
    if parts[0] == "jitter" and len(parts) == 3 and parts[1] not in ("seed",):
        # a jitter block needs its other required fields: a valid block, then one bad key
        valid = {"storage_miss": {"probability": 0.1, "ranks": [1]},
                 "storage_fail": {"ranks": [1]},
                 "storage_latency": {"ranks": [1], "factor": 2.0}}[parts[1]]
        node.update({k: v for k, v in valid.items() if k != parts[2]})
    return out


@pytest.fixture(scope="module")
def shared_box():
    with _box() as d:
        yield Path(d)


@pytest.mark.parametrize("base,key,value", SCHEMA_PARAMS)
def test_newer_schema_keys_in_a_file(shared_box, base, key, value):
    p = write_scenario(shared_box, _with(BASES[base], key, value), name=f"{base}.yaml")
    err = bad(["validate", p], shared_box, f"{base}.yaml:")
    assert re.search(rf"{base}\.yaml:\d+", err), err
    assert key.rsplit(".", 1)[-1] in err, (key, err)


@pytest.mark.parametrize("base,key,value", SCHEMA_PARAMS)
def test_newer_schema_keys_on_the_command_line(shared_box, base, key, value):
    p = write_scenario(shared_box, BASES[base], name=f"{base}.yaml")
    text = _dump(value).strip() if not isinstance(value, str) or not value else value
    rc, err = call(["validate", p, "--set", f"{key}={text}"], shared_box)
    assert rc == 2, (rc, err)
    # the scenario file and the override, or (an unknown key) the override alone
    assert f"{base}.yaml (--set {key})" in err or f"--set {key}:" in err, err
    assert key.rsplit(".", 1)[-1] in err, (key, err)


def test_the_fuzz_bases_are_valid(shared_box):
    for name, data in BASES.items():
        rc, err = call(["validate", write_scenario(shared_box, data, name=f"{name}.yaml")], shared_box)
        assert rc == 0, (name, err)


FLAG_CASES = [  # (command, flag, bad values); the scenario/sweep is a small valid one
    *[("plan", "--target-hit-rate", v) for v in ["2", "-0.1", "x", "150%", "nan", "inf"]],
    *[("plan", "--target-ttft-p99", v) for v in ["-1", "0", "x", "nan", "inf"]],
    *[("plan", "--warmup", v) for v in ["1", "1.5", "-0.1", "x", "nan"]],
    *[("plan", "--check-points", v) for v in ["-1", "x", "1.5", "100000"]],
    *[("plan", "--opt-points", v) for v in ["-1", "x", "100000"]],
    *[("plan", "--grid-points", v) for v in ["0", "1", "-1", "x", "10000000"]],
    *[("plan", "--max-host-gb", v) for v in ["0", "-1", "x", "inf", "nan"]],
    *[("plan", "--policies", v) for v in ["x", "write_back+nope", "nope+lru", "", "write_back"]],
    *[("plan", "--jobs", v) for v in ["0", "-1", "x"]],
    *[("plan", "--kv-points", v) for v in ["0", "-1", "x"]],
    *[("plan", "--slot-points", v) for v in ["0", "-1", "x"]],
    *[("plan", "--aux-points", v) for v in ["0", "-1", "x"]],
    *[("plan", "--max-slots", v) for v in ["0", "-1", "x"]],
    *[("plan", "--max-aux", v) for v in ["0", "-1", "x"]],
    *[("plan", "--inert-fraction", v) for v in ["2", "-0.1", "x", "nan"]],
    *[("census", "--seeds", v) for v in ["0", "-1", "x", str(10**7)]],
    *[("census", "--seed-start", v) for v in ["-1", "x", str(2**63)]],
    *[("census", "--jobs", v) for v in ["0", "-1", "x"]],
    ("census", "--executor", "nope"), ("census", "--address", "127.0.0.1:1"),
    *[("sweep", "--workers", v) for v in ["0", "-1", "x"]],
    ("sweep", "--executor", "nope"), ("sweep", "--address", "127.0.0.1:1"),
    *[("bound", "--trace-root", v) for v in ["/nonexistent", "/dev/null"]],
]


@pytest.mark.parametrize("command,flag,value", FLAG_CASES,
                         ids=[f"{c} {f} {v!r}" for c, f, v in FLAG_CASES])
def test_plan_census_sweep_flags(shared_box, command, flag, value):
    s = write_scenario(shared_box, name="flags.yaml")
    out = shared_box / f"out-{command}"
    if command == "sweep":
        target = shared_box / "flags-sweep.yaml"
        target.write_text("name: fl\nbase: flags.yaml\ngrid: {host.ratio: [2.0]}\n")
        argv = ["sweep", target, "-o", out, flag, value]
    elif command == "census":
        argv = ["census", s, "--seeds", "1", "-o", out, "--quiet", "--jobs", "1", flag, value]
        if flag == "--seeds":
            argv = ["census", s, "-o", out, "--quiet", "--jobs", "1", flag, value]
    elif command == "plan":
        argv = ["plan", s, "-o", out, "--quiet", flag, value]
    else:
        argv = [command, s, flag, value]
    err = bad(argv, shared_box, flag.split("-")[-1], out)
    assert flag in err or flag.lstrip("-") in err, err
    assert not out.exists(), "nothing written for a refused flag"


SWEEP_FILE_CASES = [  # (sweep file text after the base line, where the error must point)
    ("seeds: {count: 0}", "seeds"), ("seeds: {count: 20000}", "seeds"),
    ("seeds: {count: 2, start: -1}", "seeds"), ("seeds: {count: 2, step: 1}", "seeds"),
    ("seeds: [-1]", "seeds"), ("seeds: [1, 1]", "seeds"), ("seeds: x", "seeds"),
    ("seeds: [1.5]", "seeds"), ("seeds: []", "seeds"), ("seeds: [true]", "seeds"),
    ("grid: {host.ratio: []}", "grid.host.ratio"), ("grid: {host.ratio: 5}", "grid.host.ratio"),
    ("grid: {seed: [1, 2]}", "grid"), ("grid: {'a b': [1]}", "grid"),
    ("grid: {host.ratio: [.inf]}", "grid.host.ratio"), ("grid: {host.ratio: [2024-01-01]}", "grid.host.ratio"),
    ("grid: {host.ratoi: [2.0]}", "grid.host.ratoi"), ("grid: {host.ratio: [x]}", "grid.host.ratio"),
    ("grid: {host.ratio: [2.0, 2.0]}", "sw.yaml"),
    ("zip: {host.ratio: [2.0, 3.0], tp: [2]}", "zip"),
    ("set: {host.ratio: 2.0}\ngrid: {host.ratio: [3.0]}", "grid"),
    ("set: {storage.backend: nope}", "set.storage"), ("set: {dp: 0}", "set.dp"),
    ("set: {router.policy: nope}", "set.router"), ("set: {model.hybrid_preset: nope}", "set.model"),
    ("nope: 1", "nope"), ("bases: [s.yaml]", "base"), ("name: ../x", "name"),
]


@pytest.mark.parametrize("extra,where", SWEEP_FILE_CASES, ids=[c for c, _ in SWEEP_FILE_CASES])
def test_sweep_file_keys(shared_box, extra, where):
    write_scenario(shared_box)
    p = shared_box / "sw.yaml"
    p.write_text(f"name: sw\nbase: s.yaml\n{extra}\n")
    err = bad(["sweep", p, "--dry-run"], shared_box, where)
    assert "sw.yaml" in err, err


BUNDLE_CASES = [
    ({"format": "x"}, "format"), ({"format": 5}, "format"),
    ({"expect": []}, "expect"), ({"expect": None}, "expect"),
    ({"verdict": 5}, "verdict"), ({"verdict": None}, "verdict"), ({"verdict": ["missed"]}, "verdict"),
    ({"verdict": "agree"}, "verdict"), ({"verdict": "hang"}, "verdict"),
    ({"op_traces": {"0": 5}}, "op_traces.0"), ({"op_traces": {"zero": "x"}}, "op_traces"),
    ({"op_traces": {"0": ""}}, "op_traces.0"), ({"op_traces": {"0": "ranks/../../x"}}, "op_traces.0"),
    ({"op_traces": {"0": "ranks/rank0.optrace.jsonl\u0000"}}, "op_traces.0"),
    ({"op_traces": {"99999": "x"}}, "op_traces"), ({"op_traces": "x"}, "op_traces"),
    ({"optrace_final_digests": {"0": "x"}}, "optrace_final_digests.0"),
    ({"optrace_final_digests": {"0": 1.5}}, "optrace_final_digests.0"),
    ({"optrace_final_digests": []}, "optrace_final_digests"),
    ({"seeds": {"scenario": "x"}}, "seeds.scenario"), ({"seeds": {"scenario": 2**64}}, "seeds.scenario"),
    ({"seeds": {"jitter": -3}}, "seeds.jitter"), ({"seeds": {"scenario": True}}, "seeds.scenario"),
    ({"seeds": "x"}, "seeds"), ({"seeds": {"scenario": 1.5}}, "seeds.scenario"),
    ({"inputs_copied": [{"from": "/x"}]}, "inputs_copied.0"),
    ({"inputs_copied": [{"to": "inputs/x"}]}, "inputs_copied.0"),
    ({"inputs_copied": [{"from": 5, "to": "x"}]}, "inputs_copied.0"),
    ({"inputs_copied": [{"from": "x", "to": ""}]}, "inputs_copied.0.to"),
    ({"inputs_copied": [5]}, "inputs_copied.0"), ({"inputs_copied": {"a": 1}}, "inputs_copied"),
]


@pytest.mark.parametrize("fields,where", BUNDLE_CASES, ids=[json.dumps(f) for f, _ in BUNDLE_CASES])
def test_bundle_fields(box, fields, where):
    b = _bundle(box)
    _edit_bundle(b, **fields)
    err = bad(["replay", b], box, where)
    assert "bundle.json" in err, err


V2 = {"op": "header", "version": 2, "device_capacity": 64, "host_capacity": 64, "page_size": 1,
      "write_policy": "write_through", "prefetch_threshold": 1}
OPTRACE_V2_CASES = [  # (header changes, op line or None, the line the error names)
    *[({"version": v}, None, 1) for v in [3, 0, "2", 2.0, None, True]],
    *[({"write_acks": v}, None, 1) for v in ["x", 5, None]],
    ({"version": 1, "write_acks": "op"}, None, 1),
    *[({"storage_writes": v}, None, 1) for v in ["x", 5, None, True]],
    ({"version": 1, "storage_writes": "auto"}, None, 1),
    *[({"host_memory_mode": v}, None, 1) for v in ["x", 5, None]],
    ({"version": 1, "host_memory_mode": "cache"}, None, 1),
    *[({"prefetch_threshold": v}, None, 1) for v in [-1, "x", 1.5, 10**16]],
    *[({"page_size": v}, None, 1) for v in [0, -1, "x", 1.5, 2**17]],
    *[({"device_capacity": v}, None, 1) for v in [-1, "x", None, 10**16]],
    *[({"load_back_threshold": v}, None, 1) for v in [-1, "x"]],
    ({"write_policy": "x"}, None, 1), ({"ids": "x"}, None, 1), ({"eviction_policy": "x"}, None, 1),
    ({}, {"op": "prefetch", "tokens": [1, 2]}, 2),
    ({}, {"op": "prefetch", "tokens": "x", "id": "p"}, 2),
    ({}, {"op": "prefetch", "tokens": [1, 2.5], "id": "p"}, 2),
    ({}, {"op": "prefetch", "tokens": [1], "id": [1]}, 2),
    ({}, {"op": "prefetch_hit", "id": "p", "n": "x"}, 2),
    ({}, {"op": "prefetch_hit", "id": "p", "n": -1}, 2),
    ({}, {"op": "prefetch_hit", "id": "p"}, 2),
    ({}, {"op": "prefetch_done", "id": "p", "n": -4}, 2),
    ({}, {"op": "prefetch_done", "id": "p", "n": 1.5}, 2),
    ({}, {"op": "prefetch_revoke"}, 2),
    ({}, {"op": "storage_write", "node": "x", "id": "s"}, 2),
    ({}, {"op": "storage_write", "id": "s"}, 2),
    ({}, {"op": "storage_write_ack"}, 2),
    ({}, {"op": "write_ack"}, 2),
    ({}, {"op": "write_ack", "id": 1.5}, 2),
    ({"write_acks": "end_of_op"}, {"op": "write_ack", "id": 1}, 2),
    ({"version": 1}, {"op": "write_ack", "id": 1}, 2),
    ({"version": 1}, {"op": "prefetch", "tokens": [1], "id": "p"}, 2),
    ({"version": 1}, {"op": "storage_write", "node": 1, "id": "s"}, 2),
    ({"version": 1}, {"op": "pin", "tokens": [1], "id": "p"}, 2),
    ({}, {"op": "buffer_stage", "tokens": "x"}, 2),
    ({}, {"op": "buffer_stage"}, 2),
    ({}, {"op": "pin", "tokens": [1]}, 2),
    ({}, {"op": "unpin"}, 2),
    ({}, {"op": "insert", "tokens": [1], "reserved": -1}, 2),
    ({}, {"op": "insert", "tokens": [1], "reserved": "x"}, 2),
    ({}, {"op": "insert", "tokens": [1], "reserved": 10**16}, 2),
    ({}, {"op": "skip_ids", "n": -1}, 2),
    ({}, {"op": "skip_ids", "n": 10**16}, 2),
    ({}, {"op": "evict_device", "n": "x"}, 2),
    ({}, {"op": "evict_host", "n": -1}, 2),
    ({}, {"op": "nope"}, 2), ({}, {"op": 5}, 2), ({}, {"tokens": [1]}, 2),
    ({}, [1, 2], 2), ({}, "x", 2),
]


@pytest.mark.parametrize("header,line,where", OPTRACE_V2_CASES,
                         ids=[f"{json.dumps(h)} {json.dumps(o)}" for h, o, _ in OPTRACE_V2_CASES])
def test_op_trace_v2_lines(shared_box, header, line, where):
    p = shared_box / "v2.jsonl"
    head = {**V2, **header}  # None: a JSON null
    text = json.dumps(head) + "\n" + (json.dumps(line) + "\n" if line is not None else
                                      json.dumps({"op": "dump"}) + "\n")
    p.write_text(text)
    bad(["replay-ops", p], shared_box, f"v2.jsonl:{where}")
