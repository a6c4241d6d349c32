"""`hicache-sim sweep`: expansion and ids, one-line errors, a local sweep, gathering,
failures and resume of finished points (the kill test is in test_sweep_resume.py,
Ray in test_sweep_ray.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import cli
from sim.errors import UserError
from sim.sweep import load_sweep, point_id, point_status

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"


@pytest.fixture
def base(tmp_path) -> Path:
    """A copy of quickstart.yaml beside the sweep files (it names no relative paths)."""
    p = tmp_path / "base.yaml"
    shutil.copy(QUICKSTART, p)
    return p


def write(tmp_path: Path, text: str, name: str = "sw.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ------------------------------------------------------------------ expansion and ids


def test_grid_zip_seeds_expand_in_a_fixed_order(tmp_path, base):
    sw = write(tmp_path, """
base: base.yaml
set: {workload.num_requests: 20}
grid:
  host.ratio: [1.0, 2.0]
  cache.eviction_policy: [lru, lfu]
zip:
  cache.write_policy: [write_through, write_back, write_back]
  cache.host_policy: [lru, lru, duplicate_first]
seeds: {count: 2, start: 5}
""")
    plan = load_sweep(sw)
    assert len(plan.points) == 2 * 2 * 3 * 2
    assert plan.param_columns == ["workload.num_requests", "host.ratio", "cache.eviction_policy",
                                  "cache.write_policy", "cache.host_policy"]
    got = [(p.params["host.ratio"], p.params["cache.eviction_policy"], p.params["cache.write_policy"],
            p.params["cache.host_policy"], p.seed) for p in plan.points[:8]]
    assert got == [
        (1.0, "lru", "write_through", "lru", 5), (1.0, "lru", "write_through", "lru", 6),
        (1.0, "lru", "write_back", "lru", 5), (1.0, "lru", "write_back", "lru", 6),
        (1.0, "lru", "write_back", "duplicate_first", 5), (1.0, "lru", "write_back", "duplicate_first", 6),
        (1.0, "lfu", "write_through", "lru", 5), (1.0, "lfu", "write_through", "lru", 6),
    ]
    assert [p.index for p in plan.points] == list(range(24))
    ids = [p.point_id for p in plan.points]
    assert len(set(ids)) == len(ids) and all(len(i) == 12 for i in ids)
    assert ids == [p.point_id for p in load_sweep(sw).points]  # deterministic
    assert all(p.results_dir == f"points/{p.point_id}" for p in plan.points)
    # Every point's overrides reach its scenario, seed last.
    p = plan.points[5]
    assert p.override_args()[-1] == "seed=6"
    assert "cache.host_policy=duplicate_first" in p.override_args()


def test_ids_depend_on_the_point_only(tmp_path, base):
    """Adding values or renaming the sweep keeps the ids of existing points (resume
    across edits); changing a value or the seed changes it."""
    a = load_sweep(write(tmp_path, "base: base.yaml\ngrid: {host.ratio: [1.0, 2.0]}\nseeds: [3]\n", "a.yaml"))
    b = load_sweep(write(tmp_path, "name: other\nbase: base.yaml\ngrid: {host.ratio: [0.5, 1.0, 2.0, 4.0]}\n"
                                   "seeds: [3, 4]\n", "b.yaml"))
    ids_a = {p.point_id for p in a.points}
    ids_b = {p.point_id for p in b.points}
    assert ids_a < ids_b and len(ids_b) == 8
    assert point_id("base.yaml", [("host.ratio", 1.0)], 3) in ids_a
    assert point_id("base.yaml", [("host.ratio", 1.0)], 4) not in ids_a
    assert point_id("base.yaml", [("host.ratio", 1)], 3) not in ids_a  # values as written


def test_bases_are_a_dimension_and_default_seeds_are_each_bases_own(tmp_path, base):
    other = tmp_path / "other.yaml"
    other.write_text(base.read_text().replace("seed: 1", "seed: 9").replace("name: quickstart", "name: other"))
    plan = load_sweep(write(tmp_path, "bases: [base.yaml, other.yaml]\ngrid: {host.ratio: [1.0, 2.0]}\n"))
    assert [(p.params["base"], p.params["host.ratio"], p.seed) for p in plan.points] == [
        ("base.yaml", 1.0, 1), ("base.yaml", 2.0, 1), ("other.yaml", 1.0, 9), ("other.yaml", 2.0, 9)]
    assert plan.param_columns[0] == "base"


# ------------------------------------------------------------------ one-line errors

BAD = [
    ("base: base.yaml\ngrdi: {host.ratio: [1]}\n", "sw.yaml:2: grdi: found unknown key 'grdi'"),
    ("base: base.yaml\ngrid:\n  cache.wrte_policy: [lru]\n",
     "sw.yaml:3: grid.cache.wrte_policy: found unknown key 'wrte_policy' under cache"),
    ("base: base.yaml\nset:\n  workload.num_documents: 3\n",
     "sw.yaml:3: set.workload.num_documents: found unknown key 'num_documents'"),
    ("base: base.yaml\ngrid:\n  cache.write_policy:\n    - write_back\n    - nope\n",
     "sw.yaml:5: grid.cache.write_policy: found 'nope'; expected one of"),
    ("base: base.yaml\nzip:\n  host.ratio: [1.0, -2]\n  cache.host_policy: [lru, lru]\n",
     "sw.yaml:3: zip.host.ratio: found -2"),
    ("base: base.yaml\nzip:\n  host.ratio: [1.0, 2.0]\n  cache.host_policy: [lru]\n",
     "sw.yaml:4: zip.cache.host_policy: found 1 values for 'cache.host_policy' but 2 for 'host.ratio'"),
    ("base: base.yaml\nbases: [base.yaml]\n", "sw.yaml:1: base: found both base and bases"),
    ("grid: {host.ratio: [1]}\n", "sw.yaml: base: found neither base nor bases"),
    ("base: nope.yaml\n", "sw.yaml:1: base: found 'nope.yaml' (not found"),
    ("bases:\n  - base.yaml\n  - nope.yaml\n", "sw.yaml:3: bases.1: found 'nope.yaml'"),
    ("base: base.yaml\nseeds: [1, x]\n", "sw.yaml:2: seeds.1: found 'x'; expected a seed"),
    ("base: base.yaml\nseeds: {count: 0}\n", "sw.yaml:2: seeds.count: found 0"),
    ("base: base.yaml\nseeds: {cnt: 3}\n", "sw.yaml:2: seeds.cnt: found unknown key 'cnt'"),
    ("base: base.yaml\nseeds: [2, 2]\n", "sw.yaml:2: seeds.1: found seed 2 twice"),
    ("base: base.yaml\ngrid: {seed: [1, 2]}\n", "grid.seed: found key 'seed'; expected seeds"),
    ("base: base.yaml\ngrid: {host.ratio: [1]}\nzip: {host.ratio: [2]}\n",
     "sw.yaml:3: zip.host.ratio: found 'host.ratio' in both grid and zip"),
    ("base: base.yaml\ngrid: {host.ratio: []}\n", "grid.host.ratio: found []; expected a non-empty list"),
    ("base: base.yaml\ngrid: {host.ratio: 2}\n", "grid.host.ratio: found 2; expected a non-empty list"),
    ("base: base.yaml\ngrid: {host.ratio: [1\n", "sw.yaml:3: found invalid YAML"),
    ("- a\n", "sw.yaml: found a YAML list; expected a mapping of sweep keys"),
    ("", "sw.yaml: found an empty file"),
    ("base: base.yaml\ngrid: {host.ratio: [1.0, 1.0]}\n", "found the point host.ratio=1.0 seed=1 twice"),
    ("base: base.yaml\nset: {name: 2024-01-01}\n", "sw.yaml:2: set.name: found a date"),
    ("name: a/b\nbase: base.yaml\n", "sw.yaml:1: name: found 'a/b'"),
    ("base: base.yaml\nset: {'cache..x': 1}\n", "sw.yaml:2: set.cache..x: found key 'cache..x'"),
    ("bases: [base.yaml, base.yaml]\n", "sw.yaml:1: bases: found 'base.yaml' twice"),
]


@pytest.mark.parametrize("text,message", BAD, ids=[m.split(": ", 1)[-1][:40] for _, m in BAD])
def test_bad_sweep_files_are_one_line_errors(tmp_path, base, capsys, text, message):
    sw = write(tmp_path, text)
    out = tmp_path / "out"
    assert cli.main(["sweep", str(sw), "-o", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("hicache-sim sweep: error: ")
    assert message in err, err
    assert not (out / "points").exists()  # nothing ran


def test_a_bad_key_fails_before_any_point_runs(tmp_path, base):
    """The bad key is in the last grid value's point only; no point may run first."""
    sw = write(tmp_path, "base: base.yaml\ngrid:\n  workload.kind: [multi_turn_chat, few_shot]\n"
                         "  workload.think_time_s: [1]\n")
    with pytest.raises(UserError, match=r"sw.yaml:4: grid.workload.think_time_s: found unknown key "
                                        r"'think_time_s' under workload"):
        load_sweep(sw)
    assert cli.main(["sweep", str(sw), "-o", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


def test_a_broken_base_scenario_names_its_own_file_and_line(tmp_path, base):
    base.write_text(base.read_text().replace("tp: 2", "tp: 2\ntpp: 3"))
    sw = write(tmp_path, "base: base.yaml\ngrid: {host.ratio: [1.0]}\n")
    line = base.read_text().splitlines().index("tpp: 3") + 1
    with pytest.raises(UserError, match=rf"base.yaml:{line}: tpp: found unknown key 'tpp'"):
        load_sweep(sw)


def test_bad_flags(tmp_path, base, capsys):
    sw = write(tmp_path, "base: base.yaml\n")
    assert cli.main(["sweep", str(sw), "--workers", "0"]) == 2
    assert "--workers: found 0" in capsys.readouterr().err
    assert cli.main(["sweep", str(sw), "--address", "localhost:6379"]) == 2
    assert "--address: found an address with --executor local" in capsys.readouterr().err
    assert cli.main(["sweep", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: no such file; expected a sweep YAML" in capsys.readouterr().err


# ------------------------------------------------------------------ a local sweep

TINY = """
name: tiny
base: base.yaml
set: {workload.num_requests: 30}
grid:
  cache.write_policy: [write_through, write_back]
  host.ratio: [1.0, 2.0]
seeds: [1]
"""


def _meta_stamps(out: Path) -> dict:
    return {m.parent.name: (m.stat().st_ino, m.stat().st_mtime_ns)
            for m in sorted((out / "points").glob("*/meta.json"))}


def test_local_sweep_writes_results_and_a_table(tmp_path, base, capsys):
    sw = write(tmp_path, TINY)
    out = tmp_path / "out"
    assert cli.main(["sweep", str(sw), "-o", str(out), "--workers", "2", "--quiet"]) == 0
    stdout = capsys.readouterr().out
    assert "4 point(s): 4 ran, 0 already complete, 0 failed" in stdout
    # one row per point: the keys that vary, seed, hit rate, TTFT, verdict
    head = next(ln for ln in stdout.splitlines() if ln.startswith("cache.write_policy"))
    assert head.split() == ["cache.write_policy", "host.ratio", "seed", "hit", "rate", "TTFT",
                            "p50", "TTFT", "p99", "verdict"]
    assert sum(1 for ln in stdout.splitlines() if ln.startswith("write_")) == 4

    table = pd.read_parquet(out / "sweep.parquet")
    plan = load_sweep(sw)
    assert len(table) == 4
    assert list(table["point_id"]) == [p.point_id for p in plan.points]
    assert list(table["cache.write_policy"]) == ["write_through"] * 2 + ["write_back"] * 2
    assert list(table["host.ratio"]) == [1.0, 2.0, 1.0, 2.0]
    assert set(table["workload.num_requests"]) == {30} and set(table["workload.kind"]) == {"multi_turn_chat"}
    assert list(table["seed"]) == [1, 1, 1, 1]
    assert table.attrs["parameter_columns"] == ["workload.num_requests", "cache.write_policy",
                                                "host.ratio", "workload.kind"]
    for _, row in table.iterrows():
        folder = out / row["results_dir"]
        assert row["results_dir"] == f"points/{row['point_id']}"
        summary = json.loads((folder / "summary.json").read_text())
        assert set(summary) <= set(table.columns)  # every summary field, verdict included
        for k, v in summary.items():
            if isinstance(v, (list, dict)):  # nested fields are JSON text cells
                assert json.loads(row[k]) == v, k
                continue
            assert row[k] == (pytest.approx(v) if isinstance(v, float) else v), k
        assert json.loads((folder / "meta.json").read_text())["partial"] is False
        resolved = (folder / "scenario.yaml").read_text()
        # The point's overrides reached its run.
        assert f"seed: {row['seed']}" in resolved
        assert f"write_policy: {row['cache.write_policy']}" in resolved
        assert row["host_tokens"] == 16384 * row["host.ratio"] + 64  # quickstart: 16k device + 1 page
    assert json.loads((out / "failures.json").read_text()) == []
    # The reports read it.
    from reports.load import load_sweep as read_sweep
    assert len(read_sweep(out).table) == 4

    # Running it again skips every finished point: their meta.json are untouched.
    before = _meta_stamps(out)
    table_bytes = (out / "sweep.parquet").read_bytes()
    assert cli.main(["sweep", str(sw), "-o", str(out), "--quiet"]) == 0
    assert "0 ran, 4 already complete" in capsys.readouterr().out
    assert _meta_stamps(out) == before
    assert (out / "sweep.parquet").read_bytes() == table_bytes

    # --gather-only rebuilds the same table from the folders.
    (out / "sweep.parquet").unlink()
    assert cli.main(["sweep", str(sw), "-o", str(out), "--gather-only"]) == 0
    assert (out / "sweep.parquet").read_bytes() == table_bytes
    assert capsys.readouterr().out.endswith("sweep.parquet: 4 row(s)\n")

    # --dry-run lists the points with their state and runs nothing.
    shutil.rmtree(out / plan.points[2].results_dir)
    assert cli.main(["sweep", str(sw), "-o", str(out), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[2] for ln in lines[1:5]] == ["done", "done", "todo", "done"]
    assert lines[-1] == "3 complete, 1 to run"
    assert not (out / plan.points[2].results_dir).exists()

    # A gather with a point missing has one row fewer.
    assert cli.main(["sweep", str(sw), "-o", str(out), "--gather-only"]) == 0
    assert "3 row(s); 1 of 4 point(s) have no complete results" in capsys.readouterr().out
    assert len(pd.read_parquet(out / "sweep.parquet")) == 3


def test_an_edited_base_reruns_its_points(tmp_path, base, capsys):
    """Ids hash the base's name, not its content: a point run from an older base is
    'stale' and runs again instead of being reused."""
    sw = write(tmp_path, "base: base.yaml\nset: {workload.num_requests: 20}\ngrid: {host.ratio: [1.0, 2.0]}\n")
    out = tmp_path / "out"
    assert cli.main(["sweep", str(sw), "-o", str(out), "--workers", "1", "--quiet"]) == 0
    plan = load_sweep(sw)
    assert [point_status(p, out) for p in plan.points] == ["done", "done"]
    before = _meta_stamps(out)
    base.write_text(base.read_text().replace("max_context_tokens: 16384", "max_context_tokens: 8192"))
    plan = load_sweep(sw)
    assert [point_status(p, out) for p in plan.points] == ["stale", "stale"]
    capsys.readouterr()
    assert cli.main(["sweep", str(sw), "-o", str(out), "--workers", "1", "--quiet"]) == 0
    assert "2 ran, 0 already complete" in capsys.readouterr().out
    after = _meta_stamps(out)
    assert after.keys() == before.keys() and all(after[k] != before[k] for k in after)
    assert all("max_context_tokens: 8192" in (out / p.results_dir / "scenario.yaml").read_text()
               for p in plan.points)


def test_a_failing_point_is_recorded_and_the_others_finish(tmp_path, base, capsys):
    """A trace with a bad record passes validation (the path exists) and fails while
    running: that point is a failure, the other base's point still has results."""
    (tmp_path / "trace.jsonl").write_text(
        '{"arrival_s": 0.0, "input_len": 128, "output_len": 4, "block_size": 64, "blocks": [1, 2]}\n'
        '{"arrival_s": 0.1, "input_len": "many", "output_len": 4, "block_size": 64, "blocks": [1, 3]}\n')
    (tmp_path / "bad.yaml").write_text(
        "name: bad\nmodel: {preset: llama-3.1-8b}\ntp: 1\npage_size: 64\ndevice: {tokens: 4096}\n"
        "workload: {kind: trace, format: generic, path: trace.jsonl}\n")
    sw = write(tmp_path, "bases: [bad.yaml, base.yaml]\nset: {workload.rate_scale: 2.0}\n")
    out = tmp_path / "out"
    assert cli.main(["sweep", str(sw), "-o", str(out), "--workers", "2", "--quiet"]) == 1
    captured = capsys.readouterr()
    assert "1 ran, 0 already complete, 1 failed" in captured.out
    plan = load_sweep(sw)
    bad, good = plan.points
    assert f"point {bad.point_id} failed: " in captured.err and "Traceback" not in captured.err
    failures = json.loads((out / "failures.json").read_text())
    assert [f["point_id"] for f in failures] == [bad.point_id]
    assert failures[0]["params"] == {"base": "bad.yaml", "workload.rate_scale": 2.0}
    assert failures[0]["error"] and "\n" not in failures[0]["error"]
    assert "run_scenario" in failures[0]["traceback"]
    assert point_status(bad, out) == "todo" and point_status(good, out) == "done"
    table = pd.read_parquet(out / "sweep.parquet")
    assert list(table["point_id"]) == [good.point_id]
    # A rerun retries only the failed point.
    assert cli.main(["sweep", str(sw), "-o", str(out), "--workers", "1", "--quiet"]) == 1
    assert "0 ran, 1 already complete, 1 failed" in capsys.readouterr().out


def test_mapping_and_null_values_become_columns(tmp_path, base, capsys):
    """Values that are mappings (or of mixed kinds) are stored as their one-line YAML;
    null stays missing."""
    sw = write(tmp_path, """
base: base.yaml
set: {workload.num_requests: 20}
zip:
  workload.arrival:
    - {process: poisson, rate: 2.0}
    - {process: bursty, rate: 2.0, cv: 3.0}
  scheduler.max_running_requests: [null, 16]
""")
    out = tmp_path / "out"
    assert cli.main(["sweep", str(sw), "-o", str(out), "--workers", "1", "--quiet"]) == 0
    table = pd.read_parquet(out / "sweep.parquet")
    assert list(table["workload.arrival"]) == ["{process: poisson, rate: 2.0}",
                                               "{process: bursty, rate: 2.0, cv: 3.0}"]
    assert pd.isna(table["scheduler.max_running_requests"][0])
    assert table["scheduler.max_running_requests"][1] == 16
    resolved = (out / table["results_dir"][1] / "scenario.yaml").read_text()
    assert "process: bursty" in resolved and "max_running_requests: 16" in resolved
