"""Parameter sweeps: many runs of one or more base scenarios, resumable, in parallel.

A sweep file names a base scenario (``base:``, or several as a dimension ``bases:``),
overrides applied to every point (``set:``), a cartesian ``grid:`` and/or a ``zip:``
of equal-length lists of values keyed by scenario key paths (the same paths as
``--set``), and ``seeds:``::

    name: capacity
    base: quickstart.yaml             # the sweep's folder, then scenarios/ (no ..)
    set: {workload.num_requests: 200}
    grid: {host.ratio: [1.0, 2.0]}
    zip:
      cache.write_policy: [write_through, write_back]
      cache.host_policy:  [lru, duplicate_first]
    seeds: [1, 2]                     # or {count: 2, start: 1}

Points are expanded in a fixed order (bases, then the grid in file order with the
last key varying fastest, then the zip, then seeds) and every one is validated
against the scenario schema before anything runs. A point is one (overrides, seed);
its id is a short hash of the base as written, the overrides and the seed, so it
does not change when the sweep file grows, and its results folder is
``OUT/points/<id>/`` (an ordinary ``hicache-sim run`` folder).

Resume: the runner writes ``meta.json`` last, so a point folder whose ``meta.json``
says ``partial: false`` and whose resolved scenario is the one asked for is done and
skipped; anything else (killed mid-write, interrupted, or a base scenario edited
since) runs again. Points run in worker processes (``local``) or Ray tasks (``ray``),
both calling :func:`run_point` (``sim.census`` runs its seeds through the same
executors with its own task function); a Python exception in one point is recorded in
``OUT/failures.json`` and the others keep going (a divergence halt is a result, not
a failure). Afterwards :func:`gather` writes ``OUT/sweep.parquet``: one row per
point with the swept key paths as columns, ``seed``, ``point_id``, ``results_dir``
and every field of the point's ``summary.json``.
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
import json
import logging
import math
import multiprocessing
import os
import re
import reprlib
import signal
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from sim import safeio, yamlio
from sim.analysis.bound import bound_for_scenario, write_bound
from sim.atomic import write_json, write_parquet, write_text
from sim.errors import UserError
from sim.fmt import duration, percent, table as text_table
from sim.paths import PathRejected, REPO_ROOT, resolve_input
from sim.resultsdir import FolderLock
from sim.runner import run_scenario
from sim.scenario import (
    _key_lines,
    dump_resolved,
    load_scenario,
    more_errors,
    resolve_capacities,
)
from sim.units import guess_unit

POINTS_DIR = "points"
SWEEP_TABLE = "sweep.parquet"
FAILURES_FILE = "failures.json"
SWEEP_COPY = "sweep.yaml"
ID_LENGTH = 12  # hex digits of sha256: collisions are negligible for any real sweep
# Typo guards, like census's: every point is validated up front (about 10 ms each, so
# --dry-run on 10,000 points takes a couple of minutes), then is a task and a folder.
MAX_POINTS = 10_000
MAX_SEEDS = 10_000
RAY_OBJECT_STORE_BYTES = 128 << 20

# ----------------------------------------------------------------------------------
# The sweep file schema
# ----------------------------------------------------------------------------------

_repr = reprlib.Repr()
_repr.maxstring, _repr.maxother, _repr.maxlist, _repr.maxdict, _repr.maxlevel = 60, 60, 6, 6, 2


def _show(v) -> str:
    """A short one-line repr of a found value."""
    return _repr.repr(v).replace("\n", "\\n").replace("\r", "\\r")


def _err(found: str, expected: str, sub: tuple = ()) -> PydanticCustomError:
    """'found X; expected Y', with ``sub`` the key path below the field that raised it."""
    return PydanticCustomError("sweep", "found {found}; expected {expected}",
                               {"found": found, "expected": expected, "sub": list(sub)})


_PLAIN = (str, int, float, bool, type(None))


def _check_value(v, sub: tuple):
    """Values must be what a scenario file can hold: no dates, binary or sets (YAML
    tags safe_load still builds), no inf/nan."""
    if isinstance(v, float) and not math.isfinite(v):
        raise _err(_show(v), "a finite number", sub)
    if isinstance(v, _PLAIN):
        return
    if isinstance(v, list):
        for i, x in enumerate(v):
            _check_value(x, sub + (str(i),))
        return
    if isinstance(v, dict):
        for k, x in v.items():
            if not isinstance(k, str):
                raise _err(f"key {_show(k)}", "string keys", sub)
            _check_value(x, sub + (k,))
        return
    kind = "a date" if isinstance(v, (datetime.date, datetime.datetime)) else f"a {type(v).__name__}"
    raise _err(f"{kind} {_show(v)}", "a number, string, boolean, null, list or mapping", sub)


_KEY_RE = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\Z")


def _check_key(key, where: tuple) -> str:
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise _err(f"key {_show(key)}", "a dotted scenario key path like host.ratio", where)
    if key == "seed":
        raise _err("key 'seed'", "seeds in the top-level 'seeds:' list", where)
    return key


class SweepSpec(BaseModel):
    """A sweep file, validated (``extra="forbid"``: a misspelt key is an error)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str | None = None  # names the default output folder: results/sweeps/<name>
    description: str = ""
    base: str | None = None
    bases: list[str] | None = Field(default=None, min_length=1)
    set_: dict[str, Any] = Field(default_factory=dict, alias="set")
    grid: dict[str, Any] = Field(default_factory=dict)
    zip_: dict[str, Any] = Field(default_factory=dict, alias="zip")
    seeds: list[int] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if v is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}", v):
            raise _err(_show(v), "a name of letters, digits, '_', '.' and '-' (a folder name)")
        return v

    @field_validator("set_")
    @classmethod
    def _set(cls, v: dict) -> dict:
        for key, value in v.items():
            _check_key(key, (key,))
            _check_value(value, (key,))
        return v

    @field_validator("grid", "zip_")
    @classmethod
    def _lists(cls, v: dict) -> dict:
        for key, values in v.items():
            _check_key(key, (key,))
            if not isinstance(values, list) or not values:
                raise _err(_show(values), "a non-empty list of values", (key,))
            if len(values) > MAX_POINTS:
                raise _err(f"{len(values):,} values", f"at most {MAX_POINTS:,} (a sweep's points)", (key,))
            for i, value in enumerate(values):
                _check_value(value, (key, str(i)))
        return v

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds(cls, v):
        if v is None:
            return None
        if isinstance(v, dict):
            form = "{count: N, start: S}"
            for k in v:
                if k not in ("count", "start"):
                    raise _err(f"unknown key {_show(k)}", form, (str(k),))
            if "count" not in v:
                raise _err("no 'count'", form, ("count",))
            for k, lo, hi in (("count", 1, MAX_SEEDS), ("start", 0, 2**63 - 1 - MAX_SEEDS)):
                x = v.get(k, 0)
                if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
                    raise _err(_show(x), f"an int from {lo} to {hi} ({form})", (k,))
            return list(range(v.get("start", 0), v.get("start", 0) + v["count"]))
        expected = "a list of seeds (ints >= 0) or {count: N, start: S}"
        if not isinstance(v, list) or not v:
            raise _err(_show(v), expected)
        for i, s in enumerate(v):
            if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**63:
                raise _err(_show(s), "a seed: an int >= 0", (str(i),))
        seen = set()
        for i, s in enumerate(v):
            if s in seen:
                raise _err(f"seed {s} twice", "distinct seeds", (str(i),))
            seen.add(s)
        if len(v) > MAX_SEEDS:
            raise _err(f"{len(v)} seeds", f"at most {MAX_SEEDS}")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        if (self.base is None) == (self.bases is None):
            raise _err("both base and bases" if self.base else "neither base nor bases",
                       "exactly one of base (a scenario path) and bases (a list of them)", ("base",))
        for i, b in enumerate(self.bases or [self.base]):
            if not isinstance(b, str) or not b.strip() or "\x00" in b:
                raise _err(_show(b), "a path to a scenario YAML", ("bases", str(i)) if self.bases else ("base",))
        if self.bases and len(set(self.bases)) != len(self.bases):
            dup = next(b for b in self.bases if self.bases.count(b) > 1)
            raise _err(f"{dup!r} twice", "distinct base scenarios", ("bases",))
        sections = {"set": self.set_, "grid": self.grid, "zip": self.zip_}
        owner: dict[str, str] = {}
        for section, keys in sections.items():
            for key in keys:
                if key in owner:
                    raise _err(f"{key!r} in both {owner[key]} and {section}",
                               "each key path in only one of set, grid, zip", (section, key))
                owner[key] = section
        lengths = {k: len(v) for k, v in self.zip_.items()}
        if len(set(lengths.values())) > 1:
            first = next(iter(lengths))
            bad = next(k for k, n in lengths.items() if n != lengths[first])
            raise _err(f"{lengths[bad]} values for {bad!r} but {lengths[first]} for {first!r}",
                       "lists of equal length in zip", ("zip", bad))
        return self


# ----------------------------------------------------------------------------------
# Points
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One run of a sweep: a base scenario, its overrides and a seed."""

    index: int
    point_id: str
    base: str  # as written in the sweep file
    base_path: str  # absolute
    overrides: tuple[tuple[str, Any], ...]  # (key path, value), applied in this order
    seed: int
    params: dict  # column -> value: base (when several), then set, grid, zip keys
    where: dict = field(repr=False, compare=False)  # key path -> (section, value index)
    workload_kind: str = ""
    scenario_digest: str = ""  # hash of the resolved scenario (minus its comment header)
    trace_roots: tuple = ()

    @property
    def results_dir(self) -> str:
        """The point's results folder, relative to the sweep's output folder."""
        return f"{POINTS_DIR}/{self.point_id}"

    def override_args(self) -> list[str]:
        """The overrides as ``--set`` strings (``seed=N`` last)."""
        return [f"{k}={_yaml_text(v)}" for k, v in self.overrides] + [f"seed={self.seed}"]

    def describe(self) -> str:
        parts = [f"{k}={_yaml_text(v)}" for k, v in self.params.items()]
        return " ".join(parts + [f"seed={self.seed}"])

    def task(self, out: Path) -> dict:
        """What a worker needs to run this point: plain data, cheap to ship."""
        return {"point_id": self.point_id, "base": self.base_path,
                "overrides": self.override_args(), "out_dir": str(Path(out, self.results_dir).resolve()),
                "trace_roots": [str(r) for r in self.trace_roots]}


@dataclass
class SweepPlan:
    """A validated, expanded sweep file."""

    path: Path
    name: str
    spec: SweepSpec
    points: list[Point]
    param_columns: list[str]
    text: str  # the sweep file as read
    trace_roots: tuple = ()  # --trace-root folders, passed to every point


def _yaml_text(v) -> str:
    """A value as one-line YAML that ``yaml.safe_load`` reads back as the same value."""
    text = yaml.safe_dump(v, default_flow_style=True, width=1 << 30, sort_keys=False,
                          allow_unicode=True)
    if text.endswith("\n...\n"):
        text = text[: -len("\n...\n")]
    return text.rstrip("\n")


def point_id(base: str, overrides, seed: int) -> str:
    """The point's stable id: a short hash of the base (as written), overrides and seed."""
    canon = json.dumps({"base": base, "overrides": [[k, v] for k, v in overrides], "seed": seed},
                       sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canon.encode()).hexdigest()[:ID_LENGTH]


def _body_digest(resolved_text: str) -> str:
    """Hash of a resolved scenario without its comment header (the version line)."""
    lines = resolved_text.splitlines(keepends=True)
    body = "".join(itertools.dropwhile(lambda ln: ln.startswith("#"), lines))
    return hashlib.sha256(body.encode()).hexdigest()


# ----------------------------------------------------------------------------------
# Loading and expanding
# ----------------------------------------------------------------------------------


def load_sweep(path, trace_roots=()) -> SweepPlan:
    """Read, validate and expand a sweep file; every point's scenario is validated.

    Every problem is one :class:`UserError` line naming the sweep file (and line)
    or the base scenario file, the key path, what was found and what was expected.
    """
    path = Path(path)
    where = str(path)
    text = safeio.read_text(path, "a sweep YAML", safeio.LIMIT_YAML)
    # Duplicate keys, huge integers and alias bombs are refused here (sim.yamlio), so
    # no later walk (_check_value, pydantic) ever sees an exploding value.
    data = yamlio.load(text, where, "a sweep mapping")
    keys = ", ".join(f.alias or n for n, f in SweepSpec.model_fields.items())
    if not isinstance(data, dict):
        found = "an empty file" if data is None else f"a YAML {type(data).__name__}"
        raise UserError(f"found {found}; expected a mapping of sweep keys ({keys})", where=where)
    lines = _key_lines(text)
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise _spec_error(err, lines, where) from None
    except RecursionError:
        raise UserError("found data nested too deep; expected a sweep mapping", where=where) from None
    plan = _expand(path, spec, lines, tuple(str(Path(r).resolve()) for r in trace_roots))
    plan.text = text
    return plan


def _line_of(lines: dict, parts: tuple) -> int | None:
    for n in range(len(parts), 0, -1):
        if parts[:n] in lines:
            return lines[parts[:n]]
    return None


def _spec_error(err: ValidationError, lines: dict, where: str) -> UserError:
    """The sweep-schema error that comes first in the file, as one line."""
    ranked = []
    errors = err.errors(include_url=False)
    aliases = {"set_": "set", "zip_": "zip"}
    for order, e in enumerate(errors):
        loc = [aliases.get(p, p) for p in e["loc"] if isinstance(p, (str, int))]
        ctx = e.get("ctx") or {}
        typ = e["type"]
        if typ == "sweep":
            parts = tuple(str(p) for p in loc if p != "__root__") + tuple(ctx.get("sub") or ())
            found, expected = ctx["found"], ctx["expected"]
        elif typ == "extra_forbidden":
            parts = tuple(str(p) for p in loc)
            fields = [f.alias or n for n, f in SweepSpec.model_fields.items()]
            found, expected = f"unknown key {parts[-1]!r}", f"one of {', '.join(fields)}"
        else:
            parts = tuple(str(p) for p in loc)
            msg = str(e.get("msg", ""))
            for prefix in ("Value error, ", "Input should be ", "input should be "):
                if msg.startswith(prefix):
                    msg = msg[len(prefix):]
            found, expected = _show(e.get("input")), msg
        line = _line_of(lines, parts)
        ranked.append(((line if line is not None else 1 << 30, order), parts, found,
                       expected, line))
    ranked.sort(key=lambda r: r[0])
    _, parts, found, expected, line = ranked[0]
    key = ".".join(parts) or "(top level)"
    rest = [f"{'.'.join(p) or '(top level)'}: found {f}; expected {x}"
            + (f" (line {ln})" if ln is not None and ln != line else "")
            for _, p, f, x, ln in ranked[1:]]

    tail = more_errors(rest)
    return UserError(" ".join(f"{key}: found {found}; expected {expected}{tail}".split()),
                     where=f"{where}:{line}" if line is not None else where)


def base_roots(sweep_path: Path, trace_roots=()) -> list[Path]:
    """Where a sweep's base scenarios may be: the sweep file's folder, the repository's
    ``scenarios/`` folder, then ``--trace-root`` folders (``sim.paths``)."""
    roots = [sweep_path.resolve().parent, REPO_ROOT / "scenarios", *map(Path, trace_roots)]
    return list(dict.fromkeys(Path(os.path.abspath(r)) for r in roots))


def _expand(path: Path, spec: SweepSpec, lines: dict, trace_roots: tuple = ()) -> SweepPlan:
    where = str(path)
    bases = spec.bases or [spec.base]
    base_paths = []
    roots = base_roots(path, trace_roots)
    for i, base in enumerate(bases):
        sub = ("bases", str(i)) if spec.bases else ("base",)
        try:
            p = resolve_input(base, roots, "a base scenario YAML", file=True)
        except PathRejected as e:
            line = _line_of(lines, sub)
            raise UserError(f"{'.'.join(sub)}: found {e.found}; expected {e.expected}",
                            where=f"{where}:{line}" if line else where) from None
        base_paths.append(str(p))
    seeds_given = spec.seeds is not None
    n_grid = math.prod(len(v) for v in spec.grid.values())
    n_zip = len(next(iter(spec.zip_.values()))) if spec.zip_ else 1
    n_points = len(bases) * n_grid * n_zip * (len(spec.seeds) if seeds_given else 1)
    if n_points > MAX_POINTS:
        section = "grid" if spec.grid else "zip" if spec.zip_ else "seeds" if seeds_given else "bases"
        line = _line_of(lines, (section,))
        raise UserError(f"{section}: found {n_points:,} points (bases x grid x zip x seeds); "
                        f"expected at most {MAX_POINTS:,}",
                        where=f"{where}:{line}" if line else where)

    where_of: dict[str, tuple[str, int | None]] = {k: ("set", None) for k in spec.set_}
    grid_keys, zip_keys = list(spec.grid), list(spec.zip_)
    points: list[Point] = []
    ids: dict[str, Point] = {}
    for base, base_path in zip(bases, base_paths):
        # a broken base names its own file and line
        base_scenario = load_scenario(base_path, trace_roots=trace_roots)
        seeds = spec.seeds if seeds_given else [base_scenario.seed]
        for gvals in itertools.product(*(list(enumerate(spec.grid[k])) for k in grid_keys)):
            for zi in range(n_zip):
                overrides = list(spec.set_.items())
                where_pt = dict(where_of)
                for k, (gi, v) in zip(grid_keys, gvals):
                    overrides.append((k, v))
                    where_pt[k] = ("grid", gi)
                for k in zip_keys:
                    overrides.append((k, spec.zip_[k][zi]))
                    where_pt[k] = ("zip", zi)
                params = ({"base": base} if spec.bases else {}) | dict(overrides)
                for seed in seeds:
                    pid = point_id(base, overrides, seed)
                    pt = Point(len(points), pid, base, base_path, tuple(overrides), seed, params, where_pt,
                               trace_roots=trace_roots)
                    if pid in ids:
                        raise UserError(f"found the point {pt.describe()} twice (also point "
                                        f"{ids[pid].index}); expected distinct values in grid and zip",
                                        where=where)
                    scenario = _validate_point(pt, where, lines)
                    pt = Point(pt.index, pid, base, base_path, pt.overrides, seed, params, where_pt,
                               _workload_kind(scenario), _body_digest(dump_resolved(scenario)),
                               trace_roots)
                    ids[pid] = pt
                    points.append(pt)
    columns = (["base"] if spec.bases else []) + list(spec.set_) + grid_keys + zip_keys
    name = spec.name or path.stem
    return SweepPlan(path, name, spec, points, columns, "", trace_roots)


def _workload_kind(scenario) -> str:
    return str(getattr(scenario.workload, "kind", ""))


def _validate_point(pt: Point, where: str, lines: dict):
    """Load the point's scenario; a bad key or value is reported at its sweep-file line."""
    try:
        return load_scenario(pt.base_path, pt.override_args(), trace_roots=pt.trace_roots)
    except UserError as err:
        inner = str(err)
        if err.where and inner.startswith(f"{err.where}: "):
            inner = inner[len(err.where) + 2:]
        message, line = None, None
        for key, (section, idx) in pt.where.items():
            if err.where == f"--set {key}":  # an unknown key path
                message, line = f"{section}.{key}: {inner}", _line_of(lines, (section, key))
            elif err.where and err.where.endswith(f"(--set {key})"):  # a bad value
                parts = (section, key) if idx is None else (section, key, str(idx))
                message, line = f"{section}.{inner}", _line_of(lines, parts)
            else:
                continue
            break
        if message is None:  # not one key's fault (a cross-field check in the base)
            raise UserError(f"point {pt.describe()}: {err}", where=where) from None
        raise UserError(" ".join(f"{message} (in base {pt.base})".split()),
                        where=f"{where}:{line}" if line else where) from None


# ----------------------------------------------------------------------------------
# Point state
# ----------------------------------------------------------------------------------


def point_status(point: Point, out) -> str:
    """``done`` (complete and current), ``stale`` (complete, for another scenario),
    ``partial`` (interrupted run) or ``todo`` (never finished: no ``meta.json``)."""
    folder = Path(out, point.results_dir)
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (FileNotFoundError, NotADirectoryError):
        return "todo"
    except (OSError, ValueError):
        return "todo"  # unreadable: run it again
    if not isinstance(meta, dict) or meta.get("partial", True):
        return "partial"
    try:
        resolved = (folder / "scenario.yaml").read_text()
    except OSError:
        return "todo"
    return "done" if _body_digest(resolved) == point.scenario_digest else "stale"


# ----------------------------------------------------------------------------------
# Running one point (in a worker process or a Ray task)
# ----------------------------------------------------------------------------------


def run_point(task: dict) -> dict:
    """Run one sweep point and write its results folder; never raises for the point's
    own failure (the sweep records it and goes on).

    ``task`` is :meth:`Point.task`'s plain dict, so the same function serves process
    pools and Ray. Returns ``{point_id, ok, error, traceback, verdict, halted}``.
    """
    out = Path(task["out_dir"])
    result = {"point_id": task["point_id"], "ok": False, "error": None, "traceback": None,
              "verdict": None, "halted": None}
    try:
        out.mkdir(parents=True, exist_ok=True)
        # The folder is incomplete until the runner writes meta.json again (it also
        # does this, but only after simulating: a run that raises must not leave an
        # earlier meta.json behind).
        (out / "meta.json").unlink(missing_ok=True)
        for tmp in out.glob(".*.tmp"):  # left by a killed atomic write
            tmp.unlink(missing_ok=True)
        scenario = load_scenario(task["base"], task["overrides"], trace_roots=task.get("trace_roots", ()))
        res = run_scenario(scenario, out)
        if res.partial:
            result["error"] = "interrupted (meta.json says partial: true)"
        else:
            result.update(ok=True, verdict=res.divergence.get("verdict"),
                          halted=res.divergence.get("halted"))
    except Exception as err:  # noqa: BLE001 - a point's failure is data for failures.json
        result["error"] = " ".join(f"{type(err).__name__}: {err}".split())
        result["traceback"] = traceback.format_exc()
    return result


def _worker_init(parent_pid: int | None = None) -> None:
    """Pool worker set-up: ignore Ctrl-C, and die with the parent.

    Ctrl-C goes to the whole process group; the parent decides what to do (stop
    the pool), so workers must not die mid-write with their own traceback. A parent
    killed outright (SIGKILL, OOM) runs no clean-up, so each worker asks the kernel
    for SIGTERM when its parent dies (Linux ``PR_SET_PDEATHSIG``) instead of living
    on as an orphan; a parent already gone by then ends the worker at once.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent_pid is None or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(1)


_ignore_sigint = _worker_init  # the former name


# ----------------------------------------------------------------------------------
# Executors: each runs tasks and calls ``done(result)`` as they finish
# ----------------------------------------------------------------------------------


def _failed(task: dict, err: BaseException) -> dict:
    """The result of a task whose worker died (the task's own function never returns)."""
    return {"point_id": task["point_id"], "ok": False,
            "error": " ".join(f"{type(err).__name__}: {err}".split()) or type(err).__name__,
            "traceback": "".join(traceback.format_exception(err)), "verdict": None, "halted": None}


def _run_local(tasks: list[dict], done: Callable[[dict], None], workers: int, address,
               fn: Callable[[dict], dict] = run_point) -> None:
    """A spawn-context process pool: fresh interpreters, no state shared with the parent.

    ``fn`` (a module-level function, so workers can import it) runs one task: a dict
    with a ``point_id``; it returns a result dict with that ``point_id`` and ``ok``.
    :func:`run_point` for sweeps; ``sim.census`` passes its own.
    """
    if address is not None:
        raise UserError("--address: found an address with --executor local; expected it only "
                        "with --executor ray")
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx,
                               initializer=_worker_init, initargs=(os.getpid(),))
    try:
        futures = {pool.submit(fn, t): t for t in tasks}
        for fut in as_completed(futures):
            try:
                done(fut.result())
            except Exception as err:  # noqa: BLE001 - e.g. a worker killed (BrokenProcessPool)
                done(_failed(futures[fut], err))
    except BaseException:
        # Interrupted: stop the workers now; their points have no meta.json yet and
        # run again on resume.
        procs = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join()
        raise
    pool.shutdown(wait=True)


def _run_ray(tasks: list[dict], done: Callable[[dict], None], workers: int, address,
             fn: Callable[[dict], dict] = run_point) -> None:
    """Ray tasks calling ``fn`` (as in :func:`_run_local`); ``address`` None starts a
    local instance."""
    try:
        import ray
    except ImportError:
        raise UserError("--executor ray: found no 'ray' module; expected Ray installed "
                        "(pip install 'hicache-sim[ray]')") from None
    kwargs: dict[str, Any] = {"address": address, "include_dashboard": False,
                              "log_to_driver": False, "logging_level": logging.ERROR}
    saved = os.environ.get("PYTHONPATH")
    if address is None:
        _ray_loopback_only(ray)
        kwargs["_node_ip_address"] = "127.0.0.1"
        kwargs["num_cpus"] = workers
        # Points write their results to disk and return a small dict: a minimal object
        # store (Ray's default takes 30% of RAM as shared memory) is plenty.
        kwargs["object_store_memory"] = RAY_OBJECT_STORE_BYTES
        # Workers of a local instance inherit this environment: make sure they can
        # import ``sim`` even when it is not installed.
        root = str(Path(__file__).resolve().parents[1])
        os.environ["PYTHONPATH"] = os.pathsep.join([root] + ([saved] if saved else []))
    try:
        try:
            ray.init(**kwargs)
        except (ConnectionError, ValueError, RuntimeError) as err:
            raise UserError(f"--address: found {address!r} ({' '.join(str(err).split())}); expected a "
                            "reachable Ray cluster (or no --address for a local one)") from None
        finally:
            if address is None:
                if saved is None:
                    os.environ.pop("PYTHONPATH", None)
                else:
                    os.environ["PYTHONPATH"] = saved
        remote = ray.remote(num_cpus=1, max_retries=0)(fn)
        refs = {remote.remote(t): t for t in tasks}
        pending = list(refs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for ref in ready:
                    try:
                        done(ray.get(ref))
                    except Exception as err:  # noqa: BLE001 - a worker crash
                        done(_failed(refs[ref], err))
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
    finally:
        ray.shutdown()


def _ray_loopback_only(ray) -> None:
    """Make a local Ray instance listen on 127.0.0.1 only.

    Ray's GCS, raylet and workers listen on every interface unless the node's IP is
    the loopback address, and on Linux Ray replaces 127.0.0.1 by the machine's
    routable IP unless clusters are switched off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``
    = 0, read when Ray is imported; set for child processes too). A user who wants
    a real cluster passes ``--address`` (docs/RAY.md).
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    try:
        ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
    except AttributeError:
        pass


EXECUTORS: dict[str, Callable] = {"local": _run_local, "ray": _run_ray}


# ----------------------------------------------------------------------------------
# The sweep
# ----------------------------------------------------------------------------------


@dataclass
class SweepOutcome:
    """What :func:`run_sweep` did."""

    out: Path
    total: int
    skipped: list[str]  # point ids already complete
    ran: list[str]  # point ids that ran to a result
    failures: list[dict]  # one per failed point (also in failures.json)
    halted: list[str]  # point ids whose TP group halted on divergence (a result)
    rows: int  # rows in sweep.parquet
    table: object = None  # pandas.DataFrame: sweep.parquet as gathered


def default_out(plan: SweepPlan) -> Path:
    return Path("results") / "sweeps" / plan.name


def run_sweep(plan: SweepPlan, out, *, executor: str = "local", workers: int | None = None,
              address: str | None = None, progress: bool = True) -> SweepOutcome:
    """Run every point not already complete, then write ``sweep.parquet``."""
    if executor not in EXECUTORS:
        raise UserError(f"--executor: found {executor!r}; expected one of {', '.join(EXECUTORS)}")

    workers = workers or os.cpu_count() or 1
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError("found a file; expected a sweep output folder", where=str(out))
    with FolderLock(out):  # one sweep at a time writes a folder
        return _run_sweep(plan, out, executor, workers, address, progress, write_json, write_text)


def _run_sweep(plan, out, executor, workers, address, progress, write_json, write_text) -> SweepOutcome:
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / SWEEP_COPY, plan.text)
    todo, skipped = [], []
    for p in plan.points:
        (skipped if point_status(p, out) == "done" else todo).append(p)
    by_id = {p.point_id: p for p in plan.points}
    ran: list[str] = []
    failures: list[dict] = []
    halted: list[str] = []
    bar = _bar(len(plan.points), len(skipped), progress)

    def done(result: dict) -> None:
        p = by_id[result["point_id"]]
        if result["ok"]:
            ran.append(p.point_id)
            if result.get("halted"):
                halted.append(p.point_id)
        else:
            failures.append({"point_id": p.point_id, "index": p.index, "results_dir": p.results_dir,
                             "params": p.params, "seed": p.seed, "error": result["error"],
                             "traceback": result.get("traceback")})
        tick(bar, failures)

    try:
        if todo:
            EXECUTORS[executor]([p.task(out) for p in todo], done, workers, address)
    finally:
        if bar is not None:
            bar.close()
    failures.sort(key=lambda f: f["index"])
    write_json(out / FAILURES_FILE, failures)
    table = gather(plan, out)
    return SweepOutcome(out, len(plan.points), [p.point_id for p in skipped],
                        sorted(ran, key=lambda i: by_id[i].index), failures,
                        sorted(halted, key=lambda i: by_id[i].index), len(table), table)


def _bar(total: int, initial: int, enabled: bool, desc: str = "sweep", unit: str = "point"):
    if not enabled or not sys.stderr.isatty():
        return None
    from tqdm import tqdm  # only for a bar on a terminal

    return tqdm(total=total, initial=initial, unit=unit, dynamic_ncols=True, file=sys.stderr,
                desc=desc, smoothing=0.1)


# ----------------------------------------------------------------------------------
# Gathering
# ----------------------------------------------------------------------------------


def _column(values: list) -> list:
    """Values for one parquet column: scalars of one kind stay; anything else (lists,
    mappings, mixed kinds) becomes its one-line YAML text."""
    kinds = set()
    for v in values:
        if v is None:
            continue
        if isinstance(v, bool):
            kinds.add("bool")
        elif isinstance(v, (int, float)):
            kinds.add("number")
        elif isinstance(v, str):
            kinds.add("str")
        else:
            kinds.add("other")
    if len(kinds) <= 1 and "other" not in kinds:
        return values
    return [None if v is None else (v if isinstance(v, str) else _yaml_text(v)) for v in values]


def gather(plan: SweepPlan, out):
    """Write ``OUT/sweep.parquet`` (atomically) from the complete point folders; return it.

    One row per complete point, in sweep order. Columns: the swept key paths (values
    as written in the sweep file), ``workload.kind``, ``seed``, ``point_id``,
    ``results_dir`` (relative to OUT), then every field of ``summary.json`` (which
    includes ``verdict``). The parameter columns are also listed in the table's
    ``attrs["parameter_columns"]`` (kept in the parquet file's metadata).
    """
    import pandas as pd  # here, not at the top: importing the module stays light (pandas is slow to load)

    out = Path(out)
    rows = []
    for p in plan.points:
        if point_status(p, out) != "done":
            continue
        folder = out / p.results_dir
        try:
            summary = json.loads((folder / "summary.json").read_text())
        except (OSError, ValueError):
            continue  # meta.json is written last, so this is a folder damaged by hand
        row = dict(p.params)
        row.setdefault("workload.kind", p.workload_kind)
        row.update(seed=p.seed, point_id=p.point_id, results_dir=p.results_dir)
        for k, v in summary.items():
            if k not in row:
                # nested fields (per-instance rows) as JSON text: one cell, parseable
                row[k] = json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v
        if "verdict" not in row:
            div = json.loads((folder / "divergence.json").read_text())
            row["verdict"] = div.get("verdict")
        bound = folder / "bound.json"
        if bound.exists():
            row["bound_hit_rate"] = json.loads(bound.read_text())["bound_hit_rate"]
        rows.append(row)
    params = list(plan.param_columns)
    if "workload.kind" not in params:
        params.append("workload.kind")
    columns = params + ["seed", "point_id", "results_dir"]
    for row in rows:
        columns += [k for k in row if k not in columns]
    if "verdict" not in columns:
        columns.append("verdict")
    data = {c: _column([r.get(c) for r in rows]) for c in columns}
    table = pd.DataFrame(data, columns=columns)
    table.attrs["parameter_columns"] = params

    write_parquet(out / SWEEP_TABLE, table, {c: guess_unit(c, table[c]) for c in table.columns})
    return table


def format_table(table, param_columns=None) -> str:
    """The gathered table as console text (``sim.fmt.table``), one row per point: the
    swept keys whose values differ between points (all swept keys if none differ),
    seed, hit rate, TTFT p50 / p99 and the TP verdict."""
    params = list(param_columns if param_columns is not None
                  else table.attrs.get("parameter_columns", []))
    params = [c for c in params if c in table.columns]
    varied = [c for c in params if table[c].astype(str).nunique() > 1] or params
    header = varied + ["seed", "hit rate", "TTFT p50", "TTFT p99", "verdict"]

    def get(row, key):
        v = row.get(key)
        if hasattr(v, "item"):  # a numpy scalar
            v = v.item()
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else v

    def cell(row, key) -> str:
        v = get(row, key)
        return "-" if v is None else v if isinstance(v, str) else _yaml_text(v)

    rows = []
    for row in table.to_dict("records"):
        rows.append([cell(row, c) for c in varied]
                    + [cell(row, "seed"), percent(get(row, "hit_rate")),
                       duration(get(row, "ttft_p50_s")), duration(get(row, "ttft_p99_s")),
                       cell(row, "verdict")])
    return text_table(header, rows)


def add_bounds(plan: SweepPlan, out) -> int:
    """Write the offline bound (``bound.json``) into every complete point that lacks
    one; points with the same workload and capacities share one computation. Returns
    how many points got a bound. ``gather`` then adds a ``bound_hit_rate`` column,
    which the capacity plot draws as a reference line."""
    out = Path(out)
    cache: dict = {}
    n = 0
    for p in plan.points:
        folder = out / p.results_dir
        if point_status(p, out) != "done" or (folder / "bound.json").exists():
            continue
        scn = load_scenario(folder / "scenario.yaml",
                            trace_roots=[Path(p.base_path).parent, *plan.trace_roots])
        key = (scn.workload.model_dump_json(), scn.page_size, resolve_capacities(scn), scn.seed)
        if key not in cache:
            cache[key] = bound_for_scenario(scn)
        write_bound(cache[key], folder, with_csv=False)
        n += 1
    return n


def tick(bar, failures: list) -> None:
    """One finished task on a progress bar (or none), with the failures so far."""
    if bar is not None:
        bar.update(1)
        if failures:
            bar.set_postfix_str(f"{len(failures)} failed", refresh=False)


def report_failures(command: str, what: str, key: str, failures: list, details) -> int:
    """Each failed task as one line on stderr, then where the details are; the exit
    code: 1 when a task failed (rerunning retries it), else 0."""
    for f in failures:
        print(f"hicache-sim {command}: {what} {f[key]} failed: {f['error']}", file=sys.stderr)
    if failures:
        print(f"hicache-sim {command}: {len(failures)} {what}(s) failed; details in "
              f"{details}; rerun to retry them", file=sys.stderr)
        return 1
    return 0
