"""The whole-trace Mooncake reader (``MooncakeReader.arrays``, the planner's) against
the record-by-record one: the same requests and ids, or None where only the plain
reader can say (it then raises, skips, or reads a form the typed decoder refuses)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, TRACES
from sim.errors import InputFormatError
from sim.workloads import build_workload
from sim.workloads.base import IdSpace
from sim.workloads.traces import MooncakeReader


def as_requests(arr) -> list[tuple]:
    """(arrival, blocks, block size, input, output) per request of a TraceArrays."""
    ends = np.cumsum(arr.counts).tolist()
    starts = [0] + ends[:-1]
    flat = arr.blocks.tolist()
    return [(a, tuple(flat[s:e]), arr.block_size, i, o) for a, s, e, i, o in
            zip(arr.arrival.tolist(), starts, ends, arr.input_len.tolist(), arr.output_len.tolist())]


def plain(reqs) -> list[tuple]:
    return [(r.arrival, r.blocks, r.block_size, r.input_len, r.output_len) for r in reqs]


@pytest.mark.parametrize("name", ["conversation_trace.jsonl.gz", "synthetic_trace.jsonl.gz"])
def test_real_traces_read_whole_equal_record_by_record(name):
    path = TRACES / "mooncake-fast25" / name
    a_ids, p_ids = IdSpace(), IdSpace()
    a_ids.new_range(77)  # another source took ids first
    p_ids.new_range(77)
    arr = MooncakeReader(path, rate_scale=1.5, ids=a_ids).arrays()
    assert arr is not None
    assert as_requests(arr) == plain(MooncakeReader(path, rate_scale=1.5, ids=p_ids))
    assert a_ids.next_id == p_ids.next_id


def test_full_block_ids_get_the_fresh_tail_in_the_same_order(tmp_path):
    recs = [{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [5]},  # tail
            {"timestamp": 1, "input_length": 1024, "output_length": 1, "hash_ids": [5, 9]},
            {"timestamp": 1, "input_length": 100, "output_length": 0, "hash_ids": []},  # tail only
            {"timestamp": 2.5, "input_length": 1600, "output_length": 3, "hash_ids": [5, 9, 4]}]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n\n")
    arr = MooncakeReader(path).arrays()
    assert as_requests(arr) == plain(MooncakeReader(path))
    assert arr.blocks.tolist() == [0, 1, 0, 2, 3, 0, 2, 4, 5]


record = st.fixed_dictionaries({
    "timestamp": st.integers(0, 3),  # steps between records: non-decreasing
    "input_length": st.integers(1, 5 * 512),
    "output_length": st.integers(0, 9),
    "hash_ids": st.lists(st.integers(-3, 12), max_size=6),
})
# What makes a line one only the plain reader reads (or refuses): each form.
odd = st.sampled_from([
    None, None, None, None, None, None,
    "blank", "string ids", "float length", "two objects", "going back", "bad json",
    "huge id", "bool time", "extra field",
])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(record, odd), min_size=0, max_size=8), st.booleans())
def test_random_traces_whole_equal_record_by_record_or_defer(tmp_path, rows, fit):
    lines, t = [], 0
    for rec, how in rows:
        t += rec["timestamp"]
        rec = dict(rec, timestamp=t * 250)
        if fit:  # mostly valid counts: ceil, or full blocks only
            n = -(-rec["input_length"] // 512) if len(rec["hash_ids"]) % 2 else rec["input_length"] // 512
            rec["hash_ids"] = (rec["hash_ids"] * 6)[:n] or list(range(n))
        text = json.dumps(rec)
        if how == "blank":
            lines.append("   ")
        elif how == "string ids":
            text = json.dumps(dict(rec, hash_ids=" ".join(map(str, rec["hash_ids"]))))
        elif how == "float length":
            text = json.dumps(dict(rec, input_length=float(rec["input_length"])))
        elif how == "two objects":
            text = text + " " + text
        elif how == "going back":
            text = json.dumps(dict(rec, timestamp=rec["timestamp"] - 1))
        elif how == "bad json":
            text = text[:-1]
        elif how == "huge id":
            text = json.dumps(dict(rec, hash_ids=[2**70] + rec["hash_ids"][1:]))
        elif how == "bool time":
            text = json.dumps(dict(rec, timestamp=True))
        elif how == "extra field":
            text = json.dumps(dict(rec, note={"a": [1, 2]}))
        lines.append(text)
    path = tmp_path / "t.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines))
    try:
        want = plain(MooncakeReader(path))
    except InputFormatError:
        want = None
    arr = MooncakeReader(path).arrays()
    if arr is not None:  # whenever it answers, it is the plain reader's answer
        assert want is not None and as_requests(arr) == want
    elif want is not None and all(h in (None, "blank", "extra field") for _, h in rows):
        raise AssertionError("a trace of plain records was left to the plain reader")


@pytest.mark.parametrize("sets", [[], ["limits.max_requests=300"], ["limits.duration_s=120"],
                                  ["limits.max_requests=50", "limits.duration_s=1e6"]])
def test_the_stream_applies_the_limits_as_iterating_does(sets):
    from sim.scenario import load_scenario

    scn = load_scenario(ROOT / "scenarios" / "mooncake_synthetic.yaml", sets)
    arr = build_workload(scn).arrays()
    assert arr is not None
    assert as_requests(arr) == plain(build_workload(scn))
