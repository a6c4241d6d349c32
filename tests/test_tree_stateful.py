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
