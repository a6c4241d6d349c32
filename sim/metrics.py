"""Per-request rows and time series of one run, and the run's headline numbers.

Rows are appended as plain tuples (cheap on the hot path) and every few thousand
of them become typed columns (``_Rows``): a long run holds 8 bytes per value, not a
tuple of boxed numbers. Each data-parallel instance keeps its own ``Metrics``; the
time series has one row per rank and sample, so every replica's occupancy is there
(``instance``, ``rank`` columns); headline numbers take each instance's rank 0.
"""

from __future__ import annotations


import numpy as np
import pandas as pd

from sim.fmt import duration
from sim.hybrid.replica import HybridReplica

REQUEST_COLUMNS = [
    "rid", "session", "arrival", "start", "first_token", "finish", "input_tokens",
    "device_hit_tokens", "host_hit_tokens", "miss_tokens", "load_back_tokens",
    "load_back_bytes", "load_back_s", "backup_stall_s", "prefill_s", "ttft_s", "instance",
]
TIMESERIES_COLUMNS = [
    "t", "instance", "rank", "device_used", "device_reserved", "host_used", "duplicate_tokens",
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
    "ttft_s": "s", "instance": "id",
}
TIMESERIES_UNITS = {
    "t": "s", "instance": "id", "rank": "id", "device_used": "tokens", "device_reserved": "tokens", "host_used": "tokens",
    "duplicate_tokens": "tokens", "effective_tokens": "tokens", "device_capacity": "tokens",
    "host_capacity": "tokens", "evicted_tokens": "tokens", "backup_tokens": "tokens",
    "reclaim_pass1_tokens": "tokens", "reclaim_pass2_tokens": "tokens",
    "host_evict_tokens": "tokens", "drop_tokens": "tokens", "load_back_tokens": "tokens",
    "requests_done": "1", "hit_rate": "1",
}


# Rows a ``_Rows`` holds as tuples before it turns them into typed columns.
ROW_CHUNK = 4096

# Column dtypes the one-pass frame builder (``_sorted_frame``) handles: a column whose
# chunks all have one of these sets of dtypes concatenates to the second (int and float
# promote to float64 as pandas' concat does); any other mix takes pandas' own path.
_FAST_DTYPES = {frozenset({"int64"}): "int64", frozenset({"float64"}): "float64",
                frozenset({"int64", "float64"}): "float64", frozenset({"bool"}): "bool"}


class _Rows:
    """Rows of one table, kept compact: the newest as tuples, the rest as pandas
    frames of up to ROW_CHUNK rows each, built by the same constructor the whole
    table used to be built by. Each column's type is pandas' inference over its
    values; a chunk's equals the whole table's whenever every chunk infers one type
    (concat keeps it), and where chunks differ (ints in one, floats in another)
    concat promotes them as the inference over all the values would (int and float to
    float64).

    With ``spill_to(file)`` the finished chunks go to that file (pickled, exact)
    instead of memory, so a long run's rows cost disk, not RAM; ``frames`` and
    ``tuples`` read them back in order."""

    __slots__ = ("columns", "pending", "_chunks", "n", "last_row", "spill", "_spilled")

    def __init__(self, columns: list[str]):
        self.columns = columns
        self.pending: list[tuple] = []
        self._chunks: list[pd.DataFrame] = []  # in memory (no spill file)
        self.n = 0
        self.last_row: tuple | None = None
        self.spill = None  # a binary file the chunks are pickled into, or None
        self._spilled: list[tuple] = []  # (offset, size, dtypes) per chunk in ``spill``

    def append(self, row: tuple) -> None:
        pending = self.pending
        pending.append(row)
        self.n += 1
        self.last_row = row
        if len(pending) >= ROW_CHUNK:
            self._store(pd.DataFrame(pending, columns=self.columns))
            self.pending = []

    def spill_to(self, fh) -> None:
        """From now on keep the finished chunks in ``fh`` (those so far move there)."""
        self.spill = fh
        chunks, self._chunks = self._chunks, []
        for df in chunks:
            self._store(df)

    def _store(self, df: pd.DataFrame) -> None:
        if self.spill is None:
            self._chunks.append(df)
            return
        import pickle

        data = pickle.dumps(df, protocol=pickle.HIGHEST_PROTOCOL)
        fh = self.spill
        fh.seek(0, 2)
        self._spilled.append((fh.tell(), len(data), tuple(str(t) for t in df.dtypes)))
        fh.write(data)

    @property
    def n_chunks(self) -> int:
        """Finished chunks so far, in memory or spilled."""
        return len(self._chunks) + len(self._spilled)

    def chunk_dtypes(self) -> list[tuple]:
        """Each finished chunk's column dtypes (as strings), in order, without reading
        a spilled one back."""
        return [d for _o, _n, d in self._spilled] + [tuple(str(t) for t in df.dtypes)
                                                     for df in self._chunks]

    def iter_chunks(self):
        """The finished chunks in order, one at a time (a spilled one is read back
        when its turn comes)."""
        if self._spilled:
            import pickle

            fh = self.spill
            fh.flush()
            for offset, size, _d in self._spilled:
                fh.seek(offset)
                yield pickle.loads(fh.read(size))
        yield from self._chunks

    def __len__(self) -> int:
        return self.n

    def last(self) -> tuple:
        return self.last_row

    def pending_frame(self) -> pd.DataFrame | None:
        return pd.DataFrame(self.pending, columns=self.columns) if self.pending else None

    def frames(self) -> list[pd.DataFrame]:
        out = list(self.iter_chunks())
        if self.pending:
            out.append(self.pending_frame())
        return out

    def tuples(self) -> list[tuple]:
        """Every row as a tuple of Python values, in order."""
        out = []
        for df in self.iter_chunks():
            out.extend(zip(*(df[c].tolist() for c in self.columns)))
        return out + self.pending


def _frame(tables: list[_Rows], columns: list[str]) -> pd.DataFrame:
    parts = [df for t in tables for df in t.frames()]
    if not parts:
        return pd.DataFrame([], columns=columns)
    if len(parts) == 1:
        return parts[0]
    return pd.concat(parts, ignore_index=True)


def _plain_sorted_frame(tables: list[_Rows], columns: list[str], by: list[str]) -> pd.DataFrame:
    """Every row of ``tables`` (in order) as one frame, stably sorted by ``by``: pandas'
    concat and sort, the reference ``_sorted_frame`` is checked against."""
    df = _frame(tables, columns)
    return df.sort_values(by if len(by) > 1 else by[0], kind="stable").reset_index(drop=True)


def _sorted_frame(tables: list[_Rows], columns: list[str], by: list[str]) -> pd.DataFrame:
    """``_plain_sorted_frame``'s frame, built in one pass where every column is numeric:
    each column is filled chunk by chunk into one array (a chunk, spilled or not, is
    dropped once copied), then put in order by the same stable sort; a long run then
    holds the frame once, not its chunks, their concatenation and the sorted copy at
    the same time. Any other dtype mix takes the plain path."""
    pend = [t.pending_frame() for t in tables]
    metas = [d for t, p in zip(tables, pend)
             for d in t.chunk_dtypes() + ([tuple(str(x) for x in p.dtypes)] if p is not None else [])]
    if len(metas) < 2:
        return _plain_sorted_frame(tables, columns, by)
    kinds = [_FAST_DTYPES.get(frozenset(m[i] for m in metas)) for i in range(len(columns))]
    if None in kinds:
        return _plain_sorted_frame(tables, columns, by)
    n = sum(len(t) for t in tables)
    cols = [np.empty(n, dtype=k) for k in kinds]
    at = 0
    for t, p in zip(tables, pend):
        for df in (*t.iter_chunks(), *([p] if p is not None else [])):
            m = len(df)
            for i, c in enumerate(columns):
                cols[i][at:at + m] = df[c].to_numpy()
            at += m
    assert at == n
    keys = [cols[columns.index(b)] for b in by]
    order = (np.argsort(keys[0], kind="stable") if len(keys) == 1
             else np.lexsort(keys[::-1]))
    for i in range(len(cols)):
        cols[i] = cols[i][order]  # one column at a time: one extra column at the peak
    return pd.DataFrame(dict(zip(columns, cols)), copy=False)


class Metrics:
    """One TP group's (data-parallel instance's) rows and counters."""

    def __init__(self, cfg, bytes_per_token: int = 0, instance: int = 0):
        self.cfg = cfg
        self.bytes_per_token = bytes_per_token
        self.instance = instance
        self._rows = _Rows(REQUEST_COLUMNS)
        self._ts = _Rows(TIMESERIES_COLUMNS)
        self.done = 0
        self.rejected = 0  # requests that can never fit the device pool
        self.retracted = 0  # decode retractions (`retract_decode`)
        self.aborted = 0    # retract_decode's last request, aborted out of memory
        self.input_tokens = 0
        self.hit_tokens = 0
        self.device_hit = 0
        self.host_hit = 0
        # The L3 tier's counters (rank 0's replica), or None with storage off.
        self.storage = None if getattr(cfg, "storage", None) is None else {
            "l3_hit_tokens": 0, "prefetch_issued": 0, "prefetch_declined": {},
            "prefetch_revoked": {}, "l3_read_bytes": 0, "l3_write_bytes": 0,
            "tier_storage_tokens": 0}
        # rid -> the tokens of its host hit that came from storage (storage on only;
        # not a requests.parquet column: ``sim.analysis.plan`` reads it after warm-up).
        self.l3_by_rid: dict = {}

    def spill_to(self, folder) -> None:
        """Keep the finished row chunks in unnamed temporary files in ``folder`` (a
        results folder being staged): they never appear in it, and vanish with this
        object or the process."""
        import tempfile

        for table in (self._rows, self._ts):
            table.spill_to(tempfile.TemporaryFile(dir=folder, prefix=".rows-"))

    @property
    def rows(self) -> list[tuple]:
        """The per-request rows so far (REQUEST_COLUMNS), as tuples."""
        return self._rows.tuples()

    @property
    def ts(self) -> list[tuple]:
        """The time-series rows so far (TIMESERIES_COLUMNS), as tuples."""
        return self._ts.tuples()

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
        if self.storage is not None:
            # Of the host hit, the tokens that came from storage for this request.
            n = min(rq.l3, rq.loaded)
            self.storage["tier_storage_tokens"] += n
            if n:
                self.l3_by_rid[r.rid] = n
        self._rows.append((
            r.rid, r.session, r.arrival, rq.start, rq.first_token, rq.finish, r.input_len,
            rq.device_hit, rq.loaded, r.input_len - hit, rq.loaded,
            rq.loaded * self.bytes_per_token, rq.load_s, rq.stall_s, rq.prefill_s,
            rq.first_token - r.arrival, self.instance,
        ))

    def sample(self, t: float, trees: list, final: bool = False) -> None:
        """One row per rank (``trees[r]`` is rank r's replica) at time ``t``."""
        if final and len(self._ts) and self._ts.last()[0] == t:
            return
        inst, done, hit = self.instance, self.done, self.hit_rate
        for rank, tree in enumerate(trees):
            s = tree.stats
            self._ts.append((
                t, inst, rank, tree.dev_used, tree.reserved, tree.host_used, tree.dup_tokens,
                tree.dev_used + tree.host_used - tree.dup_tokens, tree.device_capacity,
                tree.host_capacity, s.demote_tokens + s.drop_tokens + s.delete_tokens,
                s.backup_tokens, s.reclaim_pass1_tokens, s.reclaim_pass2_tokens,
                s.host_evict_tokens, s.drop_tokens, s.load_tokens, done, hit,
            ))

    def requests_df(self) -> pd.DataFrame:
        return requests_frame([self])

    def timeseries_df(self) -> pd.DataFrame:
        return timeseries_frame([self])

    def summary(self, tree) -> dict:
        return summarize([self], [tree])


REQUEST_ORDER = ["rid"]
TIMESERIES_ORDER = ["t", "instance", "rank"]


def requests_frame(metrics: list[Metrics]) -> pd.DataFrame:
    """Every instance's request rows, by rid."""
    return _sorted_frame([m._rows for m in metrics], REQUEST_COLUMNS, REQUEST_ORDER)


def timeseries_frame(metrics: list[Metrics]) -> pd.DataFrame:
    """Every instance's time-series rows, by time, instance and rank."""
    return _sorted_frame([m._ts for m in metrics], TIMESERIES_COLUMNS, TIMESERIES_ORDER)


def _pct(a, q):
    return float(np.percentile(a, q)) if len(a) else None


def summarize(metrics: list[Metrics], trees: list, busy_s: list[float] | None = None,
              requests: pd.DataFrame | None = None, timeseries: pd.DataFrame | None = None) -> dict:
    """The run's headline numbers over its instances (``trees[i]``: instance i's rank-0
    replica; ``busy_s[i]``: its GPU time in forwards). ``requests`` / ``timeseries``:
    the frames of ``metrics`` when the caller has them already (built once per run)."""
    df = requests_frame(metrics) if requests is None else requests
    ts = timeseries_frame(metrics) if timeseries is None else timeseries
    ref = ts[ts["rank"] == 0] if len(ts) else ts
    inp = sum(m.input_tokens for m in metrics)
    hit = sum(m.hit_tokens for m in metrics)
    dev_hit = sum(m.device_hit for m in metrics)
    host_hit = sum(m.host_hit for m in metrics)
    ttft = df["ttft_s"].to_numpy() if len(df) else np.array([])
    # A run interrupted before any request finished has no TTFT: None (strict
    # JSON), without numpy's "All-NaN slice" warning on the user's terminal.
    ttft = ttft[~np.isnan(ttft)]
    occupied = ref["device_used"] + ref["host_used"] if len(ref) else pd.Series([0])
    stat = lambda name: int(sum(getattr(t.stats, name) for t in trees))  # noqa: E731
    bpt = metrics[0].bytes_per_token
    sim_time = float(ts["t"].max()) if len(ts) else 0.0
    out = {
        "requests": int(sum(m.done for m in metrics)),
        "rejected_requests": int(sum(m.rejected for m in metrics)),
        "retracted_requests": int(sum(m.retracted for m in metrics)),
        "aborted_requests": int(sum(m.aborted for m in metrics)),
        "input_tokens": int(inp),
        "hit_rate": hit / inp if inp else 0.0,
        "device_hit_rate": dev_hit / inp if inp else 0.0,
        "host_hit_rate": host_hit / inp if inp else 0.0,
        "miss_rate": 1 - hit / inp if inp else 0.0,
        # No request finished (every arrival after limits.duration_s): no TTFT.
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p99_s": _pct(ttft, 99),
        "effective_tokens_mean": float(ref["effective_tokens"].mean()) if len(ref) else 0.0,
        "duplicate_share_mean": float((ref["duplicate_tokens"] / occupied.where(occupied > 0)).fillna(0).mean())
        if len(ref) else 0.0,
        "device_tokens": int(trees[0].device_capacity),
        "host_tokens": int(trees[0].host_capacity),
        "load_back_bytes": stat("load_tokens") * bpt,
        "backup_bytes": stat("backup_tokens") * bpt,
        "backup_stall_s": float(df["backup_stall_s"].sum()) if len(df) else 0.0,
        "reclaim_pass1_tokens": stat("reclaim_pass1_tokens"),
        "reclaim_pass2_tokens": stat("reclaim_pass2_tokens"),
        "drop_tokens": stat("drop_tokens"),
        "sim_time_s": sim_time,
    }
    out.update(_load(metrics, df, busy_s, sim_time))
    if isinstance(trees[0], HybridReplica):
        out["hybrid"] = _hybrid([t.summary() for t in trees], bpt)
    if metrics[0].storage is not None:
        out.update(_storage(metrics, inp, dev_hit, host_hit))
    return out


def _hybrid(rows: list[dict], bpt: int) -> dict:
    """A hybrid model's component figures (rank 0's replica of each instance, summed):
    its pool, the states backed up and loaded, host hits with and without a Mamba
    state (a load-back that restored the anchor's state, or FULL alone)."""
    out = {"kind": rows[0]["kind"]}
    for k, v in rows[0].items():
        if k != "kind":
            out[k] = int(sum(r[k] for r in rows))
    return out


def _storage(metrics, inp: int, dev_hit: int, host_hit: int) -> dict:
    """The L3 tier's figures (present only with ``storage:``): rank 0's replica."""
    def tot(k):
        return int(sum(m.storage[k] for m in metrics))

    def reasons(k):
        out: dict = {}
        for m in metrics:
            for r, n in m.storage[k].items():
                out[r] = out.get(r, 0) + n
        return dict(sorted(out.items()))

    l3 = tot("l3_hit_tokens")
    tier_st = tot("tier_storage_tokens")
    buf = {}
    for m in metrics:  # buffer_only only (docs/STORAGE.md §9)
        for k, n in m.storage.get("host_buffer", {}).items():
            buf[k] = max(buf.get(k, 0), n) if k in ("size_tokens", "peak_tokens") else buf.get(k, 0) + n
    out = {} if not buf else {"host_buffer": dict(sorted(buf.items()))}
    return out | {
        "l3_hit_tokens": l3,
        "l3_hit_rate": l3 / inp if inp else 0.0,
        "prefetch_issued": tot("prefetch_issued"),
        "prefetch_declined": reasons("prefetch_declined"),
        "prefetch_revoked": reasons("prefetch_revoked"),
        "l3_read_bytes": tot("l3_read_bytes"),
        "l3_write_bytes": tot("l3_write_bytes"),
        "hit_tokens_by_tier": {"device": int(dev_hit), "host": int(host_hit - tier_st),
                               "storage": tier_st},
    }


def _load(metrics, df, busy_s, sim_time) -> dict:
    """Utilisation per instance, and whether queueing dominates TTFT."""
    if busy_s is None or sim_time <= 0:
        return {}
    per = []
    for m, busy in zip(metrics, busy_s):
        per.append({"instance": m.instance, "requests": int(m.done),
                    "hit_rate": m.hit_rate, "utilisation": busy / sim_time})
    wait = (df["start"] - df["arrival"]).to_numpy() if len(df) else np.array([])
    service = (df["first_token"] - df["start"]).to_numpy() if len(df) else np.array([])
    wait_p50, service_p50 = _pct(wait, 50), _pct(service, 50)
    warning = None
    if wait_p50 is not None and service_p50 is not None and wait_p50 > service_p50:
        warning = (f"arrivals outrun service: the median request waits {duration(wait_p50)} in "
                   f"the queue, more than its {duration(service_p50)} of prefill, so TTFT measures "
                   "queueing; add instances (dp) or lower the arrival rate")
    return {"instances": per,
            "utilisation": float(np.mean([p["utilisation"] for p in per])),
            "queue_wait_p50_s": wait_p50, "prefill_service_p50_s": service_p50,
            "overload_warning": warning}
