#!/usr/bin/env bash
# One H200 (issues 36 and 35): the 8B at about twice its goodput with the slowest first tokens
# itemised (server queue, server TTFT, forecast), then the 70B FP8 at about twice its goodput
# without and with shared-prefix decode attention (an A/B on served `seed`). 120 s of arrivals
# per rate, admission bound 0.8 s, latency-aware prefill at 35 ms.
#   benchmarks/device_jobs.sh start benchmarks/jobs/session17.sh
. benchmarks/jobs/parts.sh
export RATES70=${RATES70:-3} RATES8=${RATES8:-28}
# API event-loop stalls of 0.25 s or more are logged with where the loop was held (the 8B's
# worst first tokens: time before the queue, issue 36)
export SERVE_ENV=${SERVE_ENV:-"FLEETLM_STEP_TIME_TARGET_S=0.035 FLEETLM_API_STALL_S=0.25"}
run_parts "${PARTS:-serve8 serve70 serve70_shared}"
