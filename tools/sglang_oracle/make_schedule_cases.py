#!/usr/bin/env python3
"""Waiting-queue orders from SGLang 0.5.23's own `SchedulePolicy.calc_priority`
(managers/schedule_policy.py), for data/conformance/schedule/cases.json.

Each case: sequences cached in a tree (SGLang's `RadixCache`, page size 1, inserted in
order), a waiting queue (rid, tokens, max_new_tokens) and a policy; SGLang's policy
sorts the queue in place and the case keeps the rids in its order. ``random`` is
seeded as `Scheduler.__init__` does (`set_random_seed` -> `random.seed`), with nothing
else drawing. Run in the oracle venv:

    $SGLANG_ORACLE_VENV/bin/python tools/sglang_oracle/make_schedule_cases.py [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

# sglang.srt.configs imports torchvision, which the oracle venv lacks: the shared server
# oracle's stub (only when torchvision is not importable).
_REPO = Path(__file__).resolve().parents[2]
_ORACLE = Path(os.environ.get("HICACHE_SGLANG_ORACLE") or _REPO.parent / "shared" / "oracle")
sys.path.insert(0, str(_ORACLE / "server"))
import cpu_shims  # noqa: E402

cpu_shims.install_torchvision_stub()
import sglang.srt.managers.schedule_policy as sp_mod  # noqa: E402
from sglang.srt.managers.schedule_policy import SchedulePolicy  # noqa: E402

# The runtime-context bags a server publishes at start (runtime_context.py); only the
# two fields calc_priority reads, as a default aggregated server has them.
sp_mod.get_disagg = lambda: SimpleNamespace(disaggregation_mode="null")
sp_mod.get_memory = lambda: SimpleNamespace(radix_eviction_policy="lru")
from sglang.srt.mem_cache.base_prefix_cache import InsertParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

OUT = Path(__file__).resolve().parents[2] / "data" / "conformance" / "schedule" / "cases.json"


class FakeReq(SimpleNamespace):
    """The fields `calc_priority` reads of a `Req` (schedule_batch.py)."""

    def _compute_max_prefix_len(self, input_len):
        return max(input_len - 1, 0)


def make_req(rid, tokens, max_new):
    return FakeReq(rid=rid, origin_input_ids=list(tokens), output_ids=[], extra_key=None,
                   cache_salt=None, sampling_params=SimpleNamespace(max_new_tokens=max_new),
                   priority=None, kv=SimpleNamespace(cache_protected_len=0),
                   prefix_len=0, host_hit_length=0, num_matched_prefix_tokens=0)


def seq(*parts):
    out = []
    for base, n in parts:
        out.extend(range(base, base + n))
    return out


CACHED = [seq((1000, 64)), seq((1000, 64), (2000, 40)), seq((3000, 20)), seq((4000, 100))]
QUEUES = {
    # shared prefixes of every depth, cold requests sharing a prefix among themselves
    # (in-batch prefix caching), a request matching nothing
    "mixed": [
        ("a", seq((9000, 50)), 10),
        ("b", seq((1000, 64), (2000, 40), (5000, 8)), 300),
        ("c", seq((3000, 20), (6000, 30)), 40),
        ("d", seq((7000, 40), (7100, 5)), 7),
        ("e", seq((7000, 40), (7200, 9)), 500),
        ("f", seq((1000, 64), (8000, 10)), 300),
        ("g", seq((4000, 100), (4500, 2)), 1),
        ("h", seq((7000, 40), (7300, 3)), 90),
        ("i", seq((1000, 30), (8500, 4)), 2),
    ],
    # cold requests: in-batch matches just under and at the deprioritize threshold
    "thresholds": [
        ("p", seq((7000, 31), (100, 5)), 5),
        ("q", seq((7000, 31), (200, 5)), 6),
        ("r", seq((7000, 32), (300, 5)), 7),
        ("s", seq((7000, 32), (400, 5)), 8),
        ("t", seq((3000, 20), (500, 40)), 9),
        ("u", seq((3000, 20), (500, 40), (600, 1)), 9),
    ],
    # a device match just above the check threshold skips the in-batch check
    "deep": [
        ("x", seq((4000, 33), (10, 40)), 3),
        ("y", seq((4000, 33), (10, 40), (20, 2)), 3),
        ("z", seq((4000, 100), (30, 2)), 4),
        ("w", seq((9500, 10)), 4),
    ],
}
POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random")
SEEDS = (0, 7, 26)


def build_cache():
    cache = RadixCache.create_simulated()
    for s in CACHED:
        cache.insert(InsertParams(key=RadixKey(token_ids=s),
                                  value=torch.arange(len(s), dtype=torch.int64)))
    return cache


def run(policy, queue, seed):
    cache = build_cache()
    sp = SchedulePolicy(policy, cache, False, False, False)
    reqs = [make_req(*q) for q in queue]
    random.seed(seed)
    sp.calc_priority(reqs)
    return [r.rid for r in reqs]


def rust_dfs_order(queue):
    """`dfs_weight_order` of SGLang's Rust tree core (the binding's own walk) over the
    same cached sequences, each request's last device node from its match: the engine
    sorts alike under both cores, so both must give SGLang's policy order."""
    from array import array

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import oracle_rust_v2 as V
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

    o = V.RustV2Oracle({"op": "header", "device_capacity": 1 << 20, "host_capacity": 1 << 20,
                        "page_size": 1, "ids": "rust_server", "write_policy": "write_back"})
    for s in CACHED:
        o.apply_ext(0, {"op": "insert", "tokens": s})
    last = [o.core.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [V._fold(t) for t in toks])))).last_device_node
            for _, toks, _ in queue]
    return [queue[i][0] for i in o.core.dfs_weight_order(last)]


def cases():
    out = []
    for name, queue in QUEUES.items():
        for policy in POLICIES:
            for seed in (SEEDS if policy == "random" else (0,)):
                case = {"queue_name": name, "policy": policy, "seed": seed,
                        "queue": [list(q) for q in queue], "order": run(policy, queue, seed)}
                if policy == "dfs-weight":
                    case["rust_order"] = rust_dfs_order(queue)
                out.append(case)
    return {"cached": CACHED, "page_size": 1,
            "note": "SGLang 0.5.23 SchedulePolicy.calc_priority over RadixCache (page 1); "
                    "tools/sglang_oracle/make_schedule_cases.py",
            "cases": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the vendored file differs")
    args = ap.parse_args()
    text = json.dumps(cases(), separators=(",", ":")) + "\n"
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT}: differs from SGLang's orders", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
