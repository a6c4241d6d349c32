"""Streamed request-trace readers: Mooncake JSONL, agentic JSON, and a generic format.

Every reader is an iterable of :class:`Request` (re-iterable: each pass re-reads the
file) that never loads a whole line-oriented file: it walks lines one at a time. A
malformed record raises :class:`InputFormatError` naming the file, the line and what
was expected; with ``skip_bad_lines=True`` it is skipped instead, and counted in the
reader's ``skipped`` (the first message is kept in ``first_skip``).

The planner, which wants the whole trace as arrays, has one exception:
``MooncakeReader.arrays`` reads a Mooncake file whole (msgspec's typed decoder, ids
renumbered with ``np.unique``) and gives exactly what iterating gives, or None where
a record needs the record-by-record reader's judgement (its errors, its skips, the
forms only it reads); tests compare the two on the shipped traces and random ones.

Block ids are made unique across the whole stream through an :class:`IdSpace`, so a
trace can be mixed with other sources without accidental sharing.

Formats (see /work/shared/data/traces/README.md for the two public ones):

* **mooncake** (JSONL): ``{"timestamp": ms, "input_length": n, "output_length": m,
  "hash_ids": [...]}``, 512-token blocks. ``hash_ids`` are already *prefix* ids (hash
  i names the prefix up to block i; checked on both shipped files: every id always
  follows the same predecessor). They are only renumbered into the stream's id space.
* **agentic** (one JSON object per conversation file, a folder of them): 64-token
  blocks, ``t`` seconds from conversation start, ``in``/``out``/``hash_ids`` per
  request, sub-agents nested as ``{"type": "subagent", "t": ..., "requests": [...]}``
  whose own ``t`` are relative to the sub-agent's start. Hash ids are local to each
  file. In the shipped subset each id always follows the same predecessor (they behave
  as prefix ids), but the format does not promise it, so the reader interns
  ``(previous prefix id, hash)`` -> a fresh id, per conversation: correct for content
  hashes and prefix hashes alike, and it namespaces each conversation. ``hash_ids``
  cover only the *full* blocks of the input (``len == in // 64``); the reader appends
  one fresh, never-shared id for a trailing partial block.
* **generic** (JSONL, or CSV with a header when the file ends in ``.csv``): one request
  per record with fields ``arrival_s`` (seconds, non-decreasing), ``input_len``,
  ``output_len``, ``block_size`` (optional when the scenario gives one), ``blocks``
  (a list of ints, or a string of ints separated by spaces or commas, optionally in
  ``[...]``) and ``session`` (optional int, default -1). ``blocks`` holds
  ``ceil(input_len / block_size)`` ids (or ``input_len // block_size``: a fresh id is
  then added for the partial tail). With ``block_ids: prefix`` (default) they are
  prefix ids; with ``block_ids: content`` they are per-block content hashes and are
  interned like the agentic ones. Blank lines and lines starting with ``#`` are
  ignored; unknown fields are ignored.
"""

from __future__ import annotations

import csv
import heapq
import itertools
import json
import math
import re
from pathlib import Path
from typing import Iterator

import numpy as np

from sim import jsonl, safeio
from sim.errors import InputFormatError, UserError
from sim.workloads.base import IdSpace, Request

# Mooncake FAST'25 traces hash 512-token blocks (traces README §1).
MOONCAKE_BLOCK_SIZE = 512
# WEKA kv-cache-tester traces hash 64-token blocks (traces README §2; also in each file).
AGENTIC_BLOCK_SIZE = 64
# Sanity bound on token counts and block sizes in any trace record: far above any
# real context, low enough that later arithmetic stays in ordinary ints and floats.
MAX_TOKENS = 10**9

# At most 40 digits: Python refuses to parse integers of thousands of digits, and no
# id or count needs more.
_INT_RE = re.compile(r"-?[0-9]{1,40}\Z")
_SPLIT_RE = re.compile(r"[\s,]+")

# (arrival, blocks, block_size, input_len, output_len, session)
Record = tuple



def _remap(hs, remap: dict, ids) -> list[int]:
    """The trace's prefix ids as ids of this stream's id space (new ones on first sight,
    in the order they first appear)."""
    get = remap.get
    out = list(map(get, hs))  # one pass in C for the ids already seen
    if None in out:
        # New ids come from the first unseen position on (a trace's new blocks are the
        # record's tail): only those positions are walked, and the id space's counter
        # is advanced once, as ``ids.new()`` per id would.
        nid = ids.next_id
        for i in range(out.index(None), len(out)):
            if out[i] is None:
                h = hs[i]
                v = get(h)  # an earlier position of this record may have just named it
                if v is None:
                    v = remap[h] = nid
                    nid += 1
                out[i] = v
        ids.next_id = nid
    return out

class TraceArrays:
    """A whole trace as arrays: request ``i`` has ``counts[i]`` block ids, back to back
    in ``blocks``, of ``block_size`` tokens, ``input_len[i]`` / ``output_len[i]``
    tokens and its ``arrival`` in seconds (``Request``'s fields, column by column)."""

    __slots__ = ("blocks", "counts", "block_size", "input_len", "output_len", "arrival")

    def __init__(self, blocks, counts, block_size, input_len, output_len, arrival):
        self.blocks, self.counts, self.block_size = blocks, counts, block_size
        self.input_len, self.output_len, self.arrival = input_len, output_len, arrival

    def __len__(self) -> int:
        return len(self.counts)

    def head(self, n: int) -> "TraceArrays":
        """The first ``n`` requests."""
        k = int(self.counts[:n].sum())
        return TraceArrays(self.blocks[:k], self.counts[:n], self.block_size, self.input_len[:n],
                           self.output_len[:n], self.arrival[:n])


_MOONCAKE_DEC = None


def _mooncake_decoder():
    """msgspec's typed decoder of one Mooncake record (None without msgspec): the
    record's fields only in the forms the plain reader reads as they are (a number,
    an integer, a list of integers); anything else fails it."""
    global _MOONCAKE_DEC
    if _MOONCAKE_DEC is None:
        try:
            import msgspec
        except ImportError:
            return None

        class MooncakeRecord(msgspec.Struct):
            timestamp: float
            input_length: int
            output_length: int
            hash_ids: list[int]

        _MOONCAKE_DEC = msgspec.json.Decoder(MooncakeRecord)
    return _MOONCAKE_DEC


def _first_seen_ids(hs: np.ndarray, counts: np.ndarray, tail: np.ndarray, ids: IdSpace) -> np.ndarray:
    """``_remap`` over the whole trace at once, with ``_fit_blocks``'s fresh id after
    the hashes of each ``tail`` record: ids of ``ids`` in the order the trace ids (and
    the fresh tails) first appear."""
    n = len(counts)
    out_counts = counts + tail
    out_starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(out_counts, out=out_starts[1:])
    total = int(out_starts[-1])
    rec = np.repeat(np.arange(n, dtype=np.int64), counts)
    in_starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=in_starts[1:])
    real_pos = np.arange(len(hs), dtype=np.int64) + (out_starts[:-1] - in_starts[:-1])[rec]
    tail_pos = (out_starts[1:] - 1)[tail]
    new = np.zeros(total, dtype=bool)
    if len(hs):
        _, first, inv = np.unique(hs, return_index=True, return_inverse=True)
        new[real_pos[first]] = True
    new[tail_pos] = True
    fresh = np.cumsum(new) - 1 + ids.next_id  # at a new position: the id it takes
    out = np.empty(total, dtype=np.int64)
    if len(hs):
        out[real_pos] = fresh[real_pos[first]][inv.reshape(-1)]
    out[tail_pos] = fresh[tail_pos]
    ids.next_id += int(new.sum())
    return out


class _Bad(Exception):
    """A malformed record: what was found and what was expected."""

    def __init__(self, found: str, expected: str):
        super().__init__(found)
        self.found, self.expected = found, expected


def _short(v, limit: int = 60) -> str:
    """A one-line, bounded repr of a found value."""
    s = repr(v).replace("\n", "\\n").replace("\r", "\\r")
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _int(rec: dict, key: str, lo: int, hi: int = MAX_TOKENS) -> int:
    if key not in rec:
        raise _Bad(f"no {key!r}", f"an integer {key!r}")
    v = rec[key]
    if isinstance(v, str) and _INT_RE.match(v.strip()):
        v = int(v.strip())
    if type(v) is float and v.is_integer() and abs(v) < 2**53:
        v = int(v)
    if type(v) is not int:
        raise _Bad(f"{key} = {_short(v)}", f"an integer {key!r}")
    if not lo <= v <= hi:
        raise _Bad(f"{key} = {v}", f"{key!r} in [{lo}, {hi}]")
    return v


def _num(rec: dict, key: str, lo: float = 0.0, hi: float = 1e12) -> float:
    if key not in rec:
        raise _Bad(f"no {key!r}", f"a number {key!r}")
    v = rec[key]
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            raise _Bad(f"{key} = {_short(v)}", f"a number {key!r}") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Bad(f"{key} = {_short(v)}", f"a number {key!r}")
    try:
        v = float(v)
    except OverflowError:  # an integer too large for a float
        raise _Bad(f"{key} = {_short(v)}", f"a finite {key!r} in [{lo:g}, {hi:g}]") from None
    if not (math.isfinite(v) and lo <= v <= hi):
        raise _Bad(f"{key} = {v}", f"a finite {key!r} in [{lo:g}, {hi:g}]")
    return v


def _int_list(v, key: str) -> list[int]:
    """A list of ints: a JSON list, or a string of ints split on spaces/commas."""
    if isinstance(v, str):
        s = v.strip()
        if s.startswith("[") and s.endswith("]"):
            s = s[1:-1]
        parts = [p for p in _SPLIT_RE.split(s) if p]
        if not all(_INT_RE.match(p) for p in parts):
            raise _Bad(f"{key} = {_short(v)}", f"{key!r} as integers separated by spaces")
        return [int(p) for p in parts]
    if not isinstance(v, list):
        raise _Bad(f"{key} = {_short(v)}", f"a list of integers {key!r}")
    for x in v:
        if type(x) is not int:
            raise _Bad(f"{key} element {_short(x)}", f"a list of integers {key!r}")
    return v


def _fit_blocks(hs: list[int], input_len: int, block_size: int, ids: IdSpace) -> list[int] | None:
    """Check the block count; append a fresh id when only full blocks were hashed.

    Returns None when the count is neither ceil(input_len / bs) nor the full-block
    count (the caller reports the record as bad).
    """
    n_full = input_len // block_size
    n_all = -(-input_len // block_size)
    if len(hs) == n_all:
        return hs
    if len(hs) == n_full:  # only full blocks hashed: the partial tail is unshared
        hs.append(ids.new())
        return hs
    return None


def _block_count_error(n: int, input_len: int, block_size: int) -> _Bad:
    return _Bad(
        f"{n} block ids for {input_len} tokens",
        f"ceil({input_len} / {block_size}) = {-(-input_len // block_size)} block ids",
    )


def _open_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) for each line, decoded lazily (one bounded line in memory;
    regular files only, ``.gz`` decompressed: ``sim.safeio``)."""
    for lineno, raw in safeio.open_lines(path, "a trace file"):
        # surrogateescape: undecodable bytes survive as lone surrogates and then
        # fail the field checks, which report the line, instead of aborting here.
        yield lineno, raw.decode("utf-8", "surrogateescape")


def _empty(path, skipped: int, what: str = "request records") -> InputFormatError:
    """The error for a trace that gave nothing to simulate."""
    found = f"no valid {what} ({skipped} bad ones skipped)" if skipped else f"no {what} (an empty trace)"
    return InputFormatError(path, None, found, f"at least one of the {what}")


def _json_obj(text: str) -> dict:
    rec = jsonl.loads(text)  # msgspec, or None: then json's own result or error
    if rec is None:
        rec = _json_loads(text)
    if not isinstance(rec, dict):
        raise _Bad(f"a JSON {type(rec).__name__}", "one JSON object per line")
    return rec


def _json_loads(text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise _Bad(f"invalid JSON ({_short(msg, 80)})", "one JSON object per line") from None


class _LineReader:
    """Shared machinery: numbering, skip counting, the id space."""

    expected_record = "a record"

    def __init__(self, path, *, rate_scale: float = 1.0, skip_bad_lines: bool = False,
                 ids: IdSpace | None = None):
        self.path = Path(path)
        if not rate_scale > 0 or not math.isfinite(rate_scale):
            raise UserError(f"found rate_scale {rate_scale}; expected a positive number")
        self.rate_scale = float(rate_scale)
        self.skip_bad_lines = skip_bad_lines
        self.ids = ids if ids is not None else IdSpace()
        self.skipped = 0
        self.first_skip: str | None = None

    def _bad(self, line: int | None, bad: _Bad) -> None:
        err = InputFormatError(self.path, line, bad.found, bad.expected)
        if not self.skip_bad_lines:
            raise err
        self.skipped += 1
        if self.first_skip is None:
            self.first_skip = str(err)

    def records(self) -> Iterator[Record]:  # pragma: no cover - abstract
        raise NotImplementedError

    def __iter__(self) -> Iterator[Request]:
        self.skipped = 0
        self.first_skip = None
        rid = -1
        for rid, (arrival, blocks, bs, n_in, n_out, session) in enumerate(self.records()):
            yield Request(rid, arrival, tuple(blocks), bs, n_in, n_out, session)
        if rid < 0:  # nothing to simulate: an error, not a run of 0 requests
            raise _empty(self.path, self.skipped)


class MooncakeReader(_LineReader):
    """Mooncake FAST'25 JSONL: ``timestamp`` (ms), lengths, 512-token prefix ``hash_ids``."""

    def __init__(self, path, *, block_size: int = MOONCAKE_BLOCK_SIZE, **kw):
        super().__init__(path, **kw)
        self.block_size = block_size

    def records(self) -> Iterator[Record]:
        ids, bs = self.ids, self.block_size
        remap: dict[int, int] = {}  # trace prefix id -> stream id
        last = 0.0
        for lineno, line in _open_lines(self.path):
            if not line.strip():
                continue
            try:
                rec = _json_obj(line)
                ts = _num(rec, "timestamp")
                n_in = _int(rec, "input_length", 1)
                n_out = _int(rec, "output_length", 0)
                if "hash_ids" not in rec:
                    raise _Bad("no 'hash_ids'", "a list of integers 'hash_ids'")
                hs = _int_list(rec["hash_ids"], "hash_ids")
                if ts / 1000.0 < last:
                    raise _Bad(
                        f"timestamp {ts:g} ms after {last * 1000:g} ms",
                        "non-decreasing timestamps",
                    )
                n = len(hs)
                blocks = _remap(hs, remap, ids)
                if _fit_blocks(blocks, n_in, bs, ids) is None:
                    raise _block_count_error(n, n_in, bs)
            except _Bad as bad:
                self._bad(lineno, bad)
                continue
            last = ts / 1000.0
            yield last / self.rate_scale, blocks, bs, n_in, n_out, -1


    def arrays(self) -> "TraceArrays | None":
        """The whole trace at once as arrays (for the planner: no Request per record),
        exactly what iterating this reader gives; None where only the record-by-record
        reader can say what the trace holds (a record it would refuse or skip, a field
        in a form only it reads), so the caller iterates instead. Bounded as the plain
        reader is (``safeio.LIMIT_STREAM``, ``safeio.LIMIT_LINE``)."""
        dec = _mooncake_decoder()
        if dec is None:
            return None
        try:
            data = safeio.read_bytes(self.path, "a trace file", safeio.LIMIT_STREAM)
        except UserError:
            return None  # the plain reader reports it, naming the line
        lines = data.split(b"\n")
        if len(data) > safeio.LIMIT_LINE and max(map(len, lines)) >= safeio.LIMIT_LINE:
            return None
        try:
            recs = [dec.decode(line) for line in lines if line.strip()]
        except (ValueError, RecursionError):  # msgspec.ValidationError and DecodeError
            return None
        if not recs:
            return None
        ts = np.array([r.timestamp for r in recs], dtype=float)
        try:
            n_in = np.array([r.input_length for r in recs], dtype=np.int64)
            n_out = np.array([r.output_length for r in recs], dtype=np.int64)
            hs = np.array(list(itertools.chain.from_iterable(r.hash_ids for r in recs)), dtype=np.int64)
        except OverflowError:
            return None
        counts = np.array([len(r.hash_ids) for r in recs], dtype=np.int64)
        secs = ts / 1000.0
        bs = self.block_size
        if not (np.isfinite(ts).all() and (ts >= 0).all() and (ts <= 1e12).all()
                and (n_in >= 1).all() and (n_in <= MAX_TOKENS).all()
                and (n_out >= 0).all() and (n_out <= MAX_TOKENS).all()
                and (secs[1:] >= secs[:-1]).all()):
            return None
        n_all = -(-n_in // bs)
        tail = (counts == n_in // bs) & (counts != n_all)  # only full blocks hashed
        if not ((counts == n_all) | tail).all():
            return None
        blocks = _first_seen_ids(hs, counts, tail, self.ids)
        return TraceArrays(blocks, counts + tail, bs, n_in, n_out, secs / self.rate_scale)


class GenericReader(_LineReader):
    """The documented generic format (JSONL, or CSV when the name ends in ``.csv``)."""

    FIELDS = ("arrival_s", "input_len", "output_len", "block_size", "blocks", "session")

    def __init__(self, path, *, block_size: int | None = None, block_ids: str = "prefix", **kw):
        super().__init__(path, **kw)
        if block_ids not in ("prefix", "content"):
            raise UserError(f"found block_ids {block_ids!r}; expected 'prefix' or 'content'")
        self.block_size = block_size
        self.block_ids = block_ids
        # engine.clock steps: each row's arrival is its integer ``arrival_step``
        # (the server harness's field) instead of ``arrival_s``.
        self.steps = False

    def _rows(self) -> Iterator[tuple[int, dict | _Bad]]:
        lines = _open_lines(self.path)
        if safeio.suffix(self.path) != ".csv":
            for lineno, line in lines:
                s = line.strip()
                if not s or s.startswith("#"):
                    continue
                try:
                    yield lineno, _json_obj(line)
                except _Bad as bad:
                    yield lineno, bad
            return
        # CSV: the csv module pulls physical lines from `feed`; `pos` tracks the line.
        # the physical line, how many lines the reader has taken, the row's first line
        pos = [0, 0, None]

        def feed():
            for lineno, line in lines:
                pos[0] = lineno
                if line.strip() and not line.lstrip().startswith("#"):
                    pos[1] += 1
                    if pos[2] is None:
                        pos[2] = lineno
                    yield line

        # strict: a quote left open at the end is an error, not a silent field
        reader = csv.reader(feed(), strict=True)
        header = None
        while True:
            taken, pos[2] = pos[1], None
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                yield pos[2] or pos[0], _Bad(f"unreadable CSV ({_short(str(err), 60)}; an "
                                             "unclosed quote?)", "a CSV row with its quotes closed")
                continue
            if pos[1] - taken > 1:
                # One request per line: a quoted field running on over lines swallowed
                # the rows below it (an unclosed quote).
                raise InputFormatError(self.path, pos[2], f"a quoted field running over "
                                       f"{pos[1] - taken} lines (to line {pos[0]}; an unclosed quote?)",
                                       "one CSV row per line, its quotes closed")
            if header is None:
                header = [h.strip() for h in row]
                missing = [f for f in ("arrival_s", "input_len", "output_len", "blocks")
                           if f not in header]
                if missing:
                    raise InputFormatError(
                        self.path, pos[0], f"header {_short(','.join(header), 80)}",
                        f"a CSV header naming {', '.join(self.FIELDS)} (missing {', '.join(missing)})",
                    )
                continue
            if len(row) != len(header):
                yield pos[0], _Bad(f"{len(row)} fields", f"{len(header)} fields as in the header")
                continue
            yield pos[0], dict(zip(header, row))

    def records(self) -> Iterator[Record]:
        ids = self.ids
        remap: dict[int, int] = {}
        intern: dict[tuple[int, int], int] = {}
        last = 0.0
        for lineno, rec in self._rows():
            try:
                if isinstance(rec, _Bad):
                    raise rec
                if self.steps:
                    if "arrival_step" not in rec:
                        raise _Bad("no 'arrival_step'" + (" (arrival_s given)" if "arrival_s" in rec else ""),
                                   "an integer 'arrival_step' (engine.clock steps)")
                    arrival = float(_int(rec, "arrival_step", 0, 10**12))
                elif "arrival_s" not in rec and "arrival_step" in rec:
                    raise _Bad("'arrival_step' without 'arrival_s'",
                               "'arrival_s' (or engine.clock steps for arrival_step)")
                else:
                    arrival = _num(rec, "arrival_s")
                n_in = _int(rec, "input_len", 1)
                n_out = _int(rec, "output_len", 0)
                if "block_size" in rec and rec["block_size"] not in ("", None):
                    bs = _int(rec, "block_size", 1)
                elif self.block_size is not None:
                    bs = self.block_size
                else:
                    raise _Bad("no 'block_size'", "a 'block_size' field (or workload.block_size)")
                session = -1
                if "session" in rec and rec["session"] not in ("", None):
                    session = _int(rec, "session", -1, 2**62)
                if "blocks" not in rec:
                    raise _Bad("no 'blocks'", "a list of integers 'blocks'")
                hs = _int_list(rec["blocks"], "blocks")
                if arrival < last:
                    f = "arrival_step" if self.steps else "arrival_s"
                    raise _Bad(f"{f} {arrival:g} after {last:g}", f"non-decreasing {f}")
                n = len(hs)
                if self.block_ids == "prefix":
                    blocks = _remap(hs, remap, ids)
                else:
                    blocks, p = [], -1
                    for h in hs:
                        v = intern.get((p, h))
                        if v is None:
                            v = intern[(p, h)] = ids.new()
                        blocks.append(v)
                        p = v
                if _fit_blocks(blocks, n_in, bs, ids) is None:
                    raise _block_count_error(n, n_in, bs)
            except _Bad as bad:
                self._bad(lineno, bad)
                continue
            last = arrival
            self.line = lineno  # where the record just yielded is (for later checks)
            yield arrival / self.rate_scale, blocks, bs, n_in, n_out, session


class AgenticReader(_LineReader):
    """A folder (or one file) of agentic conversation traces, merged by arrival.

    Each conversation starts at an offset: all at 0 (``start="zero"``), or staggered
    by a seeded Poisson process of ``start_rate`` conversations per second, in file
    order (``start="poisson"``; the first starts at 0). A conversation's file is loaded
    only when its start time comes up and dropped when its last request is out, so a
    staggered run holds few conversations at a time. Streams merge through a heap keyed
    by (time, conversation, index): deterministic. ``session`` is the conversation's
    index in file order; sub-agent requests keep their parent's session.

    Each malformed file (bad JSON, no ``requests``) or request counts one in
    ``skipped`` under ``skip_bad_lines``.
    """

    def __init__(self, path, *, start: str = "zero", start_rate: float | None = None,
                 seed: int = 0, **kw):
        super().__init__(path, **kw)
        if start not in ("zero", "poisson"):
            raise UserError(f"found conversation start {start!r}; expected 'zero' or 'poisson'")
        if start == "poisson" and not (start_rate and start_rate > 0):
            raise UserError(f"found start_rate {start_rate!r}; expected a positive rate")
        self.start, self.start_rate, self.seed = start, start_rate, seed
        self._current: Path | None = None
        if self.path.is_dir():
            self.files = sorted(p for p in self.path.iterdir()
                                if p.name.endswith((".json", ".json.gz")) and p.is_file())
            if not self.files:
                raise UserError("found no *.json or *.json.gz conversation files in the folder; "
                                "expected agentic trace files", where=str(self.path))
        elif self.path.is_file():
            self.files = [self.path]
        else:
            raise UserError("no such file or folder", where=str(self.path))

    def offsets(self) -> list[float]:
        n = len(self.files)
        if self.start == "zero":
            return [0.0] * n
        rng = np.random.Generator(np.random.PCG64(self.seed))
        gaps = rng.exponential(1.0 / self.start_rate, n)
        gaps[0] = 0.0
        return np.cumsum(gaps).tolist()

    # -- one conversation -------------------------------------------------------
    def _load(self, path: Path) -> list[tuple] | None:
        """The conversation's requests, flattened and sorted by time.

        Each event: (t, order, stream, hash_ids, in, out, block_size). Returns None
        when the file is skipped.
        """
        data = safeio.read_bytes(path, "an agentic conversation JSON", safeio.LIMIT_JSON_DOC)
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as err:
            line = getattr(err, "lineno", None)
            msg = (str(err).splitlines() or [type(err).__name__])[0]
            self._bad(line, _Bad(f"invalid JSON ({_short(msg, 80)})",
                                 "one JSON object per conversation file"))
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("requests"), list):
            self._bad(None, _Bad(
                "no 'requests' list" if isinstance(doc, dict) else f"a JSON {type(doc).__name__}",
                "a JSON object with a 'requests' list"))
            return None
        try:
            bs = _int(doc, "block_size", 1) if "block_size" in doc else AGENTIC_BLOCK_SIZE
        except _Bad as bad:
            self._bad(None, bad)
            return None
        events: list[tuple] = []
        # Iterative walk (sub-agents may nest): (requests, time base, stream key, where)
        stack = [(doc["requests"], 0.0, (), "requests")]
        while stack:
            reqs, base, stream, where = stack.pop()
            for i, r in enumerate(reqs):
                at = f"{where}[{i}]"
                try:
                    if not isinstance(r, dict):
                        raise _Bad(f"a JSON {type(r).__name__}", "a request object")
                    t = base + _num(r, "t")
                    if r.get("type") == "subagent":
                        sub = r.get("requests")
                        if not isinstance(sub, list):
                            raise _Bad("a sub-agent without 'requests'", "a 'requests' list")
                        if len(stream) >= 16:
                            raise _Bad("sub-agents nested 16 deep", "at most 16 levels")
                        stack.append((sub, t, stream + (i,), at + ".requests"))
                        continue
                    n_in = _int(r, "in", 1)
                    n_out = _int(r, "out", 0)
                    hs = _int_list(r.get("hash_ids"), "hash_ids")
                    n = len(hs)
                    if n not in (n_in // bs, -(-n_in // bs)):
                        raise _block_count_error(n, n_in, bs)
                except _Bad as bad:
                    self._bad(None, _Bad(f"{at}: {bad.found}", bad.expected))
                    continue
                events.append((t, len(events), stream, hs, n_in, n_out, bs))
        events.sort(key=lambda e: (e[0], e[1]))
        return events

    def _bad(self, line, bad):  # name the conversation file, not the folder
        err = InputFormatError(self._current or self.path, line, bad.found, bad.expected)
        if not self.skip_bad_lines:
            raise err
        self.skipped += 1
        if self.first_skip is None:
            self.first_skip = str(err)

    def records(self) -> Iterator[Record]:
        ids, scale = self.ids, self.rate_scale
        heap = [(off, c, -1) for c, off in enumerate(self.offsets())]
        heapq.heapify(heap)
        convs: dict[int, tuple] = {}
        while heap:
            t, c, k = heapq.heappop(heap)
            if k < 0:  # the conversation's start: load it now
                self._current = self.files[c]
                try:
                    events = self._load(self.files[c])
                finally:
                    self._current = None
                if events:
                    # interning table, and per stream the last (hashes, ids) seen
                    convs[c] = (events, t, {}, {})
                    heapq.heappush(heap, (t + events[0][0], c, 0))
                continue
            events, start, intern, last = convs[c]
            _, _, stream, hs, n_in, n_out, bs = events[k]
            blocks = _intern_prefix(hs, stream, intern, last, ids)
            if len(hs) * bs < n_in:  # only full blocks hashed: add the unshared tail
                blocks = blocks + [ids.new()]
            yield t / scale, blocks, bs, n_in, n_out, c
            if k + 1 < len(events):
                heapq.heappush(heap, (start + events[k + 1][0], c, k + 1))
            else:
                del convs[c]  # done: free its memory


def _intern_prefix(hs: list[int], stream, intern: dict, last: dict, ids: IdSpace) -> list[int]:
    """Prefix ids for per-conversation hashes: intern ``(previous id, hash)``.

    Consecutive requests of one stream share long prefixes (about 96% in the agentic
    traces), so the common prefix with the stream's previous request is found with
    C-level slice comparisons and only the new suffix is interned block by block.
    """
    prev_h, prev_ids = last.get(stream, ((), ()))
    n = min(len(hs), len(prev_h))
    if hs[:n] == list(prev_h[:n]):
        k = n
    else:  # largest k with equal k-prefixes, by bisection
        lo, hi = 0, n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if hs[:mid] == list(prev_h[:mid]):
                lo = mid
            else:
                hi = mid
        k = lo
    out = list(prev_ids[:k])
    p = out[-1] if k else -1
    for h in hs[k:]:
        v = intern.get((p, h))
        if v is None:
            v = intern[(p, h)] = ids.new()
        out.append(v)
        p = v
    last[stream] = (hs, out)
    return list(out)


class Timestamps:
    """Arrival times in seconds, streamed from a trace (for the ``trace`` arrival process).

    ``fmt``: ``mooncake``, ``generic`` (their request arrivals) or ``lines`` (one time
    in seconds per line; blank and ``#`` lines ignored). A file with no times at all is
    an error (a run of 0 requests says nothing). Under ``skip_bad_lines`` a malformed
    line is skipped and counted in ``skipped``, which the generator reading these
    times reports (summary.json ``skipped_trace_lines``), as a trace reader does.
    """

    def __init__(self, path, fmt: str, *, skip_bad_lines: bool = False):
        self.path, self.fmt, self.skip_bad_lines = path, fmt, skip_bad_lines
        self.skipped = 0

    def __iter__(self) -> Iterator[float]:
        self.skipped = 0
        n = 0
        for n, v in enumerate(_timestamps(self.path, self.fmt, self), 1):
            yield v
        if n == 0:
            raise _empty(self.path, self.skipped, "arrival times")


def _timestamps(path, fmt: str, reader: Timestamps) -> Iterator[float]:
    skip_bad_lines = reader.skip_bad_lines
    if fmt in ("mooncake", "generic"):
        key, scale = ("timestamp", 1e-3) if fmt == "mooncake" else ("arrival_s", 1.0)
        rows = GenericReader(path)._rows() if fmt == "generic" else (
            (n, line) for n, line in _open_lines(Path(path)) if line.strip())
        last = 0.0
        for lineno, rec in rows:
            try:
                if isinstance(rec, _Bad):
                    raise rec
                if isinstance(rec, str):
                    rec = _json_obj(rec)
                v = _num(rec, key) * scale
                if v < last:
                    raise _Bad(f"{key} {v / scale:g} after {last / scale:g}", f"non-decreasing {key}")
            except _Bad as bad:
                if skip_bad_lines:
                    reader.skipped += 1
                    continue
                raise InputFormatError(path, lineno, bad.found, bad.expected) from None
            last = v
            yield v
        return
    if fmt != "lines":
        raise UserError(f"found timestamp format {fmt!r}; expected mooncake, generic or lines")
    last = 0.0
    for lineno, line in _open_lines(Path(path)):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        try:
            v = float(s)
        except ValueError:
            v = float("nan")
        if not (math.isfinite(v) and v >= last):
            err = InputFormatError(path, lineno, _short(s),
                                   "one finite, non-decreasing time in seconds per line")
            if skip_bad_lines:
                reader.skipped += 1
                continue
            raise err
        last = v
        yield v
