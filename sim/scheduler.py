"""SGLang 0.5.23's scheduler policy, per replica: admission, KV allocation, retraction.

The engine (``sim.events``) runs the TP group's loop; this module is what each rank's
scheduler decides inside one iteration, written from SGLang's code:

* **Admission** (`Scheduler._get_new_batch_prefill_raw`, schedule_policy.py
  `PrefillAdder`): the early returns on ``batch_is_full`` and the request-row budget,
  `calc_priority` (sim/policies/schedule.py: the queue's order under
  ``scheduler.schedule_policy``; every 32nd call `_touch_waiting_prefixes`), the
  continuing chunk first (`add_chunked_req`), then each waiting request in order:
  `init_next_round_input` matches it (stamping recency, maybe splitting a node) before
  `add_one_req` decides, so the request that fails is matched too. `add_one_req`
  pins the matched prefix, checks the memory budget (`PrefillBudget.check_prefill`)
  *before* any load-back, then `init_load_back`, then commits (`_commit_prefill_admission`).
* **Allocation**: nothing is allocated at admission. `prepare_for_extend` ->
  `alloc_for_extend` evicts once for the whole batch (extend tokens plus one page per
  request, `alloc_paged_token_slots_extend`) and takes whole pages per request.
  Decode allocates step by step (`update_running_batch`: `check_decode_mem` evicts
  what the step's new pages need; `alloc_for_decode` keeps one page per request free).
* **Retraction** (`ScheduleBatch.retract_decode`): when a step's pages do not fit, the
  requests with the fewest outputs (then the longest inputs) are released without
  an insert (`release_req`: `release_kv_cache(checkpoint=False)`, then an eviction of
  20 steps of room per request left) and re-queued at the back; the new-token ratio
  is re-estimated.
* **Results** (`checkpoint_into_tree`): every insert of a sequence longer than its
  prompt inserts the prompt key a second time, with priority + 1, splitting the leaf
  at the prompt boundary.

Simplifications (docs/SCHEDULER.md, "How the engine still differs"): a request's
``max_new_tokens`` is its trace output length and it stops there; no priority
preemption, LoRA, grammar or mixed chunks.
"""

from __future__ import annotations

from sim import constants as C

# PrefillAdder's verdicts (schedule_policy.py AddReqResult).
CONTINUE, NO_TOKEN, OTHER = "continue", "no_token", "other"


def page_ceil(tokens: int, ps: int) -> int:
    return -(-tokens // ps) * ps


class SchedState:
    """One replica's scheduler state that outlives an iteration."""

    __slots__ = ("batch_is_full", "priority_calls", "ratio", "ratio_min", "ratio_decay")

    def __init__(self, conservativeness: float = 1.0):
        # NewTokenRatioTracker.from_config
        init = min(C.INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)
        self.ratio_min = min(init * C.MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.ratio_decay = (init - self.ratio_min) / C.NEW_TOKEN_RATIO_DECAY_STEPS
        self.ratio = init
        self.batch_is_full = False
        self.priority_calls = 0   # SchedulePolicy._waiting_prefix_refresh_calls

    def copy(self) -> "SchedState":
        s = SchedState.__new__(SchedState)
        for k in SchedState.__slots__:
            setattr(s, k, getattr(self, k))
        return s

    def decay(self, steps: int) -> None:
        """``steps`` decode steps without retraction (`decay_step` each)."""
        cur, lo, d = self.ratio, self.ratio_min, self.ratio_decay
        while steps > 0 and cur > lo:
            cur = max(cur - d, lo)
            steps -= 1
        self.ratio = cur


def available(tree) -> int:
    """`allocator.available_size()`: free whole pages, in tokens. Running requests'
    pages (``tree.reserved``) and frees still in flight are not free."""
    ps = tree.page_size
    return tree.device_capacity // ps * ps - tree.dev_used - tree.reserved


class Budget:
    """`PrefillBudget` (mem_cache/prefill_budget.py) for one prefill pass: offsets for
    admitted but unallocated work against the replica's live pool."""

    __slots__ = ("tree", "ps", "total_offset", "current_offset")

    def __init__(self, tree, total_offset: float):
        self.tree = tree
        self.ps = tree.page_size
        self.total_offset = total_offset
        self.current_offset = 0

    def _available_and_evictable(self) -> int:
        return available(self.tree) + self.tree.evictable

    @property
    def remaining_total(self) -> float:
        return self._available_and_evictable() - self.total_offset

    @property
    def remaining_current(self) -> float:
        return self._available_and_evictable() - self.current_offset

    def has_capacity(self) -> bool:
        return self.remaining_total > 0 and self.remaining_current > 0

    def reserve(self, extend: int, max_new: int) -> None:
        immediate = page_ceil(extend, self.ps) + self.ps
        self.total_offset += immediate + max_new
        self.current_offset += immediate


class Adder:
    """One replica's `PrefillAdder`: the pass's budgets and what it admitted."""

    __slots__ = ("budget", "rem_input", "rem_chunk", "ps", "clip")

    def __init__(self, budget: Budget, max_prefill_tokens: int, chunk: int | None,
                 clip: int = C.CLIP_MAX_NEW_TOKENS):
        self.clip = clip  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
        self.budget = budget
        self.rem_input = max_prefill_tokens
        self.rem_chunk = chunk
        self.ps = budget.ps

    def state(self) -> str:
        """`budget_state`: the verdict for the next candidate."""
        if not self.budget.has_capacity():
            return NO_TOKEN
        if self.rem_input <= 0:
            return OTHER
        if self.rem_chunk is not None and self.rem_chunk <= 0:
            return OTHER
        return CONTINUE

    def select(self, fill: int, prefix: int, total_tokens: int, out_len: int, first: bool):
        """`_select_prefill_admission`: (extend, max_new, chunked) or a verdict."""
        ps = self.ps
        extend = fill - prefix
        input_tokens = page_ceil(extend, ps)
        if not total_tokens < self.budget.remaining_total:
            return NO_TOKEN
        rem_chunk = self.rem_chunk
        if rem_chunk is None and not first and input_tokens >= self.rem_input:
            return OTHER
        if rem_chunk is not None and input_tokens > rem_chunk:
            extend = rem_chunk // ps * ps
            extend = (prefix + extend) // ps * ps - prefix
            if extend <= 0:
                return OTHER
            return extend, 0, True
        return extend, min(out_len, self.clip), False

    def charge(self, extend: int, max_new: int) -> None:
        """`_update_prefill_budget` (the compute budgets take the page-ceiled extend)."""
        self.budget.reserve(extend, max_new)
        ext = page_ceil(extend, self.ps)
        self.rem_input -= ext
        if self.rem_chunk is not None:
            self.rem_chunk -= ext

    def chunk_room(self) -> int:
        """`PrefillBudget.available_chunk_tokens` for the continuing chunk."""
        room = min(self.rem_chunk, int(self.budget.remaining_total))
        return room if room > 0 else self.rem_chunk


def running_offset(running, ratio: float, ignore_eos: bool = False, lag=(),
                   clip: int = C.CLIP_MAX_NEW_TOKENS) -> float:
    """`PrefillAdder.__init__`'s total_offset: each running request's remaining decode
    tokens (clipped at ``clip``, SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION) times the
    new-token ratio, summed in batch order; a request with ``ignore_eos`` is charged in
    full, still clipped (`_get_running_request_total_token_offset`). ``lag``: rids whose
    last token is not yet processed (the overlap loop's last batch): their `output_ids`
    are one short."""
    if lag:
        rem = [min(rq.r.output_len - rq.generated + (rq.r.rid in lag), clip) for rq in running]
    else:
        rem = [min(rq.r.output_len - rq.generated, clip) for rq in running]
    if ignore_eos:
        return float(sum(rem))
    return sum(x * ratio for x in rem)


def retraction_order(batch, lag=()) -> list[int]:
    """`_get_decode_retraction_order` ("length"): most-preferred to keep first; the
    retract loop pops from the end (fewest outputs, then longest input). ``lag``: the
    overlap loop's in-flight rids, whose last token is not in `output_ids` yet."""
    idx = list(range(len(batch)))
    if lag:
        idx.sort(key=lambda i: (batch[i].generated - (batch[i].r.rid in lag),
                                -batch[i].r.input_len), reverse=True)
    else:
        idx.sort(key=lambda i: (batch[i].generated, -batch[i].r.input_len), reverse=True)
    return idx


def ratio_after_retract(kept, lag=()) -> float:
    """`estimate_new_token_ratio_after_retract` over the requests left (``lag`` as for
    `retraction_order`)."""
    decoded = sum(rq.generated for rq in kept)
    if lag:
        decoded -= sum(rq.r.rid in lag for rq in kept)
    max_new = sum(rq.r.output_len for rq in kept)
    return min(1.0, (decoded + C.RETRACT_DECODE_STEPS * len(kept)) / (max_new + 1))


def steps_without_event(avail: int, evictable: bool, phases: list[int], b: int, ps: int,
                        limit: int) -> int:
    """Decode steps from now, at most ``limit``, before one that must evict or retract
    on a replica with ``avail`` free tokens: a step evicts when fewer than one page per
    request is free and something is evictable (`alloc_for_decode`), and retracts when
    its new pages do not fit (`check_decode_mem`). ``phases[p]``: requests whose
    committed length is ``p`` mod ``ps``; such a request needs a page at step ``j``
    when ``(p + j) % ps == 0``. Every ``ps`` steps each request takes one page, so
    whole cycles are skipped while at least a page per request stays free."""
    full = b * ps
    cycle = b * ps
    q = max(0, (avail - full) // cycle) if avail >= full else 0
    j = q * ps
    if j >= limit:
        return limit
    avail -= q * cycle
    while j < limit:
        need = ps * phases[(-j) % ps]
        if avail < need or (evictable and avail < full):
            return j
        avail -= need
        j += 1
    return limit
