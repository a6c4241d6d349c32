"""`repro --from-dump`: a crash dump written by SGLang's own code, end to end.

The dump (data/dumps/crash_dump_tp8.pkl, tools/sglang_dumps/make_dumps.py) is imported,
its traffic searched over per-rank perturbations for the assertion, and either a
bundle that replays is written (exit 3) or the search says it found none (exit 0).
"""

import json
import os
import subprocess
import sys

from conftest import ROOT

CLI = [sys.executable, str(ROOT / "cli.py")]
DUMP = ROOT / "data" / "dumps" / "crash_dump_tp8.pkl"
DIGEST = "write_back duplicate-reclaim victims diverged across PP/TP ranks"


def cli(*args, env=None):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, cwd=ROOT,
                          env=env)


def test_the_dump_at_its_own_sizes_does_not_reproduce_and_says_so(tmp_path):
    out = tmp_path / "b"
    tmp = tmp_path / "system-tmp"
    tmp.mkdir()
    p = cli("repro", "--from-dump", DUMP, "-o", out, "--tries", 2,
            env={**os.environ, "TMPDIR": str(tmp)})
    assert p.returncode == 0, p.stderr
    assert "dump: 6 requests at TP 8" in p.stdout
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("not reproduced: no perturbation in the space gave") and DIGEST in last
    assert "14 runs" in last  # 7 perturbations x 2 seeds
    assert not out.exists()
    # the import's scratch folder sat beside the bundle and is gone; nothing went to TMPDIR
    assert sorted(x.name for x in tmp_path.iterdir()) == ["system-tmp"]
    assert not any(tmp.iterdir())


def test_a_smaller_device_reproduces_the_digest_assertion_and_bundles_it(tmp_path):
    out = tmp_path / "b"
    p = cli("repro", "--from-dump", DUMP, "-o", out, "--tries", 2, "--set", "device.tokens=384",
            "--set", "host.ratio=1.0", "--shrink-runs", 10)
    assert p.returncode == 3, p.stderr
    assert "found: device_capacity_skew on rank 1, seed 1: AssertionError" in p.stdout
    meta = json.loads((out / "bundle.json").read_text())
    assert json.dumps(meta).count("device_capacity_skew") >= 1
    r = cli("replay", out)
    assert r.returncode == 0, r.stderr
    assert DIGEST in r.stderr or DIGEST in r.stdout
    # The bundle stands alone: the dump's imported trace travelled into it.
    assert any((out / "inputs").iterdir())


def test_another_assertion_is_searched_for_and_reported_missing(tmp_path):
    p = cli("repro", "--from-dump", DUMP, "-o", tmp_path / "b", "--tries", 1, "--set",
            "device.tokens=384", "--set", "host.ratio=1.0", "--assertion", "no such line")
    assert p.returncode == 0
    assert "gave 'no such line'" in p.stdout and "runs failed otherwise" in p.stdout


def test_scenario_and_dump_together_are_refused(tmp_path):
    p = cli("repro", ROOT / "scenarios" / "quickstart.yaml", "--from-dump", DUMP, "-o", tmp_path / "b")
    assert p.returncode == 2 and "exactly one" in p.stderr
    p = cli("repro", "--from-dump", ROOT / "data" / "dumps" / "hostile_reduce.pkl", "-o", tmp_path / "b")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1


def test_a_budget_stops_the_search_between_runs(tmp_path):
    from sim.imports import build, crashdump
    from sim.repro.from_dump import search_dump
    from sim.scenario import load_scenario

    build.write(crashdump.read(DUMP), tmp_path / "imp")
    s = load_scenario(tmp_path / "imp" / "scenario.yaml")
    ticks = iter(range(100))
    res = search_dump(s, tries=5, base_seed=1, budget_s=2.5, clock=lambda: next(ticks))
    assert res.stopped == "budget" and res.runs == 3 and res.outcome is None
    assert res.as_search(1).stopped == "budget"


def test_a_name_must_be_a_slug(tmp_path):
    p = cli("import", DUMP, "-o", tmp_path / "o", "--name", "a b/c")
    assert p.returncode == 2 and "--name" in p.stderr


def test_the_import_scratch_stays_beside_the_bundle(tmp_path, monkeypatch, capsys):
    """Nothing is written outside the output's folder: the imported scenario and trace
    are staged beside the bundle (as the bundle itself is), never in the system temp."""
    import tempfile

    import cli as cli_main

    def refuse(*a, **k):
        raise AssertionError("repro --from-dump wrote into the system temp folder")

    monkeypatch.setattr(tempfile, "TemporaryDirectory", refuse)
    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    rc = cli_main.main(["repro", "--from-dump", str(DUMP), "-o", str(tmp_path / "b"),
                        "--tries", "1"])
    assert rc == 0
    assert "not reproduced" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []  # no bundle, and the scratch folder is gone
