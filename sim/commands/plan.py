"""`hicache-sim plan SCENARIO`: one command, one figure, one answer.

Hit rate and TTFT against host GB per rank for write_back / write_through x
duplicate_first / lru, from the one-pass model checked by engine runs, with the
offline optimum, the knee, and the smallest host that meets a target
(``sim.analysis.plan``). Writes ``plan.png``, ``plan.svg``, ``plan.parquet`` and
``plan.json`` into ``-o`` (default ``results/<name>_plan``), atomically.

A scenario with a ``model.hybrid_preset`` gets the hybrid plan instead
(``sim.analysis.plan_hybrid``): host hit rate against host KV x the other component's
host pool (Mamba state slots, or host SWA tokens for (FULL, SWA)) from engine runs, and
the size at or below which the host tier is inert; same outputs.
"""

from __future__ import annotations

import math
import sys

NAME = "plan"
HELP = "Host capacity plan: hit rate and TTFT vs host GB per rank, knee, target answer."


def add_arguments(p) -> None:
    p.add_argument("scenario", help="scenario YAML (see scenarios/)")
    p.add_argument("-o", "--out", metavar="DIR", help="output folder (default results/<name>_plan)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key (repeatable)")
    p.add_argument("--trace-root", dest="trace_roots", action="append", default=[], metavar="DIR",
                   help="also resolve the scenario's trace paths under DIR; repeatable")
    p.add_argument("--target-hit-rate", metavar="X",
                   help="print the smallest host per rank (and per node) reaching this hit rate "
                        "(0.6 or 60%%)")
    p.add_argument("--target-ttft-p99", metavar="S",
                   help="print the smallest host per rank whose TTFT p99 is at most S seconds")
    p.add_argument("--warmup", default="0", metavar="FRACTION",
                   help="count hits only after this fraction of the requests (default 0)")
    p.add_argument("--check-points", default=DEFAULTS["check_points"], metavar="N",
                   help="engine runs per policy pair, evenly spaced from 0 GB to the range's end "
                        "(default 4; 0: model only)")
    p.add_argument("--opt-points", default=DEFAULTS["opt_points"], metavar="N",
                   help="host sizes for the offline optimum (default 5; 0: none)")
    p.add_argument("--grid-points", default=DEFAULTS["grid_points"], metavar="N",
                   help="host sizes on the model curve (default 50)")
    p.add_argument("--max-host-gb", metavar="GB",
                   help="end of the host range per rank (default: where write_back's model reaches "
                        "99%% of its reachable hits, at least 2x the scenario's host)")
    p.add_argument("--policies", metavar="WP+HP,...",
                   help="policy pairs (default: write_back+duplicate_first, write_back+lru, "
                        "write_through+duplicate_first, write_through+lru)")
    p.add_argument("--jobs", default="1", metavar="J", help="engine runs in parallel (default 1)")
    g = p.add_argument_group("hybrids: (FULL, MAMBA) and (FULL, SWA) (model.hybrid_preset; "
                             "docs/HYBRID.md §11)")
    g.add_argument("--kv-points", default=DEFAULTS["kv_points"], metavar="N",
                   help="host KV sizes, evenly spaced up to --max-host-gb, plus the scenario's "
                        "(default 3)")
    g.add_argument("--aux-points", metavar="N",
                   help="points on the second axis per KV size, geometric up to --max-aux "
                        "(default 8): host Mamba state slots from 1, host SWA tokens from one "
                        "page (in whole pages)")
    g.add_argument("--max-aux", metavar="N",
                   help="end of the second axis (default: Mamba, the states the workload can "
                        "create, one per prefill chunk; SWA, device SWA + the largest host KV, "
                        "tokens: a multiple of page_size)")
    g.add_argument("--slot-points", default=DEFAULTS["slot_points"], metavar="N",
                   help="(FULL, MAMBA) name of --aux-points: host Mamba state slot counts")
    g.add_argument("--max-slots", metavar="N",
                   help="(FULL, MAMBA) name of --max-aux: the largest slot count")
    g.add_argument("--inert-fraction", default=DEFAULTS["inert_fraction"], metavar="X",
                   help="a slot count (host SWA size) is inert when its host hit tokens are "
                        "below this share of the plateau with an unbounded pool (default 1%%)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def _number(text, flag, lo=None, hi=None, *, integer=False, percent=False, lo_open=False):
    from sim.errors import UserError

    raw = str(text).strip()
    scale = 1.0
    if percent and raw.endswith("%"):
        raw, scale = raw[:-1], 0.01
    try:
        v = float(raw) * scale
    except ValueError:
        v = math.nan
    bad = not math.isfinite(v) or (integer and not v.is_integer())
    if not bad and lo is not None:
        bad = v <= lo if lo_open else v < lo
    if not bad and hi is not None:
        bad = v > hi
    if bad:
        kind = "a whole number" if integer else "a number"
        rng = f" in {'(' if lo_open else '['}{lo:g}, {hi:g}]" if lo is not None and hi is not None else (
            f" {'>' if lo_open else '>='} {lo:g}" if lo is not None else "")
        raise UserError(f"found {text!r}; expected {kind}{rng}", where=flag)
    return int(v) if integer else v


def _policies(text):
    from sim.analysis.plan import HOST_POLICIES, WRITE_POLICIES
    from sim.errors import UserError

    if text is None:
        return None
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        wp, _, hp = item.partition("+")
        if wp not in WRITE_POLICIES or hp not in HOST_POLICIES:
            raise UserError(f"found {item!r}; expected WRITE+HOST with WRITE one of "
                            f"{', '.join(WRITE_POLICIES)} and HOST one of {', '.join(HOST_POLICIES)}",
                            where="--policies")
        if (wp, hp) not in out:
            out.append((wp, hp))
    if not out:
        raise UserError(f"found {text!r}; expected at least one WRITE+HOST pair", where="--policies")
    return out


def run(args) -> int:
    import gc

    # The command's imports (pydantic, numpy, pyarrow; matplotlib in the writer) and
    # the scenario's load make objects that live to its end: a cyclic collection in
    # the middle walks them and frees nothing. Collections run only while engine runs
    # make garbage (make_plan pauses them for its own analysis of the trace).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _run(args, collecting)
    finally:
        if collecting:
            gc.enable()


def _run(args, collecting: bool) -> int:
    import gc
    from pathlib import Path

    from sim.errors import UserError

    target = None if args.target_hit_rate is None else _number(
        args.target_hit_rate, "--target-hit-rate", 0.0, 1.0, percent=True, lo_open=True)
    ttft = None if args.target_ttft_p99 is None else _number(
        args.target_ttft_p99, "--target-ttft-p99", 0.0, 1e9, lo_open=True)
    warmup = _number(args.warmup, "--warmup", 0.0, 0.99, percent=True)
    checks = _number(args.check_points, "--check-points", 0, 100, integer=True)
    opts = _number(args.opt_points, "--opt-points", 0, 100, integer=True)
    grid = _number(args.grid_points, "--grid-points", 3, 10000, integer=True)
    jobs = _number(args.jobs, "--jobs", 1, 256, integer=True)
    max_gb = None if args.max_host_gb is None else _number(
        args.max_host_gb, "--max-host-gb", 0.0, 1e7, lo_open=True)
    if ttft is not None and checks < 2:
        raise UserError(f"found --check-points {checks}; expected at least 2 engine points for a "
                        "TTFT target (TTFT comes from engine runs only)", where="--target-ttft-p99")
    policies = _policies(args.policies)
    # The writer forks now, before the scenario's imports: its own (matplotlib) run
    # while this process loads the scenario and computes the plan.
    writer = PlanWriter.start()
    try:
        from sim.scenario import load_scenario

        scenario = load_scenario(args.scenario, args.sets, trace_roots=args.trace_roots)
        out = Path(args.out or f"results/{scenario.name}_plan")
        if out.exists() and not out.is_dir():
            raise UserError("found a file; expected a folder for the plan's outputs", where=str(out))
        if collecting and (checks or scenario.model.hybrid_preset is not None):
            # Engine runs make garbage: collect it, without walking what is there now
            # (frozen: it lives to the end). A model-only plan runs none.
            gc.freeze()
            gc.enable()
        if scenario.model.hybrid_preset is not None:
            return _run_hybrid(args, scenario, out, warmup, jobs, max_gb, writer)
        for flag, key in HYBRID_ONLY:
            if getattr(args, key) != DEFAULTS[key]:
                raise UserError(f"found {flag} with a FULL-only model; expected it only with a "
                                "hybrid model.hybrid_preset (it sizes the second host pool)",
                                where=flag)

        from sim.analysis.plan import make_plan

        progress = Progress("engine run", args.quiet)
        plan = make_plan(scenario, warmup=warmup, max_host_gb=max_gb, check_points=checks,
                         opt_points=opts, grid_points=grid, policies=policies, jobs=jobs,
                         target_hit_rate=target, target_ttft_p99_s=ttft, progress=progress)
        gc.disable()  # writing: pyarrow's import (pandas' for a table only it can type)
        written = writer.write(plan, out) if writer is not None else write_plan(plan, out)
    finally:
        if writer is not None:
            writer.close()
    print_plan(plan)
    print(f"written: {', '.join(str(p) for p in written)}")
    _skip_final_collection()
    return 0


def _skip_final_collection() -> None:
    """Every file is written and closed: the interpreter's last garbage collection at
    exit, a walk over every object pyarrow, numpy and pydantic made, frees nothing
    the operating system does not take back anyway, so the objects are frozen out of
    it (``gc.freeze``)."""
    import gc

    gc.freeze()


FIGURE_FORMATS = ("png", "svg")


def _preload() -> None:
    """What drawing and saving a plan figure imports: matplotlib (reports.plan), the
    Agg and SVG backends its first save of each format would load, the atomic writer,
    and what unpickling the plan takes."""
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.backends.backend_svg  # noqa: F401

    import reports.plan  # noqa: F401
    import sim.analysis.plan  # noqa: F401
    import sim.atomic  # noqa: F401


def _writer_process(conn) -> None:
    """The plan's figures in a forked process: their imports while the parent
    computes the plan, then the figures once the plan arrives; the paths written, or
    the error."""
    import traceback

    try:
        _preload()
        job = conn.recv()
        if job is not None:
            plan, out, hybrid = job
            draw, save = _figure_writers(hybrid)
            conn.send([str(p) for p in write_figures(plan, out, draw, save)])
        else:
            conn.send(None)
    except BaseException:  # noqa: BLE001 - handed to the parent, which raises it
        conn.send(traceback.format_exc())


class PlanWriter:
    """The plan's figures off the critical path: a forked process imports what drawing
    them takes (matplotlib: about half a second) while the parent loads the scenario
    and computes the plan, then draws and saves them while the parent writes the
    table and the JSON (pyarrow, and pandas for a hybrid plan's table: imported only
    then, so they load while the figures draw). The same functions write the same bytes as
    ``write_plan``; the parent waits for the figures, so every file is there when
    ``plan`` returns. Where fork is not the platform's way, ``start`` returns None and
    the parent writes everything itself."""

    def __init__(self, ctx):
        self.conn, there = ctx.Pipe()
        self.proc = ctx.Process(target=_writer_process, args=(there,), daemon=True)
        self.proc.start()
        there.close()
        self.sent = False

    @classmethod
    def start(cls) -> "PlanWriter | None":
        import multiprocessing

        if not sys.platform.startswith("linux") or "fork" not in multiprocessing.get_all_start_methods():
            return None
        return cls(multiprocessing.get_context("fork"))

    def write(self, plan, out, hybrid: bool = False) -> list:
        """``write_plan(plan, out)`` (``write_hybrid_plan`` when ``hybrid``): the figures
        in the process, the table and JSON here; the paths written, in that order."""
        from pathlib import Path

        self.conn.send((plan, out, hybrid))
        self.sent = True
        try:
            files = write_files(plan, out, hybrid_plan_table if hybrid else plan_table)
        finally:
            try:
                got = self.conn.recv()  # the figures, even when the files failed
            except EOFError:
                got = f"the writing process ended with exit code {self.proc.exitcode}"
        if isinstance(got, str):
            raise RuntimeError(f"writing the plan failed:\n{got}")
        return [Path(p) for p in got] + files

    def close(self) -> None:
        """Release the process whatever happened (no plan: it is told to stop)."""
        if not self.sent and self.proc.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
        self.conn.close()
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join()


def write_figures(plan, out, draw, save_figure) -> list:
    """``plan.png`` and ``plan.svg`` (``save_figure(draw(plan), path, fmt)``) into
    ``out``, each written atomically; the paths written."""
    from pathlib import Path

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fig = draw(plan)
    paths = []
    for fmt in FIGURE_FORMATS:
        p = out / f"plan.{fmt}"
        save_figure(fig, p, fmt)
        paths.append(p)
    return paths


def write_files(plan, out, table) -> list:
    """``plan.parquet`` (``table(plan)``) and ``plan.json`` (``plan.doc``) into ``out``,
    each written atomically; the paths written."""
    from pathlib import Path

    from sim.atomic import write_json, write_parquet

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(out / "plan.parquet", table(plan))
    write_json(out / "plan.json", plan.doc)
    return [out / "plan.parquet", out / "plan.json"]


def write_outputs(plan, out, draw, save_figure, table) -> list:
    """The figures, then ``plan.parquet`` and ``plan.json``, into ``out``, each written
    atomically; the paths written."""
    return write_figures(plan, out, draw, save_figure) + write_files(plan, out, table)


def _figure_writers(hybrid: bool):
    """(draw, save) of the plan figure or of the hybrid one."""
    if hybrid:
        from reports.plan_hybrid import draw_hybrid_plan, save_hybrid_plan_figure

        return draw_hybrid_plan, save_hybrid_plan_figure
    from reports.plan import draw_plan, save_plan_figure

    return draw_plan, save_plan_figure


def plan_table(plan):
    """The FULL-only plan's rows: built without pandas where it can be
    (``sim.analysis.plan.plan_arrow_table``, the same bytes), else
    ``sim.analysis.plan.plan_table``."""
    from sim.analysis.plan import plan_arrow_table
    from sim.analysis.plan import plan_table as table

    arrow = plan_arrow_table(plan)
    return table(plan) if arrow is None else arrow


def hybrid_plan_table(plan):
    """The hybrid plan's rows (``sim.analysis.plan_hybrid.hybrid_plan_table``)."""
    from sim.analysis.plan_hybrid import hybrid_plan_table as table

    return table(plan)


def write_plan(plan, out) -> list:
    """The FULL-only plan's outputs (``sim.analysis.plan``)."""
    return write_outputs(plan, out, *_figure_writers(False), plan_table)


def write_hybrid_plan(plan, out) -> list:
    """The hybrid plan's outputs (``sim.analysis.plan_hybrid``)."""
    return write_outputs(plan, out, *_figure_writers(True), hybrid_plan_table)


def _gb(v) -> str:
    return "-" if v is None else f"{v:,.1f} GB"


def print_plan(plan) -> None:
    d = plan.doc
    tier = d["tier"]
    # host copies per node: one per rank, one per TP group under MLA host dedup
    n = d.get("host_copies_per_node", d["ranks_per_node"]) if tier == "host" else d["ranks_per_node"]
    print(f"{d['scenario']}: {d['requests']:,} requests ({d['warmup_requests']:,} warm-up), device "
          f"{d['device_gb_per_rank']:.1f} GB ({d['device_tokens_per_rank']:,} tokens) per rank, "
          f"{d['bytes_per_token']:,} bytes/token, {d['ranks_per_node']} ranks per node"
          + (f" (MLA host dedup: {n} host {'copy' if n == 1 else 'copies'} per node)" if d.get("mla_dedup") else "")
          + f"; {tier} range up to "
          f"{d['max_host_gb_per_rank']:,.1f} GB per rank"
          + ("" if tier == "host" else " (host off: the plan varies the device)"))
    header = ["policy", "knee (per rank)", "hit at knee", f"hit at scenario {tier}",
              "model-engine max |Δ|"]
    if d["targets"]["hit_rate"] is not None:
        header.append(f"hit >= {d['targets']['hit_rate']:.0%}: per rank / per node")
    if d["targets"]["ttft_p99_s"] is not None:
        header.append(f"TTFT p99 <= {d['targets']['ttft_p99_s']:g} s: per rank / per node")
    rows = [header]
    for r in d["policies"]:
        knee_text = ("beyond range" if r.get("knee_beyond_range")
                     else _gb(r["knee_gb_per_rank"]))
        row = [f"{r['write_policy']} + {r['host_policy']}", knee_text,
               "-" if r["knee_hit_rate"] is None else f"{r['knee_hit_rate']:.1%}",
               f"{r['hit_rate_at_scenario_host']:.1%}",
               "-" if r["model_vs_engine_max_abs_error"] is None
               else f"{100 * r['model_vs_engine_max_abs_error']:.1f} pts"]
        for key in ("target_hit_rate_gb_per_rank", "target_ttft_p99_gb_per_rank"):
            if key in r:
                v = r[key]
                row.append("none in range" if v is None else f"{_gb(v)} / {_gb(v * n)}")
        rows.append(row)
    widths = [max(len(x[i]) for x in rows) for i in range(len(header))]
    for row in rows:
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                               enumerate(zip(row, widths))))
    if plan.opt:
        what = "L1+L2 only, no L3: not a bound with storage" if d.get("storage") else "bound, any policy"
        print(f"offline optimum ({what}): " + ", ".join(
            f"{g:,.1f} GB -> {h:.1%}" for g, h in plan.opt))
    st = d.get("storage")
    if st:
        cap = st["capacity_gb_per_rank"]
        print(f"L3: {st['backend']} storage, " + ("unbounded" if cap is None else f"{cap:g} GB per rank")
              + f"; hit rates above are {st['planning_curve']}")
        for r in d["policies"]:
            pts = r.get("engine_tiers") or []
            if pts:
                print(f"  {r['write_policy']} + {r['host_policy']}, device / host / storage = total: "
                      + "; ".join(f"{p['host_gb_per_rank']:,.1f} GB {p['device']:.1%} / {p['host']:.1%} / "
                                  f"{p['storage']:.1%} = {p['total']:.1%}" for p in pts))
    e = d.get("scenario_engine")
    if e:
        fails = "-" if e["backup_failures"] is None else f"{e['backup_failures']:,}"
        print(f"engine at the scenario's size: device hit {e['device_hit_rate']:.1%}, host hit "
              f"{e['host_hit_rate']:.1%}; pages held device {e['device_pages_mean']:,.0f} / host "
              f"{e['host_pages_mean']:,.0f} / both {e['duplicate_pages_mean']:,.0f} (unique "
              f"{e['unique_pages_mean']:,.0f}); failed host allocations {fails}")
    print(f"diagnosis ({d['scenario_policy']['write_policy']} + "
          f"{d['scenario_policy']['host_policy']} at {tier} {d['scenario_size_gb_per_rank']:.1f} GB): "
          f"{d['diagnosis']}")
    own = next(r for r in d["policies"] if (r["write_policy"], r["host_policy"]) ==
               (d["scenario_policy"]["write_policy"], d["scenario_policy"]["host_policy"])) \
        if any((r["write_policy"], r["host_policy"]) == (d["scenario_policy"]["write_policy"],
               d["scenario_policy"]["host_policy"]) for r in d["policies"]) else d["policies"][0]
    for key, what in (("target_hit_rate_gb_per_rank", f"a {d['targets']['hit_rate'] or 0:.0%} hit rate"),
                      ("target_ttft_p99_gb_per_rank", f"a TTFT p99 of {d['targets']['ttft_p99_s'] or 0:g} s")):
        if key in own:
            v = own[key]
            pol = f"{own['write_policy']} + {own['host_policy']}"
            if v is None:
                print(f"answer: no {tier} size up to {d['max_host_gb_per_rank']:,.1f} GB per rank "
                      f"gives {what} with {pol}" + (_beyond_optimum(d) if key.startswith(
                          "target_hit") else ""))
            else:
                node = d.get("node")
                fits = "" if not node else (
                    " (fits the node)" if v <= node["host_budget_gb_per_rank"] else
                    f" (more than the node allows: {node['host_budget_gb_per_rank']:,.1f} GB per rank)")
                of = (f"{d['ranks_per_node']} ranks, {n} host {'copy' if n == 1 else 'copies'} (MLA host dedup)"
                      if d.get("mla_dedup") else f"{n} ranks")
                print(f"answer: {pol} needs {v:,.1f} GB of {tier} KV per rank, {v * n:,.1f} GB per "
                      f"node of {of}, for {what}{fits}")


def _beyond_optimum(d: dict) -> str:
    """Why an unreached hit-rate target is unreachable, from the offline optimum: below
    the target, no policy and no size in the range reaches it; above it, one could."""
    best, target = d.get("optimum_max_hit_rate"), d["targets"]["hit_rate"]
    if best is None or target is None:
        return ""
    bound = "no L3, not a bound with storage" if d.get("storage") else "a bound for any policy"
    if best < target:
        return (f"; even the offline optimum ({bound}) reaches only {best:.1%} in this range, "
                f"below the {target:.0%} target")
    return f"; the offline optimum ({bound}) reaches {best:.1%}: another policy may"


class Progress:
    """Progress lines for a log: ``engine run 12/45, 38 s elapsed, ETA 1.2 min``. The
    total is known before the first run (the plan counts its runs up front), so it
    never grows; the ETA is the elapsed time per finished run times those left."""

    def __init__(self, what: str, quiet: bool, clock=None, file=None):
        import time

        self.what, self.quiet = what, quiet
        self.clock = clock or time.perf_counter
        self.file = file
        self.t0 = self.clock()
        self.total = None

    def __call__(self, done: int, total: int) -> None:
        from sim.fmt import duration

        self.total = total
        if self.quiet:
            return
        elapsed = self.clock() - self.t0
        eta = elapsed / done * (total - done) if done else None
        print(f"{self.what} {done}/{total}, {duration(elapsed)} elapsed, ETA "
              f"{duration(eta) if done < total else '0 s'}",
              file=self.file or sys.stderr, flush=True)


# Flags of one kind of plan, with their defaults: the other kind refuses a changed one.
DEFAULTS = {"check_points": "4", "opt_points": "5", "grid_points": "50", "target_hit_rate": None,
            "target_ttft_p99": None, "policies": None, "kv_points": "3", "slot_points": "8",
            "max_slots": None, "inert_fraction": "1%", "aux_points": None, "max_aux": None}
FULL_ONLY = (("--target-hit-rate", "target_hit_rate"), ("--target-ttft-p99", "target_ttft_p99"),
             ("--policies", "policies"), ("--check-points", "check_points"),
             ("--opt-points", "opt_points"), ("--grid-points", "grid_points"))
HYBRID_ONLY = (("--kv-points", "kv_points"), ("--slot-points", "slot_points"),
               ("--max-slots", "max_slots"), ("--inert-fraction", "inert_fraction"),
               ("--aux-points", "aux_points"), ("--max-aux", "max_aux"))
# The (FULL, MAMBA) names of the generic flags, and the generic ones.
MAMBA_NAMES = (("--slot-points", "slot_points", "--aux-points", "aux_points"),
               ("--max-slots", "max_slots", "--max-aux", "max_aux"))


def _run_hybrid(args, scenario, out, warmup, jobs, max_gb, writer=None) -> int:
    """A hybrid scenario: the plan of ``sim.analysis.plan_hybrid`` ((FULL, MAMBA) or
    (FULL, SWA) with a host tier)."""
    from sim.analysis.plan_hybrid import check_hybrid, make_hybrid_plan
    from sim.errors import UserError

    check_hybrid(scenario)
    for flag, key in FULL_ONLY:
        if getattr(args, key) != DEFAULTS[key]:
            raise UserError(f"found {flag} with the hybrid model {scenario.model.hybrid_preset!r}; "
                            "expected it only for a FULL-only model (a hybrid plan answers host "
                            "KV x its other host pool, under the scenario's write policy)",
                            where=flag)
    swa = scenario.model.hybrid().kind == "swa"
    for mflag, mkey, gflag, gkey in MAMBA_NAMES:
        if getattr(args, mkey) != DEFAULTS[mkey]:
            if swa:
                raise UserError(f"found {mflag} with the (FULL, SWA) hybrid "
                                f"{scenario.model.hybrid_preset!r}; expected {gflag} (the host "
                                "SWA tokens axis; state slots are Mamba's)", where=mflag)
            if getattr(args, gkey) is not None:
                raise UserError(f"found both {mflag} and {gflag}; expected one of them "
                                f"({mflag} is the Mamba name of {gflag})", where=mflag)
    kv_points = _number(args.kv_points, "--kv-points", 1, 50, integer=True)
    pflag, ptext = (("--aux-points", args.aux_points) if args.aux_points is not None
                    else ("--slot-points", args.slot_points))
    slot_points = _number(ptext, pflag, 1, 200, integer=True)
    mflag, mtext = (("--max-aux", args.max_aux) if args.max_aux is not None
                    else ("--max-slots", args.max_slots))
    max_slots = None if mtext is None else _number(mtext, mflag, 1, 10**12, integer=True)
    inert = _number(args.inert_fraction, "--inert-fraction", 0.0, 1.0, percent=True, lo_open=True)
    if inert >= 1.0:
        raise UserError(f"found {args.inert_fraction!r}; expected a fraction in (0, 1)",
                        where="--inert-fraction")

    progress = Progress("engine run", args.quiet)
    plan = make_hybrid_plan(scenario, warmup=warmup, max_host_gb=max_gb, kv_points=kv_points,
                            slot_points=slot_points, max_slots=max_slots, jobs=jobs,
                            inert_fraction=inert, progress=progress)
    written = (writer.write(plan, out, hybrid=True) if writer is not None
               else write_hybrid_plan(plan, out))
    print_hybrid_plan(plan)
    print(f"written: {', '.join(str(p) for p in written)}")
    _skip_final_collection()
    return 0


def print_hybrid_plan(plan) -> None:
    from sim.analysis.plan_hybrid import axis_of, fmt_int

    d = plan.doc
    ax = axis_of(d["kind"])
    k, sg = ax.key, f"sglang_{ax.sglang}"
    swa = ax.kind == "swa"
    n = d["ranks_per_node"]
    own = (f"host {d['scenario_host_tokens_per_rank']:,} KV tokens, "
           f"{d[ax.own_key]:,} {ax.unit}" if d["scenario_host_tokens_per_rank"] else "host off")
    if swa:
        aux = (f"{d[ax.device_key]:,} SWA tokens (window {d['sliding_window']:,}, page "
               f"{d['page_size']})")
        sg_name = "SGLang default"
    else:
        aux = (f"{d[ax.device_key]:,} state slots ({d[ax.bytes_key] / 1e6:,.1f} MB a state)")
        sg_name = "SGLang split"
    print(f"{d['scenario']}: {d['requests']:,} requests ({d['warmup_requests']:,} warm-up), "
          f"{d['hybrid_preset']} (FULL, {'SWA' if swa else 'MAMBA'}), per rank: device "
          f"{d['device_tokens_per_rank']:,} FULL tokens + {aux}, {own}; {n} ranks per node; "
          f"{d['write_policy']}")
    header = ["host KV per rank", "plateau host hit", "model host hit", f"inert below ({ax.unit})",
              f"{ax.unit} per KV GB", "per node", f"{sg_name} {ax.unit}",
              f"host hit at {sg_name.split()[1]}"]
    rows = [header]
    for r in d["kv_sizes"]:
        t = r.get(f"inert_threshold_{k}")
        per_gb = r[f"inert_threshold_{k}_per_kv_gb"]
        rows.append([
            f"{r['host_kv_gb_per_rank']:,.1f} GB ({r['host_kv_tokens_per_rank']:,})",
            f"{r['plateau_host_hit_rate']:.1%}", f"{r['model_host_hit_rate']:.1%}",
            "-" if t is None else ("never" if t == 0 else f"<= {t:,}"),
            "-" if per_gb is None else f"{per_gb:,.1f}",
            fmt_int(r[f"inert_threshold_{k}_per_node"]), f"{r[f'{sg}_{k}']:,}",
            f"{r[f'{sg}_host_hit_rate']:.1%}" + (" (inert)" if r[f"{sg}_inert"] else "")])
    widths = [max(len(x[i]) for x in rows) for i in range(len(header))]
    for row in rows:
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                               enumerate(zip(row, widths))))
    slots = sorted({p.aux for p in plan.points if p.probe == "grid"})
    kvs = [r["host_kv_tokens_per_rank"] for r in d["kv_sizes"]]
    by = {(p.host_tokens, p.aux): p for p in plan.points}
    w = max(9, max((len(f"{s:,}") for s in slots), default=0) + 2)
    print(f"host hit rate on the grid (rows: host KV tokens per rank; columns: {ax.label} "
          "per rank):")
    print("  " + "".ljust(11) + "".join(f"{s:>{w},}" for s in slots))
    for kv in kvs:
        print("  " + f"{kv:>11,}" + "".join(
            f"{by[(kv, s)].host_hit_rate:>{w}.1%}" if (kv, s) in by else f"{'':>{w}}"
            for s in slots))
    print(f"inert: {d['inert_rule']}")
    print(f"model: {d['model_note']}")
    bad = [v for v in d["verdicts"] if v != "agree"]
    if bad:
        print(f"note: some engine runs ended with verdict {', '.join(bad)} (the scenario's jitter)")
    for r in d["kv_sizes"]:
        t = r.get(f"inert_threshold_{k}")
        kv = f"with {r['host_kv_gb_per_rank']:,.1f} GB of host KV per rank"
        sp = r[f"{sg}_{k}"]
        if swa:
            tail = f"SGLang's default sizing gives {sp:,}"
        else:
            tail = f"SGLang's split gives {sp:,}"
        if t is None:
            what = "host SWA size" if swa else "slot count"
            print(f"answer: {kv}, no {what} gives host hits "
                  f"(none even with unbounded {ax.unit})")
        elif t == 0:
            one = f"one page ({d['page_size']} tokens) of host SWA" if swa else "one state slot"
            print(f"answer: {kv}, the host tier is never inert: {one} already gives "
                  f"host hits; {tail}")
        else:
            unit = "host SWA tokens" if swa else "state slots"
            print(f"answer: {kv}, the host tier is inert at {t:,} {unit} per rank or fewer "
                  f"({t * n:,} per node of {n} ranks; {r[f'inert_threshold_{k}_per_kv_gb']:,.1f} "
                  f"{ax.unit} per KV GB); {tail}")
