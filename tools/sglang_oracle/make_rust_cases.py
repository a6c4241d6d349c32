#!/usr/bin/env python3
"""data/conformance/rust/: FULL conformance cases replayed on SGLang 0.5.23's Rust tree
core as a started server holds it (header ``ids: rust_server``: root 1, first node 2,
the Rust digest), through oracle_rust_v2.py. `tests/test_tree_core.py` compares
``replay-ops --ids rust_server`` with these outputs on the projection the shared
Rust oracle's compare.py defines, without SGLang installed.

    $SGLANG_ORACLE_VENV/bin/python tools/sglang_oracle/make_rust_cases.py [--check]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import oracle_rust_v2  # noqa: E402

DATA = HERE.parents[1] / "data" / "conformance"
OUT = DATA / "rust"
# every FULL case of data/conformance/ (generated and hand-written)
CASES = sorted(p.name.removesuffix(".jsonl.gz") for p in DATA.glob("*.jsonl.gz")
               if not p.name.endswith(".out.jsonl.gz"))


def rust_lines(case: str) -> str:
    with gzip.open(DATA / f"{case}.jsonl.gz", "rt") as f:
        lines = f.readlines()
    header = json.loads(lines[0])
    header["ids"] = "rust_server"
    out = io.StringIO()
    oracle_rust_v2.replay([json.dumps(header) + "\n"] + lines[1:], out)
    return out.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a vendored output differs")
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    bad = 0
    sums = []
    for case in CASES:
        text = rust_lines(case)
        sums.append(f"{hashlib.sha256(text.encode()).hexdigest()}  {case}.rust.out.jsonl\n")
        path = OUT / f"{case}.rust.out.jsonl.gz"
        if args.check:
            with gzip.open(path, "rt") as f:
                if f.read() != text:
                    print(f"{path}: differs from the Rust core's replay", file=sys.stderr)
                    bad += 1
            continue
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
            f.write(text.encode())
        print(f"{case}: {text.count(chr(10))} lines")
    if not args.check:
        (OUT / "SHA256SUMS").write_text("".join(sums))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
