#!/usr/bin/env bash
# Calibrate the host<->device copy parameters on a real GPU, in one go (about 1 minute;
# capped at 170 s). Prepared for a session lent an H200; runs on any CUDA GPU.
#
#   benchmarks/gpu_calibrate.sh [PROFILE_OUT]      (default profiles/h200-measured.yaml)
#
# Writes the fitted profile (loadable as `cost_profile: profiles/h200-measured.yaml`) and
# a log at $LOG_DIR/gpu_calibrate.log (default benchmarks/results/). When $OUT is set
# (the device runner's output folder) both files are also copied there.
# Needs a python with CUDA torch, numpy, pydantic and pyyaml: $PY, else .venv/bin/python,
# else python3.
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE_OUT=${1:-profiles/h200-measured.yaml}
LOG_DIR=${LOG_DIR:-benchmarks/results}
mkdir -p "$LOG_DIR" "$(dirname "$PROFILE_OUT")"
LOG="$LOG_DIR/gpu_calibrate.log"

PYBIN=""
for cand in "${PY:-}" .venv/bin/python python3 python; do
  [ -n "$cand" ] || continue
  if "$cand" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    PYBIN=$cand
    break
  fi
done
if [ -z "$PYBIN" ]; then
  echo "gpu_calibrate: no python with a CUDA-enabled torch found (tried \$PY, .venv/bin/python, python3)" >&2
  exit 1
fi
if ! "$PYBIN" -c 'import numpy, pydantic, yaml' 2>/dev/null; then
  echo "gpu_calibrate: $PYBIN lacks numpy, pydantic or pyyaml" >&2
  exit 1
fi

{
  echo "# benchmarks/gpu_calibrate.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,memory.total \
    --format=csv 2>&1 || echo "(nvidia-smi unavailable)"
  "$PYBIN" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "|", torch.cuda.get_device_name(0))'

  # Sizes from 64 KiB (latency-bound) to 1 GiB (bandwidth-bound); 4 KiB page copies up to
  # 4096 calls (call-bound); 256 MiB x 4 per stream for concurrent H2D + D2H.
  timeout 170 "$PYBIN" cli.py calibrate --device cuda --base h200-sxm --name h200-measured \
    --sizes 64K 256K 1M 4M 16M 64M 256M 1G \
    --pages 1 4 16 64 256 1024 4096 --page-bytes 4K \
    --repeats 20 --concurrent-bytes 256M \
    --out "$PROFILE_OUT"

  # What the measured profile means for the simulator, next to the shipped default.
  "$PYBIN" - "$PROFILE_OUT" <<'PY'
import sys
from sim.costs import CostModel
for prof in ("h200-sxm", sys.argv[1]):
    for backend in ("kernel", "direct"):
        cm = CostModel(prof, "llama-3.1-70b", tp=8, page_size=64, io_backend=backend)
        print(f"{cm.profile.name:>14} {backend:>6} llama-3.1-70b TP8 page 64:"
              f" h2d 1 page {cm.h2d_time(64) * 1e6:8.1f} us, 10k tokens {cm.h2d_time(10_000) * 1e3:7.2f} ms;"
              f" d2h 1 page {cm.d2h_time(64) * 1e6:8.1f} us, 10k tokens {cm.d2h_time(10_000) * 1e3:7.2f} ms")
PY
} 2>&1 | tee "$LOG"

if [ -n "${OUT:-}" ]; then
  cp "$PROFILE_OUT" "$LOG" "$OUT"/
fi
echo "gpu_calibrate: wrote $PROFILE_OUT and $LOG"
