"""The sections every training run carries (tokenizer, optimizer, train, mesh, checkpoint, init) and the Stage I
run config (`RunConfig`, mid-training and SFT) with its validation."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from mimesis_jax.config.checks import need as _need
from mimesis_jax.errors import ConfigError
from mimesis_jax.config.serial import to_dict
from mimesis_jax.models.config import REMAT_POLICIES, ModelConfig

STAGES = ("midtrain", "sft")


# ------------------------------------------------------------------------------------------ sections
@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    name: str = "tiny"  # "tiny" | "qwen3" | "qwen3_5" | "hf:DIR" | "sentencepiece:PATH"
    # Tiny runs build the model for the tokenizer: model.vocab_size := len(tokenizer) rounded up to
    # vocab_multiple. Otherwise model.vocab_size is checked to be >= the tokenizer's size.
    set_model_vocab: bool = False
    vocab_multiple: int = 8


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 3e-5  # peak learning rate
    schedule: Literal["cosine", "constant"] = "cosine"  # after linear warmup from 0
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at train.steps
    weight_decay: float = 0.0  # decoupled (AdamW); applied to matrices only, never to norms/biases
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    clip_norm: float = 1.0  # global-norm gradient clipping; 0 disables


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 100  # optimizer steps of the whole run (the schedule's length)
    global_batch: int = 8  # sequences per optimizer step, summed over all processes
    grad_accum: int = 1  # micro-batches per step (global_batch must divide into them)
    seed: int = 0
    remat: str = "none"  # one of models.config.REMAT_POLICIES
    dtype: Literal["bfloat16", "float32"] = "bfloat16"  # compute dtype; weights/optimizer state stay fp32
    nonfinite: Literal["stop", "skip"] = "stop"  # non-finite loss/grad norm: stop the run, or skip the update
    max_consecutive_skips: int = 10  # with nonfinite=skip: stop after this many skipped steps in a row
    log_every: int = 1  # stdout / TensorBoard every N steps (metrics.jsonl always gets every step)
    # RL stages: the update metrics stay on the device and are fetched to the host every N steps (always at a
    # checkpoint, a validation, SIGTERM and the end), one transfer for the N steps; every step is still logged
    # under its own step number. 1 = fetch (and wait for the updates) every step. The LM trainer reads every
    # step's loss (train.nonfinite) and takes only 1.
    metrics_sync_every: int = 1
    prefetch: int = 2  # batches prepared ahead on a host thread; 0 = none
    progress_bar: bool = True
    tensorboard: bool = True
    # RL stages: write <workdir>/timeline.json, a trace of the run's rollouts, agent turns, user waits, coach
    # notes, updates and weight syncs per track (mimesis_jax/timeline.py; open it in ui.perfetto.dev; docs/stage2.md)
    timeline: bool = False


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = 1
    fsdp: int = -1  # -1 absorbs the remaining devices
    tensor: int = 1

    def axes(self) -> dict[str, int]:
        return {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every: int = 500  # save every N steps (and always at the end, on SIGTERM and on a non-finite stop)
    keep: int = 3  # keep the N most recent checkpoints
    async_save: bool = True  # write in a background thread while training continues
    fallback: bool = True  # resume from the newest intact step when the latest is corrupt (logged); false: stop


@dataclasses.dataclass(frozen=True)
class InitConfig:
    """Where the initial weights come from (ignored when the workdir already has a checkpoint: resume)."""

    from_workdir: str = ""  # another run's workdir (SFT after mid-training): its checkpoint's params
    from_hf: str = ""  # a HF model directory
    step: int = -1  # with from_workdir: which checkpoint step (-1 = latest)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    stage: str
    model: ModelConfig
    data: Any  # mimesis_jax.data.pipeline.DataConfig (any dataclass: --set walks its fields)
    tokenizer: TokenizerConfig = TokenizerConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    train: TrainConfig = TrainConfig()
    mesh: MeshConfig = MeshConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    init: InitConfig = InitConfig()
    name: str = ""

    def replace(self, **kw) -> "RunConfig":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict:
        return to_dict(self)

    def runtime_model(self) -> ModelConfig:
        """The model config the trainer runs: architecture + train.dtype/remat, fp32 master weights."""
        return self.model.replace(dtype=self.train.dtype, param_dtype="float32", remat=self.train.remat)


# ------------------------------------------------------------------------------------------ checks
def validate(cfg: RunConfig) -> RunConfig:
    """Cross-field checks of a Stage I run config; every error names its key (checks.need)."""
    def need(ok: bool, key: str, msg: str):
        _need(ok, key, msg, within=cfg)

    need(cfg.stage in STAGES, "stage", f"must be one of {STAGES}")
    if not isinstance(cfg.model, ModelConfig):
        raise ConfigError(f"config key 'model': must be a mimesis_jax.models.ModelConfig, "
                          f"got {type(cfg.model).__name__}")
    default = ModelConfig()
    for k in ("dtype", "param_dtype", "remat"):
        need(getattr(cfg.model, k) == getattr(default, k), f"model.{k}",
             f"a runtime field: set train.{'dtype' if k != 'remat' else 'remat'} instead (weights are always fp32)")
    need(cfg.tokenizer.vocab_multiple >= 1, "tokenizer.vocab_multiple", "must be >= 1")
    o = cfg.optimizer
    need(math.isfinite(o.lr) and o.lr > 0, "optimizer.lr", "must be a finite number > 0")
    need(cfg.train.steps >= 1, "train.steps", "must be >= 1")
    need(o.warmup_steps >= 0, "optimizer.warmup_steps", "must be >= 0")
    need(o.warmup_steps <= cfg.train.steps, "optimizer.warmup_steps",
         f"must be <= train.steps={cfg.train.steps}: lower it too, e.g. "
         f"--set optimizer.warmup_steps={max(0, cfg.train.steps // 10)}")
    need(0.0 <= o.min_lr_ratio <= 1.0, "optimizer.min_lr_ratio", "must be in [0, 1]")
    need(o.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0")
    need(0.0 <= o.b1 < 1.0, "optimizer.b1", "must be in [0, 1)")
    need(0.0 <= o.b2 < 1.0, "optimizer.b2", "must be in [0, 1)")
    need(o.eps > 0, "optimizer.eps", "must be > 0")
    need(o.clip_norm >= 0, "optimizer.clip_norm", "must be >= 0 (0 disables clipping)")
    t = cfg.train
    need(t.steps >= 1, "train.steps", "must be >= 1")
    need(t.global_batch >= 1, "train.global_batch", "must be >= 1")
    need(t.grad_accum >= 1, "train.grad_accum", "must be >= 1")
    need(t.global_batch % t.grad_accum == 0, "train.grad_accum",
         f"must divide train.global_batch={t.global_batch}")
    need(t.remat in REMAT_POLICIES, "train.remat", f"must be one of {REMAT_POLICIES}")
    need(t.max_consecutive_skips >= 1, "train.max_consecutive_skips", "must be >= 1")
    need(t.log_every >= 1, "train.log_every", "must be >= 1")
    need(t.metrics_sync_every == 1, "train.metrics_sync_every",
         "must be 1 for mid-training / SFT (the trainer checks every step's loss for train.nonfinite); "
         "it applies to the RL stages")
    need(t.prefetch >= 0, "train.prefetch", "must be >= 0")
    need(not t.timeline, "train.timeline", "applies to the RL stages only (mid-training / SFT write no timeline)")
    for ax in ("data", "fsdp", "tensor"):
        v = getattr(cfg.mesh, ax)
        need(v == -1 or v >= 1, f"mesh.{ax}", "must be >= 1, or -1 to absorb the remaining devices")
    need([cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor].count(-1) <= 1, "mesh", "at most one axis may be -1")
    need(cfg.checkpoint.every >= 1, "checkpoint.every", "must be >= 1")
    need(cfg.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1")
    need(not (cfg.init.from_workdir and cfg.init.from_hf), "init.from_hf",
         "set at most one of init.from_workdir and init.from_hf")
    need(cfg.init.step >= -1, "init.step", "must be >= 0, or -1 for the latest checkpoint")
    check = getattr(cfg.data, "validate", None)
    if callable(check):
        try:
            check()
        except ConfigError:
            raise
        except ValueError as e:
            raise ConfigError(f"config section 'data': {e}") from None
    return cfg
