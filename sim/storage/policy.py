"""Prefetch decisions and host memory modes, exactly as SGLang 0.5.23 computes them
(docs/STORAGE.md §2-3). Pure functions: no clock, no tree.

Sources (under sglang/srt/): ``mem_cache/unified_radix_cache.py``
(``prefetch_from_storage``, ``_can_terminate_prefetch``, ``_start_storage_prefetch_wait``,
``_prefetch_deadline_expired``, ``check_prefetch_progress``,
``_drain_storage_control_queues_impl``), ``mem_cache/unified_cache/storage_attachment.py``
(``resolve_prefetch_threshold``, ``apply_runtime_config``),
``mem_cache/hybrid_cache/hybrid_cache_controller.py`` (``parse_storage_backend_extra_config``,
``allocate_storage_hit``), ``managers/cache_controller.py`` (``attach_storage_backend``,
``prefetch_rate_limited``), ``arg_groups/hicache_hook.py``
(``validate_hicache_host_memory_mode``, ``handle_hicache_ratio_default``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sim import constants as C

HOST_MEMORY_MODES = ("cache", "buffer_only")


# ------------------------------------------------------------------ threshold
def tree_prefetch_threshold(configured: int = C.PREFETCH_THRESHOLD_DEFAULT, *,
                            host_memory_mode: str = "cache",
                            swa_full_window_pages: int | None = None,
                            page_size: int = 1) -> int:
    """The tree's ``prefetch_threshold`` (tokens): the configured value
    (extra_config ``prefetch_threshold``, default 256), raised under buffer_only to an
    SWA component's full window (``StorageAttachment.resolve_prefetch_threshold``).
    No ``max`` with the page size here: that is only the controller's copy."""
    if type(configured) is not int:
        # parse_storage_backend_extra_config: "prefetch_threshold must be int"
        raise ValueError(f"prefetch_threshold must be int, got {type(configured).__name__}")
    if host_memory_mode == "buffer_only" and swa_full_window_pages is not None:
        configured = max(configured, swa_full_window_pages * page_size)
    return configured


def controller_prefetch_threshold(threshold: int, page_size: int) -> int:
    """The cache controller's copy: ``max(prefetch_threshold, page_size)``
    (``attach_storage_backend``)."""
    return max(threshold, page_size)


# ------------------------------------------------------------------ timeout
def prefetch_timeout_s(requested_tokens: int, page_size: int,
                       base_s: float = C.PREFETCH_TIMEOUT_BASE_S,
                       per_ki_token_s: float = C.PREFETCH_TIMEOUT_PER_KI_TOKEN_S) -> float:
    """The ``timeout`` policy's budget for one prefetch, in seconds, float for float
    as SGLang: ``apply_runtime_config`` sets ``prefetch_timeout_per_page =
    page_size / 1024 * per_ki_token``; ``_start_storage_prefetch_wait`` computes
    ``base + (stats_requested_tokens // page_size) * prefetch_timeout_per_page``.
    ``requested_tokens`` is the page-aligned prefetch key's length at issue."""
    per_page = page_size / 1024 * per_ki_token_s
    pages = requested_tokens // page_size
    return float(base_s) + pages * per_page


# ------------------------------------------------------------------ issue
def prefetch_capacity_limit(host_logical_size: int, host_memory_mode: str = "cache") -> int:
    """``prefetch_capacity_limit`` (``attach_storage_backend``): cache mode leaves half
    the host pool for write-back, ``int(0.5 * logical_size)``; buffer_only
    ``int(0.9 * size)``."""
    if host_memory_mode == "buffer_only":
        return int(C.HICACHE_LOAD_POOL_USAGE_FRACTION * host_logical_size)
    return int(C.PREFETCH_CAPACITY_FRACTION_CACHE * host_logical_size)


def rate_limited(tokens_occupied: int, capacity_limit: int) -> bool:
    """Cache mode's ``prefetch_rate_limited``: the requested spans of in-flight
    prefetches (``prefetch_tokens_occupied``) reached the cap."""
    return tokens_occupied >= capacity_limit


def issue_decision(requested_tokens: int, threshold: int, tokens_occupied: int,
                   capacity_limit: int) -> str | None:
    """Whether ``prefetch_from_storage`` issues a prefetch of ``requested_tokens``
    (the page-aligned key after the matched prefix): None if it does, else the
    decline reason, in SGLang's order of checks: ``"too_short"``
    (``declined_too_short``; a zero-length key is no attempt at all: ``"empty"``), then
    ``"rate_limited"`` (``declined_rate_limited``)."""
    if requested_tokens < threshold:
        return "empty" if requested_tokens == 0 else "too_short"
    if rate_limited(tokens_occupied, capacity_limit):
        return "rate_limited"
    return None


def anchor_allows_prefetch(anchor_is_root: bool, anchor_backed_up: bool) -> bool:
    """Cache mode's gate in ``Scheduler._prefetch_kvcache``: a prefetch anchors only
    on the root or a backed-up node (``is_backuped(last_host_node) or
    is_root(last_host_node)``)."""
    return anchor_is_root or anchor_backed_up


# ------------------------------------------------------------------ the storage hit
def storage_hit_alloc(hit_tokens: int, host_free: Callable[[], int],
                      evict_host: Callable[[int], int], page_size: int,
                      threshold: int) -> int:
    """Host slots a storage hit gets in cache mode, or 0 (revoked, reason
    ``host_capacity``), as ``_try_alloc_storage_hit`` calls
    ``allocate_storage_hit(hit, allow_partial=True, min_tokens=prefetch_threshold,
    evict_host=self.evict_host)`` on a non-shared host layout:

    1. allocate ``hit`` if it fits;
    2. else ``evict_host(hit)`` (the **whole** hit, not the shortfall) and retry;
    3. else the partial fallback: ``min(hit, free - free % page_size)``, kept only if
       ``>= min_tokens``.

    A hit below the threshold never gets here: it is revoked first
    (``below_threshold``, see ``hit_decision``)."""
    if hit_tokens <= host_free():
        return hit_tokens
    evict_host(hit_tokens)
    free = host_free()
    if hit_tokens <= free:
        return hit_tokens
    alloc_len = min(hit_tokens, free - free % page_size)
    return alloc_len if alloc_len >= threshold else 0


def hit_decision(hit_tokens: int, threshold: int, terminated: bool) -> str | None:
    """What the drain of ``prefetch_hit_queue`` does with a rank-agreed hit before
    allocating: ``"terminated"`` (the op was terminated meanwhile: revoke),
    ``"below_threshold"`` (revoke; a zero hit is a storage miss), or None (go on to
    ``storage_hit_alloc``)."""
    if terminated:
        return "terminated"
    if hit_tokens < threshold:
        return "below_threshold"
    return None


# ------------------------------------------------------------------ stop policies
@dataclass
class PrefetchWait:
    """``_StoragePrefetchWait``: the timeout policy's per-request timer. It starts at
    the first *blocked* admission poll (``PollTimer.observe(ready=False)``), not at
    issue, and keeps its budget across re-issues of the same request."""

    timeout_s: float = 0.0
    started_at: float | None = None
    expired: bool = False


class PrefetchPolicy:
    """A prefetch stop policy (``--hicache-storage-prefetch-policy``): one rank's vote
    in ``_can_terminate_prefetch`` at an admission poll of a prefetch that is not yet
    terminated. ``timed``: the policy keeps a per-request timer (``PrefetchWait``),
    started at the first blocked poll and marked expired at termination; its votes are
    MAX-reduced across the TP group (``terminate_consensus``), one collective per poll."""

    __slots__ = ()
    name = ""
    timed = False

    def can_terminate(self, *, kv_landed: bool, wait: PrefetchWait | None, now: float) -> bool:
        raise NotImplementedError


class BestEffort(PrefetchPolicy):
    """Always terminates: the request is admitted with what has landed."""

    __slots__ = ()
    name = "best_effort"

    def can_terminate(self, *, kv_landed, wait, now) -> bool:
        return True


class WaitComplete(PrefetchPolicy):
    """Never terminates at a poll: completion arrives through the ack drain."""

    __slots__ = ()
    name = "wait_complete"

    def can_terminate(self, *, kv_landed, wait, now) -> bool:
        return False


class Timeout(PrefetchPolicy):
    """``_prefetch_deadline_expired``: not when all KV has landed; else when the wait
    exists and is marked expired, or its timer runs and ``now - started_at >
    timeout_s`` (strictly)."""

    __slots__ = ()
    name = "timeout"
    timed = True

    def can_terminate(self, *, kv_landed, wait, now) -> bool:
        if kv_landed:
            return False
        return wait is not None and (wait.expired or (
            wait.started_at is not None and now - wait.started_at > wait.timeout_s))


# SGLang's three policies, by name (in SGLang any other value falls through to
# terminating; the scenario schema accepts only these names).
PREFETCH_POLICIES: dict[str, PrefetchPolicy] = {
    p.name: p for p in (BestEffort(), WaitComplete(), Timeout())
}


def prefetch_policy(policy: str | PrefetchPolicy) -> PrefetchPolicy:
    """The registry's policy for a name (a policy object passes through)."""
    return PREFETCH_POLICIES[policy] if isinstance(policy, str) else policy


def can_terminate(policy: str | PrefetchPolicy, *, kv_landed: bool,
                  wait: PrefetchWait | None, now: float) -> bool:
    """One rank's vote in ``_can_terminate_prefetch`` under ``policy`` (a registry
    name or policy object; ``PrefetchPolicy.can_terminate``)."""
    return prefetch_policy(policy).can_terminate(kv_landed=kv_landed, wait=wait, now=now)


def terminate_consensus(votes) -> bool:
    """The timeout verdict every rank uses: an all_reduce MAX of the votes (any rank
    timed out terminates on all)."""
    return max(int(bool(v)) for v in votes) == 1


def poll(policy: str | PrefetchPolicy, *, terminated: bool, kv_landed: bool, wait: PrefetchWait | None,
         now: float, requested_tokens: int, page_size: int,
         base_s: float = C.PREFETCH_TIMEOUT_BASE_S,
         per_ki_token_s: float = C.PREFETCH_TIMEOUT_PER_KI_TOKEN_S,
         consensus: bool | None = None) -> tuple[bool, PrefetchWait | None]:
    """One single-rank admission poll, ``check_prefetch_progress``: returns
    ``(done, wait)``. ``done`` False: the request stays queued; the first blocked poll
    under ``timeout`` starts the wait (budget ``prefetch_timeout_s``). ``done`` True:
    the prefetch is terminated here (the caller then revokes it if no hit was staged,
    else inserts what has landed); under ``timeout`` the wait is marked expired.
    ``consensus``: the TP group's reduced verdict (``terminate_consensus`` over every
    rank's ``can_terminate``), which replaces this rank's own vote when given."""
    if not terminated:
        pol = prefetch_policy(policy)
        verdict = (pol.can_terminate(kv_landed=kv_landed, wait=wait, now=now)
                   if consensus is None else consensus)
        if not verdict:
            if pol.timed and wait is None:
                wait = PrefetchWait(prefetch_timeout_s(requested_tokens, page_size,
                                                       base_s, per_ki_token_s), now)
            return False, wait
        if pol.timed:
            wait = wait or PrefetchWait()
            wait.expired = True
    return True, wait


# ------------------------------------------------------------------ host memory modes
@dataclass(frozen=True)
class HostMode:
    """The resolved host memory configuration."""

    mode: str                 # "cache" or "buffer_only"
    write_policy: str         # write_back is resolved to write_through under buffer_only
    hicache_ratio: float | None  # None only on a decode server (resolved later)
    tree_holds_host: bool     # cache: the tree keeps host values; buffer_only: never


def resolve_host_mode(mode: str = C.HOST_MEMORY_MODE_DEFAULT, *,
                      storage_backend: str | None = None,
                      write_policy: str = C.HICACHE_WRITE_POLICY_DEFAULT,
                      hicache_ratio: float | None = None, hicache_size: int = 0,
                      disaggregation_mode: str = "null") -> HostMode:
    """``--hicache-host-memory-mode`` as 0.5.23 resolves it
    (``validate_hicache_host_memory_mode``, ``handle_hicache_ratio_default``):

    * the mode must be ``cache`` (default) or ``buffer_only``;
    * ``--hicache-ratio`` defaults to 2.0 (cache) or 1.2 (buffer_only), except on a
      decode server (resolved later); ``--hicache-size`` > 0 still overrides the
      ratio when the pool is sized (``hicache_size`` is only checked here);
    * buffer_only needs ``--hicache-storage-backend``, turns ``write_back`` into
      ``write_through`` (there is no host tier to write back to) and is refused on
      decode instances.
    Raises ValueError as SGLang does for the invalid combinations."""
    if mode not in HOST_MEMORY_MODES:
        raise ValueError(f"hicache_host_memory_mode must be 'cache' or 'buffer_only', got {mode!r}")
    ratio = hicache_ratio
    if ratio is None and disaggregation_mode != "decode":
        ratio = C.HICACHE_RATIO_BUFFER_ONLY if mode == "buffer_only" else C.HICACHE_RATIO_DEFAULT
    if mode == "cache":
        return HostMode("cache", write_policy, ratio, True)
    if storage_backend is None:
        raise ValueError("--hicache-host-memory-mode buffer_only requires a storage backend "
                         "(--hicache-storage-backend)")
    if disaggregation_mode == "decode":
        raise ValueError("--hicache-host-memory-mode buffer_only is not supported on decode instances")
    if write_policy == "write_back":
        write_policy = "write_through"
    return HostMode("buffer_only", write_policy, ratio, False)
