"""`sweep --bounds`: each point gets the offline bound, and no policy beats it."""

import subprocess
import sys

import pandas as pd

from conftest import ROOT


def test_sweep_bounds_column_is_an_upper_reference(tmp_path):
    out = tmp_path / "sw"
    p = subprocess.run([sys.executable, str(ROOT / "cli.py"), "sweep", str(ROOT / "scenarios" / "sweeps" / "ci.yaml"),
                        "-o", str(out), "--quiet", "--bounds", "--workers", "1"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    table = pd.read_parquet(out / "sweep.parquet")
    assert "bound_hit_rate" in table.columns and table["bound_hit_rate"].notna().all()
    assert (table["hit_rate"] <= table["bound_hit_rate"] + 1e-12).all()
    for folder in table["results_dir"]:
        assert (out / folder / "bound.json").exists()
