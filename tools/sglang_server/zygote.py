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
run_harness.py --fresh runs without it; --verify-fresh checks both give identical
outputs.
"""
import json
import os
import signal
import sys
import time


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
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            try:
                rc = launch.run(server_dir, job["argv"])
            except BaseException:  # the harness re-raises nothing, but be safe
                import traceback
                traceback.print_exc()
                rc = 3
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc if isinstance(rc, int) else 3)
        t0 = time.time()
        timeout = float(job.get("timeout") or 600)
        rc = None
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.time() - t0 > timeout:
                os.kill(pid, signal.SIGKILL)  # our own child, by pid
                os.waitpid(pid, 0)
                rc = "timeout"
                break
            time.sleep(0.02)
        print(json.dumps({"rc": rc}), flush=True)


if __name__ == "__main__":
    main()
