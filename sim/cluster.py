"""Data-parallel instances behind a router: what one scenario deploys.

A scenario's ``dp`` instances are independent TP groups (``sim.events.Simulation``),
each with its own trees, collectives, GPU and copy engines, on one SimPy environment.
The cluster's arrival process hands each request, at its arrival time, to the
instance the router picks (``sim.router``). An arrival is a relevant time (a decode
run stops at the next step boundary after it) for the instance it is routed to, so
that instance sees the request exactly when a real scheduler would, at its next
iteration, unless no iteration reads it before something else makes the loop look
(``Simulation._arrival_moment``); an idle instance wakes at every arrival. The run
stops at the first instance that stops (a digest assertion under
``on_divergence: halt``, a hang), as the deployment would page someone there.
"""

from __future__ import annotations

import simpy

from sim.errors import UserError
from sim.events import Simulation, feed, run_until, within_limits
from sim.request import _Halt
from sim.metrics import requests_frame, summarize, timeseries_frame
from sim.router import ROUTERS
from sim.verdict import VERDICTS


class Cluster:
    """``cfg.dp`` TP groups serving one request stream."""

    def __init__(self, cfg, workload, cost=None, *, progress=None, trace_events=None):
        self.cfg = cfg
        self.env = simpy.Environment()
        self.workload = iter(workload)
        self.instances = [Simulation(cfg, None, cost, env=self.env, instance=i,
                                     trace_events=trace_events,
                                     progress=None if progress is None else self._progress)
                          for i in range(cfg.dp)]
        self.router = ROUTERS[cfg.router](cfg.dp, **cfg.router_params)
        self._progress_cb = progress
        self._user_error = None
        self.routed = [0] * cfg.dp

    # ------------------------------------------------------------ the run
    def run(self) -> None:
        self.env.process(self._arrivals())
        for inst in self.instances:
            inst.start()
        try:
            run_until(self.env, simpy.AllOf(self.env, [inst.over for inst in self.instances]))
        except _Halt:
            pass
        finally:
            for inst in self.instances:
                inst.collective.close()
        if self._user_error is not None:
            raise self._user_error
        for inst in self.instances:
            inst.wrap_up()

    def _arrivals(self):
        yield from feed(self.env, within_limits(self.workload, self.cfg), self.instances,
                        self._route, self._fail)

    def _route(self, req) -> int:
        insts = self.instances
        i = self.router.choose(req, [inst.load for inst in insts]) if len(insts) > 1 else 0
        self.router.routed(req, i)
        self.routed[i] += 1
        return i

    def _fail(self, err: UserError) -> None:
        self._user_error = err

    def _progress(self, now, _metrics) -> None:
        self._progress_cb(now, self)

    # ------------------------------------------------------------ what it gives
    @property
    def done(self) -> int:
        return sum(i.metrics.done for i in self.instances)

    @property
    def rejected(self) -> int:
        return sum(i.metrics.rejected for i in self.instances)

    @property
    def hit_rate(self) -> float:
        inp = sum(i.metrics.input_tokens for i in self.instances)
        return sum(i.metrics.hit_tokens for i in self.instances) / inp if inp else 0.0

    @property
    def halted(self) -> str | None:
        return next((i.halted for i in self.instances if i.halted), None)

    @property
    def stuck(self) -> str | None:
        stuck = [f"instance {i.instance}: {i.stuck}" for i in self.instances if i.stuck]
        return "; ".join(stuck) or None

    def requests_df(self):
        return requests_frame([i.metrics for i in self.instances])

    def timeseries_df(self):
        return timeseries_frame([i.metrics for i in self.instances])

    def summary(self, requests=None, timeseries=None) -> dict:
        """The run's headline numbers; ``requests`` / ``timeseries``: this run's frames
        when the caller built them already."""
        insts = self.instances
        out = summarize([i.metrics for i in insts], [i.group.cohorts[0].tree for i in insts],
                        [i.busy_s for i in insts], requests=requests, timeseries=timeseries)
        out["dp"] = self.cfg.dp
        if self.cfg.dp > 1:
            out["router"] = self.cfg.router
            for row, k in zip(out.get("instances", []), self.routed):
                row["routed"] = k
            if hasattr(self.router, "stats"):
                out["router_decisions"] = self.router.stats()
        return out

    def report(self) -> dict:
        """divergence.json: one TP group's report when dp = 1; with several, the
        instance whose failure came first (or the most serious outcome) at the top,
        every instance's report under ``instances``."""
        reps = [i.report() for i in self.instances]
        if len(reps) == 1:
            return reps[0]
        top = min(range(len(reps)), key=lambda k: _severity(reps[k]))
        out = dict(reps[top])
        out["instance"] = top
        out["instances"] = reps
        return out


def _severity(rep: dict) -> tuple:
    """Failures first, the earliest first; then missed, absorbed, agree."""
    v = rep["verdict"]
    t = None
    for key in ("collective_error", "digest_mismatch"):
        if rep.get(key):
            t = rep[key]["t"] if t is None else min(t, rep[key]["t"])
    order = {"missed": 1, "absorbed": 2, "agree": 3}
    if t is not None and v not in order:
        return (0, t, VERDICTS.index(v))
    return (order.get(v, 0), 0.0, 0)
