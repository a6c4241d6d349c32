"""Every row of the README's exit-code table, as `run` exits.

The code is what the real server would have done, decided by the first failure it
would hit (the verdict): `on_divergence: halt` and `record` exit alike, whatever a
recorded run does after that failure.
"""

import re

import pytest

import cli
from conftest import ROOT
from sim.verdict import (EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK, EXIT_SERVER_FAILED,
                         EXIT_UNTRACKED, exit_code)


def run(tmp_path, scenario, *sets):
    args = ["run", str(ROOT / scenario), "-o", str(tmp_path / "r"), "--quiet"]
    for s in sets:
        args += ["--set", s]
    return cli.main(args)


# (bundle, its verdict, the code): one shipped bundle per verdict a server dies at.
BUNDLES = [("ack_local", "detected", EXIT_SERVER_FAILED),
           ("id_drift", "false_alarm", EXIT_SERVER_FAILED),
           ("pre_26921", "hang", EXIT_SERVER_FAILED),
           ("device_free_delay", "size_mismatch", EXIT_SERVER_FAILED),
           ("request_order", "size_mismatch", EXIT_SERVER_FAILED)]


@pytest.mark.parametrize("mode", ["halt", "record"])
@pytest.mark.parametrize("bundle,verdict,code", BUNDLES)
def test_the_code_follows_the_first_failure_under_halt_and_record(tmp_path, capsys, bundle,
                                                                  verdict, code, mode):
    import json

    rc = run(tmp_path, f"bundles/{bundle}/scenario.yaml", f"on_divergence={mode}")
    div = json.loads((tmp_path / "r" / "divergence.json").read_text())
    assert div["verdict"] == verdict
    assert rc == code
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("hicache-sim run: ") and "divergence.json" in err
    if verdict in ("detected", "false_alarm"):
        assert "AssertionError" in err
        assert ("recorded, the run went on" in err) == (mode == "record")


@pytest.mark.parametrize("scenario,sets,verdict", [
    ("scenarios/quickstart.yaml", ["workload.num_requests=30"], "agree"),
    ("scenarios/storage_buffer_only.yaml", [], "absorbed"),
])
def test_a_run_a_server_survives_exits_0(tmp_path, scenario, sets, verdict):
    import json

    assert run(tmp_path, scenario, *sets) == EXIT_OK
    assert json.loads((tmp_path / "r" / "divergence.json").read_text())["verdict"] == verdict


def test_bad_input_exits_2(tmp_path, capsys):
    assert run(tmp_path, "scenarios/quickstart.yaml", "host.ratoi=2") == EXIT_BAD_INPUT
    assert "host.ratoi" in capsys.readouterr().err


@pytest.mark.parametrize("div,stuck,code", [
    ({"verdict": "missed", "halted": None}, None, EXIT_OK),  # nothing a server checks saw
    ({"verdict": "agree", "halted": None}, None, EXIT_OK),
    ({"verdict": "detected", "halted": None}, None, EXIT_SERVER_FAILED),  # recorded
    # a recorded detection the run later could not follow: the detection came first
    ({"verdict": "detected", "halted": "untracked"}, None, EXIT_SERVER_FAILED),
    ({"verdict": "missed", "halted": "out_of_memory"}, None, EXIT_SERVER_FAILED),
    ({"verdict": "agree", "halted": None}, "no event left with 3 waiting", EXIT_SERVER_FAILED),
    ({"verdict": "missed", "halted": "untracked"}, None, EXIT_UNTRACKED),
])
def test_exit_code_rows(div, stuck, code):
    assert exit_code(div, stuck) == code


def test_the_readme_table_is_the_codes_the_code_uses():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Exit codes"):]
    section = section[:section.index("\n## ", 4)]
    codes = [int(c) for c in re.findall(r"^\| `(\d+)` \|", section, re.M)]
    assert codes == [EXIT_OK, 1, EXIT_BAD_INPUT, EXIT_SERVER_FAILED, EXIT_UNTRACKED,
                     EXIT_INTERRUPTED]
