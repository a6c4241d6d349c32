"""User-facing errors: one line, naming where the bad input is and what was expected.

The CLI prints ``str(err)`` and exits with ``err.exit_code``; no traceback reaches
the user for their own mistake.
"""

import difflib


def one_line(text: str) -> str:
    """``text`` as one printable line: control characters and every Unicode line
    break (which ``str.splitlines`` and terminals honour) shown as escapes. The CLI
    prints every error through this, so a found value cannot break the line."""
    out = []
    for ch in str(text):
        o = ord(ch)
        if o < 0x20 or o == 0x7F or 0x80 <= o < 0xA0 or ch in "\u2028\u2029":
            out.append(repr(ch)[1:-1])
        else:
            out.append(ch)
    return "".join(out)


def suggest(word, choices, n: int = 1) -> list[str]:
    """The names a user most likely meant by ``word``, best first (at most ``n``).

    A name that starts with ``word`` (``h100`` -> ``h100-sxm``), then one containing
    it (``70b`` -> ``llama-3.1-70b``), ignoring case, before spelling distance (difflib):
    a user types the start of a name far more often than a name with one letter wrong,
    and ``h100`` is closer to ``a100`` by edit distance than to ``h100-sxm``."""
    word = str(word)
    choices = [str(c) for c in choices]
    low = word.lower()
    out: list[str] = []
    if low:
        out += [c for c in choices if c.lower() == low]
        out += sorted((c for c in choices if c.lower().startswith(low) and c not in out), key=len)
        if len(low) >= 3:  # shorter pieces are inside too many names to mean one
            out += sorted((c for c in choices if low in c.lower() and c not in out), key=len)
    out += [c for c in difflib.get_close_matches(word, choices, n) if c not in out]
    return out[:n]


class UserError(Exception):
    """Bad input from the user (a file, a key, a flag). Rendered as one line."""

    exit_code = 2

    def __init__(self, message: str, *, where: str | None = None):
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class InputFormatError(UserError):
    """A malformed line or record in a data file (op-trace, request trace)."""

    def __init__(self, path, line: int | None, found: str, expected: str):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"found {found}; expected {expected}", where=where)
        self.path, self.line = path, line


class DivergenceError(Exception):
    """The run ended where a real server would have failed (the digest assertion, a
    collective), or where the engine cannot follow the ranks: ``exit_code`` says which
    (``sim.verdict.exit_code``, README "Exit codes")."""

    exit_code = 3

    def __init__(self, message: str, *, exit_code: int = 3):
        super().__init__(message)
        self.exit_code = exit_code


class TreeError(Exception):
    """An operation a tree refuses (the op-trace reports ``code``): the FULL tree's and
    the hybrid trees' alike."""

    def __init__(self, code: str):
        super().__init__(code)
        self.code = code


class InvariantError(AssertionError):
    """A tree's ``check()`` found a broken invariant; names the node and the invariant."""
