#!/usr/bin/env bash
# Single host, one process over every local device (GPUs, TPU chips or the CPU).
#
#   launch/local.sh midtrain configs/tiny_midtrain.py runs/tiny_mid [--set train.steps=20 ...]
#   launch/local.sh sft configs/tiny_sft.py runs/tiny_sft --set init.from_workdir=runs/tiny_mid
#   launch/local.sh simrl configs/tiny_simrl.py runs/tiny_simrl --set init.from_workdir=runs/tiny_sft
#   launch/local.sh agentrl configs/tiny_agentrl.py:csd runs/tiny_agent
#   launch/local.sh rehearse configs/qwen3_8b_agentrl.py:csd runs/rehearse [--tokens 32 ...]   (commands/rehearse.py)
#
# Rerunning the same command resumes from the workdir's latest checkpoint. SIGTERM (e.g. `kill PID`) makes
# the trainer finish its step, checkpoint and exit 0. Set JAX_COMPILATION_CACHE_DIR to reuse compiled steps
# across runs.
#
# NUM_PROCESSES=N (default 1) rehearses a multi-host run on this machine: N processes joined by jax.distributed
# (coordinator 127.0.0.1:$PORT, default 12355), each with its own devices -- on a CPU give each some with
#   NUM_PROCESSES=2 XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu \
#     launch/local.sh agentrl configs/tiny_agentrl.py:csd runs/agent_2proc
# Every stage runs this way (the RL stages split each step's tasks over the processes; `rehearse` runs the paper
# config's mesh over all processes' devices, e.g. 2 x 8 for the 16-device RL configs:
#   NUM_PROCESSES=2 XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
#     launch/local.sh rehearse configs/qwen3_8b_agentrl.py:csd runs/rehearse_2proc
# ). Only process 0 prints and writes metrics; the script waits for all and fails if any fails.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 midtrain|sft|simrl|agentrl|rehearse CONFIG WORKDIR [--set key=value ...]" >&2
  exit 2
fi
stage=$1 config=$2 workdir=$3
shift 3
case $stage in
  midtrain|sft|simrl|agentrl|rehearse) ;;
  *) echo "$0: unknown stage '$stage' (midtrain, sft, simrl, agentrl or rehearse)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
nproc=${NUM_PROCESSES:-1}
if [ "$nproc" -le 1 ]; then
  exec "${PYTHON:-python}" -m mimesis_jax "$stage" --config "$config" --workdir "$workdir" "$@"
fi
pids=()
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' TERM INT
for ((i = 0; i < nproc; i++)); do
  "${PYTHON:-python}" -m mimesis_jax "$stage" --config "$config" --workdir "$workdir" --distributed \
    --coordinator "127.0.0.1:${PORT:-12355}" --num-processes "$nproc" --process-id "$i" "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=$?
done
exit $status
