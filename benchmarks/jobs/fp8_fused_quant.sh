#!/usr/bin/env bash
# One H200 (~10 min, start/collect through benchmarks/device_jobs.sh): the FP8 activation
# quantization fused into rms_norm and silu_and_mul (engine/models/fp8_activation.py), A/B.
#   1. GPU tests: the fused kernels bit for bit against rms_norm / silu_and_mul + quantize_fp8,
#      and the FP8 engine's greedy output with and without the fusion (CUDA graphs);
#   2. the fused kernels against the two launches they replace, at the 70B's widths and 1-64
#      rows (benchmarks/kernel_bench/fp8.py);
#   3. a 70B FP8 decode step kernel by kernel, fused and then unfused (--unfused-fp8-quant), at
#      the batch sizes the fusion covers (<= FP8_SKINNY_MAX_ROWS = 64) and 2k context.
#   benchmarks/device_jobs.sh start benchmarks/jobs/fp8_fused_quant.sh; WAIT_S=560 ... collect
. benchmarks/jobs/base.sh
nvidia-smi -L
[ -n "${SKIP_TESTS:-}" ] || { timeout 300 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_rms_norm.py tests/kernels/test_silu_mul.py tests/kernels/test_fp8_quant.py \
  tests/engine/test_gpu_paths.py -k "fp8 or rms or silu or quant" > "$R/gpu_tests.log" 2>&1
stamp "tests rc=$?"; tail -4 "$R/gpu_tests.log"; }
timeout 150 python3 -m benchmarks.kernel_bench --only fp8 --json "$R/kernel_bench_fp8.json" \
  > "$R/kernel_bench_fp8.log" 2>&1
stamp "kernel_bench fp8 rc=$?"; grep -E "_fp8|quantize_fp8" "$R/kernel_bench_fp8.log"
for mode in fused unfused; do
  flag=""; [ "$mode" = unfused ] && flag="--unfused-fp8-quant"
  timeout 300 python3 -m benchmarks.decode_breakdown --model llama-3.1-70b \
    --quantization fp8 --kv-cache-dtype fp8 --parts decode $flag \
    --batches "${BATCHES:-1,32,64}" --context "${CONTEXT:-2000}" --steps 10 \
    --json "$R/decode_breakdown_70b_fp8_$mode.json" > "$R/decode_breakdown_70b_fp8_$mode.log" 2>&1
  stamp "breakdown $mode rc=$?"
  grep -E "decode B=|ms  x" "$R/decode_breakdown_70b_fp8_$mode.log" | head -30
done
