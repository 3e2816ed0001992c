"""The Stage I training loop: sharded jitted steps, checkpoints with exact resume, SIGTERM, metrics.

    result = train(cfg, workdir)          # cfg: config.RunConfig; resumes if workdir has a checkpoint

One run = `cfg.train.steps` optimizer steps over the batches of the data iterator. The loop

* builds the mesh (`cfg.mesh`), the runtime model config (bf16 compute, fp32 weights, remat) and optax;
* resumes from WORKDIR/checkpoints if there is a checkpoint (params, optimizer state, step, RNG and the data
  iterator's position), else initialises from `cfg.init` (a HF directory, another run's checkpoint, or random);
* runs steps; the per-step losses of a resumed run equal those of an uninterrupted one;
* checkpoints every `checkpoint.every` steps and at the end; on SIGTERM (or a first Ctrl-C) it finishes the
  current step, saves, and returns with `preempted=True` (the CLI then exits 0);
* stops with `NonFiniteLossError` naming the step when the loss or gradient norm is not finite
  (`train.nonfinite=stop`), or skips the update and counts it (`train.nonfinite=skip`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import queue
import threading
import time
from typing import Any, Callable

import jax
import numpy as np

from mimesis_jax import config as config_lib, sharding
from mimesis_jax.checkpoints import CheckpointError, Checkpointer
from mimesis_jax.config import RunConfig
from mimesis_jax.data.pipeline import check_data_files, make_iterator
from mimesis_jax.data.tokenizer import load_tokenizer as _load
from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.train.metrics import MetricsLogger
from mimesis_jax.train.optim import make_optimizer, make_schedule, schedule_hparams
from mimesis_jax.train.state import (StopFlag, initial_params, make_mesh, model_config_for, restore_latest,
    state_shardings)
from mimesis_jax.train.step import init_train_state, make_train_step

BATCH_KEYS = ("tokens", "positions", "segment_ids", "loss_mask")

# (tokenizer, batch_size, seed, process_index, process_count) -> iterator with get_state()/set_state()
DataFactory = Callable[[Any, int, int, int, int], Any]


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm was NaN/inf (the message names the step and what to try)."""


class DataExhaustedError(RuntimeError):
    """The data iterator ended before train.steps."""


@dataclasses.dataclass
class TrainResult:
    workdir: str
    start_step: int  # the step this run resumed from (0 for a fresh run)
    final_step: int
    losses: dict[int, float]  # step (1-based) -> loss, for the steps run in this call
    preempted: bool
    checkpoint_step: int | None
    nonfinite_steps: int


# ------------------------------------------------------------------------------------------ model
def load_tokenizer(cfg: RunConfig):
    return _load(cfg.tokenizer.name)


# ------------------------------------------------------------------------------------------- data
def default_data_factory(cfg: RunConfig) -> DataFactory:
    """`cfg.data.make_iterator` if the data section provides one (e.g. train.synthetic.SyntheticData), else
    the data pipeline's make_iterator over `cfg.data` (a data.pipeline.DataConfig)."""
    own = getattr(cfg.data, "make_iterator", None)
    if callable(own):
        return lambda tok, b, seed, pi, pc: own(tok, batch_size=b, seed=seed, process_index=pi, process_count=pc)
    def make(tok, batch_size, seed, process_index, process_count):
        return make_iterator(cfg.data, tok, batch_size=batch_size, seed=seed, process_index=process_index,
                             process_count=process_count)
    return make


class _Prefetcher:
    """Pulls (batch, iterator state after it, iterator stats) on a host thread, `depth` batches ahead.

    The state travels with its batch, so the state checkpointed after step s is exactly the position after
    the batch of step s. depth=0 reads synchronously.
    """

    def __init__(self, it, depth: int):
        self.it = it
        self.depth = depth
        self.q: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self.stop = threading.Event()
        self.thread = None
        if depth > 0:
            self.thread = threading.Thread(target=self._run, name="data-prefetch", daemon=True)
            self.thread.start()

    def _pull(self):
        try:
            batch = next(self.it)
        except StopIteration:
            return ("end", None)
        except Exception as e:  # re-raised on the main thread
            return ("error", e)
        stats = dict(getattr(self.it, "stats", {}) or {})
        return ("ok", (batch, self.it.get_state(), stats))

    def _run(self):
        while not self.stop.is_set():
            item = self._pull()
            while not self.stop.is_set():
                try:
                    self.q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if item[0] != "ok":
                return

    def next(self):
        kind, value = self._pull() if self.thread is None else self.q.get()
        if kind == "error":
            raise value
        if kind == "end":
            return None
        return value

    def close(self):
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=5)


def _check_batch(batch, local_batch: int, step: int) -> dict:
    if not isinstance(batch, dict):
        raise TypeError(f"data iterator: batch for step {step} is a {type(batch).__name__}, expected a dict")
    missing = [k for k in BATCH_KEYS if k not in batch]
    if missing:
        raise KeyError(f"data iterator: batch for step {step} lacks {missing} (has {sorted(batch)})")
    shape = np.shape(batch["tokens"])
    for k in BATCH_KEYS:
        s = np.shape(batch[k])
        if len(s) != 2 or s != shape or s[0] != local_batch:
            raise ValueError(f"data iterator: batch[{k!r}] for step {step} has shape {s}; expected "
                             f"[{local_batch}, seq_len] like tokens {shape}")
    return {
        "tokens": np.asarray(batch["tokens"], np.int32),
        "positions": np.asarray(batch["positions"], np.int32),
        "segment_ids": np.asarray(batch["segment_ids"], np.int32),
        "loss_mask": np.asarray(batch["loss_mask"], np.float32),
    }


# ------------------------------------------------------------------------------------------- train
@functools.lru_cache(maxsize=8)
def compiled_functions(model_config: ModelConfig, opt_cfg, total_steps: int, mesh, grad_accum: int,
                       skip_nonfinite: bool):
    """(tx, schedule, abstract state, state shardings, jitted init, jitted step) for one run setup.

    Cached on the (hashable) settings, so a run resumed in the same process -- and the tests -- reuse the
    compiled step instead of compiling it again. The learning-rate numbers and the weight decay are inputs of the
    step (optim.schedule_hparams), not constants in it: the demo's SFT run, whose optimizer differs from
    mid-training's only in them, gets mid-training's compiled step from XLA's persistent cache (~20 CPU s).
    """
    tx = make_optimizer(opt_cfg, total_steps, model_config)
    schedule = make_schedule(opt_cfg, total_steps)
    abs_state, shardings = state_shardings(model_config, tx, mesh)
    init = jax.jit(lambda p, r: init_train_state(p, tx, r), out_shardings=shardings, donate_argnums=(0,))
    step = make_train_step(model_config, lambda hp: make_optimizer(opt_cfg, total_steps, model_config, hp), mesh,
                           shardings, grad_accum=grad_accum, skip_nonfinite=skip_nonfinite,
                           schedule=lambda hp: make_schedule(opt_cfg, total_steps, hp),
                           hparams=schedule_hparams(opt_cfg, total_steps))
    return tx, schedule, abs_state, shardings, init, step


def train(cfg: RunConfig, workdir: str, *, data: DataFactory | None = None, tokenizer=None,
          handle_signals: bool = True) -> TrainResult:
    """Runs (or resumes) a training run in `workdir`; see the module docstring."""
    cfg = config_lib.validate(cfg)
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    primary = jax.process_index() == 0
    log = print if primary else (lambda *a, **k: None)

    if data is None and not hasattr(cfg.data, "make_iterator"):
        check_data_files(cfg.data)  # every data file read once up front: a bad line is named before any step
    needs_tokenizer = cfg.tokenizer.set_model_vocab or (data is None and not hasattr(cfg.data, "make_iterator"))
    if tokenizer is None and needs_tokenizer:
        tokenizer = load_tokenizer(cfg)
    model_config = model_config_for(cfg, tokenizer)
    cfg = cfg.replace(model=dataclasses.replace(model_config, dtype="float32", remat="none"))
    run_dict = cfg.to_dict()
    t = cfg.train
    if t.global_batch % jax.process_count():
        raise ConfigError(f"config key 'train.global_batch': {t.global_batch} is not divisible by the "
                          f"{jax.process_count()} processes")
    local_batch = t.global_batch // jax.process_count()

    mesh = make_mesh(cfg)
    tx, schedule, abs_state, shardings, init, step_fn = compiled_functions(
        model_config, cfg.optimizer, t.steps, mesh, t.grad_accum, t.nonfinite == "skip")
    ckpt = Checkpointer(workdir, keep=cfg.checkpoint.keep, async_save=cfg.checkpoint.async_save)
    factory = data or default_data_factory(cfg)
    it = factory(tokenizer, local_batch, t.seed, jax.process_index(), jax.process_count())

    latest, state, data_state = restore_latest(ckpt, abs_state, shardings, run_dict, log, cfg.checkpoint.fallback)
    if latest is not None:
        try:
            it.set_state(data_state)
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{ckpt.directory}/{latest}: cannot resume the data iterator: {e}") from None
        log(f"resume: {workdir} from step {latest}")
    else:
        params = initial_params(cfg, model_config, mesh, shardings["params"], log)
        state = init(params, jax.random.fold_in(jax.random.key(t.seed), 1))
        data_state = it.get_state()
        if primary:
            with open(os.path.join(workdir, "run_config.json"), "w") as f:
                json.dump(run_dict, f, indent=2)
    start = int(jax.device_get(state["step"]))
    if start >= t.steps:
        log(f"nothing to do: checkpoint step {start} >= train.steps={t.steps}")
        ckpt.close()
        return TrainResult(workdir, start, start, {}, False, latest, int(jax.device_get(state["nonfinite"])))

    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abs_state["params"]))
    log(f"{cfg.stage}: {model_config.model_type} {n_params / 1e6:.2f}M params | mesh {dict(mesh.shape)} | "
        f"global batch {t.global_batch} x grad_accum {t.grad_accum} | steps {start}->{t.steps} | "
        f"dtype {model_config.dtype} | remat {model_config.remat}")
    logger = MetricsLogger(workdir, total_steps=t.steps, start_step=start, log_every=t.log_every,
                           tensorboard=t.tensorboard, progress_bar=t.progress_bar, stage=cfg.stage)
    stop = StopFlag(handle_signals)
    feed = _Prefetcher(it, t.prefetch)
    losses: dict[int, float] = {}
    step, saved, preempted, consecutive_bad = start, (latest if latest is not None else None), False, 0
    last = time.perf_counter()
    try:
        while step < t.steps:
            item = feed.next()
            if item is None:
                if saved != step:
                    ckpt.save(step, state, data_state, run_dict)
                    saved = step
                raise DataExhaustedError(f"the data iterator ended after step {step} of train.steps={t.steps} "
                                         f"(checkpoint saved at step {step}); add data/epochs or lower train.steps")
            batch, next_data_state, stats = item
            batch = sharding.global_batch(_check_batch(batch, local_batch, step + 1), mesh, t.global_batch)
            state, m = step_fn(state, batch)
            m = jax.device_get(m)  # also waits for the step: never queue sharded CPU steps
            step += 1
            data_state = next_data_state
            now = time.perf_counter()
            dt, last = now - last, now
            loss = float(m["loss"])
            losses[step] = loss
            finite = bool(m["finite"])
            record = {"loss": loss, "lr": float(m.get("lr", np.nan)), "grad_norm": float(m["grad_norm"]),
                      "param_norm": float(m["param_norm"]), "tokens": int(m["tokens"]),
                      "target_tokens": int(m["target_tokens"]), "tokens_per_s": float(m["tokens"]) / max(dt, 1e-9),
                      "step_time_s": dt, "finite": finite,
                      "nonfinite_total": int(jax.device_get(state["nonfinite"]))}
            record.update({f"data/{k}": v for k, v in stats.items() if isinstance(v, (int, float))})
            logger.log(step, record)
            if not finite:
                consecutive_bad += 1
                what = f"loss {loss}, grad norm {float(m['grad_norm'])}"
                if t.nonfinite == "stop":
                    raise NonFiniteLossError(
                        f"step {step}: non-finite {what}. Stopping (train.nonfinite=stop); the last checkpoint "
                        f"is step {ckpt.latest_step()}. Lower optimizer.lr, check the data, or set "
                        f"train.nonfinite=skip to skip such updates.")
                logger.write(f"step {step}: non-finite {what}; update skipped "
                             f"({consecutive_bad} in a row, {record['nonfinite_total']} in total)")
                if consecutive_bad >= t.max_consecutive_skips:
                    raise NonFiniteLossError(f"step {step}: {consecutive_bad} non-finite steps in a row "
                                             f"(train.max_consecutive_skips={t.max_consecutive_skips}); stopping")
            else:
                consecutive_bad = 0
            preempted = stop.is_set() or ckpt.manager.reached_preemption(step)
            if step % cfg.checkpoint.every == 0 or step == t.steps or preempted:
                ckpt.save(step, state, data_state, run_dict)
                saved = step
                last = time.perf_counter()  # a synchronous part of the save is not step time
            if preempted:
                logger.write(f"stop requested: checkpoint saved at step {step}; rerun the same command to resume")
                break
    finally:
        feed.close()
        stop.restore()
        logger.close()
        ckpt.close()
    return TrainResult(workdir, start, step, losses, preempted, saved, int(jax.device_get(state["nonfinite"])))
