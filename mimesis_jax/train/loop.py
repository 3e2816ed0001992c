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

What surrounds the steps (validation, mesh, checkpointer, restore or init and run_config.json, metrics logger, stop
flag, scheduled and preemption saves, the non-finite-loss guard, cleanup) is train/run.py `Run`, which the RL learner
shares; this module adds the data (iterator, prefetch thread, batch checks) and the compiled LM step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import queue
import threading
import time
from typing import Any, Callable

import jax
import numpy as np

from mimesis_jax import sharding
from mimesis_jax.checkpoints import CheckpointError
from mimesis_jax.config import RunConfig
from mimesis_jax.data.pipeline import check_data_files, make_iterator
from mimesis_jax.data.tokenizer import load_tokenizer as _load
from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.train.optim import make_optimizer, make_schedule, schedule_hparams
from mimesis_jax.train.run import NonFiniteLossError, Run
from mimesis_jax.train.state import state_shardings
from mimesis_jax.train.step import init_train_state, make_train_step

BATCH_KEYS = ("tokens", "positions", "segment_ids", "loss_mask")

# (tokenizer, batch_size, seed, process_index, process_count) -> iterator with get_state()/set_state()
DataFactory = Callable[[Any, int, int, int, int], Any]


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
    primary = jax.process_index() == 0
    run = Run(cfg, workdir, log=print if primary else (lambda *a, **k: None))
    cfg, workdir, log = run.cfg, run.workdir, run.log
    if data is None and not hasattr(cfg.data, "make_iterator"):
        check_data_files(cfg.data)  # every data file read once up front: a bad line is named before any step
    needs_tokenizer = cfg.tokenizer.set_model_vocab or (data is None and not hasattr(cfg.data, "make_iterator"))
    if tokenizer is None and needs_tokenizer:
        tokenizer = load_tokenizer(cfg)
    run.prepare(tokenizer)
    cfg, model_config, mesh, t = run.cfg, run.model_config, run.mesh, run.cfg.train
    if t.global_batch % jax.process_count():
        raise ConfigError(f"config key 'train.global_batch': {t.global_batch} is not divisible by the "
                          f"{jax.process_count()} processes")
    local_batch = t.global_batch // jax.process_count()

    tx, schedule, abs_state, shardings, init, step_fn = compiled_functions(
        model_config, cfg.optimizer, t.steps, mesh, t.grad_accum, t.nonfinite == "skip")
    factory = data or default_data_factory(cfg)
    it = factory(tokenizer, local_batch, t.seed, jax.process_index(), jax.process_count())
    run.restore_or_init(abs_state, shardings, init)
    if run.latest is not None:
        try:
            it.set_state(run.data_state)
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{run.ckpt.directory}/{run.latest}: cannot resume the data iterator: {e}") \
                from None
    state, data_state = run.state, (run.data_state if run.latest is not None else it.get_state())
    start = run.start
    if run.nothing_to_do():
        return TrainResult(workdir, start, start, {}, False, run.latest, int(jax.device_get(state["nonfinite"])))

    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abs_state["params"]))
    log(f"{cfg.stage}: {model_config.model_type} {n_params / 1e6:.2f}M params | mesh {dict(mesh.shape)} | "
        f"global batch {t.global_batch} x grad_accum {t.grad_accum} | steps {start}->{t.steps} | "
        f"dtype {model_config.dtype} | remat {model_config.remat}")
    feed = _Prefetcher(it, t.prefetch)
    losses: dict[int, float] = {}
    step = start
    last = time.perf_counter()
    with run, contextlib.closing(feed):
        run.open_logs(stage=cfg.stage, handle_signals=handle_signals)
        while step < t.steps:
            item = feed.next()
            if item is None:
                if run.saved != step:
                    run.save(step, state, data_state)
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
            record = {"loss": loss, "lr": float(m.get("lr", np.nan)), "grad_norm": float(m["grad_norm"]),
                      "param_norm": float(m["param_norm"]), "tokens": int(m["tokens"]),
                      "target_tokens": int(m["target_tokens"]), "tokens_per_s": float(m["tokens"]) / max(dt, 1e-9),
                      "step_time_s": dt, "finite": bool(m["finite"]),
                      "nonfinite_total": int(jax.device_get(state["nonfinite"]))}
            record.update({f"data/{k}": v for k, v in stats.items() if isinstance(v, (int, float))})
            run.logger.log(step, record)
            run.check_finite(step, loss, record["grad_norm"], finite=record["finite"],
                             skipped_total=record["nonfinite_total"])
            if run.save_due(step):
                run.save(step, state, data_state)
                last = time.perf_counter()  # a synchronous part of the save is not step time
            if run.preempted:
                run.say_stopped(step)
                break
    return TrainResult(workdir, start, step, losses, run.preempted, run.saved,
                       int(jax.device_get(state["nonfinite"])))
