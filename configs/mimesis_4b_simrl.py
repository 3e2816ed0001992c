"""MIMESIS-4B joint multi-domain RL (paper §3.3, Eq 4): Table 7's recipe on the 4B backbone.

    python -m mimesis_jax simrl --config configs/mimesis_4b_simrl.py --workdir runs/mimesis_4b_simrl \
        --set sides.judge=https://judge.example/v1 sides.judge_model=<name> sides.key_env=JUDGE_API_KEY

Same choices as mimesis_9b_simrl.py (see there), on the 4B backbone and fsdp 4 x tensor 2 of 16 devices x 2 data,
including its memory settings (4 micro-batches: 2 would peak at 80 GiB; 256 rollouts per sampler call).
"""

from mimesis_jax.config import load_sibling


def get_config():
    return load_sibling(__file__, "mimesis_9b_simrl.py").paper_simrl("4b")
