"""SGLang 0.5.23's crash dumps and request dumps, read into plain records.

Both are one pickled dict (managers/tokenizer_manager.py):

* a crash dump (``dump_requests_before_crash``): ``server_args`` (the ``ServerArgs``,
  or None when it did not pickle), ``config_updates``, ``resolved_config`` (the
  server args as a plain dict, ``ServerArgs.resolved_dict`` plus the control-plane
  changes), ``requests`` and ``launch_command`` (``sys.argv``);
* a request dump (``dump_requests``, one file per ``dump_requests_threshold``
  requests in ``dump_requests_folder``, set through ``configure_logging``;
  managers/configure_logging.py): the same without ``launch_command``.

``requests`` is a list of ``(obj, out, created, finished)``: the request
(``GenerateReqInput``; a crash dump copies finished ones with ``input_ids`` as a
tuple, record_request_for_crash_dump), its last output dict (``output_ids``,
``meta_info`` with ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``; for an
unfinished request of a crash dump only ``get_crash_dump_output()``: the text and
output ids so far), and wall-clock created / finished times (``convert_time_to_realtime``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from sim import safeio
from sim.imports import unpickle
from sim.imports.unpickle import Refused, StandIn

# A request dump folder holds at most this many files (a day of dumps at one a second
# would be 86,400; a real folder has a handful).
MAX_FILES = 100_000


@dataclass
class DumpRequest:
    rid: str
    input_ids: tuple
    output_len: int
    created: float
    finished: float
    done: bool  # finished before the dump (else: in flight at the crash)
    cached_tokens: int | None
    max_new_tokens: int | None


@dataclass
class Dump:
    path: str
    kind: str  # "crash" or "requests"
    server_args: dict  # field -> value, plain
    model_config: object | None  # the ModelConfig stand-in, when server_args pickled
    launch_command: str | None
    requests: list = field(default_factory=list)
    skipped: list = field(default_factory=list)  # (rid, why)


def _read_one(path: Path, max_bytes: int, max_items: int) -> dict:
    where = str(path)
    data = safeio.read_bytes(path, "a dump file", limit=max_bytes)
    obj = unpickle.loads(data, where, max_items=max_items)
    if not isinstance(obj, dict) or "requests" not in obj:
        raise Refused(f"a pickled {type(obj).__name__}; expected SGLang's dump dict (with "
                      "'requests' and 'server_args')", where=where)
    if not isinstance(obj["requests"], (list, tuple)):
        raise Refused(f"'requests' is a {type(obj['requests']).__name__}; expected a list of "
                      "(request, output, created, finished)", where=where)
    return obj


def _server_args(obj: dict, where: str) -> tuple[dict, object | None]:
    rc = obj.get("resolved_config")
    sa = obj.get("server_args")
    fields = None
    model_config = None
    if isinstance(sa, unpickle.ServerArgs):
        fields = sa.get("fields")
        model_config = sa.get("model_config")
    elif isinstance(sa, dict):  # the watermark path: resolved_dict() already
        fields = sa
    if isinstance(rc, dict):  # the config in effect: preferred over the launch values
        merged = dict(fields or {})
        merged.update(rc)
        fields = merged
    if not isinstance(fields, dict):
        raise Refused("no server args (server_args and resolved_config are both None: the "
                      "server's args did not pickle); expected a dump with its server args",
                      where=where)
    return fields, model_config


def _int_tuple(v) -> tuple | None:
    if isinstance(v, (list, tuple)) and all(type(x) is int for x in v):
        return tuple(v)
    return None


def _requests(rows, where: str, dump: Dump) -> None:
    for i, row in enumerate(rows):
        if not (isinstance(row, tuple) and len(row) == 4):
            raise Refused(f"requests[{i}] is not a (request, output, created, finished) tuple",
                          where=where)
        req, out, created, finished = row
        if not isinstance(req, StandIn):
            raise Refused(f"requests[{i}][0] is a {type(req).__name__}; expected a "
                          "GenerateReqInput", where=where)
        if not isinstance(req, unpickle.GenerateReqInput):
            dump.skipped.append((str(req.get("rid")), f"a {req.sglang_name} (not a generation)"))
            continue
        for name, t in (("created", created), ("finished", finished)):
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
                raise Refused(f"requests[{i}] {name} time {t!r}; expected a number (seconds)",
                              where=where)
        out = out if isinstance(out, dict) else {}
        meta = out.get("meta_info") if isinstance(out.get("meta_info"), dict) else {}
        ids = req.get("input_ids")
        rid = req.get("rid")
        rows_ids = []
        if _int_tuple(ids) is not None:
            rows_ids = [(rid, _int_tuple(ids))]
        elif isinstance(ids, (list, tuple)) and ids and all(_int_tuple(r) is not None for r in ids):
            # A batch request: one row per prompt (is_single False), rids a list.
            rids = rid if isinstance(rid, (list, tuple)) and len(rid) == len(ids) else \
                [f"{rid}#{k}" for k in range(len(ids))]
            rows_ids = [(r, _int_tuple(x)) for r, x in zip(rids, ids)]
            meta = {}
        else:
            why = "text only (the dump holds no token ids; this reader has no tokenizer)" \
                if ids is None else "input_ids that are not token ids"
            dump.skipped.append((str(rid), why))
            continue
        out_ids = out.get("output_ids")
        n_out = len(out_ids) if isinstance(out_ids, (list, tuple)) else None
        if n_out is None and type(meta.get("completion_tokens")) is int:
            n_out = meta["completion_tokens"]
        sp = req.get("sampling_params")
        mnt = sp.get("max_new_tokens") if isinstance(sp, dict) else None
        mnt = mnt if type(mnt) is int else None
        done = meta.get("finish_reason") is not None or "meta_info" in out
        for r, toks in rows_ids:
            if not toks:
                dump.skipped.append((str(r), "an empty prompt"))
                continue
            ct = meta.get("cached_tokens")
            dump.requests.append(DumpRequest(
                rid=str(r), input_ids=toks, output_len=max(1, n_out or 0) if n_out else (mnt or 1),
                created=float(created), finished=float(finished), done=bool(done),
                cached_tokens=ct if type(ct) is int else None, max_new_tokens=mnt))


def read(path, *, max_bytes: int = unpickle.MAX_BYTES, max_items: int = unpickle.MAX_ITEMS) -> Dump:
    """A crash dump (a ``.pkl`` file) or a request-dump folder (its ``*.pkl`` files, in
    name order: SGLang names them by the second they were written)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix == ".pkl")
        if not files:
            raise Refused("a folder with no .pkl files; expected a crash dump file or a "
                          "dump_requests_folder", where=str(p))
        if len(files) > MAX_FILES:
            raise Refused(f"{len(files):,} dump files; expected at most {MAX_FILES:,}", where=str(p))
        kind = "requests"
    else:
        files = [p]
        kind = None
    dump = None
    for f in files:
        obj = _read_one(f, max_bytes, max_items)
        if dump is None:
            fields, mc = _server_args(obj, str(f))
            k = kind or ("crash" if "launch_command" in obj else "requests")
            lc = obj.get("launch_command")
            # redact_watermark_command_line joins sys.argv into one string.
            if isinstance(lc, (list, tuple)):
                lc = " ".join(str(a) for a in lc)
            dump = Dump(path=str(p), kind=k, server_args=fields, model_config=mc,
                        launch_command=lc if isinstance(lc, str) else None)
        _requests(obj["requests"], str(f), dump)
    if not dump.requests:
        raise Refused(f"no request with token ids ({len(dump.skipped)} skipped"
                      + (f", first: {dump.skipped[0][1]}" if dump.skipped else "")
                      + "); expected at least one", where=str(p))
    dump.requests.sort(key=lambda r: (r.created, r.rid))
    return dump
