"""The run command's progress bar and summary lines, without running a simulation."""

import io
import types

from sim.commands.run import _Bar, rejected_line


def _metrics(done, rejected, hit=0.5):
    return types.SimpleNamespace(done=done, rejected=rejected, hit_rate=hit)


def test_the_bar_counts_rejected_requests_and_reaches_its_total():
    out = io.StringIO()
    bar = _Bar(12_031, None, file=out)
    assert bar.bar.total == 12_031
    for done in range(0, 12_024, 7):  # progress ticks only when a request finishes
        bar.update(float(done), _metrics(done, min(7, done // 1000)))
    bar.close(_metrics(12_024, 7), complete=True)
    assert bar.bar.n == bar.bar.total == 12_031
    assert "12031/12031" in out.getvalue()


def test_a_run_that_ends_short_of_the_estimate_still_ends_at_its_count():
    bar = _Bar(1000, None, file=io.StringIO())
    bar.update(1.0, _metrics(900, 0))
    bar.close(_metrics(950, 3), complete=True)  # e.g. arrivals past limits.duration_s
    assert bar.bar.n == bar.bar.total == 953


def test_an_interrupted_run_keeps_its_total():
    bar = _Bar(1000, None, file=io.StringIO())
    bar.close(_metrics(400, 0), complete=False)
    assert (bar.bar.n, bar.bar.total) == (400, 1000)


def test_without_a_request_count_the_bar_follows_simulated_time():
    out = io.StringIO()
    bar = _Bar(None, 600.0, file=out)
    assert bar.by_time and bar.bar.total == 600.0
    bar.update(120.0, _metrics(10, 0))
    assert bar.bar.n == 120.0
    bar.close(_metrics(50, 0), complete=True)
    assert bar.bar.n == 600.0


def test_rejected_requests_say_why():
    s = {"rejected_requests": 7, "device_tokens": 16_384}
    assert rejected_line(s) == ("7 requests rejected: input+output plus a page does not fit "
                                "the device pool (16,384 tokens)")
    assert rejected_line({"rejected_requests": 1, "device_tokens": 64}, 48).startswith(
        "1 request rejected") and "(48 tokens)" in rejected_line(s, 48)


def test_expected_requests_come_from_the_workload_the_trace_or_the_limit():
    from conftest import ROOT
    from sim.scenario import load_scenario
    from sim.workloads.count import expected_requests

    moon = ROOT / "scenarios" / "mooncake_conversation.yaml"
    assert expected_requests(load_scenario(moon)) == 12_031  # the trace's lines
    assert expected_requests(load_scenario(moon, ["limits.max_requests=500"])) == 500
    quick = load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    assert expected_requests(quick) == quick.workload.num_requests
    agentic = load_scenario(ROOT / "scenarios" / "agentic_claude_code.yaml")
    assert expected_requests(agentic) is None  # a folder of JSON: not cheap to count
