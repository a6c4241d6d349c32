"""Running one case with its schedule recorded, and naming how it failed.

``TracingSimulation`` is the engine plus what a repro bundle needs and the engine's
report does not keep: when each op, ack pop and collective call happened (one
global order, ``tick``), every rank's inputs to every collective, which host
allocations failed on which rank, and the order of the shape divergence. It only
wraps the engine's own hooks (``_op``, ``_pop``, ``_compare_shapes``, the collective
object and the tree's ``host_alloc_fail`` draw), so a traced run takes exactly the
decisions an untraced one takes.

Everything recorded is keyed by rank, never by how the engine groups identical ranks
into one replica (``sim/ranks.py``): ranks sharing a replica get one entry each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.collectives import CollectiveError
from sim.commands.run import consensus_line
from sim.constants import DIGEST_MISMATCH_MESSAGE
from sim.events import Simulation
from sim.ranks import log_alloc_failures
from sim.runner import prepare

# Verdicts that are failures (sim/verdict.py).
FAILURE_VERDICTS = ("detected", "false_alarm", "hang", "size_mismatch", "missed")


class _RecordingCollective:
    """Wraps the engine's collective to log every call: the site, each entering rank's
    input (the sync vector, or the forward's numel), and the result or the error."""

    def __init__(self, inner, sim: "TracingSimulation"):
        self.inner = inner
        self.sim = sim

    def _record(self, step, site, inputs) -> dict:
        sim = self.sim
        rec = {"call": len(sim.calls) + 1, "t": sim.env.now, "step": step, "site": site,
               "inputs": {str(r): (list(v) if isinstance(v, (list, tuple)) else v)
                          for r, v in sorted(inputs.items())},
               "g": sim.tick()}
        sim.calls.append(rec)
        return rec

    def _run(self, rec, fn, *args):
        try:
            out = fn(*args)
        except CollectiveError as err:
            rec["error"] = {"kind": err.kind, "detail": err.detail,
                            "ranks_out": list(err.ranks_out)}
            if err.pending is not None:
                rec["error"]["pending"] = {str(r): c for r, c in err.pending.items()}
            raise
        if out is not None:
            rec["result"] = list(out)
        return out

    def all_reduce_min(self, step, site, inputs, next_calls=None):
        rec = self._record(step, site, inputs)
        return self._run(rec, self.inner.all_reduce_min, step, site, inputs, next_calls)

    def all_reduce_uniform(self, step, site, vector):
        rec = self._record(step, site, {r: vector for r in range(self.inner.world)})
        return self._run(rec, self.inner.all_reduce_uniform, step, site, vector)

    def all_reduce_replicas(self, step, site, groups):
        rec = self._record(step, site, {r: vec for ranks, vec in groups for r in ranks})
        return self._run(rec, self.inner.all_reduce_replicas, step, site, groups)

    def forward(self, step, numels, idle=None):
        rec = self._record(step, "forward", numels)
        return self._run(rec, self.inner.forward, step, numels, idle)

    def forward_uniform(self, step, numel):
        rec = self._record(step, "forward", {r: numel for r in range(self.inner.world)})
        return self._run(rec, self.inner.forward_uniform, step, numel)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name):
        return getattr(self.inner, name)


class TracingSimulation(Simulation):
    """The engine, plus the schedule (see the module doc)."""

    def __init__(self, cfg, workload, cost=None, **kwargs):
        super().__init__(cfg, workload, cost, **kwargs)
        self._clock = 0
        self.op_at: dict[int, tuple[int, float, int]] = {}  # id(op) -> (tick, t, step)
        self.calls: list[dict] = []
        self.pops: list[dict] = []       # per rank and sync: the acks it popped
        self.shape_tick: int | None = None
        self.shapes: dict[int, list] | None = None  # rank -> [(rid, prefix, extend)] then
        self.collective = _RecordingCollective(self.collective, self)
        self.alloc_failures: dict[int, list[list[int]]] = {}  # rank -> [[op index, attempt]]
        self.alloc_failure_at: list[dict] = []                # the same, in time order
        for c in self.group.cohorts:
            if c.tree.host_alloc_fail is not None and c.ops is not None:
                self._watch_host_allocs(c)

    def tick(self) -> int:
        self._clock += 1
        return self._clock

    def _op(self, c, op):
        Simulation._op(c, op)
        if c.ops is not None:
            self.op_at[id(op)] = (self.tick(), self.env.now, self.step_no)

    def _pop(self, c, n_write, n_load):
        # Before the pops: their write_ack / load_back_ack ops come after this tick.
        g = self.tick()
        for r in c.ranks:
            self.pops.append({"g": g, "t": self.env.now, "step": self.step_no, "rank": r,
                              "write": n_write, "load": n_load})
        super()._pop(c, n_write, n_load)

    def _compare_shapes(self, plans):
        had = self.obs.shape is not None
        super()._compare_shapes(plans)
        if not had and self.obs.shape is not None:
            self.shape_tick = self.tick()
            # Every rank's whole batch shape: the report's first_request only looks at
            # requests present in a later group's batch, not at one a rank left out.
            self.shapes = dict(sorted((r, [list(x) for x in p.shape])
                                      for c, p in plans for r in c.ranks))

    def _watch_host_allocs(self, c) -> None:
        """Log ``[op index, attempt]`` of each failed host allocation of ``c``'s rank
        (``sim.ranks.log_alloc_failures``), and when in the run each happened."""
        rank = c.ranks[0]

        def at(i: int, a: int) -> None:
            self.alloc_failure_at.append({"g": self.tick(), "t": self.env.now,
                                          "step": self.step_no, "rank": rank,
                                          "op_index": i, "attempt": a})

        self.alloc_failures[rank] = log_alloc_failures(c, at)


@dataclass
class Outcome:
    """One run of a case: its report (divergence.json) and the simulation."""

    scenario: object
    cfg: object
    divergence: dict
    arrived: int          # requests that reached the scheduler before the run ended
    sim: Simulation
    recorded: bool

    @property
    def verdict(self) -> str:
        return self.divergence["verdict"]

    @property
    def failed(self) -> bool:
        return self.verdict in FAILURE_VERDICTS

    @property
    def failure_class(self) -> str | None:
        return failure_class(self.divergence)

    @property
    def events(self) -> int:
        """Recorded ops over every rank (ranks sharing a replica count once each)."""
        if not self.recorded:
            return 0
        return sum(len(c.ops) * len(c.ranks) for c in self.sim.group.cohorts)

    def rank_ops(self) -> dict[int, list[dict]]:
        """Each rank's recorded engine ops, by rank."""
        out = {r: c.ops for c in self.sim.group.cohorts for r in c.ranks}
        return dict(sorted(out.items()))


def run_case(scenario, *, record: bool = False) -> Outcome:
    """Simulate a validated scenario; ``record`` keeps per-rank ops and the schedule."""
    scenario, cfg, cost, workload = prepare(scenario)
    cfg.record_ops = record
    pulled = _Pulled(workload)
    sim = (TracingSimulation if record else Simulation)(cfg, workload=pulled, cost=cost)
    sim.run()
    div = sim.report()
    # Requests the scheduler saw: count arrival times (a halted batch is in neither
    # queue), up to duration_s (the engine drops arrivals after it).
    end = sim.env.now if cfg.duration_s is None else min(sim.env.now, cfg.duration_s)
    arrived = sum(1 for a in pulled.arrivals if a <= end)
    return Outcome(scenario, cfg, div, arrived, sim, record)


class _Pulled:
    """A request stream that remembers the arrival time of each request it handed out."""

    def __init__(self, workload):
        self._it = iter(workload)
        self.arrivals: list[float] = []

    def __iter__(self):
        return self

    def __next__(self):
        req = next(self._it)
        self.arrivals.append(req.arrival)
        return req


# ----------------------------------------------------------------------------------
# How a report fails
# ----------------------------------------------------------------------------------


def first_failure(div: dict) -> tuple[str, dict] | None:
    """The failure a real server hits first, as ``(kind, record)``: "collective" (a
    hang or size mismatch) or "digest" (the assertion). Within one step the sync
    collective comes before its digest check, as ``Observations.verdict`` orders them."""
    found = []
    for prio, (kind, key) in enumerate((("collective", "collective_error"),
                                        ("digest", "digest_mismatch"),
                                        ("consensus", "rank_consensus"))):
        rec = div.get(key)
        if rec:
            found.append((rec["t"], rec["step"], prio, kind, rec))
    if not found:
        return None
    first = min(found, key=lambda x: x[:3])
    return first[3], first[4]


def fired(div: dict) -> list[str]:
    """The perturbations that fired, in ``sim.jitter.PERTURBATIONS`` order."""
    return [k for k, v in (div.get("perturbations") or {}).items() if v]


def failure_class(div: dict) -> str | None:
    """What kind of failure a report shows; None for agree / absorbed. Shrinking keeps
    it: the verdict, how the failure shows (the collective's kind and site, the digest,
    or nothing), and which perturbations fired."""
    v = div["verdict"]
    if v not in FAILURE_VERDICTS:
        return None
    first = first_failure(div)
    if first is None:
        how = "untracked" if div.get("untracked") else "undetected divergence"
    elif first[0] == "collective":
        how = f"collective {first[1]['kind']} in {first[1]['site']}"
    else:
        how = "digest assertion"
    return f"{v}: {how}; fired: {', '.join(fired(div)) or 'none'}"


def jitter_class(div: dict, cfg) -> str:
    """The jitter class (a scenarios/jitter_<class>.yaml name): the sync discipline when
    it is not 0.5.23's, write_through host-allocation failures as their own class, else
    the first perturbation that fired (or was configured)."""
    disc = cfg.discipline
    if disc == "local":
        return "ack_local"
    if disc == "pre_26921":
        return "pre_26921"
    names = fired(div) or [k for k in (div.get("perturbations") or {})]
    if not names:
        return "none"
    if names[0] == "host_alloc_failure" and cfg.write_policy == "write_through":
        return "write_through_alloc_failure"
    return names[0]


def failure_time(div: dict) -> float:
    """When the first failure became visible (inf for a divergence nothing noticed)."""
    first = first_failure(div)
    return math.inf if first is None else first[1]["t"]


def failure_line(div: dict) -> str:
    """One line saying how the first failure shows, as the real server would fail."""
    v = div["verdict"]
    first = first_failure(div)
    if first is None:
        d = div.get("first_true_divergence")
        if v == "missed" and d:
            return (f"undetected divergence: the ranks differ from t={d['t']:.6f}s (step "
                    f"{d['step']}: {d['what']}) and no check noticed")
        return f"no failure ({v})"
    kind, rec = first
    if kind == "consensus":
        return consensus_line(rec)
    if kind == "collective":
        return (f"collective {rec['kind']} at t={rec['t']:.6f}s (step {rec['step']}, "
                f"{rec['site']}): {rec['message']}")
    tail = "" if v == "detected" else " (false alarm: the trees are logically equal)"
    return f"AssertionError at t={rec['t']:.6f}s (step {rec['step']}): {DIGEST_MISMATCH_MESSAGE}{tail}"
