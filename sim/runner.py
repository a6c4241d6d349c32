"""Run one scenario and write its results folder.

The folder holds ``requests.parquet``, ``timeseries.parquet``, ``divergence.json``,
``summary.json``, ``scenario.yaml`` (as resolved), ``meta.json`` and, when asked, a
Perfetto trace. The folder is written whole: locked, filled in a sibling temporary
folder and renamed into place (``sim.resultsdir``), so a folder with a ``meta.json``
is complete (or marked ``partial`` after Ctrl-C) and never mixes two runs. Nothing in
it depends on the wall clock: the same scenario and seed give byte-identical files.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sim import __version__
from sim.atomic import atomic_path, write_json, write_parquet, write_text
from sim.cluster import Cluster
from sim.diagnostics import tier_fields
from sim.errors import UserError
from sim.interrupt import INTERRUPT_ENV, InterruptGuard, checkpoint
from sim.kvevents import encode_batch, engine_batches, publish_zmq, trace_page_tokens
from sim.metrics import REQUEST_UNITS, TIMESERIES_UNITS
from sim.optrace import _dumps, engine_ops_to_trace
from sim.paths import PathRejected, confine_output, write_user_file
from sim.ranks import log_alloc_failures
from sim.resolve import from_scenario
from sim.resultsdir import OPTRACE_INDEX, OPTRACE_KIND, OpTraceFolder, ResultsFolder
from sim.scenario import dump_resolved
from sim.steprec import StepRecorder, rank_paths
from sim.workloads import build_workload


@dataclass
class RunResult:
    out_dir: Path | None
    summary: dict
    divergence: dict
    partial: bool
    sim: object
    # a Ctrl-C that came after the simulation ended: the folder was written whole
    # (sim.interrupt), and the command exits 130 all the same
    interrupted: bool = False


def git_revision() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).resolve().parent, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def prepare(scenario, seed: int | None = None, collective: str | None = None):
    """(scenario, SimConfig, CostModel, workload) with CLI overrides applied."""
    updates = {}
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise UserError(f"found seed {seed!r}; expected an int from 0 to 2**63 - 1", where="seed")
        updates["seed"] = seed
    if updates:
        scenario = scenario.model_copy(update=updates)
    cfg, cost = from_scenario(scenario)
    if collective is not None:
        cfg.collective = collective
    return scenario, cfg, cost, build_workload(scenario)


def run_scenario(scenario, out_dir=None, *, seed: int | None = None,
                 collective: str | None = None, progress: Callable | None = None,
                 trace_out: str | None = None, record_ops: bool = False,
                 record_ops_dir=None, record_steps: str | None = None,
                 kv_events: dict | None = None) -> RunResult:
    """Simulate ``scenario`` (a validated ``sim.scenario.Scenario``) and, with
    ``out_dir``, write its results folder (locked, staged, renamed whole:
    ``sim.resultsdir``). ``record_ops_dir``: also write every replica's op-trace
    there (v2, docs/OPTRACE.md), under the same rules. ``kv_events``: SGLang's KV
    events of the run, ``{"file": path, "zmq": parsed --kv-events-config, "wait_s": s}``
    (sim.kvevents; either or both)."""
    scenario, cfg, cost, workload = prepare(scenario, seed, collective)
    # KV events come from rank 0's op stream (sim.kvevents): recorded for them too.
    cfg.record_ops = record_ops or record_ops_dir is not None or kv_events is not None
    if kv_events is not None and cfg.hybrid is not None:
        raise UserError("--kv-events on a hybrid model; expected a FULL-attention model (the "
                        "hybrid trees' KV events are not modelled)")
    steps_paths = None
    if record_steps is not None:
        steps_paths = _step_paths(record_steps, scenario)
    if out_dir is not None and record_ops_dir is not None:
        _separate(out_dir, record_ops_dir)
    # Lock (and check) the results folder before simulating: a second writer, or an
    # -o that is not a results folder, fails at once, not after the run.
    folder = ResultsFolder(out_dir).acquire() if out_dir is not None else None
    ops_folder = None
    guard = InterruptGuard()
    try:
        ops_folder = OpTraceFolder(record_ops_dir).acquire() if record_ops_dir is not None else None
        checkpoint("locked")
        res = _run(scenario, cfg, cost, workload, folder, progress, trace_out, ops_folder, guard,
                   steps_paths, kv_events)
    finally:
        for f in (ops_folder, folder):
            if f is not None:
                f.release()
        guard.restore()
    if guard.pending and out_dir is None and record_ops_dir is None:
        raise KeyboardInterrupt  # no folder to finish writing: the caller's Ctrl-C, now
    res.interrupted = guard.pending
    return res


def _step_paths(path: str, scenario) -> list[str]:
    """``--record-steps FILE``: one file per rank; none may exist yet."""
    if scenario.engine.clock != "steps":
        raise UserError(f"found engine.clock {scenario.engine.clock!r}; expected 'steps' "
                        "for --record-steps (its records are per scheduler step)",
                        where=scenario.source)
    paths = rank_paths(path, scenario.tp)
    for p in paths:
        if os.path.lexists(p):
            raise UserError("found an existing file; expected a new file for --record-steps",
                            where=p)
    return paths


def _separate(out_dir, ops_dir) -> None:
    """The op-trace folder and the results folder are each renamed into place whole,
    so neither may contain the other."""
    a, b = Path(os.path.abspath(out_dir)), Path(os.path.abspath(ops_dir))
    if a == b or a in b.parents or b in a.parents:
        raise UserError(f"found the results folder {a}; expected a --record-ops folder "
                        "apart from it (neither inside the other)", where=str(b))


def _watch_host_allocs(sim) -> dict:
    """``{id(cohort): [[op index, attempt], ...]}``: each replica's failed host
    allocations, for the op-trace headers (``sim.ranks.log_alloc_failures``)."""
    return {id(c): log_alloc_failures(c) for inst in sim.instances for c in inst.group.cohorts}


def _engine_trace(c, cfg, fails: dict, note: str) -> list:
    """A (FULL-only) replica's recorded ops as an op-trace v2: header + ops."""
    return engine_ops_to_trace(
        c.ops, device_capacity=c.tree.device_capacity, host_capacity=c.tree.host_capacity,
        page_size=cfg.page_size, write_policy=cfg.write_policy,
        load_back_threshold=cfg.load_back_threshold, version=2, ids=cfg.ids,
        host_policy=cfg.host_policy, eviction_policy=cfg.eviction_policy,
        host_alloc_failures=fails.get(id(c)),
        storage=None if cfg.storage is None else cfg.storage.prefetch_threshold,
        host_memory_mode=None if cfg.storage is None else cfg.storage.host_memory_mode,
        note=note)


def kv_event_payloads(sim, fails: dict, scenario=None) -> list:
    """SGLang's KV event batches (sim.kvevents) of each instance's rank 0 (the
    publisher rank: is_kv_publisher_rank, attn-TP rank 0), encoded as its publisher
    encodes them: [(ts, attn_dp_rank, payload)], instances interleaved by time, each
    batch tagged with its attn_dp_rank (select_kv_publisher_dp_rank: the DP replica)."""
    cfg = sim.cfg
    tokens = trace_page_tokens(scenario) if scenario is not None else None
    allb = []
    for inst in sim.instances:
        c = next(c for c in inst.group.cohorts if 0 in c.ranks)
        trace = _engine_trace(c, cfg, fails, f"kv events, instance {inst.instance}")
        batches, rep = engine_batches(trace, inst.op_ticks, sim.env.now, inst.instance, tokens)
        t = rep.tree
        if (t.digest, t.dev_used, t.host_used, t.n_nodes) != (
                c.tree.digest, c.tree.dev_used, c.tree.host_used, c.tree.n_nodes):
            raise RuntimeError("the KV-event replay of rank 0's ops ended elsewhere than the "
                               "engine's tree")
        allb += [(ts, inst.instance, k, evs) for k, (ts, evs) in enumerate(batches)]
    allb.sort(key=lambda b: (b[0], b[1], b[2]))
    return [(ts, dp, encode_batch(ts, evs, dp)) for ts, dp, _k, evs in allb]


def write_kv_events(path, payloads: list) -> None:
    """The payloads back to back (a msgpack stream), atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(b"".join(p for _ts, _dp, p in payloads))


def write_op_traces(folder, sim, scenario, fails: dict, partial: bool) -> dict:
    """Every replica's op-trace into the staged ``folder``: ``rank<r>.jsonl`` per rank
    (``instance<i>/rank<r>.jsonl`` with dp > 1) and ``index.json``. Returns the index."""
    cfg = sim.cfg
    traces = []
    for inst in sim.instances:
        sub = folder / f"instance{inst.instance}" if cfg.dp > 1 else folder
        sub.mkdir(exist_ok=True)
        for c in inst.group.cohorts:
            if cfg.hybrid is not None:
                # a hybrid replica writes its own trace (docs/HYBRID.md §6, §10.5)
                trace = c.tree.trace(cfg)
                trace[0]["note"] = (f"hicache-sim {__version__} run --record-ops, scenario "
                                    f"{scenario.name}, instance {inst.instance}, ranks {c.label}")
                _write_trace(folder, sub, traces, inst, c, trace, len(trace) - 1)
                continue
            trace = _engine_trace(
                c, cfg, fails, f"hicache-sim {__version__} run --record-ops, scenario "
                               f"{scenario.name}, instance {inst.instance}, ranks {c.label}")
            _write_trace(folder, sub, traces, inst, c, trace, len(c.ops))
    traces.sort(key=lambda x: (x["instance"], x["rank"]))
    fmt = ("hybrid op-trace (docs/HYBRID.md §6)" if cfg.hybrid is not None
           else "op-trace v2 (docs/OPTRACE.md)")
    index = {"kind": OPTRACE_KIND, "format": fmt,
             "hicache_sim": __version__, "scenario": scenario.name, "seed": scenario.seed,
             "tp": cfg.tp, "dp": cfg.dp, "write_policy": cfg.write_policy,
             "page_size": cfg.page_size, "ids": cfg.ids,
             "partial": partial or sim.stuck is not None, "halted": sim.halted,
             "traces": traces}
    write_json(folder / OPTRACE_INDEX, index)
    return index


def _write_trace(folder, sub, traces: list, inst, c, trace: list, n_ops: int) -> None:
    """One replica's op-trace, once per rank it stands for, and its index rows."""
    text = "".join(_dumps(op) + "\n" for op in trace)
    t = c.tree
    for r in c.ranks:
        name = f"rank{r}.jsonl"
        write_text(sub / name, text)
        traces.append({
            "instance": inst.instance, "rank": r,
            "file": name if sub == folder else f"{sub.name}/{name}",
            "ops": n_ops, "replica": c.label,
            # the engine's own tree after the last op: a replay must end here
            "final": {"digest": t.digest, "dev": t.dev_used, "host": t.host_used,
                      "nodes": t.n_nodes},
        })


def _run(scenario, cfg, cost, workload, folder, progress, trace_out, ops_folder=None,
         guard=None, steps_paths=None, kv_events=None) -> RunResult:
    guard = guard or InterruptGuard()
    if os.environ.get(INTERRUPT_ENV) == "simulating":
        progress = _interrupt_at_first_request(progress)
    trace_events = [] if (trace_out or scenario.output.trace_out) else None
    sim = Cluster(cfg, workload, cost, progress=progress, trace_events=trace_events)
    fails = _watch_host_allocs(sim) if (ops_folder is not None or kv_events) else {}
    recorder = None
    if steps_paths is not None:
        recorder = StepRecorder(cfg.tp)
        sim.instances[0].steprec = recorder
    out = None
    if folder is not None:
        # The staged folder exists from the start: the metrics spill their finished row
        # chunks into unnamed files in it (sim.metrics), so a long run's memory does not
        # grow with its requests; the files never appear in the folder.
        out = folder.stage()
        for inst in sim.instances:
            inst.metrics.spill_to(out)
    partial = ended = False
    guard.arm()  # from here a Ctrl-C stops the simulation, and the folder is still written
    try:
        sim.run()
        ended = True
        checkpoint("simulated")
        guard.defer()  # the simulation is over: a Ctrl-C now waits for the folder
    except KeyboardInterrupt:
        guard.defer()
        partial = not ended
        guard.pending |= ended  # it came after the end: a complete folder, exit 130
    # Each frame is built once (summary, files): a long run holds one copy at a time.
    requests, timeseries = sim.requests_df(), sim.timeseries_df()
    summary = sim.summary(requests=requests, timeseries=timeseries)
    divergence = sim.report()
    summary["verdict"] = divergence["verdict"]
    summary["skipped_trace_lines"] = int(getattr(workload, "skipped", 0) or 0)

    # GB sizes, bytes per token, per-tier pages and the diagnosis (sim.diagnostics).
    summary.update(tier_fields(summary, timeseries,
                               [i.group.cohorts[0].tree for i in sim.instances], scenario))
    if folder is None:
        del requests, timeseries
    else:
        meta_path = out / "meta.json"
        write_parquet(out / "requests.parquet", requests, REQUEST_UNITS)
        del requests
        checkpoint("staging")
        write_parquet(out / "timeseries.parquet", timeseries, TIMESERIES_UNITS)
        del timeseries
        write_json(out / "divergence.json", divergence)
        write_json(out / "summary.json", summary)
        write_text(out / "scenario.yaml", dump_resolved(scenario))
        if scenario.output.trace_out is not None and trace_out is None:
            try:  # a scenario writes only inside its results folder
                tp = confine_output(scenario.output.trace_out, out, "output.trace_out")
            except PathRejected as e:
                raise UserError(f"output.trace_out: found {e.found}; expected {e.expected}",
                                where=scenario.source) from None
            write_trace(tp, sim, trace_events)
        write_json(meta_path, {
            "hicache_sim": __version__,
            "git_revision": git_revision(),
            "python": platform.python_version(),
            "scenario": scenario.name,
            "seed": scenario.seed,
            "cost_profile": scenario.cost.profile,
            "cost": cost.describe() if hasattr(cost, "describe") else None,
            "collective": cfg.collective,
            # a run that neither drained nor halted is not a complete result
            "partial": partial or sim.stuck is not None,
            "stuck": sim.stuck,
            "halted": sim.halted,
            "requests_done": sim.done,
            "sim_time_s": sim.env.now,
        })
        folder.commit()  # the whole folder at once: old or new, never a mix
        checkpoint("committed")
    if ops_folder is not None:
        write_op_traces(ops_folder.stage(), sim, scenario, fails, partial)
        ops_folder.commit()
    if recorder is not None:
        for r, p in enumerate(steps_paths):
            write_user_file(p, lambda path, r=r: write_text(
                path, "".join(line + "\n" for line in recorder.lines(r))))
    if trace_out is not None:  # the command line's --trace-out: any file the user names
        write_user_file(trace_out, lambda p: write_trace(p, sim, trace_events))
    if kv_events is not None:
        payloads = kv_event_payloads(sim, fails, scenario)
        if kv_events.get("file") is not None:
            write_user_file(kv_events["file"], lambda p: write_kv_events(p, payloads))
        if kv_events.get("zmq") is not None:
            by_dp: dict = {}
            for _ts, dp, p in payloads:
                by_dp.setdefault(dp, []).append(p)
            publish_zmq(kv_events["zmq"], by_dp or {0: []}, kv_events.get("wait_s", 10.0))
    return RunResult(folder.out if folder else None, summary, divergence, partial, sim)


def _interrupt_at_first_request(progress):
    """The progress callback, delivering ``HICACHE_SIM_INTERRUPT_AT=simulating``'s
    SIGINT when the first request finishes (sim.interrupt)."""
    def hook(now, metrics):
        if metrics.done == 1:
            checkpoint("simulating")
        if progress is not None:
            progress(now, metrics)

    return hook


def write_trace(path: Path, sim, events: list) -> None:
    """A Chrome/Perfetto trace: one thread per rank, plus the scheduler's syncs."""
    meta = []
    for i in range(sim.cfg.dp):  # one process per data-parallel instance
        meta.append({"name": "process_name", "ph": "M", "pid": i,
                     "args": {"name": f"TP group {i}" if sim.cfg.dp > 1 else "TP group"}})
        meta += [{"name": "thread_name", "ph": "M", "pid": i, "tid": r,
                  "args": {"name": f"rank {r}"}} for r in range(sim.cfg.tp)]
    write_text(path, json.dumps({"traceEvents": meta + (events or []),
                                 "displayTimeUnit": "ms"}, separators=(",", ":")))
