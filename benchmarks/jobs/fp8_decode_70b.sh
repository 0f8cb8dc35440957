#!/usr/bin/env bash
# One H200 (~12 min, start/collect through benchmarks/device_jobs.sh): the 70B FP8 decode path
# after the W8A8 skinny GEMM and the fp16 dots over an e4m3 cache; the norms and SiLU-and-mul emit
# the FP8 layers' e4m3 inputs (benchmarks/jobs/fp8_fused_quant.sh measures that fusion A/B).
#   1. GPU tests of the kernels and the engine's fast paths;
#   2. the e4m3-cache decode kernel at the 70B's heads (64 query, 8 KV), fp16 against bf16 dots
#      (benchmarks/sweeps/decode_fp8_sweep.py);
#   3. a 70B FP8 decode step kernel by kernel against its bandwidth floor (decode_breakdown.py);
#   4. `nano` on the 70B FP8 with an e4m3 cache against its roofline (fleetlm bench engine).
#   benchmarks/device_jobs.sh start benchmarks/jobs/fp8_decode_70b.sh; WAIT_S=560 ... collect
. benchmarks/jobs/base.sh
nvidia-smi -L
[ -n "${SKIP_TESTS:-}" ] || { timeout 300 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_skinny_gemm.py tests/kernels/test_paged_decode_attention.py \
  tests/kernels/test_fp8_kv_cache.py tests/kernels/test_rms_norm.py tests/kernels/test_silu_mul.py \
  tests/engine/test_gpu_paths.py > "$R/gpu_tests.log" 2>&1
stamp "tests rc=$?"; tail -4 "$R/gpu_tests.log"; }
timeout 200 python3 -m benchmarks.sweeps.decode_fp8_sweep --heads 64 --kv-heads 8 \
  --shapes "${ATTN_SHAPES:-64:2048,128:2048,256:1024}" --json "$R/decode_fp8_sweep_70b.json" \
  > "$R/decode_fp8_sweep_70b.log" 2>&1
stamp "attention sweep rc=$?"; grep -A20 "^fastest" "$R/decode_fp8_sweep_70b.log"
timeout 300 python3 -m benchmarks.decode_breakdown --model llama-3.1-70b \
  --quantization fp8 --kv-cache-dtype fp8 --parts "${PARTS:-decode}" \
  --batches "${BATCHES:-64,128}" --context "${CONTEXT:-2000}" --steps 10 \
  --json "$R/decode_breakdown_70b_fp8.json" > "$R/decode_breakdown_70b_fp8.log" 2>&1
stamp "breakdown rc=$?"
grep -E "ceilings|decode B=|ms  x" "$R/decode_breakdown_70b_fp8.log" | head -30
timeout 420 python3 -m fleetlm.cli bench engine --model llama-3.1-70b --quantization fp8 \
  --kv-cache-dtype fp8 --workload nano --detokenize --json "$R/nano_70b_fp8.json" \
  > "$R/nano_70b_fp8.log" 2>&1
stamp "nano rc=$?"; grep -E "all_at_once|roofline|tok/s" "$R/nano_70b_fp8.log" | tail -5
