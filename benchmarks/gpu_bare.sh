#!/usr/bin/env bash
# The GPU check on a bare GPU machine (Python 3.12 with its own torch; no JVM, no network, no uv), in
# one command from the project's root, the wheels folder built beforehand on a machine with network:
#   python3 -m benchmarks.gpu_wheels .gpu            # here (stdlib and pip only): the wheels it lacks, under 64 MiB
#   bash benchmarks/gpu_bare.sh [gpu_bare options]   # there: install them, run the check
# Installs the wheels into a folder of its own (PYTHONPATH before the machine's packages), then runs
# `python -m benchmarks.gpu_bare`, whose table lands in $OUT (or benchmarks/results). About 8 minutes.
set -u
cd "$(dirname "$0")/.."
wheels=${GPU_WHEELS:-.gpu}
site=${GPU_SITE:-/tmp/adapterd-site}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi: CPU mode"
# Compiled on install (no --no-compile): every interpreter after it, the fork server's included, starts
# from bytecode instead of compiling the training stack again.
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl || exit 1
python3 -m zipfile -e "$wheels/bnb.zip" "$site"
export PYTHONPATH="$site:$(pwd)"
exec python3 -m benchmarks.gpu_bare "$@"
