"""Plots: every kind is written, is a valid non-blank image, shows the data, and is
byte-identical for the same input."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread

from reports.load import load_many, load_run
from reports.plots import FIGURES, build_plots, plot_runs
from test_reports_fixture import build_run, build_sweep

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RUN_PLOTS = ["hit_rate_vs_host_capacity", "effective_capacity", "tier_occupancy",
             "ttft_cdf", "transfer_traffic"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("plots")
    runs = [build_run(root / f"wt-lru-x{r:g}", ratio=r) for r in (1.0, 2.0, 4.0)]
    runs += [build_run(root / f"wb-df-x{r:g}", write_policy="write_back",
                       host_policy="duplicate_first", ratio=r) for r in (1.0, 4.0)]
    runs.append(build_run(root / "wb-df-x4-s1", write_policy="write_back",
                          host_policy="duplicate_first", ratio=4.0, seed=1, partial=True))
    sweep = build_sweep(root / "sweep", ratios=(1.0, 2.0), seeds=(0, 1), requests=80)
    return runs, sweep


@pytest.fixture(scope="module")
def written(folders, tmp_path_factory):
    runs, sweep = folders
    out = tmp_path_factory.mktemp("out")
    notes: list[str] = []
    paths = plot_runs(load_many([*runs, sweep]), out, notes=notes)
    return out, paths, notes


def test_all_plots_written_as_png_and_svg(written):
    out, paths, notes = written
    assert notes == []
    expected = {f"{stem}.{ext}" for stem in RUN_PLOTS + ["hit_rate_vs_host_capacity_sweep"]
                for ext in ("png", "svg")}
    assert {p.name for p in paths} == expected
    assert all(p.parent == out for p in paths)
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]  # atomic writes


def test_pngs_are_valid_and_not_blank(written):
    _, paths, _ = written
    for path in (p for p in paths if p.suffix == ".png"):
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE), path
        img = imread(path)
        assert img.shape[0] > 300 and img.shape[1] > 500, path
        # A blank canvas has one colour; a plot has lines, bars and text.
        assert img[..., :3].std() > 0.05, path
        rgb = (img[..., :3] * 255).astype(np.uint32)
        colours = np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2])
        assert len(colours) > 50, path
        assert b"Software" not in data and b"tIME" not in data  # no dates/versions


def test_svgs_parse_and_carry_titles(written):
    _, paths, _ = written
    for path in (p for p in paths if p.suffix == ".svg"):
        root = ET.parse(path).getroot()
        assert root.tag.endswith("svg"), path
        text = path.read_text()
        assert "<dc:date>" not in text
    ttft = (written[0] / "ttft_cdf.svg").read_text()
    # Text is drawn as paths; matplotlib keeps the string in a comment beside it.
    assert "Time to first token (CDF)" in ttft and "log scale" in ttft
    assert "wb-df-x4-s1 (partial)" in ttft
    traffic = (written[0] / "transfer_traffic.svg").read_text()
    assert "cumulative bytes (GB)" in traffic  # decimal, as every capacity


def test_same_input_gives_identical_bytes(folders, written, tmp_path):
    runs, sweep = folders
    out, paths, _ = written
    again = plot_runs(load_many([*runs, sweep]), tmp_path)
    for first, second in zip(paths, again):
        assert first.name == second.name
        assert first.read_bytes() == second.read_bytes(), first.name


def _bars(fig):
    """(x, bottom, height, colour) of every bar in the figure's visible axes."""
    out = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for patch in ax.patches:
            out.append((ax.get_title(), round(patch.get_x() + patch.get_width() / 2, 6),
                        patch.get_y(), patch.get_height()))
    return out


def test_capacity_bars_show_the_runs_split(folders):
    runs, _ = folders
    loaded = [load_run(d) for d in runs[:3]]  # write_through + lru at 1x, 2x, 4x
    (plot,) = [p for p in build_plots(loaded) if p.stem == "hit_rate_vs_host_capacity"]
    (ax,) = [a for a in plot.figure.axes if a.get_visible()]
    assert ax.get_title() == "write_through + host: lru"
    # meta.json knows the bytes per token (65536): capacities in GB per rank, tokens beside.
    assert ax.get_xlabel() == "host capacity per rank (GB = 1e9 bytes)"
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    for tick, run, ratio in zip(ticks, loaded, (1, 2, 4)):
        tokens = run.summary["host_tokens"]
        gb, tok, dev = tick.split("\n")
        assert gb == f"{tokens * 65536 / 1e9:.3g} GB"
        assert tok.endswith(" tok") and dev == f"({ratio}× dev)"
    bars = _bars(plot.figure)
    assert len(bars) == 9  # device, host, miss for each capacity
    for i, run in enumerate(loaded):  # ordered by capacity, as the runs are
        device, host, miss = (b for b in bars if b[1] == i)
        s = run.summary
        assert device[3] == pytest.approx(s["device_hit_rate"])
        assert host[2] == pytest.approx(s["device_hit_rate"])
        assert host[3] == pytest.approx(s["host_hit_rate"])
        assert miss[2] + miss[3] == pytest.approx(1.0)
    # The offline bound is drawn, one segment per bar, at bound_hit_rate.
    (bound,) = ax.collections[-1:]
    ys = sorted(seg[0][1] for seg in bound.get_segments())
    assert ys == pytest.approx(sorted(r.summary["bound_hit_rate"] for r in loaded))


def test_capacity_in_tokens_when_bytes_unknown(tmp_path):
    runs = [load_run(build_run(tmp_path / f"r{r:g}", ratio=r, bytes_known=False,
                               requests=40)) for r in (1.0, 2.0)]
    runs.append(load_run(build_run(tmp_path / "cut", ratio=2.0, seed=1, partial=True,
                                   bytes_known=False, requests=40)))
    (plot,) = [p for p in build_plots(runs) if p.stem == "hit_rate_vs_host_capacity"]
    (ax,) = [a for a in plot.figure.axes if a.get_visible()]
    assert ax.get_xlabel() == "host capacity (tokens)"
    # The 2x bar averages a full and a partial run, and says so.
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "48K\n(1× dev)", "96K\n(2× dev)\n(partial)"]


def test_sweep_bars_are_means_over_seeds(folders):
    _, sweep = folders
    res = load_many([sweep])
    (plot,) = [p for p in build_plots(res) if p.stem.startswith("hit_rate_vs_host_capacity")]
    titles = sorted(a.get_title() for a in plot.figure.axes if a.get_visible())
    assert titles == ["write_back + host: duplicate_first", "write_back + host: lru",
                      "write_through + host: duplicate_first", "write_through + host: lru"]
    table = res.sweeps[0].table
    want = table[(table["cache.write_policy"] == "write_back")
                 & (table["cache.host_policy"] == "lru")]
    want = want.groupby("host.ratio")["host_hit_rate"].mean().to_numpy()
    ax = next(a for a in plot.figure.axes if a.get_title() == "write_back + host: lru")
    host_bars = [p for p in ax.patches if p.get_facecolor()[:3] == pytest.approx(
        (0xef / 255, 0x86 / 255, 0x36 / 255))]
    assert [p.get_height() for p in host_bars] == pytest.approx(list(want))
    # Two seeds per point: the error bars are drawn.
    assert any(len(c.get_segments()) == 2 for c in ax.collections
               if hasattr(c, "get_segments"))


def test_sweep_alone_plots_capacity_and_notes_the_rest(folders, tmp_path):
    _, sweep = folders
    notes: list[str] = []
    paths = plot_runs(load_many([sweep]), tmp_path, formats=["png"], notes=notes)
    assert [p.name for p in paths] == ["hit_rate_vs_host_capacity_sweep.png"]
    assert len(notes) == len(FIGURES) - 1
    assert all(n.startswith("skipped ") and "no run folders" in n for n in notes)


def test_run_without_traffic_skips_the_traffic_plot(tmp_path):
    d = build_run(tmp_path / "device-only")
    req = pd.read_parquet(d / "requests.parquet")
    req[["load_back_tokens", "load_back_bytes", "load_back_s"]] = 0
    req.to_parquet(d / "requests.parquet")
    ts = pd.read_parquet(d / "timeseries.parquet")
    ts[["backup_tokens", "load_back_tokens"]] = 0
    ts.to_parquet(d / "timeseries.parquet")
    notes: list[str] = []
    names = [p.stem for p in build_plots([load_run(d)], notes)]
    assert "transfer_traffic" not in names and "ttft_cdf" in names
    assert notes == ["skipped transfer_traffic: no load-back or backup traffic in any run"]


def test_traffic_ends_at_the_summary_totals(folders):
    runs, _ = folders
    loaded = [load_run(d) for d in runs[:2]]
    (plot,) = [p for p in build_plots(loaded) if p.stem == "transfer_traffic"]
    load_ax, backup_ax = plot.figure.axes
    assert load_ax.get_ylabel() == backup_ax.get_ylabel() == "cumulative bytes (GB)"
    for ax, key in ((load_ax, "load_back_bytes"), (backup_ax, "backup_bytes")):
        ends = [line.get_ydata()[-1] for line in ax.get_lines()]
        assert ends == pytest.approx([r.summary[key] / 1e9 for r in loaded])


def test_unknown_format_is_rejected(folders, tmp_path):
    runs, _ = folders
    with pytest.raises(ValueError, match="jpg"):
        plot_runs([load_run(runs[0])], tmp_path, formats=["jpg"])


def test_capacity_bars_split_the_host_hit_by_storage(tmp_path):
    """Runs with storage: the host bar is split into host and storage (L3), from
    summary.json's ``hit_tokens_by_tier``; the panels tell the storage sizes apart."""
    from conftest import ROOT
    from sim.runner import run_scenario
    from sim.scenario import load_scenario

    runs = []
    for cap in (None, 0.3):
        out = tmp_path / f"c{cap}"
        sets = ["workload.num_requests=120"] + ([] if cap is None else [f"storage.capacity_gb={cap}"])
        run_scenario(load_scenario(ROOT / "scenarios" / "storage_mooncake.yaml", sets), out)
        runs.append(load_run(out))
    (plot,) = [p for p in build_plots(runs) if p.stem == "hit_rate_vs_host_capacity"]
    titles = sorted(a.get_title() for a in plot.figure.axes if a.get_visible())
    assert titles == ["capacity_gb=0.3", "capacity_gb=null"]
    bars = _bars(plot.figure)
    assert len(bars) == 8  # device, host, storage, miss per run
    for run in runs:
        s = run.summary
        title = "capacity_gb=null" if run.scenario["storage"].get("capacity_gb") is None \
            else "capacity_gb=0.3"
        device, host, l3, miss = (b for b in bars if b[0] == title)
        share = s["hit_tokens_by_tier"]["storage"] / s["input_tokens"]
        assert l3[3] == pytest.approx(share)
        assert host[3] + l3[3] == pytest.approx(s["host_hit_rate"])
        assert miss[2] + miss[3] == pytest.approx(1.0)
    l3 = {t: [b for b in bars if b[0] == t][2][3] for t in titles}
    assert l3["capacity_gb=null"] > l3["capacity_gb=0.3"]  # a bigger store gives more back
    labels = [t.get_text() for t in plot.figure.legends[0].get_texts()]
    assert "storage hit (L3, prefetched to host)" in labels


def test_storage_share_reads_summary_dicts_and_sweep_table_json():
    """A sweep table holds ``hit_tokens_by_tier`` as JSON text; a run's summary as a dict;
    a run without storage has no L3 share (NaN, drawn as no storage bar)."""
    import json

    from reports.plots import _storage_rate

    tiers = {"device": 60, "host": 20, "storage": 30}
    assert _storage_rate(tiers, 200) == 0.15
    assert _storage_rate(json.dumps(tiers), 200) == 0.15
    assert np.isnan(_storage_rate(None, 200)) and np.isnan(_storage_rate(tiers, 0))
    assert np.isnan(_storage_rate("not json", 200))
