"""`replay`'s exit code says whether the bundle reproduced, never what it recorded.

The engine is stubbed here (``verify_bundle``'s result), so this checks the command's
contract alone; tests/test_repro.py replays the shipped bundles for real."""

import types

import cli
import sim.repro as repro



def _result(verdict, failure_class, line):
    outcome = types.SimpleNamespace(verdict=verdict, failure_class=failure_class)
    return repro.VerifyResult(outcome, line, ["verdict", "digests", "optrace rank 0"])


def test_a_reproduced_failure_exits_0_and_prints_the_recorded_failure(monkeypatch, capsys):
    line = "AssertionError at t=14.830000s (step 812): the digests differ"
    monkeypatch.setattr(repro, "verify_bundle", lambda *a, **k: _result("detected", "digest", line))
    assert cli.main(["replay", "some/bundle"]) == 0
    out, err = capsys.readouterr()
    assert "reproduced some/bundle: recorded verdict detected (digest)" in out
    assert "2 outcome fields and 1 rank op-trace(s)" in out
    assert err == f"hicache-sim replay: {line}\n"


def test_a_bundle_that_does_not_reproduce_exits_1(monkeypatch, capsys):
    def differs(*a, **k):
        raise repro.NotReproduced("does not reproduce: verdict is \"agree\", the bundle expects "
                                  "\"detected\"", where="some/bundle")

    monkeypatch.setattr(repro, "verify_bundle", differs)
    assert cli.main(["replay", "some/bundle"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not reproduce: verdict" in err


def test_a_missing_bundle_exits_2(tmp_path, capsys):
    assert cli.main(["replay", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
