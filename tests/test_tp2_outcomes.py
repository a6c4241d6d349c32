"""tools/sglang_server/tp2.py's outcome classes, and the vendored outcomes of real TP-2
SGLang groups under faults (data/conformance/tp2/), checked without SGLang."""

import gzip
import json
import sys
from pathlib import Path

from conftest import vendored_checksums_match

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "sglang_server"))

import tp2  # noqa: E402

FOLDER = REPO / "data" / "conformance" / "tp2"


def rank(steps, error=None, fired=None):
    rows = [{"type": "config"}]
    rows += [{"type": "step", "step": i, "host_free": h, "dev_free": d} for i, (h, d) in enumerate(steps)]
    if error:
        rows.append({"type": "error", **error})
    rows.append({"type": "summary", "fault": None if fired is None else {"fired_at": fired}})
    return rows


def test_agree_when_the_ranks_match_step_for_step():
    a = rank([(10, 5), (8, 5)])
    res = tp2.outcome([a, rank([(10, 5), (8, 5)], fired=1)], [False, False])
    assert res["class"] == "agree" and res["fired_at"] == [None, 1]
    assert res["first_free_difference"] is None


def test_the_first_step_where_free_space_differs_is_a_silent_divergence():
    a = rank([(10, 5), (8, 5), (8, 4), (8, 4)])
    b = rank([(10, 5), (9, 5), (8, 3), (8, 4)], fired=1)
    res = tp2.outcome([a, b], [False, False])
    assert res["class"] == "silent_divergence"
    assert res["step"] == 1 and res["differs"] == {"host_free": [8, 9]}
    assert res["steps_differing"] == 2


def test_an_error_record_is_an_assertion_with_each_ranks_step_and_text():
    err = {"step": 7, "exc": "AssertionError", "msg": "diverged"}
    res = tp2.outcome([rank([(1, 1)] * 8, err), rank([(1, 2)] * 8, err)], [False, False])
    assert res["class"] == "assertion"  # an error outranks a free-space difference
    assert res["errors"] == [err, err]
    assert res["first_free_difference"] == {"step": 0, "steps_differing": 8, "differs": {"dev_free": [1, 2]}}


def test_a_rank_still_running_is_a_hang(tmp_path):
    res = tp2.outcome([rank([(1, 1)] * 3), rank([(1, 1)] * 5)], [True, False])
    assert res["class"] == "hang" and res["last_step"] == [2, 4] and res["timed_out"] == [True, False]
    # a killed rank's last line may be cut short: it is dropped, the rest is read
    p = tmp_path / "r.jsonl"
    p.write_text('{"type": "step", "step": 0}\n{"type": "st')
    assert tp2.read_rank(p) == [{"type": "step", "step": 0}]


def test_the_fault_manifest_has_every_kind_at_several_steps_on_ten_workloads():
    cfgs = [c for w in tp2.TP_WORKLOADS for c in tp2.run_configs(w)]
    assert len(tp2.TP_WORKLOADS) >= 10
    assert all(c["write_policy"] == "write_back" and c["fault_rank"] == 1 for c in cfgs)
    kinds = {}
    for c in cfgs:
        if c["fault"]:
            kind, _, at = c["fault"].partition("@")
            kinds.setdefault(kind, set()).add(int(at.split(":")[0]))
    assert set(kinds) == {"host_alloc_fail", "ack_delay", "reclaim_skip"}
    assert all(len(steps) >= 2 for steps in kinds.values())
    argv = tp2.rank_argv(next(c for c in cfgs if c["fault"]), Path("t.jsonl"), Path("o"), 1, 1234)
    assert argv[argv.index("--tp-size") + 1] == "2" and "--fault" in argv
    assert "--fault" not in tp2.rank_argv(cfgs[1], Path("t.jsonl"), Path("o"), 0, 1234)


def test_the_vendored_outcomes_are_complete():
    data = json.loads((FOLDER / "outcomes.json").read_text())
    runs = data["runs"]
    traces = vendored_checksums_match(FOLDER)
    assert {r["trace"][:-3] for r in runs} == traces
    assert len({r["workload"] for r in runs}) >= 10
    classes = {"agree", "assertion", "hang", "silent_divergence"}
    for r in runs:
        o = r["outcome"]
        assert o["class"] in classes, r["run"]
        assert r["config"]["fault"] == r["fault"] and len(o["fired_at"]) == 2
        if o["class"] == "assertion":
            errs = [e for e in o["errors"] if e]
            assert errs and all({"step", "exc", "msg"} <= set(e) for e in errs)
        elif o["class"] == "silent_divergence":
            assert isinstance(o["step"], int) and o["differs"]
        elif o["class"] == "hang":
            assert any(o["timed_out"])
        if r["fault"] is None:
            assert o["class"] == "agree", r["run"]  # a clean group never diverges
    for name in traces:
        with gzip.open(FOLDER / f"{name}.gz", "rt") as f:
            assert all("arrival_step" in json.loads(line) for line in f)
