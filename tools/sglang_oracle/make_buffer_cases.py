#!/usr/bin/env python3
"""Rebuild data/conformance/buffer/ (docs/OPTRACE.md §15): record the engine cases with
hicache-sim (this interpreter), replay every case on SGLang's own tree with
``oracle_buffer.py`` (the oracle venv's interpreter, ``$SGLANG_ORACLE_VENV``), gzip both
with mtime 0 and rewrite SHA256SUMS. The hand-written ``h*`` traces are kept as
vendored; only their outputs are regenerated.

    python tools/sglang_oracle/make_buffer_cases.py [--check]

``--check``: also replay each case through hicache-sim and fail on any byte that
differs from SGLang's output.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "data" / "conformance" / "buffer"
SCN = ROOT / "scenarios" / "storage_buffer_only.yaml"
COMMON = ("workload.max_context_tokens=4096",)
ENGINE_CASES = {
    "b01_s1_ps64_pins": ("seed=1", "workload.num_requests=120"),
    "b02_s2_ps64_parked": ("seed=2", "workload.num_requests=80", "host.tokens=2048",
                           "storage.prefetch_threshold=64", "workload.arrival.rate=8",
                           "workload.think_time_s.mean=0.5", "storage.read_gbps=1"),
    "b03_s3_ps16": ("seed=3", "workload.num_requests=80", "page_size=16",
                    "workload.block_size=16"),
}


def oracle_python() -> str:
    venv = os.environ.get("SGLANG_ORACLE_VENV",
                          os.path.join(os.environ.get("TMPDIR", "/tmp"), "sglang-oracle-venv"))
    return os.path.join(venv, "bin", "python")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    traces = {}
    for name, sets in ENGINE_CASES.items():
        argv = [sys.executable, str(ROOT / "cli.py"), "run", str(SCN), "-o", str(tmp / name / "res"),
                "--quiet", "--record-ops", str(tmp / name / "ops")]
        for s in COMMON + sets:
            argv += ["--set", s]
        subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        traces[name] = (tmp / name / "ops" / "rank0.jsonl").read_bytes()
    for p in sorted(OUT.glob("h*.jsonl.gz")):
        if not p.name.endswith(".out.jsonl.gz"):
            traces[p.name[: -len(".jsonl.gz")]] = gzip.decompress(p.read_bytes())
    bad = 0
    for name, data in traces.items():
        src, out = tmp / f"{name}.jsonl", tmp / f"{name}.out.jsonl"
        src.write_bytes(data)
        subprocess.run([oracle_python(), str(ROOT / "tools" / "sglang_oracle" / "oracle_buffer.py"),
                        str(src), "-o", str(out), "--check"], check=True)
        (OUT / f"{name}.jsonl.gz").write_bytes(gzip.compress(data, mtime=0))
        (OUT / f"{name}.out.jsonl.gz").write_bytes(gzip.compress(out.read_bytes(), mtime=0))
        if args.check:
            sim_out = tmp / f"{name}.sim.jsonl"
            subprocess.run([sys.executable, str(ROOT / "cli.py"), "replay-ops", str(src), "-o",
                            str(sim_out)], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
            if sim_out.read_bytes() != out.read_bytes():
                print(f"{name}: hicache-sim's replay differs from SGLang's", file=sys.stderr)
                bad += 1
    lines = []
    for p in sorted(OUT.glob("*.gz")):
        lines.append(f"{hashlib.sha256(gzip.decompress(p.read_bytes())).hexdigest()}  {p.name[:-3]}")
    (OUT / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
