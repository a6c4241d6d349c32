"""Every tier's hits as the results hold them: device, host and storage, each labelled.

summary.json's ``host_hit_rate`` counts every token loaded back through the host pool,
storage's included; the run summary, the diagnosis and the report show the host tier's
own hits and the L3's apart (``sim.diagnostics.tier_hits``), so a storage run whose
host holds nothing shows 0 host hits.
"""

import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from reports.html import render_report
from reports.load import load_run
from sim.diagnostics import diagnose

CLI = [sys.executable, str(ROOT / "cli.py")]


@pytest.fixture(scope="module")
def buffer_only(tmp_path_factory):
    """scenarios/storage_buffer_only.yaml as shipped: its host is a staging buffer."""
    out = tmp_path_factory.mktemp("sbo") / "res"
    p = subprocess.run(CLI + ["run", str(ROOT / "scenarios/storage_buffer_only.yaml"), "-o",
                              str(out), "--quiet"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return out, p.stdout, json.loads((out / "summary.json").read_text())


def _row(stdout: str, label: str) -> str:
    m = re.search(rf"^\s*{re.escape(label)}\s{{2,}}(.*)$", stdout, re.M)
    assert m, f"no {label!r} row in:\n{stdout}"
    return m.group(1)


def test_the_summary_has_a_labelled_row_per_tier_with_its_tokens(buffer_only):
    _, stdout, s = buffer_only
    by = s["hit_tokens_by_tier"]
    assert by["host"] == 0 and by["storage"] > 0  # the run holds no host hits at all
    inp = s["input_tokens"]
    for tier in ("device", "host", "storage"):
        row = _row(stdout, f"{tier} hits")
        assert f"({by[tier]:,} tokens)" in row
        assert row.startswith(f"{by[tier] / inp:.1%}")
    assert _row(stdout, "host hits").startswith("0.0%")
    # no row claims the storage hits for the host
    assert "device + host" not in stdout
    assert "staging buffer" in _row(stdout, "host capacity")
    assert _row(stdout, "storage capacity") == "unbounded"
    read = _row(stdout, "storage read / write traffic")
    assert f"({s['l3_read_bytes'] // s['bytes_per_token']:,} tokens)" in read and "GB" in read


def test_the_diagnosis_names_storage_not_host(buffer_only):
    _, _, s = buffer_only
    assert "host 0.0%" in s["diagnosis"] and f"storage {s['l3_hit_rate']:.1%}" in s["diagnosis"]
    assert "staging buffer" in s["diagnosis"]


def test_the_report_has_a_storage_hit_column_and_host_without_it(buffer_only):
    out, _, s = buffer_only
    page = render_report([load_run(out)])
    table = page[page.index("<table>"):page.index("</table>")]
    head = re.findall(r"<th>([^<]*)</th>", table)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", table)
    row = dict(zip(head, cells))
    assert row["host hit"] == "0.0%"
    assert row["storage hit"] == f"{100 * s['l3_hit_rate']:.1f}%"
    assert row["storage capacity per rank"] == "unbounded"


def test_tier_hits_without_storage_is_device_and_host():
    from sim.diagnostics import tier_hits

    s = {"input_tokens": 1000, "device_hit_rate": 0.5, "host_hit_rate": 0.2}
    assert tier_hits(s) == {"device": (500, 0.5), "host": (200, 0.2)}
    with_l3 = dict(s, hit_tokens_by_tier={"device": 500, "host": 50, "storage": 150})
    assert tier_hits(with_l3) == {"device": (500, 0.5), "host": (50, 0.05),
                                  "storage": (150, 0.15)}


def test_device_too_small_counts_storage_hits_as_loaded_back():
    line = diagnose(device_hit_rate=0.1, host_hit_rate=0.05, storage_hit_rate=0.3,
                    device_tokens=100, host_tokens=200, write_policy="write_back")
    assert line.startswith("device too small: 78% of hits")
    assert "host 5.0%, storage 30.0%" in line


def test_the_occupancy_plot_names_a_buffer_only_host_for_what_it_is(buffer_only):
    from reports.plots import build_plots

    out, _, _ = buffer_only
    (occ,) = [p for p in build_plots([load_run(out)]) if p.stem == "tier_occupancy"]
    titles = [ax.get_title() for ax in occ.figure.axes]
    assert titles[0] == "Device tier" and "staging buffer" in titles[1]
