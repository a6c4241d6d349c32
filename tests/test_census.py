"""`hicache-sim census`: one scenario over many seeds, resumable and deterministic.

The scenario is the shipped host-capacity skew cut down to 40 requests on a small
device, so a seed runs in milliseconds and the seeds still disagree about the
verdict. Tests assert what the census promises (counts, resume, bytes, exit codes),
not which verdicts the engine currently produces.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import sim.census as census_mod
from cli import main
from sim.census import KNOWN_VERDICTS, census, plan_census, read_record
from sim.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
SKEW = str(ROOT / "scenarios" / "jitter_host_capacity_skew.yaml")
QUICK = str(ROOT / "scenarios" / "quickstart.yaml")
SMALL = ("limits.max_requests=40", "device.tokens=4096")
OUTPUTS = ("census.parquet", "census.json", "failures.json")


def _strict(path: Path):
    """Parse JSON refusing NaN / Infinity (the census promises strict JSON)."""
    def no_constants(name):
        raise AssertionError(f"{path}: non-standard JSON constant {name}")
    return json.loads(path.read_text(), parse_constant=no_constants)


def _counting(monkeypatch) -> list[int]:
    """Record every seed actually simulated (jobs=1 runs them in this process)."""
    calls: list[int] = []
    real = census_mod._simulate

    def counted(scenario, seed):
        calls.append(seed)
        return real(scenario, seed)

    monkeypatch.setattr(census_mod, "_simulate", counted)
    return calls


def test_counts_sum_to_the_seeds_and_the_aggregate_is_consistent(tmp_path):
    table = census(SKEW, 5, overrides=SMALL, out=tmp_path, jobs=1, plots=False)
    agg = _strict(tmp_path / "census.json")
    assert table["seed"].tolist() == [0, 1, 2, 3, 4]
    assert sum(r["seeds"] for r in agg["verdicts"]) == 5 == agg["all"]["seeds"] == agg["completed"]
    assert sum(r["share"] for r in agg["verdicts"]) == pytest.approx(1.0)
    # Per verdict, the counts are the table's, in the known order.
    assert {r["verdict"]: r["seeds"] for r in agg["verdicts"]} == table["verdict"].value_counts().to_dict()
    assert agg["verdict_order"] == [v for v in KNOWN_VERDICTS if v in set(table["verdict"])]
    # Delay percentiles cover exactly the seeds whose digest fired after a true divergence.
    counted = table[table["digest_after_true_divergence"]]
    assert agg["all"]["detection_delay_s"]["n"] == len(counted)
    if len(counted):
        assert agg["all"]["detection_delay_s"]["max"] == counted["detection_delay_s"].max()
        assert (counted["digest_mismatch_t_s"] >= counted["first_true_divergence_t_s"]).all()
    assert agg["all"]["first_true_divergence_t_s"]["n"] == table["first_true_divergence_t_s"].notna().sum()
    # Perturbation counts: a column per name the engine reports, none when it reports none.
    names = sorted(agg["perturbations"] or {})
    assert [c for c in table.columns if c.startswith("perturbation_")] == \
        [f"perturbation_{n}_count" for n in names]
    # Only records, no results folders.
    assert sorted(p.name for p in (tmp_path / "seeds").iterdir()) == [f"seed-{s}.json" for s in range(5)]
    assert not list(tmp_path.glob("**/meta.json"))


def test_rerun_and_pool_give_byte_identical_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    census(SKEW, 4, overrides=SMALL, out=a, jobs=1)
    first = {f: (a / f).read_bytes() for f in OUTPUTS + ("census.png", "census.svg")}
    seeds_a = {p.name: p.read_bytes() for p in (a / "seeds").iterdir()}
    # Again in the same folder (nothing to run: everything rebuilt from the records) ...
    again = census(SKEW, 4, overrides=SMALL, out=a, jobs=1)
    assert again.attrs["ran"] == [] and again.attrs["skipped"] == [0, 1, 2, 3]
    # ... and from scratch through sim.sweep's process pool.
    census(SKEW, 4, overrides=SMALL, out=b, jobs=2)
    for f, data in first.items():
        assert (a / f).read_bytes() == data, f
        assert (b / f).read_bytes() == data, f
    assert {p.name: p.read_bytes() for p in (b / "seeds").iterdir()} == seeds_a


def test_resume_runs_only_what_is_missing_or_stale(tmp_path, monkeypatch):
    census(SKEW, 4, overrides=SMALL, out=tmp_path, jobs=1, plots=False)
    seeds = tmp_path / "seeds"
    # A record that is present and current is used as it is, even when it says
    # something the engine never would (an unknown verdict): it is not re-run.
    fake = _strict(seeds / "seed-1.json") | {"verdict": "zz_unheard_of"}
    (seeds / "seed-1.json").write_text(json.dumps(fake))
    (seeds / "seed-2.json").unlink()  # never finished
    stale = _strict(seeds / "seed-3.json") | {"scenario_digest": "another scenario"}
    (seeds / "seed-3.json").write_text(json.dumps(stale))
    (seeds / ".seed-2.json.abc.tmp").write_text("{")  # a write killed half-way
    calls = _counting(monkeypatch)
    table = census(SKEW, 4, overrides=SMALL, out=tmp_path, jobs=1, plots=False)
    assert calls == [2, 3]
    assert table.attrs["skipped"] == [0, 1] and table.attrs["ran"] == [2, 3]
    assert table.set_index("seed").loc[1, "verdict"] == "zz_unheard_of"
    agg = table.attrs["aggregate"]
    assert agg["verdict_order"][-1] == "zz_unheard_of"  # unknown verdicts last, still counted
    assert sum(r["seeds"] for r in agg["verdicts"]) == 4
    assert not list(seeds.glob("*.tmp"))
    # A different scenario (another --set) makes every record stale.
    calls.clear()
    census(SKEW, 2, overrides=SMALL + ("host.ratio=2.0",), out=tmp_path, jobs=1, plots=False)
    assert calls == [0, 1]


def test_a_killed_census_resumes_where_it_stopped(tmp_path, monkeypatch):
    real = census_mod._simulate
    calls: list[int] = []

    def killed_at_seed_2(scenario, seed):
        if seed == 2:
            raise KeyboardInterrupt
        calls.append(seed)
        return real(scenario, seed)

    monkeypatch.setattr(census_mod, "_simulate", killed_at_seed_2)
    with pytest.raises(KeyboardInterrupt):
        census(SKEW, 4, overrides=SMALL, out=tmp_path, jobs=1, plots=False)
    assert sorted(p.name for p in (tmp_path / "seeds").iterdir()) == ["seed-0.json", "seed-1.json"]
    monkeypatch.undo()  # the engine back, now counted
    calls = _counting(monkeypatch)
    table = census(SKEW, 4, overrides=SMALL, out=tmp_path, jobs=1, plots=False)
    assert calls == [2, 3] and len(table) == 4


def test_a_seed_that_raises_is_a_failure_not_a_verdict(tmp_path, monkeypatch, capsys):
    real = census_mod._simulate

    def broken_seed_1(scenario, seed):
        if seed == 1:
            raise RuntimeError("engine bug")
        return real(scenario, seed)

    monkeypatch.setattr(census_mod, "_simulate", broken_seed_1)
    rc = main(["census", SKEW, "--seeds", "3", *[a for s in SMALL for a in ("--set", s)],
               "-o", str(tmp_path), "--jobs", "1", "--no-plots", "--quiet"])
    assert rc == 1
    assert "seed 1 failed: RuntimeError: engine bug" in capsys.readouterr().err
    agg = _strict(tmp_path / "census.json")
    assert agg["failed_seeds"] == [1] and agg["completed"] == 2
    assert [f["seed"] for f in _strict(tmp_path / "failures.json")] == [1]
    monkeypatch.undo()
    calls = _counting(monkeypatch)
    table = census(SKEW, 3, overrides=SMALL, out=tmp_path, jobs=1, plots=False)
    assert calls == [1] and len(table) == 3 and _strict(tmp_path / "failures.json") == []


def test_perturbation_counts_when_the_engine_reports_them(tmp_path, monkeypatch):
    real = census_mod._simulate

    def with_counts(scenario, seed):
        div = real(scenario, seed)
        if seed != 2:
            div["perturbations"] = {"host_capacity_skew": seed + 1} | ({"extra": 5} if seed == 0 else {})
        else:  # seed 2 as a record written before the field existed
            div.pop("perturbations")
        return div

    monkeypatch.setattr(census_mod, "_simulate", with_counts)
    table = census(SKEW, 3, overrides=SMALL, out=tmp_path, jobs=1, plots=False)
    col = table["perturbation_host_capacity_skew_count"]
    assert col.tolist()[:2] == [1, 2] and col.isna().tolist() == [False, False, True]
    assert table["perturbation_extra_count"].tolist()[:2] == [5, 0]
    p = _strict(tmp_path / "census.json")["perturbations"]
    assert p["host_capacity_skew"] == {"seeds_reporting": 2, "seeds_fired": 2, "total": 3,
                                       "mean_per_seed": 1.5}


def test_a_scenario_without_jitter_always_agrees(tmp_path):
    table = census(QUICK, 3, overrides=("limits.max_requests=30",), out=tmp_path, jobs=1, plots=False)
    assert table["verdict"].tolist() == ["agree"] * 3
    agg = table.attrs["aggregate"]
    assert agg["perturbations_configured"] == []
    assert [(r["verdict"], r["seeds"]) for r in agg["verdicts"]] == [("agree", 3)]
    assert agg["all"]["detection_delay_s"] == {"n": 0, "p50": None, "p90": None, "p99": None, "max": None}


def test_cli_prints_the_table_and_warns_about_a_pinned_jitter_seed(tmp_path, capsys):
    rc = main(["census", SKEW, "--seeds", "2", "--seed-start", "5",
               *[a for s in SMALL + ("jitter.seed=7",) for a in ("--set", s)],
               "-o", str(tmp_path), "--jobs", "1", "--no-plots", "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert err.count("\n") == 1 and "warning:" in err and "jitter.seed is pinned to 7" in err
    assert "seeds 5..6 (2)" in out and "\nall " in out
    assert _strict(tmp_path / "census.json")["jitter_seed_pinned"] == 7


@pytest.mark.parametrize("argv", [
    ["census", "no/such/scenario.yaml", "--seeds", "3"],
    ["census", SKEW, "--seeds", "0"],
    ["census", SKEW, "--seeds", "3", "--set", "host.ratio=lots"],
    ["census", SKEW, "--seeds", "3", "--set", "no_such_section.x=1"],
    ["census", SKEW, "--seeds", "3", "--set", "novalue"],
    ["census", SKEW, "--seeds", "3", "--seed-start", "-1"],
    ["census", SKEW, "--seeds", "3", "--jobs", "0"],
])
def test_bad_input_is_one_line_and_exit_2(argv, tmp_path, capsys):
    rc = main(argv + ["-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("hicache-sim census: error: ")
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


def test_library_seed_lists_and_errors(tmp_path):
    plan = plan_census(SKEW, [7, 3], overrides=SMALL, out=tmp_path)
    assert plan.seeds == (3, 7) and read_record(plan, 3) is None
    for bad in ([], [1, 1], [-1], 2.5, True):
        with pytest.raises(UserError):
            plan_census(SKEW, bad, overrides=SMALL, out=tmp_path)
