"""Read results folders (and sweep folders) into plain pandas/dict objects.

The reports never import the simulator: everything they show comes from the files
``sim/metrics.py`` writes (docs/ARCHITECTURE.md, "Results folder"), so a user can plot
results produced elsewhere (on Ray workers, on another machine). Anything wrong with
a folder is reported as one line naming the file and what was expected.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd
import yaml

from sim.errors import InputFormatError, UserError

REQUESTS_FILE = "requests.parquet"
TIMESERIES_FILE = "timeseries.parquet"
DIVERGENCE_FILE = "divergence.json"
SCENARIO_FILE = "scenario.yaml"
META_FILE = "meta.json"
SUMMARY_FILE = "summary.json"
SWEEP_FILE = "sweep.parquet"

# Every file a complete results folder holds, in the order the checks report them.
RESULT_FILES = (
    REQUESTS_FILE,
    TIMESERIES_FILE,
    DIVERGENCE_FILE,
    SCENARIO_FILE,
    META_FILE,
    SUMMARY_FILE,
)

REQUEST_COLUMNS = (
    "rid", "session", "arrival", "start", "first_token", "finish", "input_tokens",
    "device_hit_tokens", "host_hit_tokens", "miss_tokens", "load_back_tokens",
    "load_back_bytes", "load_back_s", "backup_stall_s", "prefill_s", "ttft_s",
)

TIMESERIES_COLUMNS = (
    "t", "device_used", "host_used", "duplicate_tokens", "effective_tokens",
    "device_capacity", "host_capacity", "evicted_tokens", "backup_tokens",
    "reclaim_pass1_tokens", "reclaim_pass2_tokens", "host_evict_tokens", "drop_tokens",
    "load_back_tokens", "requests_done", "hit_rate",
)

# Time-series counters are running totals since the start of the run (like
# ``requests_done``); the traffic plot reads their last value as the total.
CUMULATIVE_COLUMNS = (
    "evicted_tokens", "backup_tokens", "reclaim_pass1_tokens", "reclaim_pass2_tokens",
    "host_evict_tokens", "drop_tokens", "load_back_tokens", "requests_done",
)

# The headline numbers of summary.json that a sweep repeats as columns.
SUMMARY_KEYS = (
    "hit_rate", "device_hit_rate", "host_hit_rate", "miss_rate", "ttft_p50_s",
    "ttft_p99_s", "effective_tokens_mean", "duplicate_share_mean", "host_tokens",
    "device_tokens", "load_back_bytes", "backup_bytes", "requests",
)

SWEEP_REQUIRED_COLUMNS = ("device_hit_rate", "host_hit_rate", "miss_rate")


@dataclass
class Run:
    """One simulated run, as read back from its results folder."""

    dir: Path
    label: str  # unique among the runs of one report; used in legends and tables
    requests: pd.DataFrame
    timeseries: pd.DataFrame
    meta: dict[str, Any]
    summary: dict[str, Any]
    divergence: dict[str, Any]
    scenario_text: str
    scenario: dict[str, Any]

    @property
    def partial(self) -> bool:
        """True when the run stopped early (interrupted, out of budget)."""
        return bool(self.meta.get("partial", False))

    @property
    def display_label(self) -> str:
        """The label shown in plots: partial runs say so."""
        return f"{self.label} (partial)" if self.partial else self.label

    @property
    def name(self) -> str:
        """The scenario's own name, or the folder name when it has none."""
        name = self.scenario.get("name")
        return str(name) if name not in (None, "") else self.dir.name


@dataclass
class Sweep:
    """A sweep folder: one row per (point, seed) with parameters and summary columns."""

    dir: Path
    label: str
    table: pd.DataFrame

    @property
    def parameter_columns(self) -> list[str]:
        """Scenario parameters the sweep records (dotted keys), in file order.

        ``hicache-sim sweep`` stores the list in the table's parquet metadata; a table
        from elsewhere falls back to every column that is not a known result field."""
        listed = self.table.attrs.get("parameter_columns")
        if listed:
            return [c for c in listed if c in self.table.columns]
        skip = set(SUMMARY_KEYS) | {"results_dir", "seed", "bound_hit_rate", "point_id"}
        return [c for c in self.table.columns if c not in skip]


@dataclass
class Results:
    """Everything one ``plot``/``report`` call reads: runs and sweeps, in argument order."""

    runs: list[Run] = field(default_factory=list)
    sweeps: list[Sweep] = field(default_factory=list)

    def __iter__(self):
        return iter(self.runs)

    def __len__(self) -> int:
        return len(self.runs) + len(self.sweeps)


# --------------------------------------------------------------------------- readers


def _read_parquet(path: Path, columns: Sequence[str], what: str) -> pd.DataFrame:
    try:
        df = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises many types for a damaged file
        raise InputFormatError(path, None, f"an unreadable file ({type(err).__name__})",
                               f"a parquet table of {what}") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise UserError(f"missing column(s) {', '.join(missing)}; expected the columns "
                        f"{', '.join(columns)}", where=str(path))
    return df


def _read_json(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        line = getattr(err, "lineno", None)
        raise InputFormatError(path, line, "text that is not valid JSON",
                               "a JSON object") from None
    if not isinstance(obj, dict):
        raise InputFormatError(path, None, f"a JSON {type(obj).__name__}", "a JSON object")
    return obj


def _read_scenario(path: Path) -> tuple[str, dict[str, Any]]:
    text = path.read_text()
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise InputFormatError(path, line, "text that is not valid YAML",
                               "the resolved scenario as a YAML mapping") from None
    if obj is None:
        obj = {}
    if not isinstance(obj, dict):
        raise InputFormatError(path, None, f"a YAML {type(obj).__name__}",
                               "the resolved scenario as a YAML mapping")
    return text, obj


def _child_results(path: Path) -> list[Path]:
    """Sub-folders that are results or sweep folders (for a helpful error message)."""
    found = []
    for child in sorted(p for p in path.iterdir() if p.is_dir()):
        if (child / SWEEP_FILE).is_file() or (child / REQUESTS_FILE).is_file():
            found.append(child)
    return found


def _check_folder(path: Path) -> None:
    if not path.exists():
        raise UserError("no such folder; expected a results folder", where=str(path))
    if not path.is_dir():
        raise UserError("is a file; expected a results folder (holding "
                        f"{REQUESTS_FILE}, {META_FILE}, ...)", where=str(path))


def _check_complete(path: Path) -> None:
    missing = [name for name in RESULT_FILES if not (path / name).is_file()]
    if not missing:
        return
    if len(missing) == len(RESULT_FILES):
        children = _child_results(path)
        hint = ""
        if children:
            hint = (f"; it holds {len(children)} results folder(s), pass those instead "
                    f"(e.g. {children[0]})")
        raise UserError(f"not a results folder: found none of {', '.join(RESULT_FILES)}"
                        f"{hint}", where=str(path))
    raise UserError(f"incomplete results folder: missing {', '.join(missing)}; expected "
                    f"all of {', '.join(RESULT_FILES)}", where=str(path))


def _check_counters(path: Path, df: pd.DataFrame) -> None:
    """Counters must be running totals: a decrease means the folder breaks the contract."""
    for col in CUMULATIVE_COLUMNS:
        values = df[col].to_numpy()
        if len(values) > 1:
            drops = (values[1:] < values[:-1]).nonzero()[0]
            if len(drops):
                i = int(drops[0]) + 1
                raise UserError(f"column {col} decreases at row {i} (t={df['t'].iloc[i]}); "
                                "expected a running total since the start of the run",
                                where=str(path / TIMESERIES_FILE))


def load_run(path: str | Path, label: str | None = None) -> Run:
    """Read one results folder; raise a one-line ``UserError`` if it is not one."""
    path = Path(path)
    _check_folder(path)
    if (path / SWEEP_FILE).is_file() and not (path / REQUESTS_FILE).is_file():
        raise UserError("is a sweep folder; expected a results folder of one run "
                        "(use load_many for sweeps)", where=str(path))
    _check_complete(path)
    meta = _read_json(path / META_FILE)
    summary = _read_json(path / SUMMARY_FILE)
    divergence = _read_json(path / DIVERGENCE_FILE)
    scenario_text, scenario = _read_scenario(path / SCENARIO_FILE)
    requests = _read_parquet(path / REQUESTS_FILE, REQUEST_COLUMNS, "per-request rows")
    timeseries = _read_parquet(path / TIMESERIES_FILE, TIMESERIES_COLUMNS, "time-series rows")
    timeseries = timeseries.sort_values("t", kind="stable").reset_index(drop=True)
    _check_counters(path, timeseries)
    return Run(dir=path, label=label or _folder_name(path), requests=requests, timeseries=timeseries,
               meta=meta, summary=summary, divergence=divergence,
               scenario_text=scenario_text, scenario=scenario)


def load_sweep(path: str | Path, label: str | None = None) -> Sweep:
    """Read a sweep folder (one holding ``sweep.parquet``)."""
    path = Path(path)
    _check_folder(path)
    file = path / SWEEP_FILE
    if not file.is_file():
        raise UserError(f"not a sweep folder: no {SWEEP_FILE}", where=str(path))
    table = _read_parquet(file, SWEEP_REQUIRED_COLUMNS, "sweep rows")
    if "host_tokens" not in table.columns and "host.ratio" not in table.columns:
        raise UserError("missing column host_tokens (and host.ratio); expected the host "
                        "capacity of each point", where=str(file))
    return Sweep(dir=path, label=label or _folder_name(path), table=table)


def _folder_name(path: Path) -> str:
    """The folder's own name, also for ``.`` and other relative spellings."""
    return path.name or path.resolve().name or str(path)


def _unique_labels(paths: Sequence[Path]) -> list[str]:
    """Folder names, lengthened with parent folders (then numbered) until unique."""
    labels = [_folder_name(p) for p in paths]
    for depth in (2, 3):
        counts = {lab: labels.count(lab) for lab in labels}
        if all(n == 1 for n in counts.values()):
            return labels
        labels = [("/".join(p.parts[-depth:]) if counts[lab] > 1 else lab)
                  for p, lab in zip(paths, labels)]
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if labels.count(lab) == 1 else f"{lab} #{seen[lab]}")
    return out


def load_many(paths: Iterable[str | Path]) -> Results:
    """Read results folders and sweep folders, in order; the same folder twice counts once.

    A sweep folder contributes its table (the hit-rate-vs-capacity plot and the sweep
    table of the report); its runs are loaded only if their folders are passed too.
    """
    unique: list[Path] = []
    seen: set[Path] = set()
    for p in paths:
        p = Path(p)
        _check_folder(p)
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    if not unique:
        raise UserError("no results folders given; expected at least one")
    labels = _unique_labels(unique)
    results = Results()
    for p, label in zip(unique, labels):
        if (p / SWEEP_FILE).is_file():
            results.sweeps.append(load_sweep(p, label))
        else:
            results.runs.append(load_run(p, label))
    return results


def as_results(obj: Results | Run | Sweep | Iterable[Run | Sweep]) -> Results:
    """Accept a ``Results``, one run/sweep or a list of them (what callers have at hand)."""
    if isinstance(obj, Results):
        return obj
    if isinstance(obj, (Run, Sweep)):
        obj = [obj]
    results = Results()
    for item in obj:
        if isinstance(item, Run):
            results.runs.append(item)
        elif isinstance(item, Sweep):
            results.sweeps.append(item)
        else:
            raise TypeError(f"expected Run or Sweep, got {type(item).__name__}")
    return results


def flatten(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested scenario mapping -> ``{"cache.write_policy": ..., ...}`` (insertion order).

    Lists stay whole values: two runs differ in a list key if the lists differ.
    """
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat
