"""The HTML report: one self-contained file, the comparison tables, determinism."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser

import pytest

from reports.html import digest_verdict, render_report, scenario_differences, write_report
from reports.load import load_many, load_run
from sim.fmt import duration
from test_reports_fixture import build_run, build_sweep

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class _Collect(HTMLParser):
    """Every start tag with its attributes, and the text."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("html")
    a = build_run(root / "wt-lru", ratio=2.0)
    b = build_run(root / "wb-df", write_policy="write_back", host_policy="duplicate_first", ratio=2.0,
                  diverged=True)
    c = build_run(root / "wt-lru-cut", ratio=4.0, partial=True,
                  scenario_overrides={"workload.trace": "traces/a.jsonl"})
    sweep = build_sweep(root / "sweep", ratios=(1.0, 2.0), seeds=(0, 1),
                        host_policies=("lru",), requests=60)
    return [a, b, c], sweep


@pytest.fixture(scope="module")
def report(folders, tmp_path_factory):
    runs, sweep = folders
    path = tmp_path_factory.mktemp("rep") / "report.html"
    assert write_report(load_many([*runs, sweep]), path) == path
    return path


def _section(html: str, heading: str) -> str:
    start = html.index(f"<h2>{heading}</h2>")
    end = html.find("<h2>", start + 1)
    return html[start:end if end >= 0 else None]


def test_report_is_one_self_contained_file(report):
    assert [p.name for p in report.parent.iterdir()] == ["report.html"]  # no temp left
    html = report.read_text()
    parser = _Collect()
    parser.feed(html)
    tags = [t for t, _ in parser.tags]
    assert "script" not in tags and "link" not in tags and "iframe" not in tags
    assert "url(" not in html and "http://" not in html and "https://" not in html
    imgs = [attrs for tag, attrs in parser.tags if tag == "img"]
    # Five run plots plus the sweep's capacity plot, all embedded.
    assert len(imgs) == 6
    for attrs in imgs:
        assert attrs["alt"]
        src = attrs["src"]
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_SIGNATURE)


def test_summary_table_has_one_row_per_run(report):
    runs = _section(report.read_text(), "Runs")
    assert runs.count("<tr>") == 1 + 3  # header + one row per run
    for text in ("wt-lru", "wb-df", "write_back", "duplicate_first", "96,000", "192,000",
                 "(partial)", "TTFT p99", "ranks agree"):
        assert text in runs, text
    assert ("diverged at t=3.25 s, step=17, ranks=[[0], [1]], what=tree contents differ; "
            "caught by the digest check 1.25 s later") in runs


def test_hit_rates_in_table_come_from_summary(folders, report):
    runs, _ = folders
    row = _section(report.read_text(), "Runs").split("<tr>")[2]  # first run
    s = load_run(runs[0]).summary
    assert f"{100 * s['hit_rate']:.1f}%" in row
    assert f"{100 * s['host_hit_rate']:.1f}%" in row
    assert duration(s["ttft_p50_s"]) in row  # every delay through the one formatter


def test_differences_show_only_keys_that_differ(report):
    diff = _section(report.read_text(), "How the scenarios differ")
    keys = re.findall(r"<code>([^<]+)</code>", diff)
    assert keys == ["name", "host.ratio", "cache.write_policy", "cache.host_policy",
                    "workload.trace"]
    assert "absent" in diff and "traces/a.jsonl" in diff
    assert "page_size" not in diff and "model.preset" not in diff


def test_sweep_and_notes_sections(report):
    html = report.read_text()
    sweep = _section(html, "Sweeps")
    assert sweep.count("<tr>") == 1 + 4  # two write policies x two ratios
    assert "<code>workload.kind</code>=multi_turn_chat" in sweep
    notes = _section(html, "Notes")
    assert "wt-lru-cut is partial" in notes


def test_report_is_deterministic(folders, report, tmp_path):
    runs, sweep = folders
    again = write_report(load_many([*runs, sweep]), tmp_path / "again.html")
    assert again.read_bytes() == report.read_bytes()


def test_scenario_differences_marks_absent_keys(folders):
    runs, _ = folders
    loaded = [load_run(d) for d in runs]
    same, differing = scenario_differences(loaded)
    assert "page_size" in same and "cache.eviction_policy" in same
    assert differing["cache.write_policy"] == ["write_through", "write_back", "write_through"]
    absent = differing["workload.trace"]
    assert absent[2] == "traces/a.jsonl" and absent[0] is absent[1] and absent[0] != "null"


def test_single_run_has_nothing_to_compare(folders):
    runs, _ = folders
    html = render_report([load_run(runs[0])])
    assert "Only one run: nothing to compare." in html
    assert "<h2>Sweeps</h2>" not in html


@pytest.mark.parametrize("divergence, cls, text", [
    ({}, "absent", "not recorded"),
    ({"verdict": "agree", "halted": None}, "ok", "ranks agree"),
    ({"verdict": "absorbed", "forks": [{"t": 1}, {"t": 2}]}, "ok",
     "ranks forked (2 fork(s)) but their trees agree"),
    ({"verdict": "missed", "first_true_divergence": {"t": 2.5, "what": "x"}}, "bad",
     "diverged at t=2.5 s, what=x; NOT caught by the digest check"),
    ({"verdict": "false_alarm", "digest_mismatch": {"t": 7.0}}, "warn",
     "digest mismatch at t=7 s without a true divergence"),
    ({"verdict": "hang", "batch_mismatch": {"t": 1.0, "where": "admit"}}, "bad",
     "ranks scheduled different batches (t=1 s, where=admit): a hang on real hardware"),
    ({"verdict": "skipped_collective", "halted": "skipped_collective",
      "collective_error": {"t": 0.5, "kind": "skipped_collective", "message": "rank 1"}},
     "bad", "skipped_collective at t=500 ms: rank 1; run halted (skipped_collective)"),
    # The short form: diverged / first_divergence / detected_by_digest.
    ({"diverged": False, "first_divergence": None}, "ok", "ranks agree"),
    ({"diverged": True, "first_divergence": 12, "detected_by_digest": False}, "bad",
     "diverged at 12; NOT caught by the digest check"),
])
def test_digest_verdicts(divergence, cls, text):
    assert digest_verdict(divergence) == (cls, text)
