"""The `plan` figure and log: an axis fitted to the curves, the answer marked, no knee
called at the range's end, progress with one total and an ETA, and an unreachable
target said to be beyond even the offline optimum."""

import numpy as np
import pytest

from reports.plan import draw_plan
from sim.analysis.plan import knee, make_plan, still_rising
from sim.commands.plan import Progress, print_plan
from sim.scenario import load_scenario
from test_plan import SMALL
from test_plan_hybrid import small  # noqa: F401  (the fixture)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    p = tmp_path_factory.mktemp("plan") / "small.yaml"
    p.write_text(SMALL)
    return load_scenario(p)


def _plan(scenario, target):
    return make_plan(scenario, check_points=2, grid_points=12, opt_points=3,
                     target_hit_rate=target)


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_a_curve_still_climbing_at_the_end_has_no_knee():
    x = np.linspace(0, 10, 51)
    assert knee(x, 0.05 * x) is None and still_rising(x, 0.05 * x)
    # saturating: a knee inside the range, and not "still rising"
    y = 1 - np.exp(-x)
    assert knee(x, y) is not None and not still_rising(x, y)


def test_the_hit_axis_is_fitted_to_the_curves_and_the_answer_is_marked(scenario):
    plan = _plan(scenario, None)
    curves = np.concatenate([c for c in plan.planning.values()])
    lo, hi = float(curves.min()), float(curves.max())
    target = round((lo + hi) / 2, 3)
    plan = _plan(scenario, target)
    top = draw_plan(plan).axes[0]
    y0, y1 = top.get_ylim()
    assert (y0, y1) != (0.0, 1.0)
    assert y0 <= lo and y1 >= hi and y1 - y0 < 1.0
    assert (y1 - y0) <= max(hi - lo, 0.0) * 1.2 + 0.05  # fitted, not the 0-100% axis
    own = next(r for r in plan.doc["policies"]
               if (r["write_policy"], r["host_policy"]) == ("write_back", "duplicate_first"))
    gb = own["target_hit_rate_gb_per_rank"]
    assert gb is not None
    stars = [ln for ln in top.get_lines() if ln.get_marker() == "*"]
    assert len(stars) == 1 and stars[0].get_xdata()[0] == pytest.approx(gb)
    assert stars[0].get_ydata()[0] == pytest.approx(target)
    assert any(t.startswith(f"answer: {gb:,.2f} GB per rank") for t in _texts(top.figure))


def test_an_unreachable_target_says_even_the_optimum_is_below_it(scenario, capsys):
    plan = _plan(scenario, 0.99)
    best = plan.doc["optimum_max_hit_rate"]
    assert best is not None and best < 0.99
    print_plan(plan)
    answer = next(line for line in capsys.readouterr().out.splitlines()
                  if line.startswith("answer:"))
    assert "even the offline optimum" in answer and f"only {best:.1%}" in answer
    fig = draw_plan(plan)
    assert any("even the offline optimum reaches only" in t for t in _texts(fig))
    assert not [ln for ln in fig.axes[0].get_lines() if ln.get_marker() == "*"]


def test_a_knee_beyond_the_range_is_not_drawn_or_printed_as_one(scenario, capsys):
    plan = _plan(scenario, None)
    row = plan.doc["policies"][0]
    row["knee_beyond_range"], row["knee_gb_per_rank"], row["knee_hit_rate"] = True, None, None
    print_plan(plan)
    line = next(x for x in capsys.readouterr().out.splitlines()
                if x.strip().startswith(f"{row['write_policy']} + {row['host_policy']}"))
    assert "beyond range" in line


def test_progress_lines_have_an_eta_and_one_total():
    now = iter([0.0, 10.0, 20.0, 40.0])
    lines = []

    class Out:
        def write(self, s):
            lines.append(s)

        def flush(self):
            pass

    p = Progress("engine run", False, clock=lambda: next(now), file=Out())
    p(1, 4)
    p(2, 4)
    p(4, 4)
    text = "".join(lines).splitlines()
    assert text == ["engine run 1/4, 10 s elapsed, ETA 30 s",
                    "engine run 2/4, 20 s elapsed, ETA 20 s",
                    "engine run 4/4, 40 s elapsed, ETA 0 s"]


def test_the_hybrid_plans_total_is_known_before_its_first_run(small):  # noqa: F811
    from sim.analysis.plan_hybrid import make_hybrid_plan

    calls = []
    plan = make_hybrid_plan(load_scenario(small), kv_points=1, slot_points=5,
                            progress=lambda done, total: calls.append((done, total)))
    totals = {t for _, t in calls}
    assert len(totals) == 1, calls  # never grows mid-run
    (total,) = totals
    dones = [d for d, _ in calls]
    assert dones == sorted(dones) and dones[-1] == total
    # the bisection ran (this plan brackets its threshold between grid counts)
    assert any(p.probe == "bisect" for p in plan.points)
