"""Per-request rows and time series of one run, and the run's headline numbers.

Rows are appended as plain tuples (cheap on the hot path) and turned into pandas
frames once, at the end. Rank 0's replica is the reference for occupancy.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

REQUEST_COLUMNS = [
    "rid", "session", "arrival", "start", "first_token", "finish", "input_tokens",
    "device_hit_tokens", "host_hit_tokens", "miss_tokens", "load_back_tokens",
    "load_back_bytes", "load_back_s", "backup_stall_s", "prefill_s", "ttft_s",
]
TIMESERIES_COLUMNS = [
    "t", "device_used", "device_reserved", "host_used", "duplicate_tokens",
    "effective_tokens", "device_capacity", "host_capacity", "evicted_tokens",
    "backup_tokens", "reclaim_pass1_tokens", "reclaim_pass2_tokens", "host_evict_tokens",
    "drop_tokens", "load_back_tokens", "requests_done", "hit_rate",
]
# Each column's unit (sim.units), written into the parquet files' metadata. Times are
# simulated seconds from the start of the run; tokens and bytes are per rank.
REQUEST_UNITS = {
    "rid": "id", "session": "id", "arrival": "s", "start": "s", "first_token": "s",
    "finish": "s", "input_tokens": "tokens", "device_hit_tokens": "tokens",
    "host_hit_tokens": "tokens", "miss_tokens": "tokens", "load_back_tokens": "tokens",
    "load_back_bytes": "bytes", "load_back_s": "s", "backup_stall_s": "s", "prefill_s": "s",
    "ttft_s": "s",
}
TIMESERIES_UNITS = {
    "t": "s", "device_used": "tokens", "device_reserved": "tokens", "host_used": "tokens",
    "duplicate_tokens": "tokens", "effective_tokens": "tokens", "device_capacity": "tokens",
    "host_capacity": "tokens", "evicted_tokens": "tokens", "backup_tokens": "tokens",
    "reclaim_pass1_tokens": "tokens", "reclaim_pass2_tokens": "tokens",
    "host_evict_tokens": "tokens", "drop_tokens": "tokens", "load_back_tokens": "tokens",
    "requests_done": "1", "hit_rate": "1",
}


class Metrics:
    def __init__(self, cfg, bytes_per_token: int = 0):
        self.cfg = cfg
        self.bytes_per_token = bytes_per_token
        self.rows: list[tuple] = []
        self.ts: list[tuple] = []
        self.done = 0
        self.rejected = 0  # requests larger than the device pool
        self.input_tokens = 0
        self.hit_tokens = 0
        self.device_hit = 0
        self.host_hit = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    def request_done(self, rq) -> None:
        r = rq.r
        hit = min(r.input_len, rq.device_hit + rq.loaded)
        self.done += 1
        self.input_tokens += r.input_len
        self.hit_tokens += hit
        self.device_hit += rq.device_hit
        self.host_hit += rq.loaded
        self.rows.append((
            r.rid, r.session, r.arrival, rq.start, rq.first_token, rq.finish, r.input_len,
            rq.device_hit, rq.loaded, r.input_len - hit, rq.loaded,
            rq.loaded * self.bytes_per_token, rq.load_s, rq.stall_s, rq.prefill_s,
            rq.first_token - r.arrival,
        ))

    def sample(self, t: float, tree, final: bool = False) -> None:
        if final and self.ts and self.ts[-1][0] == t:
            return
        s = tree.stats
        self.ts.append((
            t, tree.dev_used, tree.reserved, tree.host_used, tree.dup_tokens,
            tree.dev_used + tree.host_used - tree.dup_tokens, tree.device_capacity,
            tree.host_capacity, s.demote_tokens + s.drop_tokens + s.delete_tokens,
            s.backup_tokens, s.reclaim_pass1_tokens, s.reclaim_pass2_tokens,
            s.host_evict_tokens, s.drop_tokens, s.load_tokens, self.done, self.hit_rate,
        ))

    def requests_df(self) -> pd.DataFrame:
        df = pd.DataFrame(self.rows, columns=REQUEST_COLUMNS)
        return df.sort_values("rid", kind="stable").reset_index(drop=True)

    def timeseries_df(self) -> pd.DataFrame:
        return pd.DataFrame(self.ts, columns=TIMESERIES_COLUMNS)

    def summary(self, tree) -> dict:
        df = self.requests_df()
        ts = self.timeseries_df()
        inp = self.input_tokens
        ttft = df["ttft_s"].to_numpy() if len(df) else np.array([])
        # A run interrupted before any request finished has no TTFT: None (strict
        # JSON), without numpy's "All-NaN slice" warning on the user's terminal.
        ttft = ttft[~np.isnan(ttft)]
        occupied = ts["device_used"] + ts["host_used"] if len(ts) else pd.Series([0])
        s = tree.stats
        return {
            "requests": int(self.done),
            "rejected_requests": int(self.rejected),
            "input_tokens": int(inp),
            "hit_rate": self.hit_rate,
            "device_hit_rate": self.device_hit / inp if inp else 0.0,
            "host_hit_rate": self.host_hit / inp if inp else 0.0,
            "miss_rate": 1 - self.hit_rate if inp else 0.0,
            # No request finished (every arrival after limits.duration_s): no TTFT.
            "ttft_p50_s": float(np.percentile(ttft, 50)) if len(ttft) else None,
            "ttft_p99_s": float(np.percentile(ttft, 99)) if len(ttft) else None,
            "effective_tokens_mean": float(ts["effective_tokens"].mean()) if len(ts) else 0.0,
            "duplicate_share_mean": float((ts["duplicate_tokens"] / occupied.where(occupied > 0)).fillna(0).mean())
            if len(ts) else 0.0,
            "device_tokens": int(tree.device_capacity),
            "host_tokens": int(tree.host_capacity),
            "load_back_bytes": int(s.load_tokens * self.bytes_per_token),
            "backup_bytes": int(s.backup_tokens * self.bytes_per_token),
            "backup_stall_s": float(df["backup_stall_s"].sum()) if len(df) else 0.0,
            "reclaim_pass1_tokens": int(s.reclaim_pass1_tokens),
            "reclaim_pass2_tokens": int(s.reclaim_pass2_tokens),
            "drop_tokens": int(s.drop_tokens),
            "sim_time_s": float(ts["t"].max()) if len(ts) else 0.0,
        }
