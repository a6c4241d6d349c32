"""Pool sizing as SGLang 0.5.23 does it, and capacities shown in GB with tokens beside.

What this is for: an operator sizes HiCache in GB (``--mem-fraction-static``,
``--hicache-size``, ``--hicache-ratio``, ``--hicache-host-memory-fraction``) while the
tree counts tokens. This module holds SGLang's formulas (each cited, constants in
``sim.constants``) and the one formatter every command uses, so a capacity reads the
same everywhere: ``12.3 GB (300,032 tokens)``. GB here is always 1e9 bytes, the unit
of ``--hicache-size`` and of SGLang's host-memory log lines.

Device pool (``device.mem_fraction_static``)::

    kv_bytes = f * gpu_memory - weights_per_rank            (GiB arithmetic in SGLang)
    tokens   = kv_bytes // bytes_per_token // page_size * page_size

from ``KVCacheConfigurator._profile_available_bytes`` (mem_cache/kv_cache_configurator.py:
``rest_memory = available_gpu_memory - pre_model_load_memory * (1 - mem_fraction_static)``,
with ``available = pre - weights``) and ``DefaultPoolConfigurator.calculate_pool_sizes``
(model_executor/pool_configurator.py). ``gpu_memory`` is the profile's ``hbm_gib``;
SGLang measures free memory with ``torch.cuda.mem_get_info`` before the weights load,
so the CUDA context and NCCL buffers (a few hundred MiB) make a real pool slightly
smaller than this. ``weights_per_rank`` = all parameters x bytes per weight / tp.

Host pool: ratio / size_gb / gib as in ``sim.scenario`` (sem §6.2), plus SGLang's
auto-sizing (``mem_cache/hicache_auto_size.py auto_size_hicache``): when neither a
ratio nor a size is given, the default ratio 2 is lowered to
``min(2, budget * fraction * 0.95 / device_pool_bytes)``, with
``budget = (available host RAM - 10 GiB) // ranks_per_host``
(``mem_cache/pool_host/base.py host_memory_budget_bytes``).
"""

from __future__ import annotations

import math

from sim import constants as C

GB = 10**9
GIB = 1 << 30


def weights_bytes_per_rank(spec, tp: int) -> float:
    """Weight bytes one TP rank holds: every parameter sharded over ``tp``.

    Embeddings and the LM head are vocab-parallel in SGLang, so they shard too; the
    replicated norms are a rounding error at these sizes.
    """
    return spec.params_total * spec.weight_bytes / tp


def decode_graph_max_bs(gpu_mib: float, tp: int) -> int:
    """SGLang's default decode CUDA-graph max batch size (memory_hook.handle_gpu_memory_settings)."""
    for bound, small_tp, large_tp in C.DECODE_GRAPH_MAX_BS:
        if gpu_mib < bound:
            return small_tp if tp < 4 else large_tp
    return C.DECODE_GRAPH_MAX_BS_LARGE


def prefill_graph_sizes(max_bs: int) -> list[int]:
    """cuda_graph_hook.generate_prefill_cuda_graph_batch_sizes (token buckets)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256))
             + list(range(4608, max_bs + 1, 512)))
    return [s for s in sizes if s <= max_bs]


def sglang_mem_fraction_static(gpu_gib: float, tp: int, chunked_prefill: int | None,
                               max_running: int | None, mla: bool) -> float:
    """SGLang's default ``--mem-fraction-static`` for this GPU and TP size.

    ``arg_groups/memory_hook.py handle_gpu_memory_settings``, the branch a CUDA server
    takes by default (no post-capture KV sizing, no DP attention, no VLM, no DeepEP):
    reserved MiB = 512 + max(chunked_prefill, 2048) * 1.5 + tp / 8 * 1024 + decode
    graph (max_bs * 2) + prefill graph (8 MiB per captured bucket; 1.5 GiB with MLA),
    at least 10 GiB above 60 GiB of GPU memory; f = round((gpu - reserved) / gpu, 3).
    """
    gpu_mib = gpu_gib * 1024
    chunk = chunked_prefill if chunked_prefill else C.CHUNKED_PREFILL_DEFAULT
    max_bs = decode_graph_max_bs(gpu_mib, tp)
    if max_running is not None and max_bs > max_running:
        max_bs = max_running  # memory_hook: a default max_bs is capped by max_running_requests
    reserved = C.MEM_FRACTION_BASE_MB
    reserved += max(chunk, C.MEM_FRACTION_MIN_ACTIVATION_TOKENS) * C.MEM_FRACTION_ACTIVATION_MB_PER_TOKEN
    reserved += tp / 8 * C.MEM_FRACTION_TP_MB_PER_8_RANKS
    reserved += max_bs * C.MEM_FRACTION_DECODE_GRAPH_MB_PER_BS
    if mla:
        reserved += C.MEM_FRACTION_PREFILL_GRAPH_MLA_MB
    else:
        # The prefill graph's max_bs defaults to chunked_prefill_size for non-MLA models.
        reserved += len(prefill_graph_sizes(chunk)) * C.MEM_FRACTION_PREFILL_GRAPH_MB_PER_BS
    if gpu_mib > C.MEM_FRACTION_FLOOR_ABOVE_MB:
        reserved = max(reserved, C.MEM_FRACTION_FLOOR_MB)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def device_kv_bytes(fraction: float, gpu_gib: float, weights_bytes: float) -> int:
    """KV pool bytes per rank: ``rest_memory`` of ``_profile_available_bytes``, in bytes."""
    pre = gpu_gib  # GiB, as get_available_gpu_memory reports
    available = pre - weights_bytes / GIB
    rest = available - pre * (1 - fraction)
    return int(rest * GIB)


def device_tokens_from_bytes(kv_bytes: int, bytes_per_token: int, page_size: int) -> int:
    """``calculate_pool_sizes``: whole tokens of ``cell_size`` bytes, rounded to pages."""
    if kv_bytes <= 0:
        return 0
    return kv_bytes // bytes_per_token // page_size * page_size


def minimum_mem_fraction(gpu_gib: float, weights_bytes: float) -> float:
    """SGLang's suggestion when the weights leave no KV room: 1 - available / pre."""
    return 1 - (gpu_gib - weights_bytes / GIB) / gpu_gib


def host_budget_bytes(host_ram_gb: float, ranks_per_node: int) -> int:
    """Host bytes one rank may pin: (available RAM - 10 GiB reserve) // ranks per host."""
    free = int(host_ram_gb * GB) - C.HOST_MEMORY_RESERVE_BYTES
    return free // max(1, ranks_per_node)


def device_pool_bytes(device_tokens: int, page_size: int, bytes_per_token: int) -> int:
    """The device KV buffers' size: ``size + page_size`` slots (memory_pool.py
    MHATokenToKVPool allocates one padding page), what ``_estimate_hicache_bytes`` sums."""
    return (device_tokens + page_size) * bytes_per_token


def auto_host_ratio(requested: float, fraction: float, budget_bytes: int, device_bytes: int) -> float:
    """``auto_size_hicache``: the ratio lowered until the host pools fit."""
    return min(requested, budget_bytes * fraction * (1 - C.HICACHE_AUTO_SIZE_SLACK) / device_bytes)


def host_tokens_for_gb(gb: float, bytes_per_token: int, page_size: int) -> int:
    """Host tokens of ``--hicache-size gb`` (sem §6.2: one extra page); 0 GB is no host."""
    if gb <= 0:
        return 0
    size = math.floor(gb * C.HICACHE_SIZE_BYTES_PER_GB / bytes_per_token)
    return (size // page_size + C.HOST_POOL_EXTRA_PAGES) * page_size


def gb(tokens: float, bytes_per_token: float) -> float:
    return tokens * bytes_per_token / GB


def fmt_gb_value(value_gb: float) -> str:
    """A GB figure with about three significant digits: 0.512, 12.3, 1,234."""
    if value_gb == 0:
        return "0"
    if abs(value_gb) >= 100:
        return f"{value_gb:,.0f}"
    if abs(value_gb) >= 10:
        return f"{value_gb:.1f}"
    if abs(value_gb) >= 1:
        return f"{value_gb:.2f}"
    return f"{value_gb:.3g}"


def fmt_capacity(tokens: int, bytes_per_token: int) -> str:
    """``12.3 GB (300,032 tokens)``: GB first (what an operator sets), tokens beside."""
    return f"{fmt_gb_value(gb(tokens, bytes_per_token))} GB ({int(tokens):,} tokens)"
