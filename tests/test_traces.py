"""Streamed trace readers: the shipped traces, the generic format, and fuzzed input."""

from __future__ import annotations

import gzip
import json
import math
import statistics
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, TRACES
from sim.errors import InputFormatError, UserError
from sim.workloads.base import IdSpace
from sim.workloads.traces import (
    AgenticReader,
    GenericReader,
    MooncakeReader,
    Timestamps,
    _intern_prefix,
)


@pytest.fixture(scope="module")
def traces() -> Path:
    return TRACES


def prefix_consistent(reqs) -> bool:
    parent: dict[int, int] = {}
    for r in reqs:
        prev = -1
        for b in r.blocks:
            if parent.setdefault(b, prev) != prev:
                return False
            prev = b
    return True


# -- Mooncake --------------------------------------------------------------------------


@pytest.mark.parametrize("name,count,span", [
    ("conversation_trace.jsonl.gz", 12031, 3537),
    ("synthetic_trace.jsonl.gz", 3993, 1022),
])
def test_mooncake_real_files(traces, name, count, span):
    path = traces / "mooncake-fast25" / name
    reader = MooncakeReader(path)
    reqs = list(reader)
    assert len(reqs) == count  # the README's request counts
    assert reader.skipped == 0
    arrivals = [r.arrival for r in reqs]
    assert arrivals == sorted(arrivals)
    assert round(arrivals[-1]) == span
    assert [r.rid for r in reqs] == list(range(count))
    assert all(r.block_size == 512 and len(r.blocks) == math.ceil(r.input_len / 512)
               for r in reqs)
    assert prefix_consistent(reqs)
    # trace ids are renumbered one to one (no tails were added: every line has ceil ids)
    distinct_trace_ids = set()
    with gzip.open(path, "rt") as f:
        for line in f:
            distinct_trace_ids.update(json.loads(line)["hash_ids"])
    assert len({b for r in reqs for b in r.blocks}) == len(distinct_trace_ids)


def test_mooncake_rate_scale_and_shared_id_space(traces):
    path = traces / "mooncake-fast25" / "synthetic_trace.jsonl.gz"
    ids = IdSpace()
    ids.new_range(1000)  # another source took ids 0..999
    fast = list(MooncakeReader(path, rate_scale=2.0, ids=ids))
    slow = list(MooncakeReader(path))
    assert [r.arrival * 2 for r in fast] == pytest.approx([r.arrival for r in slow])
    assert min(b for r in fast for b in r.blocks) >= 1000


def _write(tmp_path, name, lines):
    p = tmp_path / name
    p.write_text("".join(line + "\n" for line in lines))
    return p


GOOD = '{"timestamp": %d, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]}'


def test_mooncake_bad_line_names_file_and_line(tmp_path):
    p = _write(tmp_path, "m.jsonl", [GOOD % 0, GOOD % 1, '{"timestamp": 2, "input_length": "x"}'])
    with pytest.raises(InputFormatError) as e:
        list(MooncakeReader(p))
    msg = str(e.value)
    assert msg.startswith(f"{p}:3: ") and "input_length" in msg and "expected" in msg
    assert e.value.line == 3


@pytest.mark.parametrize("bad", [
    "not json",
    "[1, 2]",
    '{"timestamp": 5, "input_length": 1000, "output_length": 5}',
    '{"timestamp": 5, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2, 3, 4]}',
    '{"timestamp": 5, "input_length": 1000, "output_length": -1, "hash_ids": [1, 2]}',
    '{"timestamp": 5, "input_length": true, "output_length": 1, "hash_ids": [1, 2]}',
    '{"timestamp": NaN, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]}',
    '{"timestamp": 5, "input_length": 1000, "output_length": 1, "hash_ids": [1, "a"]}',
    '{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]}',  # goes back
])
def test_mooncake_skip_bad_lines_counts_them(tmp_path, bad):
    p = _write(tmp_path, "m.jsonl", [GOOD % 1, bad, GOOD % 2, "", bad, GOOD % 3])
    with pytest.raises(InputFormatError):
        list(MooncakeReader(p))
    reader = MooncakeReader(p, skip_bad_lines=True)
    reqs = list(reader)
    assert len(reqs) == 3 and reader.skipped == 2
    assert reader.first_skip.startswith(f"{p}:2: ")
    assert [r.rid for r in reqs] == [0, 1, 2]


def test_mooncake_full_block_ids_get_a_fresh_tail(tmp_path):
    p = _write(tmp_path, "m.jsonl", [
        '{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2]}',
        '{"timestamp": 1, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2]}',
    ])
    a, b = list(MooncakeReader(p))
    assert len(a.blocks) == 3 and a.blocks[:2] == b.blocks[:2] and a.blocks[2] != b.blocks[2]


# -- agentic ---------------------------------------------------------------------------


def _walk(reqs, depth=0):
    for r in reqs:
        if r.get("type") == "subagent":
            yield from _walk(r["requests"], depth + 1)
        else:
            yield depth, r


@pytest.fixture(scope="module")
def agentic(traces):
    folder = traces / "weka-claude-code-subset"
    reader = AgenticReader(folder)
    return folder, reader, list(reader)


def test_agentic_counts_match_the_files_and_readme(agentic):
    folder, reader, reqs = agentic
    files = sorted(folder.glob("*.json.gz"))
    assert len(files) == 29
    top = sub = 0
    for f in files:
        for depth, _ in _walk(json.loads(gzip.decompress(f.read_bytes()))["requests"]):
            top += depth == 0
            sub += depth > 0
    assert (top, sub) == (2885, 121)  # 3,006 requests in all, as the README says
    assert len(reqs) == top + sub == 3006
    assert reader.skipped == 0
    assert len({r.session for r in reqs}) == 29


def test_agentic_stream_is_ordered_with_valid_prefix_ids(agentic):
    _, _, reqs = agentic
    arrivals = [r.arrival for r in reqs]
    assert arrivals == sorted(arrivals)
    assert all(r.block_size == 64 and len(r.blocks) == math.ceil(r.input_len / 64) for r in reqs)
    assert prefix_consistent(reqs)
    # hash ids are local to a file: conversations never share a block
    owner: dict[int, int] = {}
    for r in reqs:
        for b in r.blocks:
            assert owner.setdefault(b, r.session) == r.session


def test_agentic_consecutive_requests_share_long_prefixes(agentic):
    _, _, reqs = agentic
    last: dict[int, tuple] = {}
    overlap = []
    for r in reqs:
        prev = last.get(r.session)
        if prev is not None:
            n = 0
            for x, y in zip(prev, r.blocks):
                if x != y:
                    break
                n += 1
            overlap.append(n / len(r.blocks))
        last[r.session] = r.blocks
    # the README quotes a ~96% median consecutive overlap
    assert statistics.median(overlap) > 0.9


def test_agentic_poisson_starts_are_seeded(traces):
    folder = traces / "weka-claude-code-subset"
    a = AgenticReader(folder, start="poisson", start_rate=0.01, seed=1).offsets()
    b = AgenticReader(folder, start="poisson", start_rate=0.01, seed=1).offsets()
    c = AgenticReader(folder, start="poisson", start_rate=0.01, seed=2).offsets()
    assert a == b != c
    assert a[0] == 0.0 and a == sorted(a)
    assert AgenticReader(folder).offsets() == [0.0] * 29


def test_agentic_staggered_merge_on_small_files(tmp_path):
    def conv(hashes_per_req, ts, sub=None):
        reqs = [{"t": t, "type": "n", "in": 64 * len(h) + 10, "out": 3, "hash_ids": h}
                for t, h in zip(ts, hashes_per_req)]
        if sub:
            reqs.insert(1, {"t": 0.5, "type": "subagent", "requests": sub})
        return {"block_size": 64, "requests": reqs}

    sub = [{"t": 0.25, "type": "n", "in": 130, "out": 1, "hash_ids": [100, 101]}]
    (tmp_path / "a.json").write_text(json.dumps(conv([[1, 2], [1, 2, 3]], [0, 1.0], sub)))
    (tmp_path / "b.json").write_text(json.dumps(conv([[1, 2], [1, 9]], [0, 0.6])))
    reqs = list(AgenticReader(tmp_path))
    assert [(r.session, r.arrival) for r in reqs] == [
        (0, 0.0), (1, 0.0), (1, 0.6), (0, 0.75), (0, 1.0)]
    a0, b0, b1, sub0, a1 = reqs
    assert a0.blocks[:2] == a1.blocks[:2]  # same conversation, same prefix
    assert not set(a0.blocks) & set(b0.blocks)  # same local hashes, other conversation
    assert b0.blocks[0] == b1.blocks[0] and b0.blocks[1] != b1.blocks[1]
    assert len(sub0.blocks) == 3 and not set(sub0.blocks) & set(a0.blocks)


def test_agentic_bad_request_is_reported_or_skipped(tmp_path):
    doc = {"block_size": 64, "requests": [
        {"t": 0, "type": "n", "in": 100, "out": 1, "hash_ids": [1]},
        {"t": 1, "type": "n", "in": "lots", "out": 1, "hash_ids": [1]},
    ]}
    p = tmp_path / "c.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(InputFormatError) as e:
        list(AgenticReader(p))
    assert str(p) in str(e.value) and "requests[1]" in str(e.value)
    reader = AgenticReader(p, skip_bad_lines=True)
    assert len(list(reader)) == 1 and reader.skipped == 1


def test_agentic_missing_path_is_a_user_error(tmp_path):
    with pytest.raises(UserError):
        AgenticReader(tmp_path / "nope")
    with pytest.raises(UserError):
        AgenticReader(tmp_path)  # an empty folder


@given(seqs=st.lists(st.lists(st.integers(0, 4), max_size=12), max_size=8))
def test_intern_prefix_shortcut_equals_plain_interning(seqs):
    intern, last, ids = {}, {}, IdSpace()
    plain: dict[tuple, int] = {}
    counter = [0]
    for hs in seqs:
        got = _intern_prefix(list(hs), (), intern, last, ids)
        # the reference: intern every (previous id, hash) pair, no shortcut
        p, want = -1, []
        for h in hs:
            if (p, h) not in plain:
                plain[(p, h)] = counter[0]
                counter[0] += 1
            p = plain[(p, h)]
            want.append(p)
        assert got == want


# -- generic ---------------------------------------------------------------------------


def test_generic_jsonl_and_csv_agree(tmp_path):
    jl = _write(tmp_path, "g.jsonl", [
        "# a comment",
        '{"arrival_s": 0, "input_len": 130, "output_len": 2, "block_size": 64, "blocks": [5, 6, 7], "session": 1}',
        '{"arrival_s": 0.5, "input_len": 128, "output_len": 2, "block_size": 64, "blocks": "5 6"}',
        '{"arrival_s": 0.5, "input_len": 200, "output_len": 0, "blocks": "[5, 8, 9, 10]", "extra": 1}',
    ])
    cs = _write(tmp_path, "g.csv", [
        "arrival_s,input_len,output_len,block_size,blocks,session",
        "0,130,2,64,5 6 7,1",
        "0.5,128,2,64,5 6,",
        '0.5,200,0,,"[5, 8, 9, 10]",',
    ])
    a = list(GenericReader(jl, block_size=64))
    b = list(GenericReader(cs, block_size=64))
    assert a == b
    assert [r.session for r in a] == [1, -1, -1]
    assert a[1].blocks == a[0].blocks[:2]
    assert a[0].blocks[0] == a[2].blocks[0] and a[2].blocks[1] not in a[0].blocks


def test_generic_content_ids_are_chained_into_prefix_ids(tmp_path):
    p = _write(tmp_path, "g.jsonl", [
        '{"arrival_s": 0, "input_len": 128, "output_len": 1, "block_size": 64, "blocks": [1, 2]}',
        '{"arrival_s": 1, "input_len": 128, "output_len": 1, "block_size": 64, "blocks": [3, 2]}',
    ])
    a, b = list(GenericReader(p, block_ids="content"))
    assert a.blocks[1] != b.blocks[1]  # same content hash after a different prefix
    a, b = list(GenericReader(p, block_ids="prefix"))
    assert a.blocks[1] == b.blocks[1]  # as prefix ids they name the same prefix


def test_generic_needs_block_size_and_order(tmp_path):
    p = _write(tmp_path, "g.jsonl", ['{"arrival_s": 0, "input_len": 10, "output_len": 1, "blocks": [1]}'])
    with pytest.raises(InputFormatError, match="block_size"):
        list(GenericReader(p))
    p = _write(tmp_path, "h.jsonl", [
        '{"arrival_s": 2, "input_len": 10, "output_len": 1, "block_size": 16, "blocks": [1]}',
        '{"arrival_s": 1, "input_len": 10, "output_len": 1, "block_size": 16, "blocks": [1]}',
    ])
    with pytest.raises(InputFormatError, match=r":2: .*non-decreasing"):
        list(GenericReader(p))


def test_generic_csv_header_is_checked(tmp_path):
    p = _write(tmp_path, "g.csv", ["when,input_len", "0,10"])
    with pytest.raises(InputFormatError, match="header"):
        list(GenericReader(p, block_size=16))


def test_Timestamps(tmp_path, traces):
    ts = list(Timestamps(traces / "mooncake-fast25" / "synthetic_trace.jsonl.gz", "mooncake"))
    assert len(ts) == 3993 and ts == sorted(ts)
    p = _write(tmp_path, "t.txt", ["0", "1", "x", "2"])
    with pytest.raises(InputFormatError, match=":3: "):
        list(Timestamps(p, "lines"))
    assert list(Timestamps(p, "lines", skip_bad_lines=True)) == [0.0, 1.0, 2.0]


def test_a_generators_skipped_arrival_lines_reach_the_summary(tmp_path):
    """A synthetic workload timed by a ``trace`` arrival file counts the lines it
    skipped, as a trace reader does (summary.json ``skipped_trace_lines``)."""
    from sim.runner import run_scenario
    from sim.scenario import load_scenario

    p = _write(tmp_path, "t.lines", ["0", "0.5", "x", "1.0", "-3", "2.0"])
    for kind in ("multi_turn_chat", "few_shot"):
        scn = load_scenario(ROOT / "scenarios" / "quickstart.yaml", [
            f"workload={{kind: {kind}, num_requests: 6,"
            f" arrival: {{process: trace, path: {p}, skip_bad_lines: true}}}}"],
            trace_roots=[str(tmp_path)])
        assert run_scenario(scn).summary["skipped_trace_lines"] == 2, kind


# -- fuzzing: any input is either read or refused with one UserError line ----------------


def _read_all(kind: str, path: Path, skip: bool):
    if kind == "mooncake":
        return list(MooncakeReader(path, skip_bad_lines=skip))
    if kind in ("generic", "csv"):
        return list(GenericReader(path, block_size=16, skip_bad_lines=skip))
    if kind == "agentic":
        return list(AgenticReader(path, skip_bad_lines=skip))
    return list(Timestamps(path, "lines", skip_bad_lines=skip))


SUFFIX = {"mooncake": ".jsonl", "generic": ".jsonl", "csv": ".csv", "agentic": ".json", "lines": ".txt"}


def _expect_clean(kind, path, skip):
    try:
        _read_all(kind, path, skip)
    except UserError as err:
        assert "\n" not in str(err) and str(path) in str(err)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(SUFFIX)), data=st.binary(max_size=400), skip=st.booleans())
def test_random_bytes_never_crash_a_reader(tmp_path, kind, data, skip):
    path = tmp_path / f"fuzz{SUFFIX[kind]}"
    path.write_bytes(data)
    _expect_clean(kind, path, skip)


def _mutate(text: str, edits) -> str:
    s = list(text)
    for pos, op, ch in edits:
        if not s:
            s = [ch]
            continue
        i = pos % len(s)
        if op == 0:
            del s[i]
        elif op == 1:
            s.insert(i, ch)
        else:
            s[i] = ch
    return "".join(s)


_EDITS = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 2),
                            st.sampled_from(list('{}[]",:0123456789-.eE \n\tanx\x00\xff'))),
                  min_size=1, max_size=8)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=_EDITS, skip=st.booleans())
def test_mutated_mooncake_lines_never_crash(tmp_path, traces, edits, skip):
    with gzip.open(traces / "mooncake-fast25" / "conversation_trace.jsonl.gz", "rt") as f:
        head = "".join(next(f) for _ in range(6))
    path = tmp_path / "m.jsonl"
    path.write_text(_mutate(head, edits), errors="surrogateescape")
    _expect_clean("mooncake", path, skip)


GENERIC_SAMPLE = (
    '{"arrival_s": 0, "input_len": 40, "output_len": 2, "blocks": [1, 2, 3], "session": 1}\n'
    '{"arrival_s": 1.5, "input_len": 33, "output_len": 0, "blocks": "1 2 4"}\n'
)
CSV_SAMPLE = "arrival_s,input_len,output_len,blocks,session\n0,40,2,1 2 3,1\n1.5,33,0,1 2 4,\n"
AGENTIC_SAMPLE = json.dumps({"block_size": 16, "requests": [
    {"t": 0, "type": "n", "in": 40, "out": 2, "hash_ids": [1, 2]},
    {"t": 1, "type": "subagent", "requests": [{"t": 0, "in": 20, "out": 1, "hash_ids": [7]}]},
    {"t": 2, "type": "n", "in": 50, "out": 2, "hash_ids": [1, 2, 3]},
]})


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["generic", "csv", "agentic"]), edits=_EDITS, skip=st.booleans())
def test_mutated_generic_and_agentic_never_crash(tmp_path, kind, edits, skip):
    sample = {"generic": GENERIC_SAMPLE, "csv": CSV_SAMPLE, "agentic": AGENTIC_SAMPLE}[kind]
    path = tmp_path / f"f{SUFFIX[kind]}"
    path.write_text(_mutate(sample, edits), errors="surrogateescape")
    _expect_clean(kind, path, skip)


def test_samples_are_valid(tmp_path):
    """The fuzz seeds themselves parse: mutations start from valid input."""
    for kind, sample in (("generic", GENERIC_SAMPLE), ("csv", CSV_SAMPLE), ("agentic", AGENTIC_SAMPLE)):
        path = tmp_path / f"f{SUFFIX[kind]}"
        path.write_text(sample)
        assert len(_read_all(kind, path, False)) in (2, 3)
