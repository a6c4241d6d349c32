"""A pre-imported SGLang process that forks one child per harness run.

    $SGLANG_SERVER_VENV/bin/python zygote.py SERVER_DIR TREE_CORE CLIP|none

Importing SGLang's scheduler takes about 6 s of the 7-8 s a harness run spends
before its first step; forking a process that has only imported it (nothing built,
no thread started) skips that. The environment a run sets before SGLang is imported
is set here first, exactly as server_oracle.py's main() sets it, because SGLang reads
some of it at import time (``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` becomes
``schedule_policy.CLIP_MAX_NEW_TOKENS``): one zygote per (tree core, clip).

Reads one JSON object per line on stdin, ``{"argv": [...], "log": PATH, "timeout":
S}``; forks; the child sends stdout and stderr to ``log`` and runs launch.run(argv);
answers ``{"rc": N}`` (``"rc": "timeout"`` when it was killed after ``timeout`` s).
A TP group is ``{"ranks": [{"argv", "log"}, ...], "timeout": S}``: one child per rank,
all started before any is waited for (they meet in gloo), answered ``{"rc": [...]}``;
started with tp_oracle.py's environment (OMP_NUM_THREADS=1,
SGLANG_CPU_OMP_THREADS_BIND=0|1) by tp2.py.
run_harness.py --fresh runs without it; --verify-fresh checks both give identical
outputs.
"""
import json
import os
import signal
import sys
import time


def spawn(server_dir, argv, log):
    """Fork a child that runs one harness process's main(argv), output to ``log``."""
    import launch
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        try:
            rc = launch.run(server_dir, argv)
        except BaseException:  # the harness catches the real code's errors; be safe
            import traceback
            traceback.print_exc()
            rc = 3
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc if isinstance(rc, int) else 3)
    return pid


def wait_all(pids, timeout):
    """Each child's exit code, or "timeout" for one still running after ``timeout`` s
    (then killed: our own child, by pid)."""
    t0 = time.time()
    rcs = [None] * len(pids)
    while any(rc is None for rc in rcs):
        for i, pid in enumerate(pids):
            if rcs[i] is None:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    rcs[i] = os.waitstatus_to_exitcode(status)
        if any(rc is None for rc in rcs) and time.time() - t0 > timeout:
            for i, pid in enumerate(pids):
                if rcs[i] is None:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    rcs[i] = "timeout"
        time.sleep(0.02)
    return rcs


def main():
    server_dir, tree_core, clip = sys.argv[1:4]
    os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = tree_core
    if clip != "none":
        os.environ["SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION"] = clip
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import launch
    launch.prepare(server_dir)
    # what main() imports before building the Scheduler
    import torch  # noqa: F401
    import hicache_cpu  # noqa: F401
    import fake_worker  # noqa: F401
    import instrument  # noqa: F401
    from sglang.srt.server_args import ServerArgs, PortArgs  # noqa: F401
    from sglang.srt.runtime_context import publish, SpawnRanks  # noqa: F401
    from sglang.srt.managers import scheduler  # noqa: F401
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput  # noqa: F401
    from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: F401
    from sglang.srt.utils.common import set_random_seed  # noqa: F401
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        if "ranks" in job:  # a TP group: one child per rank, as tp_oracle.py starts them
            rcs = wait_all([spawn(server_dir, r["argv"], r["log"]) for r in job["ranks"]],
                           float(job.get("timeout") or 600))
            print(json.dumps({"rc": rcs}), flush=True)
            continue
        rc = wait_all([spawn(server_dir, job["argv"], job["log"])], float(job.get("timeout") or 600))[0]
        print(json.dumps({"rc": rc}), flush=True)


if __name__ == "__main__":
    main()
