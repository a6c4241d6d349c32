"""A sweep killed part-way resumes: finished points are kept untouched, the rest run,
and no point folder ever looks complete without being complete."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from reports.load import load_run
from sim.sweep import load_sweep, point_status

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, str(ROOT / "cli.py"), "sweep"]

# Six points of the full quickstart run one after another (--workers 1), so there
# is a window after the first point finishes and before the last one does.
SWEEP = """
name: resume
base: base.yaml
grid:
  host.ratio: [1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
seeds: [1]
"""


@pytest.fixture
def sweep(tmp_path) -> Path:
    shutil.copy(ROOT / "scenarios" / "quickstart.yaml", tmp_path / "base.yaml")
    p = tmp_path / "resume.yaml"
    p.write_text(SWEEP)
    return p


def _complete(out: Path) -> list[Path]:
    return sorted(m.parent for m in (out / "points").glob("*/meta.json"))


def _start_and_stop(sweep: Path, out: Path, sig: int) -> int:
    """Start the sweep in its own process group; once a point is complete, send
    ``sig`` to the whole group (the CLI and its workers, as a terminal or a batch
    system would). Returns the exit status."""
    proc = subprocess.Popen(CLI + [str(sweep), "-o", str(out), "--workers", "1", "--quiet"],
                            cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while proc.poll() is None and not (out / "points").is_dir() or \
                proc.poll() is None and not _complete(out):
            time.sleep(0.005)
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
        _, err = proc.communicate()
        # The sweep's workers die with it, but one may still be finishing a point (an
        # interrupted worker completes the folder it is writing) or a rename in the
        # kernel: read the folder only once the whole process group is gone. On a
        # loaded machine a worker may take long to get there; one still alive after
        # a while is killed outright, so that nothing completes after the count.
        for n in itertools.count():
            try:
                os.killpg(proc.pid, signal.SIGKILL if n >= 2000 else 0)
            except ProcessLookupError:
                break
            time.sleep(0.005)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0, f"the sweep finished before it could be stopped: {err.decode()}"
    return proc.returncode


def _stamps(folders) -> dict:
    return {f.name: ((f / "meta.json").stat().st_ino, (f / "meta.json").stat().st_mtime_ns)
            for f in folders}


def _check_nothing_looks_complete_but_is_not(out: Path) -> None:
    for folder in _complete(out):
        run = load_run(folder)  # every results file present and readable
        assert not run.partial
        assert run.summary["requests"] == len(run.requests)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_killed_sweep_resumes_without_rerunning_or_losing_points(tmp_path, sweep, sig):
    out = tmp_path / "out"
    plan = load_sweep(sweep)
    total = len(plan.points)

    rc = _start_and_stop(sweep, out, sig)
    assert rc == (-signal.SIGKILL if sig == signal.SIGKILL else 130)
    done = _complete(out)
    assert 1 <= len(done) < total
    _check_nothing_looks_complete_but_is_not(out)
    assert {point_status(p, out) for p in plan.points} <= {"done", "todo"}
    before = _stamps(done)

    res = subprocess.run(CLI + [str(sweep), "-o", str(out), "--workers", "1", "--quiet"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    # Each point ran exactly once over the two invocations: the finished ones were
    # skipped (their meta.json is the very same file, unmodified) ...
    assert f"{total - len(done)} ran, {len(done)} already complete, 0 failed" in res.stdout, \
        res.stdout.splitlines()[-3:]
    assert _stamps(done) == before
    # ... and none is lost.
    assert [point_status(p, out) for p in plan.points] == ["done"] * total
    _check_nothing_looks_complete_but_is_not(out)
    table = pd.read_parquet(out / "sweep.parquet")
    assert list(table["point_id"]) == [p.point_id for p in plan.points]
    assert list(table["host.ratio"]) == [1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    assert json.loads((out / "failures.json").read_text()) == []

    # The stitched-together sweep equals one that was never interrupted.
    fresh = tmp_path / "fresh"
    res = subprocess.run(CLI + [str(sweep), "-o", str(fresh), "--workers", "2", "--quiet"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert (fresh / "sweep.parquet").read_bytes() == (out / "sweep.parquet").read_bytes()
    for p in plan.points:
        for name in ("summary.json", "requests.parquet", "timeseries.parquet", "divergence.json"):
            assert (fresh / p.results_dir / name).read_bytes() == (out / p.results_dir / name).read_bytes()
