"""`plan`: the fast curves equal the reference ones, the knee and target rules, and the
command end to end (deterministic outputs, one-line errors)."""

from __future__ import annotations

import json
import random

import numpy as np
import pandas as pd
import pytest

import cli
from conftest import ROOT
from sim.analysis import curves
from sim.analysis.optimum import _next_uses, interval_upper_bound
from sim.analysis.plan import check_sizes, knee, smallest_meeting
from sim.analysis.stack_distance import COLD, lru_hit_curve, lru_stack_distances


def random_prefix_trace(rng: random.Random, n: int = 60) -> list[list[int]]:
    """Requests sharing prefixes of a few documents, with long single-child chains."""
    ids: dict[tuple, int] = {}
    out = []
    for _ in range(n):
        doc = rng.randrange(6)
        depth = rng.randrange(1, 12)
        path = []
        for j in range(depth):
            # Units in blocks of 4 follow each other always (chains); branching at block starts.
            branch = rng.randrange(2) if j % 4 == 0 and j else 0
            key = (tuple(path), doc, branch)
            path.append(ids.setdefault(key, len(ids)))
        out.append(path)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_compressed_lru_and_optimum_equal_the_references(seed):
    paths = random_prefix_trace(random.Random(seed))
    comp = curves.compress(paths)
    assert int(comp.weight.sum()) == sum(map(len, paths))
    lp = curves.lru_pass(comp, np.arange(len(paths), dtype=float))
    ref = lru_hit_curve(paths).hits_at
    hits = lp.hits_at()
    caps = np.arange(0, sum(map(len, paths)) + 3)
    assert [int(x) for x in lp.hit_units(caps, hits=hits)] == \
        [int(ref[min(c, len(ref) - 1)]) for c in caps]
    nxt = curves.next_uses(comp)
    ref_next = _next_uses(paths)
    for cap in (0, 1, 3, 7, 15, 40):
        assert curves.optimum_units(comp, cap, nxt) == interval_upper_bound(paths, cap, ref_next)


def test_a_chain_unit_that_also_starts_a_path_joins_its_chain_top():
    """Ids that are not prefix ids: unit 2 follows 1 in one request and starts another,
    and the two are accessed equally often, so 2 is merged into 1's chain; the run
    that starts at 2 is then 1's group, as each chain's top is found by following
    the merges up (the pointer jumping a run start needs only then)."""
    comp = curves.compress([[1], [2], [1, 2]])
    assert comp.group.tolist() == [1, 1, 1]
    assert comp.weight.tolist() == [1, 1, 2]
    assert comp.request.tolist() == [0, 1, 2]


def test_warm_up_counts_only_the_later_requests():
    paths = random_prefix_trace(random.Random(11), 80)
    warm = 30
    comp = curves.compress(paths)
    lp = curves.lru_pass(comp, np.zeros(len(paths)))
    dist = lru_stack_distances(paths)
    req = np.repeat(np.arange(len(paths)), [len(p) for p in paths])
    later = dist[(req >= warm) & (dist != COLD)]
    for cap in (1, 5, 20, 200):
        assert int(lp.hit_units(cap, warm=warm)) == int(((later >= 1) & (later <= cap)).sum())


def test_knee_is_where_the_gain_per_gb_falls_below_a_tenth_of_the_steepest():
    x = np.linspace(0, 10, 101)
    y = 1 - np.exp(-x)  # gain exp(-x): a tenth of the steepest at x = ln 10
    k = knee(x, y)
    assert x[k] == pytest.approx(np.log(10), abs=0.11)
    # Flat, then steep (write_through below the device), then flat: past the steepest.
    y2 = np.clip((x - 4) / 2, 0, 1)
    assert x[knee(x, y2)] == pytest.approx(6.0, abs=0.11)
    assert knee(x, np.zeros_like(x)) is None


def test_target_answer_is_interpolated_or_none():
    x = np.array([0.0, 10.0, 20.0, 30.0])
    y = np.array([0.1, 0.3, 0.5, 0.55])
    assert smallest_meeting(x, y, 0.4) == pytest.approx(15.0)
    assert smallest_meeting(x, y, 0.1) == 0.0
    assert smallest_meeting(x, y, 0.6) is None
    ttft = np.array([9.0, 5.0, 3.0, 2.5])
    assert smallest_meeting(x, ttft, 4.0, rising=False) == pytest.approx(15.0)
    assert check_sizes(x, y, 3)[0] == 0.0 and len(check_sizes(x, y, 3)) == 3


SMALL = """\
name: small
model: {preset: llama-3.1-8b}
tp: 2
page_size: 64
device: {tokens: 4096}
host: {ratio: 2}
cache: {write_policy: write_back, host_policy: duplicate_first}
workload:
  kind: multi_turn_chat
  num_requests: 60
  block_size: 64
  arrival: {process: poisson, rate: 4.0}
  system_prompt_tokens: 512
  user_tokens: {dist: lognormal, mean: 150, cv: 1.0}
  output_tokens: {dist: lognormal, mean: 64, cv: 1.0}
  think_time_s: {dist: exponential, mean: 3}
  max_context_tokens: 4000
scheduler: {max_running_requests: 8}
"""


def test_plan_end_to_end_is_deterministic(tmp_path, capsys):
    p = tmp_path / "small.yaml"
    p.write_text(SMALL)
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        rc = cli.main(["plan", str(p), "-o", str(out), "--check-points", "3", "--grid-points", "12",
                       "--opt-points", "3", "--target-hit-rate", "40%", "--target-ttft-p99", "100",
                       "--warmup", "0.25", "--quiet"])
        assert rc == 0
        outs.append(out)
    text = capsys.readouterr().out
    assert "answer: write_back + duplicate_first" in text and "diagnosis (" in text
    for f in ("plan.png", "plan.svg", "plan.parquet", "plan.json"):
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes(), f
    doc = json.loads((outs[0] / "plan.json").read_text())
    assert doc["warmup_requests"] == 15
    assert {(r["write_policy"], r["host_policy"]) for r in doc["policies"]} == {
        ("write_back", "duplicate_first"), ("write_back", "lru"),
        ("write_through", "duplicate_first"), ("write_through", "lru")}
    for r in doc["policies"]:
        assert r["model_vs_engine_max_abs_error"] is not None
        assert "target_hit_rate_gb_per_rank" in r and "target_ttft_p99_gb_per_rank" in r
    df = pd.read_parquet(outs[0] / "plan.parquet")
    assert {"host_gb_per_rank", "host_tokens_per_rank", "host_gb_per_node", "hit_rate",
            "ttft_p99_s", "backup_failures", "duplicate_pages_mean"} <= set(df.columns)
    eng = df[df["series"] == "engine"]
    # 3 sizes per policy pair, plus the scenario's own host for its own pair.
    assert len(eng) == 4 * 3 + 1
    assert (eng["requests_measured"] <= 45).all()  # the warm-up's 15 requests are left out


def test_plan_on_a_single_tier_varies_the_device(tmp_path, capsys):
    p = tmp_path / "small.yaml"
    p.write_text(SMALL.replace("host: {ratio: 2}", "host: off"))
    out = tmp_path / "o"
    assert cli.main(["plan", str(p), "-o", str(out), "--check-points", "2", "--grid-points", "8",
                     "--opt-points", "2", "--quiet"]) == 0
    doc = json.loads((out / "plan.json").read_text())
    assert doc["tier"] == "device" and len(doc["policies"]) == 1
    df = pd.read_parquet(out / "plan.parquet")
    assert "device_gb_per_rank" in df.columns
    assert "single tier" in capsys.readouterr().out


@pytest.mark.parametrize("args, where", [
    (["--warmup", "1.5"], "--warmup"),
    (["--target-hit-rate", "abc"], "--target-hit-rate"),
    (["--target-hit-rate", "0"], "--target-hit-rate"),
    (["--policies", "write_back+fifo"], "--policies"),
    (["--check-points", "2.5"], "--check-points"),
    (["--target-ttft-p99", "1", "--check-points", "0"], "--target-ttft-p99"),
    (["--max-host-gb", "-1"], "--max-host-gb"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, where):
    p = tmp_path / "small.yaml"
    p.write_text(SMALL)
    rc = cli.main(["plan", str(p), "-o", str(tmp_path / "o"), "--quiet", *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert "\n" not in err and where in err and "expected" in err


def test_data_parallel_instances_each_cache_their_own_stream(tmp_path):
    """With dp > 1 the model is the sum of one LRU per instance, over the requests the
    router gave it (a single cache over the whole stream would count reuse across
    instances that never happens)."""
    from sim.analysis.plan import _instance_parts, make_plan, plan_trace
    from sim.scenario import load_scenario

    p = tmp_path / "small.yaml"
    p.write_text(SMALL)
    two = load_scenario(p, ["dp=2"])  # round robin: request r goes to instance r % 2
    trace = plan_trace(two)
    n = len(trace.paths)
    parts = _instance_parts(two, n)
    assert [x.tolist() for x in parts] == [list(range(0, n, 2)), list(range(1, n, 2))]
    plan = make_plan(two, check_points=0, grid_points=8, opt_points=2)
    d = plan.doc
    ps, d_units = d["page_size"], d["device_tokens_per_rank"] // d["page_size"]
    per = [curves.lru_pass(curves.compress([trace.paths[k] for k in idx.tolist()]),
                           trace.arrival[idx]).hits_at(0) for idx in parts]
    at = lambda h, c: h[min(c, len(h) - 1)]  # noqa: E731
    want0 = sum(at(h, d_units) for h in per) * ps / d["measured_input_tokens"]
    assert plan.model["write_back"][0] == pytest.approx(want0)  # host 0: the devices alone
    whole = curves.lru_pass(curves.compress(trace.paths), trace.arrival).hits_at(0)
    assert sum(h[-1] for h in per) < whole[-1]  # reuse across instances is lost


def test_plan_trace_keys_every_request_as_the_engine_does(tmp_path):
    """plan_trace's one flat array (page_units) against the plain path: page_key of each
    request of the workload stream; an instance's subset against the list subset."""
    from sim.analysis.plan import plan_trace
    from sim.scenario import load_scenario
    from sim.workloads import build_workload, page_key

    p = tmp_path / "small.yaml"
    p.write_text(SMALL)
    scn = load_scenario(p, [])
    trace = plan_trace(scn)
    plain = [page_key(r.blocks, r.block_size, scn.page_size, r.input_len) for r in build_workload(scn)]
    assert trace.paths == plain and trace.requests == len(plain)
    idx = np.array([0, 2, 3, len(plain) - 1])
    units, starts = trace.subset(idx)
    assert [units[starts[i]:starts[i + 1]].tolist() for i in range(len(idx))] == [plain[k] for k in idx]
    a, b = curves.compress_units(units, starts), curves.compress([plain[k] for k in idx])
    assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("group", "weight", "request", "starts"))


def test_plan_with_storage_reports_each_tier_from_the_engine(tmp_path, capsys):
    """A scenario with ``storage:``: the engine points carry the device / host / storage
    split, the planning curve is the engine's L1+L2+L3 (the one-pass model has no L3),
    and the storage size given changes the L3 share."""
    from conftest import ROOT

    scn = str(ROOT / "scenarios" / "storage_mooncake.yaml")
    docs = {}
    for cap in (None, 0.3):
        out = tmp_path / f"c{cap}"
        argv = ["plan", scn, "-o", str(out), "--check-points", "3", "--grid-points", "8",
                "--opt-points", "0", "--policies", "write_through+duplicate_first", "--quiet"]
        if cap is not None:
            argv += ["--set", f"storage.capacity_gb={cap}"]
        assert cli.main(argv) == 0
        docs[cap] = json.loads((out / "plan.json").read_text())
        df = pd.read_parquet(out / "plan.parquet")
        eng = df[df["series"] == "engine"]
        assert eng["storage_hit_rate"].notna().all()
    text = capsys.readouterr().out
    assert "L3: mooncake storage, unbounded" in text and "0.3 GB per rank" in text
    d = docs[None]
    assert d["storage"]["capacity_gb_per_rank"] is None
    assert docs[0.3]["storage"]["capacity_gb_per_rank"] == 0.3
    (row,) = d["policies"]
    assert row["model_vs_engine_max_abs_error"] is None  # the model is not checked against L3
    pts = row["engine_tiers"]
    for p in pts:
        assert p["device"] + p["host"] + p["storage"] == pytest.approx(p["total"])
    assert max(p["storage"] for p in pts) > 0
    # the planning curve follows the engine's own L1+L2+L3 points (on the 8-point grid)
    at_own = next(p for p in pts if p["host_gb_per_rank"] == pytest.approx(d["scenario_host_gb_per_rank"]))
    assert d["scenario_engine"]["hit_rate"] == pytest.approx(at_own["total"])
    assert row["hit_rate_at_scenario_host"] == pytest.approx(at_own["total"], abs=0.01)
    assert d["scenario_engine"]["storage_hit_rate"] == pytest.approx(at_own["storage"])
    small = {round(p["host_gb_per_rank"], 6): p["storage"] for p in docs[0.3]["policies"][0]["engine_tiers"]}
    big = {round(p["host_gb_per_rank"], 6): p["storage"] for p in pts}
    assert sum(small.values()) < sum(big.values())


def test_the_outputs_written_in_their_own_process_are_the_inline_ones(tmp_path):
    """plan's PlanWriter writes the bytes the inline write_plan writes (figure
    included), and an error in it is raised in the parent."""
    from sim.analysis.plan import make_plan
    from sim.commands import plan as plan_cmd
    from sim.scenario import load_scenario

    scn = load_scenario(ROOT / "scenarios" / "quickstart.yaml", ["workload.num_requests=200"])
    plan = make_plan(scn, check_points=0, opt_points=2, grid_points=8)
    plan_cmd.write_plan(plan, tmp_path / "inline")
    writer = plan_cmd.PlanWriter.start()
    assert writer is not None
    try:
        paths = writer.write(plan, tmp_path / "forked")
    finally:
        writer.close()
    assert [p.name for p in paths] == ["plan.png", "plan.svg", "plan.parquet", "plan.json"]
    for p in paths:
        assert p.read_bytes() == (tmp_path / "inline" / p.name).read_bytes(), p.name
    (tmp_path / "file").write_text("")
    writer = plan_cmd.PlanWriter.start()
    try:  # the table and JSON are this process's: its own error, after the figures' answer
        with pytest.raises(OSError):
            writer.write(plan, tmp_path / "file" / "under")  # not a folder
    finally:
        writer.close()


def test_an_error_drawing_the_figure_is_raised_in_the_parent(tmp_path, monkeypatch):
    import reports.plan

    from sim.analysis.plan import make_plan
    from sim.commands import plan as plan_cmd
    from sim.scenario import load_scenario

    scn = load_scenario(ROOT / "scenarios" / "quickstart.yaml", ["workload.num_requests=100"])
    plan = make_plan(scn, check_points=0, opt_points=0, grid_points=4)

    def broken(_plan):
        raise ValueError("no figure today")

    monkeypatch.setattr(reports.plan, "draw_plan", broken)  # the forked process inherits it
    writer = plan_cmd.PlanWriter.start()
    try:
        with pytest.raises(RuntimeError, match="(?s)writing the plan failed.*no figure today"):
            writer.write(plan, tmp_path / "out")
    finally:
        writer.close()
    assert (tmp_path / "out" / "plan.json").is_file()  # the parent's part was written


def _parquet_bytes(table_or_df, path) -> bytes:
    from sim.atomic import write_parquet

    write_parquet(path, table_or_df)
    return path.read_bytes()


@pytest.mark.parametrize("sets,kw", [
    ([], dict(check_points=0, opt_points=2, grid_points=8)),  # model, planning and optimum rows
    ([], dict(check_points=2, opt_points=0, grid_points=6)),  # engine rows and their extras
    (["host=off"], dict(check_points=2, opt_points=1, grid_points=5)),  # the device tier
], ids=["model", "engine", "device_tier"])
def test_the_table_built_without_pandas_is_the_pandas_one_byte_for_byte(tmp_path, sets, kw):
    """plan.parquet is written from a pyarrow table built directly
    (plan_arrow_table): its file is the one pandas' DataFrame gives (plan_table)."""
    from sim.analysis.plan import make_plan, plan_arrow_table, plan_table
    from sim.scenario import load_scenario

    scn = load_scenario(ROOT / "scenarios" / "quickstart.yaml", ["workload.num_requests=120", *sets])
    plan = make_plan(scn, **kw)
    arrow = plan_arrow_table(plan)
    assert arrow is not None
    assert _parquet_bytes(arrow, tmp_path / "a.parquet") == _parquet_bytes(plan_table(plan), tmp_path / "b.parquet")


def test_a_column_is_typed_as_pandas_types_it_or_left_to_pandas():
    """Each kind of column the plan's rows hold, typed as pd.DataFrame(rows) types it
    and converted as Table.from_pandas converts it; mixes it does not mirror: None."""
    import pyarrow as pa

    from sim.analysis.plan import _ABSENT, _arrow_column

    A = _ABSENT
    cases = {"float+absent": [1.0, A, np.float64(2.5)], "int": [1, 2, 3], "int+absent": [1, A, 3],
             "int+None": [1, None, 3], "float+None": [1.5, None, A], "None+absent": [None, A],
             "None": [None, None], "nan": [float("nan"), 1.0], "int+float": [1, 2.5],
             "str": ["a", "b"], "str+absent+None": ["a", A, None], "bool": [True, False]}
    for name, values in cases.items():
        df = pd.DataFrame([dict({"k": 0}, **({} if v is A else {"x": v})) for v in values])
        want = pa.Table.from_pandas(df[["x"]], preserve_index=False).column("x").combine_chunks()
        got, dtype = _arrow_column(values)
        assert got.type == want.type and got.to_pylist() == want.to_pylist(), name
        assert dtype == str(df["x"].dtype), name
    assert _arrow_column([A, A])[0].type == pa.null()  # a column no row has: df[c] = None
    for mix in ([True, A], ["a", 1.0], [True, 1], [2**64, 1]):
        assert _arrow_column(mix) is None, mix
