"""What a run observed about its TP group, and the verdict that follows from it.

The engine reports *events* here: the ground truth (the first step at which some
rank's tree or batch shape differs from rank 0's), what SGLang's own checks saw (a
digest assertion, a collective that hangs or mismatches), and how often each
injected perturbation fired. The verdict is derived from those observations alone,
never from the configuration:

- ``agree``: no perturbation fired and nothing differed;
- ``absorbed``: perturbations fired (named, with counts), yet the trees and every
  collective stayed consistent;
- ``detected``: the digest assertion (or, with ``collective.rank_consensus``, SGLang's
  rank consensus checker) fired after a real divergence;
- ``false_alarm``: either fired while the trees were logically equal;
- ``missed``: the trees diverged and nothing a real server checks noticed;
- ``hang`` / ``size_mismatch``: a collective would block or get different sizes.

The first failure a real server would hit decides (it stops there). Everything
recorded is keyed by rank, never by how the engine grouped ranks into replicas, so
shared and eager runs report identically.
"""

from __future__ import annotations

from sim.fmt import duration
from sim.constants import RANK_DIVERGENCE_MESSAGE

VERDICTS = ("agree", "absorbed", "detected", "false_alarm", "missed", "hang", "size_mismatch")

# The exit codes of a run (README "Exit codes"): what the real server would have done,
# decided by the first failure it would have hit, so `on_divergence: halt` and
# `record` exit alike whatever a recorded run does after that failure.
EXIT_OK = 0            # ran to the end: agree, absorbed, or missed (nothing checked noticed)
EXIT_BAD_INPUT = 2     # sim.errors.UserError
EXIT_SERVER_FAILED = 3  # the digest assertion, a collective hang or size mismatch, OOM, stuck
EXIT_UNTRACKED = 4     # the ranks diverged silently and the engine cannot follow them on
EXIT_INTERRUPTED = 130  # Ctrl-C: the folder is marked partial
# Verdicts at which a real server stops: SGLang's digest assertion, or a collective.
SERVER_FAILURES = ("detected", "false_alarm", "hang", "size_mismatch")


def exit_code(divergence: dict, stuck: str | None = None) -> int:
    """A finished run's exit code from its divergence.json and whether it got stuck.

    The verdict already names the first failure a real server would hit; a recorded
    run that goes on past it keeps that verdict, so the code does not depend on what
    follows. A prefill out of memory stops a real server too (SGLang raises), and a
    run whose event queue ran dry with work left would hang there."""
    if divergence.get("verdict") in SERVER_FAILURES:
        return EXIT_SERVER_FAILED
    if divergence.get("halted") == "out_of_memory" or stuck is not None:
        return EXIT_SERVER_FAILED
    if divergence.get("halted") == "untracked":
        return EXIT_UNTRACKED
    return EXIT_OK


def state(tree) -> tuple:
    """A cheap summary of a replica's logical state: pool occupancy, node counts, the
    duplicate map, in-flight loads and writes, and the incremental content hash the
    tree maintains (ids excluded). Allocator state outside the tree (``reserved``)
    is left out: a late free is not a divergence until it changes a decision."""
    return (tree.dev_used, tree.host_used, tree.n_nodes, tree.dup_tokens, tree.evictable,
            tree.protected, len(tree.dups), len(tree.loads), len(tree.pending_writes),
            tree.content_hash)


def groups_by(cohorts, key) -> list[tuple[list[int], object]]:
    """Ranks grouped by ``key(cohort)``, each group's ranks sorted, groups by first rank."""
    out: dict = {}
    for c in cohorts:
        out.setdefault(key(c), []).extend(c.ranks)
    return sorted(((sorted(r), k) for k, r in out.items()), key=lambda g: g[0][0])


class Observations:
    """The run's observations, filled in by the engine as they happen."""

    def __init__(self, tp: int, perturbations, faults=None):
        self.tp = tp
        self.perturbations = perturbations
        self.faults = faults  # sim.faults.ScriptedFaults, or None
        # the step clock's current step (engine.clock: steps), stamped on the failures
        # SGLang's checks see; None under the time clock
        self.clock_step: int | None = None
        self.first_true_divergence: dict | None = None
        self.digest: dict | None = None
        self.mismatch_steps = 0
        self.collective: dict | None = None
        self.shape: dict | None = None
        self.untracked_at: dict | None = None
        self.rank_consensus: dict | None = None  # the consensus checker's first divergence
        self.request_split_at: dict | None = None  # the ranks' request states split (sim.lanes)
        self.rank_assert: dict | None = None  # an assertion on some ranks only (not the digest's)

    # ------------------------------------------------------------ ground truth
    def compare(self, now: float, step: int, cohorts, full: bool = False) -> None:
        """Record the first step at which some rank's tree differs from rank 0's.
        ``full`` also compares whole-tree fingerprints (ids excluded)."""
        if self.first_true_divergence is not None or len(cohorts) < 2:
            return
        ref = state(cohorts[0].tree)
        what = None
        if any(state(c.tree) != ref for c in cohorts[1:]):
            what = "tree contents differ"
            key = lambda c: state(c.tree)  # noqa: E731
        elif full:
            fp = cohorts[0].tree.fingerprint()
            if any(c.tree.fingerprint() != fp for c in cohorts[1:]):
                what = "tree structure differs"
                key = lambda c: c.tree.fingerprint()  # noqa: E731
        if what is None:
            return
        groups = groups_by(cohorts, key)
        self.first_true_divergence = {
            "t": now, "step": step, **self._clock(), "what": what, "ranks": [g for g, _ in groups],
            "state": {f"ranks {','.join(map(str, g))}": list(state(_tree_of(cohorts, g[0])))[:9]
                      for g, _ in groups}}

    def final_compare(self, now: float, step: int, cohorts) -> None:
        self.compare(now, step, cohorts, full=True)

    def shape_divergence(self, now: float, step: int, plans) -> None:
        """Ranks computed different batch shapes (request ids, prefix and extend
        lengths) for the same forward: a ground-truth event of its own."""
        if self.shape is not None:
            return
        groups = groups_by([c for c, _ in plans],
                           lambda c: tuple(next(p.shape for cc, p in plans if cc is c)))
        ref = {rid: (pre, ext) for rid, pre, ext in groups[0][1]}
        first = None
        for g, shape in groups[1:]:
            mine = {rid: (pre, ext) for rid, pre, ext in shape}
            # in batch order, the first request whose (prefix, extend) differs or that
            # one side admitted and the other did not
            for rid in list(ref) + [r for r in mine if r not in ref]:
                if ref.get(rid) != mine.get(rid):
                    first = {"rid": rid, "ranks": g,
                             "prefix_extend": list(mine[rid]) if rid in mine else None,
                             "rank0_prefix_extend": list(ref[rid]) if rid in ref else None}
                    break
            if first:
                break
        self.shape = {"t": now, "step": step, "ranks": [g for g, _ in groups],
                      "first_request": first,
                      "extend_tokens": {",".join(map(str, g)): sum(e for _, _, e in s)
                                        for g, s in groups}}
        if self.first_true_divergence is None:
            self.first_true_divergence = {"t": now, "step": step, "what": "batch shapes differ",
                                          "ranks": [g for g, _ in groups], "state": {}}

    def untracked(self, now: float, step: int, why: str) -> None:
        self.untracked_at = {"t": now, "step": step, **self._clock(), "why": why}
        if self.first_true_divergence is None:
            self.first_true_divergence = {"t": now, "step": step, "what": why,
                                          "ranks": [], "state": {}}

    def request_split(self, now: float, step: int, lanes: list[list[int]], why: str) -> None:
        """The ranks took different decisions on requests (``why``: "admission" into a
        prefill batch, "retraction" from a decode step) and go on, each group of ranks
        with its own request state (``lanes``: their ranks); the first time."""
        if self.request_split_at is None:
            self.request_split_at = {"t": now, "step": step, **self._clock(), "lanes": lanes,
                                     "why": why}

    def rank_assertion(self, now: float, step: int, ranks: list[int], exc: str, message: str,
                       where: str) -> None:
        """SGLang raised on ``ranks`` (``where``: the function), not on the others: they
        die on the closed connection at their next collective."""
        if self.rank_assert is None:
            self.rank_assert = {"t": now, "step": step, **self._clock(), "ranks": list(ranks),
                                "exc": exc, "message": message, "where": where}

    # ------------------------------------------------------------ SGLang's checks
    def digest_mismatch(self, now, step, lo, hi, digests: dict, message: str) -> bool:
        """The digest assertion failed on some rank; True the first time."""
        self.mismatch_steps += 1
        if self.digest is not None:
            return False
        self.digest = {"t": now, "step": step, **self._clock(), "min": lo, "max": hi,
                       "digests": {str(r): d for r, d in sorted(digests.items())},
                       "message": message}
        return True

    def collective_error(self, now, step, err) -> None:
        if self.collective is None:
            self.collective = {"t": now, "step": step, **self._clock(), "kind": err.kind,
                               "site": err.site,
                               "ranks_in": list(err.ranks_in), "ranks_out": list(err.ranks_out),
                               "detail": err.detail, "message": err.line}
            if err.pending is not None:
                self.collective["pending"] = {str(r): c for r, c in err.pending.items()}

    def _clock(self) -> dict:
        return {} if self.clock_step is None else {"clock_step": self.clock_step}

    def consensus_divergence(self, now, step, site: str, index: int, events: dict) -> None:
        """The rank consensus checker found ranks whose ``index``-th event differs."""
        if self.rank_consensus is None:
            self.rank_consensus = {"t": now, "step": step, "site": site, "event": index,
                                   "events": events, "message": RANK_DIVERGENCE_MESSAGE}

    # ------------------------------------------------------------ verdict
    def verdict(self) -> tuple[str, str]:
        true_div, mismatch = self.first_true_divergence, self.digest
        failures = []
        rc = self.rank_consensus
        if rc:
            real = true_div is not None and (true_div["step"], true_div["t"]) <= (rc["step"], rc["t"])
            failures.append((rc["t"], rc["step"], 1, "detected" if real else "false_alarm",
                             f"the rank consensus checker caught ranks differing at {rc['site']}"
                             + (f", {rc['t'] - true_div['t']:.6g} s after the trees diverged"
                                if real else " while the trees were logically equal")))
        if self.collective:
            e = self.collective
            failures.append((e["t"], e["step"], 0, e["kind"],
                             f"{e['site']} collective: {e['detail']}"))
        ra = self.rank_assert
        if ra:
            real = true_div is not None and (true_div["step"], true_div["t"]) <= (ra["step"], ra["t"])
            failures.append((ra["t"], ra["step"], 1, "detected" if real else "false_alarm",
                             f"ranks {ra['ranks']} raised in {ra['where']}: {ra['message']}"))
        if mismatch:
            real = true_div is not None and (true_div["step"], true_div["t"]) <= (mismatch["step"], mismatch["t"])
            failures.append((mismatch["t"], mismatch["step"], 1,
                             "detected" if real else "false_alarm",
                             "the digest assertion fired " + (
                                 f"{duration(mismatch['t'] - true_div['t'])} after the trees diverged"
                                 if real else "while the trees were logically equal")))
        if failures:
            f = min(failures)
            return f[3], f[4]
        if true_div:
            return "missed", (f"the trees diverged at t={duration(true_div['t'])} "
                              f"({true_div['what']}) and no check noticed")
        fired = {k: v for k, v in self.perturbations.fired.items() if v}
        if self.faults is not None:
            fired.update(self.faults.fired())
        if fired:
            what = ", ".join(f"{k} fired {v} time{'s' if v != 1 else ''}" for k, v in fired.items())
            return "absorbed", f"{what}; the trees and every collective stayed consistent"
        configured = self.perturbations.configured
        return "agree", ("no perturbation fired" + (f" (configured: {', '.join(configured)})"
                                                    if configured else ""))

    def report(self) -> dict:
        verdict, reason = self.verdict()
        true_div, mismatch = self.first_true_divergence, self.digest
        delay = None
        if verdict == "detected":
            # the check that caught it: the first of the digest and the consensus checker
            caught = min((x for x in (mismatch, self.rank_consensus) if x is not None),
                         key=lambda x: (x["t"], x["step"]))
            delay = caught["t"] - true_div["t"]
        return {
            "verdict": verdict,
            "reason": reason,
            "perturbations": self.perturbations.as_dict(),
            "first_true_divergence": true_div,
            "digest_mismatch": mismatch,
            "detection_delay_s": delay,
            "mismatch_steps": self.mismatch_steps,
            "collective_error": self.collective,
            "shape_divergence": self.shape,
            "untracked": self.untracked_at,
            "rank_consensus": self.rank_consensus,
            **({"faults": self.faults.report()} if self.faults is not None and self.faults.faults
               else {}),
            # only where it happened: every other run's divergence.json is unchanged
            **({"request_split": self.request_split_at} if self.request_split_at else {}),
            **({"rank_assertion": self.rank_assert} if self.rank_assert else {}),
        }


def _tree_of(cohorts, rank: int):
    for c in cohorts:
        if rank in c.ranks:
            return c.tree
    raise KeyError(rank)


# The outcome classes of divergence.json's ``outcome``, as tools/sglang_server/tp2.py
# classes a real TP group's run: SGLang raised (``assertion``), a collective blocked
# (``hang``) or got different sizes (``size_mismatch``), a prefill ran out of memory
# (``out_of_memory``), the ranks' free space differed with no error
# (``silent_divergence``), their trees differed yet free space never did
# (``tree_divergence``), or nothing differed (``agree``); ``untracked``: the ranks
# went on to run different batches, past which the engine cannot follow them.
OUTCOMES = ("agree", "assertion", "hang", "size_mismatch", "out_of_memory",
            "silent_divergence", "tree_divergence", "untracked")


def outcome(rep: dict, tp: int, free_diff: dict | None, halted: str | None) -> dict:
    """The outcome class of a run from its observations (``rep``: Observations.report),
    the first step where the ranks' free space differed and why the run halted. Each
    rank gets its message (an assertion) or its pending call (a collective)."""
    def at(ev):
        return ev.get("clock_step", ev["step"])

    # each way a run can fail, with its rank among failures at the same time and step
    # (a collective's error comes first: the ranks block in it before they check)
    fails = [(ev["t"], ev["step"], order, kind, ev)
             for key, order, kind in (("digest_mismatch", 1, "digest"),
                                      ("rank_consensus", 1, "consensus"),
                                      ("collective_error", 0, "collective"),
                                      ("rank_assertion", 1, "rank"))
             if (ev := rep.get(key))]
    base = {"first_free_difference": free_diff}
    if fails:
        _, _, _, kind, ev = min(fails)  # kinds differ: the events are never compared
        if kind == "collective":
            pend = ev.get("pending") or {}
            return {"class": ev["kind"], "step": at(ev), "site": ev["site"],
                    "message": ev["message"],
                    "ranks": {str(r): {"pending": pend.get(str(r))} for r in range(tp)}, **base}
        if kind == "rank":
            # the others finish the step and die in their next call, on the connection
            # the raising rank closed (gloo's line)
            from sim.collectives import LINES
            step = at(ev)
            return {"class": "assertion", "step": step,
                    "ranks": {str(r): ({"step": step, "exc": ev["exc"], "msg": ev["message"]}
                                       if r in ev["ranks"] else
                                       {"step": step + 1, "exc": "RuntimeError",
                                        "msg": LINES["gloo_peer_reset"]})
                              for r in range(tp)}, **base}
        raising = sorted(int(r) for r in ev["digests"]) if kind == "digest" else list(range(tp))
        return {"class": "assertion", "step": at(ev),
                "ranks": {str(r): ({"step": at(ev), "exc": "AssertionError", "msg": ev["message"]}
                                   if r in raising else None) for r in range(tp)}, **base}
    if halted == "untracked":
        # the ranks went on to run different batches, which the engine cannot follow
        # (its ranks share one request state): what SGLang does next is not known
        u = rep.get("untracked") or {}
        return {"class": "untracked", "step": u.get("clock_step", u.get("step")),
                "message": u.get("why"), **base}
    if halted == "out_of_memory":
        u = rep.get("untracked") or {}
        return {"class": "out_of_memory", "step": u.get("clock_step", u.get("step")),
                "message": u.get("why"), **base}
    if free_diff is not None:
        return {"class": "silent_divergence", "step": free_diff["step"], **base}
    if rep.get("first_true_divergence") is not None:
        t = rep["first_true_divergence"]
        return {"class": "tree_divergence", "step": t.get("clock_step", t["step"]), **base}
    return {"class": "agree", **base}

