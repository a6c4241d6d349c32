"""Arrival processes: when requests (or sessions) start.

``poisson`` (exponential gaps), ``bursty`` (gamma gaps with a coefficient of
variation: cv = 1 is Poisson, cv > 1 clusters arrivals into bursts) and ``trace``
(timestamps read, streamed, from a request trace or a plain list). Times are seconds
from the start, before ``rate_scale`` (the caller divides by it).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from sim.workloads.traces import Timestamps

_BATCH = 1024


def _gaps(rng: np.random.Generator, process: str, rate: float, cv: float) -> Iterator[float]:
    while True:
        if process == "poisson":
            g = rng.exponential(1.0 / rate, _BATCH)
        else:
            # Gamma with mean 1/rate and CV cv: shape k = 1/cv^2, scale = 1/(rate k).
            k = 1.0 / (cv * cv)
            g = rng.gamma(k, 1.0 / (rate * k), _BATCH)
        yield from g.tolist()


def arrivals(spec, rng: np.random.Generator) -> tuple[Iterator[float], Timestamps | None]:
    """Non-decreasing arrival times for an arrival spec from the scenario schema, and
    the reader of a ``trace`` spec's file (its ``skipped`` counts the malformed lines
    it skipped; None for a synthetic process).

    Synthetic processes start at 0 (the first request arrives at t = 0) and never end;
    ``trace`` ends with its file.
    """
    if spec.process == "trace":
        reader = Timestamps(spec.path, spec.format, skip_bad_lines=spec.skip_bad_lines)
        return iter(reader), reader
    return _synthetic(spec, rng), None


def _synthetic(spec, rng: np.random.Generator) -> Iterator[float]:
    t = 0.0
    yield t
    for g in _gaps(rng, spec.process, spec.rate, getattr(spec, "cv", 1.0)):
        t += g
        yield t
