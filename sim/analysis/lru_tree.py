"""The real radix tree run as a single-tier LRU cache, against the stack curve.

What this is for: ``stack_distance`` predicts LRU hit rates at every capacity from
one pass over a page-granular model. This module runs the same unit paths through
``sim.tree.Tree`` (the bit-exact SGLang replica) with no host tier, so the prediction
can be checked against the code the simulator runs, and the difference explained.

The run
=======
``Tree(device_capacity=C, host_capacity=0, write_policy="write_back")``: every
eviction victim's blocking backup fails for lack of host room and the victim is
dropped, so the host tier never holds anything: a pure single-tier LRU. Per request,
served one at a time, as the engine admits one (``sim/events.py``):

1. ``match_prefix(key)``: the hit is ``device_len``;
2. ``inc_lock`` on the matched node (SGLang locks the prefix it is about to reuse);
3. ``evict_device(need - free)`` when the new pages do not fit;
4. ``insert(key)`` (cut to what fits when even an empty cache is too small: the
   shallowest pages stay, as in the model), then ``dec_lock``.

Only input pages are cached (``page_key``); the engine also caches decoded pages,
which are never reused and only take room.

How the tree differs from the page model, exactly
=================================================
Write ``L_r`` for the model's recency order of every unit seen (``stack_distance``).
The tree differs in two ways, and only these:

* **node-granular eviction**: a radix node spans many pages and is evicted whole;
  ``evict_device(n)`` frees *at least* ``n`` tokens and overshoots by up to the last
  victim's size minus one page. The cache then holds fewer than ``C`` units until
  later inserts fill it again.
* **split refresh**: when ``match_prefix`` stops inside a node it splits it, and the
  lower fragment (off the request's path) gets a fresh access time (sem §3.1). In the
  model nothing off the path is touched.

Let ``L'_r`` be ``L_r`` with each split fragment touched at its request, below that
request's path (``lru_stack_distances(..., refresh=...)``, with the fragments this
run records), and ``d'`` the stack distances in it. **Claim: the tree's cache
after every request is the top ``m_r`` units of ``L'_r``, ``m_r`` its occupancy in
pages; so request ``r``'s hit is exactly the number of its units with
``1 <= d' <= m_{r-1}``.** Proof sketch: by induction. A node's pages are always
touched together (touching part of one splits it first), so they are contiguous in
``L'`` and the node's access time orders leaf nodes as ``L'`` orders their deepest
units (within one request: the fragment, stamped at the match, before the path,
stamped at the insert). The victims of ``evict_device`` are therefore the bottom of
``L'`` outside the locked match, whole nodes at a time; the unmatched part of the
path is not cached (the cache is prefix-closed and the match is the longest
prefix); so after the insert the cache is the path plus the top of the rest: a top
set of ``L'_r``. ∎

Consequences (what the tests check):

* ``m_r <= C`` always; once anything was evicted, ``m_r >= C - o`` where ``o`` is the
  largest overshoot (pages) of any eviction call, ``o <= K - 1`` for ``K`` the largest
  node evicted, itself at most the longest request. Before the first eviction the
  cache holds everything seen. Hence, per request,
  ``hits'(C - o) <= tree hits(C) <= hits'(C)``.
* With no split, ``L' = L``: the plain stack curve sandwiches the tree,
  ``stack(C - o) <= tree(C) <= stack(C)``.
* With single-page nodes (``unit_nodes=True`` inserts a request page by page, so no
  node ever spans two pages, no split happens and nothing overshoots): the tree
  **equals** the stack curve and ``lru_prefix_cache_sim``, request by request.

A split refresh keeps a fragment longer than LRU would, so with splits the tree can
hit more *or* less than the stack curve; no bound independent of the trace holds,
and ``LruTreeRun.splits`` / ``overshoot_*`` say how much of each effect a run had.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sim.analysis.stack_distance import as_unit_paths, check_page_tokens, lru_hit_curve
from sim.errors import UserError
from sim.tree import Tree
from sim.workloads.keys import page_key
from sim.workloads.traces import MooncakeReader


@dataclass(frozen=True)
class UnitTrace:
    """A request stream keyed as the engine keys it: one unit per full page.

    ``input_tokens`` counts every input token, partial last pages included: it is the
    denominator SGLang's hit rate uses (cached tokens / input tokens). ``unit_tokens``
    counts only the full pages, the part a cache can ever hold.
    """

    paths: list[list[int]]
    page_size: int
    input_tokens: int

    @property
    def unit_tokens(self) -> int:
        return sum(len(p) for p in self.paths) * self.page_size


def unit_trace(requests: Iterable, page_size: int) -> UnitTrace:
    """Key ``sim.workloads.Request`` objects with ``page_key`` at ``page_size``."""
    check_page_tokens(page_size)
    paths, total = [], 0
    for r in requests:
        paths.append(page_key(r.blocks, r.block_size, page_size, r.input_len))
        total += r.input_len
    return UnitTrace(paths, page_size, total)


def mooncake_trace(path, page_size: int) -> UnitTrace:
    """A Mooncake FAST'25 JSONL file, keyed at ``page_size`` (``MooncakeReader``)."""
    path = Path(path)
    if not path.is_file():
        raise UserError("no such file; expected a Mooncake trace (.jsonl)", where=str(path))
    return unit_trace(MooncakeReader(path), page_size)


@dataclass(frozen=True)
class LruTreeRun:
    """One capacity of the real tree run as a single-tier LRU (module docstring).

    ``per_request`` holds each request's hit units and ``occupancy`` the device pages
    held just before it; ``refreshed`` maps a request index to the units of the node
    fragment its ``match_prefix`` split off and refreshed. Overshoots are in tokens.
    """

    capacity_tokens: int
    page_size: int
    hit_tokens: int
    input_tokens: int
    hit_rate: float
    per_request: tuple[int, ...]
    occupancy: tuple[int, ...]
    refreshed: dict[int, tuple[int, ...]]
    evictions: int  # evict_device calls
    evicted_tokens: int
    evicted_nodes: int
    overshoot_tokens: int  # freed beyond what the calls asked, summed
    max_overshoot_tokens: int
    splits: int
    truncated_tokens: int  # new input tokens that did not fit even in an empty cache

    @property
    def max_overshoot_units(self) -> int:
        return self.max_overshoot_tokens // self.page_size


def _check_capacity(cap) -> int:
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise UserError(f"capacity {cap!r} tokens; expected a non-negative integer")
    return cap


def run_lru_tree(
    requests: Iterable[Sequence[int]],
    capacity_tokens: int,
    page_size: int,
    *,
    input_tokens: int | None = None,
    unit_nodes: bool = False,
    write_policy: str = "write_back",
) -> LruTreeRun:
    """Replay unit paths through a device-only ``Tree`` of ``capacity_tokens``.

    ``input_tokens`` is the hit-rate denominator (default: the full pages replayed).
    ``unit_nodes`` inserts each request page by page so no node spans two pages (the
    page-granular case, for tests). ``write_policy`` ``"write_through"`` with no host
    deletes victims instead of dropping them; the result is the same LRU.
    """
    check_page_tokens(page_size)
    cap = _check_capacity(capacity_tokens)
    paths = as_unit_paths(requests)
    ps = page_size
    tree = Tree(device_capacity=cap, host_capacity=0, page_size=ps,
                write_policy=write_policy, host_policy="lru", eviction_policy="lru")
    stats = tree.stats
    per_request, occupancy = [], []
    refreshed: dict[int, tuple[int, ...]] = {}
    evictions = evicted_nodes = overshoot = max_overshoot = truncated = 0
    for r, path in enumerate(paths):
        key = list(path)
        occupancy.append(tree.dev_used // ps)
        m = tree.match_prefix(key)
        hit = m.device_len // ps
        per_request.append(hit)
        if m.split:
            # The match split the node it stopped in: the new upper fragment is
            # ``m.best`` and its only child, the lower fragment, was just refreshed.
            (fragment,) = m.best.children.values()
            refreshed[r] = tuple(fragment.key)
        lock = m.last_device
        tree.inc_lock(lock)
        need = (len(key) - hit) * ps
        free = cap - tree.dev_used
        if need > free:
            asked = need - free
            nodes = tree.n_nodes
            freed = tree.evict_device(asked).freed
            evictions += 1
            evicted_nodes += nodes - tree.n_nodes  # eviction only removes nodes
            over = max(0, freed - asked)
            overshoot += over
            max_overshoot = max(max_overshoot, over)
            free = cap - tree.dev_used
        fit = hit + min(len(key) - hit, free // ps)
        truncated += (len(key) - fit) * ps
        split = False
        if unit_nodes:
            for end in range(hit + 1, fit + 1):
                split |= tree.insert(key[:end]).split
        elif fit:
            split = tree.insert(key[:fit]).split
        if split:  # a theorem, not an input condition
            raise AssertionError(f"request {r}: insert split a node after the match")
        tree.dec_lock(lock)
    hit_units = sum(per_request)
    denom = input_tokens if input_tokens is not None else sum(len(p) for p in paths) * ps
    return LruTreeRun(
        capacity_tokens=cap,
        page_size=ps,
        hit_tokens=hit_units * ps,
        input_tokens=denom,
        hit_rate=hit_units * ps / denom if denom else 0.0,
        per_request=tuple(per_request),
        occupancy=tuple(occupancy),
        refreshed=refreshed,
        evictions=evictions,
        evicted_tokens=stats.drop_tokens + stats.delete_tokens,
        evicted_nodes=evicted_nodes,
        overshoot_tokens=overshoot,
        max_overshoot_tokens=max_overshoot,
        splits=stats.splits,
        truncated_tokens=truncated,
    )


def lru_tree_curve(
    requests: Iterable[Sequence[int]],
    capacities_tokens: Iterable[int],
    page_size: int,
    *,
    input_tokens: int | None = None,
    unit_nodes: bool = False,
) -> list[LruTreeRun]:
    """``run_lru_tree`` at each capacity (one run per capacity)."""
    paths = as_unit_paths(requests)
    return [run_lru_tree(paths, c, page_size, input_tokens=input_tokens, unit_nodes=unit_nodes)
            for c in capacities_tokens]


@dataclass(frozen=True)
class LruComparison:
    """The LRU tree run and the stack curve at one capacity, both over ``input_tokens``."""

    capacity_tokens: int
    stack_hit_tokens: int
    tree_hit_tokens: int
    input_tokens: int
    tree: LruTreeRun

    @property
    def stack_hit_rate(self) -> float:
        return self.stack_hit_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def tree_hit_rate(self) -> float:
        return self.tree_hit_tokens / self.input_tokens if self.input_tokens else 0.0


def compare_lru(trace: UnitTrace, capacities_tokens: Iterable[int]) -> list[LruComparison]:
    """Stack-curve and real-tree LRU hit tokens side by side, SGLang's denominator."""
    ps = trace.page_size
    curve = lru_hit_curve(trace.paths)
    out = []
    for cap in capacities_tokens:
        rep = run_lru_tree(trace.paths, _check_capacity(cap), ps, input_tokens=trace.input_tokens)
        out.append(LruComparison(cap, curve.hit_units(cap // ps) * ps, rep.hit_tokens,
                                 trace.input_tokens, rep))
    return out
