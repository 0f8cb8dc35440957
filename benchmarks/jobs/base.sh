# What the engine-only job scripts start with, run from the tree's root by device_jobs.sh
# (`. benchmarks/jobs/base.sh`): results under $R, unbuffered Python importing this tree, and a
# timestamped echo. Jobs that launch the serving stack source common.sh instead (it installs
# the carried wheels too).
set -u
R=$JOBS/results
mkdir -p "$R"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD

stamp() { echo "[$(date +%H:%M:%S)] $*"; }
