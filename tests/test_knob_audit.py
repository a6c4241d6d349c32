"""Every knob in the scenario schema changes the run, or says why it does not
(tools/knob_audit.py): one test per schema key, each observing small runs."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import knob_audit as K  # noqa: E402


def test_every_schema_key_has_exactly_one_entry():
    schema = K.leaves()
    assert sorted(set(schema) - set(K.RULES)) == [], "schema keys without an entry in RULES"
    assert sorted(set(K.RULES) - set(schema)) == [], "entries in RULES for keys the schema lacks"


def test_every_entry_names_a_context_the_audit_has():
    for key, rule in K.RULES.items():
        if not isinstance(rule, K.Elsewhere):
            assert rule.context in K.CONTEXTS, key
            assert rule.alts, key


@pytest.mark.parametrize("key", sorted(k for k, r in K.RULES.items() if not isinstance(r, K.Elsewhere)))
def test_knob(key):
    bad = [f for f in K.audit(key) if not f.ok]
    assert not bad, "; ".join(f"{' '.join(f.alt)}: {f.detail}" for f in bad)


def test_the_audit_sees_a_knob_that_changes_nothing():
    """The audit itself can fail: a key set to the value it already has changes nothing,
    and a result-neutral key that did change the run is reported."""
    fake = K.Changes("quick", "cache.write_policy=write_back")  # quickstart's own value
    K.RULES["__probe__"] = fake
    try:
        (finding,) = K.audit("__probe__")
        assert not finding.ok and "exactly what it did" in finding.detail
        K.RULES["__probe__"] = K.Same("not so", "quick", "seed=2")
        (finding,) = K.audit("__probe__")
        assert not finding.ok and "results/requests.parquet" in finding.changed
    finally:
        del K.RULES["__probe__"]


def test_every_distribution_parameter_moves_the_draws():
    """``_DistFields``' parameters: each one each distribution takes changes its draws
    (both the batch sampler a workload uses and the quantile a jitter draw uses)."""
    from sim.workloads.dists import DISTRIBUTIONS, Draws

    base = {"value": 100.0, "low": 10.0, "high": 200.0, "mean": 100.0, "cv": 1.0}
    seen = set()
    for name, dist in DISTRIBUTIONS.items():
        params = {p: base[p] for p in dist.params}
        for p in dist.params:
            moved = dict(params, **{p: params[p] * 1.5})
            a = Draws(np.random.Generator(np.random.PCG64(7)), name, params)
            b = Draws(np.random.Generator(np.random.PCG64(7)), name, moved)
            assert [a() for _ in range(50)] != [b() for _ in range(50)], (name, p)
            assert dist.quantile(0.3, params) != dist.quantile(0.3, moved), (name, p)
            seen.add(p)
    assert seen == {"value", "low", "high", "mean", "cv"}
