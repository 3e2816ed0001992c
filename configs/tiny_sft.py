"""Tiny ThoughtTrace SFT (paper §3.2) of the tiny simulator, starting from tiny mid-training.

    python -m mimesis_jax sft --config configs/tiny_sft.py --workdir runs/tiny_sft \
        --set init.from_workdir=runs/tiny_mid

Thought-first user turns (``<think>`` self-reported reasons ``</think>`` then the message) from the shipped
ThoughtTrace-format sample (80 conversations, two of them deliberately malformed: skipped and counted). Three
epochs as in the paper (~10 packed batches per epoch at 512 tokens). The LR is 1e-3 rather than the paper's
1e-7: the paper nudges a pretrained model, this toy must visibly move. Without init.from_workdir the model
starts from random weights (and says so).
"""

import dataclasses
import os

from mimesis_jax.config import OptimizerConfig, load_sibling
from mimesis_jax.data.pipeline import DataConfig, SourceConfig
from mimesis_jax.data.tokenizer import samples_dir

_mid = load_sibling(__file__, "tiny_midtrain.py")


def get_config():
    base = _mid.get_config()
    return dataclasses.replace(
        base,
        name="tiny_sft",
        stage="sft",
        data=DataConfig(sources=(SourceConfig(os.path.join(samples_dir(), "thoughttrace_sample.jsonl"),
                                              format="thoughttrace"),),
                        seq_len=512, num_epochs=None, skip_bad_records=True),
        optimizer=OptimizerConfig(lr=1e-3, schedule="cosine", warmup_steps=3, min_lr_ratio=0.1, weight_decay=0.0,
                                  b1=0.9, b2=0.95, clip_norm=1.0),
        train=dataclasses.replace(base.train, steps=30, log_every=5),
        checkpoint=dataclasses.replace(base.checkpoint, every=15),
    )
