#!/usr/bin/env bash
# One H200 (~13 min, start/collect through benchmarks/device_jobs.sh): the session's last round.
#   1. the GPU tests: every kernel test (compiled on the GPU), the engine's GPU paths, overlap
#      and FP8 tests, the sampler's (structured outputs) on CUDA;
#   2. the e4m3-cache decode kernel at the 70B's heads: the fp16 and q's-dtype widenings;
#   3. the shared-prefix decode kernel against the plain one (when benchmarks/shared_prefix_bench.py
#      exists);
#   4. `nano` on the 70B FP8 (e4m3 KV) against its roofline;
#   5. structured outputs on the 8B (64 streams, with and without a JSON schema; needs the
#      llguidance wheel carried in .whl/), then `nano` on the 8B.
#   benchmarks/device_jobs.sh start benchmarks/jobs/final_round.sh; WAIT_S=560 ... collect
set -u
R=$JOBS/results
mkdir -p "$R"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
fi
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
nvidia-smi -L
timeout 420 python3 -m pytest -q -p no:cacheprovider tests/kernels \
  tests/engine/test_gpu_paths.py tests/engine/test_overlap_gpu.py \
  ${GPU_TESTS:-} > "$R/gpu_tests.log" 2>&1
stamp "tests rc=$?"; tail -6 "$R/gpu_tests.log"
timeout 150 python3 -m benchmarks.sweeps.decode_fp8_sweep --heads 64 --kv-heads 8 --widen fp16,q \
  --shapes 64:2048,128:2048,256:1024 --json "$R/decode_fp8_sweep_70b_widen.json" \
  > "$R/decode_fp8_sweep_70b_widen.log" 2>&1
stamp "widen sweep rc=$?"; grep -A12 "^fastest" "$R/decode_fp8_sweep_70b_widen.log"
if [ -f benchmarks/shared_prefix_bench.py ]; then
  timeout 150 python3 -m benchmarks.shared_prefix_bench --json "$R/shared_prefix_bench.json" \
    > "$R/shared_prefix_bench.log" 2>&1
  stamp "shared prefix rc=$?"; tail -20 "$R/shared_prefix_bench.log"
fi
nano() {  # nano NAME ARGS...
  local name=$1; shift
  timeout 400 python3 -m fleetlm.cli bench engine --workload nano --detokenize \
    --json "$R/nano_$name.json" "$@" > "$R/nano_$name.log" 2>&1
  stamp "nano $name rc=$?"; grep -E "all_at_once|roofline" "$R/nano_$name.log" | tail -3
}
nano 70b_fp8 --model llama-3.1-70b --quantization fp8 --kv-cache-dtype fp8
timeout 240 python3 -m benchmarks.structured_output --model llama-3.1-8b --streams 64 \
  --max-tokens 256 > "$R/structured_output_8b.log" 2>&1
stamp "structured rc=$?"; tail -8 "$R/structured_output_8b.log"
nano 8b --model llama-3.1-8b
