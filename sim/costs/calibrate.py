"""Measure real host<->device copies with torch and fit a cost profile to them.

Three sweeps, in both directions (H2D and D2H):

1. **Sizes**: one copy of each size; fitting ``time = latency + bytes / bandwidth`` gives
   ``bw_h2d_gbps`` / ``bw_d2h_gbps`` (from device-side times: CUDA events) and
   ``t_op_us`` (the intercept of the host-side wall time of the whole op, issue to
   completion, which is what the scheduler waits for).
2. **Pages**: ``k`` separate small copies of ``page_bytes`` each, issued back to back
   (many small page copies vs one large copy); the slope of wall time against ``k`` is
   the per-call cost ``c_call_us``. It is measured through torch's ``copy_`` and so
   includes torch's dispatch, an upper bound on SGLang's C++ ``cudaMemcpyAsync`` loop.
3. **Concurrency**: one large H2D and one large D2H at the same time (two CUDA streams;
   two threads on CPU); each direction's bandwidth share gives ``bidir_factor`` (the
   smaller of the two, as the shipped A100 profile does).

On CUDA the host buffers are pinned (as SGLang's host pool is), copies are
``non_blocking`` on dedicated streams and timed with ``torch.cuda.Event(enable_timing=
True)``. On CPU the same code runs with CPU tensors timed by ``time.perf_counter``, so
the path is exercised without a GPU. Every other parameter comes from the ``--base``
profile. torch is imported here, lazily, never by ``import sim.costs``.
"""

from __future__ import annotations

import datetime as _dt
import platform
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sim.atomic import write_text
from sim.costs.fit import fit_per_call, fit_transfer
from sim.costs.profile import Profile, dump_profile, load_profile, profile_from_mapping
from sim.errors import UserError

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

# Quick by default on CPU (a few seconds on 2 cores); a fuller sweep on CUDA.
DEFAULTS = {
    "cpu": dict(sizes=[256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB], pages=[1, 8, 32, 128],
                page_bytes=4 * KIB, repeats=5, concurrent_bytes=16 * MIB),
    "cuda": dict(sizes=[64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB,
                        256 * MIB, 1 * GIB],
                 pages=[1, 4, 16, 64, 256, 1024, 4096], page_bytes=4 * KIB, repeats=20,
                 concurrent_bytes=256 * MIB),
}
DIRECTIONS = ("h2d", "d2h")
# Back-to-back copies per stream in the concurrency test, so the two directions overlap
# for most of their duration despite starting a few microseconds apart.
CONCURRENT_REPS = 4


@dataclass
class Measurements:
    """Raw timings (seconds, medians over repeats) and what they were taken on."""

    device: str
    device_name: str
    torch_version: str
    cuda_version: str | None
    date: str
    sizes: list[int]
    size_device_s: dict[str, list[float]] = field(default_factory=dict)  # per direction
    size_wall_s: dict[str, list[float]] = field(default_factory=dict)
    pages: list[int] = field(default_factory=list)
    page_bytes: int = 0
    page_wall_s: dict[str, list[float]] = field(default_factory=dict)  # k small copies
    page_bulk_wall_s: dict[str, list[float]] = field(default_factory=dict)  # 1 copy of k pages
    concurrent_bytes: int = 0
    alone_s: dict[str, float] = field(default_factory=dict)
    concurrent_s: dict[str, float] = field(default_factory=dict)


class _Bench:
    """Buffers, timers and concurrency for one device; the only place torch is touched."""

    def __init__(self, device: str):
        try:
            import torch
        except ImportError:
            raise UserError("torch is not installed; expected the 'torch' extra"
                            " (pip install -e '.[torch]')", where="calibrate") from None
        self.torch = torch
        self.cuda = device == "cuda"
        if self.cuda and not torch.cuda.is_available():
            raise UserError(f"found no usable CUDA device (torch {torch.__version__});"
                            " expected a GPU, or use --device cpu", where="--device cuda")
        self.dev = torch.device("cuda", torch.cuda.current_device()) if self.cuda else torch.device("cpu")
        if self.cuda:
            self.streams = {"h2d": torch.cuda.Stream(), "d2h": torch.cuda.Stream()}
        self._threads = torch.get_num_threads()
        if not self.cuda:
            # One thread per copy, as one DMA engine per direction: torch's intra-op
            # pool would otherwise wait on busy cores and time the OS scheduler instead.
            torch.set_num_threads(1)

    def close(self):
        self.torch.set_num_threads(self._threads)

    def device_name(self) -> str:
        if self.cuda:
            return self.torch.cuda.get_device_name(self.dev)
        return _cpu_name()

    def host_buffer(self, nbytes: int):
        # Pinned on CUDA, like SGLang's host pool; filled so pages are faulted in.
        buf = self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=self.cuda)
        buf.fill_(1)
        return buf

    def device_buffer(self, nbytes: int):
        buf = self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.dev)
        buf.fill_(2)
        return buf

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def time(self, ops, direction: str) -> tuple[float, float]:
        """Run ``ops`` (copy callables) once; return (device seconds, wall seconds)."""
        if not self.cuda:
            t0 = time.perf_counter()
            for op in ops:
                op()
            wall = time.perf_counter() - t0
            return wall, wall
        cuda = self.torch.cuda
        stream = self.streams[direction]
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        cuda.synchronize()
        t0 = time.perf_counter()
        with cuda.stream(stream):
            start.record(stream)
            for op in ops:
                op()
            end.record(stream)
        end.synchronize()
        wall = time.perf_counter() - t0
        return start.elapsed_time(end) / 1e3, wall

    def time_concurrent(self, ops_by_direction: dict) -> dict[str, float]:
        """Run each direction's ops at the same time; return device seconds per direction."""
        if not self.cuda:
            barrier = threading.Barrier(len(ops_by_direction))
            out: dict[str, float] = {}

            def worker(direction, ops):
                barrier.wait()
                t0 = time.perf_counter()
                for op in ops:
                    op()  # torch releases the GIL inside copy_
                out[direction] = time.perf_counter() - t0

            threads = [threading.Thread(target=worker, args=item) for item in ops_by_direction.items()]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return out
        cuda = self.torch.cuda
        events = {d: (cuda.Event(enable_timing=True), cuda.Event(enable_timing=True))
                  for d in ops_by_direction}
        cuda.synchronize()
        for direction, ops in ops_by_direction.items():  # issue both, then wait for both
            stream = self.streams[direction]
            with cuda.stream(stream):
                events[direction][0].record(stream)
                for op in ops:
                    op()
                events[direction][1].record(stream)
        cuda.synchronize()
        return {d: s.elapsed_time(e) / 1e3 for d, (s, e) in events.items()}


def _copy(dst, src):
    """A copy op: non_blocking so CUDA copies from/to pinned memory are async DMA."""
    return lambda: dst.copy_(src, non_blocking=True)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def measure(device: str, sizes, pages, page_bytes: int, repeats: int,
            concurrent_bytes: int, log=print) -> Measurements:
    """Run the three sweeps on ``device`` ("cuda" or "cpu") and return the raw timings."""
    bench = _Bench(device)
    try:
        return _measure(bench, device, sizes, pages, page_bytes, repeats, concurrent_bytes, log)
    finally:
        bench.close()


def _measure(bench, device, sizes, pages, page_bytes, repeats, concurrent_bytes, log):
    torch = bench.torch
    sizes = sorted(set(int(s) for s in sizes))
    pages = sorted(set(int(k) for k in pages))
    span = max(max(sizes), max(pages) * page_bytes, concurrent_bytes)
    host = bench.host_buffer(span)
    devb = bench.device_buffer(span)
    # The concurrency test needs a second pair so H2D and D2H touch different memory.
    host2 = bench.host_buffer(concurrent_bytes)
    dev2 = bench.device_buffer(concurrent_bytes)
    bench.sync()

    def ops_for(direction, nbytes, offset=0):
        h, d = host[offset:offset + nbytes], devb[offset:offset + nbytes]
        return _copy(d, h) if direction == "h2d" else _copy(h, d)

    cuda_version = getattr(torch.version, "cuda", None) if bench.cuda else None
    m = Measurements(
        device=device, device_name=bench.device_name(), torch_version=torch.__version__,
        cuda_version=cuda_version,
        date=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        sizes=sizes, pages=pages, page_bytes=page_bytes, concurrent_bytes=concurrent_bytes)
    log(f"calibrate: {device} ({m.device_name}), torch {m.torch_version}"
        + (f", CUDA {cuda_version}" if cuda_version else ""))

    for direction in DIRECTIONS:  # warm-up: context, allocator, first-touch
        bench.time([ops_for(direction, span)], direction)

    # 1. Size sweep: one copy per size.
    for direction in DIRECTIONS:
        dev_s, wall_s = [], []
        for size in sizes:
            op = [ops_for(direction, size)]
            runs = [bench.time(op, direction) for _ in range(repeats)]
            dev_s.append(statistics.median(r[0] for r in runs))
            wall_s.append(statistics.median(r[1] for r in runs))
        m.size_device_s[direction], m.size_wall_s[direction] = dev_s, wall_s

    # 2. Page sweep: k small copies (pre-sliced, so only the copy calls are timed) vs
    # one copy of the same k pages.
    for direction in DIRECTIONS:
        small, bulk = [], []
        for k in pages:
            ops = [ops_for(direction, page_bytes, i * page_bytes) for i in range(k)]
            small.append(statistics.median(bench.time(ops, direction)[1] for _ in range(repeats)))
            one = [ops_for(direction, k * page_bytes)]
            bulk.append(statistics.median(bench.time(one, direction)[1] for _ in range(repeats)))
        m.page_wall_s[direction], m.page_bulk_wall_s[direction] = small, bulk

    # 3. Concurrency: the same large copies alone, then H2D and D2H together.
    h2d_ops = [_copy(dev2, host2)] * CONCURRENT_REPS
    d2h_ops = [_copy(host[:concurrent_bytes], devb[:concurrent_bytes])] * CONCURRENT_REPS
    both = {"h2d": h2d_ops, "d2h": d2h_ops}
    conc_repeats = max(3, repeats // 4)
    for direction in DIRECTIONS:
        m.alone_s[direction] = statistics.median(
            bench.time_concurrent({direction: both[direction]})[direction]
            for _ in range(conc_repeats))
    runs = [bench.time_concurrent(both) for _ in range(conc_repeats)]
    for direction in DIRECTIONS:
        m.concurrent_s[direction] = statistics.median(r[direction] for r in runs)
    return m


@dataclass
class Calibration:
    """The fitted parameters and the profile built from them."""

    profile: Profile
    report: list[str]


def fit_profile(m: Measurements, base: Profile, name: str, base_label: str) -> Calibration:
    """Fit the measured parameters and merge them into ``base``; the rest stay as in base."""
    report: list[str] = []
    fits: dict[str, dict] = {}
    measured: dict[str, float] = {}
    latencies = []
    for direction in DIRECTIONS:
        bw_fit = fit_transfer(m.sizes, m.size_device_s[direction], what=f"{direction} size sweep")
        wall_fit = fit_transfer(m.sizes, m.size_wall_s[direction],
                                what=f"{direction} size sweep (wall)")
        latencies.append(wall_fit.latency_s)
        measured[f"bw_{direction}_gbps"] = bw_fit.bandwidth_bps / 1e9
        fits[f"{direction}_size"] = {"latency_us": bw_fit.latency_s * 1e6,
                                     "bandwidth_gbps": bw_fit.bandwidth_bps / 1e9,
                                     **bw_fit.line.as_dict()}
        fits[f"{direction}_size_wall"] = {"latency_us": wall_fit.latency_s * 1e6,
                                          "bandwidth_gbps": wall_fit.bandwidth_bps / 1e9,
                                          **wall_fit.line.as_dict()}
        report.append(_fit_line(f"{direction} sizes (device)", bw_fit.line,
                                f"latency {bw_fit.latency_s * 1e6:.2f} us, bandwidth"
                                f" {bw_fit.bandwidth_bps / 1e9:.2f} GB/s"))
        report.append(_fit_line(f"{direction} sizes (wall)", wall_fit.line,
                                f"t_op {wall_fit.latency_s * 1e6:.2f} us, bandwidth"
                                f" {wall_fit.bandwidth_bps / 1e9:.2f} GB/s"))
    measured["t_op_us"] = statistics.fmean(latencies) * 1e6

    per_call = []
    for direction in DIRECTIONS:
        call_fit = fit_per_call(m.pages, m.page_wall_s[direction], what=f"{direction} page sweep")
        per_call.append(call_fit.per_call_s)
        fits[f"{direction}_pages"] = {"per_call_us": call_fit.per_call_s * 1e6,
                                      "fixed_us": call_fit.fixed_s * 1e6,
                                      **call_fit.line.as_dict()}
        k, small, bulk = m.pages[-1], m.page_wall_s[direction][-1], m.page_bulk_wall_s[direction][-1]
        report.append(_fit_line(f"{direction} pages", call_fit.line,
                                f"per call {call_fit.per_call_s * 1e6:.2f} us;"
                                f" {k} x {m.page_bytes} B copies take {small / bulk:.1f}x"
                                " one copy of the same bytes"))
    measured["c_call_us"] = statistics.fmean(per_call) * 1e6

    shares = {d: m.alone_s[d] / m.concurrent_s[d] for d in DIRECTIONS}
    measured["bidir_factor"] = min(1.0, min(shares.values()))
    fits["concurrent"] = {"bytes": m.concurrent_bytes, "reps": CONCURRENT_REPS,
                          **{f"{d}_share": shares[d] for d in DIRECTIONS}}
    report.append("concurrent H2D+D2H: each direction keeps "
                  + ", ".join(f"{d} {shares[d]:.2f}" for d in DIRECTIONS)
                  + f" of its alone bandwidth -> bidir_factor {measured['bidir_factor']:.2f}")

    on = (f"{m.device_name} ({m.device}), torch {m.torch_version}"
          + (f", CUDA {m.cuda_version}" if m.cuda_version else "") + f", {m.date}")
    how = {
        "bw_h2d_gbps": "slope of CUDA-event (device) time over a size sweep of single copies",
        "bw_d2h_gbps": "slope of CUDA-event (device) time over a size sweep of single copies",
        "t_op_us": "mean intercept of wall time (issue to completion) over the size sweeps",
        "c_call_us": "slope of wall time over k back-to-back torch copy_ calls of"
                     f" {m.page_bytes} B (includes torch dispatch: an upper bound)",
        "bidir_factor": "min over directions of alone/concurrent time, H2D and D2H on two"
                        " streams at once",
    }
    if m.device == "cpu":
        how = {k: v.replace("CUDA-event (device)", "perf_counter").replace("two streams",
                                                                           "two threads")
               for k, v in how.items()}
    data = base.model_dump()
    data.update(measured)
    data["name"] = name
    data["gpu"] = m.device_name
    data["host_link"] = (f"{base.host_link} (from base {base_label}, not measured)"
                         if m.device == "cuda" else "none: CPU-to-CPU copies (code-path check)")
    data["description"] = (f"measured by hicache-sim calibrate on {m.device_name};"
                           f" unmeasured parameters from profile {base_label}")
    sources = {k: f"[base {base_label}] {v}" for k, v in base.sources.items()}
    for key in measured:
        sources[key] = f"measured by hicache-sim calibrate on {on}: {how[key]}"
    data["sources"] = sources
    data["measured"] = {
        "device": m.device, "device_name": m.device_name, "torch": m.torch_version,
        "cuda": m.cuda_version, "date": m.date, "base": base_label,
        "fits": fits,
        "points": {
            "sizes_bytes": m.sizes,
            **{f"{d}_size_device_s": m.size_device_s[d] for d in DIRECTIONS},
            **{f"{d}_size_wall_s": m.size_wall_s[d] for d in DIRECTIONS},
            "pages": m.pages, "page_bytes": m.page_bytes,
            **{f"{d}_pages_wall_s": m.page_wall_s[d] for d in DIRECTIONS},
            **{f"{d}_pages_bulk_wall_s": m.page_bulk_wall_s[d] for d in DIRECTIONS},
            **{f"{d}_alone_s": m.alone_s[d] for d in DIRECTIONS},
            **{f"{d}_concurrent_s": m.concurrent_s[d] for d in DIRECTIONS},
        },
    }
    profile = profile_from_mapping(_plain(data), where="calibrated profile")
    return Calibration(profile, report)


def _fit_line(label: str, line, params: str) -> str:
    return (f"{label}: {params}; R^2 {line.r2:.4f}, worst relative error"
            f" {line.worst_rel_err * 100:.1f}% over {line.points} points")


def _plain(obj):
    """Plain Python scalars/lists/dicts (numpy floats would not survive yaml.safe_dump)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, str):
        return str(obj)  # torch.__version__ is a str subclass yaml cannot represent
    if isinstance(obj, bool) or obj is None or isinstance(obj, int):
        return obj
    return float(f"{float(obj):.6g}")  # 6 significant digits: beyond measurement noise


def calibrate(device: str, out, base: str = "h200-sxm", sizes=None, pages=None,
              page_bytes: int | None = None, repeats: int | None = None,
              concurrent_bytes: int | None = None, name: str | None = None,
              log=print) -> Calibration:
    """Measure, fit, and write the profile to ``out`` atomically; return the calibration."""
    if device not in DEFAULTS:
        raise UserError(f"found {device!r}; expected one of {', '.join(DEFAULTS)}",
                        where="--device")
    base_profile = load_profile(base)  # fail on a bad base before measuring anything
    d = DEFAULTS[device]
    m = measure(device, sizes or d["sizes"], pages or d["pages"],
                page_bytes or d["page_bytes"], repeats or d["repeats"],
                concurrent_bytes or d["concurrent_bytes"], log=log)
    out = Path(out)
    cal = fit_profile(m, base_profile, name or out.stem, str(base))
    for line in cal.report:
        log(line)
    header = (f"# hicache-sim cost profile written by `hicache-sim calibrate --device {device}`\n"
              f"# on {m.device_name}, torch {m.torch_version}, {m.date}. Measured keys:"
              " bw_h2d_gbps, bw_d2h_gbps, t_op_us, c_call_us, bidir_factor;\n"
              f"# every other key is from the base profile '{base}'. See `sources:` and"
              " `measured:`.\n")
    write_text(out, header + dump_profile(cal.profile))
    load_profile(out)  # the written file must load back
    log(f"calibrate: wrote {out}")
    return cal
