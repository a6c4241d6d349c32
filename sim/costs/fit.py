"""Least-squares fits that turn copy timings into cost-model parameters.

Two straight lines cover the calibration: copy time against bytes (the intercept is
the fixed latency per op, the slope is 1 / bandwidth) and time against the number of
copy calls issued (the slope is the per-call cost). Timings carry roughly
multiplicative noise and span orders of magnitude, so the fit weights each point by
1 / time: it minimises relative, not absolute, residuals, and the small sizes that
pin down the latency are not drowned by the large ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from sim.errors import UserError


@dataclass(frozen=True)
class LinearFit:
    """y = intercept + slope * x, with the fit's quality on the points it came from."""

    intercept: float
    slope: float
    r2: float  # coefficient of determination (unweighted)
    worst_rel_err: float  # max |predicted - measured| / measured
    points: int

    def predict(self, x):
        return self.intercept + self.slope * np.asarray(x, dtype=float)

    def as_dict(self) -> dict:
        return {k: float(v) if isinstance(v, float) else v for k, v in asdict(self).items()}


def fit_linear(x, y, what: str = "fit") -> LinearFit:
    """Relative-error-weighted least squares of y on [1, x] (numpy.linalg.lstsq)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("x and y must be 1-D and the same length")
    if len(x) < 2 or np.unique(x).size < 2:
        raise UserError(f"found {np.unique(x).size} distinct point(s); expected at least 2"
                        " to fit a line", where=what)
    if not np.all(y > 0):
        raise UserError("found a non-positive time; expected every measured time > 0",
                        where=what)
    w = 1.0 / y
    design = np.column_stack([np.ones_like(x), x])
    coef, *_ = np.linalg.lstsq(design * w[:, None], y * w, rcond=None)
    intercept, slope = (float(c) for c in coef)
    pred = intercept + slope * x
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    worst = float(np.max(np.abs(pred - y) / y))
    return LinearFit(intercept, slope, r2, worst, int(len(x)))


@dataclass(frozen=True)
class TransferFit:
    """A copy's fixed latency and bandwidth, fitted from (bytes, seconds) points."""

    latency_s: float  # clamped at 0 (a negative intercept is noise)
    bandwidth_bps: float  # bytes per second
    line: LinearFit


def fit_transfer(nbytes, seconds, what: str = "transfer fit") -> TransferFit:
    """Fit ``seconds = latency + bytes / bandwidth``."""
    line = fit_linear(nbytes, seconds, what)
    if not line.slope > 0:
        raise UserError(f"found time not growing with size (slope {line.slope:.3g} s/B);"
                        " expected larger or more spread --sizes", where=what)
    return TransferFit(max(0.0, line.intercept), 1.0 / line.slope, line)


@dataclass(frozen=True)
class CallFit:
    """The cost of each extra copy call, fitted from (calls, seconds) points."""

    per_call_s: float  # clamped at 0
    fixed_s: float  # clamped at 0
    line: LinearFit


def fit_per_call(calls, seconds, what: str = "per-call fit") -> CallFit:
    """Fit ``seconds = fixed + calls * per_call`` (small copies, so calls dominate)."""
    line = fit_linear(calls, seconds, what)
    return CallFit(max(0.0, line.slope), max(0.0, line.intercept), line)
