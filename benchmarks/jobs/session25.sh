#!/usr/bin/env bash
# One H200 (issues 35/36), or an H100 for the 8B parts. In order of what decides the most:
#   1. the prefill attention's key splits (FLEETLM_PREFILL_SPLIT_KEYS): their GPU tests, then the
#      kernel bench on short chunks over long prefixes (one range against the split count);
#   2. the 8B at 10 req/s (an H100's goodput; 14 on an H200: RATE8) with documents paced and the
#      splits, paced alone, and the defaults: on an H100 paced alone took TPOT p95 to 48.7 ms
#      against 34.2 (`serve_seed_8b_h100_2026-12-05_run3_paced.json`), 24 attention programs for
#      a document's ~74-token chunk on 132 SMs;
#   3. the 70B FP8 at 1 req/s: paced with splits, the defaults, the 30 ms target.
#   benchmarks/device_jobs.sh start benchmarks/jobs/session25.sh
. benchmarks/jobs/parts.sh
export GOODPUT8=${RATE8:-10} GOODPUT8_S=${GOODPUT8_S:-90} GOODPUT70=${RATE70:-1}
PACED="FLEETLM_PACE_LONG_PROMPTS=true"
SPLIT="FLEETLM_PREFILL_SPLIT_KEYS=true"
part_split_kernels() {
  PYTHONPATH=/tmp/site:$PWD timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/kernels/test_paged_prefill_attention.py > "$R/prefill_split_gpu_tests.log" 2>&1
  stamp "split gpu tests rc=$?"; tail -4 "$R/prefill_split_gpu_tests.log"
  PYTHONPATH=$PWD timeout 300 python3 -m benchmarks.kernel_bench --only prefill_split \
    --json "$R/prefill_split_bench.json" > "$R/prefill_split_bench.log" 2>&1
  stamp "split bench rc=$?"; tail -12 "$R/prefill_split_bench.log"
}
part_serve8_paced_split() {
  SERVE_ENV="$PACED $SPLIT" SERVE8_NAME=serve8_paced_split part_serve8_goodput
}
part_serve8_paced() { SERVE_ENV="$PACED" SERVE8_NAME=serve8_paced part_serve8_goodput; }
part_serve8_base() { SERVE_ENV="" SERVE8_NAME=serve8_base part_serve8_goodput; }
part_serve70_paced_split() {
  SERVE_ENV="$PACED $SPLIT" SERVE70_NAME=serve70_paced_split part_serve70_goodput
}
part_serve70_base() { SERVE_ENV="" SERVE70_NAME=serve70_base part_serve70_goodput; }
part_serve70_target() {
  SERVE_ENV="FLEETLM_STEP_TIME_TARGET_S=0.03" SERVE70_NAME=serve70_target part_serve70_goodput
}
run_parts "${PARTS:-split_kernels serve8_paced_split serve8_base serve8_paced serve70_paced_split serve70_base serve70_target}"
