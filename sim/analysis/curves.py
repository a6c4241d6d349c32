"""Fast one-pass capacity curves for planning: chain-compressed LRU stack distances,
the offline optimum at a few capacities, and the age of a page at hit and at eviction.

What this is for: ``hicache-sim plan`` needs the LRU hit curve at ~50 capacities and
the offline optimum at a few, on traces of millions of page accesses, in seconds.
The answers are exactly those of ``stack_distance.lru_hit_curve`` and
``optimum.interval_upper_bound`` (tests check it); only the work is smaller.

Chain compression
-----------------
Prefix ids form a forest. If unit ``u`` has exactly one child ``v`` ever and both are
accessed equally often, then every access to ``u`` is followed, in the same request, by
one to ``v`` (``v``'s parent is always ``u``, so each ``v`` access implies a ``u``
access; equal counts make the converse hold). Such chains (a 512-token Mooncake
block is 8 pages at page size 64) are merged into one *group* of weight ``w``: its
units are touched together, get consecutive stamps (deepest first), and so occupy
consecutive LRU ranks ``above + 1 .. above + w`` where ``above`` is the weight of the
live stamps more recent than the group's. At capacity ``C`` the shallowest
``clip(C - above, 0, w)`` units of the group hit, exactly as unit by unit. The
optimum's interval sweep holds ``w`` identical intervals per group; dropping part
of a group's weight is the unit sweep dropping some of those identical intervals.

Warm-up: requests before ``warm`` still update the cache state but their hits and
input tokens are not counted, as published curves that measure only the second
half of a trace do.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import numpy as np

COLD = -1


@dataclass(frozen=True)
class Compressed:
    """A unit trace as chain groups: per group access its group, weight (units) and request."""

    group: np.ndarray  # int64, one entry per group access, request-major, path order
    weight: np.ndarray  # int64 units per access
    request: np.ndarray  # int64 request index per access
    starts: np.ndarray  # int64, offset of each request's first access (len = requests + 1)
    unit_accesses: int

    @property
    def requests(self) -> int:
        return len(self.starts) - 1


def compress(paths) -> Compressed:
    """Merge single-child, equal-count chains of the prefix forest into weighted groups."""
    lens = np.fromiter((len(p) for p in paths), dtype=np.int64, count=len(paths))
    total = int(lens.sum())
    flat = np.fromiter(itertools.chain.from_iterable(paths), dtype=np.int64, count=total)
    starts = np.zeros(len(paths) + 1, dtype=np.int64)
    np.cumsum(lens, out=starts[1:])
    return compress_units(flat, starts)


def compress_units(flat: np.ndarray, starts: np.ndarray) -> Compressed:
    """``compress`` of the paths held back to back in ``flat`` (int64 units), request
    ``i`` at ``flat[starts[i]:starts[i + 1]]``: the planner's form (``page_units``),
    with no list per request."""
    flat = np.asarray(flat, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    lens = np.diff(starts)
    total = len(flat)
    n_req = len(starts) - 1
    if total == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Compressed(empty, empty, empty, np.zeros(n_req + 1, dtype=np.int64), 0)
    lo_id, hi_id = int(flat.min()), int(flat.max())
    if lo_id >= 0 and hi_id < 4 * total:
        # page_key hands out dense ids: index by them directly (np.unique's sort is
        # most of this function's time otherwise). Unused ids are harmless rows.
        dense, n = flat, hi_id + 1
        counts = np.bincount(flat, minlength=n)
    else:
        _, dense, counts = np.unique(flat, return_inverse=True, return_counts=True)
        n = len(counts)
    first = np.zeros(total, dtype=bool)
    first[starts[:-1][lens > 0]] = True  # path starts: no parent
    # Unit indices (< n) in 32 bits where they fit, and the single-child test as a
    # boolean before it is gathered: the same values in half the fresh memory or less
    # (on a Mooncake trace these arrays are tens of MB, and touching new pages is
    # most of this function's time in a fresh process).
    it = np.int32 if n < 2**31 else np.int64
    prev = np.empty(total, dtype=it)
    prev[0] = -1
    prev[1:] = dense[:-1]
    prev[first] = -1
    parent = np.full(n, -1, dtype=it)
    parent[dense] = prev  # prefix ids: every access of a unit has the same parent
    del prev
    has_parent = parent >= 0
    children = np.bincount(parent[has_parent], minlength=n)
    p = np.maximum(parent, 0)  # where there is no parent, has_parent masks the row out
    merge = has_parent & (children == 1)[p]
    del children
    merge &= counts[p] == counts
    del p
    # An access starts a new group run where its path starts or its unit is not merged
    # into its parent's chain (the previous access is that parent: prefix ids); then
    # its group (the chain's top) differs from the previous access's.
    new_run = ~merge[dense]
    new_run |= first
    idx = np.flatnonzero(new_run)
    weight = np.diff(np.append(idx, total))
    request = np.searchsorted(starts, idx, side="right") - 1  # the request holding each run
    gstarts = np.searchsorted(idx, starts)
    top = dense[idx]
    # A run starts at an unmerged unit, its chain's top, except at a path start whose
    # unit is merged: only ids that are not prefix ids have one. Then the top is found
    # by pointer jumping (about 12 passes over every unit on a Mooncake trace).
    if merge[top].any():
        head = np.where(merge, parent, np.arange(n))
        while True:
            nxt = head[head]
            if np.array_equal(nxt, head):
                break
            head = nxt
        top = head[top]
    return Compressed(top, weight.astype(np.int64), request.astype(np.int64),
                      gstarts.astype(np.int64), total)


@dataclass(frozen=True)
class LruPass:
    """Per group access: the weight of more recent live units (``above``; ``COLD`` on a
    first access) and the seconds since the group's previous use."""

    above: np.ndarray
    age_s: np.ndarray
    comp: Compressed

    def hits_at(self, warm: int = 0) -> np.ndarray:
        """Hit units at every capacity 0..max (flat beyond), counting requests >= warm."""
        c = self.comp
        keep = (self.above != COLD) & (c.request >= warm)
        a, w = self.above[keep], c.weight[keep]
        size = int((a + w).max()) + 2 if len(a) else 2
        # Each measured access puts one unit at each rank above+1 .. above+w.
        diff = np.bincount(a + 1, minlength=size) - np.bincount(a + w + 1, weights=None, minlength=size)
        hist = np.cumsum(diff)  # hist[c]: unit accesses at rank exactly c
        return np.cumsum(hist).astype(np.int64)

    def hit_units(self, capacity_units, warm: int = 0, hits=None) -> np.ndarray:
        hits = self.hits_at(warm) if hits is None else hits
        cap = np.minimum(np.asarray(capacity_units, dtype=np.int64), len(hits) - 1)
        return hits[cap]

    def ages(self, capacity_units: int, warm: int = 0) -> tuple[float | None, float | None]:
        """(median age at hit, median age at eviction), seconds, at ``capacity_units``.

        Age at hit: seconds since a hitting unit's previous use. Age at eviction: the same
        for reuses that just missed (ranks in (C, 1.25 C]): they were evicted shortly
        before, at about that age, which is LRU's characteristic time at this size.
        """
        c = self.comp
        keep = (self.above != COLD) & (c.request >= warm)
        a, w, age = self.above[keep], c.weight[keep], self.age_s[keep]
        cap = int(capacity_units)
        hit_w = np.clip(cap - a, 0, w)
        hi = int(cap * 1.25) + 1
        ev_w = np.clip(np.minimum(a + w, hi) - np.maximum(a, cap), 0, None)
        return _wmedian(age, hit_w), _wmedian(age, ev_w)


def _wmedian(values: np.ndarray, weights: np.ndarray) -> float | None:
    m = weights > 0
    if not m.any():
        return None
    v, w = values[m], weights[m]
    order = np.argsort(v, kind="stable")
    cw = np.cumsum(w[order])
    return float(v[order][np.searchsorted(cw, cw[-1] / 2)])


def lru_pass(comp: Compressed, arrivals) -> LruPass:
    """One pass of weighted LRU stack distances over the compressed trace."""
    group, weight, starts = comp.group.tolist(), comp.weight.tolist(), comp.starts.tolist()
    arr = list(arrivals)
    n = len(group)
    dead = [0] * (n + 1)  # Fenwick over stamps 1..n: dead weight
    wprefix = [0] * (n + 1)  # weight stamped up to stamp s
    stamp_of: dict[int, int] = {}
    last_req: dict[int, int] = {}
    top = top_w = dead_total = 0
    above = [0] * n
    age = [0.0] * n
    for r in range(len(starts) - 1):
        lo, hi = starts[r], starts[r + 1]
        t = arr[r]
        for i in range(lo, hi):
            s = stamp_of.get(group[i])
            if s is None:
                above[i] = COLD
                continue
            q, dead_le = s, 0
            while q > 0:
                dead_le += dead[q]
                q &= q - 1
            # live weight of stamps > s
            above[i] = (top_w - wprefix[s]) - (dead_total - dead_le)
            age[i] = t - arr[last_req[group[i]]]
        for i in range(hi - 1, lo - 1, -1):  # deepest first: the shallowest is most recent
            g, w = group[i], weight[i]
            s = stamp_of.get(g)
            if s is not None:
                while s <= n:
                    dead[s] += w
                    s += s & -s
                dead_total += w
            top += 1
            top_w += w
            wprefix[top] = top_w
            stamp_of[g] = top
            last_req[g] = r
    return LruPass(np.asarray(above, dtype=np.int64), np.asarray(age, dtype=np.float64), comp)


def next_uses(comp: Compressed) -> np.ndarray:
    """For each group access, the request of the group's next access (``requests`` if none)."""
    n = len(comp.group)
    order = np.lexsort((np.arange(n), comp.group))
    g_sorted = comp.group[order]
    nxt = np.full(n, comp.requests, dtype=np.int64)
    same = g_sorted[1:] == g_sorted[:-1]
    nxt[order[:-1][same]] = comp.request[order[1:][same]]
    return nxt


def optimum_units(comp: Compressed, capacity_units: int, nxt: np.ndarray, warm: int = 0) -> int:
    """``optimum.interval_upper_bound`` on the compressed trace: the offline optimum's
    hit units (exact in the single-tier model, ``optimum`` module docstring), counting
    hits of requests >= ``warm``."""
    group, weight, starts, nx = comp.group.tolist(), comp.weight.tolist(), comp.starts.tolist(), nxt.tolist()
    never = comp.requests
    held: dict[int, list] = {}  # group -> [end request, held weight]
    heap: list = []  # (-end, order, group)
    held_total = 0
    hits = 0
    order = 0
    cap = capacity_units
    for r in range(len(starts) - 1):
        lo, hi = starts[r], starts[r + 1]
        for i in range(lo, hi):
            h = held.get(group[i])
            if h is not None and h[0] == r:
                if r >= warm:
                    hits += h[1]
                held_total -= h[1]
                del held[group[i]]
        for i in range(lo, hi):
            e = nx[i]
            if e != never:
                g = group[i]
                held[g] = [e, weight[i]]
                held_total += weight[i]
                order += 1
                heapq.heappush(heap, (-e, order, g))
        while held_total > cap:
            neg_e, o, g = heap[0]
            h = held.get(g)
            if h is None or h[0] != -neg_e:
                heapq.heappop(heap)  # the interval ended already
                continue
            excess = held_total - cap
            if h[1] <= excess:
                heapq.heappop(heap)
                held_total -= h[1]
                del held[g]
            else:  # drop part of the group's identical intervals
                h[1] -= excess
                held_total -= excess
    return hits
