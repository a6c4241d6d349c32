"""The TP group's forwards on its GPU (``Simulation.gpu``, a ``simpy.Resource`` of
capacity 1), as a part of ``sim.events.Simulation``.

Under ``scheduler.overlap_timing: serial`` (and the normal loop, and the step clock)
the loop holds the GPU through each busy period and prices its forwards in line
(``_hold_gpu``, ``_release_gpu``, ``_run_to`` for a run of decode steps). Under
``pipelined`` each forward holds the GPU by itself: a prefill is a process
(``_on_gpu``), a decode forward a request with an exact release timer on a hold the
loop's consecutive decode forwards share (``_DecodeHold``, ``_Segment``), and the loop
waits for the forward before last only to process its results (``_forward_done``),
as ``event_loop_overlap`` runs ``run_batch`` before ``pop_and_process``
(docs/SCHEDULER.md, "The overlap loop in time").

``Forwards`` is mixed into ``Simulation``, whose state it reads: ``env``, ``gpu``,
``cost``, ``busy_s``, ``_hold``, ``_fwd_last``, the loop's ``_run`` / ``_proc`` (a
relevant moment's cut), ``_sync_s``, ``_next_sample`` and ``_last_relevant``.

A pipelined iteration's cache sync is a wait of its own before the decode launch it
precedes; where nothing else can run until it ends and the launch does not depend on
when it is made, the launch goes first and the sync is covered by the wait after it
(``_sync_ahead``, ``_until_via``): one SimPy event instead of two, the same events in
the same order otherwise (``Forwards.merge_sync_waits`` turns it off, which a test
compares byte for byte).
"""

from __future__ import annotations

import math

import simpy

from sim.clock import delay_to, until
from sim.errors import InvariantError


class _DecodeHold:
    """The GPU, held by the loop's consecutive decode forwards (pipelined): its
    request and when the last of them ends. It is handed back (``Simulation._arm``)
    at that end once another forward needs the GPU or the loop goes idle."""

    __slots__ = ("req", "end")

    def __init__(self, gpu):
        self.req = gpu.request()
        self.end = math.nan


class _Segment:
    """One decode forward on a hold: a step, or a run of steps of one batch; its
    batch size, the context its first step attends, its start and end (NaN until
    the GPU has taken it) and its steps."""

    __slots__ = ("hold", "b", "ctx", "start", "end", "steps")

    def __init__(self, hold: _DecodeHold, b: int, ctx: int, start: float):
        self.hold, self.b, self.ctx, self.start = hold, b, ctx, start
        self.end = math.nan
        self.steps = 0


class Forwards:
    """The forwards' part of ``Simulation`` (this module's docstring)."""

    # Pipelined: a decode launch may go ahead of its iteration's cache sync, the wait
    # after it covering both (``_sync_ahead``). Bookkeeping only (tests turn it off and
    # compare the results byte for byte): it saves a SimPy event per such iteration.
    merge_sync_waits = True

    def _hold_gpu(self):
        """The loop's forwards hold the GPU back to back while it is busy; it lets go
        when the loop goes idle (one request per busy period, not per forward)."""
        if self._gpu_hold is None:
            self._gpu_hold = self.gpu.request()
            yield self._gpu_hold

    def _release_gpu(self) -> None:
        self._arm()
        for lane in self._lanes or ():
            lane._release_gpu()
        if self._gpu_hold is not None:
            self.gpu.release(self._gpu_hold)
            self._gpu_hold = None

    def _forward_done(self, fwd, via: float | None = None):
        """Wait for ``fwd``, a forward launched earlier (pipelined): its results can
        be processed once the GPU has computed them (`copy_done.synchronize`).
        ``via``: the end of the iteration's cache sync, which the launch before this
        wait went ahead of (``_sync_ahead``): the wait covers it (``_until_via``)."""
        if via is not None:
            # ``fwd`` ends after the sync (``_sync_ahead`` checked it)
            if isinstance(fwd, _Segment):
                yield from self._until_via(via, fwd.end)
            else:
                yield fwd  # a prefill's: it cannot end before ``via``, nothing is due
            return
        if fwd is None:
            return
        if isinstance(fwd, _Segment):
            if fwd.end != fwd.end:
                yield fwd.hold.req  # its steps are fixed once the GPU takes it
            if self.env.now < fwd.end:
                yield from until(self.env, fwd.end)
        elif not fwd.processed:
            yield fwd

    def _results_of(self, fwd, via: float | None = None):
        """`pop_and_process`: the last batch's results, once ``fwd``, its forward (None:
        in line, already ended), has ended; then the scans their inserts made.
        ``via``: as ``_forward_done``'s."""
        yield from self._forward_done(fwd, via)
        self._process_pending()
        yield from self._result_scan_time()

    def _drain_gpu(self):
        """Before the ranks' request states split (``sim.lanes``): the forward in flight
        ends and the group's GPU is handed back; lanes keep their forwards in line,
        each on its ranks' own GPU."""
        yield from self._forward_done(self._fwd_last)
        self._arm()

    def _forward_over(self, fwd) -> bool:
        if fwd is None:
            return True
        if isinstance(fwd, _Segment):
            return self.env.now >= fwd.end  # False while NaN
        return fwd.processed

    def _arm(self) -> None:
        """Hand the decode hold's GPU back at its last forward's end: another
        forward is about to ask for it, or the loop goes idle."""
        h, self._hold = self._hold, None
        if h is None:
            return
        env, t = self.env, h.end
        if t != t:
            # a hold is armed only after its last forward got the GPU and its steps
            raise InvariantError("the GPU hold's last forward has no end yet")
        if not t > env.now:
            self.gpu.release(h.req)
            return
        d = delay_to(env.now, t)
        if env.now + d == t:
            env.timeout(d).callbacks.append(lambda _ev: self.gpu.release(h.req))
        else:  # rounding to even skips ``t``: a process lands there
            env.process(self._release_at(h, t))

    def _release_at(self, h: _DecodeHold, t: float):
        yield from until(self.env, t)
        self.gpu.release(h.req)

    def _launch(self, gen):
        """Start the prefill forward ``gen`` on the GPU; returns the forward launched
        before it, whose results the caller processes next."""
        self._arm()
        prev, self._fwd_last = self._fwd_last, self.env.process(gen)
        return prev

    def _on_gpu(self, dur: float, starts: list, span: tuple | None):
        """One prefill forward: it queues behind the forward before it on the GPU,
        begins once its batch's loads have started (layer-wise overlap), and holds
        the GPU for ``dur``."""
        env = self.env
        with self.gpu.request() as req:
            yield req
            if starts:
                yield simpy.AllOf(env, starts)
            t0 = env.now
            yield env.timeout(dur)
        if span is not None:  # tracing
            name, ranks, args = span
            self._trace(name, "forward", ranks, t0, env.now - t0, **args)
        self._kick()  # an idle loop may be waiting for the group's last forward

    def _decode_forward(self, b: int, ctx: int, steps: int | None = None,
                        at: float | None = None):
        """Launch a decode forward of the batch (``steps`` of them, or as many as the
        loop fixes later with ``_fix_steps``). It follows the loop's last decode
        forward on the same hold when nobody is queued for the GPU: a request
        made now would be granted at that forward's end, or now if it has ended.
        ``at``: the launch is the one the loop would make then (``_sync_ahead``: it
        follows the hold, or its request queues for the busy GPU). Returns the forward
        and the one launched before it."""
        env = self.env
        h = self._hold
        now = env.now if at is None else at
        if h is not None and not self.gpu.queue:
            seg = _Segment(h, b, ctx, h.end if h.end > now else now)
        else:
            if at is not None and (h is not None or self.gpu.count < self.gpu.capacity):
                raise InvariantError("a launch ahead of its sync follows the hold or queues "
                                     "for the GPU")
            self._arm()
            h = self._hold = _DecodeHold(self.gpu)
            seg = _Segment(h, b, ctx, env.now if h.req.triggered else math.nan)
            if seg.start != seg.start and steps is not None:
                h.req.callbacks.append(lambda _ev: self._granted(seg, steps))
        if steps is not None and seg.start == seg.start:
            self._fix_steps(seg, steps, seg.start, 0, self.busy_s)
        prev, self._fwd_last = self._fwd_last, seg
        return seg, prev

    def _granted(self, seg: _Segment, steps: int) -> None:
        seg.start = self.env.now
        self._fix_steps(seg, steps, seg.start, 0, self.busy_s)

    def _fix_steps(self, seg: _Segment, steps: int, t: float, m: int, busy: float) -> None:
        """``seg`` keeps ``steps`` steps; the first ``m`` of them end at ``t`` (their
        share of ``busy`` counted): the last ones are priced from there, the GPU's
        busy time grows by each, and the hold ends with them."""
        seg.steps = steps
        seg.end, _, self.busy_s = self.cost.decode_run(seg.b, seg.ctx + m * seg.b, steps - m,
                                                       t, 0.0, math.inf, busy)
        seg.hold.end = seg.end
        if self.trace is not None:
            self._trace("decode", "forward", self._ranks(), seg.start, seg.end - seg.start,
                        requests=seg.b, steps=steps)

    def _run_to(self, t: float, lo: float, priced: tuple, recut, via: float | None = None):
        """Wait until ``t``, the end ``priced`` (time, steps, busy) of a run of decode
        steps; a relevant moment after ``lo`` and before ``t`` (``_relevant``)
        interrupts the wait and ``recut(moment)`` prices the run again. ``via``: the
        end of the cache sync the run's launch went ahead of (``_sync_ahead``; before
        ``t``). Returns the pricing the run ends with."""
        env = self.env
        while True:
            self._run = cut = [t, False, lo]  # end, cut, after
            s, via = via, None  # the first wait only
            try:
                if s is None:
                    yield from until(env, t)
                else:
                    # nothing runs before ``s``: no relevant moment can cut the sync
                    yield from self._until_via(s, t)
            except simpy.Interrupt:
                pass
            self._run = None
            if cut[0] >= t:
                return priced
            priced = recut(cut[0])
            t = priced[0]
            if t <= env.now:
                return priced

    def _sync_ahead(self, waits_last: bool = False) -> float | None:
        """Pipelined: when the iteration's cache sync (``_sync_s`` of CPU, before its
        decode launch) ends, if the launch can be made now instead; None if not, and
        the loop waits for the sync first. It can when no event is due until then
        (nothing else runs meanwhile, so nothing changes what the launch reads) and
        the launch makes no event and reads no time: it follows the GPU hold's last
        forward, which ends after the sync (no forward queued for the GPU), and
        starts at that end whenever it is made; or, with ``waits_last`` (the loop
        waits next for the forward launched before it, ``_launch_step``), there is no
        hold and its request queues for the busy GPU. With ``waits_last`` that
        forward must end after the sync too. The wait after the launch then covers
        the sync (``_until_via``, or the prefill's process)."""
        if not self.merge_sync_waits:
            return None
        env = self.env
        s = env.now + self._sync_s  # where SimPy's timeout would land
        if not env.peek() > s:
            return None
        h = self._hold
        if h is not None:
            if self.gpu.queue or not h.end > s:  # (not after ``s`` while NaN)
                return None
        elif not waits_last or self.gpu.count < self.gpu.capacity:
            return None
        if waits_last:
            fwd = self._fwd_last
            if isinstance(fwd, _Segment):
                return s if fwd.end > s else None
            # a prefill's process: as nothing is due before ``s``, it ends after it
            return s if fwd is not None and not fwd.processed else None
        return s

    def _until_via(self, s: float, t: float):
        """Wait until ``t`` (after ``s``), the loop's cache sync ending at ``s`` on the
        way, nothing due before then (``_sync_ahead``). One timeout where it lands at
        ``t`` and the wait after the sync would have been one timeout too: no event
        is made between the sync's and that one, so the order of everything at ``t``
        is theirs. Otherwise the sync's wait, then ``until``'s."""
        env = self.env
        d = delay_to(env.now, t)
        if env.now + d == t and s + delay_to(s, t) == t:
            yield env.timeout(d)
            return
        yield env.timeout(self._sync_s)
        yield from until(env, t)

    def _decode_stalls(self, plans):
        """A decode step's memory work on each replica's scheduler thread; pipelined,
        after the iteration's cache sync (both run while the GPU computes)."""
        if self._pipelined and self._sync_s:
            yield self.env.timeout(self._sync_s)
        if plans:
            yield simpy.AllOf(self.env, [self.env.process(self._stall(c, p)) for c, p in plans])

    def _launch_step(self, at: float | None = None):
        """Pipelined: this iteration's decode step goes to the GPU before the last
        batch's results are processed (`run_batch`, then `pop_and_process`). Returns
        the step's forward and the forward launched before it. ``at``: as
        ``_decode_forward``'s."""
        batch = self.running
        b = len(batch)
        return self._decode_forward(b, sum([rq.kv for rq in batch]) + b, 1, at)

    def _decode_pipelined(self, first, b: int, ctx: int, steps: int, began: float, synced: bool):
        """Pipelined decode: ``steps`` steps of the batch, the first already on the GPU
        when ``first`` is set. The steps after this iteration's each stand for an
        iteration whose CPU work (its cache sync) the step before it hides; the loop
        goes on at the start of the last of them, whose results the next iteration
        processes, or earlier, at the first step boundary at or after a relevant
        moment or the sample grid: there the next iteration looks, with one more
        step already launched. Returns the steps taken."""
        env, cost = self.env, self.cost
        base = 0 if first is None else 1
        n = steps - base
        ctx_run = ctx + base * b
        if n <= 0 or (first is not None and (self._last_relevant > began
                                             or self._next_sample <= env.now)):
            return base  # the next iteration has something to look at now
        if n > 1 and self._sync_s >= cost.decode_step_time(b, ctx_run):
            n = 1  # the CPU is the slower side: every iteration is a step of its own
        # relevant moments after ``ref`` are the next iteration's to see: after this
        # one began, or, for a run after this iteration's step, after the results
        ref = env.now if first is not None else began
        s = None  # the sync's end, where the launch goes ahead of it (``_sync_ahead``)
        if self._sync_s and (first is not None or not synced):
            # the cache sync of the iteration that launches the run's first step
            s = self._sync_ahead()
            if s is None:
                yield env.timeout(self._sync_s)
        h = self._hold
        if h is not None and h.end != h.end:
            # this iteration's step got the GPU just now: its grant fixes its end first
            yield h.req
        seg, _ = self._decode_forward(b, ctx_run, at=s)
        if seg.start != seg.start:
            yield seg.hold.req  # the GPU takes it once the forward before it has ended
            seg.start = env.now
        b0 = seg.start
        stop = self._next_sample
        t, m, busy = b0, 0, self.busy_s
        if self._last_relevant <= ref and stop > b0 and n > 1:
            t, m, busy = cost.decode_run(b, ctx_run, n - 1, b0, 0.0, stop, busy)

        def recut(stop):
            # a relevant moment after ``ref``: one at or before the run's start leaves
            # it the step already launched
            if stop <= b0:
                return b0, 0, self.busy_s
            return cost.decode_run(b, ctx_run, n - 1, b0, 0.0, stop, self.busy_s)
        if s is not None or env.now < t:
            # (ahead of the sync, t >= b0, the hold's end, > s: ``_sync_ahead``)
            t, m, busy = yield from self._run_to(t, ref, (t, m, busy), recut, s)
        # the run's last step, from the boundary where the loop goes on
        self._fix_steps(seg, m + 1, t, m, busy)
        return base + m + 1

    def _ranks(self) -> list[int]:
        return (list(range(self.cfg.tp)) if self._root is None
                else sorted(r for c in self.group.cohorts for r in c.ranks))
