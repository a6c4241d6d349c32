"""tools/sglang_server/compare_steps.py: the step-by-step comparison of a server-harness
output with an engine ``--record-steps`` file (no SGLang needed)."""

import copy
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "sglang_server"))

import compare_steps as cs  # noqa: E402


def harness_rows():
    """A harness output as server_oracle.py writes it: a config record, steps with the
    harness's extra fields and its omissions (empty hc lists left out, no batch fields
    on an idle step, adds as dicts, retracted per call), requests, a summary."""
    return [
        {"type": "config", "server_args": {"page_size": 16}},
        {"type": "step", "step": 0, "waiting": 1, "mode": "extend", "rids": ["r0", "r1"],
         "extend": [80, 48], "prefix": [0, 0], "chunked": None, "ratio": 0.7, "dev_free": 900,
         "adds": [{"rid": "r0", "rem_total": 1024, "res": "CONTINUE"},
                  {"rid": "r1", "rem_total": 600, "res": "CONTINUE"},
                  {"rid": "r2", "rem_total": 100, "res": "NO_TOKEN"}],
         "retracted": [], "hc": {"ready_counts": [[0, 0]], "digest": 0}},
        {"type": "step", "step": 1, "waiting": 1, "mode": "decode", "rids": ["r0", "r1"],
         "ratio": 0.69, "dev_free": 880, "adds": [], "retracted": [],
         "hc": {"write": [[2, 80, True], [3, 48, True]], "digest": 0}},
        {"type": "step", "step": 2, "waiting": 0, "mode": "extend", "rids": ["r2"],
         "extend": [16], "prefix": [64], "chunked": None, "dev_free": 850,
         "adds": [{"rid": "r2", "res": "CONTINUE"}], "retracted": [["r1"]],
         "hc": {"write_ack": [2, 3], "load": [[4, 32, True]],
                "init_load_back": [["r2", 32, 32]], "digest": 0}},
        {"type": "step", "step": 3, "waiting": 0, "running": 0, "dev_free": 1024, "ops": [],
         "adds": [], "retracted": [], "hc": {"digest": 7}},
        {"type": "req", "rid": "r0", "input_len": 80, "arrival_step": 0, "first_sched_step": 0,
         "finish_step": 2, "cached_tokens": 0, "cached_tokens_device": 0, "cached_tokens_host": 0,
         "host_hit_length": 0},
        {"type": "req", "rid": "r1", "input_len": 48, "first_sched_step": 0, "finish_step": 3,
         "cached_tokens": 0, "cached_tokens_device": 0, "cached_tokens_host": 0},
        {"type": "req", "rid": "r2", "input_len": 80, "first_sched_step": 2, "finish_step": 3,
         "cached_tokens": 64, "cached_tokens_device": 32, "cached_tokens_host": 32},
        {"type": "summary", "steps": 4},
    ]


def engine_rows():
    """The same run as the engine writes it: every contract field present, adds as
    [rid, result] pairs, retracted flat, idle-step fields null."""
    out = []
    for r in harness_rows():
        if r["type"] == "step":
            hc = r.get("hc", {})
            out.append({
                "type": "step", "step": r["step"], "mode": r.get("mode"),
                "rids": r.get("rids", []), "extend": r.get("extend"), "prefix": r.get("prefix"),
                "chunked": r.get("chunked"),
                "adds": [[a["rid"], a["res"]] for a in r["adds"]],
                "retracted": [x for call in r["retracted"] for x in call],
                "hc": {"write": hc.get("write", []), "write_ack": hc.get("write_ack", []),
                       "load": hc.get("load", []), "init_load_back": hc.get("init_load_back", []),
                       "digest": hc.get("digest")}})
        elif r["type"] == "req":
            out.append({"type": "req", **{k: r.get(k) for k in ("rid",) + cs.REQ_FIELDS}})
    return out


def write(path: Path, rows, gz=False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def run_cli(*args):
    return subprocess.run([sys.executable, str(REPO / "tools" / "sglang_server" / "compare_steps.py"),
                           *map(str, args)], capture_output=True, text=True)


def test_identical_files_pass(tmp_path):
    h = write(tmp_path / "h.jsonl.gz", harness_rows(), gz=True)
    e = write(tmp_path / "e.jsonl", engine_rows())
    res = cs.compare_files(h, e)
    assert res.diff is None
    assert (res.steps, res.reqs) == (4, 3)
    done = run_cli(h, e, "--name", "w1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "w1: 4 steps, 3 requests identical"


def test_a_file_compared_with_itself_passes(tmp_path):
    h = write(tmp_path / "h.jsonl", harness_rows())
    assert run_cli(h, h).returncode == 0


def test_non_contract_fields_are_ignored():
    e = engine_rows()
    h = harness_rows()
    h[1]["dev_free"] = 1
    h[1]["ratio"] = 0.1
    h[1]["adds"][0]["rem_total"] = 5  # budgets are the harness's extra
    h[2]["hc"]["ready_counts"] = [[9, 9]]
    h[5]["host_hit_length"] = 99
    assert cs.compare(h, e).diff is None


@pytest.mark.parametrize("step,field,mutate", [
    (0, "prefix", lambda r: r["prefix"].__setitem__(1, 16)),
    (0, "adds", lambda r: r["adds"].__setitem__(2, ["r2", "CONTINUE"])),
    (1, "hc.write", lambda r: r["hc"]["write"].__setitem__(1, [3, 48, False])),
    (2, "retracted", lambda r: r.__setitem__("retracted", [])),
    (2, "hc.init_load_back", lambda r: r["hc"].__setitem__("init_load_back", [["r2", 32, 0]])),
    (3, "hc.digest", lambda r: r["hc"].__setitem__("digest", 21)),
    (3, "mode", lambda r: r.__setitem__("mode", "decode")),
])
def test_a_perturbed_field_fails_naming_its_step_and_field(tmp_path, step, field, mutate):
    e = engine_rows()
    rec = next(r for r in e if r["type"] == "step" and r["step"] == step)
    mutate(rec)
    res = cs.compare(harness_rows(), e)
    assert res.diff_step == step
    assert res.diff_fields == [field]
    assert res.steps == step  # the steps before it were identical
    h = write(tmp_path / "h.jsonl", harness_rows())
    ef = write(tmp_path / "e.jsonl", e)
    done = run_cli(h, ef)
    assert done.returncode == 1
    out = done.stdout
    assert f"at step {step}: {field} differ" in out
    assert "harness {" in out and "engine  {" in out  # both sides shown


def test_a_missing_step_fails_at_that_step():
    e = [r for r in engine_rows() if r.get("step") != 2]
    res = cs.compare(harness_rows(), e)
    assert res.diff_step == 2 and "missing on the engine side" in res.diff
    h = [r for r in harness_rows() if r.get("step") != 3]
    res = cs.compare(h, engine_rows())
    assert res.diff_step == 3 and "missing on the harness side" in res.diff


def test_an_extra_engine_step_fails():
    e = engine_rows()
    e.insert(4, {"type": "step", "step": 4, "mode": None})
    res = cs.compare(harness_rows(), e)
    assert res.diff_step == 4 and "missing on the harness side" in res.diff


@pytest.mark.parametrize("field", cs.REQ_FIELDS)
def test_a_request_difference_fails_naming_the_request(field):
    e = engine_rows()
    rec = next(r for r in e if r.get("rid") == "r2")
    rec[field] = (rec[field] or 0) + 1
    res = cs.compare(harness_rows(), e)
    assert res.diff_step is None and res.diff_fields == [field]
    assert res.diff.startswith("request r2:")
    assert res.steps == 4


def test_a_missing_request_fails():
    e = [r for r in engine_rows() if r.get("rid") != "r1"]
    res = cs.compare(harness_rows(), e)
    assert res.diff == "request r1: missing on the engine side"


def test_quiet_step_adds_compare_like_full_ones():
    h = copy.deepcopy(harness_rows())
    for r in h:
        if r["type"] == "step":
            r["adds"] = [[a["rid"], a["res"], a.get("rem_total")] for a in r["adds"]]
    assert cs.compare(h, engine_rows()).diff is None


def test_an_unreadable_file_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "step", "step": 0}\nnot json\n')
    good = write(tmp_path / "e.jsonl", engine_rows())
    done = run_cli(bad, good)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and f"{bad}:2: found invalid JSON" in done.stderr
    done = run_cli(tmp_path / "absent.jsonl", good)
    assert done.returncode == 2 and "cannot read" in done.stderr and "Traceback" not in done.stderr
