"""A sweep on a local Ray instance (2 workers) gives exactly the local executor's
results, and Ray is shut down afterwards."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import ray  # a dev dependency: CI installs it, so a missing Ray fails here

import cli
from sim.sweep import load_sweep

CI_SWEEP = Path(__file__).resolve().parents[1] / "scenarios" / "sweeps" / "ci.yaml"
RESULT_FILES = ("summary.json", "divergence.json", "requests.parquet", "timeseries.parquet",
                "scenario.yaml")


def test_ray_sweep_equals_local_sweep(tmp_path, capsys):
    plan = load_sweep(CI_SWEEP)
    assert len(plan.points) == 4
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    assert cli.main(["sweep", str(CI_SWEEP), "-o", str(local), "--workers", "2", "--quiet"]) == 0
    try:
        rc = cli.main(["sweep", str(CI_SWEEP), "-o", str(on_ray), "--executor", "ray",
                       "--workers", "2", "--quiet"])
    finally:
        stopped = not ray.is_initialized()
        if not stopped:
            ray.shutdown()
    assert stopped, "the sweep left Ray running"
    assert rc == 0
    out = capsys.readouterr().out
    assert out.count("4 point(s): 4 ran, 0 already complete, 0 failed") == 2
    # Determinism: the same point gives byte-identical files on either executor.
    for p in plan.points:
        for name in RESULT_FILES:
            assert (on_ray / p.results_dir / name).read_bytes() == \
                (local / p.results_dir / name).read_bytes(), (p.point_id, name)
    assert (on_ray / "sweep.parquet").read_bytes() == (local / "sweep.parquet").read_bytes()
    table = pd.read_parquet(on_ray / "sweep.parquet")
    assert list(table["point_id"]) == [p.point_id for p in plan.points]
    assert table["hit_rate"].between(0, 1).all() and (table["requests"] == 60).all()
