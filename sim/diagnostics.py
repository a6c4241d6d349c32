"""Per-tier diagnostics of a run, and the one-line diagnosis an operator reads.

What this is for: a hit rate alone does not say which tier to grow. These numbers
do: the hits each tier served, the pages each tier held on average and how many were
held twice (write-through mirrors, loaded-back nodes), the unique pages over both,
failed host allocations, and (from the one-pass model, ``sim.analysis.plan``) how old
a page is when it hits versus when LRU evicts it. ``diagnose`` turns them into one
line: "device too small", "host too small", "host tier inert" or "balanced".
"""

from __future__ import annotations

#: Host hits below this share of input tokens make the host tier "inert".
INERT_HOST_SHARE = 0.01
#: Device hits below this share of all hits: most hits pay a load-back.
DEVICE_SHARE_LOW = 0.5
#: Mean host occupancy above this is "full".
HOST_FULL = 0.95


def tier_fields(summary: dict, timeseries, trees, scenario) -> dict:
    """Fields ``run`` adds to ``summary.json``: GB sizes, bytes per token, the sizing
    provenance, per-tier page counts (time-series means of rank 0, over the samples
    of every instance: per instance, per rank), failed host allocations (summed over
    the instances' rank-0 trees) and the diagnosis."""
    from sim.scenario import resolve_sizing

    info = resolve_sizing(scenario)
    bpt = info["bytes_per_token"]
    page = scenario.page_size
    ts = timeseries
    if len(ts) and "rank" in ts.columns:
        ts = ts[ts["rank"] == 0]
    out = {
        "bytes_per_token": bpt,
        "device_gb": summary["device_tokens"] * bpt / 1e9,
        "host_gb": summary["host_tokens"] * bpt / 1e9,
        "sizing": {k: info[k] for k in ("device_sizing", "host_sizing", "node")},
        "sizing_warnings": list(info["warnings"]),
    }
    if len(ts):
        dev = ts["device_used"].astype(float)
        host = ts["host_used"].astype(float)
        dup = ts["duplicate_tokens"].astype(float)
        out.update({
            "device_pages_mean": float(dev.mean()) / page,
            "host_pages_mean": float(host.mean()) / page,
            "duplicate_pages_mean": float(dup.mean()) / page,
            "unique_pages_mean": float((dev + host - dup).mean()) / page,
            "host_occupancy_mean": float(host.mean()) / summary["host_tokens"]
            if summary["host_tokens"] else 0.0,
        })
    else:
        out.update({"device_pages_mean": 0.0, "host_pages_mean": 0.0,
                    "duplicate_pages_mean": 0.0, "unique_pages_mean": 0.0,
                    "host_occupancy_mean": 0.0})
    counts = [getattr(getattr(t, "stats", None), "backup_failures", None) for t in trees]
    out["backup_failures"] = int(sum(counts)) if counts and all(isinstance(c, int) for c in counts) \
        else None
    out["diagnosis"] = diagnose(
        device_hit_rate=summary["device_hit_rate"], host_hit_rate=summary["host_hit_rate"],
        device_tokens=summary["device_tokens"], host_tokens=summary["host_tokens"],
        write_policy=scenario.cache.write_policy, backup_failures=out["backup_failures"],
        host_occupancy=out["host_occupancy_mean"])
    return out


def diagnose(*, device_hit_rate: float, host_hit_rate: float, device_tokens: int,
             host_tokens: int, write_policy: str, backup_failures: int | None = None,
             host_occupancy: float | None = None, below_knee: bool | None = None,
             knee_gb: float | None = None, age_at_hit_s: float | None = None,
             age_at_eviction_s: float | None = None) -> str:
    """One line naming the tier to grow, or saying neither needs it.

    Rules, first match wins (the constants above):

    1. no host tier: "single tier";
    2. host hits under 1% of input: "host tier inert", with the likely reason
       (write_through with a host no larger than the device mirrors it; failed host
       allocations; otherwise reuse is within the device's reach or beyond the host's);
    3. device hits under half of all hits: "device too small" (most hits pay a load-back);
    4. below the knee of the host curve (``plan``), or a full host: "host too small";
    5. otherwise "balanced".

    ``age_at_hit_s`` / ``age_at_eviction_s`` (median seconds since a page's last use
    when it hits / when LRU evicts it) are appended when known: evictions much younger
    than typical hits mean the cache is too small for the reuse the trace has.
    """
    hits = device_hit_rate + host_hit_rate
    fails = f"; {backup_failures:,} failed host allocations" if backup_failures else ""
    ages = ""
    if age_at_hit_s is not None and age_at_eviction_s is not None:
        ages = (f"; median age at hit {age_at_hit_s:,.0f} s vs at eviction "
                f"{age_at_eviction_s:,.0f} s")
    if host_tokens <= 0:
        return f"single tier (no host): device hits {device_hit_rate:.1%} of input{ages}"
    if host_hit_rate < INERT_HOST_SHARE:
        if write_policy.startswith("write_through") and host_tokens <= device_tokens:
            why = "write_through with a host no larger than the device mirrors it"
        elif backup_failures:
            why = "host allocations fail"
        else:
            why = "reuse falls within the device's reach, or beyond the host's"
        return (f"host tier inert: host hits are {host_hit_rate:.2%} of input tokens "
                f"({why}){fails}{ages}")
    if hits > 0 and device_hit_rate / hits < DEVICE_SHARE_LOW:
        return (f"device too small: {host_hit_rate / hits:.0%} of hits are loaded back from "
                f"host, each paying a load-back{fails}{ages}")
    if below_knee:
        where = f" (knee at {knee_gb:,.1f} GB per rank)" if knee_gb is not None else ""
        return f"host too small: below the knee of the hit-rate curve{where}{fails}{ages}"
    if below_knee is None and host_occupancy is not None and host_occupancy >= HOST_FULL:
        return (f"host may be too small: full ({host_occupancy:.0%} mean occupancy) and "
                f"serving {host_hit_rate:.1%} of input; run plan for the curve{fails}{ages}")
    return (f"balanced: device {device_hit_rate:.1%} + host {host_hit_rate:.1%} of input"
            f"{fails}{ages}")
