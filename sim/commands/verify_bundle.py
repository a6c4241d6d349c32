"""`hicache-sim replay BUNDLE_DIR`: verify a repro bundle (``sim.repro.verify_bundle``).

Re-runs the bundle's scenario and checks it fails exactly as recorded (verdict, the
first true divergence, the shape divergence, the digest mismatch, the collective
error, every rank's digest, the step count), that each rank's op-trace is what the
re-run recorded, and that each op-trace re-runs alone to its final digest. The
user-facing name stays ``replay``; the module is named for what it does, apart from
``replay-ops`` (op-trace replay, ``sim.optrace``).

Exit codes: 3 when the failure reproduces (the failure is printed as one line, as the
real server would fail); 1 when it does not (one line saying what differs); 2 for a
missing or malformed bundle.
"""

from __future__ import annotations

NAME = "replay"
HELP = ("Re-run a repro bundle; exit 3 with the one-line failure when it reproduces exactly, "
        "1 when it does not.")


def add_arguments(p) -> None:
    p.add_argument("bundle", metavar="BUNDLE_DIR", help="a folder written by hicache-sim repro")
    p.add_argument("--trace-root", dest="trace_roots", action="append", default=[], metavar="DIR",
                   help="also resolve the bundle scenario's trace paths under DIR (a bundle's "
                        "scenario otherwise reads files inside the bundle only); repeatable")


def run(args) -> int:
    from sim.errors import DivergenceError
    from sim.repro.bundle import verify_bundle

    res = verify_bundle(args.bundle, trace_roots=args.trace_roots)
    n_traces = sum(1 for c in res.checked if c.startswith("optrace"))
    print(f"reproduced {args.bundle}: {res.outcome.failure_class}; checked "
          f"{len(res.checked) - n_traces} outcome fields and {n_traces} rank op-trace(s)")
    raise DivergenceError(res.line)
