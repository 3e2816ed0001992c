"""What both RL stages share: building (or resuming) the training state in a workdir, and one step's PPO updates.

Stage II (train/agent_rl_loop.py: the agent against the frozen simulator) and Stage I's joint RL
(train/simulator_rl.py: the simulator over the 24 domains) differ in how rollouts are made and scored; the state,
the checkpoint, the optimizer and the update of Eq 5-6 (+ CSD for Stage II) are the same code, here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Sequence

import jax
import numpy as np

from mimesis_jax import sharding
from mimesis_jax.models.config import ConfigError, ModelConfig
from mimesis_jax.train.checkpoint import Checkpointer

UPDATE_METRICS = ("loss", "grpo_loss", "csd_loss", "mean_w", "frac_delta_pos", "clip_frac", "entropy", "approx_kl",
                  "grad_norm")


@dataclasses.dataclass
class RLRun:
    cfg: Any  # the validated run config, with the runtime model filled in
    model_config: ModelConfig
    mesh: Any
    schedule: Any
    step_fn: Any  # train/agent_rl.RLStep
    ckpt: Checkpointer
    state: dict
    latest: int | None  # the checkpoint step resumed from, or None for a fresh run
    data_state: dict | None  # the resumed checkpoint's data state (samplers, counters)
    run_dict: dict
    ref_params: Any = None  # the KL reference (initial weights) when rl.kl_coef > 0

    @property
    def start(self) -> int:
        return int(jax.device_get(self.state["step"]))


def setup(cfg, workdir: str, tok, log=print) -> RLRun:
    """Validates `cfg`, builds mesh / optimizer / step, and restores the latest checkpoint of `workdir` or
    initialises the state (writing run_config.json). `cfg` has the RL run-config fields (model, tokenizer, init,
    rl, optimizer, train, mesh, checkpoint) and `updates_per_step()`."""
    from mimesis_jax.train.agent_rl import make_rl_step
    from mimesis_jax.train.loop import initial_params, model_config_for, restore_latest, state_shardings
    from mimesis_jax.train.optim import make_optimizer, make_schedule
    from mimesis_jax.train.step import init_train_state

    cfg = cfg.validate()
    os.makedirs(workdir, exist_ok=True)
    model_config = model_config_for(cfg, tok)
    cfg = cfg.replace(model=dataclasses.replace(model_config, dtype="float32", remat="none"))
    run_dict = cfg.to_dict()
    try:
        mesh = sharding.make_mesh(cfg.mesh.axes())
    except ValueError as e:
        raise ConfigError(f"config section 'mesh': {e}") from None
    total_updates = cfg.train.steps * cfg.updates_per_step()
    tx = make_optimizer(cfg.optimizer, total_updates, model_config)
    schedule = make_schedule(cfg.optimizer, total_updates)
    step_fn = make_rl_step(model_config, tx, mesh, cfg.rl)
    abs_state, shardings = state_shardings(model_config, tx, mesh)
    ckpt = Checkpointer(workdir, keep=cfg.checkpoint.keep, async_save=cfg.checkpoint.async_save)
    latest, state, data_state = restore_latest(ckpt, abs_state, shardings, run_dict, log)
    if latest is None:
        params = initial_params(cfg, model_config, mesh, shardings["params"], log)
        init = jax.jit(lambda p, r: init_train_state(p, tx, r), out_shardings=shardings, donate_argnums=(0,))
        state = init(params, jax.random.fold_in(jax.random.key(cfg.train.seed), 1))
        with open(os.path.join(workdir, "run_config.json"), "w") as f:
            json.dump(run_dict, f, indent=2)
    else:
        log(f"resume: {workdir} from step {latest}")
    ref_params = None
    if getattr(cfg.rl, "kl_coef", 0.0) > 0:  # the reference policy: the run's initial weights, never updated
        ref_params = initial_params(cfg, model_config, mesh, shardings["params"], log)
    return RLRun(cfg, model_config, mesh, schedule, step_fn, ckpt, state, latest, data_state, run_dict, ref_params)


def step_seed(seed: int, step: int) -> int:
    """The rollout seed of RL step `step` (0-based): a pure function of (train.seed, step), so resumes match."""
    return int(np.random.SeedSequence([seed, step + 1]).generate_state(1)[0])


def ppo_updates(run: RLRun, chunks: Sequence[tuple[Sequence, Sequence]], *, row_len: int | None = None
                ) -> tuple[dict, list[dict]]:
    """One RL step's optimizer updates, one per mini-batch: chunks = [(trajectories, advantages per trajectory's
    agent turns)]. Old log-probs are fixed for the whole step BEFORE the first update (the sampler's, or
    recomputed with the pre-update parameters), so ratios move from the second mini-batch on (Eq 5-6).
    Returns (the new state, each update's metrics on the host)."""
    from mimesis_jax.algorithms.rl_batch import pack_trajectories

    rl, step_fn, state = run.cfg.rl, run.step_fn, run.state
    teacher = rl.teacher if rl.alpha > 0 else "none"
    batches = []
    for trajs, adv in chunks:
        packed = pack_trajectories(trajs, adv, teacher=teacher, loss_agg=rl.loss_agg,
                                   use_rollout_logprobs=rl.old_logprobs == "rollout",
                                   rows_multiple=step_fn.rows_multiple(), row_len=row_len)
        batches.append(jax.block_until_ready(step_fn.place(packed)))  # nothing in flight while the step compiles
    if rl.old_logprobs == "recompute":  # pi_old = the parameters before this step's updates
        batches = [step_fn.recompute_old_logprobs(state["params"], b) for b in batches]
    params, opt_state = state["params"], state["opt_state"]
    ms = []
    for b in batches:
        params, opt_state, m = step_fn(params, opt_state, b, ref_params=run.ref_params)
        ms.append(jax.device_get(m))  # waits: never queue sharded CPU steps
    return dict(state, params=params, opt_state=opt_state), ms


def update_record(ms: list[dict], train_s: float) -> dict:
    """Mean update metrics of one step (0.0 when it made no update) + the last update's clip fraction."""
    rec = {k: (float(np.mean([float(m[k]) for m in ms if k in m])) if any(k in m for m in ms) else 0.0)
           for k in UPDATE_METRICS}
    if ms:
        rec["clip_frac_last"] = float(ms[-1]["clip_frac"])
        rec["train_tokens_per_s"] = sum(float(m["agent_tokens"]) for m in ms) / max(train_s, 1e-9)
    return rec
