"""``run --record-steps``: every scheduler step and request in the SGLang server
harness's own records (/work/shared/oracle/server/instrument.py ``Instrument``).

Under ``engine.clock: steps`` a step is one SimPy time unit; step ``k`` starts at time
``k`` and its results are processed at ``k + 1``, so the recorder keeps step ``k``'s
record open until the loop starts the next iteration. The field names are the
harness's (its ``--quiet-steps`` form of ``adds``: ``[rid, result, rem_total]``):

* ``step``: ``step, mode, rids, extend, prefix, chunked, adds, retracted`` and ``hc``
  (``write [node, tokens, ok]``, ``write_ack [node]``, ``load [node, tokens, ok]``,
  ``load_ack`` (a count), ``init_load_back [rid, host_hit, loaded]``, ``digest``),
  empty ``hc`` lists left out as the harness does; a step with no batch has no
  ``mode``. Steps in which the engine's loop does not iterate (it sleeps until the
  next relevant time) are the harness's empty idle steps: written as such when the
  loop next iterates (nothing changed meanwhile, so the digest is the tree's).
* ``req``: ``rid`` ("r" + trace line index), ``first_sched_step``, ``finish_step``,
  ``cached_tokens``, ``cached_tokens_device``, ``cached_tokens_host``.

One record list per rank (ranks of one replica share their records until it forks).
"""

from __future__ import annotations

import gzip
import json

from sim.scheduler import available

# schedule_policy.py AddReqResult's names, as the harness prints them
RESULT_NAMES = {"continue": "CONTINUE", "no_token": "NO_TOKEN", "other": "OTHER"}


class StepRecorder:
    def __init__(self, tp: int):
        self.tp = tp
        self.steps: dict[int, list[dict]] = {r: [] for r in range(tp)}
        self.reqs: dict[int, dict] = {}
        self.cur: dict[int, dict] = {}   # id(cohort) -> the open step's record
        self._ranks: dict[int, list[int]] = {}
        self.step = None
        self._last = -1  # the last step written

    # ------------------------------------------------------------ steps
    def begin(self, step: int, cohorts) -> None:
        if step > self._last + 1:
            # the steps the loop slept through: `event_loop_*` iterates on them idle
            for c in cohorts:
                self._ranks[id(c)] = list(c.ranks)
                d = c.tree.digest
                for s in range(self._last + 1, step):
                    self._close(c, {"type": "step", "step": s, "adds": [], "retracted": [],
                                    "hc": {"digest": d}})
        self.step = step
        self.cur = {}
        self._ranks = {}
        for c in cohorts:
            if c.tree.rec is None:
                c.tree.rec = []
            c.tree.rec.clear()
            self.cur[id(c)] = {"type": "step", "step": step}
            self._ranks[id(c)] = list(c.ranks)

    def rec(self, c) -> dict:
        r = self.cur.get(id(c))
        if r is None:  # a replica forked during the step: its ranks' records start here
            r = self.cur[id(c)] = {"type": "step", "step": self.step}
            self._ranks[id(c)] = list(c.ranks)
        return r

    def hc(self, c, key: str, item) -> None:
        h = self.rec(c).setdefault("hc", {})
        if key == "load_ack":
            h[key] = h.get(key, 0) + item
        else:
            h.setdefault(key, []).append(item)

    def add(self, c, rid: int, result: str, rem_total: float) -> None:
        self.rec(c).setdefault("adds", []).append([f"r{rid}", RESULT_NAMES[result],
                                                   int(rem_total)])

    def retracted(self, c, rids: list[int]) -> None:
        self.rec(c).setdefault("retracted", []).append([f"r{i}" for i in rids])

    def extend(self, c, plan, chunked_rid) -> None:
        r = self.rec(c)
        r["mode"] = "extend"
        r["rids"] = [f"r{rid}" for rid, _, _ in plan.shape]
        r["extend"] = [e for _, _, e in plan.shape]
        r["prefix"] = [p for _, p, _ in plan.shape]
        r["chunked"] = None if chunked_rid is None else f"r{chunked_rid}"

    def decode(self, cohorts, batch) -> None:
        rids = [f"r{rq.r.rid}" for rq in batch]
        for c in cohorts:
            r = self.rec(c)
            r["mode"] = "decode"
            r["rids"] = rids

    def decode_run(self, cohorts, batch, k: int) -> None:
        """A run of ``k`` identical decode steps: the open record is its first; the
        middle ones are plain; the last stays open for the run's results."""
        if k <= 1:
            return
        rids = [f"r{rq.r.rid}" for rq in batch]
        first = self.step
        self.end(cohorts)
        for s in range(first + 1, first + k - 1):
            for c in cohorts:
                rec = {"type": "step", "step": s, "mode": "decode", "rids": rids}
                self._close(c, rec)
        self.begin(first + k - 1, cohorts)
        self.decode(cohorts, batch)

    def end(self, cohorts) -> None:
        if self.step is None:
            return
        for c in cohorts:
            rec = self.rec(c)
            rec.setdefault("adds", [])
            rec.setdefault("retracted", [])
            tree = c.tree
            if tree.rec:
                # every D->H backup of the step, per node (write-through inserts and
                # write_back evictions alike), as the harness logs each `write` call
                w = [[node.id, extra["n"], True] for kind, node, extra in tree.rec
                     if kind == "backup"]
                if w:
                    h = rec.setdefault("hc", {})
                    h["write"] = w + h.get("write", [])
                    # a write_back eviction's backup is synchronized at once
                    # (`writing_check(write_back=True)`): acked in its own step
                    done = [i for i, _, _ in w if i not in tree.pending_writes]
                    if done:
                        h["write_ack"] = h.get("write_ack", []) + done
                tree.rec.clear()
            rec.setdefault("hc", {})["digest"] = tree.digest ^ tree.digest_xor
            # the harness's `sizes()`: the allocator's and the host pool's available_size
            rec["dev_free"] = available(tree)
            rec["host_free"] = tree.host_capacity - tree.host_used - tree.host_reserved
            self._close(c, rec)
        self.step = None

    def _close(self, c, rec: dict) -> None:
        for r in self._ranks.get(id(c), c.ranks):
            self.steps[r].append(rec)
        if rec["step"] > self._last:
            self._last = rec["step"]

    # ------------------------------------------------------------ requests
    def first_sched(self, rid: int, step: int) -> None:
        self.reqs.setdefault(rid, {}).setdefault("first_sched_step", step)

    def finished(self, rq, step: int) -> None:
        d = self.reqs.setdefault(rq.r.rid, {})
        d["finish_step"] = step
        d["cached_tokens"] = rq.device_hit + rq.loaded
        d["cached_tokens_device"] = rq.device_hit
        d["cached_tokens_host"] = rq.loaded

    # ------------------------------------------------------------ output
    def lines(self, rank: int):
        for rec in self.steps[rank]:
            yield json.dumps(rec, separators=(", ", ": "))
        for rid in sorted(self.reqs):
            yield json.dumps({"type": "req", "rid": f"r{rid}", **self.reqs[rid]},
                             separators=(", ", ": "))


def rank_paths(path: str, tp: int) -> list[str]:
    """``FILE.jsonl`` at tp 1; ``FILE.rank0.jsonl``, ``FILE.rank1.jsonl``, ... above."""
    if tp == 1:
        return [path]
    stem, dot, ext = path.rpartition(".")
    if not dot or "/" in ext:
        stem, ext = path, "jsonl"
    return [f"{stem}.rank{r}.{ext}" for r in range(tp)]


# ------------------------------------------------------------ comparison
# The fields compared with a harness output: per step and per request.
STEP_FIELDS = ("mode", "rids", "extend", "prefix", "chunked", "adds", "retracted")
HC_FIELDS = ("write", "write_ack", "load", "init_load_back", "digest")
REQ_FIELDS = ("first_sched_step", "finish_step", "cached_tokens", "cached_tokens_device",
              "cached_tokens_host")


def read_records(path) -> tuple[dict, dict]:
    op = gzip.open if str(path).endswith(".gz") else open
    steps, reqs = {}, {}
    with op(path, "rt") as fh:
        for line in fh:
            d = json.loads(line)
            if d["type"] == "step":
                steps[d["step"]] = d
            elif d["type"] == "req":
                reqs[d["rid"]] = d
    return steps, reqs


class _Relabel:
    """A bijection built as values appear: node ids (and digests, which fold them)
    match up to the numbering."""

    def __init__(self):
        self.fw, self.bw = {}, {}

    def same(self, h, e) -> bool:
        a, b = self.fw.get(e), self.bw.get(h)
        if a is None and b is None:
            self.fw[e], self.bw[h] = h, e
            return True
        return a == h and b == e


def _view(d: dict | None, hc_on: bool) -> dict:
    d = d or {}
    out = {"mode": d.get("mode")}
    if out["mode"]:
        out["rids"] = d.get("rids")
    if out["mode"] == "extend":
        for k in ("extend", "prefix", "chunked"):
            out[k] = d.get(k)
    out["adds"] = [[a["rid"], a["res"], a["rem_total"]] if isinstance(a, dict) else a
                   for a in d.get("adds") or []]
    out["retracted"] = d.get("retracted") or []
    if hc_on:
        hc = d.get("hc") or {}
        for k in HC_FIELDS:
            if hc.get(k):
                out["hc." + k] = hc[k]
    return out


def _same(k, a, b, ids: _Relabel | None, dig: _Relabel | None) -> bool:
    if ids is None:
        return a == b
    if k in ("hc.write", "hc.load"):
        return (a is not None and b is not None and len(a) == len(b)
                and all(x[1:] == y[1:] and ids.same(x[0], y[0]) for x, y in zip(a, b)))
    if k == "hc.write_ack":
        return (a is not None and b is not None and len(a) == len(b)
                and all(ids.same(x, y) for x, y in zip(a, b)))
    if k == "hc.digest":
        return dig.same(a or 0, b or 0)
    return a == b


def compare(harness, engine, relabel: bool = False) -> dict:
    """Step-for-step comparison of a harness output with a ``--record-steps`` file:
    counts, and the first differing step with both sides of each differing field.
    Every field is compared as is, node ids and digests included, and a step on one
    side only differs (field ``step``). ``relabel``: ids and digests need only match
    up to a consistent renumbering (a run whose `cache.ids` or tree core is not the
    server's)."""
    hs, hr = read_records(harness)
    es, er = read_records(engine)
    hc_on = any("hc" in d for d in hs.values())
    last = max(max(hs, default=0), max(es, default=0))
    ids = dig = None
    if relabel:
        ids, dig = _Relabel(), _Relabel()
        dig.same(0, 0)
    differ, first = 0, None
    dh = de = 0
    for s in range(last + 1):
        if (s in hs) != (s in es):
            differ += 1
            if first is None:
                first = {"step": s, "fields": {"step": {"harness": s in hs, "engine": s in es}}}
            continue
        a, b = _view(hs.get(s), hc_on), _view(es.get(s), hc_on)
        if hc_on:
            dh = a.get("hc.digest", 0) if s in hs else dh
            de = b.get("hc.digest", 0) if s in es else de
            a["hc.digest"], b["hc.digest"] = dh, de
        bad = [k for k in sorted(set(a) | set(b)) if not _same(k, a.get(k), b.get(k), ids, dig)]
        if bad:
            differ += 1
            if first is None:
                first = {"step": s, "fields": {k: {"harness": a.get(k), "engine": b.get(k)}
                                               for k in bad}}
    rdiff = [r for r in hr if any(hr[r].get(k) != er.get(r, {}).get(k) for k in REQ_FIELDS)]
    return {"steps": last + 1, "steps_differ": differ, "first": first,
            "requests": len(hr), "requests_differ": len(rdiff),
            "first_request": None if not rdiff else {
                "rid": rdiff[0], **{k: {"harness": hr[rdiff[0]].get(k),
                                        "engine": er.get(rdiff[0], {}).get(k)}
                                    for k in REQ_FIELDS}}}
