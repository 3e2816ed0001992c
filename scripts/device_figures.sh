#!/usr/bin/env bash
# The accelerator figures, in one run on one accelerator (made for one H200, at most ~9 minutes):
#   1. MFU of the Stage II train step (GRPO, Eq 6) of the ~1B Qwen3 of configs/qwen3_1b_device.py in bf16
#      (target >= 45%): `python -m mimesis_jax profile --what grpo_step`;
#   2. the fused CSD step (Eq 11) on the same dialogues plus their coach notes, 8 agent turns: its median step
#      time over the GRPO step's (target <= 1.15x): `profile --what csd_step --set rl.alpha=0.01`;
#   3. the rollout engine's decode tokens/s at batch 64, against `sampler.generate` in the same process:
#      benchmarks/bench_engine_decode.py;
#   4. memory against the plan: a rehearsal (`python -m mimesis_jax rehearse`, commands/rehearse.py) of the paper
#      Stage II CSD config (configs/qwen3_8b_agentrl.py:csd) at hidden REH_WIDTH (2048) with REH_REPEATS (16)
#      layers on this one device (its mesh set to 1 x 1 x 1), in the config's bf16, with the static sampler
#      (rollout.engine=false rollout.max_batch=256): one real RL step, then every program it compiled (the update
#      on its ladder rungs, the sampler's buckets) with the backend's own compiled bytes next to the plan's, and
#      their ratio;
#   5. the static sampler's steady-state decode against a plain jitted decode loop (benchmarks/bench_sampler.py:
#      sampler / reference, goal <= 1.1) at the ~1B agent's width and the real Qwen3 vocabulary.
#
#   scripts/device_figures.sh                     # on the accelerator; writes $OUT (else ./device_out)
#   TINY=1 scripts/device_figures.sh              # the same five steps at tiny sizes on a CPU (about 3 minutes;
#                                                 # tests/test_device_script.py runs it)
#
# Synthetic data and random weights throughout: nothing is downloaded and nothing is installed. It runs from the
# working tree (PYTHONPATH=repo root) with the interpreter $PYTHON (default python3), which needs what
# `pip install -e .` brings; the lent H200's image lacks a few of those (grain, fastapi and their needs), carried
# there as wheels (docs/scale-out.md, "The accelerator figures").
#
# Each step has its own time limit (seconds: GRPO_TIMEOUT, CSD_TIMEOUT, ENGINE_TIMEOUT, MEMORY_TIMEOUT,
# SAMPLER_TIMEOUT; 90 + 100 + 210 + 90 + 50 = 540 s on the device) and a step that fails or runs out of time is
# reported as such: the others still run. Knobs: STEPS (profiled steps after the warm-up, 3), ATTN
# (model.attention_impl: blockwise; pallas = the Triton kernels), SET_EXTRA (more `--set key=value` overrides for
# both profile runs, e.g. "train.remat=full"), REH_WIDTH / REH_REPEATS / REH_TOKENS (the rehearsal's hidden size,
# layer-pattern repeats and token-budget divisor), KEEP_TRACES=1 (also keep the profiler traces and HLO under
# $OUT/traces: large), ONLY (the steps to run, default "grpo csd engine memory sampler": a rerun of some).
#
# Written to $OUT (at most 8 files, so that all of them come back from a lent machine): device_figures.log (every
# step's output), grpo_summary.json, csd_summary.json (commands/profile.py's summary.json: step times, tokens/s,
# model FLOPs, MFU, memory), engine.json (bench_engine_decode.py's numbers), rehearse.json (the rehearsal's
# report), sampler.txt (bench_sampler.py's output) and figures.txt (the summary printed at the end).
set -uo pipefail
cd "$(dirname "$0")/.."
{  # the whole script is one compound command: bash reads it all before running, so editing it meanwhile is safe

OUT=${OUT:-./device_out}
PY=${PYTHON:-python3}
STEPS=${STEPS:-3}
ATTN=${ATTN:-blockwise}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/device_figures.XXXXXX")
LOG=$OUT/device_figures.log
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
CONFIG=configs/qwen3_1b_device.py

if [[ ${TINY:-0} == 1 ]]; then
  export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
  GRPO_TIMEOUT=${GRPO_TIMEOUT:-300} CSD_TIMEOUT=${CSD_TIMEOUT:-300} ENGINE_TIMEOUT=${ENGINE_TIMEOUT:-240}
  # the device config's shapes shrunk (16 layers kept: the layer stack is scanned, so depth costs little here);
  # KV heads before query heads: each override is checked as it is applied
  SIZE="model.num_key_value_heads=2 model.num_attention_heads=4 model.hidden_size=64 model.intermediate_size=128
        model.head_dim=16 model.vocab_size=1024 model.attention_block_q=64 model.attention_block_k=64
        rollout.row_len=256 rollout.max_context_tokens=256 rollout.prompts_per_step=2 rollout.mini_batch_prompts=2
        rollout.group_size=4 rollout.agent_max_tokens=64"
  TOKENS="--prompt-tokens 40 --user-tokens 10 --note-tokens 6 --reply-tokens 12"
  ENGINE_ARGS="--tiny --repeats 1"
  MEMORY_TIMEOUT=${MEMORY_TIMEOUT:-300} SAMPLER_TIMEOUT=${SAMPLER_TIMEOUT:-240}
  # the rehearsal's token budgets / 64: a 200-token row and context (the toy prompts' 72 + 8,192 / 64), as
  # tests/test_rehearse.py's CPU rehearsals; its update and sampler programs are measured as at / 32, on fewer tokens
  REH_WIDTH=${REH_WIDTH:-64} REH_REPEATS=${REH_REPEATS:-2} REH_TOKENS=${REH_TOKENS:-64}
  SAMPLER_ARGS="--layers 2 --hidden 64 --vocab 4096 --batch 8 --prompt-len 16 --new-tokens 16 --rounds 2"
else
  # sized from the step times of the H200 run in docs/benchmarks.md
  GRPO_TIMEOUT=${GRPO_TIMEOUT:-90} CSD_TIMEOUT=${CSD_TIMEOUT:-100} ENGINE_TIMEOUT=${ENGINE_TIMEOUT:-210}
  MEMORY_TIMEOUT=${MEMORY_TIMEOUT:-90} SAMPLER_TIMEOUT=${SAMPLER_TIMEOUT:-50}
  REH_WIDTH=${REH_WIDTH:-2048} REH_REPEATS=${REH_REPEATS:-16} REH_TOKENS=${REH_TOKENS:-16}
  # the ~1B agent's width at the real vocabulary: the LM head and the sampling over V weigh as at scale
  SAMPLER_ARGS="--layers 4 --hidden 2048 --batch 64 --prompt-len 256 --new-tokens 128 --rounds 3"
  # one H200: let XLA take most of the 139 GiB (the plan's peak for the CSD step is 77 GiB)
  export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
  SIZE=""
  # bench_csd.py's realistic dialogue mix at its means: 3,764 trunk tokens in a 4,096-token row at 8 turns
  TOKENS="--prompt-tokens 700 --user-tokens 160 --note-tokens 50 --reply-tokens 220"
  ENGINE_ARGS="--repeats 2"
fi
SETS="$SIZE model.attention_impl=$ATTN ${SET_EXTRA:-}"
# time the steps without the profiler's trace (its device tracing slows the kernels it times) where the profile
# command offers that; KEEP_TRACES=1 keeps it
NOTRACE=""
if [[ ${KEEP_TRACES:-0} != 1 ]] && grep -q -- '"--no-trace"' mimesis_jax/commands/profile.py; then NOTRACE="--no-trace"; fi

say() { echo "[device_figures $(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }
: >"$LOG"
say "TINY=${TINY:-0} OUT=$OUT python=$PY steps=$STEPS attention=$ATTN overrides: $(echo $SETS)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  2>&1 | tee -a "$LOG"
"$PY" -c "import sys, jax, flax; print('python', sys.version.split()[0], 'jax', jax.__version__, 'flax', \
flax.__version__, 'devices', jax.devices())" 2>&1 | tee -a "$LOG"
START=$SECONDS

# run NAME TIMEOUT CMD...: runs one step under its limit, its output into the log; records its exit status
declare -A RC
ONLY=${ONLY:-grpo csd engine memory sampler}
run() {
  local name=$1 limit=$2
  shift 2
  if [[ " $ONLY " != *" $name "* ]]; then
    RC[$name]=skipped
    say "$name: skipped (ONLY=$ONLY)"
    return
  fi
  say "$name: start (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  RC[$name]=${PIPESTATUS[0]}
  local why=""
  [[ ${RC[$name]} == 124 || ${RC[$name]} == 137 ]] && why=" (timed out)"
  say "$name: exit ${RC[$name]} after $((SECONDS - t0))s$why"
}

profile() {  # profile NAME WHAT TIMEOUT [extra --set ...]
  local name=$1 what=$2 limit=$3
  shift 3
  # shellcheck disable=SC2086  # SETS and TOKENS are word lists
  run "$name" "$limit" "$PY" -m mimesis_jax profile --config "$CONFIG" --what "$what" --steps "$STEPS" \
    --out "$WORK/$name" $NOTRACE $TOKENS --set $SETS "$@"
  if [[ -f $WORK/$name/summary.json ]]; then
    cp "$WORK/$name/summary.json" "$OUT/${name}_summary.json"
    if [[ ${KEEP_TRACES:-0} == 1 ]]; then
      mkdir -p "$OUT/traces"
      tar -czf "$OUT/traces/$name.tgz" -C "$WORK" "$name"
    fi
  fi
}

profile grpo grpo_step "$GRPO_TIMEOUT"
profile csd csd_step "$CSD_TIMEOUT" rl.alpha=0.01
# shellcheck disable=SC2086
run engine "$ENGINE_TIMEOUT" "$PY" benchmarks/bench_engine_decode.py $ENGINE_ARGS --batch 64 --json "$OUT/engine.json"
# the paper Stage II CSD config's structure on this one device (its mesh set to 1 x 1 x 1), in the config's bf16,
# with its static sampler (the config's default is the engine, whose programs a rehearsal counts, not measures)
run memory "$MEMORY_TIMEOUT" "$PY" -m mimesis_jax rehearse --config configs/qwen3_8b_agentrl.py:csd \
  --width "$REH_WIDTH" --repeats "$REH_REPEATS" --tokens "$REH_TOKENS" --json "$OUT/rehearse.json" \
  --set mesh.data=1 mesh.fsdp=1 mesh.tensor=1 rollout.engine=false rollout.max_batch=256
# shellcheck disable=SC2086
run sampler "$SAMPLER_TIMEOUT" "$PY" benchmarks/bench_sampler.py $SAMPLER_ARGS --reference-argmax first --count-compiles
sed -n '/^\[device_figures .*sampler: start/,/^\[device_figures .*sampler: exit/p' "$LOG" >"$OUT/sampler.txt"
rm -rf "$WORK"

say "all steps done in $((SECONDS - START))s; summary:"
"$PY" - "$OUT" "${RC[grpo]}" "${RC[csd]}" "${RC[engine]}" "${RC[memory]}" "${RC[sampler]}" <<'EOF' 2>&1 \
  | tee "$OUT/figures.txt"
import json, os, sys

out, rcs = sys.argv[1], dict(zip(("grpo", "csd", "engine", "memory", "sampler"), sys.argv[2:7]))


def load(name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


grpo, csd, eng = load("grpo_summary.json"), load("csd_summary.json"), load("engine.json")
reh = load("rehearse.json")


def fail(name):
    rc = rcs[name]
    if rc == "skipped":
        return f"n/a ({name} step skipped: ONLY)"
    return f"n/a ({name} step {'timed out' if rc in ('124', '137') else 'exited ' + rc}; see device_figures.log)"


def mfu(s):
    return "n/a (no peak FLOP/s for this device kind)" if s["mfu"] is None else f"{s['mfu']:.1%}"


def temp(s):
    t = s["memory_bytes"]["temp"]
    return "n/a" if t is None else f"{t / 2 ** 30:.1f} GiB"


for name, s in (("grpo", grpo), ("csd", csd)):
    if s:
        b = s["batch"]
        t = s["step_time_s"]["median"]
        print(f"{name}_step: {s['backend']} ({s['device_kind']}), median step {t * 1e3:.1f} ms of {s['steps']}, "
              f"{s['tokens_per_s']:.0f} {s['token_kind']}/s, MFU {mfu(s)}; {b['dialogues']} "
              f"dialogues x {b['turns']} turns in {b['rows']} rows of {b['row_len']}, teacher tokens "
              f"{b['teacher_tokens']}; compiled temp memory {temp(s)}")
print("MFU of the GRPO train step (bf16; target >= 45%):", mfu(grpo) if grpo else fail("grpo"))
if grpo and csd:
    r = csd["step_time_s"]["median"] / grpo["step_time_s"]["median"]
    f = csd["model_flops_per_step"] / grpo["model_flops_per_step"]
    print(f"CSD step / GRPO step at {csd['batch']['turns']} turns (median step times; target <= 1.15x): {r:.3f}x "
          f"(model FLOPs ratio {f:.3f}x: the time ratio at equal efficiency)")
else:
    print("CSD step / GRPO step (target <= 1.15x):", fail("grpo" if not grpo else "csd"))
if eng:
    print(f"engine decode at batch {eng['batch']}: {eng['engine_tok_s']:.0f} tok/s (sampler.generate "
          f"{eng['sampler_tok_s']:.0f} tok/s, ratio {eng['ratio']:.2f}x; decode only "
          f"{eng['engine_decode_only_tok_s']:.0f} tok/s; slot use {eng['slot_use']:.0%}; identical samples "
          f"{eng['identical_samples']}/{eng['batch']})")
else:
    print("engine decode at batch 64:", fail("engine"))
if reh:
    for rep in reh["reports"]:
        m = rep["model"]
        print(f"memory against plan ({rep['dtype']}, {rep['num_devices']} device): {reh['config']} rehearsed at "
              f"{m['layers']} layers, hidden {m['hidden']}, row_len {rep['row_len']}; plan/compiled per program "
              f"(tolerance {rep['tolerance']:.0%}):")
        for p in rep["programs"]:
            shape = " ".join(f"{k}={v}" for k, v in p["shape"].items() if v)
            print(f"  {p['program']:9s} {shape:52s} compiled {p['compiled_bytes'] / 2 ** 30:7.3f} GiB, plan "
                  f"{p['plan_bytes'] / 2 ** 30:7.3f} GiB, ratio {p['plan_bytes'] / p['compiled_bytes']:.3f} "
                  f"{'ok' if p['ok'] else 'OFF'}")
else:
    print("memory against plan:", fail("memory"))
ratio = None
if os.path.exists(os.path.join(out, "sampler.txt")):
    with open(os.path.join(out, "sampler.txt")) as f:
        ratio = next((line.strip() for line in f if line.startswith("ratio sampler / reference:")), None)
print("sampler against the plain decode loop (goal <= 1.1):", ratio if ratio else fail("sampler"))
EOF
status=0
for k in grpo csd engine memory sampler; do [[ ${RC[$k]} == 0 || ${RC[$k]} == skipped ]] || status=1; done
exit $status
}
