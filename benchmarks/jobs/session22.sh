#!/usr/bin/env bash
# One H200 (issue 35): the latency-aware prefill as a plan per prompt (documents by a share of the
# GPU, the cost model calibrated at start-up) on served `seed`, no admission bound, 120 s per
# rate: the 70B FP8 (FP8 KV) at 0.7, 1 and 1.25 req/s, then the 8B at 12 and 14, then the 70B's
# prefill steps kernel by kernel (issue 35 item 6). Simulated
# (docs/benchmarks.md, "The scheduler simulated"): the 70B meets at 1 req/s, the 8B at 14. The
# workers' logs carry the calibration ("step costs calibrated"); the step traces carry the decode
# context and prefill pairs, so `python -m benchmarks.schedule_sim --fit-trace` can refit them.
#   benchmarks/device_jobs.sh start benchmarks/jobs/session22.sh
. benchmarks/jobs/parts.sh
export GOODPUT70=${GOODPUT70:-"0.7 1 1.25"} GOODPUT8=${GOODPUT8:-"12 14"}
export SERVE_ENV=${SERVE_ENV:-"FLEETLM_STEP_TIME_TARGET_S=0.03"}
run_parts "${PARTS:-tests_calibration serve70_goodput serve8_goodput breakdown_prefill}"
