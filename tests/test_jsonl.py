"""sim.jsonl (msgspec) against the standard library: the same values read, the same
bytes written, the same one-line errors; and the replayer's kept paths against the
tree's own walk."""

import sys
import gzip
import json

import pytest

from conftest import CONFORMANCE, conformance_cases, replay_checked
from sim import jsonl, optrace
from sim.errors import InputFormatError
from sim.optrace import Replayer, read_trace, replay

sys.path.insert(0, str(CONFORMANCE.parents[1] / "tools"))
from result_hashes import NOT_OP_TRACES  # noqa: E402  (the server harness's logs)

ALL_CASES = sorted(p for p in CONFORMANCE.rglob("*.jsonl.gz")
                   if not p.name.endswith(".out.jsonl.gz")
                   and p.relative_to(CONFORMANCE).parts[0] not in NOT_OP_TRACES)


def test_msgspec_is_installed():
    """A dependency (pyproject.toml): without it sim.jsonl falls back to json, slower."""
    jsonl.loads(b"{}")
    assert jsonl.msgspec is not None


def test_every_vendored_line_reads_and_writes_as_json_does():
    n = 0
    for case in ALL_CASES:
        out = case.with_name(case.name.replace(".jsonl.gz", ".out.jsonl.gz"))
        for path in (case, out):
            for raw in gzip.decompress(path.read_bytes()).splitlines():
                if not raw.strip():
                    continue
                want = json.loads(raw)
                got = jsonl.loads(raw)
                if got is None:  # only a line too bracketed to be read fast (a dump)
                    assert raw.count(b"[") + raw.count(b"{") > jsonl._MAX_BRACKETS
                else:
                    assert got == want and list(got) == list(want)
                assert jsonl.dumps(want) == jsonl.plain_dumps(want)
                n += 1
    assert n > 100_000


EDGES = [
    {"id": "r\u00e9q", "n": 1}, {"id": "del\x7f"}, {"id": "ctl\x00\x01\x1f\n\t\"\\/"},
    {"id": "\U0001f600"}, {"n": 2**64}, {"n": -2**63 - 1}, {"n": 10**40}, {"k": None},
    {"k": True, "j": False}, {"tokens": []}, {"nested": {"a": [1, [2, [3]]]}}, {1: 2},
    [1, 2, 3], "text", 7,
]


@pytest.mark.parametrize("obj", EDGES, ids=repr)
def test_dumps_is_json_dumps_at_the_edges(obj):
    assert jsonl.dumps(obj) == json.dumps(obj, separators=(",", ":"))


LINES = [b'{"a":NaN}', b'{"a":Infinity}', b'{"a":1e400}', b'{"a":"\\ud800"}', b'{"a":"\xff"}',
         b'{"a":' + b"9" * 5000 + b"}", b'{"a":' + b"[" * 995 + b"]" * 995 + b"}",
         b'{"a":' + b"[" * 3000 + b"]" * 3000 + b"}", b" ", b"\x1c", b'{"a":1,"a":2,"b":3}',
         b'{"a":' + b"9" * 30 + b"}", b"\xef\xbb\xbf{}", b'{"a":1} x', b'{"a":"\xc3\xa9"}']


@pytest.mark.parametrize("raw", LINES, ids=lambda r: repr(r[:24]))
def test_loads_reads_what_json_reads_or_leaves_it_to_json(raw):
    got = jsonl.loads(raw)
    if got is None:
        return  # the caller's plain path: json.loads itself
    assert got == json.loads(raw.decode("utf-8"))
    assert list(got) == list(json.loads(raw.decode("utf-8")))


@pytest.mark.parametrize("text", ['{"a":"\udc80"}', '{"a":1}\udcff', '{"a":"\ud800x"}'])
def test_loads_leaves_lone_surrogates_to_json(text):
    assert jsonl.loads(text) is None


def _read(path, plain: bool, monkeypatch):
    with monkeypatch.context() as m:
        if plain:
            m.setattr(optrace.jsonl, "loads", lambda raw: None)
        try:
            return [op for _, _, op in read_trace(path)]
        except InputFormatError as err:
            return str(err)


HEADER = b'{"op":"header","device_capacity":64,"host_capacity":32}\n'
BAD_OPS = [b'{"op":"insert","tokens":[1,2,true]}', b'{"op":"insert","tokens":[1,2.0]}',
           b'{"op":"insert","tokens":' + b"[" * 995 + b"]" * 995 + b"}",
           b'{"op":"lock","tokens":[1],"id":1.5}', b'{"op":"evict_device","n":NaN}',
           b'{"op":"insert","tokens":[1,' + b"9" * 5000 + b"]}", b'{"op":"insert","tokens":[1]',
           b'{"op":"lock","tokens":[1],"id":"r\xc3\xa9"}', b'{"op":"match","tokens":"abc"}',
           b'[1,2]', b'{"op":"insert","tokens":[1,2]}\n\n \n\x1c\n{"op":"dump"}', b'\xff\xfe']


@pytest.mark.parametrize("line", BAD_OPS, ids=lambda r: repr(r[:30]))
def test_a_trace_reads_as_the_plain_path_reads_it(tmp_path, monkeypatch, line):
    p = tmp_path / "t.jsonl"
    p.write_bytes(HEADER + line + b"\n")
    assert _read(p, False, monkeypatch) == _read(p, True, monkeypatch)


@pytest.mark.parametrize("case", conformance_cases()[::4], ids=lambda p: p.name.split(".")[0])
def test_kept_paths_are_the_tree_walks(case):
    for rp in replay_checked(case, Replayer):
        ps = rp.page_size
        for node in rp.tree.iter_nodes():
            units = rp.tree.path_units(node)
            assert rp.path(node) == (units if ps == 1 else [t for u in units for t in u])


def test_kept_paths_stay_right_when_the_cache_is_cleared(monkeypatch):
    case = conformance_cases()[-1]
    want = list(replay(case))
    monkeypatch.setattr(optrace, "PATH_CACHE", 3)
    assert list(replay(case)) == want
