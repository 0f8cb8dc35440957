#!/usr/bin/env bash
# One H200: the bare engine on `seed` at $RATES (default 12 req/s, 60 s of arrivals) once per
# engine configuration, to A/B the knobs that set how much prefill a step carries beside its
# decodes. $CONFIGS: configurations separated by ';', each a name then FLEETLM_* assignments.
# Run through benchmarks/device_jobs.sh; results (one JSON per configuration) in $JOBS/results.
set -u
R=$JOBS/results
mkdir -p "$R"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
DEFAULT="base;chunk1024 FLEETLM_LONG_PREFILL_CHUNK=1024"
DEFAULT="$DEFAULT;tokens4096 FLEETLM_MAX_NUM_BATCHED_TOKENS=4096"
DEFAULT="$DEFAULT;budget35 FLEETLM_STEP_TIME_TARGET_S=0.035"
IFS=';' read -ra configs <<< "${CONFIGS:-$DEFAULT}"
for config in "${configs[@]}"; do
  read -ra words <<< "$config"
  name=${words[0]}
  echo "== $name: ${words[*]:1}"
  env "${words[@]:1}" PYTHONPATH=/tmp/site:$PWD python3 -m fleetlm.cli bench serve \
    --backend engine --model llama-3.1-8b --rates "${RATES:-12}" --duration 60 \
    --no-stop-on-miss --json "$R/engine_$name.json" > "$R/engine_$name.log" 2>&1
  echo "$name rc=$?"
  grep -E "req/s:|server side" "$R/engine_$name.log" | head -4
done
