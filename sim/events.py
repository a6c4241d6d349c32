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

import itertools
import math
from collections import deque
from typing import Callable, Iterable

import simpy

from sim import consensus
from sim import constants as C
from sim.collectives import REQUEST_BROADCAST, CollectiveError, make_collective
from sim.config import SimConfig
from sim.constants import DIGEST_MISMATCH_MESSAGE
from sim.errors import UserError
from sim.clock import until  # noqa: F401  (sim.events.until: part of this module's API)
from sim.faults import ScriptedFaults
from sim.forwards import Forwards
from sim.jitter import Jitter
from sim.metrics import Metrics
from sim.ranks import Ack, Cohort, RankGroup
from sim.policies import resolve
from sim.policies.schedule import GroupShuffle, calc_priority
from sim.policies.sync import SYNC_DISCIPLINES
from sim.scheduler import (CONTINUE, NO_TOKEN, OTHER, Adder, Budget, available,
                           page_ceil, ratio_after_retract, retraction_order,
                           running_offset, steps_without_event)
from sim.verdict import Observations, outcome
from sim.workloads.keys import output_key, page_key


# Request-order jitter permutes at most this many leading candidates of a batch.
ORDER_WINDOW = 1024


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
    the run's end."""
    while not over.triggered and env.peek() < math.inf:
        env.step()


class _Halt(Exception):
    """Stops the run where a real server would stop (or the run cannot follow)."""


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


class _Slot:
    """A request's state on one replica: its lock and its KV."""

    __slots__ = ("lock", "lock_id", "done", "in_tree", "device_hit", "loaded", "inserted")

    def __init__(self):
        self.lock = None       # the locked node
        self.lock_id = None    # that lock's op-trace id (when recording)
        self.done = 0          # tokens whose KV exists while prefilling (prefix + chunks)
        self.in_tree = 0       # leading tokens whose pages the tree owns (page-aligned)
        self.device_hit = 0
        self.loaded = 0
        # `req.kv.cache_inserted_len`: tokens this request inserted (0 again after a
        # retraction, `reset_for_retract`, as the slot is new then)
        self.inserted = 0

    def copy(self) -> "_Slot":
        s = _Slot()
        for k in _Slot.__slots__:
            setattr(s, k, getattr(self, k))
        return s


class Req:
    """A request across its life. Per-replica state lives in ``slots``; the metrics
    fields describe rank 0, the group's reference rank. A retracted request keeps its
    outputs: it prefills its input and those outputs again (``fill_len``)."""

    __slots__ = ("r", "key", "slots", "remaining", "generated", "kv", "retractions",
                 "device_hit", "loaded", "load_s", "stall_s", "prefill_s", "start",
                 "first_token", "finish", "l3")

    def __init__(self, r, key):
        self.r = r
        self.key = key
        self.slots: dict[int, _Slot] = {}  # id(cohort) -> its state
        self.remaining = 0   # decode steps left
        self.generated = 0   # output tokens so far
        self.kv = 0          # committed KV tokens while decoding (`kv_committed_len`)
        self.retractions = 0
        self.device_hit = self.loaded = 0
        self.load_s = self.stall_s = self.prefill_s = 0.0
        self.start = self.first_token = self.finish = math.nan
        self.l3 = 0  # tokens its prefetch loaded from storage (rank 0's replica)

    @property
    def try_suffix(self) -> str:
        """The op-trace id suffix of this admission: ``.t<n>`` after n retractions, so
        a re-admitted request's locks and loads never reuse an earlier try's ids."""
        return f".t{self.retractions}" if self.retractions else ""

    @property
    def fill_len(self) -> int:
        """`full_untruncated_fill_ids`: input plus the outputs so far."""
        return self.r.input_len + self.generated


class _Plan:
    """One replica's half of a prefill batch: what it admitted and what that cost."""

    __slots__ = ("reqs", "shape", "chunks", "backups", "scanned", "loads", "load_tokens",
                 "started", "stall_first")

    def __init__(self):
        self.reqs: list[Req] = []
        self.shape: list[tuple[int, int, int]] = []  # (rid, prefix tokens, extend tokens)
        self.chunks: list[tuple[int, int]] = []      # (new, cached) per request
        self.backups: list[int] = []                 # blocking D2H backups, tokens each
        self.scanned = 0                             # reclaim map entries visited
        self.loads: list = []                        # load-back ids of this batch
        self.load_tokens = 0
        self.started = None                          # event: the merged H2D op began
        self.stall_first = 0.0                       # eviction stall, booked on the first request


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
    instance. Every arrival is a relevant time for every instance, so a decode run
    stops at the step boundary after it, where a real scheduler would see it. A bad
    trace record goes to ``fail`` and stops the run."""
    try:
        for req in requests:
            if req.arrival > env.now:
                yield env.timeout(req.arrival - env.now)
                for inst in instances:
                    inst._relevant(req.arrival)
            instances[choose(req)].submit(req)
    except UserError as err:
        fail(err)
        raise _Halt() from None
    for inst in instances:
        inst.end_arrivals()


class Simulation(Forwards):
    """A TP group serving a request stream with HiCache, in simulated time."""

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

    # ------------------------------------------------------------ collectives
    def _all_reduce(self, site: str, inputs: dict[int, list[int]], next_calls=None) -> list[int]:
        try:
            if next_calls and len(inputs) < self.cfg.tp:
                return self.collective.all_reduce_min(self.step_no, site, inputs, next_calls)
            return self.collective.all_reduce_min(self.step_no, site, inputs)
        except CollectiveError as err:
            self._collective_failed(err)

    def _collective_failed(self, err: CollectiveError):
        if err.kind == "misaligned":
            # Calls from different sites paired with equal sizes: a real group returns
            # and runs on with every later pairing shifted, which this engine cannot follow.
            self.obs.untracked(self.env.now, self.step_no, f"collectives misaligned: {err.detail}")
            self.obs.compare(self.env.now, self.step_no, self.group.cohorts, full=True)
            self.halted = "untracked"
            raise _Halt()
        self.obs.collective_error(self.env.now, self.step_no, err)
        self._trace(err.kind, "collective", list(range(self.cfg.tp)), self.env.now, 0)
        self.obs.compare(self.env.now, self.step_no, self.group.cohorts, full=True)
        self.halted = err.kind
        raise _Halt()

    def _flush_writes(self) -> None:
        """`flush_pending_backups`: each replica's queued write-through backups leave
        as one merged D->H op with one ack (sem §6.4, `start_writing`)."""
        for c in self.group.cohorts:
            self._launch_writes(c)

    def _launch_writes(self, c: Cohort) -> None:
        ids = self._pending_writes.pop(id(c), None)
        if ids:
            tokens = sum(k for _, k in ids)
            ack = self.group.make_ack(c, "write", [i for i, _ in ids], tokens)
            self._count_delays(ack)
            c.write_q.append(ack)
            self.env.process(self._copy(c, c.d2h, c.h2d, ack, self.cost.d2h_time, None))

    def _sync(self) -> None:
        """`check_hicache_events` in the configured discipline (sem §5.2)."""
        self._flush_writes()
        if self._st is not None:
            self._st.sync()
            return
        group, now, disc = self.group, self.env.now, self._discipline
        if self._solo and disc.solo_pops:
            c = group.cohorts[0]
            self._pop(c, c.ready_count(c.write_q, 0, now), c.ready_count(c.load_q, 0, now))
            return
        if len(group.cohorts) == 1 and disc.one_vector:
            c = group.cohorts[0]
            if (all(a.delays is None for a in c.write_q)
                    and all(a.delays is None for a in c.load_q)):
                # Every rank shares one replica and sees the same acks: one vector.
                w, l_ = c.ready_count(c.write_q, 0, now), c.ready_count(c.load_q, 0, now)
                d = c.tree.digest ^ c.tree.digest_xor
                red = self.collective.all_reduce_uniform(self.step_no, "sync", [w, l_, d, -d])
                self._pop(c, red[0], red[1])
                return
        counts: dict[int, tuple[int, int]] = {}
        digest: dict[int, int] = {}
        for c in group.cohorts:
            w_uniform = all(a.delays is None for a in c.write_q)
            l_uniform = all(a.delays is None for a in c.load_q)
            base = None
            for r in c.ranks:
                if base is None or not (w_uniform and l_uniform):
                    base = (c.ready_count(c.write_q, r, now), c.ready_count(c.load_q, r, now))
                counts[r] = base
                digest[r] = c.tree.digest ^ c.tree.digest_xor
        disc.reduce(self, counts, digest)

    def _sync_call_count(self) -> int:
        """The collectives ``_sync`` issues in the current state, acks popped: what
        each iteration of a decode run would issue (its queues cannot change)."""
        disc = self._discipline
        if self._solo and disc.solo_pops:
            return 0
        return disc.call_count(self)

    def _check_digest(self, digest: dict[int, int], lo: int, hi: int) -> None:
        """Each rank asserts its digest equals the reduced min and max."""
        if all(d == lo and d == hi for d in digest.values()):
            return
        self._sync_mismatch = True
        now = self.env.now
        first = self.obs.digest_mismatch(now, self.step_no, lo, hi, digest,
                                         DIGEST_MISMATCH_MESSAGE)
        if first:
            self._trace("digest_mismatch", "divergence", list(range(self.cfg.tp)), now, 0)
            self.obs.compare(now, self.step_no, self.group.cohorts, full=True)
        if self.cfg.on_divergence == "halt":
            self.halted = "digest_mismatch"
            raise _Halt()

    def _pop(self, c: Cohort, n_write: int, n_load: int) -> None:
        """`writing_check(n)` then `loading_check(n)`: pop the agreed acks FIFO."""
        tree = c.tree
        for _ in range(n_write):
            ack = c.write_q.popleft()
            for i in ack.ids:
                tree.finish_write_through(i)
                self._op(c, {"op": "write_ack", "id": i})
                if self.steprec is not None:
                    self.steprec.hc(c, "write_ack", i)
        for _ in range(n_load):
            ack = c.load_q.popleft()
            for i in ack.ids:
                if i[0] == "b":  # a staged bounce's H2D (buffer_only): `try_finish_load_back`
                    c.st.book.load_ack(i)
                    continue
                tree.finish_load_back(i)
                self._op(c, {"op": "load_back_ack", "id": i})
            if self.steprec is not None:
                self.steprec.hc(c, "load_ack", 1)
            self._trace("load_ack", "ack", c.ranks, self.env.now, 0, ids=len(ack.ids))

    def _count_delays(self, ack: Ack) -> None:
        if ack.delays:
            self.jitter.perturbations.fire("ack_delay", len(ack.delays))

    def _copy(self, c: Cohort, engine, other, ack: Ack, seconds, started):
        """One merged transfer on a copy engine; its ack completes when it ends.
        Concurrent traffic the other way shares the link (priced by the cost model).
        Under the step clock it holds no engine: the harness completes every copy
        ``ack_delay_steps`` after its issue, however many are in flight."""
        if self._steps:
            yield from self._step_copy(c, ack, started)
            return
        with engine.request() as req:
            yield req
            if started is not None:
                started.succeed()
            t0 = self.env.now
            dur = seconds(ack.tokens, concurrent=other.count > 0)
            yield self.env.timeout(dur)
        self._acked(ack)
        self._trace(f"{ack.kind}_copy", "transfer", c.ranks, t0, ack.done - t0, tokens=ack.tokens)

    def _acked(self, ack: Ack) -> None:
        """A copy ended now: its ack is ready for the undelayed ranks at once and for
        each delayed rank when its delay has passed (a timeout per rank), each a
        relevant moment (a decode run must stop where the ack can land)."""
        ack.done = self.env.now
        self._relevant()
        if ack.delays is not None:
            ack.late = late = {}
            for r, d in ack.delays.items():
                ev = late[r] = self.env.timeout(d)
                ev.callbacks.append(self._ack_ready)

    def _ack_ready(self, _event) -> None:
        self._relevant()

    def _step_copy(self, c: Cohort, ack: Ack, started):
        """A copy under the step clock: issued in step k, acked by the poll of step
        k + N (N: ``ack_delay_steps``), at time k + N. Loads are issued at the step's
        start; write-through backups where `process_batch_result` ends with
        `flush_pending_backups` (at k + 1 for the normal loop's own results, at k for
        the overlap loop's results of the step before)."""
        if started is not None:
            started.succeed()
        d2h, h2d = self.cfg.ack_delay_steps
        t0 = self.env.now
        dur = max(0, self._iter_step + (h2d if ack.kind == "load" else d2h)
                  + self.faults.ack_extra(c, self._iter_step) - t0)
        if dur:
            yield self.env.timeout(dur)
        self._acked(ack)

    # ------------------------------------------------------------ admission
    def _admit(self) -> list[tuple[Cohort, _Plan]] | None:
        """This iteration's prefill batch on every replica (`get_new_batch_prefill`),
        its extend allocation included (`prepare_for_extend`)."""
        group = self.group
        if self.chunked is None and (self.running or self._finishing) and all(c.sched.batch_is_full
                                                         for c in group.cohorts):
            return None  # every replica's early return (`batch_is_full`)
        cap = min(c.tree.device_capacity for c in group.cohorts)
        ps = self._ps
        while self.waiting:
            rq = self.waiting[0]
            r = rq.r
            if (rq.fill_len + min(r.output_len - rq.generated, self.cfg.clip_max_new_tokens) + ps >= cap
                    or (self._hyb is not None and self._hyb.never_admissible(rq))):
                # Never admissible, even into an empty pool (check_prefill's
                # `total_tokens < remaining_total`): SGLang aborts such a request.
                self.waiting.popleft()
                self.metrics.rejected += 1
                if self._st is not None:
                    for c in group.cohorts:
                        self._st.abort(c, f"p{r.rid}")
                continue
            break
        if not self.waiting and self.chunked is None:
            return None
        self.batch_no += 1
        j = self.jitter
        if j.id_drift:
            self._id_drift()
        orders = self._orders() if j.order_ranks else {}
        plans = []
        for c in list(group.cohorts):
            order = orders.get(c.ranks[0]) if len(c.ranks) == 1 else None
            if order is None:
                seq = self.waiting
            else:
                first = list(itertools.islice(self.waiting, len(order)))
                seq = itertools.chain((first[i] for i in order),
                                      itertools.islice(self.waiting, len(order), None))
            plans.append((c, self._admit_cohort(c, seq)))
        if all(not p.reqs for _, p in plans):
            return None
        if len(plans) > 1:
            self._compare_shapes(plans)
        return plans

    def _record_extend(self, plans) -> None:
        """The batch as the harness logs it after `get_next_batch_to_run`."""
        sr, step = self.steprec, int(self.env.now)
        for c, p in plans:
            chunked = None
            for rq, (rid, prefix, extend) in zip(p.reqs, p.shape):
                if prefix + extend < rq.fill_len:
                    chunked = rid
            sr.extend(c, p, chunked)
        if self._reports:
            for rq in plans[0][1].reqs:
                sr.first_sched(rq.r.rid, step)

    def _orders(self) -> dict[int, list[int]]:
        """Request-order jitter: each perturbed rank's order over the first waiting
        requests (at most ORDER_WINDOW: a batch never reaches further in practice),
        forking the ranks whose order differs."""
        n = min(ORDER_WINDOW, len(self.waiting))
        orders = {}
        for r in self.jitter.order_ranks:
            if self._root is not None and not self._holds(r):
                continue  # another lane's rank: its own scheduler orders its queue
            order = self.jitter.admission_order(r, self.batch_no, n)
            if order is not None:
                self.jitter.perturbations.fire("request_order")
                self._fork(r, "request_order", f"admission order {order}")
                orders[r] = order
        return orders

    def _holds(self, rank: int) -> bool:
        """Whether ``rank``'s replica is one of this request state's (sim.lanes)."""
        return any(rank in c.ranks for c in self.group.cohorts)

    def _id_drift(self) -> None:
        j = self.cfg.jitter
        if self._root is not None and not self._holds(j.id_drift_rank):
            return  # another lane's rank
        for rq in itertools.chain([self.chunked] if self.chunked else [], self.waiting):
            if rq.r.rid == j.id_drift_after and not rq.slots:
                c = self._fork(j.id_drift_rank, "id_drift",
                               f"{j.id_drift_extra} extra node ids before request {rq.r.rid}")
                self._op(c, {"op": "skip_ids", "n": j.id_drift_extra})
                c.tree.skip_ids(j.id_drift_extra)
                self.jitter.perturbations.fire("id_drift")
                return

    def _admit_cohort(self, c: Cohort, seq: Iterable[Req]) -> _Plan:
        """`_get_new_batch_prefill_raw` on one replica, over the candidates in its order."""
        cfg, tree, st = self.cfg, c.tree, c.sched
        plan = _Plan()
        # under overlap the running batch still holds the in-flight finishers
        running = self.running + self._finishing if self._finishing else self.running
        if not running:
            st.batch_is_full = False
        chunked = self.chunked
        if (st.batch_is_full or not self.waiting) and chunked is None:
            return plan
        rows = cfg.max_running - len(running) - (chunked is not None)
        if rows <= 0 and chunked is None:
            st.batch_is_full = True
            return plan
        self._calc_priority(c)
        clip = cfg.clip_max_new_tokens
        adder = Adder(Budget(tree, running_offset(running, st.ratio, cfg.ignore_eos,
                                                  self._inflight_rids(), clip)),
                      cfg.max_prefill_tokens, cfg.chunked_prefill_tokens, clip)
        if chunked is not None:
            if not self._add_chunked(c, chunked, adder, plan):
                return plan
            rows += 1  # the continuing chunk's row is held, not free
        for rq in seq:
            if adder.state() == OTHER:
                break
            if len(plan.reqs) >= rows:
                st.batch_is_full = True
                break
            if self._st is not None and not self._st.poll(c, rq):
                continue  # `check_prefetch_progress`: its prefetch is not done
            res = self._add_one(c, rq, adder, plan)
            if res != CONTINUE:
                if res == NO_TOKEN:
                    st.batch_is_full = bool(plan.reqs) or bool(running)
                break
        if plan.reqs:
            self._alloc_extend(c, plan)
        return plan

    def _calc_priority(self, c: Cohort) -> None:
        """`SchedulePolicy.calc_priority` (sim/policies/schedule.py)."""
        calc_priority(self, c)

    def _add_chunked(self, c: Cohort, rq: Req, adder: Adder, plan: _Plan) -> bool:
        """`add_chunked_req`: the continuing chunk goes first, as large as the chunk
        budget and the pool allow. False: a hybrid's SWA pool has no room for it
        (`available_chunk_tokens` is None): it waits, and so does the pass."""
        slot = rq.slots[id(c)]
        room = adder.chunk_room()
        if self._hyb is not None:
            room = self._hyb.chunk_room(c, plan, room)
            if room <= 0:
                return False
        cand = rq.fill_len - slot.done
        truncated = cand > room
        extend = min(cand, room)
        plan.reqs.append(rq)
        plan.shape.append((rq.r.rid, slot.done, extend))
        plan.chunks.append((extend, slot.done))
        adder.charge(extend, 0 if truncated else min(rq.r.output_len, self.cfg.clip_max_new_tokens))
        return True

    def _add_one(self, c: Cohort, rq: Req, adder: Adder, plan: _Plan) -> str:
        """`init_next_round_input` (the match) and `add_one_req` for one candidate."""
        if self.steprec is None:
            return self._add_one_req(c, rq, adder, plan)
        rem = adder.budget.remaining_total  # `rem_total_tokens` as add_one_req starts
        res = self._add_one_req(c, rq, adder, plan)
        self.steprec.add(c, rq.r.rid, res, rem)
        return res

    def _add_one_req(self, c: Cohort, rq: Req, adder: Adder, plan: _Plan) -> str:
        tree, req, ps = c.tree, rq.r, self._ps
        fill = rq.fill_len
        # The match stops a token short of the input (`_compute_max_prefix_len`): the
        # last position's logits must be computed.
        key = self._seq_key(rq, fill - 1)
        lid = f"q{req.rid}{rq.try_suffix}"
        # match + the pin `add_one_req` holds while it decides (`_lock_node`); an
        # admitted request keeps it as its own lock (`_commit_prefill_admission`).
        self._op(c, {"op": "lock", "key": key, "id": lid})
        m = tree.match_prefix(key)
        if self._rc:
            self._consensus_match(c, key, m)
        hyb = self._hyb
        if hyb is not None:
            # inside the match (copy on write), before the pin
            self._hybrid_result(c, plan, hyb.matched(c, rq, m))
        lock = m.last_device
        tree.inc_lock(lock)
        dev = m.device_len
        max_new = min(max(req.output_len - rq.generated, 0), self.cfg.clip_max_new_tokens)
        total = fill - dev + max_new + ps  # + per_req_token_overhead (one page)
        first = not plan.reqs
        sel = adder.select(fill, dev + m.host_len, total, req.output_len, first)
        if hyb is not None and not isinstance(sel, str):
            sel = hyb.fit(c, plan, sel, dev + m.host_len, max_new)
        loaded = 0
        if self._buf:
            staged = c.st.book.staged.get(f"p{req.rid}")
            if staged is not None:
                sel, lock, lid, loaded = self._st.buf_splice(c, rq, key, m, staged, adder,
                                                             plan, sel, lock, lid, total, first)
        if not isinstance(sel, str) and (m.host_len or (hyb is not None and m.aux_host_len)):
            # `prepare_load_back` holds for a single-pool budget; `init_load_back`.
            rid = f"r{req.rid}{rq.try_suffix}"
            self._op(c, {"op": "load_back", "key": key, "id": rid})
            res = tree.load_back(m, rid) if hyb is None else tree.load_back(m, rid, req.rid)
            plan.stall_first += self._charge(plan, res.eviction)
            if self.steprec is not None:
                self.steprec.hc(c, "init_load_back", [f"r{req.rid}", m.host_len, res.tokens])
                if res.ok:
                    self.steprec.hc(c, "load", [res.anchor.id, res.tokens, True])
            if res.ok:
                loaded = res.tokens
                # the request's lock moves down to the loaded anchor
                self._op(c, {"op": "lock", "key": key, "id": lid + ".l"})
                self._op(c, {"op": "unlock", "id": lid})
                lid += ".l"
                tree.dec_lock(lock)
                lock = res.anchor
                tree.inc_lock(lock)
                plan.loads.append(rid)
                plan.load_tokens += loaded + (res.extra if hyb is not None else 0)
                if hyb is not None:
                    sel = hyb.after_load(sel, fill, dev + loaded, m.host_len, loaded,
                                         req.output_len)
            else:
                # Nothing loaded: recomputing the host part may no longer fit.
                sel = adder.select(fill, dev, total, req.output_len, first)
        if isinstance(sel, str):
            self._op(c, {"op": "unlock", "id": lid})
            tree.dec_lock(lock)
            if hyb is not None:
                hyb.rejected(c, rq)
            return sel
        extend, max_new_tokens, chunked = sel
        prefix = dev + loaded
        slot = _Slot()
        slot.lock, slot.lock_id = lock, lid
        slot.done = slot.in_tree = prefix
        slot.device_hit, slot.loaded = dev, loaded
        rq.slots[id(c)] = slot
        plan.reqs.append(rq)
        plan.shape.append((req.rid, prefix, extend))
        plan.chunks.append((extend, prefix))
        adder.charge(extend, max_new_tokens)
        if self.jitter.free_ranks and c.kv.late and len(c.ranks) == 1:
            self.jitter.perturbations.fire("device_free_delay")
        return adder.state()

    def _alloc_extend(self, c: Cohort, plan: _Plan) -> None:
        """`alloc_for_extend`: one eviction sized for the whole batch (its extend tokens
        plus a page per request, `alloc_paged_token_slots_extend`; at page size 1 the
        extend tokens alone, `alloc_token_slots`), then each request's new pages
        (`get_num_new_pages`)."""
        tree, ps = c.tree, self._ps
        if self._hyb is not None:
            self._hybrid_result(c, plan, self._hyb.alloc_extend(c, plan))
        demand = sum(e for _, _, e in plan.shape)
        if ps > 1:
            demand += len(plan.reqs) * ps
        self._evict_for(c, demand, plan)
        need = 0
        for rq, (_, done, extend) in zip(plan.reqs, plan.shape):
            need += page_ceil(done + extend, ps) - page_ceil(done, ps)
        if need > available(tree):
            self._out_of_memory(c, f"prefill out of memory on ranks {c.label}: {need} tokens "
                                   f"wanted, {available(tree)} free")
        c.kv.alloc(need)

    def _out_of_memory(self, c: Cohort, detail: str) -> None:
        self.obs.untracked(self.env.now, self.step_no, detail)
        self.halted = "out_of_memory"
        raise _Halt()

    def _evict_for(self, c: Cohort, tokens: int, plan: "_Plan") -> None:
        """`evict_from_tree_cache`: evict the shortfall below ``tokens`` free (nothing
        to do, and nothing recorded, when the tree has nothing evictable)."""
        tree = c.tree
        short = tokens - available(tree)
        if self.jitter.device_skew and tree.evictable:
            # Fired only on a skewed replica, and only where the skew changed what it
            # evicts: an eviction an unskewed pool would not need, or another amount.
            skew = tree.device_capacity - self.cfg.device_tokens
            if skew and max(0, short) != max(0, short + skew):
                self.jitter.perturbations.fire("device_capacity_skew")
        if short <= 0 or not tree.evictable:
            return
        self._op(c, {"op": "evict_device", "n": short})
        ev = tree.evict_device(short)
        if self._rc:
            consensus.record(self, c, "evict_for_alloc", f"<evict {short} tokens> | "
                             "allocation_reclaim_satisfied is not None=False", f"<freed {ev.freed}>")
        plan.stall_first += self._charge(plan, ev)

    def _hybrid_result(self, c: Cohort, plan: _Plan, res) -> bool:
        """Carry out what a hybrid hook returned (``sim.hybrid.replica.HookResult``):
        its eviction's backups and scans booked on ``plan``, then its out-of-memory
        refusal, which halts the run. Returns the hook's ``fits``."""
        if res.eviction is not None:
            plan.stall_first += self._charge(plan, res.eviction)
        if res.refused is not None:
            self._out_of_memory(c, res.refused)
        return res.fits

    def _charge(self, plan: _Plan, ev) -> float:
        """Book an eviction's blocking backups and reclaim scans on ``plan``."""
        if ev is None:
            return 0.0
        cost = self.cost
        plan.backups.extend(ev.backups)
        plan.scanned += ev.reclaim_scanned
        return (sum(cost.d2h_time(k) for k in ev.backups)
                + cost.reclaim_scan_time(ev.reclaim_scanned))

    def _compare_shapes(self, plans) -> None:
        """The forward's shape on every rank, and the first prefix length that differs
        across ranks (a ground-truth event even when the totals happen to agree)."""
        ref = plans[0][1].shape
        if any(p.shape != ref for _, p in plans[1:]):
            self.obs.shape_divergence(self.env.now, self.step_no, plans)

    def _prefill(self, plans):
        """Charge each replica's scheduler-thread stall, run the forward, insert."""
        env, cost = self.env, self.cost
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
        span = ("prefill", self._ranks(), {"requests": len(p0.reqs),
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

    # ------------------------------------------------------------ decode
    def _decode(self):
        """Decode steps of the running batch (`update_running_batch` + forward) up to
        the next relevant time, the first finish, or the first step that must evict
        or retract on some replica; that step runs alone, its memory work first."""
        env, cost = self.env, self.cost
        pipe = self._pipelined
        began = env.now
        first = None  # pipelined: this iteration's step, launched before the last results
        synced = False  # pipelined: this iteration's cache sync has been paid
        limit = min([rq.remaining for rq in self.running])
        if self.waiting and not all(c.sched.batch_is_full for c in self.group.cohorts):
            limit = 1  # admission is retried every step while the batch is not full
        if self._pending:
            # the previous batch's results land after this step's memory work (a
            # hybrid's pools, and the storage tier's staging, always take it alone)
            if self._hyb is not None or self._st is not None or self._decode_headroom(1) == 0:
                plans = self._decode_memory()
                if plans is None:
                    return False  # `update_running_batch` skips decode this step
                if not isinstance(plans, list):
                    yield from self._drain_gpu()
                    yield from plans  # the ranks' request states split (sim.lanes)
                    return
                yield from self._decode_stalls(plans)
                synced = True
                if pipe and self.running:
                    first = self._launch_step()
                yield from self._results_of(first[1] if first else self._fwd_last)
                if not self.running:
                    return
                k_cap = 1  # its frees and inserts change the next step's headroom
            else:
                # this step needs no memory work; the steps after it see the results
                if pipe:
                    yield from self._decode_stalls([])
                    synced = True
                    first = self._launch_step()
                yield from self._results_of(first[1] if first else None)
                limit = min([rq.remaining for rq in self.running])
                if self.waiting and not all(c.sched.batch_is_full for c in self.group.cohorts):
                    limit = 1
                k_cap = max(1, self._decode_headroom(limit))
                if pipe and len(self.group.cohorts) > 1:
                    # Pipelined, the run's next step stands for the next iteration,
                    # whose sync and comparison the run skips; the results just
                    # processed changed the replicas they read (their digests, and
                    # which replica has a write in flight: pre_26921's writing_check
                    # hangs on it). That iteration looks for itself.
                    k_cap = 1
        else:
            k_cap = self._decode_headroom(limit)
        if k_cap == 0:
            plans = self._decode_memory()
            if plans is None:
                return False
            if not isinstance(plans, list):
                yield from self._drain_gpu()
                yield from plans  # the ranks' request states split (sim.lanes)
                return
            stalled_at = env.now
            yield from self._decode_stalls(plans)
            synced = True
            if not self.running:
                return
            # This step's memory work is done; the steps after it that need none join
            # its run (each is an iteration whose sync and admission change nothing).
            # Not so after a retraction (it clears `batch_is_full`: the next iteration
            # retries admission), when a relevant time passed during the stall, or
            # when replicas may now differ (the next iteration compares them).
            if (self._retracted_now or self._last_relevant > stalled_at
                    or len(self.group.cohorts) > 1):
                k_cap = 1
            else:
                limit = min(limit, min([rq.remaining for rq in self.running]))
                k_cap = max(1, self._decode_headroom(limit))
        batch = self.running
        b = len(batch)
        if self.steprec is not None:
            self.steprec.decode(self.group.cohorts, batch)
        ctx = sum([rq.kv for rq in batch]) + b  # each step attends kv + 1 positions
        now = env.now
        # The sample grid is a stop too, so the timeseries is sampled where a step-by-step
        # loop would sample it.
        stop = self._next_sample
        busy0, steps = self.busy_s, min(k_cap, limit)
        if pipe:
            self._forward(b)
            k = yield from self._decode_pipelined(first, b, ctx, steps, began, synced)
        else:
            t, k, busy = cost.decode_run(b, ctx, steps, now, self._sync_s, stop, busy0)
            self._forward(b)
            if self._gpu_hold is None:
                yield from self._hold_gpu()

            def recut(stop):  # cut short by a relevant moment during the run
                return cost.decode_run(b, ctx, steps, now, self._sync_s, stop, busy0)
            t, k, busy = yield from self._run_to(t, now, (t, k, busy), recut)
            self.busy_s = busy
        self.step_no += k - 1  # the first of these steps is this iteration
        self._iter_step += k - 1
        if self._overlap:
            self._inflight = batch
        if self.steprec is not None:
            self.steprec.decode_run(self.group.cohorts, batch, k)
        if k > 1:
            # the other iterations' syncs and forwards, as a step-by-step loop issues
            # them, and their digest checks (the digests cannot change in a run)
            fw = 0 if self._solo and self.collective.name == "simulated" else 1
            self.collective.repeat((k - 1) * (self._sync_call_count() + fw))
            if self._sync_mismatch and self._discipline.mismatch_recurs(self):
                self.obs.mismatch_steps += k - 1
        ps = self._ps
        done = []
        if ps == 1:
            pages = b * k
            for rq in batch:
                rq.kv += k
                rq.generated += k
                rq.remaining -= k
                if not rq.remaining:
                    done.append(rq)
        else:
            pages = 0
            for rq in batch:
                kv = rq.kv
                pages += (kv + k + ps - 1) // ps - (kv + ps - 1) // ps  # pages crossed
                rq.kv = kv + k
                rq.generated += k
                rq.remaining -= k
                if not rq.remaining:
                    done.append(rq)
        for c in self.group.cohorts:
            c.kv.alloc(pages * ps)
            if self._hyb is not None:
                self._hyb.decoded(c, batch)
            st = c.sched
            if st.ratio > st.ratio_min and not self._retracted_now:
                st.decay(k)
        self._retracted_now = False
        if done:
            self.running = [rq for rq in batch if rq.remaining > 0]
            if self._overlap:
                # left out of the next decode batch (`_reqs_finishing_inflight`), their
                # results processed in the next step, after it has been scheduled
                self._finishing.extend(done)
                for rq in done:
                    self._pending.append((self._finished_inflight, rq))
                self._pending.append((self._unfull, None))
                return
            self._unfull()
            for rq in done:
                self._finish(rq)
            self._compare()
            yield from self._result_scan_time()

    def _decode_headroom(self, limit: int) -> int:
        """Decode steps from now that neither evict nor retract on any replica (0
        under ``engine.decode_runs: false``: every step does its memory work)."""
        if not self.cfg.decode_runs:
            return 0
        batch, ps = self.running, self._ps
        b = len(batch)
        phases = None
        for c in self.group.cohorts:
            tree = c.tree
            avail = available(tree)
            if avail - b * ps >= b * (limit + ps):
                continue  # a page per request stays free for the whole run
            if phases is None:
                phases = [0] * ps
                for rq in batch:
                    phases[rq.kv % ps] += 1
            limit = steps_without_event(avail, tree.evictable > 0, phases, b, ps, limit)
            if limit == 0:
                return 0
        if self._hyb is not None:
            for c in self.group.cohorts:
                limit = self._hyb.headroom(c, batch, limit)
        return limit

    def _decode_memory(self) -> list:
        """The memory half of `update_running_batch` on every replica for this step:
        `check_decode_mem` (evicting the step's new pages), `retract_decode` when they
        do not fit, then `alloc_for_decode`'s eviction (a page per request kept free).
        Replicas that retract different requests run different batches: the forward's
        collective sees it."""
        batch, ps = self.running, self._ps
        plans, kept_by, abort_by = [], {}, {}
        if self._finishing:
            # `update_running_batch`: with the in-flight finishers' KV about to be
            # freed, a step that does not fit is skipped rather than retracting
            pre = {id(c): _Plan() for c in self.group.cohorts}
            fits = [self._decode_fits(c, batch, list(range(len(batch))), pre[id(c)])
                    for c in self.group.cohorts]
            if not all(fits):
                if any(fits):
                    self.obs.untracked(self.env.now, self.step_no,
                                       "ranks disagree on skipping a decode step")
                    self.halted = "untracked"
                    raise _Halt()
                self._unfull()
                return None
        else:
            pre = {}
        for c in self.group.cohorts:
            plan = pre.get(id(c)) or _Plan()
            order = list(range(len(batch)))
            abort_by[id(c)] = None
            if not self._decode_fits(c, batch, order, plan):
                order = retraction_order(batch, self._inflight_rids())
                first = True
                while first or not self._decode_fits(c, batch, order, plan):
                    if len(order) == 1:
                        break
                    first = False
                    self._release(c, batch[order.pop()], plan)
                    self._evict_for(c, len(order) * C.RETRACT_DECODE_STEPS, plan)
                if len(order) <= 1 and not self._decode_fits(c, batch, order, plan):
                    # Not even one request fits: SGLang aborts the last one.
                    abort_by[id(c)] = order[-1]
                    self._release(c, batch[order.pop()], plan)
            kept_by[id(c)] = order
            plans.append((c, plan))
        ref = kept_by[id(self.group.cohorts[0])]
        aborted = abort_by[id(self.group.cohorts[0])]
        if any(k != ref for k in kept_by.values()) or any(a != aborted for a in abort_by.values()):
            from sim import lanes
            if lanes.can_split(self):
                # each rank goes on with its own retraction, from here with its own
                # request state: the rest of this step runs in the lanes (a generator)
                return lanes.split_decode(self, plans, kept_by, abort_by)
            sizes = {r: len(kept_by[id(c)]) for c in self.group.cohorts for r in c.ranks}
            self.obs.untracked(self.env.now, self.step_no,
                               "ranks retracted different requests")
            self._forward(sizes)
            self.halted = "untracked"
            raise _Halt()
        return self._retract(batch, plans, ref, aborted)

    def _retract(self, batch, plans, ref: list[int], aborted: int | None) -> list:
        """The retraction every replica of ``plans`` agreed on (``ref``: the indices of
        ``batch`` kept; ``aborted``: the one aborted, or None), then each replica's
        `alloc_for_decode` eviction. Returns the plans with blocking work."""
        ps = self._ps
        if len(ref) < len(batch):
            self._retracted_now = True
            kept = [batch[i] for i in ref]
            stay = set(ref)
            lag = self._inflight_rids()
            out = [i for i in retraction_order(batch, lag)[::-1] if i not in stay]
            if self.steprec is not None:
                for c in self.group.cohorts:
                    self.steprec.retracted(c, [batch[i].r.rid for i in out])
            for i in out:
                if batch[i].r.rid in lag:
                    # under overlap the in-flight token of a retracted request is
                    # dropped when its result comes (batch_result_processor.py
                    # `process_batch_result_decode`: `req.is_retracted` -> continue)
                    batch[i].generated -= 1
                self._requeue(batch[i], aborted=i == aborted)
            self.running = kept
            for c in self.group.cohorts:
                c.sched.ratio = ratio_after_retract(kept, lag)
                c.sched.batch_is_full = False
        for c, plan in plans:
            self._evict_for(c, len(self.running) * ps, plan)
            if self._hyb is not None:
                self._hybrid_result(c, plan, self._hyb.decode_evict(c, self.running))
        if plans[0][1].stall_first and self.running:
            self.running[0].stall_s += plans[0][1].stall_first
        return [(c, p) for c, p in plans if p.backups or p.scanned]

    def _decode_fits(self, c: Cohort, batch, order, plan) -> bool:
        """`check_decode_mem` over ``order``: evict what the step's new pages lack."""
        ps = self._ps
        need = ps * sum(1 for i in order if batch[i].kv % ps == 0)
        self._evict_for(c, need, plan)
        if (self._hyb is not None
                and not self._hybrid_result(c, plan, self._hyb.decode_fits(c, need))):
            return False
        return available(c.tree) >= need

    def _release(self, c: Cohort, rq: Req, plan) -> None:
        """`release_req` -> `release_kv_cache(checkpoint=False)`: the request's own KV
        goes back to the allocator, nothing is inserted, its lock is dropped."""
        slot = rq.slots.pop(id(c))
        self._op(c, {"op": "unlock", "id": slot.lock_id})
        c.tree.dec_lock(slot.lock)
        if self._hyb is not None:
            self._hyb.released(c, rq)
        self._free(c, page_ceil(rq.kv, self._ps) - slot.in_tree)

    def _requeue(self, rq: Req, aborted: bool) -> None:
        """`reset_for_retract` and `_add_request_to_queue`: back of the queue, to
        prefill its input and outputs so far again."""
        rq.retractions += 1
        self.metrics.retracted += 1
        rq.kv = 0
        if aborted:
            self.metrics.aborted += 1
            return
        self.waiting.append(rq)

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
