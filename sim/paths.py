"""Path confinement: the one place that decides which paths an input file may name.

What this is for: scenarios, sweeps and bundles are data, often copied from someone
else. A path inside one must not make hicache-sim read or write anywhere else than
the documented places:

* **inputs** (traces, arrival files, cost profiles) named by a scenario resolve
  against the *roots*, in this order: the scenario's own folder, the repository's
  ``data/`` folder, the user's trace cache (``$HICACHE_TRACE_CACHE``, default
  ``~/.cache/hicache-sim/traces``), then any folder given with ``--trace-root``. A
  relative path is tried under each root; an absolute path (as a results folder's
  resolved ``scenario.yaml`` writes them) is accepted only inside a root. ``..``
  is never accepted, and a symlink that leads out of its root is refused. A bundle's
  scenario has one root: the bundle.
* **outputs** named by a scenario (``output.trace_out``) are relative to the results
  folder and stay inside it.
* **names** that become folder names (scenario and sweep names) are slugs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePath

from sim.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "data"
SLUG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}\Z")
SLUG_RULE = "a name of letters, digits, '_', '.' and '-' (it names a folder), at most 200 characters"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class PathRejected(Exception):
    """A path an input names that is not allowed: what was found, what was expected."""

    def __init__(self, found: str, expected: str):
        super().__init__(f"found {found}; expected {expected}")
        self.found, self.expected = found, expected


def trace_cache() -> Path:
    """The user's trace cache folder (a documented root; need not exist)."""
    env = os.environ.get("HICACHE_TRACE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "hicache-sim" / "traces"


def input_roots(scenario_dir, extra=()) -> list[Path]:
    """The documented roots for a scenario in ``scenario_dir``, then ``extra`` ones."""
    roots = [Path(scenario_dir), DATA_DIR, trace_cache()]
    roots += [Path(r) for r in extra]
    out: list[Path] = []
    for r in roots:
        r = Path(os.path.abspath(r))
        if r not in out:
            out.append(r)
    return out


def is_slug(name) -> bool:
    return isinstance(name, str) and bool(SLUG_RE.match(name))


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:
        return False


def _plain(value, what: str) -> PurePath:
    """``value`` as a path if it is a usable path string: no NUL, no control characters."""
    if not isinstance(value, str) or not value.strip():
        raise PathRejected(repr(value)[:60], f"a path to {what}")
    if _CONTROL.search(value):
        raise PathRejected(f"{value!r:.60} (control characters)", f"a path to {what}")
    p = PurePath(value)
    if ".." in p.parts:
        raise PathRejected(f"{value!r:.80} (climbs out with '..')",
                           f"a path to {what} without '..'")
    return p


def resolve_input(value, roots, what: str, file: bool = False) -> str:
    """The absolute path of an input file or folder a scenario names, inside a root;
    ``file``: only a file will do, so a folder is refused here, where the caller can
    name the key and line (the reader would name only the path).

    Raises :class:`PathRejected` for anything else; the message names the roots.
    """
    found = _resolve_input(value, roots, what)
    if file and os.path.isdir(found):
        raise PathRejected(f"{value!r:.80} (a folder: {found})", f"{what} (a file)")
    return found


def _resolve_input(value, roots, what: str) -> str:
    p = _plain(value, what)
    names = ", ".join(str(r) for r in roots)
    real_roots = [os.path.realpath(r) for r in roots]
    if p.is_absolute():
        real = os.path.realpath(p)
        if any(_inside(real, r) for r in real_roots) and os.path.exists(real):
            return os.path.abspath(p)
        if not any(_inside(real, r) for r in real_roots):
            raise PathRejected(f"{value!r:.80} (an absolute path outside the trace roots)",
                               f"{what} under one of: {names} (or pass --trace-root DIR)")
        raise PathRejected(f"{value!r:.80} (no such file)", what)
    escaped = None
    for root, real_root in zip(roots, real_roots):
        cand = os.path.abspath(os.path.join(root, p))
        if not os.path.lexists(cand):
            continue
        if not _inside(os.path.realpath(cand), real_root):
            escaped = escaped or cand
            continue
        if os.path.exists(cand):
            return cand
    if escaped:
        raise PathRejected(f"{value!r:.80} (a symlink leading out of its root: {escaped})",
                           f"{what} inside its root")
    raise PathRejected(f"{value!r:.80} (not found under any root: {names})",
                       f"{what} under one of those roots (add one with --trace-root DIR)")


def check_relative(value, what: str) -> PurePath:
    """``value`` as a relative path without ``..`` (a scenario's output names)."""
    p = _plain(value, what)
    if p.is_absolute():
        raise PathRejected(f"{value!r:.80} (an absolute path)",
                           f"{what}, relative (the command line's flag may name any file)")
    return p


def confine_output(value, base, what: str) -> Path:
    """``value`` (relative, no ``..``) as a path inside the folder ``base``."""
    out = Path(base) / check_relative(value, what)
    real_base = os.path.realpath(base)
    if not _inside(os.path.realpath(out), real_base):
        raise PathRejected(f"{value!r:.80} (leads out of the results folder)",
                           f"{what} inside the results folder")
    return out


def confine_in(folder, value, what: str) -> Path:
    """A relative path a bundle (or other folder-scoped file) names, inside ``folder``."""
    p = _plain(value, what)
    if p.is_absolute():
        raise PathRejected(f"{value!r:.80} (an absolute path)", f"{what} relative to the bundle")
    out = Path(folder) / p
    if not _inside(os.path.realpath(out), os.path.realpath(folder)):
        raise PathRejected(f"{value!r:.80} (leads out of the bundle)", f"{what} inside the bundle")
    return out


def check_user_file(path) -> Path:
    """A file the command line names, to write: not a folder, and in a folder that
    exists (a typo in the folder must not quietly create a tree of folders)."""
    p = Path(path)
    if p.is_dir():
        raise UserError("found a folder; expected a file to write", where=str(p))
    parent = p.parent
    if not parent.is_dir():
        found = "a file" if parent.exists() else "no such folder"
        raise UserError(f"found {found} at {parent}; expected an existing folder to write the "
                        "file in", where=str(p))
    return p


def write_user_file(path, write) -> None:
    """Write a file the command line names (``write(path)``); OS errors as one line."""
    p = check_user_file(path)
    try:
        write(p)
    except OSError as err:
        raise UserError(f"cannot write ({err.strerror or err}); expected a writable file path",
                        where=str(p)) from None
