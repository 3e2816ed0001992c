"""Tiny user-side mid-training (paper §3.1) of a tiny Qwen3.5 simulator on the shipped sample corpora, on a CPU.

    python -m mimesis_jax midtrain --config configs/tiny_midtrain.py --workdir runs/tiny_mid

Same pipeline as the paper run (role-flipped next-user-turn prediction, loss on user turns only, packed rows),
at toy scale: a 4-layer hybrid model (3 gated-DeltaNet + 1 gated-attention layer, hidden 64) built from
scratch for the tiny sentencepiece tokenizer (1,024 ids), 300 sample dialogues (~10 packed batches per epoch).
A from-scratch model needs many passes and a large LR to show a falling loss, so this runs 10 epochs at 3e-3
(the paper fine-tunes a pretrained 4B/9B model for ~1 epoch at 3e-5). float32 compute: XLA's CPU backend has
no fast bf16 matmuls.
"""

import os

from mimesis_jax.config import (CheckpointConfig, MeshConfig, OptimizerConfig, RunConfig, TokenizerConfig,
                                TrainConfig, tiny_qwen3_5)
from mimesis_jax.data.pipeline import DataConfig, SourceConfig
from mimesis_jax.data.tokenizer import samples_dir


def get_config() -> RunConfig:
    sd = samples_dir()
    return RunConfig(
        name="tiny_midtrain",
        stage="midtrain",
        model=tiny_qwen3_5(),
        tokenizer=TokenizerConfig(name="tiny", set_model_vocab=True, vocab_multiple=64),
        data=DataConfig(sources=(SourceConfig(os.path.join(sd, "midtrain_everyday.jsonl"), weight=0.6),
                                 SourceConfig(os.path.join(sd, "midtrain_support.jsonl"), weight=0.4)),
                        seq_len=512, num_epochs=None),
        optimizer=OptimizerConfig(lr=3e-3, schedule="cosine", warmup_steps=10, min_lr_ratio=0.1, weight_decay=0.01,
                                  b1=0.9, b2=0.95, clip_norm=1.0),
        train=TrainConfig(steps=100, global_batch=8, grad_accum=1, seed=0, dtype="float32", log_every=10),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1),
        checkpoint=CheckpointConfig(every=50, keep=2, async_save=True),
    )
