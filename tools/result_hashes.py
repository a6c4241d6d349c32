"""SHA-256 of every shipped scenario's results and every conformance replay's output.

An optimisation must change no result. This tool runs every shipped scenario
(``scenarios/*.yaml``, ``scenarios/regressions/*.yaml``), cut to a small request count,
with its op-traces recorded, and replays every vendored conformance case
(``data/conformance/**``), and hashes what each writes:

    python tools/result_hashes.py --write    # (re)write tests/data/result_hashes.json
    python tools/result_hashes.py --check    # recompute; exit 1 naming what differs

The table is regenerated with ``--write`` when a change is meant to move results (a
model fix); a speed-up leaves it as it is. ``meta.json``'s ``git_revision`` is left
out: it names the commit, not the result. ``tests/test_result_hashes.py`` runs the
check, one entry per test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TABLE = ROOT / "tests" / "data" / "result_hashes.json"
CONFORMANCE = ROOT / "data" / "conformance"

# Small enough for `make test`, large enough that queues form and tiers spill.
MAX_REQUESTS = 120
# Claude Code contexts are ~98k tokens: their op-traces (token lists, once per rank at
# TP 8) take seconds per request, so fewer of them.
REQUESTS = {"agentic_claude_code": 24}
# Scenarios whose own trace is not shipped run on their documented stand-in
# (scenarios/regressions/sglang_29049.yaml's comment).
STAND_IN = {"sglang_29049": ["workload.path=traces/mooncake-fast25/conversation_trace.jsonl.gz"]}


def scenario_paths() -> list[Path]:
    return sorted((ROOT / "scenarios").glob("*.yaml")) + \
        sorted((ROOT / "scenarios" / "regressions").glob("*.yaml"))


# Folders of data/conformance/ that hold no op-traces: the server harness's step logs
# and request traces (server/, server_engine/, tp2/) and the schedule-order fixtures.
NOT_OP_TRACES = {"server", "server_engine", "tp2", "schedule"}


def case_paths() -> list[Path]:
    return sorted(p for p in CONFORMANCE.rglob("*.jsonl.gz")
                  if not p.name.endswith(".out.jsonl.gz")
                  and p.relative_to(CONFORMANCE).parts[0] not in NOT_OP_TRACES)


def scenario_key(path: Path) -> str:
    return "scenario:" + path.relative_to(ROOT / "scenarios").with_suffix("").as_posix()


def case_key(path: Path) -> str:
    return "replay:" + path.relative_to(CONFORMANCE).as_posix()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _folder_hashes(folder: Path, prefix: str) -> dict[str, str]:
    out = {}
    for p in sorted(q for q in folder.rglob("*") if q.is_file()):
        rel = p.relative_to(folder).as_posix()
        if rel == ".lock":
            continue
        # the repository's own path (a trace's, echoed in scenario.yaml) is the
        # checkout's, not the result's
        data = p.read_bytes().replace(str(ROOT).encode(), b"<repo>")
        if rel == "meta.json":
            meta = json.loads(data)
            meta.pop("git_revision", None)
            data = json.dumps(meta, sort_keys=True).encode()
        out[f"{prefix}{rel}"] = _sha(data)
    return out


def hash_scenario(path: Path) -> dict[str, str]:
    """``{file: sha256}`` for ``path``'s results folder and op-trace folder."""
    from sim.runner import run_scenario
    from sim.scenario import load_scenario

    n = REQUESTS.get(path.stem, MAX_REQUESTS)
    sets = STAND_IN.get(path.stem, []) + [f"limits.max_requests={n}"]
    scn = load_scenario(path, sets)
    with tempfile.TemporaryDirectory(prefix="result_hashes_") as tmp:
        res, ops = Path(tmp) / "results", Path(tmp) / "ops"
        run_scenario(scn, res, record_ops_dir=ops)
        return {**_folder_hashes(res, "results/"), **_folder_hashes(ops, "ops/")}


def hash_case(path: Path) -> str:
    """sha256 of ``replay-ops``' output for one conformance case."""
    from sim.optrace import replay_lines

    h = hashlib.sha256()
    for line in replay_lines(path):
        h.update(line.encode())
        h.update(b"\n")
    return h.hexdigest()


def entries() -> dict[str, tuple]:
    """Every entry's key and how to compute it."""
    out = {scenario_key(p): (hash_scenario, p) for p in scenario_paths()}
    out.update({case_key(p): (hash_case, p) for p in case_paths()})
    return out


def compute(key: str):
    fn, path = entries()[key]
    return fn(path)


def load_table() -> dict:
    return json.loads(TABLE.read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"write {TABLE.relative_to(ROOT)}")
    mode.add_argument("--check", action="store_true", help="recompute and compare with the table")
    ap.add_argument("-k", dest="only", help="only the entries whose key contains this")
    args = ap.parse_args(argv)

    todo = {k: v for k, v in entries().items() if args.only is None or args.only in k}
    got = {k: fn(p) for k, (fn, p) in todo.items()}
    if args.write:
        table = load_table() if (args.only and TABLE.exists()) else {}
        table.update(got)
        TABLE.parent.mkdir(parents=True, exist_ok=True)
        tmp = TABLE.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")
        tmp.replace(TABLE)
        print(f"{TABLE.relative_to(ROOT)}: {len(got)} entries written")
        return 0
    table = load_table()
    bad = [k for k in got if table.get(k) != got[k]]
    missing = [k for k in table if k not in got and args.only is None]
    for k in bad:
        if isinstance(got[k], dict) and isinstance(table.get(k), dict):
            files = sorted(f for f in set(got[k]) | set(table[k]) if got[k].get(f) != table[k].get(f))
            print(f"differs: {k}: {', '.join(files)}")
        else:
            print(f"differs: {k}")
    for k in missing:
        print(f"gone: {k} (in the table, not shipped)")
    print(f"{len(got) - len(bad)} of {len(got)} entries identical")
    return 1 if bad or missing else 0


if __name__ == "__main__":
    sys.exit(main())
