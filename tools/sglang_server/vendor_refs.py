#!/usr/bin/env python3
"""Vendor a small set of server-harness outputs into data/conformance/server/.

    python tools/sglang_server/vendor_refs.py [--check] [--jobs 2]
    make conformance-server-refresh

Runs (or takes from the harness cache) the runs named in REFS, and writes for each:
``<run>.jsonl.gz`` (the harness output, the summary's wall-clock times removed, so
that the same SGLang gives the same bytes), its trace ``<workload>.jsonl.gz``, and
one ``index.json`` with each run's config, harness flags, engine scenario and
counts, and ``SHA256SUMS`` (the uncompressed files' checksums, as in the other
data/conformance folders). With ``--check`` nothing is written: it exits 1 if any vendored
byte would change. tests/test_server_refs.py checks the files without SGLang.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gen_workloads  # noqa: E402
import run_harness  # noqa: E402
from runconfig import REPO, check_server, engine_scenario, harness_args  # noqa: E402

DEST = REPO / "data" / "conformance" / "server"

# Three write policies x both loops, with page sizes 1, 4, 16 and 64, chunked prefill,
# retraction with and without the clip, host pressure with load-backs, ack delays of
# 2 and 3 steps, and the lpm and random schedule policies.
REFS = [
    "s01_shared_ps1.wb.normal",
    "s01_shared_ps1.wb.overlap",
    "m03_multiturn_ps16.wt.normal",
    "m03_multiturn_ps16.wt.overlap",
    "h02_hostpress_ps16.wts.normal",
    "h02_hostpress_ps16.wts.overlap",
    "h01_hostpress_ps1.wb.overlap",
    "l02_long_ps16_chunk128.wt.overlap",
    "d01_decode_ps1.wb.overlap",
    "d02_decode_ps1_clip64.wt.normal",
    "s07_shared_ps64_lpm.wb.normal",
    "x03_mixed_ps4_lpm_delay.wts.overlap",
    "s05_shared_ps16_random.wt.overlap",
]


def _gz(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as f:
        f.write(data)
    return buf.getvalue()


def _vendored_output(path: Path) -> bytes:
    """The harness output with the summary's wall-clock times removed."""
    lines = []
    with gzip.open(path, "rt") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("type") == "summary":
                rec.pop("wall_s", None)
                line = json.dumps(rec) + "\n"
            lines.append(line)
    return "".join(lines).encode()


def build(cache: Path, jobs: int) -> dict[str, bytes]:
    """The vendored files, by name."""
    with tempfile.TemporaryDirectory(prefix="sglang-server-refs-") as tmp:
        wl = Path(tmp)
        names = sorted({r.split(".")[0] for r in REFS})
        if gen_workloads.main(["-o", str(wl), "--only", *names]) != 0:
            raise SystemExit(2)
        cfgs = {c["run"]: c for c in run_harness.load_manifest(wl / "manifest.jsonl")}
        missing = [r for r in REFS if r not in cfgs]
        if missing:
            raise SystemExit(f"REFS: found unknown run(s) {', '.join(missing)}; expected names "
                             "from the manifest")
        chosen = [cfgs[r] for r in REFS]
        if any(not j.out.exists() for j in run_harness.plan(chosen, wl, cache)):
            why = check_server()
            if why:
                raise SystemExit(why)
        outs, failed = run_harness.ensure(chosen, wl, cache, jobs)
        if failed:
            raise SystemExit(f"{failed[0][0].cfg['run']}: the harness run failed: {failed[0][1]}")
        sums: dict[str, str] = {}
        files, index = {}, {"sglang": "0.5.23", "harness": "../shared/oracle/server/server_oracle.py "
                                                           "via tools/sglang_server/launch.py",
                            "runs": []}
        for cfg in chosen:
            out = _vendored_output(outs[cfg["run"]])
            trace = (wl / cfg["trace"]).read_bytes()
            tname = cfg["trace"] + ".gz"
            oname = cfg["run"] + ".jsonl.gz"
            files[tname] = _gz(trace)
            files[oname] = _gz(out)
            summ = json.loads(out.rstrip().rsplit(b"\n", 1)[-1])
            index["runs"].append({
                "run": cfg["run"], "config": cfg, "harness_args": harness_args(cfg),
                # the trace resolves under data/, a documented input root (sim/paths.py),
                # so the scenario runs from wherever it is written
                "engine_scenario": engine_scenario(cfg, f"conformance/server/{tname}"),
                "output": oname, "trace": tname,
                "steps": summ["steps"], "requests": summ["requests"],
                "error": summ.get("error")})
            sums[oname[:-3]] = hashlib.sha256(out).hexdigest()
            sums[tname[:-3]] = hashlib.sha256(trace).hexdigest()
        files["index.json"] = (json.dumps(index, indent=1, sort_keys=True) + "\n").encode()
        # as in the other data/conformance folders: the uncompressed files' checksums
        files["SHA256SUMS"] = "".join(f"{d}  {n}\n" for n, d in sorted(sums.items())).encode()
        return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file would change")
    ap.add_argument("--cache", default=str(run_harness.DEFAULT_CACHE))
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    files = build(Path(a.cache), a.jobs)
    DEST.mkdir(parents=True, exist_ok=True)
    changed = [n for n, b in files.items() if not (DEST / n).is_file() or (DEST / n).read_bytes() != b]
    stale = sorted(p.name for p in DEST.glob("*.gz") if p.name not in files)
    if a.check:
        for n in changed + stale:
            print(f"{DEST / n}: would change", file=sys.stderr)
        return 1 if changed or stale else 0
    for n in changed:
        tmp = DEST / (n + ".tmp")
        tmp.write_bytes(files[n])
        os.replace(tmp, DEST / n)
    for n in stale:
        (DEST / n).unlink()
    total = sum(len(b) for b in files.values())
    print(f"{len(REFS)} runs vendored in {DEST} ({total / 1e6:.2f} MB; {len(changed)} files "
          f"written, {len(stale)} removed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
