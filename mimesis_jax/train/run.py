"""The run skeleton, written once: what the LM loop (train/loop.py `train`) and the RL learner
(train/rl/learner.py `setup` + `RLLearner.run`) do around their steps.

    run = Run(cfg, workdir, log=log)                  # validation (the config's own checks), the workdir
    run.prepare(tokenizer)                            # the runtime model config, run_config dict, mesh
    ... the loop builds its optimizer, abstract state, shardings and jitted init ...
    run.restore_or_init(abs_state, shardings, init)   # checkpointer; the newest intact checkpoint, else the
                                                      # initial weights + run_config.json
    if run.nothing_to_do(): return ...
    with run:                                         # on exit: the stop flag's signal handlers, the logger and
        run.open_logs(stage="midtrain")               # the checkpointer closed; metrics logger + stop flag
        while step < run.cfg.train.steps:
            ... one step ...
            run.logger.log(step, record)
            run.check_finite(step, loss, grad_norm)   # train.nonfinite: stop (NonFiniteLossError) or skip
            if run.save_due(step):                    # preemption, every checkpoint.every steps, the last step
                run.save(step, state, data_state)
            if run.preempted:
                run.say_stopped(step); break

Preemption is a SIGTERM (or a first Ctrl-C) caught by the stop flag, or the checkpoint manager's preemption
notice (`reached_preemption`, a multi-host job's coordinated stop); either way the current step finishes, is
saved, and the loop returns with preempted=True. The non-finite-loss guard reads `train.nonfinite` of the run
config (both the LM and the RL configs have the switch): `stop` raises NonFiniteLossError naming the step and the
last checkpoint; `skip` is for a step that can skip its own update (the LM step does, counting it in the state's
`nonfinite`) and stops after `train.max_consecutive_skips` in a row. An RL update cannot be skipped (its step is
train/rl/step.py, which has no skip), so a Run built with skips=False rejects `train.nonfinite=skip` as a
ConfigError naming the key.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import jax

from mimesis_jax import config as config_lib
from mimesis_jax.checkpoints import Checkpointer
from mimesis_jax.errors import ConfigError
from mimesis_jax.train.metrics import MetricsLogger
from mimesis_jax.train.state import StopFlag, initial_params, make_mesh, model_config_for, restore_latest


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm was NaN/inf (the message names the step and what to try)."""


class Run:
    """One training run in a workdir (module docstring). Attributes, as the steps fill them: cfg (validated; after
    `prepare` with the runtime model in fp32 storage form), workdir, log, model_config, run_dict, mesh, ckpt,
    state, latest (the checkpoint step resumed from, None for a fresh run), data_state (the resumed checkpoint's),
    saved (the last step checkpointed), logger, stop, preempted."""

    def __init__(self, cfg, workdir: str, *, log=print, skips: bool = True):
        self.cfg = config_lib.validate(cfg) if isinstance(cfg, config_lib.RunConfig) else cfg.validate()
        if not skips and self.cfg.train.nonfinite == "skip":
            raise ConfigError("config key 'train.nonfinite': skip needs a step that can skip its update; this "
                              "stage's cannot, use stop")
        self.skips = skips
        self.workdir = os.path.abspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.log = log
        self.model_config = self.run_dict = self.mesh = self.ckpt = None
        self.state = self.latest = self.data_state = self.saved = None
        self.logger = self.stop = None
        self.preempted = False
        self.bad_in_row = 0  # non-finite steps in a row (train.nonfinite=skip)

    def prepare(self, tokenizer=None) -> None:
        """The runtime model config (vocabulary from `tokenizer` when configured), the run config as checkpointed
        (its model in storage form: fp32, no remat) and the device mesh of `cfg.mesh` (over `training_devices`)."""
        self.model_config = model_config_for(self.cfg, tokenizer)
        self.cfg = self.cfg.replace(model=dataclasses.replace(self.model_config, dtype="float32", remat="none"))
        self.run_dict = self.cfg.to_dict()
        self.mesh = make_mesh(self.cfg, self.training_devices())

    def training_devices(self):
        """The devices the mesh is built on: None (all of them); the RL run leaves out its rollout pool."""
        return None

    def restore_or_init(self, abs_state, shardings, init) -> None:
        """Opens the checkpointer and restores the newest intact checkpoint of the workdir; without one, the state
        is `init(initial params, rng)` (init.from_hf / from_workdir / random) and run_config.json is written."""
        c = self.cfg.checkpoint
        self.ckpt = Checkpointer(self.workdir, keep=c.keep, async_save=c.async_save)
        self.latest, self.state, self.data_state = restore_latest(self.ckpt, abs_state, shardings, self.run_dict,
                                                                  self.log, c.fallback)
        self.saved = self.latest
        if self.latest is not None:
            self.log(f"resume: {self.workdir} from step {self.latest}")
            return
        params = initial_params(self.cfg, self.model_config, self.mesh, shardings["params"], self.log)
        self.state = init(params, jax.random.fold_in(jax.random.key(self.cfg.train.seed), 1))
        if jax.process_index() == 0:
            with open(os.path.join(self.workdir, "run_config.json"), "w") as f:
                json.dump(self.run_dict, f, indent=2)

    @property
    def start(self) -> int:
        """The step the state is at (the resumed checkpoint's, 0 for a fresh run)."""
        return int(jax.device_get(self.state["step"]))

    def nothing_to_do(self) -> bool:
        """True (and the checkpointer closed) when the state is already at train.steps."""
        start, steps = self.start, self.cfg.train.steps
        if start < steps:
            return False
        self.log(f"nothing to do: checkpoint step {start} >= train.steps={steps}")
        self.ckpt.close()
        return True

    def open_logs(self, *, stage: str, handle_signals: bool = True, stdout_keys: tuple = ()) -> None:
        """The metrics logger (metrics.jsonl, console, TensorBoard) from the start step and the stop flag (SIGTERM /
        first Ctrl-C, when `handle_signals`); `with run:` closes them."""
        t = self.cfg.train
        self.logger = MetricsLogger(self.workdir, total_steps=t.steps, start_step=self.start, log_every=t.log_every,
                                    tensorboard=t.tensorboard, progress_bar=t.progress_bar, stage=stage,
                                    stdout_keys=stdout_keys)
        self.stop = StopFlag(handle_signals)

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc) -> None:
        """Cleanup, error or not: the stop flag's signal handlers restored, the logger closed, the checkpointer
        closed (its pending saves finished)."""
        if self.stop is not None:
            self.stop.restore()
        if self.logger is not None:
            self.logger.close()
        self.ckpt.close()

    def check_finite(self, step: int, loss: float, grad_norm: float, *, finite: bool | None = None,
                     skipped_total: int | None = None) -> None:
        """The non-finite-loss guard after `step` (module docstring). `finite` defaults to both numbers being
        finite; `skipped_total` is the run's count of skipped updates (train.nonfinite=skip)."""
        if finite is None:
            finite = math.isfinite(loss) and math.isfinite(grad_norm)
        if finite:
            self.bad_in_row = 0
            return
        self.bad_in_row += 1
        t = self.cfg.train
        what = f"loss {loss}, grad norm {grad_norm}"
        if t.nonfinite == "stop":
            hint = ", or set train.nonfinite=skip to skip such updates" if self.skips else ""
            raise NonFiniteLossError(
                f"step {step}: non-finite {what}. Stopping (train.nonfinite=stop); the last checkpoint is step "
                f"{self.ckpt.latest_step()}. Lower optimizer.lr, check the data{hint}.")
        self.logger.write(f"step {step}: non-finite {what}; update skipped ({self.bad_in_row} in a row, "
                          f"{skipped_total} in total)")
        if self.bad_in_row >= t.max_consecutive_skips:
            raise NonFiniteLossError(f"step {step}: {self.bad_in_row} non-finite steps in a row "
                                     f"(train.max_consecutive_skips={t.max_consecutive_skips}); stopping")

    def save_due(self, step: int, scheduled: bool = True) -> bool:
        """Whether to checkpoint after `step`: on preemption (which also sets `preempted`), and when `scheduled`
        every checkpoint.every steps and at train.steps."""
        self.preempted = self.stop.is_set() or self.ckpt.manager.reached_preemption(step)
        due = step % self.cfg.checkpoint.every == 0 or step == self.cfg.train.steps
        return self.preempted or (scheduled and due)

    def save(self, step: int, state: dict, data_state, lagged: dict | None = None) -> None:
        """Checkpoints `step` (asynchronously if checkpoint.async_save) with this process's data state (and the
        earlier policy versions `lagged` of an asynchronous RL run: Checkpointer.save)."""
        self.ckpt.save(step, state, data_state, self.run_dict, lagged=lagged)
        self.saved = step

    def say_stopped(self, step: int) -> None:
        """The console / log line of a preempted run."""
        self.logger.write(f"stop requested: checkpoint saved at step {step}; rerun the same command to resume")
