"""Build crash dumps and request dumps with SGLang 0.5.23's own code.

Run in the server oracle venv (it imports SGLang's TokenizerManager):

    /tmp/sglang-server-venv/bin/python tools/sglang_dumps/make_dumps.py data/dumps

A crash dump is written by the real ``TokenizerManager.dump_requests_before_crash``
(managers/tokenizer_manager.py), called on a TokenizerManager whose only state is the
fields that method and ``record_request_for_crash_dump`` read: real ``ServerArgs``
(published as the scheduler does), real ``GenerateReqInput`` objects, real
``ReqState`` / ``APIServerReqTimeStats``. Finished requests go through the real
``record_request_for_crash_dump`` with an ``out_dict`` shaped as
``_handle_batch_output`` builds it for a ``BatchTokenIDOutput`` (skip_tokenizer_init);
one request is left unfinished, so the dump also holds ``get_crash_dump_output()``.
A request dump (``dump_requests_folder``) is written by the real ``dump_requests``
(its ``_dump_data_to_file`` background task run to completion).

The hostile pickles are written beside them by hand: they are what an attacker or a
broken disk would give, not anything SGLang writes.
"""
from __future__ import annotations

import asyncio
import collections
import json
import os
import pickle
import sys
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIMS = Path("/work/shared/oracle/server")
sys.path.insert(0, str(SHIMS))
import cpu_shims  # noqa: E402,F401  (torchvision stand-in; must precede sglang)

from sglang.srt.managers.io_struct import GenerateReqInput  # noqa: E402
from sglang.srt.mem_cache.utils import get_hash_str, hash_str_to_int64  # noqa: E402
from sglang.srt.managers.tokenizer_manager import ReqState, TokenizerManager  # noqa: E402
from sglang.srt.observability.req_time_stats import APIServerReqTimeStats  # noqa: E402
from sglang.srt.runtime_context import SpawnRanks, publish  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

TINYLLAMA = str(SHIMS / "tinyllama")
PAGE = 16


def server_args() -> ServerArgs:
    """A TP8 HiCache write_back server, as the dump's user ran it (CPU-constructible)."""
    sa = ServerArgs(
        model_path=TINYLLAMA, device="cpu", load_format="dummy", skip_tokenizer_init=True,
        attention_backend="torch_native", disable_cuda_graph=True,
        tp_size=8, dist_init_addr="127.0.0.1:29911",
        page_size=PAGE, max_total_tokens=4096, max_running_requests=8,
        chunked_prefill_size=512, max_prefill_tokens=2048, schedule_policy="lpm",
        radix_eviction_policy="lru", mem_fraction_static=0.8,
        enable_hierarchical_cache=True, hicache_write_policy="write_back",
        hicache_ratio=1.5, hicache_io_backend="direct", hicache_mem_layout="layer_first",
        crash_dump_folder="/tmp/unused",
    )
    sa.resolve_once()
    publish(sa, role="tokenizer", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    return sa


def deepseek_server_args() -> ServerArgs:
    """An MLA server: a two-layer DeepSeek-V3 geometry (deepseek_v3_tiny/config.json:
    kv_lora_rank 512, qk_rope_head_dim 64), TP 8, --hicache-size 4."""
    sa = ServerArgs(
        model_path=str(HERE / "deepseek_v3_tiny"), device="cpu", load_format="dummy",
        skip_tokenizer_init=True, attention_backend="torch_native", disable_cuda_graph=True,
        tp_size=8, dist_init_addr="127.0.0.1:29912", page_size=64, max_total_tokens=8192,
        enable_hierarchical_cache=True, hicache_write_policy="write_back", hicache_size=4,
        crash_dump_folder="/tmp/unused",
    )
    sa.resolve_once()
    publish(sa, role="tokenizer", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    return sa


def tokens(doc: int, n: int) -> list[int]:
    """Deterministic token ids: a shared document prefix, then per-request text."""
    return [zlib.crc32(f"{doc}:{i}".encode()) % 32000 for i in range(n)]


def traffic():
    """(rid, input_ids, output_len, arrival offset s): two documents reused 3 times."""
    out = []
    t = 0.0
    for k in range(6):
        doc = k % 2
        prefix = tokens(1000 + doc, 160)
        suffix = tokens(2000 + k, 24 + 8 * k)
        out.append((f"req-{k}", prefix + suffix, 8 + k, t))
        t += 0.25
    return out


def manager(sa: ServerArgs, folder: Path) -> TokenizerManager:
    tm = object.__new__(TokenizerManager)
    tm.server_args = sa
    tm.model_path = sa.model_path
    tm.served_model_name = sa.served_model_name
    tm.crash_dump_folder = str(folder)
    tm.crash_dump_performed = False
    tm.crash_dump_request_list = collections.deque()
    tm.rid_to_state = {}
    tm.dump_requests_folder = ""
    tm.dump_requests_threshold = 1000
    tm.dump_request_list = []
    tm.dump_requests_exclude_meta_keys = None
    return tm


def state_for(rid, ids, out_len, created, finished):
    obj = GenerateReqInput(input_ids=ids, sampling_params={"max_new_tokens": out_len,
                                                          "temperature": 0.0}, rid=rid)
    obj.normalize_batch_and_arguments()
    ts = APIServerReqTimeStats()
    ts.created_time = created
    st = ReqState(out_list=[], finished=finished, event=asyncio.Event(), obj=obj, time_stats=ts)
    gen = tokens(3000 + len(ids), out_len if finished else out_len // 2)
    st.output_ids.extend(gen)
    cached = 160 if rid not in ("req-0", "req-1") else 0
    out_dict = {
        "output_ids": st.output_ids.copy(),
        "meta_info": {
            "id": rid,
            "finish_reason": {"type": "length", "length": out_len} if finished else None,
            "prompt_tokens": len(ids),
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(gen),
            "cached_tokens": cached,
        },
    }
    return st, out_dict


def crash_dump(out: Path, sa: ServerArgs, name: str = "crash_dump_tp8.pkl") -> Path:
    folder = out / "crash"
    tm = manager(sa, folder)
    base = time.perf_counter() - 10.0
    reqs = traffic()
    for rid, ids, out_len, t in reqs[:-1]:
        st, od = state_for(rid, ids, out_len, base + t, True)
        tm.record_request_for_crash_dump(st, od)
    rid, ids, out_len, t = reqs[-1]
    st, _ = state_for(rid, ids, out_len, base + t, False)
    tm.rid_to_state[rid] = st
    tm.dump_requests_before_crash(hostname="node0")
    (path,) = sorted((folder / "node0").glob("crash_dump_*.pkl"))
    dst = out / name
    os.replace(path, dst)
    (folder / "node0").rmdir()
    folder.rmdir()
    return dst


async def _request_dump(tm, reqs, base, folder: Path):
    """Each request through the real dump_requests; its background write awaited and the
    file renamed at once (SGLang names files by the second, so two in one second would
    overwrite each other)."""
    n = 0
    for rid, ids, out_len, t in reqs:
        st, od = state_for(rid, ids, out_len, base + t, True)
        st.time_stats.finished_time = base + t + 0.5
        tm.dump_requests(st, od)
        for task in list(asyncio.all_tasks() - {asyncio.current_task()}):
            await task
        for f in sorted(folder.glob("2*.pkl")):
            os.replace(f, folder / f"part{n}.pkl")
            n += 1


def request_dump(out: Path, sa: ServerArgs) -> Path:
    folder = out / "request_dumps"
    folder.mkdir(exist_ok=True)
    for old in folder.glob("*.pkl"):
        old.unlink()
    tm = manager(sa, Path("/nonexistent"))
    tm.dump_requests_folder = str(folder)
    tm.dump_requests_threshold = 3
    asyncio.run(_request_dump(tm, traffic(), time.perf_counter() - 10.0, folder))
    return folder


class _WriteFile:
    """A payload whose unpickling would create a file (never allowed to run)."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def hostile(out: Path, good: Path):
    raw = good.read_bytes()
    (out / "hostile_truncated.pkl").write_bytes(raw[: len(raw) // 2])
    (out / "hostile_reduce.pkl").write_bytes(pickle.dumps(
        {"server_args": None, "requests": [_WriteFile("/tmp/hicache_sim_pwned_by_dump")]}))

    class Gadget:
        pass
    for mod in ("evil", "evil.module"):
        sys.modules.setdefault(mod, type(sys)(mod))
    Gadget.__module__, Gadget.__qualname__ = "evil.module", "Gadget"
    sys.modules["evil.module"].Gadget = Gadget
    (out / "hostile_unknown_class.pkl").write_bytes(
        pickle.dumps({"server_args": None, "requests": [Gadget()]}))
    # 200 nested lists: a few hundred bytes, deeper than any dump.
    deep: list = []
    for _ in range(200):
        deep = [deep]
    (out / "hostile_deep.pkl").write_bytes(pickle.dumps({"server_args": None, "requests": deep}))


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "data/dumps").resolve()
    out.mkdir(parents=True, exist_ok=True)
    # The launch command the dump records (sys.argv), as the user started the server.
    sys.argv = ["python3", "-m", "sglang.launch_server", "--model-path", TINYLLAMA, "--tp-size", "8",
                "--page-size", str(PAGE), "--max-total-tokens", "4096", "--max-running-requests", "8",
                "--chunked-prefill-size", "512", "--schedule-policy", "lpm",
                "--enable-hierarchical-cache", "--hicache-write-policy", "write_back",
                "--hicache-ratio", "1.5", "--crash-dump-folder", "/var/crash/sglang"]
    sa = server_args()
    good = crash_dump(out, sa)
    request_dump(out, sa)
    hostile(out, good)
    crash_dump(out, deepseek_server_args(), "crash_dump_dsv3_tp8.pkl")
    # What SGLang's own unpickler sees, for the importer's tests to compare with.
    with open(good, "rb") as f:
        d = pickle.load(f)
    expect = {
        "keys": sorted(d),
        "server_args_type": f"{type(d['server_args']).__module__}.{type(d['server_args']).__qualname__}",
        "requests": [
            {"rid": r[0].rid, "input_ids": list(r[0].input_ids),
             "max_new_tokens": r[0].sampling_params.get("max_new_tokens"),
             "output_len": len(r[1].get("output_ids") or []),
             "cached_tokens": (r[1].get("meta_info") or {}).get("cached_tokens"),
             "created": r[2], "finished": r[3],
             # SGLang's KV-event hashes of the prompt's full pages (mem_cache/utils.py)
             "page_hashes": [hash_str_to_int64(h) for h in get_hash_str(
                 list(r[0].input_ids)[: len(r[0].input_ids) // PAGE * PAGE], None,
                 page_size=PAGE)] if len(r[0].input_ids) >= PAGE else []}
            for r in d["requests"]
        ],
        "tp_size": d["server_args"].tp_size, "page_size": d["server_args"].page_size,
        "hicache_ratio": d["server_args"].hicache_ratio,
        "launch_command": d["launch_command"],
    }
    (out / "crash_dump_tp8.expected.json").write_text(json.dumps(expect, indent=1) + "\n")
    print(f"wrote {good} ({good.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
