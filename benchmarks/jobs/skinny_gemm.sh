#!/usr/bin/env bash
# One H200, one call (~8 min): kernels/skinny_gemm.py's tests compiled on the GPU, then the
# config sweep against cuBLAS at llama-3.1-8b's decode shapes (benchmarks/sweeps/skinny_gemm_sweep.py).
#   MS=1,16,32,64,128 bash benchmarks/jobs/skinny_gemm.sh        (results in $OUT)
set -u
export PYTHONUNBUFFERED=1
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
nvidia-smi -L
PYTHONPATH=$PWD timeout 120 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_skinny_gemm.py > "$OUT/skinny_tests.log" 2>&1
stamp "tests rc=$?"; tail -3 "$OUT/skinny_tests.log"
PYTHONPATH=$PWD timeout "${SWEEP_S:-450}" python3 -m benchmarks.sweeps.skinny_gemm_sweep \
  --ms "${MS:-1,8,16,32,64,96,128,192,256}" --shapes "${SHAPES:-qkv,o,gate_up,down,lm_head}" \
  ${GRID:+--grid "$GRID"} --json "$OUT/skinny_gemm_sweep.json" > "$OUT/skinny_gemm_sweep.log" 2>&1
stamp "sweep rc=$?"; grep -vE "^\s*$" "$OUT/skinny_gemm_sweep.log" | tail -60
