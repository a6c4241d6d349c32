"""What a newcomer reads: the scenario reference lists presets, profiles and a
description for every key; a typo gets the name meant; a second error is shown; a
census says which seeds gave which verdict; `replay-ops --summary` prints a summary."""

import gzip
import json
import re

import pytest

import cli
from conftest import ROOT
from sim.costs import MODEL_PRESETS, PROFILES
from sim.costs.hybrid_models import HYBRID_MODEL_PRESETS
from sim.schema_doc import markdown

QUICK = ROOT / "scenarios" / "quickstart.yaml"


def test_the_reference_lists_every_preset_and_profile():
    md = markdown()
    presets = md[md.index("\n## Model presets\n"):md.index("\n## GPU profiles\n")]
    profiles = md[md.index("\n## GPU profiles\n"):]
    for name in list(MODEL_PRESETS) + list(HYBRID_MODEL_PRESETS):
        assert f"| `{name}` |" in presets, name
    for name in PROFILES:
        assert f"| `{name}` |" in profiles, name


def test_every_key_in_the_reference_has_a_description():
    rows = [ln for ln in markdown().splitlines() if re.match(r"\| `[a-z_]+` \| ", ln)]
    keyed = [ln for ln in rows if ln.count("|") == 6]  # the key tables' five columns
    assert len(keyed) > 200
    empty = [ln.split("|")[1].strip() for ln in keyed if not ln.split("|")[5].strip()]
    assert not empty, empty


@pytest.mark.parametrize("key,typed,meant", [
    ("cost.profile", "h100", "h100-sxm"),
    ("cost.profile", "H200", "h200-sxm"),
    ("model.preset", "70b", "llama-3.1-70b"),
    ("model.preset", "llama-3.1-8", "llama-3.1-8b"),
    ("cache.write_policy", "write-back", "write_back"),
])
def test_a_typed_name_suggests_the_name_meant(tmp_path, capsys, key, typed, meant):
    rc = cli.main(["validate", str(QUICK), "--set", f"{key}={typed}"])
    err = capsys.readouterr()
    text = err.err + err.out
    assert rc == 2
    assert f"did you mean {meant!r}" in text, text


def test_h100_suggests_h100_sxm_not_a100():
    from sim.errors import suggest

    assert suggest("h100", PROFILES) == ["h100-sxm"]
    assert suggest("a10", PROFILES) == ["a100"]
    assert suggest("ratoi", ["tokens", "ratio", "gib"]) == ["ratio"]  # spelling still works


def test_a_second_error_is_shown_not_counted(tmp_path, capsys):
    p = tmp_path / "two.yaml"
    p.write_text(QUICK.read_text().replace("ratio: 2.0", "ratoi: 2.0")
                 .replace("profile: h200-sxm", "profile: h100"))
    assert cli.main(["run", str(p), "-o", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "host.ratoi" in err and "cost.profile: found profile 'h100'" in err
    assert "more error" not in err


def test_a_census_lists_the_seeds_of_each_verdict(tmp_path, capsys):
    skew = ROOT / "scenarios" / "jitter_host_capacity_skew.yaml"
    rc = cli.main(["census", str(skew), "--seeds", "4", "--set", "limits.max_requests=40",
                   "--set", "device.tokens=4096", "-o", str(tmp_path / "c"), "--jobs", "1",
                   "--no-plots", "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    agg = json.loads((tmp_path / "c" / "census.json").read_text())
    listed = {}
    for row in agg["verdicts"]:
        assert len(row["seed_list"]) == row["seeds"]
        listed.update({s: row["verdict"] for s in row["seed_list"]})
    assert sorted(listed) == [0, 1, 2, 3]
    block = out[out.index("seeds by verdict"):]
    for row in agg["verdicts"]:
        line = next(ln for ln in block.splitlines() if ln.split()[:1] == [row["verdict"]])
        shown = {int(x) for part in line.split(None, 1)[1].split(", ")
                 for x in (range(int(part.split("-")[0]), int(part.split("-")[1]) + 1)
                           if "-" in part else [part])}
        assert shown == set(row["seed_list"])


def test_census_seed_ranges():
    from sim.census import seed_ranges

    assert seed_ranges([7, 0, 1, 2, 3, 5, 8, 9]) == "0-3, 5, 7-9"
    assert seed_ranges([4, 5]) == "4, 5"


def test_replay_ops_summary_prints_one_line_not_every_op(tmp_path, capsys):
    trace = sorted((ROOT / "data" / "conformance").glob("g01_*.jsonl.gz"))[0]
    n_ops = sum(1 for line in gzip.open(trace, "rt") if line.strip()) - 1  # less the header
    assert cli.main(["replay-ops", str(trace), "--summary"]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "ops replayed; digest" in err
    assert n_ops > 10
    # with -o the per-op outputs still go to the file
    assert cli.main(["replay-ops", str(trace), "--summary", "-o", str(tmp_path / "o.jsonl")]) == 0
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) >= n_ops
