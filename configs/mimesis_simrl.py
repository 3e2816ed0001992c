"""MIMESIS joint multi-domain RL (paper §3.3, Eq 4, Table 7), starting from the ThoughtTrace-SFT simulator of the
same size; variants 4b (default) and 9b, the backbone size (same recipe, same mesh, same memory settings).

    python -m mimesis_jax simrl --config configs/mimesis_simrl.py:4b --workdir runs/mimesis_4b_simrl \
        --set sides.judge=https://judge.example/v1 sides.judge_model=<name> sides.key_env=JUDGE_API_KEY
    python -m mimesis_jax simrl --config configs/mimesis_simrl.py:9b --workdir runs/mimesis_9b_simrl \
        --set sides.judge=https://judge.example/v1 sides.judge_model=<name> sides.key_env=JUDGE_API_KEY \
              domains.sources='(("abcd_behaviour","data/abcd/abcd_v1.1.json.gz"),
                                ("hitom","data/soul/hitom_rl_train.parquet"))'

Table 7 (given): 500 steps, 64 prompts x 8 rollouts = 512 rollouts per step, LR 8e-6, 16x A100, reasoning enabled,
no KL reward. FoldGRPO over the 24 domains (23 SOUL tasks + ABCD behaviour).

Chosen here (the paper is silent):
* p(d) uniform over the 24 domains (domains.weights = () ); behaviour task: neutral share 1/3, 8 customer turns.
* mini-batches of 16 prompts (4 updates per step), clip 0.2, token-mean, no KL, no CSD; old log-probs from the
  sampler; AdamW b1 0.9 b2 0.95, no decay, clip-norm 1.0, constant LR.
* 2,048 new tokens per simulator turn (thought + utterance), contexts up to 16,384 tokens (row_len); LM-head
  counts per row at 0.2, 0.3 and 1 of the row (`rollout.head_rungs`): a row packs many policy-turn segments
  whose agent tokens are a small part of it, so a head of the whole row would be mostly padding.
* mesh: 16 devices = data 2 x fsdp 4 x tensor 2; bf16 compute, fp32 master weights, full remat, blockwise
  attention at these lengths.
* memory on A100-80GB (`python -m mimesis_jax plan`, 76 GiB usable): the smallest settings that fit. 4 gradient
  micro-batches per update (`rl.num_microbatches`; 128 rows of 16,384 tokens = 4 rows per device per micro-batch):
  the update's peak is 70.0 GiB for 9B (204 GiB with 1, 115 with 2) and 46.4 GiB for 4B (148 / 80 with 1 / 2).
* the rollout engine samples the policy (`rollout.engine`, `rollout.max_batch` = 0: the engine's slots bound its
  batch): it samples 2.7-3.2x the static sampler's tokens per device-second (1.7-2.2x a plain jitted decode
  loop's) on 16-turn dialogues in groups of 8 (benchmarks/bench_rollout.py, docs/benchmarks.md), so it is the
  setting here. It decodes in its replica layout (the `rollout.mesh` default, data=8, fsdp=1, tensor=2: one
  data-parallel replica per tensor pair, each owning its 64 rollouts' pages and state slots, heads split over
  tensor=2, with its own copy of the weights synced after every update), its pool capped at
  `rollout.engine_memory_gib` = 16 GiB per device (uncapped: 512 rollouts x 16,384 tokens + their state slots,
  306 GiB for 9B); `plan`: rollout peak 48.3 GiB for 9B (its weight copy 9.3 GiB) and 33.7 for 4B (4.5 GiB; the
  same per device on 2 processes x 8), so the update's peak above decides: 9B is TIGHT, 4B FITS. Each replica
  holds 145 state slots (a state and a snapshot per rollout: a MirrorBench turn resumes from the snapshot,
  inference/page_pool.py) and 821k tokens, 12,822 per rollout in flight (a step whose rollouts outgrow that
  evicts, counted in engine/evictions);
* the static sampler instead: `--set rollout.engine=false rollout.max_batch=256`, at most 256 rollouts per
  sampler call (512 per step as 2 calls, the same samples): the rollout phase's peak is 75.8 GiB for 9B and 64.1
  for 4B (136 / 120 GiB with all 512 at once). On 2 processes x 8 each holds its own parameter copy too: 9B then
  needs `rollout.max_batch=128` (`plan --processes 2`: 80.0 GiB with 256, 49.9 with 128).
* fixed sides: any OpenAI-compatible endpoint for the judge; the ABCD support agent and the SOUL interlocutors
  default to the same endpoint (sides.support_agent / sides.partner to change).
Ablations (Appendix C): --set init.from_workdir=... (mid-trained / SFT) vs init.from_hf=<pretrained Qwen3.5 dir>;
rollout.thinking=false; domains.behaviour=false; domains.weights=...; rollout.fold=false (naive statistics).
"""

from mimesis_jax.config import (CheckpointConfig, DomainMixConfig, InitConfig, MeshConfig, OptimizerConfig, RLConfig,
                                SidesConfig, SimRLConfig, SimRolloutConfig, TokenizerConfig, TrainConfig, qwen3_5_model)

VARIANTS = ("4b", "9b")


def get_config(size: str = "4b") -> SimRLConfig:
    return SimRLConfig(
        name=f"mimesis_{size}_simrl",
        model=qwen3_5_model(size).replace(attention_impl="blockwise"),
        tokenizer=TokenizerConfig(name="qwen3_5"),
        init=InitConfig(from_workdir=f"runs/mimesis_{size}_sft"),
        sides=SidesConfig(judge="http://localhost:8001/v1", judge_model="judge", support_agent="", partner="",
                          key_env="JUDGE_API_KEY", max_tokens=1024),
        domains=DomainMixConfig(weights=(), behaviour=True, neutral_share=1.0 / 3.0, max_user_turns=8),
        rl=RLConfig(alpha=0.0, kl_coef=0.0, eps_low=0.2, eps_high=0.2, loss_agg="token-mean", num_microbatches=4),
        rollout=SimRolloutConfig(prompts_per_step=64, group_size=8, mini_batch_prompts=16, max_tokens=2048,
                                 max_context_tokens=16_384, row_len=16_384, head_rungs=(0.2, 0.3, 1),
                                 temperature=1.0, thinking=True,
                                 fold=True, env_workers=64, max_batch=0, engine=True,
                                 engine_memory_gib=16.0),
        optimizer=OptimizerConfig(lr=8e-6, schedule="constant", warmup_steps=0, weight_decay=0.0, b1=0.9, b2=0.95,
                                  clip_norm=1.0),
        train=TrainConfig(steps=500, seed=0, remat="full", dtype="bfloat16", nonfinite="stop", log_every=1),
        mesh=MeshConfig(data=2, fsdp=4, tensor=2),
        checkpoint=CheckpointConfig(every=10, keep=3, async_save=True),
    )

