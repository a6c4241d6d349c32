"""Console formatting shared by every command: one duration formatter, one table.

Every number of seconds a command prints goes through :func:`duration`, and every
table through :func:`table`, so the same quantity reads the same everywhere (run
summary, sweep, census, bound, validate's estimates). Nothing here knows about the
simulator; the helpers take plain numbers and strings.
"""

from __future__ import annotations

import math
from typing import Sequence

MISSING = "-"

# Upper bounds of each unit, in seconds: a value switches to the next unit once it
# would need more than about 1.5 of it, so 75 s stays "75 s" and 100 s is "1.7 min".
_UNITS = ((1e-3, 1e-6, "µs"), (1.0, 1e-3, "ms"), (90.0, 1.0, "s"), (90 * 60.0, 60.0, "min"),
          (48 * 3600.0, 3600.0, "h"), (math.inf, 86400.0, "days"))


def duration(seconds) -> str:
    """``seconds`` in µs, ms, s, min, h or days as it grows: ``"7.2 ms"``, ``"13.4 s"``,
    ``"2.5 min"``, ``"1.2 h"``; ``"-"`` for None, NaN or infinity."""
    if seconds is None or isinstance(seconds, bool):
        return MISSING
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        return MISSING
    if not math.isfinite(s):
        return MISSING
    sign, s = ("-" if s < 0 else ""), abs(s)
    if s == 0:
        return "0 s"
    for limit, scale, unit in _UNITS:
        if s < limit:
            value = s / scale
            # three significant digits below 100, whole numbers above (with commas)
            text = f"{value:.3g}" if value < 100 else f"{value:,.0f}"
            return f"{sign}{text} {unit}"
    raise AssertionError("unreachable: the last unit has no limit")


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *,
          footer: Sequence[Sequence[str]] = (), indent: str = "", rule: bool = True,
          align: str | None = None) -> str:
    """Rows as plain aligned text: by default the first column left-aligned and the
    others right (numbers); ``align`` gives one ``l`` or ``r`` per column instead.

    ``rule`` draws a line under the header (and above ``footer`` rows, e.g. a total).
    Cells are strings already formatted by the caller; trailing spaces are trimmed.
    """
    header = [str(c) for c in header]
    body = [[str(c) for c in r] for r in rows]
    foot = [[str(c) for c in r] for r in footer]
    every = [header] + body + foot
    for r in every:
        if len(r) != len(header):
            raise ValueError(f"a table row has {len(r)} cells; expected {len(header)}")
    widths = [max(len(r[i]) for r in every) for i in range(len(header))]
    align = align or "l" + "r" * (len(header) - 1)
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"align {align!r}: expected one 'l' or 'r' per column")

    def line(cells) -> str:
        return (indent + "  ".join(c.ljust(w) if a == "l" else c.rjust(w)
                                   for c, w, a in zip(cells, widths, align))).rstrip()

    sep = indent + "-" * (sum(widths) + 2 * (len(widths) - 1))
    out = [line(header)]
    if rule:
        out.append(sep)
    out += [line(r) for r in body]
    if foot:
        if rule:
            out.append(sep)
        out += [line(r) for r in foot]
    return "\n".join(out)


def percent(x, digits: int = 1) -> str:
    """A ratio as a percentage, ``"-"`` when unknown."""
    if x is None or isinstance(x, bool):
        return MISSING
    try:
        v = float(x)
    except (TypeError, ValueError):
        return MISSING
    return f"{v:.{digits}%}" if math.isfinite(v) else MISSING
