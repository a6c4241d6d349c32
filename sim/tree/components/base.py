"""The interface of a hybrid tree's auxiliary component (SWA, Mamba), after SGLang
0.5.23's ``unified_cache/components/base.py`` ``TreeComponent``, and what the two
share: the component's device and host LRU lists, its value ledger moves, its
device eviction walk and its host eviction walk.

The core (``sim/tree/hybrid.py`` ``HybridTree``) holds one component object as
``tree.aux`` and calls its hooks where SGLang's ``UnifiedTreeCore`` loops over its
components; ``components/full.py`` (``FullComponent``) is FULL's own object,
``tree.full``. A node's component fields are slots of the node itself
(``sim/tree/hnode.py``: ``aux``, ``aux_lock``, ``lp``/``ln``, ``aux_host``, ...),
so a hook reads them directly. A hook's docstring names the SGLang method it
mirrors; the default is the base's (a no-op, or the value SGLang's base returns),
and a hook SGLang declares abstract raises here too.

Citations name SGLang files under ``sglang/srt/mem_cache/``: ``core`` is
``unified_cache/unified_tree_core.py``, ``base``/``full``/``swa``/``mamba`` are
``unified_cache/components/*.py``.
"""

from __future__ import annotations

import copy

from sim.tree.hnode import HNode, HostHNode

# ``UnifiedLRUList`` without sessions, once per tier: the device list links the nodes
# holding a device value through ``lp``/``ln`` and skips ``aux_lock``-ed entries; the
# host list (``use_host_ptr=True``) links the host-only values through ``hlp``/``hln``
# and skips ``aux_host_lock``-ed ones. Both are built from this one source with their
# own slot names, so every link read stays a direct slot read (no ``getattr`` on the
# hottest lists of the tree).
_LRU_SOURCE = '''
class {cls}:
    """{doc}"""

    __slots__ = ("head", "tail")

    def __init__(self):
        self.head = Sentinel({head_id}, [], None, 0.0, 0.0)
        self.tail = Sentinel({tail_id}, [], None, 0.0, 0.0)
        self.head.{nxt} = self.tail
        self.tail.{prv} = self.head

    @staticmethod
    def add_after(prev, node):
        """``insert_after(prev, node)``: ``node`` just older than ``prev``."""
        nxt = prev.{nxt}
        node.{prv} = prev
        node.{nxt} = nxt
        nxt.{prv} = node
        prev.{nxt} = node

    @staticmethod
    def remove(node):
        p, n = node.{prv}, node.{nxt}
        p.{nxt} = n
        n.{prv} = p
        node.{prv} = node.{nxt} = None

    def insert_mru(self, node):
        assert node.{prv} is None
        h = self.head
        nxt = h.{nxt}
        node.{prv} = h
        node.{nxt} = nxt
        nxt.{prv} = node
        h.{nxt} = node

    def reset_mru(self, node):
        self.remove(node)
        self.add_after(self.head, node)

    def prev_{unlocked}(self, node):
        """``get_prev_{unlocked}``: the next older entry whose {lock} is 0."""
        x = node.{prv}
        while x.{lock} > 0:
            x = x.{prv}
        return None if x is self.head else x

    def lru_{unlocked}(self):
        return self.prev_{unlocked}(self.tail)

    def order(self):
        out, x = [], self.head.{nxt}
        while x is not self.tail:
            out.append(x)
            x = x.{nxt}
        return out
'''


def _lru_class(cls: str, doc: str, sentinel: type, ids: tuple, prv: str, nxt: str,
               lock: str, unlocked: str) -> type:
    ns = {"Sentinel": sentinel, "__name__": __name__}
    exec(_LRU_SOURCE.format(cls=cls, doc=doc, head_id=ids[0], tail_id=ids[1], prv=prv,
                            nxt=nxt, lock=lock, unlocked=unlocked), ns)
    return ns[cls]


LRUList = _lru_class(
    "LRUList", "A component's device ``UnifiedLRUList``: head (MRU) ... tail (LRU) "
    "sentinels, the nodes holding a device value.", HNode, (-1, -2), "lp", "ln",
    "aux_lock", "no_lock")
HostLRUList = _lru_class(
    "HostLRUList", "A component's host ``UnifiedLRUList`` (``use_host_ptr=True``): the "
    "nodes whose value is host-only, linked through ``hlp``/``hln``.", HostHNode,
    (-3, -4), "hlp", "hln", "aux_host_lock", "no_host_lock")


class Discard:
    """The tally a host eviction hands its internal steps (``_release_layers``,
    ``_sweep``), which add device frees and component tombstones to ``freed`` and
    ``aux``; nobody reads it back: a host eviction reports only the host values it
    freed (core ``drive_host_eviction``). Two slots, so it costs less to build than
    an ``Eviction``."""

    __slots__ = ("freed", "aux")

    def __init__(self):
        self.freed = 0
        self.aux = 0


class TreeComponent:
    """base ``TreeComponent``: one auxiliary component of a hybrid tree. ``tree``:
    the core it belongs to; ``root``/``ps``: its root node and page size, read by
    the walks; ``lru``/``hlru``: the component's device and host LRU lists (core
    ``lru_lists[ct]``). The ledgers (``aux_used``, ``aux_evictable``,
    ``aux_protected``: core ``component_evictable_size_`` and its peers) stay on the
    core, as SGLang's do."""

    __slots__ = ("tree", "root", "ps", "lru", "hlru")

    name = ""  # ComponentType
    # base eviction_priority(is_leaf=False): full=2 > swa=1 > mamba=0; leaves all 0.
    priority = 0
    # core _finish_internal_component_eviction: the load-back pin and FULL-evicted
    # re-checks after an internal backup are Mamba's.
    recheck_pin = False
    # core insert: the request's prev_prefix_len must end on a node boundary (SWA's
    # window start and Mamba's checkpoint read it; components/none.py: FULL alone).
    prev_at_boundary = True
    # core reset(): this component's device and host UnifiedLRUList (their sentinels'
    # clock draws); 0 for no component.
    lru_lists = 1
    # False: the component holds no values, so its match, insert and backup hooks do
    # nothing and the core skips calling them (components/none.py: FULL alone).
    holds_values = True

    def __init__(self):
        self.tree = self.root = None
        self.ps = 1
        self.lru = LRUList()
        self.hlru = HostLRUList()

    def attach(self, tree) -> None:
        """``TreeComponent.tree_core``, set when the core is built (or cloned)."""
        self.tree = tree
        self.root = tree.root
        self.ps = tree.page_size

    def clone_into(self, new_tree, nmap: dict) -> "TreeComponent":
        """This component's copy for ``new_tree`` (``HybridTree.clone``): its own
        fields as they are, its LRU lists rebuilt in order over the copied nodes."""
        new = copy.copy(self)
        new.attach(new_tree)
        new.lru = LRUList()
        prev = new.lru.head
        for x in self.lru.order():
            y = nmap[id(x)]
            LRUList.add_after(prev, y)
            prev = y
        new.hlru = HostLRUList()
        if new_tree.hicache:
            for x in reversed(self.hlru.order()):
                new.hlru.insert_mru(nmap[id(x)])
        return new

    # ------------------------------------------------------------ sizes
    def value_len(self, node) -> int:
        """base ``value_len`` (here ``reclaimable_value_len`` too): the device value's
        size, 0 for a tombstone."""
        raise NotImplementedError

    def value_len_of(self, node) -> int:
        """The size a device value on ``node`` would have (Mamba 1, SWA tokens)."""
        return 1

    def host_value_len(self, node) -> int:
        """The size of the host value on ``node`` (Mamba: 1 state; SWA: tokens)."""
        return 1

    # ------------------------------------------------------------ the value ledger
    def set_value(self, node, n: int) -> None:
        """core ``set_component_device_value``: store the value, MRU in the LRU,
        credited to protected when the node is locked, else evictable."""
        node.aux = True
        if node.hlp is not None:
            self.hlru.remove(node)
        self.lru.insert_mru(node)
        t = self.tree
        t.aux_used += n
        if node.aux_lock > 0:
            t.aux_protected += n
        else:
            t.aux_evictable += n
        if t.rec is not None:
            t._ev("set", node, c=self.name, n=n)

    def evict_component(self, node, event: bool = True) -> int:
        """base ``evict_component(DEVICE)`` plus core
        ``_evict_component_and_detach_lru``: free the device value, debit evictable,
        leave the LRU (a tombstone over a host copy joins the host LRU). Returns the
        freed count."""
        n = self.value_len(node)
        node.aux = False
        t = self.tree
        t.aux_evictable -= n
        t.aux_used -= n
        t.hy.aux_evicted += n
        self.lru.remove(node)
        if node.aux_host and node.hlp is None:
            self.hlru.insert_mru(node)
        if event and t.rec is not None:
            t._ev("tomb", node, c=self.name, n=n)
        return n

    def evict_host_component(self, node) -> int:
        """base ``evict_component(HOST)``: the host value only."""
        n = self.host_value_len(node)
        node.aux_host = False
        t = self.tree
        t.ht.aux_host_used -= n
        t.hy.aux_host_freed += n
        if node.hlp is not None:
            self.hlru.remove(node)
        if t.rec is not None:
            t._ev("host_tomb", node, c=self.name, n=n)
        return n

    def release_host_value(self, node) -> None:
        """Free the host value as part of the node's deletion
        (core ``_release_all_component_layers``): no tombstone, no count."""
        node.aux_host = False
        self.tree.ht.aux_host_used -= self.host_value_len(node)
        if node.hlp is not None:
            self.hlru.remove(node)

    # ------------------------------------------------------------ split and match
    def split(self, up, child) -> None:
        """base ``redistribute_on_node_split`` (abstract): the component's share of
        the new upper fragment ``up`` of ``child``."""
        raise NotImplementedError

    def match_validator(self, device_only: bool = True):
        """base ``create_match_validator`` (abstract): a per-match predicate, whether
        a node is a valid match boundary for this component; None when every node
        is (the core then calls nothing)."""
        raise NotImplementedError

    def match_end(self, best) -> None:
        """base ``refresh_lru(MATCH_END)`` at the match's boundary ``best``."""

    def branch(self, device_len: int, full_len: int):
        """base ``finalize_match_result_in_tree_core``: the aligned FULL hit past
        this component's boundary a request may checkpoint at, or None."""
        return None

    def host_hit(self, best) -> int:
        """``finalize_match_result_in_tree_core``'s host part: the component's host
        hit length at ``best_match_node``."""
        return 0

    # ------------------------------------------------------------ insert
    def prepare_insert(self, key: list, prev: int, res, args: dict) -> None:
        """core ``begin_insert``'s component part (and the request's
        ``prepare_for_caching_req``): refuse an insert the pool cannot hold, set
        ``res.aux_new``."""

    def insert_overlap(self, node, m_tok: int, start_tok: int, prev: int, args: dict) -> None:
        """base ``update_component_on_insert_overlap``: the insert walks over
        ``node`` (``m_tok`` tokens from ``start_tok``) already on device."""

    def recover_after_unevict(self, node, m_tok: int, start_tok: int, args: dict) -> None:
        """base ``recover_after_unevict``: ``node`` just took the request's fresh FULL
        KV (``_unevict_node_on_insert``)."""

    def commit_insert(self, node, is_new_leaf: bool, res, args: dict) -> None:
        """base ``commit_insert_component_data``: the insert's target node."""

    def insert_end(self, node) -> None:
        """base ``refresh_lru(INSERT_END)`` (a no-op in the base)."""

    # ------------------------------------------------------------ locks
    def acquire_lock(self, node):
        """base ``acquire_component_lock`` (abstract): lock the component's values
        for a request anchored at ``node``; returns the receipt's boundary uuid."""
        raise NotImplementedError

    def release_lock(self, node, uuid) -> None:
        """base ``release_component_lock`` (abstract)."""
        raise NotImplementedError

    def acquire_host_lock(self, anchor):
        """base ``acquire_component_lock(lock_host=True)``; returns the host boundary
        uuid or None."""
        return None

    def release_host_lock(self, anchor, uuid) -> None:
        """base ``release_component_lock(lock_host=True)``."""

    # ------------------------------------------------------------ device eviction
    def evict_device(self, request: int, res) -> None:
        """swa.py / mamba.py ``_evict_device_next_node``, driven to ``request``: the
        component's LRU from the tail, skipping locked entries. A device leaf goes
        whole, as FULL's victims do (core ``evict_device_leaf``: ``_delete_leaf``
        with HiCache off, ``_evict_dleaf`` with it on); any other node loses only
        this component's value (a tombstone, cascading to lower priorities: none in
        a two-component tree), a host copy, if any, staying behind in the host LRU.
        Under write_back an internal value with no host copy on a node whose FULL
        has none either is first backed up (mamba ``InternalStateBackup``: host
        room, ``backup_node_for_write_back``, then ``finish_mamba_state_eviction``)."""
        t = self.tree
        victim = t._evict_dleaf if t.hicache else t._delete_leaf
        ht = t.ht
        backup_first = t.hicache and not ht.wt
        lru = self.lru
        cursor = lru.lru_no_lock()
        d_leaves = t.d_leaves
        while True:
            if cursor is not None and cursor.lp is None:
                cursor = lru.lru_no_lock()
            if res.aux >= request or cursor is None:
                return
            x = cursor
            cursor = lru.prev_no_lock(x)
            if x in d_leaves:
                victim(x, res)
                continue
            if backup_first and not x.aux_host and not x.host and x.dev:
                # InternalStateBackup: host room for every value the backup carries
                # (Mamba: the state; SWA: the unbacked window, swa
                # ``_collect_unbacked_swa_nodes``), reserved whole
                # (``evict_host(needed)``), then ``backup_node_for_write_back``.
                needed = 0
                for y in self.backup_nodes(x):
                    needed += self.host_value_len(y)
                if needed:
                    if ht.aux_host_capacity - ht.aux_host_used < needed:
                        self.drive_host_eviction(needed)
                    t._backup(x, res)
                    # _finish_internal_component_eviction's re-checks (the
                    # load-back pin and FULL's device value: Mamba only).
                    pin = self.recheck_pin
                    if (not t._alive(x) or not x.aux or x.aux_lock > 0
                            or (pin and x.lb is not None) or x.lp is None):
                        continue
                    if x in d_leaves or (pin and not x.dev):
                        cursor = x  # re-selected through the normal walk
                        continue
            res.aux += self.evict_component(x)
            t._refresh(x)

    # ------------------------------------------------------------ host tier
    def needs_incremental_backup(self, x) -> bool:
        """base ``needs_incremental_backup``: new device data missing from host."""
        return False

    def backup_nodes(self, x) -> list:
        """``build_hicache_transfers(BACKUP_HOST)``: the nodes whose value a backup
        of ``x`` writes, oldest first (Mamba: ``x``'s state; SWA: the unbacked
        window)."""
        return [x] if self.needs_incremental_backup(x) else []

    def load_needed(self, anchor) -> bool:
        """Whether a load-back from ``anchor`` restores a host-only value."""
        return False

    def load_nodes(self, anchor) -> list:
        """``build_hicache_transfers(LOAD_BACK)``: the nodes whose host-only value a
        load-back restores, oldest first (Mamba: the anchor's state; SWA: the
        window's host-only slices)."""
        return [anchor] if self.load_needed(anchor) else []

    def alloc_for_load(self, nodes: list, ev) -> bool:
        """The device slots of a load's restores (``_resolve_device_transfers``);
        an eviction it runs is added to ``ev``."""
        return True

    def prepare_load_back(self, anchor, holds, ev):
        """base ``prepare_load_back``: a truthy value when it gave the request a
        slot (handed back to ``finalize_load_back``)."""
        return None

    def finalize_load_back(self, slot, success: bool) -> None:
        """base ``finalize_load_back``: release what ``prepare_load_back`` took when
        the load did not go through."""

    def drive_host_eviction(self, n: int) -> int:
        """base ``drive_host_eviction`` (mamba's, swa's per slice): the host LRU from
        the tail, skipping host-locked entries; a host leaf is evicted whole, any
        other node loses only its host value. Returns the host units freed."""
        t = self.tree
        freed = 0
        hlru = self.hlru
        h_leaves = t.ht.h_leaves
        x = hlru.lru_no_host_lock()
        res = Discard()
        while freed < n and x is not None and x.hlp is not None:
            nxt = hlru.prev_no_host_lock(x)
            if x in h_leaves:
                freed += t._evict_hleaf(x, res)[1]
            else:
                freed += self.evict_host_component(x)
                t._refresh(x)
            x = nxt
        return freed

    def check(self) -> None:
        """The component's own invariants (``sanity_check``'s component part)."""
