#!/usr/bin/env python3
"""The differential test against SGLang's real tree (`make conformance-sglang`).

For every shipped scenario (scenarios/*.yaml), cut to a few hundred requests and
forced to one TP-2 group (``tp=2``, ``dp=1``; jitter as shipped), this records every
replica's op-trace with ``hicache-sim run --record-ops``, replays each trace on SGLang
0.5.23's own tree and through ``hicache-sim replay-ops``, and compares the outputs
(docs/OPTRACE.md §10). Both tree cores are checked (``cache.tree_core``):

* **python**: recorded under ``cache.tree_core=python``, replayed on SGLang's Python
  ``UnifiedTreeCore`` (tools/sglang_oracle/oracle_v2.py, oracle_storage.py for the
  storage tier, oracle_buffer.py under buffer_only, oracle_hybrid.py for hybrid
  models, over ``../shared/oracle/``) and compared line by line as JSON values;
* **rust**: recorded under the default core (``ids: rust_server``), replayed on
  SGLang's ``RustUnifiedTreeCore`` (tools/sglang_oracle/oracle_rust_v2.py, over
  ``../shared/oracle/rust/``) and compared on the projection that
  ``../shared/oracle/rust/compare.py`` defines (the Rust API hides some outputs),
  with the digest compared raw. Storage, buffer_only and hybrid traces and scenarios
  with id drift have no Rust recording (the Rust oracle plays neither; a hybrid model
  runs the Python core's ids, id drift needs the Python core's global counter).

One line per trace; the first difference stops the run with exit 1, naming the trace
and the line. The replay's last line must also reach the engine's own final tree
(digest, pools, node count from the trace folder's index).

Run in the project's venv (the oracle runs in its own, SGLANG_ORACLE_VENV):

    python tools/conformance_sglang.py [--requests 200] [--work DIR] [SCENARIO ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Scenarios whose own comments name a second write policy: recorded both ways, so
# write_through's asynchronous acks are covered beside the shipped write_through ones.
VARIANTS = {"capacity_wb_vs_wt": [("write_through", ["cache.write_policy=write_through"])]}


def oracle_python() -> Path:
    venv = os.environ.get("SGLANG_ORACLE_VENV") or str(Path(tempfile.gettempdir()) / "sglang-oracle-venv")
    return Path(venv) / "bin" / "python"


def tp2_jitter(scenario: Path) -> list[str]:
    """--set overrides keeping a jitter block's ``ranks`` valid at TP 2: ranks from 2 up
    are dropped (rank 1 kept, or taken when none is left), so the perturbation still
    runs on one rank of the pair."""
    import yaml

    data = yaml.safe_load(scenario.read_text()) or {}
    sets = []
    for kind, block in (data.get("jitter") or {}).items():
        ranks = block.get("ranks") if isinstance(block, dict) else None
        if isinstance(ranks, list) and any(r >= 2 for r in ranks):
            kept = [r for r in ranks if r < 2] or [1]
            sets.append(f"jitter.{kind}.ranks=[{', '.join(map(str, kept))}]")
    return sets


def load(scenario: Path, sets: list[str], requests: int):
    from sim.scenario import load_scenario

    sets = [f"limits.max_requests={requests}", "tp=2", "dp=1", *tp2_jitter(scenario), *sets]
    return load_scenario(str(scenario), sets)


def record(scenario: Path, name: str, sets: list[str], requests: int, out: Path) -> dict:
    """Run the scenario with --record-ops into ``out``; return its index."""
    from sim.runner import run_scenario

    run_scenario(load(scenario, sets, requests), None, record_ops_dir=out)
    return json.loads((out / "index.json").read_text())


from sim.optrace_rust import project_rust  # noqa: E402


def compare(trace: Path, ours: Path, theirs: Path, project=None) -> tuple[int, str | None]:
    """(lines compared, None) or (line, what differs) at the first difference."""
    a = ours.read_text().splitlines()
    b = theirs.read_text().splitlines()
    for n, (x, y) in enumerate(zip(a, b)):
        jx, jy = json.loads(x), json.loads(y)
        if project is not None:
            jx, jy = project(jx), project(jy)
        if jx != jy:
            keys = sorted(k for k in set(jx) | set(jy) if jx.get(k) != jy.get(k))
            diff = "; ".join(f"{k}: replay-ops {json.dumps(jx.get(k))[:200]} vs SGLang "
                             f"{json.dumps(jy.get(k))[:200]}" for k in keys)
            return n, f"{trace}: output line {n} (trace line {n + 1}) differs: {diff}"
    if len(a) != len(b):
        return min(len(a), len(b)), (f"{trace}: replay-ops wrote {len(a)} lines, "
                                     f"SGLang {len(b)}")
    return len(a), None


def header_of(trace: Path) -> dict:
    with open(trace) as f:
        return json.loads(f.readline())


def _rust_playable(trace: Path) -> bool:
    h = header_of(trace)
    return not ("components" in h or "prefetch_threshold" in h or "storage_writes" in h
                or h.get("host_memory_mode") == "buffer_only")


def _oracle_for(trace: Path) -> str:
    """The oracle that replays ``trace`` on SGLang: a hybrid trace (a header naming
    ``components``, docs/HYBRID.md §6) goes to oracle_hybrid.py, SGLang's unified core
    with its own components; one with the storage tier (docs/OPTRACE.md §14) to the
    storage oracle, which extends oracle_v2 with SGLang's insert_host and prefetch
    bookkeeping (oracle_buffer.py under buffer_only); the rest to oracle_v2."""
    header = header_of(trace)
    if "components" in header:
        return "oracle_hybrid.py"
    if header.get("host_memory_mode") == "buffer_only":  # docs/OPTRACE.md §15
        return "oracle_buffer.py"
    if "prefetch_threshold" in header or "storage_writes" in header:
        return "oracle_storage.py"
    return "oracle_v2.py"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="*", help="scenario YAMLs (default: scenarios/*.yaml)")
    ap.add_argument("--requests", type=int, default=200, help="limits.max_requests (default 200)")
    ap.add_argument("--work", default=str(REPO / "results" / "conformance-sglang"),
                    help="where traces and outputs go (default: results/conformance-sglang)")
    ap.add_argument("--python-only", action="store_true",
                    help="check the Python core only (no Rust recordings)")
    ap.add_argument("--check", action="store_true",
                    help="also run SGLang's sanity_check after every op (slower)")
    args = ap.parse_args()
    from sim.optrace import replay_lines

    py = oracle_python()
    if not py.is_file():
        print(f"{py}: found no oracle venv; expected one built by ../shared/oracle/setup.sh "
              "(make conformance-sglang builds it)", file=sys.stderr)
        return 2
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    paths = [Path(p) for p in args.scenarios] or sorted((REPO / "scenarios").glob("*.yaml"))
    jobs = []  # (label, trace, ours, theirs, final)
    rust_jobs = []
    for path in paths:
        for suffix, sets in [("", [])] + VARIANTS.get(path.stem, []):
            name = path.stem + (f"@{suffix}" if suffix else "")
            index = record(path, name, [*sets, "cache.tree_core=python"], args.requests,
                           work / name / "ops")
            for t in index["traces"]:
                trace = work / name / "ops" / t["file"]
                stem = t["file"].replace("/", "_").removesuffix(".jsonl")
                jobs.append((name, t, trace, work / name / f"{stem}.sim.jsonl",
                             work / name / f"{stem}.sglang.jsonl"))
            if args.python_only or not all(_rust_playable(work / name / "ops" / t["file"])
                                           for t in index["traces"]):
                continue
            if load(path, sets, args.requests).cache.tree_core != "rust":
                continue  # pinned to the Python core (id drift), or a hybrid model
            index = record(path, name, sets, args.requests, work / name / "ops-rust")
            for t in index["traces"]:
                trace = work / name / "ops-rust" / t["file"]
                stem = t["file"].replace("/", "_").removesuffix(".jsonl")
                rust_jobs.append((name + " [rust]", t, trace, work / name / f"{stem}.rust-sim.jsonl",
                                  work / name / f"{stem}.rust-sglang.jsonl"))
    # SGLang's side: one oracle process for all traces (importing SGLang takes seconds;
    # each trace builds a fresh core, which resets SGLang's process-global counters).
    by_oracle: dict[str, list] = {}
    for job in jobs:
        by_oracle.setdefault(_oracle_for(job[2]), []).append(job)
    for oracle, group in sorted(by_oracle.items()):
        script = str(REPO / "tools" / "sglang_oracle" / oracle)
        if oracle == "oracle_hybrid.py":  # no batch mode: one process per trace
            cmds = [[str(py), script, str(trace), "-o", str(theirs)]
                    for _, _, trace, _, theirs in group]
        else:
            batch = work / f"batch-{oracle.removesuffix('.py')}.tsv"
            batch.write_text("".join(f"{trace}\t{theirs}\n" for _, _, trace, _, theirs in group))
            cmds = [[str(py), script, "--batch", str(batch)]]
        for cmd in cmds:
            done = subprocess.run(cmd + (["--check"] if args.check else []))
            if done.returncode != 0:
                print(f"the SGLang oracle ({oracle}) failed (exit {done.returncode})",
                      file=sys.stderr)
                return 1
    if rust_jobs:
        batch = work / "batch-oracle_rust_v2.tsv"
        batch.write_text("".join(f"{trace}\t{theirs}\n" for _, _, trace, _, theirs in rust_jobs))
        done = subprocess.run([str(py), str(REPO / "tools" / "sglang_oracle" / "oracle_rust_v2.py"),
                               "--batch", str(batch)], env={**os.environ, "RUST_BACKTRACE": "0"})
        if done.returncode != 0:
            print(f"the SGLang Rust oracle failed (exit {done.returncode})", file=sys.stderr)
            return 1
    total_ops = 0
    for name, t, trace, ours, theirs, project in [(*j, None) for j in jobs] + [(*j, project_rust)
                                                                      for j in rust_jobs]:
        with open(ours, "w") as fh:
            for line in replay_lines(trace):
                fh.write(line + "\n")
        n, why = compare(trace, ours, theirs, project)
        if why is None:
            last = json.loads(ours.read_text().splitlines()[-1])
            # A hybrid trace without the host tier writes neither a digest nor a host
            # pool (docs/HYBRID.md §6): its tree has none, which the index says as 0.
            final = {k: last.get(k, 0 if "components" in header_of(trace) else None)
                     for k in t["final"]}
            if final != t["final"]:
                why = f"{trace}: replays to {final}, the engine ended at {t['final']}"
        print(f"{name:<40} rank {t['rank']}  {t['ops']:>6} ops  {'match' if why is None else 'MISMATCH'}")
        if why is not None:
            print(why, file=sys.stderr)
            return 1
        total_ops += t["ops"]
    print(f"{len(jobs)} traces on the Python core, {len(rust_jobs)} on the Rust core, "
          f"{total_ops} ops: all match SGLang 0.5.23's trees line for line")
    return 0


if __name__ == "__main__":
    sys.exit(main())
