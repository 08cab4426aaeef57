#!/usr/bin/env bash
# The GPU check (issue 14): one script, one table.
#
# On a host with one NVIDIA GPU it measures, through a local broker and the local Hub server:
#   - SFT LoRA tokens/s through the daemon against the same job as a plain TRL script,
#   - a QLoRA (bitsandbytes 4-bit) job through the daemon,
#   - GPU memory before a job, its peak, and after it (back to the baseline),
#   - a warm child: CUDA untouched until its job, and its start latency,
#   - GRPO with vLLM colocated, if vLLM is installed (skipped otherwise).
# Takes about 5-8 minutes on one GPU (under 10). Without CUDA it runs in CPU mode: the same
# daemon-against-plain and warm-child rows on the tiny model for a few steps, GPU rows marked
# "skipped (no CUDA)" (about 2-3 minutes on 2 cores).
#
# Nothing reaches the internet: the model is built here from a Qwen2 config (the shape of
# Qwen2.5-0.5B, random weights, bf16) and the tokenizer is trained locally; no downloads. The
# adapters go to the local Hub server (HF_ENDPOINT points the children there), so HF_HUB_OFFLINE
# is not set: it would refuse those uploads too.
#
# Prints the table and writes it to benchmarks/results/gpu_check-<host>.md. Exits 1 when a row
# failed. Arguments go to `python -m benchmarks.gpu_check` (--plan: only list the rows and which
# are skipped here; --cpu: CPU mode on a GPU host; --steps, --repeats, --grpo-steps).
set -euo pipefail

cd "$(dirname "$0")/.."
exec uv run --frozen python -m benchmarks.gpu_check "$@"
