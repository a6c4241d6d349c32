"""The per-step HiCache sync, the copy engines and the acks (part of ``Simulation``).

Each iteration's ``check_hicache_events`` (`_process_hicache_events`,
managers/scheduler.py): queued write-through backups flushed as one merged D->H op
per replica, then the cache sync in the configured discipline (``sim/policies/sync.py``):
the MIN all_reduce of ready ack counts and ``[digest, -digest]``, the digest
assertion, and the agreed acks popped FIFO. A copy is a SimPy process holding its
replica's copy engine (``Cohort.d2h`` / ``Cohort.h2d``, a ``simpy.Resource`` each); its
ack becomes ready for each rank when the copy ends, or when that rank's delay's
timeout fires (``sim.ranks.Ack``).
"""

from __future__ import annotations

from sim.collectives import CollectiveError
from sim.constants import DIGEST_MISMATCH_MESSAGE
from sim.ranks import Ack, Cohort
from sim.request import _Halt


class CacheSync:
    """The HiCache sync, copies and acks of a TP group (``Simulation``'s part)."""

    def _all_reduce(self, site: str, inputs: dict[int, list[int]], next_calls=None) -> list[int]:
        try:
            if next_calls and len(inputs) < self.cfg.tp:
                return self.collective.all_reduce_min(self.step_no, site, inputs, next_calls)
            return self.collective.all_reduce_min(self.step_no, site, inputs)
        except CollectiveError as err:
            self._collective_failed(err)

    def _all_reduce_replicas(self, site: str, groups: list) -> list[int]:
        """``_all_reduce`` where each replica's ranks enter with one vector:
        ``groups`` is [(ranks, vector)] over every replica."""
        try:
            return self.collective.all_reduce_replicas(self.step_no, site, groups)
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
        if not self._pending_writes:
            return  # most calls: nothing queued on any replica
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
        if len(group.cohorts) == 1 and disc.by_replica:
            c = group.cohorts[0]
            w, l_ = c.shared_ready_count(c.write_q, now), c.shared_ready_count(c.load_q, now)
            if w is not None and l_ is not None:
                # Every rank shares one replica and sees the same acks: one vector
                # (``reduce_replicas``' one row, without building it: the usual sync).
                d = c.tree.digest ^ c.tree.digest_xor
                red = self.collective.all_reduce_uniform(self.step_no, "sync", [w, l_, d, -d])
                self._pop(c, red[0], red[1])
                return
        if disc.by_replica:
            # every replica's ranks agree on their ready acks: one row per replica
            rows = []
            for c in group.cohorts:
                w, l_ = c.shared_ready_count(c.write_q, now), c.shared_ready_count(c.load_q, now)
                if w is None or l_ is None:
                    break
                rows.append((c, w, l_, c.tree.digest ^ c.tree.digest_xor))
            else:
                disc.reduce_replicas(self, rows)
                return
        counts: dict[int, tuple[int, int]] = {}
        digest: dict[int, int] = {}
        for c in group.cohorts:
            d = c.tree.digest ^ c.tree.digest_xor
            digest.update(dict.fromkeys(c.ranks, d))
            w, l_ = c.shared_ready_count(c.write_q, now), c.shared_ready_count(c.load_q, now)
            if w is not None and l_ is not None:
                # every rank of the replica sees the same acks: one count pair, one object
                counts.update(dict.fromkeys(c.ranks, (w, l_)))
            else:
                for r in c.ranks:
                    counts[r] = (c.ready_count(c.write_q, r, now), c.ready_count(c.load_q, r, now))
        disc.reduce(self, counts, digest)

    def _sync_call_count(self) -> int:
        """The collectives ``_sync`` issues in the current state, acks popped: what
        each iteration of a decode run would issue (its queues cannot change)."""
        disc = self._discipline
        if self._solo and disc.solo_pops:
            return 0
        return disc.call_count(self)

    def _check_replica_digests(self, rows: list, lo: int, hi: int) -> None:
        """``_check_digest`` over ``reduce_replicas``' rows (replica, writes, loads,
        digest): the per-rank map is built only when some digest disagrees."""
        if lo == hi and all(row[3] == lo for row in rows):
            return
        self._check_digest({r: row[3] for row in rows for r in row[0].ranks}, lo, hi)

    def _check_digest(self, digest: dict[int, int], lo: int, hi: int) -> None:
        """Each rank asserts its digest equals the reduced min and max."""
        if lo == hi and all(d == lo for d in digest.values()):
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
