"""User-facing errors: one line, naming where the bad input is and what was expected.

The CLI prints ``str(err)`` and exits with ``err.exit_code``; no traceback reaches
the user for their own mistake.
"""


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
