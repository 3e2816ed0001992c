"""Stage II at paper scale (paper §4, Table 13): the Qwen3-8B agent trained against the frozen MIMESIS-9B simulator
on UserRL's training mixture. Variants:
* grpo (default): GRPO only (§4.1) -- the UserRL+ baseline of Table 2;
* csd: GRPO + coached on-policy self-distillation (§4.2) -- alpha 0.01, beta 5.0 -- with the frozen simulator as
  the coach (the documented coach prompt, algorithms/csd.py) and the fused teacher/student pass: the "CSD" row of
  Table 2.

    python -m mimesis_jax agentrl --config configs/qwen3_8b_agentrl.py:grpo --workdir runs/agent_grpo \\
        --set init.from_hf=/models/Qwen3-8B users.simulator=http://sim-host:8000/v1 users.simulator_model=mimesis-9b \\
        --set gyms.sources='("/data/userrl/alltrain_multiturn/train.parquet",)'

Table 13: 100 steps, group size 8, 16 turns per dialogue, LR 1e-6, gamma 0.8, temperature 1.0 in training and 0
in validation, bf16, 16x A100-80GB, max prompt 1,152 tokens, max response 8,192 tokens. UserRL's settings the
paper inherits: 128 prompts per step, mini-batch 16 (8 updates per step), clip 0.2, no KL, no entropy bonus,
token-mean loss.
Choices where the paper is silent (this project's):
* mesh 16 = fsdp 8 x tensor 2 (tensor parallelism inside a node's NVLink); blockwise (flash) attention and full
  per-layer remat: a packed 9,344-token row of an 8B model does not fit dense scores;
* the response budget is the dialogue's context: `rollout.max_context_tokens` = 1,152 + 8,192 = 9,344 (verl's
  multi-turn response length counts every turn after the prompt, tool results included) and each agent turn
  may use up to 2,048 of it; rows of 9,344 tokens (one dialogue never spans rows), LM-head counts per row at 0.55
  and 1 of the row (`rollout.head_rungs`; per row of a head group: the rows of one device in one micro-batch) and
  the CSD teacher's at 0.5, 0.7 and 1 of those (`rollout.branch_head_rungs`): on plan's synthetic mix 1.28x the
  agent tokens, and for csd the teacher's 1.42x the coached tokens (2.6x when it was min(branch, head));
* 4 gradient micro-batches per update (`rl.num_microbatches`), a constant LR after 3 warmup updates, grad clipping
  at 1.0, AdamW without weight decay;
* the rollout engine samples the policy (`rollout.engine`, `rollout.max_batch` = 0: the engine's slots bound its
  batch): it samples 2.7-3.2x the static sampler's tokens per device-second (1.7-2.2x a plain jitted decode
  loop's) on 16-turn dialogues in groups of 8 (benchmarks/bench_rollout.py, docs/benchmarks.md), so it is the
  setting here. It decodes in its replica layout (the `rollout.mesh` default, data=8, fsdp=1, tensor=2 over the 16
  devices: one data-parallel replica per tensor pair, each owning its 128 dialogues' pages, heads split over
  tensor=2, with its own copy of the weights synced after every update), its pool capped at
  `rollout.engine_memory_gib` = 16 GiB per device (the uncapped rule, 1,024 dialogues x 9,344 tokens, asks
  1,314 GiB); `python -m mimesis_jax plan` counts the engine's weight copy (8.2 GiB, matrices in bf16), 16 GiB of
  pool per device and a decode burst (its page copy and the layers' weight slices, 16.8 GiB), next to the
  training state: rollout peak 46.7 of 76 usable GiB on an A100-80GB, FITS (the same per device on 2 processes x
  8: `plan --processes 2`). The replicas hold 1.86M tokens, 1,820 per dialogue in flight (a step whose dialogues
  outgrow that evicts, counted in engine/evictions). The update's peak with 4 micro-batches is 31.3 GiB (88.0
  GiB with one);
* the static sampler instead: `--set rollout.engine=false rollout.max_batch=256`, at most 256 dialogues per
  sampler call (1,024 per step run as 4 calls with the same samples): the largest power of two whose rollout
  phase fits an A100-80GB on this mesh (`plan`: KV cache 20.5 GiB + prefill 11.1 GiB, peak 49.4 of 76 usable
  GiB; all 1,024 at once need 175 GiB); on 2 processes x 8 each calls with 128 (`plan --processes 2`: 53.2 GiB,
  its own parameter copy included);
* the simulator is served (e.g. `serve --generation-role user` on the exported MIMESIS-9B, or vLLM) and also
  plays the gyms' judge and classifier; validation every 10 steps on the shipped evaluation tasks.
The csd variant differs in rl.alpha (0.01) only:

    python -m mimesis_jax agentrl --config configs/qwen3_8b_agentrl.py:csd --workdir runs/agent_csd \\
        --set init.from_hf=/models/Qwen3-8B users.simulator=http://sim-host:8000/v1
"""

from mimesis_jax.config import (MAX_PROMPT_TOKENS, USERRL_TRAIN_ROWS, AgentRLConfig, CheckpointConfig, MeshConfig,
                                MixtureConfig, OptimizerConfig, RLConfig, RolloutConfig, TokenizerConfig, TrainConfig,
                                UserSideConfig, ValidationConfig, qwen3_model)

PROMPT, RESPONSE = MAX_PROMPT_TOKENS, 8192
VARIANTS = ("grpo", "csd")
ENGINE_GIB = 16.0  # the rollout engine's pool per device (see the docstring)
ALPHA = {"grpo": 0.0, "csd": 0.01}  # Eq 11's CSD weight: the only difference between the variants


def get_config(variant: str = "grpo") -> AgentRLConfig:
    return AgentRLConfig(
        name=f"qwen3_8b_agentrl_{variant}",
        model=qwen3_model("8b").replace(attention_impl="blockwise"),
        tokenizer=TokenizerConfig(name="qwen3"),
        users=UserSideConfig(simulator="http://127.0.0.1:8000/v1", simulator_model="mimesis-9b",
                             simulator_style="simulator", simulator_thinking=True, simulator_max_tokens=1024),
        gyms=MixtureConfig(sources=("shipped:train",), weights=tuple(USERRL_TRAIN_ROWS.items()),
                           max_prompt_tokens=PROMPT, max_turns=16),
        rl=RLConfig(alpha=ALPHA[variant], beta=5.0, gamma=0.8, eps_low=0.2, eps_high=0.2, loss_agg="token-mean",
                    credit="equalized", score="sum", old_logprobs="recompute", num_microbatches=4),
        rollout=RolloutConfig(prompts_per_step=128, group_size=8, mini_batch_prompts=16, max_turns=16,
                              agent_max_tokens=2048, max_context_tokens=PROMPT + RESPONSE,
                              row_len=PROMPT + RESPONSE, head_rungs=(0.55, 1), branch_head_rungs=(0.5, 0.7),
                              temperature=1.0, env_workers=64, max_batch=0, engine=True,
                              engine_memory_gib=ENGINE_GIB),
        optimizer=OptimizerConfig(lr=1e-6, schedule="constant", warmup_steps=3, weight_decay=0.0, clip_norm=1.0),
        train=TrainConfig(steps=100, seed=0, remat="full", dtype="bfloat16", log_every=1),
        mesh=MeshConfig(data=1, fsdp=8, tensor=2),
        checkpoint=CheckpointConfig(every=10, keep=3),
        validation=ValidationConfig(every=10, sources=("shipped:test",), temperature=0.0),
    )
