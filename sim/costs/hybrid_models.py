"""Hybrid model geometry: what a token weighs per layer type, and a Mamba state per request.

A hybrid model has two kinds of layers with two caches:

* sliding-window models (gpt-oss, Gemma 3): full-attention layers hold KV for every
  token (the FULL pool), sliding-window layers only within the window (the SWA pool);
* Mamba/linear-attention hybrids (Qwen3-Next, Nemotron-H, Jamba): full-attention
  layers hold KV per token (FULL), Mamba layers one fixed-size state per request or
  cached prefix (the Mamba pool, ``HybridReqToTokenPool.mamba_pool``).

``HybridModelSpec`` carries both, in the formulas SGLang 0.5.23 sizes its pools with:

* FULL bytes per token per rank: ``get_num_kv_heads(tp) * (head_dim + v_head_dim) *
  kv_size`` per full layer (model_executor/pool_configurator.py
  ``HybridSWAPoolConfigurator.__init__`` ``_full_per_token``, and
  ``DefaultPoolConfigurator._compute_cell_size`` over ``full_attention_layer_ids`` for a
  mambaish model);
* SWA bytes per token per rank: ``get_swa_num_kv_heads(tp) * (swa_head_dim +
  swa_v_head_dim) * kv_size`` per SWA layer (``_swa_per_token``; SWA geometry defaults
  to the full layers', configs/model_config.py ``swa_head_dim``);
* Mamba state bytes per request per rank: configs/mamba_utils.py
  ``BaseLinearStateParams.mamba_cache_per_req`` = (conv elements x conv dtype +
  temporal elements x SSM dtype) x Mamba layers, with the shapes of
  ``Mamba2StateShape.create`` (Mamba-2 / gated delta net: conv ``(conv_dim / tp,
  kernel - 1)``, ``conv_dim = intermediate + 2 * n_groups * state``; temporal
  ``(heads / tp, head_dim, state)``) or ``create_full_rank`` (Mamba-1, Jamba: conv
  ``(intermediate / tp, kernel - 1)``, temporal ``(intermediate / tp, 1, state)``).
  Dtypes: conv bf16 (``SGLANG_MAMBA_CONV_DTYPE`` unset), SSM float32 unless the model
  config names ``mamba_ssm_dtype`` (``mamba2_state_dtype``).

The FULL-only presets of ``sim.costs.models`` are untouched; ``full_spec`` gives a
``ModelSpec`` of the full-attention layers alone (what the FULL pool costs), which
the engine's cost model can take as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.costs.models import ModelSpec
from sim.errors import UserError


@dataclass(frozen=True, slots=True)
class MambaGeometry:
    """One Mamba layer's state geometry, unsharded (per model)."""

    intermediate: int      # Mamba-2: heads * head_dim; Mamba-1: expand * hidden
    state_size: int        # ssm_state_size / d_state (GDN: key head dim)
    conv_kernel: int       # conv kernel width (d_conv)
    n_groups: int = 1      # Mamba-2 B/C groups (GDN: key heads); unused for Mamba-1
    heads: int = 0         # Mamba-2 heads (GDN: value heads); 0 for Mamba-1
    head_dim: int = 0      # Mamba-2 head dim (GDN: value head dim); 0 for Mamba-1
    conv_dtype_bytes: int = 2   # bf16
    ssm_dtype_bytes: int = 4    # float32

    @property
    def full_rank(self) -> bool:
        """Mamba-1 (``Mamba2StateShape.create_full_rank``)."""
        return self.heads == 0

    def shapes(self, tp: int) -> tuple[tuple[int, int], tuple[int, int, int]]:
        """(conv shape, temporal shape) on one rank, as SGLang builds them."""
        if self.full_rank:
            if self.intermediate % tp:
                raise UserError(f"found tp={tp}; expected tp dividing the Mamba-1"
                                f" intermediate size {self.intermediate}",
                                where="mamba state")
            return ((self.intermediate // tp, self.conv_kernel - 1),
                    (self.intermediate // tp, 1, self.state_size))
        groups = self.n_groups
        if groups % tp:
            # extra_groups_for_head_shards: groups are replicated to follow the heads.
            groups += tp - groups
        conv_dim = self.intermediate + 2 * groups * self.state_size
        if conv_dim % tp or self.heads % tp:
            raise UserError(f"found tp={tp}; expected tp dividing conv_dim {conv_dim}"
                            f" and the {self.heads} Mamba heads", where="mamba state")
        return ((conv_dim // tp, self.conv_kernel - 1),
                (self.heads // tp, self.head_dim, self.state_size))

    def layer_bytes(self, tp: int) -> int:
        """One layer's state bytes on one rank."""
        (c0, c1), (t0, t1, t2) = self.shapes(tp)
        return c0 * c1 * self.conv_dtype_bytes + t0 * t1 * t2 * self.ssm_dtype_bytes


@dataclass(frozen=True, slots=True)
class HybridModelSpec:
    """A hybrid model: ``kind`` "swa" (components FULL, SWA) or "mamba" (FULL, MAMBA).

    ``full`` is the full-attention geometry with ``layers`` = the full-attention layer
    count. SWA: ``swa_layers`` and ``sliding_window`` (tokens); SWA heads default to
    the full layers'. Mamba: ``mamba_layers`` and ``mamba``."""

    name: str
    kind: str
    full: ModelSpec
    swa_layers: int = 0
    sliding_window: int = 0
    swa_kv_heads: int | None = None
    swa_head_dim: int | None = None
    mamba_layers: int = 0
    mamba: MambaGeometry | None = None
    source: str = ""

    def __post_init__(self):
        where = f"model '{self.name}'"
        if self.kind == "swa":
            if self.swa_layers < 1 or self.sliding_window < 1 or self.mamba_layers:
                raise UserError("expected swa_layers >= 1 and sliding_window >= 1, no"
                                " Mamba layers, for kind 'swa'", where=where)
        elif self.kind == "mamba":
            if self.mamba_layers < 1 or self.mamba is None or self.swa_layers:
                raise UserError("expected mamba_layers >= 1 and a Mamba geometry, no SWA"
                                " layers, for kind 'mamba'", where=where)
        else:
            raise UserError(f"found kind {self.kind!r}; expected 'swa' or 'mamba'",
                            where=where)

    @property
    def components(self) -> tuple[str, str]:
        return ("full", self.kind)

    @property
    def layers(self) -> int:
        """Layers holding a cache (MLP-only layers, as Nemotron-H's '-', hold none)."""
        return self.full.layers + self.swa_layers + self.mamba_layers

    def full_spec(self) -> ModelSpec:
        """The full-attention layers as a FULL ``ModelSpec`` (their KV and FLOPs)."""
        return self.full

    def full_bytes_per_token(self, tp: int) -> int:
        """FULL-pool bytes per token per rank (``_full_per_token * full layers``)."""
        return self.full.bytes_per_token(tp)

    def swa_bytes_per_token(self, tp: int) -> int:
        """SWA-pool bytes per token per rank (``_swa_per_token * swa layers``); 0 for
        a Mamba hybrid."""
        if self.kind != "swa":
            return 0
        heads = self.full.kv_heads if self.swa_kv_heads is None else self.swa_kv_heads
        hd = self.full.head_dim if self.swa_head_dim is None else self.swa_head_dim
        self.full.check_tp(tp)
        per_layer = max(1, heads // tp) * 2 * hd * self.full.dtype_bytes
        return per_layer * self.swa_layers

    def mamba_state_bytes(self, tp: int) -> int:
        """Mamba-pool bytes per state slot per rank (``mamba_cache_per_req``); 0 for
        an SWA hybrid."""
        if self.kind != "mamba":
            return 0
        return self.mamba.layer_bytes(tp) * self.mamba_layers


def _gqa(name, layers, q_heads, kv_heads, head_dim, active, total=None, wbytes=2.0):
    return ModelSpec(name=name, layers=layers, q_heads=q_heads, kv_heads=kv_heads,
                     head_dim=head_dim, active_params=active, total_params=total,
                     weight_bytes=wbytes)


# Layer counts, heads and windows from each model's config.json (the values below are
# those of the Hugging Face configs named in ``source``; transformers 5.19's
# GptOssConfig() and JambaConfig() defaults are gpt-oss-120b's and Jamba-v0.1's, and
# SGLang 0.5.23's NemotronHConfig() default pattern is Nemotron-H-8B's). Layer types:
# gpt-oss alternates sliding/full (``layer_types``); Gemma 3 has one global layer per 6
# (``sliding_window_pattern`` 6: layer i is full when (i + 1) % 6 == 0); Qwen3-Next one
# full layer per 4 (``full_attention_interval`` 4, configs/qwen3_next.py
# ``layers_block_type``); Nemotron-H one per '*' of ``hybrid_override_pattern``; Jamba
# one attention layer per 8 at offset 4. Parameter counts from the model cards.
# gpt-oss keeps its MoE weights in MXFP4 (4.25 bits a parameter with the block
# scales); ``weight_bytes`` 0.53 applies that to every parameter, a slight
# underestimate (attention and embeddings are bf16).
HYBRID_MODEL_PRESETS: dict[str, HybridModelSpec] = {
    "gpt-oss-20b": HybridModelSpec(
        name="gpt-oss-20b", kind="swa",
        full=_gqa("gpt-oss-20b", 12, 64, 8, 64, 3.6e9, 20.9e9, 0.53),
        swa_layers=12, sliding_window=128,
        source="openai/gpt-oss-20b config.json: 24 layers alternating sliding/full,"
               " 64 heads, 8 KV heads, head_dim 64, sliding_window 128"),
    "gpt-oss-120b": HybridModelSpec(
        name="gpt-oss-120b", kind="swa",
        full=_gqa("gpt-oss-120b", 18, 64, 8, 64, 5.1e9, 116.8e9, 0.53),
        swa_layers=18, sliding_window=128,
        source="openai/gpt-oss-120b config.json: 36 layers alternating sliding/full,"
               " 64 heads, 8 KV heads, head_dim 64, sliding_window 128"),
    "gemma-3-12b": HybridModelSpec(
        name="gemma-3-12b", kind="swa",
        full=_gqa("gemma-3-12b", 8, 16, 8, 256, 12.2e9),
        swa_layers=40, sliding_window=1024,
        source="google/gemma-3-12b-it config.json: 48 layers, sliding_window_pattern 6,"
               " 16 heads, 8 KV heads, head_dim 256, sliding_window 1024"),
    "gemma-3-27b": HybridModelSpec(
        name="gemma-3-27b", kind="swa",
        full=_gqa("gemma-3-27b", 10, 32, 16, 128, 27.4e9),
        swa_layers=52, sliding_window=1024,
        source="google/gemma-3-27b-it config.json: 62 layers, sliding_window_pattern 6,"
               " 32 heads, 16 KV heads, head_dim 128, sliding_window 1024"),
    # Gated delta net as SGLang shapes it (qwen3_next.py mamba2_cache_params):
    # intermediate = value heads 32 x 128, n_groups = key heads 16, state = key dim 128.
    "qwen3-next-80b-a3b": HybridModelSpec(
        name="qwen3-next-80b-a3b", kind="mamba",
        full=_gqa("qwen3-next-80b-a3b", 12, 16, 2, 256, 3e9, 80e9),
        mamba_layers=36,
        mamba=MambaGeometry(intermediate=32 * 128, state_size=128, conv_kernel=4,
                            n_groups=16, heads=32, head_dim=128),
        source="Qwen/Qwen3-Next-80B-A3B-Instruct config.json: 48 layers,"
               " full_attention_interval 4, 16 heads, 2 KV heads, head_dim 256;"
               " linear: 16 key heads x 128, 32 value heads x 128, conv kernel 4"),
    "nemotron-h-8b": HybridModelSpec(
        name="nemotron-h-8b", kind="mamba",
        full=_gqa("nemotron-h-8b", 4, 32, 8, 128, 8e9),
        mamba_layers=24,
        mamba=MambaGeometry(intermediate=128 * 64, state_size=128, conv_kernel=4,
                            n_groups=8, heads=128, head_dim=64),
        source="nvidia/Nemotron-H-8B-Base-8K config.json: hybrid_override_pattern of"
               " 24 M, 4 *, 24 -; 32 heads, 8 KV heads, head_dim 128; mamba 128 heads"
               " x 64, n_groups 8, ssm_state_size 128, conv kernel 4"),
    "jamba-v0.1": HybridModelSpec(
        name="jamba-v0.1", kind="mamba",
        full=_gqa("jamba-v0.1", 4, 32, 8, 128, 12e9, 52e9),
        mamba_layers=28,
        mamba=MambaGeometry(intermediate=2 * 4096, state_size=16, conv_kernel=4),
        source="ai21labs/Jamba-v0.1 config.json: 32 layers, attn_layer_period 8,"
               " offset 4, 32 heads, 8 KV heads, hidden 4096; Mamba-1 d_state 16,"
               " d_conv 4, expand 2"),
}


def resolve_hybrid_model(spec, where: str = "model") -> HybridModelSpec:
    """A HybridModelSpec from a preset name (or one itself)."""
    if isinstance(spec, HybridModelSpec):
        return spec
    if isinstance(spec, str) and spec.lower() in HYBRID_MODEL_PRESETS:
        return HYBRID_MODEL_PRESETS[spec.lower()]
    raise UserError(f"found {spec!r}; expected one of {', '.join(HYBRID_MODEL_PRESETS)}",
                    where=where)


def with_ssm_dtype(spec: HybridModelSpec, ssm_dtype_bytes: int) -> HybridModelSpec:
    """The model with another SSM state dtype (``--mamba-ssm-dtype bfloat16``: 2)."""
    if spec.kind != "mamba":
        raise UserError("has no Mamba state", where=f"model '{spec.name}'")
    return replace(spec, mamba=replace(spec.mamba, ssm_dtype_bytes=ssm_dtype_bytes))
