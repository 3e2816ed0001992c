"""UserRL's training mixture (docs/reference/environments.md): the five training gyms in UserRL's proportions -- Travel 925,
Tau 500, Turtle 423, Persuade 378, Function 200 rows -- prompts of 1,152 tokens or more dropped (counted and
logged), 16 agent turns per episode (paper Table 13).

    python -m mimesis_jax rollout --mixture configs/userrl_train_mixture.py --agent ... --user ... --n 128 --out r.jsonl

`sources` point at the shipped tasks; for the published data give UserRL's parquet, e.g.
`--set sources='("data/alltrain_multiturn/train.parquet",)'` (with the gym data files in `--data-dir`).
"""

from mimesis_jax.config import MAX_PROMPT_TOKENS, USERRL_TRAIN_ROWS, MixtureConfig


def get_config() -> MixtureConfig:
    return MixtureConfig(sources=("shipped:train",), weights=tuple(USERRL_TRAIN_ROWS.items()),
                         max_prompt_tokens=MAX_PROMPT_TOKENS, max_turns=16)
