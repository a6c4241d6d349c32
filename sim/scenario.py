"""Scenario files: the typed schema, safe loading, ``--set`` overrides, one-line errors.

A scenario is one YAML file naming everything a run needs: the model and TP size,
the two cache tiers, the cache policies, the cost profile, jitter, the workload, the
scheduler and the limits. ``load_scenario`` reads it with ``yaml.safe_load``, applies
``--set a.b=value`` overrides, validates it against the pydantic schema below
(``extra="forbid"`` everywhere: a misspelt key is an error, never ignored) and turns
the first problem into ONE line::

    scenarios/x.yaml:12: workload.arrival.rate: found -1.0; expected a number > 0

Names in the file resolve through registries (model presets, cost profiles, policy
and distribution names); paths are relative to the scenario file's folder.
``resolve_capacities`` turns the device/host sizes into token counts with SGLang's
host pool geometry (hicache-semantics.md §6.2). ``dump_resolved`` writes the
validated scenario back as YAML, defaults filled in, in schema order.
"""

import dataclasses
import math
import os
import re
import reprlib
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from sim import __version__, safeio, sizing, yamlio
from sim.collectives import DEFAULT_TIMEOUT_S
from sim.constants import MAMBA_FULL_MEMORY_RATIO_DEFAULT as C_MAMBA_RATIO
from sim.constants import SWA_FULL_TOKENS_RATIO_DEFAULT as C_SWA_RATIO
from sim.constants import (
    CHUNKED_PREFILL_DEFAULT,
    CLIP_MAX_NEW_TOKENS,
    DEFAULT_TREE_CORE,
    HICACHE_HOST_MEMORY_FRACTION_DEFAULT,
    HICACHE_RATIO_BUFFER_ONLY,
    HICACHE_RATIO_DEFAULT,
    HICACHE_SIZE_BYTES_PER_GB,
    HOST_POOL_EXTRA_PAGES,
    LOAD_BACK_THRESHOLD,
    MAX_PREFILL_TOKENS_DEFAULT,
    MLA_DEDUP_STORAGE_BACKENDS,
    PREFETCH_POLICY_DEFAULT,
    PREFETCH_THRESHOLD_DEFAULT,
    PREFETCH_TIMEOUT_BASE_S,
    PREFETCH_TIMEOUT_PER_KI_TOKEN_S,
    SCHEDULE_POLICY_DEFAULT,
)
from sim.costs import (
    DEFAULT_PROFILE,
    IO_BACKENDS,
    MEM_LAYOUTS,
    MODEL_PRESETS,
    ModelSpec,
    PROFILES,
    load_profile,
)
from sim.costs.hybrid_models import HYBRID_MODEL_PRESETS
from sim.errors import UserError, suggest
from sim.hybrid import pools
from sim.hybrid.kinds import HYBRID_KINDS
from sim.optrace_check import MAX_PAGE_SIZE
from sim.paths import (
    PathRejected,
    SLUG_RULE,
    check_relative,
    input_roots,
    is_slug,
    resolve_input,
)
from sim.policies.eviction import EVICTION_POLICIES
from sim.policies.host import HOST_POLICIES
from sim.policies.schedule import SCHEDULE_POLICIES
from sim.policies.write import WRITE_POLICIES
from sim.sizing import fmt_capacity
from sim.workloads.dists import DISTRIBUTIONS
from sim.workloads.traces import AGENTIC_BLOCK_SIZE, MOONCAKE_BLOCK_SIZE

GIB = 1 << 30

# ----------------------------------------------------------------------------------
# Field types and error helpers
# ----------------------------------------------------------------------------------


def _no_bool(v):
    # YAML turns yes/no/on/off into booleans, and pydantic would accept them as 1/0.
    if isinstance(v, bool):
        raise PydanticCustomError("bool_not_number", "a number, not a boolean")
    return v


def _int(lo: int, hi: int):
    return Annotated[int, BeforeValidator(_no_bool), Field(ge=lo, le=hi)]


def _num(lo: float | None = None, hi: float | None = None, *, gt: float | None = None):
    return Annotated[float, BeforeValidator(_no_bool), Field(ge=lo, le=hi, gt=gt)]


Tokens = _int(1, 10**12)
Rank = _int(0, 63)
Probability = _num(0.0, 1.0)
Seconds = _num(0.0, 1e9)


def _err(found: str, expected: str, sub: str = "") -> PydanticCustomError:
    """A validation error whose text is already 'found X; expected Y'.

    ``sub`` is the key path below the model that raised it, so the message (and the
    YAML line) can point at the exact key a cross-field check is about.
    """
    return PydanticCustomError(
        "scenario", "found {found}; expected {expected}",
        {"found": found, "expected": expected, "sub": sub},
    )


_repr = reprlib.Repr()
_repr.maxstring, _repr.maxother, _repr.maxlist, _repr.maxdict, _repr.maxlevel = 60, 60, 6, 6, 2


def _show(v) -> str:
    """A short one-line repr of a found value (bounded even for huge or shared data)."""
    return _repr.repr(v).replace("\n", "\\n").replace("\r", "\\r")


class _Model(BaseModel):
    """Every scenario section: unknown keys are errors, inf/nan are rejected."""

    # A field's docstring (the string below it) is its description: in the JSON Schema
    # editors read and in docs/SCENARIO.md (sim.schema_doc). Read on their demand
    # (describe_fields), not at import: pydantic's use_attribute_docstrings reads and
    # parses each class's source while building it, a tenth of a second that loading
    # and validating a scenario (every run, every plan) does not need.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_default=True)


def _resolve_path(value: str, info: ValidationInfo, what: str, file: bool = False) -> str:
    """An existing input path inside the documented roots (``sim.paths``); absolute."""
    ctx = info.context or {}
    roots = ctx.get("roots") or input_roots(ctx.get("base_dir") or ".", ctx.get("extra_roots", ()))
    try:
        return resolve_input(value, roots, what, file=file)
    except PathRejected as e:
        raise _err(e.found, e.expected) from None


# ----------------------------------------------------------------------------------
# Distributions (token lengths, think times, jitter delays)
# ----------------------------------------------------------------------------------

_DIST_PARAMS = ("value", "low", "high", "mean", "cv")


class _DistFields(_Model):
    """A named distribution from ``sim.workloads.dists.DISTRIBUTIONS`` and its params.

    Written flat: ``{dist: lognormal, mean: 300, cv: 1.5}``; a bare number means
    ``{dist: constant, value: N}``. Exactly the distribution's parameters must be set.
    """

    value: _num(0.0, 1e12) | None = None
    """`constant`: the value."""
    low: _num(0.0, 1e12) | None = None
    """`uniform`: the lower bound."""
    high: _num(0.0, 1e12) | None = None
    """`uniform`: the upper bound."""
    mean: _num(gt=0.0, hi=1e12) | None = None
    """`exponential` and `lognormal`: the mean."""
    cv: _num(0.0, 100.0) | None = None
    """`lognormal`: the coefficient of variation (standard deviation / mean)."""

    @model_validator(mode="before")
    @classmethod
    def _bare_number(cls, v):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return {"dist": "constant", "value": v}
        return v

    @model_validator(mode="after")
    def _params_match(self):
        want = DISTRIBUTIONS[self.dist].params
        for p in _DIST_PARAMS:
            given = getattr(self, p) is not None
            if p in want and not given:
                raise _err(f"no {p!r}", f"{p!r} for dist {self.dist!r} (needs: {', '.join(want) or 'nothing'})", p)
            if given and p not in want:
                raise _err(f"{p!r}", f"only {', '.join(want) or 'no parameters'} for dist {self.dist!r}", p)
        if self.dist == "uniform" and self.low > self.high:
            raise _err(f"low {self.low:g} > high {self.high:g}", "low <= high", "low")
        return self

    def params(self) -> dict:
        return {p: getattr(self, p) for p in DISTRIBUTIONS[self.dist].params}


class Dist(_DistFields):
    """A length or time distribution (any registered name)."""

    dist: Literal[tuple(DISTRIBUTIONS)]  # type: ignore[valid-type]
    """The distribution's name (sim.workloads.dists); its parameters are the keys beside it."""


def _dist(**kw) -> Any:
    return Field(default_factory=lambda: Dist(**kw))


# ----------------------------------------------------------------------------------
# Model, TP and capacities
# ----------------------------------------------------------------------------------


class Mla(_Model):
    """MLA KV geometry: the cached latent width and the decoupled RoPE key width."""

    kv_lora_rank: _int(1, 1 << 16)
    """Width of the cached latent (the compressed KV) per token and layer."""
    qk_rope_head_dim: _int(0, 1 << 16)
    """Width of the decoupled RoPE key cached beside the latent."""


class ModelConfig(_Model):
    """``preset: <name>`` (``sim.costs.MODEL_PRESETS``), optionally with overrides, or a
    custom model: layers, q_heads, head_dim, dtype_bytes, params_b and either
    ``kv_heads`` (MHA/GQA) or ``mla: {kv_lora_rank, qk_rope_head_dim}``; or
    ``hybrid_preset: <name>`` (``sim.costs.hybrid_models.HYBRID_MODEL_PRESETS``): a
    sliding-window or Mamba hybrid, run on the unified tree with components
    (FULL, SWA) or (FULL, MAMBA) (docs/HYBRID.md §10), alone."""

    preset: str | None = None
    """A shipped model (see Model presets below); the keys beside it override its geometry."""
    # A hybrid model (sim.costs.hybrid_models.HYBRID_MODEL_PRESETS), with no other key.
    hybrid_preset: str | None = None
    layers: _int(1, 1024) | None = None
    """Transformer layers holding KV."""
    q_heads: _int(1, 4096) | None = None
    """Query heads (for the attention FLOPs)."""
    kv_heads: _int(1, 4096) | None = None
    """KV heads (MHA/GQA); a custom model gives this or `mla`."""
    head_dim: _int(1, 4096) | None = None
    """Head dimension of keys (and of values unless v_head_dim is set)."""
    v_head_dim: _int(1, 4096) | None = None
    """Head dimension of values, when it differs from head_dim."""
    dtype_bytes: _int(1, 8) | None = None
    """Bytes per KV element (2 for bf16/fp16, 1 for fp8)."""
    mla: Mla | None = None
    """Multi-head latent attention geometry (DeepSeek style), instead of kv_heads."""
    params_b: _num(gt=0.0, hi=1e5) | None = None  # active parameters, billions (FLOPs)
    total_params_b: _num(gt=0.0, hi=1e5) | None = None  # all parameters (MoE), billions
    weight_bytes: _num(gt=0.0, hi=8.0) | None = None
    """Bytes per weight parameter, for the weights' memory and read time per rank (2 bf16, 1 fp8; default: the preset's, else 2)."""

    @model_validator(mode="after")
    def _known(self):
        if self.hybrid_preset is not None:
            if self.hybrid_preset not in HYBRID_MODEL_PRESETS:
                close = suggest(self.hybrid_preset, HYBRID_MODEL_PRESETS)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise _err(f"hybrid_preset {self.hybrid_preset!r}",
                           f"one of {', '.join(HYBRID_MODEL_PRESETS)}{hint}", "hybrid_preset")
            extra = [k for k in type(self).model_fields
                     if k != "hybrid_preset" and getattr(self, k) is not None]
            if extra:
                raise _err(f"{extra[0]!r} with hybrid_preset",
                           "hybrid_preset alone (a hybrid preset's geometry is fixed)", extra[0])
            return self
        if self.preset is not None:
            if self.preset not in MODEL_PRESETS:
                close = suggest(self.preset, MODEL_PRESETS)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise _err(f"preset {self.preset!r}", f"one of {', '.join(MODEL_PRESETS)}{hint}", "preset")
        else:
            for key in ("layers", "q_heads", "head_dim", "params_b"):
                if getattr(self, key) is None:
                    raise _err(f"no {key!r}", f"{key!r} for a custom model (or a preset)", key)
            if (self.kv_heads is None) == (self.mla is None):
                raise _err("both kv_heads and mla" if self.kv_heads else "neither kv_heads nor mla",
                           "kv_heads (MHA/GQA) or mla (kv_lora_rank + qk_rope_head_dim)", "kv_heads")
        try:
            self.spec()
        except UserError as e:
            raise _err(f"an invalid model ({e})", "a consistent model geometry") from None
        return self

    def hybrid(self):
        """The ``HybridModelSpec`` of ``hybrid_preset``, or None."""
        if self.hybrid_preset is None:
            return None
        return HYBRID_MODEL_PRESETS[self.hybrid_preset]

    def spec(self):
        """The ``sim.costs.ModelSpec`` this section describes (a hybrid: its
        full-attention layers, what the FULL pool and the cost model see)."""
        if self.hybrid_preset is not None:
            return self.hybrid().full_spec()
        fields: dict = {}
        if self.preset is not None:
            base = MODEL_PRESETS[self.preset]
            fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        else:
            fields["name"] = "custom"
        for key in ("layers", "q_heads", "head_dim", "v_head_dim", "dtype_bytes", "weight_bytes"):
            if getattr(self, key) is not None:
                fields[key] = getattr(self, key)
        if self.kv_heads is not None:
            fields.update(kv_heads=self.kv_heads, kv_lora_rank=0, qk_rope_head_dim=0)
        if self.mla is not None:
            fields.update(kv_heads=0, kv_lora_rank=self.mla.kv_lora_rank,
                          qk_rope_head_dim=self.mla.qk_rope_head_dim)
        if self.params_b is not None:
            fields["active_params"] = self.params_b * 1e9
        if self.total_params_b is not None:
            fields["total_params"] = self.total_params_b * 1e9
        return ModelSpec(**fields)


#: The keys that size each tier: exactly one (device) / at most one (host) is given, so
#: ``--set host.size_gb=4`` replaces whichever unit the file used (``_apply_override``).
DEVICE_UNITS = ("tokens", "gib", "mem_fraction_static")
HOST_UNITS = ("tokens", "gib", "ratio", "size_gb", "host_memory_fraction")


class Device(_Model):
    """Device (GPU) KV capacity per rank, one of: ``tokens`` (a multiple of page_size),
    ``gib`` (rounded down to whole pages with the model's bytes per token) or
    ``mem_fraction_static`` (SGLang --mem-fraction-static: the pool SGLang would size
    on the GPU of ``cost.profile`` after this rank's weights, ``sim.sizing``; ``auto``
    takes SGLang's default for that GPU, TP size and chunked prefill)."""

    tokens: Tokens | None = None
    """The pool in KV tokens per rank, a multiple of page_size."""
    gib: _num(gt=0.0, hi=1e6) | None = None
    """The pool in GiB (2^30 bytes, as GPU memory is given) per rank, rounded down to whole pages."""
    mem_fraction_static: Union[_num(gt=0.0, hi=1.0), Literal["auto"]] | None = None
    """SGLang --mem-fraction-static: the pool SGLang sizes on cost.profile's GPU after the weights; `auto`: SGLang's default for that GPU."""
    # Hybrid models only (model.hybrid_preset; sim/hybrid/pools.py). With ``tokens``
    # (FULL tokens) the SWA pool is ``tokens * swa_full_tokens_ratio`` and the Mamba
    # pool takes ``mamba_full_memory_ratio`` x the FULL pool's bytes; with ``gib`` or
    # ``mem_fraction_static`` the budget is split as SGLang splits it.
    swa_full_tokens_ratio: _num(gt=0.0, hi=1.0) | None = None   # --swa-full-tokens-ratio
    mamba_full_memory_ratio: _num(gt=0.0, hi=100.0) | None = None  # --mamba-full-memory-ratio
    max_mamba_cache_size: _int(1, 10**7) | None = None  # --max-mamba-cache-size (state slots)

    @model_validator(mode="after")
    def _one(self):
        given = [k for k in DEVICE_UNITS if getattr(self, k) is not None]
        if len(given) != 1:
            raise _err(" and ".join(given) if given else "none of them",
                       f"exactly one of {', '.join(DEVICE_UNITS)}", given[1] if given else "tokens")
        return self

    def mode(self) -> tuple[str, Any]:
        for k in DEVICE_UNITS:
            if getattr(self, k) is not None:
                return k, getattr(self, k)
        raise AssertionError("validated Device has one unit")


def _host_off(v):
    # ``host: off`` (YAML reads it as false) or ``host: "off"``: no host tier, as a
    # server without --enable-hierarchical-cache (a single-tier radix cache).
    if v is False or (isinstance(v, str) and v.strip().lower() == "off"):
        return {"tokens": 0}
    return v


class Host(_Model):
    """Host (pinned CPU) KV capacity per rank, one of: ``tokens`` (the exact pool size, a
    multiple of page_size; 0, or ``host: off``, means no host tier), ``ratio`` (SGLang
    --hicache-ratio, x device tokens), ``size_gb`` (SGLang --hicache-size, GB of 1e9
    bytes per rank), ``gib``, or ``host_memory_fraction`` (SGLang
    --hicache-host-memory-fraction: the default ratio 2 auto-sized down to fit
    ``node.host_ram_gb``). ratio, size_gb, gib and the fraction follow SGLang's
    geometry: one extra page is added. Default: ratio 2, auto-sized with fraction 0.8
    when ``node`` is given (as SGLang does on a real machine)."""

    tokens: _int(0, 10**12) | None = None
    """The pool in KV tokens per rank, a multiple of page_size; 0 (or `host: off`): no host tier."""
    gib: _num(gt=0.0, hi=1e7) | None = None
    """The pool in GiB (2^30 bytes) per rank (plus SGLang's one page)."""
    ratio: _num(gt=0.0, hi=1e4) | None = None
    """SGLang --hicache-ratio: the pool as a multiple of the device pool's tokens (plus one page)."""
    size_gb: _num(gt=0.0, hi=1e7) | None = None
    """SGLang --hicache-size: the pool in GB (1e9 bytes) per rank (plus one page)."""
    host_memory_fraction: _num(gt=0.0, hi=1.0) | None = None
    """SGLang --hicache-host-memory-fraction: the default ratio 2, sized down to fit this share of node.host_ram_gb."""
    # A Mamba hybrid's host state slots (the MambaPoolHost size, as given), overriding what the
    # sizing unit gives; required with ``tokens``.
    mamba_states: _int(1, 10**9) | None = None
    # An SWA hybrid's host SWA pool in tokens (the SWA host pool's size, as given),
    # overriding what the sizing unit gives; required with ``tokens``.
    swa_tokens: _int(1, 10**12) | None = None
    # MLA host dedup (mem_cache/mla_host_dedup.py): the host pool's payload lives on
    # attn-TP rank 0 only (the peers' pools are allocator-only, MLAHostAllocation:
    # no buffer), so a node holds one host copy per TP group; a load-back is the
    # owner's H2D plus a layerwise NCCL broadcast to the peers. Off by default, as in
    # SGLang: 0.5.23 ships the dedup code but no flag engages it on the HiCache path
    # (maybe_create_mla_host_dedup_context has no caller; --enable-linker-mla-dedup
    # is the Mooncake linker's, exclusive with --enable-hierarchical-cache).
    mla_dedup: bool = False

    @model_validator(mode="before")
    @classmethod
    def _off(cls, v):
        return _host_off(v)

    @model_validator(mode="after")
    def _at_most_one(self):
        given = [k for k in HOST_UNITS if getattr(self, k) is not None]
        if len(given) > 1:
            raise _err(f"{' and '.join(given)}", f"one of {', '.join(HOST_UNITS)}", given[1])
        return self

    def mode(self) -> tuple[str, float]:
        """The sizing unit given, or ("default", ratio 2) when none is."""
        for k in HOST_UNITS:
            if getattr(self, k) is not None:
                return k, getattr(self, k)
        return "default", HICACHE_RATIO_DEFAULT

    @property
    def off(self) -> bool:
        return self.tokens == 0


class Node(_Model):
    """The machine the ranks run on: the host RAM available to SGLang (GB of 1e9 bytes,
    what psutil reports available, cgroup-bounded) and its GPUs. SGLang gives each local
    rank (RAM - 10 GiB) / ranks-per-node and refuses to start when a host pool exceeds
    it (mem_cache/pool_host/base.py); ``on_exceed: warn`` runs anyway and records it."""

    host_ram_gb: _num(gt=0.0, hi=1e7)
    """Host RAM available to SGLang, GB (1e9 bytes): what psutil reports available."""
    gpus: _int(1, 1024) = 8
    """GPUs on the node: how many ranks share its host RAM."""
    on_exceed: Literal["refuse", "warn"] = "refuse"
    """A host pool beyond the node's RAM per rank: `refuse` as SGLang does, or `warn` and run anyway."""


# ----------------------------------------------------------------------------------
# Cache, costs, collectives, jitter
# ----------------------------------------------------------------------------------

def _policy_names():
    return tuple(WRITE_POLICIES), tuple(HOST_POLICIES), tuple(EVICTION_POLICIES)


_WRITE, _HOSTP, _EVICT = _policy_names()


def _registry_names():
    from sim.policies.sync import SYNC_DISCIPLINES
    from sim.storage.policy import PREFETCH_POLICIES

    return tuple(SYNC_DISCIPLINES), tuple(PREFETCH_POLICIES)


_DISCIPLINES, _PREFETCH = _registry_names()


class Cache(_Model):
    """The HiCache tree's policies (names from the ``sim.policies`` registries)."""

    write_policy: Literal[_WRITE] = "write_through"  # type: ignore[valid-type]  # SGLang default (sem §7)
    host_policy: Literal[_HOSTP] = "duplicate_first"  # type: ignore[valid-type]  # PR #33777
    eviction_policy: Literal[_EVICT] = "lru"  # type: ignore[valid-type]
    """Which device node is evicted first (SGLang --radix-eviction-policy)."""
    load_back_threshold: _int(0, 10**9) = LOAD_BACK_THRESHOLD
    """Host-hit tokens below which a match is not loaded back (SGLang's load_back_threshold)."""
    # A hybrid model's trees model the Python core only: the default is python there.
    tree_core: Literal["rust", "python"] = DEFAULT_TREE_CORE
    """The tree core: rust (what a default 0.5.23 server runs: its handles and digest, sem §4.6) or python (UnifiedTreeCore, SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python)."""
    # Node ids: as a started 0.5.23 server has them (so digests in divergence.json are
    # the values the server would print; Python core: first node 10, Rust: 2), as a bare
    # tree core has them (Python: first node 5, Rust: 1), or as op-traces number them
    # (first node 1).
    ids: Literal["server", "sglang", "optrace"] = "server"
    # An SWA hybrid only: SGLANG_OPT_RELEASE_PREFILL_SWA (unset: off, SGLang's default),
    # a request's prefill SWA lock released once decode passes the window
    # (docs/HYBRID.md §10).
    release_prefill_swa: bool | None = None


def _cost_names():
    return DEFAULT_PROFILE, tuple(IO_BACKENDS), tuple(MEM_LAYOUTS)


_DEFAULT_PROFILE, _IO, _LAYOUTS = _cost_names()


class Cost(_Model):
    """The cost profile (a shipped name or a path to a YAML profile) and the I/O path."""

    profile: str = _DEFAULT_PROFILE
    """A shipped GPU profile (see GPU profiles below) or a path to a profile YAML (`hicache-sim calibrate` writes one)."""
    io_backend: Literal[_IO] = "kernel"  # type: ignore[valid-type]  # SGLang default (sem §7)
    mem_layout: Literal[_LAYOUTS] = "page_first"  # type: ignore[valid-type]  # SGLang default

    @field_validator("profile")
    @classmethod
    def _profile(cls, v: str, info: ValidationInfo) -> str:
        if v in PROFILES:
            return v
        if not (v.endswith((".yaml", ".yml")) or "/" in v):
            close = suggest(v, PROFILES)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _err(f"profile {v!r}", f"one of {', '.join(PROFILES)} or a path to a .yaml profile{hint}")
        path = _resolve_path(v, info, "a cost profile YAML", file=True)
        load_profile(path)  # a bad profile file is its own one-line UserError
        return path


class Collective(_Model):
    """The TP group's collectives: how they are computed (simulated, or real
    torch.distributed: gloo on cpu, NCCL on cuda), which SGLang code issues the per-step
    cache sync (``discipline``), and how long a blocked real call waits before it is
    reported as a hang.

    ``discipline``: ``synced`` is 0.5.23 (one MIN all_reduce of ready write and load
    acks and the digest every step); ``pre_26921`` is the code before sglang #26921 /
    #27489 (separate write and load checks, each skipped by a rank with nothing of
    that kind in flight); ``local`` lets each rank pop its own ready acks (a bug mode).
    """

    backend: Literal["simulated", "torch"] = "simulated"
    """`simulated` computes the reductions in process; `torch` runs them through torch.distributed, one process per rank."""
    device: Literal["cpu", "cuda"] = "cpu"
    """The torch backend's device: `cpu` (gloo) or `cuda` (NCCL)."""
    discipline: Literal[_DISCIPLINES] = "synced"  # type: ignore[valid-type]
    """Which SGLang code issues the per-step cache sync (see the section text)."""
    timeout_s: _num(gt=0.0, hi=3600.0) = DEFAULT_TIMEOUT_S
    """Seconds a blocked torch collective waits before it is reported as a hang."""
    forward: Literal["all_reduce", "none"] = "all_reduce"
    """The forward's TP collective: `all_reduce` (a model's, on the device group: ranks with different token counts meet there); `none`: a stub forward with no collective, as the SGLang server harness's fake worker runs (server_oracle.py `install_forward`), for comparison with it."""
    rank_consensus: bool = False
    """SGLang's rank consensus checker (utils/rank_consensus_checker.py, sglang #34406; off unless SGLANG_ENABLE_RANK_CONSENSUS_CHECKER is set): each rank logs its @rank_consensus calls (match_prefix, insert, evict_for_alloc, write_backup_storage, _can_terminate_prefetch, check_prefetch_progress) with the selected params and results; the first call that differs across ranks kills the server ("Found rank divergence"), where it was made (sim.consensus)."""


class Router(_Model):
    """How requests are spread over the ``dp`` instances (``sim.router``).

    ``cache_aware`` is sgl-router's cache-aware policy; its defaults are the router's
    (`--cache-threshold 0.3 --balance-abs-threshold 64 --balance-rel-threshold 1.5`,
    sgl-model-gateway docs, load balancing). ``max_tree_tokens``: the size its
    approximate trees are trimmed to (`--max-tree-size` is 2**26 characters; at about
    4 characters a token that is 2**24 tokens). Those four apply to ``cache_aware``
    only: setting one with another policy is an error, since it would change nothing.
    """

    policy: Literal["round_robin", "least_load", "cache_aware"] = "round_robin"
    """`round_robin`, `least_load` (fewest running plus waiting) or sgl-router's `cache_aware`."""
    cache_threshold: Probability = 0.3
    """cache_aware: the prefix-match share above which a request goes to the best-matching instance."""
    balance_abs_threshold: _int(0, 10**9) = 64
    """cache_aware: the load gap (requests) beyond which the least-loaded instance is chosen."""
    balance_rel_threshold: _num(1.0, 1e6) = 1.5
    """cache_aware: the load ratio beyond which the least-loaded instance is chosen."""
    max_tree_tokens: _int(1, 10**12) = 1 << 24
    """cache_aware: the tokens each approximate tree is trimmed to."""

    @model_validator(mode="after")
    def _cache_aware_only(self):
        extra = sorted(set(self.model_fields_set) - {"policy"})
        if extra and self.policy != "cache_aware":
            raise _err(f"{extra[0]} with policy {self.policy!r}",
                       "it only with policy 'cache_aware' (it changes nothing otherwise)", extra[0])
        return self

    def params(self) -> dict:
        if self.policy != "cache_aware":
            return {}
        return {"cache_threshold": self.cache_threshold,
                "balance_abs_threshold": self.balance_abs_threshold,
                "balance_rel_threshold": self.balance_rel_threshold,
                "max_tree_tokens": self.max_tree_tokens}


class AckDelaySteps(_Model):
    """Steps from a copy's issue to the poll that acks it (the harness's
    ``--d2h-delay-steps`` / ``--h2d-delay-steps``)."""

    d2h: _int(1, 10**6) = 1
    """Device -> host copies: write-through backups (a write_back eviction's blocking backup completes at once)."""
    h2d: _int(1, 10**6) = 1
    """Host -> device copies: load-backs."""


class Engine(_Model):
    """How the simulator keeps the ranks' replicas. ``shared``: ranks share one tree
    until a rank-specific event forks one off; ``eager``: one tree per rank from the
    start. Either way, replicas whose whole state is equal again merge back into one.
    Both give byte-identical results (the option exists to check that), as do both
    settings of ``decode_runs`` and ``check_invariants``."""

    replicas: Literal["shared", "eager"] = "shared"
    """`shared`: ranks share one tree until a rank-specific event forks one; `eager`: one tree per rank from t=0. Either way, replicas that are equal again merge back."""
    decode_runs: bool = True
    """`true` (default): decode steps that need no memory work on any replica run together, priced at once; `false`: one decode step per iteration, each doing its memory work (the reference loop the runs must match byte for byte)."""
    check_invariants: bool = False
    """`true`: every replica's invariants (the tree's ledgers, leaf sets, LRUs, locks, host tier; a hybrid's request slots and SWA against its pools) are recomputed at each compare point (every iteration, after each prefill and each batch of finishes); a broken one stops the run with an InvariantError naming it. Slow: whole-tree walks."""
    clock: Literal["time", "steps"] = "time"
    """`time` (default): iterations cost what the cost model says. `steps`: one scheduler iteration is one step (the SGLang server harness's clock, for step-by-step comparison with it); arrivals are a generic trace's `arrival_step`."""
    ack_delay_steps: AckDelaySteps | None = None
    """Under `clock: steps`: a copy issued in step k is acked by the poll of step k+N."""

    @model_validator(mode="after")
    def _steps_only(self):
        if self.ack_delay_steps is not None and self.clock != "steps":
            raise _err("ack_delay_steps with clock 'time'",
                       "clock 'steps' (under the time clock copies take what the cost model says)",
                       "ack_delay_steps")
        return self


class Fault(_Model):
    """One scripted fault on one rank, as the SGLang TP-2 harness's ``--fault`` hooks
    act (../shared/oracle/server/instrument.py ``Instrument._install_fault``), under
    ``engine.clock: steps``."""

    rank: _int(0, 63)
    """The rank the fault acts on."""
    kind: Literal["host_alloc_fail", "ack_delay", "reclaim_skip"]
    """`host_alloc_fail`: the host pool's alloc returns None once, at the first backup at or after `step`. `ack_delay`: copies recorded in steps `step`..`step`+20 complete `extra_steps` steps later. `reclaim_skip`: Python core: every duplicate reclaim of the first reclaiming step >= `step` is skipped (the host copy stays); Rust core: this rank's digest is perturbed after its first reclaiming host eviction >= `step`."""
    step: _int(0, 10**9)
    """The first step at which the fault may act."""
    extra_steps: _int(1, 10**6) | None = None
    """`ack_delay` only (required there): the steps each delayed copy completes late."""

    @model_validator(mode="after")
    def _extra(self):
        if self.kind == "ack_delay" and self.extra_steps is None:
            raise _err("ack_delay without extra_steps", "extra_steps (the steps a copy is late)",
                       "extra_steps")
        if self.kind != "ack_delay" and self.extra_steps is not None:
            raise _err(f"extra_steps with kind {self.kind!r}", "extra_steps on ack_delay only",
                       "extra_steps")
        return self


class Storage(_Model):
    """The L3 storage tier below the host (SGLang's ``--hicache-storage-backend``,
    docs/STORAGE.md). Absent: no L3. Each TP rank has its own backend (its own page
    keys, its own read and write engine); prefetch hits are MIN-reduced over the ranks.

    ``backend``: a cost shape of ``sim.storage.backends.BACKENDS`` (per rank: op
    latency plus bytes at the read or write bandwidth); ``read_gbps``, ``write_gbps``
    and ``op_latency_us`` override its figures (null: the registry's). The prefetch
    knobs are SGLang's (``--hicache-storage-prefetch-policy`` and the extra_config
    keys ``prefetch_threshold``, ``prefetch_timeout_base``,
    ``prefetch_timeout_per_ki_token``). Needs ``collective.discipline: synced``.
    ``attn_cp_size`` (SGLang ``--attn-cp-size``, dividing ``tp``): attention context
    parallelism, which only decides which ranks write each page to storage
    (``sim.storage.collectives.unwritten_ranks``; for an MLA model, 0.5.23 writes from
    global TP rank 0 only, so the other CP coordinates' shards stay empty).

    ``capacity_gb``: each rank's storage size (GB of 1e9 bytes of its KV shard; null:
    unbounded, as SGLang's ``sim`` backend, which keeps every key). When a finished
    write would overflow it, the least recently written or read pages go first
    (``sim.storage.view.StorageView``; the file backend's ``LRUFileEvictor`` order,
    an assumption for the others, docs/STORAGE.md §7).
    """

    backend: Literal["sim", "mooncake", "3fs", "nixl", "file"] = "sim"
    """The backend's cost shape (sim.storage.backends): op latency plus bytes at its read or write bandwidth per rank."""
    read_gbps: _num(gt=0.0, hi=1e6) | None = None
    """Read bandwidth per rank, GB/s (null: the backend's)."""
    write_gbps: _num(gt=0.0, hi=1e6) | None = None
    """Write bandwidth per rank, GB/s (null: the backend's)."""
    op_latency_us: _num(0.0, 1e9) | None = None
    """Latency of each storage op, microseconds (null: the backend's)."""
    capacity_gb: _num(0.0, 1e9) | None = None
    """Each rank's storage size, GB (1e9 bytes) of its KV shard; null: unbounded. Overflow evicts the least recently used pages."""
    prefetch_policy: Literal[_PREFETCH] = PREFETCH_POLICY_DEFAULT  # type: ignore[valid-type]
    """SGLang --hicache-storage-prefetch-policy: when a prefetch is cut off."""
    prefetch_threshold: _int(0, 10**12) = PREFETCH_THRESHOLD_DEFAULT
    """Tokens a storage hit must reach to be prefetched (SGLang's prefetch_threshold)."""
    prefetch_timeout_base: Seconds = PREFETCH_TIMEOUT_BASE_S
    """`timeout` policy: seconds every prefetch may take."""
    prefetch_timeout_per_ki_token: Seconds = PREFETCH_TIMEOUT_PER_KI_TOKEN_S
    """`timeout` policy: extra seconds per 1024 prefetched tokens."""
    attn_cp_size: _int(1, 4096) = 1
    """SGLang --attn-cp-size (dividing tp): which ranks write each page to storage."""
    # SGLang --hicache-host-memory-mode (sim.storage.policy.resolve_host_mode): ``cache``
    # (the host pool is a tier of the tree) or ``buffer_only`` (the host pool only stages
    # KV between device and storage; the tree holds no host values, docs/STORAGE.md §9).
    # buffer_only turns write_back into write_through and defaults the host ratio to 1.2.
    host_memory_mode: Literal["cache", "buffer_only"] = "cache"


_DELAY_DISTS = ("none", "uniform", "exponential", "lognormal")


class AckDelay(_DistFields):
    """Extra completion delay (seconds) of transfer acks on some ranks."""

    dist: Literal[_DELAY_DISTS] = "none"  # type: ignore[valid-type]
    """The delay's distribution, seconds (`none`: no delay)."""
    ranks: list[Rank] | None = None  # None: every rank
    acks: Literal["write", "load", "both"] = "both"
    """Which acks are late: write (backup) acks, load-back acks, or both."""


class HostAllocFailure(_Model):
    """A host allocation fails on some ranks with this probability, per attempt
    (sem §5.4.b; sglang #28429: ``write_backup`` enqueues only where it succeeds)."""

    probability: Probability = 0.0
    """Chance that one host allocation attempt fails."""
    ranks: list[Rank] | None = None
    """The ranks it fails on (null: every rank)."""


class DeviceFreeDelay(_DistFields):
    """A finished request's private device KV returns to these ranks' allocators late,
    by a drawn delay in seconds (sglang #33442: load-back sizes from rank-local free
    device space)."""

    dist: Literal[_DELAY_DISTS] = "none"  # type: ignore[valid-type]
    """The delay's distribution, seconds (`none`: no delay)."""
    ranks: list[Rank] | None = None  # None: every rank


class IdDrift(_Model):
    """One rank's node-id counter jumps by ``extra_ids`` after request ``after_request``
    (sem §5.4.d: a false-positive digest crash)."""

    rank: Rank = 1
    """The rank whose node-id counter jumps."""
    extra_ids: _int(0, 10**9) = 1
    """How many ids it skips."""
    after_request: _int(0, 10**12) = 0
    """The request id after which it jumps."""


class RequestOrder(_Model):
    """Some ranks see adjacent requests swapped, within a window, with a probability."""

    ranks: list[Rank] | None = None
    """The ranks that see swapped requests (null: every rank)."""
    swap_probability: Probability = 0.0
    """Chance that two adjacent requests are swapped."""
    window: _int(2, 1024) = 2
    """Requests within which a swap may move one."""


class StorageMiss(_Model):
    """Pages absent from some ranks' storage (a backend that lost or never stored
    them): each page key is missing on such a rank with this probability, the same
    draw every time it is asked. Needs ``storage:``."""

    probability: Probability = 0.0
    """Chance that a page key is missing on such a rank (the same draw every time)."""
    ranks: list[Rank] | None = None
    """The ranks whose storage lacks pages (null: every rank)."""


class StorageFail(_Model):
    """These ranks' storage backends fail every query (their hits are 0; through the
    MIN, every rank's). Needs ``storage:``."""

    ranks: list[Rank] = Field(default_factory=list)
    """The ranks whose storage fails every query."""


class StorageLatency(_DistFields):
    """A slow storage backend on some ranks: each storage call there (a query, a
    prefetch read batch, a write) takes ``factor`` times its backend cost, plus a drawn
    extra delay in seconds (``dist``, per call). A slow rank delays every rank's
    prefetches through the rank-agreed (MIN) hits, progress and drain counts, and so
    their timeout votes (docs/STORAGE.md §7). Needs ``storage:``."""

    factor: _num(gt=0.0, hi=1e6) = 1.0
    """Each storage call's backend cost is multiplied by this."""
    dist: Literal[_DELAY_DISTS] = "none"  # type: ignore[valid-type]
    """An extra delay per call, seconds (`none`: none)."""
    ranks: list[Rank] | None = None  # None: every rank


class Jitter(_Model):
    """Rank-level perturbations and faults; all default off. Each draw is keyed by
    (``seed``, rank, event); ``seed`` defaults to the scenario's. Capacity skews are
    per-rank deltas in tokens."""

    seed: _int(0, 2**63 - 1) | None = None
    """Seed of the jitter's draws (default: the scenario's seed)."""
    ack_delay: AckDelay = Field(default_factory=AckDelay)
    """Late transfer acks on some ranks."""
    host_alloc_failure: HostAllocFailure = Field(default_factory=HostAllocFailure)
    """Host allocations failing on some ranks."""
    host_capacity_skew: dict[Rank, _int(-(10**12), 10**12)] = Field(default_factory=dict)
    """Per-rank change of the host pool, tokens ({rank: delta})."""
    device_capacity_skew: dict[Rank, _int(-(10**12), 10**12)] = Field(default_factory=dict)
    """Per-rank change of the device pool, tokens ({rank: delta})."""
    device_free_delay: DeviceFreeDelay = Field(default_factory=DeviceFreeDelay)
    """Late device frees on some ranks."""
    id_drift: IdDrift | None = None
    """One rank's node ids drifting (a false-positive digest)."""
    request_order: RequestOrder = Field(default_factory=RequestOrder)
    """Adjacent requests swapped on some ranks."""
    storage_miss: StorageMiss = Field(default_factory=StorageMiss)
    """Pages missing from some ranks' storage."""
    storage_fail: StorageFail = Field(default_factory=StorageFail)
    """Storage backends failing every query on some ranks."""
    storage_latency: StorageLatency = Field(default_factory=StorageLatency)
    """Slow storage backends on some ranks."""


# ----------------------------------------------------------------------------------
# Workloads
# ----------------------------------------------------------------------------------


class Poisson(_Model):
    """Exponential gaps, ``rate`` arrivals (requests or sessions) per second."""

    process: Literal["poisson"]
    """Exponential gaps between arrivals."""
    rate: _num(gt=0.0, hi=1e7)
    """Arrivals (requests, or sessions for session workloads) per second."""


class Bursty(_Model):
    """Gamma gaps with mean 1/rate and coefficient of variation ``cv`` (1 = Poisson)."""

    process: Literal["bursty"]
    """Gamma gaps: burstier than Poisson when cv > 1."""
    rate: _num(gt=0.0, hi=1e7)
    """Mean arrivals per second."""
    cv: _num(gt=0.0, hi=100.0) = 2.0
    """Coefficient of variation of the gaps (1: Poisson)."""


class TraceArrival(_Model):
    """Arrival times read from a file: a mooncake or generic trace, or ``lines`` (one
    time in seconds per line)."""

    process: Literal["trace"]
    """Arrival times read from a file."""
    path: str
    """The file (resolved under the scenario's folder, data/ and --trace-root)."""
    format: Literal["mooncake", "generic", "lines"] = "lines"
    """`lines`: one time in seconds per line; `mooncake` or `generic`: the trace's timestamps."""
    skip_bad_lines: bool = False
    """Skip malformed lines (counted in summary.json) instead of failing."""

    @field_validator("path")
    @classmethod
    def _path(cls, v, info: ValidationInfo):
        return _resolve_path(v, info, "a timestamp file", file=True)


Arrival = Annotated[Union[Poisson, Bursty, TraceArrival], Field(discriminator="process")]


class _Generator(_Model):
    block_size: _int(1, 1 << 20) = 64
    """Tokens per content block: the unit the generator shares between requests."""
    num_requests: _int(1, 10**9) = 1000
    """Requests to generate."""
    arrival: Arrival = Field(default_factory=lambda: Poisson(process="poisson", rate=1.0))
    """When requests (or sessions) arrive."""
    rate_scale: _num(gt=0.0, hi=1e6) = 1.0
    """Multiplies the arrival rate (or divides a trace's gaps)."""
    output_tokens: Dist = _dist(dist="lognormal", mean=256, cv=1.0)
    """Decode tokens per request."""


class MultiTurnChat(_Generator):
    """Chat sessions (arriving by ``arrival``) with a few shared system prompts."""

    kind: Literal["multi_turn_chat"]
    """Chat sessions sharing a few system prompts, each turn extending the last."""
    num_system_prompts: _int(1, 10**6) = 4
    """Distinct system prompts the sessions share."""
    system_prompt_tokens: Dist = _dist(dist="constant", value=1024)
    """Length of a system prompt, tokens."""
    turns: Dist = _dist(dist="exponential", mean=5)
    """Turns per session."""
    user_tokens: Dist = _dist(dist="lognormal", mean=200, cv=1.0)
    """Tokens a user adds per turn."""
    think_time_s: Dist = _dist(dist="exponential", mean=30)
    """Seconds between a reply and the next turn."""
    max_context_tokens: Tokens = 32768
    """A session ends when its context would exceed this."""


class AgenticToolLoop(_Generator):
    """Agent sessions: a long shared tools/system prefix, a task, many short steps."""

    kind: Literal["agentic_tool_loop"]
    """Agent sessions: a shared tools prefix, a task, many short tool steps."""
    num_shared_prefixes: _int(1, 10**6) = 1
    """Distinct tools/system prefixes the sessions share."""
    shared_prefix_tokens: Dist = _dist(dist="constant", value=12000)
    """Length of a shared prefix, tokens."""
    task_tokens: Dist = _dist(dist="lognormal", mean=1500, cv=0.5)
    """Length of a session's task, tokens."""
    steps: Dist = _dist(dist="lognormal", mean=20, cv=1.0)
    """Tool steps per session."""
    step_tokens: Dist = _dist(dist="lognormal", mean=400, cv=1.5)
    """Tokens a tool result adds per step."""
    tool_time_s: Dist = _dist(dist="exponential", mean=2)
    """Seconds a tool call takes between steps."""
    max_context_tokens: Tokens = 131072
    """A session ends when its context would exceed this."""
    output_tokens: Dist = _dist(dist="lognormal", mean=150, cv=1.0)
    """Decode tokens per step."""


class FewShot(_Generator):
    """A few templates shared by many requests (``template_zipf_s`` 0: uniform)."""

    kind: Literal["few_shot"]
    """Requests sharing a few long templates, each with its own suffix."""
    num_templates: _int(1, 10**6) = 8
    """Distinct templates."""
    template_tokens: Dist = _dist(dist="constant", value=2048)
    """Length of a template, tokens."""
    template_zipf_s: _num(0.0, 10.0) = 0.0
    """Zipf exponent of template popularity (0: uniform)."""
    suffix_tokens: Dist = _dist(dist="lognormal", mean=256, cv=1.0)
    """Length of a request's own suffix, tokens."""


class ZipfDocuments(_Generator):
    """RAG: a shared instruction, a Zipf-popular document, a unique question."""

    kind: Literal["zipf_documents"]
    """RAG requests: a shared instruction, a Zipf-popular document, a unique question."""
    num_documents: _int(1, 10**7) = 1000
    """Documents in the corpus."""
    document_tokens: Dist = _dist(dist="lognormal", mean=4096, cv=0.5)
    """Length of a document, tokens."""
    zipf_s: _num(0.0, 10.0) = 1.0
    """Zipf exponent of document popularity."""
    system_prompt_tokens: _int(0, 10**7) = 256
    """Length of the shared instruction, tokens."""
    question_tokens: Dist = _dist(dist="lognormal", mean=64, cv=0.5)
    """Length of a question, tokens."""


class Uniform(_Generator):
    """Independent requests of fresh blocks only: no reuse at all (a control)."""

    kind: Literal["uniform"]
    """Independent requests of fresh blocks: no reuse (a control)."""
    input_tokens: Dist = _dist(dist="uniform", low=512, high=8192)
    """Input length per request, tokens."""


class ConversationStart(_Model):
    """Agentic traces: when each conversation starts (file order)."""

    mode: Literal["zero", "poisson"] = "zero"
    """`zero`: every conversation starts at once; `poisson`: at `rate` per second."""
    rate: _num(gt=0.0, hi=1e6) | None = None  # conversations per second (poisson)

    @model_validator(mode="after")
    def _rate(self):
        if self.mode == "poisson" and self.rate is None:
            raise _err("no 'rate'", "a rate (conversations per second) for mode poisson", "rate")
        if self.mode == "zero" and self.rate is not None:
            raise _err("'rate'", "no rate for mode zero (every conversation starts at 0)", "rate")
        return self


class Trace(_Model):
    """A request trace, streamed (``sim.workloads.traces``): ``mooncake`` (JSONL),
    ``agentic`` (a folder of conversation JSON files, or one) or ``generic``."""

    kind: Literal["trace"]
    """Requests read from a trace file, streamed."""
    format: Literal["mooncake", "agentic", "generic"]
    """`mooncake` (JSONL with hash ids), `agentic` (conversation JSON files) or `generic` (JSONL, scenarios/README.md)."""
    path: str
    """The trace file or folder (resolved under the scenario's folder, data/, $HICACHE_TRACE_CACHE and --trace-root)."""
    rate_scale: _num(gt=0.0, hi=1e6) = 1.0
    """Divides the trace's inter-arrival gaps (2: twice as fast)."""
    skip_bad_lines: bool = False
    """Skip malformed lines (counted in summary.json) instead of failing."""
    # mooncake: 512 by default; generic: used for rows without block_size; agentic:
    # always the file's own block_size.
    block_size: _int(1, 1 << 20) | None = None
    block_ids: Literal["prefix", "content"] = "prefix"  # generic only
    conversation_start: ConversationStart | None = None  # agentic only

    @field_validator("path")
    @classmethod
    def _path(cls, v, info: ValidationInfo):
        return _resolve_path(v, info, "a trace file or folder")

    @model_validator(mode="after")
    def _format_fields(self):
        if self.format != "agentic" and self.conversation_start is not None:
            raise _err("conversation_start", "it only with format agentic", "conversation_start")
        if self.format == "agentic" and self.block_size is not None:
            raise _err("block_size", "none for format agentic (each file names its own)", "block_size")
        if self.format != "generic" and self.block_ids != "prefix":
            raise _err(f"block_ids {self.block_ids!r}", "block_ids only with format generic", "block_ids")
        if self.format == "generic" and Path(self.path).is_dir():
            raise _err("a folder", "a generic trace file (.jsonl or .csv)", "path")
        if self.format == "mooncake" and Path(self.path).is_dir():
            raise _err("a folder", "a Mooncake .jsonl file", "path")
        return self

    def trace_block_size(self) -> int | None:
        """The block size the trace will use, when it is known without reading it."""
        if self.format == "mooncake":
            return self.block_size or MOONCAKE_BLOCK_SIZE
        if self.format == "agentic":
            return AGENTIC_BLOCK_SIZE
        return self.block_size


_Part = Annotated[
    Union[MultiTurnChat, AgenticToolLoop, FewShot, ZipfDocuments, Uniform, Trace],
    Field(discriminator="kind"),
]


class Mix(_Model):
    """Several workloads merged by arrival, each in its own id and session namespace."""

    kind: Literal["mix"]
    """Several workloads merged by arrival time."""
    parts: Annotated[list[_Part], Field(min_length=1, max_length=64)]
    """The workloads (any kind but mix), each in its own id namespace."""


Workload = Annotated[
    Union[MultiTurnChat, AgenticToolLoop, FewShot, ZipfDocuments, Uniform, Trace, Mix],
    Field(discriminator="kind"),
]


# ----------------------------------------------------------------------------------
# Scheduler, limits, output, the scenario
# ----------------------------------------------------------------------------------


def _schedule_names():
    return tuple(SCHEDULE_POLICIES), {k: p.cache_aware for k, p in SCHEDULE_POLICIES.items()}


_SCHEDULE, SCHEDULE_CACHE_AWARE = _schedule_names()


class Scheduler(_Model):
    """Simulator defaults (not SGLang constants: SGLang sizes these from GPU memory).

    ``mode: cache_replay`` is a preset, not an engine knob: it means
    ``max_running_requests: 1`` and ``decode: false`` (one request at a time, no
    decode), a pure cache replay whose hit rates compare with one-pass cache models and
    published hit-rate-vs-capacity curves. Setting either key to something else
    alongside it is an error."""

    mode: Literal["serve", "cache_replay"] = "serve"
    """`serve` runs SGLang's scheduler; `cache_replay`: one request at a time, no decode."""
    max_running_requests: _int(1, 10**6) | None = None  # None: bounded by device memory
    # SGLang --chunked-prefill-size (default: its value on a 35-160 GiB GPU); None: no chunking.
    chunked_prefill_tokens: _int(1, 10**9) | None = CHUNKED_PREFILL_DEFAULT
    # SGLang --max-prefill-tokens: extend tokens one prefill batch may add.
    max_prefill_tokens: _int(1, 10**9) = MAX_PREFILL_TOKENS_DEFAULT
    # SGLang --schedule-conservativeness: scales the new-token ratio that admission
    # charges running requests' remaining decode with (larger: fewer retractions).
    schedule_conservativeness: _num(gt=0.0, hi=100.0) = 1.0
    decode: bool = True
    """Simulate decode steps (their time, page growth and retractions)."""
    schedule_policy: Literal[_SCHEDULE] = SCHEDULE_POLICY_DEFAULT  # type: ignore[valid-type]
    """SGLang --schedule-policy (SchedulePolicy.calc_priority; sim/policies/schedule.py)."""
    clip_max_new_tokens: _int(1, 10**9) = CLIP_MAX_NEW_TOKENS
    """SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: admission's estimate of a request's decode tokens is clipped to this (smaller: more admitted, more retractions)."""
    ignore_eos: bool = False
    """SGLang's sampling param `ignore_eos` on every request (the server harness sets it: its stub forward never emits EOS). Admission then charges running requests' remaining decode in full instead of times the new-token ratio (schedule_policy.py `_get_running_request_total_token_offset`)."""
    overlap: bool = True
    """SGLang's default loop, `event_loop_overlap`: each batch's results are processed in the next iteration, after it has scheduled and launched its own batch (false: `event_loop_normal`, SGLang's --disable-overlap-schedule)."""
    overlap_timing: Literal["serial", "pipelined"] = "pipelined"
    """How the overlap loop spends time. `pipelined` (the default with `overlap` true on the time clock): each forward holds the GPU resource while the scheduler goes on with the next iteration's CPU work (its cache sync, admission, the last batch's results), as `event_loop_overlap` runs; decode steps follow one another on the GPU while the CPU keeps up. `serial`: the CPU work is added to the forwards, as under `event_loop_normal`. Unset, it is `serial` with `overlap` false or `engine.clock: steps` (neither has an overlap loop in time); set to `pipelined` there, it is an error."""

    @model_validator(mode="after")
    def _preset(self):
        if not self.overlap:
            # event_loop_normal runs its CPU work and forwards in turn: the default
            # resolves to the timing it has, and the resolved scenario says so
            if "overlap_timing" in self.model_fields_set and self.overlap_timing == "pipelined":
                raise _err("overlap_timing 'pipelined' with overlap false",
                           "overlap true (event_loop_normal runs its CPU work and forwards "
                           "in turn) or overlap_timing 'serial'", "overlap_timing")
            self.overlap_timing = "serial"
        if self.mode == "cache_replay":
            given = self.model_fields_set
            if "max_running_requests" in given and self.max_running_requests != 1:
                raise _err(f"max_running_requests {self.max_running_requests} with mode cache_replay",
                           "1 or unset (cache_replay serves one request at a time)",
                           "max_running_requests")
            if "decode" in given and self.decode:
                raise _err("decode true with mode cache_replay",
                           "false or unset (cache_replay decodes nothing)", "decode")
            self.max_running_requests = 1
            self.decode = False
        return self


class Limits(_Model):
    """Stop after this many requests, or drop arrivals after ``duration_s``."""

    max_requests: _int(1, 10**12) | None = None
    """Stop after this many requests."""
    duration_s: _num(gt=0.0, hi=1e9) | None = None
    """Drop arrivals after this simulated time, seconds."""


class Output(_Model):
    timeseries_interval_s: _num(gt=0.0, hi=1e9) = 1.0
    """Simulated seconds between timeseries.parquet samples."""
    trace_out: str | None = None  # a Perfetto trace file, relative to the results folder

    @field_validator("trace_out")
    @classmethod
    def _relative(cls, v):
        # A scenario writes only inside its results folder (sim.paths); the command
        # line's --trace-out may name any file.
        if v is not None:
            try:
                check_relative(v, "a trace file inside the results folder")
            except PathRejected as e:
                raise _err(e.found, e.expected) from None
        return v


class Scenario(_Model):
    """One simulation run, fully described. See scenarios/README.md."""

    name: Annotated[str, Field(min_length=1, max_length=200)]
    """The run's name: the default results folder is results/<name> (a slug)."""
    description: str = ""
    """One line saying what the scenario shows (free text)."""
    seed: _int(0, 2**63 - 1) = 0
    """Seeds every random draw of the workload and, unless jitter.seed is set, of the jitter: same scenario and seed, byte-identical results."""
    model: ModelConfig
    """The model whose KV is cached: a preset (see Model presets below) or a custom geometry; it sets the bytes per token and the compute costs."""
    tp: _int(1, 64) = 1
    """Tensor-parallel ranks per instance: each rank holds its own replica of the tree and its shard of every KV page."""
    dp: _int(1, 256) = 1  # data-parallel instances, each a TP group of `tp` ranks
    page_size: _int(1, MAX_PAGE_SIZE)
    """KV tokens per page (SGLang --page-size): the unit of allocation, matching and transfer."""
    device: Device
    """The device (GPU) KV pool per rank."""
    host: Host = Field(default_factory=Host)
    """The host (pinned CPU) KV pool per rank, HiCache's L2; `host: off` for a single tier."""
    node: Node | None = None
    """The machine the ranks run on (host RAM, GPUs), for SGLang's host-pool sizing and its refusal when a pool exceeds the RAM; absent: not checked."""
    cache: Cache = Field(default_factory=Cache)
    """The tree's write, host-pressure and eviction policies."""
    cost: Cost = Field(default_factory=Cost)
    """The GPU cost profile (see GPU profiles below) and the transfer path."""
    collective: Collective = Field(default_factory=Collective)
    """How the TP group's collectives are computed and which SGLang sync discipline issues them."""
    router: Router = Field(default_factory=Router)
    """How requests are spread over the dp instances."""
    engine: Engine = Field(default_factory=Engine)
    """How the simulator keeps the ranks' replicas and prices decode, and whether it checks them (results are the same either way)."""
    storage: Storage | None = None
    """The L3 storage tier below the host (absent: no L3)."""
    jitter: Jitter = Field(default_factory=Jitter)
    """Rank-level perturbations and faults, all off by default."""
    faults: list[Fault] = Field(default_factory=list)
    """Scripted faults, each on one rank at a step (the SGLang TP-2 harness's hooks; `engine.clock: steps` only)."""
    workload: Workload
    """The requests: a generator (`kind`) or a trace."""
    scheduler: Scheduler = Field(default_factory=Scheduler)
    """The scheduler's batch limits, chunked prefill and decode."""
    limits: Limits = Field(default_factory=Limits)
    """Stop early: after a number of requests, or at a simulated time."""
    on_divergence: Literal["halt", "record"] = "halt"
    """What a digest mismatch does: `halt` stops the run as SGLang's assertion stops the server; `record` notes it and runs on (the exit code is the same, README "Exit codes")."""
    output: Output = Field(default_factory=Output)
    """What the results folder gets besides its fixed files."""

    _source: str | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _slug(cls, v):
        if not is_slug(v):
            raise _err(_show(v), SLUG_RULE)
        return v

    @model_validator(mode="after")
    def _consistent(self):
        spec = self.model.spec()
        try:
            spec.check_tp(self.tp)
        except UserError:
            raise _err(f"tp {self.tp} with {spec.kv_heads} KV heads",
                       f"tp dividing {spec.kv_heads} or a multiple of it", "tp") from None
        for path, bs in _block_sizes(self.workload):
            if bs is None:
                continue
            if not (bs % self.page_size == 0 or self.page_size % bs == 0):
                raise _err(f"page_size {self.page_size} with block_size {bs} ({path})",
                           "one of them to divide the other", "page_size")
        if self.engine.clock == "steps":
            sch = self.scheduler
            if sch.overlap_timing == "pipelined":
                if "overlap_timing" in sch.model_fields_set:
                    raise _err("scheduler.overlap_timing 'pipelined' with clock 'steps'",
                               "clock 'time' (the step clock counts iterations, not time) "
                               "or overlap_timing 'serial'", "scheduler.overlap_timing")
                # the default: the step clock has no overlap in time
                sch.overlap_timing = "serial"
            w = self.workload
            if not (w.kind == "trace" and w.format == "generic"):
                raise _err(f"clock 'steps' with workload kind {w.kind!r}"
                           + (f" format {w.format!r}" if w.kind == "trace" else ""),
                           "a generic trace whose rows carry arrival_step", "engine.clock")
            if self.storage is not None:
                raise _err("clock 'steps' with storage",
                           "no storage block (the step clock models device and host only)",
                           "engine.clock")
            if self.dp != 1:
                raise _err(f"clock 'steps' with dp {self.dp}", "dp 1", "engine.clock")
        if self.faults and self.model.hybrid() is not None:
            raise _err("faults on a hybrid model", "a FULL-attention model (the harness's "
                       "hooks act on the FULL tree)", "faults")
        if self.faults and self.engine.clock != "steps":
            raise _err(f"faults with clock {self.engine.clock!r}",
                       "engine.clock 'steps' (a fault acts at a scheduler step)", "faults")
        for i, f in enumerate(self.faults):
            if f.rank >= self.tp:
                raise _err(f"rank {f.rank} with tp {self.tp}", f"a rank below {self.tp}",
                           f"faults.{i}.rank")
        if self.storage is not None and self.collective.discipline != "synced":
            raise _err(f"storage with discipline {self.collective.discipline!r}",
                       "discipline 'synced' (the storage queues ride on 0.5.23's sync)",
                       "storage")
        if self.storage is not None and self.storage.host_memory_mode == "buffer_only":
            # validate_hicache_host_memory_mode's other refusals (no storage backend, a
            # decode instance, DCP) cannot arise here: the key lives in the storage
            # block and the schema has no disaggregated or DCP instances.
            if self.host.tokens == 0:
                # hicache_hook.validate_hicache_host_memory_mode: "requires a host pool size"
                raise _err("host_memory_mode 'buffer_only' with host off",
                           "a host pool (the staging buffer between device and storage)",
                           "storage.host_memory_mode")
        if self.storage is not None and self.tp % self.storage.attn_cp_size:
            raise _err(f"attn_cp_size {self.storage.attn_cp_size} with tp {self.tp}",
                       "a divisor of tp", "storage.attn_cp_size")
        j = self.jitter
        slow = j.storage_latency.factor != 1.0 or j.storage_latency.dist != "none"
        if self.storage is None and (j.storage_miss.probability > 0 or j.storage_fail.ranks or slow):
            key = ("storage_miss" if j.storage_miss.probability > 0
                   else "storage_fail" if j.storage_fail.ranks else "storage_latency")
            raise _err(f"jitter.{key} without storage",
                       "a storage: block (it changes nothing otherwise)", f"jitter.{key}")
        for path, ranks in _rank_lists(self.jitter):
            for r in ranks:
                if r >= self.tp:
                    raise _err(f"rank {r}", f"a rank below tp ({self.tp})", path)
            if len(set(ranks)) != len(ranks):  # a rank listed twice is a typo for another
                dup = next(r for r in ranks if ranks.count(r) > 1)
                raise _err(f"rank {dup} twice", "distinct ranks", path)
        if self.model.hybrid_preset is not None and self.collective.rank_consensus:
            raise _err("rank_consensus with model.hybrid_preset",
                       "a FULL-attention model (the checker's payloads are the FULL tree's: "
                       "a hybrid's match and insert results are not modelled for it)",
                       "collective.rank_consensus")
        if self.model.hybrid_preset is not None:
            _hybrid_check(self)
        elif self.cache.release_prefill_swa:
            raise _err("cache.release_prefill_swa without model.hybrid_preset",
                       "it only with an SWA hybrid", "cache.release_prefill_swa")
        elif (self.host.mamba_states is not None or self.host.swa_tokens is not None
              or any(getattr(self.device, k) is not None for k in HYBRID_DEVICE_KEYS)):
            key = ("host.mamba_states" if self.host.mamba_states is not None else
                   "host.swa_tokens" if self.host.swa_tokens is not None else
                   "device." + next(k for k in HYBRID_DEVICE_KEYS
                                    if getattr(self.device, k) is not None))
            raise _err(f"{key} without model.hybrid_preset",
                       "it only with a hybrid model (it sizes a component's pool)", key)
        if j.id_drift is not None and self.cache.tree_core == "rust":
            # the drift is UnifiedTreeNode's process-global counter (sem §5.4.d); Rust
            # handles are per core (rust_tree_core/adapter.py), nothing else moves them
            raise _err("jitter.id_drift with cache.tree_core 'rust'",
                       "cache.tree_core: python (Rust core handles are per core)",
                       "jitter.id_drift")
        if self.host.mla_dedup:
            _mla_dedup_check(self, spec)
        try:
            dev, host = _capacities(self)
            _node_check(self, dev, host)
        except _CapacityError as e:
            raise _err(e.found, e.expected, e.sub) from None
        return self

    @property
    def source(self) -> str | None:
        """The file this scenario was loaded from (None when built in code)."""
        return self._source


HYBRID_DEVICE_KEYS = ("swa_full_tokens_ratio", "mamba_full_memory_ratio", "max_mamba_cache_size")


def _mla_dedup_check(s: "Scenario", spec) -> None:
    """mla_host_dedup.py ``mla_host_dedup_eligible`` and ``maybe_create_..._context``:
    an MLA pool, a compatible storage backend, more than one attn-TP rank; SGLang
    quietly keeps the replicated pools otherwise, here the knob would change nothing,
    so it is refused."""
    if s.model.hybrid_preset is not None or not spec.kv_lora_rank:
        raise _err("mla_dedup with a non-MLA model", "an MLA model (model.mla, or an MLA "
                   "preset such as deepseek-v3): only an MLA pool is replicated whole",
                   "host.mla_dedup")
    if s.host.off:
        raise _err("mla_dedup with host off", "a host tier", "host.mla_dedup")
    if s.tp < 2:
        raise _err(f"mla_dedup with tp {s.tp}", "tp of at least 2 (one rank has no peers)",
                   "host.mla_dedup")
    backend = None if s.storage is None else s.storage.backend
    if backend not in MLA_DEDUP_STORAGE_BACKENDS:
        raise _err(f"mla_dedup with storage backend {backend!r}",
                   "no storage or the 'file' backend (storage_supports_host_dedup)",
                   "host.mla_dedup")


def host_copies_per_node(s: "Scenario") -> int:
    """Host pools holding KV on one node: one per rank, or under MLA host dedup one per
    TP group (its owner; at least the one of the node's first group)."""
    ranks = _ranks_per_node(s)
    return max(1, ranks // s.tp) if s.host.mla_dedup else ranks


def _hybrid_check(s: "Scenario") -> None:
    """What the hybrid engine models (docs/HYBRID.md §10): each combination it does
    not is refused, naming the key."""
    h = s.model.hybrid()
    own = HYBRID_KINDS[h.kind]
    for kind, other in HYBRID_KINDS.items():  # the other kind's keys
        if kind == h.kind:
            continue
        for k in other.device_keys:
            if getattr(s.device, k) is not None:
                raise _err(f"device.{k} for {own.label}", f"it only with {other.label}",
                           f"device.{k}")
        if getattr(s.host, other.host_key) is not None:
            raise _err(f"host.{other.host_key} for {own.label}",
                       f"it only with {other.label}", f"host.{other.host_key}")
    key = own.host_key
    if s.host.off:
        if getattr(s.host, key) is not None:
            raise _err(f"host.{key} with host: off", own.host_off, f"host.{key}")
    else:
        mode = s.host.mode()[0]
        if mode in ("gib", "host_memory_fraction"):
            raise _err(f"host.{mode} for a hybrid model",
                       f"host.tokens (with host.{key}), host.ratio or host.size_gb",
                       f"host.{mode}")
        if mode == "tokens" and getattr(s.host, key) is None:
            raise _err(f"host.tokens without host.{key}", f"host.{key} ({own.host_what}) "
                       "with host.tokens", f"host.{key}")
        if s.cache.load_back_threshold != LOAD_BACK_THRESHOLD:
            # a load-back of an evicted anchor carries its window's SWA or its state:
            # only a spec emptied by another load's pin is below any threshold
            raise _err(f"cache.load_back_threshold {s.cache.load_back_threshold} for "
                       f"{own.label}", f"the default {LOAD_BACK_THRESHOLD} "
                       f"({own.threshold_why})", "cache.load_back_threshold")
    if own.request_state:
        if s.page_size != 1:
            raise _err(f"page_size {s.page_size} for a Mamba hybrid",
                       "1 (--enable-mamba-extra-buffer's state tracking is not modelled)",
                       "page_size")
        if s.device.max_mamba_cache_size is not None and s.device.mamba_full_memory_ratio is not None:
            raise _err("both device.max_mamba_cache_size and device.mamba_full_memory_ratio",
                       "one of them (the state count overrides the ratio)",
                       "device.mamba_full_memory_ratio")
    c = s.cache
    if c.release_prefill_swa and not own.windowed:
        raise _err("cache.release_prefill_swa for a Mamba hybrid", "it only with an SWA hybrid",
                   "cache.release_prefill_swa")
    sp = s.scheduler.schedule_policy
    if SCHEDULE_CACHE_AWARE.get(sp):
        raise _err(f"scheduler.schedule_policy {sp!r} for a hybrid model",
                   "fcfs, lof or random (cache-aware policies are modelled on FULL-only trees)",
                   "scheduler.schedule_policy")
    if c.tree_core != "python":
        if "tree_core" in c.model_fields_set:
            raise _err(f"cache.tree_core {c.tree_core!r} for a hybrid model",
                       "python (hybrid trees model the Python core's ids)", "cache.tree_core")
        c.tree_core = "python"
    if s.storage is not None:
        raise _err("storage for a hybrid model", "no storage: block (not modelled for hybrids)",
                   "storage")
    if s.node is not None:
        raise _err("node for a hybrid model",
                   "no node: block (host budgets are not modelled per component)", "node")
    if s.jitter.host_alloc_failure.probability > 0:
        raise _err("jitter.host_alloc_failure for a hybrid model",
                   "no host allocation failures (not modelled for hybrids)",
                   "jitter.host_alloc_failure")


def hybrid_pools(s: "Scenario") -> dict:
    """A hybrid model's pools per rank (sim/hybrid/pools.py): FULL tokens and the
    component's device pool (SWA tokens, or Mamba state slots), the FULL host tokens
    and the host state slots."""
    h = s.model.hybrid()
    page, tp, d = s.page_size, s.tp, s.device
    full_b = h.full_bytes_per_token(tp)
    mode, value = d.mode()
    try:
        if mode == "tokens":
            full = int(value)
            if full % page:
                raise _CapacityError("device.tokens", f"{full} tokens",
                                     f"a multiple of page_size {page} (nearest: {_nearest(full, page)})")
            budget = None
        elif mode == "gib":
            budget = int(value * GIB)
            _check_gib_fits(s, value, sizing.weights_bytes_per_rank(h.full_spec(), tp))
        else:
            gpu_gib = _profile_gib(s)
            spec = h.full_spec()
            if value == "auto":
                value = sizing.sglang_mem_fraction_static(
                    gpu_gib, tp, s.scheduler.chunked_prefill_tokens,
                    s.scheduler.max_running_requests, False)
            budget = sizing.device_kv_bytes(value, gpu_gib, sizing.weights_bytes_per_rank(spec, tp))
            if budget <= 0:
                raise _CapacityError("device.mem_fraction_static", f"{value:g}",
                                     "a fraction leaving GPU memory for the KV cache")
        kind = HYBRID_KINDS[h.kind]
        if kind.windowed:
            swa_b = h.swa_bytes_per_token(tp)
            ratio = (d.swa_full_tokens_ratio if d.swa_full_tokens_ratio is not None
                     else C_SWA_RATIO)
            if budget is None:
                aux = int(full * ratio) // page * page
                if h.sliding_window + page >= aux:
                    raise _CapacityError("device.swa_full_tokens_ratio",
                                         f"an SWA pool of {aux} tokens",
                                         f"more than sliding_window {h.sliding_window} + page_size {page}")
            else:
                full, aux = pools.swa_device_pools(budget, full_b, swa_b, page,
                                                   h.sliding_window, ratio)
            aux_b = swa_b
        else:
            state_b = h.mamba_state_bytes(tp)
            ratio = (d.mamba_full_memory_ratio if d.mamba_full_memory_ratio is not None
                     else C_MAMBA_RATIO)
            if budget is None:
                if d.max_mamba_cache_size is not None:
                    aux = d.max_mamba_cache_size
                else:
                    # the FULL pool is what (1 + r) splits off the budget: the state budget
                    # is r x its bytes (kv_cache_configurator.py _handle_max_mamba_cache)
                    aux = int((full * full_b * ratio - state_b) // state_b)
                    if aux <= 0:
                        raise _CapacityError("device.mamba_full_memory_ratio",
                                             f"{ratio:g} giving {aux} state slots",
                                             "a ratio leaving at least one state slot")
            else:
                full, aux = pools.mamba_device_pools(budget, full_b, state_b, page, ratio=ratio,
                                                     max_mamba_cache_size=d.max_mamba_cache_size)
            aux_b = state_b
        host_full = host_aux = 0
        if not s.host.off:
            # build_hybrid_swa_group / build_hybrid_mamba_stack: the FULL and the
            # component's host pools, each from its own device pool by the ratio, or from
            # its share of --hicache-size (_split_hicache_size); host.swa_tokens /
            # host.mamba_states overrides the component's.
            hmode, hval = s.host.mode()
            if hmode == "tokens":
                host_full = int(hval)
                if host_full % page:
                    raise _CapacityError("host.tokens", f"{host_full} tokens",
                                         f"a multiple of page_size {page}")
            else:
                host_full, host_aux = pools.hybrid_host_pools(
                    h.kind, full, aux, page, full_b, aux_b,
                    **({"hicache_gb": hval} if hmode == "size_gb" else {"ratio": hval}))
            key = kind.host_key
            if getattr(s.host, key) is not None:
                host_aux = getattr(s.host, key)
                if kind.host_units_are_pages and host_aux % page:  # SWA host slots: token pages
                    raise _CapacityError(f"host.{key}", f"{host_aux} tokens",
                                         f"a multiple of page_size {page}")
    except UserError as e:
        raise _CapacityError("device", str(e).split(": ", 1)[-1], "pools SGLang can build") from None
    if full < page:
        raise _CapacityError(f"device.{mode}", f"{full} FULL tokens", "at least one page")
    return {"full": full, "aux": aux, "host_full": host_full, "host_aux": host_aux,
            "full_bytes_per_token": full_b, "aux_bytes": aux_b}


def _block_sizes(w, where="workload"):
    if isinstance(w, Mix):
        for i, p in enumerate(w.parts):
            yield from _block_sizes(p, f"{where}.parts.{i}")
    elif isinstance(w, Trace):
        yield where, w.trace_block_size()
    else:
        yield where, w.block_size


def _rank_lists(j: Jitter):
    for name in ("ack_delay", "host_alloc_failure", "request_order", "storage_miss",
                 "storage_fail", "storage_latency"):
        ranks = getattr(j, name).ranks
        if ranks:
            yield f"jitter.{name}.ranks", ranks
    if j.host_capacity_skew:
        yield "jitter.host_capacity_skew", list(j.host_capacity_skew)
    if j.id_drift is not None:
        yield "jitter.id_drift.rank", [j.id_drift.rank]


# ----------------------------------------------------------------------------------
# Capacities
# ----------------------------------------------------------------------------------


class _CapacityError(Exception):
    def __init__(self, sub: str, found: str, expected: str):
        super().__init__(f"{sub}: found {found}; expected {expected}")
        self.sub, self.found, self.expected = sub, found, expected


def _nearest(n: int, page: int) -> str:
    lo = n // page * page
    return f"{lo} or {lo + page}" if lo else f"{page}"


def _ranks_per_node(s: Scenario) -> int:
    """Ranks sharing one node's host RAM: SGLang's ranks_per_host (launch world size //
    nodes), here tp x dp ranks packed onto nodes of ``node.gpus`` GPUs."""
    dp = getattr(s, "dp", None)
    dp = dp if isinstance(dp, int) and not isinstance(dp, bool) else getattr(dp, "size", 1)
    world = s.tp * (dp if isinstance(dp, int) and dp > 0 else 1)
    return max(1, min(world, s.node.gpus)) if s.node is not None else world


def _check_gib_fits(s: Scenario, value: float, weights: int) -> None:
    """``device.gib`` is a KV pool on the profile's GPU: with the rank's weights it must
    fit the GPU's memory (``device.tokens`` sets a pool of any size, for what-ifs)."""
    gpu_gib = _profile_gib(s)
    room = gpu_gib - weights / GIB
    if value > room:
        raise _CapacityError("device.gib", f"{value:g} GiB of KV per rank beside "
                             f"{weights / GIB:.2f} GiB of weights",
                             f"at most {max(room, 0):.2f} GiB beside them in the GPU's {gpu_gib:g} GiB (cost.profile "
                             f"{s.cost.profile}; device.tokens sets a pool of any size)")


def _profile_gib(s: Scenario) -> float:
    return _cached_profile(s.cost.profile, load_profile).hbm_gib


_PROFILE_CACHE: dict = {}


def _cached_profile(name, load):
    # A sweep or ``plan`` resolves capacities many times; the file does not change.
    if name not in _PROFILE_CACHE:
        _PROFILE_CACHE[name] = load(name)
    return _PROFILE_CACHE[name]


def _device_sizing(s: Scenario, page: int, bpt: int) -> tuple[int, dict]:
    mode, value = s.device.mode()
    info: dict = {"unit": mode}
    if mode == "tokens":
        dev = int(value)
        if dev % page:
            raise _CapacityError("device.tokens", f"{dev} tokens",
                                 f"a multiple of page_size {page} (nearest: {_nearest(dev, page)})")
    elif mode == "gib":
        dev = math.floor(value * GIB / bpt) // page * page
        if dev < page:
            raise _CapacityError("device.gib", f"{value:g} GiB = {dev} tokens "
                                 f"at {bpt} bytes/token", f"at least one page ({page} tokens)")
        _check_gib_fits(s, value, sizing.weights_bytes_per_rank(s.model.spec(), s.tp))
    else:
        spec = s.model.spec()
        gpu_gib = _profile_gib(s)
        if value == "auto":
            value = sizing.sglang_mem_fraction_static(
                gpu_gib, s.tp, s.scheduler.chunked_prefill_tokens,
                s.scheduler.max_running_requests, spec.is_mla)
        weights = sizing.weights_bytes_per_rank(spec, s.tp)
        kv = sizing.device_kv_bytes(value, gpu_gib, weights)
        dev = sizing.device_tokens_from_bytes(kv, bpt, page)
        info.update(mem_fraction_static=value, gpu_gib=gpu_gib,
                    weights_gb_per_rank=weights / sizing.GB, kv_pool_gb=max(kv, 0) / sizing.GB)
        if dev < page:
            need = math.ceil(sizing.minimum_mem_fraction(gpu_gib, weights) * 1000) / 1000
            raise _CapacityError(
                "device.mem_fraction_static",
                f"{value:g} on a {gpu_gib:g} GiB GPU ({s.cost.profile}) with "
                f"{weights / GIB:.2f} GiB of weights per rank: {max(kv, 0) / GIB:.2f} GiB for KV",
                f"a fraction leaving at least one page of KV (SGLang: 'Loaded weights leave no "
                f"GPU memory for the KV cache'; raise it above {need:.3f})")
    return dev, info


def _sizing(s: Scenario) -> dict:
    """Both tiers' sizes per rank, how they were derived, and the node's host budget."""
    page = s.page_size
    bpt = s.model.spec().bytes_per_token(s.tp)
    dev, dev_info = _device_sizing(s, page, bpt)
    mode, value = s.host.mode()
    buffer_only = s.storage is not None and s.storage.host_memory_mode == "buffer_only"
    if mode == "default" and buffer_only:
        # hicache_hook.handle_hicache_ratio_default: 1.2 under buffer_only (it stages in
        # flight rather than retaining)
        value = HICACHE_RATIO_BUFFER_ONLY
    host_info: dict = {"unit": mode}
    ranks = _ranks_per_node(s)
    budget = sizing.host_budget_bytes(s.node.host_ram_gb, ranks) if s.node is not None else None
    if mode == "default" and s.node is not None:
        # SGLang on a real machine: no --hicache-ratio / --hicache-size means auto-sizing
        # with --hicache-host-memory-fraction 0.8 (hicache_hook.handle_hicache_ratio_default).
        mode, value = "host_memory_fraction", HICACHE_HOST_MEMORY_FRACTION_DEFAULT
        host_info["unit"] = "default (auto-sized)"
    if mode == "tokens":
        host = int(value)
        if host and (host % page or host < page):
            raise _CapacityError("host.tokens", f"{host} tokens",
                                 f"0 (no host tier) or a positive multiple of page_size {page} "
                                 f"(nearest: {_nearest(host, page)})")
    else:
        if mode == "host_memory_fraction":
            if s.node is None:
                raise _CapacityError("host.host_memory_fraction", f"{value:g} with no node section",
                                     "node.host_ram_gb (the host RAM the fraction is of)")
            dev_bytes = sizing.device_pool_bytes(dev, page, bpt)
            ratio = sizing.auto_host_ratio(HICACHE_RATIO_BUFFER_ONLY if buffer_only
                                           else HICACHE_RATIO_DEFAULT, value, budget, dev_bytes)
            host_info.update(host_memory_fraction=value, auto_ratio=ratio)
            if ratio <= 0:
                raise _CapacityError("node.host_ram_gb", f"{s.node.host_ram_gb:g} GB",
                                     "more than the 10 GiB SGLang keeps free (auto-sizing: 'No "
                                     "host memory is left for HiCache after the 10 GiB reserve')")
            size = math.floor(dev * ratio)
        elif mode in ("ratio", "default"):  # SGLang: int(device_tokens * hicache_ratio)
            size = math.floor(dev * value)
        elif mode == "size_gb":  # SGLang: int(hicache_size * 1e9 / size_per_token)
            size = math.floor(value * HICACHE_SIZE_BYTES_PER_GB / bpt)
        else:
            size = math.floor(value * GIB / bpt)
        if size < page:
            key = "host.ratio" if mode == "default" else (
                "node.host_ram_gb" if mode == "host_memory_fraction" else f"host.{mode}")
            raise _CapacityError(key, f"{value:g} giving {size} tokens",
                                 f"a host of at least one page ({page} tokens)")
        host = (size // page + HOST_POOL_EXTRA_PAGES) * page  # sem §6.2
    for rank, delta in s.jitter.host_capacity_skew.items():
        if delta % page or host + delta < page:
            raise _CapacityError(f"jitter.host_capacity_skew.{rank}", f"{delta} tokens",
                                 f"a multiple of page_size {page} leaving at least one page "
                                 f"of the {host}-token host")
    out = {
        "device_tokens": dev,
        "host_tokens": host,
        "bytes_per_token": bpt,
        "device_gb": sizing.gb(dev, bpt),
        "host_gb": sizing.gb(host, bpt),
        "device_sizing": dev_info,
        "host_sizing": host_info,
        "node": None,
        "warnings": [],
    }
    if s.model.hybrid_preset is not None:
        p = hybrid_pools(s)
        out.update(device_tokens=p["full"], host_tokens=p["host_full"],
                   device_gb=sizing.gb(p["full"], bpt), host_gb=sizing.gb(p["host_full"], bpt),
                   hybrid={"aux_device": p["aux"], "aux_host": p["host_aux"],
                           "aux_bytes": p["aux_bytes"]})
    if s.node is not None:
        need = host * bpt
        out["node"] = {
            "host_ram_gb": s.node.host_ram_gb,
            "ranks_per_node": ranks,
            "host_budget_gb_per_rank": budget / sizing.GB,
            # SGLang's budget check runs on each pool that allocates (base.py
            # _allocate_host_buffer: the owner's under dedup) against the per-rank share.
            "host_gb_per_node": need * host_copies_per_node(s) / sizing.GB,
            "host_copies_per_node": host_copies_per_node(s),
            "exceeds": need > budget,
        }
        if need > budget:
            out["warnings"].append(_node_message(s, host, bpt, budget, ranks))
    return out


def _node_message(s, host, bpt, budget, ranks) -> str:
    return (f"host pools of {sizing.fmt_gb_value(host * bpt / sizing.GB)} GB per rank x {ranks} "
            f"ranks = {sizing.fmt_gb_value(host * bpt * ranks / sizing.GB)} GB exceed node.host_ram_gb "
            f"{s.node.host_ram_gb:g} GB less SGLang's 10 GiB reserve "
            f"({sizing.fmt_gb_value(budget / sizing.GB)} GB per rank); SGLang refuses to start "
            "('Not enough host memory available')")


def _node_check(s: Scenario, dev: int, host: int) -> None:
    if s.node is None or s.node.on_exceed == "warn":
        return
    info = _sizing(s)
    if info["node"]["exceeds"]:
        mode = s.host.mode()[0]
        key = f"host.{mode}" if mode != "default" else "node.host_ram_gb"
        b = info["node"]["host_budget_gb_per_rank"]
        raise _CapacityError(key, info["warnings"][0].split("; SGLang")[0],
                             f"at most {b:,.2f} GB per rank (SGLang refuses to start: 'Not enough "
                             "host memory available'; node.on_exceed: warn runs anyway)")


def _capacities(s: Scenario) -> tuple[int, int]:
    if s.model.hybrid_preset is not None:
        p = hybrid_pools(s)
        return p["full"], p["host_full"]
    info = _sizing(s)
    return info["device_tokens"], info["host_tokens"]


def resolve_capacities(scenario: Scenario) -> tuple[int, int]:
    """(device tokens, host tokens) per rank, following SGLang's pool geometry.

    Device: ``tokens`` as given (a page multiple), ``gib`` rounded down to pages, or
    ``mem_fraction_static`` as SGLang sizes the pool (``sim.sizing``).
    Host: ``tokens`` as given (0: no host tier); otherwise size = floor(device * ratio),
    floor(size_gb * 1e9 / bytes_per_token), floor(gib * 2**30 / bytes_per_token) or the
    auto-sized ratio (``host_memory_fraction`` of ``node.host_ram_gb``), then pages =
    size // page_size + 1 and host = pages * page_size (sem §6.2). Per-rank skews
    (jitter.host_capacity_skew) are applied by the engine on top of this.
    """
    try:
        return _capacities(scenario)
    except _CapacityError as e:
        raise UserError(str(e), where=scenario.source) from None


def resolve_sizing(scenario: Scenario) -> dict:
    """``resolve_capacities`` with the GB figures, how each tier was sized, the node's
    host budget and any warning (a node whose host RAM the pools exceed)."""
    try:
        return _sizing(scenario)
    except _CapacityError as e:
        raise UserError(str(e), where=scenario.source) from None


def model_spec(scenario: Scenario):
    """The scenario's ``sim.costs.ModelSpec``."""
    return scenario.model.spec()


# ----------------------------------------------------------------------------------
# Loading, overrides and one-line errors
# ----------------------------------------------------------------------------------


def load_scenario(path, overrides=(), *, flags=(), trace_roots=(), roots=None) -> Scenario:
    """Load, override and validate a scenario file. Every problem is one UserError line.

    ``overrides``: ``--set KEY=VALUE`` strings. ``flags``: ``(label, key, value)`` for
    command-line flags that set a scenario key (``("--seed", "seed", 7)``), validated
    by the schema like any key. ``trace_roots``: extra input roots (``--trace-root``);
    ``roots``: exactly these roots instead of the documented ones (bundles).
    """
    for root in trace_roots:  # a typo in a root would only show as "not found" later
        if not os.path.isdir(root):
            found = "a file" if os.path.exists(root) else "no such folder"
            raise UserError(f"found {found}; expected a folder to resolve the scenario's paths "
                            "under", where=f"--trace-root {root}")
    path = Path(path)
    where = str(path)
    text = safeio.read_text(path, "a scenario YAML", safeio.LIMIT_YAML)
    data = _parse_yaml(text, where)
    if data is None:
        raise UserError("found an empty file; expected a mapping of scenario keys "
                        f"({', '.join(Scenario.model_fields)})", where=where)
    if not isinstance(data, dict):
        raise UserError(f"found a YAML {type(data).__name__}; expected a mapping of scenario keys",
                        where=where)
    lines = _key_lines(text)
    overridden: list[tuple] = []
    labels: dict[tuple, str] = {}
    for item in overrides:
        overridden.append(_apply_override(data, item, where))
    for label, key, value in flags:
        if value is None:
            continue
        parts = tuple(key.split("."))
        cur = data
        for p in parts[:-1]:
            if not isinstance(cur.get(p), dict):
                cur[p] = {}
            cur = cur[p]
        cur[parts[-1]] = value
        overridden.append(parts)
        labels[parts] = label
    base_dir = str(path.resolve().parent)
    return _validate(data, where, lines, overridden, base_dir=base_dir, labels=labels,
                     roots=roots, extra_roots=tuple(trace_roots))


def scenario_from_dict(data: dict, base_dir=".", where: str = "<scenario>") -> Scenario:
    """Validate an in-memory mapping (tests, sweeps); errors as in ``load_scenario``."""
    if not isinstance(data, dict):
        raise UserError(f"found a {type(data).__name__}; expected a mapping", where=where)
    return _validate(data, where, {}, [], base_dir=str(base_dir))


def _validate(data, where, lines, overridden, base_dir, labels=None, roots=None,
              extra_roots=()) -> Scenario:
    ctx = {"base_dir": base_dir, "roots": roots, "extra_roots": extra_roots}
    try:
        s = Scenario.model_validate(data, context=ctx)
    except ValidationError as err:
        raise _as_user_error(err, data, lines, overridden, where, labels or {}) from None
    except RecursionError:
        raise UserError("found data nested too deep; expected a scenario mapping", where=where) from None
    s._source = where
    return s


def _parse_yaml(text: str, where: str):
    return yamlio.load(text, where, "a YAML mapping")


def _flat(s: str) -> str:
    return " ".join(str(s).split())


def _key_lines(text: str) -> dict[tuple, int]:
    """1-based YAML line of every key path (strings), from the composed node tree.

    Composition is safe (no objects are constructed). Aliased nodes are visited once,
    so an alias bomb cannot blow up the walk.
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return {}
    out: dict[tuple, int] = {}
    seen: set[int] = set()
    stack = [(root, ())]
    while stack:
        node, path = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    p = path + (k.value,)
                    out.setdefault(p, k.start_mark.line + 1)
                    stack.append((v, p))
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                p = path + (str(i),)
                out.setdefault(p, v.start_mark.line + 1)
                stack.append((v, p))
    return out


# -- the schema, walked along a key path ----------------------------------------------


def _members(ann) -> list:
    """The concrete types an annotation allows (Annotated, Optional, Union unwrapped)."""
    origin = typing.get_origin(ann)
    if origin is Annotated:
        return _members(typing.get_args(ann)[0])
    if origin is Union or origin is types.UnionType:
        out = []
        for a in typing.get_args(ann):
            if a is not type(None):
                out.extend(_members(a))
        return out
    return [ann]


def _is_model(t) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _tag(model) -> tuple[str, Any] | None:
    """(field, value) of a model's single-value Literal discriminator, if any."""
    for name in ("kind", "process"):
        f = model.model_fields.get(name)
        if f is not None and typing.get_origin(f.annotation) is Literal:
            args = typing.get_args(f.annotation)
            if len(args) == 1:
                return name, args[0]
    return None


def _models_for(ann, data) -> list:
    """The model classes an annotation allows here; a discriminated union is narrowed
    by the data's tag (``kind``/``process``) when the data names a known one."""
    models = [m for m in _members(ann) if _is_model(m)]
    if len(models) > 1 and isinstance(data, dict):
        chosen = [m for m in models if (t := _tag(m)) and data.get(t[0]) == t[1]]
        if chosen:
            return chosen
    return models


def _child(ann, key, data):
    """The annotation of ``key`` under ``ann`` (with this data), or None if no such key."""
    for m in _members(ann):
        origin = typing.get_origin(m)
        if origin is dict:
            return typing.get_args(m)[1]
        if origin is list:
            if isinstance(key, int) or (isinstance(key, str) and key.isdigit()):
                return typing.get_args(m)[0]
            return None
    for model in _models_for(ann, data):
        if key in model.model_fields:
            return model.model_fields[key].annotation
    return None


def _keys_here(ann, data) -> list[str]:
    keys: list[str] = []
    for model in _models_for(ann, data):
        keys.extend(k for k in model.model_fields if k not in keys)
    return keys


def _tags_here(ann) -> list:
    return [t[1] for m in _members(ann) if _is_model(m) and (t := _tag(m))]


_KEY_RE = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\Z")


def _apply_override(data: dict, item: str, where: str) -> tuple:
    """Apply one ``a.b.c=value`` to the data; the key path must exist in the schema."""
    if not isinstance(item, str) or "=" not in item:
        raise UserError(f"found {_show(item)}; expected KEY.PATH=VALUE", where="--set")
    key, _, text = item.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not _KEY_RE.match(key):
        raise UserError(f"found key {_show(key)}; expected a dotted key path like "
                        "workload.rate_scale", where="--set")

    value = yamlio.load(text, f"--set {key}", "a YAML value")
    _switch_unit(data, parts)
    ann: Any = Scenario
    cur: Any = data
    for i, part in enumerate(parts):
        child = _child(ann, part, cur)
        if child is None:
            keys = _keys_here(ann, cur)
            close = suggest(part, keys, 3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            above = ".".join(parts[:i]) or "the top level"
            raise UserError(f"found unknown key {part!r} under {above}; expected one of "
                            f"{', '.join(keys) or '(none)'}{hint}", where=f"--set {key}")
        last = i == len(parts) - 1
        k: Any = int(part) if isinstance(cur, list) else part
        if isinstance(cur, dict) and isinstance(k, str) and k.lstrip("-").isdigit() \
                and typing.get_origin(_members(ann)[0]) is dict:
            k = int(k)  # int-keyed mappings (host_capacity_skew)
        if last:
            if isinstance(cur, list):
                if k >= len(cur):
                    raise UserError(f"found index {k}; expected below {len(cur)}", where=f"--set {key}")
            cur[k] = value
        else:
            if isinstance(cur, list):
                if k >= len(cur):
                    raise UserError(f"found index {k}; expected below {len(cur)}", where=f"--set {key}")
                nxt = cur[k]
            else:
                nxt = cur.get(k)
                if nxt is None:
                    nxt = cur[k] = {}
            if not isinstance(nxt, (dict, list)):
                raise UserError(f"found {'.'.join(parts[:i + 1])} = {_show(nxt)}; expected a mapping "
                                "to set a key in", where=f"--set {key}")
            cur = nxt
        ann = child
    return tuple(parts)


def _switch_unit(data: dict, parts: list) -> None:
    """``--set host.size_gb=4`` on a file sized by ``host.ratio``: the new unit replaces
    the old one (the tiers take one sizing unit each), instead of conflicting with it.
    ``host: off`` becomes a mapping first, so any host unit can be set on it."""
    if len(parts) != 2 or parts[0] not in ("host", "device"):
        return
    units = HOST_UNITS if parts[0] == "host" else DEVICE_UNITS
    if parts[1] not in units:
        return
    section = data.get(parts[0])
    if parts[0] == "host" and _host_off(section) != section:
        data["host"] = section = {}
    if isinstance(section, dict):
        for unit in units:
            if unit != parts[1]:
                section.pop(unit, None)


def _data_path(loc: tuple, data, missing_tail: bool = False) -> list:
    """The keys of an error location that exist in the data (union tags and validator
    names dropped), plus, for a missing field, the trailing key that is absent."""
    out: list = []
    cur = data
    for i, item in enumerate(loc):
        if isinstance(cur, dict) and item in cur:
            out.append(item)
            cur = cur[item]
        elif isinstance(cur, list) and isinstance(item, int) and 0 <= item < len(cur):
            out.append(item)
            cur = cur[item]
        elif missing_tail and i == len(loc) - 1 and isinstance(item, str):
            out.append(item)
    return out


def _ann_at(parts, data):
    ann: Any = Scenario
    cur = data
    for p in parts:
        ann = _child(ann, p, cur)
        if ann is None:
            return None
        cur = cur.get(p) if isinstance(cur, dict) else (
            cur[p] if isinstance(cur, list) and isinstance(p, int) and p < len(cur) else None)
    return ann


def _render(e: dict, data) -> tuple[list, str, str]:
    """(key path, found, expected) for one pydantic error."""
    typ = e["type"]
    parts = _data_path(tuple(e["loc"]), data, missing_tail=typ == "missing")
    ctx = e.get("ctx") or {}
    inp = e.get("input")
    if typ == "scenario":
        if ctx.get("sub"):
            parts = parts + ctx["sub"].split(".")
        return parts, str(ctx["found"]), str(ctx["expected"])
    if typ == "extra_forbidden":
        keys = _keys_here(_ann_at(parts[:-1], data), _get(data, parts[:-1])) if parts else []
        bad = str(parts[-1]) if parts else "?"
        close = suggest(bad, keys)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return parts, f"unknown key {bad!r}", f"one of {', '.join(keys)}{hint}"
    if typ == "missing":
        return parts, "no value", f"a value for {str(parts[-1])!r}" if parts else "a value"
    if typ == "literal_error":
        choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        close = suggest(inp, choices) if isinstance(inp, str) else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return parts, _show(inp), f"one of {ctx.get('expected')}{hint}"
    if typ in ("union_tag_invalid", "union_tag_not_found"):
        disc = ctx.get("discriminator", "kind").strip("'")
        tags = ", ".join(map(str, _tags_here(_ann_at(parts, data)))) or ctx.get("expected_tags", "")
        if typ == "union_tag_not_found":
            parts = parts + [disc]
            return parts, f"no {disc!r}", f"{disc}: one of {tags}"
        parts = parts + [disc]
        return parts, f"{disc} {ctx.get('tag')!r}", f"one of {tags}"
    if typ in ("model_type", "model_attributes_type", "dict_type"):
        keys = _keys_here(_ann_at(parts, data), None)
        exp = f"a mapping with keys {', '.join(keys)}" if keys else "a mapping"
        return parts, f"a {type(inp).__name__} {_show(inp)}", exp
    if typ == "invalid_key":
        return parts, f"key {_show(parts[-1] if parts else inp)}", "string keys"
    return parts, _show(inp), _expected(str(e.get("msg", "")))


_BOUNDS = (("greater than or equal to ", ">= "), ("less than or equal to ", "<= "),
           ("greater than ", "> "), ("less than ", "< "))


def _expected(msg: str) -> str:
    """pydantic's 'Input should be X' as what was expected: 'X'."""
    for prefix in ("Value error, ", "Assertion failed, ", "Input should be ", "input should be "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    for long, short in _BOUNDS:
        if msg.startswith(long):
            return "a value " + short + msg[len(long):]
    m = re.match(r"(List|Dictionary|String|Value) should have (.*?)(?: after validation)?(?:, not \d+)?$", msg)
    if m:
        return f"a {m.group(1).lower()} with {m.group(2)}"
    return msg


def _get(data, parts):
    cur = data
    for p in parts:
        try:
            cur = cur[p]
        except (KeyError, IndexError, TypeError):
            return None
    return cur


def more_errors(rest: list[str]) -> str:
    """The tail of a one-line error for the errors after the first: the second in full
    (a user fixing the first should not have to run again to learn of it), then how
    many more there are."""
    if not rest:
        return ""
    n = len(rest) - 1
    return f"; also {rest[0]}" + (f" (and {n} more error{'s' if n > 1 else ''})" if n else "")


def _as_user_error(err: ValidationError, data, lines, overridden, where, labels=None) -> UserError:
    ranked = []
    errors = err.errors(include_url=False)
    for order, e in enumerate(errors):
        parts, found, expected = _render(e, data)
        sp = tuple(str(p) for p in parts)
        line = None
        for n in range(len(sp), 0, -1):
            if sp[:n] in lines:
                line = lines[sp[:n]]
                break
        via_set = next((o for o in overridden if sp[: len(o)] == o), None)
        rank = (0 if via_set else 1, line if line is not None else 1 << 30, order)
        ranked.append((rank, sp, found, expected, line, via_set))
    ranked.sort(key=lambda r: r[0])

    def place(line, via_set) -> str:
        if via_set:
            label = (labels or {}).get(via_set) or f"--set {'.'.join(via_set)}"
            return f"{where} ({label})"
        return f"{where}:{line}" if line is not None else where

    _, sp, found, expected, line, via_set = ranked[0]
    key = ".".join(sp) or "(top level)"
    rest = []
    for _, sp2, found2, expected2, line2, via2 in ranked[1:]:
        at = place(line2, via2)
        rest.append(f"{'.'.join(sp2) or '(top level)'}: found {found2}; expected {expected2}"
                    + (f" ({at})" if at != place(line, via_set) else ""))
    return UserError(_flat(f"{key}: found {found}; expected {expected}{more_errors(rest)}"),
                     where=place(line, via_set))


# ----------------------------------------------------------------------------------
# Field descriptions (for the schema's readers)
# ----------------------------------------------------------------------------------

_DESCRIBED = False


def _field_docstrings(node) -> dict[str, str]:
    """The docstrings of a class body's fields: a string statement right after an
    annotated name (``x: int = 1`` then a string literal), cleaned as pydantic's
    use_attribute_docstrings cleans it (``inspect.cleandoc``)."""
    import ast
    import inspect

    out, prev = {}, None
    for stmt in node.body:
        if (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str) and isinstance(prev, ast.AnnAssign)
                and isinstance(prev.target, ast.Name)):
            out[prev.target.id] = inspect.cleandoc(stmt.value.value)
        prev = stmt
    return out


def describe_fields() -> None:
    """Give every section's fields their docstrings as ``description``, as pydantic's
    ``use_attribute_docstrings`` would have while building the classes, and rebuild
    the classes' schemas (leaves first: each is defined before the sections that hold
    it) so ``model_json_schema`` has them; once per process. For the schema's readers
    (``sim.schema_doc``): validation never reads a description.

    A field declared in a class takes the docstring below it there; a field a class
    inherits keeps its parent's description (pydantic copies the parent's field)."""
    global _DESCRIBED
    if _DESCRIBED:
        return
    import ast

    try:
        tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    except OSError:  # no source to read (as pydantic, which then describes nothing)
        tree = ast.parse("")
    docs = {node.name: _field_docstrings(node) for node in tree.body
            if isinstance(node, ast.ClassDef)}
    models = [obj for obj in globals().values()
              if isinstance(obj, type) and issubclass(obj, _Model) and obj.__module__ == __name__]
    for cls in models:
        own = docs.get(cls.__name__, {})
        declared = cls.__dict__.get("__annotations__", {})
        for name, info in cls.__pydantic_fields__.items():
            if info.description is not None:
                continue
            if name in own:
                info.description = own[name]
            elif name not in declared:
                parent = next(b for b in cls.__mro__[1:]
                              if name in (getattr(b, "__pydantic_fields__", None) or {}))
                info.description = parent.__pydantic_fields__[name].description
    for cls in models:
        cls.model_rebuild(force=True)
    _DESCRIBED = True


# ----------------------------------------------------------------------------------
# Dumping
# ----------------------------------------------------------------------------------


def _tags_first(v):
    """Put the discriminating keys (kind, process, format, dist, mode) first: readable."""
    if isinstance(v, dict):
        first = [k for k in ("kind", "process", "format", "dist", "mode") if k in v]
        return {k: _tags_first(v[k]) for k in first + [k for k in v if k not in first]}
    if isinstance(v, list):
        return [_tags_first(x) for x in v]
    return v


# Engine keys that by construction change no result (class Engine's docstring).
_ENGINE_BOOKKEEPING = ("replicas", "decode_runs", "check_invariants")


def dump_resolved(scenario: Scenario) -> str:
    """The validated scenario as YAML: defaults filled in, paths absolute, keys in
    schema order (deterministic). Loading it again gives the same scenario. The
    resolved capacities head the file as comments. ``engine``'s bookkeeping keys
    (``replicas``, ``decode_runs``, ``check_invariants``) are left out: by construction
    they change no result, and leaving them out keeps the folders of a run and its
    check byte-identical. Its clock stays: it changes the run."""
    info = resolve_sizing(scenario)
    dev, host, bpt = info["device_tokens"], info["host_tokens"], info["bytes_per_token"]
    data = _tags_first(scenario.model_dump(mode="python", exclude_none=True,
                                           exclude={"engine": set(_ENGINE_BOOKKEEPING)}))
    if scenario.router.policy != "cache_aware":  # its thresholds would not load back
        data["router"] = {"policy": scenario.router.policy}
    head = (f"# resolved by hicache-sim {__version__}\n"
            f"# per rank: device {fmt_capacity(dev, bpt)}, host {fmt_capacity(host, bpt)} "
            f"({bpt} bytes/token at tp {scenario.tp})\n")
    return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=False,
                                 allow_unicode=True, width=100)
