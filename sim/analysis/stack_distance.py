"""One-pass LRU hit-rate curves over prefix units (Mattson's stack algorithm).

What this is for: the hit rate of a page-granular, prefix-closed LRU cache at
*every* capacity at once, from one pass over a request trace, so a capacity sweep
costs one replay instead of one per capacity.

The cache model
===============
A request is a path ``u_0, u_1, ..., u_{k-1}`` of prefix units (unit ``i`` names
the whole prefix up to ``i``; see docs/ARCHITECTURE.md, "Prefix-id semantics"), so
the units form a forest whose edges are ``u_{j-1} -> u_j``. One unit is one page of
``page_tokens`` tokens. For request ``r``:

1. **match**: the hit is the longest prefix of the path present in the cache;
2. **insert**: every unit of the path is touched (inserted if absent) and gets the
   key ``(r, -j)``, ``j`` its depth in the path;
3. **evict**: while more than ``C`` units are cached, the cached *leaf* (a unit with
   no cached child) with the smallest key is removed, one unit at a time.

So the oldest last use goes first, and within one request the deepest unit goes
first. The cache stays prefix-closed (a unit is cached only if its parent is).

Why this key and not SGLang's stamps
------------------------------------
SGLang stamps the matched node with ``t`` and the ancestor ``k`` levels up with
``t - k * MATCH_ANCESTOR_STEP`` (sem §1.4): ancestors look slightly *older* than
their descendants, yet a parent is never evicted first, because eviction only
takes leaves (sem §2.3). The order in which leaf-only eviction really removes the
units of one path is therefore deepest first, which is what ``(r, -j)`` says
directly. With it, a parent's key is always larger than its child's (the parent is
touched whenever the child is, and is shallower on ties), so the globally smallest
key is always a leaf: "evict the smallest-key leaf" equals "evict the smallest key".
Keys are distinct: units sharing a last request lie on that request's path, at
different depths.

The inclusion property (why one pass gives every capacity)
----------------------------------------------------------
Let ``L_r`` be every unit seen so far, ordered by key, largest (most recent)
first, after request ``r``; ``top_C(L_r)`` its first ``C`` units. Claim: the cache of
capacity ``C`` after request ``r`` is ``S_r(C) = top_C(L_r)``. By induction: assume
``S_{r-1}(C) = top_C(L_{r-1})``. Request ``r`` raises the keys of its path ``P`` above
every other key and leaves all other keys alone. The reference cache holds
``S_{r-1}(C) ∪ P`` after the insert and then removes smallest keys down to ``C``
units, so it keeps ``top_C`` of ``S_{r-1}(C) ∪ P`` under the new keys. Any unit outside
that union had a key below all of ``S_{r-1}(C)`` (or the union holds every unit seen
so far, when fewer than ``C`` are known) and its key did not change, so it ranks
below all of the union in ``L_r`` too: ``top_C`` of the union is ``top_C(L_r)``. ∎

Hence ``S_r(C) ⊆ S_r(C+1)`` (inclusion: LRU over prefix units is a stack
algorithm), and a unit ``u`` of request ``r`` hits at capacity ``C`` iff its rank in
``L_{r-1}`` is at most ``C``. That rank is the unit's **stack distance**. Since the
caches are prefix-closed, the hits of a request at capacity ``C`` are exactly the
``C``-hits counted unit by unit, and they form a prefix of its path.

Computing ranks: each touch hands out the next integer *stamp* (deepest unit of a
request first, so stamp order is key order). A unit's rank is the number of live
stamps at or above its current stamp. A Fenwick tree over stamps counts the dead
ones (a stamp dies when its unit is touched again), so each reuse costs
O(log N), N the number of unit accesses; cold accesses cost O(1).

How this differs from SGLang (to be measured against the real tree)
-------------------------------------------------------------------
- SGLang evicts whole radix **nodes** (a node may span many pages), and an
  eviction call frees *at least* ``n`` tokens (sem §3.3), so it can overshoot by up
  to a node; this model evicts exactly one page at a time and never overshoots.
- SGLang evicts *before* allocating the new request's KV and locks the request's
  matched prefix and the running batch's paths meanwhile; here eviction runs after
  the insert with nothing locked, and requests are served one at a time.
- SGLang inserts input *and* output tokens of a finished request and keeps
  partial pages out of the tree; the unit lists given here decide what is cached.
- Splits (sem §3.1) refresh a suffix child's stamp; at page granularity every unit
  carries its own stamp, so splits do not exist here.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from sim.errors import UserError

#: Stack distance of a unit's first access: a miss at every capacity.
COLD = -1

UnitPath = tuple[int, ...]


def as_unit_paths(requests: Iterable[Sequence[int]]) -> list[UnitPath]:
    """Materialise requests as tuples of unit ids and check they form a prefix forest.

    A unit must always follow the same parent (the previous unit of its request, or
    nothing at depth 0) and may appear once per request; otherwise the ids are not
    prefix ids and no prefix-cache analysis is meaningful.
    """
    paths: list[UnitPath] = []
    parent_of: dict[int, int | None] = {}
    for r, request in enumerate(requests):
        path = tuple(request)
        parent = None
        for j, unit in enumerate(path):
            known = parent_of.setdefault(unit, parent)
            if known != parent:
                raise UserError(
                    f"unit {unit} follows {parent!r} here but followed {known!r} before; "
                    "expected prefix ids (a unit names its whole prefix, so it always "
                    "has the same parent)",
                    where=f"request {r}, unit {j}",
                )
            parent = unit
        paths.append(path)
    return paths


def lru_stack_distances(
    requests: Iterable[Sequence[int]], refresh: Mapping[int, Sequence[int]] | None = None
) -> np.ndarray:
    """Stack distance of every unit access, in request order then path order.

    Entry ``i`` is the rank of the accessed unit in the LRU order just before its
    request (1 = most recent), or ``COLD`` for a first access. The access hits at
    capacity ``C`` units iff ``1 <= distance <= C``.

    ``refresh`` maps a request index to units (shallowest first, one chain of the
    forest) that request *touches without accessing*: after its ranks are read, they
    move to the top, deepest first, just below the request's own path. This is what
    the real tree does to the lower half of a node that ``match_prefix`` splits
    (``replay.py`` records those fragments). Refreshed units must have been seen.
    """
    paths = as_unit_paths(requests)
    refresh = refresh or {}
    n = sum(len(p) for p in paths) + sum(len(f) for f in refresh.values())
    dead = [0] * (n + 1)  # Fenwick tree over stamps 1..n: 1 where a stamp has died
    stamp_of: dict[int, int] = {}
    top = 0  # the last stamp handed out
    dead_total = 0
    out: list[int] = []

    def kill(s: int) -> None:
        nonlocal dead_total
        while s <= n:
            dead[s] += 1
            s += s & -s
        dead_total += 1

    for r, path in enumerate(paths):
        olds = [stamp_of.get(u) for u in path]
        # Ranks are read before any unit of this request is re-stamped: a request
        # hits against the cache as the previous request left it.
        for s in olds:
            if s is None:
                out.append(COLD)
                continue
            q, dead_below = s - 1, 0
            while q > 0:
                dead_below += dead[q]
                q &= q - 1
            # live stamps in [s, top] = all stamps there minus the dead ones there
            out.append((top - s + 1) - (dead_total - dead_below))
        # Refreshed units first (they rank below this request's path), deepest first.
        for u in reversed(refresh.get(r, ())):
            s = stamp_of.get(u)
            if s is None:
                raise ValueError(f"request {r} refreshes unit {u}, which was never requested")
            kill(s)
            top += 1
            stamp_of[u] = top
        # Deepest unit first, so the shallowest gets the largest (most recent) stamp.
        for j in range(len(path) - 1, -1, -1):
            s = stamp_of.get(path[j])  # olds[j], unless the refresh re-stamped it
            if s is not None:
                kill(s)
            top += 1
            stamp_of[path[j]] = top
    return np.asarray(out, dtype=np.int64)


@dataclass(frozen=True)
class LruCurve:
    """Hit units of the prefix LRU cache as a function of its capacity in units."""

    hits_at: np.ndarray  # hits_at[c]: hit units at capacity c; flat beyond the end
    access_units: int  # unit accesses in the trace (the "input" in units)
    distinct_units: int  # cold misses; capacity >= this turns every reuse into a hit

    def hit_units(self, capacity_units: int) -> int:
        """Hit units at ``capacity_units`` (any non-negative int)."""
        if capacity_units < 0:
            raise UserError(f"capacity {capacity_units} units is negative; expected >= 0")
        return int(self.hits_at[min(capacity_units, len(self.hits_at) - 1)])


def lru_hit_curve(requests: Iterable[Sequence[int]]) -> LruCurve:
    """The whole LRU hit curve (hit units per capacity in units) from one pass."""
    dist = lru_stack_distances(requests)
    reused = dist[dist != COLD]
    hist = np.bincount(reused, minlength=1)  # hist[0] == 0: distances start at 1
    return LruCurve(
        hits_at=np.cumsum(hist),
        access_units=int(dist.size),
        distinct_units=int(dist.size - reused.size),
    )


@dataclass(frozen=True)
class CurvePoint:
    """One capacity of a hit-rate curve; tokens count whole units only."""

    capacity_tokens: int
    hit_tokens: int
    input_tokens: int
    hit_rate: float


def check_page_tokens(page_tokens: int) -> None:
    """Reject a page size that is not a positive int."""
    if isinstance(page_tokens, bool) or not isinstance(page_tokens, int) or page_tokens < 1:
        raise UserError(f"page_tokens is {page_tokens!r}; expected a positive integer")


def hit_rate_curve(
    requests: Iterable[Sequence[int]], capacities_tokens: Iterable[int], page_tokens: int
) -> list[CurvePoint]:
    """LRU hit tokens and hit rate at each capacity (tokens), from one pass.

    A capacity holds ``capacity // page_tokens`` whole units. ``input_tokens`` is
    the unit accesses times ``page_tokens``: a trace's partial last pages are not
    units, so callers wanting a rate over true input lengths divide ``hit_tokens``
    by their own total.
    """
    check_page_tokens(page_tokens)
    curve = lru_hit_curve(requests)
    input_tokens = curve.access_units * page_tokens
    points = []
    for cap in capacities_tokens:
        cap = int(cap)
        if cap < 0:
            raise UserError(f"capacity {cap} tokens is negative; expected >= 0")
        hit = curve.hit_units(cap // page_tokens) * page_tokens
        points.append(CurvePoint(cap, hit, input_tokens, hit / input_tokens if input_tokens else 0.0))
    return points


@dataclass(frozen=True)
class PrefixCacheRun:
    """Outcome of one reference simulation: hit units per request and in total."""

    per_request: list[int]

    @property
    def hit_units(self) -> int:
        return sum(self.per_request)


def lru_prefix_cache_sim(
    requests: Iterable[Sequence[int]], capacity_units: int, *, check: bool = False
) -> PrefixCacheRun:
    """The reference: simulate the prefix LRU cache above at one capacity.

    Deliberately direct (a cached set, per-unit child counts, a heap of eviction
    candidates) and independent of the stack-distance pass, so each checks the other.
    ``check=True`` verifies prefix closure, the capacity and the child counts after
    every request (for tests; O(cache) per request).
    """
    if capacity_units < 0:
        raise UserError(f"capacity {capacity_units} units is negative; expected >= 0")
    paths = as_unit_paths(requests)
    parent: dict[int, int | None] = {}
    key: dict[int, tuple[int, int]] = {}  # unit -> (last request, -depth)
    cached_children: dict[int, int] = {}  # cached unit -> number of cached children
    candidates: list[tuple[tuple[int, int], int]] = []  # heap; entries may be stale
    per_request: list[int] = []
    for r, path in enumerate(paths):
        hit = 0
        while hit < len(path) and path[hit] in cached_children:
            hit += 1
        per_request.append(hit)
        for j, u in enumerate(path):
            parent[u] = path[j - 1] if j else None
            if u not in cached_children:
                cached_children[u] = 0
                if j:
                    cached_children[path[j - 1]] += 1
            key[u] = (r, -j)
            heapq.heappush(candidates, (key[u], u))
        while len(cached_children) > capacity_units:
            k, u = heapq.heappop(candidates)
            # Skip entries for evicted units, outdated keys and non-leaves; a unit
            # that becomes a leaf later is pushed again at that moment.
            if cached_children.get(u) != 0 or key[u] != k:
                continue
            del cached_children[u]
            p = parent[u]
            if p is not None:
                cached_children[p] -= 1
                if cached_children[p] == 0:
                    heapq.heappush(candidates, (key[p], p))
        if check:
            _check_cache(cached_children, parent, capacity_units)
    return PrefixCacheRun(per_request)


def _check_cache(cached_children: dict[int, int], parent: dict[int, int | None], cap: int) -> None:
    assert len(cached_children) <= cap, "over capacity"
    counts = dict.fromkeys(cached_children, 0)
    for u in cached_children:
        p = parent[u]
        if p is not None:
            assert p in cached_children, f"unit {u} cached without its parent {p}"
            counts[p] += 1
    assert counts == cached_children, "child counts out of date"
