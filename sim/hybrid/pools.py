"""Per-component pool sizes of a hybrid model, as SGLang 0.5.23 sizes them.

Pure functions of byte budgets and per-token / per-state bytes
(``sim.costs.hybrid_models``); the byte budget itself (``rest_memory`` of
``KVCacheConfigurator._profile_available_bytes``) is ``sim.sizing.device_kv_bytes``.
Only the default paths are modelled: no speculative decoding, no unified memory pool,
no PP slicing, no request-cap SWA sizing (DeepSeek-V4 family), no ReplaySSM.

Device, (FULL, SWA) (model_executor/pool_configurator.py
``HybridSWAPoolConfigurator``)::

    cell      = full_bytes_per_token + ratio * swa_bytes_per_token      (_recompute_cell_size)
    total     = int(available_bytes // cell)                            (calculate_pool_sizes)
    full      = total // page * page                                    (_solve_pool_sizes)
    swa       = int(full * ratio) // page * page
    refuse when sliding_window + page >= swa                            (validate_swa_pool_size)

Device, (FULL, MAMBA) (mem_cache/kv_cache_configurator.py ``_handle_max_mamba_cache``,
then ``DefaultPoolConfigurator`` over the full-attention layers only)::

    budget    = rest_gib * r / (1 + r) * 2**30                          (r: mamba_full_memory_ratio)
    states    = int((budget - per_state) // per_state)                  (or --max-mamba-cache-size)
    rest_gib -= (states + 1) * per_state / 2**30                        (+1: the padding slot)
    full      = int(rest_gib * 2**30) // full_bytes_per_token // page * page
    max_running <= states // slots_per_request                          (resolve_max_num_reqs)

Host (mem_cache/pool_host/base.py ``HostKVCache.__init__``, pool_host/mamba.py
``MambaPoolHost.__init__``, hybrid_cache/hybrid_pool_assembler.py)::

    size      = int(device_capacity * hicache_ratio)                    (ratio)
              | int(share_gb * 1e9 // bytes_per_unit)                   (--hicache-size)
    size      = (size // page + 1) * page                               (a padding page; Mamba: page 1)
    share_gb  = hicache_size * pool_bytes / sum(pool_bytes)             (_split_hicache_size)

where each pool's bytes are its device buffers (``get_kv_size_bytes``: KV pools
``(size + page) * bytes_per_token``, the Mamba pool ``(size + 1) * state bytes``).
"""

from __future__ import annotations

from sim import constants as C
from sim.errors import UserError

GIB = 1 << 30


def swa_device_pools(available_bytes: int, full_bytes_per_token: int,
                     swa_bytes_per_token: int, page_size: int, sliding_window: int,
                     ratio: float = C.SWA_FULL_TOKENS_RATIO_DEFAULT) -> tuple[int, int]:
    """(FULL tokens, SWA tokens) of ``HybridSWAPoolConfigurator.calculate_pool_sizes``."""
    if not 0 < ratio <= 1:
        raise UserError(f"found swa_full_tokens_ratio={ratio!r}; expected a number in (0, 1]",
                        where="pools")
    cell = full_bytes_per_token + ratio * swa_bytes_per_token
    total = int(available_bytes // cell)
    full = total // page_size * page_size
    swa = int(full * ratio) // page_size * page_size
    if sliding_window + page_size >= swa:
        raise UserError(f"SWA pool ({swa} tokens) cannot hold even one request: found a"
                        f" floor of sliding_window ({sliding_window}) + page_size"
                        f" ({page_size}); expected a larger swa_full_tokens_ratio or KV"
                        f" budget", where="pools")
    return full, swa


def mamba_slots_per_request(*, skip_decode_lock: bool = False, extra_buffer: bool = False,
                            overlap: bool = True, lazy: bool = False,
                            radix_cache: bool = True) -> int:
    """``KVCacheConfigurator._calculate_mamba_ratio``: state slots a running request
    counts for when ``max_running_requests`` is capped by the Mamba pool."""
    if not radix_cache:
        return 1
    base = C.MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO - (
        C.MAMBA_CACHE_BASE_RATIO_DROP_ON_SKIP if skip_decode_lock else 0)
    extra = 0
    if extra_buffer:
        extra = 1 if lazy else (2 if overlap else 1)  # get_mamba_tracking_slots
    elif skip_decode_lock:
        extra = C.MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_BUFFER
    return base + extra


def mamba_device_pools(rest_bytes: int, full_bytes_per_token: int, state_bytes: int,
                       page_size: int, *,
                       ratio: float = C.MAMBA_FULL_MEMORY_RATIO_DEFAULT,
                       max_mamba_cache_size: int | None = None) -> tuple[int, int]:
    """(FULL tokens, Mamba state slots): ``_handle_max_mamba_cache`` then the FULL pool
    from what is left (``_profile_available_bytes`` returns ``int(rest * 2**30)``).
    ``rest_bytes`` is the KV budget before the Mamba pool (SGLang's ``rest_memory``)."""
    if state_bytes <= 0 or full_bytes_per_token <= 0:
        raise UserError("expected positive FULL bytes per token and Mamba state bytes",
                        where="pools")
    rest_gib = rest_bytes / GIB
    if max_mamba_cache_size is not None:
        states = int(max_mamba_cache_size)
    else:
        budget = rest_gib * ratio / (1 + ratio) * GIB
        states = int((budget - state_bytes) // state_bytes)
    if states <= 0:
        raise UserError(f"found max_mamba_cache_size={states}; expected > 0 (not enough"
                        f" GPU memory for the Mamba state cache)", where="pools")
    rest_gib -= (states + C.MAMBA_POOL_PADDING_SLOTS) * state_bytes / GIB
    if rest_gib <= 0:
        raise UserError("the Mamba state pool leaves no memory for the KV cache",
                        where="pools")
    avail = int(rest_gib * GIB)
    full = avail // full_bytes_per_token // page_size * page_size
    return full, states


def mamba_max_running(states: int, token_capacity: int, requested: int | None = None,
                      slots_per_request: int | None = None, context_len: int = 0) -> int:
    """``resolve_max_num_reqs`` (one DP worker): the running-request cap, capped by
    ``states // slots_per_request`` for a Mamba hybrid."""
    ratio = mamba_slots_per_request() if slots_per_request is None else slots_per_request
    if requested is not None:
        cap = min(max(1, requested), token_capacity // 2)
    else:
        # (no context length: the upper clamp)
        est = (int(token_capacity / context_len * C.MAX_NUM_REQS_PER_CONTEXT) if context_len
               else C.MAX_NUM_REQS_MAX)
        cap = min(max(min(est, C.MAX_NUM_REQS_MAX), C.MAX_NUM_REQS_MIN), token_capacity // 2)
    cap = min(cap, states // ratio)
    if cap <= 0:
        raise UserError(f"the Mamba state cache ({states} slots, {ratio} per request)"
                        f" cannot serve any request", where="pools")
    return cap


def host_pool_size(device_capacity: int, page_size: int, *, ratio: float | None = None,
                   share_gb: float = 0.0, bytes_per_unit: int = 0) -> int:
    """A host pool's size in its units (tokens, or states at page 1): by
    ``--hicache-size`` share when ``share_gb > 0``, else by ``ratio``; one padding
    page on top (``HostKVCache.__init__``, ``MambaPoolHost.__init__``)."""
    if share_gb > 0:
        if bytes_per_unit <= 0:
            raise UserError("expected bytes_per_unit with share_gb", where="pools")
        size = int(share_gb * 1e9 // bytes_per_unit)
    else:
        if ratio is None:
            ratio = C.HICACHE_RATIO_DEFAULT
        size = int(device_capacity * ratio)
    return (size // page_size + C.HOST_POOL_EXTRA_PAGES) * page_size


def split_hicache_size(hicache_gb: float, pool_bytes: list[int]) -> list[float]:
    """``_split_hicache_size``: ``--hicache-size`` shared by device pool bytes."""
    total = sum(pool_bytes)
    return [hicache_gb * b / total for b in pool_bytes]


def kv_pool_bytes(tokens: int, page_size: int, bytes_per_token: int) -> int:
    """A KV pool's device buffers: ``size + page_size`` slots (one padding page)."""
    return (tokens + page_size) * bytes_per_token


def mamba_pool_bytes(states: int, state_bytes: int) -> int:
    """The Mamba pool's device buffers: ``size + 1`` state slots."""
    return (states + C.MAMBA_POOL_PADDING_SLOTS) * state_bytes


def hybrid_host_pools(kind: str, full_tokens: int, aux_size: int, page_size: int,
                      full_bytes_per_token: int, aux_bytes_per_unit: int, *,
                      ratio: float | None = None, hicache_gb: float = 0.0) -> tuple[int, int]:
    """(FULL host tokens, SWA host tokens or Mamba host states) of the hybrid host
    group (``build_hybrid_swa_group`` / ``build_hybrid_mamba_stack``): each pool sized
    from its own device pool by the ratio, or from its share of ``--hicache-size``."""
    if kind == "swa":
        aux_page = page_size
        aux_bytes = kv_pool_bytes(aux_size, page_size, aux_bytes_per_unit)
    elif kind == "mamba":
        aux_page = 1  # MambaPoolHost.page_size = 1
        aux_bytes = mamba_pool_bytes(aux_size, aux_bytes_per_unit)
    else:
        raise UserError(f"found kind {kind!r}; expected 'swa' or 'mamba'", where="pools")
    if hicache_gb > 0:
        full_share, aux_share = split_hicache_size(
            hicache_gb, [kv_pool_bytes(full_tokens, page_size, full_bytes_per_token),
                         aux_bytes])
        return (host_pool_size(full_tokens, page_size, share_gb=full_share,
                               bytes_per_unit=full_bytes_per_token),
                host_pool_size(aux_size, aux_page, share_gb=aux_share,
                               bytes_per_unit=aux_bytes_per_unit))
    return (host_pool_size(full_tokens, page_size, ratio=ratio),
            host_pool_size(aux_size, aux_page, ratio=ratio))
