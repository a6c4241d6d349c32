"""How many requests a scenario will send, when that is cheap to know (progress bars).

Generators make exactly ``num_requests`` (unless an arrival trace runs out first);
line-per-request traces (mooncake, generic JSONL/CSV) are counted by reading their
lines when the file is small enough that this costs a fraction of the run; agentic
folders would have to be parsed whole, so they are not counted. The number is an
estimate for display only: bad lines that are skipped, an arrival file that ends
early or ``limits.duration_s`` can make the run send fewer.
"""

from __future__ import annotations

import os

from sim import safeio
from sim.errors import UserError

# Count a trace's lines only up to this size on disk: reading it then takes well
# under a second, next to a run that takes minutes.
CHEAP_TRACE_BYTES = 64 * safeio.MIB


def _trace_lines(cfg) -> int | None:
    if cfg.format == "agentic":
        return None
    try:
        if os.path.getsize(cfg.path) > CHEAP_TRACE_BYTES:
            return None
        n = sum(1 for _, line in safeio.open_lines(cfg.path, "a trace file") if line.strip())
    except (OSError, UserError):
        return None  # the run itself reports an unreadable trace, with the line
    if safeio.suffix(cfg.path) == ".csv":
        n -= 1  # the header
    return max(n, 0)


def _count(w) -> int | None:
    if w.kind == "mix":
        parts = [_count(p) for p in w.parts]
        return None if None in parts else sum(parts)
    if w.kind == "trace":
        return _trace_lines(w)
    return getattr(w, "num_requests", None)


def expected_requests(scenario) -> int | None:
    """The number of requests the run will most likely see, or None if unknown."""
    n = _count(scenario.workload)
    cap = scenario.limits.max_requests
    if cap is not None:
        n = cap if n is None else min(n, cap)
    return n
