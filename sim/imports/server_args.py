"""SGLang 0.5.23 server args -> scenario keys, each mapping citing its SGLang field.

``MAPPINGS`` is the table (docs/SERVER_ARTEFACTS.md prints it): one row per SGLang
field this project models, the scenario key it sets and why that is the same knob.
Every other field of the dump is returned as unmapped, with its value, so a user sees
what the scenario does not carry (written beside the scenario as ``unmapped.json``
and summarised in the scenario's header comment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# Fields that describe the process, not the cache or the scheduler: dropped from the
# unmapped list (they change nothing a simulator could model).
_IRRELEVANT_PREFIXES = ("tokenizer", "served_model_name", "host", "port", "log_", "api_key",
                        "file_storage", "crash_dump", "dump_", "enable_metrics", "otlp",
                        "download_dir", "revision", "trust_remote_code", "skip_server_warmup",
                        "watchdog", "nccl_port", "dist_init_addr", "base_gpu_id",
                        "gpu_id_step", "random_seed", "show_time_cost", "decode_log_interval",
                        "bucket_", "collect_tokens_histogram", "prompt_tokens_buckets",
                        "generation_tokens_buckets", "enable_request_time_stats_logging",
                        "kv_events_config")


@dataclass(frozen=True)
class Mapping:
    field: str  # SGLang ServerArgs field (server_args.py / arg_groups/fields/)
    key: str  # scenario key path it sets
    why: str
    convert: Callable[[Any, dict], Any]  # (value, all args) -> scenario value, or _SKIP


_SKIP = object()


def _same(v, a):
    return v


def _page(v, a):
    return int(v) if v else 1  # page_size None resolves to 1 (memory_hook.py)


def _chunk(v, a):
    # chunked_prefill_size -1 (or None after resolution on some paths): no chunking.
    return None if v is None or int(v) <= 0 else int(v)


def _device_tokens(v, a):
    # --max-total-tokens caps the device pool (model_runner profile_max_num_token then
    # min with max_total_tokens); the page-size multiple is the pool SGLang builds.
    if not v:
        return _SKIP
    page = _page(a.get("page_size"), a)
    return max(page, int(v) // page * page)


def _mem_fraction(v, a):
    return _SKIP if a.get("max_total_tokens") or v is None else float(v)


def _ratio(v, a):
    if not a.get("enable_hierarchical_cache") or (a.get("hicache_size") or 0) > 0:
        return _SKIP
    if a.get("hicache_host_memory_fraction") is not None:
        return _SKIP
    return float(v) if v else _SKIP


def _size(v, a):
    if not a.get("enable_hierarchical_cache") or not v or v <= 0:
        return _SKIP
    return float(v)


def _fraction(v, a):
    if not a.get("enable_hierarchical_cache") or (a.get("hicache_size") or 0) > 0 or v is None:
        return _SKIP
    return float(v)


def _hicache(v, a):
    return _SKIP if v else "off"  # a server without --enable-hierarchical-cache


def _if_hicache(f):
    def g(v, a):
        return f(v, a) if a.get("enable_hierarchical_cache") and v is not None else _SKIP
    return g


def _host_policy(v, a):
    # write_back duplicate reclaim is on unless SGLANG_HICACHE_SKIP_HOST_DUPLICATE_RECLAIM
    # (unified_tree_core.py drive_host_eviction); the env is not in the dump.
    return "duplicate_first" if a.get("enable_hierarchical_cache") else _SKIP


_STORAGE = {"mooncake", "3fs", "nixl", "file"}


def _storage_backend(v, a):
    return v if a.get("enable_hierarchical_cache") and v in _STORAGE else _SKIP


def _if_storage(v, a):
    return v if a.get("hicache_storage_backend") in _STORAGE and v is not None else _SKIP


MAPPINGS: tuple[Mapping, ...] = (
    Mapping("tp_size", "tp", "--tp-size: the ranks that each hold a replica of the tree", _same),
    Mapping("dp_size", "dp", "--dp-size: data-parallel instances behind the router", _same),
    Mapping("page_size", "page_size", "--page-size: tokens per KV page (the tree's key unit)", _page),
    Mapping("max_total_tokens", "device.tokens",
            "--max-total-tokens: the device KV pool in tokens", _device_tokens),
    Mapping("mem_fraction_static", "device.mem_fraction_static",
            "--mem-fraction-static: the pool sized from GPU memory (when no max_total_tokens)",
            _mem_fraction),
    Mapping("enable_hierarchical_cache", "host",
            "--enable-hierarchical-cache: off gives a single-tier radix cache (host: off)", _hicache),
    Mapping("hicache_ratio", "host.ratio", "--hicache-ratio: host = device x ratio", _ratio),
    Mapping("hicache_size", "host.size_gb", "--hicache-size: GB of host KV per rank (wins over ratio)", _size),
    Mapping("hicache_host_memory_fraction", "host.host_memory_fraction",
            "--hicache-host-memory-fraction: auto-size within the node's RAM", _fraction),
    Mapping("hicache_write_policy", "cache.write_policy", "--hicache-write-policy", _if_hicache(_same)),
    Mapping("hicache_write_policy", "cache.host_policy",
            "write_back duplicate reclaim, SGLang's default (PR #33777)", _host_policy),
    Mapping("radix_eviction_policy", "cache.eviction_policy", "--radix-eviction-policy", _same),
    Mapping("hicache_io_backend", "cost.io_backend", "--hicache-io-backend", _if_hicache(_same)),
    Mapping("hicache_mem_layout", "cost.mem_layout", "--hicache-mem-layout", _if_hicache(_same)),
    Mapping("max_running_requests", "scheduler.max_running_requests", "--max-running-requests",
            lambda v, a: int(v) if v else _SKIP),
    Mapping("chunked_prefill_size", "scheduler.chunked_prefill_tokens", "--chunked-prefill-size", _chunk),
    Mapping("max_prefill_tokens", "scheduler.max_prefill_tokens", "--max-prefill-tokens",
            lambda v, a: int(v) if v else _SKIP),
    Mapping("schedule_conservativeness", "scheduler.schedule_conservativeness",
            "--schedule-conservativeness", lambda v, a: float(v) if v else _SKIP),
    Mapping("hicache_storage_backend", "storage.backend", "--hicache-storage-backend", _storage_backend),
    Mapping("hicache_storage_prefetch_policy", "storage.prefetch_policy",
            "--hicache-storage-prefetch-policy", _if_storage),
    Mapping("hicache_host_memory_mode", "storage.host_memory_mode", "--hicache-host-memory-mode",
            _if_storage),
)

# Fields whose value this project cannot take but which decide behaviour: named in the
# unmapped list with the reason (the rest are listed bare).
WHY_NOT: dict[str, Callable[[Any], str | None]] = {
    "schedule_policy": lambda v: None if v == "fcfs" else
    f"{v!r}: the simulator schedules FCFS only (sim/scheduler.py)",
    "disable_radix_cache": lambda v: "the radix cache is off: nothing to simulate" if v else None,
    "disable_overlap_schedule": lambda v: None if v else
    "overlap scheduling (event_loop_overlap) is not modelled",
    "enable_mixed_chunk": lambda v: "mixed chunks are not modelled" if v else None,
    "pp_size": lambda v: f"pipeline parallel {v} is not modelled" if v and v > 1 else None,
    "kv_cache_dtype": lambda v: None if v in ("auto", None) else f"{v!r}: set as model.dtype_bytes",
    "enable_linker_mla_dedup": lambda v: (
        "the Mooncake linker's MLA dedup (hicache_hook.py: needs the external linker, exclusive "
        "with --enable-hierarchical-cache); host.mla_dedup is the HiCache pool's") if v else None,
}


def _setp(tree: dict, path: str, value) -> None:
    parts = path.split(".")
    for p in parts[:-1]:
        if not isinstance(tree.get(p), dict):
            tree[p] = {}
        tree = tree[p]
    tree[parts[-1]] = value


def map_server_args(args: dict) -> tuple[dict, list[dict], list[dict]]:
    """(scenario keys, mapped rows [{field, value, key, set, why}], unmapped rows)."""
    out: dict = {}
    mapped: list[dict] = []
    used = set()
    for m in MAPPINGS:
        if m.field not in args:
            continue
        v = args[m.field]
        val = m.convert(v, args)
        used.add(m.field)
        if val is _SKIP:
            continue
        if m.key == "host" and val == "off":
            out["host"] = "off"
        elif not (m.key.startswith("host.") and out.get("host") == "off"):
            _setp(out, m.key, val)
        mapped.append({"field": m.field, "value": v, "key": m.key, "set": val, "why": m.why})
    unmapped = []
    for k in sorted(args):
        if k in used or k.startswith(_IRRELEVANT_PREFIXES):
            continue
        why = WHY_NOT.get(k, lambda v: None)(args[k])
        if k in WHY_NOT and why is None:
            continue  # the value this project models already
        unmapped.append({"field": k, "value": _plain(args[k]), **({"why": why} if why else {})})
    return out, mapped, unmapped


def _plain(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return repr(v)
