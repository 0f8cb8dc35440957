#!/usr/bin/env bash
# Benchmarks longer than one device call (10 min): `start` runs a job script in the background,
# detached from the call (setsid), writing under /tmp/fleetlm-jobs; `collect` waits up to
# WAIT_S seconds for it to end and packs what it wrote so far into $OUT/jobs.tgz. Call `collect`
# again in the next device call (the machine stays warm between calls that follow one another).
#   benchmarks/device_jobs.sh start benchmarks/jobs/served_gap.sh
#   WAIT_S=560 benchmarks/device_jobs.sh collect
set -u
JOBS=/tmp/fleetlm-jobs
case "${1:-}" in
  start)
    shift
    mkdir -p "$JOBS"
    rm -rf "$JOBS/rc" "$JOBS/tree" "$JOBS/results"  # a warm machine keeps the last job's
    cp -r "$PWD" "$JOBS/tree"  # the call's working tree may go away when it ends
    (cd "$JOBS/tree" && setsid bash -c "JOBS=$JOBS bash $*; echo \$? > $JOBS/rc" \
      > "$JOBS/job.log" 2>&1 < /dev/null &)
    echo "started: $*"
    ;;
  collect)
    deadline=$(( $(date +%s) + ${WAIT_S:-560} ))
    while [ ! -f "$JOBS/rc" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    mkdir -p "${OUT:?}"
    # One archive: the device tool brings back at most 8 files, 16 MiB each. Server logs and
    # step traces go first when it would be larger.
    (cd "$JOBS" && find . -path ./tree -prune -o -type f -print | tar -czf "$OUT/jobs.tgz" -T -)
    if [ "$(stat -c %s "$OUT/jobs.tgz")" -gt 15000000 ]; then
      (cd "$JOBS" && find . -path ./tree -prune -o -type f ! -name 'diag*' ! -path '*trace*' \
        -print | tar -czf "$OUT/jobs.tgz" -T -)
    fi
    if [ -f "$JOBS/rc" ]; then echo "job ended rc=$(cat "$JOBS/rc")"; else echo "job running"; fi
    tail -30 "$JOBS/job.log"
    ;;
  *)
    echo "usage: $0 start SCRIPT [ARGS] | collect" >&2
    exit 2
    ;;
esac
