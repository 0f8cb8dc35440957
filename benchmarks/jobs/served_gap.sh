#!/usr/bin/env bash
# One H200, issues 14 and 15: the engine's GPU tests, then the served path against the bare
# engine on the same `seed` requests (60 s of arrivals per rate), then the bare engine with
# CUDA-graph pieces for mixed steps, and with pieces plus the latency-aware prefill budget.
# Run through benchmarks/device_jobs.sh (it takes ~20 min); results land in $JOBS/results.
. benchmarks/jobs/common.sh
PYTHONPATH=/tmp/site:$PWD python3 -m pytest -q -p no:cacheprovider tests/engine/test_gpu_paths.py \
  > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" | tee -a "$R/gpu_tests.log"

RATES=${RATES:-5,6,7}
common=(--model llama-3.1-8b --duration 60 --no-stop-on-miss)
OUT=$R/serve benchmarks/device_serve.sh --launch --compare-engine --rates "$RATES" "${common[@]}" \
  --json "$R/serve/serve.json" --plot "$R/serve/serve.png"
FLEETLM_USE_PIECEWISE_GRAPHS=1 OUT=$R/piecewise benchmarks/device_serve.sh --backend engine \
  --rates "${PIECE_RATES:-6,7,8}" "${common[@]}" --json "$R/piecewise/engine.json"
FLEETLM_USE_PIECEWISE_GRAPHS=1 FLEETLM_STEP_TIME_TARGET_S=0.035 OUT=$R/budget \
  benchmarks/device_serve.sh --backend engine --rates "${PIECE_RATES:-6,7,8}" "${common[@]}" \
  --json "$R/budget/engine.json"
