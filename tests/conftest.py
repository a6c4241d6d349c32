"""Shared test set-up: the repository root on sys.path, and where shared/ lives."""

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# CI clones the repo with shared/ beside it; HICACHE_SHARED overrides.
SHARED = Path(os.environ.get("HICACHE_SHARED", ROOT.parent / "shared"))
# The traces the repository ships (gzip-compressed; data/traces/README.md).
TRACES = ROOT / "data" / "traces"

# The default CI profile: enough examples to find real bugs, bounded for 2 cores.
settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def shared() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"shared/ not found at {SHARED}; set HICACHE_SHARED")
    return SHARED
