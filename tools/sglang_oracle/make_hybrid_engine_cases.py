#!/usr/bin/env python3
"""Engine-recorded hybrid op-traces, replayed on SGLang's own core (docs/HYBRID.md §10.5).

Usage (in the project venv; the oracle venv runs the oracle):

    .venv/bin/python tools/sglang_oracle/make_hybrid_engine_cases.py [--check] [--verify] \
        [--only PREFIX]

For each case of ``data/conformance/hybrid_engine/CASES.json`` (a shipped scenario,
``--set`` overrides and a rank), the TP engine runs the scenario with
``run --record-ops``; the rank's trace goes to
``tools/sglang_oracle/oracle_hybrid.py`` in the oracle venv (``$SGLANG_ORACLE_VENV``,
default ``/tmp/sglang-oracle-venv``), whose output lines are what SGLang 0.5.23's
``UnifiedTreeCore`` with its own components does on that trace. Both are written
gzip-compressed (level 9, no timestamp) with ``SHA256SUMS``. ``--check`` runs SGLang's
``sanity_check`` and the pool accounting after every op; ``--verify`` rebuilds into a
temporary folder and fails on any byte that differs from the vendored files.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT_DIR = REPO / "data" / "conformance" / "hybrid_engine"
sys.path.insert(0, str(REPO))


def record(case: dict, workdir: Path) -> str:
    """The rank's op-trace the engine records for ``case``, as text."""
    from sim.runner import run_scenario
    from sim.scenario import load_scenario

    scn = load_scenario(REPO / case["scenario"], case["sets"])
    ops = workdir / "ops"
    run_scenario(scn, None, record_ops_dir=ops)
    return (ops / f"rank{case['rank']}.jsonl").read_text()


def oracle(trace: Path, check: bool) -> str:
    venv = Path(os.environ.get("SGLANG_ORACLE_VENV", "/tmp/sglang-oracle-venv"))
    out = trace.with_suffix(".out")
    cmd = [str(venv / "bin" / "python"), str(REPO / "tools" / "sglang_oracle" / "oracle_hybrid.py"),
           str(trace), "-o", str(out)] + (["--check"] if check else [])
    subprocess.run(cmd, check=True)
    return out.read_text()


def gz(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0) as f:
        f.write(data)
    return buf.getvalue()


def build(dest: Path, check: bool, only=None) -> None:
    cases = json.loads((OUT_DIR / "CASES.json").read_text())
    dest.mkdir(parents=True, exist_ok=True)
    sums = {}
    if only and (dest / "SHA256SUMS").is_file():
        for line in (dest / "SHA256SUMS").read_text().splitlines():
            d, n = line.split("  ", 1)
            sums[n] = d
    with tempfile.TemporaryDirectory() as tmp:
        for name, case in cases.items():
            if only and not any(name.startswith(p) for p in only):
                continue
            work = Path(tmp) / name
            work.mkdir()
            text = record(case, work)
            trace = work / "trace.jsonl"
            trace.write_text(text)
            out = oracle(trace, check)
            for suffix, data in ((".jsonl", text), (".out.jsonl", out)):
                raw = data.encode()
                sums[name + suffix] = hashlib.sha256(raw).hexdigest()
                (dest / f"{name}{suffix}.gz").write_bytes(gz(raw))
            errors = sum('"error"' in line for line in out.splitlines())
            print(f"{name}: {len(text.splitlines()) - 1} ops, {errors} refused")
    (dest / "SHA256SUMS").write_text("".join(f"{d}  {n}\n" for n, d in sorted(sums.items())))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="SGLang's sanity_check and the pool accounting after every op")
    ap.add_argument("--verify", action="store_true",
                    help="rebuild into a temporary folder and compare with the vendored files")
    ap.add_argument("--only", metavar="PREFIX", action="append",
                    help="rebuild only the cases whose names start with PREFIX (repeatable)")
    args = ap.parse_args()
    if not args.verify:
        for p in OUT_DIR.glob("*.gz"):
            if not args.only or any(p.name.startswith(x) for x in args.only):
                p.unlink()
        build(OUT_DIR, args.check, args.only)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp), args.check)
        bad = [p.name for p in sorted(Path(tmp).iterdir())
               if (OUT_DIR / p.name).read_bytes() != p.read_bytes()]
    if bad:
        print(f"differs from the vendored files: {', '.join(bad)}", file=sys.stderr)
        return 1
    print("identical to the vendored files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
