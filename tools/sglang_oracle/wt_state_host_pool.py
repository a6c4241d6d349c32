#!/usr/bin/env python3
"""sglang #39436's fill-and-replay at the report's scale on the (FULL, MAMBA) tree
under write_through (docs/HYBRID.md §5.9): prompts of 8,448 tokens chunk-prefilled at
4,096 (3 state checkpoints each), a 2,680,896-token FULL host tier, a state host pool
of N slots; the first prompts, long evicted, replayed. The trace is built on the sim
(sim/hybrid, through the op-trace replayer) and, with --oracle, replayed on SGLang
0.5.23's core (oracle_hybrid.py) and compared line by line.

Usage (the repository's venv; --oracle needs the oracle venv):

    python tools/sglang_oracle/wt_state_host_pool.py [--mamba-host 565 734] \
        [--device-prompts 40] [--prompts 200] [--replay 8] [--oracle] [-o DIR]

The report gives the host pools and the prompt shape; the device tier (40 prompts by
default) and the device state pool (200) are this script's choice: the outcome does
not depend on them while the device holds fewer prompts than are filled.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sim.hybrid.replay import HybridReplayer  # noqa: E402

# sglang #39436's figures: prompt length, chunked prefill size, FULL host tokens.
PROMPT_TOKENS = 8448
CHUNK = 4096
HOST_TOKENS = 2_680_896


def dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


def build(mamba_host: int, prompts: int, device_prompts: int, replay: int,
          mamba_device: int = 200):
    """The trace and the sim's output lines: each prompt's three checkpoint inserts
    (each reusing and having inserted the previous one), eviction before each to
    make room, every write acked after the prompt (writing_check), then the replays."""
    header = {"op": "header", "components": ["full", "mamba"],
              "device_capacity": device_prompts * PROMPT_TOKENS,
              "mamba_capacity": mamba_device, "page_size": 1, "mamba_chunk": CHUNK,
              "hicache": True, "host_capacity": HOST_TOKENS,
              "mamba_host_capacity": mamba_host, "write_policy": "write_through"}
    r = HybridReplayer(header)
    t = r.tree
    ops, outs = [header], [r.header_output()]

    def emit(op):
        out = r.apply(len(ops), op)
        if "error" in out:
            raise SystemExit(f"op {len(ops)} refused: {out['error']}")
        ops.append(op)
        outs.append(out)

    ends = list(range(CHUNK, PROMPT_TOKENS, CHUNK)) + [PROMPT_TOKENS]
    for k in range(prompts):
        tokens = list(range(k * PROMPT_TOKENS + 1, (k + 1) * PROMPT_TOKENS + 1))
        prev = 0
        for end in ends:
            need_full = (end - prev) - (t.device_capacity - t.dev_used)
            need_state = 1 - (t.aux_capacity - t.aux_used - t.held)
            if need_full > 0 or need_state > 0:
                ev = {"op": "evict"}
                if need_full > 0:
                    ev["full"] = need_full
                if need_state > 0:
                    ev["mamba"] = need_state
                emit(ev)
            op = {"op": "insert", "tokens": tokens[:end]}
            if prev:
                op.update(prev=prev, inserted=prev)
            emit(op)
            prev = end
        for ack in list(t.writes):
            emit({"op": "write_ack", "id": ack})
    for k in range(replay):
        emit({"op": "match",
              "tokens": list(range(k * PROMPT_TOKENS + 1, (k + 1) * PROMPT_TOKENS + 1))})
    return ops, outs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mamba-host", type=int, nargs="+", default=[565, 734])
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--device-prompts", type=int, default=40)
    ap.add_argument("--replay", type=int, default=8)
    ap.add_argument("--oracle", action="store_true",
                    help="replay each trace on SGLang's core and compare every line")
    ap.add_argument("-o", "--out", help="write each trace and its outputs here")
    args = ap.parse_args()
    for mh in args.mamba_host:
        ops, outs = build(mh, args.prompts, args.device_prompts, args.replay)
        lines = [dumps(o) for o in outs]
        replays = [o for o in outs if o["op"] == "match"]
        whole = sum(o["host_len"] == PROMPT_TOKENS and o["mamba_host_len"] == 1
                    for o in replays)
        print(f"state host slots {mh}: {whole}/{len(replays)} replays whole from host "
              f"(host_len {[o['host_len'] for o in replays]}), {len(ops) - 1} ops")
        if args.out:
            d = Path(args.out)
            d.mkdir(parents=True, exist_ok=True)
            (d / f"wt_{mh}.jsonl").write_text("".join(dumps(op) + "\n" for op in ops))
            (d / f"wt_{mh}.out.jsonl").write_text("".join(x + "\n" for x in lines))
        if args.oracle:
            from oracle_hybrid import replay
            buf = io.StringIO()
            replay([dumps(op) for op in ops], buf)
            got = buf.getvalue().splitlines()
            diff = next((i for i, (a, b) in enumerate(zip(got, lines)) if a != b), None)
            if diff is not None or len(got) != len(lines):
                print(f"  SGLang's core differs at line {diff}")
                return 1
            print(f"  SGLang's core: every one of {len(got)} lines identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
