"""Units of every parquet column: written into the file, next to the data.

Each parquet file hicache-sim writes carries, in its schema metadata under
``hicache_sim.units``, a JSON map from every column to its unit, so a reader (a
notebook, a plotting tool) need not guess from the name. The vocabulary:

========  ====================================================================
``s``      seconds (simulated time unless the column says wall)
``tokens`` KV tokens (per rank where a capacity or pool is meant)
``bytes``  bytes (per rank)
``GiB``    2**30 bytes;  ``GB``: 1e9 bytes (SGLang's --hicache-size)
``1/s``    a rate: arrivals (requests, sessions) per second
``1``      dimensionless: a ratio, share, probability or count
``id``     an identifier (request, session, seed, point): not a quantity
``text``   a name or label (a policy, a verdict, a key's YAML text)
``bool``   a flag
========  ====================================================================

Column names are not changed to carry units: reports and users read them as they are.
Modules declare the units of their own columns next to the column lists
(``sim.metrics``, ``sim.census``); tables whose columns come from scenario keys and
summary fields (``sim.sweep``'s gathered table) use :func:`guess_unit`.
"""

from __future__ import annotations

import json

UNITS_KEY = b"hicache_sim.units"
VOCABULARY = ("s", "tokens", "bytes", "GiB", "GB", "1/s", "1", "id", "text", "bool")

# summary.json's headline numbers (a sweep repeats them as columns).
SUMMARY_UNITS = {
    "requests": "1", "rejected_requests": "1", "retracted_requests": "1", "aborted_requests": "1", "input_tokens": "tokens", "hit_rate": "1",
    "device_hit_rate": "1", "host_hit_rate": "1", "miss_rate": "1", "ttft_p50_s": "s",
    "ttft_p99_s": "s", "effective_tokens_mean": "tokens", "duplicate_share_mean": "1",
    "device_tokens": "tokens", "host_tokens": "tokens", "load_back_bytes": "bytes",
    "backup_bytes": "bytes", "backup_stall_s": "s", "reclaim_pass1_tokens": "tokens",
    "reclaim_pass2_tokens": "tokens", "drop_tokens": "tokens", "sim_time_s": "s",
    "verdict": "text", "skipped_trace_lines": "1", "bound_hit_rate": "1",
    "seed": "id", "point_id": "id", "results_dir": "text",
    # data-parallel runs (sim.cluster): a sweep keeps lists and mappings as YAML text
    "dp": "1", "router": "text", "router_decisions": "text", "instances": "text",
    "utilisation": "1", "queue_wait_p50_s": "s", "prefill_service_p50_s": "s",
    "overload_warning": "text",
    # the L3 storage tier (present with `storage:` only)
    "l3_hit_tokens": "tokens", "l3_hit_rate": "1", "prefetch_issued": "1",
    "prefetch_declined": "text", "prefetch_revoked": "text", "l3_read_bytes": "bytes",
    "l3_write_bytes": "bytes", "hit_tokens_by_tier": "text", "host_buffer": "text",
    "storage_gb": "GB", "host_memory_mode": "text",
}

# Scenario keys whose last part does not say its unit by the rules below.
_LAST_PART = {"rate": "1/s", "zipf_s": "1", "template_zipf_s": "1", "gib": "GiB",
              "size_gb": "GB", "seed": "id", "cv": "1", "ratio": "1", "probability": "1",
              "swap_probability": "1", "rate_scale": "1"}


def guess_unit(name: str, values=None) -> str:
    """A column's unit from its name (a summary field or a dotted scenario key) and,
    for names that say nothing, its values: numbers are ``1``, flags ``bool``, anything
    else ``text``."""
    if name in SUMMARY_UNITS:
        return SUMMARY_UNITS[name]
    last = name.rsplit(".", 1)[-1]
    if last in _LAST_PART:
        return _LAST_PART[last]
    if last.endswith("_s") or last == "t":
        return "s"
    if "bytes" in last:
        return "bytes"
    if "tokens" in last or last == "page_size" or last == "block_size":
        return "tokens"
    if last.endswith(("_rate", "_share", "_ratio")):
        return "1"
    kinds = {type(v) for v in (values if values is not None else ()) if v is not None}
    if kinds and kinds <= {bool}:
        return "bool"
    if kinds and all(issubclass(k, (int, float)) and k is not bool for k in kinds):
        return "1"
    try:  # a pandas Series: its dtype decides
        import pandas as pd  # here: cli.py loads this module at start-up

        if isinstance(values, pd.Series):
            if pd.api.types.is_bool_dtype(values):
                return "bool"
            if pd.api.types.is_numeric_dtype(values):
                return "1"
    except ImportError:  # pragma: no cover - pandas is a dependency
        pass
    return "text"


def units_for(columns, declared: dict) -> dict:
    """``declared`` restricted to ``columns``, in column order; every column must have
    a unit from :data:`VOCABULARY` (a column without one is a bug here, not bad input)."""
    missing = [c for c in columns if c not in declared]
    if missing:
        raise ValueError(f"no unit declared for column(s) {', '.join(map(str, missing))}")
    bad = {c: declared[c] for c in columns if declared[c] not in VOCABULARY}
    if bad:
        raise ValueError(f"unknown unit(s) {bad}; expected one of {', '.join(VOCABULARY)}")
    return {str(c): declared[c] for c in columns}


def read_units(path) -> dict:
    """The ``hicache_sim.units`` map of a parquet file ({} when it has none)."""
    import pyarrow.parquet as pq  # here: cli.py loads this module at start-up

    meta = pq.read_schema(path).metadata or {}
    raw = meta.get(UNITS_KEY)
    return json.loads(raw) if raw else {}
