#!/usr/bin/env bash
# One prepared GPU check (under 8 minutes on an H200): kernel correctness on the device, then the
# decode benchmark at 32k, 128k and 512k tokens, batch 1 and 8. Uses the machine's own torch and
# triton (nothing is installed), with the repository on PYTHONPATH.
#   device tool:  bash benchmarks/gpu_check.sh       (results land in $OUT, or benchmarks/results/)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUTDIR="${OUT:-benchmarks/results}"
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUTDIR/gpu_check.log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUTDIR/gpu_check.log"
# 1. correctness: the kernel tests run compiled on CUDA (same float64 grid as the interpreter run)
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py 2>&1 | tail -5 | tee -a "$OUTDIR/gpu_check.log"
# 2. the benchmark
timeout 300 python3 -m benchmarks.bench_decode --contexts 32768 131072 524288 --batch 1 8 \
  --out "$OUTDIR/gpu_decode.json" 2>&1 | tee -a "$OUTDIR/gpu_check.log"
