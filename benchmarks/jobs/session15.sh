#!/usr/bin/env bash
# One H200 (issue 36): each model at about its goodput and at about twice it, 120 s of `seed`
# per rate, admission bound 0.8 s, with the seat rule that prices each row's share of the
# prompts and the latency-aware prefill budget; then every kernel test compiled on the GPU.
#   PARTS="serve70 serve8 kernels" benchmarks/device_jobs.sh start benchmarks/jobs/session15.sh
. benchmarks/jobs/parts.sh
export RATES70=${RATES70:-2,4} RATES8=${RATES8:-28}
export SERVE_ENV=${SERVE_ENV:-"FLEETLM_STEP_TIME_TARGET_S=0.035"}
run_parts "${PARTS:-serve70 serve8 kernels}"
