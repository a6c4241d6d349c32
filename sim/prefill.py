"""A prefill batch on the GPU, and the results it leaves (part of ``Simulation``).

Each replica's scheduler-thread stall (reclaim scans, blocking backups on its D2H
engine), the batch's merged load on its H2D engine, the forward's TP collective and
the forward itself on the GPU (``sim/forwards.py``); then `process_batch_result_prefill`:
each request's progress, its first token, and (under the overlap loop, deferred to
the next iteration) its `cache_unfinished_req`.
"""

from __future__ import annotations

import math
from collections import deque

import simpy

from sim import constants as C
from sim.collectives import REQUEST_BROADCAST, CollectiveError
from sim.ranks import Cohort
from sim.request import Req, _Halt, _Plan


class Prefill:
    """A TP group's prefill forwards and their results (``Simulation``'s part)."""

    def _prefill(self, plans):
        """Charge each replica's scheduler-thread stall, run the forward, insert."""
        env = self.env
        now = env.now
        if self._pipelined and self._sync_s:
            # the scheduler thread's cache sync, while the GPU runs the last batch
            yield env.timeout(self._sync_s)
        stalls = [env.process(self._stall(c, p)) for c, p in plans
                  if p.scanned or p.backups or p.loads]
        if stalls:
            yield simpy.AllOf(env, stalls)
        if len(plans) == 1:
            numels = sum(e for _, _, e in plans[0][1].shape)
        else:
            numels = {r: sum(e for _, _, e in p.shape) for c, p in plans for r in c.ranks}
        self._forward(numels)
        rids = [rq.r.rid for rq in plans[0][1].reqs]
        if any([rq.r.rid for rq in p.reqs] != rids for _, p in plans[1:]):
            # Equal token totals (or no forward collective), different requests: no
            # collective fails, and each rank goes on with its own batch, from here on
            # with its own request state (sim.lanes).
            from sim import lanes
            if not lanes.can_split(self):
                self.obs.untracked(env.now, self.step_no, "ranks admitted different requests "
                                   "with equal token totals")
                self.halted = "untracked"
                raise _Halt()
            yield from self._drain_gpu()
            yield from lanes.split_prefill(self, plans, now)
            return
        yield from self._prefill_run(plans, now)

    def _prefill_run(self, plans, now: float):
        """The batch's forward time and its results, every plan of ``plans`` having
        admitted the same requests."""
        env, cost = self.env, self.cost
        p0 = plans[0][1]
        # lockstep: the slowest rank's compute (and its loads' visible stall)
        dur = max(cost.prefill_batch_time(p.chunks)
                  + (cost.batch_load_stall(p.load_tokens, p.chunks) if p.load_tokens else 0.0)
                  for _, p in plans)
        starts = [p.started for _, p in plans if p.started is not None]
        # the forward's trace span (name, ranks, args), built only when tracing
        span = None if self.trace is None else (
            "prefill", self._ranks(), {"requests": len(p0.reqs),
                                       "tokens": sum(e for _, _, e in p0.shape)})
        if self._pipelined:
            # `run_batch` launches the forward, then `pop_and_process` handles the last
            # batch's results once its forward has ended
            self.busy_s += dur
            yield from self._results_of(self._launch(self._on_gpu(dur, starts, span)))
            self._after_prefill(plans, now)
            yield from self._result_scan_time()
            return
        if self._gpu_hold is None:
            yield from self._hold_gpu()
        if starts:
            yield simpy.AllOf(env, starts)
        dur += self._sync_s  # serial: the iteration's sync is part of its forward
        self.busy_s += dur
        yield env.timeout(dur)
        if span is not None:
            name, ranks, args = span
            self._trace(name, "forward", ranks, now, env.now - now, **args)
        self._after_prefill(plans, now)
        yield from self._result_scan_time()

    def _result_scan_time(self):
        """The slowest replica's reclaim scans from result processing (lockstep)."""
        if self._result_scans:
            worst = max(self._result_scans.values())
            self._result_scans.clear()
            if worst:
                yield self.env.timeout(self.cost.reclaim_scan_time(worst))

    def _stall(self, c: Cohort, p: _Plan):
        """One replica's scheduler thread: reclaim scans, then each blocking write_back
        backup on its D2H engine (serially, sem §6.5); then the batch's merged H2D
        load op is submitted (`ready_to_load_host_cache`)."""
        env, cost = self.env, self.cost
        if p.scanned:
            yield env.timeout(cost.reclaim_scan_time(p.scanned))
        if p.backups:
            t0 = env.now
            # One hold for the whole sequence: while the scheduler thread is blocked in
            # it, nothing else can queue on this replica's D2H engine (write-through
            # flushes are issued by the same thread), so releasing between backups
            # would hand the engine straight back.
            with c.d2h.request() as req:
                yield req
                for k in p.backups:
                    yield env.timeout(cost.d2h_time(k, concurrent=c.h2d.count > 0))
            self._trace("blocking_backups", "transfer", c.ranks, t0, env.now - t0,
                        backups=len(p.backups))
        if p.loads:
            self._update_producer(c)
            ack = self.group.make_ack(c, "load", list(p.loads), p.load_tokens)
            self._count_delays(ack)
            c.load_q.append(ack)
            c.producers[c.producer_index] = ack
            p.started = env.event()
            env.process(self._copy(c, c.h2d, c.d2h, ack, cost.h2d_time, p.started))

    def _update_producer(self, c: Cohort) -> None:
        """`LayerDoneCounter.update_producer` (cache_controller.py), as `start_loading`
        calls it for the batch's merged load op: the next of the producer slots, whose
        last load must have finished on every rank (its event's `query()`); a rank
        where it has not raises (a slow ack with more loads in flight than slots)."""
        i = c.producer_index = (c.producer_index + 1) % C.LAYER_DONE_COUNTERS
        prev = c.producers[i]
        if prev is None:
            return  # an event never recorded is complete
        now = self.env.now
        late = [r for r in c.ranks if not prev.ready(r, now)]
        if late:
            self.obs.rank_assertion(now, self.step_no, late, "AssertionError",
                                    C.PRODUCER_REUSE_MESSAGE, "LayerDoneCounter.update_producer")
            self.obs.compare(now, self.step_no, self.group.cohorts, full=True)
            self.halted = "assertion"
            raise _Halt()

    def _forward(self, numels: dict[int, int] | int) -> None:
        """The forward's TP all_reduce: per-rank token counts, or one count for all."""
        if (self._solo and self.collective.name == "simulated") or not self.cfg.forward_collective:
            return
        try:
            if isinstance(numels, int):
                self.collective.forward_uniform(self.step_no, numels)
            else:
                # A rank with no batch runs no forward (`event_loop_normal`: `if batch:
                # run_batch` else `on_idle`); it goes round its loop and blocks in the
                # next iteration's request broadcast.
                idle = {r: REQUEST_BROADCAST for r, n in numels.items() if n == 0}
                if len(idle) == len(numels):
                    return
                if idle:
                    self.collective.forward(self.step_no, {r: n for r, n in numels.items() if n},
                                            idle)
                else:
                    self.collective.forward(self.step_no, numels)
        except CollectiveError as err:
            self._collective_failed(err)

    def _process_pending(self) -> None:
        """`pop_and_process` under overlap: the previous batch's results."""
        if not self._pending:
            return
        work, self._pending = self._pending, []
        for fn, arg in work:
            fn(arg)
        self._flush_writes()

    def _defer(self, fn, arg) -> None:
        if self._overlap:
            self._pending.append((fn, arg))
        else:
            fn(arg)

    def _inflight_rids(self) -> set[int]:
        """The last launched batch's rids (built only when admission asks)."""
        return {rq.r.rid for rq in self._inflight} if self._inflight else set()

    def _finished_inflight(self, rq: Req) -> None:
        """A request whose last token's result is processed now (overlap: one step
        after its launch; it was already left out of the decode batch, as
        `_reqs_finishing_inflight` does)."""
        self._finish(rq)
        if self._overlap:
            self._finishing.remove(rq)

    def _unfull(self, _=None) -> None:
        for c in self.group.cohorts:
            c.sched.batch_is_full = False

    def _after_prefill(self, plans, began: float) -> None:
        """`process_batch_result_prefill`: a continuing chunk checkpoints its progress;
        a finished prefill yields its first token, then checkpoints and decodes (or
        finishes)."""
        env, cost = self.env, self.cost
        now = env.now
        c0, p0 = plans[0]
        cid0 = id(c0)
        continuing = self.chunked  # left the queue at its first chunk
        self.chunked = None
        admitted: set[int] = set()
        if p0.stall_first and p0.reqs:
            p0.reqs[0].stall_s += p0.stall_first
        shrink = False  # a request leaves the batch: `batch_is_full` resets
        # `get_next_batch_to_run`: into an empty running batch the prefill batch is not
        # merged but becomes it, with its own `batch_is_full` (False)
        shrink_if_joined = not self.running
        finished = False
        for i, rq in enumerate(p0.reqs):
            req = rq.r
            for c, p in plans:
                rq.slots[id(c)].done += p.shape[i][2]
            s0 = rq.slots[cid0]
            if math.isnan(rq.start):
                rq.start = began  # admitted: its first batch began forming
            admitted.add(req.rid)
            rq.prefill_s += cost.prefill_time(p0.shape[i][2], p0.shape[i][1])
            fill = rq.fill_len
            if s0.done < fill:
                # its checkpoint waits for the next iteration (`stash_chunked_request`)
                self.chunked = self._stash = rq
                shrink = True
                continue
            rq.kv = fill
            rq.generated += 1
            if math.isnan(rq.first_token):
                rq.device_hit, rq.loaded = s0.device_hit, s0.loaded
                rq.load_s = cost.h2d_time(s0.loaded) if s0.loaded else 0.0
                if self._pipelined:
                    # the first token exists once the forward has ended and its
                    # results are processed (`process_batch_result_prefill`)
                    self._pending.append((self._first_token, rq))
                else:
                    rq.first_token = now
            rq.remaining = req.output_len - rq.generated
            if rq.remaining <= 0 or not self.cfg.decode:
                if self._overlap:
                    self._finishing.append(rq)
                    finished = True
                else:
                    shrink = True
                self._defer(self._finished_inflight, rq)
            else:
                self._defer(self._checkpoint_filled, (rq, fill))
                self.running.append(rq)
        if self._overlap:
            self._inflight = p0.reqs
            if finished:
                self._pending.append((self._unfull, None))
        if shrink or (shrink_if_joined and self.running):
            self._unfull()
        if continuing is not None:
            admitted.discard(continuing.r.rid)  # not queued: nothing to filter for it
        if admitted:
            # Admitted requests are at the head of the queue (FCFS); request-order
            # jitter can admit a later one, hence the general filter behind.
            w = self.waiting
            while w and w[0].r.rid in admitted:
                admitted.discard(w.popleft().r.rid)
            if admitted:
                self.waiting = deque(rq for rq in w if rq.r.rid not in admitted)
        self._compare()

    def _first_token(self, rq: Req) -> None:
        rq.first_token = self.env.now

    def _checkpoint_filled(self, arg) -> None:
        self._checkpoint(*arg)
