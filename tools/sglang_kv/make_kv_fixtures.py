"""KV-event fixtures from SGLang 0.5.23's own code.

Run in the tree-core oracle venv:

    /tmp/sglang-oracle-venv/bin/python tools/sglang_kv/make_kv_fixtures.py rust TRACE... -o data/kv_events
    /tmp/sglang-oracle-venv/bin/python tools/sglang_kv/make_kv_fixtures.py decode EVENTS.msgpack -o OUT.json
    /tmp/sglang-oracle-venv/bin/python tools/sglang_kv/make_kv_fixtures.py hashes -o data/kv_events/hashes.json
    /tmp/sglang-oracle-venv/bin/python tools/sglang_kv/make_kv_fixtures.py v2 RANK0.jsonl.gz -o data/kv_events/engine

``rust``: replays each op-trace on SGLang's Rust tree core (the shared oracle's
RustOracle, built with ``enable_kv_cache_events=True``) and writes, per op, the events
its ``take_events`` returned, as (type, block_hashes, parent_block_hash, token_ids,
block_size, medium) like ../shared/oracle/rust/kv_compare.py compares them; the
Python core's events are checked equal on the way (as kv_compare.py does).

``decode``: reads a ``run --kv-events`` file (a stream of msgpack payloads, one per
published batch) with SGLang's own decoder (``msgspec.msgpack.Decoder(KVEventBatch)``,
disaggregation/kv_events.py), re-encodes each batch with SGLang's encoder
(``msgspec.msgpack.Encoder``, as ``ZmqEventPublisher._publisher_thread`` does) and
writes the decoded batches plus whether every re-encoding equals the bytes read.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path

SHARED = Path(os.environ.setdefault("HICACHE_SGLANG_ORACLE", "/work/shared/oracle"))


def _norm(evs):
    out = []
    for e in evs:
        d = {"t": type(e).__name__}
        for k in ("block_hashes", "parent_block_hash", "token_ids", "block_size", "medium"):
            if hasattr(e, k):
                v = getattr(e, k)
                d[k] = v.value if hasattr(v, "value") else (list(v) if isinstance(v, (list, tuple)) else v)
        out.append(d)
    return out


def rust(paths, out: Path):
    sys.path.insert(0, str(SHARED / "rust"))
    sys.path.insert(0, str(SHARED))
    import compare  # noqa: F401  (the shared rust folder's helpers)
    import oracle as py_oracle
    import oracle_rust
    out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        lines = [l for l in compare.read_lines(path) if l.strip()]
        header = json.loads(lines[0])
        po = py_oracle.Oracle(header)
        po.core.kv_events.enabled = True
        ro = oracle_rust.RustOracle(header)
        recs = []
        for i, l in enumerate(lines[1:], 1):
            op = json.loads(l)
            po.apply(op)
            pe = _norm(po.core.take_events())
            ro.apply(op)
            qe = _norm(ro.last_kv)
            assert pe == qe, f"{path}: op {i}: the two cores differ"
            recs.append(json.dumps({"i": i, "events": qe}, separators=(",", ":")))
        name = Path(path).name.replace(".jsonl.gz", "").replace(".jsonl", "")
        with gzip.GzipFile(out / f"{name}.rust_events.jsonl.gz", "wb", mtime=0) as f:
            f.write(("\n".join(recs) + "\n").encode())
        print(name, len(recs), "ops", sum(len(json.loads(r)["events"]) for r in recs), "events")


def _skip(b: bytes, i: int) -> int:
    """The end of the msgpack object at ``i`` (the file is payloads back to back)."""
    t = b[i]
    be = int.from_bytes
    if t <= 0x7f or t >= 0xe0 or t in (0xc0, 0xc2, 0xc3):
        return i + 1
    if 0x80 <= t <= 0x8f:
        j = i + 1
        for _ in range(2 * (t & 0x0f)):
            j = _skip(b, j)
        return j
    if 0x90 <= t <= 0x9f:
        j = i + 1
        for _ in range(t & 0x0f):
            j = _skip(b, j)
        return j
    if 0xa0 <= t <= 0xbf:
        return i + 1 + (t & 0x1f)
    fixed = {0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8, 0xd0: 1, 0xd1: 2, 0xd2: 4, 0xd3: 8,
             0xca: 4, 0xcb: 8}
    if t in fixed:
        return i + 1 + fixed[t]
    strs = {0xd9: 1, 0xda: 2, 0xdb: 4, 0xc4: 1, 0xc5: 2, 0xc6: 4}
    if t in strs:
        n = strs[t]
        return i + 1 + n + be(b[i + 1:i + 1 + n], "big")
    conts = {0xdc: (2, 1), 0xdd: (4, 1), 0xde: (2, 2), 0xdf: (4, 2)}
    if t in conts:
        n, k = conts[t]
        j = i + 1 + n
        for _ in range(k * be(b[i + 1:i + 1 + n], "big")):
            j = _skip(b, j)
        return j
    raise ValueError(f"msgpack type byte {t:#x} at {i}: not in a KV event batch")


def decode(path: Path, out: Path):
    import msgspec
    from sglang.srt.disaggregation.kv_events import KVEventBatch
    dec = msgspec.msgpack.Decoder(KVEventBatch)
    enc = msgspec.msgpack.Encoder()
    data = path.read_bytes()
    batches, same = [], True
    pos = 0
    while pos < len(data):
        end = _skip(data, pos)
        raw = data[pos:end]
        pos = end
        b = dec.decode(raw)
        same &= enc.encode(b) == raw
        batches.append({"ts": b.ts, "attn_dp_rank": b.attn_dp_rank,
                        "events": [{"t": type(e).__name__, **msgspec.structs.asdict(e)}
                                   for e in b.events]})
    json.dump({"source": path.name, "batches": batches, "reencoded_identical": same},
              open(out, "w"), indent=None, separators=(",", ":"))
    print(len(batches), "batches; re-encoded identical:", same)


def v2(paths, out: Path):
    """An engine-recorded op-trace (``run --record-ops``: v2, write acks, ``reserved``,
    ``ids``) on SGLang's Python tree core through the project's V2 oracle
    (tools/sglang_oracle/oracle_v2.py), its KV-event recorder on: per op, the events
    ``take_events`` returns (the Python core's equal the Rust core's:
    ../shared/oracle/rust/README.md)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sglang_oracle"))
    import oracle_v2
    out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            lines = [json.loads(x) for x in f if x.strip()]
        o = oracle_v2.V2Oracle(lines[0])
        o.core.kv_events.enabled = True
        recs = []
        for op in lines[1:]:
            # the engine's output pages have negative ids, which SGLang's page hash
            # refuses; sim.kvevents.token_id stands them for 2**63 + t (a bijection:
            # the tree is the same)
            if "tokens" in op:
                op["tokens"] = [t if t >= 0 else t + (1 << 63) for t in op["tokens"]]
        for i, op in enumerate(lines[1:], 1):
            r = o.apply_ext(i, op)
            assert "error" not in r, (path, i, r)
            recs.append(json.dumps({"i": i, "events": _norm(o.core.take_events())},
                                   separators=(",", ":")))
        name = Path(path).name.split(".")[0]
        with gzip.GzipFile(out / f"{name}.sglang_events.jsonl.gz", "wb", mtime=0) as f:
            f.write(("\n".join(recs) + "\n").encode())
        print(name, len(recs), "ops", sum(len(json.loads(r)["events"]) for r in recs), "events")


def hashes(out: Path):
    """SGLang's page hashes (get_hash_str + hash_str_to_int64, mem_cache/utils.py) of a
    few token chains, narrow and wide (an id above 2**32 - 1), page sizes 1, 2 and 4."""
    from sglang.srt.mem_cache.utils import get_hash_str, hash_str_to_int64
    cases = []
    for page, toks in ((1, [1, 2, 3]), (2, [5, 5, 7, 7, 9, 9]), (4, [0, 1, 2, 3, 4294967295] * 2),
                       (2, [3, 3, (1 << 63) - 17, (1 << 63) - 17, 8, 8]),
                       (4, [(1 << 63) - 1 - 5 * (1 << 32)] * 4 + [11] * 4)):
        hs = get_hash_str(toks, None, page_size=page)
        cases.append({"page_size": page, "tokens": toks, "hashes": [hash_str_to_int64(h) for h in hs]})
    json.dump(cases, open(out, "w"), indent=1)
    print(len(cases), "hash cases")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("rust", "v2", "decode", "hashes"))
    ap.add_argument("paths", nargs="*")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    if a.mode == "rust":
        rust(a.paths, Path(a.out))
    elif a.mode == "v2":
        v2(a.paths, Path(a.out))
    elif a.mode == "hashes":
        hashes(Path(a.out))
    else:
        decode(Path(a.paths[0]), Path(a.out))


main()
