"""Seed censuses: one scenario over many seeds, and how its TP verdicts spread.

One seed's verdict is one draw: over seeds 0-19 the shipped ``host_alloc_failure``
scenario is detected 13 times, missed 4 times, hangs twice and is absorbed once. A
census runs seeds ``K .. K+N-1`` of one scenario (the run's ``seed``; the jitter draws
follow it unless the scenario pins ``jitter.seed``) and keeps, per seed, only what
the divergence report says (no results folder)::

    OUT/seeds/seed-<n>.json    one record per seed (written atomically, when it ends)
    OUT/census.parquet         one row per seed, in seed order
    OUT/census.json            the aggregate: per verdict, count, share, percentiles
    OUT/failures.json          seeds whose run raised (an engine bug, not a verdict)
    OUT/census.png, .svg       verdict bars and the detection-delay CDF (reports.census)

Resume: a seed whose record exists, parses, and names this scenario (the digest of
the resolved scenario, seed aside) is done and not run again, so a killed census
picks up where it stopped and a finished one only rebuilds the tables. Seeds run in
the process pool or on Ray through ``sim.sweep``'s executors; ``jobs=1`` with the
local executor runs them in this process (no pool start-up for small censuses).

Everything written is deterministic: the same scenario and seeds give byte-identical
files, however many jobs ran them and however often the census was resumed (tables
are always built from the records on disk, never from in-memory results).
"""

from __future__ import annotations

import json
import math
import os
import re
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from sim.atomic import write_parquet, write_text
from sim.errors import UserError
from sim.fmt import duration, percent, table
from sim.jitter import Jitter
from sim.resolve import from_scenario
from sim.runner import run_scenario
from sim.scenario import dump_resolved, load_scenario
from sim.sweep import EXECUTORS, _bar, _body_digest, tick

SEEDS_DIR = "seeds"
TABLE_FILE = "census.parquet"
AGGREGATE_FILE = "census.json"
FAILURES_FILE = "failures.json"
RECORD_FORMAT = "hicache-sim census record"
RECORD_VERSION = 1
AGGREGATE_FORMAT = "hicache-sim census"
MAX_SEED = 2**63 - 1  # the scenario schema's bound
MAX_SEEDS = 1_000_000  # a typo guard: every seed is a task and a file

# Verdicts the engine reports today, in the order tables and plots show them (from
# "nothing wrong" to "the server dies"). Counting never relies on this list: any
# other verdict a newer engine reports is counted too and shown after these.
KNOWN_VERDICTS = ("agree", "absorbed", "detected", "missed", "false_alarm", "hang",
                  "size_mismatch")

# divergence.json events a record keeps: (key, extra string fields besides t/step).
EVENTS = (("first_true_divergence", ()), ("digest_mismatch", ()),
          ("collective_error", ("kind",)), ("batch_mismatch", ("where",)))

DELAY_PERCENTILES = (50, 90, 99)
DIVERGENCE_PERCENTILES = (50, 90)
PERTURBATION_PREFIX = "perturbation_"
PERTURBATION_SUFFIX = "_count"

_FOLDER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")


# ----------------------------------------------------------------------------------
# The plan
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CensusPlan:
    """What a census runs: one validated scenario, its seeds, where records go."""

    scenario: object  # sim.scenario.Scenario, overrides applied
    source: str  # the scenario file as given
    overrides: tuple[str, ...]
    seeds: tuple[int, ...]
    digest: str  # of the resolved scenario with its seed set aside
    out: Path

    @property
    def name(self) -> str:
        return self.scenario.name

    @property
    def pinned_jitter_seed(self) -> int | None:
        """``jitter.seed`` when the scenario pins it: every seed then shares the jitter
        draws and only the workload varies."""
        return self.scenario.jitter.seed

    def record_path(self, seed: int) -> Path:
        return self.out / SEEDS_DIR / f"seed-{seed}.json"

    def task(self, seed: int) -> dict:
        # The scenario travels as the validated object (it pickles in a few KB), so a
        # worker does not parse and validate the YAML again for every seed. The
        # executors key results by "point_id".
        return {"point_id": _task_id(seed), "seed": seed, "scenario": self.scenario,
                "digest": self.digest, "record": str(self.record_path(seed))}


def _task_id(seed: int) -> str:
    return f"seed {seed}"


def default_out(scenario) -> Path:
    name = scenario.name
    if not _FOLDER_NAME.fullmatch(name):
        raise UserError(f"name: found {name!r}; expected a name of letters, digits, '_', '.' and "
                        "'-' for the default output folder (or pass -o DIR)",
                        where=scenario.source or "<scenario>")
    return Path("results") / "census" / name


def _seed_list(seeds, seed_start) -> tuple[int, ...]:
    def is_int(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if is_int(seeds):
        if not is_int(seed_start) or not 0 <= seed_start <= MAX_SEED:
            raise UserError(f"--seed-start: found {seed_start!r}; expected a seed from 0 to {MAX_SEED}")
        if not 1 <= seeds <= MAX_SEEDS:
            raise UserError(f"--seeds: found {seeds}; expected a number of seeds from 1 to {MAX_SEEDS:,}")
        if seed_start + seeds - 1 > MAX_SEED:
            raise UserError(f"--seeds: found seeds {seed_start}..{seed_start + seeds - 1}; expected "
                            f"the last seed at most {MAX_SEED}")
        return tuple(range(seed_start, seed_start + seeds))
    try:
        out = tuple(seeds)
    except TypeError:
        raise UserError(f"seeds: found {type(seeds).__name__} {seeds!r}; expected a number of seeds "
                        "or a list of seeds") from None
    if not out:
        raise UserError("seeds: found an empty list; expected at least one seed")
    if len(out) > MAX_SEEDS:
        raise UserError(f"seeds: found {len(out):,} seeds; expected at most {MAX_SEEDS:,}")
    for s in out:
        if not is_int(s) or not 0 <= s <= MAX_SEED:
            raise UserError(f"seeds: found {s!r}; expected seeds as ints from 0 to {MAX_SEED}")
    if len(set(out)) != len(out):
        dup = next(s for s in out if out.count(s) > 1)
        raise UserError(f"seeds: found seed {dup} twice; expected distinct seeds")
    return tuple(sorted(out))


# What a census writes into its folder (and, besides dot files, all it may hold).
CENSUS_ENTRIES = {SEEDS_DIR, TABLE_FILE, AGGREGATE_FILE, FAILURES_FILE, "census.png", "census.svg"}


def check_out(out: Path) -> Path:
    """``-o`` must be a new folder, an empty one or an earlier census's (to resume):
    a census writes several files and a ``seeds/`` folder in place, so it never
    writes beside someone else's files (as ``run`` never replaces another folder)."""
    where = str(out)
    if out.exists() and not out.is_dir():
        raise UserError("found a file; expected a census folder (a new one, or an earlier "
                        "census to resume)", where=where)
    if out.is_dir():
        try:
            names = {n for n in os.listdir(out) if not n.startswith(".")}
        except OSError as err:
            raise UserError(f"cannot list it ({err.strerror or err}); expected a readable "
                            "census folder", where=where) from None
        foreign = sorted(names - CENSUS_ENTRIES)
        if foreign:
            more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
            raise UserError(f"found a folder that is not a census folder (it holds "
                            f"{foreign[0]!r}{more}); expected a new folder or an earlier census "
                            "to resume", where=where)
        if SEEDS_DIR in names and not (out / SEEDS_DIR).is_dir():
            raise UserError(f"found a file {SEEDS_DIR!r}; expected the census's seeds folder",
                            where=str(out / SEEDS_DIR))
    return out


def plan_census(scenario, seeds, *, seed_start: int = 0, overrides: Iterable[str] = (),
                out=None) -> CensusPlan:
    """Validate everything a census needs before anything runs (one-line UserErrors).

    ``scenario`` is a scenario file path; ``seeds`` a count (seeds ``seed_start ..
    seed_start + seeds - 1``) or a list of seeds; ``overrides`` ``--set`` items.
    """
    overrides = tuple(overrides)
    seed_list = _seed_list(seeds, seed_start)
    scn = load_scenario(scenario, overrides)
    # The seed is the census's own axis, so the record key is the scenario without it
    # (and the seed, stored beside it). The comment header (version, capacities) is
    # not part of the digest, as in sweeps.
    digest = _body_digest(dump_resolved(scn.model_copy(update={"seed": 0})))
    return CensusPlan(scn, str(scenario), overrides, seed_list, digest,
                      check_out(Path(out) if out is not None else default_out(scn)))


# ----------------------------------------------------------------------------------
# Per-seed records
# ----------------------------------------------------------------------------------


def _num(x) -> float | None:
    """A finite float, or None (strict JSON has no NaN/inf; nor does a missing time)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def _int(x) -> int | None:
    return int(x) if isinstance(x, int) and not isinstance(x, bool) else None


def _str(x) -> str | None:
    return None if x is None else str(x)


def _perturbations(p) -> dict[str, int] | None:
    """``divergence["perturbations"]`` (name -> times it fired) as plain ints; None when
    the engine does not report it (older engines)."""
    if not isinstance(p, dict):
        return None
    out = {}
    for k, v in p.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[str(k)] = int(v)
    return out


def seed_record(divergence: dict, seed: int, digest: str) -> dict:
    """The part of one run's ``divergence.json`` a census keeps."""
    rec = {"format": RECORD_FORMAT, "version": RECORD_VERSION, "seed": seed,
           "scenario_digest": digest, "verdict": str(divergence["verdict"]),
           "halted": _str(divergence.get("halted")), "steps": _int(divergence.get("steps")),
           "detection_delay_s": _num(divergence.get("detection_delay_s")),
           "perturbations": _perturbations(divergence.get("perturbations"))}
    for key, extra in EVENTS:
        e = divergence.get(key)
        if isinstance(e, dict):
            rec[key] = {"t": _num(e.get("t")), "step": _int(e.get("step"))}
            rec[key].update({k: _str(e.get(k)) for k in extra})
        else:
            rec[key] = None
    return rec


def write_strict_json(path, obj) -> None:
    """Atomically, sorted keys, and no NaN (``allow_nan=False`` fails loudly instead)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


def read_record(plan: CensusPlan, seed: int) -> dict | None:
    """The seed's record when it is complete and for this scenario, else None."""
    try:
        rec = json.loads(plan.record_path(seed).read_text())
    except (OSError, ValueError):
        return None  # missing or unreadable (a write is atomic, so a hand edit): run it
    if (not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT
            or rec.get("version") != RECORD_VERSION or rec.get("seed") != seed
            or rec.get("scenario_digest") != plan.digest or not isinstance(rec.get("verdict"), str)):
        return None  # another scenario, another record version, or not a record
    return rec


def _simulate(scenario, seed: int) -> dict:
    """One run, no results folder; its divergence report."""
    if scenario.output.trace_out is not None:
        # Nothing is written, so do not collect the trace's events either.
        scenario = scenario.model_copy(update={
            "output": scenario.output.model_copy(update={"trace_out": None})})
    res = run_scenario(scenario, None, seed=seed)
    if res.partial:
        # The runner turns Ctrl-C into a partial result; a census must not record it.
        raise KeyboardInterrupt
    return res.divergence


def run_seed(task: dict) -> dict:
    """Run one seed and write its record; never raises for the run's own failure (the
    census records it and goes on). ``task`` is :meth:`CensusPlan.task`'s dict; the
    result has the shape ``sim.sweep``'s executors expect."""
    result = {"point_id": task["point_id"], "ok": False, "error": None, "traceback": None,
              "verdict": None, "halted": None}
    try:
        record = Path(task["record"])
        for tmp in record.parent.glob(f".{record.name}.*.tmp"):  # left by a killed write
            tmp.unlink(missing_ok=True)
        div = _simulate(task["scenario"], task["seed"])
        rec = seed_record(div, task["seed"], task["digest"])
        write_strict_json(record, rec)
        result.update(ok=True, verdict=rec["verdict"], halted=rec["halted"])
    except Exception as err:  # noqa: BLE001 - a seed's failure is data for failures.json
        result["error"] = " ".join(f"{type(err).__name__}: {err}".split())
        result["traceback"] = traceback.format_exc()
    return result


# ----------------------------------------------------------------------------------
# The table and the aggregate
# ----------------------------------------------------------------------------------

# (column, pandas dtype); nullable ints so a missing step stays missing, not NaN.
BASE_COLUMNS = (
    ("seed", "int64"), ("verdict", "string"), ("halted", "string"), ("steps", "Int64"),
    ("detection_delay_s", "float64"), ("digest_after_true_divergence", "bool"),
    ("first_true_divergence_t_s", "float64"), ("first_true_divergence_step", "Int64"),
    ("digest_mismatch_t_s", "float64"), ("digest_mismatch_step", "Int64"),
    ("collective_error_t_s", "float64"), ("collective_error_step", "Int64"),
    ("collective_error_kind", "string"),
    ("batch_mismatch_t_s", "float64"), ("batch_mismatch_step", "Int64"),
    ("batch_mismatch_where", "string"),
)
# Each column's unit (sim.units), in census.parquet's metadata: times are simulated
# seconds, steps count scheduler steps; perturbation_<name>_count columns are counts.
BASE_UNITS = {
    "seed": "id", "verdict": "text", "halted": "text", "steps": "1", "detection_delay_s": "s",
    "digest_after_true_divergence": "bool",
    "first_true_divergence_t_s": "s", "first_true_divergence_step": "1",
    "digest_mismatch_t_s": "s", "digest_mismatch_step": "1",
    "collective_error_t_s": "s", "collective_error_step": "1", "collective_error_kind": "text",
    "batch_mismatch_t_s": "s", "batch_mismatch_step": "1", "batch_mismatch_where": "text",
}


def table_units(table) -> dict:
    """The unit of every column of a census table (a column missing here is a bug that
    ``write_parquet`` reports)."""
    units = dict(BASE_UNITS)
    units.update({c: "1" for c in table.columns if c.startswith(PERTURBATION_PREFIX)})
    return units


def _row(rec: dict, names: list[str]) -> dict:
    row = {"seed": rec["seed"], "verdict": rec["verdict"], "halted": rec.get("halted"),
           "steps": rec.get("steps"), "detection_delay_s": rec.get("detection_delay_s")}
    for key, extra in EVENTS:
        e = rec.get(key) or {}
        row[f"{key}_t_s"] = e.get("t")
        row[f"{key}_step"] = e.get("step")
        for k in extra:
            row[f"{key}_{k}"] = e.get(k)
    t_true, t_dig = row["first_true_divergence_t_s"], row["digest_mismatch_t_s"]
    # The engine's own test for a real (not false-alarm) detection: the trees differed
    # no later than the digest did.
    row["digest_after_true_divergence"] = t_true is not None and t_dig is not None and t_dig >= t_true
    pert = rec.get("perturbations")
    for n in names:
        # A perturbation dict counts firings, so a name another seed lists fired zero
        # times here; a record without the dict (an older engine) knows nothing.
        row[f"{PERTURBATION_PREFIX}{n}{PERTURBATION_SUFFIX}"] = None if pert is None else pert.get(n, 0)
    return row


def build_table(records: Sequence[dict]):
    """One row per record, in seed order; fixed columns and dtypes (an empty census
    gives an empty table with the same schema)."""
    import pandas as pd  # here, not at the top: importing the module stays light (pandas is slow to load)

    records = sorted(records, key=lambda r: r["seed"])
    names = sorted({n for r in records for n in (r.get("perturbations") or {})})
    rows = [_row(r, names) for r in records]
    columns = list(BASE_COLUMNS) + [(f"{PERTURBATION_PREFIX}{n}{PERTURBATION_SUFFIX}", "Int64")
                                    for n in names]
    data = {}
    for col, dtype in columns:
        values = [r[col] for r in rows]
        if dtype == "float64":
            values = [math.nan if v is None else v for v in values]
        data[col] = pd.Series(values, dtype=dtype)
    return pd.DataFrame(data, columns=[c for c, _ in columns])


def verdict_order(verdicts: Iterable[str]) -> list[str]:
    """Known verdicts in their order, then any others alphabetically."""
    present = set(verdicts)
    return [v for v in KNOWN_VERDICTS if v in present] + sorted(present - set(KNOWN_VERDICTS))


def _quantiles(values, percentiles, with_max: bool) -> dict:
    """n and percentiles of ``values``; null when there are none.

    Percentiles are inverted-CDF (the smallest value with at least p% of the seeds at
    or below it): always a delay some seed really had, and the point where the step
    CDF in the figure crosses p. With 20 seeds, interpolating would invent values
    between two seeds (and p99 is then simply the max)."""
    v = np.sort(np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float))
    out: dict = {"n": int(len(v))}
    for p in percentiles:
        out[f"p{p}"] = float(np.quantile(v, p / 100, method="inverted_cdf")) if len(v) else None
    if with_max:
        out["max"] = float(v[-1]) if len(v) else None
    return out


def seed_ranges(seeds: Iterable[int]) -> str:
    """Seeds as compact runs: ``0-3, 5, 7-9``."""
    out, run = [], []
    for s in sorted(set(int(x) for x in seeds)):
        if run and s == run[-1] + 1:
            run.append(s)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
        run = [s]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
    return ", ".join(out)


def _group_stats(table, label: str, total: int) -> dict:
    counted = table[table["digest_after_true_divergence"]]
    n = len(table)
    return {
        "verdict": label,
        "seeds": int(n),
        "share": (n / total) if total else None,
        # Which seeds: what `repro --seed N` (or `run --seed N`) needs to replay one.
        "seed_list": sorted(int(s) for s in table["seed"].tolist()),
        # Over the seeds where the digest fired after a true divergence: how long the
        # ranks ran with different trees before SGLang's assertion noticed.
        "detection_delay_s": _quantiles(counted["detection_delay_s"].tolist(),
                                        DELAY_PERCENTILES, with_max=True),
        "first_true_divergence_t_s": _quantiles(table["first_true_divergence_t_s"].dropna().tolist(),
                                                DIVERGENCE_PERCENTILES, with_max=False),
    }


def aggregate(table, plan: CensusPlan, failed: Sequence[int] = ()) -> dict:
    """census.json: per verdict (ordered) and over all seeds."""
    total = len(table)
    order = verdict_order(table["verdict"].tolist())
    rows = [_group_stats(table[table["verdict"] == v], v, total) for v in order]
    cols = [c for c in table.columns if c.startswith(PERTURBATION_PREFIX)]
    perturbations = None
    if cols:
        perturbations = {}
        for c in cols:
            counts = table[c].dropna().astype(int).tolist()
            name = c[len(PERTURBATION_PREFIX):-len(PERTURBATION_SUFFIX)]
            perturbations[name] = {
                "seeds_reporting": len(counts), "seeds_fired": sum(1 for x in counts if x > 0),
                "total": int(sum(counts)),
                "mean_per_seed": (sum(counts) / len(counts)) if counts else None}

    cfg, _ = from_scenario(plan.scenario)
    return {
        "format": AGGREGATE_FORMAT, "version": RECORD_VERSION,
        "scenario": plan.name, "scenario_file": plan.source, "overrides": list(plan.overrides),
        "scenario_digest": plan.digest, "tp": plan.scenario.tp,
        "perturbations_configured": Jitter(cfg.jitter, cfg.tp, cfg.seed).perturbations.configured,
        "jitter_seed_pinned": plan.pinned_jitter_seed,
        "seeds": {"count": len(plan.seeds), "first": plan.seeds[0], "last": plan.seeds[-1]},
        "completed": total, "failed_seeds": sorted(failed),
        "verdict_order": order, "verdicts": rows, "all": _group_stats(table, "all", total),
        "perturbations": perturbations,
        "notes": ("percentiles: inverted CDF (a value some seed had); detection_delay_s over the seeds "
                  "whose digest mismatch came at or after their first true divergence; "
                  "times are simulated seconds"),
    }


# ----------------------------------------------------------------------------------
# The console table
# ----------------------------------------------------------------------------------


def format_table(agg: dict) -> str:
    """The aggregate as plain aligned text (``sim.fmt.table``; ``rich`` is not a
    dependency). Times are simulated, shown in ms, s, min or h (``sim.fmt.duration``)."""
    header = ["verdict", "seeds", "share", "delay n", "p50", "p90", "p99", "max",
              "1st div n", "p50", "p90"]
    lines = []
    for row in agg["verdicts"] + [agg["all"]]:
        d, f = row["detection_delay_s"], row["first_true_divergence_t_s"]
        lines.append([row["verdict"], str(row["seeds"]), percent(row["share"]),
                      str(d["n"]), duration(d["p50"]), duration(d["p90"]), duration(d["p99"]),
                      duration(d["max"]), str(f["n"]), duration(f["p50"]), duration(f["p90"])])
    s = agg["seeds"]
    title = (f"census {agg['scenario']}: seeds {s['first']}..{s['last']} ({s['count']}), "
             f"{agg['completed']} completed")
    if agg["failed_seeds"]:
        title += f", {len(agg['failed_seeds'])} failed"
    out = [title, table(header, lines[:-1], footer=lines[-1:])]
    out.append("delay: digest mismatch minus first true divergence (seeds where the digest "
               "fired after one); 1st div: time of the first true divergence; simulated time")
    if agg.get("perturbations"):
        fired = ", ".join(f"{k} {v['total']} in {v['seeds_fired']}/{v['seeds_reporting']} seeds"
                          for k, v in agg["perturbations"].items())
        out.append(f"perturbations fired: {fired}")
    if agg["verdicts"]:
        width = max(len(row["verdict"]) for row in agg["verdicts"])
        out.append("seeds by verdict (`run --seed N` or `repro --seed N` replays one):")
        out += [f"  {row['verdict']:<{width}}  {seed_ranges(row.get('seed_list', []))}"
                for row in agg["verdicts"]]
    return "\n".join(out)


# ----------------------------------------------------------------------------------
# Running a census
# ----------------------------------------------------------------------------------


@dataclass
class CensusOutcome:
    """What :func:`run_census` did."""

    out: Path
    table: object  # pandas.DataFrame, as in census.parquet
    aggregate: dict  # as in census.json
    ran: list[int] = field(default_factory=list)  # seeds simulated now
    skipped: list[int] = field(default_factory=list)  # seeds whose record was already there
    failures: list[dict] = field(default_factory=list)  # as in failures.json
    files: list[Path] = field(default_factory=list)  # aggregate files written


def run_census(plan: CensusPlan, *, jobs: int | None = None, executor: str = "local",
               address: str | None = None, progress: bool = False,
               plots: bool = True) -> CensusOutcome:
    """Run every seed without a current record, then write the table, the aggregate
    and (``plots``) the figure."""
    if executor not in EXECUTORS:
        raise UserError(f"--executor: found {executor!r}; expected one of {', '.join(EXECUTORS)}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise UserError(f"--jobs: found {jobs!r}; expected a positive number of parallel seeds")
    if address is not None and executor != "ray":
        raise UserError("--address: found an address with --executor local; expected it only "
                        "with --executor ray")
    jobs = jobs or os.cpu_count() or 1
    plan.out.mkdir(parents=True, exist_ok=True)
    todo = [s for s in plan.seeds if read_record(plan, s) is None]
    skipped = sorted(set(plan.seeds) - set(todo))
    ran: list[int] = []
    failures: list[dict] = []
    bar = _bar(len(plan.seeds), len(skipped), progress, desc="census", unit="seed")
    seed_of = {_task_id(s): s for s in todo}

    def done(result: dict) -> None:
        seed = seed_of[result["point_id"]]
        if result["ok"]:
            ran.append(seed)
        else:
            failures.append({"seed": seed, "error": result["error"],
                             "traceback": result.get("traceback")})
        tick(bar, failures)

    try:
        if todo:
            tasks = [plan.task(s) for s in todo]
            if executor == "local" and jobs == 1:
                for t in tasks:  # in this process: a pool would only add start-up time
                    done(run_seed(t))
            else:
                EXECUTORS[executor](tasks, done, jobs, address, fn=run_seed)
    finally:
        if bar is not None:
            bar.close()
    failures.sort(key=lambda f: f["seed"])
    write_strict_json(plan.out / FAILURES_FILE, failures)
    records = [r for r in (read_record(plan, s) for s in plan.seeds) if r is not None]
    table = build_table(records)
    agg = aggregate(table, plan, [f["seed"] for f in failures])
    write_parquet(plan.out / TABLE_FILE, table, table_units(table))
    write_strict_json(plan.out / AGGREGATE_FILE, agg)
    files = [plan.out / TABLE_FILE, plan.out / AGGREGATE_FILE]
    if plots:
        from reports.census import plot_census  # matplotlib: only when plotting

        files += plot_census(plan.out)
    return CensusOutcome(plan.out, table, agg, sorted(ran), skipped, failures, files)


def census(scenario, seeds, *, seed_start: int = 0, overrides: Iterable[str] = (), out=None,
           jobs: int | None = 1, executor: str = "local", address: str | None = None,
           plots: bool = True, progress: bool = False,
           warn: Callable[[str], None] | None = None):
    """Run (or resume) a census and return its table (a pandas DataFrame, one row per
    completed seed, as in census.parquet); ``table.attrs`` holds ``aggregate`` (as in
    census.json), ``out``, ``ran``, ``skipped`` and ``failures``.

    ``scenario``: a scenario file; ``seeds``: a count (from ``seed_start``) or a list;
    ``overrides``: ``--set`` items; ``out``: the census folder (default
    ``results/census/<scenario name>``). A pinned ``jitter.seed`` is reported through
    ``warn`` (default :func:`warnings.warn`). Bad input raises ``UserError``.
    """
    plan = plan_census(scenario, seeds, seed_start=seed_start, overrides=overrides, out=out)
    if plan.pinned_jitter_seed is not None:
        message = pinned_warning(plan)
        if warn is None:
            warnings.warn(message, stacklevel=2)
        else:
            warn(message)
    res = run_census(plan, jobs=jobs, executor=executor, address=address, progress=progress,
                     plots=plots)
    table = res.table.copy()
    table.attrs.update(aggregate=res.aggregate, out=str(res.out), ran=res.ran,
                       skipped=res.skipped, failures=res.failures)
    return table


def pinned_warning(plan: CensusPlan) -> str:
    return (f"{plan.source}: jitter.seed is pinned to {plan.pinned_jitter_seed}, so every seed "
            "shares the same jitter draws (only the workload varies); remove it to vary both")
