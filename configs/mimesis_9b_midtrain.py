"""MIMESIS-9B user-side mid-training (paper §3.1, Table 4): the 4B run's settings on the 9B backbone.

    python -m mimesis_jax midtrain --config configs/mimesis_9b_midtrain.py --workdir runs/mimesis_9b_midtrain \
        --set init.from_hf=/ckpt/Qwen3.5-9B data.sources.0.path='/data/odyssim_midtrain/*.jsonl' --distributed

Table 4 lists one set of Stage I settings for both sizes (5,000 steps, LR 3e-5, max length 24,576, 32x A100);
batch, schedule, mesh and the rest are the choices written in mimesis_4b_midtrain.py. On fsdp 16 x tensor 2
the fp32 weights, grads and AdamW moments of 9B (~144 GB) are ~4.5 GB per device.
"""

from mimesis_jax.config import load_sibling


def get_config():
    return load_sibling(__file__, "mimesis_4b_midtrain.py").paper_midtrain("9b")
