"""``hicache-sim plot`` and ``hicache-sim report`` through ``cli.main``."""

from __future__ import annotations

import pytest

import cli
from test_reports_fixture import build_run, build_sweep


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    a = build_run(root / "a", ratio=1.0, requests=80)
    b = build_run(root / "b", write_policy="write_back", ratio=2.0, requests=80)
    sweep = build_sweep(root / "sweep", ratios=(1.0, 2.0), seeds=(0,),
                        host_policies=("lru",), write_policies=("write_back",), requests=40)
    return root, a, b, sweep


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_plot_one_run_defaults_to_its_plots_folder(folders, capsys):
    _, a, _, _ = folders
    assert cli.main(["plot", str(a), "--format", "png"]) == 0
    out = capsys.readouterr().out.split()
    assert out == [str(a / "plots" / f"{stem}.png") for stem in (
        "hit_rate_vs_host_capacity", "effective_capacity", "tier_occupancy", "ttft_cdf",
        "transfer_traffic")]
    assert all((a / "plots" / name).stat().st_size > 1000
               for name in ("ttft_cdf.png", "tier_occupancy.png"))


def test_plot_several_with_out_dir(folders, tmp_path, capsys):
    _, a, b, sweep = folders
    assert cli.main(["plot", str(a), str(b), str(sweep), "-o", str(tmp_path / "p")]) == 0
    names = sorted(p.name for p in (tmp_path / "p").iterdir())
    assert "hit_rate_vs_host_capacity_sweep.svg" in names and "ttft_cdf.svg" in names
    assert len(names) == 12


def test_plot_sweep_alone_notes_skipped_plots(folders, tmp_path, capsys):
    *_, sweep = folders
    assert cli.main(["plot", str(sweep), "-o", str(tmp_path), "--format", "svg"]) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == [str(tmp_path / "hit_rate_vs_host_capacity_sweep.svg")]
    assert captured.err.count("note: skipped") == 4


def test_plot_several_without_out_dir_is_exit_2(folders, capsys):
    _, a, b, _ = folders
    assert cli.main(["plot", str(a), str(b)]) == 2
    assert _error_line(capsys) == ("hicache-sim plot: error: -o: 2 folders given; expected "
                                   "-o DIR saying where their plots go")


@pytest.mark.parametrize("command", ["plot", "report"])
def test_missing_folder_is_exit_2_with_one_line(folders, tmp_path, capsys, command):
    _, a, _, _ = folders
    missing = tmp_path / "no-such-run"
    argv = [command, str(a), str(missing), "-o", str(tmp_path / "out.html")]
    assert cli.main(argv) == 2
    line = _error_line(capsys)
    assert line == f"hicache-sim {command}: error: {missing}: no such folder; expected a " \
                   "results folder"
    assert not (tmp_path / "out.html").exists()


@pytest.mark.parametrize("command", ["plot", "report"])
def test_not_a_results_folder_is_exit_2(tmp_path, capsys, command):
    (tmp_path / "empty").mkdir()
    assert cli.main([command, str(tmp_path / "empty"), "-o", str(tmp_path / "o")]) == 2
    assert "not a results folder" in _error_line(capsys)


def test_incomplete_folder_is_exit_2(tmp_path, capsys):
    d = build_run(tmp_path / "r", requests=30)
    (d / "meta.json").unlink()
    assert cli.main(["report", str(d), "-o", str(tmp_path / "r.html")]) == 2
    assert "missing meta.json" in _error_line(capsys)


def test_bad_format_is_exit_2(folders, tmp_path, capsys):
    _, a, _, _ = folders
    assert cli.main(["plot", str(a), "-o", str(tmp_path), "--format", "png,jpeg"]) == 2
    assert _error_line(capsys) == ("hicache-sim plot: error: --format: found 'png,jpeg'; "
                                   "expected a comma-separated list of png, svg")


def test_report_writes_one_html_file(folders, tmp_path, capsys):
    _, a, b, sweep = folders
    out = tmp_path / "sub" / "report.html"
    assert cli.main(["report", str(a), str(b), str(sweep), "-o", str(out),
                     "--title", "policies"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    html = out.read_text()
    assert "<title>policies</title>" in html
    assert html.count("data:image/png;base64,") == 6
    assert "<code>cache.write_policy</code>" in html
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]


def test_report_requires_out(folders, capsys):
    _, a, _, _ = folders
    with pytest.raises(SystemExit) as exc:
        cli.main(["report", str(a)])
    assert exc.value.code == 2
    assert "-o/--out" in capsys.readouterr().err


def test_report_into_a_folder_is_exit_2(folders, tmp_path, capsys):
    _, a, _, _ = folders
    assert cli.main(["report", str(a), "-o", str(tmp_path)]) == 2
    assert "is a folder; expected the path of the HTML file" in _error_line(capsys)
