"""Rank-local perturbations and faults, drawn per event.

Every random quantity a rank sees is a pure function of ``(seed, stream, rank, n)``,
where ``n`` numbers that rank's events of one kind (its n-th load ack, its n-th host
allocation attempt, ...). Nothing is drawn from a shared generator, so a value never
depends on which ranks share a replica, how many other draws happened first, or in
what order the engine visits the ranks: shared and eager replicas see the same draws.

``Perturbations`` counts how often each perturbation actually *fired* (an ack that
really was late, an allocation that really failed, a capacity skew that was binding):
the verdict module reports ``absorbed`` only for perturbations that fired, and
``agree`` when none did.
"""

from __future__ import annotations

from sim.config import JitterConfig
from sim.workloads.dists import DISTRIBUTIONS

_M64 = (1 << 64) - 1

# One stream id per kind of draw: independent sequences for the same (rank, n).
STREAM_ACK = 0x41434B          # "ACK"
STREAM_HOST_ALLOC = 0x484F5354  # "HOST"
STREAM_ORDER = 0x4F5244        # "ORD"
STREAM_FREE = 0x46524545       # "FREE"
STREAM_STORAGE = 0x53544F52    # "STOR"
STREAM_STORAGE_LATENCY = 0x534C4F57  # "SLOW"


def _mix(x: int) -> int:
    """splitmix64's finaliser: a bijective 64-bit mix with full avalanche."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def uniform(seed: int, stream: int, rank: int, n: int) -> float:
    """A uniform in (0, 1) keyed by its event: the same key always gives the same value."""
    h = _mix(_mix(_mix(_mix(seed & _M64) ^ stream) ^ rank) ^ (n & _M64))
    return ((h >> 11) + 0.5) * (1.0 / (1 << 53))


# The perturbations, in the order reports list them.
PERTURBATIONS = ("ack_delay", "host_alloc_failure", "host_capacity_skew",
                 "device_capacity_skew", "device_free_delay", "id_drift", "request_order",
                 "storage_miss", "storage_fail", "storage_latency")


class Perturbations:
    """How often each configured perturbation fired in this run."""

    __slots__ = ("configured", "fired")

    def __init__(self, configured: list[str]):
        self.configured = [p for p in PERTURBATIONS if p in configured]
        self.fired: dict[str, int] = {p: 0 for p in self.configured}

    def fire(self, name: str, k: int = 1) -> None:
        self.fired[name] += k

    def as_dict(self) -> dict:
        return dict(self.fired)


class Jitter:
    """The configured perturbations of one run, as per-event draws."""

    def __init__(self, cfg: JitterConfig, tp: int, seed: int, rank_base: int = 0):
        self.cfg = cfg
        self.tp = tp
        self.seed = seed if cfg.seed is None else cfg.seed
        # Draws are keyed by global rank (data-parallel instance i's rank r is
        # i * tp + r), so that two instances never share a draw.
        self.base = rank_base
        configured = []
        if cfg.ack_delay != "none":
            self._ack_dist = DISTRIBUTIONS[cfg.ack_delay]
            ranks = range(tp) if cfg.ack_delay_ranks is None else cfg.ack_delay_ranks
            self.ack_ranks = tuple(sorted({r for r in ranks if 0 <= r < tp}))
            if self.ack_ranks:
                configured.append("ack_delay")
        else:
            self.ack_ranks = ()
        self.alloc_ranks = frozenset(r for r in cfg.host_alloc_failure_ranks if 0 <= r < tp) \
            if cfg.host_alloc_failure_p > 0 else frozenset()
        if self.alloc_ranks:
            configured.append("host_alloc_failure")
        self.host_skew = {r: d for r, d in cfg.host_capacity_skew.items() if 0 <= r < tp and d}
        self.device_skew = {r: d for r, d in cfg.device_capacity_skew.items() if 0 <= r < tp and d}
        if self.host_skew:
            configured.append("host_capacity_skew")
        if self.device_skew:
            configured.append("device_capacity_skew")
        self.free_ranks = frozenset(r for r in cfg.device_free_delay_ranks if 0 <= r < tp) \
            if cfg.device_free_delay != "none" else frozenset()
        if self.free_ranks:
            self._free_dist = DISTRIBUTIONS[cfg.device_free_delay]
            configured.append("device_free_delay")
        self.id_drift = cfg.id_drift_rank is not None and 0 <= cfg.id_drift_rank < tp \
            and cfg.id_drift_extra > 0
        if self.id_drift:
            configured.append("id_drift")
        self.order_ranks = tuple(r for r in cfg.request_order_ranks if 0 <= r < tp) \
            if cfg.request_order_swap_p > 0 else ()
        if self.order_ranks:
            configured.append("request_order")
        self.miss_ranks = frozenset(r for r in cfg.storage_miss_ranks if 0 <= r < tp) \
            if cfg.storage_miss_p > 0 else frozenset()
        if self.miss_ranks:
            configured.append("storage_miss")
        self.fail_ranks = frozenset(r for r in cfg.storage_fail_ranks if 0 <= r < tp)
        if self.fail_ranks:
            configured.append("storage_fail")
        self.slow_ranks = frozenset(r for r in cfg.storage_latency_ranks if 0 <= r < tp)
        if self.slow_ranks:
            self._slow_dist = DISTRIBUTIONS[cfg.storage_latency]
            configured.append("storage_latency")
        self.perturbations = Perturbations(configured)

    @property
    def active(self) -> bool:
        return bool(self.perturbations.configured)

    # ------------------------------------------------------------------ draws
    def ack_delays(self, kind: str, n: int) -> dict[int, float] | None:
        """Extra delay per delayed rank of that rank's ``n``-th ``kind`` ack, or None
        when no rank is delayed for this kind of ack."""
        c = self.cfg
        if not self.ack_ranks or c.ack_delay_acks not in ("both", kind):
            return None
        q, p, seed = self._ack_dist.quantile, c.ack_delay_params, self.seed
        stream = STREAM_ACK + (kind == "write")
        b = self.base
        return {r: q(uniform(seed, stream, b + r, n), p) for r in self.ack_ranks}

    def host_alloc_fails(self, rank: int, n: int) -> bool:
        """Whether ``rank``'s ``n``-th host allocation attempt fails."""
        return uniform(self.seed, STREAM_HOST_ALLOC, self.base + rank, n) < self.cfg.host_alloc_failure_p

    def page_missing(self, rank: int, key: int) -> bool:
        """Whether the page with storage key ``key`` is absent from ``rank``'s storage
        (the same answer every time it is asked)."""
        return uniform(self.seed, STREAM_STORAGE, self.base + rank, key) < self.cfg.storage_miss_p

    def storage_seconds(self, rank: int, n: int, base_s: float) -> float:
        """What ``rank``'s ``n``-th storage call costs when its backend's figure is
        ``base_s`` (``jitter.storage_latency``): ``factor * base_s`` plus the drawn
        extra delay. Only for a rank in ``slow_ranks``."""
        c = self.cfg
        extra = self._slow_dist.quantile(
            uniform(self.seed, STREAM_STORAGE_LATENCY, self.base + rank, n),
            c.storage_latency_params) if c.storage_latency != "none" else 0.0
        return c.storage_latency_factor * base_s + extra

    def free_delay(self, rank: int, n: int) -> float:
        """Delay of ``rank``'s ``n``-th device free of a finished request."""
        c = self.cfg
        return self._free_dist.quantile(uniform(self.seed, STREAM_FREE, self.base + rank, n),
                                        c.device_free_delay_params)

    def admission_order(self, rank: int, batch_no: int, n: int) -> list[int] | None:
        """The order in which ``rank`` admits a batch of ``n`` candidates, or None when
        it is the plain order (request-order jitter)."""
        c = self.cfg
        if n < 2 or rank not in self.order_ranks:
            return None
        order = list(range(n))
        w = max(2, c.request_order_window)
        key, g = batch_no << 24, self.base + rank
        for i in range(n - 1):
            if uniform(self.seed, STREAM_ORDER, g, key + 2 * i) < c.request_order_swap_p:
                u = uniform(self.seed, STREAM_ORDER, g, key + 2 * i + 1)
                k = min(n - 1, i + 1 + int(u * (w - 1)))
                order[i], order[k] = order[k], order[i]
        return order if order != list(range(n)) else None
