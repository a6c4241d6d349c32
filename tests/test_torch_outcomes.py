"""`--collective torch` against `simulated` on the shipped scenarios that perturb ranks:
the same outcome, the same step, each rank's same pending call or message.

Every jitter scenario runs cut short (its first requests), under real torch.distributed
gloo and under the simulated collective, with a bounded timeout (2 s: gloo's own
timeout ends a real hang); the parts of divergence.json that say how the group ends
must be equal. The scenarios whose shipped run ends in a collective failure (a hang,
a size mismatch) also run at their shipped size, where the failure happens, so the
pending calls real gloo leaves each rank in are compared too (``slow``). A TP-2 group
under a scripted fault (the step clock, whose ``outcome`` block names each rank's
error), whose ranks split into lanes (sim.lanes) before the digest assertion, runs
under both as well.
"""

import sys
from pathlib import Path

import pytest
import yaml

from sim.runner import run_scenario
from sim.scenario import load_scenario

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
JITTER = sorted((ROOT / "scenarios").glob("jitter_*.yaml"))
TIMEOUT = "collective.timeout_s=2"
# shipped runs that end in a collective failure, and its kind (scenario comments)
FAILING = {"jitter_pre_26921": "hang", "jitter_write_through_alloc_failure": "hang",
           "jitter_host_alloc_failure": "size_mismatch"}


def ending(d: dict) -> dict:
    """How the run ends: verdict, halt, the collective error with each rank's pending
    call and the line it dies with, the digest assertion, and the step-clock outcome."""
    ce = d["collective_error"]
    dm = d["digest_mismatch"]
    return {
        "verdict": d["verdict"], "halted": d["halted"], "finished": d["finished"],
        "steps": d["steps"], "collective_calls": d["collective_calls"],
        # the line too, on the cpu group; the forward runs on the device group, whose
        # simulated line is a server's (NCCL's watchdog) and torch's here gloo's
        "collective_error": None if ce is None else {
            k: ce.get(k) for k in ("step", "kind", "site", "ranks_in", "ranks_out", "pending")
            + (("message",) if ce["site"] != "forward" else ())},
        "digest_mismatch": None if dm is None else {k: dm[k] for k in ("step", "digests")},
        "request_split": d.get("request_split"),
        "outcome": d.get("outcome"),
    }


def both(scn) -> tuple[dict, dict]:
    a = run_scenario(scn, None).divergence
    b = run_scenario(scn, None, collective="torch").divergence
    return ending(a), ending(b)


@pytest.mark.parametrize("path", JITTER, ids=lambda p: p.stem)
def test_torch_ends_every_jitter_scenario_as_simulated(path):
    a, b = both(load_scenario(path, [TIMEOUT, "workload.num_requests=12"]))
    assert a == b


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAILING))
def test_torch_fails_where_simulated_does_with_each_ranks_pending_call(name):
    a, b = both(load_scenario(ROOT / "scenarios" / f"{name}.yaml", [TIMEOUT]))
    assert a == b
    ce = a["collective_error"]
    assert a["halted"] == ce["kind"] == FAILING[name]
    if ce["kind"] == "hang":
        # each rank names the call it is blocked in, and they differ
        p = ce["pending"]
        assert set(p) == {"0", "1"} and p["0"] != p["1"]


def test_torch_ends_a_faulted_tp2_group_with_split_lanes_as_simulated(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    sys.path.insert(0, str(ROOT / "tools" / "sglang_server"))
    import conformance_tp2 as ct
    from runconfig import engine_scenario

    g = next(g for g in ct.load_groups() if g["run"] == "t10_hostpress_ps32.host_alloc_fail_at40")
    scn = engine_scenario(g["config"], str(ct.FOLDER / g["trace"]))
    scn.setdefault("collective", {})["timeout_s"] = 2
    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump(scn, sort_keys=False))
    a, b = both(load_scenario(p))
    assert a == b
    assert a["outcome"]["class"] == "assertion" and a["request_split"] is not None
