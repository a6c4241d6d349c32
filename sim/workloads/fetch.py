"""Fetching and verifying the traces of ``sim.workloads.catalog``.

``fetch`` downloads a remote trace's files from raw.githubusercontent.com (or a mirror
with the same layout: ``<base>/<owner>/<repo>/<commit>/<path>``; ``file://`` works too)
into the user's trace cache (``sim.paths.trace_cache()``: ``$HICACHE_TRACE_CACHE`` or
``~/.cache/hicache-sim/traces``), one folder per trace. Each file is streamed into a
temporary file beside its target, hashed on the way, and renamed into place only once
its checksum is right (``sim.atomic.atomic_path``): a failed or interrupted download
leaves nothing behind, never a partial trace a scenario could read.

The expected checksum is, in order: ``--sha256`` (a user's pin), the registry's, or the
one recorded when the file was first fetched (the folder's ``SHA256SUMS``). With none
of these the fetch computes it, prints it and records it, and ``verify`` checks the
file against that record from then on.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sim.atomic import atomic_path, write_text
from sim.errors import UserError
from sim.paths import DATA_DIR, trace_cache
from sim.workloads.catalog import RAW_BASE, TRACES, TraceEntry, TraceFile, get, raw_url

MANIFEST = "SHA256SUMS"  # in each fetched trace's folder, `sha256sum -c` format
CHUNK = 1 << 20
MAX_BYTES = 16 << 30  # no public trace comes near this; a runaway stream stops here
TIMEOUT_S = 60
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
SCHEMES = ("https", "http", "file")


def entry_or_error(name: str) -> TraceEntry:
    entry = get(name)
    if entry is None:
        raise UserError(f"found unknown trace {name!r}; expected one of "
                        f"{', '.join(t.name for t in TRACES)} (see hicache-sim traces)",
                        where="traces")
    return entry


def folder(entry: TraceEntry) -> Path:
    """Where the trace's files are: data/traces/<folder> or <trace cache>/<folder>."""
    return (DATA_DIR / "traces" if entry.shipped else trace_cache()) / entry.folder


def check_sha256(text: str, where: str = "--sha256") -> str:
    value = text.strip().lower()
    if not _HEX64.match(value):
        raise UserError(f"found {text!r:.80}; expected a SHA-256 checksum (64 hex digits)",
                        where=where)
    return value


def redact(url: str) -> str:
    """``url`` as it may be printed: a user name and password in it become ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<an unparseable URL>"
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def check_mirror(url: str) -> str:
    """A mirror base URL: http(s) with a host, or file:// naming an existing folder."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as err:
        raise UserError(f"found an unparseable URL ({err}); expected a base URL such as "
                        "https://mirror.example/raw", where="--mirror") from None
    shown = redact(url)
    if parts.scheme not in SCHEMES:
        raise UserError(f"found {shown!r:.120}; expected a base URL starting https://, http:// "
                        "or file:// (laid out as raw.githubusercontent.com)", where="--mirror")
    if parts.scheme == "file":
        path = urllib.request.url2pathname(parts.path)
        if not os.path.isdir(path):
            raise UserError(f"found {shown!r:.120} (no such folder); expected a file:// URL of "
                            "an existing folder", where="--mirror")
    elif not parts.hostname:
        raise UserError(f"found {shown!r:.120} (no host); expected a base URL such as "
                        "https://mirror.example/raw", where="--mirror")
    else:
        try:
            parts.port
        except ValueError:
            raise UserError(f"found {shown!r:.120} (a port that is not a number); expected a "
                            "base URL such as https://mirror.example:8443/raw",
                            where="--mirror") from None
    return url.rstrip("/")


def sha256_of(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest(path: Path) -> dict[str, str]:
    """{file name: sha256} from a ``sha256sum`` file; {} when there is none."""
    out: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return out
    for line in text.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and _HEX64.match(parts[0]):
            out[parts[1].strip().lstrip("*")] = parts[0]
    return out


def _write_manifest(path: Path, sums: dict[str, str]) -> None:
    write_text(path, "".join(f"{h}  {n}\n" for n, h in sorted(sums.items())))


@dataclass
class Fetched:
    path: Path
    size: int
    sha256: str
    checked: str  # what the checksum was checked against, or "recorded" (first fetch)


def _download(url: str, target: Path, want: str | None, size: int | None,
              opener: Callable) -> tuple[int, str]:
    """Stream ``url`` into ``target`` atomically; (bytes, sha256). A wrong checksum or
    size raises UserError and leaves no file (the temporary one is removed)."""
    where = f"traces fetch {redact(url)}"  # a mirror's credentials are never printed
    h = hashlib.sha256()
    n = 0
    with atomic_path(target) as tmp:
        try:
            resp = opener(url, timeout=TIMEOUT_S)
        except urllib.error.HTTPError as err:
            raise UserError(f"HTTP {err.code} {err.reason}; expected the file at the "
                            "pinned commit (is the mirror laid out as "
                            "raw.githubusercontent.com?)", where=where) from None
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as err:
            reason = getattr(err, "reason", None) or getattr(err, "strerror", None) or err
            reason = str(reason).replace(url, redact(url))
            raise UserError(f"cannot download ({reason}); expected a reachable URL "
                            "(or pass --mirror URL)", where=where) from None
        with resp, open(tmp, "wb") as out:
            while True:
                try:
                    block = resp.read(CHUNK)
                except OSError as err:
                    raise UserError(f"download interrupted ({err}); expected the whole "
                                    "file (run the fetch again)", where=where) from None
                if not block:
                    break
                n += len(block)
                if n > MAX_BYTES:
                    raise UserError(f"found more than {MAX_BYTES >> 30} GiB; expected a "
                                    "trace file", where=where)
                h.update(block)
                out.write(block)
        digest = h.hexdigest()
        if size is not None and n != size:
            raise UserError(f"found {n:,} bytes; expected {size:,} (the registry's size)",
                            where=where)
        if want is not None and digest != want:
            raise UserError(f"checksum mismatch: found SHA-256 {digest}; expected {want} "
                            "(nothing was kept)", where=where)
    return n, digest


def fetch(entry: TraceEntry, *, mirror: str | None = None, sha256: str | None = None,
          opener: Callable = urllib.request.urlopen) -> list[Fetched]:
    """Download every file of a remote trace into its cache folder (see the module doc)."""
    if entry.shipped:
        raise ValueError(f"{entry.name} ships with the repository")  # the command checks first
    pinned = check_sha256(sha256) if sha256 is not None else None
    if pinned is not None and len(entry.files) != 1:
        raise UserError(f"found --sha256 for {entry.name}, which has {len(entry.files)} files; "
                        "expected it only for a single-file trace", where="--sha256")
    base = check_mirror(mirror) if mirror is not None else RAW_BASE
    dest = folder(entry)
    manifest = dest / MANIFEST
    recorded = read_manifest(manifest)
    done = []
    for f in entry.files:
        want, checked = _expected(f, pinned, recorded)
        size, digest = _download(raw_url(entry, f, base), dest / f.name, want, f.size, opener)
        recorded[f.name] = digest
        # Recorded after each file, so a set fetched half-way still verifies what it has.
        _write_manifest(manifest, recorded)
        done.append(Fetched(dest / f.name, size, digest, checked))
    return done


def _expected(f: TraceFile, pinned: str | None, recorded: dict) -> tuple[str | None, str]:
    if pinned is not None:
        return pinned, "--sha256"
    if f.sha256 is not None:
        return f.sha256, "registry"
    if f.name in recorded:
        return recorded[f.name], "first fetch"
    return None, "recorded"


@dataclass
class Check:
    entry: TraceEntry
    file: TraceFile
    path: Path
    status: str  # ok, mismatch, missing (shipped), not fetched, unrecorded
    against: str = ""  # registry, first fetch
    found: str | None = None

    @property
    def failed(self) -> bool:
        return self.status in ("mismatch", "missing")


def verify(entries=TRACES) -> list[Check]:
    """Check the checksum of every file present: shipped files against the registry
    (a missing shipped file fails), fetched ones against the registry or the checksum
    recorded when they were fetched (an absent remote file is just not fetched)."""
    out = []
    for entry in entries:
        d = folder(entry)
        recorded = {} if entry.shipped else read_manifest(d / MANIFEST)
        for f in entry.files:
            p = d / f.name
            if not p.is_file():
                out.append(Check(entry, f, p, "missing" if entry.shipped else "not fetched"))
                continue
            want, against = (f.sha256, "registry") if f.sha256 else \
                (recorded.get(f.name), "first fetch")
            if want is None:
                out.append(Check(entry, f, p, "unrecorded"))
                continue
            found = sha256_of(p)
            out.append(Check(entry, f, p, "ok" if found == want else "mismatch", against, found))
    return out


def status(entry: TraceEntry) -> str:
    """present / fetched / partly fetched / not fetched, without hashing anything."""
    d = folder(entry)
    have = sum(1 for f in entry.files if (d / f.name).is_file())
    if entry.shipped:
        return "shipped" if have == len(entry.files) else f"shipped, {len(entry.files) - have} missing"
    if have == 0:
        return "not fetched"
    return "fetched" if have == len(entry.files) else f"{have}/{len(entry.files)} fetched"
