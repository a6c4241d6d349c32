"""`hicache-sim traces [list | verify [NAME...] | fetch NAME [--mirror URL] [--sha256 HEX]]`.

The known traces are the registry in ``sim.workloads.catalog``; downloading and
checking is ``sim.workloads.fetch``. Exit codes: 0 done; 1 ``verify`` found a file
whose checksum is wrong (or a shipped file missing); 2 bad input (an unknown name, a
bad mirror, a download that fails or whose checksum is wrong: nothing is kept).
"""

from __future__ import annotations

import sys
import time

NAME = "traces"
HELP = ("List the known request traces, verify the checksums of those present, or fetch a "
        "public one into the trace cache.")


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.add_parser("list", help="list the known traces and where they are (the default)")
    v = sub.add_parser("verify", help="check the SHA-256 of every trace file present")
    v.add_argument("names", nargs="*", metavar="NAME", help="only these traces")
    f = sub.add_parser("fetch", help="download a public trace into $HICACHE_TRACE_CACHE "
                                     "(default ~/.cache/hicache-sim/traces)")
    f.add_argument("name", metavar="NAME", help="a trace name from `hicache-sim traces`")
    f.add_argument("--mirror", metavar="URL",
                   help="base URL laid out as raw.githubusercontent.com "
                        "(<base>/<owner>/<repo>/<commit>/<path>); file:// works")
    f.add_argument("--sha256", metavar="HEX",
                   help="the checksum the file must have (pins one the registry lacks)")


def run(args) -> int:
    action = getattr(args, "action", None) or "list"
    return {"list": _list, "verify": _verify, "fetch": _fetch}[action](args)


def _list(args) -> int:
    from sim.fmt import table
    from sim.paths import trace_cache
    from sim.workloads.catalog import TRACES
    from sim.workloads.fetch import status

    rows = [[t.name, t.format, "-" if t.requests is None else f"{t.requests:,}",
             str(len(t.files)), status(t), t.scenario_path, t.description] for t in TRACES]
    print(table(["name", "format", "requests", "files", "status", "workload.path", "about"], rows,
                align="llrrlll"))
    print(f"trace cache: {trace_cache()} ($HICACHE_TRACE_CACHE); shipped traces: data/traces/")
    print("fetch one with: hicache-sim traces fetch NAME; check them with: hicache-sim traces verify")
    return 0


def _verify(args) -> int:
    from sim.fmt import table
    from sim.workloads.catalog import TRACES
    from sim.workloads.fetch import entry_or_error, verify

    entries = [entry_or_error(n) for n in args.names] if args.names else list(TRACES)
    checks = verify(entries)
    shown = [c for c in checks if c.status != "not fetched"]
    rows = [[c.entry.name, c.file.name, c.status.upper() if c.failed else c.status,
             c.against or "-"] for c in shown]
    if rows:
        print(table(["trace", "file", "checksum", "against"], rows, align="llll"))
    failed = [c for c in checks if c.failed]
    absent = len(checks) - len(shown)
    print(f"{len(shown)} file(s) checked: {sum(c.status == 'ok' for c in shown)} ok, "
          f"{len(failed)} failed" + (f"; {absent} remote file(s) not fetched" if absent else ""))
    for c in failed:
        why = f"SHA-256 {c.found}" if c.status == "mismatch" else "no such file"
        print(f"hicache-sim traces: {c.path}: {c.status}: {why}", file=sys.stderr)
    return 1 if failed else 0


def _fetch(args) -> int:
    from sim.fmt import duration
    from sim.workloads.fetch import entry_or_error, fetch, folder


    entry = entry_or_error(args.name)
    if entry.shipped:
        print(f"{entry.name} ships with the repository: {folder(entry)} (nothing to fetch; "
              f"a scenario names it as workload.path: {entry.scenario_path})")
        return 0
    t0 = time.perf_counter()
    done = fetch(entry, mirror=args.mirror, sha256=args.sha256)
    for f in done:
        note = ("checksum recorded (the registry has none): pin it with --sha256"
                if f.checked == "recorded" else f"checksum matches the {f.checked}")
        print(f"{f.path}: {f.size:,} bytes, SHA-256 {f.sha256} ({note})")
    print(f"{entry.name}: {len(done)} file(s) in {folder(entry)} ({duration(time.perf_counter() - t0)}); "
          f"use it in a scenario as workload: {{kind: trace, format: {entry.format}, "
          f"path: {entry.scenario_path}}}")
    return 0
