"""JSON Lines at msgspec's speed, with the standard library's exact results.

Op-traces and their replay outputs are millions of small JSON lines; the standard
library spends most of a replay parsing and writing them. msgspec does both several
times faster (measured against orjson too: benchmarks/bench_replay.py). What it
writes and reads differs from ``json`` only at edges, and those edges go through
``json`` itself, so every result is what ``json`` gives:

* :func:`dumps` is ``json.dumps(obj, separators=(",", ":"))`` byte for byte for what
  op-trace lines and replay outputs hold: ints, bools, None, strings, lists and
  str-keyed dicts. msgspec writes those the same, except non-ASCII and DEL, which it
  writes raw where ``json`` escapes them: a line holding a byte from 0x7f up is
  written by ``json``. Floats are not among them (every number of a trace is checked
  to be an int, every count of the tree is one); msgspec would write some of them
  otherwise (``1e16`` for ``1e+16``, NaN as ``null``).
* :func:`loads` is ``json.loads`` where it succeeds, or None: the caller then takes
  its plain ``json`` path, errors and all. msgspec refuses what ``json`` accepts
  beyond the JSON standard (NaN, Infinity, lone surrogates, floats out of range, ints
  over 4300 digits) and accepts nothing ``json`` refuses, except nesting 5 levels
  deeper than ``json``'s recursion limit: a line with many brackets goes to ``json``.
"""

from __future__ import annotations

import json

msgspec = None
_ENC = _DEC = None
_READY = False


def _load() -> None:
    """msgspec on first use (its import costs a run that reads no JSON Lines ~35 ms);
    without it (a venv from before the dependency) json alone, slower."""
    global msgspec, _ENC, _DEC, _READY
    try:
        import msgspec as m
    except ImportError:
        m = None
    if m is not None:
        msgspec, _ENC, _DEC = m, m.json.Encoder(), m.json.Decoder()
    _READY = True
# Far below either library's recursion limit (about 990 levels), far above any op.
_MAX_BRACKETS = 128


def plain_dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


def dumps(obj) -> str:
    """``plain_dumps(obj)``, exactly."""
    if not _READY:
        _load()
    if _ENC is None:
        return plain_dumps(obj)
    try:
        b = _ENC.encode(obj)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return plain_dumps(obj)
    if b.isascii() and b"\x7f" not in b:
        return b.decode("ascii")
    return plain_dumps(obj)


def loads(raw: bytes | str):
    """``json.loads(raw)`` (of its UTF-8 text) when msgspec parses ``raw``; None
    otherwise (invalid JSON, or JSON only ``json`` reads), for the caller's plain path."""
    if not _READY:
        _load()
    if _DEC is None:
        return None
    if isinstance(raw, str):
        if raw.count("[") + raw.count("{") > _MAX_BRACKETS:
            return None
    elif raw.count(b"[") + raw.count(b"{") > _MAX_BRACKETS:
        return None
    try:
        return _DEC.decode(raw)
    except (msgspec.DecodeError, ValueError, RecursionError):  # ValueError: a str with lone surrogates
        return None
