#!/usr/bin/env python3
"""The differential test against SGLang 0.5.23's real server (`make conformance-server`).

For every run of the generated manifest (tools/sglang_server/gen_workloads.py: every
workload under the three write policies and both loops), this

1. runs the workload through the server harness (``../shared/oracle/server``, cached:
   tools/sglang_server/run_harness.py);
2. runs it through the engine under the step clock: ``python cli.py run SCENARIO
   --record-steps FILE``, with the scenario made from the run config
   (tools/sglang_server/runconfig.py, ``engine_scenario``);
3. compares the two step by step (tools/sglang_server/compare_steps.py).

One line per run; the first difference stops the run with exit 1, naming the step and
showing both sides. Ends with the counts: workloads, runs, steps and requests compared,
identical runs, and the wall time.

    python tools/conformance_server.py [--work DIR] [--jobs 2] [--only SUBSTRING ...]
        [--keep-going]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "sglang_server"))

import compare_steps  # noqa: E402
import gen_workloads  # noqa: E402
import run_harness  # noqa: E402
from runconfig import ConfigError, check_server, engine_scenario  # noqa: E402

# How long one engine run may take: the runs are a few hundred steps.
ENGINE_TIMEOUT_S = 300


def write_scenario(cfg: dict, folder: Path) -> Path:
    """The run's engine scenario, beside its trace (the trace path is relative)."""
    import yaml

    path = folder / f"{cfg['run']}.yaml"
    text = (f"# made by tools/conformance_server.py from run config {cfg['run']}\n"
            + yaml.safe_dump(engine_scenario(cfg, cfg["trace"]), sort_keys=False))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def run_engine(scenario: Path, out_dir: Path) -> tuple[Path | None, str | None]:
    """(the --record-steps file, None), or (None, the one-line reason it failed)."""
    steps = out_dir / "steps.jsonl"
    steps.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, str(REPO / "cli.py"), "run", str(scenario), "-o", str(out_dir / "results"),
           "--record-steps", str(steps), "--quiet"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=ENGINE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"the engine run did not finish in {ENGINE_TIMEOUT_S} s"
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else f"no message (exit {done.returncode})"
        hint = ""
        if "--record-steps" in done.stderr or "engine.clock" in done.stderr or "clock" in last:
            hint = " (this engine has no step clock (engine.clock: steps) or run --record-steps yet)"
        return None, f"the engine run failed (exit {done.returncode}): {last[:300]}{hint}"
    if not steps.is_file():
        return None, f"the engine run wrote no {steps}"
    return steps, None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(REPO / "results" / "conformance-server"),
                    help="workloads and engine outputs (default: results/conformance-server)")
    ap.add_argument("--cache", default=str(run_harness.DEFAULT_CACHE),
                    help="harness outputs, shared with run_harness.py (default: results/sglang-server/harness)")
    ap.add_argument("--jobs", type=int, default=2, help="harness runs at a time (default 2)")
    ap.add_argument("--only", nargs="*", help="run names containing any of these")
    ap.add_argument("--keep-going", action="store_true",
                    help="compare every run; report the differing ones at the end")
    a = ap.parse_args(argv)
    t0 = time.time()
    work = Path(a.work)
    wl = work / "workloads"
    if gen_workloads.main(["-o", str(wl)]) != 0:
        return 2
    try:
        cfgs = run_harness.load_manifest(wl / "manifest.jsonl")
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    if a.only:
        cfgs = [c for c in cfgs if any(s in c["run"] for s in a.only)]
    cache = Path(a.cache)
    jobs = run_harness.plan(cfgs, wl, cache)
    if any(not j.out.exists() for j in jobs):
        why = check_server()
        if why:
            print(why, file=sys.stderr)
            return 2
    t_h = time.time()
    outs, failed = run_harness.ensure(cfgs, wl, cache, a.jobs)
    t_h = time.time() - t_h
    for job, why in failed:
        print(f"{job.cfg['run']}: the harness run failed: {why}", file=sys.stderr)
    if failed:
        return 1
    print(f"harness: {len(outs)} runs ready ({t_h:.0f} s)")
    steps = reqs = identical = 0
    differing = []
    for cfg in cfgs:
        run = cfg["run"]
        scenario = write_scenario(cfg, wl)
        recorded, why = run_engine(scenario, work / "engine" / run)
        if why is not None:
            print(f"{run}: {why}", file=sys.stderr)
            return 1
        try:
            res = compare_steps.compare_files(outs[run], recorded)
        except compare_steps.ReadError as e:
            print(f"{run}: {e}", file=sys.stderr)
            return 2
        steps += res.steps
        reqs += res.reqs
        err = ""
        if res.harness_error:
            err = f" (SGLang raised {res.harness_error.get('exc')} at step {res.harness_error.get('step')})"
        if res.diff is None:
            identical += 1
            print(f"{run:<44} {res.steps:>5} steps {res.reqs:>4} requests  identical{err}")
            continue
        print(f"{run:<44} DIFFERS after {res.steps} identical steps at {res.diff}")
        differing.append(run)
        if not a.keep_going:
            break
    compared = identical + len(differing)
    print(f"{len({c['workload'] for c in cfgs})} workloads, {compared} of {len(cfgs)} runs compared: "
          f"{steps} steps and {reqs} requests identical; runs identical: {identical}, "
          f"differing: {len(differing)}; {time.time() - t0:.0f} s")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
