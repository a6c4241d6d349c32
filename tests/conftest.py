"""Shared test set-up: the repository root on sys.path, the vendored traces and conformance cases."""

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The traces the repository ships (gzip-compressed; data/traces/README.md).
TRACES = ROOT / "data" / "traces"

# The default CI profile: enough examples to find real bugs, bounded for 2 cores.
settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# SGLang's own outputs for the conformance op-traces, vendored from shared/conformance
# (gzip-compressed; data/conformance/SHA256SUMS holds the originals' checksums).
CONFORMANCE = ROOT / "data" / "conformance"


def conformance_cases() -> list[Path]:
    """Every vendored conformance trace (``NAME.jsonl.gz``), sorted by name."""
    return sorted(p for p in CONFORMANCE.glob("*.jsonl.gz") if not p.name.endswith(".out.jsonl.gz"))


def expected_outputs(case: Path) -> list[dict]:
    """The output SGLang's tree produced for ``case``, one dict per line."""
    import gzip
    import json

    out = case.with_name(case.name.replace(".jsonl.gz", ".out.jsonl.gz"))
    with gzip.open(out, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def case_id(p: Path) -> str:
    return p.name.split(".")[0]
