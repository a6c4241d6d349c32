"""The Mamba component of SGLang 0.5.23's unified tree: the (FULL, MAMBA) tree.

A Mamba value is one state-pool slot: the SSM state after the node's last token. It
is only meaningful where a match ends, so it lives on the nodes inserts ended at,
never on split-off prefixes, and a match boundary must hold one. From
``sglang/srt/mem_cache/unified_cache/components/mamba.py`` (``mamba`` below), see
docs/HYBRID.md §4:

* a match is valid only at a node with a state (``create_match_validator``), and
  only that node is refreshed in the Mamba LRU (``refresh_lru(MATCH_END)``);
* an insert attaches the request's state to its target node, or, when the node has
  one, keeps the tree's and frees the request's fork (``mamba_exist``,
  ``commit_insert_component_data``, ``cleanup_after_caching_req``);
* a split leaves the state on the lower fragment (``redistribute_on_node_split``);
* a lock pins the anchor's state only (``acquire_component_lock``);
* eviction walks the Mamba LRU: leaves go whole, internal states are tombstoned;
* ``max_states`` (``--mamba-max-states-per-path``) caps the states on an insert's
  root path (``_evict_excess_path_states``).
"""

from __future__ import annotations

import math

from sim import constants as C
from sim.tree.components.base import TreeComponent
from sim.tree.hybrid import HybridInvariantError, HybridTree, HybridTreeError
from sim.tree.results import HybridCow

_NO_COW = HybridCow(False)  # nothing to copy: the match ends on no state


class MambaComponent(TreeComponent):
    """mamba ``MambaComponent``. ``grid``: the checkpoint grid of ``branch``
    (runtime_context.py ``mamba_checkpoint_grid``: lcm(mamba_cache_chunk_size,
    page)); ``max_states``: ``mamba_max_states_per_path`` (-1: unlimited);
    ``held``: the state slots running requests hold outside the tree (their copies
    on write)."""

    __slots__ = ("grid", "max_states", "held")

    name = "mamba"
    priority = C.EVICTION_PRIORITY_INTERNAL["mamba"]
    recheck_pin = True

    def __init__(self, mamba_chunk: int, page_size: int, max_states: int):
        super().__init__()
        self.grid = math.lcm(mamba_chunk, page_size)
        self.max_states = max_states
        self.held = 0

    def value_len(self, node) -> int:
        return 1 if node.aux else 0

    def free_slot(self) -> bool:
        """A state slot is free in the pool (the tree's states and the held ones)."""
        t = self.tree
        return t.aux_used + self.held < t.aux_capacity

    def split(self, up, child) -> None:
        """mamba ``redistribute_on_node_split``: the new parent gets no state and no
        lock; the state stays on the lower fragment."""
        up.aux = False
        up.aux_lock = 0

    # ------------------------------------------------------------------ match
    def match_validator(self, device_only: bool = True):
        """mamba ``create_match_validator``: a state at the node (with HiCache, a
        host copy also counts for ``best_match_node``)."""
        if device_only:
            return lambda node: node.aux
        return lambda node: node.aux or node.aux_host

    def host_hit(self, best) -> int:
        """``finalize_match_result_in_tree_core``: ``mamba_host_hit_length`` is 1 when
        the boundary's state is host-only (so a load-back is started for it)."""
        return 1 if best.aux_host and not best.aux else 0

    def match_end(self, best) -> None:
        """mamba ``refresh_lru(MATCH_END)``: only the state the match uses."""
        if best.aux:
            self.lru.reset_mru(best)

    def branch(self, device_len: int, full_len: int):
        """mamba ``finalize_match_result_in_tree_core``: the grid-aligned FULL hit when
        it passes the Mamba boundary."""
        aligned = full_len // self.grid * self.grid
        return aligned if aligned > device_len else None

    # ------------------------------------------------------------------ insert
    def prepare_insert(self, key, prev, res, args) -> None:
        """core ``begin_insert``: a fresh state needs a free slot (``free_slot``,
        inline: every insert asks); a donated one is the request's own."""
        t = self.tree
        if not args["donated"] and t.aux_used + self.held >= t.aux_capacity:
            raise HybridTreeError("mamba_full")
        res.aux_new = 1

    def commit_insert(self, node, is_new_leaf, res, args) -> None:
        """mamba ``commit_insert_component_data``."""
        t = self.tree
        if is_new_leaf:
            node.aux = True
            self.lru.insert_mru(node)
            t.aux_used += 1
            t.aux_evictable += 1
            if t.rec is not None:
                t._ev("set", node, c="mamba", n=1)
            self._cap_path(node)
        elif not node.aux:
            self.set_value(node, 1)
            node.last_access = t._tick()
            self._cap_path(node)
        else:
            self.lru.reset_mru(node)
            node.last_access = t._tick()
            res.mamba_exist = True

    def _cap_path(self, tail) -> None:
        """mamba ``_evict_excess_path_states`` (the deferred
        ``MambaEvictExcessPathStates`` action): past ``max_states`` states on the
        tail's root path, tombstone the shallowest that are not the tail, locked, a
        fork (children != 1) or a device leaf."""
        cap = self.max_states
        if cap < 0:
            return
        holders, node, root = [], tail, self.root
        while node is not None and node is not root:
            if node.aux:
                holders.append(node)
            node = node.parent
        excess = len(holders) - cap
        if excess <= 0:
            return
        t = self.tree
        for node in reversed(holders):
            if excess <= 0 or node is tail:
                break
            if node.aux_lock > 0 or len(node.children) != 1 or node in t.d_leaves:
                continue
            self.evict_component(node)
            t._refresh(node)
            excess -= 1

    # ------------------------------------------------------------------ locks
    def acquire_lock(self, node):
        """mamba ``acquire_component_lock``: the anchor only."""
        if node is self.root:
            return None
        if node.aux_lock == 0 and node.aux:
            t = self.tree
            t.aux_evictable -= 1
            t.aux_protected += 1
        node.aux_lock += 1
        return None

    def release_lock(self, node, uuid) -> None:
        """mamba ``release_component_lock``: the anchor only."""
        if node is self.root:
            return
        if node.aux_lock <= 0:
            raise HybridInvariantError(f"Mamba release hit lock_ref=0 on node {node.id}")
        t = self.tree
        if node.aux_lock == 1 and node.aux:
            t.aux_evictable += 1
            t.aux_protected -= 1
        node.aux_lock -= 1
        if node.aux_lock == 0:
            t._refresh(node)

    def acquire_host_lock(self, anchor):
        """mamba ``acquire_component_lock(lock_host=True)``: the anchor's host state,
        which leaves the host LRU."""
        if anchor is not self.root:
            if anchor.aux_host_lock == 0 and anchor.aux_host and anchor.hlp is not None:
                self.hlru.remove(anchor)
            anchor.aux_host_lock += 1
        return None

    def release_host_lock(self, anchor, uuid) -> None:
        """mamba ``release_component_lock(lock_host=True)``: a host-only state
        rejoins the host LRU."""
        if anchor is not self.root:
            anchor.aux_host_lock -= 1
            if anchor.aux_host_lock == 0:
                if not anchor.aux and anchor.aux_host and anchor.hlp is None:
                    self.hlru.insert_mru(anchor)
                self.tree._refresh(anchor)

    # ------------------------------------------------------------------ host tier
    def needs_incremental_backup(self, x) -> bool:
        """``needs_incremental_backup`` / ``build_hicache_transfers(BACKUP_HOST)``: the
        device state, when it has no host copy yet."""
        return x.aux and not x.aux_host

    def load_needed(self, anchor) -> bool:
        """``build_hicache_transfers(LOAD_BACK)``: the anchor's host-only state."""
        return anchor.aux_host and not anchor.aux

    def prepare_load_back(self, anchor, holds, ev):
        """mamba ``prepare_load_back``: a request (``holds``: whether it holds a slot;
        None: no request) loading a host-only state gets a slot of its own for the
        copy, evicting one state for it when the pool is full
        (``_alloc_request_state_slot``)."""
        if holds is None or holds or not self.load_needed(anchor):
            return None
        if not self.free_slot():
            t = self.tree
            t._merge(ev, t.evict(0, 1))
            if not self.free_slot():
                raise HybridInvariantError("Cannot alloc mamba for load_back")
        self.held += 1
        return True

    def finalize_load_back(self, slot, success: bool) -> None:
        """mamba ``finalize_load_back``: a called-off load returns the slot (a load
        that started keeps it: ``load_back``'s ``slot_granted``)."""
        if slot and not success:
            self.held -= 1

    def alloc_for_load(self, nodes, ev) -> bool:
        """The restore's device slot (``_resolve_device_transfers``, evicting once
        through ``_evict_mamba_for_device_alloc``)."""
        if not self.free_slot():
            t = self.tree
            t._merge(ev, t.evict(0, 1))
        return self.free_slot()

    def check(self) -> None:
        t = self.tree
        for n in t.iter_nodes():
            if n.aux_lock > n.lock:
                raise HybridInvariantError(f"node {n.id}: Mamba lock outside FULL's path lock")
        if self.held < 0 or t.aux_used + self.held > t.aux_capacity:
            raise HybridInvariantError(f"Mamba pool: {t.aux_used} in the tree + "
                                       f"{self.held} held > {t.aux_capacity}")


class MambaTree(HybridTree):
    """The (FULL, MAMBA) tree: the core with a ``MambaComponent``. ``mamba_chunk``:
    ``mamba_cache_chunk_size()`` (``max(the model's mamba chunk size, page_size)``,
    runtime_context.py), which with the page size sets the checkpoint grid of
    ``branch``; ``mamba_capacity``: state slots; ``max_states``:
    ``mamba_max_states_per_path`` (-1: unlimited); ``extra_buffer``:
    ``--enable-mamba-extra-buffer`` (needed past page size 1; the tree behaves the
    same, the request-side state bookkeeping differs)."""

    def __init__(self, *, mamba_capacity: int, mamba_chunk: int, page_size: int = 1,
                 max_states: int = -1, extra_buffer: bool = False,
                 mamba_host_capacity: int = 0, **core):
        """``core``: ``HybridTree``'s keywords (``device_capacity``, ``record``, the
        host pool, the policies)."""
        # MambaComponent.__init__: without --enable-mamba-extra-buffer only the
        # sequence-end state exists, so a cached state needs page size 1.
        if page_size != 1 and not extra_buffer:
            raise ValueError("MambaTree needs page_size 1 without the extra buffer")
        if mamba_chunk < 1:
            raise ValueError("mamba_chunk must be >= 1")
        if max_states == 0 or max_states < -1:
            raise ValueError("max_states must be -1 or a positive integer")
        super().__init__(MambaComponent(mamba_chunk, page_size, max_states),
                         aux_capacity=mamba_capacity, aux_host_capacity=mamba_host_capacity,
                         page_size=page_size, **core)

    grid = property(lambda self: self.aux.grid)
    max_states = property(lambda self: self.aux.max_states)

    @property
    def held(self) -> int:
        """State slots running requests hold outside the tree (``MambaComponent.held``)."""
        return self.aux.held

    @held.setter
    def held(self, n: int) -> None:
        self.aux.held = n

    def _free_slot(self) -> bool:
        return self.aux.free_slot()

    def insert(self, key: list, prev: int = 0, donated: bool = False, inserted: int = 0):
        """Insert ``key`` with the request's state: a fresh slot (the fork of a running
        request), or, ``donated``, a finished request's own held slot, which the tree
        keeps or frees (``prepare_for_caching_req`` / ``cleanup_after_caching_req``).
        ``inserted``: ``InsertParams.inserted_len`` (write_through hit counts)."""
        res = super().insert(key, prev, inserted, donated=donated)
        if donated:
            self.aux.held -= 1
        return res

    # ------------------------------------------------------------------ requests
    def peek_best(self, key: list, host: bool = False):
        """The node ``match_prefix(key)`` would end at, read-only: the deepest wholly
        matched node with a state (a split-off fragment never has one). ``host``: as a
        HiCache match (``best_match_node``): FULL on either tier, a state on either."""
        node, pos, n, best = self.root, 0, len(key), self.root
        while pos < n:
            child = node.children.get(key[pos])
            if child is None or (host and not (child.dev or child.host)):
                break
            p = self._common(key, pos, child.key)
            if p < len(child.key):
                break
            if child.aux or (host and child.aux_host):
                best = child
            pos += p
            node = child
        return best

    def cow_would_fail(self, key: list, holds: bool) -> bool:
        """Whether a copy on write for ``key`` would find no slot: the pool is full
        and evicting one state under a lock on the match frees none (SGLang asserts
        "Can not alloc mamba cache"; a trace refuses the op instead, unchanged)."""
        if holds or self.aux.free_slot():
            return False
        best = self.peek_best(key)
        return best.aux and self.aux_evictable - (best.aux_lock == 0) <= 0

    def cow(self, match, holds: bool) -> HybridCow:
        """mamba ``finalize_match_result_in_cache`` (``cow_mamba``): a request matching
        a state copies it into its own slot, allocated unless it ``holds`` one; with
        the pool full, one state is evicted first while the match is locked
        (``inc_lock_ref``, ``evict_for_alloc(mamba_num=1)``, ``dec_lock_ref``). The
        result says whether a state was copied, or whether that eviction freed none
        (``failed``: SGLang asserts "Can not alloc mamba cache"), and carries it."""
        best = match.best
        if not best.aux:
            return _NO_COW
        ev = None
        comp = self.aux
        if not holds:
            # free_slot, inline: every matching request asks
            if self.aux_used + comp.held >= self.aux_capacity:
                receipt = self.inc_lock(best)
                ev = self.evict(0, 1)
                self.dec_lock(receipt)
                if not ev.aux:
                    return HybridCow(False, True, ev)
            comp.held += 1
        return HybridCow(True, False, ev)

    def release(self) -> None:
        """A request leaving without caching frees its held slot."""
        comp = self.aux
        if comp.held <= 0:
            raise HybridInvariantError("no held Mamba slot to release")
        comp.held -= 1

    def load_back_would_fail(self, key: list, holds: bool) -> bool:
        """Whether ``prepare_load_back`` would find no slot for a request loading the
        state ``key`` matches (SGLang asserts; a trace refuses the op first)."""
        if holds or self.aux.free_slot():
            return False
        best = self.peek_best(key, host=True)
        return self.aux.load_needed(best) and self.aux_evictable <= 0
