"""Exact waits on SimPy's clock: a run of decode steps and the same steps one by one
must land on the same boundaries, bit for bit."""

from __future__ import annotations

import math

import simpy


def until(env: simpy.Environment, t: float):
    """Wait until exactly time ``t`` (``t >= now``), on SimPy timeouts. A delay of
    ``t - now`` lands at ``now + (t - now)``, which rounding can move by an ulp; a run
    of decode steps and the same steps one by one must share every boundary bit for
    bit. So the delay is the float whose sum with ``now`` is ``t``. Where none is
    (``now``'s bits below ``t``'s last place are exactly half of it, and rounding to
    even skips ``t``), the wait lands on the last time before ``t`` it can reach and
    covers the rest from there, where ``t - now`` is exact."""
    yield env.timeout(delay_to(env.now, t))
    if env.now != t:
        yield env.timeout(t - env.now)


def delay_to(now: float, t: float) -> float:
    """The delay whose sum with ``now`` is ``t`` (``until``), or, where rounding to
    even skips ``t``, the largest whose sum falls short of it."""
    d = t - now
    while now + d < t:
        d = math.nextafter(d, math.inf)
    while now + d > t:
        d = math.nextafter(d, -math.inf)
    return d
