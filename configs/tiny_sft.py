"""Tiny ThoughtTrace SFT (paper §3.2) of the tiny simulator, starting from tiny mid-training.

    python -m mimesis_jax sft --config configs/tiny_sft.py --workdir runs/tiny_sft \
        --set init.from_workdir=runs/tiny_mid

Thought-first user turns (``<think>`` self-reported reasons ``</think>`` then the message) from the shipped
ThoughtTrace-format sample (80 conversations, two of them deliberately malformed: skipped and counted). Three
epochs as in the paper (~10 packed batches per epoch at 512 tokens). The LR is 1e-3 rather than the paper's
1e-7: the paper nudges a pretrained model, this toy must visibly move. Without init.from_workdir the model
starts from random weights (and says so).
"""

import os

from mimesis_jax.config import (CheckpointConfig, MeshConfig, OptimizerConfig, RunConfig, TokenizerConfig,
                                TrainConfig, tiny_qwen3_5)
from mimesis_jax.data.pipeline import DataConfig, SourceConfig
from mimesis_jax.data.tokenizer import samples_dir


def get_config() -> RunConfig:
    # the model, tokenizer, batch and mesh of configs/tiny_midtrain.py
    return RunConfig(
        name="tiny_sft",
        stage="sft",
        model=tiny_qwen3_5(),
        tokenizer=TokenizerConfig(name="tiny", set_model_vocab=True, vocab_multiple=64),
        data=DataConfig(sources=(SourceConfig(os.path.join(samples_dir(), "thoughttrace_sample.jsonl"),
                                              format="thoughttrace"),),
                        seq_len=512, num_epochs=None, skip_bad_records=True),
        optimizer=OptimizerConfig(lr=1e-3, schedule="cosine", warmup_steps=3, min_lr_ratio=0.1, weight_decay=0.0,
                                  b1=0.9, b2=0.95, clip_norm=1.0),
        train=TrainConfig(steps=30, global_batch=8, grad_accum=1, seed=0, dtype="float32", log_every=5),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1),
        checkpoint=CheckpointConfig(every=15, keep=2, async_save=True),
    )
