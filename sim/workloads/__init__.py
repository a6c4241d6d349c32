"""Request streams for the engine: seeded generators and streamed trace readers.

The engine calls ``build_workload(scenario)`` and iterates the result: ``Request``
objects (``base.py``) in non-decreasing arrival, ``rid`` 0, 1, 2, ... It keys them with
``keys.page_key``. Builders are registered by the workload ``kind`` in ``WORKLOADS``
(``generators.py`` for the synthetic kinds; ``trace`` and ``mix`` here).
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Iterator

import numpy as np

from sim.workloads import generators as _generators  # noqa: F401  (registers the kinds)
from sim.errors import UserError
from sim.workloads.base import WORKLOADS, IdSpace, Request, Workload, register
from sim.workloads.keys import output_key, page_key
from sim.workloads.traces import AgenticReader, GenericReader, MooncakeReader

__all__ = [
    "WORKLOADS", "IdSpace", "Request", "Workload", "WorkloadStream", "build_workload",
    "output_key", "page_key",
]


def _sub_seed(seed: int, *tags: int) -> int:
    """A seed for a sub-stream, independent of the parent's other streams."""
    return int(np.random.SeedSequence([seed, *tags]).generate_state(1, np.uint64)[0])


@register("trace")
def trace(cfg, seed: int, ids: IdSpace | None = None):
    """A streamed reader for ``cfg.format`` (it keeps its ``skipped`` count)."""
    common = dict(rate_scale=cfg.rate_scale, skip_bad_lines=cfg.skip_bad_lines, ids=ids)
    if cfg.format == "mooncake":
        return MooncakeReader(cfg.path, block_size=cfg.trace_block_size(), **common)
    if cfg.format == "generic":
        return GenericReader(cfg.path, block_size=cfg.block_size, block_ids=cfg.block_ids, **common)
    start = cfg.conversation_start
    return AgenticReader(cfg.path, start=start.mode if start else "zero",
                         start_rate=start.rate if start else None,
                         seed=_sub_seed(seed, 1), **common)


class _Mix:
    """Parts merged by arrival (ties: part order); ids share one space, sessions are
    namespaced as ``session * n_parts + part``."""

    def __init__(self, cfg, seed: int, ids: IdSpace | None = None):
        ids = ids if ids is not None else IdSpace()
        self.parts = [WORKLOADS[p.kind](p, _sub_seed(seed, 2, i), ids)
                      for i, p in enumerate(cfg.parts)]

    @property
    def skipped(self) -> int:
        return sum(getattr(p, "skipped", 0) for p in self.parts)

    def __iter__(self) -> Iterator[Request]:
        n = len(self.parts)

        def tagged(i, part):
            for r in part:
                yield r.arrival, i, r

        merged = heapq.merge(*(tagged(i, p) for i, p in enumerate(self.parts)),
                             key=lambda x: (x[0], x[1]))
        for rid, (_, i, r) in enumerate(merged):
            s = r.session * n + i if r.session >= 0 else -1
            yield dataclasses.replace(r, rid=rid, session=s)


register("mix")(_Mix)


class WorkloadStream:
    """The scenario's request stream: re-iterable, deterministic, limits applied.

    Each ``iter()`` rebuilds the sources from the seed, so two passes are identical.
    ``limits.max_requests`` truncates it; arrivals after ``limits.duration_s`` are
    dropped. ``skipped`` counts malformed trace lines skipped in the last pass.
    """

    def __init__(self, workload_cfg, seed: int, max_requests: int | None = None,
                 duration_s: float | None = None, page_size: int | None = None,
                 clock: str = "time"):
        self.cfg, self.seed = workload_cfg, seed
        self.clock = clock
        self.page_size = page_size
        self.max_requests, self.duration_s = max_requests, duration_s
        self._source = None

    @property
    def skipped(self) -> int:
        return getattr(self._source, "skipped", 0) if self._source is not None else 0

    @property
    def line(self) -> int | None:
        """The trace line of the request just yielded (line-oriented traces), or None."""
        return getattr(self._source, "line", None) if self._source is not None else None

    def __iter__(self) -> Iterator[Request]:
        src = WORKLOADS[self.cfg.kind](self.cfg, self.seed, IdSpace())
        if self.clock == "steps":
            src.steps = True  # a generic trace (the schema allows no other under steps)
        self._source = src
        limit, until = self.max_requests, self.duration_s
        last = 0.0
        ps = self.page_size
        for r in src:
            if ps is not None and r.block_size % ps and ps % r.block_size:
                # Only per-record block sizes (generic traces) get here: the schema
                # checked every other one. Name the record, not just the sizes.
                line = getattr(src, "line", None)
                where = (f"{self.cfg.path}:{line}" if line else self.cfg.path) \
                    if self.cfg.kind == "trace" else f"workload request {r.rid}"
                raise UserError(f"found block_size {r.block_size} with page_size {ps}; expected "
                                "one of them to divide the other", where=where)
            if limit is not None and r.rid >= limit:
                return
            if until is not None and r.arrival > until:
                return
            if r.arrival < last:  # every source promises order; this keeps it honest
                raise RuntimeError(f"workload {self.cfg.kind} went back in time at rid {r.rid}")
            last = r.arrival
            yield r


    def arrays(self):
        """The whole stream at once as ``traces.TraceArrays`` (limits applied), exactly
        the requests iterating it gives, for a Mooncake trace; None for any other
        source, or where its reader must read record by record (``MooncakeReader.arrays``):
        then iterate."""
        cfg = self.cfg
        if cfg.kind != "trace" or cfg.format != "mooncake" or self.clock != "time":
            return None
        src = WORKLOADS[cfg.kind](cfg, self.seed, IdSpace())
        arr = src.arrays()
        if arr is None:
            return None
        ps = self.page_size
        if ps is not None and arr.block_size % ps and ps % arr.block_size:
            return None  # iterating names the record
        n = len(arr)
        if self.max_requests is not None:
            n = min(n, self.max_requests)
        if self.duration_s is not None:  # arrivals are non-decreasing: the first one past it
            n = min(n, int(np.searchsorted(arr.arrival, self.duration_s, side="right")))
        self._source = src
        return arr if n == len(arr) else arr.head(n)


def build_workload(scenario) -> WorkloadStream:
    """The request stream a validated scenario describes (``sim.scenario.Scenario``)."""
    return WorkloadStream(scenario.workload, _sub_seed(scenario.seed, 0),
                          scenario.limits.max_requests, scenario.limits.duration_s,
                          scenario.page_size, clock=scenario.engine.clock)
