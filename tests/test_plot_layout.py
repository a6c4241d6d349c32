"""Multi-run figures stay legible for 2 to 8 runs: no text over another, none cut off.

Each figure is drawn with its renderer and every visible text (titles, panel titles,
tick labels, axis labels, legend entries, annotations) is measured with
``get_window_extent``: each must lie inside the figure, and no two may overlap.
"""

import itertools
import re

import pytest

from reports.load import load_run
from reports.plots import build_plots
from sim.runner import run_scenario
from sim.scenario import load_scenario
from conftest import ROOT

# Eight runs that differ in three policy keys and in four workload keys, under folder
# names as long as a sweep's: long panel titles, long legend entries.
POLICIES = [(w, h, e) for w in ("write_back", "write_through")
            for h in ("duplicate_first", "lru") for e in ("lru", "lfu")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout")
    out = []
    for i, (w, h, e) in enumerate(POLICIES):
        sets = [f"cache.write_policy={w}", f"cache.host_policy={h}",
                f"cache.eviction_policy={e}", "workload.num_requests=24",
                f"workload.user_tokens.mean={150 + 10 * i}",
                f"workload.arrival.rate={1 + i / 8:g}",
                f"workload.output_tokens.mean={200 + 8 * i}",
                f"workload.think_time_s.mean={10 + i / 4:g}"]
        scn = load_scenario(ROOT / "scenarios/quickstart.yaml", sets)
        folder = root / f"quickstart_{w}_{h}_evict_{e}_user_tokens_{150 + 10 * i}_seed_1"
        run_scenario(scn, folder)
        out.append(load_run(folder))
    return out


def _drawn_texts(fig):
    """Every non-empty text drawing ``fig`` draws (a tick label outside the axis limits
    or in an unused panel is not drawn), once each, with its extent in display pixels."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    from reports.plots import STYLE

    drawn = {}
    plain = Text.draw

    def record(self, renderer):
        plain(self, renderer)
        if self.get_visible() and self.get_text().strip():
            drawn[id(self)] = (self.get_text(), self.get_window_extent(renderer))

    FigureCanvasAgg(fig)
    with pytest.MonkeyPatch.context() as mp, matplotlib.rc_context(STYLE):
        mp.setattr(Text, "draw", record)
        fig.canvas.draw()  # the fonts the files are saved with
    return list(drawn.values())


def _overlap(a, b, tol=0.5) -> bool:
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > tol) and (min(a.y1, b.y1) - max(a.y0, b.y0) > tol)


def layout_problems(fig) -> list[str]:
    texts = _drawn_texts(fig)
    box = fig.bbox
    bad = [f"{s!r} cut off: x {e.x0:.0f}..{e.x1:.0f}, y {e.y0:.0f}..{e.y1:.0f} outside "
           f"{box.width:.0f} x {box.height:.0f} px" for s, e in texts
           if e.x0 < box.x0 - 0.5 or e.y0 < box.y0 - 0.5 or e.x1 > box.x1 + 0.5
           or e.y1 > box.y1 + 0.5]
    for (s, a), (t, b) in itertools.combinations(texts, 2):
        if _overlap(a, b):
            bad.append(f"{s!r} overlaps {t!r}")
    return bad


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_every_figure_of_n_runs_has_no_overlapping_or_clipped_text(runs, n):
    plots = build_plots(runs[:n])
    assert {"hit_rate_vs_host_capacity", "ttft_cdf"} <= {p.stem for p in plots}
    problems = {p.stem: layout_problems(p.figure) for p in plots}
    assert not any(problems.values()), "\n".join(
        f"{k}: {p}" for k, v in problems.items() for p in v[:8])


def test_the_checker_sees_an_overlap_and_a_clipped_legend():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3))
    ax = fig.subplots()
    ax.set_title("a title")
    ax.text(0.5, 0.5, "one", transform=ax.transAxes)
    ax.text(0.5, 0.5, "two", transform=ax.transAxes)
    fig.legend(ax.plot([0, 1])[:1], ["x" * 120], loc="lower center")
    problems = layout_problems(fig)
    assert any("overlaps" in p for p in problems)
    assert any("cut off" in p for p in problems)


def test_the_reports_verdict_cells_show_no_raw_floats():
    """A divergence point's times read as durations, never as 15-digit floats."""
    from reports.html import digest_verdict

    div = {"verdict": "detected", "detection_delay_s": 1.4166666666666667,
           "first_true_divergence": {"t": 13.691234567891234, "step": 17,
                                     "share": 0.333333333333333314}}
    _, text = digest_verdict(div)
    assert not re.search(r"\d{6,}", text), text
    assert "t=13.7 s" in text and "share=0.3333" in text and "1.42 s later" in text


SWEEP = """\
name: layout
bases: [quickstart.yaml, capacity_wb_vs_wt.yaml]
zip:
  cache.write_policy: [write_through, write_back, write_back, write_back]
  cache.host_policy: [lru, lru, duplicate_first, duplicate_first_single_pass]
grid:
  host.ratio: [1.0, 2.0]
  workload.num_requests: [20]
seeds: [1]
"""


def test_a_sweeps_eight_capacity_panels_have_no_overlapping_or_clipped_text(tmp_path, capsys):
    """The capacity sweep's shape (four policy pairs x two workloads): eight panels
    whose titles are two lines each, the longest policy name among them."""
    import cli
    from reports.load import load_many

    (tmp_path / "layout.yaml").write_text(SWEEP)
    assert cli.main(["sweep", str(tmp_path / "layout.yaml"), "-o", str(tmp_path / "s"),
                     "--workers", "1", "--quiet"]) == 0
    capsys.readouterr()
    (plot,) = [p for p in build_plots(load_many([tmp_path / "s"]))
               if p.stem.startswith("hit_rate_vs_host_capacity")]
    assert len([ax for ax in plot.figure.axes if ax.get_visible()]) == 8
    assert layout_problems(plot.figure) == []
