"""`hicache-sim replay BUNDLE_DIR`: verify a repro bundle (``sim.repro.verify_bundle``).

Re-runs the bundle's scenario and checks it fails exactly as recorded (verdict, the
first true divergence, the shape divergence, the digest mismatch, the collective
error, every rank's digest, the step count), that each rank's op-trace is what the
re-run recorded, and that each op-trace re-runs alone to its final digest. The
user-facing name stays ``replay``; the module is named for what it does, apart from
``replay-ops`` (op-trace replay, ``sim.optrace``).

Exit codes say whether the bundle *reproduces*, not what it recorded: 0 when the run
matches the bundle exactly (the recorded failure is printed as information, on
stderr, as the real server would have printed it); 1 when it does not (one line
saying what differs); 2 for a missing or malformed bundle.
"""

from __future__ import annotations

import sys

NAME = "replay"
HELP = ("Re-run a repro bundle; exit 0 when it reproduces what the bundle recorded (the "
        "recorded failure is printed), 1 when it does not.")


def add_arguments(p) -> None:
    p.add_argument("bundle", metavar="BUNDLE_DIR", help="a folder written by hicache-sim repro")
    p.add_argument("--trace-root", dest="trace_roots", action="append", default=[], metavar="DIR",
                   help="also resolve the bundle scenario's trace paths under DIR (a bundle's "
                        "scenario otherwise reads files inside the bundle only); repeatable")


def run(args) -> int:
    from sim.errors import one_line
    # Looked up on the package at call time: tests stub sim.repro.verify_bundle.
    from sim.repro import verify_bundle

    # A bundle that does not reproduce raises NotReproduced (exit 1) with what differs.
    res = verify_bundle(args.bundle, trace_roots=args.trace_roots)
    n_traces = sum(1 for c in res.checked if c.startswith("optrace"))
    print(f"reproduced {args.bundle}: recorded verdict {res.outcome.verdict} "
          f"({res.outcome.failure_class}); checked {len(res.checked) - n_traces} outcome "
          f"fields and {n_traces} rank op-trace(s)")
    if res.line:
        # The failure the bundle recorded, as the real server died with it: information
        # about what was reproduced, not this command's outcome.
        print(one_line(f"hicache-sim replay: {res.line}"), file=sys.stderr)
    return 0
