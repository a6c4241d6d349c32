#!/usr/bin/env python3
"""Time SGLang 0.5.23's core on a hybrid op-trace: ops per second of
``HybridOracle.apply`` (the real ``UnifiedTreeCore`` with its SWA or Mamba component,
the CPU pools and action routing of oracle_hybrid.py), after the import and the
build, without invariant checks. Prints one JSON line ``{"ops": N, "seconds": S}``.

Usage (in the oracle venv): python tools/sglang_oracle/bench_hybrid_core.py TRACE.jsonl
``benchmarks/bench_tree.py`` runs it to report the sim's speed against SGLang's.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oracle_hybrid import HostHybridOracle, HybridOracle  # noqa: E402


def main():
    with open(sys.argv[1]) as f:
        ops = [json.loads(line) for line in f if line.strip()]
    oracle = (HostHybridOracle if ops[0].get("hicache") else HybridOracle)(ops[0])
    body = ops[1:]
    t0 = time.perf_counter()
    errors = 0
    for op in body:
        errors += "error" in oracle.apply(op)
    dt = time.perf_counter() - t0
    print(json.dumps({"ops": len(body), "seconds": dt, "errors": errors}))


if __name__ == "__main__":
    main()
