#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py), in one command from the project's root, on the machine a GPU
# check is lent: Python 3.12 with its own torch, no JVM, no network, no uv. The wheels it lacks are
# built beforehand on a machine with network and carried with the tree:
#   python3 -m benchmarks.gpu_wheels .gpu             # here (stdlib and pip only): the wheels, under 64 MiB
#   bash benchmarks/gpu_check.sh [gpu_check options]  # there: install them, run the check
# Installs the wheels into a folder of its own (PYTHONPATH before the machine's packages), then runs
# `python -m benchmarks.gpu_check`, whose table lands in $OUT (or benchmarks/results). `--plan` lists
# the rows and which this host runs; `--only packing,lora_7b` runs some of them; `--budget-s` (480)
# starts no row past it. Where uv and the project's environment are, skip the wheels:
# `uv run --frozen python -m benchmarks.gpu_check`.
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
exec python3 -m benchmarks.gpu_check "$@"
