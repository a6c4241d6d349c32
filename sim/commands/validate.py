"""``hicache-sim validate SCENARIO... [--set k=v]``: check scenario files without running.

One line per file: ``OK`` with the resolved per-rank capacities, or the error line.
Every file is checked even after a failure; the exit code is 2 if any failed.
"""

from __future__ import annotations

import sys

from sim.errors import UserError, one_line

NAME = "validate"
HELP = "Validate scenario files and print their resolved device/host capacities."


def add_arguments(parser) -> None:
    parser.add_argument("scenarios", nargs="+", metavar="SCENARIO", help="scenario YAML files")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY.PATH=VALUE",
                        help="override a key (value parsed as YAML); repeatable")
    parser.add_argument("--deep", action="store_true",
                        help="also stream the whole workload (reads trace files to the end) "
                             "and report its request count")
    from sim.commands.run import add_input_flags

    add_input_flags(parser)


def check(path: str, overrides=(), deep: bool = False, trace_roots=(), force: bool = False) -> str:
    """The OK line for one scenario file; raises UserError on any problem."""
    from sim import resources
    from sim.scenario import load_scenario
    from sim.workloads import build_workload

    s = load_scenario(path, overrides, trace_roots=trace_roots)
    est = resources.check(s, force=force)
    from sim.scenario import resolve_sizing
    from sim.sizing import fmt_capacity

    info = resolve_sizing(s)
    dev, host, bpt = info["device_tokens"], info["host_tokens"], info["bytes_per_token"]
    stream = build_workload(s)
    note = ""
    if deep:
        n = sum(1 for _ in stream)
        note = f", {n} requests"
        if stream.skipped:
            note += f" ({stream.skipped} bad lines skipped)"
    else:
        next(iter(stream), None)  # opens the trace and parses its first record
    warn = " (note: host <= device, SGLang warns)" if 0 < host <= dev else ""
    warn += "".join(f" (warning: {w})" for w in info["warnings"])
    node = info["node"]
    if node is not None:
        dedup = (f" ({node['host_copies_per_node']} holding KV: MLA host dedup)"
                 if s.host.mla_dedup else "")
        warn += (f", node: {node['host_gb_per_node']:,.1f} GB of host pools on {node['ranks_per_node']} "
                 f"ranks{dedup}, budget {node['host_budget_gb_per_rank']:,.1f} GB per rank")
    host_text = fmt_capacity(host, bpt) if host else "off (no host tier)"
    hyb = info.get("hybrid")
    if hyb is not None:  # the component's own pools (docs/HYBRID.md §10.1)
        h = s.model.hybrid()
        if h.kind == "mamba":
            warn += (f", {s.model.hybrid_preset}: {hyb['aux_device']:,} Mamba state slots "
                     f"({hyb['aux_device'] * hyb['aux_bytes'] / 1e9:,.2f} GB)"
                     + (f", {hyb['aux_host']:,} host state slots" if host else ""))
        else:
            warn += (f", {s.model.hybrid_preset}: SWA pool {hyb['aux_device']:,} tokens "
                     f"({hyb['aux_device'] * hyb['aux_bytes'] / 1e9:,.3f} GB), "
                     f"window {h.sliding_window}")
    big = f"; {est.line()}" if est.large else ""
    return (f"OK {path}: {s.name}: device {fmt_capacity(dev, bpt)}, host {host_text} per rank "
            f"({bpt:,} bytes/token), tp {s.tp}, page {s.page_size}, "
            f"workload {s.workload.kind}{note}{warn}{big}")


def run(args) -> int:
    failed = 0
    for path in args.scenarios:
        try:
            print(check(path, args.overrides, args.deep, args.trace_roots, args.force))
        except UserError as err:
            failed += 1
            print(one_line(f"hicache-sim validate: error: {err}"), file=sys.stderr)
    return 2 if failed else 0
