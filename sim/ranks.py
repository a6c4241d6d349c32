"""A TP group of tree replicas, with copy-on-divergence and seeded jitter.

Ranks whose input event streams have been identical so far form a *cohort* that
shares one tree and one set of ack queues. A rank-specific event (an ack it processes
alone, an extra node id, a different admission order) forks that rank off into its
own cohort with a cloned tree. Without jitter a TP group of 8 is one cohort and costs
about the same as TP=1.

Ack queues are FIFO, as SGLang's are. Each entry completes at ``done`` (the transfer's
finish); rank ``r`` sees it ready at ``done + delay[r]``, its CUDA event firing late.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from sim.config import JitterConfig, SimConfig
from sim.tree import Tree


def _delay_none(rng, p):
    return 0.0


def _delay_uniform(rng, p):
    return float(rng.uniform(p.get("low", 0.0), p.get("high", 1e-3)))


def _delay_exponential(rng, p):
    return float(rng.exponential(p.get("mean", 1e-3)))


def _delay_lognormal(rng, p):
    return float(rng.lognormal(p.get("mu", -7.0), p.get("sigma", 1.0)))


# Per-rank ack completion delay distributions, in seconds.
DELAYS = {"none": _delay_none, "uniform": _delay_uniform,
          "exponential": _delay_exponential, "lognormal": _delay_lognormal}


class Ack:
    """One in-flight transfer's acknowledgement (a write or a load)."""

    __slots__ = ("kind", "ack_id", "done", "delays", "tokens")

    def __init__(self, kind: str, ack_id, done: float, delays, tokens: int):
        self.kind = kind
        self.ack_id = ack_id
        self.done = done
        self.delays = delays  # rank -> extra delay, or None when no rank is delayed
        self.tokens = tokens

    def ready_at(self, rank: int) -> float:
        return self.done if self.delays is None else self.done + self.delays.get(rank, 0.0)


class Cohort:
    """Ranks with identical history: one tree, one pair of FIFO ack queues."""

    __slots__ = ("ranks", "tree", "write_q", "load_q", "ops")

    def __init__(self, ranks: list[int], tree: Tree, write_q=None, load_q=None, ops=None):
        self.ranks = ranks
        self.tree = tree
        self.write_q: deque[Ack] = write_q if write_q is not None else deque()
        self.load_q: deque[Ack] = load_q if load_q is not None else deque()
        self.ops = ops  # the op-trace this cohort has seen (repro bundles), or None

    def ready_count(self, q: deque, rank: int, now: float) -> int:
        """Acks ready from the front of ``q`` up to the first that is not (`query()`)."""
        n = 0
        for ack in q:
            if ack.ready_at(rank) > now:
                break
            n += 1
        return n

    @property
    def label(self) -> str:
        return ",".join(map(str, self.ranks))


class RankGroup:
    """The TP group: cohorts of ranks, the fork log, and per-rank jitter streams."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.tp = cfg.tp
        j: JitterConfig = cfg.jitter
        self.jitter = j
        self.forks: list[dict] = []
        self.seed = cfg.seed if j.seed is None else j.seed
        self._rngs = [np.random.Generator(np.random.PCG64([self.seed, 7919, r])) for r in range(cfg.tp)]
        self._delay = DELAYS[j.ack_delay]
        self._delay_ranks = (set(range(cfg.tp)) if j.ack_delay_ranks is None
                             else {r for r in j.ack_delay_ranks if r < cfg.tp})
        if j.ack_delay == "none":
            self._delay_ranks = set()
        base = self._make_tree(0)
        self.cohorts: list[Cohort] = [Cohort(list(range(cfg.tp)), base,
                                             ops=[] if cfg.record_ops else None)]
        # Ranks whose physical inputs differ from the start get their own replica at
        # t=0: a skewed host pool, or a host allocator that can fail on its own.
        eager = set(j.host_capacity_skew) | set(j.host_alloc_failure_ranks if j.host_alloc_failure_p > 0 else ())
        if cfg.eager_replicas:
            eager = set(range(1, cfg.tp))
        for r in sorted(x for x in eager if x < cfg.tp and cfg.tp > 1):
            cause = ("host_capacity_skew" if r in j.host_capacity_skew else
                     "host_alloc_failure" if r in j.host_alloc_failure_ranks else "eager_replicas")
            self.fork(r, cause, 0.0)
        for c in self.cohorts:
            self._apply_physical(c)

    # ---------------------------------------------------------------- trees
    def _make_tree(self, rank: int) -> Tree:
        cfg = self.cfg
        return Tree(device_capacity=cfg.device_tokens, host_capacity=cfg.host_tokens,
                    page_size=cfg.page_size, write_policy=cfg.write_policy,
                    host_policy=cfg.host_policy, eviction_policy=cfg.eviction_policy,
                    load_back_threshold=cfg.load_back_threshold, ids=cfg.ids)

    def _apply_physical(self, c: Cohort) -> None:
        """Rank-local physical state of a single-rank cohort."""
        j = self.jitter
        if len(c.ranks) != 1:
            return
        r = c.ranks[0]
        if r in j.host_capacity_skew:
            c.tree.host_capacity = max(0, self.cfg.host_tokens + j.host_capacity_skew[r])
        if j.host_alloc_failure_p > 0 and r in j.host_alloc_failure_ranks:
            rng = np.random.Generator(np.random.PCG64([self.seed, 104729, r]))
            p = j.host_alloc_failure_p
            c.tree.host_alloc_fail = lambda: bool(rng.random() < p)

    def cohort_of(self, rank: int) -> Cohort:
        for c in self.cohorts:
            if rank in c.ranks:
                return c
        raise KeyError(rank)

    def fork(self, rank: int, cause: str, now: float, detail: str = "") -> Cohort:
        """Copy-on-divergence: give ``rank`` its own replica from here on."""
        c = self.cohort_of(rank)
        if len(c.ranks) == 1:
            return c
        c.ranks.remove(rank)
        new = Cohort([rank], c.tree.clone(), deque(c.write_q), deque(c.load_q),
                     list(c.ops) if c.ops is not None else None)
        self.cohorts.append(new)
        self.cohorts.sort(key=lambda x: x.ranks[0])
        self.forks.append({"t": now, "rank": rank, "cause": cause, "detail": detail})
        self._apply_physical(new)
        return new

    # ---------------------------------------------------------------- acks
    def make_ack(self, kind: str, ack_id, done: float, tokens: int) -> Ack:
        delays = None
        if self._delay_ranks and self.jitter.ack_delay_acks in ("both", kind):
            p = self.jitter.ack_delay_params
            delays = {r: self._delay(self._rngs[r], p) for r in sorted(self._delay_ranks)}
        return Ack(kind, ack_id, done, delays, tokens)

    def next_ready_time(self, ack: Ack) -> list[float]:
        """Times at which some rank sees ``ack`` ready (to wake the scheduler)."""
        if ack.delays is None:
            return [ack.done]
        return sorted({ack.done} | {ack.done + d for d in ack.delays.values()})

    def swap_order(self, rank: int, n: int) -> list[int] | None:
        """Admission order of a batch of ``n`` on ``rank`` (request-order jitter)."""
        j = self.jitter
        if n < 2 or j.request_order_swap_p <= 0 or rank not in j.request_order_ranks:
            return None
        rng = self._rngs[rank]
        order = list(range(n))
        w = max(2, j.request_order_window)
        for i in range(n - 1):
            if rng.random() < j.request_order_swap_p:
                k = min(n - 1, i + int(rng.integers(1, w)))
                order[i], order[k] = order[k], order[i]
        return order if order != list(range(n)) else None
