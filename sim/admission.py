"""Admission: one iteration's prefill batch on every replica (part of ``Simulation``).

`get_new_batch_prefill` (managers/scheduler.py) per replica, in its own order: the
waiting queue ordered by the schedule policy (``sim/policies/schedule.py``), each
candidate matched and pinned, the memory budget checked before any load-back
(``sim/scheduler.py`` ``Adder``), the load-backs started, then one eviction and the
batch's extend pages (`alloc_for_extend`). Nothing here spends time: the plan
(``sim.request._Plan``) carries the costs that ``sim/prefill.py`` charges.
"""

from __future__ import annotations

import itertools
from typing import Iterable

from sim import consensus
from sim.ranks import Cohort
from sim.policies.schedule import calc_priority
from sim.scheduler import (CONTINUE, NO_TOKEN, OTHER, Adder, Budget, available, page_ceil,
                           running_offset)
from sim.request import Req, _Halt, _Plan, _Slot

# Request-order jitter permutes at most this many leading candidates of a batch.
ORDER_WINDOW = 1024


class Admission:
    """Admission of a TP group's prefill batches (``Simulation``'s part)."""

    def _admit(self) -> list[tuple[Cohort, _Plan]] | None:
        """This iteration's prefill batch on every replica (`get_new_batch_prefill`),
        its extend allocation included (`prepare_for_extend`)."""
        group = self.group
        if self._batch_full():
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

    def _batch_full(self) -> bool:
        """Whether admission returns at once on every replica: a running batch (under
        overlap, its in-flight finishers count), no chunked prefill to continue, and
        every replica's `batch_is_full` set (`get_new_batch_prefill`'s first check)."""
        return (self.chunked is None and bool(self.running or self._finishing)
                and all(c.sched.batch_is_full for c in self.group.cohorts))

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
