#!/usr/bin/env bash
# One H200: the GPU tests of the engine's paths and the prefill kernels, the 1 × 8192 causal
# prefill attention against the bf16 matmul ceiling, the served path against the bare engine on
# `seed` at $RATES (default 7 req/s, 60 s of arrivals) with whatever FLEETLM_* settings were
# exported, then an optional engine benchmark ($ENGINE_BENCH, a command line).
# Run through benchmarks/device_jobs.sh; results land in $JOBS/results.
. benchmarks/jobs/common.sh
PYTHONPATH=/tmp/site:$PWD python3 -m pytest -q -p no:cacheprovider -k "not llama_shapes or None" \
  tests/engine/test_gpu_paths.py tests/kernels/test_dense_prefill_attention.py \
  tests/kernels/test_paged_prefill_attention.py ${GPU_TESTS:-} > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" | tee -a "$R/gpu_tests.log"
PYTHONPATH=$PWD python3 -m benchmarks.kernel_bench --only prefill_8k \
  --json "$R/kernels_prefill_8k_h200.json" > "$R/kernels.log" 2>&1
echo "kernel bench rc=$?" | tee -a "$R/kernels.log"
OUT=$R/serve benchmarks/device_serve.sh --launch --compare-engine --rates "${RATES:-7}" \
  --model llama-3.1-8b --duration 60 --no-stop-on-miss --json "$R/serve/serve.json"
if [ -n "${ENGINE_BENCH:-}" ]; then
  PYTHONPATH=/tmp/site:$PWD bash -c "$ENGINE_BENCH" > "$R/engine_bench.log" 2>&1
  echo "engine bench rc=$?" | tee -a "$R/engine_bench.log"
fi
