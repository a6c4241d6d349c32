"""`run --kv-events`: SGLang 0.5.23's KV cache events out, in its wire format.

Fixtures, all from SGLang's own code (tools/sglang_kv/make_kv_fixtures.py):
* data/kv_events/rust/*.rust_events.jsonl.gz: per op of each conformance op-trace, the
  events the Rust tree core's take_events returned (the Python core's were equal);
* data/kv_events/quickstart_25.*: a run's event file and SGLang's decoding of it
  (msgspec Decoder(KVEventBatch)), whose re-encoding by SGLang's encoder gave the
  same bytes;
* data/kv_events/hashes.json: SGLang's page hashes (get_hash_str, hash_str_to_int64).
"""

import gzip
import json
import subprocess
import sys

import msgpack
import pytest

from conftest import ROOT, conformance_cases
from sim.kvevents import BlockHasher, KvReplayer, Recorder, hash_to_int64

KV = ROOT / "data" / "kv_events"
CLI = [sys.executable, str(ROOT / "cli.py")]


def _norm(evs):
    out = []
    for e in evs:
        d = {"t": e["type"]}
        if e["type"] == "BlockStored":
            d.update(block_hashes=e["block_hashes"], parent_block_hash=e["parent_block_hash"],
                     token_ids=e["token_ids"], block_size=e["block_size"], medium=e["medium"])
        elif e["type"] == "BlockRemoved":
            d.update(block_hashes=e["block_hashes"], medium=e["medium"])
        out.append(d)
    return out


CASES = [c for c in conformance_cases() if (KV / "rust" / c.name.replace(
    ".jsonl.gz", ".rust_events.jsonl.gz")).exists()]


def test_every_conformance_trace_has_rust_events():
    assert len(CASES) == len(conformance_cases()) >= 30


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name.replace(".jsonl.gz", ""))
def test_events_equal_the_rust_cores_op_by_op(case):
    lines = [json.loads(x) for x in gzip.open(case, "rt") if x.strip()]
    exp = [json.loads(x) for x in gzip.open(
        KV / "rust" / case.name.replace(".jsonl.gz", ".rust_events.jsonl.gz"), "rt")]
    rep = KvReplayer(lines[0])
    for i, op in enumerate(lines[1:], 1):
        rep.apply(i, op)
        got = _norm(rep.kv.take())
        assert got == exp[i - 1]["events"], f"op {i} ({op['op']})"
    assert len(exp) == len(lines) - 1


def test_rust_fixtures_cover_every_event_kind():
    kinds = set()
    for p in (KV / "rust").glob("*.gz"):
        for x in gzip.open(p, "rt"):
            for e in json.loads(x)["events"]:
                kinds.add((e["t"], e.get("medium")))
    assert {("BlockStored", "GPU"), ("BlockStored", "CPU_PINNED"), ("BlockRemoved", "GPU"),
            ("BlockRemoved", "CPU_PINNED")} <= kinds


def test_page_hashes_are_sglangs_narrow_and_wide():
    for case in json.loads((KV / "hashes.json").read_text()):
        ps, toks = case["page_size"], case["tokens"]
        pages = [tuple(toks[i:i + ps]) for i in range(0, len(toks), ps)]
        got = [hash_to_int64(d) for d in BlockHasher().chain(pages)]
        assert got == case["hashes"], case


def test_recorder_coalesces_a_chain_and_splits_on_medium():
    r = Recorder(1)
    r.store([1, 2], 2, "GPU")
    r.store([1, 2, 3], 1, "GPU")  # its parent is the tail's last block: one event
    r.store([1, 2, 3], 1, "CPU_PINNED")
    q = r.take()
    assert [len(e["block_hashes"]) for e in q] == [3, 1]
    assert q[0]["token_ids"] == [1, 2, 3] and q[0]["parent_block_hash"] is None
    assert q[1]["parent_block_hash"] == q[0]["block_hashes"][1]


def _batches(data: bytes):
    u = msgpack.Unpacker(raw=False, strict_map_key=False)
    u.feed(data)
    return list(u)


def test_run_writes_what_sglang_decodes(tmp_path):
    out = tmp_path / "ev.msgpack"
    p = subprocess.run(CLI + ["run", str(ROOT / "scenarios" / "quickstart.yaml"), "--set",
                              "workload.num_requests=25", "-o", str(tmp_path / "r"),
                              "--kv-events", str(out), "--quiet"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    data = out.read_bytes()
    # byte for byte the file SGLang decoded and re-encoded identically
    assert data == (KV / "quickstart_25.kv.msgpack").read_bytes()
    dec = json.loads(gzip.open(KV / "quickstart_25.sglang_decoded.json.gz", "rt").read())
    assert dec["reencoded_identical"] is True
    ours = _batches(data)
    assert len(ours) == len(dec["batches"]) > 10
    for b, s in zip(ours, dec["batches"]):
        ts, events, dp = b
        assert ts == s["ts"] and dp == s["attn_dp_rank"] == 0
        assert len(events) == len(s["events"])
        for e, f in zip(events, s["events"]):
            assert e["type"] == f["t"]
            for k, v in e.items():
                if k != "type":
                    assert f[k] == v, (k, e, f)
    # a batch per iteration, in time order; stores on both tiers, removes on the device
    assert [b[0] for b in ours] == sorted(b[0] for b in ours)
    kinds = {(e["type"], e.get("medium")) for b in ours for e in b[1]}
    assert ("BlockStored", "GPU") in kinds and ("BlockStored", "CPU_PINNED") in kinds


def test_events_follow_the_tree(tmp_path):
    """Replaying the batches as a router would: every removal names a block stored on
    that medium before and not removed since."""
    data = (KV / "quickstart_25.kv.msgpack").read_bytes()
    live = {"GPU": set(), "CPU_PINNED": set()}
    for _ts, events, _dp in _batches(data):
        for e in events:
            if e["type"] == "BlockStored":
                live[e["medium"]].update(e["block_hashes"])
            elif e["type"] == "BlockRemoved":
                for h in e["block_hashes"]:
                    assert h in live[e["medium"]], (e["medium"], h)
                    live[e["medium"]].discard(h)


def test_kv_events_refused_on_a_hybrid(tmp_path):
    p = subprocess.run(CLI + ["run", str(ROOT / "scenarios" / "hybrid_swa.yaml"), "-o",
                              str(tmp_path / "r"), "--kv-events", str(tmp_path / "e")],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "hybrid" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_zmq_config_is_checked_in_one_line(tmp_path):
    for cfg, words in (('{"publisher": "zmq", "endpoint": "tcp://*:5557"}', "loopback"),
                       ('{"publisher": "zmq", "endpoint": "tcp://10.0.0.1:5557"}', "loopback"),
                       ('{"publisher": "null"}', "expected 'zmq'"),
                       ('{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557", "x": 1}', "key 'x'"),
                       ('{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557", "format": "dynamo"}',
                        "dynamo"),
                       ("[1]", "expected an object"), ("{", "invalid JSON")):
        p = subprocess.run(CLI + ["run", str(ROOT / "scenarios" / "quickstart.yaml"), "-o",
                                  str(tmp_path / "r"), "--kv-events-config", cfg],
                           capture_output=True, text=True, cwd=ROOT)
        assert p.returncode == 2 and words in p.stderr, (cfg, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "r").exists()  # refused before the run


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_zmq_publisher_sends_the_files_batches_as_sglangs_publisher_frames(tmp_path):
    """With pyzmq: a subscriber on loopback gets (topic, sequence, payload) frames whose
    payloads are the file's batches, in order. Without it: the one-line refusal."""
    import importlib.util
    import threading

    port = _free_port()
    cfg = json.dumps({"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}", "bind": True,
                      "topic": "kv"})
    args = CLI + ["run", str(ROOT / "scenarios" / "quickstart.yaml"), "--set",
                  "workload.num_requests=25", "-o", str(tmp_path / "r"), "--quiet",
                  "--kv-events", str(tmp_path / "ev"), "--kv-events-config", cfg,
                  "--kv-events-wait", "60"]
    if importlib.util.find_spec("zmq") is None:
        p = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
        assert p.returncode == 2 and "found no pyzmq" in p.stderr
        return
    import zmq
    got = []
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    want = len(_batches((KV / "quickstart_25.kv.msgpack").read_bytes()))

    def listen():
        import time
        while True:  # connect once the publisher has bound (it waits for us)
            try:
                sub.connect(f"tcp://127.0.0.1:{port}")
                break
            except zmq.ZMQError:
                time.sleep(0.05)
        while len(got) < want:
            if not sub.poll(60_000):
                return
            got.append(sub.recv_multipart())

    t = threading.Thread(target=listen)
    t.start()
    out, err = proc.communicate(timeout=300)
    t.join(timeout=120)
    sub.close(linger=0)
    ctx.term()
    assert proc.returncode == 0, err
    file_batches = _batches((tmp_path / "ev").read_bytes())
    assert len(got) == len(file_batches) == want
    for seq, (topic, seq_b, payload) in enumerate(got):
        assert topic == b"kv" and int.from_bytes(seq_b, "big") == seq
        assert _batches(payload) == [file_batches[seq]]


def test_an_imported_dumps_events_carry_its_tokens_and_sglangs_hashes(tmp_path):
    """`import` then `run --kv-events`: the prompt pages' events hold the dump's own
    token ids, and their block hashes are the ones SGLang computes for those tokens
    (data/dumps/crash_dump_tp8.expected.json: get_hash_str + hash_str_to_int64)."""
    dumps = ROOT / "data" / "dumps"
    exp = json.loads((dumps / "crash_dump_tp8.expected.json").read_text())
    imp, ev = tmp_path / "imp", tmp_path / "ev"
    for args in (["import", str(dumps / "crash_dump_tp8.pkl"), "-o", str(imp)],
                 ["run", str(imp / "scenario.yaml"), "-o", str(tmp_path / "r"), "--quiet",
                  "--kv-events", str(ev)]):
        p = subprocess.run(CLI + args, capture_output=True, text=True, cwd=ROOT)
        assert p.returncode == 0, p.stderr
    want = {}  # SGLang's hash of each prompt page -> that page's tokens
    for r in exp["requests"]:
        ids = r["input_ids"]
        for i, h in enumerate(r["page_hashes"]):
            want[h] = ids[i * 16:(i + 1) * 16]
    stored = {}
    for _ts, events, _dp in _batches(ev.read_bytes()):
        for e in events:
            if e["type"] == "BlockStored" and e["medium"] == "GPU":
                for k, h in enumerate(e["block_hashes"]):
                    stored[h] = e["token_ids"][k * 16:(k + 1) * 16]
    prompt = {h: t for h, t in stored.items() if h in want}
    # every prompt page the tree stored is published under SGLang's hash, with its tokens
    assert len(prompt) == len(set(want)) and all(prompt[h] == want[h] for h in prompt)
    # the remaining stores are output pages (the op-trace's tokens: ids of 2**63 + u)
    assert all(min(t) >= 2**32 for h, t in stored.items() if h not in want)


def test_an_engine_recorded_op_trace_gives_sglangs_events_op_by_op():
    """rank 0's op-trace of a quickstart run (run --record-ops: v2, write acks, reserved,
    server ids) replayed on SGLang's own tree core with its KV-event recorder on
    (make_kv_fixtures.py v2): the same events, op for op, as the run's file holds."""
    eng = KV / "engine"
    lines = [json.loads(x) for x in gzip.open(eng / "quickstart_25_rank0.jsonl.gz", "rt") if x.strip()]
    exp = [json.loads(x) for x in gzip.open(eng / "quickstart_25_rank0.sglang_events.jsonl.gz", "rt")]
    rep = KvReplayer(lines[0])
    n = 0
    for i, op in enumerate(lines[1:], 1):
        rep.apply(i, op)
        got = _norm(rep.kv.take())
        assert got == exp[i - 1]["events"], f"op {i} ({op['op']})"
        n += len(got)
    file_events = sum(len(b[1]) for b in _batches((KV / "quickstart_25.kv.msgpack").read_bytes()))
    assert len(exp) == len(lines) - 1 and n == file_events > 0


def test_each_dp_instance_publishes_its_own_tree(tmp_path):
    out = tmp_path / "ev"
    p = subprocess.run(CLI + ["run", str(ROOT / "scenarios" / "quickstart.yaml"), "--set", "dp=2",
                              "--set", "workload.num_requests=60", "-o", str(tmp_path / "r"),
                              "--kv-events", str(out), "--quiet"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    batches = _batches(out.read_bytes())
    assert {b[2] for b in batches} == {0, 1}
    assert [b[0] for b in batches] == sorted(b[0] for b in batches)
    for dp in (0, 1):
        live = {"GPU": set(), "CPU_PINNED": set()}
        for _ts, events, r in batches:
            if r != dp:
                continue
            for e in events:
                if e["type"] == "BlockStored":
                    live[e["medium"]].update(e["block_hashes"])
                else:
                    assert set(e["block_hashes"]) <= live[e["medium"]]
                    live[e["medium"]] -= set(e["block_hashes"])
