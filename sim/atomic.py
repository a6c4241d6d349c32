"""Atomic writes: a finished result is never half-written or lost."""

from __future__ import annotations

import json
import math
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from sim.units import UNITS_KEY, units_for

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; rename it over ``path`` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; results are ordinary files
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def strict(obj):
    """``obj`` with every NaN or infinity replaced by None: strict JSON for any parser."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    return obj


def write_json(path, obj) -> None:
    """Strict JSON (``allow_nan=False`` after :func:`strict`), keys sorted."""
    write_text(path, json.dumps(strict(obj), indent=2, sort_keys=True, default=str,
                                allow_nan=False) + "\n")


def write_parquet(path, df, units: dict | None = None) -> None:
    """The one parquet writer: ``df`` without its index, ``df.attrs`` kept (as pandas
    keeps them), and with ``units`` (column -> unit, ``sim.units``) every column's unit
    in the schema metadata under ``hicache_sim.units``. ``df`` may also be a pyarrow
    Table already in the form ``from_pandas`` gives (``sim.analysis.plan.plan_arrow_table``:
    a table built without pandas), written as it is."""
    # here, not at the top: cli.py loads this module at start-up, pyarrow is slow to load
    import pyarrow as pa
    import pyarrow.parquet as pq

    if isinstance(df, pa.Table):
        table = df
    else:
        table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    if getattr(df, "attrs", None):  # what pandas' own writer adds, so read_parquet restores them
        meta[b"PANDAS_ATTRS"] = json.dumps(df.attrs).encode()
    if units is not None:
        meta[UNITS_KEY] = json.dumps(units_for(list(table.column_names), units)).encode()
    table = table.replace_schema_metadata(meta)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="snappy")
