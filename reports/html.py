"""One self-contained HTML file that compares runs: tables, scenario differences, plots.

Plots are embedded as base64 PNG and the style sheet is inline, so the file can be
mailed or attached to an issue on its own. The same folders give the same bytes (no
timestamps; the plots are deterministic).
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

import numpy as np

from reports.identical import find_identical, run_cases, sweep_cases
from reports.load import Results, Run, Sweep, as_results, flatten
from reports.plots import (build_plots, device_capacity_tokens, figure_bytes,
                           host_capacity_tokens)
from sim import __version__
from sim.atomic import write_text
from sim.fmt import duration

CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1200px;padding:0 1em;color:#222;line-height:1.4}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.25em;margin-top:1.8em;
border-bottom:1px solid #ddd;padding-bottom:.2em}h3{font-size:1.05em}
.sub{color:#666;margin-top:0}
table{border-collapse:collapse;font-size:.88em;margin:.6em 0;display:block;overflow-x:auto}
th,td{border:1px solid #ddd;padding:.3em .55em;text-align:left;vertical-align:top}
th{background:#f3f5f8}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr:nth-child(even) td{background:#fafbfc}
.ok{color:#1a7f37}.bad{color:#c62828;font-weight:bold}.warn{color:#9a6700}
.partial{color:#9a6700;font-weight:bold}.absent{color:#999}
code{background:#f3f5f8;padding:0 .25em;border-radius:3px}
figure{margin:1.5em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.9em}
ul.notes{color:#555;font-size:.9em}
"""

MISSING = "—"


# --------------------------------------------------------------------------- formatting


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else float("nan")


def _pct(value: Any) -> str:
    v = _num(value)
    return MISSING if not np.isfinite(v) else f"{100 * v:.1f}%"


def _tokens(value: Any) -> str:
    v = _num(value)
    return MISSING if not np.isfinite(v) else f"{v:,.0f}"


def _seconds(value: Any) -> str:
    v = _num(value)
    return duration(v) if np.isfinite(v) else MISSING


def _scalar(value: Any) -> str:
    """A scenario value as YAML would show it (lists and mappings as compact JSON)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, sort_keys=False, default=str)
    return str(value)


def _table(header: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    """An HTML table; cells are already-escaped HTML."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                        for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


# ------------------------------------------------------------------------ the sections


def _where(point: Any) -> str:
    """A divergence point (``{"t": .., "step": .., "ranks": .., "what": ..}``) in one line;
    nested mappings (tree summaries, digests) are left out."""
    if isinstance(point, dict):
        # When first, then the rest in file order (JSON written with sorted keys).
        keys = [k for k in ("t", "step") if k in point] + \
            [k for k in point if k not in ("t", "step")]
        text = ", ".join(f"{k}={_point_value(k, point[k])}" for k in keys
                         if not isinstance(point[k], dict))
    else:
        text = _scalar(point) if point is not None else "an unknown point"
    return text if len(text) <= 160 else text[:157] + "..."


def _point_value(key: str, value: Any) -> str:
    """One field of a divergence point as a reader wants it: times as durations
    ("13.7 s"), other fractions to 4 significant digits, never 15."""
    if isinstance(value, float):
        return duration(value) if key == "t" or key.endswith("_s") else f"{value:.4g}"
    return _scalar(value)


def _at(point: Any) -> str:
    t = point.get("t") if isinstance(point, dict) else None
    return f" at t={duration(t)}" if isinstance(t, (int, float)) else ""


def digest_verdict(divergence: dict[str, Any]) -> tuple[str, str]:
    """(css class, text) of a run's divergence verdict from its divergence.json.

    Reads the engine's ``verdict`` (agree, absorbed, detected, missed, false_alarm,
    hang, or a collective error kind) with ``first_true_divergence`` and
    ``digest_mismatch``; older folders with only ``diverged`` /
    ``first_divergence`` / ``detected_by_digest`` are read too.
    """
    verdict = divergence.get("verdict")
    if verdict is None and "diverged" in divergence:  # the short form
        if not divergence.get("diverged"):
            verdict = "agree"
        else:
            verdict = "detected" if divergence.get("detected_by_digest") else "missed"
    if verdict is None:
        return "absent", "not recorded"
    true_div = divergence.get("first_true_divergence", divergence.get("first_divergence"))
    mismatch = divergence.get("digest_mismatch")
    if verdict == "agree":
        cls, text = "ok", "ranks agree"
    elif verdict == "absorbed":
        forks = divergence.get("forks") or []
        cls, text = "ok", f"ranks forked ({len(forks)} fork(s)) but their trees agree"
    elif verdict == "detected":
        delay = divergence.get("detection_delay_s")
        after = f" {duration(delay)} later" if isinstance(delay, (int, float)) else ""
        cls, text = "bad", (f"diverged at {_where(true_div)}; caught by the digest "
                            f"check{after}")
    elif verdict == "missed":
        cls, text = "bad", f"diverged at {_where(true_div)}; NOT caught by the digest check"
    elif verdict == "false_alarm":
        cls, text = "warn", f"digest mismatch{_at(mismatch)} without a true divergence"
    elif verdict == "hang":
        cls, text = "bad", (f"ranks scheduled different batches "
                            f"({_where(divergence.get('batch_mismatch'))}): a hang on "
                            "real hardware")
    else:
        error = divergence.get("collective_error")
        message = error.get("message") if isinstance(error, dict) else None
        cls, text = "bad", f"{verdict}{_at(error)}" + (f": {message}" if message else "")
    halted = divergence.get("halted")
    if halted:
        text += f"; run halted ({halted})" if isinstance(halted, str) else "; run halted"
    return cls, text


def _rate(run: Run, key: str, part: str | None) -> float:
    value = run.summary.get(key)
    if isinstance(value, (int, float)):
        return float(value)
    req = run.requests
    total = float(req["input_tokens"].sum())
    if total <= 0:
        return float("nan")
    if part is None:  # overall hit rate
        return float((req["device_hit_tokens"] + req["host_hit_tokens"]).sum()) / total
    return float(req[part].sum()) / total


def _ttft(run: Run, q: float) -> float:
    key = f"ttft_p{q * 100:g}_s"
    value = run.summary.get(key)
    if isinstance(value, (int, float)):
        return float(value)
    ttft = run.requests["ttft_s"].dropna().to_numpy(dtype=float)
    return float(np.quantile(ttft, q)) if len(ttft) else float("nan")


def _capacity(tokens, run: Run) -> str:
    """``12.3 GB (300,032 tokens)`` when the run knows its bytes per token, else tokens."""
    from reports.plots import bytes_per_token
    from sim.sizing import fmt_capacity

    bpt = bytes_per_token(run)
    if bpt is None or not isinstance(tokens, (int, float)) or tokens != tokens:
        return _tokens(tokens)
    return _e(fmt_capacity(int(tokens), bpt))


def _tier_shares(run: Run) -> dict:
    """Device, host and (with an L3 tier) storage hits of a run as shares of input:
    summary.json's per-tier split (``sim.diagnostics.tier_hits``), else the requests'."""
    from sim.diagnostics import tier_hits

    s = run.summary
    if isinstance(s.get("input_tokens"), (int, float)) and all(
            isinstance(s.get(k), (int, float)) for k in ("device_hit_rate", "host_hit_rate")):
        return {t: share for t, (_, share) in tier_hits(s).items()}
    return {"device": _rate(run, "device_hit_rate", "device_hit_tokens"),
            "host": _rate(run, "host_hit_rate", "host_hit_tokens")}


def _storage_capacity(run: Run) -> str:
    """A storage run's L3 size per rank in GB with tokens beside ("unbounded": no cap)."""
    if "hit_tokens_by_tier" not in run.summary:
        return MISSING
    cap = run.summary.get("storage_gb", flatten(run.scenario).get("storage.capacity_gb"))
    if not isinstance(cap, (int, float)) or isinstance(cap, bool):
        return "unbounded"
    from reports.plots import bytes_per_token

    bpt = bytes_per_token(run)
    return _capacity(int(cap * 1e9 // bpt), run) if bpt else _e(f"{cap:g} GB")


def _runs_table(runs: list[Run]) -> str:
    storage = any("hit_tokens_by_tier" in run.summary for run in runs)
    header = ["run", "scenario", "write policy", "host policy", "eviction policy",
              "device capacity per rank", "host capacity per rank",
              *(["storage capacity per rank"] if storage else []),
              "requests", "hit rate", "device hit", "host hit",
              *(["storage hit"] if storage else []),
              "miss", "TTFT p50", "TTFT p99", "digest verdict"]
    rows = []
    for run in runs:
        flat = flatten(run.scenario)
        label = _e(run.label)
        if run.partial:
            label += ' <span class="partial">(partial)</span>'
        cls, verdict = digest_verdict(run.divergence)
        requests = run.summary.get("requests", len(run.requests))
        tiers = _tier_shares(run)
        rows.append([
            label, _e(run.name),
            _e(flat.get("cache.write_policy", MISSING)),
            _e(flat.get("cache.host_policy", MISSING)),
            _e(flat.get("cache.eviction_policy", MISSING)),
            _capacity(device_capacity_tokens(run), run), _capacity(host_capacity_tokens(run), run),
            *([_storage_capacity(run)] if storage else []),
            _tokens(requests),
            _pct(_rate(run, "hit_rate", None)),
            _pct(tiers["device"]), _pct(tiers["host"]),
            *([_pct(tiers.get("storage"))] if storage else []),
            _pct(_rate(run, "miss_rate", "miss_tokens")),
            _seconds(_ttft(run, 0.5)), _seconds(_ttft(run, 0.99)),
            f'<span class="{cls}">{_e(verdict)}</span>',
        ])
    return _table(header, rows, numeric=set(range(5, len(header) - 1)))


def scenario_differences(runs: list[Run]) -> tuple[list[str], dict[str, list[Any]]]:
    """(keys equal in every run, {key: each run's value} for keys that differ).

    Keys are dotted paths of the resolved scenario.yaml. A key some runs lack differs;
    those runs hold the ``MISSING`` mark (distinct from an explicit ``null``).
    """
    flats = [flatten(run.scenario) for run in runs]
    keys = list(dict.fromkeys(k for f in flats for k in f))
    differing: dict[str, list[Any]] = {}
    same = []
    for key in keys:
        values = [f.get(key, MISSING) for f in flats]
        shown = [_scalar(v) if v is not MISSING else MISSING for v in values]
        if len(set(shown)) > 1:
            differing[key] = values
        else:
            same.append(key)
    return same, differing


def _differences_section(runs: list[Run]) -> str:
    if len(runs) < 2:
        return "<p>Only one run: nothing to compare.</p>"
    same, differing = scenario_differences(runs)
    if not differing:
        return (f"<p>The runs' resolved scenarios are identical ({len(same)} keys).</p>")
    header = ["scenario key"] + [run.label for run in runs]
    rows = []
    for key, values in differing.items():
        cells = [f"<code>{_e(key)}</code>"]
        for v in values:
            cells.append('<span class="absent">absent</span>' if v is MISSING
                         else _e(_scalar(v)))
        rows.append(cells)
    note = (f"<p class=\"sub\">{len(differing)} key(s) differ; {len(same)} key(s) are the "
            "same in every run and are not shown.</p>")
    return note + _table(header, rows)


SWEEP_METRICS = (("host_gb", "host GB per rank", lambda v: f"{v:,.3g}"),
                 ("hit_rate", "hit rate", _pct), ("device_hit_rate", "device hit", _pct),
                 ("host_hit_rate", "host hit", _pct), ("storage_hit_rate", "storage hit", _pct),
                 ("miss_rate", "miss", _pct),
                 ("bound_hit_rate", "offline bound", _pct),
                 ("ttft_p50_s", "TTFT p50", _seconds), ("ttft_p99_s", "TTFT p99", _seconds))


def _sweep_section(sweep: Sweep) -> str:
    table = sweep.table
    if "hit_tokens_by_tier" in table.columns and "input_tokens" in table.columns:
        # Storage points: host hits without the L3's (summary.json's host_hit_rate
        # counts both), storage beside (sim.diagnostics.tier_hits).
        from reports.plots import _storage_rate

        l3 = [_storage_rate(t, n) for t, n in zip(table["hit_tokens_by_tier"],
                                                   table["input_tokens"])]
        table = table.assign(storage_hit_rate=l3)
        if "host_hit_rate" in table.columns:
            table["host_hit_rate"] = table["host_hit_rate"] - table["storage_hit_rate"].fillna(0.0)
    params = sweep.parameter_columns
    varying = [c for c in params if table[c].astype(str).nunique() > 1]
    fixed = [c for c in params if c not in varying]
    parts = [f"<h3>Sweep {_e(sweep.label)}</h3>",
             f"<p class=\"sub\">{len(table)} row(s) from <code>{_e(sweep.dir)}</code>"]
    if fixed and len(table):
        parts.append("; the same in every point: " + ", ".join(
            f"<code>{_e(c)}</code>={_e(_scalar(table[c].iloc[0]))}" for c in fixed))
    parts.append(". Values are means over seeds.</p>")
    metrics = [(c, name, fmt) for c, name, fmt in SWEEP_METRICS if c in table.columns]
    if varying:
        grouped = table.groupby(varying, sort=False, dropna=False)
        agg = grouped[[c for c, _, _ in metrics]].mean()
        agg["_n"] = grouped.size()
        rows = []
        for key, row in agg.iterrows():
            key = key if isinstance(key, tuple) else (key,)
            rows.append([_e(_scalar(k)) for k in key] + [str(int(row["_n"]))]
                        + [fmt(row[c]) for c, _, fmt in metrics])
    else:
        means = table[[c for c, _, _ in metrics]].mean()
        rows = [[str(len(table))] + [fmt(means[c]) for c, _, fmt in metrics]]
    header = varying + ["seeds"] + [name for _, name, _ in metrics]
    parts.append(_table(header, rows, numeric=set(range(len(varying), len(header)))))
    same = _identical_section(find_identical(sweep_cases(sweep)), "point")
    if same:
        parts.append("<p><b>Policies with identical results</b> (points that differ only "
                     "in these policy keys):</p>" + same)
    return "".join(parts)


def _identical_section(findings, what: str) -> str:
    """Policy pairs with identical results, each with the reason the results give."""
    items = []
    for f in findings:
        pairs = ", ".join(f"{_e(a.label)} = {_e(b.label)}" for a, b in f.pairs[:6])
        more = f" and {len(f.pairs) - 6} more" if len(f.pairs) > 6 else ""
        items.append(f"<li><b>{_e(f.title())}</b>: identical hit rates and TTFTs in "
                     f"{len(f.pairs)} {what} pair(s) ({pairs}{more}). <i>Why:</i> "
                     f"{_e(f.reason)}.</li>")
    return ('<ul class="identical">' + "".join(items) + "</ul>") if items else ""


def render_report(runs, *, notes: list[str] | None = None, title: str | None = None) -> str:
    """The report as an HTML string (what ``write_report`` writes)."""
    results: Results = as_results(runs)
    notes = list(notes or [])
    for run in results.runs:
        if run.partial:
            notes.append(f"run {run.label} is partial (stopped early; meta.json says "
                         "partial: true): its numbers cover only the simulated part")
    plots = build_plots(results, notes)
    title = title or "hicache-sim report"
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
           f"<h1>{_e(title)}</h1>",
           f'<p class="sub">{len(results.runs)} run(s), {len(results.sweeps)} sweep(s); '
           f"written by hicache-sim {_e(__version__)} from results folders only.</p>"]
    if results.runs:
        out.append("<h2>Runs</h2>")
        out.append(_runs_table(results.runs))
        out.append("<h2>How the scenarios differ</h2>")
        out.append(_differences_section(results.runs))
        same = _identical_section(find_identical(run_cases(results.runs)), "run")
        if same:
            out.append('<h2 id="identical-results">Policies with identical results</h2>')
            out.append(same)
    if results.sweeps:
        out.append("<h2>Sweeps</h2>")
        out.extend(_sweep_section(s) for s in results.sweeps)
    if notes:
        out.append("<h2>Notes</h2><ul class=\"notes\">")
        out.extend(f"<li>{_e(n)}</li>" for n in notes)
        out.append("</ul>")
    if plots:
        out.append("<h2>Plots</h2>")
    for plot in plots:
        data = base64.b64encode(figure_bytes(plot.figure, "png")).decode("ascii")
        out.append(f'<figure id="{_e(plot.stem)}"><img alt="{_e(plot.title)}" '
                   f'src="data:image/png;base64,{data}"><figcaption>{_e(plot.title)}'
                   "</figcaption></figure>")
    out.append("</body></html>\n")
    # Non-ASCII characters as character references: the file reads the same whatever
    # the locale's encoding is when it is written.
    return "\n".join(out).encode("ascii", "xmlcharrefreplace").decode("ascii")


def write_report(runs, out_path: str | Path, *, notes: list[str] | None = None,
                 title: str | None = None) -> Path:
    """Write the HTML report of ``runs`` (a ``Results`` or list of ``Run``/``Sweep``)
    to ``out_path`` atomically; return the path."""
    out_path = Path(out_path)
    write_text(out_path, render_report(runs, notes=notes, title=title))
    return out_path


__all__ = ["write_report", "render_report", "scenario_differences", "digest_verdict"]
