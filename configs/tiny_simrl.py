"""Tiny Stage I joint RL (paper §3.3, Eq 4) on a CPU: FoldGRPO of the tiny simulator over two domains.

    python -m mimesis_jax simrl --config configs/tiny_simrl.py --workdir runs/simrl
    python -m mimesis_jax simrl --config configs/tiny_simrl.py --workdir runs/simrl \
        --set init.from_workdir=runs/demo/sft          # start from the tiny ThoughtTrace-SFT simulator

Domains: hitom (single-turn, accuracy, no judge) and abcd_behaviour (multi-turn: the simulator plays the ABCD
customer for 2 turns against the rule-based toy support agent, scored by the rule-based toy judge of envs/toy.py,
which rewards pushy, ~12-word customer turns). Weights 1:1. 4 prompts x 4 rollouts per step, mini-batches of 2
prompts, 24 tokens per turn, LR 3e-3 (a toy from random weights must move; Table 7's 8e-6 nudges a
trained 9B model). Thinking is off here: a random-init tiny model does not close a <think> block within 24 tokens,
so every turn would have no public reply and score 0 (--set rollout.thinking=true with a simulator that learned
the format, e.g. init.from_workdir=<SFT run>). Real judges / support agents:
--set sides.judge=<spec> sides.support_agent=<spec>.
"""

from mimesis_jax.config import (CheckpointConfig, DomainMixConfig, MeshConfig, OptimizerConfig, RLConfig, SidesConfig,
                                SimRLConfig, SimRolloutConfig, TokenizerConfig, TrainConfig, tiny_qwen3_5)


def get_config() -> SimRLConfig:
    return SimRLConfig(
        name="tiny_simrl",
        model=tiny_qwen3_5(),
        tokenizer=TokenizerConfig(name="tiny", set_model_vocab=True, vocab_multiple=64),
        sides=SidesConfig(judge="toy-judge", support_agent="toy-agent"),
        domains=DomainMixConfig(weights=(("hitom", 1.0), ("abcd_behaviour", 1.0)), max_user_turns=2),
        rl=RLConfig(alpha=0.0, num_microbatches=1),
        rollout=SimRolloutConfig(prompts_per_step=4, group_size=4, mini_batch_prompts=2, max_tokens=24,
                                 row_len=2048, temperature=1.0, thinking=False, env_workers=1),
        optimizer=OptimizerConfig(lr=3e-3, schedule="constant", warmup_steps=0, weight_decay=0.0, clip_norm=1.0),
        train=TrainConfig(steps=10, seed=0, dtype="float32", log_every=1),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1),
        checkpoint=CheckpointConfig(every=5, keep=2),
    )
