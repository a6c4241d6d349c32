"""Resource estimates for a run, and the refusal of runs the machine cannot hold.

What this is for: ``validate`` used to accept a billion requests or TP 64 with torch
collectives without a word, and TP 64 under torch spawned 66 processes and ate 6 GB
before anyone noticed. :func:`estimate` gives rough wall time and memory from the
scenario alone (no trace is read); ``validate`` and ``run`` print it for large runs,
and :func:`check` refuses torch collectives beyond the machine's cores and memory
unless ``--force``.

The figures are deliberately coarse (within a factor of a few), from this project's
benchmarks (README, "Speed"): about 3,000 simulated requests per wall-second at
TP 8 with the simulated collective; per-request rows and time-series samples of a
few hundred bytes; tree nodes of about half a kilobyte per page; a torch rank is a
fresh interpreter with torch imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sim.errors import UserError
from sim.fmt import duration
from sim.jitter import Jitter
from sim.resolve import from_scenario
from sim.scenario import resolve_capacities

# simulated requests per wall-second: bench_sim at TP 8 ran 2,358-3,283 on the 2-core
# machine (README, "Speed", 2026-12-01/02); the 1e6-request quickstart at TP 2 about 2,700
REQUESTS_PER_S = 3_000
TORCH_REQUESTS_PER_S = 300  # with a real all_reduce per step over pipes
ROW_BYTES = 400  # one request row, and its share of the time series
NODE_BYTES = 512  # one tree node (per replica; ranks share until they diverge)
TORCH_RANK_BYTES = 350 << 20  # one spawned torch rank (interpreter + torch)
BASE_BYTES = 300 << 20  # the simulator's own interpreter, numpy, pandas, pydantic
# Print an estimate from these sizes on.
NOTE_WALL_S = 60.0
NOTE_BYTES = 2 << 30
# Torch ranks per core before a run is refused (they mostly wait on each other).
TORCH_RANKS_PER_CORE = 4


@dataclass
class Estimate:
    requests: int | None  # None: a trace (its length is not known without reading it)
    wall_s: float | None
    memory_bytes: int
    processes: int

    def line(self) -> str:
        req = "requests unknown (a trace)" if self.requests is None else f"{self.requests:,} requests"
        wall = "" if self.wall_s is None else f", about {duration(self.wall_s)} wall"
        return (f"estimate: {req}{wall}, about {self.memory_bytes / 1e9:.1f} GB memory, "
                f"{self.processes} process(es)")

    @property
    def large(self) -> bool:
        return (self.wall_s or 0) >= NOTE_WALL_S or self.memory_bytes >= NOTE_BYTES


def _requests(workload) -> int | None:
    if getattr(workload, "kind", None) == "mix":
        parts = [_requests(p) for p in workload.parts]
        return None if None in parts else sum(parts)
    return getattr(workload, "num_requests", None)


def machine() -> tuple[int, int | None]:
    """(CPU cores this process may use, available memory in bytes or None)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    avail = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    return cores, avail


def estimate(scenario) -> Estimate:
    n = _requests(scenario.workload)
    if scenario.limits.max_requests is not None:
        n = scenario.limits.max_requests if n is None else min(n, scenario.limits.max_requests)
    torch = scenario.collective.backend == "torch"
    tp = scenario.tp
    wall = None if n is None else n / (TORCH_REQUESTS_PER_S if torch else REQUESTS_PER_S) * max(1.0, tp / 8)
    dev, host = resolve_capacities(scenario)
    nodes = (dev + host) // scenario.page_size
    # Every rank's replica may diverge (copy-on-divergence); jitter makes it likely.
    # Each data-parallel instance is a TP group of its own.
    dp = scenario.dp
    replicas = dp * (tp if _jittered(scenario) else 1)
    mem = BASE_BYTES + nodes * NODE_BYTES * replicas + (n or 0) * ROW_BYTES
    procs = 1
    if torch:
        mem += dp * tp * TORCH_RANK_BYTES
        procs += dp * tp
    return Estimate(n, wall, int(mem), procs)


def _jittered(s) -> bool:
    """Whether ranks may come to hold trees of their own: a configured perturbation
    (the engine's own list, ``sim.jitter.Jitter``) or a sync discipline other than
    SGLang's."""
    cfg, _ = from_scenario(s)
    return Jitter(cfg.jitter, cfg.tp, cfg.seed).active or cfg.discipline != "synced"


def check(scenario, *, force: bool = False) -> Estimate:
    """The estimate; a UserError if torch collectives would overrun this machine."""
    est = estimate(scenario)
    if scenario.collective.backend != "torch" or force:
        return est
    cores, avail = machine()
    tp = scenario.tp * scenario.dp  # torch ranks: every instance's
    if tp > cores * TORCH_RANKS_PER_CORE:
        raise UserError(f"collective.backend: found torch with {tp} ranks (dp x tp processes) on "
                        f"{cores} core(s); expected at most {cores * TORCH_RANKS_PER_CORE} ranks "
                        "here (use the simulated collective, or --force)", where=scenario.source)
    if avail is not None and tp * TORCH_RANK_BYTES > avail // 2:
        raise UserError(f"collective.backend: found torch with {tp} ranks, about "
                        f"{tp * TORCH_RANK_BYTES / 1e9:.1f} GB for its processes; expected at "
                        f"most half the {avail / 1e9:.1f} GB available (use the simulated "
                        "collective, or --force)", where=scenario.source)
    return est
