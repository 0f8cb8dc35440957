#!/usr/bin/env bash
# One H200 (issues 35/36): session22.sh's parts (the calibration's GPU test, the 70B FP8 at 0.7 / 1
# / 1.25 req/s and the 8B at 12 / 14 under a 30 ms step target, 120 s a rate), then the 8B at
# 28 req/s with the brief's TTFT as admission bound and no target, to read the worker's loop turn
# with the exchange thread against `overload_8b_h200_2026-12-05_rate28_overdue.json` (32.6 ms turns,
# the GPU idle 9.0 ms before each step), then the 70B's prefill steps kernel by kernel.
#   benchmarks/device_jobs.sh start benchmarks/jobs/session23.sh
. benchmarks/jobs/parts.sh
export GOODPUT70=${GOODPUT70:-"0.7 1 1.25"} GOODPUT8=${GOODPUT8:-"12 14"}
export SERVE_ENV=${SERVE_ENV:-"FLEETLM_STEP_TIME_TARGET_S=0.03"}
part_serve8_loop() { SERVE_ENV="" RATES8=28 part_serve8; }
# The same 8B rates without the target, for an A/B on one machine (an H100 when no H200 comes).
part_serve8_goodput_base() { SERVE_ENV="" SERVE8_NAME=serve8_goodput_base part_serve8_goodput; }
run_parts "${PARTS:-tests_calibration serve70_goodput serve8_goodput serve8_loop breakdown_prefill}"
