"""The tree core and the FULL component of SGLang 0.5.23's unified radix tree, for
trees with one auxiliary component (SWA or Mamba). Device tier only.

This is the component-generic half of ``docs/HYBRID.md``: node ids and the logical
clock, splits, the device leaf set, the FULL path lock and FULL leaf eviction, the
one auxiliary LRU list, the eviction driver and the leaf deletion that cascades to
every component. ``sim/hybrid/swa.py`` and ``sim/hybrid/mamba.py`` add each
component's hooks (``_aux_*`` methods below). Citations name SGLang files under
``sglang/srt/mem_cache/``: ``core`` is ``unified_cache/unified_tree_core.py``,
``full``/``swa``/``mamba``/``base`` are ``unified_cache/components/*.py``, and
``cache`` is ``unified_radix_cache.py``.

The FULL-only tree (``sim/tree.py``) is separate and untouched: it is the hot path of
every FULL simulation, and it models the host tier, which this tree does not yet.

Keys are lists of units (one unit per page, as in ``sim/tree.py``); token counts are
``units * page_size``. Every FULL value is on device here (no host tier, so FULL is
never tombstoned), and every node's slot counts stand in for SGLang's tensors:

* FULL: ``len(key) * page_size`` device tokens on every node;
* SWA: the same count when ``aux`` is set (the node's SWA value), none when it is a
  tombstone;
* Mamba: one state slot when ``aux`` is set.

Public operations return one result object each (``HybridMatch``, ``HybridInsert``,
``HybridEviction``, ``LockReceipt``), as the FULL tree's do.
"""

from __future__ import annotations

import copy
import heapq

from sim import constants as C


class HybridTreeError(Exception):
    """An operation the tree refuses; ``code`` is the op-trace error code."""

    def __init__(self, code: str):
        super().__init__(code)
        self.code = code


class HybridInvariantError(AssertionError):
    """``check()`` found a broken invariant."""


class HNode:
    """A radix node: FULL on device always; the auxiliary component's value maybe.

    ``lock``: FULL ``lock_ref``; ``aux``/``aux_lock``: the auxiliary component's value
    present / ``lock_ref``; ``uuid``: SWA's window-lock boundary mark
    (``metadata["uuid"]``); ``lp``/``ln``: links in the auxiliary device LRU list
    (``lru_prev``/``lru_next``), ``lp is None`` when not in it."""

    __slots__ = ("id", "parent", "children", "key", "lock", "aux", "aux_lock", "uuid",
                 "last_access", "creation", "lp", "ln")

    def __init__(self, nid: int, key: list, parent, t_access: float, t_create: float):
        self.id = nid
        self.parent = parent
        self.children: dict = {}
        self.key = key
        self.lock = 0
        self.aux = False
        self.aux_lock = 0
        self.uuid = None
        self.last_access = t_access
        self.creation = t_create
        self.lp = None
        self.ln = None

    def __repr__(self) -> str:
        return f"HNode({self.id}, {len(self.key)}p{', aux' if self.aux else ''})"


# ---------------------------------------------------------------- op results


class HybridMatch:
    """``match_prefix``'s result. ``device_len``: tokens up to ``best`` (the deepest
    node every component's validator accepts); ``full_len``: tokens the FULL walk
    matched (``full_kv_hit_length``); ``branch``: the component's branching seqlen
    (``swa_branching_seqlen`` / ``mamba_branching_seqlen``) or None."""

    __slots__ = ("device_len", "full_len", "best", "branch")

    def __init__(self, device_len, full_len, best, branch):
        self.device_len = device_len
        self.full_len = full_len
        self.best = best
        self.branch = branch


class HybridInsert:
    """``insert``'s result: ``prefix_len`` tokens reused, ``new`` fresh FULL tokens
    the request brought, ``aux_new`` fresh SWA tokens (SWA) or 1 (Mamba),
    ``mamba_exist`` (Mamba: the tree already had a state at the target, so the
    request's fork is freed), ``node`` the target node."""

    __slots__ = ("prefix_len", "new", "aux_new", "mamba_exist", "node")

    def __init__(self):
        self.prefix_len = 0
        self.new = 0
        self.aux_new = 0
        self.mamba_exist = False
        self.node = None


class HybridEviction:
    """What ``evict`` freed, per component: FULL tokens, and SWA tokens or Mamba
    states (``aux``); cascades count toward each component's own total."""

    __slots__ = ("full", "aux")

    def __init__(self):
        self.full = 0
        self.aux = 0


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


class _LRU:
    """``UnifiedLRUList`` without sessions: head (MRU) ... tail (LRU) sentinels."""

    __slots__ = ("head", "tail")

    def __init__(self):
        self.head = HNode(-1, [], None, 0.0, 0.0)
        self.tail = HNode(-2, [], None, 0.0, 0.0)
        self.head.ln = self.tail
        self.tail.lp = self.head

    @staticmethod
    def add_after(prev: HNode, node: HNode) -> None:
        nxt = prev.ln
        node.lp = prev
        node.ln = nxt
        nxt.lp = node
        prev.ln = node

    @staticmethod
    def remove(node: HNode) -> None:
        p, n = node.lp, node.ln
        p.ln = n
        n.lp = p
        node.lp = node.ln = None

    def insert_mru(self, node: HNode) -> None:
        assert node.lp is None
        self.add_after(self.head, node)

    def reset_mru(self, node: HNode) -> None:
        self.remove(node)
        self.add_after(self.head, node)

    def prev_no_lock(self, node: HNode):
        """``get_prev_no_lock``: the next older entry whose ``lock_ref`` is 0."""
        x = node.lp
        while x.aux_lock > 0:
            x = x.lp
        return None if x is self.head else x

    def lru_no_lock(self):
        return self.prev_no_lock(self.tail)

    def order(self) -> list:
        out, x = [], self.head.ln
        while x is not self.tail:
            out.append(x)
            x = x.ln
        return out


class HybridTree:
    """The unified tree with components ``("full", AUX)``; see the module docstring.

    Subclasses set ``AUX`` and implement the ``_aux_*`` hooks. ``record=True`` keeps
    an event list (``rec``) per op, for op-trace replay."""

    AUX = ""
    # base.py eviction_priority: internal nodes full=2 > swa=1 > mamba=0; leaves all 0.
    AUX_PRIORITY = 0

    def __init__(self, *, device_capacity: int, aux_capacity: int, page_size: int = 1,
                 record: bool = False):
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        # _cascade_evict from an internal auxiliary victim reaches only components of
        # lower or equal internal priority: none here, FULL's being higher. The walks
        # below rely on that (a three-component tree would need the cascade).
        assert C.EVICTION_PRIORITY_INTERNAL["full"] > self.AUX_PRIORITY
        self.page_size = page_size
        self.device_capacity = device_capacity
        self.aux_capacity = aux_capacity
        self._clock = C.CLOCK_START
        self._next_id = 0
        self.root = self._new_node([], None)
        # reset(): root lock_ref 1 for every component; never a leaf, never evicted.
        self.root.lock = 1
        self.root.aux_lock = 1
        # reset() then builds a device and a host UnifiedLRUList per component, each
        # with a head and a tail sentinel node: clock draws, no tree ids (the op-trace
        # numbering moves sentinels out of the id space, as oracle.py does).
        for _ in range(C.SENTINEL_IDS_PER_COMPONENT * 2):
            self._tick()
            self._tick()
        self.lru = _LRU()
        self.d_leaves: set = set()
        self.dev_used = 0          # FULL device tokens (all tree-held)
        self.aux_used = 0          # SWA tokens / Mamba states held by the tree
        self.evictable = 0         # component_evictable_size_[FULL]
        self.protected = 0
        self.aux_evictable = 0     # component_evictable_size_[AUX]
        self.aux_protected = 0
        self.n_nodes = 0
        self.rec: list | None = [] if record else None

    # ------------------------------------------------------------------ basics
    def _tick(self) -> float:
        t = self._clock
        self._clock = t + 1.0
        return t

    def _new_node(self, key: list, parent) -> HNode:
        # UnifiedTreeNode.__init__ draws last_access_time, then creation_time.
        nid = self._next_id
        self._next_id = nid + 1
        t = self._tick()
        return HNode(nid, key, parent, t, self._tick())

    def _ev(self, kind: str, node: HNode, **extra) -> None:
        self.rec.append((kind, node, extra))

    def tokens(self, node: HNode) -> int:
        return len(node.key) * self.page_size

    def path_units(self, node: HNode) -> list:
        parts = []
        while node is not None and node.parent is not None:
            parts.append(node.key)
            node = node.parent
        out = []
        for part in reversed(parts):
            out.extend(part)
        return out

    def aux_value_len(self, node: HNode) -> int:
        """``value_len`` of the auxiliary component (0 for a tombstone)."""
        raise NotImplementedError

    def _is_dleaf(self, node: HNode) -> bool:
        """core ``_is_device_leaf``: not root, FULL on device (always here), no lock on
        any component, no child with FULL on device (here: no child)."""
        return (node.lock == 0 and node.aux_lock == 0 and not node.children
                and node is not self.root)

    def _refresh(self, node: HNode) -> None:
        """core ``_update_evictable_leaf_sets`` (the device half)."""
        if self._is_dleaf(node):
            self.d_leaves.add(node)
        else:
            self.d_leaves.discard(node)

    # -------------------------------------------------- auxiliary value ledger
    def _aux_set(self, node: HNode, n: int) -> None:
        """core ``set_component_device_value``: store the value, MRU in the LRU,
        credited to protected when the node is locked, else evictable."""
        node.aux = True
        self.lru.insert_mru(node)
        self.aux_used += n
        if node.aux_lock > 0:
            self.aux_protected += n
        else:
            self.aux_evictable += n
        if self.rec is not None:
            self._ev("set", node, c=self.AUX, n=n)

    def _aux_tomb(self, node: HNode, event: bool = True) -> int:
        """``evict_component(DEVICE)`` of the auxiliary component plus
        ``_evict_component_and_detach_lru``: free the value, debit evictable, leave
        the LRU. Returns the freed count."""
        n = self.aux_value_len(node)
        node.aux = False
        self.aux_evictable -= n
        self.aux_used -= n
        self.lru.remove(node)
        if event and self.rec is not None:
            self._ev("tomb", node, c=self.AUX, n=n)
        return n

    # ------------------------------------------------------------------ walks
    @staticmethod
    def _common(key: list, pos: int, nkey: list) -> int:
        n = len(nkey)
        if key[pos:pos + n] == nkey:
            return n
        i, lim = 0, min(n, len(key) - pos)
        while i < lim and key[pos + i] == nkey[i]:
            i += 1
        return i

    def _split(self, child: HNode, p: int) -> HNode:
        """core ``_split_node(child, p units)``: the new upper fragment takes a new id
        and becomes the parent; the original keeps its id and its lower key."""
        parent = child.parent
        up = self._new_node(child.key[:p], parent)
        up.creation = child.creation
        # full.py redistribute_on_node_split: the parent copies lock_ref.
        up.lock = child.lock
        parent.children[child.key[0]] = up
        child.key = child.key[p:]
        child.parent = up
        up.children[child.key[0]] = child
        self._aux_split(up, child)
        # _for_each_component_lru(insert_after(child, new), skip_existing=True)
        if up.aux and up.lp is None:
            _LRU.add_after(child, up)
        child.last_access = self._tick()
        self.n_nodes += 1
        self._refresh(up)
        self._refresh(child)
        if self.rec is not None:
            self._ev("split", up, child=child.id, n=len(up.key) * self.page_size)
        return up

    def _aux_split(self, up: HNode, child: HNode) -> None:
        """The auxiliary component's ``redistribute_on_node_split``."""
        raise NotImplementedError

    def device_prefix_len(self, key: list) -> int:
        """Units of ``key`` in the tree (all on device); a read that changes nothing."""
        node, pos, n = self.root, 0, len(key)
        while pos < n:
            child = node.children.get(key[pos])
            if child is None:
                break
            p = self._common(key, pos, child.key)
            pos += p
            if p < len(child.key):
                break
            node = child
        return pos

    def _at_boundary(self, key: list, units: int) -> bool:
        """Whether the tree holds ``key[:units]`` as whole nodes (a reused prefix
        ends where its match ended, at a node boundary: docs/HYBRID.md §6)."""
        node, pos = self.root, 0
        while pos < units:
            child = node.children.get(key[pos])
            if child is None:
                return False
            k = len(child.key)
            if pos + k > units or key[pos:pos + k] != child.key:
                return False
            pos += k
            node = child
        return True

    # ------------------------------------------------------------------ match
    def match_prefix(self, key: list) -> HybridMatch:
        """core ``match_prefix`` / ``_match_prefix_helper`` / ``_match_post_processor``
        (device only: ``match_device_only`` validators)."""
        if not key:
            return HybridMatch(0, 0, self.root, None)
        ps = self.page_size
        node, pos, n = self.root, 0, len(key)
        best, best_units = self.root, 0
        valid = self._aux_validator()
        while pos < n:
            child = node.children.get(key[pos])
            if child is None:
                break
            p = self._common(key, pos, child.key)
            if p < len(child.key):
                node = self._split(child, p)
                pos += p
                # FULL's validator holds (FULL on device); every validator runs.
                if valid(node):
                    best, best_units = node, pos
                break
            pos += p
            node = child
            if valid(node):
                best, best_units = node, pos
        self._aux_match_end(best)
        t = self._tick()
        x = best
        while x is not None:
            x.last_access = t
            t -= C.MATCH_ANCESTOR_STEP
            x = x.parent
        device_len = best_units * ps
        full_len = pos * ps
        return HybridMatch(device_len, full_len, best, self._aux_branch(device_len, full_len))

    def _aux_validator(self):
        raise NotImplementedError

    def _aux_match_end(self, best: HNode) -> None:
        raise NotImplementedError

    def _aux_branch(self, device_len: int, full_len: int):
        raise NotImplementedError

    # ------------------------------------------------------------------ insert
    def insert(self, key: list, prev: int = 0, **aux_args) -> HybridInsert:
        """``checkpoint``'s insert: the request holds fresh KV past ``prev`` tokens
        (core ``begin_insert`` / ``_insert_walk_step`` / ``_insert_overlap_step`` /
        ``_insert_commit_step`` / ``_insert_tail_step``)."""
        ps = self.page_size
        n_tok = len(key) * ps
        if prev % ps or prev > n_tok or not self._at_boundary(key, prev // ps):
            raise HybridTreeError("bad_prev")
        res = HybridInsert()
        res.new = n_tok - prev
        if res.new > self.device_capacity - self.dev_used:
            raise HybridTreeError("device_full")
        self._aux_prepare(key, prev, res, aux_args)
        self._tick()  # _touch_node(root)
        if not key:
            res.node = self.root
            res.mamba_exist = True
            self._aux_empty_insert(res)
            return res
        node, pos, n = self.root, 0, len(key)
        while pos < n:
            child = node.children.get(key[pos])
            if child is None:
                break
            child.last_access = self._tick()  # _touch_node
            p = self._common(key, pos, child.key)
            if p < len(child.key):
                child = self._split(child, p)
            self._aux_overlap(child, p * ps, pos * ps, prev, aux_args)
            node = child
            pos += p
        res.prefix_len = pos * ps
        if pos < n:
            leaf = self._new_node(key[pos:], node)
            node.children[key[pos]] = leaf
            t = (n - pos) * ps
            self.dev_used += t
            self.evictable += t
            self.n_nodes += 1
            self._refresh(leaf)
            self._refresh(node)
            if self.rec is not None:
                self._ev("new", leaf, n=t)
            res.node = leaf
            self._aux_commit(leaf, True, res, aux_args)
        else:
            res.node = node
            self._aux_commit(node, False, res, aux_args)
        if res.node is not self.root:
            self._aux_insert_end(res.node)
        return res

    def _aux_prepare(self, key, prev, res, aux_args) -> None:
        raise NotImplementedError

    def _aux_empty_insert(self, res) -> None:
        raise NotImplementedError

    def _aux_overlap(self, node, m_tok, start_tok, prev, aux_args) -> None:
        pass

    def _aux_commit(self, node, is_new_leaf, res, aux_args) -> None:
        raise NotImplementedError

    def _aux_insert_end(self, node) -> None:
        pass

    # ------------------------------------------------------------------ locks
    def inc_lock(self, node: HNode, skip_aux: bool = False) -> LockReceipt:
        """core ``inc_lock_ref``: FULL's path lock, then the auxiliary lock unless
        ``skip_aux`` (``skip_lock_components``: the Mamba-less decode hold)."""
        cur = node
        root = self.root
        while cur is not root:  # full.py acquire_component_lock
            if cur.lock == 0:
                t = len(cur.key) * self.page_size
                self.evictable -= t
                self.protected += t
            cur.lock += 1
            self.d_leaves.discard(cur)
            cur = cur.parent
        receipt = LockReceipt(node, None if skip_aux else self._aux_acquire(node), skip_aux)
        self._refresh(node)
        return receipt

    def dec_lock(self, receipt: LockReceipt) -> None:
        """core ``dec_lock_ref``: auxiliary release first (``_release_components``
        walks the components in reverse), then FULL's path unlock."""
        node = receipt.node
        if not (receipt.swa_released or receipt.skip_aux):
            self._aux_release(node, receipt.uuid)
        cur, root = node, self.root
        while cur is not root:  # full.py release_component_lock
            if cur.lock <= 0:
                raise HybridInvariantError(f"FULL release hit lock_ref=0 on node {cur.id}")
            if cur.lock == 1:
                t = len(cur.key) * self.page_size
                self.evictable += t
                self.protected -= t
            cur.lock -= 1
            if cur.lock == 0:
                self._refresh(cur)
            cur = cur.parent
        self._refresh(node)

    def _aux_acquire(self, node):
        raise NotImplementedError

    def _aux_release(self, node, uuid) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ eviction
    def evict(self, full: int = 0, aux: int = 0) -> HybridEviction:
        """cache ``evict`` -> ``_evict_components`` (no availability targets): each
        component in tree order walks its own victims until its running total, which
        includes what earlier cascades freed, reaches its request."""
        res = HybridEviction()
        if res.full < full:
            self._evict_full(full, res)
        if res.aux < aux:
            self._evict_aux(aux, res)
        return res

    def _evict_full(self, request: int, res: HybridEviction) -> None:
        """full.py ``_evict_device_start`` / ``_evict_device_next_node``: a heap of the
        device leaves by ``last_access_time`` (the ``lru`` strategy); a deleted leaf's
        parent joins when it becomes a leaf."""
        heap = [(n.last_access, n.id, n) for n in self.d_leaves]
        heapq.heapify(heap)
        d_leaves = self.d_leaves
        last = None
        while True:
            if last is not None and last.parent is not None and last.parent in d_leaves:
                p = last.parent
                heapq.heappush(heap, (p.last_access, p.id, p))
            last = None
            x = None
            while res.full < request and heap:
                _, _, cand = heapq.heappop(heap)
                if cand in d_leaves:
                    x = cand
                    break
            if x is None:
                return
            last = x
            self._delete_leaf(x, res)

    def _evict_aux(self, request: int, res: HybridEviction) -> None:
        """swa.py / mamba.py ``_evict_device_next_node`` (no sessions, no HiCache):
        walk the component's LRU from the tail skipping locked entries; a device leaf
        is deleted whole (core ``evict_device_leaf``), any other node loses only this
        component's value (a tombstone) and cascades to lower priorities (none in a
        two-component tree)."""
        lru = self.lru
        cursor = lru.lru_no_lock()
        d_leaves = self.d_leaves
        while True:
            if cursor is not None and cursor.lp is None:
                cursor = lru.lru_no_lock()
            if res.aux >= request or cursor is None:
                return
            x = cursor
            cursor = lru.prev_no_lock(x)
            if x in d_leaves:
                self._delete_leaf(x, res)
            else:
                res.aux += self._aux_tomb(x)
                self._refresh(x)

    def _delete_leaf(self, x: HNode, res: HybridEviction) -> None:
        """core ``_delete_unbacked_device_leaf``: ``_release_all_component_layers``
        (FULL's and the auxiliary value freed, each counted toward its own total),
        unlink, refresh the parent; ``_iteratively_delete_tombstone_ancestors`` stops
        at once since the parent's FULL is on device."""
        t = len(x.key) * self.page_size
        res.full += t
        self.evictable -= t
        self.dev_used -= t
        if x.aux:
            res.aux += self._aux_tomb(x, event=False)
        self.d_leaves.discard(x)
        parent = x.parent
        if self.rec is not None:
            self._ev("delete", x, n=t)
        del parent.children[x.key[0]]  # x.parent stays: the FULL walk reads it next
        self.n_nodes -= 1
        self._refresh(parent)

    # ------------------------------------------------------------------ replicas
    def clone(self) -> "HybridTree":
        """An independent copy (the engine forks a diverging rank off with this):
        nodes, LRU order, leaf set, counters and clock. Iterative, so deep chains do
        not hit the recursion limit. Receipts held outside move with ``receipt_in``."""
        new = copy.copy(self)
        nmap = {}
        stack = [self.root]
        while stack:
            x = stack.pop()
            y = copy.copy(x)
            y.lp = y.ln = None
            nmap[id(x)] = y
            stack.extend(x.children.values())
        for y in nmap.values():
            if y.parent is not None:
                y.parent = nmap[id(y.parent)]
            y.children = {k: nmap[id(c)] for k, c in y.children.items()}
        new.root = nmap[id(self.root)]
        new.lru = _LRU()
        prev = new.lru.head
        for x in self.lru.order():
            _LRU.add_after(prev, nmap[id(x)])
            prev = nmap[id(x)]
        new.d_leaves = {nmap[id(x)] for x in self.d_leaves}
        new.rec = None if self.rec is None else []
        return new

    def receipt_in(self, receipt: LockReceipt) -> LockReceipt:
        """The same lock, anchored at this tree's node with the receipt's node id
        (a receipt taken on the tree this one was cloned from)."""
        nid = receipt.node.id
        node = self.root if nid == self.root.id else next(
            (n for n in self.iter_nodes() if n.id == nid), None)
        if node is None:
            raise HybridTreeError("unknown_node")
        out = LockReceipt(node, receipt.uuid, receipt.skip_aux)
        out.swa_released = receipt.swa_released
        return out

    def fingerprint(self) -> tuple:
        """A structural summary two replicas agree on iff their logical states match
        (ids excluded, as the FULL tree's ``fingerprint``)."""
        out = []
        stack = [self.root]
        while stack:
            x = stack.pop()
            if x is not self.root:
                out.append((tuple(self.path_units(x)), x.aux, x.lock, x.aux_lock))
            stack.extend(sorted(x.children.values(), key=lambda c: c.key[0], reverse=True))
        return (self.dev_used, self.aux_used, tuple(out))

    # ------------------------------------------------------------------ views
    def iter_nodes(self):
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def check(self) -> None:
        """Every invariant SGLang's ``sanity_check`` and the pools would check here:
        ledgers against the nodes, the leaf set against its predicate, the LRU list
        against the nodes holding a value, and lock coverage."""
        ps = self.page_size
        dev = aux = ev = pr = aev = apr = cnt = 0
        in_tree = set()
        for n in self.iter_nodes():
            cnt += 1
            in_tree.add(n)
            t = len(n.key) * ps
            if not n.key:
                raise HybridInvariantError(f"node {n.id}: empty key")
            if n.parent.children.get(n.key[0]) is not n:
                raise HybridInvariantError(f"node {n.id}: not its parent's child")
            dev += t
            if n.lock > 0:
                pr += t
            else:
                ev += t
            if n.lock < 0 or n.aux_lock < 0:
                raise HybridInvariantError(f"node {n.id}: negative lock")
            if n.parent is not self.root and n.lock > n.parent.lock:
                raise HybridInvariantError(f"node {n.id}: FULL lock above its parent's")
            if n.aux:
                v = self.aux_value_len(n)
                aux += v
                if n.aux_lock > 0:
                    apr += v
                else:
                    aev += v
                if n.lp is None:
                    raise HybridInvariantError(f"node {n.id}: {self.AUX} value not in its LRU")
            elif n.lp is not None:
                raise HybridInvariantError(f"node {n.id}: {self.AUX} tombstone in its LRU")
            if (n in self.d_leaves) != self._is_dleaf(n):
                raise HybridInvariantError(f"node {n.id}: device leaf set disagrees")
        order = self.lru.order()
        if len(order) != len(set(order)) or not set(order) <= in_tree:
            raise HybridInvariantError(f"{self.AUX} LRU holds a node twice or a dead node")
        if not self.d_leaves <= in_tree:
            raise HybridInvariantError("device leaf set holds a dead node")
        got = (dev, aux, ev, pr, aev, apr, cnt)
        want = (self.dev_used, self.aux_used, self.evictable, self.protected,
                self.aux_evictable, self.aux_protected, self.n_nodes)
        if got != want:
            raise HybridInvariantError(f"ledgers (dev, aux, evictable, protected, "
                                       f"aux_evictable, aux_protected, nodes): tree {got}, "
                                       f"counters {want}")
        if dev > self.device_capacity or aux > self.aux_capacity:
            raise HybridInvariantError("a pool is over capacity")
        self._aux_check()

    def _aux_check(self) -> None:
        pass
