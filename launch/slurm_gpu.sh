#!/usr/bin/env bash
# GPU cluster under SLURM: one process per node driving its 8 GPUs; jax.distributed joins the nodes
# (coordinator, process count and ids are read from SLURM's environment).
#
#   sbatch --nodes=4 launch/slurm_gpu.sh midtrain configs/mimesis_midtrain.py:4b /shared/runs/mimesis_4b_midtrain \
#       --set init.from_hf=/shared/ckpt/Qwen3.5-4B data.sources.0.path='/shared/data/midtrain/*.jsonl'
#   sbatch --nodes=1 launch/slurm_gpu.sh sft configs/mimesis_sft.py:4b /shared/runs/mimesis_4b_sft
#   sbatch --nodes=2 launch/slurm_gpu.sh simrl configs/mimesis_simrl.py:4b /shared/runs/mimesis_4b_simrl \
#       --set init.from_workdir=/shared/runs/mimesis_4b_sft mesh.fsdp=16
#   sbatch --nodes=2 launch/slurm_gpu.sh agentrl configs/qwen3_8b_agentrl.py:csd /shared/runs/agent_csd \
#       --set mesh.fsdp=16 users.simulator=/shared/export/mimesis_4b_simrl
#
# The mesh in the config must multiply to nodes x 8 (the paper's mid-training: 4 nodes = fsdp 16 x tensor 2;
# SFT: 1 node = fsdp 4 x tensor 2). WORKDIR must be on a filesystem every node sees: orbax writes each
# host's shards there and process 0 writes metrics.jsonl / TensorBoard.
# RL stages (simrl, agentrl): every node runs its share of each step's tasks (task i on node i % nodes; whole
# GRPO groups per node) with a node-local copy of the policy on its first GPU and its own frozen simulator /
# judge / coach (or the endpoints the config names), then the nodes train on the assembled global batch. The
# batch axes of the mesh (mesh.data x mesh.fsdp) must be a multiple of the node count; rl.credit=infopo is
# single-node only. A run resumes with the same node count it was started with.
# Five minutes before the time limit SLURM sends SIGTERM to the tasks: they checkpoint and exit 0;
# resubmitting the same command resumes (or let --requeue do it).
#SBATCH --job-name=mimesis
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --exclusive
#SBATCH --time=5-00:00:00
#SBATCH --signal=TERM@300
#SBATCH --requeue
#SBATCH --output=%x-%j.out
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: sbatch --nodes=N $0 midtrain|sft|simrl|agentrl CONFIG WORKDIR [--set key=value ...]" >&2
  exit 2
fi
stage=$1 config=$2 workdir=$3
shift 3
case $stage in
  midtrain|sft|simrl|agentrl) ;;
  *) echo "$0: unknown stage '$stage' (midtrain, sft, simrl or agentrl)" >&2; exit 2 ;;
esac
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
# Let JAX own GPU memory, keep XLA's GPU autotuning, overlap collectives with compute.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true"
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$workdir/jax_cache}
srun --kill-on-bad-exit=1 "${PYTHON:-python}" -m mimesis_jax "$stage" --config "$config" --workdir "$workdir" \
  --distributed "$@"
