"""Per-step cache-sync disciplines: how a TP group's ranks agree on the ready acks
(`check_hicache_events`, sem §5.2), each from one SGLang version, keyed by name.

The scheduler loop (``sim.events.Simulation._sync``) gathers every rank's ready write
and load ack counts and its digest, then hands them to the configured discipline:

- ``synced`` (0.5.23): one MIN all_reduce of ``[writes, loads, digest, -digest]``;
  every rank pops the agreed counts;
- ``pre_26921`` (before sglang #26921 / #27489): separate write and load checks, each
  skipped by a rank with nothing of that kind in flight;
- ``local`` (a bug mode): each rank pops its own ready acks; ranks of a replica that
  disagree fork first.

A discipline also says what a run of identical decode iterations costs in collectives
(``call_count``) and whether a digest mismatch recurs in each of them
(``mismatch_recurs``).
"""

from __future__ import annotations

from sim.collectives import REQUEST_BROADCAST, Call


class SyncDiscipline:
    """One discipline. ``solo_pops``: at TP 1 the ready acks pop without a collective;
    ``by_replica``: ``reduce_replicas`` stands for ``reduce`` when every replica's
    ranks agree on their ready acks (``CacheSync._sync`` then builds one row per
    replica; with one replica, one vector for all, whose MIN is that vector)."""

    __slots__ = ()
    name = ""
    solo_pops = True
    by_replica = False

    def reduce(self, sim, counts: dict, digest: dict) -> None:
        """The sync's collectives over ``counts`` (rank -> (writes, loads) ready) and
        ``digest`` (rank -> digest), the digest check, and the pops."""
        raise NotImplementedError

    def reduce_replicas(self, sim, rows: list) -> None:
        """``reduce`` over ``rows``: (replica, writes ready, loads ready, digest), one
        per replica, every rank of a replica with its replica's counts."""
        raise NotImplementedError

    def call_count(self, sim) -> int:
        """The collectives one sync issues in the current state, acks popped (what
        each iteration of a decode run would issue: its queues cannot change)."""
        return 1

    def mismatch_recurs(self, sim) -> bool:
        """Whether a digest mismatch is seen again by every iteration of a decode run."""
        return True


def _sync_inputs(sim, counts: dict, digest: dict) -> tuple[dict, list]:
    """Each rank's ``[writes, loads, digest, -digest]`` for the sync's MIN, and the
    replicas whose ranks count their ready acks apart. The ranks of a replica that
    share one count pair (``CacheSync._sync``) enter with one vector object, which
    the simulated MIN visits once."""
    inputs: dict = {}
    split = []
    for c in sim.group.cohorts:
        first = counts[c.ranks[0]]
        d = digest[c.ranks[0]]
        if all(counts[r] is first for r in c.ranks):
            inputs.update(dict.fromkeys(c.ranks, [first[0], first[1], d, -d]))
            continue
        split.append(c)
        for r in c.ranks:
            inputs[r] = [counts[r][0], counts[r][1], d, -d]
    return inputs, split


def _reduce_rows(sim, rows: list) -> list[int]:
    """The sync's MIN over ``reduce_replicas``' rows, one vector per replica, and the
    digest check. Returns the reduced vector."""
    red = sim._all_reduce_replicas("sync", [(c.ranks, [w, l_, d, -d]) for c, w, l_, d in rows])
    sim._check_replica_digests(rows, red[-2], -red[-1])
    return red


class Synced(SyncDiscipline):
    __slots__ = ()
    name = "synced"

    by_replica = True

    def reduce(self, sim, counts, digest) -> None:
        inputs, _ = _sync_inputs(sim, counts, digest)
        red = sim._all_reduce("sync", inputs)
        sim._check_digest(digest, red[-2], -red[-1])
        for c in sim.group.cohorts:
            sim._pop(c, red[0], red[1])

    def reduce_replicas(self, sim, rows) -> None:
        red = _reduce_rows(sim, rows)
        for c in sim.group.cohorts:
            sim._pop(c, red[0], red[1])


class Local(SyncDiscipline):
    __slots__ = ()
    name = "local"
    solo_pops = False
    by_replica = True

    def reduce_replicas(self, sim, rows) -> None:
        _reduce_rows(sim, rows)
        # each rank drains its own ready acks: here every replica's ranks agree
        for c, w, l_, _ in rows:
            sim._pop(c, w, l_)

    def reduce(self, sim, counts, digest) -> None:
        group = sim.group
        inputs, split = _sync_inputs(sim, counts, digest)
        red = sim._all_reduce("sync", inputs)
        sim._check_digest(digest, red[-2], -red[-1])
        # each rank drains its own ready acks; ranks of a replica that disagree fork first
        for c in split:
            by_count: dict = {}
            for r in c.ranks:
                by_count.setdefault(counts[r], []).append(r)
            for key in list(by_count)[1:]:
                for r in by_count[key]:
                    sim._fork(r, "ack_local_drain", f"rank {r} drains {key} acks")
        for c in group.cohorts:
            sim._pop(c, *counts[c.ranks[0]])


class Pre26921(SyncDiscipline):
    """Before sglang #26921 / #27489: `writing_check` returns early on a rank with no
    write in flight and `loading_check` on a rank with no load in flight, each before
    its own all_reduce. The digest rides on the load check, as in 0.5.23's standalone
    `loading_check`."""

    __slots__ = ()
    name = "pre_26921"

    def reduce(self, sim, counts, digest) -> None:
        group = sim.group
        # A rank that returns early issues its next call on the cpu group instead: the
        # load check when it has a load in flight, else the next iteration's request
        # broadcast (the forward runs on the device group). That call meets the others'.
        load_check = Call("cpu", "load_check", "all_reduce", 3, "int64")
        nxt = {r: load_check if c.load_q else REQUEST_BROADCAST
               for c in group.cohorts if not c.write_q for r in c.ranks}
        inputs = {r: [counts[r][0]] for c in group.cohorts if c.write_q for r in c.ranks}
        n_write = sim._all_reduce("write_check", inputs, nxt)[0] if inputs else 0
        inputs = {r: [counts[r][1], digest[r], -digest[r]]
                  for c in group.cohorts if c.load_q for r in c.ranks}
        nxt = {r: REQUEST_BROADCAST for c in group.cohorts if not c.load_q for r in c.ranks}
        n_load = 0
        if inputs:
            red = sim._all_reduce("load_check", inputs, nxt)
            sim._check_digest({r: digest[r] for r in inputs}, red[1], -red[2])
            n_load = red[0]
        for c in group.cohorts:
            sim._pop(c, n_write, n_load)

    def call_count(self, sim) -> int:
        cohorts = sim.group.cohorts
        return any(c.write_q for c in cohorts) + any(c.load_q for c in cohorts)

    def mismatch_recurs(self, sim) -> bool:
        # the digest rides on the load check, which a step with no load skips
        return any(c.load_q for c in sim.group.cohorts)


SYNC_DISCIPLINES: dict[str, SyncDiscipline] = {
    d.name: d for d in (Synced(), Pre26921(), Local())
}
