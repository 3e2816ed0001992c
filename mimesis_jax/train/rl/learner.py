"""The RL stage loop, written once: `RLLearner.run` resumes, samples, filters, updates, validates, checkpoints,
logs and stops on SIGTERM over a stage's three pieces (train/rl/seams.py): its World (tasks, episodes, group
filter, step record, validation, data state), its Cluster (the frozen models, the policy sampler's shapes) and its
Algorithm (credit assignment; the loss is the run config's `rl` section). Stage II (train/rl/agent.py) and Stage
I.3 (train/rl/simulator.py) are written as such pieces; docs/api.md ("Writing your own RL stage") shows a toy one.

    result = RLLearner(cfg, workdir, world=MyWorld(), cluster=Cluster(), algorithm=GRPO()).run()

The loop calls the learner's hooks (`RLLearner`: read_inputs, draw, rollouts, filter_groups, prepare_groups,
advantages, record, ...), each of which forwards to its piece; a subclass may override a hook instead.

One step: draw `rollout.prompts_per_step` items; run `rollout.group_size` rollouts of each (the policy samples
through one generator for the run, `chat_models.policy_model`, whose weights follow each update with
`set_params(..., version=step)`; every rollout gets a rollout id never used before in the run, every seed
derives from (train.seed, step, rollout id)); the stage drops invalid rollouts and skips groups left too small
(counted, never trained); the kept groups, in the global group-id order (`global_minibatch_order`), are cut into
PPO mini-batches of `rollout.mini_batch_prompts` groups with the stage's advantages; `ppo_updates` fixes the old
log-probs for the whole step BEFORE the first update, then makes one optimizer update per mini-batch (Eq 5-6,
train/rl/step.py; with rl.max_staleness > 0 and rl.async_early_updates each mini-batch is updated as soon as its
groups are in, its old log-probs those of the step's start weights: `learn_parts`); the step's record is logged
(metrics.jsonl, `stdout_keys` on the console), validation runs every `validation.every` steps, and a checkpoint is
written every `checkpoint.every` steps, at the end and on SIGTERM (a learner built with save_checkpoints=False, as
`rehearse` builds it, writes one on SIGTERM only).

Step shapes. With rollout.row_len fixed (both stages' paper configs) every mini-batch is packed to one program of
the run's shape ladder (`run_ladder`: train/rl/ladder.py ladder_for_config; at most 3 GRPO / 6 CSD programs per head rung
(CSD: and branch-head rung), rows at rollout.row_rungs of one row per dialogue). A stage may fix the policy
sampler's shapes too (`policy_buckets`; Stage I.3: one sampler program per run, Stage II: one per prompt rung, at
most 4). Each step's record carries `num_compilations`, the programs this process has compiled so far in the run
(jax's compile events), and its parts (`compilation_record`): compilations/update (RLStep.num_compilations),
compilations/old_logprobs (the pre-update scoring of rl.old_logprobs=recompute), compilations/sampler (the static
sampler's programs: the policy's and those of in-process frozen models) and compilations/engine (the rollout
engines' prefill and decode programs). A resumed process counts from 0. `pad/row_fraction` and
`pad/head_fraction` (`pad_counts`): the fractions of the step's trunk slots (rows x row_len) and LM-head slots
(rows x head) that are padding, over the whole update batches (summed over the processes); with the fused CSD
teacher also `pad/branch_head_fraction`, of the teacher's LM-head slots (rows x branch_head) against the coached
tokens.

Learning rate. The schedule (train/optim.py, over train.steps x updates per step) is indexed by the optimizer
updates actually applied, the count optax keeps in the optimizer state (so it is checkpointed and resumes
exactly): a step whose groups were all skipped makes no update and does not advance it, and a step with fewer
kept groups makes fewer updates. The logged `lr` is the rate the step's last update applied, computed in the
update from that same count (train/rl/step.py), with `opt_steps` the updates applied so far; a step without an
update logs neither.

Metrics without a host sync per step. The update metrics stay on the device (on CPU the loop still waits for each
update: sharded CPU programs are never queued) and are fetched to the host in one transfer every
`train.metrics_sync_every` steps, and always before a validation, a checkpoint (so SIGTERM, a crash after a
checkpoint and a resume lose no row) and at the end; each row is written with its own step number, so the file
is the same whatever the setting. With a setting > 1 on an accelerator the host does not wait for the updates,
so `train_s` is the host's time of the update phase (packing, dispatch) and `train_tokens_per_s` is not logged.

Checkpoints (checkpoints.py) hold params, optimizer state, step, RNG and the data state (the stage's sampler, the
next rollout id and the stage's own counters), so a resumed run reproduces the uninterrupted run's per-step
metrics; with rl.max_staleness > 0 also the earlier policy versions the steps in flight past them sampled with
(`keep_version`, `checkpoint_step`; the replay on resume: async_rollouts.py "Resume"). SIGTERM (or a first Ctrl-C, or the checkpoint manager's preemption notice) finishes the current step,
saves and returns with preempted=True. The run skeleton (validation, mesh, checkpointer, restore or init, metrics
logger, stop flag, saves, cleanup) is train/run.py `Run`, shared with the LM loop; `setup` returns an RLRun, a Run
with the update. Its non-finite-loss guard runs on each step's mean update loss and grad norm when the metrics are
fetched, so before that step's checkpoint: a non-finite one stops the run with NonFiniteLossError
(train.nonfinite=stop; `skip` is a ConfigError, the RL update having no skip).

`setup` builds (or resumes) the training state in a workdir; in `ppo_updates` each process packs its own part of
each mini-batch, the processes agree on shapes and on the loss normalisers (rl_batch.layout_info / common_layout /
conform) and the global batch is assembled from the process-local rows (RLStep.place(process_local=True)); no
process holds the whole batch (the rest of the multi-process contract: train/rl/distributed.py). Episode seeds
depend on global task indices and rollout ids only, so a P-process run samples the episodes of the one-process run
and its updates equal it up to fp32 summation order; resuming needs the same P.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import time
from typing import Any, Sequence

import jax
import numpy as np

from mimesis_jax import config as config_lib, profiling, timeline
from mimesis_jax.algorithms import rl_batch
from mimesis_jax.checkpoints import Checkpointer, gather_json
from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.errors import ConfigError
from mimesis_jax.episodes.progress import TurnReporter
from mimesis_jax.train.optim import make_optimizer, make_schedule
from mimesis_jax.train.rl import async_rollouts, distributed
from mimesis_jax.train.rl.async_rollouts import (DEVICE_LOCK, Drawn, Guarded, Produced, RolloutProducer,
                                                  StepRollouts, own_copy)
from mimesis_jax.train.rl.chat_models import EngineMeter, engine_of, policy_model, policy_params, vllm_sync_record
from mimesis_jax.train.rl.ladder import ladder_for_config
from mimesis_jax.train.rl.seams import GRPO, Algorithm, Cluster, World
from mimesis_jax.train.rl.step import DECOUPLED_METRICS, make_rl_step
from mimesis_jax.train.run import Run
from mimesis_jax.train.state import initial_params, state_shardings
from mimesis_jax.train.step import init_train_state

VALIDATION_SEED = 12345  # the sampling seed of every validation pass (temperature `validation.temperature`)


def load_stage_config(path: str, overrides, kind):
    """The run config of an RL stage (`kind`: AgentRLConfig / SimRLConfig) from `path` + --set overrides; a config
    class's own ValueError becomes a ConfigError naming the file."""
    try:
        return config_lib.load_config(path, overrides, kind=kind)
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{path}: {e}") from None


def mean_or_zero(xs) -> float:
    """The mean of `xs` as a float, 0.0 for none (a step's metric over possibly no episodes)."""
    xs = [float(x) for x in xs]
    return float(np.mean(xs)) if xs else 0.0

# the spans whose share of each step's wall time is logged (docs/stage2.md "Busy fractions"): the training
# devices' optimizer updates, the rollout side's generations
BUSY_SPANS = {"update": "pool_busy/train", "agent turn": "pool_busy/rollout"}
BUSY_KEYS = tuple(BUSY_SPANS.values())


def busy_record(fractions: dict) -> dict:
    """The step record's busy fractions from `timeline.Busy.fractions` over the step's wall-clock window."""
    return {key: float(fractions[kind]) for kind, key in BUSY_SPANS.items()}


SCORE_PROGRAM = "_score_fn"  # RLStep's old-log-prob scoring (rl.old_logprobs = "recompute")
SAMPLER_PROGRAM = "generate_bucket"  # inference/sampler.py
ENGINE_PROGRAMS = ("prefill_program", "decode_program", "copy_state_program")  # inference/engine_programs.py


def compilation_record(step_fn, compiled) -> dict:
    """`num_compilations` and its parts (module docstring, Step shapes): the update's programs from
    RLStep.num_compilations, the others from `compiled` (a profiling.Compilations over the run so far)."""
    parts = {"update": step_fn.num_compilations, "old_logprobs": compiled.count_of(SCORE_PROGRAM),
             "sampler": compiled.count_of(SAMPLER_PROGRAM),
             "engine": sum(compiled.count_of(n) for n in ENGINE_PROGRAMS)}
    return {"num_compilations": sum(parts.values()), **{f"compilations/{k}": v for k, v in parts.items()}}


COMPILATION_KEYS = ("num_compilations", "compilations/update", "compilations/old_logprobs", "compilations/sampler",
                    "compilations/engine")  # per process: what a resumed run's records differ in


UPDATE_METRICS = ("loss", "grpo_loss", "csd_loss", "mean_w", "frac_delta_pos", "clip_frac", "entropy", "approx_kl",
                  "grad_norm")


class RLRun(Run):
    """An RL stage's run (train/run.py `Run`) with its update: schedule, step_fn (train/rl/step.RLStep) and
    ref_params (the KL reference, the initial weights, when rl.kl_coef > 0)."""

    schedule: Any = None
    step_fn: Any = None
    ref_params: Any = None

    def training_devices(self):
        """The training mesh's devices: all but each process's rollout pool (`rollout.devices`,
        distributed.training_devices)."""
        return distributed.training_devices(self.cfg.rollout)


def setup(cfg, workdir: str, tok, log=print) -> RLRun:
    """Validates `cfg`, builds mesh / optimizer / step, and restores the latest checkpoint of `workdir` or
    initialises the state (writing run_config.json): the Run skeleton's first steps (train/run.py). `cfg` has the
    RL run-config fields (model, tokenizer, init, rl, optimizer, train, mesh, checkpoint) and `updates_per_step()`;
    train.nonfinite=skip is a ConfigError (an RL update cannot be skipped)."""
    run = RLRun(cfg, workdir, log=log, skips=False)
    run.prepare(tok)
    cfg, model_config, mesh = run.cfg, run.model_config, run.mesh
    total_updates = cfg.train.steps * cfg.updates_per_step()
    tx = make_optimizer(cfg.optimizer, total_updates, model_config)
    run.schedule = make_schedule(cfg.optimizer, total_updates)
    run.step_fn = make_rl_step(model_config, tx, mesh, cfg.rl, schedule=run.schedule)
    if jax.process_count() > 1:
        if getattr(cfg.rl, "credit", "") == "infopo":
            raise ConfigError("config key 'rl.credit': infopo needs a scoring pass over the whole batch on one "
                              "process; it is not supported with more than one process yet")
        try:
            run.step_fn.local_rows_multiple()
        except ValueError as e:
            raise ConfigError(f"config section 'mesh': {e}") from None
    abs_state, shardings = state_shardings(model_config, tx, mesh)
    init = jax.jit(lambda p, r: init_train_state(p, tx, r), out_shardings=shardings, donate_argnums=(0,))
    run.restore_or_init(abs_state, shardings, init)
    if getattr(cfg.rl, "kl_coef", 0.0) > 0:  # the reference policy: the run's initial weights, never updated
        run.ref_params = initial_params(cfg, model_config, mesh, shardings["params"], log)
    return run


ABORT_ENV = "MIMESIS_ABORT_AFTER_STEP"


def abort_if_requested(step: int, ckpt: Checkpointer) -> None:
    """Crash-test hook: with $MIMESIS_ABORT_AFTER_STEP=k the process exits abruptly (os._exit(75), no clean-up)
    right after step k's checkpoint is on disk, as a killed job would; rerunning resumes from it."""
    k = os.environ.get(ABORT_ENV, "")
    if k and step == int(k):
        ckpt.wait()
        os._exit(75)


HANG_ENV = "MIMESIS_HANG_IN_ROLLOUTS"


def hang_if_requested(step: int, workdir: str) -> None:
    """Crash-test hook (tests/test_async_kill.py): with $MIMESIS_HANG_IN_ROLLOUTS=k the rollouts of step k (numbered
    as logged, from 1), once drawn, write WORKDIR/hanging-in-rollouts-k and wait to be killed (after an hour the
    process exits abruptly, os._exit(75)): a kill point with that step in flight, whatever the timing."""
    k = os.environ.get(HANG_ENV, "")
    if k and step == int(k):
        with open(os.path.join(workdir, f"hanging-in-rollouts-{step}"), "w"):
            pass
        time.sleep(3600)
        os._exit(75)


def fetch_metrics(tree):
    """Device metrics -> host values: the loop's only transfer of update metrics (one per flush)."""
    return jax.device_get(tree)


def on_cpu(run: RLRun) -> bool:
    """Whether the run's mesh is CPU devices (whose sharded programs must never be queued)."""
    return run.mesh.devices.flat[0].platform == "cpu"


def waits_for_updates(run: RLRun) -> bool:
    """Whether the host waits for every update: on CPU (sharded CPU programs are never queued) or with
    train.metrics_sync_every = 1 (the metrics are fetched every step anyway)."""
    return run.cfg.train.metrics_sync_every == 1 or on_cpu(run)


def pack_minibatch(run: RLRun, trajs: Sequence, adv: Sequence, *, row_len: int | None,
                   ladder: rl_batch.ShapeLadder | None):
    """One mini-batch of `ppo_updates` packed and placed on the devices (this process's share of it with several
    processes), ready; with the padding counts of the whole mini-batch (`pad_counts`)."""
    rl, step_fn = run.cfg.rl, run.step_fn
    teacher = rl.teacher if rl.alpha > 0 else "none"
    multi = jax.process_count() > 1
    packed = None
    if len(trajs):
        packed = rl_batch.pack_trajectories(trajs, adv, teacher=teacher, loss_agg=rl.loss_agg,
                                            use_rollout_logprobs=rl.old_logprobs == "rollout",
                                            behaviour_logprobs=rl.behavior_is_cap > 0,
                                            rows_multiple=step_fn.local_rows_multiple() if multi else
                                            step_fn.rows_multiple(), row_len=None if ladder else row_len,
                                            ladder=ladder)
    if multi:  # this process's share of the mini-batch, in the shapes and normalisers all processes agree on
        layout = rl_batch.common_layout(gather_json(rl_batch.layout_info(packed)), step_fn.local_rows_multiple(),
                                        ladder)
        local = rl_batch.split_microbatches(rl_batch.conform(packed, layout, rl.loss_agg), rl.num_microbatches)
        batch = step_fn.place(local, process_local=True)
    else:
        batch = step_fn.place(packed)
    counts = pad_counts(local if multi else packed.arrays)
    if multi:  # the whole mini-batch's padding: every process logs the same record
        shares = gather_json(counts)
        counts = {k: sum(c[k] for c in shares) for k in PAD_KEYS}
    return jax.block_until_ready(batch), counts  # nothing in flight while the step compiles


def ppo_updates(run: RLRun, chunks: Sequence[tuple[Sequence, Sequence]], *, row_len: int | None = None,
                ladder: rl_batch.ShapeLadder | None = None, lock=None, old_params=None, first: int = 0,
                step: int | None = None) -> tuple[dict, list[dict]]:
    """One RL step's optimizer updates, one per mini-batch: chunks = [(trajectories, advantages per trajectory's
    agent turns)]. Old log-probs are fixed for the whole step BEFORE the first update (the sampler's, or
    recomputed with the pre-update parameters), so ratios move from the second mini-batch on (Eq 5-6).
    ladder: pack every mini-batch to one of its programs (rl_batch.ShapeLadder; row_len is then the ladder's).
    lock: held around each program until its outputs are ready, when rollouts sample beside the updates on the same
    devices (async_rollouts.DEVICE_LOCK); None: the synchronous loop, or rollouts on a pool of their own
    (`rollout.devices`), nothing held.
    old_params: the weights the old log-probs are recomputed with (default: the state's, before these updates);
    the step's later mini-batches of `RLLearner.learn_parts` pass a copy of the weights at the step's start.
    first, step: the first update's mini-batch index in its step and the step (1-based), for the timeline.
    Returns (the new state, each update's metrics as device arrays: `fetch_metrics` brings them to the host)."""
    rl, step_fn, state = run.cfg.rl, run.step_fn, run.state
    batches, pads = [], []
    for trajs, adv in chunks:
        with timeline.span("pack", trajectories=len(trajs)):
            batch, counts = pack_minibatch(run, trajs, adv, row_len=row_len, ladder=ladder)
        pads.append(counts)
        batches.append(batch)
    held = contextlib.nullcontext() if lock is None else lock
    if rl.old_logprobs == "recompute":  # pi_old = the parameters before this step's updates
        with held, timeline.span("old logprobs", minibatches=len(batches)):
            batches = [step_fn.recompute_old_logprobs(state["params"] if old_params is None else old_params, b)
                       for b in batches]
            if lock is not None:
                jax.block_until_ready(batches)
    params, opt_state = state["params"], state["opt_state"]
    cpu = on_cpu(run)
    ms = []
    for i, (b, counts) in enumerate(zip(batches, pads)):
        with held, timeline.span("update", minibatch=first + i, **({} if step is None else {"step": step})):
            params, opt_state, m = step_fn(params, opt_state, b, ref_params=run.ref_params)
            if cpu or lock is not None:
                jax.block_until_ready(m)  # waits (no transfer): never queue sharded CPU steps
        m = dict(m, **counts)  # host ints: the padding of the update's batch (pad_counts)
        ms.append(m)
    if ms and waits_for_updates(run):  # train_s then covers the updates' device time (the last one ends last)
        jax.block_until_ready(ms[-1])
    return dict(state, params=params, opt_state=opt_state), ms


PAD_KEYS = ("pad_rows_real", "pad_rows_slots", "pad_head_real", "pad_head_slots", "pad_branch_head_real",
            "pad_branch_head_slots")


def steps_at_once(cfg) -> int:
    """How many steps' rollouts run at once: rl.max_staleness + 1 (every admitted step's, on a rollout pool or on
    shared devices, train/rl/async_rollouts.py; one in the synchronous loop)."""
    return cfg.rl.max_staleness + 1


def pad_counts(arrays: dict) -> dict:
    """The padding of one update's packed host arrays (any leading axes: [B, ...] or [M, B/M, ...]): real trunk
    tokens (segment id > 0) and trunk slots (rows x row_len), real LM-head positions (agent tokens) and head slots
    (rows x head_idx width), and with fused CSD branches the teacher's: coached tokens and branch-head slots (rows x
    branch_head_idx width; 0 and 0 without). The step record's pad/* fractions (`update_record`) come from their
    sums."""
    fused = "branch_head_idx" in arrays
    return {"pad_rows_real": int((arrays["segment_ids"] > 0).sum()), "pad_rows_slots": int(arrays["tokens"].size),
            "pad_head_real": int(arrays["agent_mask"].sum()), "pad_head_slots": int(arrays["head_idx"].size),
            "pad_branch_head_real": int(arrays["coached_mask"].sum()) if fused else 0,
            "pad_branch_head_slots": int(arrays["branch_head_idx"].size) if fused else 0}


def run_ladder(run: RLRun) -> rl_batch.ShapeLadder | None:
    """The shape ladder this process packs its mini-batch shares to (ladder.ladder_for_config; None: the fine
    ladders)."""
    multi = jax.process_count() > 1
    multiple = run.step_fn.local_rows_multiple() if multi else run.step_fn.rows_multiple()
    return ladder_for_config(run.cfg, multiple, jax.process_count())


def update_record(ms: list[dict], train_s: float | None) -> dict:
    """Mean update metrics of one step (0.0 when it made no update), how many updates it made, the last update's
    clip fraction, the lr it applied and the updates applied so far (when the step reports them: a step without an
    update has no lr), the fractions of padding of its batches (pad/*, from `pad_counts`) and the trained tokens
    per second of `train_s` (None: the update time was not measured)."""
    rec = {k: (float(np.mean([float(m[k]) for m in ms if k in m])) if any(k in m for m in ms) else 0.0)
           for k in UPDATE_METRICS}
    rec.update({k: float(np.mean([float(m[k]) for m in ms])) for k in DECOUPLED_METRICS if ms and k in ms[0]})
    rec["updates"] = len(ms)
    if ms:
        rec["clip_frac_last"] = float(ms[-1]["clip_frac"])
        if "lr" in ms[-1]:
            rec["lr"] = float(ms[-1]["lr"])
            rec["opt_steps"] = int(ms[-1]["opt_steps"])
        if all(k in m for m in ms for k in PAD_KEYS):  # the fraction of padding (0: none) of the step's batches
            tot = {k: sum(int(m[k]) for m in ms) for k in PAD_KEYS}
            rec["pad/row_fraction"] = 1 - tot["pad_rows_real"] / max(1, tot["pad_rows_slots"])
            rec["pad/head_fraction"] = 1 - tot["pad_head_real"] / max(1, tot["pad_head_slots"])
            if tot["pad_branch_head_slots"]:  # the CSD teacher's LM head (fused branches)
                rec["pad/branch_head_fraction"] = 1 - tot["pad_branch_head_real"] / tot["pad_branch_head_slots"]
        if train_s is not None:
            rec["train_tokens_per_s"] = sum(float(m["agent_tokens"]) for m in ms) / max(train_s, 1e-9)
    return rec


def global_minibatch_order(kept: list[list]) -> list[list]:
    """The kept groups of ALL processes in group-id order, this process's groups in their place and [] for the
    groups other processes hold: every process then cuts the same PPO mini-batches (`rollout.mini_batch_prompts`
    consecutive groups) and packs its own part of each. One process: `kept` unchanged."""
    if jax.process_count() == 1:
        return kept
    mine = {g[0].group_id: g for g in kept}
    return [mine.get(gid, []) for gid in distributed.global_groups(list(mine))]


def staleness_of(trained: list, step: int) -> dict:
    """The step record's staleness metrics (async_rollouts.staleness_summary) over the trained tokens of EVERY
    process: each process counts its own groups' tokens per staleness, the counts are summed."""
    counts = async_rollouts.staleness_counts(trained, step)
    if jax.process_count() > 1:
        summed: dict[int, int] = {}
        for k, c in distributed.gather_list(sorted(counts.items())):
            summed[int(k)] = summed.get(int(k), 0) + int(c)
        counts = summed
    return async_rollouts.staleness_summary(counts)


# ------------------------------------------------------------------------------------------ the loop
@dataclasses.dataclass
class RLResult:
    workdir: str
    start_step: int
    final_step: int
    metrics: dict[int, dict]  # step -> the logged record, for the steps run in this call
    preempted: bool
    checkpoint_step: int | None


class RLLearner:
    """One RL stage's run in a workdir (module docstring) over its three pieces (train/rl/seams.py): `world`
    (tasks, episodes, groups, record, validation, data state), `cluster` (the frozen models and the policy
    sampler's shapes) and `algorithm` (credit assignment). `run` calls the hooks below in this order:
    read_inputs, (setup), on_setup, restore, open_models, banner, then per step draw, rollouts, filter_groups,
    prepare_groups, advantages (per mini-batch), record, validate (when due), data_state; close at the end. Each
    hook forwards to its piece; a subclass may override a hook instead (tests' scripted stages do)."""

    stage = "rl"  # the metrics' stage name and the log prefix ("agentrl", "simrl")
    policy_name = "policy"  # the trained policy's chat-model name
    stdout_keys: tuple = ()  # the record's keys printed on the console

    def __init__(self, cfg, workdir: str, *, world: World | None = None, cluster: Cluster | None = None,
                 algorithm: Algorithm | None = None, tokenizer=None, handle_signals: bool = True, on_rollouts=None,
                 log=print, save_checkpoints: bool = True):
        self.cfg, self.workdir = cfg, os.path.abspath(workdir)
        self.handle_signals, self.on_rollouts = handle_signals, on_rollouts
        self.save_checkpoints = save_checkpoints  # False: no checkpoint but on SIGTERM (a run that keeps nothing)
        self.log = distributed.primary_log(log)
        self.tok = tokenizer if tokenizer is not None else load_tokenizer(cfg.tokenizer.name)
        self.run_state: RLRun | None = None
        self.source = None  # where the steps' rollouts come from (`rollout_source`), while `run` runs
        self.lagged: dict[int, Any] = {}  # rl.max_staleness > 0: version -> a copy of its weights (`keep_version`)
        self.groups_in_flight = 0  # at the last update's start: groups started and not trained, beyond its own
        self.step_start = None  # `learn_parts`: the kept copy of the weights at the step's start (`start_params`)
        self.deferred: list[int] = []  # versions whose publication waits for the steps before them (`publish_due`)
        self.world = (world or World()).bind(self)
        self.cluster = (cluster or Cluster()).bind(self)
        self.algorithm = (algorithm or GRPO()).bind(self)

    # ---------------------------------------------------------------------------------- the hooks (seams.py)
    def read_inputs(self) -> None:
        self.world.read_inputs()

    def on_setup(self) -> None:
        self.world.on_setup()

    def restore(self, data_state: dict) -> None:
        self.world.restore(data_state)

    def data_state(self) -> dict:
        return self.world.data_state()

    def num_validation(self) -> int:
        return self.world.num_validation()

    def has_validation(self) -> bool:
        return self.world.has_validation()

    def policy_max_tokens(self) -> int:
        return self.cluster.policy_max_tokens()

    def policy_buckets(self, in_flight: int):
        return self.cluster.policy_buckets(in_flight)

    def open_models(self, in_flight: int) -> None:
        self.cluster.open(in_flight)

    def banner(self, start: int) -> str:
        return self.world.banner(start)

    def draw(self, n: int) -> list:
        return self.world.draw(n)

    def rollouts(self, model, items: list, **kw) -> list:
        return self.world.rollouts(model, items, **kw)

    def filter_groups(self, outs: list) -> tuple[list[list], dict]:
        return self.world.filter_groups(outs)

    def prepare_groups(self, kept: list[list], counts: dict) -> None:
        self.algorithm.prepare(kept, counts)

    def advantages(self, items: list, counts: dict) -> tuple[Sequence, Sequence]:
        return self.algorithm.advantages(items, counts)

    def record(self, outs: list, kept: list[list], counts: dict, times: dict) -> dict:
        return self.world.record(outs, kept, counts, times)

    def validate(self, model, label: str) -> dict:
        return self.world.validate(model, label)

    def engines(self) -> dict:
        return self.cluster.engines()

    def close(self) -> None:
        self.cluster.close()

    # ---------------------------------------------------------------------------------- helpers for the hooks
    def progress(self, label: str):
        """A TurnReporter for the console when train.progress_bar is on (process 0), else None."""
        return TurnReporter(label) if self.cfg.train.progress_bar and jax.process_index() == 0 else None

    # ---------------------------------------------------------------------------------- the loop
    def produce(self, policy, step: int, first_rid: int, deliver=None, *, keep_sampler: bool = False) -> Produced:
        """Step `step`'s draw and rollouts (rollout ids from `first_rid`; every process counts the rollouts of all
        processes). keep_sampler: with a copy of the data sampler's state right after the draw (what a checkpoint
        after this step keeps when the draws run ahead of the updates). deliver: the rollouts in parts
        (`step_rollouts`)."""
        r = self.cfg.rollout
        started = time.perf_counter()
        with timeline.track("rollouts"), timeline.span("rollouts", step=step + 1):  # steps numbered as logged
            drawn = self.draw(r.prompts_per_step)
            kept = async_rollouts.snapshot(self.data_state()["sampler"]) if keep_sampler else None
            outs = self.step_rollouts(policy, step, drawn, first_rid, deliver, track="rollouts")
        return Produced(step, outs, first_rid + len(drawn) * r.group_size, kept, started, time.perf_counter())

    def step_rollouts(self, policy, step: int, items: list, first_rid: int, deliver=None, *, track: str) -> list:
        """The rollouts of step `step`'s drawn `items` (item i: group step x prompts_per_step + i, rollout ids from
        `first_rid`). deliver (rl.async_early_updates, async_rollouts.RolloutProducer.deliver): in parts, one per
        PPO mini-batch (rollout.mini_batch_prompts consecutive items), each rolled as a batch of its own, all at
        once, each in a thread of its own (timeline track `<track> part <k>`); every part is handed over with
        `deliver(step, part, outcomes, last)` in part order as soon as it and the parts before it are complete.
        The groups, rollout ids and seeds are those of one batch (`rollouts`' contract)."""
        cfg, r = self.cfg, self.cfg.rollout
        kw = dict(group_size=r.group_size, temperature=r.temperature, seed=distributed.step_seed(cfg.train.seed, step))
        label, first_group = f"{self.stage} step {step + 1} rollout", step * r.prompts_per_step
        hang_if_requested(step + 1, self.workdir)
        if deliver is None:
            return self.rollouts(policy, items, first_group=first_group, first_rid=first_rid, label=label, **kw)
        m = r.mini_batch_prompts
        starts = list(range(0, len(items), m))
        if not starts:
            deliver(step, 0, [], True)
            return []

        def part(k: int, i: int) -> list:
            with timeline.track(f"{track} part {k + 1}"), \
                    timeline.span("groups", step=step + 1, part=k, first_group=first_group + i):
                return self.rollouts(policy, items[i:i + m], first_group=first_group + i,
                                     first_rid=first_rid + i * r.group_size, label=f"{label} part {k + 1}", **kw)

        outs: list = []
        with concurrent.futures.ThreadPoolExecutor(len(starts), thread_name_prefix=f"rollouts-{step + 1}") as pool:
            futures = [pool.submit(part, k, i) for k, i in enumerate(starts)]
            for k, f in enumerate(futures):
                got = f.result()
                deliver(step, k, got, k == len(futures) - 1)
                outs += got
        return outs

    def draw_step(self, step: int, first_rid: int) -> Drawn:
        """Step `step`'s draw alone, with the data sampler's state right after it: what the producer takes in step
        order before the step's rollouts run beside other steps' (`roll`)."""
        r = self.cfg.rollout
        drawn = self.draw(r.prompts_per_step)
        kept = async_rollouts.snapshot(self.data_state()["sampler"])
        return Drawn(step, drawn, first_rid, first_rid + len(drawn) * r.group_size, kept)

    def roll(self, policy, d: Drawn, slots: int, deliver=None) -> Produced:
        """The rollouts of a drawn step (`draw_step`), on the timeline's track of its slot: up to `slots` steps
        roll at once, step j in slot j % slots ("rollouts", "rollouts 2", ...). deliver: in parts
        (`step_rollouts`)."""
        slot = d.step % slots
        track = "rollouts" if slot == 0 else f"rollouts {slot + 1}"
        started = time.perf_counter()
        with timeline.track(track), timeline.span("rollouts", step=d.step + 1):
            outs = self.step_rollouts(policy, d.step, d.items, d.first_rid, deliver, track=track)
        return Produced(d.step, outs, d.next_rid, d.sampler_state, started, time.perf_counter())

    def rollout_source(self, policy, start: int, next_rid: int, first_version: int | None = None):
        """Where the loop takes each step's rollouts from (train/rl/async_rollouts.py): inline (rl.max_staleness
        = 0) or a producer thread running up to rl.max_staleness versions ahead (its generator `Guarded`): every
        admitted step's rollouts at once (up to N + 1), on shared devices or a rollout pool. A resume
        that replays the in-flight steps (`first_version`, async_rollouts.py "Resume") starts the generator at
        that earlier version, from the kept copies (`keep_version`)."""
        rl, r, run_ = self.cfg.rl, self.cfg.rollout, self.run_state
        if rl.max_staleness == 0:
            return StepRollouts(lambda s, rid: self.produce(policy, s, rid), next_rid)
        first = start if first_version is None else first_version
        if distributed.pool_size(self.cfg.rollout):  # the rollouts on devices of their own: no turns, the pool's
            # weights its own copy; every admitted step's rollouts at once (up to N + 1), the draws in step order
            policy.generator = Guarded(policy.generator, device_lock=None)
            if first != start:
                policy.set_params(jax.block_until_ready(policy_params(run_.model_config, r, self.lagged[first],
                                                                      run_.mesh)), first)
            return RolloutProducer(lambda d, *deliver: self.roll(policy, d, rl.max_staleness + 1, *deliver),
                                   start=start, stop=self.cfg.train.steps, first_rid=next_rid,
                                   max_staleness=rl.max_staleness, fixed_lag=rl.async_deterministic, lock=None,
                                   draw=self.draw_step, published=first, parts=self.early_updates())
        if r.generator == "vllm":  # its decode takes no JAX device: a sync waits for the call in flight, not for the
            # device lock; no arrays held (each sync streams the weights into vLLM's child before it returns)
            policy.generator = Guarded(policy.generator, device_lock=contextlib.nullcontext())
            if first != start:
                policy.set_params(self.lagged[first], first)
        else:
            policy.generator = Guarded(policy.generator)
            with DEVICE_LOCK:  # the generator's weights must outlive the updates (own_copy)
                placed = own_copy(policy.params if first == start else
                                  policy_params(run_.model_config, r, self.lagged[first], run_.mesh))
            policy.set_params(placed, first)
        # every admitted step's rollouts at once here too (up to N + 1): their programs take turns with the
        # update's on the devices, their user waits overlap one another and the updates
        return RolloutProducer(lambda d, *deliver: self.roll(policy, d, rl.max_staleness + 1, *deliver),
                               start=start, stop=self.cfg.train.steps, first_rid=next_rid,
                               max_staleness=rl.max_staleness, fixed_lag=rl.async_deterministic, published=first,
                               draw=self.draw_step, parts=self.early_updates())

    def keep_version(self, version: int) -> None:
        """rl.max_staleness = N > 0: a copy of the weights of `version` (the next update donates them); the last
        N + 1 versions are kept, what a checkpoint after a later step saves for the steps in flight past it."""
        n = self.cfg.rl.max_staleness
        if not n:
            return
        lock = None if distributed.pool_size(self.cfg.rollout) else DEVICE_LOCK  # copies are multi-device programs
        with contextlib.nullcontext() if lock is None else lock:
            self.lagged[version] = own_copy(self.run_state.state["params"])
        for v in [v for v in self.lagged if v < version - n]:
            del self.lagged[v]

    def lagged_to_save(self, step: int) -> dict:
        """The kept versions a checkpoint after `step` saves: those before it the steps in flight may sample with
        (max(0, step - N) .. step - 1, as far as kept)."""
        n = self.cfg.rl.max_staleness
        return {v: p for v, p in sorted(self.lagged.items()) if step - n <= v < step}

    def restore_lagged(self, step: int) -> int | None:
        """On a resume with N > 0: the versions the checkpoint of `step` saved into the kept copies; returns the
        version to start the generator at (max(0, step - N)), or None when the checkpoint lacks any of them (a new
        schedule from `step`)."""
        run_, n = self.run_state, self.cfg.rl.max_staleness
        need = list(range(max(0, step - n), step))
        if not set(need) <= set(run_.data_state.get("lagged_versions", [])):
            self.log(f"resume: the checkpoint of step {step} holds no policy versions {need} (written with a smaller "
                     f"rl.max_staleness); the steps after it sample from version {step} on")
            return None
        params = run_.state["params"]
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params)
        self.lagged.update(run_.ckpt.restore_lagged(step, abstract, need))
        return need[0] if need else None

    def learn(self, got: Produced, ladder) -> tuple[list, list[list], dict, dict, list]:
        """One step's rollouts -> its updates: groups filtered and prepared (on_rollouts sees them), advantages per
        mini-batch, `ppo_updates` (taking turns on the devices with the rollouts when they run beside it). Returns
        (outs, kept, counts, times from the rollouts' arrival on, the updates' device metrics)."""
        run_, r, step = self.run_state, self.cfg.rollout, got.step
        times = {"rollouts": time.perf_counter()}
        kept, counts = self.filter_groups(got.outs)
        kept = global_minibatch_order(kept)
        with timeline.span("coach notes" if self.cfg.rl.alpha > 0 else "prepare groups", step=step + 1):
            self.prepare_groups(kept, counts)
        times["prepared"] = time.perf_counter()
        if self.on_rollouts is not None:
            self.on_rollouts(step + 1, got.outs)
        lock = self.source.lock
        with contextlib.nullcontext() if lock is None else lock, timeline.span("advantages", step=step + 1):
            # a credit may score on the devices (infopo)
            chunks = [self.advantages([t for g in kept[i:i + r.mini_batch_prompts] for t in g], counts)
                      for i in range(0, len(kept), r.mini_batch_prompts)]
            if lock is not None:
                jax.block_until_ready(chunks)
        times["advantages"] = time.perf_counter()
        ms: list[dict] = []
        self.groups_in_flight = self.source.started_after(step) * r.prompts_per_step
        if chunks:
            run_.state, ms = ppo_updates(run_, chunks, row_len=r.row_len or None, ladder=ladder, lock=lock)
        return got.outs, kept, counts, times, ms

    def early_updates(self) -> bool:
        """Whether a step's updates start before all its dialogues end (rl.max_staleness > 0 and
        rl.async_early_updates: `learn_parts`)."""
        return bool(self.cfg.rl.max_staleness) and self.cfg.rl.async_early_updates

    def take_step(self, step: int, ladder, policy) -> tuple[Produced, tuple, float]:
        """Step `step`'s rollouts and updates (`learn`, or `learn_parts` in parts): (its Produced, what `learn`
        returns, the seconds the loop waited for the rollouts)."""
        if self.early_updates():
            return self.learn_parts(step, ladder, policy)
        t = time.perf_counter()
        with timeline.span("wait for rollouts", step=step + 1):
            got = self.source.take(step)
        learned = self.learn(got, ladder)
        return got, learned, learned[3]["rollouts"] - t

    def learn_parts(self, step: int, ladder, policy) -> tuple[Produced, tuple, float]:
        """rl.async_early_updates: step `step`'s groups as the producer hands them over (`step_rollouts`: one
        mini-batch's groups per part, in group order), each part filtered and prepared as it comes, and each PPO
        mini-batch updated as soon as its rollout.mini_batch_prompts kept groups are in: the same mini-batches
        (consecutive kept groups in group order) and advantages as `learn`, the old log-probs recomputed with the
        step's start weights (the kept copy `lagged[step]`), so under the fixed lag the same updates as `learn`'s.
        Under the fixed lag the versions deferred by `publish_after` are published once the steps they wait for
        have all their parts (`publish_due`). Returns what `take_step` does; the times' marks are those of
        `learn` with the waits for later parts counted in neither coach_s nor train_s."""
        run_, r, lock = self.run_state, self.cfg.rollout, self.source.lock
        m, proximal = r.mini_batch_prompts, self.lagged[step]
        self.step_start = proximal
        outs, kept, queue, ms, counts = [], [], [], [], {}
        waited = prepared = scored = first_wait = 0.0
        part, last, first = 0, False, 0.0
        while not last:
            self.publish_due(policy, step - 1)  # the versions that admit this step's rollouts
            t = time.perf_counter()
            with timeline.span("wait for rollouts", step=step + 1, part=part):
                got, last = self.source.take_part(step, part)
            t2 = time.perf_counter()
            if part == 0:
                first, first_wait = t2, t2 - t
            waited, part = waited + (t2 - t), part + 1
            if last:
                self.publish_due(policy, step)
            groups, c = self.filter_groups(got)
            for k, v in c.items():
                counts[k] = counts[k] + v if k in counts else v
            groups = global_minibatch_order(groups)
            with timeline.span("coach notes" if self.cfg.rl.alpha > 0 else "prepare groups", step=step + 1):
                self.prepare_groups(groups, counts)
            outs, kept, queue = outs + got, kept + groups, queue + groups
            prepared += time.perf_counter() - t2
            if last and self.on_rollouts is not None:
                self.on_rollouts(step + 1, outs)
            while len(queue) >= m or (last and queue):
                t = time.perf_counter()
                with contextlib.nullcontext() if lock is None else lock, \
                        timeline.span("advantages", step=step + 1):
                    chunk = self.advantages([x for g in queue[:m] for x in g], counts)
                    if lock is not None:
                        jax.block_until_ready(chunk)
                scored, queue = scored + time.perf_counter() - t, queue[m:]
                if not ms:
                    self.groups_in_flight = self.source.started_after(step) * r.prompts_per_step
                run_.state, got_ms = ppo_updates(run_, [chunk], row_len=r.row_len or None, ladder=ladder, lock=lock,
                                                 old_params=proximal, first=len(ms), step=step + 1)
                ms += got_ms
        self.step_start = None
        times = {"rollouts": first, "prepared": first + prepared,  # coach_s: the parts' preparation only
                 "advantages": first + prepared + scored + (waited - first_wait)}  # train_s: the updates only
        return self.source.take(step), (outs, kept, counts, times, ms), waited

    def start_params(self):
        """The weights at the start of the current step's updates, for a credit that scores with them (InfoPO):
        the training state's, or during `learn_parts` (whose updates start before the last advantages) the kept
        copy."""
        return self.run_state.state["params"] if self.step_start is None else self.step_start

    def publish_after(self, policy, step: int) -> None:
        """The weights after step `step` (version `step`) to the generator: now, or with rl.async_early_updates
        under the fixed lag deferred (`publish_due`) so that the loop goes on with the next step's parts while the
        steps the version waits for still roll."""
        if self.early_updates() and self.cfg.rl.async_deterministic:
            self.deferred.append(step)
            return
        self.publish(policy, step)

    def publish_due(self, policy, upto: int | None = None) -> None:
        """The deferred versions (`publish_after`) whose fixed-lag wait covers steps up to `upto` only (version v
        waits for the steps up to v - 1 + rl.max_staleness, async_rollouts.RolloutProducer.publish), in version
        order, each from its kept copy; None: all of them (before a validation, which samples the newest)."""
        n, stop = self.cfg.rl.max_staleness, self.cfg.train.steps
        while self.deferred and (upto is None or min(self.deferred[0] - 1 + n, stop - 1) <= upto):
            v = self.deferred.pop(0)
            self.publish(policy, v, self.lagged[v])

    def publish(self, policy, version: int, params=None) -> None:
        """The updated weights to the policy's generator as `version` (after every step, also one without an
        update: its rollouts are then stamped with the version that trains them); `params`: the weights of an
        earlier version a resume replays (default: the training state's)."""
        run_, r = self.run_state, self.cfg.rollout
        lock = self.source.lock
        weights = run_.state["params"] if params is None else params

        def set_params():
            with timeline.span("weight sync", version=version):
                if not self.source.beside:
                    policy.set_params(policy_params(run_.model_config, r, weights, run_.mesh), version)
                    return
                if r.generator == "vllm":  # streamed into vLLM's child before set_params returns: no copy
                    placed = weights
                elif lock is None:  # a rollout pool: the weights copied into it (new buffers there), on their way
                    # before the next update donates the training arrays
                    placed = jax.block_until_ready(policy_params(run_.model_config, r, weights, run_.mesh))
                else:
                    with lock:  # the copies are multi-device programs
                        placed = own_copy(policy_params(run_.model_config, r, weights, run_.mesh))
                policy.set_params(placed, version)

        self.source.publish(version, set_params)

    def open_source(self, policy, start: int, next_rid: int, cleanup) -> None:
        """`self.source` (`rollout_source`), closed by `cleanup` (before the policy: the rollout in flight ends
        first); a resume of an asynchronous run first restores the versions its in-flight steps sampled with and
        replays them (async_rollouts.py "Resume")."""
        first = self.restore_lagged(start) if self.run_state.latest is not None and self.cfg.rl.max_staleness \
            else None
        self.keep_version(start)
        self.source = self.rollout_source(policy, start, next_rid, first)
        cleanup.callback(self.source.close)
        for v in range(start + 1 if first is None else first + 1, start + 1):
            self.publish(policy, v, self.lagged[v])

    def checkpoint_step(self, step: int, got: Produced, next_rid: int) -> None:
        """The checkpoint after `step`: the train state, the data state as of the step's own draw (`got`'s when
        the draws ran ahead), and with rl.max_staleness > 0 the versions the steps in flight sampled with."""
        data = self.data_state()
        sampler_state = data.pop("sampler")
        if got.sampler_state is not None:  # the draws ran ahead: the state after this step's draw
            sampler_state = got.sampler_state
        lagged = self.lagged_to_save(step)
        if self.cfg.rl.max_staleness:
            data["lagged_versions"] = sorted(lagged)
        # several processes with rollouts beside the loop: the checkpointer's barriers are programs over every
        # device (orbax's sync_global_devices), so they take turns with the sampler's (async_rollouts.DEVICE_LOCK)
        beside = self.cfg.rl.max_staleness and jax.process_count() > 1
        with DEVICE_LOCK if beside else contextlib.nullcontext():
            self.run_state.save(step, self.run_state.state,
                                {"sampler": sampler_state, "next_rollout_id": next_rid, **data}, lagged=lagged)

    def run(self) -> RLResult:
        self.read_inputs()
        run_ = self.run_state = setup(self.cfg, self.workdir, self.tok, self.log)
        self.cfg = cfg = run_.cfg
        self.on_setup()
        next_rid = 0
        if run_.latest is not None:
            self.restore(run_.data_state)
            next_rid = int(run_.data_state["next_rollout_id"])
        start = run_.start
        if run_.nothing_to_do():
            return RLResult(self.workdir, start, start, {}, False, run_.latest)

        r = cfg.rollout
        P = jax.process_count()
        # dialogues in flight at once on this process: a step's share of the groups, or the validation rollouts
        in_flight = max(-(-r.prompts_per_step // P) * r.group_size, -(-self.num_validation() // P))
        at_once = in_flight * steps_at_once(cfg)  # the engines' pools hold every step in flight at once
        step = start
        history: dict[int, dict] = {}
        pending: list[tuple[int, dict, list]] = []  # (step, host record, the step's device update metrics)
        sync_every, waited = cfg.train.metrics_sync_every, waits_for_updates(run_)
        ladder = run_ladder(run_)

        def flush(check: bool = True):  # one host transfer for the pending steps' update metrics, each row under
            # its own step; then the non-finite-loss guard on each step's mean update loss (train.nonfinite)
            fetched = iter(fetch_metrics([ms for _, _, ms in pending if ms]) if any(ms for _, _, ms in pending)
                           else [])
            for s, rec, ms in pending:
                rec.update(update_record(next(fetched) if ms else [], rec.get("train_s") if waited else None))
                history[s] = rec
                run_.logger.log(s, rec)
            done = [(s, rec) for s, rec, _ in pending] if check else []
            pending.clear()
            timeline.flush()  # the timeline so far, with the rows (a killed run keeps both)
            for s, rec in done:
                run_.check_finite(s, rec["loss"], rec["grad_norm"])

        def flush_after_error():  # an error mid-run: keep the rows of the steps that ran (they follow no checkpoint)
            if pending:
                try:
                    flush(check=False)
                except Exception as e:  # the device failed: the error being raised says why
                    run_.logger.write(f"metrics of steps {[s for s, _, _ in pending]} not written: {e}")

        with contextlib.ExitStack() as cleanup:
            cleanup.callback(self.close)
            cleanup.enter_context(run_)  # at exit: the stop flag, the metrics logger and the checkpointer closed
            cleanup.enter_context(timeline.recording(  # written at each flush and at the end (train.timeline)
                os.path.join(self.workdir, "timeline.json") if cfg.train.timeline and jax.process_index() == 0
                else None, process=f"{self.stage} {os.path.basename(self.workdir)}"))
            cleanup.enter_context(timeline.track("trainer"))  # the loop's thread: updates, syncs, the rest
            busy = cleanup.enter_context(timeline.measuring(BUSY_SPANS))  # the pools' busy fractions, per step
            compiled = cleanup.enter_context(profiling.count_compilations())  # the run's compile events
            self.open_models(at_once)
            self.log(self.banner(start))
            run_.open_logs(stage=self.stage, handle_signals=self.handle_signals, stdout_keys=self.stdout_keys)
            cleanup.callback(flush_after_error)
            # one policy generator for the run (inference/protocol.py); its weights follow the updates
            policy = policy_model(run_.model_config, self.tok, r, run_.state["params"], name=self.policy_name,
                                  max_tokens=self.policy_max_tokens(), in_flight=at_once, mesh=run_.mesh,
                                  buckets=self.policy_buckets(in_flight), version=step)
            cleanup.callback(policy.close)
            meter = EngineMeter({"engine": engine_of(policy), **self.engines()})
            built = policy.generator  # what open_source may wrap (async_rollouts.Guarded); vllm_sync_record reads it
            self.open_source(policy, start, next_rid, cleanup)
            ended = time.perf_counter()
            while step < cfg.train.steps:
                started = time.perf_counter()
                meter.start()
                got, (outs, kept, counts, times, ms), wait_s = self.take_step(step, ladder, policy)  # wait_s: for
                times["start"], next_rid = started, got.next_rid  # the step's rollouts
                if self.source.beside:  # they ran beside the updates: rollout_s is the producer's time
                    times["start"] = times["rollouts"] - (got.ended - got.started)
                step += 1
                run_.state["step"] = distributed.step_array(step, run_.mesh)
                self.keep_version(step)  # before the next update donates them (rl.max_staleness > 0)
                if not self.source.beside:  # the next rollouts sample the updated policy (in train_s, as ever)
                    self.publish(policy, step)
                times["trained"] = time.perf_counter()
                if self.source.beside:  # the turns in flight or the steps held back: the new weights
                    self.publish_after(policy, step)
                rec = self.record(outs, kept, counts, times)
                rec.update(compilation_record(run_.step_fn, compiled))  # programs compiled so far, by kind
                rec.update(meter.record())  # the step's rollouts on the engines (rollout.engine): engine/*
                rec.update(vllm_sync_record(built))  # rollout.generator=vllm: the step's weight sync
                rec.update(staleness_of([t for g in kept for t in g], step - 1))
                validating = bool(cfg.validation.every and step % cfg.validation.every == 0 and self.has_validation())
                if validating:
                    self.publish_due(policy)  # validation samples with the newest weights
                    with timeline.span("validation", step=step):
                        rec.update(self.validate(policy, f"{self.stage} step {step} validation"))
                now = time.perf_counter()
                rec["step_s"] = now - ended  # wall clock of the loop: since the previous step's record
                rec.update(busy_record(busy.fractions(ended, now)))
                if self.source.beside:
                    rec["rollout_wait_s"] = wait_s
                rec["groups_in_flight"] = self.groups_in_flight
                ended = now
                pending.append((step, rec, ms))
                saving = run_.save_due(step, scheduled=self.save_checkpoints)
                if len(pending) >= sync_every or validating or saving:
                    flush()
                if saving:
                    self.checkpoint_step(step, got, next_rid)
                    abort_if_requested(step, run_.ckpt)
                if run_.preempted:
                    run_.say_stopped(step)
                    break
        return RLResult(self.workdir, start, step, history, run_.preempted, run_.saved)
