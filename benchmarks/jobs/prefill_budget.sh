#!/usr/bin/env bash
# One H200: how large a step's token budget should be on `seed` (issue 15). At 12 req/s with
# the 8,192-token default, bursts of arrivals and long-document slices make runs of 250-400 ms
# steps: prompts arriving during one wait for it and the next, which sets the TTFT tail.
#   1. served and bare engine at $RATE (default 12) with FLEETLM_MAX_NUM_BATCHED_TOKENS=$TOKENS
#      (default 4096), identical requests (--compare-engine);
#   2. the bare engine at $RATE for each of $CONFIGS (default: the 8,192 default, 3,072), the
#      same machine, for the A/B;
#   3. the bare engine at $RATE + 1 with $TOKENS.
# Run through benchmarks/device_jobs.sh; results in $JOBS/results.
. benchmarks/jobs/common.sh
RATE=${RATE:-12}
TOKENS=${TOKENS:-4096}
stamp "served and engine at $RATE, $TOKENS tokens per step"
FLEETLM_MAX_NUM_BATCHED_TOKENS=$TOKENS OUT=$R/serve benchmarks/device_serve.sh --launch \
  --compare-engine --rates "$RATE" --model llama-3.1-8b --duration 60 --no-stop-on-miss \
  --json "$R/serve/serve.json" > "$R/serve.log" 2>&1
stamp "served rc=$?"; grep -E "req/s:|goodput|roofline|server side" "$R/serve/bench.log" | tail -12
RATES=$RATE engine_configs "${CONFIGS:-base;tokens3072 FLEETLM_MAX_NUM_BATCHED_TOKENS=3072}"
RATES=$((RATE + 1)) engine_configs "tokens${TOKENS}_$((RATE + 1)) FLEETLM_MAX_NUM_BATCHED_TOKENS=$TOKENS"
