"""Per-rank request state: lanes, copy-on-divergence of the scheduler's queues.

SGLang runs one scheduler per TP rank, each with its own waiting queue, running batch
and ``Req`` objects (`Scheduler.__init__`, managers/scheduler.py): the ranks agree on
requests only because they take the same decisions from the same inputs. The engine
keeps one request state for the group while they do (``Simulation.waiting``,
``running``, ...; each request's per-replica slot in ``Req.slots``). When the
replicas' decisions on requests differ (a prefill batch with other requests on some
rank, or a decode step that retracts other requests), the group splits into *lanes*: each set of replicas that took the same decision
gets its own copy of the request state, as ``RankGroup.fork`` copies a tree, and goes
on with its own batches. The lane holding rank 0 keeps the original ``Req`` objects
and the group's metrics (the metrics describe rank 0); the others work on copies.

What still couples the ranks is what couples SGLang's: every iteration's collectives.
The group's loop (``Simulation._loop``) keeps the iteration: the request broadcast
(every arrival reaches every lane), the HiCache sync over every replica (its MIN
all_reduce, the digest assertion), then each lane's batch side by side (``batches``:
the iteration lasts as long as the slowest rank's), then the forward's collective on
the device group with each rank's token count, where a rank with no batch waits in
the next request broadcast. So a run goes on until what really stops it: a digest
assertion, a hang, a size mismatch, or the end.

A lane runs one iteration per decode step (no decode runs: each step's sync pairs
across lanes). The L3 tier and hybrid models keep one request state (their per-request
bookkeeping is shared): there, a split is still ``untracked``.
"""

from __future__ import annotations

import copy
from collections import deque

import simpy

from sim.events import Simulation
from sim.request import Req
from sim.metrics import Metrics
from sim.ranks import GroupView


def can_split(sim: Simulation) -> bool:
    """Whether ``sim``'s request state can split (see the module doc)."""
    return sim._st is None and sim._hyb is None


class Lane(Simulation):
    """One lane's request state, sharing the group's environment, collectives,
    observations and replicas (a shallow copy of the group's ``Simulation``)."""

    @property
    def halted(self):
        return self._root.halted

    @halted.setter
    def halted(self, why):
        self._root.halted = why  # a lane's halt stops the group

    @property
    def finished(self):
        return self._root.finished  # the group's loop is the one that finishes

    @finished.setter
    def finished(self, value):
        self._root.finished = value

    @property
    def _last_relevant(self):
        return self._root._last_relevant

    @_last_relevant.setter
    def _last_relevant(self, t):
        self._root._last_relevant = t

    def _relevant(self, t: float | None = None) -> None:
        self._root._relevant(t)  # the group's loop wakes on every lane's moments

    def _check_over(self) -> None:
        self._root._check_over()  # the group's work is over, not a lane's

    def _kick(self, _event=None) -> None:
        self._root._kick()

    def _compare(self) -> None:
        self._root._compare()  # the ground truth compares every replica

    def _decode_headroom(self, limit: int) -> int:
        # one decode step per iteration: each step's sync pairs with the other lanes'
        return min(1, super()._decode_headroom(limit))

    def tick(self) -> int:
        return self._root.tick()  # a recording group's one clock (sim.repro.case)

    def _forward(self, numels) -> None:
        """The forward's collective is the group's, once every lane has run
        (``batches``): post this lane's ranks' token counts."""
        board = self._root._forward_numels
        if isinstance(numels, int):
            for c in self.group.cohorts:
                for r in c.ranks:
                    board[r] = numels
        else:
            board.update(numels)


_CLASSES: dict[type, type] = {}


def _lane_class(base: type) -> type:
    """``Lane`` over the group's own class (a recording ``TracingSimulation`` keeps its
    hooks in its lanes)."""
    if base is Simulation:
        return Lane
    cls = _CLASSES.get(base)
    if cls is None:
        cls = _CLASSES[base] = type(f"{base.__name__}Lane", (Lane, base), {})
    return cls


def _lane(sim: Simulation, cohorts: list, reqs: dict, own: bool):
    """A lane for ``cohorts``, copying ``sim``'s request state. ``reqs``: the original
    ``Req``'s id -> this lane's copy, filled as they are met. ``own``: the lane keeps
    the original requests (rank 0's). Returns the lane and its mapping function."""
    root = sim._root or sim
    lane = object.__new__(_lane_class(type(root)))
    d = dict(sim.__dict__)
    d.pop("halted", None)
    lane.__dict__.update(d)
    lane._root, lane._lanes = root, None
    lane.group = GroupView(root.group, list(cohorts))
    # each rank's own GPU, scheduler RNG and result scans
    lane.gpu = simpy.Resource(sim.env, capacity=1)
    lane._gpu_hold = lane._hold = lane._fwd_last = None
    lane._run = None
    lane._result_scans = {}
    lane.shuffle = copy.deepcopy(sim.shuffle)
    if not own:
        lane._reports = False
        lane.metrics = Metrics(sim.cfg, sim.cost.bytes_per_token, sim.instance)
        lane.progress = None
    cids = {id(c) for c in cohorts}

    def mine(rq: Req | None) -> Req | None:
        if rq is None:
            return None
        new = reqs.get(id(rq))
        if new is None:
            if own:
                new = rq
            else:
                new = Req.__new__(Req)
                for k in Req.__slots__:
                    setattr(new, k, getattr(rq, k))
            reqs[id(rq)] = new
            new.slots = {k: v for k, v in rq.slots.items() if k in cids}
        return new

    def arg(a):
        if isinstance(a, Req):
            return mine(a)
        if isinstance(a, tuple):
            return tuple(mine(x) if isinstance(x, Req) else x for x in a)
        return a

    lane.waiting = deque(mine(rq) for rq in sim.waiting)
    lane.running = [mine(rq) for rq in sim.running]
    lane.chunked = mine(sim.chunked)
    lane._stash = mine(sim._stash)
    lane._pipelined = False  # a lane's forwards stay in line (its group's ended first)
    lane._finishing = [mine(rq) for rq in sim._finishing]
    lane._inflight = [mine(rq) for rq in sim._inflight]
    lane._pending = [(getattr(lane, fn.__name__), arg(a)) for fn, a in sim._pending]
    return lane, mine


def _split(sim: Simulation, groups: list[list], why: str) -> list:
    """One lane per group of ``sim``'s ``(cohort, plan)`` pairs (the first group holds
    the lowest rank), each plan's requests mapped to its lane's. Returns the lanes."""
    root = sim._root or sim
    made = []
    # the copies first: the lane keeping the originals prunes their slots
    for i in range(len(groups) - 1, -1, -1):
        cps = groups[i]
        lane, mine = _lane(sim, [c for c, _ in cps], {}, own=i == 0 and sim._reports)
        for _, p in cps:
            p.reqs = [mine(rq) for rq in p.reqs]
        made.append(lane)
    made.reverse()
    new = made
    if root._lanes is None:
        root._lanes = new
        root._forward_numels = {}
    else:
        i = root._lanes.index(sim)
        root._lanes[i:i + 1] = new
    root.obs.request_split(sim.env.now, root.step_no,
                           [sorted(r for c, _ in cps for r in c.ranks) for cps in groups], why)
    root._trace("split", "divergence", list(range(root.cfg.tp)), sim.env.now, 0,
                lanes=len(new))
    # what ``sim`` held now lives in its lanes (its replicas stay in view: the rest of
    # its iteration flushes their backups)
    sim.waiting, sim.running, sim.chunked, sim._stash = deque(), [], None, None
    sim._finishing, sim._inflight, sim._pending = [], [], []
    return new


def _group_by(plans: list, key) -> list[list]:
    by: dict = {}
    for c, p in plans:
        by.setdefault(key(c, p), []).append((c, p))
    return list(by.values())  # plans[0] (the lowest rank's) first


def split_prefill(sim: Simulation, plans: list, now: float):
    """The replicas of ``sim`` admitted different requests into this prefill batch:
    one lane per decision, each running the rest of its batch (``_prefill_run``)."""
    groups = _group_by(plans, lambda c, p: tuple(rq.r.rid for rq in p.reqs))
    new = _split(sim, groups, "admission")
    procs = []
    for lane, cps in zip(new, groups):
        lane._proc = p = sim.env.process(lane._prefill_run(cps, now))
        procs.append(p)
    yield simpy.AllOf(sim.env, procs)


def split_decode(sim: Simulation, plans: list, kept_by: dict, abort_by: dict):
    """The replicas of ``sim`` retracted different requests for this decode step
    (`retract_decode` from each rank's own pool): one lane per decision, each applying
    its retraction and running its step; then the step's forward across every rank."""
    key = {id(c): (tuple(kept_by[id(c)]), abort_by[id(c)]) for c, _ in plans}
    groups = _group_by(plans, lambda c, p: key[id(c)])
    new = _split(sim, groups, "retraction")
    root = sim._root or sim
    env = sim.env
    procs = []
    for lane, cps in zip(new, groups):
        kept, aborted = key[id(cps[0][0])]
        work = lane._retract(lane.running, cps, list(kept), aborted)
        lane._proc = p = env.process(_decode_rest(lane, work))
        procs.append(p)
    yield simpy.AllOf(env, procs)
    if sim is root:
        _forward_all(root)


def _decode_rest(lane: Lane, work: list):
    """A lane's decode step after its retraction: its blocking backups, then the step
    (``_decode`` again: its memory work is done, so it finds the step fits), or, with
    nothing left running, the last batch's results."""
    if work:
        yield simpy.AllOf(lane.env, [lane.env.process(lane._stall(c, p)) for c, p in work])
    if lane.running:
        yield from lane._decode()
    else:
        lane._process_pending()
        yield from lane._result_scan_time()
    lane._flush_writes()


def _forward_all(root: Simulation) -> None:
    """The iteration's forward collective over every rank, from the lanes' posted
    token counts: a rank with no batch runs no forward and blocks in the next request
    broadcast."""
    numels, root._forward_numels = root._forward_numels, {}
    if numels:
        root._forward({r: numels.get(r, 0) for r in range(root.cfg.tp)})


def batches(root: Simulation):
    """One iteration's batches, every lane's side by side (each rank's scheduler runs
    its own; the iteration lasts as long as the slowest), then the forward's
    collective across every rank. True when some lane took the step."""
    env = root.env
    root._forward_numels = {}
    procs = []
    for lane in list(root._lanes):
        lane.step_no, lane._iter_step = root.step_no, root._iter_step
        lane._batch_ran = False
        lane._proc = p = env.process(lane._batch())
        procs.append(p)
    yield simpy.AllOf(env, procs)
    _forward_all(root)
    root._batch_ran = any(lane._batch_ran for lane in root._lanes)
    return any(p.value for p in procs)
