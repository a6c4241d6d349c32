"""Bounded reads of user files: the one place every input file is opened.

What this is for: a scenario, a sweep, a profile, a bundle or a trace names a path,
and whatever is there gets read. A FIFO blocks forever, ``/dev/zero`` reads until
memory runs out, a gzip bomb expands without end and a single 10 GB "line" is one
allocation. So every read goes through here:

* only regular files (symlinks followed): a folder, FIFO, socket or device is a
  one-line :class:`UserError` before anything is opened (opening a FIFO blocks);
* whole-file reads (:func:`read_text`, :func:`read_bytes`) stop at a size limit,
  checked on the bytes actually read, so a file that grows while read is caught too;
* line reads (:func:`open_lines`) stream one bounded line at a time;
* ``.gz`` files are decompressed transparently, under the same limits (counted on
  the decompressed bytes).
"""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from pathlib import Path
from typing import Iterator

from sim.errors import UserError

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
# Limits by kind of file. Far above any real input, low enough that reading one is
# never a memory problem.
LIMIT_YAML = 4 * MIB  # scenarios, sweeps, profiles: hand-written text
LIMIT_JSON_DOC = 256 * MIB  # one agentic conversation, a bundle.json
LIMIT_LINE = 64 * MIB  # one JSONL / CSV record
LIMIT_STREAM = 64 * GIB  # a whole streamed trace, decompressed


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _size(n: int) -> str:
    for unit, div in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= div:
            return f"{n / div:.4g} {unit}"
    return f"{n} bytes"


def check_regular(path, what: str) -> int:
    """The size of ``path`` if it is a regular file; a one-line UserError otherwise."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"no such file; expected {what}", where=str(path)) from None
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read ({getattr(err, 'strerror', None) or err}); expected {what}",
                        where=str(path)) from None
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"found {_kind(st.st_mode)}; expected {what} (a regular file)",
                        where=str(path))
    return st.st_size


def is_gzip(path) -> bool:
    return str(path).lower().endswith(".gz")


def _open(path, what: str):
    check_regular(path, what)
    try:
        raw = open(path, "rb")
    except OSError as err:
        raise UserError(f"cannot open ({err.strerror or err}); expected {what}",
                        where=str(path)) from None
    return gzip.GzipFile(fileobj=raw, mode="rb") if is_gzip(path) else raw, raw


def _gzip_error(path, what: str, err: Exception) -> UserError:
    return UserError(f"found a damaged gzip file ({' '.join(str(err).split()) or type(err).__name__}); "
                     f"expected {what}", where=str(path))


def read_bytes(path, what: str, limit: int = LIMIT_YAML) -> bytes:
    """The whole file (decompressed if ``.gz``), at most ``limit`` bytes."""
    fh, raw = _open(path, what)
    try:
        with raw, fh:
            # In chunks: one read of ``limit + 1`` bytes allocates that much up front.
            parts, size = [], 0
            while size <= limit:
                chunk = fh.read(min(limit + 1 - size, 16 * MIB))
                if not chunk:
                    break
                parts.append(chunk)
                size += len(chunk)
            data = b"".join(parts)
    except (OSError, EOFError, zlib.error) as err:
        if is_gzip(path):
            raise _gzip_error(path, what, err) from None
        raise UserError(f"cannot read ({getattr(err, 'strerror', None) or err}); expected {what}",
                        where=str(path)) from None
    if len(data) > limit:
        raise UserError(f"found a file over {_size(limit)}; expected {what} of at most {_size(limit)}",
                        where=str(path))
    return data


def read_text(path, what: str, limit: int = LIMIT_YAML) -> str:
    """The whole file as UTF-8 text, at most ``limit`` bytes."""
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"found a byte that is not UTF-8 at offset {err.start}; expected UTF-8 text "
                        f"({what})", where=str(path)) from None


def open_lines(path, what: str, *, line_limit: int = LIMIT_LINE,
               total_limit: int = LIMIT_STREAM) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes) for each line, streamed and bounded.

    A line longer than ``line_limit`` or a file (decompressed) longer than
    ``total_limit`` is a one-line error naming the line.
    """
    fh, raw = _open(path, what)
    total = 0
    lineno = 0
    with raw, fh:
        while True:
            try:
                line = fh.readline(line_limit + 1)
            except (OSError, EOFError, zlib.error) as err:
                if is_gzip(path):
                    raise _gzip_error(path, what, err) from None
                raise UserError(f"cannot read ({getattr(err, 'strerror', None) or err})",
                                where=f"{path}:{lineno + 1}") from None
            if not line:
                return
            lineno += 1
            total += len(line)
            if len(line) > line_limit:
                raise UserError(f"found a line over {_size(line_limit)}; expected {what} with "
                                f"lines of at most {_size(line_limit)}", where=f"{path}:{lineno}")
            if total > total_limit:
                raise UserError(f"found over {_size(total_limit)} of data; expected {what} of at "
                                f"most {_size(total_limit)}", where=f"{path}:{lineno}")
            yield lineno, line


def strip_gz(name: str) -> str:
    """A file name without a trailing ``.gz`` (to look at the format's own suffix)."""
    return name[:-3] if name.lower().endswith(".gz") else name


def suffix(path) -> str:
    """The format suffix of ``path`` (``.csv``, ``.jsonl``, ...), ignoring ``.gz``."""
    return Path(strip_gz(str(path))).suffix.lower()
