"""The request contract between workloads and the engine, and the builder registry.

A workload is any iterable of :class:`Request` in non-decreasing ``arrival``. The
engine consumes only this dataclass; generators and trace readers produce it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Protocol, runtime_checkable


@dataclass(slots=True, frozen=True)
class Request:
    """One inference request, as the scheduler sees it.

    ``blocks[i]`` names the whole prefix up to and including block ``i`` (Mooncake's
    convention): two requests share block ``i`` only if they share every block before
    it. Ids are non-negative ints, unique across the whole stream. ``len(blocks) ==
    ceil(input_len / block_size)``: the last block may be partial.
    """

    rid: int  # 0, 1, 2, ... in arrival order
    arrival: float  # seconds from the start of the run
    blocks: tuple[int, ...]  # prefix-block ids
    block_size: int  # tokens per block
    input_len: int  # input tokens (the last block may be partial)
    output_len: int  # tokens to decode
    session: int  # conversation / session id (-1 when none)


@runtime_checkable
class Workload(Protocol):
    """An iterable of :class:`Request` in non-decreasing arrival order.

    Iterating twice yields the same stream (every builder here re-creates its seeded
    state in ``__iter__``). ``skipped`` counts malformed input lines that were skipped
    (``skip_bad_lines``): a trace reader's own, a generator's those of its ``trace``
    arrival file (0 for a synthetic process).
    """

    def __iter__(self) -> Iterator[Request]: ...


class IdSpace:
    """Hands out fresh prefix-block ids for one workload stream.

    Every source of a stream (a generator, a trace reader, each part of a mix) draws
    its ids here, so ids from different sources never collide. The counter lives in
    the stream, not in a module global, so two streams built from the same scenario
    give identical ids (determinism).
    """

    __slots__ = ("next_id",)

    def __init__(self) -> None:
        self.next_id = 0

    def new(self) -> int:
        i = self.next_id
        self.next_id = i + 1
        return i

    def new_range(self, n: int) -> range:
        """``n`` fresh consecutive ids (one call per block run, not per block)."""
        start = self.next_id
        self.next_id = start + n
        return range(start, start + n)


# A builder turns a validated workload config (a pydantic model from sim.scenario)
# plus a seed into a Workload: builder(config, seed, ids=None). `ids` is the id space
# shared by every source of one stream (a fresh one when omitted). Registered by the
# config's `kind` name.
Builder = Callable[..., Iterable[Request]]
WORKLOADS: dict[str, Builder] = {}


def register(kind: str) -> Callable[[Builder], Builder]:
    """Decorator: register a workload builder under ``kind``."""

    def deco(fn: Builder) -> Builder:
        if kind in WORKLOADS:
            raise ValueError(f"workload kind {kind!r} registered twice")
        WORKLOADS[kind] = fn
        return fn

    return deco
