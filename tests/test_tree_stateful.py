"""Random operation sequences keep every invariant (hypothesis stateful testing).

Acks are delayed across operations, as in the engine: write-through backups and
load-backs stay in flight while other operations split, lock and evict around them.
A failure shrinks to a minimal operation sequence.
"""

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sim.tree import Tree, TreeError

ALPHABET = st.integers(1, 4)


class TreeMachine(RuleBasedStateMachine):
    page_size = 1

    @initialize(policy=st.sampled_from(["write_back", "write_through"]),
                host_policy=st.sampled_from(["duplicate_first", "lru", "duplicate_first_single_pass",
                                             "duplicate_first_by_id"]),
                dev_pages=st.integers(4, 24), host_pages=st.integers(1, 16))
    def setup(self, policy, host_policy, dev_pages, host_pages):
        ps = self.page_size
        self.tree = Tree(device_capacity=dev_pages * ps, host_capacity=host_pages * ps,
                         page_size=ps, write_policy=policy, host_policy=host_policy,
                         load_back_threshold=1)
        self.locks = []
        self.loads = []
        self.serial = 0

    def units(self, pages):
        ps = self.page_size
        return pages if ps == 1 else [(p,) * ps for p in pages]

    @rule(pages=st.lists(ALPHABET, min_size=0, max_size=8))
    def insert(self, pages):
        key = self.units(pages)
        t = self.tree
        need = (len(key) - t.device_prefix_len(key)) * self.page_size
        t.evict_device(need - (t.device_capacity - t.dev_used))
        # the eviction may have taken the key's own (unlocked) prefix
        need = (len(key) - t.device_prefix_len(key)) * self.page_size
        try:
            res = t.insert(key)
        except TreeError:
            return
        assert res.new_device_tokens == need and res.prefix_tokens <= len(key) * self.page_size

    @rule(pages=st.lists(ALPHABET, min_size=1, max_size=8))
    def match(self, pages):
        m = self.tree.match_prefix(self.units(pages))
        assert m.device_len + m.host_len <= len(pages) * self.page_size

    @rule(pages=st.lists(ALPHABET, min_size=1, max_size=8))
    def lock(self, pages):
        node = self.tree.match_prefix(self.units(pages)).last_device
        self.tree.inc_lock(node)
        self.locks.append(node)

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 100))
    def unlock(self, i):
        self.tree.dec_lock(self.locks.pop(i % len(self.locks)))

    @rule(n=st.integers(1, 40))
    def evict_device(self, n):
        before = self.tree.dev_used
        res = self.tree.evict_device(n)
        assert before - self.tree.dev_used == res.freed == res.demoted + res.deleted + res.dropped

    @rule(n=st.integers(1, 40))
    def evict_host(self, n):
        self.tree.evict_host(n)

    @rule(pages=st.lists(ALPHABET, min_size=1, max_size=8))
    def load_back(self, pages):
        self.serial += 1
        m = self.tree.match_prefix(self.units(pages))
        res = self.tree.load_back(m, self.serial)
        if res.ok:
            self.loads.append(self.serial)

    @precondition(lambda self: self.loads)
    @rule()
    def load_ack(self):
        self.tree.finish_load_back(self.loads.pop(0))

    @precondition(lambda self: self.tree.pending_writes)
    @rule()
    def write_ack(self):
        self.tree.finish_write_through(next(iter(self.tree.pending_writes)))

    @invariant()
    def consistent(self):
        if hasattr(self, "tree"):
            self.tree.check()


class TreeMachinePage16(TreeMachine):
    page_size = 16


TestTreePage1 = TreeMachine.TestCase
TestTreePage1.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
TestTreePage16 = TreeMachinePage16.TestCase
TestTreePage16.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)


# ---------------------------------------------------------------- hybrid trees
# The same machine for the component pairs of docs/HYBRID.md: (FULL, SWA) and
# (FULL, MAMBA) trees, with check() after every op.

from sim.hybrid import HybridTreeError, MambaTree, SWATree  # noqa: E402


class HybridMachine(RuleBasedStateMachine):
    kind = "swa"
    page_size = 1

    @initialize(dev_pages=st.integers(4, 40), aux=st.integers(1, 24),
                window=st.integers(1, 10), chunk=st.integers(1, 6),
                max_states=st.sampled_from([-1, 1, 2, 3]))
    def setup(self, dev_pages, aux, window, chunk, max_states):
        ps = self.page_size
        if self.kind == "swa":
            self.tree = SWATree(device_capacity=dev_pages * ps, swa_capacity=aux * ps,
                                sliding_window=window, page_size=ps)
        else:
            self.tree = MambaTree(device_capacity=dev_pages * ps, mamba_capacity=aux,
                                  mamba_chunk=chunk, max_states=max_states, page_size=ps,
                                  extra_buffer=ps > 1)
        self.locks = []
        self.held = 0  # Mamba: requests holding their own state (copy on write)

    def units(self, pages):
        ps = self.page_size
        return pages if ps == 1 else [(p,) * ps for p in pages]

    @rule(pages=st.lists(ALPHABET, min_size=0, max_size=10), reuse=st.booleans(),
          evicted=st.integers(0, 10), donate=st.booleans())
    def insert(self, pages, reuse, evicted, donate):
        t, ps = self.tree, self.page_size
        key = self.units(pages)
        prev = t.match_prefix(key).device_len if reuse else 0
        args = {"swa_evicted": evicted * ps} if self.kind == "swa" else {}
        if self.kind == "mamba" and donate and self.held:
            args = {"donated": True}
        before = (t.dev_used, t.aux_used)
        try:
            res = t.insert(key, prev, **args)
        except HybridTreeError as err:
            assert err.code in ("device_full", "swa_full", "mamba_full")
            assert (t.dev_used, t.aux_used) == before
            return
        assert res.new == len(key) * ps - prev
        assert res.prefix_len >= prev
        if args.get("donated"):
            self.held -= 1
            assert t.held == self.held
        # everything the request brought is the tree's or freed: the tree grew by at
        # most what was new
        assert t.dev_used - before[0] <= res.new and t.aux_used - before[1] <= res.aux_new

    @rule(pages=st.lists(ALPHABET, min_size=1, max_size=10))
    def match(self, pages):
        m = self.tree.match_prefix(self.units(pages))
        assert m.device_len <= m.full_len <= len(pages) * self.page_size
        assert m.branch is None or m.device_len < m.branch <= m.full_len

    @rule(pages=st.lists(ALPHABET, min_size=1, max_size=10), skip=st.booleans())
    def lock(self, pages, skip):
        m = self.tree.match_prefix(self.units(pages))
        # Mamba: the decode hold may leave the state unlocked (skip_lock_components)
        self.locks.append(self.tree.inc_lock(m.best, skip_aux=skip and self.kind == "mamba"))

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 100))
    def unlock(self, i):
        self.tree.dec_lock(self.locks.pop(i % len(self.locks)))

    @precondition(lambda self: self.kind == "mamba")
    @rule(pages=st.lists(ALPHABET, min_size=1, max_size=10), holds=st.booleans())
    def copy_on_write(self, pages, holds):
        t = self.tree
        holds = holds and self.held > 0
        key = self.units(pages)
        if t.cow_would_fail(key, holds):
            return
        m = t.match_prefix(key)
        if t.cow(m, holds).copied and not holds:
            self.held += 1
        assert t.held == self.held

    @precondition(lambda self: self.kind == "mamba" and self.held)
    @rule()
    def release(self):
        self.tree.release()
        self.held -= 1

    @precondition(lambda self: self.kind == "swa" and any(not r.swa_released for r in self.locks))
    @rule(i=st.integers(0, 100))
    def release_swa(self, i):
        live = [r for r in self.locks if not r.swa_released]
        self.tree.release_swa(live[i % len(live)])

    @rule(full=st.integers(0, 40), aux=st.integers(0, 20))
    def evict(self, full, aux):
        t = self.tree
        before = (t.dev_used, t.aux_used)
        res = t.evict(full, aux)
        assert before[0] - t.dev_used == res.freed and before[1] - t.aux_used == res.aux
        # a walk stops only when its request is met or nothing is left to take
        if res.freed < full:
            assert not t.d_leaves
        if res.aux < aux:
            assert t.lru.lru_no_lock() is None

    @invariant()
    def consistent(self):
        if hasattr(self, "tree"):
            self.tree.check()


class SWAMachinePage2(HybridMachine):
    page_size = 2


class MambaMachine(HybridMachine):
    kind = "mamba"


class MambaMachinePage2(MambaMachine):
    page_size = 2


class MambaHostMachine(MambaMachine):
    """(FULL, MAMBA) with the host tier under each write policy: backups (write_back's
    at eviction, write_through's at insert with their acks in flight), demotes,
    deletes of unbacked leaves, host eviction of either component, duplicate
    reclaim, load-backs and their acks, on small host pools, with check() (both
    tiers, pending writes) after every op."""

    @initialize(dev_pages=st.integers(4, 40), aux=st.integers(1, 12), chunk=st.integers(1, 6),
                max_states=st.sampled_from([-1, -1, 1, 2]), host_pages=st.integers(0, 60),
                aux_host=st.sampled_from([0, 1, 2, 4, 8, 12]), threshold=st.sampled_from([1, 3]),
                policy=st.sampled_from(["write_back", "write_through",
                                        "write_through_selective"]))
    def setup(self, dev_pages, aux, chunk, max_states, host_pages, aux_host, threshold,
              policy):
        ps = self.page_size
        self.tree = MambaTree(device_capacity=dev_pages * ps, mamba_capacity=aux,
                              mamba_chunk=chunk, max_states=max_states, page_size=ps,
                              extra_buffer=ps > 1, host_capacity=host_pages * ps,
                              mamba_host_capacity=aux_host, load_back_threshold=threshold,
                              write_policy=policy)
        self.locks = []
        self.held = 0
        self.loads = []
        self.next_load = 0

    @rule(pages=st.lists(ALPHABET, min_size=1, max_size=10), skip=st.booleans())
    def lock(self, pages, skip):
        m = self.tree.match_prefix(self.units(pages))
        assert m.dnode.dev and m.device_len <= m.full_len
        self.locks.append(self.tree.inc_lock(m.dnode, skip_aux=skip))

    @rule(pages=st.lists(ALPHABET, min_size=1, max_size=10))
    def match(self, pages):
        t = self.tree
        m = t.match_prefix(self.units(pages))
        assert m.device_len <= m.full_len <= len(pages) * self.page_size
        assert m.aux_host_len == (1 if m.best.aux_host and not m.best.aux else 0)
        # the device anchor is on the best node's root path
        x = m.best
        while x is not m.dnode:
            assert x is not t.root
            x = x.parent

    @rule(n=st.integers(0, 40), full=st.booleans())
    def evict_host(self, n, full):
        t = self.tree
        before = (t.host_used, t.aux_host_used, t.dev_used)
        freed = t.evict_host(n, "full" if full else "mamba")
        assert t.dev_used == before[2]
        if full:
            assert before[0] - t.host_used == freed
        else:
            assert before[1] - t.aux_host_used == freed

    @rule(pages=st.lists(ALPHABET, min_size=1, max_size=10), with_req=st.booleans(),
          holds=st.booleans())
    def load_back(self, pages, with_req, holds):
        t = self.tree
        key = self.units(pages)
        holds = holds and self.held > 0
        if with_req and t.load_back_would_fail(key, holds):
            return
        m = t.match_prefix(key)
        lid = self.next_load
        self.next_load += 1
        out = t.load_back(m, lid, holds if with_req else None)
        if out.slot_granted:
            self.held += 1
        assert t.held == self.held
        if out.started:
            self.loads.append(lid)
            x = m.best
            while x is not t.root:  # the anchor's whole path is on device, locked
                assert x.dev and x.lock > 0
                x = x.parent
            assert not (m.best.aux_host and not m.best.aux)
        else:
            assert out.reason in ("no_host_tail", "below_threshold", "no_device_space",
                                     "no_mamba_space")
            assert lid not in t.loads

    @precondition(lambda self: self.loads)
    @rule(i=st.integers(0, 100))
    def load_ack(self, i):
        self.tree.finish_load_back(self.loads.pop(i % len(self.loads)))

    @precondition(lambda self: self.tree.writes)
    @rule(i=st.integers(0, 100))
    def write_ack_any(self, i):
        self.write_ack(i)

    def write_ack(self, i):
        t = self.tree
        ids = list(t.writes)
        ack = ids[i % len(ids)]
        nodes = t.writes[ack].nodes
        t.write_ack(ack)
        assert ack not in t.writes
        for y in nodes:  # acked: settled, and duplicates while on both tiers
            assert y.wp != ack and y.host
            if y.dev and y.lb is None and y.wp is None:
                assert t.dups.get(y.id) is y

    @precondition(lambda self: self.tree.writes)
    @rule()
    def write_ack_oldest(self):
        """SGLang's writing_check acks in issue order."""
        self.write_ack(0)

    @precondition(lambda self: self.tree.writes)
    @rule(n=st.integers(1, 4))
    def write_ack_several(self, n):
        for _ in range(min(n, len(self.tree.writes))):
            self.write_ack(0)

    @rule(pages=st.lists(ALPHABET, min_size=1, max_size=10))
    def insert_written_through(self, pages):
        """write_through: an insert's new leaf is written through with its state at
        once unless the host had no room (then neither tier holds it on host)."""
        t, ps = self.tree, self.page_size
        if t.write_policy != "write_through":
            return
        key = self.units(pages)
        try:
            res = t.insert(key, 0)
        except HybridTreeError:
            return
        leaf = res.node
        if leaf is not t.root and res.prefix_len < len(key) * ps:
            if leaf.host:
                assert leaf.wp == leaf.id and leaf.lock > 0 and leaf.aux_host
            else:
                assert not leaf.aux_host and leaf.wp is None

    @rule(full=st.integers(0, 40), aux=st.integers(0, 20))
    def evict(self, full, aux):
        t = self.tree
        before = (t.dev_used, t.aux_used)
        res = t.evict(full, aux)
        assert before[0] - t.dev_used == res.freed and before[1] - t.aux_used == res.aux


class MambaHostMachinePage2(MambaHostMachine):
    page_size = 2


class SWAHostMachine(HybridMachine):
    """(FULL, SWA) with the host tier (write_back): window backups at eviction (leaf
    and internal victims), demotes, drops, host eviction of either component,
    duplicate reclaim, window load-backs and their acks, on small host pools, with
    check() (both tiers, the SWA host LRU and host locks) after every op."""

    @initialize(dev_pages=st.integers(4, 40), aux=st.integers(1, 24),
                window=st.integers(1, 10), host_pages=st.integers(0, 60),
                aux_host=st.integers(0, 24), threshold=st.sampled_from([1, 3]),
                policy=st.sampled_from(["write_back", "write_back", "write_through",
                                        "write_through_selective"]))
    def setup(self, dev_pages, aux, window, host_pages, aux_host, threshold, policy):
        ps = self.page_size
        self.tree = SWATree(device_capacity=dev_pages * ps, swa_capacity=aux * ps,
                            sliding_window=window, page_size=ps,
                            host_capacity=host_pages * ps, swa_host_capacity=aux_host * ps,
                            load_back_threshold=threshold, write_policy=policy)
        self.locks = []
        self.held = 0
        self.loads = []
        self.next_load = 0

    @rule(pages=st.lists(ALPHABET, min_size=1, max_size=10))
    def lock(self, pages):
        m = self.tree.match_prefix(self.units(pages))
        assert m.dnode.dev and m.device_len <= m.full_len
        self.locks.append(self.tree.inc_lock(m.dnode))

    @rule(pages=st.lists(ALPHABET, min_size=1, max_size=10))
    def match(self, pages):
        t = self.tree
        m = t.match_prefix(self.units(pages))
        assert m.device_len <= m.full_len <= len(pages) * self.page_size
        # swa_host_hit_length counts host-only slices within one window of the
        # boundary: there is one there when it is positive
        if m.aux_host_len:
            x, covered, found = m.best, 0, False
            while x is not t.root and covered < t.window:
                found |= x.aux_host and not x.aux
                covered += len(x.key) * t.page_size
                x = x.parent
            assert found
        x = m.best
        while x is not m.dnode:
            assert x is not t.root
            x = x.parent

    @rule(n=st.integers(0, 40), full=st.booleans())
    def evict_host(self, n, full):
        t = self.tree
        before = (t.host_used, t.aux_host_used, t.dev_used)
        freed = t.evict_host(n, "full" if full else "swa")
        assert t.dev_used == before[2]
        if full:
            assert before[0] - t.host_used == freed
        else:
            assert before[1] - t.aux_host_used >= freed

    @rule(pages=st.lists(ALPHABET, min_size=1, max_size=10))
    def load_back(self, pages):
        t = self.tree
        m = t.match_prefix(self.units(pages))
        lid = self.next_load
        self.next_load += 1
        out = t.load_back(m, lid)
        if out.started:
            self.loads.append(lid)
            x = m.best
            while x is not t.root:  # the anchor's whole path is on device, locked
                assert x.dev and x.lock > 0
                x = x.parent
            # the window above the anchor holds device SWA (restored if host-only)
            x, covered = m.best, 0
            while x is not t.root and covered < t.window:
                assert x.aux
                covered += len(x.key) * t.page_size
                x = x.parent
        else:
            assert out.reason in ("no_host_tail", "below_threshold", "no_device_space",
                                     "no_swa_space")
            assert lid not in t.loads

    @precondition(lambda self: self.loads)
    @rule(i=st.integers(0, 100))
    def load_ack(self, i):
        self.tree.finish_load_back(self.loads.pop(i % len(self.loads)))

    @precondition(lambda self: self.tree.writes)
    @rule(i=st.integers(0, 100), oldest=st.booleans())
    def write_ack(self, i, oldest):
        """write_through: one backup acked (in issue order, or any): every slice it
        published is settled, a duplicate while on both tiers."""
        t = self.tree
        ids = list(t.writes)
        ack = ids[0 if oldest else i % len(ids)]
        nodes = t.writes[ack].nodes
        t.write_ack(ack)
        for y in nodes:
            assert y.wp != ack and y.host
            if y.dev and y.lb is None and y.wp is None:
                assert t.dups.get(y.id) is y

    @rule(full=st.integers(0, 40), aux=st.integers(0, 20))
    def evict(self, full, aux):
        t = self.tree
        before = (t.dev_used, t.aux_used)
        res = t.evict(full, aux)
        assert before[0] - t.dev_used == res.freed


class SWAHostMachinePage2(SWAHostMachine):
    page_size = 2


TestHybridSWAHost = SWAHostMachine.TestCase
TestHybridSWAHost.settings = settings(max_examples=80, stateful_step_count=50, deadline=None)
TestHybridSWAHostPage2 = SWAHostMachinePage2.TestCase
TestHybridSWAHostPage2.settings = settings(max_examples=30, stateful_step_count=50,
                                           deadline=None)
TestHybridMambaHost = MambaHostMachine.TestCase
TestHybridMambaHost.settings = settings(max_examples=80, stateful_step_count=50, deadline=None)
TestHybridMambaHostPage2 = MambaHostMachinePage2.TestCase
TestHybridMambaHostPage2.settings = settings(max_examples=30, stateful_step_count=50,
                                             deadline=None)
TestHybridSWA = HybridMachine.TestCase
TestHybridSWA.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestHybridSWAPage2 = SWAMachinePage2.TestCase
TestHybridSWAPage2.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)
TestHybridMamba = MambaMachine.TestCase
TestHybridMamba.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestHybridMambaPage2 = MambaMachinePage2.TestCase
TestHybridMambaPage2.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)
