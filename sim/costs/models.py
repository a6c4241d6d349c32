"""Model geometry: what one token of KV cache weighs on one TP rank, and FLOP counts.

A ``ModelSpec`` holds only what the cost model needs: the KV geometry (layers, KV
heads, head dims, dtype, or the MLA latent) and the parameter counts that turn tokens
into FLOPs and weight bytes. Presets cover the models the reference notes tabulate
(shared/reference/transfer-costs.md §2); a custom model is a mapping with the same
fields (``resolve_model``).

TP sharding follows SGLang (hicache-semantics.md §6.1; ``ModelConfig.get_num_kv_heads``):
KV heads per rank = max(1, kv_heads // tp), so heads are replicated when tp exceeds
them; an MLA latent is replicated whole on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from sim.errors import UserError


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The KV and compute geometry of one model (per model, not per rank).

    MHA/GQA models set ``kv_heads`` and ``head_dim`` (and ``v_head_dim`` when V differs
    from K). MLA models set ``kv_lora_rank`` and ``qk_rope_head_dim`` (the cached
    latent); their ``head_dim``/``v_head_dim`` are the query-key and value head sizes of
    the prefill attention, used only for FLOPs.
    """

    name: str
    layers: int
    q_heads: int  # attention (query) heads; FLOPs only
    head_dim: int  # K (query-key) head size
    dtype_bytes: int = 2  # KV cache element size: 2 for bf16/fp16, 1 for fp8
    kv_heads: int = 0  # MHA/GQA KV heads (0 for MLA)
    v_head_dim: int | None = None  # V head size; None means head_dim
    kv_lora_rank: int = 0  # MLA compressed KV width (0 for MHA/GQA)
    qk_rope_head_dim: int = 0  # MLA decoupled RoPE key width, cached beside the latent
    active_params: float = 0.0  # parameters touched per token (MoE: active experts)
    total_params: float | None = None  # all parameters (MoE); None means active_params
    weight_bytes: float = 2.0  # bytes per weight parameter: 2 bf16, 1 fp8

    def __post_init__(self):
        where = f"model '{self.name}'"
        for key in ("layers", "q_heads", "head_dim", "dtype_bytes"):
            _require_int(where, key, getattr(self, key), minimum=1)
        for key in ("kv_heads", "kv_lora_rank", "qk_rope_head_dim"):
            _require_int(where, key, getattr(self, key), minimum=0)
        if self.v_head_dim is not None:
            _require_int(where, "v_head_dim", self.v_head_dim, minimum=1)
        if self.is_mla:
            if self.kv_heads:
                raise UserError(
                    "sets both kv_heads and kv_lora_rank; expected MHA/GQA (kv_heads) or MLA"
                    " (kv_lora_rank + qk_rope_head_dim), not both", where=where)
        elif self.kv_heads < 1:
            raise UserError("has no KV geometry; expected kv_heads >= 1 (MHA/GQA) or"
                            " kv_lora_rank >= 1 (MLA)", where=where)
        _require_number(where, "active_params", self.active_params, positive=True)
        _require_number(where, "weight_bytes", self.weight_bytes, positive=True)
        if self.total_params is not None:
            _require_number(where, "total_params", self.total_params, positive=True)
            if self.total_params < self.active_params:
                raise UserError(f"key 'total_params': found {self.total_params:g}; expected"
                                f" >= active_params ({self.active_params:g})", where=where)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def kv_parts(self) -> int:
        """Separate K and V buffers for MHA (2); one latent buffer for MLA (1)."""
        return 1 if self.is_mla else 2

    @property
    def params_total(self) -> float:
        return self.active_params if self.total_params is None else self.total_params

    def check_tp(self, tp) -> None:
        """Reject a TP size SGLang cannot shard this model's KV heads over.

        Heads are split when tp divides them and replicated when tp is a multiple of
        them; anything else (8 heads over tp=3) is an error. MLA accepts any tp.
        """
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise UserError(f"found tp={tp!r}; expected a positive integer",
                            where=f"model '{self.name}'")
        if self.is_mla:
            return
        h = self.kv_heads
        if h % tp and tp % h:
            raise UserError(f"found tp={tp} with {h} KV heads; expected tp dividing {h}"
                            f" or a multiple of {h}", where=f"model '{self.name}'")

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads each rank holds: max(1, kv_heads // tp); 1 (the whole latent) for MLA."""
        self.check_tp(tp)
        if self.is_mla:
            return 1
        return max(1, self.kv_heads // tp)

    def item_bytes(self, tp: int) -> int:
        """Bytes of one (token, layer, K or V) row on one rank: the unit a kernel moves."""
        if self.is_mla:
            self.check_tp(tp)
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.dtype_bytes
        # K and V may differ in head size; the average row is what the kernels stream.
        v = self.head_dim if self.v_head_dim is None else self.v_head_dim
        return self.kv_heads_per_rank(tp) * (self.head_dim + v) * self.dtype_bytes // 2

    def bytes_per_token(self, tp: int) -> int:
        """KV bytes one token occupies on one rank, over all layers (SGLang size_per_token)."""
        if self.is_mla:
            self.check_tp(tp)
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim) * self.dtype_bytes
        v = self.head_dim if self.v_head_dim is None else self.v_head_dim
        return self.layers * self.kv_heads_per_rank(tp) * (self.head_dim + v) * self.dtype_bytes

    def attention_width(self) -> int:
        """q_heads * (qk dim + v dim): the per-(query, key) pair FLOP factor / 2 / layers."""
        v = self.head_dim if self.v_head_dim is None else self.v_head_dim
        return self.q_heads * (self.head_dim + v)


def _require_int(where, key, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"key '{key}': found {value!r}; expected an integer >= {minimum}",
                        where=where)


def _require_number(where, key, value, positive):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and not value > 0):
        raise UserError(f"key '{key}': found {value!r}; expected a number > 0", where=where)


# Geometry from the models' config.json files as tabulated in transfer-costs.md §2
# (maxtext configs, HF config pages, vLLM DeepseekV3Config); parameter counts from the
# model cards (Llama 3.1: 8.03B / 70.6B; Qwen3: 32.8B, 235B total / 22B active;
# DeepSeek-V3: 671B total / 37B active, FP8 weights).
MODEL_PRESETS: dict[str, ModelSpec] = {
    "llama-3.1-8b": ModelSpec(
        name="llama-3.1-8b", layers=32, q_heads=32, kv_heads=8, head_dim=128,
        active_params=8.03e9),
    "llama-3.1-70b": ModelSpec(
        name="llama-3.1-70b", layers=80, q_heads=64, kv_heads=8, head_dim=128,
        active_params=70.6e9),
    "qwen3-32b": ModelSpec(
        name="qwen3-32b", layers=64, q_heads=64, kv_heads=8, head_dim=128,
        active_params=32.8e9),
    "qwen3-235b-a22b": ModelSpec(
        name="qwen3-235b-a22b", layers=94, q_heads=64, kv_heads=4, head_dim=128,
        active_params=22e9, total_params=235e9),
    # MLA: 512 latent + 64 RoPE dims cached per token per layer, replicated on every
    # rank. Prefill attention runs as MHA with 128+64 = 192 qk dims and 128 v dims.
    "deepseek-v3": ModelSpec(
        name="deepseek-v3", layers=61, q_heads=128, head_dim=192, v_head_dim=128,
        kv_lora_rank=512, qk_rope_head_dim=64, active_params=37e9, total_params=671e9,
        weight_bytes=1.0),
}

_FIELDS = tuple(f.name for f in fields(ModelSpec))


def resolve_model(spec, where: str = "model") -> ModelSpec:
    """A ModelSpec from a preset name or a mapping of ModelSpec fields (a custom model).

    A mapping may name ``preset`` to start from a preset and override some fields.
    """
    if isinstance(spec, ModelSpec):
        return spec
    if isinstance(spec, str):
        try:
            return MODEL_PRESETS[spec.lower()]
        except KeyError:
            raise UserError(f"found unknown model {spec!r}; expected one of"
                            f" {', '.join(MODEL_PRESETS)} or a mapping of model fields",
                            where=where) from None
    if not isinstance(spec, dict):
        raise UserError(f"found {type(spec).__name__}; expected a preset name or a mapping",
                        where=where)
    values = dict(spec)
    base = {}
    if "preset" in values:
        preset = resolve_model(values.pop("preset"), where=f"{where}.preset")
        base = {f: getattr(preset, f) for f in _FIELDS}
    for key in values:
        if key not in _FIELDS:
            raise UserError(f"unknown key '{key}'; expected one of preset, {', '.join(_FIELDS)}",
                            where=where)
    merged = {**base, **values}
    merged.setdefault("name", "custom")
    missing = [f for f in ("layers", "q_heads", "head_dim", "active_params") if f not in merged]
    if missing:
        raise UserError(f"key '{missing[0]}' is missing; expected it for a custom model",
                        where=where)
    return ModelSpec(**merged)
