#!/usr/bin/env python3
"""The engine's TP-2 outcomes under scripted faults against real SGLang's (`make conformance-tp2`).

For every vendored group of data/conformance/tp2/outcomes.json (two real SGLang 0.5.23
schedulers over gloo, tools/sglang_server/tp2.py: ten write_back workloads, each clean
and with each harness fault hook on rank 1 at two steps), this runs the engine on the
same trace with the mapped scenario (tools/sglang_server/runconfig.py
``engine_scenario``, the fault as ``faults:``) at ``tp: 2`` under the step clock, and
compares what divergence.json's ``outcome`` says with the real group's:

* the outcome class (agree, assertion, hang, silent_divergence, ...);
* for an assertion, each rank's step, exception and message;
* for a silent divergence, the first step where the ranks' free space differs;
* where the fault fired on its rank (``fired_at``; not for ``ack_delay``, which the
  harness records at K whether or not a copy was delayed).

One line per group; exits 1 at the first difference (``--keep-going``: at the end),
then the counts. No SGLang is needed: the real side is vendored.

    python tools/conformance_tp2.py [--only SUBSTRING ...] [--keep-going]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools" / "sglang_server"))

from runconfig import engine_scenario  # noqa: E402

FOLDER = REPO / "data" / "conformance" / "tp2"


def load_groups(folder: Path = FOLDER) -> list[dict]:
    return json.loads((folder / "outcomes.json").read_text())["runs"]


def engine_outcome(group: dict, work: Path, folder: Path = FOLDER) -> dict:
    """The engine's divergence.json ``outcome`` and ``faults`` for one vendored group."""
    import yaml

    from sim.runner import run_scenario
    from sim.scenario import load_scenario

    scn = engine_scenario(group["config"], str((folder / group["trace"]).resolve()))
    path = work / f"{group['run']}.yaml"
    path.write_text(yaml.safe_dump(scn, sort_keys=False))
    res = run_scenario(load_scenario(path))
    div = res.divergence
    return {**div["outcome"], "faults": div.get("faults", [])}


def real_view(group: dict) -> dict:
    """What is compared, on the real group's side."""
    o = group["outcome"]
    v = {"class": o["class"]}
    if o["class"] == "assertion":
        # a rank that died on its peer's closed connection names the peer's gloo pair
        # port, the real run's own ephemeral one (sim.collectives LINES "gloo_peer_reset")
        v["errors"] = [None if e is None else
                       dict(e, msg=re.sub(r"\[127\.0\.0\.1\]:\d+:", "[127.0.0.1]:<port>:", e["msg"]))
                       for e in o["errors"]]
    if o["class"] == "silent_divergence":
        v["step"] = o["step"]
    kind = (group["fault"] or "").partition("@")[0]
    if kind and kind != "ack_delay":
        v["fired_at"] = o["fired_at"][group["fault_rank"]]
    return v


def engine_view(group: dict, e: dict) -> dict:
    """The same fields from the engine's outcome."""
    v = {"class": e["class"]}
    if e["class"] == "assertion":
        v["errors"] = [e["ranks"][str(r)] for r in range(2)]
    if e["class"] == "silent_divergence":
        v["step"] = e["step"]
    kind = (group["fault"] or "").partition("@")[0]
    if kind and kind != "ack_delay":
        v["fired_at"] = next((f["fired_at"] for f in e["faults"]
                              if f["rank"] == group["fault_rank"]), None)
    return v


def differences(real: dict, eng: dict) -> list[str]:
    out = []
    for k in real.keys() | eng.keys():
        if real.get(k) != eng.get(k):
            out.append(f"{k}: real {json.dumps(real.get(k))[:200]}, engine {json.dumps(eng.get(k))[:200]}")
    return sorted(out)


def summary(group: dict, real: dict) -> str:
    s = real["class"]
    if "errors" in real:
        s += f" at {[None if e is None else e['step'] for e in real['errors']]}"
    if "step" in real:
        s += f" from step {real['step']}"
    return s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=[], help="groups whose name contains one of these")
    ap.add_argument("--keep-going", action="store_true", help="compare every group, then exit")
    a = ap.parse_args(argv)
    groups = [g for g in load_groups() if not a.only or any(s in g["run"] for s in a.only)]
    t0 = time.monotonic()
    same, failed = 0, []
    with tempfile.TemporaryDirectory(prefix="conformance-tp2-") as tmp:
        for g in groups:
            real = real_view(g)
            eng = engine_view(g, engine_outcome(g, Path(tmp)))
            diff = differences(real, eng)
            if not diff:
                same += 1
                print(f"same      {g['run']}: {summary(g, real)}", flush=True)
                continue
            failed.append(g["run"])
            print(f"DIFFERENT {g['run']}: " + "; ".join(diff), flush=True)
            if not a.keep_going:
                break
    workloads = len({g["workload"] for g in groups})
    faults = len({(g["fault"] or "clean") for g in groups})
    done = same + len(failed)
    stopped = "" if done == len(groups) else f", stopped at the first difference after {done}"
    print(f"conformance-tp2: {workloads} workloads x {faults} fault settings, {len(groups)} groups"
          f"{stopped}; {same} identical, {len(failed)} different "
          f"({time.monotonic() - t0:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
