"""Per-tier diagnostics of a run, and the one-line diagnosis an operator reads.

What this is for: a hit rate alone does not say which tier to grow. These numbers
do: the hits each tier served, the pages each tier held on average and how many were
held twice (write-through mirrors, loaded-back nodes), the unique pages over both,
failed host allocations, and (from the one-pass model, ``sim.analysis.plan``) how old
a page is when it hits versus when LRU evicts it. ``diagnose`` turns them into one
line: "device too small", "host too small", "host tier inert" or "balanced".
"""

from __future__ import annotations

from sim.fmt import duration
from sim.scenario import resolve_sizing

#: Host hits below this share of input tokens make the host tier "inert".
INERT_HOST_SHARE = 0.01
#: Device hits below this share of all hits: most hits pay a load-back.
DEVICE_SHARE_LOW = 0.5
#: Mean host occupancy above this is "full".
HOST_FULL = 0.95

#: The cache tiers, in the order every summary, table and plot lists them.
TIERS = ("device", "host", "storage")


def tier_hits(summary: dict) -> dict:
    """Each tier's hits as ``{tier: (tokens, share of input tokens)}``: device and host,
    and storage when the run had an L3 tier (``hit_tokens_by_tier`` in summary.json).

    ``host_hit_rate`` in summary.json counts every token loaded back through the host
    pool, the ones prefetched from storage included (they are loaded the same way);
    here the host row is the host tier's own hits and the storage row the L3's, so the
    rows add up to ``hit_rate`` and none claims another tier's hits.
    """
    inp = summary.get("input_tokens") or 0
    by = summary.get("hit_tokens_by_tier")

    def share(tokens) -> float:
        return tokens / inp if inp else 0.0

    if isinstance(by, dict):
        return {t: (int(by.get(t, 0)), share(int(by.get(t, 0)))) for t in TIERS}
    dev = round(summary.get("device_hit_rate", 0.0) * inp)
    host = round(summary.get("host_hit_rate", 0.0) * inp)
    return {"device": (dev, summary.get("device_hit_rate", 0.0)),
            "host": (host, summary.get("host_hit_rate", 0.0))}


def tier_fields(summary: dict, timeseries, trees, scenario) -> dict:
    """Fields ``run`` adds to ``summary.json``: GB sizes, bytes per token, the sizing
    provenance, per-tier page counts (time-series means of rank 0, over the samples
    of every instance: per instance, per rank), failed host allocations (summed over
    the instances' rank-0 trees) and the diagnosis."""
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
    st = getattr(scenario, "storage", None)
    if st is not None:
        # The L3 tier's size per rank (None: unbounded) and what the host pool is for.
        out["storage_gb"] = st.capacity_gb
        out["host_memory_mode"] = st.host_memory_mode
    hits = tier_hits(summary)
    out["diagnosis"] = diagnose(
        device_hit_rate=hits["device"][1], host_hit_rate=hits["host"][1],
        storage_hit_rate=hits["storage"][1] if "storage" in hits else None,
        host_buffer_only=st is not None and st.host_memory_mode == "buffer_only",
        device_tokens=summary["device_tokens"], host_tokens=summary["host_tokens"],
        write_policy=scenario.cache.write_policy, backup_failures=out["backup_failures"],
        host_occupancy=out["host_occupancy_mean"])
    return out


def diagnose(*, device_hit_rate: float, host_hit_rate: float, device_tokens: int,
             host_tokens: int, write_policy: str, backup_failures: int | None = None,
             host_occupancy: float | None = None, below_knee: bool | None = None,
             knee_gb: float | None = None, age_at_hit_s: float | None = None,
             age_at_eviction_s: float | None = None, storage_hit_rate: float | None = None,
             host_buffer_only: bool = False) -> str:
    """One line naming the tier to grow, or saying neither needs it.

    ``host_hit_rate`` is the host tier's own hits and ``storage_hit_rate`` the L3's
    (None: no storage tier), each a share of input tokens (:func:`tier_hits`).
    ``host_buffer_only``: the host pool is storage's staging buffer
    (``host_memory_mode: buffer_only``), never a cache tier.

    Rules, first match wins (the constants above):

    1. no host tier: "single tier";
    2. a buffer_only host: "host is a staging buffer", then rule 4's test for the
       device against storage, else "balanced";
    3. host hits under 1% of input: "host tier inert", with the likely reason
       (write_through with a host no larger than the device mirrors it; failed host
       allocations; otherwise reuse is within the device's reach or beyond the host's);
    4. device hits under half of all hits: "device too small" (most hits pay a load-back);
    5. below the knee of the host curve (``plan``), or a full host: "host too small";
    6. otherwise "balanced".

    ``age_at_hit_s`` / ``age_at_eviction_s`` (median seconds since a page's last use
    when it hits / when LRU evicts it) are appended when known: evictions much younger
    than typical hits mean the cache is too small for the reuse the trace has.
    """
    l3 = storage_hit_rate or 0.0
    hits = device_hit_rate + host_hit_rate + l3
    fails = f"; {backup_failures:,} failed host allocations" if backup_failures else ""
    ages = ""
    if age_at_hit_s is not None and age_at_eviction_s is not None:
        ages = (f"; median age at hit {duration(age_at_hit_s)} vs at eviction "
                f"{duration(age_at_eviction_s)}")
    # Every tier's share, labelled: "device 63.0% + host 0.0% + storage 14.6% of input".
    split = f"device {device_hit_rate:.1%} + host {host_hit_rate:.1%}" + (
        f" + storage {l3:.1%}" if storage_hit_rate is not None else "") + " of input"
    loaded = "loaded back from host" if storage_hit_rate is None else (
        f"loaded back (host {host_hit_rate:.1%}, storage {l3:.1%} of input)")
    if host_tokens <= 0:
        return f"single tier (no host): device hits {device_hit_rate:.1%} of input{ages}"
    if host_buffer_only:
        head = "the host is storage's staging buffer under buffer_only, not a cache tier"
        if hits > 0 and device_hit_rate / hits < DEVICE_SHARE_LOW:
            return (f"device too small: {(hits - device_hit_rate) / hits:.0%} of hits come "
                    f"from storage ({head}): {split}{fails}{ages}")
        return f"balanced ({head}): {split}{fails}{ages}"
    if host_hit_rate < INERT_HOST_SHARE:
        if write_policy.startswith("write_through") and host_tokens <= device_tokens:
            why = "write_through with a host no larger than the device mirrors it"
        elif backup_failures:
            why = "host allocations fail"
        else:
            why = "reuse falls within the device's reach, or beyond the host's"
        st = f"; storage {l3:.1%} of input" if storage_hit_rate is not None else ""
        return (f"host tier inert: host hits are {host_hit_rate:.2%} of input tokens "
                f"({why}){st}{fails}{ages}")
    if hits > 0 and device_hit_rate / hits < DEVICE_SHARE_LOW:
        return (f"device too small: {(hits - device_hit_rate) / hits:.0%} of hits are "
                f"{loaded}, each paying a load-back{fails}{ages}")
    if below_knee:
        where = f" (knee at {knee_gb:,.1f} GB per rank)" if knee_gb is not None else ""
        return f"host too small: below the knee of the hit-rate curve{where}{fails}{ages}"
    if below_knee is None and host_occupancy is not None and host_occupancy >= HOST_FULL:
        return (f"host may be too small: full ({host_occupancy:.0%} mean occupancy) and "
                f"serving {host_hit_rate:.1%} of input; run plan for the curve{fails}{ages}")
    return f"balanced: {split}{fails}{ages}"
