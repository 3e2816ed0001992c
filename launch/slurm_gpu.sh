#!/usr/bin/env bash
# GPU cluster under SLURM: one process per node driving its 8 GPUs; jax.distributed joins the nodes
# (coordinator, process count and ids are read from SLURM's environment).
#
#   sbatch --nodes=4 launch/slurm_gpu.sh midtrain configs/mimesis_4b_midtrain.py /shared/runs/mimesis_4b_midtrain \
#       --set init.from_hf=/shared/ckpt/Qwen3.5-4B data.sources.0.path='/shared/data/midtrain/*.jsonl'
#   sbatch --nodes=1 launch/slurm_gpu.sh sft configs/mimesis_4b_sft.py /shared/runs/mimesis_4b_sft
#
# The mesh in the config must multiply to nodes x 8 (the paper's mid-training: 4 nodes = fsdp 16 x tensor 2;
# SFT: 1 node = fsdp 4 x tensor 2). WORKDIR must be on a filesystem every node sees: orbax writes each
# host's shards there and process 0 writes metrics.jsonl / TensorBoard.
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
  echo "usage: sbatch --nodes=N $0 midtrain|sft CONFIG WORKDIR [--set key=value ...]" >&2
  exit 2
fi
stage=$1 config=$2 workdir=$3
shift 3
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
# Let JAX own GPU memory, keep XLA's GPU autotuning, overlap collectives with compute.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true"
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$workdir/jax_cache}
srun --kill-on-bad-exit=1 "${PYTHON:-python}" -m mimesis_jax "$stage" --config "$config" --workdir "$workdir" \
  --distributed "$@"
