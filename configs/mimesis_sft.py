"""MIMESIS ThoughtTrace SFT (paper §3.2, Table 4), starting from the mid-training run of the same size; variants
4b (default) and 9b, the backbone size.

    python -m mimesis_jax sft --config configs/mimesis_sft.py:4b --workdir runs/mimesis_4b_sft \
        --set init.from_workdir=runs/mimesis_4b_midtrain data.sources.0.path=/data/thoughttrace/train.jsonl
    python -m mimesis_jax sft --config configs/mimesis_sft.py:9b --workdir runs/mimesis_9b_sft \
        --set init.from_workdir=runs/mimesis_9b_midtrain data.sources.0.path=/data/thoughttrace/train.jsonl

Table 4 (given): 3 epochs, LR 1e-7, max length 32,768, 8x A100 (~45 min), ~15.8M tokens processed.
Data: ThoughtTrace (HF SCAI-JHU/ThoughtTrace, CC-BY-4.0; 2,155 conversations), exported to JSON lines or
parquet locally (nothing is downloaded by the trainer).

Chosen here (the paper is silent):
* global batch 8 rows of 32,768 tokens = 262K token slots per step; 60 steps = 15.7M slots ~ the paper's
  15.8M tokens over 3 epochs. 2 accumulation micro-batches of 4 rows.
* mesh 8 devices = fsdp 4 x tensor 2 (one 8-GPU node); for 9B the fp32 weights, grads and AdamW moments
  (~144 GB) are ~18 GB per device.
* AdamW b1 0.9, b2 0.95, no weight decay (a 1e-7 LR for 60 steps barely moves the weights; decay would
  dominate), clip 1.0; 3 warmup steps, cosine to 10%.
* bf16 compute, fp32 master weights (a 1e-7 update vanishes in bf16 weights), full remat.
* checkpoint every 20 steps (one per epoch), keep 3.
At 32K tokens the run selects the blockwise (flash) attention backend (`model.attention_impl=blockwise`), as
mid-training does.
"""

from mimesis_jax.config import (CheckpointConfig, InitConfig, MeshConfig, OptimizerConfig, RunConfig,
                                TokenizerConfig, TrainConfig, qwen3_5_model)
from mimesis_jax.data.pipeline import DataConfig, SourceConfig

VARIANTS = ("4b", "9b")


def get_config(size: str = "4b") -> RunConfig:
    return RunConfig(
        name=f"mimesis_{size}_sft",
        stage="sft",
        model=qwen3_5_model(size).replace(attention_impl="blockwise"),
        tokenizer=TokenizerConfig(name="qwen3_5"),
        init=InitConfig(from_workdir=f"runs/mimesis_{size}_midtrain"),
        data=DataConfig(sources=(SourceConfig("data/thoughttrace/train.jsonl", format="thoughttrace"),),
                        seq_len=32_768, num_epochs=None),
        optimizer=OptimizerConfig(lr=1e-7, schedule="cosine", warmup_steps=3, min_lr_ratio=0.1,
                                  weight_decay=0.0, b1=0.9, b2=0.95, eps=1e-8, clip_norm=1.0),
        train=TrainConfig(steps=60, global_batch=8, grad_accum=2, seed=0, remat="full", dtype="bfloat16",
                          nonfinite="stop", log_every=1),
        mesh=MeshConfig(data=1, fsdp=4, tensor=2),
        checkpoint=CheckpointConfig(every=20, keep=3, async_save=True),
    )
