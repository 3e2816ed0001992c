"""MIMESIS user-side mid-training (paper §3.1, Table 4) -- the paper's run as a run config; variants 4b (default)
and 9b, the backbone size.

    python -m mimesis_jax midtrain --config configs/mimesis_midtrain.py:4b --workdir runs/mimesis_4b_midtrain \
        --set init.from_hf=/ckpt/Qwen3.5-4B data.sources.0.path='/data/odyssim_midtrain/*.jsonl' --distributed
    python -m mimesis_jax midtrain --config configs/mimesis_midtrain.py:9b --workdir runs/mimesis_9b_midtrain \
        --set init.from_hf=/ckpt/Qwen3.5-9B data.sources.0.path='/data/odyssim_midtrain/*.jsonl' --distributed

Table 4 (given by the paper; one set of Stage I settings for both sizes): ~0.97 epoch, 5,000 steps, LR 3e-5, max
length 24,576, 32x A100 (~4.8 days); 9.51B tokens processed from a 62-corpus mixture (OdysSim mid-training data;
list the corpora as weighted `data.sources`, one SourceConfig each -- the mixture file is not shipped).

Chosen here (the paper is silent; change with --set):
* global batch 80 rows of 24,576 tokens = 1.97M token slots per step; x 5,000 steps = 9.83B slots, i.e. the
  paper's 9.51B processed tokens at ~97% packing efficiency. 5 accumulation micro-batches of 16 rows: one
  row per batch shard at a time.
* mesh 32 devices = fsdp 16 x tensor 2 (a 4-node x 8-GPU cluster: tensor parallelism inside a node's NVLink,
  FSDP across). Weights + grads + AdamW moments in fp32 are ~67 GB in total for 4B, ~2.1 GB per device (9B:
  ~144 GB, ~4.5 GB per device).
* AdamW b1 0.9, b2 0.95, eps 1e-8, weight decay 0.1 (matrices only), global-norm clip 1.0; linear warmup over
  100 steps (2%), cosine decay to 10% of the peak LR.
* bf16 compute with fp32 master weights and optimizer state; full per-layer rematerialisation.
* checkpoint every 250 steps (~6 h), keep 3, asynchronous.
At 24K tokens the dense reference attention would materialise [heads / tensor, T, T] fp32 scores per
full-attention layer, so the run selects the blockwise (flash) backend: `model.attention_impl=blockwise` with
the default 512 x 512 blocks (`model.attention_block_q` / `attention_block_k`).
"""

from mimesis_jax.config import (CheckpointConfig, InitConfig, MeshConfig, OptimizerConfig, RunConfig,
                                TokenizerConfig, TrainConfig, qwen3_5_model)
from mimesis_jax.data.pipeline import DataConfig, SourceConfig

VARIANTS = ("4b", "9b")


def get_config(size: str = "4b") -> RunConfig:
    return RunConfig(
        name=f"mimesis_{size}_midtrain",
        stage="midtrain",
        model=qwen3_5_model(size).replace(attention_impl="blockwise"),
        tokenizer=TokenizerConfig(name="qwen3_5"),
        init=InitConfig(from_hf=f"checkpoints/Qwen3.5-{size.upper()}"),  # the pretrained backbone (HF directory)
        data=DataConfig(sources=(SourceConfig("data/midtrain/*.jsonl", format="midtrain"),),
                        seq_len=24_576, num_epochs=None, read_threads=4),
        optimizer=OptimizerConfig(lr=3e-5, schedule="cosine", warmup_steps=100, min_lr_ratio=0.1,
                                  weight_decay=0.1, b1=0.9, b2=0.95, eps=1e-8, clip_norm=1.0),
        train=TrainConfig(steps=5_000, global_batch=80, grad_accum=5, seed=0, remat="full", dtype="bfloat16",
                          nonfinite="stop", log_every=10),
        mesh=MeshConfig(data=1, fsdp=16, tensor=2),
        checkpoint=CheckpointConfig(every=250, keep=3, async_save=True),
    )
