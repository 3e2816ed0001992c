"""Tiny Stage II run on a CPU (paper §4.1): multi-turn GRPO of a tiny Qwen3 agent against a tiny frozen simulator
on the toy gym (envs/toy.py: the user secretly likes words that start with one letter; graded reward per turn).

    python -m mimesis_jax agentrl --config configs/tiny_agentrl_grpo.py --workdir runs/agent_grpo
    python -m mimesis_jax agentrl --config configs/tiny_agentrl_csd.py --workdir runs/agent_csd \
        --set users.coach=runs/demo/sft        # the trained tiny simulator as the coach (what `demo` does)

8 tasks x 4 dialogues per step, mini-batches of 2 tasks (4 updates per step: clipping acts from the second), 2 agent
turns of <= 24 tokens, LR 3e-3 (a toy from random weights must move; the paper's 1e-6 nudges a pretrained 8B model).
The user is the rule-based toy user (envs/toy.py; its private thought says how the reply matched) and the coach the
rule-based toy coach, so the run needs no trained simulator; the demo swaps in the trained tiny simulator.
"""

from mimesis_jax.config import CheckpointConfig, MeshConfig, OptimizerConfig, TokenizerConfig, TrainConfig
from mimesis_jax.envs.userrl.mixture import MixtureConfig
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.train.agent_rl import RLConfig
from mimesis_jax.train.agent_rl_loop import AgentRLConfig, RolloutConfig, UserSideConfig


def tiny_qwen3() -> ModelConfig:
    return ModelConfig(model_type="qwen3", vocab_size=1024, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       rope_theta=10_000.0, tie_word_embeddings=True, max_position_embeddings=4096,
                       logits_seq_chunk=128, logits_vocab_chunk=512)


def get_config() -> AgentRLConfig:
    return AgentRLConfig(
        name="tiny_agentrl_grpo",
        model=tiny_qwen3(),
        tokenizer=TokenizerConfig(name="tiny", set_model_vocab=True, vocab_multiple=64),
        users=UserSideConfig(simulator="toy-user", coach="toy-coach", simulator_thinking=True),
        gyms=MixtureConfig(sources=("toy:16",), weights=(), max_prompt_tokens=0, max_turns=2),
        rl=RLConfig(alpha=0.0, num_microbatches=1),
        rollout=RolloutConfig(prompts_per_step=8, group_size=4, mini_batch_prompts=2, max_turns=2,
                              agent_max_tokens=24, row_len=256, temperature=1.0, env_workers=1),
        optimizer=OptimizerConfig(lr=3e-3, schedule="constant", warmup_steps=0, weight_decay=0.0, clip_norm=1.0),
        train=TrainConfig(steps=20, seed=0, dtype="float32", log_every=1),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1),
        checkpoint=CheckpointConfig(every=6, keep=2),
    )
