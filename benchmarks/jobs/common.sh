# What every job script starts with (`. benchmarks/jobs/common.sh`, run from the tree's root by
# benchmarks/device_jobs.sh): results under $R, the serving wheels carried in .whl/ installed
# into /tmp/site, unbuffered Python, and two helpers.
set -u
R=$JOBS/results
mkdir -p "$R"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1

stamp() { echo "[$(date +%H:%M:%S)] $*"; }

# engine_configs "NAME [FLEETLM_*=...];NAME ...": the bare engine on `seed`
# at $RATES (default 12 req/s, 60 s of arrivals) once per configuration, each in its own process
# with its assignments in the environment; $R/engine_NAME.{json,log}.
engine_configs() {
  local configs config words name
  IFS=';' read -ra configs <<< "$1"
  for config in "${configs[@]}"; do
    read -ra words <<< "$config"
    name=${words[0]}
    stamp "engine $name: ${words[*]:1}"
    env "${words[@]:1}" PYTHONPATH=/tmp/site:$PWD python3 -m fleetlm.cli bench serve \
      --backend engine --model llama-3.1-8b --rates "${RATES:-12}" --duration 60 \
      --no-stop-on-miss --json "$R/engine_$name.json" > "$R/engine_$name.log" 2>&1
    stamp "$name rc=$?"; grep -E "req/s:|goodput|roofline|server side" "$R/engine_$name.log" | tail -6
  done
}
