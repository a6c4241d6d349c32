#!/usr/bin/env python3
"""Fault runs of a real TP-2 SGLang group, and the outcome class of each.

    python tools/sglang_server/tp2.py [--cache DIR] [--only SUBSTRING ...] [--vendor]

Ten write_back workloads with host pressure (gen_workloads.py's ``hostpress`` and
``multiturn`` families, host pools below the working set), each run clean and with
each fault hook of ``../shared/oracle/server`` on rank 1 at two steps:
``host_alloc_fail@K`` (the host pool's alloc returns None once), ``ack_delay@K:5``
(copies recorded in steps K..K+20 complete 5 steps late), ``reclaim_skip@K`` (rust
core: this rank's duplicate-reclaim digest is perturbed after its first reclaiming
host eviction at or after K). Each group is two harness processes joined by
SGLang's own gloo group, started as tp_oracle.py starts them (``--tp-size 2
--tp-rank R --dist-port P``, ``OMP_NUM_THREADS=1``, ``SGLANG_CPU_OMP_THREADS_BIND=0|1``),
here forked from a pre-imported SGLang (zygote.py). One group at a time: each rank
needs a core. Outputs are cached (``CACHE/<run>.<key>.rank<R>.jsonl.gz``).

The outcome of a run, from both ranks' outputs (:func:`outcome`):

* ``hang``: a rank was still running after the timeout (killed); each rank's last
  logged step;
* ``assertion``: a rank's harness recorded an error (the real code raised): per rank,
  the step, the exception and its message;
* ``silent_divergence``: both ranks finished without an error, but their host or
  device free space differs at some step: the first such step and both values;
* ``agree``: none of these.

Each line says whether the fault fired (``fired_at``, the harness's own record).
``--vendor`` writes ``data/conformance/tp2/``: ``outcomes.json`` (every run's config,
fault and outcome) and the traces, gzipped.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gen_workloads as gw  # noqa: E402
from runconfig import (REPO, check_server, harness_args, harness_files, run_key,  # noqa: E402
                       server_dir, server_python, validate)

DEFAULT_CACHE = REPO / "results" / "sglang-server" / "tp2"
DEST = REPO / "data" / "conformance" / "tp2"
TIMEOUT_S = 180  # a group of these sizes finishes in seconds; past this it is a hang
FAULT_STEPS = (40, 90)
ACK_EXTRA = 5
FAULT_RANK = 1

TP_WORKLOADS = [
    gw.W("t01_hostpress_ps1", "hostpress", 701, dict(bs=16, n=60, groups=8, prefix_blocks=16, suffix=(1, 3), out=(2, 10), gap=2),
         page_size=1, device_tokens=768, host_ratio=1.5),
    gw.W("t02_hostpress_ps16", "hostpress", 702, dict(bs=16, n=60, groups=10, prefix_blocks=12, suffix=(1, 3), out=(2, 10), gap=2),
         page_size=16, device_tokens=640, host_ratio=1.5),
    gw.W("t03_hostpress_ps4", "hostpress", 703, dict(bs=16, n=56, groups=7, prefix_blocks=16, suffix=(1, 4), out=(2, 12), gap=2),
         page_size=4, device_tokens=768, host_ratio=1.25),
    gw.W("t04_hostpress_ps8_overlap", "hostpress", 704, dict(bs=16, n=56, groups=8, prefix_blocks=14, suffix=(1, 3), out=(2, 10), gap=2),
         page_size=8, device_tokens=768, host_ratio=1.5),
    gw.W("t05_hostpress_ps2", "hostpress", 705, dict(bs=16, n=60, groups=9, prefix_blocks=12, suffix=(1, 3), out=(2, 10), gap=1),
         page_size=2, device_tokens=640, host_ratio=1.5),
    gw.W("t06_hostpress_ps16_overlap", "hostpress", 706, dict(bs=16, n=64, groups=12, prefix_blocks=10, suffix=(1, 3), out=(2, 8), gap=1),
         page_size=16, device_tokens=512, host_ratio=1.5),
    gw.W("t07_hostpress_ps1_delay", "hostpress", 707, dict(bs=16, n=56, groups=8, prefix_blocks=14, suffix=(1, 3), out=(2, 10), gap=2),
         page_size=1, device_tokens=768, host_ratio=1.5, d2h_delay_steps=2, h2d_delay_steps=2),
    gw.W("t08_multiturn_ps4", "multiturn", 708, dict(bs=16, sessions=10, turns=(3, 6), sys_blocks=6, user=(1, 4), out=(4, 12), think=(10, 30), start_gap=4),
         page_size=4, device_tokens=640, host_ratio=1.25),
    gw.W("t09_multiturn_ps16_overlap", "multiturn", 709, dict(bs=16, sessions=10, turns=(3, 6), sys_blocks=6, user=(1, 4), out=(4, 12), think=(10, 30), start_gap=4),
         page_size=16, device_tokens=640, host_ratio=1.5),
    gw.W("t10_hostpress_ps32", "hostpress", 710, dict(bs=32, n=56, groups=9, prefix_blocks=7, suffix=(1, 2), out=(2, 10), gap=2),
         block_size=32, page_size=32, device_tokens=768, host_ratio=1.5),
]


def fault_specs() -> list[str | None]:
    specs = [None]
    for k in FAULT_STEPS:
        specs += [f"host_alloc_fail@{k}", f"ack_delay@{k}:{ACK_EXTRA}", f"reclaim_skip@{k}"]
    return specs


def run_configs(w: dict) -> list[dict]:
    overlap = w["workload"].endswith("_overlap")
    out = []
    for spec in fault_specs():
        tag = "clean" if spec is None else spec.replace("@", "_at").replace(":", "_")
        cfg = dict(gw.BASE, **w["server"], run=f"{w['workload']}.{tag}", workload=w["workload"],
                   trace=f"{w['workload']}.jsonl", seed=w["seed"], write_policy="write_back",
                   overlap=overlap, tp=2, fault=spec, fault_rank=FAULT_RANK)
        validate(cfg, f"workload {w['workload']}")
        out.append(cfg)
    return out


def rank_argv(cfg: dict, trace: Path, out: Path, rank: int, port: int) -> list[str]:
    a = [str(trace), "-o", str(out)] + harness_args(cfg) + [
        "--tp-size", "2", "--tp-rank", str(rank), "--dist-port", str(port)]
    if cfg["fault"] and rank == cfg["fault_rank"]:
        a += ["--fault", cfg["fault"]]
    return a


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def read_rank(path: Path) -> list[dict]:
    """A rank's records; a killed rank's last line may be cut short, and is dropped."""
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    if not path.exists():
        return rows
    with opener(path, "rt", errors="replace") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                break
    return rows


def first_free_difference(steps: list[dict]) -> dict | None:
    """The first step both ranks logged where host or device free space differs, the
    values, and on how many steps they differ; None when they never do."""
    common = sorted(set(steps[0]) & set(steps[1]))
    fields = ("host_free", "dev_free")
    differing = [k for k in common if any(steps[0][k].get(f) != steps[1][k].get(f) for f in fields)]
    if not differing:
        return None
    k = differing[0]
    return {"step": k, "steps_differing": len(differing),
            "differs": {f: [steps[0][k].get(f), steps[1][k].get(f)] for f in fields
                        if steps[0][k].get(f) != steps[1][k].get(f)}}


def outcome(ranks: list[list[dict]], timed_out: list[bool]) -> dict:
    """The outcome class of a TP group from its ranks' records (see the module doc).
    Every class also carries ``first_free_difference`` (null when the ranks' free
    space never differed), which for a silent divergence is its step."""
    steps = [{r["step"]: r for r in rows if r.get("type") == "step"} for rows in ranks]
    errors = [next((r for r in rows if r.get("type") == "error"), None) for rows in ranks]
    summ = [next((r for r in rows if r.get("type") == "summary"), None) for rows in ranks]
    fired = [((s or {}).get("fault") or {}).get("fired_at") for s in summ]
    diff = first_free_difference(steps)
    base = {"fired_at": fired, "steps_logged": [len(s) for s in steps], "first_free_difference": diff}
    if any(timed_out):
        return {"class": "hang", **base, "timed_out": timed_out,
                "last_step": [max(s) if s else None for s in steps]}
    if any(errors):
        return {"class": "assertion", **base,
                "errors": [None if e is None else {"step": e["step"], "exc": e["exc"], "msg": e["msg"]}
                           for e in errors]}
    if diff is not None:
        return {"class": "silent_divergence", **base, "step": diff["step"], "differs": diff["differs"],
                "steps_differing": diff["steps_differing"]}
    if len(steps[0]) != len(steps[1]):
        return {"class": "silent_divergence", **base, "step": min(len(steps[0]), len(steps[1])),
                "differs": {"steps": [len(steps[0]), len(steps[1])]}, "steps_differing": None}
    return {"class": "agree", **base}


def _gz_write(src: Path, dst: Path) -> None:
    tmp = dst.with_name(dst.name + ".tmp")
    with open(src, "rb") as f, open(tmp, "wb") as o:
        with gzip.GzipFile(fileobj=o, mode="wb", mtime=0, filename="") as gz:
            gz.write(f.read())
    os.replace(tmp, dst)
    src.unlink()


def start_zygote(cfg: dict):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("SGLANG_CPU_OMP_THREADS_BIND", "0|1")
    clip = cfg["clip_max_new_tokens"]
    p = subprocess.Popen([str(server_python()), str(HERE / "zygote.py"), str(server_dir()),
                          cfg["tree_core"], "none" if clip is None else str(int(clip))],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    if not p.stdout.readline().strip():
        raise SystemExit("the SGLang zygote exited before it was ready")
    return p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=str(DEFAULT_CACHE))
    ap.add_argument("--only", nargs="*", help="run names containing any of these")
    ap.add_argument("--vendor", action="store_true", help="write data/conformance/tp2/")
    a = ap.parse_args(argv)
    cache = Path(a.cache)
    wl = cache / "workloads"
    wl.mkdir(parents=True, exist_ok=True)
    cfgs = []
    for w in TP_WORKLOADS:
        rows = gw.workload_rows(w)
        gw._write_atomic(wl / f"{w['workload']}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        cfgs += run_configs(w)
    if a.only:
        cfgs = [c for c in cfgs if any(s in c["run"] for s in a.only)]
    files = harness_files()
    tmpdir = cache / ".tmp"
    tmpdir.mkdir(exist_ok=True)
    t0 = time.time()
    zyg = None
    results = []
    try:
        for cfg in cfgs:
            trace = wl / cfg["trace"]
            key = run_key(dict(cfg), trace.read_bytes(), files)
            key = hashlib.sha256(f"{key}:{cfg['fault']}:{cfg['fault_rank']}".encode()).hexdigest()[:12]
            outs = [cache / f"{cfg['run']}.{key}.rank{r}.jsonl.gz" for r in range(2)]
            meta = cache / f"{cfg['run']}.{key}.meta.json"
            t1 = time.time()
            if not meta.exists():
                if zyg is None:
                    why = check_server()
                    if why:
                        print(why, file=sys.stderr)
                        return 2
                    zyg = start_zygote(cfg)
                port = free_port()
                tmp = [tmpdir / f"{cfg['run']}.rank{r}.jsonl" for r in range(2)]
                job = {"ranks": [{"argv": rank_argv(cfg, trace, tmp[r], r, port),
                                  "log": str(tmpdir / f"{cfg['run']}.rank{r}.log")} for r in range(2)],
                       "timeout": TIMEOUT_S}
                zyg.stdin.write(json.dumps(job) + "\n")
                zyg.stdin.flush()
                rcs = json.loads(zyg.stdout.readline())["rc"]
                for r in range(2):
                    if tmp[r].exists():
                        _gz_write(tmp[r], outs[r])
                    else:
                        outs[r].unlink(missing_ok=True)
                m = {"rc": rcs, "timed_out": [rc == "timeout" for rc in rcs]}
                mt = meta.with_name(meta.name + ".tmp")
                mt.write_text(json.dumps(m))
                os.replace(mt, meta)
            m = json.loads(meta.read_text())
            res = outcome([read_rank(o) for o in outs], m["timed_out"])
            res["rc"] = m["rc"]
            results.append((cfg, res))
            detail = ""
            if res["class"] == "assertion":
                e = next(e for e in res["errors"] if e)
                detail = f" step {e['step']}: {e['exc']}: {e['msg'][:90]}"
            elif res["class"] == "silent_divergence":
                detail = f" first at step {res['step']} {res['differs']} ({res.get('steps_differing')} steps)"
            elif res["class"] == "hang":
                detail = f" last steps {res['last_step']}"
            print(f"{cfg['run']:<44} fired {str(res['fired_at']):<14} {res['class']}{detail} "
                  f"({time.time() - t1:.0f} s)", flush=True)
    finally:
        if zyg is not None:
            zyg.stdin.close()
            zyg.wait()
    counts = {}
    for _, r in results:
        counts[r["class"]] = counts.get(r["class"], 0) + 1
    print(f"{len(results)} TP-2 runs ({len({c['workload'] for c in cfgs})} workloads): "
          f"{json.dumps(counts, sort_keys=True)}; wall {time.time() - t0:.0f} s")
    summary = [{"run": c["run"], "workload": c["workload"], "trace": c["trace"] + ".gz",
                "fault": c["fault"], "fault_rank": c["fault_rank"], "config": c,
                "harness_args": harness_args(c), "outcome": r} for c, r in results]
    text = json.dumps({"sglang": "0.5.23", "runs": summary}, indent=1, sort_keys=True) + "\n"
    (cache / "outcomes.json").write_text(text)
    if a.vendor:
        DEST.mkdir(parents=True, exist_ok=True)
        for w in sorted({c["trace"] for c in cfgs}):
            data = (wl / w).read_bytes()
            tmp = DEST / (w + ".gz.tmp")
            with open(tmp, "wb") as o:
                with gzip.GzipFile(fileobj=o, mode="wb", mtime=0, filename="") as gz:
                    gz.write(data)
            os.replace(tmp, DEST / (w + ".gz"))
        tmp = DEST / "outcomes.json.tmp"
        tmp.write_text(text)
        os.replace(tmp, DEST / "outcomes.json")
        sums = "".join(f"{hashlib.sha256((wl / w).read_bytes()).hexdigest()}  {w}\n"
                       for w in sorted({c["trace"] for c in cfgs}))
        (DEST / "SHA256SUMS").write_text(sums)
        print(f"vendored {len(summary)} outcomes into {DEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
