"""The offline optimum of prefix hit tokens for a request trace (Bélády with prefixes).

What this is for: the best hit tokens any cache policy could reach on a trace at a
given capacity, to put the simulated policies' numbers in context. Results come as
``Bounds``: a feasible schedule's value (lower) and a proven ceiling (upper); when
they meet, the optimum is known exactly.

The model (single tier)
=======================
Requests are paths of prefix units (see ``stack_distance``). The cache is a set of
units, prefix-closed (a unit only with its parent) and of at most ``C`` units. Request
``r`` with path ``P_r`` hits ``|longest prefix of P_r in S_{r-1}|`` units, which is
``|P_r ∩ S_{r-1}|`` by prefix closure. After serving it, the cache may become **any**
prefix-closed ``S_r ⊆ S_{r-1} ∪ P_r`` with ``|S_r| <= C``: units enter only by being
requested, and anything may be dropped for free. **Bypass is allowed** by default:
not keeping a unit of ``P_r`` is the same as inserting it and evicting it at once, and
the LRU model of ``stack_distance`` (which must insert) is one of the schedules allowed
here. ``bypass=False`` gives the forced-insertion variant (below).
Decisions happen between requests; there is no concurrency, locking or prefetch.

Upper bound (interval bound). Let unit ``u`` be requested at ``a`` and next at ``b``.
A hit on ``u`` at ``b`` needs ``u ∈ S_{b-1}``, and since ``u`` is not requested in
between and units enter only when requested, ``u ∈ S_t`` for every ``t`` in
``[a, b-1]``. So every hit *is* a reuse interval held in the cache throughout, and at
most ``C`` held intervals cover any boundary ``t``. The largest set of intervals with
at most ``C`` covering any point (the maximum ``C``-colourable subgraph of an interval
graph) is found exactly by the sweep "at each ``t`` add the intervals starting there,
then drop the one ending farthest away while more than ``C`` are held" (Bélády's
argument, Carlisle & Lloyd 1995): exchanging any optimal solution's choice for the
farther-ending interval never lowers its count. That sweep ignores the prefix
constraint, so its count is an upper bound on the prefix-constrained optimum.

Lower bound (feasible schedule). A prefix-closed cache that inserts each request's
path and then evicts, one unit at a time, the cached *leaf* with the largest key
``(next request using it, depth)`` (never used again = infinitely far). A parent is
requested whenever its child is, so its next use is no later, and it is shallower on
ties: the largest key is always a leaf. Units never used again go first and earn
nothing; the others are exactly the intervals the sweep holds (tie-broken deepest
first), so the schedule earns the sweep's count. Hence **lower == upper: the single-tier optimum
is exact** in this model, and ``Bounds.exact`` reports that the two computations,
done independently, agree.

Without bypass (``bypass=False``: after request ``r`` the cache must hold ``P_r``, or
its shallowest ``C`` units when longer, as SGLang and the LRU model do). Lower: the
same farthest-next-use cache, never evicting the pinned path. Upper: the bypass
optimum (forced insertion only removes schedules). The lower bound equals exhaustive
search on every tiny trace the tests draw, so it is probably the optimum, but that
is not proven here, and ``exact`` is only reported when it meets the bypass bound.

Two tiers (device ``D`` units plus host ``H`` units)
====================================================
A request hits its longest prefix in device ∪ host; the device part (the longest
prefix on device) is a device hit, the tail found only on host is a host hit and
costs a load-back. The model: the device set ``D_r`` and the union ``U_r ⊇ D_r`` are
both prefix-closed; ``|D_r| <= D``; ``|U_r \\ D_r| <= H`` (no unit is held twice, as a
write-back cache allows; write-through's duplicate host copies only waste room);
``U_r ⊆ U_{r-1} ∪ P_r`` and ``D_r ⊆ D_{r-1} ∪ P_r`` (a host unit reaches the device only
by a hit's load-back); demotion and eviction are free. The value is
``device_hit + host_weight * host_hit`` with ``0 <= host_weight <= 1`` (a host hit saves
the prefill but pays the load-back).

Since value = ``(1 - w) * device_hits + w * all_hits``, and the device alone and the
union alone are single-tier caches of ``D`` and ``D + H`` units,
``upper = (1 - w) * OPT(D) + w * OPT(D + H)``. For ``w = 1`` that is the union bound
``OPT(D + H)``, valid for any write policy. Lower: run the single-tier schedule at
``D`` for the device and at ``D + H`` for the union. That schedule is a stack
algorithm: after each request it keeps the ``C`` smallest keys among
``S_{r-1}(C) ∪ P_r``, and by induction ``S_r(C) ⊆ S_r(C+1)`` with at most one unit
more (the ``C`` best of a set stay among the ``C+1`` best of that set plus one unit).
So ``D_r ⊆ U_r`` holds and this pair is a feasible two-tier schedule achieving the
upper bound: **the two-tier optimum is exact too**, for every ``w`` in ``[0, 1]``. The
code checks the inclusion as it runs and reports ``exact`` only if lower == upper.

What the model leaves out (so the real optimum is lower): write-through's
duplication (a host copy per device unit, leaving about ``max(D, H)`` unique units),
node-granular eviction, locking of running requests, and eviction before allocation.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sim.analysis.stack_distance import UnitPath, as_unit_paths, check_page_tokens
from sim.errors import UserError


@dataclass(frozen=True)
class Bounds:
    """Hit tokens of the offline optimum, bracketed.

    ``lower_hit_tokens`` is the value of an explicit feasible schedule,
    ``upper_hit_tokens`` a proven ceiling; ``exact`` when they are equal. Two-tier
    values are weighted (``device + host_weight * host``); ``device_hit_tokens`` and
    ``host_hit_tokens`` split the feasible schedule's hits (``None`` for one tier).
    Tokens count whole units only, as in ``stack_distance.hit_rate_curve``.
    """

    lower_hit_tokens: float
    upper_hit_tokens: float
    input_tokens: int
    exact: bool
    device_hit_tokens: int | None = None
    host_hit_tokens: int | None = None


def _check_capacity(name: str, units: int) -> None:
    if isinstance(units, bool) or not isinstance(units, int) or units < 0:
        raise UserError(f"{name} is {units!r}; expected a non-negative integer (units)")


def _next_uses(paths: list[UnitPath]) -> list[list[int]]:
    """For each access, the index of the next request using the same unit.

    ``len(paths)`` (past the end) when the unit is never used again.
    """
    never = len(paths)
    following: dict[int, int] = {}
    out: list[list[int]] = [[] for _ in paths]
    for r in range(len(paths) - 1, -1, -1):
        out[r] = [following.get(u, never) for u in paths[r]]
        for u in paths[r]:
            following[u] = r
    return out


def interval_upper_bound(paths: list[UnitPath], capacity_units: int, next_uses: list[list[int]]) -> int:
    """Most reuse intervals holdable with at most ``capacity_units`` held at once.

    Prefix-blind (units are independent items), hence an upper bound on prefix hits
    (module docstring). The sweep drops the farthest-ending interval on overflow;
    ties are broken by arrival order, which does not change the count.
    """
    never = len(paths)
    held_until: dict[int, int] = {}  # unit -> request whose hit its held interval earns
    farthest: list[tuple[int, int, int]] = []  # max-heap of (-end, order, unit); may be stale
    order = itertools.count()
    hits = 0
    for r, path in enumerate(paths):
        for u in path:
            if held_until.get(u) == r:
                del held_until[u]
                hits += 1
        for u, nxt in zip(path, next_uses[r]):
            if nxt != never:
                held_until[u] = nxt
                heapq.heappush(farthest, (-nxt, next(order), u))
        while len(held_until) > capacity_units:
            neg_end, _, u = heapq.heappop(farthest)
            if held_until.get(u) == -neg_end:  # else the interval already ended
                del held_until[u]
    return hits


class _FarthestNextUseCache:
    """A prefix-closed cache evicting the leaf used farthest in the future.

    The feasible (lower-bound) schedule. ``serve`` returns the request's hit units
    and the units evicted after it; ``pinned`` shallowest units of the request's path
    are never evicted by that call (forced insertion, when bypass is not allowed).
    """

    def __init__(self, capacity_units: int):
        self.capacity = capacity_units
        self.parent: dict[int, int | None] = {}
        self.key: dict[int, tuple[int, int]] = {}  # unit -> (next use, depth)
        self.children: dict[int, int] = {}  # cached unit -> number of cached children
        self.candidates: list[tuple[tuple[int, int], int]] = []  # max-heap by negated key

    def __contains__(self, unit: int) -> bool:
        return unit in self.children

    def serve(self, path: UnitPath, next_uses: list[int], pinned: int = 0) -> tuple[int, list[int]]:
        hit = 0
        while hit < len(path) and path[hit] in self.children:
            hit += 1
        for j, (u, nxt) in enumerate(zip(path, next_uses)):
            self.parent[u] = path[j - 1] if j else None
            if u not in self.children:
                self.children[u] = 0
                if j:
                    self.children[path[j - 1]] += 1
            self.key[u] = (nxt, j)
            heapq.heappush(self.candidates, ((-nxt, -j), u))
        evicted = []
        kept = set(path[:pinned])
        spared = []  # pinned leaves popped on the way, pushed back afterwards
        while len(self.children) > self.capacity:
            entry = heapq.heappop(self.candidates)
            neg_key, u = entry
            if self.children.get(u) != 0 or self.key[u] != (-neg_key[0], -neg_key[1]):
                continue  # evicted already, key outdated, or not a leaf (re-pushed when it is)
            if u in kept:
                spared.append(entry)
                continue
            del self.children[u]
            evicted.append(u)
            p = self.parent[u]
            if p is not None:
                self.children[p] -= 1
                if self.children[p] == 0:
                    nxt, depth = self.key[p]
                    heapq.heappush(self.candidates, ((-nxt, -depth), p))
        for entry in spared:
            heapq.heappush(self.candidates, entry)
        return hit, evicted


def farthest_next_use_hits(
    paths: list[UnitPath], capacity_units: int, next_uses: list[list[int]], bypass: bool = True
) -> int:
    """Hit units of the feasible farthest-next-use prefix cache (the lower bound).

    Without bypass, each request's path (its shallowest ``capacity_units`` units when
    longer) must stay cached after it is served.
    """
    cache = _FarthestNextUseCache(capacity_units)
    return sum(
        cache.serve(path, nu, 0 if bypass else min(capacity_units, len(path)))[0]
        for path, nu in zip(paths, next_uses)
    )


def _input_tokens(paths: list[UnitPath], page_tokens: int) -> int:
    return sum(len(p) for p in paths) * page_tokens


def optimum_bounds(
    requests: Iterable[Sequence[int]], capacity_units: int, page_tokens: int, *, bypass: bool = True
) -> Bounds:
    """Offline-optimal prefix hit tokens of one cache tier of ``capacity_units`` pages.

    ``bypass=False`` forces every served path into the cache (module docstring);
    its upper bound is the bypass optimum, so it is rarely reported exact.
    """
    _check_capacity("capacity_units", capacity_units)
    check_page_tokens(page_tokens)
    paths = as_unit_paths(requests)
    next_uses = _next_uses(paths)
    lower = farthest_next_use_hits(paths, capacity_units, next_uses, bypass)
    upper = interval_upper_bound(paths, capacity_units, next_uses)
    if lower > upper:  # a theorem, not an input condition
        raise AssertionError(f"feasible schedule {lower} beats the upper bound {upper}")
    return Bounds(lower * page_tokens, upper * page_tokens, _input_tokens(paths, page_tokens), lower == upper)


def two_tier_bounds(
    requests: Iterable[Sequence[int]],
    device_units: int,
    host_units: int,
    page_tokens: int,
    host_weight: float = 1.0,
) -> Bounds:
    """Offline optimum of ``device_hit + host_weight * host_hit`` tokens (module docstring)."""
    _check_capacity("device_units", device_units)
    _check_capacity("host_units", host_units)
    check_page_tokens(page_tokens)
    if not 0.0 <= host_weight <= 1.0:
        raise UserError(f"host_weight is {host_weight!r}; expected a number in [0, 1]")
    paths = as_unit_paths(requests)
    next_uses = _next_uses(paths)
    device = _FarthestNextUseCache(device_units)
    union = _FarthestNextUseCache(device_units + host_units)
    device_hits = all_hits = 0
    for path, nu in zip(paths, next_uses):
        d_hit, _ = device.serve(path, nu)
        u_hit, dropped = union.serve(path, nu)
        device_hits += d_hit
        all_hits += u_hit
        # The device set must stay inside the union; only units the union just
        # dropped can break that.
        for u in dropped:
            if u in device:
                raise AssertionError(f"unit {u} left the union but stayed on device")
    host_hits = all_hits - device_hits
    w = host_weight
    lower = (device_hits + w * host_hits) * page_tokens
    upper_device = interval_upper_bound(paths, device_units, next_uses)
    upper_all = interval_upper_bound(paths, device_units + host_units, next_uses)
    upper = ((1 - w) * upper_device + w * upper_all) * page_tokens
    exact = device_hits == upper_device and all_hits == upper_all
    if w == 1.0:  # keep whole tokens as ints where no weighting happens
        lower, upper = all_hits * page_tokens, upper_all * page_tokens
    return Bounds(
        lower,
        upper,
        _input_tokens(paths, page_tokens),
        exact,
        device_hit_tokens=device_hits * page_tokens,
        host_hit_tokens=host_hits * page_tokens,
    )


def combine_two_tier(device: Bounds, union: Bounds, host_weight: float = 1.0) -> Bounds:
    """The two-tier optimum from the single-tier optima at ``D`` and ``D + H`` units.

    ``device`` and ``union`` are ``optimum_bounds`` (with bypass) of one trace at ``D``
    and ``D + H`` units. By the two-tier theorem of the module docstring the value is
    ``(1 - w) * device + w * union`` for both bounds, achieved by running the two
    single-tier schedules side by side. ``two_tier_bounds`` computes the same and also
    checks the inclusion as it runs; this saves the recomputation for callers that need
    the single-tier optima anyway (``sim.analysis.bound``).
    """
    if not 0.0 <= host_weight <= 1.0:
        raise UserError(f"host_weight is {host_weight!r}; expected a number in [0, 1]")
    if device.input_tokens != union.input_tokens:
        raise ValueError("device and union bounds come from different traces")
    w = host_weight
    host_hits = union.lower_hit_tokens - device.lower_hit_tokens
    lower = device.lower_hit_tokens + w * host_hits
    upper = (1 - w) * device.upper_hit_tokens + w * union.upper_hit_tokens
    if w == 1.0:  # whole tokens stay ints, as in two_tier_bounds
        lower, upper = union.lower_hit_tokens, union.upper_hit_tokens
    return Bounds(lower, upper, device.input_tokens, device.exact and union.exact,
                  device_hit_tokens=device.lower_hit_tokens, host_hit_tokens=host_hits)


# --- Exhaustive search, for tiny traces (tests) ---------------------------------


def _prefix_closed_subsets(units: frozenset[int], parent: dict[int, int | None], limit: int):
    """Every prefix-closed subset of ``units`` with at most ``limit`` units."""
    members = sorted(units)
    for size in range(min(limit, len(members)) + 1):
        for combo in itertools.combinations(members, size):
            chosen = frozenset(combo)
            if all(parent[u] is None or parent[u] in chosen for u in chosen):
                yield chosen


def _longest_prefix(path: UnitPath, cache: frozenset[int]) -> int:
    hit = 0
    while hit < len(path) and path[hit] in cache:
        hit += 1
    return hit


def _parents(paths: list[UnitPath]) -> dict[int, int | None]:
    return {u: (p[j - 1] if j else None) for p in paths for j, u in enumerate(p)}


def brute_force_optimum(
    requests: Iterable[Sequence[int]], capacity_units: int, *, bypass: bool = True
) -> int:
    """Exact optimum hit units by trying every keep/evict decision (tiny traces only).

    Dynamic programming over cache states: after each request, every prefix-closed
    subset of (previous cache ∪ the request's path) within capacity is a successor
    (without bypass, only those holding the path's shallowest ``capacity`` units).
    Exponential in the number of units; meant for a dozen units.
    """
    _check_capacity("capacity_units", capacity_units)
    paths = as_unit_paths(requests)
    parent = _parents(paths)
    best: dict[frozenset[int], int] = {frozenset(): 0}
    for path in paths:
        forced = frozenset() if bypass else frozenset(path[:capacity_units])
        nxt: dict[frozenset[int], int] = {}
        for cache, value in best.items():
            value += _longest_prefix(path, cache)
            for kept in _prefix_closed_subsets(cache | frozenset(path), parent, capacity_units):
                if forced <= kept and nxt.get(kept, -1) < value:
                    nxt[kept] = value
        best = nxt
    return max(best.values())


def brute_force_two_tier(
    requests: Iterable[Sequence[int]], device_units: int, host_units: int, host_weight: float = 1.0
) -> float:
    """Exact optimum of ``device_hits + host_weight * host_hits`` units (tiny traces only).

    States are pairs (device set, union set) under the two-tier model of the module
    docstring; exhaustive like ``brute_force_optimum``.
    """
    paths = as_unit_paths(requests)
    parent = _parents(paths)
    empty = frozenset()
    best: dict[tuple[frozenset[int], frozenset[int]], float] = {(empty, empty): 0.0}
    for path in paths:
        nxt: dict[tuple[frozenset[int], frozenset[int]], float] = {}
        p = frozenset(path)
        for (dev, uni), value in best.items():
            d_hit = _longest_prefix(path, dev)
            value += d_hit + host_weight * (_longest_prefix(path, uni) - d_hit)
            for new_uni in _prefix_closed_subsets(uni | p, parent, device_units + host_units):
                for new_dev in _prefix_closed_subsets((dev | p) & new_uni, parent, device_units):
                    state = (new_dev, new_uni)
                    if len(new_uni) - len(new_dev) <= host_units and nxt.get(state, -1.0) < value:
                        nxt[state] = value
        best = nxt
    return max(best.values())
