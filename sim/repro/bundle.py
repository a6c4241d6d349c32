"""Repro bundles: writing them, loading them safely, and verifying that they reproduce.

A bundle is a folder: the minimal scenario (self-contained), each rank's op-trace, the
schedule (every rank's ops, ack pops, host-allocation failures and collective
inputs, in the order they happened), the report (``sim.repro.report``) and
``bundle.json`` (verdict, failure, seeds, sizes, what ``verify_bundle`` must see
again). It is written into a temporary folder beside the target and renamed into
place; ``bundle.json`` is written last, so a folder holding it is complete.

A bundle is data, possibly someone else's: ``load_bundle`` checks the type of every
field ``verify_bundle`` reads and confines every path to the bundle
(``sim.paths.confine_in``); its scenario may read files inside the bundle only.
Everything is keyed by rank, never by the engine's replica grouping, and written
deterministically (same scenario and seed: byte-identical files).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sim import __version__, safeio
from sim.analysis.divergence import rerun_ops
from sim.atomic import atomic_path, write_json, write_text
from sim.census import KNOWN_VERDICTS
from sim.errors import UserError
from sim.optrace import engine_ops_to_trace, read_trace
from sim.paths import PathRejected, confine_in
from sim.repro.case import Outcome, failure_line, run_case
from sim.repro.report import analyse, render_report
from sim.repro.shrink import fix_router
from sim.scenario import dump_resolved, load_scenario

# 2: rank-keyed outcome fields (the engine no longer reports forks or cohorts) and
# op-traces for write_through runs too (op-trace v2's explicit write acks).
BUNDLE_FORMAT = 2
# Op-traces larger than this are written gzipped (``ranks/rank<R>.optrace.jsonl.gz``):
# page-size-64 traces spell out every token and compress about 50x; read_trace and
# replay-ops read .gz transparently. Smaller ones stay plain, for reading.
GZIP_TRACES_OVER = 1 << 20
# Trace files up to this size are copied into a bundle; larger ones stay absolute.
COPY_INPUT_LIMIT = 32 << 20
# The outcome fields verify_bundle compares, in this order (the first that differs
# is the one reported).
EXPECT_KEYS = ("verdict", "failure_class", "halted", "finished", "perturbations",
               "first_true_divergence", "shape_divergence", "digest_mismatch",
               "collective_error", "untracked", "digests", "steps", "collective_calls")


def _jsonl(rows) -> str:
    return "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in rows)


# ----------------------------------------------------------------------------------
# What a bundle holds
# ----------------------------------------------------------------------------------


def rank_traces(outcome: Outcome) -> dict[int, list[dict]]:
    """Each rank's op-trace (header first), with the header extensions its replay
    needs: the tree variant, the rank's own pool sizes, its failed host allocations,
    and for write_through runs op-trace v2's explicit ``write_ack`` ops (the engine pops
    write acks at its sync, not at the end of the op issuing them; docs/OPTRACE.md)."""
    cfg, sim = outcome.cfg, outcome.sim
    trees = {r: c.tree for c in sim.group.cohorts for r in c.ranks}
    out = {}
    for r, ops in outcome.rank_ops().items():
        tree = trees[r]
        trace = engine_ops_to_trace(ops, device_capacity=tree.device_capacity,
                                    host_capacity=tree.host_capacity, page_size=cfg.page_size,
                                    write_policy=cfg.write_policy,
                                    load_back_threshold=cfg.load_back_threshold,
                                    note=f"hicache-sim {__version__} repro bundle, rank {r}",
                                    version=2 if cfg.write_policy == "write_through" else 1)
        h = trace[0]
        h.update(ids=cfg.ids, host_policy=cfg.host_policy, eviction_policy=cfg.eviction_policy)
        if cfg.storage is not None and cfg.storage.host_memory_mode == "buffer_only":
            h["host_memory_mode"] = "buffer_only"  # docs/OPTRACE.md §15
        if sim.alloc_failures.get(r):
            h["host_alloc_failures"] = sim.alloc_failures[r]
        out[r] = trace
    return out


def schedule_lines(outcome: Outcome) -> list[dict]:
    """The per-rank schedule, in the order things happened: one line per recorded op
    per rank, per ack pop per rank, per failed host allocation, per collective call."""
    sim = outcome.sim
    rows = []
    for r, ops in outcome.rank_ops().items():
        for i, op in enumerate(ops, 1):
            g, t, step = sim.op_at[id(op)]
            rows.append((g, 1, r, i, {"rank": r, "seq": i, "t": t, "step": step, "op": op}))
    for p in sim.pops:
        rows.append((p["g"], 0, p["rank"], 0, {"pop": {k: v for k, v in p.items() if k != "g"}}))
    for f in sim.alloc_failure_at:
        rows.append((f["g"], 0, f["rank"], 0,
                     {"host_alloc_failure": {k: v for k, v in f.items() if k != "g"}}))
    for call in sim.calls:
        rows.append((call["g"], 0, -1, 0, {"collective": {k: v for k, v in call.items() if k != "g"}}))
    rows.sort(key=lambda x: x[:4])
    return [x[4] for x in rows]


def expectation(outcome: Outcome) -> dict:
    """What a verification must reproduce exactly (all keyed by rank)."""
    d = outcome.divergence

    def at(x, *keys):
        return None if x is None else {k: x[k] for k in keys if k in x}

    out = {
        "verdict": d["verdict"], "failure_class": outcome.failure_class,
        "halted": d["halted"], "finished": d["finished"],
        "perturbations": d["perturbations"],
        "first_true_divergence": at(d["first_true_divergence"], "t", "step", "what", "ranks"),
        "shape_divergence": at(d["shape_divergence"], "t", "step", "ranks", "first_request"),
        "digest_mismatch": at(d["digest_mismatch"], "t", "step", "min", "max", "digests"),
        "collective_error": at(d["collective_error"], "t", "step", "kind", "site", "ranks_in",
                               "ranks_out", "detail"),
        "untracked": at(d["untracked"], "t", "step", "why"),
        "digests": d["digests"], "steps": d["steps"], "collective_calls": d["collective_calls"],
    }
    return json.loads(json.dumps(out))  # as bundle.json holds it (int keys become strings)


def sizes(outcome: Outcome) -> dict:
    return {"requests": outcome.arrived, "ranks": outcome.cfg.tp, "events": outcome.events}


def _self_contained_yaml(scenario, tmp: Path) -> tuple[str, list]:
    """The resolved scenario YAML; trace files it names are copied next to it (up to
    COPY_INPUT_LIMIT) and referred to relatively."""
    text = dump_resolved(scenario)
    head = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    data = yaml.safe_load(text)
    copied: list = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "path" and isinstance(v, str) and os.path.isfile(v):
                    src = Path(v)
                    if src.stat().st_size <= COPY_INPUT_LIMIT:
                        name = f"inputs/{len(copied)}-{src.name}"
                        (tmp / "inputs").mkdir(exist_ok=True)
                        shutil.copyfile(src, tmp / name)
                        x[k] = name
                        copied.append({"from": str(src), "to": name})
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(data.get("workload"))
    fix_router(data)  # so that the bundle's scenario loads again (see scenario_data)
    return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=False,
                                 allow_unicode=True, width=100), copied


# ----------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------


@dataclass
class BundleInfo:
    """Everything ``write_bundle`` records besides the minimal run itself."""

    source: str | None
    search: object | None          # sim.repro.search.SearchResult
    before: dict
    shrink: object | None          # sim.repro.shrink.ShrinkInfo
    extra: dict = field(default_factory=dict)


def write_bundle(out_dir, outcome: Outcome, info: BundleInfo) -> Path:
    """Write the bundle folder atomically: built beside ``out_dir``, then renamed."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "bundle.json").exists())):
        raise UserError("exists and is not a repro bundle; expected a new or bundle folder",
                        where=str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        _fill_bundle(tmp, outcome, info)
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _fill_bundle(tmp: Path, outcome: Outcome, info: BundleInfo) -> None:
    cfg, div = outcome.cfg, outcome.divergence
    scenario = outcome.scenario
    if info.shrink is not None:
        scenario = scenario.model_copy(update={"description": (
            f"Shrunk by hicache-sim repro ({outcome.failure_class}). Original: "
            f"{scenario.description}").strip()})
    text, copied = _self_contained_yaml(scenario, tmp)
    write_text(tmp / "scenario.yaml", text)
    write_text(tmp / "schedule.jsonl", _jsonl(schedule_lines(outcome)))
    traces = rank_traces(outcome)
    names = {}
    for r, trace in traces.items():
        text = _jsonl(trace)
        names[r] = f"ranks/rank{r}.optrace.jsonl"
        if len(text) > GZIP_TRACES_OVER:
            names[r] += ".gz"
            _write_gzip(tmp / names[r], text)
        else:
            write_text(tmp / names[r], text)
    report = analyse(outcome, traces)
    if report["optrace_final_digests"] != div["digests"]:
        # A bundle whose op-traces do not re-run to the engine's trees is worse than none.
        raise RuntimeError(f"op-trace digests {report['optrace_final_digests']} differ "
                           f"from the engine's {div['digests']}")
    write_json(tmp / "report.json", report)
    s = info.search
    ev = report["first_divergent_event"]
    bundle = {
        "format": BUNDLE_FORMAT,
        "hicache_sim": __version__,
        "scenario": outcome.scenario.name,
        "source": info.source,
        "verdict": div["verdict"],
        "failure_class": outcome.failure_class,
        "failure": failure_line(div),
        "failure_site": report["failure_site"]["function"],
        "first_divergent_event": None if ev is None else {
            "kind": ev["kind"], "t": ev["t"], "step": ev["step"], "summary": ev["summary"],
            "sglang": ev["sglang"]["function"]},
        "jitter_class": report["jitter_class"],
        "seeds": {"scenario": outcome.scenario.seed, "jitter": cfg.jitter.seed,
                  "base": s.base_seed if s else None, "try": (s.tries - 1) if s else None},
        "sizes": {"before": info.before, "after": sizes(outcome)},
        "shrink": None if info.shrink is None else {
            "runs": info.shrink.runs, "started_from_original": info.shrink.started_from_original,
            "exhausted": info.shrink.exhausted, "original": info.shrink.original,
            "case": info.shrink.case},
        "expect": expectation(outcome),
        "op_traces": {str(r): names[r] for r in traces},
        "optrace_final_digests": report["optrace_final_digests"],
        "inputs_copied": copied,
        "host_alloc_failures": any("host_alloc_failures" in t[0] for t in traces.values()),
        "write_acks": "op" if cfg.write_policy == "write_through" else "end_of_op",
        **info.extra,
    }
    write_text(tmp / "report.md", render_report(bundle, report))
    write_json(tmp / "bundle.json", bundle)  # last: a folder with bundle.json is complete


def _write_gzip(path: Path, text: str) -> None:
    """Deterministic gzip (no file name, mtime 0), written atomically."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(text.encode())
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(buf.getvalue())


# ----------------------------------------------------------------------------------
# Loading and verifying
# ----------------------------------------------------------------------------------


class NotReproduced(UserError):
    """The bundle ran but did not fail the same way (exit 1)."""

    exit_code = 1


@dataclass
class VerifyResult:
    outcome: Outcome
    line: str
    checked: list  # what was compared


def load_bundle(path) -> tuple[Path, dict]:
    """The bundle folder and its bundle.json; one-line errors for anything missing."""
    d = Path(path)
    if not d.exists():
        raise UserError("no such folder; expected a repro bundle folder (from hicache-sim repro)",
                        where=str(d))
    if not d.is_dir():
        raise UserError("is a file; expected a repro bundle folder", where=str(d))

    meta = d / "bundle.json"
    if not meta.exists():
        raise UserError("no bundle.json; expected a repro bundle folder (from hicache-sim repro)",
                        where=str(d))
    text = safeio.read_text(meta, "the bundle's metadata (bundle.json)", safeio.LIMIT_JSON_DOC)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        line = getattr(err, "lineno", None)
        raise UserError(f"found invalid JSON ({type(err).__name__}); expected the bundle's metadata",
                        where=f"{meta}:{line}" if line else str(meta)) from None
    if not isinstance(data, dict):
        raise UserError(f"found a JSON {type(data).__name__}; expected an object", where=str(meta))
    for key in ("format", "expect", "verdict"):
        if key not in data:
            raise UserError(f"no '{key}' key; expected a bundle.json written by hicache-sim repro",
                            where=str(meta))
    if data["format"] != BUNDLE_FORMAT:
        raise UserError(f"found format {_short(data['format'])}; expected {BUNDLE_FORMAT} "
                        "(re-create the bundle with this hicache-sim's repro)", where=str(meta))
    _check_bundle_fields(data, d, meta)
    if not (d / "scenario.yaml").is_file():
        raise UserError("no scenario.yaml; expected the bundle's minimal scenario", where=str(d))

    try:  # a symlink leading out of the bundle is refused, as op-trace links are
        confine_in(d, "scenario.yaml", "the bundle's scenario")
    except PathRejected as e:
        raise UserError(f"scenario.yaml: found {e.found}; expected {e.expected}",
                        where=str(d)) from None
    return d, data


def _check_bundle_fields(data: dict, d: Path, meta: Path) -> None:
    """The types of the fields ``verify_bundle`` reads, and every path confined to the bundle."""
    def bad(key, found, expected):
        raise UserError(f"{key}: found {found}; expected {expected}", where=str(meta))

    if not isinstance(data["expect"], dict):
        bad("expect", f"a JSON {type(data['expect']).__name__}", "an object of recorded outcome fields")

    if not isinstance(data["verdict"], str) or data["verdict"] not in KNOWN_VERDICTS:
        bad("verdict", _short(data["verdict"]), f"a verdict ({', '.join(KNOWN_VERDICTS)})")
    recorded = data["expect"].get("verdict", data["verdict"])
    if data["verdict"] != recorded:
        bad("verdict", _short(data["verdict"]), f"the verdict the bundle recorded (expect.verdict "
            f"{_short(recorded)})")
    seeds = data.get("seeds")
    if seeds is not None:
        if not isinstance(seeds, dict):
            bad("seeds", f"a JSON {type(seeds).__name__}", "an object of seeds")
        for k, x in seeds.items():
            if not (x is None or (type(x) is int and 0 <= x < 2**63)):
                bad(f"seeds.{k if len(k) <= 40 else _short(k)}", _short(x), "a seed: an int from 0 to 2**63 - 1, or null")
    copied = data.get("inputs_copied")
    if copied is not None:
        if not isinstance(copied, list):
            bad("inputs_copied", f"a JSON {type(copied).__name__}", "a list of copied inputs")
        for i, c in enumerate(copied):
            if not (isinstance(c, dict) and isinstance(c.get("from"), str)
                    and isinstance(c.get("to"), str)):
                bad(f"inputs_copied.{i}", _short(c), "an object {from: original path, to: the "
                    "copy's path inside the bundle}")
            try:
                confine_in(d, c["to"], "a copied input")
            except PathRejected as e:
                bad(f"inputs_copied.{i}.to", e.found, e.expected)
    for key in ("op_traces", "optrace_final_digests"):
        v = data.get(key)
        if v is None:
            continue
        if not isinstance(v, dict):
            bad(key, f"a JSON {type(v).__name__}", "an object keyed by rank, or null")
        for r, x in v.items():
            if not (r.isdigit() and len(r) <= 4):
                bad(f"{key}.{_short(r)}", "a key that is not a rank", "rank numbers as keys")
            if key == "op_traces":
                if not isinstance(x, str):
                    bad(f"{key}.{r}", _short(x), "a path inside the bundle")
                try:
                    confine_in(d, x, f"rank {r}'s op-trace")
                except PathRejected as e:
                    bad(f"{key}.{r}", e.found, e.expected)
            elif not (type(x) is int or x is None):
                bad(f"{key}.{r}", _short(x), "an integer digest")


def verify_bundle(path, trace_roots=()) -> VerifyResult:
    """Re-run a bundle and check it fails exactly as recorded; NotReproduced if not.

    Three checks: the re-run's outcome fields (``EXPECT_KEYS``) equal the recorded
    ones; each rank's op-trace file equals, op for op, what the re-run recorded for
    that rank; and each file, re-run alone through the op-trace replayer (what
    ``hicache-sim replay-ops`` does), reaches the recorded final digest. The bundle's
    scenario may name files inside the bundle only (plus any ``trace_roots`` the
    command line gives, for traces too large to copy in)."""
    d, meta = load_bundle(path)
    scenario = load_scenario(d / "scenario.yaml",
                             roots=[Path(os.path.abspath(d)), *(Path(r) for r in trace_roots)])
    recorded = (meta.get("seeds") or {}).get("scenario")
    if recorded is not None and recorded != scenario.seed:
        raise UserError(f"seeds.scenario: found {recorded}; expected the seed of the bundle's "
                        f"scenario.yaml ({scenario.seed})", where=str(d / "bundle.json"))
    outcome = run_case(scenario, record=True)
    got, want = expectation(outcome), meta["expect"]
    checked = []
    for key in EXPECT_KEYS:
        if got.get(key) != want.get(key):
            raise NotReproduced(f"does not reproduce: {key} is {_short(got.get(key))}, "
                                f"the bundle expects {_short(want.get(key))}", where=str(d))
        checked.append(key)
    fresh = rank_traces(outcome)
    traces = meta.get("op_traces") or {}
    if sorted(traces, key=int) != [str(r) for r in fresh]:
        raise NotReproduced(f"does not reproduce: the re-run has op-traces for ranks "
                            f"{sorted(fresh)}, the bundle lists {_short(sorted(traces, key=int))}",
                            where=str(d))
    for r, rel in sorted(traces.items(), key=lambda kv: int(kv[0])):
        p = d / rel  # confined to the bundle by load_bundle
        if not p.is_file():
            raise UserError(f"no {rel}; expected rank {r}'s op-trace", where=str(d))
        trace = [op for _, _, op in read_trace(p)]
        final = rerun_ops(trace).final_digest
        expect = (meta.get("optrace_final_digests") or {}).get(r)
        if final != expect:
            raise NotReproduced(f"does not reproduce: {rel} replays to digest {final}, "
                                f"the bundle expects {expect}", where=str(d))
        # Every op must be what the re-run did, and the header the same tree (its note
        # names the version that wrote it).
        mine = json.loads(json.dumps(fresh[int(r)]))
        ops = mine[1:]
        head = {k: v for k, v in trace[0].items() if k != "note"}
        if head != {k: v for k, v in mine[0].items() if k != "note"}:
            raise NotReproduced(f"does not reproduce: {rel}'s header differs from the re-run's "
                                f"rank {r}: {_short(head)}", where=str(d))
        if trace[1:] != ops:
            k = next((i for i, (x, y) in enumerate(zip(trace[1:], ops), 1) if x != y),
                     min(len(trace), len(ops + [None])))
            raise NotReproduced(f"does not reproduce: {rel} differs from the re-run's rank {r} "
                                f"at op {k}", where=str(d))
        checked.append(f"optrace rank {r}")
    return VerifyResult(outcome, failure_line(outcome.divergence), checked)


def _short(v) -> str:
    try:
        text = json.dumps(v, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 120 else text[:117] + "..."
