#!/usr/bin/env python3
"""Workloads that keep SGLang's scheduler busy, and the manifest of harness runs.

    python tools/sglang_server/gen_workloads.py [-o DIR] [--only NAME ...]

Deterministic (seeded numpy; same code, same bytes). Writes, into DIR (default
results/sglang-server/workloads):

* ``<workload>.jsonl``: one request per line, valid for both sides. For the server
  harness (``../shared/oracle/server``): ``arrival_step``, ``blocks`` +
  ``block_size``, ``input_len``, ``output_len``. For the engine's generic trace
  reader (sim/workloads/traces.py): the same ``blocks``/``block_size``/lengths, plus
  ``arrival_s`` (``arrival_step`` x 0.02 s), which the time clock reads (the step
  clock is to read ``arrival_step``, a field the reader ignores today). Request i (0-based line index) is ``r<i>`` on both
  sides: no comment or blank line is written, and rows are in arrival order.
* ``manifest.jsonl``: one run config per line (tools/sglang_server/runconfig.py):
  every workload under the three write policies and both loops.

Block ids follow the generic reader's ``block_ids: prefix`` meaning (id i names the
whole prefix up to block i): an id is only ever used at one position after one
predecessor, and a partial last block always gets a fresh id. The harness turns a
block into tokens with crc32 (``server_oracle.stable_tok("b", id, j)``), so that
equal ids are equal tokens there too; ids are also chosen so that no two blocks of a
trace start with the same token, so with page_size 1 a token-level match can never
run past a block where the ids differ (which a crc32 collision would otherwise
allow one time in 30,000).

Families (runs of 58-1,225 scheduler steps, median 131):
``shared`` (groups of requests sharing a long prefix), ``multiturn`` (sessions whose
turns extend the previous turn's prompt), ``hostpress`` (more distinct prefixes than
the host holds, cycled: device -> host -> device, host eviction and reclaim),
``long`` (prompts of several chunks: chunked prefill), ``decode`` (short prompts,
long outputs, a small device: retraction, with and without SGLang's
``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION=64``), ``mixed`` (all of them at once).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from runconfig import (POLICY_TAG, REPO, STEP_SECONDS, WRITE_POLICIES,  # noqa: E402
                       engine_scenario, harness_args, validate)

DEFAULT_OUT = REPO / "results" / "sglang-server" / "workloads"


def first_token(block_id: int) -> int:
    """The first token the server harness gives a block (server_oracle.stable_tok)."""
    return 3 + zlib.crc32(f"b:{block_id}:0".encode()) % 30000


class Blocks:
    """Fresh block ids whose first tokens are distinct across the trace."""

    def __init__(self, start: int = 1):
        self.next = start
        self.first = set()

    def new(self) -> int:
        while True:
            b = self.next
            self.next += 1
            t = first_token(b)
            if t not in self.first:
                self.first.add(t)
                return b

    def new_list(self, n: int) -> list[int]:
        return [self.new() for _ in range(n)]


def _row(step: int, blocks: list[int], bs: int, n_in: int, n_out: int) -> dict:
    assert len(blocks) == -(-n_in // bs), (len(blocks), n_in, bs)
    return {"arrival_step": int(step), "arrival_s": round(step * STEP_SECONDS, 6),
            "block_size": bs, "blocks": [int(b) for b in blocks],
            "input_len": int(n_in), "output_len": int(n_out)}


def _request(ids: Blocks, rng, shared: list[int], bs: int, new_blocks: int, partial: bool):
    """shared full blocks + ``new_blocks`` fresh ones (>= 1); the last one partial
    (1..bs-1 tokens) when ``partial``."""
    blocks = list(shared) + ids.new_list(new_blocks)
    n_in = len(blocks) * bs
    if partial:
        n_in -= int(rng.integers(1, bs))
    return blocks, n_in


def gen_shared(rng, bs, n, groups, prefix_blocks, suffix, out, gap):
    ids = Blocks()
    pre = [ids.new_list(prefix_blocks) for _ in range(groups)]
    rows, t = [], 0
    for _ in range(n):
        g = int(rng.integers(groups))
        k = int(rng.integers(prefix_blocks // 2, prefix_blocks + 1))  # share a part or all of it
        blocks, n_in = _request(ids, rng, pre[g][:k], bs, int(rng.integers(*suffix)),
                                bool(rng.integers(2)))
        rows.append(_row(t, blocks, bs, n_in, int(rng.integers(*out))))
        t += int(rng.integers(0, gap + 1))
    return rows


def gen_multiturn(rng, bs, sessions, turns, sys_blocks, user, out, think, start_gap):
    ids = Blocks()
    system = ids.new_list(sys_blocks)
    events = []  # (step, session, turn, blocks, n_in, n_out)
    t0 = 0
    for s in range(sessions):
        prev_blocks, prev_in, t = system, len(system) * bs, t0
        for turn in range(int(rng.integers(*turns))):
            shared = prev_blocks[: prev_in // bs]
            blocks, n_in = _request(ids, rng, shared, bs, int(rng.integers(*user)),
                                    bool(rng.integers(2)))
            events.append((t, s, turn, blocks, n_in, int(rng.integers(*out))))
            prev_blocks, prev_in = blocks, n_in
            t += int(rng.integers(*think))
        t0 += int(rng.integers(0, start_gap + 1))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    return [_row(e[0], e[3], bs, e[4], e[5]) for e in events]


def gen_hostpress(rng, bs, n, groups, prefix_blocks, suffix, out, gap):
    ids = Blocks()
    pre = [ids.new_list(prefix_blocks) for _ in range(groups)]
    rows, t = [], 0
    order = [int(x) for x in rng.permutation(groups)]
    for i in range(n):
        g = order[i % groups] if rng.random() < 0.8 else int(rng.integers(groups))
        blocks, n_in = _request(ids, rng, pre[g], bs, int(rng.integers(*suffix)), bool(rng.integers(2)))
        rows.append(_row(t, blocks, bs, n_in, int(rng.integers(*out))))
        t += int(rng.integers(0, gap + 1))
    return rows


def gen_long(rng, bs, n, docs, doc_blocks, question, out, gap):
    ids = Blocks()
    dlist = [ids.new_list(int(rng.integers(*doc_blocks))) for _ in range(docs)]
    rows, t = [], 0
    for _ in range(n):
        d = dlist[int(rng.integers(docs))] if rng.random() < 0.7 else []
        extra = int(rng.integers(*question)) if d else int(rng.integers(*doc_blocks))
        blocks, n_in = _request(ids, rng, d, bs, extra, bool(rng.integers(2)))
        rows.append(_row(t, blocks, bs, n_in, int(rng.integers(*out))))
        t += int(rng.integers(0, gap + 1))
    return rows


def gen_decode(rng, bs, waves, per_wave, groups, prefix_blocks, out, wave_gap):
    ids = Blocks()
    pre = [ids.new_list(prefix_blocks) for _ in range(groups)]
    rows = []
    for w in range(waves):
        for i in range(per_wave):
            blocks, n_in = _request(ids, rng, pre[i % groups], bs, int(rng.integers(1, 3)),
                                    bool(rng.integers(2)))
            rows.append(_row(w * wave_gap, blocks, bs, n_in, int(rng.integers(*out))))
    return rows


def gen_mixed(rng, bs, n, gap):
    """Shared prefixes, long documents and long outputs interleaved."""
    ids = Blocks()
    pre = [ids.new_list(int(rng.integers(4, 12))) for _ in range(4)]
    docs = [ids.new_list(int(rng.integers(16, 32))) for _ in range(2)]
    rows, t = [], 0
    for _ in range(n):
        kind = rng.random()
        if kind < 0.5:
            blocks, n_in = _request(ids, rng, pre[int(rng.integers(4))], bs,
                                    int(rng.integers(1, 5)), bool(rng.integers(2)))
            n_out = int(rng.integers(4, 24))
        elif kind < 0.8:
            blocks, n_in = _request(ids, rng, docs[int(rng.integers(2))], bs,
                                    int(rng.integers(1, 4)), bool(rng.integers(2)))
            n_out = int(rng.integers(4, 16))
        else:
            blocks, n_in = _request(ids, rng, [], bs, int(rng.integers(1, 4)), bool(rng.integers(2)))
            n_out = int(rng.integers(60, 140))
        rows.append(_row(t, blocks, bs, n_in, n_out))
        t += int(rng.integers(0, gap + 1))
    return rows


GENERATORS = {"shared": gen_shared, "multiturn": gen_multiturn, "hostpress": gen_hostpress,
              "long": gen_long, "decode": gen_decode, "mixed": gen_mixed}

# Server settings every workload starts from; a workload overrides some.
BASE = {"block_size": 16, "page_size": 16, "device_tokens": 1024, "host_ratio": 2.0,
        "max_running": 16, "chunked_prefill_size": 512, "max_prefill_tokens": 1024,
        "schedule_policy": "fcfs", "schedule_conservativeness": None,
        "clip_max_new_tokens": None, "d2h_delay_steps": 1, "h2d_delay_steps": 1,
        "tree_core": "rust"}


def W(name, family, seed, params, **server):
    return {"workload": name, "family": family, "seed": seed, "params": params, "server": server}


# The workloads: (name, family, seed, generator parameters, server settings). Page
# sizes 1..64, every schedule policy, chunked prefill (chunks below the prompts) on
# the `long`/`mixed` ones and some others, retraction with and without the clip.
WORKLOADS = [
    # shared prefixes
    W("s01_shared_ps1", "shared", 101, dict(bs=16, n=40, groups=4, prefix_blocks=12, suffix=(1, 5), out=(4, 24), gap=3),
      page_size=1, device_tokens=1024),
    W("s02_shared_ps2_lpm", "shared", 102, dict(bs=16, n=40, groups=6, prefix_blocks=10, suffix=(1, 4), out=(4, 20), gap=2),
      page_size=2, device_tokens=1024, schedule_policy="lpm"),
    W("s03_shared_ps4_dfs", "shared", 103, dict(bs=16, n=48, groups=5, prefix_blocks=8, suffix=(1, 6), out=(4, 16), gap=1),
      page_size=4, device_tokens=896, schedule_policy="dfs-weight"),
    W("s04_shared_ps8_lof", "shared", 104, dict(bs=16, n=40, groups=3, prefix_blocks=16, suffix=(1, 4), out=(2, 40), gap=2),
      page_size=8, device_tokens=1536, schedule_policy="lof"),
    W("s05_shared_ps16_random", "shared", 105, dict(bs=16, n=40, groups=4, prefix_blocks=12, suffix=(1, 5), out=(4, 24), gap=2),
      page_size=16, device_tokens=1024, schedule_policy="random"),
    W("s06_shared_ps32", "shared", 106, dict(bs=32, n=36, groups=4, prefix_blocks=8, suffix=(1, 3), out=(4, 24), gap=3),
      block_size=32, page_size=32, device_tokens=1536),
    W("s07_shared_ps64_lpm", "shared", 107, dict(bs=64, n=36, groups=3, prefix_blocks=5, suffix=(1, 3), out=(4, 24), gap=3),
      block_size=64, page_size=64, device_tokens=2048, schedule_policy="lpm"),
    W("s08_shared_burst_ps1", "shared", 108, dict(bs=16, n=48, groups=6, prefix_blocks=8, suffix=(1, 4), out=(8, 32), gap=0),
      page_size=1, device_tokens=1536, max_running=24),
    # multi-turn
    W("m01_multiturn_ps1", "multiturn", 201, dict(bs=16, sessions=6, turns=(3, 7), sys_blocks=4, user=(1, 4), out=(4, 20), think=(20, 50), start_gap=8),
      page_size=1, device_tokens=1024),
    W("m02_multiturn_ps4_lpm", "multiturn", 202, dict(bs=16, sessions=8, turns=(2, 6), sys_blocks=6, user=(1, 3), out=(4, 16), think=(10, 40), start_gap=5),
      page_size=4, device_tokens=768, schedule_policy="lpm"),
    W("m03_multiturn_ps16", "multiturn", 203, dict(bs=16, sessions=5, turns=(4, 8), sys_blocks=8, user=(1, 4), out=(4, 24), think=(25, 60), start_gap=10),
      page_size=16, device_tokens=1024, host_ratio=3.0),
    W("m04_multiturn_ps8_dfs", "multiturn", 204, dict(bs=16, sessions=10, turns=(2, 5), sys_blocks=4, user=(1, 3), out=(4, 16), think=(10, 30), start_gap=4),
      page_size=8, device_tokens=640, schedule_policy="dfs-weight"),
    W("m05_multiturn_ps2_delay", "multiturn", 205, dict(bs=16, sessions=6, turns=(3, 6), sys_blocks=5, user=(1, 4), out=(4, 20), think=(15, 40), start_gap=6),
      page_size=2, device_tokens=768, d2h_delay_steps=3, h2d_delay_steps=2),
    W("m06_multiturn_ps64", "multiturn", 206, dict(bs=64, sessions=6, turns=(3, 6), sys_blocks=2, user=(1, 3), out=(4, 20), think=(20, 40), start_gap=6),
      block_size=64, page_size=64, device_tokens=2048),
    W("m07_multiturn_ps1_lof", "multiturn", 207, dict(bs=16, sessions=8, turns=(2, 5), sys_blocks=3, user=(1, 5), out=(2, 40), think=(8, 30), start_gap=3),
      page_size=1, device_tokens=896, schedule_policy="lof"),
    W("m08_multiturn_ps32_random", "multiturn", 208, dict(bs=32, sessions=6, turns=(3, 6), sys_blocks=3, user=(1, 3), out=(4, 20), think=(15, 40), start_gap=5),
      block_size=32, page_size=32, device_tokens=1280, schedule_policy="random"),
    # host pressure
    W("h01_hostpress_ps1", "hostpress", 301, dict(bs=16, n=60, groups=8, prefix_blocks=16, suffix=(1, 3), out=(2, 10), gap=2),
      page_size=1, device_tokens=768, host_ratio=1.5),
    W("h02_hostpress_ps16", "hostpress", 302, dict(bs=16, n=60, groups=10, prefix_blocks=12, suffix=(1, 3), out=(2, 10), gap=2),
      page_size=16, device_tokens=640, host_ratio=1.5),
    W("h03_hostpress_ps4_lpm", "hostpress", 303, dict(bs=16, n=56, groups=7, prefix_blocks=16, suffix=(1, 4), out=(2, 12), gap=2),
      page_size=4, device_tokens=768, host_ratio=2.0, schedule_policy="lpm"),
    W("h04_hostpress_ps8_delay", "hostpress", 304, dict(bs=16, n=56, groups=8, prefix_blocks=14, suffix=(1, 3), out=(2, 10), gap=2),
      page_size=8, device_tokens=768, host_ratio=1.5, d2h_delay_steps=2, h2d_delay_steps=3),
    W("h05_hostpress_ps2_dfs", "hostpress", 305, dict(bs=16, n=60, groups=9, prefix_blocks=12, suffix=(1, 3), out=(2, 10), gap=1),
      page_size=2, device_tokens=640, host_ratio=1.25, schedule_policy="dfs-weight"),
    W("h06_hostpress_ps64", "hostpress", 306, dict(bs=64, n=50, groups=8, prefix_blocks=4, suffix=(1, 2), out=(2, 10), gap=2),
      block_size=64, page_size=64, device_tokens=1024, host_ratio=1.5),
    W("h07_hostpress_ps1_pycore", "hostpress", 307, dict(bs=16, n=56, groups=8, prefix_blocks=14, suffix=(1, 3), out=(2, 10), gap=2),
      page_size=1, device_tokens=768, host_ratio=1.5, tree_core="python"),
    W("h08_hostpress_ps16_random", "hostpress", 308, dict(bs=16, n=56, groups=8, prefix_blocks=12, suffix=(1, 3), out=(2, 10), gap=1),
      page_size=16, device_tokens=640, host_ratio=2.0, schedule_policy="random"),
    # long prompts: chunked prefill
    W("l01_long_ps1_chunk64", "long", 401, dict(bs=16, n=24, docs=3, doc_blocks=(12, 30), question=(1, 3), out=(4, 16), gap=4),
      page_size=1, device_tokens=1536, chunked_prefill_size=64, max_prefill_tokens=512),
    W("l02_long_ps16_chunk128", "long", 402, dict(bs=16, n=24, docs=3, doc_blocks=(16, 40), question=(1, 3), out=(4, 16), gap=4),
      page_size=16, device_tokens=2048, chunked_prefill_size=128, max_prefill_tokens=512),
    W("l03_long_ps4_chunk96_lpm", "long", 403, dict(bs=16, n=24, docs=4, doc_blocks=(10, 24), question=(1, 3), out=(4, 16), gap=3),
      page_size=4, device_tokens=1536, chunked_prefill_size=96, max_prefill_tokens=384, schedule_policy="lpm"),
    W("l04_long_ps64_chunk256", "long", 404, dict(bs=64, n=20, docs=3, doc_blocks=(4, 12), question=(1, 2), out=(4, 16), gap=4),
      block_size=64, page_size=64, device_tokens=3072, chunked_prefill_size=256, max_prefill_tokens=512),
    W("l05_long_ps8_chunk64_lof", "long", 405, dict(bs=16, n=24, docs=3, doc_blocks=(12, 28), question=(1, 3), out=(2, 30), gap=3),
      page_size=8, device_tokens=1536, chunked_prefill_size=64, max_prefill_tokens=256, schedule_policy="lof"),
    W("l06_long_ps2_nochunk", "long", 406, dict(bs=16, n=24, docs=3, doc_blocks=(12, 30), question=(1, 3), out=(4, 16), gap=4),
      page_size=2, device_tokens=1536, chunked_prefill_size=-1, max_prefill_tokens=1024),
    W("l07_long_ps32_chunk128_dfs", "long", 407, dict(bs=32, n=24, docs=3, doc_blocks=(8, 16), question=(1, 2), out=(4, 16), gap=3),
      block_size=32, page_size=32, device_tokens=2048, chunked_prefill_size=128, max_prefill_tokens=512,
      schedule_policy="dfs-weight"),
    W("l08_long_ps1_chunk48_random", "long", 408, dict(bs=16, n=20, docs=2, doc_blocks=(10, 24), question=(1, 3), out=(4, 16), gap=4),
      page_size=1, device_tokens=1280, chunked_prefill_size=48, max_prefill_tokens=256, schedule_policy="random"),
    # decode pressure: retraction, with and without the clip
    W("d01_decode_ps1", "decode", 501, dict(bs=16, waves=2, per_wave=10, groups=4, prefix_blocks=2, out=(100, 180), wave_gap=100),
      page_size=1, device_tokens=768, max_running=24),
    W("d02_decode_ps1_clip64", "decode", 501, dict(bs=16, waves=2, per_wave=10, groups=4, prefix_blocks=2, out=(100, 180), wave_gap=100),
      page_size=1, device_tokens=768, max_running=24, clip_max_new_tokens=64),
    W("d03_decode_ps16", "decode", 503, dict(bs=16, waves=2, per_wave=10, groups=3, prefix_blocks=3, out=(80, 150), wave_gap=100),
      page_size=16, device_tokens=768, max_running=24),
    W("d04_decode_ps16_clip64", "decode", 503, dict(bs=16, waves=2, per_wave=10, groups=3, prefix_blocks=3, out=(80, 150), wave_gap=100),
      page_size=16, device_tokens=768, max_running=24, clip_max_new_tokens=64),
    W("d05_decode_ps4_clip64_lof", "decode", 505, dict(bs=16, waves=2, per_wave=16, groups=4, prefix_blocks=2, out=(60, 140), wave_gap=90),
      page_size=4, device_tokens=896, max_running=20, clip_max_new_tokens=64, schedule_policy="lof"),
    W("d06_decode_ps8_cons", "decode", 506, dict(bs=16, waves=2, per_wave=16, groups=4, prefix_blocks=2, out=(60, 140), wave_gap=90),
      page_size=8, device_tokens=896, max_running=20, schedule_conservativeness=0.3),
    W("d07_decode_ps64_clip64", "decode", 507, dict(bs=64, waves=2, per_wave=6, groups=3, prefix_blocks=1, out=(80, 150), wave_gap=100),
      block_size=64, page_size=64, device_tokens=512, max_running=16, clip_max_new_tokens=64),
    W("d08_decode_ps2_clip64_random", "decode", 508, dict(bs=16, waves=2, per_wave=10, groups=4, prefix_blocks=2, out=(100, 180), wave_gap=100),
      page_size=2, device_tokens=768, max_running=20, clip_max_new_tokens=64, schedule_policy="random"),
    # all at once
    W("x01_mixed_ps1_chunk64", "mixed", 601, dict(bs=16, n=48, gap=3),
      page_size=1, device_tokens=1280, chunked_prefill_size=64, max_prefill_tokens=512),
    W("x02_mixed_ps16_clip64", "mixed", 602, dict(bs=16, n=48, gap=2),
      page_size=16, device_tokens=1024, chunked_prefill_size=128, clip_max_new_tokens=64, host_ratio=1.5),
    W("x03_mixed_ps4_lpm_delay", "mixed", 603, dict(bs=16, n=48, gap=2),
      page_size=4, device_tokens=1280, chunked_prefill_size=96, schedule_policy="lpm",
      d2h_delay_steps=2, h2d_delay_steps=2),
    W("x04_mixed_ps8_pycore_dfs", "mixed", 604, dict(bs=16, n=48, gap=3),
      page_size=8, device_tokens=1024, chunked_prefill_size=128, schedule_policy="dfs-weight", tree_core="python"),
]


def workload_rows(w: dict) -> list[dict]:
    rng = np.random.default_rng(w["seed"])
    return GENERATORS[w["family"]](rng, **w["params"])


def run_configs(w: dict) -> list[dict]:
    """The workload under the three write policies x both loops."""
    server = dict(BASE, **w["server"])
    out = []
    for policy in WRITE_POLICIES:
        for overlap in (False, True):
            cfg = dict(server, run=f"{w['workload']}.{POLICY_TAG[policy]}.{'overlap' if overlap else 'normal'}",
                       workload=w["workload"], trace=f"{w['workload']}.jsonl", seed=w["seed"],
                       write_policy=policy, overlap=overlap)
            validate(cfg, f"workload {w['workload']}")
            harness_args(cfg)
            engine_scenario(cfg, cfg["trace"])
            out.append(cfg)
    return out


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", default=str(DEFAULT_OUT), help="output folder")
    ap.add_argument("--only", nargs="*", help="workload names (default: all)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = [w for w in WORKLOADS if not a.only or w["workload"] in a.only]
    if a.only and len(chosen) != len(set(a.only)):
        known = {w["workload"] for w in WORKLOADS}
        bad = sorted(set(a.only) - known)
        print(f"--only: found unknown workload(s) {', '.join(bad)}; expected names from "
              f"gen_workloads.WORKLOADS", file=sys.stderr)
        return 2
    manifest = []
    for w in chosen:
        rows = workload_rows(w)
        _write_atomic(out / f"{w['workload']}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        manifest += run_configs(w)
    _write_atomic(out / "manifest.jsonl", "".join(json.dumps(c, sort_keys=True) + "\n" for c in manifest))
    print(f"{len(chosen)} workloads, {len(manifest)} runs -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
