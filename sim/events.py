"""The SimPy processes: arrivals, the replicated scheduler loop, requests, acks.

One scheduler loop feeds every rank the same request stream, as SGLang's replicated
schedulers do. An iteration (``_step``) follows SGLang's order (sem §6.6):

1. ``check_hicache_events``: every rank counts its ready write and load acks; the
   counts and ``[digest, -digest]`` are MIN-all-reduced; each rank asserts its digest
   equals the min and the max; every rank then processes the agreed number of acks
   in FIFO order (or its own count, under the ``local`` bug mode).
2. Admission: for each waiting request, in order: ``match_prefix``, a path lock, a
   load-back of the host-only part (which may evict, with blocking write_back
   backups), and device allocation for the fresh KV (which may evict too).
3. The batch's prefill is charged on one GPU timeline; each request then inserts its
   input (``cache_unfinished_req``), decodes, inserts input + output
   (``cache_finished_req``) and unlocks.

Blocking D->H backups and reclaim scans run on the scheduler thread, so they stall
the loop: the slowest rank's stall gates everyone at the next collective.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable, Iterable

import simpy

from sim.collectives import CollectiveError, make_collective
from sim.config import SimConfig
from sim.constants import DIGEST_MISMATCH_MESSAGE
from sim.errors import UserError
from sim.metrics import Metrics
from sim.ranks import Cohort, RankGroup
from sim.tree import TreeError
from sim.workloads.keys import output_key, page_key


class _Halt(Exception):
    """Stops the run: a digest assertion (on_divergence: halt) or a hung collective."""


class FixedCosts:
    """Constant placeholder costs for unit tests of the engine's logic."""

    bytes_per_token = 1024
    name = "fixed"

    def d2h_time(self, tokens, concurrent=False):
        return 20e-6 + tokens * 1e-8 if tokens else 0.0

    def h2d_time(self, tokens, concurrent=False):
        return 20e-6 + tokens * 1e-8 if tokens else 0.0

    def load_stall(self, load_tokens, new_tokens, cached_tokens):
        return self.h2d_time(load_tokens) * 0.1

    def prefill_time(self, new_tokens, cached_tokens):
        return 1e-3 + new_tokens * 2e-5 if new_tokens else 0.0

    def decode_step_time(self, batch_size, total_context_tokens):
        return 10e-3

    def sync_time(self, world, backend="gloo"):
        return 0.0 if world <= 1 else 200e-6

    def reclaim_scan_time(self, entries):
        return entries * 0.4e-6


class Req:
    """A request's state across its life; cohorts keep their own lock nodes."""

    __slots__ = ("r", "key", "lock", "lock_id", "reserved", "device_hit", "loaded",
                 "load_s", "stall_s", "prefill_s", "start", "first_token", "finish")

    def __init__(self, r, key):
        self.r = r
        self.key = key
        self.lock: dict = {}      # cohort id -> locked node
        self.lock_id: dict = {}   # cohort id -> that lock's op-trace id (when recording)
        self.reserved: dict = {}  # cohort id -> fresh device tokens reserved
        self.device_hit = self.loaded = 0
        self.load_s = self.stall_s = self.prefill_s = 0.0
        self.start = self.first_token = self.finish = math.nan


class Simulation:
    """A TP group serving a request stream with HiCache, in simulated time."""

    def __init__(self, cfg: SimConfig, workload: Iterable, cost=None, *,
                 progress: Callable | None = None, trace_events: list | None = None):
        self.cfg = cfg
        self.cost = cost if cost is not None else FixedCosts()
        self.env = simpy.Environment()
        self.group = RankGroup(cfg)
        self.collective = make_collective(cfg.collective, cfg.tp, cfg.collective_device)
        self.metrics = Metrics(cfg, self.cost.bytes_per_token)
        self.progress = progress
        self.trace = trace_events
        self.workload = iter(workload)
        self.waiting: deque[Req] = deque()
        self.running = 0
        self.arrivals_done = False
        self.finished = False
        self._user_error = None
        self._next_sample = 0.0
        self._wake = self.env.event()
        self.gpu_free = 0.0
        self.step_no = 0
        self.halted: str | None = None
        self.divergence = {"digest_mismatch": None, "first_true_divergence": None,
                           "collective_error": None, "batch_mismatch": None,
                           "mismatch_steps": 0}
        self._ps = cfg.page_size
        self.active: dict[int, Req] = {}  # admitted, not finished
        for c in self.group.cohorts:
            c.tree.backup_log = []

    # ------------------------------------------------------------ plumbing
    def _kick(self, _event=None) -> None:
        if not self._wake.triggered:
            self._wake.succeed()

    def _kick_at(self, t: float) -> None:
        delay = t - self.env.now
        if delay <= 0:
            self._kick()
        else:
            self.env.timeout(delay).callbacks.append(self._kick)

    def _trace(self, name, cat, ranks, t, dur, **args):
        if self.trace is None:
            return
        for r in ranks:
            ev = {"name": name, "cat": cat, "ph": "X", "ts": round(t * 1e6, 3),
                  "pid": 0, "tid": r, "args": args}
            if dur:
                ev["dur"] = round(dur * 1e6, 3)
            else:
                ev.update(ph="i", s="t")  # an instant event, thread-scoped
            self.trace.append(ev)

    def page_key(self, req) -> list[int]:
        return page_key(req.blocks, req.block_size, self._ps, req.input_len)

    # ------------------------------------------------------------ processes
    def run(self) -> None:
        self.env.process(self._arrivals())
        self.env.process(self._scheduler())
        try:
            self.env.run()
        except _Halt:
            pass
        finally:
            self.collective.close()
        if self._user_error is not None:
            raise self._user_error
        self._final_compare()
        self.metrics.sample(self.env.now, self.group.cohorts[0].tree, final=True)

    def _arrivals(self):
        try:
            yield from self._arrivals_inner()
        except UserError as err:
            # A bad trace record: keep the error object itself (SimPy would re-create
            # it from its args) and stop; run() raises it once the loop has unwound.
            self._user_error = err
            raise _Halt() from None

    def _arrivals_inner(self):
        cfg = self.cfg
        n = 0
        for req in self.workload:
            if cfg.max_requests is not None and n >= cfg.max_requests:
                break
            if cfg.duration_s is not None and req.arrival > cfg.duration_s:
                break
            if req.arrival > self.env.now:
                yield self.env.timeout(req.arrival - self.env.now)
            self.waiting.append(Req(req, self.page_key(req)))
            n += 1
            self._kick()
        self.arrivals_done = True
        self._kick()

    def _idle(self) -> bool:
        return (self.arrivals_done and not self.waiting and self.running == 0
                and all(not c.load_q and not c.write_q for c in self.group.cohorts))

    def _scheduler(self):
        while True:
            yield self._wake
            self._wake = self.env.event()
            if self._idle():
                self.finished = True
                return
            stall = self._step()
            if self._idle():  # this step drained the last acks
                self.finished = True
                return
            if stall > 0:
                # The loop is busy; anything that arrives meanwhile has already
                # triggered the next wake-up, so no re-kick (that would spin on
                # empty sync-only iterations).
                yield self.env.timeout(stall)

    # ------------------------------------------------------------ one step
    def _step(self) -> float:
        self.step_no += 1
        now = self.env.now
        if now >= self._next_sample:
            # Sampled at scheduler activity, on a grid of timeseries_interval_s: an idle
            # stretch (nothing changes) costs nothing.
            self.metrics.sample(now, self.group.cohorts[0].tree)
            dt = self.cfg.timeseries_interval_s
            self._next_sample = (math.floor(now / dt) + 1) * dt
        stall = self.cost.sync_time(self.cfg.tp)
        self._sync(now)
        if self.waiting and self.running < self.cfg.max_running:
            stall += self._admit(now, stall)
        if len(self.group.cohorts) > 1:
            self._compare(now)
        return stall

    def _sync(self, now: float) -> None:
        """check_hicache_events: MIN-all-reduce ready counts and the digest (sem §5.2)."""
        group, cfg = self.group, self.cfg
        discipline = cfg.jitter.ack_discipline
        counts: dict[int, tuple[int, int]] = {}
        vectors: dict[int, list[int]] = {}
        for c in group.cohorts:
            same = c.write_q[0].delays is None if c.write_q else True
            same = same and (c.load_q[0].delays is None if c.load_q else True)
            base = None
            for r in c.ranks:
                if base is None or not same:
                    base = (c.ready_count(c.write_q, r, now), c.ready_count(c.load_q, r, now))
                counts[r] = base
                if discipline == "skip_when_idle" and base == (0, 0):
                    continue  # the bug: an idle rank skips the collective
                d = c.tree.digest
                vectors[r] = [base[0], base[1], d, -d]
        if not vectors:
            return
        try:
            reduced = self.collective.all_reduce_min("check_hicache_events", vectors)
        except CollectiveError as err:
            self.divergence["collective_error"] = {
                "t": now, "step": self.step_no, "kind": err.kind, "message": str(err)}
            self._trace(err.kind, "collective", list(range(cfg.tp)), now, 0)
            self.halted = err.kind
            raise _Halt() from None
        lo, hi = reduced[-2], -reduced[-1]
        bad = sorted(r for r, v in vectors.items() if v[2] != lo or v[2] != hi)
        if bad:
            self.divergence["mismatch_steps"] += 1
            if self.divergence["digest_mismatch"] is None:
                self.divergence["digest_mismatch"] = {
                    "t": now, "step": self.step_no, "min": lo, "max": hi,
                    "digests": {r: group.cohort_of(r).tree.digest for r in range(cfg.tp)},
                    "message": DIGEST_MISMATCH_MESSAGE}
                self._trace("digest_mismatch", "divergence", list(range(cfg.tp)), now, 0)
                self._compare(now, full=True)
            if cfg.on_divergence == "halt":
                self.halted = "digest_mismatch"
                raise _Halt()
        if discipline == "local":
            # Each rank drains its own ready acks: ranks of a cohort that disagree fork.
            for c in list(group.cohorts):
                by_count: dict = {}
                for r in c.ranks:
                    by_count.setdefault(counts[r], []).append(r)
                if len(by_count) > 1:
                    for key in list(by_count)[1:]:
                        for r in by_count[key]:
                            self._fork(r, "ack_local_drain", now, f"rank {r} drains {key}")
            for c in group.cohorts:
                self._process_acks(c, *counts[c.ranks[0]], now)
        else:
            for c in group.cohorts:
                self._process_acks(c, reduced[0], reduced[1], now)

    def _process_acks(self, c: Cohort, n_write: int, n_load: int, now: float) -> None:
        tree = c.tree
        for _ in range(min(n_write, len(c.write_q))):
            ack = c.write_q.popleft()
            tree.finish_write_through(ack.ack_id)
            self._op(c, {"op": "write_ack", "id": ack.ack_id})
        for _ in range(min(n_load, len(c.load_q))):
            ack = c.load_q.popleft()
            tree.finish_load_back(ack.ack_id)
            self._op(c, {"op": "load_back_ack", "id": ack.ack_id})
            self._trace("load_ack", "ack", c.ranks, now, 0, id=str(ack.ack_id))

    @staticmethod
    def _op(c: Cohort, op: dict) -> None:
        """Record ``op`` in the replica's op-trace (repro bundles). Keys stay page-unit
        lists here; ``reserved`` is the device KV running requests hold outside the
        tree, which SGLang's allocator also excludes (an op-trace extension)."""
        if c.ops is not None:
            op["reserved"] = c.tree.reserved
            c.ops.append(op)

    # ------------------------------------------------------------ admission
    def _admit(self, now: float, stall0: float) -> float:
        """Admit waiting requests FCFS; returns the scheduler stall it caused."""
        cfg, group, cost = self.cfg, self.group, self.cost
        cap = cfg.device_tokens
        batch: list[Req] = []
        while self.waiting and self.running + len(batch) < cfg.max_running:
            rq = self.waiting[0]
            need = rq.r.input_len + rq.r.output_len
            if need > cap:
                # Larger than the whole device pool: SGLang aborts such a request.
                self.waiting.popleft()
                self.metrics.rejected += 1
                continue
            ok = [need <= cap - c.tree.protected - c.tree.reserved for c in group.cohorts]
            if not all(ok):
                if any(ok):
                    self._batch_mismatch(now, "admission", ok)
                break
            batch.append(self.waiting.popleft())
        if not batch:
            return 0.0
        j = cfg.jitter
        if j.id_drift_rank is not None and j.id_drift_rank < cfg.tp:
            for rq in batch:
                if rq.r.rid == j.id_drift_after:
                    c = self._fork(j.id_drift_rank, "id_drift", now,
                                   f"{j.id_drift_extra} extra node ids before request {rq.r.rid}")
                    self._op(c, {"op": "skip_ids", "n": j.id_drift_extra})
                    c.tree.skip_ids(j.id_drift_extra)
        orders: dict[int, list[int]] = {}  # rank -> this batch's admission order
        for r in j.request_order_ranks:
            if r < cfg.tp:
                order = group.swap_order(r, len(batch))
                if order is not None:
                    self._fork(r, "request_order", now, f"admission order {order}")
                    orders[r] = order
        stall = 0.0
        admitted: list[Req] | None = None
        for c in group.cohorts:
            order = orders.get(c.ranks[0]) if len(c.ranks) == 1 else None
            seq = batch if order is None else [batch[i] for i in order]
            c_stall, c_admitted = self._admit_cohort(c, seq, now, stall0)
            stall = max(stall, c_stall)
            ids = sorted(rq.r.rid for rq in c_admitted)
            if admitted is None:
                admitted = c_admitted
                ref = ids
            elif ids != ref:
                self._batch_mismatch(now, "admission", [ids, ref])
        admitted_ids = {id(rq) for rq in admitted}
        for rq in reversed(batch):
            if id(rq) not in admitted_ids:
                self.waiting.appendleft(rq)
        start = max(now + stall0 + stall, self.gpu_free)
        for rq in admitted:
            rq.start = now
            rq.stall_s = stall
            new = max(0, rq.r.input_len - rq.device_hit - rq.loaded)
            rq.prefill_s = cost.prefill_time(new, rq.device_hit + rq.loaded)
            # the new tokens attend to the whole prefix: device hit plus what is loaded
            load_stall = cost.load_stall(rq.loaded, new, rq.device_hit + rq.loaded) if rq.loaded else 0.0
            rq.load_s = cost.h2d_time(rq.loaded) if rq.loaded else 0.0
            end = start + load_stall + rq.prefill_s
            rq.first_token = end
            start = end
            self.running += 1
            self.active[rq.r.rid] = rq
            self.env.process(self._request(rq, end))
        self.gpu_free = start
        return stall

    def _admit_cohort(self, c: Cohort, seq: list[Req], now: float, t0: float):
        tree, cost = c.tree, self.cost
        cid = id(c)
        admitted = []
        scanned0 = tree.stats.reclaim_scanned
        for rq in seq:
            req = rq.r
            self._op(c, {"op": "lock", "key": rq.key, "id": f"q{req.rid}"})
            rq.lock_id[cid] = f"q{req.rid}"
            m = tree.match_prefix(rq.key)
            lock = m.last_device
            tree.inc_lock(lock)
            loaded = 0
            if m.host_len:
                lid = f"r{req.rid}"
                self._op(c, {"op": "load_back", "key": rq.key, "id": lid})
                res = tree.load_back(m, lid)
                if res.ok:
                    loaded = res.tokens
                    # the request's lock moves down to the loaded anchor
                    self._op(c, {"op": "lock", "key": rq.key, "id": f"q{req.rid}.l"})
                    self._op(c, {"op": "unlock", "id": f"q{req.rid}"})
                    rq.lock_id[cid] = f"q{req.rid}.l"
                    tree.dec_lock(lock)
                    lock = res.anchor
                    tree.inc_lock(lock)
                    done = now + t0 + cost.h2d_time(loaded)
                    ack = self.group.make_ack("load", lid, done, loaded)
                    c.load_q.append(ack)
                    for t in self.group.next_ready_time(ack):
                        self._kick_at(t)
                    self._trace("load_back", "transfer", c.ranks, now + t0, done - now - t0,
                                tokens=loaded)
            need = req.input_len + req.output_len - m.device_len - loaded
            free = tree.device_capacity - tree.dev_used - tree.reserved
            if free < need:
                self._op(c, {"op": "evict_device", "n": need - free})
                tree.evict_device(need - free)
                if tree.device_capacity - tree.dev_used - tree.reserved < need:
                    self._op(c, {"op": "unlock", "id": rq.lock_id.get(cid)})
                    tree.dec_lock(lock)
                    break
            tree.reserved += need
            rq.lock[cid] = lock
            rq.reserved[cid] = need
            if c is self.group.cohorts[0]:
                rq.device_hit, rq.loaded = m.device_len, loaded
            admitted.append(rq)
        stall = cost.reclaim_scan_time(tree.stats.reclaim_scanned - scanned0)
        for k in tree.backup_log:
            stall += cost.d2h_time(k)
        if tree.backup_log:
            self._trace("blocking_backups", "transfer", c.ranks, now + t0, stall,
                        backups=len(tree.backup_log))
            tree.backup_log.clear()
        return stall, admitted

    def _batch_mismatch(self, now, where, detail) -> None:
        """Ranks took different scheduling decisions: the model's TP collectives in the
        forward would see different batches, which hangs real hardware. The run stops
        here whatever ``on_divergence`` says: nothing after it would be real."""
        self.divergence["batch_mismatch"] = {"t": now, "step": self.step_no,
                                             "where": where, "detail": str(detail)}
        self._compare(now, full=True)
        self._trace("batch_mismatch", "divergence", list(range(self.cfg.tp)), now, 0)
        self.halted = "hang"
        raise _Halt()

    # ------------------------------------------------------------ a request
    def _request(self, rq: Req, first_token: float):
        yield self.env.timeout(first_token - self.env.now)
        self._insert_all(rq, rq.key, final=False)
        if self.cfg.decode and rq.r.output_len:
            step = self.cost.decode_step_time(max(1, self.running), rq.r.input_len)
            yield self.env.timeout(rq.r.output_len * step)
        r = rq.r
        full = rq.key + output_key(r.rid, r.input_len, r.output_len, self._ps)
        self._insert_all(rq, full, final=True)
        rq.finish = self.env.now
        self.running -= 1
        del self.active[rq.r.rid]
        self.metrics.request_done(rq)
        if self.progress is not None:
            self.progress(self.env.now, self.metrics)
        self._kick()

    def _insert_all(self, rq: Req, key: list, final: bool) -> None:
        """cache_unfinished_req / cache_finished_req on every replica."""
        ps, now = self._ps, self.env.now
        for c in self.group.cohorts:
            tree = c.tree
            cid = id(c)
            new = (len(key) - tree.device_prefix_len(key)) * ps
            take = min(new, rq.reserved[cid])
            tree.reserved -= take
            rq.reserved[cid] -= take
            self._op(c, {"op": "insert", "key": key})
            try:
                tree.insert(key)
            except TreeError:  # cannot happen while the reservation holds; keep going
                pass
            last = tree.last_node
            old = rq.lock[cid]
            old_id = rq.lock_id.get(cid)
            if final:
                self._op(c, {"op": "unlock", "id": old_id})
                tree.dec_lock(old)
                tree.reserved -= rq.reserved[cid]
                rq.reserved[cid] = 0
            else:
                self._op(c, {"op": "lock", "key": key, "id": f"q{rq.r.rid}.i"})
                self._op(c, {"op": "unlock", "id": old_id})
                rq.lock_id[cid] = f"q{rq.r.rid}.i"
                tree.inc_lock(last)
                tree.dec_lock(old)
                rq.lock[cid] = last
            for k in tree.pending_writes_new():
                ack = self.group.make_ack("write", k, now + self.cost.d2h_time(tree.pending_writes[k].tokens),
                                          tree.pending_writes[k].tokens)
                c.write_q.append(ack)
                for t in self.group.next_ready_time(ack):
                    self._kick_at(t)
            tree.backup_log.clear()

    def _fork(self, rank: int, cause: str, now: float, detail: str = "") -> Cohort:
        """Copy-on-divergence, plus the running requests' per-replica state: their lock
        nodes are found in the clone by path (the trees are identical at this instant)."""
        src = self.group.cohort_of(rank)
        c = self.group.fork(rank, cause, now, detail)
        if c is src:
            return c
        c.tree.backup_log = []
        sid, cid = id(src), id(c)
        for rq in self.active.values():
            if sid not in rq.lock:
                continue
            path = src.tree.path_units(rq.lock[sid])
            x, pos = c.tree.root, 0
            while pos < len(path):
                x = x.children[path[pos]]
                pos += len(x.key)
            rq.lock[cid] = x
            rq.reserved[cid] = rq.reserved[sid]
            if sid in rq.lock_id:
                rq.lock_id[cid] = rq.lock_id[sid]
        self._trace("fork", "divergence", [rank], now, 0, cause=cause)
        return c

    # ------------------------------------------------------------ ground truth
    def _compare(self, now: float, full: bool = False) -> None:
        """Compare replicas: cheap summaries each step, whole trees when asked."""
        if self.divergence["first_true_divergence"] is not None:
            return
        cohorts = self.group.cohorts
        ref = cohorts[0].tree
        rs = _summary(ref)
        for c in cohorts[1:]:
            what = None
            if _summary(c.tree) != rs:
                what = "pool occupancy / node count differ"
            elif full or self.step_no % 64 == 0:
                if c.tree.fingerprint() != ref.fingerprint():
                    what = "tree contents differ"
            if what:
                self.divergence["first_true_divergence"] = {
                    "t": now, "step": self.step_no, "ranks": [cohorts[0].ranks, c.ranks],
                    "what": what, "summary": {"ranks " + cohorts[0].label: list(rs),
                                              "ranks " + c.label: list(_summary(c.tree))}}
                self._trace("true_divergence", "divergence", c.ranks, now, 0)
                return

    def _final_compare(self) -> None:
        if len(self.group.cohorts) > 1:
            self._compare(self.env.now, full=True)

    def report(self) -> dict:
        """divergence.json: what SGLang would see, and the ground truth."""
        d = self.divergence
        forks = self.group.forks
        true_div = d["first_true_divergence"]
        mismatch = d["digest_mismatch"]
        # The verdict is the first failure a real server would hit (it stops there);
        # within one step the sync collective runs before the digest check, and both
        # before admission.
        failures = []
        if d["collective_error"]:
            e = d["collective_error"]
            failures.append((e["t"], e["step"], 0, e["kind"]))
        if mismatch:
            real = true_div is not None and true_div["t"] <= mismatch["t"]
            failures.append((mismatch["t"], mismatch["step"], 1, "detected" if real else "false_alarm"))
        if d["batch_mismatch"]:
            b = d["batch_mismatch"]
            failures.append((b["t"], b["step"], 2, "hang"))
        if failures:
            verdict = min(failures)[3]
        elif true_div:
            verdict = "missed"
        elif self.cfg.jitter.active:
            verdict = "absorbed"
        else:
            verdict = "agree"
        delay = None
        if mismatch and true_div:
            delay = mismatch["t"] - true_div["t"]
        return {
            "verdict": verdict,
            "halted": self.halted,
            "tp": self.cfg.tp,
            "cohorts": [c.ranks for c in self.group.cohorts],
            "forks": forks,
            "jitter": self.cfg.jitter.active,
            "first_fork": forks[0] if forks else None,
            "first_true_divergence": true_div,
            "digest_mismatch": mismatch,
            "detection_delay_s": delay,
            "mismatch_steps": d["mismatch_steps"],
            "collective_error": d["collective_error"],
            "batch_mismatch": d["batch_mismatch"],
            "collective_calls": self.collective.log.calls,
            "digests": {str(r): self.group.cohort_of(r).tree.digest for r in range(self.cfg.tp)},
            "steps": self.step_no,
        }


def _summary(tree) -> tuple:
    return (tree.dev_used, tree.host_used, tree.n_nodes, tree.dup_tokens, tree.evictable,
            tree.protected, tree.reserved, len(tree.loads))
