"""A bundle's diagnostics: the first divergent event, in SGLang's terms.

What this is for: a failing run's ``divergence.json`` says *that* the ranks diverged
and how the server died; a developer reading a bundle wants *where* the ranks first
took different decisions, and which SGLang 0.5.23 function a real server would be in
at that point. ``analyse`` collects every kind of rank-local difference the traced
run recorded (``sim.repro.case.TracingSimulation``), each with the per-rank values
and the SGLang function (file and qualified name) that acts there:

- ``ack_pops``: ranks popped different numbers of write or load acks at one sync
  (``writing_check`` / ``loading_check`` with rank-local counts);
- ``collective_inputs``: ranks entered a collective with different inputs: the
  sync vector's digest, its length, a rank missing (``_sync_hicache_ready_counts``,
  ``writing_check``, ``loading_check``), or the forward's numels (the model's TP
  all_reduce). Ready counts that differ under a MIN all_reduce are not a
  divergence: the MIN makes every rank pop the same acks;
- ``alloc_failure``: a rank's host allocation failed where the others' succeeded
  (``_execute_and_commit_kv_backup`` -> ``HiCacheController.write``);
- ``prefix_length``: a request's prefix (or extend) length differs across ranks in
  the same forward (``divergence.json`` ``shape_divergence.first_request``;
  ``PrefillAdder.add_one_req`` -> ``init_load_back`` -> ``_load_back_transfers``);
- ``op``: the first op of the ranks' op-traces whose op, logical result (victims,
  lengths) or timing differs.

The *first* divergent event is the earliest of these in the run's own order (the
traced run numbers every op, pop, collective and allocation failure as it happens).
``failure_site`` names the SGLang function where the server then dies (or, for a
miss, why no check notices). Everything is keyed by rank: ranks are grouped only by
what they did (identical op-traces), never by how the engine shared replicas.
"""

from __future__ import annotations

import json
import math

from sim.analysis.divergence import (
    digest_timeline,
    first_divergent_op,
    rerun_ops,
    summarise_op,
    tree_diff,
    victims,
)
from sim.repro.case import (
    Outcome,
    failure_class,
    failure_line,
    failure_time,
    fired,
    first_failure,
    jitter_class,
)

# Ops shown before / after the first divergent op in the report's victim window.
WINDOW_BEFORE, WINDOW_AFTER = 5, 15

URC = "python/sglang/srt/mem_cache/unified_radix_cache.py"
CORE = "python/sglang/srt/mem_cache/unified_cache/unified_tree_core.py"
CTRL = "python/sglang/srt/managers/cache_controller.py"
POLICY = "python/sglang/srt/managers/schedule_policy.py"
BATCH = "python/sglang/srt/managers/schedule_batch.py"
LINEAR = "python/sglang/srt/layers/linear.py"


def _site(file: str, function: str, what: str) -> dict:
    return {"file": file, "function": function, "what": what}


# Where SGLang 0.5.23 acts, by the kind of event (checked against its source).
SITES = {
    "sync": _site(URC, "UnifiedRadixCache._sync_hicache_ready_counts",
                  "one MIN all_reduce of [write_acks, load_acks, digest, -digest]; each rank "
                  "then asserts digest == min == max"),
    "write_check": _site(URC, "UnifiedRadixCache.writing_check",
                         "before sglang #26921 / #27489: returns early, before its all_reduce of "
                         "the ready write count, on a rank with no ongoing_write_through"),
    "load_check": _site(URC, "UnifiedRadixCache.loading_check",
                        "standalone: all_reduce of [finish_count, digest, -digest], then the "
                        "digest assertion"),
    "forward": _site(LINEAR, "RowParallelLinear.forward -> tensor_model_parallel_all_reduce",
                     "the model's TP all_reduce over the batch's tokens "
                     "(python/sglang/srt/distributed/communication_op.py): ranks with different "
                     "numels wedge in the same NCCL kernel (sglang #33442)"),
    "write_pops": _site(URC, "UnifiedRadixCache.writing_check",
                        "pops finish_count acks FIFO from cache_controller.ack_write_queue and "
                        "runs _finish_write_through_ack on their nodes; 0.5.23 passes the MIN "
                        "from _sync_hicache_ready_counts"),
    "load_pops": _site(URC, "UnifiedRadixCache.loading_check",
                       "pops finish_count acks FIFO from cache_controller.ack_load_queue and "
                       "unpins the loaded nodes (finish_load_back); 0.5.23 passes the MIN from "
                       "_sync_hicache_ready_counts"),
    "alloc_write_through": _site(URC, "UnifiedRadixCache._execute_and_commit_kv_backup",
                                 "-> _execute_kv_backup -> HiCacheController.write "
                                 f"({CTRL}): mem_pool_host.alloc returns None on this rank, so "
                                 "it returns 0 and never tracks the node in "
                                 "ongoing_write_through (sglang #28429; write_backup in "
                                 "earlier releases)"),
    "alloc_write_back": _site(URC, "UnifiedRadixCache._evict_components",
                              "the write_back victim's _execute_and_commit_kv_backup("
                              "write_back=True) fails in HiCacheController.write "
                              "(mem_pool_host.alloc returns None), so the victim is dropped "
                              "instead of _demote'd"),
    "prefix": _site(POLICY, "PrefillAdder.add_one_req",
                    "match_prefix, then init_load_back -> UnifiedRadixCache._load_back_transfers, "
                    "which loads back only what _component_available_size (rank-local free "
                    "device KV) allows; the lengths become ScheduleBatch.prefix_lens / "
                    f"extend_lens ({BATCH}, prepare_for_extend)"),
    "admit": _site(POLICY, "PrefillAdder.add_one_req",
                   "admission from the rank's own waiting_queue order and budget; the "
                   "matched prefix is locked (UnifiedRadixCache.inc_lock_ref)"),
    "insert": _site(URC, "UnifiedRadixCache.insert",
                    "cache_unfinished_req / cache_finished_req insert the request's KV; "
                    "write_through backups go out through _apply_cache_action -> "
                    "_execute_and_commit_kv_backup"),
    "evict_device": _site(URC, "UnifiedRadixCache.evict_for_alloc",
                          "evicts LRU device leaves when the rank's own allocator is short "
                          "(_evict_components; write_back victims are backed up, then demoted)"),
    "evict_host": _site(URC, "UnifiedRadixCache.evict_host",
                        "host eviction and duplicate reclaim on the rank's own host pool; a "
                        "reclaimed duplicate mixes its node id into the digest "
                        f"(UnifiedTreeCore._release_full_host_duplicate, {CORE})"),
    "load_back": _site(URC, "UnifiedRadixCache._load_back_transfers",
                       "init_load_back's transfer: decided from _component_available_size "
                       "(rank-local), evicting with evict_for_alloc first"),
    "load_back_ack": _site(URC, "UnifiedRadixCache.loading_check",
                           "pops the load ack and unpins the loaded nodes"),
    "write_ack": _site(URC, "UnifiedRadixCache.writing_check",
                       "pops the write ack: _finish_write_through_ack"),
    "unlock": _site(URC, "UnifiedRadixCache.dec_lock_ref",
                    "a finished or moved request lock"),
    "skip_ids": _site(CORE, "UnifiedTreeNode.__init__",
                      "node ids come from the process-wide UnifiedTreeNode.counter: a rank "
                      "that built other nodes numbers every later node differently, and "
                      "_release_full_host_duplicate mixes node.id into the digest"),
    "digest": _site(URC, "UnifiedRadixCache._sync_hicache_ready_counts",
                    "assert digest == count_values[-2] and digest == -count_values[-1] "
                    "('write_back duplicate-reclaim victims diverged across PP/TP ranks')"),
    "digest_pre_26921": _site(URC, "UnifiedRadixCache.loading_check",
                              "assert sync_tensor[1] == -sync_tensor[2] after its own "
                              "all_reduce"),
    "missed": _site(CORE, "UnifiedTreeCore._release_full_host_duplicate",
                    "the only thing the digest covers is the duplicate-reclaim victims it "
                    "mixes in here; trees (or batches) that differ elsewhere pass every check"),
}
# Tie-break of events at the same point of the run (see analyse).
KIND_ORDER = {"ack_pops": 0, "alloc_failure": 1, "op": 2, "collective_inputs": 3, "prefix_length": 4}
# Sync vector positions of the digest pair, by call site (sim/events.py `_sync`).
DIGEST_AT = {"sync": (2, 4), "load_check": (1, 3)}


def _groups(outcome: Outcome, traces: dict) -> list[list[int]]:
    """Ranks grouped by identical op-traces (their header too: a rank's own pool sizes
    and failed allocations) and op times: what they did. Rank order."""
    sim = outcome.sim
    seen: dict = {}
    for r, ops in outcome.rank_ops().items():
        head = {k: v for k, v in traces[r][0].items() if k != "note"}
        key = json.dumps([head, [[op, sim.op_at[id(op)][1:]] for op in ops]], sort_keys=True)
        seen.setdefault(key, []).append(r)
    return sorted(seen.values())


def _ranks_str(ranks) -> str:
    return ",".join(map(str, ranks))


# ----------------------------------------------------------------------------------
# The candidate events
# ----------------------------------------------------------------------------------


def _ack_pop_events(sim) -> list[dict]:
    by_sync: dict = {}
    for p in sim.pops:
        by_sync.setdefault((p["step"], p["t"]), []).append(p)
    for (step, t), ps in sorted(by_sync.items(), key=lambda kv: min(p["g"] for p in kv[1])):
        w = {p["rank"]: p["write"] for p in ps}
        ld = {p["rank"]: p["load"] for p in ps}
        if len(set(w.values())) < 2 and len(set(ld.values())) < 2:
            continue
        which = "write" if len(set(w.values())) > 1 else "load"
        vals = w if which == "write" else ld
        return [{"kind": "ack_pops", "order": min(p["g"] for p in ps), "t": t, "step": step,
                 "acks": which, "per_rank": {str(r): [w[r], ld[r]] for r in sorted(w)},
                 "summary": (f"ranks pop different numbers of {which} acks at one sync: "
                             + ", ".join(f"rank {r} pops {vals[r]}" for r in sorted(vals))),
                 "sglang": SITES[f"{which}_pops"]}]
    return []


def _collective_events(sim, tp: int) -> list[dict]:
    for call in sim.calls:
        ins = call["inputs"]
        site = call["site"]
        missing = [r for r in range(tp) if str(r) not in ins]
        why = None
        if missing:
            why = (f"ranks {_ranks_str(missing)} skipped the {site} all_reduce that ranks "
                   f"{_ranks_str(sorted(int(r) for r in ins))} entered")
        elif site == "forward":
            if len(set(ins.values())) > 1:
                why = "the forward's numels differ: " + ", ".join(f"rank {r}: {v}" for r, v in ins.items())
        else:
            if len({len(v) for v in ins.values()}) > 1:
                why = "the sync vectors' lengths differ: " + ", ".join(
                    f"rank {r}: {len(v)}" for r, v in ins.items())
            elif site in DIGEST_AT:
                a, b = DIGEST_AT[site]
                if len({tuple(v[a:b]) for v in ins.values()}) > 1:
                    why = "the sync vectors' digests differ: " + ", ".join(
                        f"rank {r}: {v[a]}" for r, v in ins.items())
        if why is None:
            continue
        ev = {"kind": "collective_inputs", "order": call["g"], "t": call["t"], "step": call["step"],
              "site": site, "call": call["call"], "per_rank": ins, "summary": why,
              "sglang": SITES.get(site, SITES["sync"])}
        if "error" in call:
            ev["error"] = call["error"]
        if site == "sync" and len({tuple(v[:2]) for v in ins.values()}) > 1:
            ev["note"] = "the ready counts differ too (the MIN makes every rank pop the same)"
        return [ev]
    return []


def _alloc_events(outcome: Outcome) -> list[dict]:
    sim, ops = outcome.sim, outcome.rank_ops()
    if not sim.alloc_failure_at:
        return []
    f = sim.alloc_failure_at[0]
    r, i = f["rank"], f["op_index"]
    op = ops[r][i - 1] if 0 < i <= len(ops[r]) else None
    others = [q for q in ops if q != r]
    site = SITES["alloc_write_through" if outcome.cfg.write_policy == "write_through"
                 else "alloc_write_back"]

    # Ordered with the op it happens in (recorded just before it is applied), at the
    # earliest rank that ran the same op, so that it comes before that op's differing
    # result (its consequence; the engine visits ranks one after another).
    order = f["g"]
    if op is not None:
        same = [q for q in ops if len(ops[q]) >= i and _bare(ops[q][i - 1]) == _bare(op)]
        order = min(sim.op_at[id(ops[q][i - 1])][0] for q in same)
    return [{"kind": "alloc_failure", "order": order, "t": f["t"], "step": f["step"],
             "rank": r, "op_index": i, "attempt": f["attempt"], "op": summarise_op(op),
             "per_rank": {str(q): ("failed" if q == r else "allocated") for q in sorted(ops)},
             "summary": (f"rank {r}'s host allocation #{f['attempt']} in op #{i} "
                         f"({summarise_op(op).split(' ')[0]}) fails; ranks {_ranks_str(others)} "
                         "allocate"),
             "sglang": site}]


def _prefix_events(outcome: Outcome) -> list[dict]:
    shape, sim = outcome.divergence.get("shape_divergence"), outcome.sim
    if not shape or sim.shape_tick is None or sim.shapes is None:
        return []
    per_rank = {r: {rid: (pre, ext) for rid, pre, ext in sh} for r, sh in sim.shapes.items()}
    order = []  # request ids in batch order, rank 0's first
    for sh in sim.shapes.values():
        order += [rid for rid, _, _ in sh if rid not in order]
    rid = next((x for x in order if len({per_rank[r].get(x) for r in per_rank}) > 1), None)
    ev = {"kind": "prefix_length", "order": sim.shape_tick, "t": shape["t"], "step": shape["step"],
          "extend_tokens": {str(r): sum(e for _, _, e in sh) for r, sh in sim.shapes.items()},
          "first_request": shape.get("first_request")}
    if rid is None:  # the same requests and lengths in another order
        ev["summary"] = "the ranks' batches hold the same requests in a different order"
        ev["per_rank"] = {str(r): [x for x, _, _ in sh] for r, sh in sim.shapes.items()}
        ev["sglang"] = SITES["admit"]
        return [ev]
    vals = {r: per_rank[r].get(rid) for r in per_rank}
    ev["rid"] = rid
    ev["per_rank"] = {str(r): None if v is None else {"prefix": v[0], "extend": v[1]}
                      for r, v in vals.items()}
    absent = [r for r, v in vals.items() if v is None]
    if absent:
        there = [r for r, v in vals.items() if v is not None]
        ev["summary"] = (f"request {rid} is in the batch of ranks {_ranks_str(there)} and not in "
                         f"that of ranks {_ranks_str(absent)}")
        ev["sglang"] = SITES["admit"]
    else:
        ev["summary"] = f"request {rid}'s cached prefix differs: " + ", ".join(
            f"rank {r} prefix {v[0]} / extend {v[1]} tokens" for r, v in vals.items())
        ev["sglang"] = SITES["prefix"]
    return [ev]


def _bare(op: dict) -> dict:
    return {k: v for k, v in op.items() if k != "reserved"}


def _op_summary(pair: dict, ops: dict, traces: dict) -> str:
    """What differs at the first divergent op: the op itself, its result, or its time;
    and the ranks' allocators when they differ (late frees, skewed pools)."""
    i = pair["op_index"]
    sides = pair["sides"]
    raw = [ops[x["ranks"][0]][i - 1] if i <= len(ops[x["ranks"][0]]) else None for x in sides]
    bare = [None if op is None else {k: v for k, v in op.items() if k != "reserved"} for op in raw]

    def who(x):
        return f"ranks {_ranks_str(x['ranks'])}"

    if bare[0] != bare[1]:
        text = f"op #{i} differs: " + "; ".join(f"{who(x)}: {x['op']}" for x in sides)
    elif any(x["output"] != sides[0]["output"] or x["victims"] != sides[0]["victims"] for x in sides):
        def result(x):
            kinds: dict = {}
            for v in x["victims"]:
                kinds[v["kind"]] = kinds.get(v["kind"], 0) + 1
            out = {k: v for k, v in (x["output"] or {}).items()
                   if k not in ("i", "op", "digest", "dev", "host", "evictable", "protected", "nodes")}
            vic = ", ".join(f"{k} x{n}" for k, n in kinds.items()) or "no victims"
            return f"{who(x)}: {json.dumps(out, sort_keys=True)}, {vic}"

        text = f"op #{i} ({bare[0]['op']}) gives different results: " + "; ".join(map(result, sides))
    else:
        text = f"op #{i} ({bare[0]['op']}) runs at different times: " + "; ".join(
            f"{who(x)} at t={x['t']:.6f}s (step {x['step']})" for x in sides)
    res = [None if op is None else op.get("reserved") for op in raw]
    if None not in res and res[0] != res[1]:
        text += (f" (their allocators differ: {res[0]} vs {res[1]} device tokens held outside "
                 f"the tree on {who(sides[0])} vs {who(sides[1])})")
    heads = [traces[x["ranks"][0]][0] for x in sides]
    for key, pool in (("device_capacity", "device"), ("host_capacity", "host")):
        if heads[0][key] != heads[1][key]:
            text += (f" (their {pool} pools differ: {heads[0][key]} vs {heads[1][key]} tokens on "
                     f"{who(sides[0])} vs {who(sides[1])})")
    return text


HOST_KINDS = ("dup_reclaim", "dup_sweep", "host_evict", "drop_host")


def _op_site(op: dict | None, out: dict | None, other: dict | None = None,
             other_out: dict | None = None) -> dict:
    """The SGLang function behind one side of the first divergent op. Where both
    ranks ran the same eviction and got different victims, the first victim that
    differs says which pool decided: a host-side one (a reclaim, a host eviction)
    is ``evict_host``, otherwise the device eviction (``evict_for_alloc``)."""
    if op is None:
        return SITES["admit"]
    kind = op["op"]
    if kind == "lock":
        return SITES["admit"]
    if kind == "insert":
        return SITES["insert"]
    if kind in ("evict_device", "evict_host") and other is not None and _bare(op) == _bare(other):
        ea = [(e["k"], e.get("path")) for e in (out or {}).get("events", ())]
        eb = [(e["k"], e.get("path")) for e in (other_out or {}).get("events", ())]
        k = next((k for k, (x, y) in enumerate(zip(ea, eb)) if x != y), min(len(ea), len(eb)))
        kinds = {x[k][0] for x in (ea, eb) if k < len(x)}
        if kinds & set(HOST_KINDS):
            return SITES["evict_host"]
    return SITES.get(kind, SITES["admit"])


# ----------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------


def failure_site(outcome: Outcome) -> dict:
    """Where the real server dies (or why nothing notices)."""
    div = outcome.divergence
    first = first_failure(div)
    if first is None:
        return {"how": div["verdict"], **SITES["missed"]}
    kind, rec = first
    if kind == "collective":
        return {"how": f"collective {rec['kind']} in {rec['site']}", **SITES.get(rec["site"], SITES["sync"])}
    site = SITES["digest_pre_26921" if outcome.cfg.discipline == "pre_26921" else "digest"]
    return {"how": "digest assertion", **site}


def analyse(outcome: Outcome, traces: dict[int, list[dict]]) -> dict:
    """report.json: the first divergent event (in SGLang's terms), every kind of
    divergent event found, the victims around the first divergent op, tree differences,
    digest timelines, the jitter class and the failure."""
    div, cfg, sim = outcome.divergence, outcome.cfg, outcome.sim
    report = {
        "verdict": div["verdict"], "failure_class": failure_class(div),
        "failure": failure_line(div), "failure_site": failure_site(outcome),
        "jitter_class": jitter_class(div, cfg), "perturbations": div["perturbations"],
        "fired": fired(div),
        "first_true_divergence": div["first_true_divergence"],
        "digest_mismatch": div["digest_mismatch"], "collective_error": div["collective_error"],
        "shape_divergence": div["shape_divergence"], "untracked": div["untracked"],
    }
    groups = _groups(outcome, traces)
    report["rank_groups"] = groups  # ranks whose ops were identical, op for op
    ops = outcome.rank_ops()
    reps = {g[0]: rerun_ops(traces[g[0]]) for g in groups}
    times = {g[0]: [sim.op_at[id(op)][1:] for op in ops[g[0]]] for g in groups}
    ps = cfg.page_size
    tf = failure_time(div)
    ref = groups[0]
    a = reps[ref[0]]
    per_pair = []
    for g in groups[1:]:
        b = reps[g[0]]
        i = first_divergent_op(a, b, times[ref[0]], times[g[0]])
        if i is None:
            continue
        entry = {"ranks": [ref, g], "op_index": i, "sides": []}
        pair_ops = [ops[x[0]][i - 1] if i <= len(ops[x[0]]) else None for x in (ref, g)]
        pair_out = [rep.outputs[i] if i < len(rep.outputs) else None for rep in (a, b)]
        for k, (grp, rep) in enumerate(((ref, a), (g, b))):
            rops = ops[grp[0]]
            op = rops[i - 1] if i <= len(rops) else None
            tick, t, step = sim.op_at[id(op)] if op is not None else (None, None, None)
            out = rep.outputs[i] if i < len(rep.outputs) else None
            lo, hi = max(1, i - WINDOW_BEFORE), min(len(rops), i + WINDOW_AFTER)
            window = []
            for j in range(lo, hi + 1):
                _, tj, sj = sim.op_at[id(rops[j - 1])]
                window.append({"i": j, "t": tj, "step": sj, "op": summarise_op(rep.ops[j - 1]),
                               "victims": victims(rep.outputs[j], ps)})
            entry["sides"].append({
                "ranks": grp, "order": tick, "t": t, "step": step, "op": summarise_op(op),
                "output": None if out is None else {k: v for k, v in out.items() if k != "events"},
                "victims": [] if out is None else victims(out, ps), "window": window,
                "sglang": _op_site(op, out, pair_ops[1 - k], pair_out[1 - k])})
        entry["tree_diff_at_divergence"] = tree_diff(rerun_ops(traces[ref[0]], upto=i).tree,
                                                     rerun_ops(traces[g[0]], upto=i).tree)
        ftd = div["first_true_divergence"]
        if ftd is not None:
            ja, jb = _last_op_before(sim, ops[ref[0]], ftd["t"]), _last_op_before(sim, ops[g[0]], ftd["t"])
            entry["true_divergence_op_index"] = [ja, jb]
            entry["tree_diff_at_true_divergence"] = tree_diff(
                rerun_ops(traces[ref[0]], upto=ja).tree, rerun_ops(traces[g[0]], upto=jb).tree)
        ia, ib = _last_op_before(sim, ops[ref[0]], tf), _last_op_before(sim, ops[g[0]], tf)
        entry["failure_op_index"] = [ia, ib]
        entry["tree_diff_at_failure"] = tree_diff(rerun_ops(traces[ref[0]], upto=ia).tree,
                                                  rerun_ops(traces[g[0]], upto=ib).tree)
        per_pair.append(entry)

    def when(e):  # the earlier of the two sides' orders for the divergent op
        ts = [x["order"] for x in e["sides"] if x["order"] is not None]
        return min(ts) if ts else math.inf

    per_pair.sort(key=lambda e: (when(e), e["op_index"]))
    report["divergent_ops"] = per_pair
    events = (_ack_pop_events(sim) + _collective_events(sim, cfg.tp) + _alloc_events(outcome)
              + _prefix_events(outcome))
    if per_pair:
        e = per_pair[0]
        first_side = min((x for x in e["sides"] if x["order"] is not None), key=lambda x: x["order"])
        sides = [{k: x[k] for k in ("ranks", "t", "step", "op")} for x in e["sides"]]
        events.append({
            "kind": "op", "order": when(e), "t": first_side["t"], "step": first_side["step"],
            "op_index": e["op_index"], "sides": sides,
            "per_rank": {str(r): x["op"] for x in e["sides"] for r in x["ranks"]},
            "summary": _op_summary(e, ops, traces), "sglang": first_side["sglang"]})
    # Ties in order: an allocation failure happens inside the op recorded just before
    # it (the cause, listed first); see _alloc_events.
    events.sort(key=lambda e: (e["order"], KIND_ORDER[e["kind"]]))
    report["divergent_events"] = events
    report["first_divergent_event"] = events[0] if events else None
    report["digest_timeline"] = {
        _ranks_str(g): [[i, sim.op_at[id(ops[g[0]][i - 1])][1] if i else 0.0, d]
                        for i, d in digest_timeline(reps[g[0]])]
        for g in groups}
    report["optrace_final_digests"] = {str(r): reps[g[0]].final_digest for g in groups for r in g}
    report["optrace_final_digests"] = dict(sorted(report["optrace_final_digests"].items(),
                                                  key=lambda kv: int(kv[0])))
    return report


def _last_op_before(sim, ops: list, t: float) -> int:
    """Output index of the last op recorded at or before ``t`` (all ops when inf)."""
    n = 0
    for i, op in enumerate(ops, 1):
        if sim.op_at[id(op)][1] > t:
            break
        n = i
    return n


# ----------------------------------------------------------------------------------
# report.md
# ----------------------------------------------------------------------------------


def _sglang(site: dict) -> str:
    return f"`{site['function']}` ({site['file'].removeprefix('python/sglang/srt/')}): {site['what']}"


def render_report(bundle: dict, report: dict) -> str:
    """report.md: the report for people."""
    b, a = bundle["sizes"]["before"], bundle["sizes"]["after"]
    lines = [f"# Repro bundle: {bundle['scenario']}", "",
             f"- **failure**: `{bundle['failure']}`",
             f"- **verdict**: {bundle['verdict']} ({bundle['failure_class']})",
             f"- **jitter class**: {bundle['jitter_class']} (fired: "
             + (", ".join(f"{k} x{v}" for k, v in report["perturbations"].items() if v) or "none") + ")",
             f"- **where the server dies**: {_sglang(report['failure_site'])}"]
    s = bundle["seeds"]
    lines += [f"- **seeds**: scenario {s['scenario']}, jitter {s['jitter']}"
              + (f" (try {s['try']} from base {s['base']})" if s["try"] is not None else ""),
              (f"- **size** (before -> after shrinking): requests {b['requests']} -> {a['requests']}, "
              f"ranks {b['ranks']} -> {a['ranks']}, events {b['events']} -> {a['events']}"),
              "", "Replay: `hicache-sim replay <this folder>` (exit 0 when it reproduces, 1 when it does not).", ""]
    ev = report.get("first_divergent_event")
    lines += ["## First divergent event", ""]
    if ev is None:
        lines.append("None: every rank ran the same ops, pops and collective inputs.")
    else:
        lines += [f"At t={ev['t']:.6f}s (step {ev['step']}), **{ev['kind']}**: {ev['summary']}.", "",
                  f"SGLang: {_sglang(ev['sglang'])}.", ""]
        if ev.get("per_rank"):
            lines += ["| rank | value |", "|---:|---|"]
            lines += [f"| {r} | `{json.dumps(v)}` |" for r, v in ev["per_rank"].items()]
            lines.append("")
    later = report.get("divergent_events", [])[1:]
    if later:
        lines += ["Later divergent events, in the order they happened:", ""]
        for e in later:
            lines.append(f"- t={e['t']:.6f}s (step {e['step']}) {e['kind']}: {e['summary']} "
                         f"(`{e['sglang']['function']}`)")
        lines.append("")
    for pair in report.get("divergent_ops", []):
        lines += ["", (f"## Ranks {_ranks_str(pair['ranks'][0])} vs {_ranks_str(pair['ranks'][1])}: "
                  f"victims around op #{pair['op_index']}"), ""]
        for side in pair["sides"]:
            lines += [f"Ranks {_ranks_str(side['ranks'])}:", "", "| op | t (s) | step | op | victims |",
                      "|---:|---:|---:|---|---|"]
            for w in side["window"]:
                vic = "; ".join(f"{v['kind']} node {v['node']} ({v['depth_pages']} pages deep"
                                + (f", {v['n']} tokens" if "n" in v else "") + ")"
                                for v in w["victims"]) or "-"
                mark = " **<**" if w["i"] == pair["op_index"] else ""
                lines.append(f"| {w['i']}{mark} | {w['t']:.6f} | {w['step']} | `{w['op']}` | {vic} |")
            lines.append("")
        for key, title in (("tree_diff_at_divergence", "right after the divergent op"),
                           ("tree_diff_at_true_divergence", "at the engine's first true divergence"),
                           ("tree_diff_at_failure", "at the failure")):
            d = pair.get(key)
            if d is None:
                continue
            ra, rb = _ranks_str(pair["ranks"][0]), _ranks_str(pair["ranks"][1])
            if d["equal"]:
                what = "none (logically equal" + (
                    ", digests differ)" if d["digest"]["a"] != d["digest"]["b"] else ")")
            elif d["nodes_equal"]:
                what = (f"the same nodes, different occupancy: {d['occupancy']['a']} vs "
                        f"{d['occupancy']['b']}")
            else:
                what = (f"{d['counts']['only_a']} node(s) only in ranks {ra}, "
                        f"{d['counts']['only_b']} only in ranks {rb}, "
                        f"{d['counts']['differ']} with different residency or locks; occupancy "
                        f"{d['occupancy']['a']} vs {d['occupancy']['b']}")
            lines.append(f"Tree difference {title}: {what}")
            for row in d["only_a"][:5]:
                lines.append(f"  - only in ranks {ra}: {row['path']}: {_node_state(row)}")
            for row in d["only_b"][:5]:
                lines.append(f"  - only in ranks {rb}: {row['path']}: {_node_state(row)}")
            for row in d["differ"][:5]:
                lines.append(f"  - {row['path']}: ranks {ra} {_node_state(row['a'])}; "
                             f"ranks {rb} {_node_state(row['b'])}")
        lines.append("")
    tl = report.get("digest_timeline")
    if tl:
        lines += ["## Digest timeline (last changes per rank group)", ""]
        for ranks, rows in tl.items():
            tail = rows[-8:]
            lines.append(f"- ranks {ranks}: " + ", ".join(f"op {i} t={t:.4f}s -> {d}" for i, t, d in tail)
                         + (f" ({len(rows)} changes in all)" if len(rows) > len(tail) else ""))
        lines.append("")
    lines += ["## Files", "",
              "- `scenario.yaml`: the minimal scenario (`hicache-sim run` it to see the failure);",
              "- `schedule.jsonl`: every rank's ops, ack pops, host-allocation failures and the "
              "collective calls (each rank's input), in the order they happened;",
              ("- `report.json`: this report as data; `bundle.json`: verdict, sizes, seeds, "
               "what `replay` checks;"),
              ("- `ranks/rank<R>.optrace.jsonl`: each rank's op-trace; replay one with "
               "`hicache-sim replay-ops ranks/rank0.optrace.jsonl --summary`.")]
    if bundle.get("host_alloc_failures"):
        lines.append("  Rank-local host allocation failures are listed in the header's "
                     "`host_alloc_failures` (a hicache-sim extension that `replay-ops` honours; "
                     "SGLang's replayer needs the same patch).")
    if bundle.get("write_acks") == "op":
        lines.append("  write_through acks are `write_ack` ops where the rank's sync popped them "
                     "(op-trace v2, docs/OPTRACE.md; `tools/sglang_oracle` replays them on "
                     "SGLang's tree).")
    lines.append("")
    return "\n".join(lines)


def _node_state(row: dict) -> str:
    where = "+".join(k for k in ("dev", "host") if row[k]) or "nowhere"
    return (f"node {row['id']} ({row['pages']} pages) on {where}, lock {row['lock']}, "
            f"host_lock {row['host_lock']}")
