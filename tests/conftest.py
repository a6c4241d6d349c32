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
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# SGLang's own outputs for the conformance op-traces, vendored from shared/conformance
# (gzip-compressed; data/conformance/SHA256SUMS holds the originals' checksums).
CONFORMANCE = ROOT / "data" / "conformance"


def conformance_cases(folder: Path = CONFORMANCE) -> list[Path]:
    """Every vendored conformance trace (``NAME.jsonl.gz``) in ``folder``, by name."""
    return sorted(p for p in folder.glob("*.jsonl.gz") if not p.name.endswith(".out.jsonl.gz"))


def expected_lines(case: Path) -> list[str]:
    """The output lines SGLang's tree produced for ``case``, as written."""
    import gzip

    out = case.with_name(case.name.replace(".jsonl.gz", ".out.jsonl.gz"))
    with gzip.open(out, "rt") as fh:
        return [line.rstrip("\n") for line in fh if line.strip()]


def expected_outputs(case: Path) -> list[dict]:
    """The output SGLang's tree produced for ``case``, one dict per line."""
    import json

    return [json.loads(line) for line in expected_lines(case)]


def vendored_checksums_match(folder: Path) -> set[str]:
    """Assert every ``*.gz`` in ``folder`` decompresses to the bytes SHA256SUMS names
    (and nothing else is vendored); returns the names."""
    import gzip
    import hashlib

    sums = dict(line.split()[::-1] for line in (folder / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == {p.name[:-3] for p in folder.glob("*.gz")}
    for name, digest in sums.items():
        data = gzip.decompress((folder / f"{name}.gz").read_bytes())
        assert hashlib.sha256(data).hexdigest() == digest, name
    return set(sums)


def replay_checked(case: Path, make):
    """Replay ``case`` op by op through the replayer ``make(header)`` builds, running
    the tree's full invariant check after every op; yield the replayer after each, so
    a test can assert what its tier adds."""
    from sim.optrace import read_trace

    replayer = None
    for idx, _, op in read_trace(case):
        if replayer is None:
            replayer = make(op)
            continue
        replayer.apply(idx, op)
        replayer.tree.check()
        yield replayer


def assert_replays_byte_for_byte(case: Path) -> None:
    """``replay-ops`` on ``case`` writes SGLang's output lines, byte for byte."""
    import json

    from sim.optrace import replay_lines

    expected = expected_lines(case)
    got = list(replay_lines(case))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g == e, f"line {json.loads(e)['i']} differs:\n sim    {g[:300]}\n sglang {e[:300]}"


def case_id(p: Path) -> str:
    return p.name.split(".")[0]


# The scenario setting that prices decode one step per iteration
# (``engine.decode_runs: false``): the engine's reference loop, against which the
# decode fast path (runs of steps priced at once) must write byte-identical results.
STEP_BY_STEP = "engine.decode_runs=false"
