"""Op-trace replay: page-size handling, generated traces, bad input, the CLI."""

import json
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from conftest import CONFORMANCE, ROOT, expected_outputs
from sim.optrace import Replayer, replay
from sim.optrace_gen import generate


def _replay_ops(ops):
    r = Replayer(ops[0])
    return [r.header_output()] + [r.apply(i, op) for i, op in enumerate(ops[1:], 1)]


def _compress(ops, ps):
    """The same trace at page size 1: each page becomes one token (a fresh id per
    distinct page), capacities in pages."""
    ids = {}

    def conv(tokens):
        n = len(tokens) - len(tokens) % ps
        return [ids.setdefault(tuple(tokens[i:i + ps]), len(ids) + 1) for i in range(0, n, ps)]

    out = []
    for op in ops:
        op = dict(op)
        if op["op"] == "header":
            op.update(page_size=1, device_capacity=op["device_capacity"] // ps,
                      host_capacity=op["host_capacity"] // ps)
        if "tokens" in op:
            op["tokens"] = conv(op["tokens"])
        if op["op"] in ("evict_device", "evict_host"):
            op["n"] = -(-op["n"] // ps)
        out.append(op)
    return out


@pytest.mark.parametrize("ps", [2, 4, 16])
@pytest.mark.parametrize("policy", ["write_back", "write_through"])
@pytest.mark.parametrize("seed", range(4))
def test_page_size_is_a_pure_scaling(ps, policy, seed):
    """A trace at page size P behaves exactly like its page-compressed twin at page
    size 1: same ids, victims, digests; token counts scaled by P."""
    ops = generate(300, seed=seed, page_size=ps, device_capacity=40 * ps,
                   host_capacity=16 * ps, write_policy=policy, mix={
                       "insert": 5, "evict_device": 2, "evict_host": 3, "match": 2,
                       "load_back": 2, "lock": 1})
    # eviction requests in whole pages, so the ceil in _compress is exact
    for op in ops:
        if op["op"] in ("evict_device", "evict_host"):
            op["n"] = -(-op["n"] // ps) * ps
    big, small = _replay_ops(ops), _replay_ops(_compress(ops, ps))
    for b, s in zip(big, small):
        assert [(e["k"], e["id"]) for e in b["events"]] == [(e["k"], e["id"]) for e in s["events"]]
        for key in ("digest", "nodes"):
            assert b[key] == s[key]
        for key in ("dev", "host", "evictable", "protected", "freed", "new", "prefix_len"):
            if key in b:
                assert b[key] == s[key] * ps, (key, b["i"])


@given(st.integers(0, 10_000), st.sampled_from([1, 2, 4]))
def test_generated_traces_replay_without_errors_and_deterministically(seed, ps):
    ops = generate(120, seed=seed, page_size=ps, device_capacity=32 * ps, host_capacity=12 * ps)
    a, b = _replay_ops(ops), _replay_ops(ops)
    assert a == b
    assert not any("error" in out for out in a)


BAD = [
    ('', "an empty file"),
    ('{"op":"insert","tokens":[1]}\n', "the header"),
    ('{"op":"header","host_capacity":4}\n', "'device_capacity'"),
    ('{"op":"header","device_capacity":4,"host_capacity":4,"page_size":0}\n', "'page_size' as a positive int"),
    ('{"op":"header","device_capacity":4,"host_capacity":4,"write_policy":"wb"}\n', "one of write_back"),
    ('{"op":"header","device_capacity":4,"host_capacity":4}\n{"op":"fly"}\n', "one of insert"),
    ('{"op":"header","device_capacity":4,"host_capacity":4}\n{"op":"evict_host","n":"3"}\n', "'n' as an int"),
    ('{"op":"header","device_capacity":4,"host_capacity":4}\n{"op":"lock","tokens":[1]}\n', "'id'"),
    ('{"op":"header","device_capacity":4,"host_capacity":4}\n[1,2]\n', "a JSON object"),
    ('{"op":"header","device_capacity":4,"host_capacity":4}\n{"op":\n', "invalid JSON"),
]


@pytest.mark.parametrize("text,expected", BAD)
def test_bad_traces_are_one_line_errors(tmp_path, text, expected):
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    proc = subprocess.run([sys.executable, str(ROOT / "cli.py"), "replay-ops", str(path), "-o", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and str(path) in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_cli_writes_the_expected_outputs(tmp_path):
    case = CONFORMANCE / "g09_wb_ps2.jsonl.gz"
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, str(ROOT / "cli.py"), "replay-ops", str(case), "-o", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert got == expected_outputs(case)


def test_sglang_id_scheme_shifts_every_id_by_four():
    case = CONFORMANCE / "h04_split_of_duplicate.jsonl.gz"
    plain = list(replay(case))
    raw = list(replay(case, ids="sglang"))
    ids_plain = [e["id"] for o in plain for e in o["events"]]
    ids_raw = [e["id"] for o in raw for e in o["events"]]
    assert ids_raw == [i + 4 for i in ids_plain]


def test_replay_ops_loads_no_engine(tmp_path):
    """`replay-ops -o` is the tree and the trace alone: the engine, SimPy and pandas
    stay unloaded (the engine's imports once cost more than replaying 10k ops)."""
    from sim.jsonl import dumps

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(dumps(op) + "\n" for op in generate(200, seed=1, page_size=4)))
    code = ("import sys, cli\n"
            f"rc = cli.main(['replay-ops', {str(trace)!r}, '-o', {str(tmp_path / 'o.jsonl')!r}])\n"
            "print(sorted(m for m in ('sim.runner', 'sim.events', 'simpy', 'pandas') "
            "if m in sys.modules), rc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert out.strip() == "[] 0"
    # an output line per trace line (the header's included)
    assert (tmp_path / "o.jsonl").read_text().count("\n") == trace.read_text().count("\n")
