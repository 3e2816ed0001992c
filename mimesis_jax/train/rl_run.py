"""What both RL stages share: building (or resuming) the training state in a workdir, and one step's PPO updates.

Stage II (train/agent_rl_loop.py: the agent against the frozen simulator) and Stage I's joint RL
(train/simulator_rl.py: the simulator over the 24 domains) differ in how rollouts are made and scored; the state,
the checkpoint, the optimizer and the update of Eq 5-6 (+ CSD for Stage II) are the same code, here.

Several processes (jax.distributed, `--distributed`; launch/*.sh): every process draws the same task list,
samples only its share (`process_share`: task i on process i % P, every rollout of a group with it, so group
statistics -- Eq 4-5 advantages, FoldGRPO -- are exact locally) with a process-local copy of the policy
(`rollout_params`), and the kept groups of all processes, in group-id order, are cut into the same PPO
mini-batches everywhere (`global_groups`). In `ppo_updates` each process packs its own part of each mini-batch,
the processes agree on shapes and on the loss normalisers (rl_batch.layout_info / common_layout / conform) and
the global batch is assembled from the process-local rows (RLStep.place(process_local=True)); no process holds
the whole batch. Step metrics are computed from per-episode summaries gathered from every process (identical on
all); process 0 logs and writes metrics; checkpoints are written by all (orbax, checkpoints.py). Episode
seeds depend on global task indices and rollout ids only (`step_seed`), so a P-process run samples the episodes of
the one-process run and its updates equal it up to fp32 summation order; resuming needs the same P.
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
from mimesis_jax.checkpoints import Checkpointer, gather_json

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
    if jax.process_count() > 1:
        if getattr(cfg.rl, "credit", "") == "infopo":
            raise ConfigError("config key 'rl.credit': infopo needs a scoring pass over the whole batch on one "
                              "process; it is not supported with more than one process yet")
        try:
            step_fn.local_rows_multiple()
        except ValueError as e:
            raise ConfigError(f"config section 'mesh': {e}") from None
    abs_state, shardings = state_shardings(model_config, tx, mesh)
    ckpt = Checkpointer(workdir, keep=cfg.checkpoint.keep, async_save=cfg.checkpoint.async_save)
    latest, state, data_state = restore_latest(ckpt, abs_state, shardings, run_dict, log, cfg.checkpoint.fallback)
    if latest is None:
        params = initial_params(cfg, model_config, mesh, shardings["params"], log)
        init = jax.jit(lambda p, r: init_train_state(p, tx, r), out_shardings=shardings, donate_argnums=(0,))
        state = init(params, jax.random.fold_in(jax.random.key(cfg.train.seed), 1))
        if jax.process_index() == 0:
            with open(os.path.join(workdir, "run_config.json"), "w") as f:
                json.dump(run_dict, f, indent=2)
    else:
        log(f"resume: {workdir} from step {latest}")
    ref_params = None
    if getattr(cfg.rl, "kl_coef", 0.0) > 0:  # the reference policy: the run's initial weights, never updated
        ref_params = initial_params(cfg, model_config, mesh, shardings["params"], log)
    return RLRun(cfg, model_config, mesh, schedule, step_fn, ckpt, state, latest, data_state, run_dict, ref_params)


def step_seed(seed: int, step: int) -> int:
    """The rollout seed of RL step `step` (0-based): a pure function of (train.seed, step), so resumes match.

    Multi-process contract: the seed does not depend on the process. Every process draws the same task list
    (identical samplers), runs the tasks of `process_share`, and each episode's seeds derive from (this seed, the
    task's GLOBAL group index, its GLOBAL rollout id, turn) -- so the union of the processes' episodes is the
    episode set of a one-process run, and a run is reproducible for any fixed process count (the updates equal
    the one-process run's up to fp32 summation order: the packed rows are laid out per process)."""
    return int(np.random.SeedSequence([seed, step + 1]).generate_state(1)[0])


# ------------------------------------------------------------------------------------------ multi-process
def is_primary() -> bool:
    return jax.process_index() == 0


def primary_log(log):
    """`log` on process 0, a no-op elsewhere (every process computes the same numbers)."""
    return log if is_primary() else (lambda *a, **k: None)


def process_share(n: int) -> list[int]:
    """The GLOBAL indices of a step's n tasks that this process runs: i with i % process_count == process_index.
    Whole GRPO groups stay on their process (every rollout of task i runs there), so group statistics (Eq 4-5
    advantages, FoldGRPO's unique-rollout counts) are exact locally; interleaving spreads the consecutive groups
    of each PPO mini-batch over the processes."""
    p, i = jax.process_count(), jax.process_index()
    return [k for k in range(n) if k % p == i]


def gather_list(items: Sequence) -> list:
    """Every process's JSON-ready `items`, concatenated in process order (the list itself on one process)."""
    if jax.process_count() == 1:
        return list(items)
    return [x for part in gather_json(list(items)) for x in part]


def global_groups(local_ids: Sequence[int]) -> list[int]:
    """The sorted union over processes of group ids (e.g. the groups kept for training)."""
    return sorted({int(g) for g in gather_list(list(local_ids))})


def rollout_params(params):
    """The parameters the sampler uses. One process: the sharded training parameters as they are. Several: a
    process-local copy (gathered from every process's shards, on this process's first device), because each
    process samples its own episodes and a computation over the global arrays would need every process to run
    it with the same inputs."""
    if jax.process_count() == 1:
        return params
    from jax.experimental import multihost_utils

    full = multihost_utils.process_allgather(params, tiled=True)
    return jax.device_put(full, jax.local_devices()[0])


def step_array(step: int, mesh):
    """The train state's step counter as a replicated (global) array, as a checkpoint on many hosts needs."""
    from jax.sharding import NamedSharding, PartitionSpec

    return jax.device_put(np.asarray(step, np.int32), NamedSharding(mesh, PartitionSpec()))


ABORT_ENV = "MIMESIS_ABORT_AFTER_STEP"


def abort_if_requested(step: int, ckpt: Checkpointer) -> None:
    """Crash-test hook: with $MIMESIS_ABORT_AFTER_STEP=k the process exits abruptly (os._exit(75), no clean-up)
    right after step k's checkpoint is on disk, as a killed job would; rerunning resumes from it."""
    k = os.environ.get(ABORT_ENV, "")
    if k and step == int(k):
        ckpt.wait()
        os._exit(75)


def ppo_updates(run: RLRun, chunks: Sequence[tuple[Sequence, Sequence]], *, row_len: int | None = None
                ) -> tuple[dict, list[dict]]:
    """One RL step's optimizer updates, one per mini-batch: chunks = [(trajectories, advantages per trajectory's
    agent turns)]. Old log-probs are fixed for the whole step BEFORE the first update (the sampler's, or
    recomputed with the pre-update parameters), so ratios move from the second mini-batch on (Eq 5-6).
    Returns (the new state, each update's metrics on the host)."""
    from mimesis_jax.algorithms import rl_batch
    from mimesis_jax.algorithms.rl_batch import pack_trajectories

    rl, step_fn, state = run.cfg.rl, run.step_fn, run.state
    teacher = rl.teacher if rl.alpha > 0 else "none"
    multi = jax.process_count() > 1
    batches = []
    for trajs, adv in chunks:
        packed = None
        if len(trajs):
            packed = pack_trajectories(trajs, adv, teacher=teacher, loss_agg=rl.loss_agg,
                                       use_rollout_logprobs=rl.old_logprobs == "rollout",
                                       rows_multiple=step_fn.local_rows_multiple() if multi else
                                       step_fn.rows_multiple(), row_len=row_len)
        if multi:  # this process's share of the mini-batch, in the shapes and normalisers all processes agree on
            layout = rl_batch.common_layout(gather_json(rl_batch.layout_info(packed)), step_fn.local_rows_multiple())
            local = rl_batch.split_microbatches(rl_batch.conform(packed, layout, rl.loss_agg), rl.num_microbatches)
            batch = step_fn.place(local, process_local=True)
        else:
            batch = step_fn.place(packed)
        batches.append(jax.block_until_ready(batch))  # nothing in flight while the step compiles
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
