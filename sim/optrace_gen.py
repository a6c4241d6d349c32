"""Seeded random op-traces of the kind shared/conformance/g*.jsonl holds.

Token sequences come from a small alphabet and reuse earlier sequences' prefixes, so
walks split nodes, hit host-only tails and fight over a tight host pool. A shadow
``Tree`` keeps the trace free of errors, as the reference generator's traces are:
an insert that would not fit is preceded by the device eviction that makes room.
"""

from __future__ import annotations

import random

from sim.tree import Tree, TreeError

# Op mix of the long conformance case g20 (2000 ops).
DEFAULT_MIX = {
    "insert": 526, "evict_device": 299, "evict_host": 273, "match": 237,
    "load_back": 220, "dump": 0, "lock": 37,
}


def generate(
    n_ops: int,
    *,
    seed: int = 0,
    page_size: int = 1,
    device_capacity: int = 48,
    host_capacity: int = 24,
    write_policy: str = "write_back",
    alphabet: int = 11,
    max_len: int = 10,
    mix: dict | None = None,
) -> list[dict]:
    """Return a list of op dicts, header first."""
    rng = random.Random(seed)
    mix = dict(DEFAULT_MIX if mix is None else mix)
    kinds, weights = zip(*mix.items())
    header = {"op": "header", "page_size": page_size, "device_capacity": device_capacity,
              "host_capacity": host_capacity, "write_policy": write_policy,
              "load_back_threshold": 1, "seed": seed}
    shadow = Tree(device_capacity=device_capacity, host_capacity=host_capacity,
                  page_size=page_size, write_policy=write_policy, load_back_threshold=1)
    seqs: list[list[int]] = []
    ops = [header]
    loads: list[str] = []
    locks: list[str] = []
    shadow_locks: dict = {}
    serial = 0

    def units(tokens):
        if page_size == 1:
            return list(tokens)
        n = len(tokens) - len(tokens) % page_size
        return [tuple(tokens[i:i + page_size]) for i in range(0, n, page_size)]

    def tokens():
        if seqs and rng.random() < 0.7:
            base = rng.choice(seqs)
            cut = rng.randint(0, len(base))
            seq = base[:cut]
        else:
            seq = []
        extra = rng.randint(0 if seq else 1, max(1, max_len * page_size - len(seq)))
        seq = seq + [rng.randint(1, alphabet) for _ in range(extra)]
        seqs.append(seq)
        if len(seqs) > 64:
            seqs.pop(0)
        return seq

    def emit(op):
        ops.append(op)

    while len(ops) < n_ops + 1:
        kind = rng.choices(kinds, weights)[0]
        if loads and rng.random() < 0.45:
            lid = loads.pop(rng.randrange(len(loads)))
            shadow.finish_load_back(lid)
            emit({"op": "load_back_ack", "id": lid})
            continue
        if locks and rng.random() < 0.06:
            lid = locks.pop(rng.randrange(len(locks)))
            node = shadow_locks.pop(lid)
            shadow.dec_lock(node)
            emit({"op": "unlock", "id": lid})
            continue
        if kind == "insert":
            seq = tokens()
            key = units(seq)
            need = (len(key) - shadow.device_prefix_len(key)) * page_size
            short = need - (device_capacity - shadow.dev_used)
            if short > 0:
                shadow.evict_device(short)
                emit({"op": "evict_device", "n": short})
            try:
                shadow.insert(key)
            except TreeError:
                continue
            emit({"op": "insert", "tokens": seq})
        elif kind == "match":
            seq = tokens()
            shadow.match_prefix(units(seq))
            emit({"op": "match", "tokens": seq})
        elif kind == "evict_device":
            n = rng.randint(1, max(1, device_capacity // 3))
            shadow.evict_device(n)
            emit({"op": "evict_device", "n": n})
        elif kind == "evict_host":
            n = rng.randint(1, max(1, host_capacity // 3))
            shadow.evict_host(n)
            emit({"op": "evict_host", "n": n})
        elif kind == "load_back":
            serial += 1
            lid = f"B{serial}"
            seq = tokens()
            m = shadow.match_prefix(units(seq))
            if shadow.load_back(m, lid).ok:
                loads.append(lid)
            emit({"op": "load_back", "tokens": seq, "id": lid})
        elif kind == "lock":
            serial += 1
            lid = f"L{serial}"
            seq = tokens()
            m = shadow.match_prefix(units(seq))
            shadow.inc_lock(m.last_device)
            shadow_locks[lid] = m.last_device
            locks.append(lid)
            emit({"op": "lock", "tokens": seq, "id": lid})
        elif kind == "dump":
            emit({"op": "dump"})
        for ack in list(shadow.pending_writes):
            shadow.finish_write_through(ack)
    return ops

