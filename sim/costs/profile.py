"""Hardware cost profiles: the measured or cited numbers the cost model runs on.

A profile is a YAML file of ``Profile`` fields. Shipped profiles live in the
repository's ``profiles/`` folder and are named through ``PROFILES``; any other value
given to ``load_profile`` is a path to a user file (for instance one written by
``hicache-sim calibrate``). Every number in a shipped profile cites its source in the
file's ``sources:`` mapping. Units are in the field names: GB/s means 1e9 bytes/s (as
nvbandwidth reports), us is microseconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sim import safeio, yamlio
from sim.constants import RECLAIM_SCAN_SECONDS_PER_ENTRY
from sim.errors import UserError, suggest

PROFILE_DIR = Path(__file__).resolve().parents[2] / "profiles"

# Shipped profile names -> files in profiles/. The default matches the reference notes'
# default target (transfer-costs.md §0).
PROFILES: dict[str, str] = {
    "h200-sxm": "h200-sxm.yaml",
    "h100-sxm": "h100-sxm.yaml",
    "a100": "a100.yaml",
    "gh200": "gh200.yaml",
}
DEFAULT_PROFILE = "h200-sxm"

_Fraction = dict(gt=0, le=1)


class Profile(BaseModel):
    """All cost parameters of one GPU + host-link platform (transfer-costs.md §1.7, §3, §4)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Short name of the profile, e.g. 'h200-sxm'.")
    description: str = Field("", description="One line on what this profile models.")
    gpu: str = Field(description="The GPU (and form factor) the numbers describe.")
    host_link: str = Field("", description="The host<->GPU link, e.g. 'PCIe Gen5 x16'.")

    # Host link, copy engine (cudaMemcpyAsync, io backend `direct`), pinned host memory.
    bw_h2d_gbps: float = Field(gt=0, description="Large pinned host->device copy bandwidth, GB/s.")
    bw_d2h_gbps: float = Field(gt=0, description="Large pinned device->host copy bandwidth, GB/s.")
    bidir_factor: float = Field(
        **_Fraction, description="Share of its own bandwidth each direction keeps while the"
        " opposite direction is busy (concurrent H2D and D2H).")
    c_call_us: float = Field(ge=0, description="CPU issue cost of one cudaMemcpyAsync call, us.")
    t_op_us: float = Field(ge=0, description="Fixed cost of one transfer op (Python, stream"
                           " wait, events), us.")

    # GPU-assisted I/O kernels (io backend `kernel`).
    bw_kernel_h2d_gbps: float = Field(gt=0, description="Peak H2D bandwidth of the SGLang"
                                      " gather/scatter kernel, GB/s.")
    bw_kernel_d2h_gbps: float = Field(gt=0, description="Peak D2H bandwidth of the kernel, GB/s.")
    k_half_kernel_bytes: float = Field(ge=0, description="Row (item) size at which the kernel"
                                       " reaches half its peak bandwidth, bytes.")
    t_launch_us: float = Field(ge=0, description="Launch cost of one I/O kernel, us.")

    # Compute.
    peak_tflops: float = Field(gt=0, description="Dense BF16 peak per GPU, TFLOP/s.")
    mfu_prefill: float = Field(**_Fraction, description="Achieved fraction of peak in prefill.")
    mfu_decode: float = Field(**_Fraction, description="Achieved fraction of peak in decode"
                              " (binds only when a decode step is compute-bound).")
    t_fixed_prefill_us: float = Field(ge=0, description="Fixed overhead of one prefill forward, us.")
    t_fixed_decode_us: float = Field(ge=0, description="Fixed overhead of one decode step, us.")
    hbm_gib: float = Field(gt=0, description="Device memory per GPU, GiB.")
    hbm_tbps: float = Field(gt=0, description="Peak HBM bandwidth per GPU, TB/s.")
    hbm_efficiency: float = Field(**_Fraction, description="Sustained fraction of peak HBM"
                                  " bandwidth in decode.")

    # Collectives: the HiCache sync all_reduce(MIN) over a few ints, at TP8 on one node.
    allreduce_gloo_us: float = Field(ge=0, description="gloo CPU-group all_reduce of a few"
                                     " int64 at world 8, one node, us (SGLang's default group).")
    allreduce_nccl_us: float = Field(ge=0, description="NCCL all_reduce of a few int64 at"
                                     " world 8 incl. launch and .item() sync, us.")

    # GPU to GPU, for MLA host dedup's load-back broadcast (mem_cache/mla_host_dedup.py).
    nvlink_gbps: float | None = Field(None, gt=0, description="GPU-to-GPU (NVLink) bandwidth"
                                      " per direction per GPU, GB/s; None: no peer link.")

    # Scheduler CPU work.
    reclaim_scan_us_per_entry: float = Field(
        RECLAIM_SCAN_SECONDS_PER_ENTRY * 1e6, ge=0,
        description="CPU time per reclaim-map entry visit per pass, us.")

    sources: dict[str, str] = Field(default_factory=dict, description="Where each number comes"
                                    " from and what it was measured on, keyed by field name.")
    measured: dict[str, Any] | None = Field(None, description="Calibration provenance: device,"
                                            " torch version, date, fit quality, raw points.")

    @field_validator("sources")
    @classmethod
    def _sources_name_fields(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if key not in cls.model_fields:
                raise ValueError(f"sources names unknown parameter '{key}'")
        return value

    @classmethod
    def numeric_fields(cls) -> tuple[str, ...]:
        """The parameters that are numbers (each one needs a source in a shipped profile)."""
        return tuple(k for k, f in cls.model_fields.items() if f.annotation is float)


def profile_path(name_or_path) -> Path:
    """The file a profile name or path refers to."""
    key = str(name_or_path)
    if key in PROFILES:
        return PROFILE_DIR / PROFILES[key]
    path = Path(key)
    if path.suffix.lower() in (".yaml", ".yml") or path.exists():
        return path
    raise UserError(f"found unknown profile {key!r}; expected one of {', '.join(PROFILES)}"
                    " or a path to a .yaml file", where="profile")


def load_profile(name_or_path=DEFAULT_PROFILE) -> Profile:
    """Load a shipped profile by name, or a user profile by path, as a validated Profile.

    Any problem with the file is one UserError line naming the file and the key.
    """
    if isinstance(name_or_path, Profile):
        return name_or_path
    path = profile_path(name_or_path)

    # Regular files only, bounded; duplicate keys and alias bombs refused.
    text = safeio.read_text(path, "a cost profile YAML", safeio.LIMIT_YAML)
    data = yamlio.load(text, str(path), "a YAML mapping of profile keys")
    if not isinstance(data, dict):
        raise UserError(f"found {type(data).__name__}; expected a mapping of profile keys",
                        where=str(path))
    return profile_from_mapping(data, where=str(path))


def profile_from_mapping(data: dict, where: str = "profile") -> Profile:
    """Validate a mapping as a Profile; errors are one line naming ``where`` and the key."""
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        raise UserError(_one_line(err), where=where) from None


def _one_line(err: ValidationError) -> str:
    # A typo'd key also shows up as a missing one; the unknown key is the better clue.
    errors = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first, *rest = (_describe(e) for e in errors)
    n = len(rest) - 1
    more = "" if not rest else f"; also {rest[0]}" + (
        f" (and {n} more error{'s' if n > 1 else ''})" if n else "")
    return first + more


def _describe(e: dict) -> str:
    """One profile error: the key, what was found and what was expected."""
    key = ".".join(str(p) for p in e["loc"]) or "(top level)"
    kind = e["type"]
    if kind == "missing":
        desc = Profile.model_fields[key].description if key in Profile.model_fields else ""
        desc = desc[:1].lower() + desc[1:].rstrip(".") if desc else "a value"
        return f"key '{key}' is missing; expected {desc}"
    if kind == "extra_forbidden":
        close = suggest(key, Profile.model_fields)
        hint = f"did you mean '{close[0]}'?" if close else "see sim/costs/profile.py Profile"
        return f"unknown key '{key}'; expected a profile parameter ({hint})"
    msg = e["msg"].replace("Value error, ", "")
    return f"key '{key}': found {e.get('input')!r}; expected {_expected(msg)}"


def _expected(msg: str) -> str:
    # pydantic says "Input should be greater than 0"; the user wants what was expected.
    for prefix in ("Input should be ", "input should be "):
        if msg.startswith(prefix):
            return msg[len(prefix):]
    return msg


def dump_profile(profile: Profile) -> str:
    """YAML text of a profile, fields in schema order (deterministic)."""
    data = profile.model_dump(exclude_none=True)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
