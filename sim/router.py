"""Routers: which data-parallel instance serves a request, by name.

A router sees each arriving request and the instances' loads (requests routed to an
instance and not finished, as SGLang's router counts them) and picks one. Policies:

- ``round_robin``: instances in turn;
- ``least_load``: the instance with the fewest unfinished requests;
- ``cache_aware``: sgl-router's cache-aware policy (`CacheAwarePolicy`,
  sgl-router/src/policies/cache_aware.rs; defaults from its documentation). When the
  loads are imbalanced, i.e. ``max - min > balance_abs_threshold`` and
  ``max > balance_rel_threshold * min``, it routes to the least loaded instance.
  Otherwise it matches the request against an approximate prefix tree per instance
  (what it routed there before, LRU-trimmed to ``max_tree_tokens``): above
  ``cache_threshold`` of the request matched, the best-matching instance wins; below
  it, the instance whose tree is smallest (most room to cache).

The router's trees are keyed by the workload's prefix-block ids (each names its whole
prefix), so a match is the run of leading blocks present: one set lookup a block. The
real router matches text or tokens and trims on a timer (``eviction_interval``); here
it trims when it inserts, which changes only when the trim happens.
"""

from __future__ import annotations

from collections import OrderedDict


class Router:
    """Base: ``choose(req, loads) -> instance``, then ``routed(req, instance)``."""

    name = "base"

    def __init__(self, n: int, **params):
        self.n = n

    def choose(self, req, loads: list[int]) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def routed(self, req, instance: int) -> None:
        pass


def _argmin(values) -> int:
    """Lowest index among the minima: ties break deterministically."""
    best = 0
    for i, v in enumerate(values):
        if v < values[best]:
            best = i
    return best


class RoundRobin(Router):
    name = "round_robin"

    def __init__(self, n: int, **params):
        super().__init__(n)
        self._next = 0

    def choose(self, req, loads):
        i = self._next
        self._next = (i + 1) % self.n
        return i


class LeastLoad(Router):
    name = "least_load"

    def choose(self, req, loads):
        return _argmin(loads)


class CacheAware(Router):
    name = "cache_aware"

    def __init__(self, n: int, *, cache_threshold: float, balance_abs_threshold: int,
                 balance_rel_threshold: float, max_tree_tokens: int, **params):
        super().__init__(n)
        self.cache_threshold = cache_threshold
        self.abs = balance_abs_threshold
        self.rel = balance_rel_threshold
        self.max_tree_tokens = max_tree_tokens
        self.trees: list[OrderedDict] = [OrderedDict() for _ in range(n)]
        self.balanced_routes = 0  # how often each branch decided (for summary.json)
        self.cache_routes = 0
        self.space_routes = 0

    def choose(self, req, loads):
        hi, lo = max(loads), min(loads)
        if hi - lo > self.abs and hi > self.rel * lo:
            self.balanced_routes += 1
            return _argmin(loads)
        blocks = req.blocks
        best, best_i = -1, 0
        for i, tree in enumerate(self.trees):
            m = 0
            for b in blocks:
                if b not in tree:
                    break
                m += 1
            if m > best:
                best, best_i = m, i
        if blocks and best / len(blocks) > self.cache_threshold:
            self.cache_routes += 1
            return best_i
        self.space_routes += 1
        return _argmin([len(t) for t in self.trees])

    def routed(self, req, instance):
        tree = self.trees[instance]
        for b in req.blocks:
            if b in tree:
                tree.move_to_end(b)
            else:
                tree[b] = None
        cap = max(1, self.max_tree_tokens // max(1, req.block_size))
        while len(tree) > cap:
            tree.popitem(last=False)

    def stats(self) -> dict:
        return {"load_balanced": self.balanced_routes, "cache_hit": self.cache_routes,
                "most_room": self.space_routes}


ROUTERS = {cls.name: cls for cls in (RoundRobin, LeastLoad, CacheAware)}
