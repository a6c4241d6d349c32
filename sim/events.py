"""The SimPy processes: arrivals, the TP group's scheduler loop, copies, late frees.

SGLang's TP ranks each run a scheduler loop (`Scheduler.event_loop_normal`) over the
same broadcast requests; the per-step collectives keep them in lockstep. This module
runs one loop for the group and, inside each iteration, lets every replica (cohort of
identical ranks, ``sim.ranks``) take its own rank-local decisions and spend its own
time on its own resources. One iteration follows `event_loop_normal` and
`get_next_batch_to_run` (managers/scheduler.py):

1. ``check_hicache_events`` (`_process_hicache_events`): flush queued write-through
   backups as one merged D->H op, then the cache sync in the configured discipline
   (``_sync``): MIN all_reduce of ready ack counts and ``[digest, -digest]``, the
   digest assertion, and the agreed acks popped FIFO.
2. A prefill batch if one can be formed (prefill first, as SGLang does), else one
   decode step of the running batch. Admission is per replica and follows SGLang's
   scheduler (``sim.scheduler``): every candidate is matched, the memory budget is
   checked before any load-back, the batch's extend pages are allocated at once
   after its load-backs (one eviction), decode allocates page by page and retracts
   when a step does not fit.
3. Each replica's scheduler thread pays its blocking backups (on its D2H engine) and
   reclaim scans; its merged H2D load op is queued on its H2D engine. The forward
   is a TP collective: every rank's batch shape enters ``Collective.forward``, so
   ranks that disagree on shapes fail there as a real server would. It then holds
   the GPU for the batch's compute, waiting layer by layer for the loads.
4. Results: ``cache_unfinished_req`` / ``cache_finished_req`` inserts and unlocks.

Decode steps between events are identical iterations (no arrival, no ack, no
finish, no eviction: the sync reduces to what it reduced before), so a run of them
is priced in one timeout that stops at the first step boundary at or after the next
*relevant* time (an arrival, an ack becoming ready for some rank, a copy finishing,
the sample grid) and before the first step that must evict or retract on some
replica. Those times are the same set however ranks share replicas, which keeps
shared and eager runs identical; a test runs the loop step by step against it.

``engine.clock: steps`` (``StepCosts``) makes one iteration one unit of time, the SGLang
server harness's clock, for step-by-step comparison with it (``sim.steprec``).

Simplifications, each a documented difference from SGLang 0.5.23 (docs/TP.md):
- (``scheduler.overlap``, default) `event_loop_overlap`: each batch's results are
  processed in the next iteration, after it has scheduled (docs/SCHEDULER.md, the
  loop's table); ``false`` is `event_loop_normal`;
- prefill and decode batches do not mix (`enable_mixed_chunk` off, SGLang's default);
- the scheduler's simplifications listed in ``sim.scheduler``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Callable, Iterable

import simpy

from sim import consensus
from sim.acks import CacheSync
from sim.admission import Admission
from sim.coalesce import Coalescer
from sim.clock import until  # noqa: F401  (sim.events.until: part of this module's API)
from sim.collectives import make_collective
from sim.config import SimConfig
from sim.decode import Decode
from sim.errors import UserError
from sim.faults import ScriptedFaults
from sim.forwards import Forwards
from sim.jitter import Jitter
from sim.metrics import Metrics
from sim.ranks import Cohort, RankGroup
from sim.policies import resolve
from sim.policies.schedule import GroupShuffle
from sim.policies.sync import SYNC_DISCIPLINES
from sim.prefill import Prefill
from sim.request import Req, _Halt
from sim.scheduler import available, page_ceil
from sim.verdict import Observations, outcome
from sim.workloads.keys import output_key, page_key


class _Late(simpy.Event):
    """Fires after every normal-priority event due at the same instant, those that
    processing them schedules at that instant included (SimPy orders a time's events
    by priority first): a loop that waits on one sees the settled state of ``now``."""

    def __init__(self, env: simpy.Environment):
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, priority=simpy.events.NORMAL + 1)


def run_until(env: simpy.Environment, over: simpy.Event) -> None:
    """Process events until ``over`` has fired, or none is left (a stuck run). Timers
    that outlive the work (a prefetch deadline whose prefetch completed first: SimPy
    cannot cancel a timeout) are left unprocessed, so they never move the clock past
    the run's end.

    The loop is ``Environment.step``'s body inline (simpy 4.1, core.py): the same heap
    pop, the same callbacks in the same order, the same crash on an undefused failure.
    A run makes some 20 events per request, and the three calls a plain
    ``while not over.triggered and env.peek() < inf: env.step()`` spends on each are
    about a twentieth of the engine. ``PLAIN_STEPS`` keeps the plain loop (the test of
    the fast path against it)."""
    if PLAIN_STEPS:
        while not over.triggered and env.peek() < math.inf:
            env.step()
        return
    queue, pop, pending, inf = env._queue, heapq.heappop, simpy.events.PENDING, math.inf
    while over._value is pending and queue and queue[0][0] < inf:
        env._now, _, _, event = pop(queue)
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc


# True: ``run_until`` steps through ``Environment.step`` (the plain path).
PLAIN_STEPS = False



class FixedCosts:
    """Constant placeholder costs for unit tests of the engine's logic."""

    bytes_per_token = 1024
    name = "fixed"

    def d2h_time(self, tokens, concurrent=False):
        return 20e-6 + tokens * 1e-8 if tokens else 0.0

    def h2d_time(self, tokens, concurrent=False):
        return 20e-6 + tokens * 1e-8 if tokens else 0.0

    def batch_load_stall(self, load_tokens, chunks, concurrent=False):
        return self.h2d_time(load_tokens) * 0.1

    def prefill_batch_time(self, chunks):
        new = sum(n for n, _ in chunks)
        return 1e-3 + new * 2e-5 if new else 0.0

    def prefill_time(self, new_tokens, cached_tokens=0):
        return self.prefill_batch_time([(new_tokens, cached_tokens)])

    def decode_step_time(self, batch_size, total_context_tokens):
        return 10e-3

    def decode_run(self, batch_size, context_tokens, max_steps, t0, extra_s, stop, busy=0.0):
        t, k = t0, 0
        while k < max_steps:
            t1 = t + (extra_s + self.decode_step_time(batch_size, context_tokens + k * batch_size))
            busy += t1 - t
            t = t1
            k += 1
            if t >= stop:
                break
        return t, k, busy

    def sync_time(self, world, backend="gloo"):
        return 0.0 if world <= 1 else 200e-6

    def reclaim_scan_time(self, entries):
        return entries * 0.4e-6


class StepCosts:
    """``engine.clock: steps``: one scheduler iteration is one unit of SimPy time, as
    in the SGLang server harness (/work/shared/oracle/server, its ack-timing model):
    every forward costs one step, a blocking synchronize (a write_back eviction's
    backup, `writing_check(write_back=True)`) completes at once, and an asynchronous
    copy is acked by the poll ``ack_delay_steps`` steps after the step that issued it
    (``Simulation._copy``). Nothing else costs time."""

    name = "steps"

    def __init__(self, base):
        self.bytes_per_token = base.bytes_per_token

    def d2h_time(self, tokens, concurrent=False):
        return 0.0

    h2d_time = d2h_time

    def batch_load_stall(self, load_tokens, chunks, concurrent=False):
        return 0.0

    def prefill_batch_time(self, chunks):
        return 1.0

    def prefill_time(self, new_tokens, cached_tokens=0):
        return 1.0

    def decode_step_time(self, batch_size, total_context_tokens):
        return 1.0

    def decode_run(self, batch_size, context_tokens, max_steps, t0, extra_s, stop, busy=0.0):
        # whole steps from t0 until ``max_steps`` or the first boundary at or after ``stop``
        k = max_steps if stop == math.inf else min(max_steps, max(1, math.ceil(stop - t0)))
        return t0 + k, k, busy + k

    def sync_time(self, world, backend="gloo"):
        return 0.0

    def reclaim_scan_time(self, entries):
        return 0.0


def within_limits(workload, cfg):
    """The stream's requests within the run's limits (``max_requests``, ``duration_s``)."""
    for n, req in enumerate(workload):
        if cfg.max_requests is not None and n >= cfg.max_requests:
            return
        if cfg.duration_s is not None and req.arrival > cfg.duration_s:
            return
        yield req


def feed(env, requests, instances, choose, fail):
    """The arrival process: each request, at its arrival time, to ``choose(req)``'s
    instance. An arrival is a relevant time (a decode run stops at the step boundary
    after it, where a real scheduler would see it) for an idle instance, which wakes,
    and for the instance it is routed to, unless that one's next iterations cannot
    read it (``Simulation._arrival_moment``). A bad trace record goes to ``fail`` and
    stops the run."""
    try:
        for req in requests:
            if req.arrival > env.now:
                yield env.timeout(req.arrival - env.now)
                for inst in instances:
                    inst._arrival_moment(req.arrival)
            instances[choose(req)].submit(req)
    except UserError as err:
        fail(err)
        raise _Halt() from None
    for inst in instances:
        inst.end_arrivals()


class Simulation(Admission, Prefill, Decode, CacheSync, Forwards):
    """A TP group serving a request stream with HiCache, in simulated time: the
    scheduler loop (here), its admission (``sim/admission.py``), prefill forwards
    (``sim/prefill.py``), decode steps (``sim/decode.py``), the HiCache sync with its
    copies and acks (``sim/acks.py``) and the forwards on the GPU
    (``sim/forwards.py``), one class over one state."""

    # Replicas that have become identical merge back into one (``sim.coalesce``);
    # False: the plain path, every fork kept to the end (the tests compare the two).
    coalesce_replicas = True
    # An arrival the next iterations cannot read leaves the decode run in flight
    # alone (``_arrival_moment``); False: the plain path, every arrival cuts it.
    quiet_arrivals = True

    def __init__(self, cfg: SimConfig, workload: Iterable | None, cost=None, *,
                 progress: Callable | None = None, trace_events: list | None = None,
                 env: simpy.Environment | None = None, instance: int = 0):
        """``workload``: the request stream; None when a ``sim.cluster.Cluster`` feeds
        this group through ``submit`` (one data-parallel instance of several, on the
        cluster's ``env``)."""
        self.cfg = cfg
        self.cost = cost if cost is not None else FixedCosts()
        self._steps = cfg.clock == "steps"
        self.steprec = None  # sim.steprec.StepRecorder under run --record-steps
        self._stash = None   # the chunked request whose progress is not checkpointed yet
        # scheduler.overlap (`event_loop_overlap`): the last launched batch's results,
        # processed in the next iteration once it has scheduled its own batch
        self._overlap = cfg.overlap
        # scheduler.overlap_timing "pipelined" (overlap loop, time clock): each forward
        # holds the GPU resource on its own; the loop launches batch N, then waits for
        # batch N-1's forward before it processes that batch's results
        # (`pop_and_process` after `run_batch`), so the next iteration's CPU work runs
        # while the GPU computes. The step clock counts iterations, not time.
        self._pipelined = (self._overlap and not self._steps
                           and cfg.overlap_timing == "pipelined")
        self._fwd_last = None  # the last launched forward (pipelined)
        self._hold = None      # the GPU held by the loop's decode forwards (pipelined)
        self._batch_ran = False  # the loop's last iteration ran a batch
        self._pending: list = []          # deferred result work, in order
        self._finishing: list[Req] = []   # last tokens launched, results pending
        self._inflight: list[Req] = []    # the last launched batch (overlap)
        self._iter_step = 0               # the current iteration's step (clock: steps)
        if self._steps:
            self.cost = StepCosts(self.cost)
        self.env = env if env is not None else simpy.Environment()
        self.instance = instance
        self.jitter = Jitter(cfg.jitter, cfg.tp, cfg.seed, rank_base=instance * cfg.tp)
        self.group = RankGroup(cfg, self.env, self.jitter)
        # identical replicas merge back (sim.coalesce); the plain path keeps them apart
        self._coalesce = (Coalescer(self, self.group.pinned)
                          if cfg.tp > 1 and self.coalesce_replicas else None)
        self.faults = ScriptedFaults(cfg.faults, lambda: self._iter_step)
        for c in self.group.cohorts:
            self.faults.install(c)
        self.collective = make_collective(cfg.collective, cfg.tp, cfg.collective_device,
                                          timeout_s=cfg.collective_timeout_s)
        self.metrics = Metrics(cfg, self.cost.bytes_per_token, instance)
        self.obs = Observations(cfg.tp, self.jitter.perturbations, self.faults)
        self.progress = progress
        self.trace = trace_events
        # (time, rank 0's op count) where a scheduler iteration ends: SGLang publishes
        # the tree's KV events there (sim.kvevents); kept only when ops are recorded.
        self.op_ticks: list | None = [] if cfg.record_ops else None
        self._rc = cfg.rank_consensus  # SGLang's rank consensus checker (sim.consensus)
        self.workload = None if workload is None else iter(workload)
        self.busy_s = 0.0                # GPU time spent in forwards
        self.gpu = simpy.Resource(self.env, capacity=1)  # the TP group's forward passes
        self._gpu_hold = None
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []     # decoding, in admission order
        self.chunked: Req | None = None  # the request whose prefill continues next batch
        # Per-rank request state (sim.lanes): once the ranks' decisions on requests
        # differ, each group of ranks that still agrees is a lane with its own queue,
        # batch and requests; None while every rank shares this one.
        self._lanes: list | None = None
        self._root = None     # a lane's group (the Simulation that owns its lanes)
        self._reports = True  # this request state's requests are rank 0's (metrics)
        self.arrivals_done = False
        self.finished = False
        self.halted: str | None = None
        self.stuck: str | None = None
        self.step_no = 0
        self.batch_no = 0
        self.shuffle = GroupShuffle(cfg.seed)  # schedule_policy random (sim.policies.schedule)
        self._user_error = None
        self._next_sample = 0.0
        self._wake = self.env.event()
        self.over = self.env.event()  # the group's work is over (``_check_over``)
        # the time of the last relevant moment (``_relevant``): a decode step's stall
        # that one passed during may not start a run
        self._last_relevant = -math.inf
        self._arrival_at = None  # an arrival moment whose relevance ``submit`` decides
        self._ps = cfg.page_size
        self._sync_s = self.cost.sync_time(cfg.tp, self.collective.transport)
        # the per-step cache sync's discipline (sim.policies.sync)
        self._discipline = resolve(SYNC_DISCIPLINES, cfg.discipline, "sync discipline")
        self._pending_writes: dict[int, list] = {}  # id(cohort) -> write acks to flush
        # Reclaim entries scanned by inserts' write-through backups, per replica: CPU
        # the scheduler thread spends while processing results.
        self._result_scans: dict[int, int] = {}
        # Shapes and collectives matter only when some rank can differ.
        self._solo = cfg.tp == 1
        self._retracted_now = False  # this decode step retracted: no ratio decay
        self._sync_mismatch = False  # the iteration's digest check failed
        # the ranks' first free-space difference (``_log_free``), at tp > 1
        self._free_log: dict | None = {} if cfg.tp > 1 and self._steps else None
        self._run = None             # [end, cut] of the decode run in flight
        self._proc = None            # the loop's process (a cut interrupts it)
        # Hybrid models' admission and allocation rules (sim.hybrid.replica); None
        # for a FULL-only model, whose path is unchanged.
        self._hyb = None
        if cfg.hybrid is not None:
            from sim.hybrid.replica import HookSettings, HybridHooks
            self._hyb = HybridHooks(HookSettings.of(cfg))
        # The L3 tier (docs/STORAGE.md §7, sim.storage.engine); None: no storage
        # work anywhere.
        self._st = None
        if cfg.storage is not None:
            from sim.storage.engine import StorageEngine
            self._st = StorageEngine(self)
        # --hicache-host-memory-mode buffer_only (sim.storage.buffer)
        self._buf = self._st is not None and self._st.buf

    # ------------------------------------------------------------ plumbing
    def _kick(self, _event=None) -> None:
        if not self._wake.triggered:
            self._wake.succeed()

    def _relevant(self, t: float | None = None) -> None:
        """A relevant moment happens now (``t``: its exact time, where the event that
        carries it may land an ulp off): an arrival, an ack becoming ready for some
        rank, a copy, storage op or late free ending, a prefetch deadline. Each is a
        SimPy event whose process calls this when it fires: an idle loop wakes, and a
        decode run in flight stops at the first step boundary at or after ``t``, where
        a step-by-step loop would look."""
        if t is None:
            t = self.env.now
        self._last_relevant = t
        self._kick()
        run = self._run
        if run is not None and run[2] < t < run[0]:
            run[0] = t
            if not run[1]:
                run[1] = True
                self._proc.interrupt("cut")

    def _arrival_moment(self, t: float) -> None:
        """Requests arrive at ``t``, some perhaps routed here. An idle loop wakes (it
        runs an iteration, as it always has). A busy one waits for ``submit``: a
        request routed elsewhere is nothing to it, and one routed here is news only
        if an iteration before the next one that changes the batch's state reads it
        (``_arrival_is_news``). Otherwise cutting the decode run in flight would make
        an iteration that does exactly what the run's next step does."""
        if self.quiet_arrivals and self._wake.triggered:
            self._arrival_at = t
        else:
            self._arrival_at = None
            self._relevant(t)

    def _arrival_is_news(self) -> bool:
        """Whether the iterations from now on read a request that arrives now before
        something else makes them look. They do not while admission returns at once
        on every replica (``_batch_full``), and decode reads the waiting queue only
        when some batch is not full. The flag is cleared only inside an iteration (a
        finish, a retraction, an empty batch), and that iteration and the ones after
        it read the live waiting queue, the arrival in it. The op ticks (one per
        iteration), the L3 tier (its prefetch starts at arrival) and lanes take every
        arrival."""
        return not (self._lanes is None and self._st is None and self.op_ticks is None
                    and self._batch_full())

    def _settle(self):
        """Let every other event due now run first: a step sees the state at ``now``
        whatever order SimPy happens to process simultaneous events in."""
        if self.env.peek() <= self.env.now:
            yield _Late(self.env)

    def _trace(self, name, cat, ranks, t, dur, **args):
        if self.trace is None:
            return
        for r in ranks:
            ev = {"name": name, "cat": cat, "ph": "X", "ts": round(t * 1e6, 3),
                  "pid": self.instance, "tid": r, "args": args}
            if dur:
                ev["dur"] = round(dur * 1e6, 3)
            else:
                ev.update(ph="i", s="t")  # an instant event, thread-scoped
            self.trace.append(ev)

    def _consensus_match(self, c: Cohort, key, m) -> None:
        consensus.record(self, c, "match_prefix", f"params={consensus.key_text(key, self._ps)}",
                         f"result.full_kv_hit_length={m.device_len + getattr(m, 'host_len', 0)} | "
                         "result.swa_host_hit_length=0")

    def _tick_ops(self) -> None:
        c = next(c for c in self.group.cohorts if 0 in c.ranks)
        self.op_ticks.append((self.env.now, len(c.ops)))

    @staticmethod
    def _op(c: Cohort, op: dict) -> None:
        """Record ``op`` in the replica's op-trace. ``reserved`` is the device KV that
        running requests hold outside the tree, which SGLang's allocator also
        excludes (an op-trace extension, docs/OPTRACE.md)."""
        if c.ops is not None:
            op["reserved"] = c.kv.reserved
            c.ops.append(op)

    # ------------------------------------------------------------ processes
    def run(self) -> None:
        """Serve ``workload`` to the end (a standalone TP group)."""
        self.env.process(self._arrivals())
        self.start()
        try:
            run_until(self.env, self.over)
        except _Halt:
            pass
        finally:
            self.collective.close()
        self.wrap_up()

    def start(self) -> None:
        self._proc = self.env.process(self._loop())

    def _check_over(self) -> None:
        """The group's work is over once its loop has finished and the last late free
        (device KV a rank returns to its allocator after a delay) has landed."""
        if not self.over.triggered and not any(c.kv.late for c in self.group.cohorts):
            self.over.succeed()

    def wrap_up(self) -> None:
        """After the event loop: a stuck run is named, the ground truth confirmed."""
        if self._user_error is not None:
            raise self._user_error
        if self._lanes is not None:
            # rank 0's request state carries the group's figures (``Req`` doc)
            self.busy_s = self._lanes[0].busy_s
        if not self.finished and self.halted is None:
            # The event queue ran dry with work left: nothing can ever wake the loop.
            s = self._lanes[0] if self._lanes else self
            self.stuck = (f"no event left with {len(s.waiting)} waiting and "
                          f"{len(s.running)} running requests")
        self.obs.final_compare(self.env.now, self.step_no, self.group.cohorts)
        self._sample(final=True)
        if self._st is not None:
            self._st.wrap_up()

    def submit(self, req) -> None:
        """A request arrives now (the cluster's router chose this instance)."""
        if self._arrival_at is not None:
            t, self._arrival_at = self._arrival_at, None
            if t == self.env.now and self._arrival_is_news():
                self._relevant(t)
        key = page_key(req.blocks, req.block_size, self._ps, req.input_len)
        if self._lanes is not None:
            for lane in self._lanes:  # every rank receives it (`broadcast_pyobj`)
                lane.waiting.append(Req(req, key))
            self._kick()
            return
        rq = Req(req, key)
        self.waiting.append(rq)
        if self._st is not None:
            self._st.arrive(rq)
        self._kick()

    def end_arrivals(self) -> None:
        self.arrivals_done = True
        self._kick()

    @property
    def load(self) -> int:
        """Requests routed here and not finished: what a router balances."""
        s = self._lanes[0] if self._lanes else self
        return len(s.waiting) + len(s.running) + (s.chunked is not None)

    def _arrivals(self):
        yield from feed(self.env, within_limits(self.workload, self.cfg), [self], lambda req: 0,
                        self._fail)

    def _fail(self, err: UserError) -> None:
        # A bad trace record: keep the error object itself (SimPy would re-create it
        # from its args); run() raises it once the loop has unwound.
        self._user_error = err

    def _in_flight(self) -> bool:
        return any(c.load_q or c.write_q or self._pending_writes.get(id(c))
                   or (c.st is not None and c.st.busy())
                   for c in self.group.cohorts)

    def _drained(self) -> bool:
        return (self.arrivals_done and all(not s.waiting and not s.running and s.chunked is None
                                           and not s._pending for s in self._lanes or (self,))
                and not self._in_flight()
                and self._forward_over(self._fwd_last))

    def _loop(self):
        """`event_loop_normal`: one iteration per relevant moment."""
        while True:
            yield from self._settle()
            sr = self.steprec
            if self._free_log is not None and self.step_no:
                self._log_free()
            if sr is not None:
                sr.end(self.group.cohorts)
            if self._drained():
                if sr is not None and self._batch_ran and not self._overlap:
                    # `event_loop_normal` iterates once more after its last batch
                    # (`last_batch` is still set): an idle step with nothing in it
                    sr.begin(int(self.env.now), self.group.cohorts)
                    sr.end(self.group.cohorts)
                self._release_gpu()
                self.finished = True
                self._check_over()
                return
            self._batch_ran = False
            if self._steps:
                self._iter_step = self.obs.clock_step = int(self.env.now)
            if sr is not None:
                sr.begin(int(self.env.now), self.group.cohorts)
            self.step_no += 1
            if self.op_ticks is not None:
                self._tick_ops()
            self._sample()
            self._sync_mismatch = False
            self._sync()
            if self._coalesce is not None:
                self._coalesce.step()
            if self._lanes is None:
                ran = yield from self._batch()
            else:
                from sim import lanes
                ran = yield from lanes.batches(self)
            if ran:
                continue
            if self._drained():
                if self._free_log is not None:
                    self._log_free()
                if sr is not None:
                    sr.end(self.group.cohorts)
                self.finished = True
                self._check_over()
                return
            if not self._forward_over(self._fwd_last):
                # nothing to run but the last forward still on the GPU: the group's
                # work is over only once it has ended
                yield from self._forward_done(self._fwd_last)
                continue
            self._release_gpu()
            self._wake = self.env.event()
            if self.op_ticks is not None:
                self._tick_ops()
            yield self._wake  # the next relevant moment (``_relevant``)

    def _batch(self):
        """`get_next_batch_to_run` and `run_batch` on this request state: the prefill
        batch, else a decode step, else the last batch's results. True when the
        iteration took its step; False when there was nothing to run."""
        sr = self.steprec
        if self._stash is not None:
            # `get_next_batch_to_run`: after the HiCache poll, the continuing chunk's
            # progress is inserted (`stash_chunked_request` -> `cache_unfinished_req`)
            self._checkpoint(self._stash, None)
            self._stash = None
        self._compare()
        if self.waiting or self.chunked is not None:
            plan = self._admit()
            if plan is not None:
                if sr is not None:
                    self._record_extend(plan)
                if not self._pipelined:
                    # the last batch's results, this one scheduled (pipelined: launched)
                    yield from self._results_of(None)
                yield from self._prefill(plan)
                # `process_batch_result` ends with `flush_pending_backups`: the
                # step's backups leave with its results
                self._flush_writes()
                self._batch_ran = True
                return True
        if self.running and self.cfg.decode:
            ran = yield from self._decode()
            self._flush_writes()
            if ran is not False:
                self._batch_ran = True
                return True
        if self._pending:
            # no batch this step: the last batch's results are processed, and the
            # step is spent (the next one schedules with them)
            self._inflight = []
            yield from self._forward_done(self._fwd_last)
            self._process_pending()
            self._flush_writes()
            self._compare()
            yield from self._result_scan_time()
            if self._steps:
                yield self.env.timeout(1)
            return True
        self._inflight = []
        self._compare()
        return False

    def _log_free(self) -> None:
        """The ranks' device and host free space at the end of the step just run (the
        harness's ``dev_free`` / ``host_free``); the first step where they differ is
        a silent divergence's step. Compared only while the ranks have replicas of
        their own."""
        cohorts = self.group.cohorts
        if len(cohorts) < 2:
            return
        vals = [(available(c.tree), c.tree.host_capacity - c.tree.host_used - c.tree.host_reserved)
                for c in cohorts]
        log = self._free_log
        if all(v == vals[0] for v in vals[1:]):
            return
        log["steps_differing"] = log.get("steps_differing", 0) + 1
        if "step" in log:
            return
        r0, r1 = vals[0], next(v for v in vals[1:] if v != vals[0])
        by_rank = {}
        for c, v in zip(cohorts, vals):
            for r in c.ranks:
                by_rank[r] = v
        log["step"] = self._iter_step
        log["differs"] = {f: [by_rank[r][i] for r in range(self.cfg.tp)]
                          for i, f in enumerate(("dev_free", "host_free")) if r0[i] != r1[i]}

    def _sample(self, final: bool = False) -> None:
        now = self.env.now
        if now >= self._next_sample or final:
            # Sampled at scheduler activity, on a grid of timeseries_interval_s: an idle
            # stretch (nothing changes) costs nothing. One row per rank.
            trees = {r: c.tree for c in self.group.cohorts for r in c.ranks}
            self.metrics.sample(now, [trees[r] for r in range(self.cfg.tp)], final=final)
            dt = self.cfg.timeseries_interval_s
            self._next_sample = (math.floor(now / dt) + 1) * dt

    # ------------------------------------------------------------ results
    def _finish(self, rq: Req) -> None:
        """`release_kv_cache(checkpoint=True)`: the committed sequence is inserted,
        the request's lock and leftover pages released."""
        self._checkpoint(rq, rq.kv, final=True)
        rq.finish = self.env.now
        if self.steprec is not None and self._reports:
            self.steprec.finished(rq, self.steprec.step)
        self.metrics.request_done(rq)
        if self.progress is not None:
            self.progress(self.env.now, self.metrics)

    def _seq_key(self, rq: Req, tokens: int) -> list:
        """The key of the request's first ``tokens`` tokens (whole pages)."""
        r = rq.r
        if tokens <= r.input_len:
            key, n = rq.key, tokens // self._ps
            return key if n >= len(key) else key[:n]  # the prompt's own key: no copy
        return rq.key + output_key(r.rid, r.input_len, tokens - r.input_len, self._ps)

    def _checkpoint(self, rq: Req, up_to: int | None, final: bool = False) -> None:
        """`checkpoint_into_tree` on every replica: insert the first ``up_to`` tokens
        (None: each replica's own progress), then, for a sequence longer than its
        prompt, the prompt key again at priority + 1 so the leaf splits at the prompt
        boundary; then move the request's lock to the inserted node (or release it)."""
        ps = self._ps
        pk = rq.key
        for c in self.group.cohorts:
            tree, slot = c.tree, rq.slots[id(c)]
            key = self._seq_key(rq, slot.done if up_to is None else up_to)
            tokens = len(key) * ps
            if self._hyb is not None:
                hy_req = self._hyb.before_insert(c, rq, slot.in_tree, tokens, final)
                if hy_req.refused is not None:
                    self._out_of_memory(c, hy_req.refused)
            if tokens > slot.in_tree:
                # the request's own pages pass to the tree (duplicates are freed)
                c.kv.to_tree(tokens - slot.in_tree)
                slot.in_tree = tokens
            if self._hyb is not None:
                self._op(c, {"op": "insert", "key": key})
                ins = self._insert(c, key, 0, req=hy_req)
            else:
                # `InsertParams.inserted_len` (unified_radix_cache.py
                # checkpoint_into_tree); only write_through's hit counts read it
                done = slot.inserted
                op = {"op": "insert", "key": key}
                if done and tree.write.hit_threshold is not None:
                    op["inserted"] = done
                self._op(c, op)
                ins = self._insert(c, key, 0, inserted=done)
                slot.inserted = max(done, tokens)
            if 0 < len(pk) < len(key) and self._hyb is None:
                # (a hybrid tree skips it: unified_radix_cache.py checkpoint_into_tree
                # splits at the prompt only for a FULL-only tree); the prompt re-insert
                # passes `inserted_len=len(prompt_key)`: it counts no hits
                op = {"op": "insert", "key": pk, "priority": 1}
                if tree.write.hit_threshold is not None:
                    op["inserted"] = len(pk) * ps
                self._op(c, op)
                # a prefix of the key just inserted
                self._insert(c, pk, 1, resident=True, inserted=len(pk) * ps)
            if final:
                self._op(c, {"op": "unlock", "id": slot.lock_id})
                tree.dec_lock(slot.lock)
                self._free(c, page_ceil(rq.kv, ps) - slot.in_tree)
            else:
                n = slot.done if up_to is None else up_to
                lid = f"q{rq.r.rid}.i{n}{rq.try_suffix}"
                self._op(c, {"op": "lock", "key": key, "id": lid})
                self._op(c, {"op": "unlock", "id": slot.lock_id})
                tree.inc_lock(ins.node)
                tree.dec_lock(slot.lock)
                slot.lock, slot.lock_id = ins.node, lid

    def _insert(self, c: Cohort, key: list, priority: int, resident: bool = False,
                inserted: int = 0, req=None):
        if req is not None:
            # a hybrid replica's insert, for the request ``before_insert`` prepared
            ins = c.tree.insert(key, priority, resident, req=req)
        elif self._buf:
            ins = self._st.buffer_insert(c, key, priority, resident, inserted)
        elif inserted:
            ins = c.tree.insert(key, priority, resident, inserted)
        else:
            ins = c.tree.insert(key, priority, resident)
        if self._rc:
            consensus.record(self, c, "insert", f"len(params.key)={len(key) * self._ps}",
                             f"result.prefix_len={ins.prefix_tokens}")
        cid = id(c)
        self._result_scans[cid] = self._result_scans.get(cid, 0) + ins.host.scanned
        if ins.writes:
            self._pending_writes.setdefault(cid, []).extend((w.ack_id, w.tokens) for w in ins.writes)
        return ins

    def _free(self, c: Cohort, tokens: int) -> None:
        """Return a request's own device KV to the replica's allocator; on a rank with
        late frees, only after its drawn delay."""
        if tokens <= 0:
            return
        j = self.jitter
        if len(c.ranks) == 1 and c.ranks[0] in j.free_ranks:
            d = j.free_delay(c.ranks[0], c.kv.issue_free())
            if d > 0:
                c.kv.free_later(tokens)
                self.env.process(self._late_free(c, tokens, d))
                return
        c.kv.free(tokens)

    def _late_free(self, c: Cohort, tokens: int, delay: float):
        yield self.env.timeout(delay)
        c.kv.late_freed(tokens)
        self._relevant()
        if self.finished:
            self._check_over()

    # ------------------------------------------------------------ replicas
    def _fork(self, rank: int, cause: str, detail: str = "") -> Cohort:
        """Copy-on-divergence, plus the requests' per-replica state: their lock nodes
        are found in the clone by path (the trees are identical at this instant)."""
        if self._lanes is not None:
            # the request state the rank's slots live in is its lane's
            lane = next(x for x in self._lanes if any(rank in c.ranks for c in x.group.cohorts))
            return lane._fork(rank, cause, detail)
        src = self.group.cohort_of(rank)
        c = self.group.fork(rank, cause, self.env.now, detail)
        if c is src:
            return c
        if c.st is not None:
            self._st.hook(c)
        sid, cid = id(src), id(c)
        if sid in self._pending_writes:
            self._pending_writes[cid] = list(self._pending_writes[sid])
        for rq in self._live():
            slot = rq.slots.get(sid)
            if slot is None:
                continue
            new = slot.copy()
            new.lock = c.tree.lock_in(slot.lock)
            rq.slots[cid] = new
        self._trace("fork", "divergence", [rank], self.env.now, 0, cause=cause)
        return c

    # ------------------------------------------------------------ storage (L3)
    def _live(self):
        yield from self.running
        # the overlap loop's finishers: out of the batch, their results (the final
        # insert and the free) still to come, so they hold their slots until then
        for rq in self._finishing:
            if rq not in self.running:
                yield rq
        if self.chunked is not None:
            yield self.chunked
        for rq in self.waiting:
            if rq.slots:
                yield rq

    def _compare(self) -> None:
        if self.cfg.check_invariants:
            for c in self.group.cohorts:
                c.tree.check()  # engine.check_invariants: raises InvariantError
        if len(self.group.cohorts) > 1:
            self.obs.compare(self.env.now, self.step_no, self.group.cohorts)

    def report(self) -> dict:
        """divergence.json: what SGLang would see, the ground truth, and the verdict."""
        rep = self.obs.report()
        rep.update({
            "halted": self.halted,
            "finished": self.finished,
            "tp": self.cfg.tp,
            "collective_calls": self.collective.calls,
            "digests": {str(r): self.group.cohort_of(r).tree.digest for r in range(self.cfg.tp)},
            "steps": self.step_no,
        })
        if self._steps:
            # the harness's outcome classes (tools/sglang_server/tp2.py), in its steps
            rep["outcome"] = outcome(rep, self.cfg.tp, self._free_log or None, self.halted)
        return rep
