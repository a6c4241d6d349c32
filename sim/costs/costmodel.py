"""Seconds for every costed action: host<->device copies, prefill, decode, syncs, scans.

``CostModel`` binds a hardware ``Profile`` to a model, a TP size, a page size and the
HiCache I/O configuration, and precomputes per-instance coefficients so that each
call in the simulator's hot path is a handful of float operations (no numpy, no
allocation). Formulas follow shared/reference/transfer-costs.md:

Transfers (§1.7), per rank, ``n`` tokens in ``pages = ceil(n / page_size)`` pages, ``L``
layers, K and V as separate buffers (``kv_parts`` = 2; 1 for an MLA latent):

* ``direct`` backend (copy engine, one cudaMemcpyAsync per page x layer x K/V; the CPU
  issues the calls while the DMA streams them)::

      T = t_op + c_call + max(pages * L * kv_parts * c_call, n * b_tok / bw_link)

* ``kernel`` backend (GPU gather/scatter, bandwidth limited by the row size ``item``)::

      bw_k = min(bw_kernel_max, bw_link) * item / (item + k_half_kernel)
      T    = t_op + n_launch * t_launch + n * b_tok / bw_k

  with ``n_launch = L`` for a load-back (one launch per layer, so compute can start on
  layer 0 early) and 1 for an all-layer backup.
* ``page_first`` + ``kernel`` D2H uses SGLang's staged kernel (hicache-semantics §6.3):
  pages are gathered on the device into a staging buffer of at most
  ``STAGING_MAX_PAGES`` pages and each chunk is copied out by the copy engine::

      T = t_op + chunks * (t_launch + c_call) + n * b_tok * (1 / bw_link + 2 / bw_hbm)

``bw_link`` is the direction's copy-engine bandwidth, times ``bidir_factor`` when the
opposite direction is busy (``concurrent=True``).

Load-back overlaps with prefill layer by layer (sem §6.4: layer l+1 loads while layer
l computes), so the visible stall is (§1.7)::

    stall = t_op + T_layer + (L - 1) * max(0, T_layer - C_layer)

with ``T_layer`` the per-layer share of the load and ``C_layer`` the per-layer share of
the prefill compute.

Prefill (§3): ``t_fixed + (2 P_active n + 2 L H_q (d_qk + d_v) n (c + n/2)) /
(tp F_peak mfu)``; TP all-reduces inside the forward are folded into ``mfu``.

Decode step (a roofline, memory-bound in practice): ``t_fixed + max(bytes / (HBM bw *
hbm_efficiency), FLOPs / (tp F_peak mfu_decode))`` where bytes are the weights this rank
reads (MoE: at most ``batch`` x active parameters, capped at all of them) plus the KV
of every context token in the batch, and FLOPs are ``2 P_active batch + 2 L H_q (d_qk +
d_v) ctx``.

Sync all_reduce (§4): the profile's TP8 latency scaled by ``ceil(log2 world) / 3``
(tree/ring hop count relative to TP8); 0 for a world of 1.
"""

from __future__ import annotations

import math

from sim.constants import STAGING_MAX_PAGES
from sim.costs.models import ModelSpec, resolve_model
from sim.costs.profile import Profile, load_profile
from sim.errors import UserError

IO_BACKENDS = ("kernel", "direct")
MEM_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
SYNC_BACKENDS = ("gloo", "nccl")

# The profile's all_reduce figures are for TP8: log2(8) = 3 hops.
_REFERENCE_SYNC_HOPS = 3


def resolve_io(io_backend: str, mem_layout: str) -> tuple[str, str]:
    """Apply SGLang's automatic layout/backend resolutions (hicache-semantics.md §6.3).

    ``page_first`` with ``direct`` becomes ``page_first_direct``; ``page_first_direct``
    with ``kernel`` switches the backend to ``direct``.
    """
    if io_backend not in IO_BACKENDS:
        raise UserError(f"found {io_backend!r}; expected one of {', '.join(IO_BACKENDS)}",
                        where="io_backend")
    if mem_layout not in MEM_LAYOUTS:
        raise UserError(f"found {mem_layout!r}; expected one of {', '.join(MEM_LAYOUTS)}",
                        where="mem_layout")
    if mem_layout == "page_first" and io_backend == "direct":
        mem_layout = "page_first_direct"
    elif mem_layout == "page_first_direct" and io_backend == "kernel":
        io_backend = "direct"
    return io_backend, mem_layout


class CostModel:
    """Time costs, in seconds, for one TP group configuration on one hardware profile.

    ``profile`` is a Profile or a profile name/path; ``model`` a ModelSpec, a preset
    name or a custom-model mapping. ``io_backend`` and ``mem_layout`` are SGLang's
    ``--hicache-io-backend`` / ``--hicache-mem-layout``; the resolved pair is kept in
    the attributes of the same names.
    """

    def __init__(self, profile, model, tp: int, page_size: int,
                 io_backend: str = "kernel", mem_layout: str = "page_first"):
        self.profile: Profile = load_profile(profile)
        self.model: ModelSpec = resolve_model(model)
        self.model.check_tp(tp)
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise UserError(f"found {page_size!r}; expected a positive integer", where="page_size")
        self.tp = tp
        self.page_size = page_size
        self.io_backend, self.mem_layout = resolve_io(io_backend, mem_layout)
        self.requested_io = (io_backend, mem_layout)

        p, m = self.profile, self.model
        self.layers = m.layers
        self.bytes_per_token: int = m.bytes_per_token(tp)
        self.item_bytes: int = m.item_bytes(tp)
        self.t_op = p.t_op_us * 1e-6

        # Transfer coefficients, indexed [concurrent]: (fixed_s, per_page_s, per_token_s,
        # chunk_pages, per_chunk_s).
        self._h2d = tuple(self._transfer_coeffs("h2d", c) for c in (False, True))
        self._d2h = tuple(self._transfer_coeffs("d2h", c) for c in (False, True))

        # Compute coefficients.
        flops_per_s = tp * p.peak_tflops * 1e12
        att = 2.0 * m.layers * m.attention_width()  # FLOPs per (query, key) pair
        prefill_rate = flops_per_s * p.mfu_prefill
        self._pf_fixed = p.t_fixed_prefill_us * 1e-6
        self._pf_linear = 2.0 * m.active_params / prefill_rate  # s per new token
        self._pf_attn = att / prefill_rate  # s per (new token, attended token)
        decode_rate = flops_per_s * p.mfu_decode
        hbm = p.hbm_tbps * 1e12 * p.hbm_efficiency
        self._dc_fixed = p.t_fixed_decode_us * 1e-6
        self._dc_active_w_s = m.active_params * m.weight_bytes / tp / hbm  # per sequence
        self._dc_total_w_s = m.params_total * m.weight_bytes / tp / hbm  # cap
        self._dc_kv_s = self.bytes_per_token / hbm  # per context token
        self._dc_linear = 2.0 * m.active_params / decode_rate  # per sequence
        self._dc_attn = att / decode_rate  # per context token

        self._sync_s = {"gloo": p.allreduce_gloo_us * 1e-6 / _REFERENCE_SYNC_HOPS,
                        "nccl": p.allreduce_nccl_us * 1e-6 / _REFERENCE_SYNC_HOPS}
        self._scan_s = p.reclaim_scan_us_per_entry * 1e-6

    # ----------------------------------------------------------------- transfers
    def _transfer_coeffs(self, direction: str, concurrent: bool):
        p, m = self.profile, self.model
        bw = (p.bw_h2d_gbps if direction == "h2d" else p.bw_d2h_gbps) * 1e9
        if concurrent:
            bw *= p.bidir_factor
        c_call = p.c_call_us * 1e-6
        t_launch = p.t_launch_us * 1e-6
        b = self.bytes_per_token
        if self.io_backend == "direct":
            per_page = m.layers * m.kv_parts * c_call
            return (self.t_op + c_call, per_page, b / bw, 1, 0.0)
        if direction == "d2h" and self.mem_layout == "page_first":
            hbm = p.hbm_tbps * 1e12 * p.hbm_efficiency
            per_token = b / bw + 2.0 * b / hbm  # CE copy-out + device gather (read + write)
            return (self.t_op, 0.0, per_token, STAGING_MAX_PAGES, t_launch + c_call)
        kmax = (p.bw_kernel_h2d_gbps if direction == "h2d" else p.bw_kernel_d2h_gbps) * 1e9
        item = self.item_bytes
        bw_k = min(kmax, bw) * item / (item + p.k_half_kernel_bytes)
        launches = m.layers if direction == "h2d" else 1
        return (self.t_op + launches * t_launch, 0.0, b / bw_k, 1, 0.0)

    def _transfer_time(self, coeffs, tokens) -> float:
        """Fixed cost, then calls or link (whichever binds), plus per-chunk staging."""
        if tokens <= 0:
            return 0.0
        fixed, per_page, per_token, chunk_pages, per_chunk = coeffs
        pages = -(-tokens // self.page_size)
        calls, link = pages * per_page, tokens * per_token
        t = fixed + (calls if calls > link else link)
        if per_chunk:
            t += -(-pages // chunk_pages) * per_chunk
        return float(t)

    def h2d_time(self, tokens, concurrent: bool = False) -> float:
        """Seconds to load ``tokens`` tokens of KV host->device on one rank (all layers).
        Under MLA host dedup: the owner's H2D, layer by layer, each layer then broadcast
        to the peers (``mla_dedup_load_time``)."""
        t = self._transfer_time(self._h2d[1 if concurrent else 0], tokens)
        if self._bcast is not None and tokens > 0:
            return self.mla_dedup_load_time(t, tokens)
        return t

    _bcast = None  # (seconds per broadcast call, seconds per byte), or None: no dedup

    def enable_mla_dedup(self, chunk_tokens: int) -> None:
        """MLA host dedup (mem_cache/mla_host_dedup.py): only the owner (attn-TP rank
        0) holds host KV; a load-back is its H2D, then ``MLAHostDedupBroadcaster``
        broadcasts each loaded layer to the peers over NCCL."""
        if self.profile.nvlink_gbps is None:
            raise UserError(f"found no nvlink_gbps in cost profile {self.profile.name!r}; "
                            "expected the GPU-to-GPU bandwidth the dedup broadcast runs on",
                            where="host.mla_dedup")
        self._bcast = (self.profile.allreduce_nccl_us * 1e-6, 1.0 / (self.profile.nvlink_gbps * 1e9))
        self._bcast_chunk = chunk_tokens

    def mla_dedup_load_time(self, h2d_s: float, tokens: int) -> float:
        """A dedup load-back: the owner's H2D and the broadcast, pipelined by layer.

        The layer-done counter fires the broadcast of each layer once it is loaded
        (linker_mla_dedup.py ``broadcast_loaded_layer`` on ``LayerWiseLoadCounter``), so
        layer i's broadcast overlaps layer i+1's load: a two-stage pipeline over L
        layers ends at L x (the slower stage) + one layer of the faster. One layer's
        broadcast is ceil(tokens / (L x chunk)) NCCL calls (``_bcast_layer``:
        staging holds layer_num x SGLANG_MLA_DEDUP_CHUNK_TOKENS rows) of the layer's
        rows (kv_cache_dim x dtype bytes per token)."""
        per_call, per_byte = self._bcast
        L = self.layers
        calls = -(-tokens // (L * self._bcast_chunk))
        bcast_layer = calls * per_call + tokens * (self.bytes_per_token / L) * per_byte
        h2d_layer = h2d_s / L
        slow, fast = max(h2d_layer, bcast_layer), min(h2d_layer, bcast_layer)
        return L * slow + fast

    def d2h_time(self, tokens, concurrent: bool = False) -> float:
        """Seconds to back up ``tokens`` tokens device->host on one rank: one all-layer copy."""
        return self._transfer_time(self._d2h[1 if concurrent else 0], tokens)

    def asymptotic_bandwidth(self, direction: str, concurrent: bool = False) -> float:
        """Bytes/s a very large transfer approaches (the limit of bytes / time)."""
        coeffs = {"h2d": self._h2d, "d2h": self._d2h}[direction][1 if concurrent else 0]
        _, per_page, per_token, chunk_pages, per_chunk = coeffs
        s_per_token = (max(per_page / self.page_size, per_token)
                       + per_chunk / (chunk_pages * self.page_size))
        return self.bytes_per_token / s_per_token

    def load_stall(self, load_tokens, new_tokens, cached_tokens, concurrent: bool = False) -> float:
        """Visible seconds a layer-wise-overlapped load-back adds before/while prefill runs.

        ``new_tokens`` are prefilled over ``cached_tokens`` of prefix (device hit plus
        the loaded tokens), as in ``prefill_time``. Layer l+1 loads while layer l
        computes; what shows is the first layer's load plus every later layer's load
        that its predecessor's compute does not cover.
        """
        return self._overlap_stall(load_tokens, self._prefill_body(new_tokens, cached_tokens),
                                   concurrent)

    def batch_load_stall(self, load_tokens, chunks, concurrent: bool = False) -> float:
        """``load_stall`` for one merged H2D op under a whole prefill batch: ``chunks``
        are the batch's (new tokens, cached tokens) pairs (sem §6.4: one load op per
        batch, consumed layer by layer by the batch's forward)."""
        return self._overlap_stall(load_tokens, self._batch_body(chunks), concurrent)

    def _overlap_stall(self, load_tokens, body_s: float, concurrent: bool) -> float:
        if load_tokens <= 0:
            return 0.0
        total = self.h2d_time(load_tokens, concurrent)
        layers = self.layers
        load_layer = (total - self.t_op) / layers
        uncovered = load_layer - body_s / layers
        return self.t_op + load_layer + (layers - 1) * (uncovered if uncovered > 0 else 0.0)

    # ----------------------------------------------------------------- compute
    def _prefill_body(self, new_tokens, cached_tokens) -> float:
        if new_tokens <= 0:
            return 0.0
        return new_tokens * (self._pf_linear + self._pf_attn * (cached_tokens + 0.5 * new_tokens))

    def prefill_time(self, new_tokens, cached_tokens=0) -> float:
        """Seconds to prefill ``new_tokens`` over ``cached_tokens`` of prefix, per TP group."""
        if new_tokens <= 0:
            return 0.0
        return float(self._pf_fixed + self._prefill_body(new_tokens, cached_tokens))

    def _batch_body(self, chunks) -> float:
        body = self._prefill_body
        return sum(body(n, c) for n, c in chunks)

    def prefill_batch_time(self, chunks) -> float:
        """Seconds for one prefill forward over ``chunks``, the (new tokens, cached
        tokens) pairs of its requests: the fixed launch cost once, each chunk's body."""
        body = self._batch_body(chunks)
        return float(self._pf_fixed + body) if body > 0 else 0.0

    def decode_step_time(self, batch_size, total_context_tokens) -> float:
        """Seconds for one decode step of ``batch_size`` sequences with that much context.

        Memory-bound roofline: weights read once per step (MoE: the experts touched) plus
        every sequence's KV, over sustained HBM bandwidth; compute binds only at large
        batches.
        """
        if batch_size <= 0:
            return 0.0
        weights = batch_size * self._dc_active_w_s
        if weights > self._dc_total_w_s:
            weights = self._dc_total_w_s
        memory = weights + total_context_tokens * self._dc_kv_s
        compute = batch_size * self._dc_linear + total_context_tokens * self._dc_attn
        return float(self._dc_fixed + (memory if memory > compute else compute))

    def decode_run(self, batch_size, context_tokens, max_steps, t0, extra_s, stop, busy=0.0):
        """Advance consecutive decode steps of one batch from time ``t0``.

        Each step costs ``decode_step_time`` at the current context plus ``extra_s``
        (the loop's own per-iteration cost) and grows the context by ``batch_size``.
        Stops after ``max_steps``, or after the first step that ends at or past
        ``stop``. Returns (end time, steps, ``busy`` plus each step's duration, added
        one step at a time). The arithmetic is ``decode_step_time``'s, operation for
        operation, so times and busy totals are bit-identical to stepping one by one.
        """
        if batch_size <= 0 or max_steps <= 0:
            return t0, 0, busy
        weights = batch_size * self._dc_active_w_s
        if weights > self._dc_total_w_s:
            weights = self._dc_total_w_s
        lin = batch_size * self._dc_linear
        kv, attn, fixed = self._dc_kv_s, self._dc_attn, self._dc_fixed
        # The context as a float: ``ctx * kv`` converts an int to the same float first
        # (contexts are far below 2**53, so every sum stays exact), one conversion fewer
        # per step; ``range`` counts the steps (the hot loop of a decode-heavy run).
        t, k, ctx = t0, 0, float(context_tokens)
        for k in range(1, max_steps + 1):
            memory = weights + ctx * kv
            compute = lin + ctx * attn
            t1 = t + (extra_s + (fixed + (memory if memory > compute else compute)))
            busy += t1 - t
            t = t1
            if t >= stop:
                break
            ctx += batch_size
        return t, k, busy

    # ----------------------------------------------------------------- CPU-side
    def sync_time(self, world, backend: str = "gloo") -> float:
        """Seconds for one HiCache MIN all_reduce over ``world`` ranks (gloo by default)."""
        try:
            per_hop = self._sync_s[backend]
        except KeyError:
            raise UserError(f"found {backend!r}; expected one of {', '.join(SYNC_BACKENDS)}",
                            where="sync backend") from None
        if world <= 1:
            return 0.0
        return per_hop * math.ceil(math.log2(world))

    def reclaim_scan_time(self, entries) -> float:
        """CPU seconds for visiting ``entries`` reclaim-map entries (sem §9.1)."""
        return entries * self._scan_s if entries > 0 else 0.0

    def describe(self) -> dict:
        """The resolved configuration, for results metadata."""
        return {
            "profile": self.profile.name,
            "model": self.model.name,
            "tp": self.tp,
            "page_size": self.page_size,
            "io_backend": self.io_backend,
            "mem_layout": self.mem_layout,
            "requested_io_backend": self.requested_io[0],
            "requested_mem_layout": self.requested_io[1],
            "bytes_per_token": self.bytes_per_token,
            "item_bytes": self.item_bytes,
        }
