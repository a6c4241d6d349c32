"""One core: the FULL conformance cases on ``HybridTree(NoComponent())``.

SGLang 0.5.23's ``UnifiedTreeCore`` with ``components=(FULL,)`` is the hybrid core
with no auxiliary component (sim/tree/components/none.py). ``sim/optrace_core.py``
replays the FULL op-traces on it; every case it can replay must give SGLang's output
lines byte for byte (data/conformance/rust: the Rust core's, on what its API shows):
the main cases, storage (L3) and buffer_only. A case it could not replay would be
named in NOT_YET with the feature it needs (none is today).
"""

import gzip
import json
import random

import pytest

from conftest import CONFORMANCE, ROOT, conformance_cases, expected_lines, replay_checked
from sim import jsonl
from sim.optrace import Replayer, read_trace
from sim.optrace_core import CoreReplayer, UnsupportedByCore, missing_features, replay
from sim.optrace_gen import generate
from sim.tree.components.none import NoComponent
from sim.tree.hybrid import HybridTree

MAIN = conformance_cases()                          # h01-h09, g01-g24
STORAGE = conformance_cases(CONFORMANCE / "storage")
BUFFER = conformance_cases(CONFORMANCE / "buffer")
# data/conformance/rust: the main cases' outputs under ids rust_server (its README)
RUST = sorted(CONFORMANCE.glob("rust/*.rust.out.jsonl.gz"))

# The cases the core cannot replay yet, and what each lacks (missing_features): none.
NOT_YET: dict = {}


def _rust_trace(out):
    return CONFORMANCE / out.name.replace(".rust.out.jsonl.gz", ".jsonl.gz")


def test_the_cases_are_there():
    assert len(MAIN) == 33 and len(STORAGE) == 46 and len(BUFFER) == 4 and len(RUST) == 33


def test_every_full_case_is_the_cores_to_replay():
    found = {}
    for case in MAIN + STORAGE + BUFFER:
        miss = missing_features(case)
        if miss:
            found[str(case.relative_to(CONFORMANCE))] = miss
    assert found == NOT_YET


@pytest.mark.parametrize("case", MAIN + STORAGE + BUFFER,
                         ids=lambda p: str(p.relative_to(CONFORMANCE)))
def test_full_case_on_the_unified_core_byte_for_byte(case):
    expected = expected_lines(case)
    got = [jsonl.dumps(out) for out in replay(case)]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g == e, f"line {json.loads(e)['i']} differs:\n core   {g[:300]}\n sglang {e[:300]}"


@pytest.mark.parametrize("case", MAIN + STORAGE + BUFFER,
                         ids=lambda p: str(p.relative_to(CONFORMANCE)))
def test_full_case_holds_the_core_invariants(case):
    for _ in replay_checked(case, CoreReplayer):
        pass  # the core's check runs inside, after every op


def test_a_hybrid_trace_is_refused_by_name():
    case = sorted((CONFORMANCE / "hybrid").glob("g01_swa*.jsonl.gz"))[0]
    assert missing_features(case) == ["hybrid trace (sim/hybrid/replay.py)"]
    with pytest.raises(UnsupportedByCore, match="hybrid trace"):
        list(replay(case))


@pytest.mark.parametrize("out", RUST, ids=lambda p: p.name.split(".")[0])
def test_full_case_on_the_unified_core_is_the_rust_core(out):
    """data/conformance/rust: the main cases on SGLang's Rust core as a started server
    holds it (ids rust_server, the Rust digest), compared on what the Rust API shows
    (sim/optrace_rust.py ``project_rust``, as tests/test_tree_core.py does for Tree)."""
    from sim.optrace_rust import project_rust

    theirs = [json.loads(line) for line in gzip.open(out, "rt")]
    ours = list(replay(_rust_trace(out), {"ids": "rust_server"}))
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert project_rust(a) == project_rust(b), f"line {i}"


@pytest.mark.parametrize("ids", ["sglang", "server", "rust", "rust_server"])
def test_id_schemes_number_as_tree_does(ids):
    """Every id scheme gives Tree's lines on the main cases (ids and digests too)."""
    from sim.optrace import replay as tree_replay

    for case in MAIN:
        assert list(replay(case, {"ids": ids})) == list(tree_replay(case, ids=ids)), case.name


def test_the_null_component_holds_nothing():
    """A FULL-only workload leaves every auxiliary slot, ledger and list empty."""
    r = CoreReplayer(read_trace(MAIN[-1]).__next__()[2])
    for idx, _, op in read_trace(MAIN[-1]):
        if idx:
            r.apply(idx, op)
    t = r.tree
    assert t.n_nodes > 0
    assert (t.aux_used, t.aux_evictable, t.aux_protected, t.aux_host_used) == (0, 0, 0, 0)
    assert t.lru.order() == [] and t.hlru.order() == []
    assert not any(x.aux or x.aux_lock or x.aux_host or x.aux_host_lock for x in t.iter_nodes())


def test_the_core_refuses_a_mid_node_prev_only_with_a_component_that_reads_it():
    """FULL alone takes a prev_prefix_len inside a node (the FULL oracle passes the
    device prefix, which may end mid-node); SWA and Mamba refuse it (bad_prev)."""
    from sim.errors import TreeError
    from sim.tree.components.swa import SWATree

    t = HybridTree(NoComponent(), device_capacity=16, aux_capacity=0, host_capacity=16)
    t.insert([1, 2, 3, 4])
    r = t.insert([1, 2, 3, 5], prev=3)
    assert (r.prefix_len, r.new) == (3, 1)
    s = SWATree(device_capacity=16, swa_capacity=16, sliding_window=2)
    s.insert([1, 2, 3, 4])
    with pytest.raises(TreeError, match="bad_prev"):
        s.insert([1, 2, 3, 5], prev=3)


# Generated traces (sim/optrace_gen.py) on both trees: the unified core and Tree
# agree op for op, under every eviction policy; seeds 10-21 run lfu under
# write_through, where an insert raises a leaf's hit count (lfu's priority) and Tree's
# kept leaf heap must re-push it (sim.policies.eviction READS_HIT_COUNT), as SGLang's
# heap, built at each eviction's start (full.py ``_evict_device_start``), sees it.
@pytest.mark.parametrize("seed", range(22))
def test_generated_traces_agree_with_tree(seed):
    ps = (1, 2, 4, 1)[seed % 4]
    wp = "write_through" if seed % 3 == 2 or seed >= 10 else "write_back"
    ops = generate(300, seed=seed, page_size=ps, device_capacity=32 * ps,
                   host_capacity=(16, 24, 64)[seed % 3] * ps, write_policy=wp,
                   mix={"insert": 500, "evict_device": 300, "evict_host": 270, "match": 230,
                        "load_back": 220, "dump": 40, "lock": 60})
    policy = "lfu" if seed >= 10 else ("lru", "fifo", "mru", "filo", "priority")[seed % 5]
    header = dict(ops[0], eviction_policy=policy,
                  host_policy=("duplicate_first", "lru")[seed % 2])
    a, b = Replayer(header), CoreReplayer(header)
    for i, op in enumerate(ops[1:], 1):
        if i % 37 == 0:
            op = dict(op, reserved=ps * (i % 5))
        if op["op"] == "insert" and i % 3 == 0:
            op = dict(op, priority=i % 4)
        assert a.apply(i, op) == b.apply(i, op), f"op {i} {op}"


ONE_CORE = ROOT / "tests" / "data" / "one_core"


def test_lfu_write_through_follows_sglang():
    """tests/data/one_core: SGLang's outputs for an lfu write_through trace; the core
    reproduces every line."""
    case = ONE_CORE / "lfu_wt_s5.jsonl.gz"
    assert [jsonl.dumps(out) for out in replay(case)] == expected_lines(case)


def test_tree_lfu_write_through_follows_sglang():
    """Tree on the same trace: its kept heap re-pushes a leaf whose hit count an insert
    raised (it diverged from op 11 before)."""
    from sim.optrace import replay_lines

    case = ONE_CORE / "lfu_wt_s5.jsonl.gz"
    assert list(replay_lines(case)) == expected_lines(case)


@pytest.mark.parametrize("seed", range(6))
def test_host_allocation_failures_agree_with_tree(seed):
    """docs/OPTRACE.md §4 (no vendored case has them): a failed backup's drop
    fallback, drop_host events sorted by path, a write_through chain cut short."""
    rng = random.Random(seed)
    ps = (1, 2, 4)[seed % 3]
    ops = generate(300, seed=seed, page_size=ps, device_capacity=32 * ps,
                   host_capacity=(16, 64, 128)[seed % 3] * ps,
                   write_policy=("write_back", "write_through")[seed % 2],
                   mix={"insert": 500, "evict_device": 300, "evict_host": 100, "match": 230,
                        "load_back": 220, "dump": 40, "lock": 60})
    fails = sorted({(rng.randint(1, 300), rng.randint(0, 1)) for _ in range(150)})
    header = dict(ops[0], host_alloc_failures=[list(f) for f in fails])
    a, b = Replayer(header), CoreReplayer(header)
    kinds = set()
    for i, op in enumerate(ops[1:], 1):
        x = a.apply(i, op)
        assert x == b.apply(i, op), f"op {i} {op}"
        kinds.update(e["k"] for e in x["events"])
    assert {"drop", "drop_host"} <= kinds or seed % 2


# What an engine reads of a FULL eviction besides ``freed`` (sim.tree.results): of a
# host eviction, the reclaim's two passes, the LRU walk's tokens and the stale entries
# swept; of a device eviction, the tokens demoted, deleted and dropped (with their
# host-only subtrees' host tokens), the declined drops and each blocking backup.
# ``scanned`` is left out: the core charges a scan of the whole duplicate map per call
# (components/full.py ``drive_host_eviction``), Tree the entries the reclaim visited.
_HOST = ("freed", "reclaimed_pass1", "reclaimed_pass2", "lru_evicted", "swept")
_DEVICE = ("freed", "demoted", "deleted", "dropped", "dropped_host", "declined",
           "backups_failed")


def _host_breakdown(he):
    return [getattr(he, name) for name in _HOST]


def _device_breakdown(ev):
    # the core's backups are (FULL tokens, the component's host units): none here
    backups = [b[0] if isinstance(b, tuple) else b for b in ev.backups]
    return [getattr(ev, name) for name in _DEVICE] + [backups] + _host_breakdown(ev.host)


@pytest.mark.parametrize("seed", range(8))
def test_eviction_breakdown_agrees_with_tree(seed):
    ps = (1, 2, 4, 1)[seed % 4]
    wp = ("write_back", "write_through")[seed % 4 == 3]
    ops = generate(300, seed=100 + seed, page_size=ps, device_capacity=32 * ps,
                   host_capacity=(16, 24, 64)[seed % 3] * ps, write_policy=wp,
                   mix={"insert": 500, "evict_device": 300, "evict_host": 270, "match": 230,
                        "load_back": 220, "dump": 40, "lock": 60})
    header = dict(ops[0], host_policy=("duplicate_first", "lru")[seed % 2])
    a, b = Replayer(header), CoreReplayer(header)
    seen = dict.fromkeys(_HOST + _DEVICE, 0)
    for i, op in enumerate(ops[1:], 1):
        kind, n = op["op"], op.get("n", 0)
        if kind == "evict_host" and n > 0:
            x, y = _host_breakdown(a.tree.evict_host(n)), \
                _host_breakdown(b.storage.tree.evict_host(n))
            names = _HOST
        elif kind == "evict_device" and n > 0:
            x, y = _device_breakdown(a.tree.evict_device(n)), _device_breakdown(b.tree.evict(n))
            names = _DEVICE
        else:
            assert a.apply(i, op) == b.apply(i, op), f"op {i} {op}"
            continue
        assert y == x, f"op {i} {op}: Tree {x}, core {y}"
        for name, v in zip(names, y):
            seen[name] += v
        assert (a.tree.dev_used, a.tree.host_used, a.tree.digest) == \
            (b.tree.dev_used, b.tree.host_used, b.tree.digest), f"op {i} {op}"
    # every part is exercised (duplicate_first reclaims, lru does not; write_through
    # deletes unbacked victims, write_back demotes and drops them)
    assert seen["lru_evicted"] > 0 and seen["demoted"] > 0
    if seed % 2 == 0:
        assert seen["reclaimed_pass1"] + seen["reclaimed_pass2"] > 0
    if wp == "write_through":
        assert seen["deleted"] > 0
