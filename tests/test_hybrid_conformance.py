"""Hybrid trees (sim/hybrid) replay SGLang 0.5.23's own (FULL, SWA) and (FULL, MAMBA)
cores bit for bit: every case in data/conformance/hybrid/ gives SGLang's output lines
byte for byte, and the tree's invariants hold after every op."""

import gzip
import json
import re

import pytest

from conftest import (ROOT, assert_replays_byte_for_byte, case_id, conformance_cases,
                      expected_lines, replay_checked, vendored_checksums_match)
from sim.errors import InputFormatError, UserError
from sim.hybrid import HybridTreeError, MambaTree, SWATree
from sim.hybrid.replay import HybridReplayer
from sim.tree.components.mamba import MambaComponent
from sim.tree.components.swa import SWAComponent
from sim.optrace import read_trace, replay_lines

HYBRID = ROOT / "data" / "conformance" / "hybrid"
CASES = conformance_cases(HYBRID)


def cases_where(keep):
    """The cases whose header ``keep`` accepts, as (header, its SGLang output lines as
    dicts); coverage tests count what these outputs exercise."""
    out = []
    for case in CASES:
        header = json.loads(gzip.open(case, "rt").readline())
        if keep(header):
            out.append((header, [json.loads(line) for line in expected_lines(case)]))
    return out


def test_vendored_files_match_their_checksums():
    vendored_checksums_match(HYBRID)


def test_at_least_30_cases_per_component_pair():
    kinds = [json.loads(gzip.open(c, "rt").readline())["components"][1] for c in CASES]
    assert kinds.count("swa") >= 30 and kinds.count("mamba") >= 30
    hand = [c for c in CASES if c.name.startswith("h")]
    assert len(hand) >= 14


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_replay_matches_sglang_byte_for_byte(case):
    assert_replays_byte_for_byte(case)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_invariants_hold_after_every_op(case):
    for _ in replay_checked(case, HybridReplayer):
        pass  # the check runs inside, after every op


def test_cases_cover_every_component_behaviour():
    """The shipped outputs exercise what the components add: tombstones, revivals,
    window-capped leaves, Mamba forks freed, branching points, early SWA releases,
    errors, at every page size the cases use."""
    seen = set()
    for case in CASES:
        kind = None
        for line in expected_lines(case):
            r = json.loads(line)
            if r["op"] == "header":
                kind = "swa" if "swa" in r else "mamba"
                continue
            for e in r["events"]:
                seen.add((kind, e["k"]))
            if r.get("mamba_exist"):
                seen.add((kind, "mamba_exist"))
            if r.get("cow"):
                seen.add((kind, "cow"))
            if r.get("branch") is not None:
                seen.add((kind, "branch"))
            if "error" in r:
                seen.add((kind, "error:" + r["error"]))
            seen.add((kind, "op:" + r["op"]))
    for kind in ("swa", "mamba"):
        for what in ("new", "split", "delete", "tomb", "set", "branch", "op:lock", "op:unlock",
                     "op:evict", "op:dump", "error:device_full", "error:bad_prev",
                     "error:unknown_lock_id", "error:duplicate_lock_id"):
            assert (kind, what) in seen, (kind, what)
    assert {("swa", "op:release_swa"), ("swa", "error:swa_full"),
            ("swa", "error:swa_already_released"), ("swa", "op:evict_for_alloc"),
            ("mamba", "mamba_exist"), ("mamba", "error:mamba_full"), ("mamba", "cow"),
            ("mamba", "op:release"), ("mamba", "op:evict_for_alloc"),
            ("mamba", "error:unknown_request")} <= seen


def test_host_tier_cases_cover_the_host_paths():
    """The (FULL, MAMBA) cases with HiCache on exercise every host-tier path the trace
    format reaches: backups with and without the state, demotes, an internal state's
    backup, host evictions of both components, duplicate reclaim in both passes with
    the digest moving, sweeps, un-evicting inserts, load-backs started and refused for
    each reason, and the host-tier errors, at page sizes 1, 2 and 4."""
    seen, page_sizes, digests = set(), set(), set()
    picked = cases_where(lambda h: h.get("hicache") and h["components"][1] == "mamba")
    n = len(picked)
    for header, outputs in picked:
        page_sizes.add(header.get("page_size", 1))
        for r in outputs:
            seen.add("op:" + r["op"])
            digests.add(r["digest"])
            for e in r["events"]:
                seen.add(e["k"] + (f":{e['pass']}" if "pass" in e else ""))
            if "reason" in r:
                seen.add("reason:" + r["reason"])
            if r.get("started"):
                seen.add("started")
            if r.get("mamba_host_len"):
                seen.add("mamba_host_len")
            if r.get("host_len"):
                seen.add("host_len")
            if "error" in r:
                seen.add(f"error:{r['op']}:{r['error']}")
    assert n >= 30
    assert page_sizes == {1, 2, 4}
    assert len(digests) > 10
    want = {"backup", "host_set", "demote", "tomb", "host_tomb", "unevict", "load", "set",
            "delete", "dup_reclaim:1", "dup_reclaim:2", "dup_sweep", "op:evict_host",
            "op:load_back", "op:load_back_ack", "started", "reason:no_host_tail",
            "reason:below_threshold", "reason:no_device_space", "reason:no_mamba_space",
            "mamba_host_len", "host_len", "error:load_back:duplicate_load_back_id",
            "error:load_back_ack:unknown_load_back_id", "error:load_back:mamba_full",
            "error:insert:bad_prev", "op:evict_for_alloc"}
    assert want <= seen, sorted(want - seen)


def test_swa_host_tier_cases_cover_the_host_paths():
    """The (FULL, SWA) cases with HiCache on exercise the SWA host paths: window
    backups of one node and of several (oldest first), an internal victim's backup
    before its tombstone, demotes, SWA host eviction of leaves and internal slices,
    duplicate reclaim, un-evicting inserts that publish SWA, host-only SWA matched and
    restored (with FULL, and alone), every load-back refusal, at page sizes 1, 2, 4."""
    seen, page_sizes = set(), set()
    picked = cases_where(lambda h: h.get("hicache") and h["components"][1] == "swa")
    n = len(picked)
    for header, outputs in picked:
        page_sizes.add(header.get("page_size", 1))
        for r in outputs:
            seen.add("op:" + r["op"])
            kinds = [e["k"] for e in r["events"]]
            for e in r["events"]:
                seen.add(e["k"] + (f":{e['pass']}" if "pass" in e else ""))
            if r["op"] in ("evict", "evict_for_alloc") and kinds.count("host_set") > 1:
                seen.add("window_backup")
            if (r["op"] in ("evict", "evict_for_alloc") and "host_set" in kinds
                    and "tomb" in kinds and "demote" not in kinds):
                seen.add("internal_backup")
            if r["op"] == "insert" and "unevict" in kinds and "set" in kinds:
                seen.add("unevict_publishes_swa")
            if "reason" in r:
                seen.add("reason:" + r["reason"])
            if r.get("started"):
                seen.add("started" if r["loaded"] else "started_swa_only")
            if r.get("swa_host_len"):
                seen.add("swa_host_len")
            if "error" in r:
                seen.add(f"error:{r['op']}:{r['error']}")
    assert n >= 30
    assert page_sizes == {1, 2, 4}
    want = {"backup", "host_set", "window_backup", "internal_backup", "demote", "tomb",
            "host_tomb", "unevict", "unevict_publishes_swa", "load", "set", "delete",
            "dup_reclaim:1", "dup_reclaim:2", "dup_sweep", "op:evict_host", "op:load_back",
            "op:load_back_ack", "started", "started_swa_only", "swa_host_len",
            "reason:no_host_tail", "reason:below_threshold", "reason:no_device_space",
            "reason:no_swa_space", "error:insert:bad_prev", "error:insert:swa_full",
            "error:load_back_ack:unknown_load_back_id",
            "error:load_back:duplicate_load_back_id", "op:evict_for_alloc"}
    assert want <= seen, sorted(want - seen)


def test_swa_write_through_cases_cover_the_write_through_paths():
    """The (FULL, SWA) cases under write_through and write_through_selective: insert
    backups of windows acked later, incremental window backups, unbacked leaves deleted
    on eviction, a backup that found no SWA host room, at page sizes 1, 2 and 4."""
    seen, page_sizes = set(), set()
    picked = cases_where(lambda h: h["components"][1] == "swa"
                         and h.get("write_policy", "write_back") != "write_back")
    n = len(picked)
    for header, outputs in picked:
        page_sizes.add(header.get("page_size", 1))
        seen.add(header["write_policy"])
        for r in outputs:
            kinds = [e["k"] for e in r["events"]]
            seen.add("op:" + r["op"])
            if r["op"] == "insert" and "backup" in kinds:
                seen.add("insert_backup")
                if kinds.count("host_set") > kinds.count("backup"):
                    seen.add("window_backup")
            if r["op"] in ("evict", "evict_for_alloc") and "delete" in kinds:
                seen.add("unbacked_delete")
            if r.get("writes"):
                seen.add("writes_in_flight")
            if r.get("started"):
                seen.add("started")
            if "error" in r:
                seen.add("error:" + r["error"])
    assert n >= 15 and page_sizes == {1, 2, 4}
    want = {"write_through", "write_through_selective", "op:write_ack", "insert_backup",
            "window_backup", "unbacked_delete", "writes_in_flight", "started",
            "op:load_back", "op:evict_host", "error:unknown_write_id"}
    assert want <= seen, sorted(want - seen)


def _swa_outputs(name):
    return [json.loads(line) for line in expected_lines(HYBRID / f"{name}.jsonl.gz")]


def test_swa_window_backup_writes_the_unbacked_window_oldest_first():
    """A demoted leaf shorter than the window takes its parent's device-only SWA with
    it (``_collect_unbacked_swa_nodes_in_window``), parent first; a load-back of the
    leaf restores both slices with FULL (case s01)."""
    tree = SWATree(device_capacity=64, swa_capacity=32, sliding_window=4,
                   host_capacity=64, swa_host_capacity=32, record=True)
    tree.insert(list(range(1, 11)))
    tree.insert(list(range(1, 7)) + [20, 21, 22])
    tree.evict(full=40)
    backups = [(k, n.key[0]) for k, n, _ in tree.rec if k == "host_set"]
    # the 4-token leaf alone, then the 3-token leaf with its parent (parent first)
    assert backups == [("host_set", 7), ("host_set", 1), ("host_set", 20)]
    assert tree.aux_host_used == 13 and tree.aux_used == 0
    m = tree.match_prefix(list(range(1, 7)) + [20, 21, 22])
    assert (m.device_len, m.host_len, m.aux_host_len) == (0, 9, 9)
    out = tree.load_back(m, 1)
    assert out.as_dict() == {"started": True, "loaded": 9} and out.aux_loaded == 9
    assert tree.aux_used == 9
    tree.finish_load_back(1)
    tree.check()
    outs = _swa_outputs("s01_swa_host_window_backup_demote")
    ev = [e for r in outs if r["op"] == "evict" for e in r["events"] if e["k"] == "host_set"]
    assert [e["n"] for e in ev] == [4, 6, 3]


def test_swa_internal_victim_is_backed_up_with_its_window_before_its_tombstone():
    """write_back: an internal SWA victim with no host copy is backed up first (FULL
    and the unbacked window, ``InternalStateBackup``), then tombstoned; its prefix
    then matches host-only SWA over device FULL, and a load-back restores the SWA
    alone (``loaded`` 0; case s02)."""
    tree = SWATree(device_capacity=64, swa_capacity=32, sliding_window=4,
                   host_capacity=64, swa_host_capacity=32)
    tree.insert(list(range(1, 11)))
    tree.insert([1, 2, 3, 4, 30, 31, 32, 33])
    tree.match_prefix(list(range(1, 11)))
    res = tree.evict(0, 4)
    assert (res.freed, res.aux) == (0, 4)
    assert (tree.host_used, tree.aux_host_used, tree.dev_used) == (4, 4, 14)
    m = tree.match_prefix([1, 2, 3, 4])
    assert (m.device_len, m.aux_host_len) == (0, 4) and m.best.dev
    out = tree.load_back(m, 1)
    assert out.as_dict() == {"started": True, "loaded": 0} and out.aux_loaded == 4
    assert m.best.aux
    tree.finish_load_back(1)
    tree.check()
    outs = _swa_outputs("s02_swa_internal_backup")
    assert any(r.get("started") and r["loaded"] == 0 and r["swa_host_len"] for r in outs)


def test_swa_host_pool_bounds_what_replays_from_host():
    """The SWA host pool is a knob of its own: with one window's worth of SWA host
    slots, evicting several prompts keeps FULL on host but most windows' SWA is lost,
    so their prefixes miss (a match must close a window); with enough slots every
    prompt's window comes back from host."""
    def replays(swa_host):
        tree = SWATree(device_capacity=64, swa_capacity=64, sliding_window=4,
                       host_capacity=256, swa_host_capacity=swa_host)
        prompts = [[100 * k + j for j in range(8)] for k in range(1, 7)]
        for p in prompts:
            tree.insert(p)
        tree.evict(full=64)
        hits = 0
        for p in prompts:
            m = tree.match_prefix(p)
            hits += m.device_len + m.host_len == len(p)
        tree.check()
        return hits
    assert replays(4) < replays(64) == 6


def test_a_state_that_reached_the_device_after_its_backup_is_pruned_by_the_demote():
    """sglang #33713's shape in 0.5.23: write_back backs a node's state up only with
    its FULL (or as an internal state whose node has no FULL host copy). A state
    that reached the device after its node's FULL went to host (an insert ending at
    a backed-up node) is dropped, not demoted, when the node is demoted: the prefix
    then matches nothing although its FULL is on host. The vendored case
    x02_mamba_state_pruned_on_demote is the same sequence on SGLang's core."""
    t = MambaTree(device_capacity=64, mamba_capacity=8, mamba_chunk=4, host_capacity=64,
                  mamba_host_capacity=8)
    a, ab = list(range(1, 5)), list(range(1, 9))
    t.insert(a)
    t.insert(ab)
    t.match_prefix(ab)                       # the leaf's state is the most recent
    assert t.evict(0, 1).aux == 1            # internal: backed up, then tombstoned
    node = t.match_prefix(a).best
    assert node.host and node.aux_host and not node.aux
    t.evict(4, 0)                            # the leaf demoted with its state
    assert t.evict_host(1, "mamba") == 1     # the internal host state goes (LRU tail)
    assert not node.aux_host and node.host
    t.insert(a)                              # the state returns, to the device only
    assert node.aux and not node.aux_host and node.dev and node.host
    ev = t.evict(4, 0)                       # a backed-up D-leaf: demoted directly
    assert (ev.freed, ev.aux) == (4, 1)
    assert not node.dev and node.host and not node.aux and not node.aux_host
    m = t.match_prefix(a)
    assert (m.best, m.host_len, m.full_len, m.branch) == (t.root, 0, 4, 4)
    t.check()


def test_host_tier_results_leave_the_device_tier_alone():
    """A tree with the host tier and no host use answers as the device-only tree:
    the host fields stay at their zero values on every op of a device-tier case."""
    case = HYBRID / "g11_mamba_c4.jsonl.gz"
    ops = list(read_trace(case))
    plain = HybridReplayer(ops[0][2])
    host = HybridReplayer({**ops[0][2], "hicache": True, "host_capacity": 0,
                           "mamba_host_capacity": 0})
    for idx, _, op in ops[1:]:
        if op["op"] in ("evict", "evict_for_alloc"):
            continue  # write_back demotes instead of deleting: a different tree
        a, b = plain.apply(idx, op), host.apply(idx, op)
        for key in ("host_len", "dnode", "mamba_host_len", "host", "mamba_host", "digest"):
            b.pop(key, None)
        if op["op"] == "dump":
            for row in b["tree"]:
                for key in ("dev", "host", "host_lock", "mamba_host", "mamba_host_lock",
                            "pinned_by"):
                    row.pop(key)
            for key in ("host_lru", "h_leaves", "duplicates"):
                b.pop(key)
        assert a == b


# ------------------------------------------------------------------ unit checks


def test_swa_insert_splits_at_the_cursor_and_caps_the_leaf():
    t = SWATree(device_capacity=64, swa_capacity=32, sliding_window=4, record=True)
    r = t.insert(list(range(1, 11)), swa_evicted=4)
    assert (r.prefix_len, r.new, r.aux_new) == (0, 10, 6)
    kinds = [(k, n.id, e.get("n")) for k, n, e in t.rec]
    # the leaf, its out-of-window head split off, then one window kept at the tail
    assert kinds == [("new", 1, 10), ("split", 2, 4), ("split", 3, 2), ("set", 3, 2),
                     ("set", 1, 4)]
    assert (t.dev_used, t.aux_used, t.aux_evictable) == (10, 6, 6)
    # the match must close a window after the tombstone: [5,6] has only 2 tokens
    m = t.match_prefix(list(range(1, 7)))
    assert (m.device_len, m.full_len, m.branch) == (0, 6, 6)
    t.check()


def test_swa_revival_consumes_the_request_kv():
    t = SWATree(device_capacity=64, swa_capacity=32, sliding_window=4)
    t.insert(list(range(1, 11)), swa_evicted=6)
    assert t.aux_used == 4
    r = t.insert(list(range(1, 11)))  # recomputed from scratch: revives [1..6]
    assert (r.prefix_len, r.new, r.aux_new) == (10, 10, 10)
    assert (t.dev_used, t.aux_used) == (10, 10)
    assert t.match_prefix(list(range(1, 11))).device_len == 10
    t.check()


def test_mamba_state_stays_on_the_lower_fragment_and_forks_are_freed():
    t = MambaTree(device_capacity=64, mamba_capacity=4, mamba_chunk=4)
    t.insert(list(range(1, 9)))
    m = t.match_prefix(list(range(1, 6)))  # splits [1..5 | 6..8]; no state at 5
    assert (m.device_len, m.full_len, m.branch, m.best) == (0, 5, 4, t.root)
    assert t.insert(list(range(1, 9))).mamba_exist
    assert t.aux_used == 1
    r = t.insert(list(range(1, 6)), prev=0)  # the split-off parent takes a state
    assert not r.mamba_exist and t.aux_used == 2
    assert t.match_prefix(list(range(1, 6))).device_len == 5
    t.check()


def _state(t):
    rows = sorted((n.id, tuple(n.key), n.lock, n.aux, n.aux_lock, n.last_access)
                  for n in t.iter_nodes())
    return (rows, [n.id for n in t.lru.order()], t.dev_used, t.aux_used, t.evictable,
            t.aux_evictable, t._clock, t._next_id)


def test_refused_inserts_change_nothing():
    t = SWATree(device_capacity=8, swa_capacity=4, sliding_window=4, page_size=2)
    t.insert([(1, 1), (2, 2)])
    before = _state(t)
    for args, code in ((([(9, 9)] * 3,), "device_full"),         # 6 new > 4 free
                       (([(1, 1), (2, 2), (3, 3)], 2), "bad_prev"),  # 2 ends inside a node
                       (([(1, 1), (2, 2), (3, 3)], 3), "bad_prev"),  # not page-aligned
                       (([(5, 5)], 0, 1), "bad_swa_evicted"),
                       (([(5, 5), (6, 6)], 0, 0), "swa_full")):  # 4 SWA > 0 free
        with pytest.raises(HybridTreeError) as info:
            t.insert(*args)
        assert info.value.code == code
        assert _state(t) == before
    m = MambaTree(device_capacity=8, mamba_capacity=1, mamba_chunk=1)
    m.insert([1])
    before = _state(m)
    with pytest.raises(HybridTreeError, match="mamba_full"):
        m.insert([2])
    assert _state(m) == before
    m.check()


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("lines,msg", [
    (['{"op":"header","components":["full","c128"],"device_capacity":8}'],
     r't.jsonl:1: found components=\["full", "c128"\]; expected "components" one of'),
    (['{"op":"header","components":["full","swa"],"device_capacity":8,"swa_capacity":4}'],
     r"t.jsonl:1: found no 'sliding_window'; expected 'sliding_window' \(an int\) in a swa header"),
    (['{"op":"header","components":["full","mamba"],"device_capacity":8,"mamba_capacity":2,'
      '"mamba_chunk":4,"page_size":2}'],
     "t.jsonl:1: found page_size=2; expected page_size 1 in a mamba header"),
    (['{"op":"header","components":["full","mamba"],"device_capacity":8,"mamba_capacity":2,'
      '"mamba_chunk":4,"mamba_max_states":0}'],
     "t.jsonl:1: found mamba_max_states=0; expected 'mamba_max_states' as -1 or a positive int"),
    (['{"op":"header","components":["full","swa"],"device_capacity":8,"swa_capacity":4,'
      '"sliding_window":2}', '{"op":"evict_device","n":3}'],
     "t.jsonl:2: found op='evict_device'; expected one of insert, match"),
    (['{"op":"header","components":["full","mamba"],"device_capacity":8,"mamba_capacity":2,'
      '"mamba_chunk":4}', '{"op":"insert","tokens":[1],"swa_evicted":0}'],
     "t.jsonl:2: found 'swa_evicted' in a mamba trace; expected 'swa_evicted' only with"),
    (['{"op":"header","components":["full","mamba"],"device_capacity":8,"mamba_capacity":2,'
      '"mamba_chunk":4}', '{"op":"release_swa","id":1}'],
     "t.jsonl:2: found a release_swa op in a mamba trace; expected release_swa only with"),
    (['{"op":"header","components":["full","swa"],"device_capacity":8,"swa_capacity":4,'
      '"sliding_window":2}', '{"op":"insert","tokens":[1,"a"]}'],
     "t.jsonl:2: found tokens=\\[1, \"a\"\\]; expected 'tokens' as a list of ints"),
    (['{"op":"header","components":["full","swa"],"device_capacity":8,"swa_capacity":4,'
      '"sliding_window":2}', '{"op":"insert","tokens":[1],"prev":-2}'],
     "t.jsonl:2: found prev=-2; expected 'prev' as a non-negative int"),
    # the host tier
    (['{"op":"header","components":["full","swa"],"device_capacity":8,"swa_capacity":4,'
      '"sliding_window":2,"hicache":true,"host_capacity":8}'],
     "t.jsonl:1: found no 'swa_host_capacity'; expected 'swa_host_capacity' \\(an int\\)"),
    (['{"op":"header","components":["full","swa"],"device_capacity":8,"swa_capacity":4,'
      '"sliding_window":2,"hicache":true,"host_capacity":8,"mamba_host_capacity":2}'],
     "t.jsonl:1: found 'mamba_host_capacity' in a swa header; expected 'swa_host_capacity'"),
    (['{"op":"header","components":["full","swa"],"device_capacity":8,"swa_capacity":4,'
      '"sliding_window":2,"page_size":2,"hicache":true,"host_capacity":8,'
      '"swa_host_capacity":3}'],
     "t.jsonl:1: found swa_host_capacity=3; expected 'swa_host_capacity' a multiple of page_size"),
    (['{"op":"header","components":["full","mamba"],"device_capacity":8,"mamba_capacity":2,'
      '"mamba_chunk":4,"hicache":true,"host_capacity":8}'],
     "t.jsonl:1: found no 'mamba_host_capacity'; expected 'mamba_host_capacity' \\(an int\\)"),
    (['{"op":"header","components":["full","mamba"],"device_capacity":8,"mamba_capacity":2,'
      '"mamba_chunk":4,"hicache":"yes"}'],
     "t.jsonl:1: found hicache='yes'; expected 'hicache' as true or false"),
    (['{"op":"header","components":["full","mamba"],"device_capacity":8,"mamba_capacity":2,'
      '"mamba_chunk":4,"host_capacity":8}'],
     "t.jsonl:1: found 'host_capacity' without \"hicache\": true"),
    (['{"op":"header","components":["full","mamba"],"device_capacity":8,"mamba_capacity":2,'
      '"mamba_chunk":4,"hicache":true,"host_capacity":8,"mamba_host_capacity":2,'
      '"write_policy":"write_around"}'],
     "t.jsonl:1: found write_policy='write_around'; expected 'write_policy' one of "
     "\"write_back\", \"write_through\", \"write_through_selective\""),
    (['{"op":"header","components":["full","mamba"],"device_capacity":8,"mamba_capacity":2,'
      '"mamba_chunk":4,"hicache":true,"host_capacity":8,"mamba_host_capacity":2}',
      '{"op":"write_ack","id":1}'],
     "t.jsonl:2: found a write_ack op under write_back; expected write_ack only with"),
    (['{"op":"header","components":["full","mamba"],"device_capacity":8,"mamba_capacity":2,'
      '"mamba_chunk":4,"hicache":true,"host_capacity":8,"mamba_host_capacity":2}',
      '{"op":"insert","tokens":[1,2],"inserted":1}'],
     "t.jsonl:2: found 'inserted' without a write_through policy; expected 'inserted' only"),
    (['{"op":"header","components":["full","mamba"],"device_capacity":8,"mamba_capacity":2,'
      '"mamba_chunk":4}', '{"op":"write_ack","id":1}'],
     "t.jsonl:2: found a write_ack op without the host tier; expected write_ack only in"),
    (['{"op":"header","components":["full","mamba"],"device_capacity":8,"mamba_capacity":2,'
      '"mamba_chunk":4}', '{"op":"load_back","tokens":[1],"id":1}'],
     't.jsonl:2: found a load_back op without the host tier; expected load_back only in a'),
    (['{"op":"header","components":["full","mamba"],"device_capacity":8,"mamba_capacity":2,'
      '"mamba_chunk":4,"hicache":true,"host_capacity":8,"mamba_host_capacity":2}',
      '{"op":"evict_host","full":1,"mamba":1}'],
     "t.jsonl:2: found evict_host naming both components; expected evict_host with exactly"),
    (['{"op":"header","components":["full","mamba"],"device_capacity":8,"mamba_capacity":2,'
      '"mamba_chunk":4,"hicache":true,"host_capacity":8,"mamba_host_capacity":2}',
      '{"op":"load_back","tokens":[1]}'],
     "t.jsonl:2: found no 'id' in a load_back op; expected 'id'"),
])
def test_malformed_hybrid_traces_give_one_line_errors(tmp_path, lines, msg):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputFormatError) as info:
        list(replay_lines(path))
    assert re.search(msg, str(info.value)), str(info.value)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(str(path))


def test_replay_ops_plays_hybrid_traces(tmp_path, capsys):
    import cli

    case = HYBRID / "h01_mamba_leaf_state_and_split.jsonl.gz"
    out = tmp_path / "out.jsonl"
    assert cli.main(["replay-ops", str(case), "-o", str(out), "--summary"]) == 0
    assert out.read_text().splitlines() == expected_lines(case)
    err = capsys.readouterr().err
    assert err.startswith(f"{len(expected_lines(case))} ops replayed; device ")
    assert "mamba 1 states" in err
    host_case = HYBRID / "x01_mamba_host_backup_demote.jsonl.gz"
    assert cli.main(["replay-ops", str(host_case), "-o", str(out), "--summary"]) == 0
    assert out.read_text().splitlines() == expected_lines(host_case)
    err = capsys.readouterr().err
    assert "mamba 0 states, host 8 tokens, mamba host 2 states" in err, err
    # FULL-only flags have no meaning for a hybrid trace: a one-line input error
    assert cli.main(["replay-ops", str(case), "--ids", "sglang"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "found a hybrid trace with ids='sglang'" in err


@pytest.mark.parametrize("name", ["g12_swa_ps1_w8", "g11_mamba_c4",
                                  "y11_mamba_host_ps1_c4_h600_m120",
                                  "z11_mamba_wt_ps1_c4_h600_m120",
                                  "z17_mamba_sel_ps1_c4_h192_m80"])
def test_a_clone_replays_the_rest_of_a_case_exactly_and_independently(name):
    """clone() at mid-trace: the clone and the original give SGLang's lines for the
    rest of the case, and a change to one leaves the other's state alone."""
    case = HYBRID / f"{name}.jsonl.gz"
    ops = list(read_trace(case))
    expected = expected_lines(case)
    orig = HybridReplayer(ops[0][2])
    half = len(ops) // 2
    for idx, _, op in ops[1:half]:
        orig.apply(idx, op)
    twin = HybridReplayer(ops[0][2])
    twin.tree = orig.tree.clone()
    twin.locks = {lid: twin.tree.receipt_in(r) for lid, r in orig.locks.items()}
    twin.held = set(orig.held)
    assert twin.tree.fingerprint() == orig.tree.fingerprint()
    for idx, _, op in ops[half:]:
        for r in (orig, twin):
            assert json.dumps(r.apply(idx, op), separators=(",", ":")) == expected[idx]
            r.tree.check()
    before = twin.tree.fingerprint()
    orig.tree.evict(10**6, 10**6)
    assert twin.tree.fingerprint() == before != orig.tree.fingerprint()


def test_the_tree_holds_its_components_and_a_clone_holds_its_own():
    """SWATree / MambaTree are the core with a component object (``tree.aux``; FULL's
    is ``tree.full``) whose state lives on it: a clone's components are its own
    (bound to the clone, their LRU lists over its nodes), so a window lock's uuid, a
    held slot or an eviction on one tree leaves the other's component alone."""
    s = SWATree(device_capacity=64, swa_capacity=64, sliding_window=4)
    assert isinstance(s.aux, SWAComponent) and s.aux.tree is s and s.window == 4
    s.insert(list(range(1, 9)))  # one window-capped leaf: two SWA fragments
    c = s.clone()
    assert c.aux is not s.aux and (c.aux.tree, c.full.tree) == (c, c)
    assert [x.id for x in c.lru.order()] == [x.id for x in s.lru.order()] == [1, 2]
    assert not set(c.lru.order()) & set(s.lru.order())
    start = s.aux.last_uuid
    assert c.inc_lock(c.match_prefix(list(range(1, 9))).dnode).uuid == start + 1
    assert (s.aux.last_uuid, c.aux.last_uuid) == (start, start + 1)
    assert s.evict(0, 64).aux == 8 and (s.aux_used, c.aux_used) == (0, 8)
    assert (len(s.lru.order()), len(c.lru.order())) == (0, 2)
    s.check()
    c.check()
    m = MambaTree(device_capacity=32, mamba_capacity=4, mamba_chunk=1)
    assert isinstance(m.aux, MambaComponent)
    m.insert([1, 2, 3])
    mc = m.clone()
    assert mc.cow(mc.match_prefix([1, 2, 3]), False).copied
    assert (mc.held, m.held) == (1, 0)
    m.check()
    mc.check()


def test_write_through_cases_cover_the_write_through_paths():
    """The write_through cases (w, z) exercise what the policy adds: backups issued
    by inserts (walked nodes and new leaves, FULL with the state, and a state alone on
    a backed-up node), acks in flight (a fragment pending under its parent's ack,
    unknown ids), unbacked leaves deleted by eviction next to demotes, load-backs,
    under both write_through and write_through_selective, at page sizes 1, 2 and 4."""
    seen, policies, page_sizes = set(), set(), set()
    picked = cases_where(lambda h: h.get("write_policy", "write_back") != "write_back")
    n = len(picked)
    for header, outputs in picked:
        policies.add(header["write_policy"])
        page_sizes.add(header.get("page_size", 1))
        for r in outputs:
            kinds = [e["k"] for e in r["events"]]
            seen.add("op:" + r["op"])
            if r["op"] == "insert" and "backup" in kinds:
                seen.add("insert_backup")
                if any(e["k"] == "backup" and e["n"] == 0 for e in r["events"]):
                    seen.add("state_only_backup")
            if r["op"] in ("evict", "evict_for_alloc"):
                seen.update("evict:" + k for k in kinds)
            if r.get("writes"):
                seen.add("writes_in_flight")
            if "error" in r:
                seen.add(f"error:{r['op']}:{r['error']}")
            if r.get("started"):
                seen.add("started")
            for row in r.get("tree", ()):
                if row["write_pending"] not in (None, row["id"]):
                    seen.add("fragment_pending")
    assert n >= 26 and policies == {"write_through", "write_through_selective"}
    assert page_sizes == {1, 2, 4}
    want = {"insert_backup", "state_only_backup", "op:write_ack", "writes_in_flight",
            "error:write_ack:unknown_write_id", "evict:delete", "evict:demote", "evict:tomb",
            "fragment_pending", "started", "op:evict_host", "op:load_back_ack"}
    assert want <= seen, sorted(want - seen)


def _outputs(name):
    return [json.loads(x) for x in expected_lines(HYBRID / f"{name}.jsonl.gz")]


def test_write_through_prunes_a_state_set_while_its_write_is_in_flight():
    """sglang #33713 under write_through (w02 on SGLang's core, replayed on the sim):
    an insert ending at a fragment of a node whose write is still in flight sets the
    fragment's state, which no backup ever carries (the incremental backup skips a
    pending node); the demote drops it, so the prefix has no host hit although its
    FULL is on host. Acked first, the same insert backs the state up alone."""
    t = MambaTree(device_capacity=64, mamba_capacity=8, mamba_chunk=4, host_capacity=64,
                  mamba_host_capacity=8, write_policy="write_through")
    a, ab = list(range(1, 5)), list(range(1, 9))
    t.insert(ab)
    assert list(t.writes) == [1]
    frag = t.insert(a).node                  # splits the pending node: same ack
    assert frag.wp == 1 and frag.host and frag.aux and not frag.aux_host
    t.write_ack(1)
    c, cd = list(range(20, 24)), list(range(20, 28))
    t.insert(cd)
    t.write_ack(3)
    frag2 = t.insert(c).node                 # not pending: the state goes alone
    assert frag2.aux_host and list(t.writes) == [frag2.id]
    t.write_ack(frag2.id)
    t.evict(64, 0)
    m = t.match_prefix(a)
    assert (m.best, m.host_len, m.full_len) == (t.root, 0, 4)
    m = t.match_prefix(c)
    assert (m.best, m.host_len, m.aux_host_len) == (frag2, 4, 1)
    t.check()
    by_op = {r["i"]: r for r in _outputs("w02_mamba_wt_state_pruned")}
    assert (by_op[13]["node"], by_op[13]["host_len"], by_op[13]["full_len"]) == (0, 0, 4)
    assert (by_op[15]["host_len"], by_op[15]["mamba_host_len"]) == (4, 1)


def test_a_state_host_pool_too_small_for_the_checkpoints_misses_on_replay():
    """sglang #39436's mechanism at small scale (w03 / w04 on SGLang's core): 8
    chunk-prefilled prompts with 3 checkpoints each through a device tier of 4 and a
    FULL host tier for all. With 4 state host slots a backup finds its state slot
    only by evicting a host-only state (an older prompt's host leaf, FULL and all)
    or fails whole, so the 4 evicted prompts replay 0/4 from host; with 24 slots,
    4/4 whole."""
    def replays(name):
        outs = _outputs(name)
        matches = [r for r in outs if r["op"] == "match"]
        assert len(matches) == 4
        return [r["host_len"] for r in matches]

    assert replays("w03_mamba_wt_state_host_pool_too_small") == [0, 0, 0, 0]
    assert replays("w04_mamba_wt_state_host_pool_enough") == [12, 12, 12, 12]


def test_write_policy_changes_the_run():
    """The header's write_policy is a knob: the same ops replay differently under
    write_back, write_through and write_through_selective."""
    ops = [{"op": "insert", "tokens": list(range(1, 9))},
           {"op": "insert", "tokens": list(range(1, 13)), "prev": 8},
           {"op": "evict", "full": 64}, {"op": "dump"}]
    header = {"op": "header", "components": ["full", "mamba"], "device_capacity": 64,
              "mamba_capacity": 8, "mamba_chunk": 4, "hicache": True, "host_capacity": 64,
              "mamba_host_capacity": 8}
    runs = []
    for policy in ("write_back", "write_through", "write_through_selective"):
        r = HybridReplayer({**header, "write_policy": policy})
        runs.append(json.dumps([r.apply(i, op) for i, op in enumerate(ops, 1)]))
        r.tree.check()
    assert len(set(runs)) == 3


def test_inserted_len_gates_write_through_hit_counts():
    """An insert's ``inserted`` (InsertParams.inserted_len) is a knob: nodes the
    request inserted before count no hit, so write_through_selective's second hit on
    a prefix comes only from another request's insert."""
    def run(inserted):
        t = MambaTree(device_capacity=64, mamba_capacity=8, mamba_chunk=4, host_capacity=64,
                      mamba_host_capacity=8, write_policy="write_through_selective")
        first = t.insert(list(range(1, 9))).node
        t.insert(list(range(1, 13)), 8, inserted=inserted)
        t.check()
        return first.hit_count, first.host

    assert run(0) == (2, True)      # counted again: its second hit backs it up
    assert run(8) == (1, False)     # the request's own prefix: not counted


def test_sglang_39436_at_the_reports_scale():
    """sglang #39436's fill-and-replay at its own scale (write_through, chunked prefill
    4,096: 200 prompts of 8,448 tokens, 3 state checkpoints each, a 2,680,896-token KV
    host tier): the state host pool bounds what replays from host, at one slot per
    checkpoint of every prompt filled (600). 565 slots: the 8 oldest prompts replay
    0/8 from host, 734: 8/8, as reported; 599: the oldest loses its last checkpoint.
    tools/sglang_oracle/wt_state_host_pool.py --oracle replays the same traces on
    SGLang's core: every line identical."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "wt_state_host_pool", ROOT / "tools" / "sglang_oracle" / "wt_state_host_pool.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)

    def replays(slots):
        _, outs = tool.build(slots, prompts=200, device_prompts=40, replay=8)
        return [(o["host_len"], o["mamba_host_len"]) for o in outs if o["op"] == "match"]

    whole = (8448, 1)
    assert replays(565) == [(0, 0)] * 8
    assert replays(734) == [whole] * 8
    assert replays(600) == [whole] * 8
    assert replays(599) == [(8192, 1)] + [whole] * 7


# ------------------------------------------------------------- policy registries
def _survivors(policy: str) -> list:
    """Two leaves, the first matched again last; one leaf's worth of FULL evicted."""
    t = MambaTree(device_capacity=64, mamba_capacity=8, mamba_chunk=1, eviction_policy=policy)
    t.insert([1, 2, 3])
    t.insert([7, 8, 9])
    t.match_prefix([1, 2, 3])
    assert t.evict(3, 0).freed == 3
    t.check()
    return sorted(tuple(t.path_units(x)) for x in t.iter_nodes())


def test_the_eviction_policy_registry_orders_fulls_leaf_heap_in_a_hybrid_tree():
    """FULL's device leaves go by the eviction policy's priority
    (``tree_core.eviction_strategy.get_priority``), as in the FULL-only tree: lru
    evicts the leaf used least recently, mru and fifo the other one."""
    assert _survivors("lru") == [(1, 2, 3)]
    assert _survivors("mru") == [(7, 8, 9)]
    assert _survivors("fifo") == [(7, 8, 9)]


def _host_eviction(policy: str):
    """A backed-up prefix loaded back (a settled duplicate), then a host eviction."""
    t = SWATree(device_capacity=16, swa_capacity=16, sliding_window=2, host_capacity=6,
                swa_host_capacity=16, host_policy=policy)
    t.insert([1, 2, 3])
    t.evict(3, 0)
    assert t.load_back(t.match_prefix([1, 2, 3]), 1).started
    t.finish_load_back(1)
    freed = t.evict_host(3)
    t.check()
    return freed, t.stats.reclaims, t.digest, t.host_used


def test_the_host_policy_registry_runs_the_hybrid_trees_duplicate_reclaim():
    """duplicate_first releases the duplicate's host copy (folded into the digest);
    lru (SGLANG_HICACHE_SKIP_HOST_DUPLICATE_RECLAIM) reclaims nothing, and with no
    host-only leaf frees nothing."""
    freed, reclaims, digest, host = _host_eviction("duplicate_first")
    assert freed == 3 and reclaims > 0 and digest != 0 and host == 0
    assert _host_eviction("lru") == (0, 0, 0, 3)


def test_an_unknown_policy_name_is_refused_by_the_registry():
    with pytest.raises(UserError):
        MambaTree(device_capacity=8, mamba_capacity=2, mamba_chunk=1, eviction_policy="lrx")
    with pytest.raises(UserError):
        SWATree(device_capacity=8, swa_capacity=8, sliding_window=2, host_policy="nope")


def test_a_hybrid_eviction_returns_its_backups_per_component_and_the_tree_counts_them():
    """write_back: an evicted leaf is backed up before its demote; the eviction's
    result holds each backup as (FULL tokens, the component's host units: Mamba one
    state; SWA the window's slices, here two fragments), and the tree counts them
    (``stats``, ``hy``)."""
    m = MambaTree(device_capacity=16, mamba_capacity=4, mamba_chunk=1, host_capacity=16,
                  mamba_host_capacity=4)
    m.insert([1, 2, 3])
    ev = m.evict(3, 0)
    assert (ev.freed, ev.aux, ev.backups) == (3, 1, [(3, 1)])
    assert (m.stats.backups, m.stats.backup_tokens, m.stats.demote_tokens) == (1, 3, 3)
    assert (m.hy.state_backups, m.hy.state_evictions) == (1, 1)
    assert m.evict(3, 0).backups == []  # nothing left to evict
    s = SWATree(device_capacity=16, swa_capacity=16, sliding_window=2, host_capacity=16,
                swa_host_capacity=16)
    s.insert([1, 2, 3])
    log = s.evict(3, 0).backups
    assert sum(f for f, _ in log) == 3 and sum(a for _, a in log) == s.hy.swa_backup_tokens == 3
    assert s.stats.backups == len(log)
