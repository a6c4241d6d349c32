"""`hicache-sim replay-ops TRACE.jsonl [-o OUT.jsonl]`: replay an op-trace."""

from __future__ import annotations

import sys

NAME = "replay-ops"
HELP = "Replay an op-trace through the tree and write SGLang-format per-op outputs."


def add_arguments(p) -> None:
    p.add_argument("trace", help="op-trace JSONL (format: docs/OPTRACE.md)")
    p.add_argument("-o", "--out", help="write outputs here (atomically) instead of stdout")
    from sim.tree import ID_SCHEMES

    p.add_argument("--ids", choices=ID_SCHEMES, default="optrace",
                   help="node numbering and digest variant when the header names none (default: optrace; docs/OPTRACE.md)")
    p.add_argument("--host-policy", default="duplicate_first",
                   help="host-pressure policy (default: duplicate_first, SGLang's)")
    p.add_argument("--summary", action="store_true",
                   help="print a one-line summary to stderr instead of the per-op outputs "
                        "(which still go to -o when it is given)")


def run(args) -> int:
    from sim.atomic import atomic_path
    from sim.optrace import replay_lines
    from sim.policies import resolve
    from sim.policies.host import HOST_POLICIES

    resolve(HOST_POLICIES, args.host_policy, "host policy", where="--host-policy")
    lines = replay_lines(args.trace, ids=args.ids, host_policy=args.host_policy)
    n = 0
    last = None
    if args.out:
        from sim.paths import check_user_file

        check_user_file(args.out)  # a folder or a missing folder: one line naming -o
        with atomic_path(args.out) as tmp, open(tmp, "w") as fh:
            for line in lines:
                fh.write(line + "\n")
                n, last = n + 1, line
    elif args.summary:
        # The summary is what was asked for: the per-op lines (one per op, each with the
        # tree's state) would bury it; replay them all the same, for the final state.
        for line in lines:
            n, last = n + 1, line
    else:
        for line in lines:
            sys.stdout.write(line + "\n")
            n, last = n + 1, line
    if args.summary and last is not None:
        import json

        final = json.loads(last)
        if "mamba_host" in final:  # a hybrid trace with the host tier
            print(f"{n} ops replayed; digest {final['digest']}; device {final['dev']} tokens, "
                  f"mamba {final['mamba']} states, host {final['host']} tokens, mamba host "
                  f"{final['mamba_host']} states, {final['nodes']} nodes", file=sys.stderr)
        elif "digest" in final:
            print(f"{n} ops replayed; digest {final['digest']}; device {final['dev']} tokens, "
                  f"host {final['host']} tokens, {final['nodes']} nodes", file=sys.stderr)
        else:  # a hybrid trace (docs/HYBRID.md §6): the component's pool instead of host
            aux = "swa" if "swa" in final else "mamba"
            unit = "tokens" if aux == "swa" else "states"
            print(f"{n} ops replayed; device {final['dev']} tokens, {aux} {final[aux]} {unit}, "
                  f"{final['nodes']} nodes", file=sys.stderr)
    return 0
