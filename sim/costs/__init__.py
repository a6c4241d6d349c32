"""Cost models: model presets, KV bytes per token, transfer/compute/collective times.

Public API (the engine's contract, docs/ARCHITECTURE.md "Costs"):

* ``MODEL_PRESETS`` / ``ModelSpec`` / ``resolve_model``: model geometry and TP sharding.
* ``PROFILES`` / ``load_profile`` / ``Profile``: hardware cost parameters from YAML.
* ``CostModel``: seconds for copies, load-back stalls, prefill, decode, syncs, scans.

Calibration (``sim.costs.calibrate``, ``sim.costs.fit``) is imported on demand only:
it needs numpy and torch, which the simulator's hot path does not.
"""

from sim.costs.costmodel import IO_BACKENDS, MEM_LAYOUTS, SYNC_BACKENDS, CostModel, resolve_io
from sim.costs.models import MODEL_PRESETS, ModelSpec, resolve_model
from sim.costs.profile import DEFAULT_PROFILE, PROFILE_DIR, PROFILES, Profile, load_profile

__all__ = [
    "CostModel", "DEFAULT_PROFILE", "IO_BACKENDS", "MEM_LAYOUTS", "MODEL_PRESETS",
    "ModelSpec", "PROFILES", "PROFILE_DIR", "Profile", "SYNC_BACKENDS", "load_profile",
    "resolve_io", "resolve_model",
]
