"""`cache.tree_core`: the Rust core a default 0.5.23 server runs against the Python one.

* The vendored Rust-core replays (data/conformance/rust/, SGLang's RustUnifiedTreeCore
  as a started server holds it, tools/sglang_oracle/make_rust_cases.py) are what
  ``replay-ops`` writes under ``ids: rust_server``, on the shared Rust oracle's
  projection, digest raw.
* On every conformance case (vendored and shared) both cores make the same decisions:
  the outputs differ only in ids and the digest, and exactly as SGLang's rules say
  (Rust: root 1, first node 2 after the server's second reset, digest event
  ``3 * (id + 1)``; Python server: root 5, first node 10, ``id + 1``).
* A scenario records under the core it runs: the op-trace header names the scheme.
"""

import gzip
import json

import pytest
from conftest import ROOT, vendored_checksums_match

from sim import constants as C
from sim.optrace import replay, replay_lines
from sim.optrace_rust import project_rust
from sim.tree import Tree

DATA = ROOT / "data" / "conformance"
RUST = DATA / "rust"
SHARED = ROOT.parent.parent / "shared" / "conformance"
RUST_CASES = sorted(RUST.glob("*.rust.out.jsonl.gz"))


def _case_trace(out: "object"):
    return DATA / out.name.replace(".rust.out.jsonl.gz", ".jsonl.gz")


def test_vendored_rust_cases_cover_every_full_case():
    vendored_checksums_match(RUST)
    full = {p.name for p in DATA.glob("*.jsonl.gz") if not p.name.endswith(".out.jsonl.gz")}
    assert {_case_trace(p).name for p in RUST_CASES} == full and len(full) >= 30


@pytest.mark.parametrize("out", RUST_CASES, ids=lambda p: p.name.split(".")[0])
def test_replay_ops_is_the_rust_core(out):
    with gzip.open(out, "rt") as f:
        theirs = [json.loads(line) for line in f]
    ours = [json.loads(line) for line in replay_lines(_case_trace(out), ids="rust_server")]
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert project_rust(a) == project_rust(b), f"line {i}"


def _traces():
    shared = sorted(p for p in SHARED.glob("*.jsonl") if not p.name.endswith(".out.jsonl"))
    vendored = sorted(p for p in DATA.glob("*.jsonl.gz") if not p.name.endswith(".out.jsonl.gz"))
    return vendored + shared


def _shift_ids(rec: dict, by: int, root: int = 0, to_root: int = 0) -> dict:
    """``rec`` with every node id moved by ``by`` (the root ``root`` becomes
    ``to_root``), its digest left out."""
    def f(x):
        return to_root if x == root else x + by

    r = json.loads(json.dumps(rec))
    for e in r.get("events", ()):
        for k in ("id", "child"):
            if isinstance(e.get(k), int):
                e[k] = f(e[k])
    for k in ("node", "anchor"):
        if isinstance(r.get(k), int):
            r[k] = f(r[k])
    for n in r.get("tree", ()):
        n["id"], n["parent"] = f(n["id"]), f(n["parent"])
    for k in ("duplicates", "d_leaves", "h_leaves"):
        if k in r:
            r[k] = [f(x) for x in r[k]]
    r.pop("digest", None)
    return r


def _digest(ids: list, stride: int) -> int:
    d = 0
    for i in ids:
        d = (d * C.DIGEST_MULTIPLIER + (i + 1) * stride) & C.DIGEST_MASK
    return d


@pytest.mark.parametrize("trace", _traces(), ids=lambda p: p.name.split(".")[0] + p.suffix)
def test_both_cores_decide_alike_and_digest_by_their_rules(trace):
    py = list(replay(trace, ids="server"))
    rs = list(replay(trace, ids="rust_server"))
    # Python server: first node 10; Rust server: first node 2
    shift = (1 + C.SENTINEL_IDS_PER_COMPONENT) * 2 - 2 * C.RUST_SERVER_ROOTS_BEFORE
    assert shift == 8
    reclaimed_py, reclaimed_rs = [], []
    for i, (a, b) in enumerate(zip(py, rs)):
        assert _shift_ids(b, shift, C.RUST_SERVER_ROOTS_BEFORE,
                          C.SENTINEL_IDS_PER_COMPONENT + 1) == _shift_ids(a, 0, -1), f"line {i}"
        reclaimed_py += [e["id"] for e in a.get("events", ()) if e["k"] == "dup_reclaim"]
        reclaimed_rs += [e["id"] for e in b.get("events", ()) if e["k"] == "dup_reclaim"]
        assert a.get("digest") == _digest(reclaimed_py, 1), f"line {i}"
        assert b.get("digest") == _digest(reclaimed_rs, C.RUST_COMPONENT_TYPES), f"line {i}"
    assert len(py) == len(rs)


def test_bare_cores_share_ids_and_the_rust_digest_is_three_times():
    """Same ids (optrace numbering = a bare Rust core): by linearity the Rust digest is
    3x the Python one mod 2^42 (shared/oracle/rust/README.md, measured over ~300k ops)."""
    seen = 0
    for trace in _traces():
        for a, b in zip(replay(trace, ids="optrace"), replay(trace, ids="rust")):
            assert b.get("digest") == (3 * a.get("digest", 0)) & C.DIGEST_MASK
            seen += a.get("digest", 0) != 0
    assert seen > 0


def test_rust_server_tree_numbers_from_two():
    t = Tree(device_capacity=16, host_capacity=16, ids="rust_server")
    assert t.root.id == 1
    ins = t.insert([1, 2, 3])
    assert ins is not None and max(n.id for n in t.root.children.values()) == 2


@pytest.mark.parametrize("core, ids", [("rust", "rust_server"), ("python", "server")])
def test_record_ops_names_the_core(tmp_path, core, ids):
    from sim.runner import run_scenario
    from sim.scenario import load_scenario

    scn = load_scenario(str(ROOT / "scenarios" / "quickstart.yaml"),
                        ["limits.max_requests=40", f"cache.tree_core={core}"])
    run_scenario(scn, None, record_ops_dir=tmp_path / "ops")
    index = json.loads((tmp_path / "ops" / "index.json").read_text())
    assert index["ids"] == ids
    header = json.loads((tmp_path / "ops" / index["traces"][0]["file"]).read_text().split("\n")[0])
    assert header["ids"] == ids
    # the replay reaches the engine's own final tree under that scheme
    last = list(replay(tmp_path / "ops" / index["traces"][0]["file"]))[-1]
    assert {k: last[k] for k in index["traces"][0]["final"]} == index["traces"][0]["final"]


def test_hybrid_default_core_is_python_and_rust_is_refused():
    from sim.errors import UserError
    from sim.scenario import load_scenario

    scn = load_scenario(str(ROOT / "scenarios" / "hybrid_swa.yaml"), [])
    assert scn.cache.tree_core == "python"
    with pytest.raises(UserError, match="cache.tree_core"):
        load_scenario(str(ROOT / "scenarios" / "hybrid_swa.yaml"), ["cache.tree_core=rust"])


def test_id_drift_needs_the_python_core():
    from sim.errors import UserError
    from sim.scenario import load_scenario

    with pytest.raises(UserError, match="jitter.id_drift"):
        load_scenario(str(ROOT / "scenarios" / "jitter_id_drift.yaml"), ["cache.tree_core=rust"])


@pytest.mark.parametrize("cls_name", ["HNode", "HostHNode"])
def test_a_node_copy_carries_every_slot(cls_name):
    """``HNode.__copy__`` lists the slots by hand (a fork copies every node): a slot
    added to a node class and left out of the copy fails here."""
    import copy

    from sim.tree import hnode

    cls = getattr(hnode, cls_name)
    x = cls(7, [1, 2], None, 1.5, 0.5)
    names = [s for k in cls.__mro__ for s in getattr(k, "__slots__", ())]
    for i, name in enumerate(names):
        setattr(x, name, object() if name in ("children", "key", "parent") else f"v{i}")
    y = copy.copy(x)
    assert type(y) is cls and y is not x
    for name in names:
        assert getattr(y, name) is getattr(x, name), name
