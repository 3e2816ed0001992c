#!/usr/bin/env bash
# TPU pod slice (Cloud TPU VMs): the same command on every worker; jax.distributed auto-detects the slice.
#
#   TPU_NAME=my-v5p-64 ZONE=us-east5-a REPO=~/mimesis_jax \
#     launch/tpu_pod.sh midtrain configs/mimesis_midtrain.py:4b /mnt/shared/runs/mimesis_4b_midtrain \
#       --set mesh.fsdp=32 mesh.tensor=1 init.from_hf=/mnt/shared/ckpt/Qwen3.5-4B
#   TPU_NAME=my-v5p-16 ZONE=us-east5-a launch/tpu_pod.sh agentrl configs/qwen3_8b_agentrl.py:csd \
#       /mnt/shared/runs/agent_csd --set mesh.fsdp=8 users.simulator=/mnt/shared/export/mimesis_4b_simrl
#
# Every worker needs the repo at $REPO with its dependencies installed (jax[tpu] of the pinned jax version) and
# WORKDIR on a filesystem all workers share (Filestore / NFS, or a gcsfuse mount). Set the mesh to the slice's
# chip count with --set mesh.*. A maintenance event's SIGTERM checkpoints and exits 0 (orbax also honours
# JAX's preemption sync point); rerunning the same command resumes.
# RL stages (simrl, agentrl): each worker samples its share of every step's tasks (task i on worker i % workers)
# with a worker-local copy of the policy and its own frozen sides; mesh.data x mesh.fsdp must be a multiple of
# the worker count; resume with the same worker count.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: TPU_NAME=... ZONE=... [REPO=...] $0 midtrain|sft|simrl|agentrl CONFIG WORKDIR [--set key=value ...]" >&2
  exit 2
fi
case $1 in
  midtrain|sft|simrl|agentrl) ;;
  *) echo "$0: unknown stage '$1' (midtrain, sft, simrl or agentrl)" >&2; exit 2 ;;
esac
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
REPO=${REPO:-~/mimesis_jax}
stage=$1 config=$2 workdir=$3
shift 3
args=$(printf ' %q' "$@")
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all --command \
  "cd $REPO && JAX_COMPILATION_CACHE_DIR=$workdir/jax_cache ${PYTHON:-python3} -m mimesis_jax $stage \
   --config $config --workdir $workdir --distributed$args"
