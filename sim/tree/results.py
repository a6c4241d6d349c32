"""The result object each public tree operation returns: what the op did (the backups
it issued, what it freed, how much of the duplicate map it scanned), so that the engine
charges time from it and nothing else needs to be read off the tree afterwards.

Every tree is the one core (``sim/tree/hybrid.py``), so every op has one result type,
with per-component fields: ``Match``, ``Insert``, ``Eviction`` (with its
``HostEviction``), ``HybridLoad``, ``HostInsert``, ``LockReceipt`` and
``HostLockReceipt``. The FULL tree (``sim/tree/full.py``) hands the engine a
load-back as a ``LoadResult``, whose ``load`` is the in-flight load itself.
"""

from __future__ import annotations

# ---------------------------------------------------------------- op results
# One result object per public op, filled in place by the op's internal steps (no
# allocation per step). Results are read-only to callers: the tree never touches a
# result after returning it. Token fields are tokens; fields documented as counts
# count nodes or duplicate-map entries.


class HostEviction:
    """What host eviction freed: one ``evict_host`` call, or the sum of every host
    eviction a device-side op ran to make room for its D->H backups (sem §3.4).

    ``freed == reclaimed_pass1 + reclaimed_pass2 + lru_evicted`` (tokens);
    ``scanned``: duplicate-map entries the reclaim visited, over both passes (the
    engine charges ``reclaim_scan_time`` for them); ``swept``: stale map entries the
    reclaim removed (a count).
    """

    __slots__ = ("freed", "reclaimed_pass1", "reclaimed_pass2", "lru_evicted", "scanned", "swept")

    def __init__(self):
        self.freed = self.reclaimed_pass1 = self.reclaimed_pass2 = self.lru_evicted = 0
        self.scanned = self.swept = 0

    def __repr__(self) -> str:
        return (f"HostEviction(freed={self.freed}, pass1={self.reclaimed_pass1}, "
                f"pass2={self.reclaimed_pass2}, lru={self.lru_evicted}, scanned={self.scanned}, "
                f"swept={self.swept})")


class _NoHostEviction(HostEviction):
    """The one shared, read-only empty ``HostEviction``: the ``host`` of every op that
    evicted nothing from host (most of them), which saves an allocation per op. An op
    swaps in a fresh ``HostEviction`` the first time it evicts from host."""

    __slots__ = ()

    def __init__(self):
        for name in HostEviction.__slots__:
            object.__setattr__(self, name, 0)

    def __setattr__(self, name, value):
        raise AttributeError("NO_HOST_EVICTION is shared and read-only")


NO_HOST_EVICTION = _NoHostEviction()


class _NoItems(list):
    """The one shared, read-only empty list: the ``backups`` / ``writes`` of every op
    that issued none (most of them), which saves a list per op (and the collector's
    visits to it). An op swaps in its own list with its first item."""

    __slots__ = ()

    def _refuse(self, *args, **kwargs):
        raise AttributeError("NO_ITEMS is shared and read-only")

    append = extend = insert = remove = pop = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse


NO_ITEMS = _NoItems()


class Eviction:
    """Result of ``evict_device`` (sem §3.3).

    ``freed == demoted + deleted + dropped`` (device tokens). ``demoted``: victims
    that kept (or just got) a host copy; ``deleted``: write_through victims with no
    host copy; ``dropped``: write_back victims that could not be backed up, deleted
    with their host-only subtrees, whose host tokens are ``dropped_host``.
    ``declined``: victims whose drop was refused (locked or pinned below), a count;
    they free nothing and stay D-leaves. ``backups``: the tokens of each blocking
    write_back D->H backup, in issue order (the engine charges ``d2h_time`` for
    each); ``backups_failed``: backups refused for lack of host room (a count).
    ``host``: the host evictions those backups ran to make room, summed.

    A hybrid tree's ``evict`` (``sim/tree/hybrid.py``) returns one too, per
    component: ``freed`` the FULL device tokens and ``aux`` the other component's
    device values (SWA tokens, Mamba states), each counting what cascades from the
    other component's victims (0 in a FULL-only tree); ``backups`` holds each
    blocking backup as (FULL tokens, the component's host units), which the engine's
    replica (``sim/hybrid/replica.py``) prices in FULL-token equivalents, and
    ``host`` the host evictions they ran.
    """

    __slots__ = ("freed", "aux", "demoted", "deleted", "dropped", "dropped_host", "declined",
                 "backups", "backups_failed", "host")

    def __init__(self):
        self.freed = self.aux = self.demoted = self.deleted = self.dropped = 0
        self.dropped_host = self.declined = self.backups_failed = 0
        self.backups: list[int] = NO_ITEMS
        self.host: HostEviction = NO_HOST_EVICTION

    @property
    def reclaim_scanned(self) -> int:
        """Duplicate-map entries the reclaims of this eviction's backups scanned."""
        return self.host.scanned

    def __repr__(self) -> str:
        return (f"Eviction(freed={self.freed}, aux={self.aux}, demoted={self.demoted}, "
                f"deleted={self.deleted}, "
                f"dropped={self.dropped}, declined={self.declined}, backups={self.backups}, "
                f"host={self.host!r})")


class LoadResult:
    """Result of ``load_back`` (sem §3.6).

    ``ok``: the load started; then ``load`` is the in-flight ``LoadBack``, ``tokens``
    the tokens it moves H->D and ``anchor`` the node the request's lock moves to.
    Otherwise ``reason`` is one of ``"no_host_tail"``, ``"below_threshold"``,
    ``"pinned_by_other"``, ``"no_device_space"``, ``tokens`` is 0 and ``load`` and
    ``anchor`` are None. ``eviction``: the device eviction run to make room, or None
    when none ran; it is set even when the load then failed with
    ``"no_device_space"``, because its backups happened and cost time.
    """

    __slots__ = ("ok", "reason", "load", "tokens", "anchor", "eviction")

    def __init__(self, reason: str | None, load: "LoadBack | None", eviction: "Eviction | None"):
        self.ok = load is not None
        self.reason = reason
        self.load = load
        self.tokens = 0 if load is None else load.tokens
        self.anchor = None if load is None else load.anchor
        self.eviction = eviction

    def __repr__(self) -> str:
        what = f"tokens={self.tokens}" if self.ok else f"reason={self.reason!r}"
        return f"LoadResult(ok={self.ok}, {what}, eviction={self.eviction!r})"


class _Rejected(LoadResult):
    """A shared, read-only LoadResult for a rejection that did nothing: most
    load-back attempts find no host tail, and sharing saves an allocation each."""

    __slots__ = ()

    def __init__(self, reason: str):
        for name, value in (("ok", False), ("reason", reason), ("load", None), ("tokens", 0),
                            ("anchor", None), ("eviction", None)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError("shared rejection results are read-only")


_REJECTED = {r: _Rejected(r) for r in ("no_host_tail", "below_threshold", "pinned_by_other")}


class Backup:
    """Result of ``backup_node``: ``ok`` when the node has a host copy afterwards;
    ``tokens`` copied D->H by this call (0 when it already had one, or on failure);
    ``host``: the host eviction run to make room."""

    __slots__ = ("ok", "tokens", "host")

    def __init__(self):
        self.ok = False
        self.tokens = 0
        self.host: HostEviction = NO_HOST_EVICTION


class HostInsert:
    """Result of ``insert_host`` (a storage prefetch landing in the host tier).

    ``prefix_tokens``: SGLang's ``InsertResult.prefix_len``: the leading tokens of
    the fetched key whose host slots the caller frees at once (write_back: every
    token the walk matched; write_through: only those matched on nodes that were
    already backed up); ``node``: ``inserted_host_node``, the node holding the end
    of the fetched key on host (None: nothing, e.g. an empty key, or the end sits
    on a device-only node under write_back); ``new_tokens``: tokens of the new
    host-only leaf; ``refilled_tokens``: write_through only, tokens of device-only
    nodes that took the fetched host copy; ``dropped``: ``host_insert_dropped``
    (write_through, the walk ended under an un-backed node: nothing was adopted);
    ``split``: whether the walk split a node.
    """

    __slots__ = ("prefix_tokens", "node", "new_tokens", "refilled_tokens", "dropped", "split")

    def __init__(self):
        self.prefix_tokens = 0
        self.node = None
        self.new_tokens = 0
        self.refilled_tokens = 0
        self.dropped = False
        self.split = False

    def __repr__(self) -> str:
        return (f"HostInsert(prefix={self.prefix_tokens}, node={self.node!r}, "
                f"new={self.new_tokens}, refilled={self.refilled_tokens}, dropped={self.dropped})")


# ---------------------------------------------------------------- op results


# ---------------------------------------------------------------- hybrid trees


class Match:
    """``match_prefix``'s result. ``device_len``: tokens up to ``best`` (the deepest
    node every component's validator accepts); ``full_len``: tokens the FULL walk
    matched (``full_kv_hit_length``); ``branch``: the component's branching seqlen
    (``swa_branching_seqlen`` / ``mamba_branching_seqlen``) or None; ``split``: the
    walk split the node it stopped in (the new upper fragment is on the path)."""

    __slots__ = ("device_len", "full_len", "best", "branch", "dnode", "host_len",
                 "aux_host_len", "split")

    def __init__(self, device_len, full_len, best, branch, dnode=None, host_len=0,
                 aux_host_len=0, split=False):
        self.split = split
        self.device_len = device_len
        self.full_len = full_len
        self.best = best
        self.branch = branch
        # Host tier: last_device_node (the lock anchor), host_hit_length (FULL host
        # tokens from best up to it) and the component's host hit
        # (mamba_host_hit_length). With HiCache off dnode is best.
        self.dnode = best if dnode is None else dnode
        self.host_len = host_len
        self.aux_host_len = aux_host_len

    # last_device_node: the lock anchor (the engine's name for ``dnode``)
    last_device = property(lambda self: self.dnode)


class Insert:
    """``insert``'s result: ``prefix_len`` tokens reused, ``new`` fresh FULL tokens
    the request brought, ``aux_new`` fresh SWA tokens (SWA) or 1 (Mamba),
    ``mamba_exist`` (Mamba: the tree already had a state at the target, so the
    request's fork is freed), ``node`` the target node (the request's new lock
    point; the root for an empty key). write_through: ``writes``, the backups the
    insert issued, in issue order (each a ``PendingWrite``: ack id, FULL tokens, the
    component's host units; in flight until its ack), ``host``, the host evictions
    they ran to make room, and ``backups_failed``, the backups abandoned for lack of
    host room (a count). ``split``: the walk split a node."""

    __slots__ = ("prefix_len", "new", "aux_new", "mamba_exist", "node", "writes", "host",
                 "backups_failed", "split")

    def __init__(self):
        self.prefix_len = 0
        self.new = 0
        self.aux_new = 0
        self.mamba_exist = False
        self.node = None
        self.writes: list = NO_ITEMS
        self.host: HostEviction = NO_HOST_EVICTION
        self.backups_failed = 0
        self.split = False

    # the FULL engine's names: the tokens already in the tree, the tokens new on device
    prefix_tokens = property(lambda self: self.prefix_len)
    new_device_tokens = property(lambda self: self.new)


class HybridLoad:
    """``load_back``'s result (cache ``init_load_back`` + ``load_back``). ``started``:
    the load began (its ack is ``finish_load_back``); ``loaded``: FULL tokens it moves
    H->D; ``aux_loaded``: the component's host-only values it restores (SWA: tokens
    of the window's slices; Mamba: states, 0 or 1); ``reason`` when not started
    (``no_host_tail``, ``below_threshold``, ``no_device_space``, ``no_swa_space``,
    ``no_mamba_space``); ``slot_granted``: Mamba, the loading request had no state
    slot and got one for the copy (``prepare_load_back``), which it now holds;
    ``eviction``: the evictions the load ran for room (FULL's, a Mamba slot's), summed
    with their backups and host evictions, or None when it ran none (set even when
    the load was then refused: they happened)."""

    __slots__ = ("started", "loaded", "aux_loaded", "reason", "slot_granted", "eviction")

    def __init__(self, reason: str | None, loaded: int = 0, aux_loaded: int = 0,
                 slot_granted: bool = False, eviction: "Eviction | None" = None):
        self.started = reason is None
        self.loaded = loaded
        self.aux_loaded = aux_loaded
        self.reason = reason
        self.slot_granted = slot_granted
        self.eviction = eviction

    def as_dict(self) -> dict:
        """The op-trace output's fields (docs/HYBRID.md §6): ``started``, ``loaded``
        and, when not started, ``reason``."""
        if self.started:
            return {"started": True, "loaded": self.loaded}
        return {"started": False, "loaded": 0, "reason": self.reason}

    def __repr__(self) -> str:
        what = f"loaded={self.loaded}, aux_loaded={self.aux_loaded}" if self.started \
            else f"reason={self.reason!r}"
        return f"HybridLoad(started={self.started}, {what})"


class HybridCow:
    """Mamba ``cow``'s result (``finalize_match_result_in_cache``): ``copied``, a
    state was copied into the request's slot; ``failed``, the pool was full and
    evicting one state freed none (SGLang asserts "Can not alloc mamba cache");
    ``eviction``: that eviction, with its backups and host evictions, or None."""

    __slots__ = ("copied", "failed", "eviction")

    def __init__(self, copied: bool, failed: bool = False, eviction: "Eviction | None" = None):
        self.copied = copied
        self.failed = failed
        self.eviction = eviction


class LockReceipt:
    """``IncLockRefResult``: the anchor, the SWA boundary uuid (None: the segment
    reached the root), whether the auxiliary lock was skipped
    (``skipped_lock_components``) and whether the SWA part was released early."""

    __slots__ = ("node", "uuid", "skip_aux", "swa_released")

    def __init__(self, node: HNode, uuid, skip_aux: bool = False):
        self.node = node
        self.uuid = uuid
        self.skip_aux = skip_aux
        self.swa_released = False


class HostLockReceipt:
    """``inc_host_lock_ref``'s receipt: the anchor, and ``top``, the node carrying
    FULL's host-lock boundary (``metadata["host_uuid"]``; a split moves it up);
    ``full``: whether FULL took a host lock at all (write_through skips an anchor
    with no host copy: full.py ``acquire_component_lock``)."""

    __slots__ = ("anchor", "full", "top", "aux_uuid")

    def __init__(self, anchor: HNode, full: bool = True):
        self.anchor = anchor
        self.top = anchor
        self.full = full
        # SWA: the window host lock's boundary uuid (None: it reached the root).
        self.aux_uuid = None
