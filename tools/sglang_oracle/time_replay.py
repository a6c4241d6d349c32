#!/usr/bin/env python3
"""Time SGLang's own tree replaying an op-trace, as the shared oracle's command does
(read the lines, replay, write one output line per op), after SGLang's import.

Usage (in the oracle venv): python time_replay.py TRACE.jsonl OUT.jsonl
Prints ``{"seconds": S, "errors": E}``; benchmarks/bench_replay.py compares S with
``replay-ops`` on the same trace and checks both outputs are the same bytes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ORACLE_DIR = Path(os.environ.get("HICACHE_SGLANG_ORACLE") or REPO.parent / "shared" / "oracle")
if not (ORACLE_DIR / "oracle.py").is_file():
    raise SystemExit(f"{ORACLE_DIR}: found no oracle.py; expected the shared oracle's folder "
                     "(set $HICACHE_SGLANG_ORACLE)")
sys.path.insert(0, str(ORACLE_DIR))

import oracle  # noqa: E402


def main() -> None:
    trace, out_path = sys.argv[1], sys.argv[2]
    t0 = time.perf_counter()
    with open(trace) as f:
        lines = f.readlines()
    with open(out_path, "w") as out:
        errors = oracle.replay(lines, out)
    print(json.dumps({"seconds": time.perf_counter() - t0, "errors": errors}))


if __name__ == "__main__":
    main()
