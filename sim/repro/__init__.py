"""Reproducing TP divergence failures: search, shrink, bundle, verify.

What this is for: a jitter scenario fails on some seeds (the ranks' trees diverge and
SGLang's digest assertion fires, a collective hangs or gets different sizes, or the
divergence goes unseen). ``hicache-sim repro`` turns that into a small,
self-contained, replayable case; ``hicache-sim replay BUNDLE`` verifies it.

One module per concern:

- ``case``: one traced run (``TracingSimulation``, ``run_case``) and how it failed
  (``failure_class``, ``failure_line``, ``jitter_class``);
- ``search``: seeds ``base + i`` until a run fails;
- ``shrink``: the failing case as knobs, minimised with Hypothesis's shrinker
  (``sim.analysis.shrink``) while the failure class holds;
- ``report``: the first divergent event in SGLang's terms (differing ack pops,
  collective inputs, host allocation failures, prefix lengths, ops) and the SGLang
  function where the real server acts there; ``report.md``;
- ``bundle``: writing bundles atomically, loading them safely (typed fields, paths
  confined to the bundle) and ``verify_bundle``, what ``replay BUNDLE`` runs.
"""

from sim.repro.bundle import (
    BUNDLE_FORMAT,
    BundleInfo,
    NotReproduced,
    VerifyResult,
    expectation,
    load_bundle,
    rank_traces,
    schedule_lines,
    sizes,
    verify_bundle,
    write_bundle,
)
from sim.repro.case import (
    FAILURE_VERDICTS,
    Outcome,
    TracingSimulation,
    failure_class,
    failure_line,
    failure_time,
    first_failure,
    jitter_class,
    run_case,
)
from sim.repro.report import SITES, analyse, render_report
from sim.repro.search import SearchResult, search, with_seed
from sim.repro.shrink import CaseSpace, ShrinkInfo, case_space, shrink

__all__ = [
    "BUNDLE_FORMAT", "BundleInfo", "CaseSpace", "FAILURE_VERDICTS", "NotReproduced", "Outcome",
    "SITES", "SearchResult", "ShrinkInfo", "TracingSimulation", "VerifyResult", "analyse",
    "case_space", "expectation", "failure_class", "failure_line", "failure_time", "first_failure",
    "jitter_class", "load_bundle", "rank_traces", "render_report", "run_case", "schedule_lines",
    "search", "shrink", "sizes", "verify_bundle", "with_seed", "write_bundle",
]
