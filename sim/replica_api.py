"""What the TP engine may call on a replica: the engine-facing interface.

A replica is one cohort's cache (``sim.ranks.Cohort.tree``): a FULL radix tree
(``sim.tree.Tree``) or a hybrid one behind ``sim.hybrid.replica.HybridReplica``.
The engine (``sim.events``, ``sim.scheduler``, ``sim.ranks``, ``sim.metrics``,
``sim.verdict``, ``sim.storage``) reaches a replica only through these names;
``tests/test_replica_api.py`` runs FULL, storage and hybrid scenarios with every
replica wrapped in a proxy that refuses any other name.

``Replica`` is what both kinds give; ``FullReplica`` adds what only a FULL tree
gives (the L3 storage tier and write_through's hit counts, which the engine uses
on FULL-only models); ``HybridReplicaAPI`` adds what the engine reads off a hybrid
replica (its kind, its per-component summary). The hybrid hooks
(``sim.hybrid.replica.HybridHooks``) live beside the replica they drive and use
its own fields; they are not the engine.

Two exceptions see a replica whole, as an object graph: ``clone`` copies it for a
fork, and ``sim.coalesce`` compares two of them to merge them back; neither reads a
field by name.

The ``reserved`` ledger (device tokens running requests hold outside the tree) is
written only by the replica's allocator (``sim.allocator.KVAllocator``); the
engine never writes a tree node.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Replica(Protocol):
    """The engine-facing interface of a replica (FULL or hybrid)."""

    # ledgers (tokens); ``reserved`` is written by ``sim.allocator.KVAllocator`` only
    page_size: int
    device_capacity: int   # set once at t=0 on a device-skewed rank (sim.ranks)
    reserved: int
    host_capacity: int     # set once at t=0 on a host-skewed rank (sim.ranks)
    host_alloc_fail: Any   # a rank's scripted host allocation failures, or None
    digest_xor: int        # a scripted fault's digest perturbation (FULL only)

    @property
    def dev_used(self) -> int: ...
    @property
    def evictable(self) -> int: ...
    @property
    def protected(self) -> int: ...
    @property
    def n_nodes(self) -> int: ...
    @property
    def host_used(self) -> int: ...
    @property
    def dup_tokens(self) -> int: ...
    @property
    def digest(self) -> int: ...
    @property
    def dups(self) -> dict: ...
    @property
    def loads(self) -> dict: ...
    @property
    def pending_writes(self) -> dict: ...
    @property
    def stats(self) -> Any: ...
    @property
    def content_hash(self) -> int: ...

    # ops: each returns a result object (sim.tree.results)
    def match_prefix(self, key: list) -> Any: ...
    def inc_lock(self, lock: Any) -> None: ...
    def dec_lock(self, lock: Any) -> None: ...
    def insert(self, key: list, priority: int = 0, resident: bool = False, **kw) -> Any: ...
    def evict_device(self, n: int) -> Any: ...
    def load_back(self, match: Any, lid: Any, *rid) -> Any: ...
    def finish_load_back(self, lid: Any) -> None: ...
    def finish_write_through(self, ack_id: Any) -> None: ...

    # forks, ids, checks
    def clone(self, maps: dict | None = None) -> "Replica": ...
    def lock_in(self, lock: Any) -> Any: ...
    def path_units(self, lock: Any) -> list: ...
    def skip_ids(self, k: int) -> None: ...
    def fingerprint(self) -> Any: ...
    def check(self) -> None: ...


@runtime_checkable
class FullReplica(Replica, Protocol):
    """What the engine also uses on a FULL tree: the L3 storage tier
    (``sim.storage``: host locks, host inserts and evictions, the write-back
    buffer's staging and walk), write_through's hit threshold, host skew."""

    root: Any
    write: Any             # the write policy (``hit_threshold``: write_through's hit counts)
    host_reserved: int     # host slots staged prefetches hold (read only: stage_host)
    host_free: int         # host slots neither in the tree nor staged
    host_nominal: int
    host_skew_fired: Any
    buffer_walk: Any
    buffer_only: bool
    on_backup_intent: Any
    on_host_backup: Any

    def stage_host(self, n: int) -> None: ...
    def unstage_host(self, n: int) -> None: ...
    def host_lock(self, node: Any) -> Any: ...
    def host_unlock(self, lock: Any) -> None: ...
    def insert_host(self, *a, **kw) -> Any: ...
    def evict_host(self, n: int) -> Any: ...
    def stage_buffer_backup(self, node: Any) -> Any: ...
    def device_prefix(self, *a, **kw) -> Any: ...


@runtime_checkable
class HybridReplicaAPI(Replica, Protocol):
    """What the engine also reads off a hybrid replica."""

    kind: str  # a key of sim.hybrid.kinds.HYBRID_KINDS

    def summary(self) -> dict: ...


def protocol_names(proto: type) -> frozenset:
    """The names ``proto`` declares (annotations, methods and properties of it and
    its protocol bases)."""
    out: set = set()
    for base in proto.__mro__:
        if base in (object, Protocol) or not getattr(base, "_is_protocol", False):
            continue
        out.update(getattr(base, "__annotations__", {}))
        out.update(n for n in vars(base) if not n.startswith("_"))
    return frozenset(out)
