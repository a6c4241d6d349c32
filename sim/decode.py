"""Decode: runs of decode steps, and a step's memory work (part of ``Simulation``).

`update_running_batch` + the forward (managers/scheduler.py): decode steps that need
no memory work on any replica run together up to the next relevant moment, priced at
once (``CostModel.decode_run``, bit for bit as one by one); a step that must evict or
retract on some replica does its memory work first (`check_decode_mem`,
`retract_decode`, `alloc_for_decode`), and the steps after it that need none join
its run.
"""

from __future__ import annotations

from sim import constants as C
from sim.ranks import Cohort
from sim.scheduler import (available, page_ceil, ratio_after_retract, retraction_order,
                           steps_without_event)
from sim.request import Req, _Halt, _Plan


class Decode:
    """A TP group's decode steps (``Simulation``'s part)."""

    # False: a step whose memory work came before the last batch's results runs
    # alone (the plain path); True: the steps after it that need none join its run.
    join_after_memory = True

    def _decode(self):
        """Decode steps of the running batch (`update_running_batch` + forward) up to
        the next relevant time, the first finish, or the first step that must evict
        or retract on some replica; that step runs alone, its memory work first."""
        env, cost = self.env, self.cost
        pipe = self._pipelined
        began = env.now
        first = None  # pipelined: this iteration's step, launched before the last results
        synced = False  # pipelined: this iteration's cache sync has been paid
        limit = self._step_limit()
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
                k_cap = 1
                if (self.join_after_memory and self._hyb is None and self._st is None
                        and not self._retracted_now and self._last_relevant <= began
                        and len(self.group.cohorts) == 1 and self.op_ticks is None):
                    # The results' frees and inserts changed the headroom: read it
                    # now, as the step without memory work does. The steps after
                    # this one join its run when none of them needs memory work.
                    # (Recorded ops tick every iteration's end, where SGLang
                    # publishes the KV events the memory work made: not joined.)
                    limit = self._step_limit()
                    k_cap = max(1, self._decode_headroom(limit))
            else:
                # this step needs no memory work; the steps after it see the results
                s = None  # the sync's end, where the step goes ahead of it
                if pipe:
                    s = self._sync_ahead(waits_last=True) if self._sync_s else None
                    if s is None:
                        yield from self._decode_stalls([])
                    synced = True
                    first = self._launch_step(s)
                yield from self._results_of(first[1] if first else None, s)
                limit = self._step_limit()
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

    def _step_limit(self) -> int:
        """Steps until the running batch's first finish; 1 while requests wait and
        some batch is not full (admission is retried every step)."""
        if self.waiting and not all(c.sched.batch_is_full for c in self.group.cohorts):
            return 1
        return min([rq.remaining for rq in self.running])

    def _decode_headroom(self, limit: int) -> int:
        """Decode steps from now that neither evict nor retract on any replica (0
        under ``engine.decode_runs: false``: every step does its memory work)."""
        if not self.cfg.decode_runs:
            return 0
        batch, ps = self.running, self._ps
        b = len(batch)
        phases = None
        # Replicas with the same free space and evictability have the same headroom:
        # ``steps_without_event`` is min(first event, limit), and the limit only
        # shrinks, so a result found under a larger limit is cut to the current one.
        seen: dict[tuple[int, bool], int] = {}
        for c in self.group.cohorts:
            tree = c.tree
            avail = available(tree)
            if avail - b * ps >= b * (limit + ps):
                continue  # a page per request stays free for the whole run
            key = (avail, tree.evictable > 0)
            got = seen.get(key)
            if got is not None:
                if got < limit:
                    limit = got
                continue
            if phases is None:
                phases = [0] * ps
                for rq in batch:
                    phases[rq.kv % ps] += 1
            limit = seen[key] = steps_without_event(avail, key[1], phases, b, ps, limit)
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
        batch = self.running
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
