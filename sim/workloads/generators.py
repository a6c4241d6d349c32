"""Seeded synthetic workloads, streamed in arrival order.

Each builder takes a validated config (``sim.scenario``), a seed and the stream's
:class:`IdSpace`, and returns an iterator of :class:`Request`. Randomness comes from
``numpy.random.Generator(PCG64)`` children of ``SeedSequence(seed)``, one per
quantity (arrivals, lengths, choices, ...), so one quantity's draws never depend on how
many of another were taken. Lengths are drawn in batches (``Draws``): no per-request
numpy call, no per-token work. Blocks are built per block run, from id ranges.

Kinds:

* ``multi_turn_chat``: sessions arrive by the arrival process; each starts with one
  of a few shared system prompts, and turn k+1's input is turn k's input + output +
  new user text, after a think time. Reusable: every full block of the previous input.
* ``agentic_tool_loop``: like chat with a long shared tools/system prefix, a unique
  task, then many short appends (tool results) per step with short tool times.
* ``few_shot``: a few templates shared by many independent requests (uniform or Zipf
  popularity), each followed by a unique suffix.
* ``zipf_documents``: RAG: a shared instruction, then a document of several blocks
  drawn by Zipf popularity, then a unique question.
* ``uniform``: independent requests with fresh blocks only: no reuse (a control).

All times are divided by the config's ``rate_scale`` (> 1 compresses the timeline:
arrivals and think times alike).

Open loop: a session's next turn arrives ``think time`` after the previous *arrival*
(the simulated response time is not known here), so think times include the response.
Decoded tokens of a turn are part of the next turn's input but get fresh block ids:
traces hash only inputs, and the engine caches outputs under ``keys.output_key``.
"""

from __future__ import annotations

import heapq
from typing import Iterator

import numpy as np

from sim.workloads.arrivals import arrivals
from sim.workloads.base import IdSpace, Request, register
from sim.workloads.dists import Draws, ZipfChoice


def _rngs(seed: int, n: int) -> list[np.random.Generator]:
    return [np.random.Generator(np.random.PCG64(s)) for s in np.random.SeedSequence(seed).spawn(n)]


def _draws(rng, spec, *, integer=True, minimum=1) -> Draws:
    """Draws for a distribution spec from the schema (``dist`` plus its params)."""
    return Draws(rng, spec.dist, spec.params(), integer=integer, minimum=minimum)


def _prefix_pool(n: int, lengths: Draws, block_size: int, ids: IdSpace) -> list[tuple[int, tuple]]:
    """``n`` shared prefixes: (token length, ids of its full blocks)."""
    pool = []
    for _ in range(n):
        length = lengths()
        pool.append((length, tuple(ids.new_range(length // block_size))))
    return pool


def _extend(shared: tuple, n_tokens: int, block_size: int, ids: IdSpace) -> tuple:
    """Blocks for ``n_tokens`` of input whose full-block prefix ``shared`` is reused."""
    n_all = -(-n_tokens // block_size)
    return shared + tuple(ids.new_range(n_all - len(shared)))


class _Stream:
    """A generator's requests and the reader of its arrival times: ``skipped`` counts
    the malformed lines a ``trace`` arrival file skipped (summary.json
    ``skipped_trace_lines``), 0 for a synthetic process."""

    __slots__ = ("_requests", "_times")

    def __init__(self, requests: Iterator[Request], times):
        self._requests, self._times = requests, times

    def __iter__(self) -> Iterator[Request]:
        return self._requests

    @property
    def skipped(self) -> int:
        return self._times.skipped if self._times is not None else 0


# -- independent requests ---------------------------------------------------------
def _independent(cfg, rng, make) -> _Stream:
    """Requests at the arrival process's times; ``make()`` -> (blocks, input, output)."""
    times, reader = arrivals(cfg.arrival, rng)

    def requests():
        scale = cfg.rate_scale
        for rid, t in zip(range(cfg.num_requests), times):
            blocks, n_in, n_out = make()
            yield Request(rid, t / scale, blocks, cfg.block_size, n_in, n_out, -1)

    return _Stream(requests(), reader)


@register("uniform")
def uniform(cfg, seed: int, ids: IdSpace | None = None) -> _Stream:
    """No reuse: every block of every request is fresh (the control)."""
    ids = ids if ids is not None else IdSpace()
    r = _rngs(seed, 3)  # r[0]: arrivals, in every builder
    n_in, n_out = _draws(r[1], cfg.input_tokens), _draws(r[2], cfg.output_tokens, minimum=0)
    bs = cfg.block_size

    def make():
        k = n_in()
        return _extend((), k, bs, ids), k, n_out()

    return _independent(cfg, r[0], make)


@register("few_shot")
def few_shot(cfg, seed: int, ids: IdSpace | None = None) -> _Stream:
    """A few shared templates (uniform or Zipf popularity) + a unique suffix each."""
    ids = ids if ids is not None else IdSpace()
    r = _rngs(seed, 5)
    bs = cfg.block_size
    pool = _prefix_pool(cfg.num_templates, _draws(r[1], cfg.template_tokens), bs, ids)
    pick = ZipfChoice(r[2], cfg.num_templates, cfg.template_zipf_s)
    suffix, n_out = _draws(r[3], cfg.suffix_tokens), _draws(r[4], cfg.output_tokens, minimum=0)

    def make():
        length, shared = pool[pick()]
        k = length + suffix()
        return _extend(shared, k, bs, ids), k, n_out()

    return _independent(cfg, r[0], make)


@register("zipf_documents")
def zipf_documents(cfg, seed: int, ids: IdSpace | None = None) -> _Stream:
    """RAG: shared instruction + a Zipf-popular document + a unique question.

    Document ranks are 0..n-1, rank 0 the most popular; a document's blocks get ids
    on first use. Its length is drawn up front (one vectorized draw for all).
    """
    ids = ids if ids is not None else IdSpace()
    r = _rngs(seed, 5)
    bs = cfg.block_size
    sys_len = cfg.system_prompt_tokens
    sys_ids = tuple(ids.new_range(sys_len // bs))
    doc_len = _draws(r[1], cfg.document_tokens)
    lengths = [doc_len() for _ in range(cfg.num_documents)]
    docs: dict[int, tuple] = {}
    pick = ZipfChoice(r[2], cfg.num_documents, cfg.zipf_s)
    question, n_out = _draws(r[3], cfg.question_tokens), _draws(r[4], cfg.output_tokens, minimum=0)

    def make():
        d = pick()
        shared_len = sys_len + lengths[d]
        shared = docs.get(d)
        if shared is None:  # the document's full blocks (its prefix includes sys)
            shared = docs[d] = sys_ids + tuple(ids.new_range(shared_len // bs - len(sys_ids)))
        k = shared_len + question()
        return _extend(shared, k, bs, ids), k, n_out()

    return _independent(cfg, r[0], make)


# -- sessions -----------------------------------------------------------------------
def _sessions(cfg, seed: int, ids: IdSpace | None, **kw) -> _Stream:
    """``_session_requests``' stream, with its arrival file's skipped lines."""
    r = _rngs(seed, 8)
    starts, reader = arrivals(cfg.arrival, r[0])
    return _Stream(_session_requests(cfg, r, starts, ids, **kw), reader)


def _session_requests(cfg, r, starts, ids: IdSpace | None, *, n_prefixes, prefix_tokens,
                      first_tokens, append_tokens, turns, gap_s) -> Iterator[Request]:
    """Sessions whose context grows turn by turn, merged in arrival order.

    Turn 1: a shared prefix (one of ``n_prefixes``) + ``first_tokens``. Turn k+1:
    turn k's input + its output + ``append_tokens``, ``gap_s`` after turn k. A session
    ends after ``turns`` turns or before its input would pass ``max_context_tokens``.
    """
    ids = ids if ids is not None else IdSpace()
    bs, scale = cfg.block_size, cfg.rate_scale
    pool = _prefix_pool(n_prefixes, _draws(r[1], prefix_tokens), bs, ids)
    pick = ZipfChoice(r[2], n_prefixes, 0.0)
    first, append = _draws(r[3], first_tokens), _draws(r[4], append_tokens)
    n_out = _draws(r[5], cfg.output_tokens, minimum=0)
    n_turns = _draws(r[6], turns)
    gap = _draws(r[7], gap_s, integer=False, minimum=0.0)
    max_ctx = cfg.max_context_tokens

    # heap of (next arrival, session, turns left, previous blocks, previous input, next input)
    heap: list[tuple] = []
    next_start = next(starts, None)
    session = 0
    for rid in range(cfg.num_requests):
        if next_start is not None and (not heap or next_start <= heap[0][0]):
            length, shared = pool[pick()]
            n_in = length + first()
            t, s, left, blocks = next_start, session, n_turns(), _extend(shared, n_in, bs, ids)
            session += 1
            next_start = next(starts, None)
        elif heap:
            t, s, left, prev, prev_in, n_in = heapq.heappop(heap)
            blocks = _extend(prev[: prev_in // bs], n_in, bs, ids)
        else:
            return  # a trace of session starts ran out and every session is done
        out = n_out()
        yield Request(rid, t / scale, blocks, bs, n_in, out, s)
        left -= 1
        if left > 0:
            next_in = n_in + out + append()
            if next_in <= max_ctx:  # else the session ends: its context is full
                heapq.heappush(heap, (t + gap(), s, left, blocks, n_in, next_in))


@register("multi_turn_chat")
def multi_turn_chat(cfg, seed: int, ids: IdSpace | None = None) -> _Stream:
    return _sessions(cfg, seed, ids, n_prefixes=cfg.num_system_prompts,
                     prefix_tokens=cfg.system_prompt_tokens, first_tokens=cfg.user_tokens,
                     append_tokens=cfg.user_tokens, turns=cfg.turns, gap_s=cfg.think_time_s)


@register("agentic_tool_loop")
def agentic_tool_loop(cfg, seed: int, ids: IdSpace | None = None) -> _Stream:
    return _sessions(cfg, seed, ids, n_prefixes=cfg.num_shared_prefixes,
                     prefix_tokens=cfg.shared_prefix_tokens, first_tokens=cfg.task_tokens,
                     append_tokens=cfg.step_tokens, turns=cfg.steps, gap_s=cfg.tool_time_s)
