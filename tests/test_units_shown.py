"""One unit for sizes and one formatter for delays in everything a user reads.

Capacities are in GB (1e9 bytes, SGLang's --hicache-size), so traffic is too; every
delay goes through ``sim.fmt.duration`` ("13.7 s", "7.2 ms"), never "13.6912 s".
"""

import re
import subprocess
import sys

from conftest import ROOT
from reports.plots import _byte_unit, _fmt_seconds
from sim.diagnostics import diagnose
from sim.fmt import duration
from sim.verdict import Observations

CLI = [sys.executable, str(ROOT / "cli.py")]


def test_the_run_summary_gives_traffic_in_gb_like_capacities(tmp_path):
    p = subprocess.run(CLI + ["run", str(ROOT / "scenarios/quickstart.yaml"), "-o",
                              str(tmp_path / "r"), "--quiet", "--set", "workload.num_requests=40"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "GiB" not in p.stdout
    traffic = next(line for line in p.stdout.splitlines() if line.startswith("load-back"))
    assert re.search(r"[\d.]+ GB \([\d,]+ tokens\) / [\d.]+ GB \([\d,]+ tokens\) per rank", traffic)


def test_plots_scale_bytes_in_decimal_units():
    assert _byte_unit(3e9) == ("GB", 1e9) and _byte_unit(5e6) == ("MB", 1e6)
    assert _fmt_seconds(0.0072) == duration(0.0072) == "7.2 ms"
    assert duration(4e-5) == "40 µs"


def test_the_detection_delay_reads_as_a_duration():
    obs = Observations(2, None)
    obs.first_true_divergence = {"t": 1.2088, "step": 3, "what": "tree contents differ"}
    obs.digest = {"t": 14.9, "step": 9}
    verdict, reason = obs.verdict()
    assert verdict == "detected"
    assert "13.7 s after the trees diverged" in reason and "13.6912" not in reason


def test_ages_in_the_diagnosis_are_durations():
    line = diagnose(device_hit_rate=0.5, host_hit_rate=0.0, device_tokens=1, host_tokens=2,
                    write_policy="write_back", age_at_hit_s=90.5, age_at_eviction_s=0.25)
    assert "median age at hit 1.51 min vs at eviction 250 ms" in line
