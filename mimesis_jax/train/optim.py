"""Optimizer and learning-rate schedule (optax), plus the placement of optimizer state on a mesh.

    schedule = make_schedule(cfg.optimizer, cfg.train.steps)     # step -> lr
    tx = make_optimizer(cfg.optimizer, cfg.train.steps, config)  # clip -> AdamW (decay on matrices only)
    shardings = opt_state_shardings(abstract_state, param_shardings)

AdamW moments live in fp32 because the parameters do (fp32 master weights); the model casts weights to the
compute dtype where it uses them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from mimesis_jax.config import OptimizerConfig
from mimesis_jax.models import is_spec, param_specs
from mimesis_jax.models.config import ModelConfig


def schedule_hparams(cfg: OptimizerConfig, total_steps: int) -> dict:
    """The numbers of a run's schedule and weight decay as float32 / int32 scalars, each converted as the
    constant it replaces would be (a Python scalar meeting a float32 array): `make_schedule` and `make_optimizer`
    given them (traced) compute what they compute from `cfg`, and runs that differ only in these numbers (the
    demo's mid-training and SFT) trace one program, which XLA's persistent compilation cache then serves."""
    warm = int(cfg.warmup_steps)
    return {"lr": np.float32(cfg.lr), "warmup": np.int32(warm), "warmup_f": np.float32(warm),
            "decay_steps": np.float32(float(max(1, total_steps - warm))),
            "one_minus_alpha": np.float32(1 - cfg.min_lr_ratio), "alpha": np.float32(cfg.min_lr_ratio),
            "weight_decay": np.float32(cfg.weight_decay)}


def make_schedule(cfg: OptimizerConfig, total_steps: int, hparams: dict | None = None) -> optax.Schedule:
    """Linear warmup 0 -> lr over `warmup_steps`, then cosine to lr * min_lr_ratio at `total_steps`, or constant.

    The paper (Table 4) gives only the peak LR; the warmup and decay shape are this project's defaults and
    are written in each config file. With `hparams` (`schedule_hparams`, traced) the numbers are read from it and
    only the shape (schedule kind, warmup or not) from `cfg`.
    """
    warm = int(cfg.warmup_steps)
    if cfg.schedule not in ("constant", "cosine"):
        raise ValueError(f"config key 'optimizer.schedule': unknown schedule {cfg.schedule!r}")
    if hparams is None:
        peak = float(cfg.lr)
        if cfg.schedule == "constant":
            after = optax.constant_schedule(peak)
        else:
            after = optax.cosine_decay_schedule(peak, decay_steps=max(1, total_steps - warm), alpha=cfg.min_lr_ratio)
        boundary, warm_last, warm_div = warm, warm - 1, warm
    else:
        h = hparams
        peak, boundary, warm_last, warm_div = h["lr"], h["warmup"], h["warmup"] - 1, h["warmup_f"]
        if cfg.schedule == "constant":
            after = lambda s: peak  # noqa: E731
        else:
            def after(s):  # optax.cosine_decay_schedule's arithmetic, in its order, on the traced numbers
                s = jnp.minimum(s, h["decay_steps"])
                cosine = 0.5 * (1 + jnp.cos(jnp.pi * s / h["decay_steps"]))
                return peak * (h["one_minus_alpha"] * cosine ** 1.0 + h["alpha"])
    if warm == 0:
        return after
    # Step s (0-based) trains with warmup lr * (s + 1) / warm, so the first step does move the weights.
    warmup = lambda s: peak * (jnp.minimum(s, warm_last) + 1.0) / warm_div  # noqa: E731
    return optax.join_schedules([warmup, after], [boundary])


def decay_mask(config: ModelConfig):
    """True for the parameters that get weight decay: the randomly initialised matrices (not norms, biases,
    gates' A_log / dt_bias). Read from the model's ParamSpec initialisers, so stacked [L, D] norms are
    recognised as norms."""
    return jax.tree.map(lambda s: s.init == "normal", param_specs(config), is_leaf=is_spec)


def make_optimizer(cfg: OptimizerConfig, total_steps: int, config: ModelConfig,
                   hparams: dict | None = None) -> optax.GradientTransformation:
    """Global-norm clipping (if clip_norm > 0) followed by AdamW with the schedule above. With `hparams`
    (`schedule_hparams`, traced) the schedule and the weight decay read it: a traced decay of 0 adds 0 x weight
    to each update, which leaves it unchanged, where a constant 0 skips the addition."""
    parts = []
    if cfg.clip_norm > 0:
        parts.append(optax.clip_by_global_norm(cfg.clip_norm))
    parts.append(optax.adamw(make_schedule(cfg, total_steps, hparams), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                             weight_decay=cfg.weight_decay if hparams is None else hparams["weight_decay"],
                             mask=decay_mask(config)))
    return optax.chain(*parts)


def _path_keys(path) -> tuple:
    return tuple(getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))) for k in path)


def opt_state_shardings(abstract_opt_state, param_shardings, mesh):
    """A sharding for every optimizer-state leaf: a leaf whose tree path ends with a parameter's path and has
    that parameter's shape (Adam's mu/nu, masked or not) follows the parameter; everything else (step
    counts) is replicated."""
    by_path = {}
    for path, s in jax.tree_util.tree_flatten_with_path(param_shardings)[0]:
        by_path[_path_keys(path)] = s
    replicated = NamedSharding(mesh, P())

    def pick(path, leaf):
        keys = _path_keys(path)
        for n in range(len(keys), 0, -1):
            s = by_path.get(keys[-n:])
            if s is not None and len(s.spec) <= len(leaf.shape):
                return s
        return replicated

    shardings = jax.tree_util.tree_map_with_path(pick, abstract_opt_state)
    return shardings
