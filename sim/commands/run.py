"""`hicache-sim run SCENARIO [-o DIR] [--seed N] [--set k=v ...]`: simulate one scenario."""

from __future__ import annotations

import sys
import time

from sim.fmt import duration

NAME = "run"
HELP = "Simulate a scenario and write a results folder (parquet, JSON, resolved YAML)."


def add_arguments(p) -> None:
    p.add_argument("scenario", help="scenario YAML (see scenarios/)")
    p.add_argument("-o", "--out", help="results folder (default: results/<scenario name>)")
    p.add_argument("--seed", type=int, help="override the scenario's seed (0 to 2**63 - 1)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set host.ratio=4 (repeatable)")
    p.add_argument("--collective", choices=("simulated", "torch"),
                   help="all_reduce backend (overrides collective.backend)")
    p.add_argument("--trace-out", metavar="FILE", help="write a Chrome/Perfetto trace of per-rank events")
    p.add_argument("--record-ops", metavar="DIR",
                   help="also write every replica's op-trace (v2, docs/OPTRACE.md) into DIR: one "
                        "JSONL per rank plus index.json (one folder per instance with dp > 1)")
    p.add_argument("--record-steps", metavar="FILE.jsonl",
                   help="also write every scheduler step and request in the SGLang server "
                        "harness's records (needs engine.clock steps; at tp > 1 one file "
                        "per rank, FILE.rank0.jsonl, ...)")
    p.add_argument("--kv-events", metavar="FILE",
                   help="also write SGLang's KV events (BlockStored / BlockRemoved, as its "
                        "publisher sends them: one msgpack KVEventBatch per scheduler iteration, "
                        "back to back) of each instance's rank 0 into FILE (docs/SERVER_ARTEFACTS.md)")
    p.add_argument("--kv-events-config", metavar="JSON",
                   help="also publish those events on a ZMQ socket, as SGLang's --kv-events-config "
                        "configures it: '{\"publisher\": \"zmq\", \"endpoint\": "
                        "\"tcp://127.0.0.1:5557\", \"bind\": true, \"topic\": \"kv\"}' "
                        "(loopback only; needs pyzmq)")
    p.add_argument("--kv-events-wait", type=float, default=10.0, metavar="SECONDS",
                   help="how long the ZMQ publisher waits for a subscriber (default 10)")
    p.add_argument("--plots", action="store_true", help="also write the plots into the results folder")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_input_flags(p)


def add_input_flags(p) -> None:
    """``--trace-root`` and ``--force``: shared by the commands that load scenarios."""
    p.add_argument("--trace-root", dest="trace_roots", action="append", default=[], metavar="DIR",
                   help="also resolve the scenario's trace, arrival and profile paths under DIR "
                        "(besides the scenario's folder, data/ and $HICACHE_TRACE_CACHE); repeatable")
    p.add_argument("--force", action="store_true",
                   help="run torch collectives even beyond this machine's cores and memory")


def run(args) -> int:
    from sim.errors import DivergenceError, UserError
    from sim.runner import run_scenario
    from sim.verdict import EXIT_INTERRUPTED, EXIT_OK, exit_code
    from sim.scenario import load_scenario

    from sim import resources

    # Command-line values go through the schema like any scenario key.
    flags = [("--seed", "seed", args.seed), ("--collective", "collective.backend", args.collective)]
    scenario = load_scenario(args.scenario, args.sets, flags=flags, trace_roots=args.trace_roots)
    kv = None
    if args.kv_events or args.kv_events_config:
        import math

        from sim.kvevents import parse_zmq_config

        if not (math.isfinite(args.kv_events_wait) and 0 < args.kv_events_wait <= 3600):
            raise UserError(f"--kv-events-wait {args.kv_events_wait:g}; expected seconds in (0, 3600]")
        kv = {"file": args.kv_events, "wait_s": args.kv_events_wait,
              "zmq": parse_zmq_config(args.kv_events_config) if args.kv_events_config else None}
    est = resources.check(scenario, force=args.force)
    from sim.scenario import resolve_sizing

    for w in resolve_sizing(scenario)["warnings"]:  # node.on_exceed: warn
        print(f"warning: {w}", file=sys.stderr)
    if est.large:
        print(est.line(), file=sys.stderr)
    if args.trace_out is not None:  # before the run, not after it
        from sim.paths import check_user_file

        check_user_file(args.trace_out)
    out = args.out or f"results/{scenario.name}"  # the name is a slug: stays under results/
    bar = _progress_bar(args.quiet, scenario)
    t0 = time.perf_counter()
    final = None  # (metrics, whether the run reached its end)
    try:
        res = run_scenario(scenario, out, progress=bar.update if bar else None,
                           trace_out=args.trace_out, record_ops_dir=args.record_ops,
                           record_steps=args.record_steps, kv_events=kv)
        # the engine (sim.cluster.Cluster) counts done and rejected requests itself
        final = (res.sim, not res.partial and res.sim.stuck is None and not res.sim.halted)
    finally:
        if bar:
            bar.close(*(final or (None, False)))
    wall = time.perf_counter() - t0
    _print_summary(res, out, wall)
    if args.record_ops:
        print(f"op-traces: {args.record_ops}")
    if args.kv_events:
        print(f"KV events: {args.kv_events}")
    if args.kv_events_config:
        print(f"KV events published: {kv['zmq']['endpoint']}")
    if args.plots and not res.partial and not res.interrupted:
        from reports.load import load_run
        from reports.plots import plot_runs

        paths = plot_runs([load_run(out)], f"{out}/plots")
        print(f"plots: {len(paths)} files in {out}/plots")
    if res.partial:
        print("interrupted: partial results written (meta.json: partial=true)", file=sys.stderr)
        return EXIT_INTERRUPTED
    if res.interrupted:
        print("interrupted after the simulation ended: the results folder is complete",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    div = res.divergence
    code = exit_code(div, res.sim.stuck)
    if code != 0:
        raise DivergenceError(f"{halt_message(div, res.sim.stuck)} (see {out}/divergence.json)",
                              exit_code=code)
    if div["verdict"] == "missed":
        print(f"warning: {div['reason']} (verdict missed; see {out}/divergence.json)",
              file=sys.stderr)
    return EXIT_OK


def consensus_line(rc: dict) -> str:
    """The rank consensus checker's CRITICAL line (rank_consensus_checker.py), short."""
    ev = "; ".join(f"ranks {r}: {e}" for r, e in rc["events"].items())
    return (f"{rc['message']} at t={rc['t']:.6f}s (step {rc['step']}, @rank_consensus "
            f"{rc['site']}, event {rc['event']}): {ev}")


def halt_message(div: dict, stuck: str | None = None) -> str:
    """One line saying where the run failed as the real server would have (the first
    failure, the verdict's), or what stopped the simulation."""
    from sim.constants import DIGEST_MISMATCH_MESSAGE

    verdict, m, e = div["verdict"], div.get("digest_mismatch"), div.get("collective_error")
    recorded = "" if div["halted"] else "; recorded, the run went on (on_divergence: record)"
    rc = div.get("rank_consensus")
    if verdict in ("detected", "false_alarm") and rc and (
            not m or (rc["step"], rc["t"]) <= (m["step"], m["t"])):
        return consensus_line(rc) + recorded  # the checker fired first
    if verdict in ("detected", "false_alarm") and m:
        return (f"AssertionError at t={m['t']:.6f}s (step {m['step']}): "
                f"{DIGEST_MISMATCH_MESSAGE}{recorded}")
    if verdict in ("hang", "size_mismatch") and e:
        return (f"collective {e['kind']} at t={e['t']:.6f}s (step {e['step']}, {e['site']}): "
                f"{e['message']}")
    u = div.get("untracked")
    if div["halted"] == "out_of_memory" and u:
        return f"out of memory at t={u['t']:.6f}s (step {u['step']}): {u['why']}"
    if stuck is not None:
        return f"the run would hang: {stuck}"
    return (f"ranks diverged at t={u['t']:.6f}s (step {u['step']}): {u['why']}; "
            "the simulation cannot follow them further")


class _Bar:
    """tqdm progress with a total and an ETA: requests (finished plus rejected) out of the
    expected count when it is known, else simulated seconds out of ``limits.duration_s``,
    else a plain counter. The postfix shows simulated time and the current hit rate."""

    STEP = 25  # requests between redraw requests (tqdm also rate-limits itself)

    def __init__(self, requests: int | None, duration_s: float | None, file=None):
        from tqdm import tqdm

        self.by_time = requests is None and duration_s is not None
        total = duration_s if self.by_time else requests
        self.bar = tqdm(total=total, unit="s" if self.by_time else "req", dynamic_ncols=True,
                        file=file or sys.stderr, mininterval=0.5,
                        desc="simulated" if self.by_time else None)
        self.last = 0.0 if self.by_time else 0
        self.now = 0.0

    def _count(self, metrics) -> int:
        # Rejected requests are finished too (SGLang aborts them): without them the
        # bar would stop short of its total by the rejected count.
        return metrics.done + metrics.rejected

    def update(self, now, metrics) -> None:
        self.now = now
        n = self._count(metrics)
        pos = min(now, self.bar.total) if self.by_time else n
        if self.by_time or n - self.last >= self.STEP or n < self.STEP:
            self.bar.update(pos - self.last)
            self.last = pos
            self.bar.set_postfix_str(f"sim {duration(now)}  {n:,} req  hit {metrics.hit_rate:.1%}"
                                     if self.by_time else
                                     f"sim {duration(now)}  hit {metrics.hit_rate:.1%}",
                                     refresh=False)

    def close(self, metrics=None, complete: bool = False) -> None:
        """Show the run's final count (the last ``update`` may have been skipped by
        ``STEP``). A run that reached its end ends at 100%: the total was an estimate
        (skipped trace lines, arrivals past duration_s), so it becomes the count."""
        if metrics is not None:
            n = self._count(metrics)
            if self.by_time:
                pos = self.bar.total if complete else min(self.now, self.bar.total)
            else:
                pos = n
                if complete:
                    self.bar.total = n
            self.bar.update(pos - self.last)
            self.last = pos
            self.bar.refresh()
        self.bar.close()


def _progress_bar(quiet: bool, scenario):
    if quiet or not sys.stderr.isatty():
        return None
    from sim.workloads.count import expected_requests

    return _Bar(expected_requests(scenario), scenario.limits.duration_s)


def rejected_line(summary: dict, pool_tokens: int | None = None) -> str:
    """Why requests were rejected: the engine rejects only requests that can never be
    admitted, whose input plus (clipped) output plus a page reaches the whole device
    pool (SGLang aborts them), so that is the reason. ``pool_tokens``: the smallest
    rank's pool (the engine's test), else rank 0's."""
    n = summary["rejected_requests"]
    pool = summary["device_tokens"] if pool_tokens is None else pool_tokens
    return (f"{n:,} request{'s' if n != 1 else ''} rejected: input+output plus a page "
            f"does not fit the device pool ({pool:,} tokens)")


def _pool_tokens(res) -> int | None:
    """The smallest device pool of any replica: the engine rejects against it."""
    sim = res.sim
    groups = [i.group for i in getattr(sim, "instances", ())] or [getattr(sim, "group", None)]
    try:
        return min(c.tree.device_capacity for g in groups for c in g.cohorts)
    except (AttributeError, ValueError, TypeError):
        return None


def tier_rows(s: dict) -> list[tuple[str, str]]:
    """The summary's per-tier rows: the hit rate, then each tier's hits (share of input,
    tokens beside), then each tier's capacity per rank in GB with tokens beside, then
    the traffic between them in GB. Device, host and, with an L3 tier, storage: each
    row names its tier, so no tier's hits are shown as another's."""
    from sim.diagnostics import tier_hits
    from sim.sizing import fmt_capacity, fmt_gb_value

    bpt = s["bytes_per_token"]
    hits = tier_hits(s)
    buffer_only = s.get("host_memory_mode") == "buffer_only"
    rows = [("hit rate", f"{s['hit_rate']:.1%} of {s.get('input_tokens', 0):,} input tokens")]
    for tier, (tokens, share) in hits.items():
        rows.append((f"  {tier} hits", f"{share:.1%}  ({tokens:,} tokens)"))
    rows.append(("device capacity", fmt_capacity(s['device_tokens'], bpt) + " per rank"))
    rows.append(("host capacity", ((fmt_capacity(s['host_tokens'], bpt) + " per rank"
                                    + ("; a staging buffer for storage (buffer_only)"
                                       if buffer_only else ""))
                                   if s['host_tokens'] else "off (no host tier)")))
    if "storage" in hits:
        cap = s.get("storage_gb")
        rows.append(("storage capacity", "unbounded" if cap is None else
                     fmt_capacity(int(cap * 1e9 // bpt), bpt) + " per rank"))

    def gb(n_bytes) -> str:
        return f"{fmt_gb_value(n_bytes / 1e9)} GB ({n_bytes // bpt:,} tokens)"

    rows.append(("load-back / backup traffic",
                 f"{gb(s['load_back_bytes'])} / {gb(s['backup_bytes'])} per rank"))
    if "storage" in hits:
        rows.append(("storage read / write traffic",
                     f"{gb(s['l3_read_bytes'])} / {gb(s['l3_write_bytes'])} per rank"))
    return rows


def _print_summary(res, out, wall) -> None:
    from sim.sizing import fmt_capacity

    s, d = res.summary, res.divergence
    bpt = s["bytes_per_token"]
    tiers = tier_rows(s)
    rows = [
        ("requests", f"{s['requests']:,}"),
        *([("rejected", rejected_line(s, _pool_tokens(res)))] if s.get("rejected_requests") else []),
        *([("retracted", f"{s['retracted_requests']:,} decode retractions"
            + (f", {s['aborted_requests']:,} aborted out of memory" if s.get("aborted_requests") else ""))]
          if s.get("retracted_requests") else []),
        ("simulated time", f"{duration(s['sim_time_s'])}  ({duration(wall)} wall)"),
        *[r for r in tiers if "traffic" not in r[0]],
        ("TTFT p50 / p99", f"{duration(s['ttft_p50_s'])} / {duration(s['ttft_p99_s'])}"),
        ("mean effective capacity", fmt_capacity(round(s['effective_tokens_mean']), bpt)),
        ("pages held (device / host / both)", f"{s['device_pages_mean']:,.0f} / "
         f"{s['host_pages_mean']:,.0f} / {s['duplicate_pages_mean']:,.0f} (unique "
         f"{s['unique_pages_mean']:,.0f}); failed host allocations "
         f"{'-' if s['backup_failures'] is None else format(s['backup_failures'], ',')}"),
        ("mean duplicate share", f"{s['duplicate_share_mean']:.1%}"),
        *[r for r in tiers if "traffic" in r[0]],
        ("reclaimed (pass 1 / pass 2)", f"{s['reclaim_pass1_tokens']:,} / {s['reclaim_pass2_tokens']:,} tokens"),
        ("diagnosis", s["diagnosis"]),
        ("TP verdict", f"{d['verdict']} ({d['tp']} ranks): {d['reason']}"),
        ("results", str(out)),
    ]
    if "utilisation" in s:
        rows.insert(-1, ("GPU utilisation", f"{s['utilisation']:.0%}"
                         + (f" over {s['dp']} instances" if s.get("dp", 1) > 1 else "")))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if s.get("overload_warning"):
        print(f"warning: {s['overload_warning']}", file=sys.stderr)
