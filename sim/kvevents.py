"""SGLang 0.5.23's KV cache events, from a replica's op stream, in its wire format.

Routers (sgl-router, Dynamo) follow a server's cache through ``BlockStored`` /
``BlockRemoved`` / ``AllBlocksCleared`` events (disaggregation/kv_events.py). This
module produces them for a simulated replica, as SGLang's tree core does:

* **Where** (mem_cache/unified_cache/unified_tree_core.py, each ``kv_events.record_*``):
  a new node (``_add_new_node``) and a node un-evicted by an insert
  (``_unevict_node_on_insert``) store on GPU; a load-back's nodes store on GPU at
  ``commit_load_back``; a finished D->H write stores on CPU_PINNED
  (``finish_write_through``: the write_through ack, and the write_back victim's
  synchronous ack before its demote); a demote removes GPU (``_demote``); a device leaf
  without a backup removes GPU (``_delete_unbacked_device_leaf``); host-only nodes of a
  dropped subtree, host leaves evicted and host duplicates reclaimed remove CPU_PINNED
  (``_release_all_component_layers`` / ``_evict_host_leaf`` /
  ``_release_full_host_duplicate``). Splits emit nothing.
* **What** (mem_cache/events.py ``KVCacheEventRecorder``): one ``BlockStored`` per
  page, linked to its parent page's hash, and one ``BlockRemoved`` per node; each
  coalesced with a compatible queue tail (``enqueue``).
* **Hashes** (mem_cache/utils.py ``compute_node_hash_values``, ``hash_str_to_int64``;
  cpp_utils/hash_binding.cpp): SHA-256 chained page by page from the root over the
  page's token ids as little-endian uint32 (a page with an id above 2^32 - 1: a 0xff
  tag then uint64s), the event hash the digest's first 8 bytes as a signed int64. No
  namespace (no extra_key / cache_salt in a simulated request).
* **Wire** (``KVEventBatch``, msgspec msgpack): a batch is the array
  ``[ts, events, attn_dp_rank]``; an event a map with ``type`` first and its fields in
  declaration order, fields at their default omitted (``omit_defaults``). SGLang
  publishes one batch per scheduler iteration that had events
  (``SchedulerKvEventsPublisher.publish_kv_events``, at the end of each loop pass), with
  ``ts = time.time()``; here ``ts`` is the simulated time.

Token ids: a key unit ``u`` of the engine is a page of ``page_size`` copies of ``u``
(as ``sim.optrace.engine_ops_to_trace`` writes the op-trace), so the hashes are those
SGLang computes when it replays that op-trace (negative output-page ids: ``token_id``).
"""

from __future__ import annotations

import hashlib
import json
import re
import struct

import msgpack

from sim import safeio
from sim.constants import KV_MEDIUM_CPU, KV_MEDIUM_GPU
from sim.errors import UserError
from sim.optrace import Replayer
from sim.workloads import build_workload

GPU, CPU = KV_MEDIUM_GPU, KV_MEDIUM_CPU
_U32 = (1 << 32) - 1


def token_id(t: int) -> int:
    """The token id a key token stands for. The engine names output pages with
    negative ids (``sim.workloads.keys.output_key``) that SGLang's hash refuses
    (hash_binding.cpp ``checked_u32``); they map to ``2**63 + t``, a valid int64 token
    id above 2**32, so such a page takes SGLang's wide (uint64) hash and never
    collides with a prompt page."""
    return t if t >= 0 else t + (1 << 63)


def _page_bytes(tokens) -> tuple[bytes, bool]:
    if any(t > _U32 for t in tokens):
        return b"\xff" + struct.pack(f"<{len(tokens)}Q", *tokens), True
    return struct.pack(f"<{len(tokens)}I", *tokens), False


def hash_to_int64(digest: bytes) -> int:
    """``hash_str_to_int64``: the hex digest's first 16 digits as a signed int64."""
    return int.from_bytes(digest[:8], "big", signed=True)


class BlockHasher:
    """SHA-256 page chains, memoised per (prior digest, page)."""

    def __init__(self):
        self._memo: dict = {}

    def chain(self, pages) -> list[bytes]:
        out, prior = [], b""
        memo = self._memo
        for page in pages:
            key = (prior, page)
            d = memo.get(key)
            if d is None:
                data, _wide = _page_bytes(page)
                d = memo[key] = hashlib.sha256(prior + data).digest()
            out.append(d)
            prior = d
        return out


def event_map(ev: dict) -> dict:
    """The msgspec encoding of one event: ``type`` first, defaults omitted."""
    t = ev["type"]
    if t == "BlockStored":
        m = {"type": t, "block_hashes": ev["block_hashes"],
             "parent_block_hash": ev["parent_block_hash"], "token_ids": ev["token_ids"],
             "block_size": ev["block_size"], "lora_id": None}
        if ev.get("medium") is not None:
            m["medium"] = ev["medium"]
        return m
    if t == "BlockRemoved":
        m = {"type": t, "block_hashes": ev["block_hashes"]}
        if ev.get("medium") is not None:
            m["medium"] = ev["medium"]
        return m
    return {"type": "AllBlocksCleared"}


def encode_batch(ts: float, events: list, attn_dp_rank: int | None) -> bytes:
    """One ``KVEventBatch`` as SGLang's publisher encodes it."""
    return msgpack.packb([float(ts), [event_map(e) for e in events], attn_dp_rank],
                         use_bin_type=True)


class Recorder:
    """``KVCacheEventRecorder`` over paths of page units (no node objects needed).

    ``tokens``: a page unit's real token ids, where the trace gave them
    (``trace_page_tokens``); other pages are the op-trace's tokens."""

    def __init__(self, page_size: int, tokens: dict | None = None):
        self.page_size = page_size
        self.hasher = BlockHasher()
        self.queue: list = []
        self.tokens = tokens or {}

    def _pages(self, units) -> list[tuple]:
        real = self.tokens
        if self.page_size == 1:
            return [real.get(u) or (token_id(u),) for u in units]
        return [real.get(u[0]) or tuple(token_id(t) for t in u) for u in units]

    def enqueue(self, ev: dict) -> None:
        q = self.queue
        if q:
            tail = q[-1]
            if tail["type"] == ev["type"] == "BlockRemoved" and tail["medium"] == ev["medium"]:
                tail["block_hashes"].extend(ev["block_hashes"])
                return
            if (tail["type"] == ev["type"] == "BlockStored" and tail["medium"] == ev["medium"]
                    and tail["block_size"] == ev["block_size"] and tail["block_hashes"]
                    and ev["parent_block_hash"] == tail["block_hashes"][-1]):
                tail["block_hashes"].extend(ev["block_hashes"])
                tail["token_ids"].extend(ev["token_ids"])
                return
        q.append(ev)

    def store(self, path_units, node_pages: int, medium: str) -> None:
        """``record_store``: one BlockStored per page of the node (its last
        ``node_pages`` pages of ``path_units``)."""
        pages = self._pages(path_units)
        chain = self.hasher.chain(pages)
        start = len(pages) - node_pages
        parent = hash_to_int64(chain[start - 1]) if start > 0 else None
        for i in range(start, len(pages)):
            h = hash_to_int64(chain[i])
            self.enqueue({"type": "BlockStored", "block_hashes": [h], "parent_block_hash": parent,
                          "token_ids": list(pages[i]), "block_size": len(pages[i]),
                          "medium": medium})
            parent = h

    def remove(self, path_units, node_pages: int, medium: str) -> None:
        """``record_remove``: one BlockRemoved for the node's pages."""
        pages = self._pages(path_units)
        chain = self.hasher.chain(pages)
        hs = [hash_to_int64(d) for d in chain[len(pages) - node_pages:]]
        if hs:
            self.enqueue({"type": "BlockRemoved", "block_hashes": hs, "medium": medium})

    def take(self) -> list:
        q, self.queue = self.queue, []
        return q


# Tree event -> (store or remove, medium), unified_tree_core.py's record_* call sites.
_STORE = {"new": GPU, "unevict": GPU, "load": GPU, "host_new": CPU, "refill": CPU}
_REMOVE = {"demote": GPU, "delete": GPU, "drop": GPU, "drop_host": CPU, "host_evict": CPU,
           "dup_reclaim": CPU}


class KvReplayer(Replayer):
    """An op-trace replayer that also records SGLang's KV events, op by op.

    The tree's event hook is wrapped, so events are recorded in the order the tree
    makes them (the recorder's coalescing depends on it); a write's CPU store is
    recorded where SGLang's ``finish_write_through`` runs."""

    def __init__(self, header: dict, tokens: dict | None = None, **kw):
        super().__init__(header, **kw)
        self.kv = Recorder(self.page_size, tokens)
        tree = self.tree
        orig_ev = tree._ev
        orig_finish = tree.finish_write_through

        def ev(kind, node, **extra):
            orig_ev(kind, node, **extra)
            self._on_event(kind, node)

        def finish(ack_id):
            pw = tree.pending_writes.get(ack_id)
            if pw is not None:
                for x in pw.nodes:
                    self._record(x, CPU, store=True)
            orig_finish(ack_id)

        tree._ev = ev
        tree.finish_write_through = finish

    def _record(self, node, medium: str, *, store: bool) -> None:
        units = self.tree.path_units(node)
        n = len(node.key)
        (self.kv.store if store else self.kv.remove)(units, n, medium)

    def _on_event(self, kind: str, node) -> None:
        if kind in _STORE:
            self._record(node, _STORE[kind], store=True)
        elif kind in _REMOVE:
            self._record(node, _REMOVE[kind], store=False)
        elif kind == "backup" and self.tree.write.write_back:
            # write_back's victim backup, acknowledged at once before its demote
            # (writing_check(write_back=True) -> finish_write_through); a
            # write_through backup's store is recorded at its ack (``finish``).
            self._record(node, CPU, store=True)

    def apply(self, i: int, op: dict) -> dict:
        q = self.kv.queue
        mark = (len(q), len(q[-1].get("block_hashes", ())) if q else 0,
                len(q[-1].get("token_ids", ())) if q else 0)
        out = super().apply(i, op)
        if "error" in out:  # a refused op changes nothing, so SGLang's tree emits nothing
            n, nh, nt = mark
            del q[n:]
            if q:
                if "block_hashes" in q[-1]:
                    del q[-1]["block_hashes"][nh:]
                if "token_ids" in q[-1]:
                    del q[-1]["token_ids"][nt:]
        return out


def engine_batches(trace: list, ticks: list, end_time: float, attn_dp_rank: int,
                   tokens: dict | None = None):
    """(ts, events) per scheduler iteration with events, from rank 0's op-trace
    (``trace``: header + ops, as ``run --record-ops`` writes it) and the iteration
    ends ``ticks`` [(time, ops before it)]. Returns the batches and the replayer (whose
    tree the caller checks against the engine's)."""
    rep = KvReplayer(trace[0], tokens)
    ops = trace[1:]
    out = []
    done = 0
    for t, n in list(ticks) + [(end_time, len(ops))]:
        while done < n:
            rep.apply(done + 1, ops[done])
            done += 1
        evs = rep.kv.take()
        if evs:
            out.append((t, evs))
    return out, rep


_MAX_TOKEN = (1 << 63) - 1


def trace_page_tokens(scenario) -> dict | None:
    """Page unit -> its real token ids, for a generic trace whose records carry
    ``input_ids`` (what ``hicache-sim import`` writes) with ``block_size`` equal to the
    page size, so each block id is one page of the engine's key. Then the events carry
    the prompt's own tokens and SGLang's hashes of them. None for any other workload."""
    w = scenario.workload
    ps = scenario.page_size
    if getattr(w, "kind", None) != "trace" or w.format != "generic" or \
            safeio.suffix(w.path) == ".csv":
        return None
    stream = build_workload(scenario)
    raw = safeio.open_lines(w.path, "a trace file")
    out: dict = {}
    at, text = 0, b""
    try:
        for req in stream:
            line = stream.line
            if req.block_size != ps or line is None:
                return None
            while at < line:
                at, text = next(raw)
            try:
                ids = json.loads(text).get("input_ids")
            except (ValueError, AttributeError):
                ids = None
            if not (isinstance(ids, list) and len(ids) == req.input_len
                    and all(type(t) is int and 0 <= t <= _MAX_TOKEN for t in ids)):
                continue
            for i in range(min(len(ids) // ps, len(req.blocks))):
                out[req.blocks[i]] = tuple(ids[i * ps:(i + 1) * ps])
    finally:
        raw.close()
    return out or None


# --kv-events-config: SGLang's KVEventsConfig keys (disaggregation/kv_events.py), of
# which a simulated publisher honours the socket's; a loopback tcp endpoint only.
_CONFIG_KEYS = {"publisher", "endpoint", "bind", "replay_endpoint", "buffer_steps", "hwm",
                "max_queue_size", "topic", "format"}
_LOOPBACK = re.compile(r"tcp://(127\.0\.0\.1|localhost|\[::1\]):([0-9]{1,5})\Z")


def parse_zmq_config(text: str) -> dict:
    """``--kv-events-config`` JSON, as ``KVEventsConfig.from_cli`` reads it, checked."""
    where = "--kv-events-config"
    try:
        cfg = json.loads(text)
    except ValueError as err:
        raise UserError(f"found invalid JSON ({str(err)[:80]}); expected a KVEventsConfig "
                        "object such as {\"publisher\": \"zmq\", \"endpoint\": "
                        "\"tcp://127.0.0.1:5557\"}", where=where) from None
    if not isinstance(cfg, dict):
        raise UserError(f"found a JSON {type(cfg).__name__}; expected an object", where=where)
    bad = sorted(set(cfg) - _CONFIG_KEYS)
    if bad:
        raise UserError(f"found key {bad[0]!r}; expected KVEventsConfig keys "
                        f"({', '.join(sorted(_CONFIG_KEYS))})", where=where)
    if cfg.get("publisher", "null") != "zmq":
        raise UserError(f"found publisher {cfg.get('publisher', 'null')!r}; expected 'zmq'",
                        where=where)
    ep = cfg.get("endpoint", "tcp://*:5557")
    m = _LOOPBACK.match(ep) if isinstance(ep, str) else None
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise UserError(f"found endpoint {ep!r}; expected a loopback tcp endpoint "
                        "(tcp://127.0.0.1:PORT, tcp://localhost:PORT or tcp://[::1]:PORT): "
                        "simulated events never leave the machine", where=where)
    if cfg.get("replay_endpoint") is not None:
        raise UserError("found a replay_endpoint; expected none (the replay socket is not "
                        "simulated)", where=where)
    if cfg.get("format", "default") != "default":
        raise UserError(f"found format {cfg['format']!r}; expected 'default' (the dynamo "
                        "format's namespaced hashes are not produced)", where=where)
    topic, bind, hwm = cfg.get("topic", ""), cfg.get("bind"), cfg.get("hwm", 100_000)
    if not isinstance(topic, str) or not (bind is None or isinstance(bind, bool)) or \
            isinstance(hwm, bool) or not isinstance(hwm, int) or hwm < 0:
        raise UserError("found a topic, bind or hwm of the wrong type; expected a string, a "
                        "boolean and a non-negative integer", where=where)
    return {"endpoint": ep, "topic": topic, "bind": bool(bind), "hwm": hwm}


def offset_endpoint(endpoint: str, dp_rank: int) -> str:
    """``ZmqEventPublisher.offset_endpoint_port``: DP rank r publishes on port + r."""
    if dp_rank == 0:
        return endpoint
    base, _, port = endpoint.rpartition(":")
    return f"{base}:{int(port) + dp_rank}"


def publish_zmq(cfg: dict, payloads: dict, wait_s: float) -> int:
    """Send each DP rank's payloads as ``ZmqEventPublisher`` does: frames (topic,
    8-byte big-endian sequence number, payload) on its own socket, bound or connected
    as SGLang's ``bind`` says. An XPUB socket (a PUB to its subscribers) waits up to
    ``wait_s`` for the first subscription, so a subscriber misses nothing. Returns the
    messages sent."""
    try:
        import zmq
    except ImportError:
        raise UserError("found no pyzmq; expected it installed for a ZMQ publisher "
                        "(pip install pyzmq)", where="--kv-events-config") from None
    ctx = zmq.Context()
    sent = 0
    try:
        for dp in sorted(payloads):
            ep = offset_endpoint(cfg["endpoint"], dp)
            sock = ctx.socket(zmq.XPUB)
            try:
                sock.setsockopt(zmq.SNDHWM, cfg["hwm"])
                (sock.bind if cfg["bind"] else sock.connect)(ep)
                if not sock.poll(int(wait_s * 1000), zmq.POLLIN):
                    raise UserError(f"found no subscriber on {ep} within {wait_s:g} s; "
                                    "expected one (start it first, or raise --kv-events-wait)",
                                    where="--kv-events-config")
                sock.recv()  # the subscription
                topic = cfg["topic"].encode()
                for seq, payload in enumerate(payloads[dp]):
                    sock.send_multipart((topic, seq.to_bytes(8, "big"), payload))
                    sent += 1
            finally:
                sock.close(linger=int(wait_s * 1000))
    finally:
        ctx.term()
    return sent
