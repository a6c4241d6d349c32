"""Named random distributions: a registry shared by workload lengths and jitter delays.

A distribution is named in a scenario file (``dist: lognormal``) and resolved here, so
nothing a file names is ever imported or evaluated. Each entry lists its parameters
(with their valid ranges) and a vectorized sampler. ``Draws`` hands out scalars from
batched draws: one numpy call per ``batch`` values keeps the generators cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Distribution:
    """A named distribution: its parameters and a vectorized sampler."""

    params: tuple[str, ...]
    sample: Callable[[np.random.Generator, dict, int], np.ndarray]
    doc: str
    # Inverse CDF: one value from one uniform in (0, 1). Per-event jitter draws use it
    # (sim.jitter), so that a value depends on its event's key alone, never on how
    # many values some other stream consumed.
    quantile: Callable[[float, dict], float]


def _lognormal(rng: np.random.Generator, p: dict, n: int) -> np.ndarray:
    # Parametrized by mean and coefficient of variation, which users can reason about:
    # sigma^2 = ln(1 + cv^2), mu = ln(mean) - sigma^2 / 2 gives exactly that mean.
    if float(p["cv"]) == 0:
        return np.full(n, float(p["mean"]))
    mu, sigma = _lognormal_params(p)
    return rng.lognormal(mu, sigma, n)


def _lognormal_params(p: dict) -> tuple[float, float]:
    mean, cv = float(p["mean"]), float(p["cv"])
    s2 = math.log1p(cv * cv)
    return math.log(mean) - s2 / 2, math.sqrt(s2)


def _lognormal_q(u: float, p: dict) -> float:
    if float(p["cv"]) == 0:
        return float(p["mean"])
    mu, sigma = _lognormal_params(p)
    return math.exp(mu + sigma * _STD_NORMAL.inv_cdf(u))


_STD_NORMAL = NormalDist()

DISTRIBUTIONS: dict[str, Distribution] = {
    "none": Distribution((), lambda rng, p, n: np.zeros(n), "always 0", lambda u, p: 0.0),
    "constant": Distribution(
        ("value",), lambda rng, p, n: np.full(n, float(p["value"])), "always `value`",
        lambda u, p: float(p["value"]),
    ),
    "uniform": Distribution(
        ("low", "high"),
        lambda rng, p, n: rng.uniform(float(p["low"]), float(p["high"]), n),
        "uniform on [low, high)",
        lambda u, p: float(p["low"]) + u * (float(p["high"]) - float(p["low"])),
    ),
    "exponential": Distribution(
        ("mean",), lambda rng, p, n: rng.exponential(float(p["mean"]), n), "exponential",
        lambda u, p: -float(p["mean"]) * math.log1p(-u),
    ),
    "lognormal": Distribution(("mean", "cv"), _lognormal, "lognormal with this mean and CV",
                              _lognormal_q),
}


# Largest integer draw (tokens, turns): far beyond any context, well inside int64.
MAX_DRAW = 10**12


class Draws:
    """Scalar draws from one distribution, taken ``batch`` at a time.

    ``integer=True`` rounds to the nearest int and clips at ``minimum`` (token counts,
    turn counts). Each ``Draws`` should own its Generator, so that the values one
    stream yields do not depend on how the others are consumed.
    """

    __slots__ = ("_rng", "_dist", "_params", "_batch", "_buf", "_i", "_integer", "_min")

    def __init__(self, rng, dist: str, params: dict, *, integer=False, minimum=0, batch=1024):
        self._rng = rng
        self._dist = DISTRIBUTIONS[dist]
        self._params = params
        self._batch = batch
        self._integer = integer
        self._min = minimum
        self._buf: list = []
        self._i = 0

    def _refill(self) -> None:
        a = self._dist.sample(self._rng, self._params, self._batch)
        if self._integer:
            # clipped above so that a heavy tail cannot overflow int64
            a = np.clip(np.rint(a), self._min, MAX_DRAW).astype(np.int64)
        else:
            a = np.maximum(a, self._min)
        self._buf = a.tolist()
        self._i = 0

    def __call__(self):
        if self._i >= len(self._buf):
            self._refill()
        v = self._buf[self._i]
        self._i += 1
        return v


class ZipfChoice:
    """Ranks 0..n-1 drawn with P(rank k) proportional to (k + 1) ** -s (finite Zipf).

    ``s = 0`` is uniform. Uses the inverse CDF (one searchsorted per batch), so any
    ``s >= 0`` works, unlike numpy's unbounded ``zipf`` which needs ``s > 1``.
    """

    __slots__ = ("_rng", "_cdf", "_batch", "_buf", "_i")

    def __init__(self, rng, n: int, s: float, batch: int = 1024):
        w = np.arange(1, n + 1, dtype=np.float64) ** -float(s)
        cdf = np.cumsum(w)
        self._cdf = cdf / cdf[-1]
        self._rng = rng
        self._batch = batch
        self._buf: list = []
        self._i = 0

    def __call__(self) -> int:
        if self._i >= len(self._buf):
            u = self._rng.random(self._batch)
            idx = np.searchsorted(self._cdf, u, side="right")
            self._buf = np.minimum(idx, len(self._cdf) - 1).tolist()
            self._i = 0
        v = self._buf[self._i]
        self._i += 1
        return v
