"""SGLang's rank consensus checker (utils/rank_consensus_checker.py, sglang #34406).

With ``SGLANG_ENABLE_RANK_CONSENSUS_CHECKER`` set, every ``@rank_consensus`` method
enqueues two strings per call on the scheduler thread, ``"<name> called params=..."``
and ``"<name> returns result=..."`` (the selected parameters and results, or
``<no check>``), and a worker thread drains the same number of events on every rank
(a MIN all_reduce of the queue lengths), hashes them and compares MIN and MAX of the
hash across the TP group: any difference logs "Found rank divergence" and kills the
server. Calls are therefore compared in order: a rank that calls once more, or gets
another result, differs from its peers at that event.

Here each replica keeps its event log (``Cohort.consensus``); ranks that share a
replica log the same events by construction. Each new event is compared with the
other replicas' event of the same index as soon as they have it, so a divergence is
caught at the call that made it. The call sites, as SGLang decorates them
(mem_cache/unified_radix_cache.py), and what they compare:

* ``match_prefix``: params (the key), results ``full_kv_hit_length`` and
  ``swa_host_hit_length``;
* ``insert``: ``len(params.key)``, result ``prefix_len``;
* ``evict_for_alloc``: params (the tokens asked) and the whole result (freed);
* ``write_backup_storage``: the call only;
* ``_can_terminate_prefetch``: the result (the group's verdict);
* ``check_prefetch_progress``: params (the request) and the result.

A key is compared through its length and a hash of its page ids (SGLang compares the
key's repr: equal keys give equal strings either way).
"""

from __future__ import annotations

from sim.request import _Halt


def key_text(key, page_size: int) -> str:
    return f"<key {len(key) * page_size} tokens #{hash(tuple(key)) & 0xFFFFFFFFFFFF:012x}>"


def record(sim, c, name: str, params: str, result: str) -> None:
    """Log one ``@rank_consensus`` call of replica ``c`` and check it against its peers."""
    log = c.consensus
    log.append(f"{name} called params={params}")
    log.append(f"{name} returns result={result}")
    cohorts = sim.group.cohorts
    if len(cohorts) < 2:
        return  # one replica: every rank logged exactly this
    n = len(log)
    for i in (n - 2, n - 1):
        seen = {}
        for o in cohorts:
            if len(o.consensus) > i:
                seen.setdefault(o.consensus[i], []).extend(o.ranks)
        if len(seen) > 1:
            _diverged(sim, name, i, seen)


def _diverged(sim, name: str, index: int, seen: dict) -> None:
    events = {",".join(map(str, sorted(r))): e for e, r in seen.items()}
    first = sim.obs.rank_consensus is None
    sim.obs.consensus_divergence(sim.env.now, sim.step_no, name, index, events)
    if first:
        sim._trace("rank_consensus", "divergence", list(range(sim.cfg.tp)), sim.env.now, 0)
        sim.obs.compare(sim.env.now, sim.step_no, sim.group.cohorts, full=True)
    if sim.cfg.on_divergence == "halt":
        sim.halted = "rank_consensus"
        raise _Halt()
