"""UserRL's evaluation set (docs/reference/environments.md): all eight gyms -- the five training gyms' test splits plus the
evaluation-only IntentionGym, TelepathyGym and SearchGym -- every task once (weights by task count), prompts of
1,152 tokens or more dropped, 16 agent turns, pass@1 at temperature 0 (the rollout command's default).

    python -m mimesis_jax rollout --mixture configs/userrl_eval_mixture.py --agent ... --user ... --out eval.jsonl

For UserRL's published test set: `--set sources='("data/alltest_multiturn/test.parquet",)'`.
"""

from mimesis_jax.config import MAX_PROMPT_TOKENS, MixtureConfig


def get_config() -> MixtureConfig:
    return MixtureConfig(sources=("shipped:test",), weights=(), max_prompt_tokens=MAX_PROMPT_TOKENS, max_turns=16)
