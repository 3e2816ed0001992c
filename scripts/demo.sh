#!/usr/bin/env bash
# The main job on a laptop CPU: tiny user-side mid-training of a tiny Qwen3.5 simulator on the shipped sample
# dialogues, then ThoughtTrace SFT from that checkpoint, then an HF export read back with load_hf.
#
#   scripts/demo.sh [--workdir runs/demo]
#
# Prints progress and per-stage losses; everything lands under the workdir (default runs/demo-<time>):
# midtrain/ and sft/ (checkpoints, metrics.jsonl, tensorboard/) and hf/ (config.json + model.safetensors).
set -euo pipefail
cd "$(dirname "$0")/.."
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
exec "${PYTHON:-python}" -m mimesis_jax demo "$@"
