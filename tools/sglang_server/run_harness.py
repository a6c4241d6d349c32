#!/usr/bin/env python3
"""Run a manifest of harness runs through SGLang's real server (cached, resumable).

    python tools/sglang_server/run_harness.py [--manifest FILE] [--cache DIR] [--jobs 2]
        [--only SUBSTRING ...] [--fresh] [--verify-fresh N]

Each run config (gen_workloads.py's manifest.jsonl) goes through
``../shared/oracle/server/server_oracle.py`` in its venv, by way of launch.py (which
restores ServerArgs.random_seed's set_random_seed, see there). Outputs go to
``CACHE/<run>.<key>.jsonl.gz``; ``key`` hashes the harness flags, the trace and the
harness's code, so a finished run is skipped (resume) and a changed input is rerun.
Every output is written to a temporary name and renamed when complete.

By default runs are forked from a pre-imported SGLang process (zygote.py: importing
the scheduler is most of a run's start-up); ``--fresh`` starts one process per run
instead, and ``--verify-fresh N`` reruns N of the runs fresh and fails unless every
record is identical (the summary's wall-clock times aside).

Prints one line per run, then the totals and the wall time of the whole manifest.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from runconfig import (REPO, ConfigError, check_server, env_group, harness_args,  # noqa: E402
                       harness_files, run_key, server_dir, server_python, validate)

DEFAULT_MANIFEST = REPO / "results" / "sglang-server" / "workloads" / "manifest.jsonl"
DEFAULT_CACHE = REPO / "results" / "sglang-server" / "harness"
RUN_TIMEOUT_S = 600


def load_manifest(path: Path) -> list[dict]:
    if not path.is_file():
        raise ConfigError(f"{path}: found no manifest; expected one written by "
                          "tools/sglang_server/gen_workloads.py")
    cfgs = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            cfg = json.loads(line)
        except ValueError as e:
            raise ConfigError(f"{path}:{n}: found invalid JSON ({e}); expected one run config per line")
        if not isinstance(cfg, dict):
            raise ConfigError(f"{path}:{n}: found a JSON {type(cfg).__name__}; expected an object")
        validate(cfg, f"{path}:{n}")
        cfgs.append(cfg)
    return cfgs


class Job:
    def __init__(self, cfg: dict, trace: Path, out: Path, tmpdir: Path):
        self.cfg, self.trace, self.out = cfg, trace, out
        self.tmp_out = tmpdir / (out.name.removesuffix(".gz"))
        self.log = tmpdir / (cfg["run"] + ".log")
        self.argv = [str(trace), "-o", str(self.tmp_out)] + harness_args(cfg)
        self.rc = None
        self.wall = 0.0


def plan(cfgs: list[dict], manifest_dir: Path, cache: Path) -> list[Job]:
    files = harness_files()
    tmpdir = cache / ".tmp"
    jobs = []
    for cfg in cfgs:
        trace = manifest_dir / cfg["trace"]
        if not trace.is_file():
            raise ConfigError(f"{trace}: found no trace for run {cfg['run']}; expected the "
                              "manifest's traces beside it")
        key = run_key(cfg, trace.read_bytes(), files)
        jobs.append(Job(cfg, trace, cache / f"{cfg['run']}.{key}.jsonl.gz", tmpdir))
    return jobs


def _finish(job: Job) -> str | None:
    """Gzip a completed run's output into the cache; None, or why it is not usable."""
    if job.rc not in (0, 2):  # 2: the real code raised and the harness recorded it
        tail = job.log.read_text(errors="replace")[-400:] if job.log.exists() else ""
        return f"exit {job.rc}: {tail.strip().splitlines()[-1] if tail.strip() else 'no output'}"
    try:
        with open(job.tmp_out, "rb") as f:
            data = f.read()
        last = json.loads(data.rstrip().rsplit(b"\n", 1)[-1])
    except (OSError, ValueError) as e:
        return f"unreadable output ({e})"
    if last.get("type") != "summary":
        return "output has no summary record"
    tmp = job.out.with_name(job.out.name + ".tmp")
    with open(tmp, "wb") as f:
        # mtime 0: the same output gives the same bytes
        with gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
            gz.write(data)
    os.replace(tmp, job.out)
    job.tmp_out.unlink()
    job.log.unlink(missing_ok=True)
    return None


class Zygote:
    def __init__(self, group: tuple):
        tree_core, clip = group
        self.group = group
        self.p = subprocess.Popen(
            [str(server_python()), str(HERE / "zygote.py"), str(server_dir()), tree_core,
             "none" if clip is None else str(int(clip))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.p.stdout.readline()
        if not ready.strip():
            raise RuntimeError("the SGLang zygote exited before it was ready")

    def run(self, job: Job) -> None:
        self.p.stdin.write(json.dumps({"argv": job.argv, "log": str(job.log),
                                       "timeout": RUN_TIMEOUT_S}) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("the SGLang zygote died")
        job.rc = json.loads(line)["rc"]

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait()


def _run_fresh(job: Job) -> None:
    with open(job.log, "w") as log:
        try:
            p = subprocess.run([str(server_python()), str(HERE / "launch.py"), str(server_dir()), "--",
                                *job.argv], stdout=log, stderr=subprocess.STDOUT,
                               timeout=RUN_TIMEOUT_S)
            job.rc = p.returncode
        except subprocess.TimeoutExpired:
            job.rc = "timeout"


def _summary(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        last = None
        for line in f:
            last = line
    return json.loads(last)


def execute(jobs: list[Job], n_workers: int, fresh: bool, say=print) -> list[tuple[Job, str]]:
    """Run the jobs (sorted by zygote group); returns [(job, why)] for those that failed."""
    if not jobs:
        return []
    (jobs[0].tmp_out.parent).mkdir(parents=True, exist_ok=True)
    q: queue.Queue = queue.Queue()
    for j in sorted(jobs, key=lambda j: (repr(env_group(j.cfg)), j.cfg["run"])):
        q.put(j)
    failed, lock = [], threading.Lock()
    done = [0]

    def worker():
        zyg = None
        try:
            while True:
                try:
                    job = q.get_nowait()
                except queue.Empty:
                    return
                t0 = time.time()
                why = None
                try:
                    if fresh:
                        _run_fresh(job)
                    else:
                        g = env_group(job.cfg)
                        if zyg is None or zyg.group != g:
                            if zyg is not None:
                                zyg.close()
                            zyg = None
                            zyg = Zygote(g)
                        zyg.run(job)
                except (RuntimeError, OSError, ValueError) as e:  # the zygote died: a fresh one next
                    why = str(e)
                    if zyg is not None:
                        zyg.p.kill()  # our own child, by handle
                        zyg.p.wait()
                    zyg = None
                job.wall = time.time() - t0
                why = why or _finish(job)
                with lock:
                    done[0] += 1
                    if why is None:
                        s = _summary(job.out)
                        err = f"  SGLang raised {s['error']['exc']} at step {s['error']['step']}" if s.get("error") else ""
                        say(f"[{done[0]:>3}/{len(jobs)}] {job.cfg['run']:<44} {s['steps']:>5} steps "
                            f"{s['requests']:>4} reqs {job.wall:6.1f} s{err}")
                    else:
                        failed.append((job, why))
                        say(f"[{done[0]:>3}/{len(jobs)}] {job.cfg['run']:<44} FAILED: {why}")
        finally:
            if zyg is not None:
                zyg.close()

    threads = [threading.Thread(target=worker) for _ in range(max(1, n_workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failed


def ensure(cfgs: list[dict], manifest_dir: Path, cache: Path, n_workers: int = 2,
           fresh: bool = False, say=print) -> tuple[dict, list]:
    """Every run's cached output (running the missing ones): ({run: path}, failures)."""
    cache.mkdir(parents=True, exist_ok=True)
    jobs = plan(cfgs, manifest_dir, cache)
    todo = [j for j in jobs if not j.out.exists()]
    if todo:
        say(f"{len(jobs) - len(todo)} of {len(jobs)} runs cached; running {len(todo)} "
            f"({'fresh processes' if fresh else 'forked from a pre-imported SGLang'}, {n_workers} at a time)")
    failed = execute(todo, n_workers, fresh, say)
    bad = {j.cfg["run"] for j, _ in failed}
    failed += [(j, "not run") for j in todo if not j.out.exists() and j.cfg["run"] not in bad]
    return {j.cfg["run"]: j.out for j in jobs if j.out.exists()}, failed


def _records(path: Path) -> list:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for r in rows:
        if r.get("type") == "summary":
            r.pop("wall_s", None)
    return rows


def verify_fresh(jobs_out: dict, cfgs: list[dict], manifest_dir: Path, cache: Path, n: int,
                 n_workers: int) -> list[str]:
    """Rerun ``n`` runs (spread over the manifest) in fresh processes into a scratch
    cache; the differences from the forked outputs, one line each."""
    if n <= 0:
        return []
    pick = cfgs[:: max(1, len(cfgs) // n)][:n]
    scratch = cache / ".verify"
    shutil.rmtree(scratch, ignore_errors=True)
    out, failed = ensure(pick, manifest_dir, scratch, n_workers, fresh=True,
                         say=lambda s: print("  verify " + s))
    diffs = [f"{j.cfg['run']}: the fresh run failed: {why}" for j, why in failed]
    for cfg in pick:
        run = cfg["run"]
        if run in out and run in jobs_out and _records(out[run]) != _records(jobs_out[run]):
            diffs.append(f"{run}: the fresh run's records differ from the forked run's")
    shutil.rmtree(scratch, ignore_errors=True)
    return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", default=str(DEFAULT_MANIFEST))
    ap.add_argument("--cache", default=str(DEFAULT_CACHE))
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    ap.add_argument("--only", nargs="*", help="run names containing any of these")
    ap.add_argument("--fresh", action="store_true", help="one fresh process per run (no fork)")
    ap.add_argument("--verify-fresh", type=int, default=0, metavar="N",
                    help="rerun N runs in fresh processes and check identical records")
    a = ap.parse_args(argv)
    why = check_server()
    if why:
        print(why, file=sys.stderr)
        return 2
    manifest = Path(a.manifest)
    try:
        cfgs = load_manifest(manifest)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    if a.only:
        cfgs = [c for c in cfgs if any(s in c["run"] for s in a.only)]
    t0 = time.time()
    try:
        out, failed = ensure(cfgs, manifest.parent, Path(a.cache), a.jobs, a.fresh)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    wall = time.time() - t0
    steps = reqs = errors = 0
    for run, path in out.items():
        s = _summary(path)
        steps += s["steps"]
        reqs += s["requests"]
        errors += bool(s.get("error"))
    print(f"{len(out)} runs ({len({c['workload'] for c in cfgs})} workloads): {steps} steps, "
          f"{reqs} requests, {errors} with an SGLang error record, {len(failed)} failed; "
          f"wall {wall:.0f} s with {a.jobs} at a time")
    diffs = verify_fresh(out, cfgs, manifest.parent, Path(a.cache), a.verify_fresh, a.jobs)
    for d in diffs:
        print(d, file=sys.stderr)
    if a.verify_fresh:
        print(f"verify-fresh: {a.verify_fresh} runs rerun in fresh processes, "
              f"{len(diffs)} differ")
    return 1 if failed or diffs else 0


if __name__ == "__main__":
    sys.exit(main())
