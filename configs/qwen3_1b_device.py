"""A ~1B Qwen3 agent for the one-accelerator figures of issue #16 item 7 (scripts/device_figures.sh): MFU of the
Stage II train step in bf16, the fused CSD step's time over the GRPO step at 8 agent turns, and the rollout
engine's decode tokens/s at batch 64 (benchmarks/bench_engine_decode.py). Random weights and synthetic dialogues:
the device machine reaches nothing outside, and these figures depend on shapes, not on weights.

    python -m mimesis_jax profile --config configs/qwen3_1b_device.py --what grpo_step --steps 3 --out prof/grpo \\
        --prompt-tokens 700 --user-tokens 160 --note-tokens 50 --reply-tokens 220
    python -m mimesis_jax profile --config configs/qwen3_1b_device.py --what csd_step --steps 3 --out prof/csd \\
        --set rl.alpha=0.01 --prompt-tokens 700 --user-tokens 160 --note-tokens 50 --reply-tokens 220
    python -m mimesis_jax plan --config configs/qwen3_1b_device.py --device h200

The model is Qwen3-1.7B's layer (hidden 2048, MLP 6144, 16 query / 8 KV heads of 128, q/k RMSNorm, tied
embeddings, vocab 151,936) at 16 layers instead of 28: 0.81B parameters in the layers + 0.31B in the tied
embedding = 1.12B. Why this shape: the same head_dim, GQA ratio and vocabulary as the paper's Qwen3-8B agent
(configs/qwen3_8b_agentrl.py), so the kernels and the chunked LM head are those of the real run, at a size
whose step compiles and runs in seconds on one chip.

The batch (what `profile --what grpo_step|csd_step` builds): one PPO mini-batch of 4 tasks x 8 dialogues = 32
dialogues of 8 agent turns, each in its own 4,096-token row. With the token counts above (bench_csd.py's
realistic mix at its means: a 700-token system prompt + task, per turn a 160-token user message, a 3-token header
and a 220-token reply, a 50-token coach note before every turn but the last) a dialogue is 3,764 trunk tokens,
1,760 of them agent tokens (LM-head positions): 120K trunk tokens per step; CSD adds 7 x 273 branch tokens per
dialogue (forward only). Memory on one H200 (`plan --device h200`): fp32 master weights 4.2 GiB + AdamW moments
8.3 GiB + two fp32 gradient buffers (accumulator + micro-batch) 8.3 GiB resident; bf16 compute, blockwise (flash)
attention, 2 gradient micro-batches of 16 rows; per-layer remat "dots" keeps the matmul outputs (44 GiB for 16
layers): the backward recomputes no big matmul, so model FLOPs and executed FLOPs stay close, which is what an MFU
figure should compare. Peak 77 GiB of the 125 GiB usable (the same with CSD branches, planned at 256-token
notes); "full" remat would need 40 GiB, no remat 172 GiB (does not fit).
"""

from mimesis_jax.config import (AgentRLConfig, CheckpointConfig, MeshConfig, MixtureConfig, OptimizerConfig, RLConfig,
                                RolloutConfig, TokenizerConfig, TrainConfig, UserSideConfig)
from mimesis_jax.models.config import ModelConfig

ROW_LEN, TURNS = 4096, 8


def qwen3_1b() -> ModelConfig:
    return ModelConfig(model_type="qwen3", vocab_size=151_936, hidden_size=2048, intermediate_size=6144,
                       num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=True,
                       max_position_embeddings=40_960, eos_token_id=151_645, bos_token_id=None, pad_token_id=None,
                       attention_impl="blockwise", attention_block_q=512, attention_block_k=512)


def get_config() -> AgentRLConfig:
    return AgentRLConfig(
        name="qwen3_1b_device",
        model=qwen3_1b(),
        tokenizer=TokenizerConfig(name="qwen3"),
        users=UserSideConfig(simulator="toy-user", coach="toy-coach", simulator_thinking=True),
        gyms=MixtureConfig(sources=("toy:16",), weights=(), max_prompt_tokens=0, max_turns=TURNS),
        rl=RLConfig(alpha=0.0, beta=5.0, gamma=0.8, eps_low=0.2, eps_high=0.2, loss_agg="token-mean",
                    credit="equalized", score="sum", num_microbatches=2),
        rollout=RolloutConfig(prompts_per_step=4, group_size=8, mini_batch_prompts=4, max_turns=TURNS,
                              agent_max_tokens=512, max_context_tokens=ROW_LEN, row_len=ROW_LEN, temperature=1.0,
                              env_workers=1),
        optimizer=OptimizerConfig(lr=1e-6, schedule="constant", warmup_steps=0, weight_decay=0.0, clip_norm=1.0),
        train=TrainConfig(steps=10, seed=0, remat="dots", dtype="bfloat16", log_every=1),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1),
        checkpoint=CheckpointConfig(every=10, keep=1),
    )
