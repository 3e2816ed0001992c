#!/usr/bin/env bash
# Single host, one process over every local device (GPUs, TPU chips or the CPU).
#
#   launch/local.sh midtrain configs/tiny_midtrain.py runs/tiny_mid [--set train.steps=20 ...]
#   launch/local.sh sft configs/tiny_sft.py runs/tiny_sft --set init.from_workdir=runs/tiny_mid
#
# Rerunning the same command resumes from the workdir's latest checkpoint. SIGTERM (e.g. `kill PID`) makes
# the trainer finish its step, checkpoint and exit 0. Set JAX_COMPILATION_CACHE_DIR to reuse compiled steps
# across runs.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 midtrain|sft CONFIG WORKDIR [--set key=value ...]" >&2
  exit 2
fi
stage=$1 config=$2 workdir=$3
shift 3
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" -m mimesis_jax "$stage" --config "$config" --workdir "$workdir" "$@"
