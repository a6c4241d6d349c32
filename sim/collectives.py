"""The collectives a TP group runs: the per-step MIN all_reduce of the HiCache sync
(sem §5.2) and the forward pass's TP all_reduce.

Two backends behind one interface (``Collective``):

- ``simulated``: an in-process element-wise MIN. It knows what a real group would do
  with a skipped call or mismatched sizes, and raises ``CollectiveError`` carrying the
  line a real server would die with (``LINES`` below).
- ``torch``: real ``torch.distributed``, one spawned process per rank, each running only
  its own rank's calls. A skipped call really blocks the other ranks inside gloo (or
  NCCL), and mismatched sizes really go over the wire; the error reported is what the
  library did, detected by its own timeout.

The engine gives each call the scheduler step and a call-site name, and the ranks that
entered it: a rank of ``range(world)`` missing from ``inputs`` skipped the call.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import math
import os
import shutil
import signal
import tempfile
import time
import weakref
from datetime import timedelta

from sim.errors import UserError
from sim.policies import resolve

# ----------------------------------------------------------------------------------
# The lines a real server dies with
# ----------------------------------------------------------------------------------
# Every message the simulated backend prints, in one place. The gloo ones are verbatim
# what the torch backend observed with the pinned torch==2.13.0 CPU wheel, whose gloo is
# built from /__w/pytorch/pytorch/third_party/gloo (tests/test_collectives.py checks the
# torch backend still prints them):
#
# - gloo_timeout: gloo/transport/tcp/unbound_buffer.cc:78, raised as a RuntimeError by
#   the collective in every rank that entered a call a peer skipped, after the group's
#   timeout (at world 4 one rank reports the same text for its "send operation", :129).
# - gloo_size: gloo/transport/tcp/pair.cc:456, a GLOO_ENFORCE on the receive path. It
#   throws on gloo's transport thread, so it is no Python exception: the receiving
#   process aborts (SIGABRT) printing "terminate called after throwing an instance of
#   'gloo::EnforceNotMet'" and then "  what():  " + this line. Its peers then fail with
#   "Connection reset by peer" (pair.cc:537) or "Connection closed by peer" (:553).
#   When gloo checks nothing (see gloo_size_check), the line is gloo_timeout instead.
# - nccl_timeout: ProcessGroupNCCL.cpp, WorkNCCL::checkTimeout, logged by the watchdog
#   before it aborts the communicator and takes the process down. Not observable here
#   (no GPU): the template follows the torch 2.x source, where the prefix is logPrefix()
#   ("[PG ID <id> PG GUID <guid>(<desc>) Rank <rank>] "; older torch printed "[Rank 0] ")
#   and the work prints as WorkNCCL(SeqNum=, OpType=, NumelIn=, NumelOut=, Timeout(ms)=).
#   The default group's prefix is used; a server's TP sub-group has its own id and desc.
#   NCCL never checks sizes: ranks with different numel wedge in the same kernel (sglang
#   PR #33442), so a size mismatch under NCCL is this same timeout.
LINES = {
    "gloo_timeout": ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
                     "unbound_buffer.cc:78] Timed out waiting {ms}ms for recv operation to complete"),
    # The same timeout on the send path (unbound_buffer.cc:129): all_reduces of
    # different sizes that gloo does not check, where the shorter rank returns and the
    # longer one waits to send its next segment (measured: int64 1 vs 3 at world 2).
    "gloo_send_timeout": ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/"
                          "tcp/unbound_buffer.cc:129] Timed out waiting {ms}ms for send "
                          "operation to complete"),
    "gloo_size": ("[enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
                  "pair.cc:456] op.preamble.length <= op.nbytes. {sent} vs {expected}. Received data "
                  "size doesn't match expected size. Is there a distributed collective mismatch in "
                  "your code?"),
    # A peer that died (a Python exception on another rank): the next call on the
    # closed connection (pair.cc:537, as a real TP-2 group's surviving rank printed
    # it). The address is the dead peer's gloo pair, its port the real run's own:
    # ``<port>`` here (tools/conformance_tp2.py compares the line with it masked).
    "gloo_peer_reset": ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "
                        "Read error [127.0.0.1]:<port>: Connection reset by peer. This is "
                        "typically caused by a remote worker hanging or bugs in the "
                        "application. Check the logs of the remote worker before reporting "
                        "an error. GLHF! \U0001f3d6\ufe0f"),
    "nccl_timeout": ("[PG ID 0 PG GUID 0(default_pg) Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, "
                     "OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, Timeout(ms)={ms}) ran for "
                     "{ran} milliseconds before timing out."),
}

# What a real server's group times out after. SGLang's --dist-timeout ("timeout for
# torch.distributed") is unset by default, so torch's defaults apply
# (torch/distributed/constants.py: default_pg_timeout = 30 min for gloo,
# default_pg_nccl_timeout = 10 min).
SERVER_TIMEOUT_S = {"gloo": 1800.0, "nccl": 600.0}
# The NCCL watchdog polls every kWatchdogThreadSleepMillis: torch's
# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, `constexpr int64_t
# kWatchdogThreadSleepMillis = 100;`, the sleep between the watchdog loop's
# `WorkNCCL::checkTimeout` passes (`ProcessGroupNCCL::Watchdog::runLoop`; the .cpp is not
# in the wheel, so tests cannot read it). "ran for" is the timeout plus up to one poll;
# printing the timeout plus one poll keeps outputs deterministic.
NCCL_WATCHDOG_POLL_MS = 100
# How long a blocked call of the torch backend waits (collective.timeout_s): hicache-sim's
# own default, not a server's (a server waits SERVER_TIMEOUT_S); short, so a wedged
# group ends a run in seconds. The one source: the scenario schema and SimConfig read it.
DEFAULT_TIMEOUT_S = 10.0

# The sync vector is int64 (sem §5.2): 8 bytes an element in gloo's size checks.
SYNC_ITEMSIZE = 8

# The torch backend's forward all_reduce sends a float32 zeros tensor of the batch's
# token count. Only equality across ranks matters, so counts above this cap are not
# sent as they are (1<<20 float32 = 4 MiB per call bounds memory and time): see
# _forward_sizes.
FORWARD_NUMEL_CAP = 1 << 20

# How many recent calls ``Collective.log`` keeps (enough to show the lead-up to an error).
LOG_CALLS = 64


def gloo_segments(numel: int, world: int) -> list[int]:
    """Elements per segment of gloo's ring allreduce (gloo/allreduce.cc) for one rank's
    tensor: 2 * world segments of ceil(numel / (2 * world)) elements, the tail ones
    shorter or empty."""
    seg = math.ceil(numel / (2 * world))
    return [max(0, min(seg, numel - i * seg)) for i in range(2 * world)]


def gloo_size_check(numels, world: int, itemsize: int) -> tuple[int, int] | None:
    """What gloo does with these per-rank element counts: ``(sent, expected)`` bytes for
    pair.cc's size enforce, or None where it checks nothing and blocks instead.

    Ranks exchange segment by segment. A receiver whose segment is smaller than the one
    its peer sends fails the enforce; at the first segment where two ranks both have
    data of different sizes, that happens. Empty segments are never exchanged, so where
    sizes differ only by who has a segment at all (4 vs 2 int64 at world 2), the
    shorter rank returns (a wrong result) and the longer one waits for segments that
    never come: a timeout. Reproduces all 15 cases measured with real gloo at world 2,
    3 and 4 (tests/test_collectives.py lists them)."""
    segs = [gloo_segments(n, world) for n in numels]
    for i in range(2 * world):
        sizes = {s[i] for s in segs if s[i]}
        if len(sizes) > 1:
            return max(sizes) * itemsize, min(sizes) * itemsize
    return None


# ----------------------------------------------------------------------------------
# Calls as each rank issues them, paired by order per process group
# ----------------------------------------------------------------------------------
class Call(NamedTuple):
    """One collective as one rank issues it. ``group``: the process group it runs on,
    "cpu" (the TP group's gloo ``cpu_group``: the request broadcast and the HiCache
    syncs) or "device" (the forward's all_reduce, NCCL on a server)."""

    group: str
    site: str
    op: str  # "all_reduce" or "broadcast"
    numel: int
    dtype: str

    def as_dict(self) -> dict:
        return {"group": self.group, "site": self.site, "op": self.op,
                "shape": [self.numel], "dtype": self.dtype}


# The first collective of every scheduler iteration: `broadcast_pyobj` (utils/common.py)
# called from `RequestReceiver._broadcast_reqs_across_ranks`
# (managers/scheduler_components/request_receiver.py) on `tp_group.cpu_group`, whose
# first call on every rank is `dist.broadcast` of a 1-element torch.long size tensor
# from the TP group's first rank. A rank that leaves an iteration early (no batch: no
# forward, `event_loop_normal`'s `else: self.on_idle()`) blocks here next.
REQUEST_BROADCAST = Call("cpu", "request_broadcast", "broadcast", 1, "int64")


def pair_outcome(calls: dict[int, Call], world: int, transport: str) -> tuple[str, str | None]:
    """What one process group does when call n of every rank meets the others' call n.

    Returns (kind, line key): "ok" (identical calls); "misaligned" (same op, size and
    dtype from different sites: a group pairs calls by order only, ProcessGroupGloo by
    its per-group sequence tag `nextTag()`, NCCL by launch order, so both return with
    a result meant for another call and every later pairing is shifted); "hang" or
    "size_mismatch". Under gloo, measured with torch==2.13.0 at world 2
    (tests/test_collectives.py, ``test_a_skip_pairs_the_next_call_as_gloo_does``): an
    all_reduce meeting a broadcast blocks both ranks until the timeout, whatever the
    sizes (int64 4 vs 1, 3 vs 1, 1 vs 1, 1 vs 4); all_reduces of different sizes
    follow ``gloo_size_check`` (1 vs 3 int64: the shorter rank returns, the longer one
    times out on its send). Under NCCL nothing is checked: ranks wedge (sglang PR
    #33442), a hang."""
    first = next(iter(calls.values()))
    if all(c == first for c in calls.values()):
        return "ok", None
    if all(c[2:] == first[2:] for c in calls.values()):
        return "misaligned", None
    if transport == "nccl":
        return "hang", "nccl_timeout"
    # The line is the lowest failing rank's, as measured: its wait is a send (:129) or
    # a receive (:78) depending on where it stands in the exchange.
    if len({c.op for c in calls.values()}) > 1:
        r = min(calls)  # every rank blocks
        return "hang", ("gloo_send_timeout" if r == 0 and calls[r].op == "broadcast"
                        else "gloo_timeout")
    itemsize = SYNC_ITEMSIZE if first.dtype == "int64" else 4
    if gloo_size_check([c.numel for c in calls.values()], world, itemsize) is None:
        # the shorter ranks return; the longest ones wait for segments never sent
        longest = max(c.numel for c in calls.values())
        r = min(r for r, c in calls.items() if c.numel == longest)
        return "hang", "gloo_timeout" if r == 0 else "gloo_send_timeout"
    return "size_mismatch", "gloo_size"


def _pending(calls: dict[int, Call]) -> dict[int, dict]:
    return {r: calls[r].as_dict() for r in sorted(calls)}


def _pending_detail(calls: dict[int, Call]) -> str:
    return "; ".join(f"rank {r} in {c.site} ({c.op} {c.dtype}[{c.numel}] on the {c.group} group)"
                     for r, c in sorted(calls.items()))


# ----------------------------------------------------------------------------------
# Errors and the call log
# ----------------------------------------------------------------------------------
class CollectiveError(Exception):
    """A collective that hangs or fails on real hardware.

    ``kind``: "hang" or "size_mismatch". ``step``: the scheduler step (None only through
    the compat ``all_reduce_min(tag, vectors)`` call, which has none). ``site``: the call
    site ("sync", "write_check", "load_check", "forward", ...). ``ranks_in`` entered the
    call, ``ranks_out`` skipped it. ``detail``: what went wrong, from the inputs alone, so
    it is identical across backends. ``line``: the one line a real server dies with (the
    simulated backend's model of it, or what torch.distributed printed)."""

    def __init__(self, kind: str, step: int | None, site: str, ranks_in: list[int],
                 ranks_out: list[int], detail: str, line: str, call: int = 0,
                 pending: dict[int, dict] | None = None):
        at = f"collective #{call}" if step is None else f"step {step}, collective #{call}"
        super().__init__(f"{kind} at {at} ({site}): {detail}")
        self.kind = kind
        self.step = step
        self.site = site
        self.ranks_in = ranks_in
        self.ranks_out = ranks_out
        self.detail = detail
        self.line = line
        self.call = call
        # Each rank's call when the group stopped (site, op, shape), where the engine
        # said what a skipping rank issues next; None for the plain skip.
        self.pending = pending


class CallLog(deque):
    """The last ``LOG_CALLS`` calls, oldest first: one dict per call (a uniform call,
    every rank entering with the same size, is kept compact and read as the same dict)."""

    def __init__(self):
        super().__init__(maxlen=LOG_CALLS)
        # Every call ever recorded, not only those kept. It lives here because the
        # engine reads ``collective.log.calls``: compat, removed once it reads
        # ``Collective.calls``.
        self.calls = 0

    def record(self, entry: dict) -> None:
        self.calls += 1
        self.append(entry)

    def record_uniform(self, step, site: str, world: int, size: int) -> None:
        self.calls += 1
        self.append((self.calls, step, site, world, size))

    @staticmethod
    def _dict(e) -> dict:
        if type(e) is not tuple:
            return e
        call, step, site, world, size = e
        return {"call": call, "step": step, "site": site, "ranks_in": list(range(world)),
                "sizes": dict.fromkeys(range(world), size)}

    def __getitem__(self, i):
        return self._dict(super().__getitem__(i))

    def __iter__(self):
        return map(self._dict, super().__iter__())

    def __eq__(self, other) -> bool:
        return list(self) == list(other)

    __hash__ = None


def _skip_detail(ranks_in, ranks_out) -> str:
    return (f"ranks {ranks_in} entered all_reduce, ranks {ranks_out} skipped it; "
            "the joined ranks block until the watchdog fires")


# ----------------------------------------------------------------------------------
# The interface
# ----------------------------------------------------------------------------------
class Collective:
    """A TP group's collectives. Subclasses implement ``_min`` and ``_forward``."""

    name = "base"

    def __init__(self, world: int, device: str = "cpu", timeout_s: float | None = None):
        self.world = world
        self.device = device
        # What a real server's call would run on; the engine prices sync cost by it.
        self.transport = "nccl" if device == "cuda" else "gloo"
        self.timeout_s = timeout_s
        self.log = CallLog()
        self._all_ranks = frozenset(range(world))

    @property
    def calls(self) -> int:
        """Collectives issued so far (for divergence.json)."""
        return self.log.calls

    def repeat(self, n: int) -> None:
        """Count ``n`` calls that repeat the last ones with the same inputs: the
        identical iterations of a decode run, which the engine prices at once."""
        self.log.calls += n

    def all_reduce_min(self, step, site=None, inputs=None, next_calls=None) -> list[int]:
        """The per-step sync: element-wise MIN of the entering ranks' int64 vectors.

        ``inputs`` maps each rank that entered the call to its vector; a rank of
        ``range(world)`` absent from it skipped the call. Returns what every entering
        rank receives. Raises ``CollectiveError``: "hang" on a skip, "size_mismatch" on
        differing lengths (the torch backend reports what gloo did instead).

        ``next_calls`` maps each skipping rank to the call it issues next on the same
        group (``Call``): that call is what meets the entering ranks' one, and the
        outcome is ``pair_outcome``'s (the torch backend really issues it)."""
        if inputs is None and isinstance(step, str):
            # compat: removed once the engine uses all_reduce_min(step, site, inputs)
            step, site, inputs = None, step, site
        ranks_in, ranks_out = self._split(inputs)
        call = self.log.calls + 1
        if not ranks_out:
            # ranks of one replica often enter with one vector object: each once
            distinct = list({id(v): v for v in inputs.values()}.values())
            n = len(distinct[0])
            if all(len(v) == n for v in distinct):
                # every rank in, one size: the compact entry, read back as the same dict
                self.log.record_uniform(step, site, self.world, n)
                return self._min_agreed(call, step, site, inputs, ranks_in, distinct)
        sizes = {r: len(inputs[r]) for r in ranks_in}
        self.log.record({"call": call, "step": step, "site": site, "ranks_in": ranks_in,
                         "sizes": sizes})
        if ranks_out and next_calls:
            missing = [r for r in ranks_out if r not in next_calls]
            if missing:
                raise ValueError(f"no next call for skipping ranks {missing}")
            calls = {r: Call("cpu", site, "all_reduce", sizes[r], "int64") for r in ranks_in}
            calls.update({r: next_calls[r] for r in ranks_out})
            self._paired(call, step, site, inputs, ranks_in, ranks_out, calls)
        return self._min(call, step, site, inputs, ranks_in, ranks_out, sizes)

    def forward(self, step: int, numels: dict[int, int], idle: dict[int, Call] | None = None) -> None:
        """The forward pass's TP all_reduce: each entering rank's activation tensor has
        numel = its batch's token count. Equal everywhere: fine. Different: the real
        kernel gets different element counts (sglang PR #33442: both ranks wedge in the
        same all-reduce kernel) -> CollectiveError, "size_mismatch" or "hang" as the
        backend observes it. A rank absent from ``numels`` skipped it: "hang".

        ``idle`` maps the ranks that have no batch (SGLang's `event_loop_normal` runs no
        forward for them) to the call they block in next on the cpu group
        (``REQUEST_BROADCAST``). The forward runs on the device group, so nothing
        there pairs with the entering ranks' call and nothing on the cpu group pairs
        with the idle ranks' one: a hang naming every rank's pending call."""
        ranks_in, ranks_out = self._split(numels)
        call = self.log.calls + 1
        self.log.record({"call": call, "step": step, "site": "forward", "ranks_in": ranks_in,
                         "sizes": {r: numels[r] for r in ranks_in}})
        if idle:
            if sorted(idle) != ranks_out:
                raise ValueError(f"idle ranks {sorted(idle)} are not the ranks outside the "
                                 f"forward {ranks_out}")
            calls = {r: Call("device", "forward", "all_reduce", numels[r], "float32")
                     for r in ranks_in}
            calls.update(idle)
            self._idle_forward(call, step, numels, ranks_in, ranks_out, calls)
        self._forward(call, step, numels, ranks_in, ranks_out)

    def all_reduce_uniform(self, step: int, site: str, vector: list[int]) -> list[int]:
        """``all_reduce_min`` where every rank enters with the same ``vector``: the
        engine's call when all ranks share one replica and see the same acks. A
        backend may skip the arithmetic (the MIN of equal vectors is the vector); it
        still records the call."""
        return self.all_reduce_min(step, site, {r: vector for r in range(self.world)})

    def forward_uniform(self, step: int, numel: int) -> None:
        """``forward`` where every rank's batch has ``numel`` tokens."""
        self.forward(step, {r: numel for r in range(self.world)})

    def all_reduce_replicas(self, step: int, site: str, groups: list) -> list[int]:
        """``all_reduce_min`` where each group of ranks (a replica's) enters with one
        vector: ``groups`` is [(ranks, vector)], the groups a partition of the TP
        group (``RankGroup.cohorts``). A backend may reduce over the groups' vectors
        alone; the call is the same."""
        inputs = {}
        for ranks, vec in groups:
            inputs.update(dict.fromkeys(ranks, vec))
        return self.all_reduce_min(step, site, inputs)

    def close(self) -> None:
        """Release the group; safe to call twice and after an error."""

    def _split(self, inputs) -> tuple[list[int], list[int]]:
        if len(inputs) == self.world and inputs.keys() == self._all_ranks:
            return list(range(self.world)), []  # every rank entered (the usual call)
        if not inputs:
            raise ValueError("a collective needs at least one entering rank")
        bad = [r for r in inputs if not (isinstance(r, int) and 0 <= r < self.world)]
        if bad:
            raise ValueError(f"ranks {bad} are not in range({self.world})")
        ranks_in = sorted(inputs)
        return ranks_in, [r for r in range(self.world) if r not in inputs]

    def _paired(self, call, step, site, inputs, ranks_in, ranks_out, calls):  # pragma: no cover
        raise NotImplementedError

    def _idle_forward(self, call, step, numels, ranks_in, ranks_out, calls):  # pragma: no cover
        raise NotImplementedError

    def _min(self, call, step, site, inputs, ranks_in, ranks_out, sizes):  # pragma: no cover
        raise NotImplementedError

    def _min_agreed(self, call, step, site, inputs, ranks_in, distinct) -> list[int]:
        """``_min`` for a call every rank entered with vectors of one size
        (``distinct``: the vector objects, each once); a backend that really
        communicates issues it as any other."""
        n = len(distinct[0])
        return self._min(call, step, site, inputs, ranks_in, [], dict.fromkeys(ranks_in, n))

    def _forward(self, call, step, numels, ranks_in, ranks_out):  # pragma: no cover
        raise NotImplementedError


# ----------------------------------------------------------------------------------
# Simulated backend
# ----------------------------------------------------------------------------------
class SimulatedCollective(Collective):
    """In-process: the MIN itself, and a model of how a real group fails."""

    name = "simulated"

    def _server_ms(self, transport: str) -> int:
        s = self.timeout_s if self.timeout_s is not None else SERVER_TIMEOUT_S[transport]
        return int(round(s * 1000))

    def _nccl_line(self, call, rank, numel) -> str:
        ms = self._server_ms("nccl")
        return LINES["nccl_timeout"].format(rank=rank, seq=call, numel=numel, ms=ms,
                                            ran=ms + NCCL_WATCHDOG_POLL_MS)

    def _hang_line(self, call, rank, numel) -> str:
        if self.transport == "nccl":
            return self._nccl_line(call, rank, numel)
        return LINES["gloo_timeout"].format(ms=self._server_ms("gloo"))

    def _size_line(self, call, sizes, itemsize) -> str:
        if self.transport == "nccl":
            r0 = min(sizes)
            return self._nccl_line(call, r0, sizes[r0])
        check = gloo_size_check(sizes.values(), self.world, itemsize)
        if check is None:  # gloo checks nothing: the longer ranks wait for their peers
            return LINES["gloo_timeout"].format(ms=self._server_ms("gloo"))
        return LINES["gloo_size"].format(sent=check[0], expected=check[1])

    def all_reduce_uniform(self, step: int, site: str, vector: list[int]) -> list[int]:
        # The fast path of an optimisation that must not change results: the same
        # log entry as all_reduce_min's, no per-rank arithmetic.
        self.log.record_uniform(step, site, self.world, len(vector))
        return list(vector)

    def forward_uniform(self, step: int, numel: int) -> None:
        self.log.record_uniform(step, "forward", self.world, numel)

    def all_reduce_replicas(self, step: int, site: str, groups: list) -> list[int]:
        n = len(groups[0][1])
        if (sum(len(ranks) for ranks, _ in groups) == self.world
                and all(len(vec) == n for _, vec in groups)):
            # every rank in (the groups partition the TP group), one size: what
            # all_reduce_min logs and returns, without a per-rank map
            self.log.record_uniform(step, site, self.world, n)
            return self._min_agreed(None, step, site, None, None, [vec for _, vec in groups])
        return super().all_reduce_replicas(step, site, groups)

    def _paired(self, call, step, site, inputs, ranks_in, ranks_out, calls):
        kind, key = pair_outcome(calls, self.world, self.transport)
        detail = f"call #{call} pairs {_pending_detail(calls)}"
        r0 = ranks_in[0]
        if kind == "misaligned":
            line = "(no error: each rank returns with a result meant for another call)"
        elif key == "gloo_size":
            check = gloo_size_check([c.numel for c in calls.values()], self.world, SYNC_ITEMSIZE)
            line = LINES["gloo_size"].format(sent=check[0], expected=check[1])
        elif key == "gloo_send_timeout":
            line = LINES[key].format(ms=self._server_ms("gloo"))
        else:
            line = self._hang_line(call, r0, calls[r0].numel)
        raise CollectiveError(kind, step, site, ranks_in, ranks_out, detail, line, call,
                              _pending(calls))

    def _idle_forward(self, call, step, numels, ranks_in, ranks_out, calls):
        r0 = ranks_in[0]
        # The NCCL watchdog (10 min by default) fires before gloo's 30 min timeout.
        raise CollectiveError("hang", step, "forward", ranks_in, ranks_out,
                              f"ranks {ranks_out} have no batch and run no forward: "
                              f"{_pending_detail(calls)}",
                              self._nccl_line(call, r0, numels[r0]), call, _pending(calls))

    def _min(self, call, step, site, inputs, ranks_in, ranks_out, sizes):
        if ranks_out:
            r0 = ranks_in[0]
            raise CollectiveError("hang", step, site, ranks_in, ranks_out,
                                  _skip_detail(ranks_in, ranks_out),
                                  self._hang_line(call, r0, sizes[r0]), call)
        if len(set(sizes.values())) > 1:
            raise CollectiveError("size_mismatch", step, site, ranks_in, ranks_out,
                                  f"tensor sizes differ across ranks: {sizes}",
                                  self._size_line(call, sizes, SYNC_ITEMSIZE), call)
        return self._min_agreed(call, step, site, inputs, ranks_in,
                                list({id(v): v for v in inputs.values()}.values()))

    def _min_agreed(self, call, step, site, inputs, ranks_in, distinct) -> list[int]:
        # the MIN over each distinct vector object once
        out = list(distinct[0])
        for vec in distinct[1:]:
            out = [a if a <= b else b for a, b in zip(out, vec)]
        return out

    def _forward(self, call, step, numels, ranks_in, ranks_out):
        # A real server's forward all_reduce runs on the GPU group (NCCL) whatever the
        # sync's transport, so its failures are the NCCL watchdog's.
        r0 = ranks_in[0]
        line = self._nccl_line(call, r0, numels[r0])
        if ranks_out:
            raise CollectiveError("hang", step, "forward", ranks_in, ranks_out,
                                  _skip_detail(ranks_in, ranks_out), line, call)
        if len(set(numels.values())) > 1:
            raise CollectiveError("size_mismatch", step, "forward", ranks_in, ranks_out,
                                  f"forward all_reduce numel differs across ranks: "
                                  f"{dict(sorted(numels.items()))}", line, call)


# ----------------------------------------------------------------------------------
# Torch backend
# ----------------------------------------------------------------------------------
def _loopback_iface() -> str | None:
    """The loopback interface's name, when the OS has one called "lo" (Linux)."""
    return "lo" if os.path.isdir("/sys/class/net/lo") else None


def _worker_env(device: str, iface: str | None) -> dict[str, str]:
    """Environment a worker sets before importing torch: keep every socket on loopback."""
    env = {"OMP_NUM_THREADS": "1"}  # one rank per core at most; no oversubscription
    if iface:
        # gloo's TCP transport binds its listening socket to this interface's address.
        env["GLOO_SOCKET_IFNAME"] = iface
    if device == "cuda":
        # NCCL's bootstrap (and socket transport, if it falls back to it) listen here.
        # NCCL exists on Linux only, where loopback is "lo".
        env["NCCL_SOCKET_IFNAME"] = iface or "lo"
    return env


def _watch_parent(tmpdir: str) -> None:
    """Exit when the parent process dies, even while the main thread is stuck in a
    collective, and remove the group's files the parent can no longer remove. (Not
    prctl(PR_SET_PDEATHSIG): that fires when the *thread* that spawned the worker exits,
    which kills a healthy group created from a short-lived thread.)"""
    # (the lines below run in a spawned rank process, the torch backend's only)
    import multiprocessing
    import threading
    from multiprocessing.connection import wait

    parent = multiprocessing.parent_process()
    if parent is None:  # pragma: no cover - always set for spawned children
        return

    def watch():
        wait([parent.sentinel])
        shutil.rmtree(tmpdir, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def _worker(rank: int, world: int, device: str, iface: str | None, tmpdir: str,
            timeout_s: float, conn) -> None:
    """One rank's process: joins the group, then runs the calls the parent sends it."""
    # Ctrl-C is the parent's: it closes the group. (SIGINT is also blocked from before
    # this process existed, see TorchCollective._start.)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # gloo's size enforce aborts the process from a C++ thread, printing to fd 2: keep
    # it in a file the parent reads to report it, and off the user's terminal.
    fd = os.open(os.path.join(tmpdir, f"rank{rank}.stderr"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 2)
    os.close(fd)
    _watch_parent(tmpdir)
    os.environ.update(_worker_env(device, iface))

    import torch  # after the environment above: torch reads it at import
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(tmpdir, "store"), world)  # no TCP rendezvous
    timeout = timedelta(seconds=timeout_s)
    if device == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world, timeout=timeout,
                                device_id=torch.device("cuda", rank))

        def all_reduce(t, op):
            t = t.cuda()
            dist.all_reduce(t, op=op)
            return t.cpu()  # waits for the kernel: a wedged one never returns

        dev_reduce = all_reduce

        def broadcast(t):
            t = t.cuda()
            dist.broadcast(t, src=0)
            t.cpu()  # waits, as all_reduce does
    elif iface:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
        # The forward's group, apart from the cpu group as a server's NCCL group is:
        # calls on one never pair with calls on the other.
        dev_pg = dist.new_group(backend="gloo", timeout=timeout)

        def all_reduce(t, op):
            dist.all_reduce(t, op=op)
            return t

        def dev_reduce(t, op):
            dist.all_reduce(t, op=op, group=dev_pg)
            return t

        def broadcast(t):
            dist.broadcast(t, src=0)
    else:
        # No interface named "lo": build gloo's device on 127.0.0.1 explicitly (the
        # default device binds whatever the hostname resolves to).
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        pg = dist.ProcessGroupGloo(store, rank, world, opts)
        dev = dist.ProcessGroupGloo(dist.PrefixStore("device", store), rank, world, opts)

        def all_reduce(t, op, pg=pg):
            o = dist.AllreduceOptions()
            o.reduceOp = op
            pg.allreduce([t], o).wait()
            return t

        def dev_reduce(t, op):
            return all_reduce(t, op, dev)

        def broadcast(t):
            o = dist.BroadcastOptions()
            o.rootRank = 0
            pg.broadcast([t], o).wait()

    conn.send(("ready", os.getpid()))
    msg = ()
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            # The parent went away (its teardown closes the pipes only after the workers
            # are gone). Its files are ours to remove now: a plain return would race the
            # watchdog thread, whose rmtree dies with the interpreter's exit.
            shutil.rmtree(tmpdir, ignore_errors=True)
            os._exit(1)
        if msg is None:
            break
        what, arg = msg
        try:
            if what == "min":
                t = all_reduce(torch.tensor(arg, dtype=torch.int64), dist.ReduceOp.MIN)
                conn.send(("ok", t.tolist()))
            elif what == "bcast":  # the request broadcast's size tensor
                broadcast(torch.zeros(arg, dtype=torch.int64))
                conn.send(("ok", None))
            else:  # "forward": only the element count matters
                dev_reduce(torch.zeros(arg, dtype=torch.float32), dist.ReduceOp.SUM)
                conn.send(("ok", None))
        except Exception as err:  # noqa: BLE001 - every failure goes back to the parent
            # Stay up (the parent sends nothing more and terminates the group): exiting
            # would close this rank's sockets, and peers still waiting in the same call
            # would fail with "Connection closed by peer" instead of their own timeout,
            # depending on who timed out first.
            conn.send(("error", _first_line(err)))
    if msg is None and dist.is_initialized():
        dist.destroy_process_group()
    conn.close()
    # Leave now: the interpreter's own exit waits on torch's threads for seconds (the
    # parent's teardown then terminates the worker after its 5 s join), and there is
    # nothing left to flush (stderr is a file, the pipe is closed).
    os._exit(0)


def _forward_sizes(numels: dict[int, int]) -> dict[int, int]:
    """The tensor sizes the torch backend's forward sends: each numel as it is up to
    ``FORWARD_NUMEL_CAP``; each distinct larger one becomes CAP + 1, CAP + 2, ... (at
    most CAP + world), so equal stays equal and different stays different."""
    big = sorted({n for n in numels.values() if n > FORWARD_NUMEL_CAP})
    return {r: n if n <= FORWARD_NUMEL_CAP else FORWARD_NUMEL_CAP + 1 + big.index(n)
            for r, n in numels.items()}


def _is_timeout(msg: str) -> bool:
    return "Timed out" in msg or "Watchdog caught" in msg


def _is_peer_loss(msg: str) -> bool:
    """gloo's errors for a connection the peer closed (after its own timeout)."""
    return any(s in msg for s in ("Connection reset by peer", "Connection closed by peer",
                                  "Broken pipe"))


class TorchCollective(Collective):
    """Real torch.distributed: one spawned process per rank, driven over pipes.

    A call goes only to the ranks that entered it, so a skip really blocks the others;
    gloo's own timeout (``timeout_s``, given to ``init_process_group``) ends the wait and
    a parent-side deadline a little longer catches a rank that never returns at all.
    After any error the group is unusable: ``close()`` terminates every worker."""

    name = "torch"
    # Start-up is interpreter + torch import per rank: seconds on an idle machine, much
    # longer on an oversubscribed one.
    START_TIMEOUT_S = 600.0

    def __init__(self, world: int, device: str = "cpu", timeout_s: float | None = None,
                 *, _iface: str | None = "auto"):
        super().__init__(world, device, DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)
        try:
            import torch
            import torch.multiprocessing  # noqa: F401
        except ImportError:
            raise UserError("collective backend 'torch' needs torch; install it with "
                            "`pip install torch==2.13.0`") from None
        if device == "cuda" and (not torch.cuda.is_available() or torch.cuda.device_count() < world):
            raise UserError(f"collective device 'cuda' needs {world} GPUs (NCCL rejects "
                            f"two ranks on one GPU); found {torch.cuda.device_count()}",
                            where="collective.device")
        # _iface is for tests: None forces the explicit 127.0.0.1 gloo device.
        self._iface = _loopback_iface() if _iface == "auto" else _iface
        self._broken = False
        self._tmpdir = tempfile.mkdtemp(prefix="hicache-coll-")
        self._conns, self._procs = [], []
        # A group dropped without close() (or left at exit) is still torn down.
        self._finalizer = weakref.finalize(self, _teardown, self._procs, self._conns,
                                           self._tmpdir, True)
        try:
            self._start()
        except BaseException:  # including Ctrl-C during start-up
            self.close()
            raise

    def _start(self) -> None:
        import torch.multiprocessing as mp  # torch is optional: the torch backend only
        from multiprocessing.connection import wait

        ctx = mp.get_context("spawn")
        # Block SIGINT while spawning: the mask is inherited through fork and exec, so a
        # Ctrl-C from the terminal (sent to the whole process group) cannot interrupt a
        # worker before it ignores SIGINT; the parent gets it when the mask is restored.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for rank in range(self.world):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_worker, daemon=True, name=f"hicache-rank{rank}",
                                   args=(rank, self.world, self.device, self._iface, self._tmpdir,
                                         self.timeout_s, child))
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        pending = {c: r for r, c in enumerate(self._conns)}
        sentinels = {p.sentinel: r for r, p in enumerate(self._procs)}
        while pending:
            ready = wait(list(pending) + list(sentinels), timeout=self.START_TIMEOUT_S)
            if not ready:
                raise RuntimeError(f"torch.distributed workers did not start within "
                                   f"{self.START_TIMEOUT_S:.0f} s")
            for obj in ready:
                if obj in pending:
                    try:
                        obj.recv()
                    except EOFError:
                        continue  # it died; its sentinel says so below
                    del pending[obj]
                elif obj in sentinels and self._conns[sentinels[obj]] in pending:
                    r = sentinels[obj]
                    self._procs[r].join(2)
                    raise RuntimeError(f"torch.distributed rank {r} died during start-up (exit "
                                       f"code {self._procs[r].exitcode}): {self._stderr_tail(r)}")

    @property
    def pids(self) -> list[int]:
        """The workers' process ids, rank order."""
        return [p.pid for p in self._procs]

    def _stderr(self, rank: int) -> str:
        try:
            with open(os.path.join(self._tmpdir, f"rank{rank}.stderr"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def _stderr_tail(self, rank: int) -> str:
        lines = [x for x in self._stderr(rank).splitlines() if x.strip()]
        return lines[-1].strip() if lines else "(no output)"

    def _death_line(self, rank: int) -> str | None:
        """The line a dead worker's C++ side printed: gloo's enforce or NCCL's watchdog."""
        for line in self._stderr(rank).splitlines():
            if "enforce fail at" in line:  # "  what():  [enforce fail at ...] ..."
                return line.split("what():", 1)[-1].strip()
            if "Watchdog caught" in line:
                # "[rank0]:[E<date> ProcessGroupNCCL.cpp:<n>] [PG ID 0 ... Rank 0] Watchdog ...":
                # drop glog's prefix, keep torch's own
                at = line.index("Watchdog caught")
                start = max(line.rfind("[PG ", 0, at), line.rfind("[Rank ", 0, at))
                return line[start if start >= 0 else at:].strip()
        return None

    def _call(self, what: str, args: dict[int, object], ranks_in: list[int]) -> dict[int, tuple]:
        """Send one call to the entering ranks and collect each one's outcome:
        ("ok", value), ("error", message), ("died", line or None) or ("stuck", None)."""
        return self._call_each({r: (what, args[r]) for r in ranks_in})

    @staticmethod
    def _msg(c: Call) -> tuple:
        if c.op == "broadcast":
            return ("bcast", c.numel)
        if c.group == "device":
            return ("forward", c.numel)
        return ("min", [0] * c.numel)

    def _call_each(self, msgs: dict[int, tuple]) -> dict[int, tuple]:
        """``_call`` where each rank gets its own message: the ranks' own streams."""
        from multiprocessing.connection import wait

        if self._broken:
            raise RuntimeError("the torch collective group is closed, or unusable after an "
                               "earlier error")
        self._broken = True  # until every entering rank has answered ok
        ranks_in = sorted(msgs)
        for r in ranks_in:
            self._conns[r].send(msgs[r])
        out: dict[int, tuple] = {}
        waiting = {self._conns[r]: r for r in ranks_in}
        sentinels = {self._procs[r].sentinel: r for r in ranks_in}
        # gloo raises at timeout_s; the margin covers a loaded machine, and a rank that
        # is still silent after it is reported as stuck rather than waited on forever.
        deadline = time.monotonic() + self.timeout_s + max(5.0, self.timeout_s / 2)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for obj in wait(list(waiting) + [s for s, r in sentinels.items() if r not in out],
                            timeout=left):
                r = waiting[obj] if obj in waiting else sentinels[obj]
                if r in out:
                    continue
                if obj in waiting:
                    try:
                        out[r] = obj.recv()
                        continue
                    except EOFError:
                        pass  # the pipe closed: the process is dying
                self._procs[r].join(2)  # let its last words reach the stderr file
                out[r] = ("died", self._death_line(r))
            waiting = {c: x for c, x in waiting.items() if x not in out}
        for r in ranks_in:
            out.setdefault(r, ("stuck", None))
        if all(o[0] == "ok" for o in out.values()):
            self._broken = False
        return out

    def _line(self, outcomes: dict[int, tuple], call: int, numel: int, rank: int) -> str:
        """The one line to report: a dead rank's own last words first (that process is
        what took the server down), else the lowest rank's timeout (a peer that then
        fails on the closed connection only echoes it; which rank times out first is
        the machine's timing), else the lowest rank's exception, else the line the
        library would print had it raised."""
        for kind, val in outcomes.values():
            if kind == "died" and val:
                return val
        errors = [outcomes[r][1] for r in sorted(outcomes) if outcomes[r][0] == "error"]
        for val in errors:
            if _is_timeout(val):
                return val
        if errors:
            return errors[0]
        ms = int(round(self.timeout_s * 1000))
        if self.transport == "nccl":
            return LINES["nccl_timeout"].format(rank=rank, seq=call, numel=numel, ms=ms,
                                                ran=ms + NCCL_WATCHDOG_POLL_MS)
        return LINES["gloo_timeout"].format(ms=ms)

    def _raise(self, call, step, site, ranks_in, ranks_out, sizes, outcomes, detail) -> None:
        """Turn the entering ranks' outcomes into the error the group showed."""
        r0 = ranks_in[0]
        line = self._line(outcomes, call, sizes[r0], r0)
        if ranks_out:
            raise CollectiveError("hang", step, site, ranks_in, ranks_out,
                                  _skip_detail(ranks_in, ranks_out), line, call)
        failed = [o for o in outcomes.values() if o[0] != "ok"]
        if not failed:
            # The sizes differed and yet every rank returned: report it all the same.
            raise CollectiveError("size_mismatch", step, site, ranks_in, ranks_out,
                                  f"{detail}; {self.transport} returned without an error", line, call)
        # A rank that failed for another reason than a timeout (gloo's size enforce,
        # or its peers' "Connection reset by peer") saw the sizes; ranks that only
        # timed out saw a hang.
        blocked = all(o[0] == "stuck" or (o[0] == "error" and _is_timeout(o[1]))
                      or (o[0] == "died" and o[1] and _is_timeout(o[1])) for o in failed)
        if blocked:
            raise CollectiveError("hang", step, site, ranks_in, ranks_out,
                                  f"{detail}; {self.transport} blocked instead of failing on it",
                                  line, call)
        raise CollectiveError("size_mismatch", step, site, ranks_in, ranks_out, detail, line, call)

    def _streams(self, call, step, site, ranks_in, ranks_out, calls, msgs, detail):
        """Issue every rank's own call and report what the group did with them."""
        outcomes = self._call_each(msgs)
        self._broken = True
        pending = _pending(calls)
        r0 = ranks_in[0]
        if all(o[0] == "ok" for o in outcomes.values()):
            raise CollectiveError("misaligned", step, site, ranks_in, ranks_out, detail,
                                  "(no error: each rank returns with a result meant for "
                                  "another call)", call, pending)
        line = self._line({r: o for r, o in outcomes.items() if o[0] != "ok"}, call,
                          calls[r0].numel, r0)
        failed = [o for o in outcomes.values() if o[0] != "ok"]
        timed_out = [o for o in failed if o[0] == "stuck" or (o[0] in ("error", "died")
                                                              and o[1] and _is_timeout(o[1]))]
        # Calls of different ops or sites block each other (measured: both ranks time
        # out). On a loaded machine the first rank to time out closes its connections,
        # and a peer still waiting then fails on the lost connection instead: the same
        # hang, seen second-hand.
        blocked = bool(timed_out) and all(
            o in timed_out or (o[1] and _is_peer_loss(o[1])) for o in failed)
        raise CollectiveError("hang" if blocked else "size_mismatch", step, site, ranks_in,
                              ranks_out, detail, line, call, pending)

    def _paired(self, call, step, site, inputs, ranks_in, ranks_out, calls):
        msgs = {r: ("min", list(inputs[r])) for r in ranks_in}
        msgs.update({r: self._msg(calls[r]) for r in ranks_out})
        self._streams(call, step, site, ranks_in, ranks_out, calls, msgs,
                      f"call #{call} pairs {_pending_detail(calls)}")

    def _idle_forward(self, call, step, numels, ranks_in, ranks_out, calls):
        sizes = _forward_sizes({r: numels[r] for r in ranks_in})
        msgs = {r: ("forward", sizes[r]) for r in ranks_in}
        msgs.update({r: self._msg(calls[r]) for r in ranks_out})
        self._streams(call, step, "forward", ranks_in, ranks_out, calls, msgs,
                      f"ranks {ranks_out} have no batch and run no forward: "
                      f"{_pending_detail(calls)}")

    def _min(self, call, step, site, inputs, ranks_in, ranks_out, sizes):
        outcomes = self._call("min", {r: list(inputs[r]) for r in ranks_in}, ranks_in)
        if not ranks_out and all(o[0] == "ok" for o in outcomes.values()) and len(set(sizes.values())) == 1:
            results = [outcomes[r][1] for r in ranks_in]
            if any(x != results[0] for x in results):
                raise RuntimeError(f"ranks got different all_reduce results: {results}")
            return results[0]
        self._broken = True
        self._raise(call, step, site, ranks_in, ranks_out, sizes, outcomes,
                    f"tensor sizes differ across ranks: {sizes}")

    def _forward(self, call, step, numels, ranks_in, ranks_out):
        outcomes = self._call("forward", _forward_sizes(numels), ranks_in)
        if not ranks_out and all(o[0] == "ok" for o in outcomes.values()) and len(set(numels.values())) == 1:
            return
        self._broken = True
        self._raise(call, step, "forward", ranks_in, ranks_out, {r: numels[r] for r in ranks_in},
                    outcomes, f"forward all_reduce numel differs across ranks: "
                              f"{dict(sorted(numels.items()))}")

    def close(self) -> None:
        self._finalizer.detach()
        _teardown(self._procs, self._conns, self._tmpdir, self._broken)
        self._broken = True  # no call after close


def _teardown(procs, conns, tmpdir, broken) -> None:
    """Stop every worker and remove the group's files; never blocks for long. A healthy
    group is asked to leave; a broken one (workers may sit inside gloo) is terminated."""
    if not broken:
        for conn in conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in procs:
            proc.join(timeout=5)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(timeout=2)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=2)
    for conn in conns:
        conn.close()
    procs.clear()
    conns.clear()
    shutil.rmtree(tmpdir, ignore_errors=True)


COLLECTIVES = {"simulated": SimulatedCollective, "torch": TorchCollective}


def make_collective(backend: str, world: int, device: str = "cpu",
                    timeout_s: float | None = None) -> Collective:
    """The named backend for a group of ``world`` ranks. ``timeout_s``: for "torch",
    how long a blocked call waits before it is reported (default 10 s); for
    "simulated", the timeout printed in the lines it reports (default: a real server's,
    ``SERVER_TIMEOUT_S``)."""
    cls = resolve(COLLECTIVES, backend, "collective backend", where="collective.backend")
    return cls(world, device, timeout_s)
