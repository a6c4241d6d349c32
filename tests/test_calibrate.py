"""Calibration: the fits recover known parameters, and `calibrate --device cpu` writes a
profile that loads. The CPU run measures real copies, so its numbers are only checked
for plausibility, never timed against a limit."""

import numpy as np
import pytest

import cli
from sim.costs import CostModel, Profile, load_profile
from sim.costs.calibrate import DIRECTIONS, Measurements, fit_profile
from sim.costs.fit import fit_linear, fit_per_call, fit_transfer
from sim.errors import UserError

SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
PAGES = [1, 4, 16, 64, 256, 1024, 4096]


def _noisy(rng, clean, noise):
    """Multiplicative (log-normal) noise of relative size ``noise``, like timing jitter."""
    return np.asarray(clean) * np.exp(noise * rng.standard_normal(len(clean)))


@pytest.mark.parametrize("seed", range(5))
def test_transfer_fit_recovers_latency_and_bandwidth(seed):
    rng = np.random.Generator(np.random.PCG64(seed))
    latency, bw = 20e-6, 53e9
    times = _noisy(rng, [latency + s / bw for s in SIZES], 0.02)
    fit = fit_transfer(SIZES, times)
    assert fit.bandwidth_bps == pytest.approx(bw, rel=0.03)
    assert fit.latency_s == pytest.approx(latency, rel=0.15)
    assert fit.line.r2 > 0.99 and fit.line.worst_rel_err < 0.1


@pytest.mark.parametrize("seed", range(5))
def test_per_call_fit_recovers_the_call_cost(seed):
    rng = np.random.Generator(np.random.PCG64(100 + seed))
    per_call, fixed = 2.5e-6, 15e-6
    times = _noisy(rng, [fixed + k * per_call for k in PAGES], 0.03)
    fit = fit_per_call(PAGES, times)
    assert fit.per_call_s == pytest.approx(per_call, rel=0.05)
    assert fit.fixed_s == pytest.approx(fixed, rel=0.25)


def test_exact_data_fits_exactly():
    line = fit_linear([1, 2, 3, 4], [3.0, 5.0, 7.0, 9.0])
    assert line.intercept == pytest.approx(1.0) and line.slope == pytest.approx(2.0)
    assert line.r2 == pytest.approx(1.0) and line.worst_rel_err == pytest.approx(0, abs=1e-12)


def test_a_poor_fit_reports_its_quality():
    line = fit_linear([1, 2, 3, 4], [1.0, 4.0, 2.0, 8.0])
    assert line.r2 < 0.9 and line.worst_rel_err > 0.2


@pytest.mark.parametrize("x, y, fragment", [
    ([1, 1, 1], [1.0, 2.0, 3.0], "at least 2"),
    ([1, 2, 3], [1.0, 0.0, 3.0], "non-positive time"),
])
def test_unfittable_points_are_user_errors(x, y, fragment):
    with pytest.raises(UserError, match=fragment):
        fit_linear(x, y)


def test_shrinking_times_cannot_give_a_bandwidth():
    with pytest.raises(UserError, match="not growing with size"):
        fit_transfer([1 << 20, 2 << 20, 4 << 20], [3e-3, 2e-3, 1e-3])


def _synthetic_measurements(rng, bw, latency, t_op, c_call, share):
    m = Measurements(device="cuda", device_name="Synthetic GPU", torch_version="0.0",
                     cuda_version="12.0", date="2000-01-01T00:00:00+00:00", sizes=SIZES,
                     pages=PAGES, page_bytes=4096, concurrent_bytes=256 << 20)
    for d in DIRECTIONS:
        m.size_device_s[d] = list(_noisy(rng, [latency + s / bw[d] for s in SIZES], 0.01))
        m.size_wall_s[d] = list(_noisy(rng, [t_op + s / bw[d] for s in SIZES], 0.01))
        m.page_wall_s[d] = list(_noisy(rng, [10e-6 + k * c_call for k in PAGES], 0.01))
        m.page_bulk_wall_s[d] = [t_op + k * 4096 / bw[d] for k in PAGES]
        m.alone_s[d] = 4 * (256 << 20) / bw[d]
        m.concurrent_s[d] = m.alone_s[d] / share[d]
    return m


def test_fit_profile_merges_measured_parameters_into_the_base():
    rng = np.random.Generator(np.random.PCG64(7))
    bw = {"h2d": 55e9, "d2h": 52e9}
    m = _synthetic_measurements(rng, bw, latency=3e-6, t_op=18e-6, c_call=2.2e-6,
                                share={"h2d": 0.93, "d2h": 0.88})
    base = load_profile("h200-sxm")
    cal = fit_profile(m, base, "synthetic", "h200-sxm")
    p = cal.profile
    assert p.bw_h2d_gbps == pytest.approx(55, rel=0.02)
    assert p.bw_d2h_gbps == pytest.approx(52, rel=0.02)
    assert p.t_op_us == pytest.approx(18, rel=0.15)
    assert p.c_call_us == pytest.approx(2.2, rel=0.05)
    assert p.bidir_factor == pytest.approx(0.88)  # the more affected direction
    # Everything not measured is the base's, with the base's citation kept.
    assert p.bw_kernel_h2d_gbps == base.bw_kernel_h2d_gbps and p.peak_tflops == base.peak_tflops
    assert p.sources["peak_tflops"].startswith("[base h200-sxm]")
    assert "Synthetic GPU" in p.sources["bw_h2d_gbps"]
    assert set(Profile.numeric_fields()) <= set(p.sources)
    assert p.measured["device_name"] == "Synthetic GPU"
    assert any("R^2" in line for line in cal.report)


def test_concurrency_faster_than_alone_is_clamped_to_one():
    rng = np.random.Generator(np.random.PCG64(8))
    m = _synthetic_measurements(rng, {"h2d": 10e9, "d2h": 10e9}, 1e-6, 5e-6, 1e-6,
                                share={"h2d": 1.1, "d2h": 1.05})
    assert fit_profile(m, load_profile("a100"), "x", "a100").profile.bidir_factor == 1.0


def test_calibrate_on_cpu_writes_a_loadable_profile(tmp_path, capsys):
    out = tmp_path / "prof" / "cpu-measured.yaml"
    rc = cli.main(["calibrate", "--device", "cpu", "--sizes", "64K", "256K", "1M", "4M",
                   "--pages", "1", "4", "16", "--repeats", "5",
                   "--concurrent-bytes", "1M", "--base", "a100", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "R^2" in printed and "worst relative error" in printed and str(out) in printed
    profile = load_profile(str(out))
    assert profile.name == "cpu-measured"
    assert profile.measured["device"] == "cpu" and profile.measured["torch"]
    assert profile.measured["points"]["sizes_bytes"] == [64 << 10, 256 << 10, 1 << 20, 4 << 20]
    assert profile.bw_h2d_gbps > 0 and profile.bw_d2h_gbps > 0
    assert 0 < profile.bidir_factor <= 1 and profile.c_call_us >= 0 and profile.t_op_us >= 0
    assert profile.peak_tflops == load_profile("a100").peak_tflops  # from --base
    assert out.read_text().startswith("# hicache-sim cost profile written by")
    assert [p.name for p in out.parent.iterdir()] == ["cpu-measured.yaml"]  # no temp left
    # Scenarios can name it by path.
    cm = CostModel(str(out), "llama-3.1-8b", tp=1, page_size=64)
    assert cm.h2d_time(64) > 0


@pytest.mark.parametrize("argv, fragment", [
    (["--sizes", "64K", "lots"], "--sizes: found 'lots'"),
    (["--sizes", "1M", "1M"], "--sizes: found 1 distinct"),
    (["--pages", "0", "4"], "--pages: found '0'"),
    (["--base", "no-such-profile"], "unknown profile 'no-such-profile'"),
    (["--repeats", "x"], "--repeats: found 'x'"),
])
def test_bad_calibrate_flags_are_one_line_errors(tmp_path, capsys, argv, fragment):
    out = tmp_path / "p.yaml"
    rc = cli.main(["calibrate", "--device", "cpu", "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and fragment in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_cuda_without_a_gpu_is_a_one_line_error(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: benchmarks/gpu_calibrate.sh exercises this path")
    rc = cli.main(["calibrate", "--device", "cuda", "--out", str(tmp_path / "p.yaml")])
    err = capsys.readouterr().err
    assert rc == 2 and "--device cuda" in err and len(err.strip().splitlines()) == 1
