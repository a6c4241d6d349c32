"""Schedule policies: the waiting queue's order before each prefill pass, as SGLang
0.5.23's `SchedulePolicy.calc_priority` (managers/schedule_policy.py) sets it.

* ``fcfs``: arrival order, untouched (no priority scheduling in the engine).
* ``lpm`` (longest prefix match, cache-aware): every waiting request is matched against
  the tree (`_compute_prefix_matches` -> `match_kv_cache`: recency, maybe a split),
  then sorted by the matched tokens, device plus host, longest first
  (`_sort_by_longest_prefix`, a stable sort). In-batch prefix caching: a request whose
  device match is at most IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD tokens is matched
  against a radix tree of the waiting requests seen before it in this pass; a match of
  IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD tokens or more sends it to the back,
  else its tokens are inserted there. Above WAITING_QUEUE_PREFIX_MATCH_MAX waiting
  requests lpm runs as fcfs (`_determine_active_policy`).
* ``dfs-weight`` (cache-aware): the same matches, then the requests in depth-first
  order of the tree, heavier subtrees first, where a node weighs the requests whose
  device match ends in its subtree (`_sort_by_dfs_weight` -> `_dfs_weight_order`,
  mem_cache/base_prefix_cache.py). No fallback for long queues.
* ``lof`` (longest output first): a stable sort by ``max_new_tokens``, largest first
  (`_sort_by_longest_output`). The engine's ``max_new_tokens`` is the trace's output
  length.
* ``random``: `random.shuffle` of the whole queue (`_sort_randomly`). SGLang shuffles
  with the process-global ``random`` module, seeded by `set_random_seed(random_seed)`
  in `Scheduler.__init__` (``--random-seed``, drawn by `random.randint(0, 1 << 30)` at
  launch when unset, serving_hook.py); every other user of that module in the
  scheduler process draws from the same stream. The engine shuffles with its own
  ``random.Random(scenario seed)``, one shuffle per prefill pass for the whole TP group
  (SGLang's ranks share the seed and draw alike); with nothing else drawing, its first
  shuffles are SGLang's after `random.seed(seed)`.

Cache-agnostic policies (fcfs, lof, random) match nothing here: neither tree core
reports `supports_fast_match_prefix`. They then run `_touch_waiting_prefixes`, which
cache-aware ones skip (they touch while matching).

The engine keeps one waiting queue per TP group; replicas whose trees have forked sort
it in turn, each from its own tree (SGLang's ranks each sort their own queue).
"""

from __future__ import annotations

import itertools
import random

from sim import constants as C


class SchedulePolicy:
    """One policy: ``cache_aware`` (matches the queue, no prefix touch) and its order."""

    name = ""
    sorts = True  # False: the queue keeps its order (nothing to copy)
    cache_aware = False
    long_queue_fcfs = False  # `_determine_active_policy`: fcfs above the match cap

    def order(self, reqs: list, matches: list | None, deprioritized: set | None,
              tree, rng: random.Random) -> list | None:
        """The new order of ``reqs`` (None: unchanged)."""
        return None


class Fcfs(SchedulePolicy):
    name = "fcfs"
    sorts = False


class LongestPrefixMatch(SchedulePolicy):
    name = "lpm"
    cache_aware = True
    long_queue_fcfs = True

    def order(self, reqs, matches, deprioritized, tree, rng):
        inf = float("inf")
        keyed = [(inf if i in deprioritized else -m[0], i) for i, m in enumerate(matches)]
        keyed.sort(key=lambda x: x[0])  # stable, as list.sort in SGLang
        return [reqs[i] for _, i in keyed]


class DfsWeight(SchedulePolicy):
    name = "dfs-weight"
    cache_aware = True

    def order(self, reqs, matches, deprioritized, tree, rng):
        return [reqs[i] for i in dfs_weight_order(tree.root, [m[1] for m in matches])]


class LongestOutputFirst(SchedulePolicy):
    name = "lof"

    def order(self, reqs, matches, deprioritized, tree, rng):
        return sorted(reqs, key=lambda rq: -rq.r.output_len)


class Random(SchedulePolicy):
    name = "random"

    def order(self, reqs, matches, deprioritized, tree, rng):
        out = list(reqs)
        rng.shuffle(out)
        return out


SCHEDULE_POLICIES = {p.name: p() for p in (Fcfs, LongestPrefixMatch, DfsWeight,
                                           LongestOutputFirst, Random)}


def dfs_weight_order(root, last_nodes: list) -> list[int]:
    """`_dfs_weight_order` (base_prefix_cache.py): request indices in depth-first order,
    children by subtree weight (heaviest first, ties in child order), a node's own
    requests after its subtree. Only the nodes on the requests' paths weigh anything, so
    the walk visits those alone (a zero-weight child holds no request and sorts last)."""
    at: dict[int, list[int]] = {}
    nodes: dict[int, object] = {}
    for i, node in enumerate(last_nodes):
        at.setdefault(id(node), []).append(i)
        nodes[id(node)] = node
    weight: dict[int, int] = {}
    for k, idx in at.items():
        node = nodes[k]
        while node is not None:
            weight[id(node)] = weight.get(id(node), 0) + len(idx)
            node = node.parent
    order: list[int] = []
    stack = [(root, False)]
    while stack:
        node, visited = stack.pop()
        if visited:
            order.extend(at.get(id(node), ()))
            continue
        kids = [ch for ch in node.children.values() if id(ch) in weight]
        kids.sort(key=lambda ch: -weight[id(ch)])
        stack.append((node, True))
        for ch in reversed(kids):
            stack.append((ch, False))
    return order


class WaitingTrie:
    """`waiting_queue_radix_tree` (a simulated RadixCache, reset every pass) over the
    engine's page units: a match counts whole pages."""

    __slots__ = ("root",)

    def __init__(self):
        self.root: dict = {}

    def match(self, key: list) -> int:
        node, n = self.root, 0
        for u in key:
            node = node.get(u)
            if node is None:
                break
            n += 1
        return n

    def insert(self, key: list) -> None:
        node = self.root
        for u in key:
            node = node.setdefault(u, {})


def prefix_matches(reqs: list, keys: list, tree, ps: int, on_match=None, matched=None):
    """`_compute_prefix_matches`: each request matched on ``tree`` (``on_match(key)``
    first, to record the op; ``matched(key, match)`` after, for the rank consensus
    checker's `match_prefix`), in queue order; returns ([(matched tokens, last device
    node)], the deprioritized indices). Matched tokens are `num_matched_prefix_tokens`:
    device plus host, at most the input less one token (`_compute_max_prefix_len`)."""
    trie = WaitingTrie()
    matches, low = [], set()
    for i, (rq, key) in enumerate(zip(reqs, keys)):
        if on_match is not None:
            on_match(key)
        m = tree.match_prefix(key)
        if matched is not None:
            matched(key, m)
        matches.append((min(m.device_len + m.host_len, max(rq.fill_len - 1, 0)), m.last_device))
        if m.device_len <= C.IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD:
            if trie.match(key) * ps >= C.IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
                low.add(i)
            else:
                trie.insert(key)
    return matches, low


class GroupShuffle:
    """`random`'s draws for one TP group: SGLang's ranks each seed `random` with the
    same `random_seed` (`set_random_seed`) and shuffle the same queue, so the group
    shuffles once per admission pass, from the scenario seed."""

    __slots__ = ("rng", "pass_no")

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.pass_no = None

    def take(self, pass_no: int):
        """The generator for pass ``pass_no``'s shuffle, or None once it has shuffled."""
        if pass_no == self.pass_no:
            return None
        self.pass_no = pass_no
        return self.rng


def calc_priority(sim, c) -> None:
    """`SchedulePolicy.calc_priority` on replica ``c`` of engine ``sim``: reorder the
    waiting queue in place, then `_touch_waiting_prefixes` for cache-agnostic policies."""
    waiting = sim.waiting
    if not waiting:
        return
    policy = SCHEDULE_POLICIES[sim.cfg.schedule_policy]
    if policy.long_queue_fcfs and len(waiting) > C.WAITING_QUEUE_PREFIX_MATCH_MAX:
        policy = SCHEDULE_POLICIES["fcfs"]
    tree, st = c.tree, c.sched
    if not policy.sorts:
        touch_waiting_prefixes(sim, c, st, tree)
        return
    reqs = list(waiting)
    matches = low = None
    if policy.cache_aware:
        keys = [sim._seq_key(rq, rq.fill_len) for rq in reqs]
        matches, low = prefix_matches(reqs, keys, tree, tree.page_size,
                                      lambda key: sim._op(c, {"op": "match", "key": key}),
                                      (lambda key, m: sim._consensus_match(c, key, m))
                                      if sim._rc else None)
    rng = None
    if isinstance(policy, Random):
        rng = sim.shuffle.take(sim.batch_no)
        if rng is None:
            policy = None  # this pass's queue is already shuffled (by another replica)
    new = policy.order(reqs, matches, low, tree, rng) if policy is not None else None
    if new is not None:
        waiting.clear()
        waiting.extend(new)
    if policy is not None and policy.cache_aware:
        return
    touch_waiting_prefixes(sim, c, st, tree)


def touch_waiting_prefixes(sim, c, st, tree) -> None:
    """`_touch_waiting_prefixes`: every WAITING_PREFIX_REFRESH_INTERVAL-th call, the
    first WAITING_QUEUE_PREFIX_MATCH_MAX waiting requests' prefixes, head last, so LRU
    evicts in reverse admission order (lru eviction only). Each touch is `touch_prefix`:
    a match (recency, a split)."""
    if sim.cfg.eviction_policy != "lru":
        return
    refresh = st.priority_calls % C.WAITING_PREFIX_REFRESH_INTERVAL == 0
    st.priority_calls += 1
    if not refresh:
        return
    head = list(itertools.islice(sim.waiting, C.WAITING_QUEUE_PREFIX_MATCH_MAX))
    for rq in reversed(head):
        key = sim._seq_key(rq, rq.fill_len)
        sim._op(c, {"op": "match", "key": key})
        m = tree.match_prefix(key)
        if sim._rc:  # `touch_prefix` is a `match_prefix` for the consensus checker
            sim._consensus_match(c, key, m)
