"""Tiny Stage II run on a CPU (paper §4): multi-turn RL of a tiny Qwen3 agent against a tiny frozen simulator on the
toy gym (envs/toy.py: the user secretly likes words that start with one letter; graded reward per turn). Variants:
* grpo (default): multi-turn GRPO (§4.1);
* csd: GRPO + CSD (§4.2, Eq 7-11): the coach (the simulator's weights asked as an assistant with the documented
  coach prompt) and the fused teacher/student pass; alpha 0.01 and beta 5.0 as in Table 13;
* infopo: the InfoPO credit baseline (§4.3; algorithms/infopo.py) -- rl.credit = "infopo": each turn's advantage
  adds the group-normalised, variance-gated information gain of the feedback it drew (the follow-up turn's
  log-probs with the feedback observed minus masked), from one extra scoring pass with the pre-update parameters.
  No CSD (alpha 0): InfoPO is the alternative credit, compared with CSD. infopo_coef 0.5 and infopo_gate_tau 0.05
  are the intrinsic weight and gate temperature of InfoPO's released code.

    python -m mimesis_jax agentrl --config configs/tiny_agentrl.py --workdir runs/agent_grpo
    python -m mimesis_jax agentrl --config configs/tiny_agentrl.py:csd --workdir runs/agent_csd \
        --set users.coach=runs/demo/sft        # the trained tiny simulator as the coach (what `demo` does)
    python -m mimesis_jax agentrl --config configs/tiny_agentrl.py:infopo --workdir runs/agent_infopo

8 tasks x 4 dialogues per step, mini-batches of 2 tasks (4 updates per step: clipping acts from the second), 2 agent
turns of <= 24 tokens, LR 3e-3 (a toy from random weights must move; the paper's 1e-6 nudges a pretrained 8B model).
The user is the rule-based toy user (envs/toy.py; its private thought says how the reply matched) and the coach the
rule-based toy coach, so the run needs no trained simulator; the demo swaps in the trained tiny simulator.
"""

from mimesis_jax.config import (AgentRLConfig, CheckpointConfig, MeshConfig, MixtureConfig, OptimizerConfig, RLConfig,
                                RolloutConfig, TokenizerConfig, TrainConfig, UserSideConfig, tiny_qwen3)

VARIANTS = ("grpo", "csd", "infopo")
RL = {  # the update of each variant: all else is shared
    "grpo": RLConfig(alpha=0.0, num_microbatches=1),
    "csd": RLConfig(alpha=0.01, beta=5.0, num_microbatches=1),
    "infopo": RLConfig(alpha=0.0, credit="infopo", infopo_coef=0.5, infopo_gate_tau=0.05, num_microbatches=1),
}


def get_config(variant: str = "grpo") -> AgentRLConfig:
    return AgentRLConfig(
        name=f"tiny_agentrl_{variant}",
        model=tiny_qwen3(),
        tokenizer=TokenizerConfig(name="tiny", set_model_vocab=True, vocab_multiple=64),
        users=UserSideConfig(simulator="toy-user", coach="toy-coach", simulator_thinking=True),
        gyms=MixtureConfig(sources=("toy:16",), weights=(), max_prompt_tokens=0, max_turns=2),
        rl=RL[variant],
        rollout=RolloutConfig(prompts_per_step=8, group_size=4, mini_batch_prompts=2, max_turns=2,
                              agent_max_tokens=24, row_len=256, temperature=1.0, env_workers=1),
        optimizer=OptimizerConfig(lr=3e-3, schedule="constant", warmup_steps=0, weight_decay=0.0, clip_norm=1.0),
        train=TrainConfig(steps=20, seed=0, dtype="float32", log_every=1),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1),
        checkpoint=CheckpointConfig(every=6, keep=2),
    )
