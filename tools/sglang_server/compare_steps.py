#!/usr/bin/env python3
"""Compare a server-harness output with an engine ``--record-steps`` file, step by step.

    python tools/sglang_server/compare_steps.py HARNESS.jsonl[.gz] ENGINE.jsonl[.gz] [--name RUN]

Only the contract fields are compared (the harness writes many more):

* per ``step`` record, by step number: ``mode``, ``rids``, ``extend``, ``prefix``,
  ``chunked``, ``adds`` (``[rid, result]`` per ``PrefillAdder.add_one_req``),
  ``retracted``, and ``hc.write`` (``[node, tokens, ok]``), ``hc.write_ack``,
  ``hc.load``, ``hc.init_load_back``, ``hc.digest``;
* per ``req`` record, by rid: ``first_sched_step``, ``finish_step``,
  ``cached_tokens``, ``cached_tokens_device``, ``cached_tokens_host``.

Normalisation (both sides alike): a list field that is absent or null is ``[]``
(the harness omits empty ``hc`` lists, and ``mode``/``rids``/``extend``/``prefix``
on a step without a batch); a scalar that is absent is null; ``adds`` keeps
``[rid, result]`` of each entry, whether it is the harness's dict
(``{"rid", "res", ...}``), its ``--quiet-steps`` triple, or a pair; ``retracted``
is flattened to the rids in order (the harness keeps one list per
``retract_decode`` call). Every step number present on either side must be
present on both.

Prints one line; at the first difference, prints the step (or rid), the fields
that differ, and both sides' records compactly, and exits 1. Exits 2 on a file
that cannot be read.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

STEP_LISTS = ("rids", "extend", "prefix", "adds", "retracted")
STEP_SCALARS = ("mode", "chunked")
HC_LISTS = ("write", "write_ack", "load", "init_load_back")
HC_SCALARS = ("digest",)
REQ_FIELDS = ("first_sched_step", "finish_step", "cached_tokens", "cached_tokens_device",
              "cached_tokens_host")
STEP_FIELDS = (STEP_SCALARS[0], STEP_LISTS[0], STEP_LISTS[1], STEP_LISTS[2], STEP_SCALARS[1],
               STEP_LISTS[3], STEP_LISTS[4]) + tuple("hc." + k for k in HC_LISTS + HC_SCALARS)


class ReadError(Exception):
    pass


def read_records(path: Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    rows = []
    try:
        with opener(path, "rt") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError as e:
                    raise ReadError(f"{path}:{n}: found invalid JSON ({e}); expected one "
                                    "record per line") from None
                if not isinstance(rec, dict):
                    raise ReadError(f"{path}:{n}: found a JSON {type(rec).__name__}; "
                                    "expected an object")
                rows.append(rec)
    except (OSError, EOFError) as e:
        raise ReadError(f"{path}: cannot read ({e})") from None
    return rows


def _list(v):
    return [] if v is None else v


def _adds(v) -> list:
    out = []
    for a in _list(v):
        if isinstance(a, dict):
            out.append([a.get("rid"), a.get("res", a.get("result"))])
        elif isinstance(a, (list, tuple)):
            out.append(list(a[:2]))
        else:
            out.append(a)
    return out


def _retracted(v) -> list:
    out = []
    for x in _list(v):
        if isinstance(x, list):
            out.extend(x)
        else:
            out.append(x)
    return out


def norm_step(rec: dict) -> dict:
    """The contract fields of a step record, normalised (see the module doc)."""
    d = {}
    for k in STEP_FIELDS:
        if k.startswith("hc."):
            hc = rec.get("hc") or {}
            v = hc.get(k[3:])
            d[k] = v if k[3:] in HC_SCALARS else _list(v)
        elif k == "adds":
            d[k] = _adds(rec.get(k))
        elif k == "retracted":
            d[k] = _retracted(rec.get(k))
        elif k in STEP_LISTS:
            d[k] = _list(rec.get(k))
        else:
            d[k] = rec.get(k)
    # JSON round trip: tuples and lists compare alike
    return json.loads(json.dumps(d))


def norm_req(rec: dict) -> dict:
    return {k: rec.get(k) for k in REQ_FIELDS}


def split(rows: list[dict], path) -> tuple[dict, dict, list]:
    steps, reqs, errors = {}, {}, []
    for r in rows:
        t = r.get("type")
        if t == "step":
            s = r.get("step")
            if not isinstance(s, int):
                raise ReadError(f"{path}: found a step record with step {s!r}; expected an integer")
            if s in steps:
                raise ReadError(f"{path}: found step {s} twice; expected one record per step")
            steps[s] = r
        elif t == "req":
            reqs[r.get("rid")] = r
        elif t == "error":
            errors.append(r)
    return steps, reqs, errors


def _compact(d: dict) -> str:
    return json.dumps({k: v for k, v in d.items() if v not in ([], None)}, separators=(",", ":"))


class Result:
    def __init__(self):
        self.steps = 0
        self.reqs = 0
        self.diff: str | None = None
        self.diff_step: int | None = None
        self.diff_fields: list[str] = []
        self.harness_error: dict | None = None  # the harness's error record, if SGLang raised


def compare(harness_rows: list[dict], engine_rows: list[dict], hpath="harness", epath="engine") -> Result:
    hs, hr, herr = split(harness_rows, hpath)
    es, er, _ = split(engine_rows, epath)
    res = Result()
    for s in sorted(set(hs) | set(es)):
        if s not in es or s not in hs:
            side, other = ("engine", "harness") if s not in es else ("harness", "engine")
            rec = norm_step(hs.get(s) or es.get(s))
            res.diff_step, res.diff_fields = s, ["step"]
            res.diff = (f"step {s}: missing on the {side} side "
                        f"({side} has {len(es if side == 'engine' else hs)} steps, "
                        f"{other} {len(hs if side == 'engine' else es)})\n"
                        f"  {other:<8} {_compact(rec)}")
            return res
        a, b = norm_step(hs[s]), norm_step(es[s])
        if a != b:
            res.diff_step = s
            res.diff_fields = [k for k in STEP_FIELDS if a[k] != b[k]]
            res.diff = (f"step {s}: {', '.join(res.diff_fields)} differ\n"
                        f"  harness {_compact(a)}\n  engine  {_compact(b)}")
            return res
        res.steps += 1
    for rid in sorted(set(hr) | set(er), key=lambda r: (len(str(r)), str(r))):
        if rid not in er or rid not in hr:
            side = "engine" if rid not in er else "harness"
            res.diff_fields = ["req"]
            res.diff = f"request {rid}: missing on the {side} side"
            return res
        a, b = norm_req(hr[rid]), norm_req(er[rid])
        if a != b:
            res.diff_fields = [k for k in REQ_FIELDS if a[k] != b[k]]
            res.diff = (f"request {rid}: {', '.join(res.diff_fields)} differ\n"
                        f"  harness {_compact(a)}\n  engine  {_compact(b)}")
            return res
        res.reqs += 1
    if herr:
        res.harness_error = herr[0]
    return res


def compare_files(harness: Path, engine: Path) -> Result:
    return compare(read_records(harness), read_records(engine), harness, engine)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("harness")
    ap.add_argument("engine")
    ap.add_argument("--name", help="the run's name in the printed line")
    a = ap.parse_args(argv)
    name = a.name or Path(a.harness).name
    try:
        res = compare_files(Path(a.harness), Path(a.engine))
    except ReadError as e:
        print(e, file=sys.stderr)
        return 2
    if res.diff is None:
        print(f"{name}: {res.steps} steps, {res.reqs} requests identical")
        return 0
    print(f"{name}: DIFFERS after {res.steps} identical steps at {res.diff}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
