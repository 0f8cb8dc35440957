#!/usr/bin/env bash
# One H200: the bare engine on `seed` at $RATES (default 12 req/s, 60 s of arrivals) once per
# engine configuration, to A/B the knobs that set how much prefill a step carries beside its
# decodes. $CONFIGS: configurations separated by ';', each a name then FLEETLM_* assignments.
# Run through benchmarks/device_jobs.sh; results (one JSON per configuration) in $JOBS/results.
. benchmarks/jobs/common.sh
DEFAULT="base;chunk1024 FLEETLM_LONG_PREFILL_CHUNK=1024"
DEFAULT="$DEFAULT;tokens4096 FLEETLM_MAX_NUM_BATCHED_TOKENS=4096"
DEFAULT="$DEFAULT;budget35 FLEETLM_STEP_TIME_TARGET_S=0.035"
engine_configs "${CONFIGS:-$DEFAULT}"
