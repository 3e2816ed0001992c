"""MIMESIS-9B ThoughtTrace SFT (paper §3.2, Table 4): the 4B SFT settings on the 9B backbone.

    python -m mimesis_jax sft --config configs/mimesis_9b_sft.py --workdir runs/mimesis_9b_sft \
        --set init.from_workdir=runs/mimesis_9b_midtrain data.sources.0.path=/data/thoughttrace/train.jsonl

Same Table 4 settings and choices as mimesis_4b_sft.py; on fsdp 4 x tensor 2 the fp32 weights, grads and
AdamW moments of 9B (~144 GB) are ~18 GB per device.
"""

from mimesis_jax.config import load_sibling


def get_config():
    return load_sibling(__file__, "mimesis_4b_sft.py").paper_sft("9b")
