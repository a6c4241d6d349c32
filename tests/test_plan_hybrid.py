"""`plan` on a hybrid: host hit rate against host KV x host Mamba state slots (FULL,
MAMBA) or host SWA tokens (FULL, SWA), the inert threshold (bisection over engine
runs), the outputs, determinism, and the refusals (sim.analysis.plan_hybrid)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import ROOT

import cli
from sim.analysis.plan_hybrid import hybrid_point, make_hybrid_plan, slot_grid
from sim.scenario import load_scenario

PROMPTS, LEN, REPLAYS = 30, 1200, 6   # 3 checkpoints a prompt at chunk 512: 512, 1024, 1200

SMALL = """\
name: small_hybrid
seed: 1
model: {hybrid_preset: qwen3-next-80b-a3b}
tp: 1
page_size: 1
device:
  tokens: 8000
  max_mamba_cache_size: 6
host:
  tokens: 40000
  mamba_states: 40
cache: {write_policy: write_back}
workload: {kind: trace, format: generic, path: small.jsonl}
scheduler: {max_running_requests: 2, chunked_prefill_tokens: 512}
"""


@pytest.fixture
def small(tmp_path):
    """Distinct prompts, then replays of the first ones: their states reach the host
    (the device keeps 6) and the Mamba host LRU evicts the oldest first."""
    lines = [{"arrival_s": float(i), "input_len": LEN, "output_len": 1, "block_size": LEN,
              "blocks": [i]} for i in range(PROMPTS)]
    lines += [{"arrival_s": PROMPTS + 5.0 + j, "input_len": LEN, "output_len": 1,
               "block_size": LEN, "blocks": [j]} for j in range(REPLAYS)]
    (tmp_path / "small.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    p = tmp_path / "small.yaml"
    p.write_text(SMALL)
    return p


def test_host_hit_rate_rises_with_slots(small):
    plan = make_hybrid_plan(load_scenario(small), kv_points=1, slot_points=6)
    kvs = [r["host_kv_tokens_per_rank"] for r in plan.doc["kv_sizes"]]
    assert kvs == [40000, 80000]            # the scenario's own, and twice it
    for kv in kvs:
        pts = sorted((p for p in plan.points if p.host_tokens == kv), key=lambda p: p.slots)
        hits = [p.host_hit_tokens for p in pts]
        assert hits == sorted(hits)          # never falls as slots grow
        assert hits[0] == 0 and hits[-1] > 0
        assert pts[-1].probe == "plateau" and pts[-1].slots == 8000 + kv
    # The grid: 6 geometric counts up to the workload's states (36 x 3), plus the
    # scenario's own count, the split's and the unbounded one.
    assert plan.doc["workload_states"] == (PROMPTS + REPLAYS) * 3
    assert plan.doc["slot_grid"] == slot_grid(108, 6)


def test_the_inert_threshold_is_inert_and_one_more_slot_is_not(small):
    s = load_scenario(small)
    plan = make_hybrid_plan(s, kv_points=1, slot_points=5)
    bpt = plan.doc["bytes_per_token"]
    for row in plan.doc["kv_sizes"]:
        t, kv = row["inert_threshold_slots"], row["host_kv_tokens_per_rank"]
        limit = row["inert_below_host_hit_tokens"]
        assert t is not None and t > 0 and limit > 0
        assert hybrid_point(s, kv, t, 0, bpt).host_hit_tokens < limit
        assert hybrid_point(s, kv, t + 1, 0, bpt).host_hit_tokens >= limit
        # every grid count at or below it is inert
        for p in plan.points:
            if p.host_tokens == kv and p.slots <= t:
                assert p.host_hit_tokens < limit
        assert row["inert_threshold_slots_per_kv_gb"] == pytest.approx(t / row["host_kv_gb_per_rank"])
        # The mechanism: the host must keep the replayed prompts' states beside the ones
        # evicted after them, so the threshold sits below the 90 states of the fill.
        assert 40 < t < PROMPTS * 3


def test_a_larger_inert_fraction_moves_the_threshold_up(small):
    s = load_scenario(small)
    lo = make_hybrid_plan(s, kv_points=1, slot_points=4, inert_fraction=0.01)
    hi = make_hybrid_plan(s, kv_points=1, slot_points=4, inert_fraction=0.9)
    t_lo = lo.doc["kv_sizes"][0]["inert_threshold_slots"]
    t_hi = hi.doc["kv_sizes"][0]["inert_threshold_slots"]
    assert t_hi > t_lo


def test_outputs_are_written_and_deterministic(small, tmp_path, capsys):
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        rc = cli.main(["plan", str(small), "-o", str(out), "--kv-points", "2", "--slot-points", "4",
                       "--jobs", "2" if name == "b" else "1", "--quiet"])
        assert rc == 0
        outs.append(out)
    text = capsys.readouterr().out
    assert "inert below (slots)" in text and "answer: with" in text and "cannot see Mamba" in text
    for f in ("plan.png", "plan.svg", "plan.parquet", "plan.json"):
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes(), f
    assert not list(outs[0].glob(".*.tmp"))      # atomic writes leave no temporaries
    doc = json.loads((outs[0] / "plan.json").read_text())
    assert doc["kind"] == "hybrid_mamba"
    assert [r["host_kv_tokens_per_rank"] for r in doc["kv_sizes"]] == [40000, 80000]
    df = pd.read_parquet(outs[0] / "plan.parquet")
    assert {"host_kv_tokens_per_rank", "host_state_slots_per_rank", "host_hit_rate",
            "probe"} <= set(df.columns)
    assert set(df["probe"]) == {"grid", "plateau", "bisect"}


def test_a_swa_hybrid_without_a_host_tier_is_refused_in_one_line(tmp_path, capsys):
    rc = cli.main(["plan", str(ROOT / "scenarios" / "hybrid_swa.yaml"), "-o", str(tmp_path / "o"),
                   "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert "hybrid_swa.yaml: host" in err and "host: off" in err and "(FULL, SWA)" in err
    assert "expected a host tier" in err and "host.swa_tokens" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, where", [
    (["--policies", "write_back+lru"], "--policies"),
    (["--target-hit-rate", "50%"], "--target-hit-rate"),
    (["--slot-points", "0"], "--slot-points"),
    (["--inert-fraction", "100%"], "--inert-fraction"),
    (["--check-points", "2"], "--check-points"),
    (["--grid-points", "20"], "--grid-points"),
])
def test_bad_hybrid_input_is_one_line_and_exit_2(small, tmp_path, capsys, args, where):
    rc = cli.main(["plan", str(small), "-o", str(tmp_path / "o"), "--quiet", *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and where in err and "expected" in err


def test_max_slots_sets_the_grid_and_a_host_off_scenario_is_planned(small, tmp_path):
    s = load_scenario(small, ["host=off"])
    plan = make_hybrid_plan(s, kv_points=2, slot_points=3, max_slots=50)
    assert plan.doc["slot_grid"] == [1, 7, 50]
    assert plan.doc["scenario_host_tokens_per_rank"] == 0
    # host off: the KV sizes run up to twice the device's FULL pool
    assert [r["host_kv_tokens_per_rank"] for r in plan.doc["kv_sizes"]] == [8000, 16000]
    grid = {p.slots for p in plan.points if p.probe == "grid"}
    assert {1, 7, 50} <= grid and 165 not in grid   # no own count without a host tier
    # Up to 16,000 host KV tokens the replayed prompts' KV (36,000 tokens of fill
    # later) is gone from the host at any slot count: no threshold to find.
    for r in plan.doc["kv_sizes"]:
        assert r["plateau_host_hit_tokens"] == 0 and r["inert_threshold_slots"] is None
        assert r["status"] == "no host hits at any slot count"


@pytest.mark.parametrize("gb", [1.0, 2.5, 30.0, 32.0, 333.0])
def test_the_split_slots_beside_a_kv_size_are_what_that_hicache_size_gives(gb):
    """``split_slots`` inverts ``_split_hicache_size``: at the KV host pool a
    ``--hicache-size`` gives, it answers that size's Mamba host pool."""
    from sim.analysis.plan_hybrid import split_slots
    from sim.hybrid import pools

    for dev, states, fb, sb in [(400000, 16, 12288, 19316736), (375755, 55, 12288, 38633472),
                                (20000, 48, 12288, 38633472)]:
        full, aux = pools.hybrid_host_pools("mamba", dev, states, 1, fb, sb, hicache_gb=gb)
        assert split_slots(full, 1, fb, dev, states, sb) == aux


def test_the_default_slot_range_is_the_states_the_requests_can_create(small):
    from sim.analysis.plan import plan_trace
    from sim.analysis.plan_hybrid import workload_states

    trace = plan_trace(load_scenario(small))
    assert workload_states(trace, 512) == (PROMPTS + REPLAYS) * 3
    assert workload_states(trace, 600) == (PROMPTS + REPLAYS) * 2
    assert workload_states(trace, None) == PROMPTS + REPLAYS      # no chunking: one each


def test_a_hybrid_flag_on_a_full_only_scenario_is_refused(tmp_path, capsys):
    rc = cli.main(["plan", str(ROOT / "scenarios" / "quickstart.yaml"), "-o", str(tmp_path / "o"),
                   "--quiet", "--slot-points", "4"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "--slot-points" in err and "FULL-only" in err


def test_the_plan_runs_the_scenarios_write_policy(small):
    """A scenario with a host tier is planned under its own cache.write_policy (each
    is modelled for (FULL, MAMBA)); write_through backs every checkpoint up at its
    insert, so the engine points differ from write_back's."""
    wb = make_hybrid_plan(load_scenario(small), kv_points=1, slot_points=4)
    wt = make_hybrid_plan(load_scenario(small, ["cache.write_policy=write_through"]),
                          kv_points=1, slot_points=4)
    assert wb.doc["write_policy"] == "write_back" and wt.doc["write_policy"] == "write_through"
    key = lambda plan: sorted((p.host_tokens, p.slots, p.host_hit_tokens, p.aux_host_frees)
                              for p in plan.points)
    assert key(wt) != key(wb)
    # host: off is planned under write_back (the plan adds a host tier the scenario lacks)
    off = make_hybrid_plan(load_scenario(small, ["host=off"]),
                           kv_points=1, slot_points=3)
    assert off.doc["write_policy"] == "write_back"


# ------------------------------------------------------------------------------------
# (FULL, SWA): the host SWA tokens axis
# ------------------------------------------------------------------------------------

# hybrid_swa_host at 80 requests on one rank without its jitter: every run agrees, and
# each plan is a couple of seconds. Host 48,016 FULL + 9,616 SWA tokens (ratio 2).
SWA_SMALL = ["workload.num_requests=80", "tp=1", "jitter={}"]
SWA_PAGE, SWA_DEVICE = 16, 4800


def swa_small(extra=()):
    return load_scenario(ROOT / "scenarios" / "hybrid_swa_host.yaml", [*SWA_SMALL, *extra])


@pytest.fixture(scope="module")
def swa_plan():
    return make_hybrid_plan(swa_small(), kv_points=1, slot_points=6)


def test_swa_host_hit_rate_rises_with_host_swa_tokens(swa_plan):
    d = swa_plan.doc
    assert d["kind"] == "hybrid_swa" and d["sliding_window"] == 128
    kvs = [r["host_kv_tokens_per_rank"] for r in d["kv_sizes"]]
    assert kvs == [48016, 96032]                    # the scenario's own, and twice it
    assert d["scenario_host_swa_tokens_per_rank"] == 9616
    assert d["device_swa_tokens_per_rank"] == SWA_DEVICE
    # the grid: whole pages, one page up to device SWA + the largest host KV
    assert d["swa_token_grid"] == slot_grid(SWA_DEVICE + 96032, 6, SWA_PAGE)
    assert d["swa_token_grid"][0] == SWA_PAGE and d["swa_token_grid"][-1] == SWA_DEVICE + 96032
    for kv in kvs:
        pts = sorted((p for p in swa_plan.points if p.host_tokens == kv), key=lambda p: p.aux)
        assert all(p.aux % SWA_PAGE == 0 for p in pts)
        hits = [p.host_hit_tokens for p in pts]
        assert hits == sorted(hits)                  # never falls as host SWA grows
        assert hits[0] == 0 and hits[-1] > 0
        assert pts[-1].probe == "plateau" and pts[-1].aux == SWA_DEVICE + kv
        assert {p.verdict for p in pts} == {"agree"}
    # SGLang's default beside the scenario's KV is the scenario's own SWA host pool
    own = next(r for r in d["kv_sizes"] if r["host_kv_tokens_per_rank"] == 48016)
    assert own["sglang_default_swa_tokens"] == 9616 and own["sglang_default_inert"] is False
    assert d["scenario_engine"]["swa_tokens"] == 9616
    assert d["scenario_engine"]["host_hits_with_swa"] > 0


def test_the_swa_inert_threshold_is_inert_and_one_more_page_is_not(swa_plan):
    s = swa_small()
    bpt = swa_plan.doc["bytes_per_token"]
    for row in swa_plan.doc["kv_sizes"]:
        t, kv = row["inert_threshold_swa_tokens"], row["host_kv_tokens_per_rank"]
        limit = row["inert_below_host_hit_tokens"]
        assert t is not None and t > 0 and t % SWA_PAGE == 0 and limit > 0
        assert hybrid_point(s, kv, t, 0, bpt).host_hit_tokens < limit
        assert hybrid_point(s, kv, t + SWA_PAGE, 0, bpt).host_hit_tokens >= limit
        for p in swa_plan.points:
            if p.host_tokens == kv and p.aux <= t:
                assert p.host_hit_tokens < limit
        assert row["inert_threshold_swa_tokens_per_kv_gb"] == pytest.approx(
            t / row["host_kv_gb_per_rank"])
        assert row["inert_threshold_swa_tokens_per_node"] == t      # one rank per node
        assert row["status"] == f"inert at {t} host SWA tokens and below, not at {t + SWA_PAGE}"
    assert "bisect" in {p.probe for p in swa_plan.points}


def test_swa_outputs_are_written_labelled_and_deterministic(tmp_path, capsys):
    src = tmp_path / "swa.yaml"
    src.write_text((ROOT / "scenarios" / "hybrid_swa_host.yaml").read_text())
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        args = ["plan", str(src), "-o", str(out), "--kv-points", "1", "--aux-points", "4",
                "--jobs", "2" if name == "b" else "1", "--quiet"]
        for kv in SWA_SMALL:
            args += ["--set", kv]
        assert cli.main(args) == 0
        outs.append(out)
    text = capsys.readouterr().out
    assert "inert below (SWA tokens)" in text and "SGLang default SWA tokens" in text
    assert "host SWA tokens per rank or fewer" in text and "cannot see SWA windows" in text
    assert "slots" not in text
    for f in ("plan.png", "plan.svg", "plan.parquet", "plan.json"):
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes(), f
    assert not list(outs[0].glob(".*.tmp"))
    svg = (outs[0] / "plan.svg").read_text()
    assert "host SWA tokens per rank" in svg and "Mamba" not in svg and "slots" not in svg
    doc = json.loads((outs[0] / "plan.json").read_text())
    assert doc["kind"] == "hybrid_swa" and len(doc["swa_token_grid"]) == 4
    df = pd.read_parquet(outs[0] / "plan.parquet")
    assert {"host_kv_tokens_per_rank", "host_swa_tokens_per_rank", "host_swa_tokens_used",
            "host_hits_with_swa", "probe"} <= set(df.columns)
    assert not any("slot" in c or "state" in c for c in df.columns)


def test_max_aux_sets_the_swa_grid_and_the_inert_fraction_moves_its_threshold():
    s = swa_small()
    short = make_hybrid_plan(s, kv_points=1, slot_points=3, max_slots=1600)
    assert short.doc["swa_token_grid"] == [16, 160, 1600]
    grid = {p.aux for p in short.points if p.probe == "grid" and p.host_tokens == 48016}
    assert grid == {16, 160, 1600, 9616}             # the grid, and the scenario's own
    hi = make_hybrid_plan(s, kv_points=1, slot_points=3, max_slots=1600, inert_fraction=0.5)
    t_lo = short.doc["kv_sizes"][0]["inert_threshold_swa_tokens"]
    t_hi = hi.doc["kv_sizes"][0]["inert_threshold_swa_tokens"]
    assert t_hi > t_lo


def test_swa_default_sizing_follows_the_scenarios_host_unit():
    """``default_swa_tokens`` inverts the scenario's host sizing: at the FULL host pool
    a ratio (or a --hicache-size) gives, it answers that sizing's SWA host pool."""
    from sim.analysis.plan_hybrid import default_swa_tokens
    from sim.scenario import resolve_sizing

    for extra in (["host={ratio: 2.0}"], ["host={ratio: 1.37}"], ["host={ratio: 5.0}"],
                  ["host={size_gb: 0.3}"], ["host={size_gb: 2.0}"]):
        s = swa_small(extra)
        info = resolve_sizing(s)
        hy = info["hybrid"]
        assert default_swa_tokens(s, info["host_tokens"], SWA_PAGE, info["bytes_per_token"],
                                  info["device_tokens"], hy["aux_device"],
                                  hy["aux_bytes"]) == hy["aux_host"], extra


@pytest.mark.parametrize("args, where, what", [
    (["--slot-points", "4"], "--slot-points", "--aux-points"),
    (["--max-slots", "100"], "--max-slots", "--max-aux"),
    (["--max-aux", "100"], "--max-aux", "multiple of page_size 16"),
    (["--aux-points", "0"], "--aux-points", "expected"),
    (["--policies", "write_back+lru"], "--policies", "FULL-only"),
])
def test_bad_swa_input_is_one_line_and_exit_2(tmp_path, capsys, args, where, what):
    rc = cli.main(["plan", str(ROOT / "scenarios" / "hybrid_swa_host.yaml"), "-o",
                   str(tmp_path / "o"), "--quiet", *[a for kv in SWA_SMALL for a in ("--set", kv)],
                   *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and where in err and what in err


def test_the_generic_flags_work_for_mamba_and_clash_with_its_names(small, tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli.main(["plan", str(small), "-o", str(a), "--quiet", "--kv-points", "1",
                     "--slot-points", "3", "--max-slots", "50"]) == 0
    assert cli.main(["plan", str(small), "-o", str(b), "--quiet", "--kv-points", "1",
                     "--aux-points", "3", "--max-aux", "50"]) == 0
    assert json.loads((a / "plan.json").read_text())["slot_grid"] == [1, 7, 50]
    assert (a / "plan.json").read_bytes() == (b / "plan.json").read_bytes()
    capsys.readouterr()
    rc = cli.main(["plan", str(small), "-o", str(tmp_path / "c"), "--quiet",
                   "--max-slots", "50", "--max-aux", "60"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "--max-slots" in err and "--max-aux" in err
