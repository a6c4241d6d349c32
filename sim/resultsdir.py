"""A results folder that cannot lie: locked, built aside, renamed into place whole.

What this is for: two runs into one ``-o`` used to interleave their files and both
exit 0; a killed run left ``.tmp`` files and a folder of mixed generations. Now:

* :meth:`ResultsFolder.acquire` takes an exclusive lock (``flock`` on the sibling
  ``.<name>.lock``) before anything runs; a second writer fails at once with one
  line. It refuses to replace anything that is not a results folder (``-o /``,
  ``-o ~``, a file).
* The run writes every file into a sibling temporary folder (``.<name>.tmp-<pid>``);
  :meth:`commit` renames it over the target in one step (an interrupted run's folder
  too, marked ``partial`` in its ``meta.json``). Readers see the old folder or the
  new one, never a mix.
* :meth:`release` removes the temporary folder if the run failed, and the lock
  file; stale temporary folders of killed runs are removed the next time the lock
  is taken (holding the lock proves no one else is writing them).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from pathlib import Path

from sim.errors import UserError
from sim.interrupt import checkpoint

# Entries a results folder may hold (a folder holding only these, or a meta.json,
# is one we may replace).
RESULT_FILES = {"requests.parquet", "timeseries.parquet", "divergence.json", "summary.json",
                "scenario.yaml", "meta.json", "plots", "bound.json", "bound.csv"}


def _err(message: str, out) -> UserError:
    return UserError(message, where=str(out))


def is_results_folder(path: Path) -> bool:
    """A folder we may replace: empty, with a meta.json, or only results files."""
    try:
        names = [n for n in os.listdir(path) if not n.startswith(".")]
    except OSError:
        return False
    return not names or "meta.json" in names or (
        "scenario.yaml" in names and all(n in RESULT_FILES for n in names))


class ResultsFolder:
    """The lock and the staging folder for one results folder ``out``."""

    NOT_OURS = ("found a folder that is not a results folder (no meta.json); expected a new "
                "folder or an earlier results folder to replace")

    def __init__(self, out):
        self.out = Path(os.path.abspath(out))
        self.lock_path = self.out.parent / f".{self.out.name}.lock"
        self.tmp = self.out.parent / f".{self.out.name}.tmp-{os.getpid()}"
        self._fd: int | None = None

    @staticmethod
    def replaceable(path: Path) -> bool:
        return is_results_folder(path)

    # -- the lock -----------------------------------------------------------------
    def acquire(self) -> "ResultsFolder":
        out = self.out
        if not out.name or out == out.parent:
            raise _err("found the file system root; expected a results folder", out)
        if out.exists() and not out.is_dir():
            raise _err("found a file; expected a results folder (a new or an earlier one)", out)
        if out.is_dir() and not self.replaceable(out):
            raise _err(self.NOT_OURS, out)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise _err(f"cannot create its parent folder ({err.strerror or err}); expected a "
                       "writable place for results", out) from None
        self._fd = lock_file(self.lock_path, out)
        self._clear_stale()
        return self

    def _clear_stale(self) -> None:
        prefix = f".{self.out.name}.tmp-"
        for entry in self.out.parent.iterdir():
            if entry.name.startswith(prefix) and entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
        if self.out.is_dir():  # .tmp files of an older, file-by-file writer
            for entry in self.out.glob(".*.tmp"):
                if entry.is_file():
                    entry.unlink(missing_ok=True)

    # -- staging and the rename ---------------------------------------------------
    def stage(self) -> Path:
        """A fresh, empty temporary folder beside the target, to write into."""
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir()
        os.chmod(self.tmp, 0o777 & ~_umask())
        return self.tmp

    def commit(self) -> Path:
        """Rename the staged folder over the target (the old one is then removed)."""
        old = None
        if self.out.exists():
            old = self.out.parent / f".{self.out.name}.tmp-{os.getpid()}-old"
            if old.exists():
                shutil.rmtree(old)
            os.replace(self.out, old)

        checkpoint("committing")  # an earlier folder renamed away, the new one not yet in place
        os.replace(self.tmp, self.out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.out

    def release(self) -> None:
        if self.tmp.exists():
            shutil.rmtree(self.tmp, ignore_errors=True)
        if self._fd is not None:
            unlock_file(self.lock_path, self._fd)
            self._fd = None

    def __enter__(self) -> "ResultsFolder":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def lock_file(lock_path: Path, out) -> int:
    """An fd holding an exclusive ``flock`` on ``lock_path``; one line if it is taken."""
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise _err(f"cannot create the lock {lock_path} ({err.strerror or err}); "
                       "expected a writable place for results", out) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise _err(f"is being written by another hicache-sim process (lock "
                           f"{lock_path}); expected one writer at a time", out) from None
            raise
        # The previous holder may have removed the file between our open and our
        # lock: then we hold a lock on a dead inode. Retry on the live one.
        try:
            same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def unlock_file(lock_path: Path, fd: int) -> None:
    """Release a lock from :func:`lock_file`, removing the file while still holding it."""
    try:
        os.unlink(lock_path)  # while still held: no one else can be using it
    except FileNotFoundError:
        pass
    os.close(fd)


OPTRACE_INDEX = "index.json"
OPTRACE_KIND = "hicache-sim op-traces"


def is_optrace_folder(path: Path) -> bool:
    """A folder ``run --record-ops`` may replace: empty, or one it wrote (its
    ``index.json`` says so)."""
    try:
        names = [n for n in os.listdir(path) if not n.startswith(".")]
    except OSError:
        return False
    if not names:
        return True
    try:
        with open(path / OPTRACE_INDEX) as fh:
            return json.load(fh).get("kind") == OPTRACE_KIND
    except (OSError, ValueError, AttributeError):
        return False


class OpTraceFolder(ResultsFolder):
    """``run --record-ops DIR``: the same lock, staging and whole-folder rename as a
    results folder; only an op-trace folder (or an empty one) is replaced."""

    NOT_OURS = (f"found a folder that is not an op-trace folder (no {OPTRACE_INDEX} of "
                "hicache-sim's); expected a new folder or an earlier --record-ops folder to replace")

    @staticmethod
    def replaceable(path: Path) -> bool:
        return is_optrace_folder(path)


class FolderLock:
    """The lock of a folder written in place over several runs (a sweep's output)."""

    def __init__(self, out):
        self.out = Path(os.path.abspath(out))
        self.lock_path = self.out.parent / f".{self.out.name}.lock"
        self._fd: int | None = None

    def __enter__(self) -> "FolderLock":
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self._fd = lock_file(self.lock_path, self.out)
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            unlock_file(self.lock_path, self._fd)
            self._fd = None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
