"""Training state shared by the LM trainer (train/loop.py) and the RL learner (train/rl/learner.py).

    model_config = model_config_for(cfg, tok)                 # the runtime ModelConfig of a run config
    abs_state, shardings = state_shardings(model_config, tx, mesh)
    latest, state, data_state = restore_latest(ckpt, abs_state, shardings, cfg.to_dict())
    params = initial_params(cfg, model_config, mesh, shardings["params"])   # when there is no checkpoint
    stop = StopFlag(install=True)                             # SIGTERM / first Ctrl-C: stop after this step

`cfg` is any run config with the sections model, tokenizer, init, train (config.RunConfig, AgentRLConfig,
SimRLConfig): these helpers read only those.
"""

from __future__ import annotations

import dataclasses
import signal
import threading

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from mimesis_jax import config as config_lib, models, sharding
from mimesis_jax.checkpoints import Checkpointer, abstract_like, gather_json
from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import RUNTIME_FIELDS, ModelConfig
from mimesis_jax.train.optim import opt_state_shardings
from mimesis_jax.train.step import init_train_state

# Architecture fields that do not change weights or compute; a checkpoint may differ in them.
_ARCH_IGNORED = ("bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "max_position_embeddings")


def arch_diff(a: ModelConfig, b: ModelConfig) -> list[str]:
    """Architecture fields (not runtime, not token ids) in which two model configs differ."""
    out = []
    for f in dataclasses.fields(ModelConfig):
        if f.name in RUNTIME_FIELDS or f.name in _ARCH_IGNORED:
            continue
        if getattr(a, f.name) != getattr(b, f.name):
            out.append(f"{f.name}: {getattr(a, f.name)!r} vs {getattr(b, f.name)!r}")
    return out


def tokenizer_size(tok) -> int:
    for attr in ("vocab_size", "__len__"):
        v = getattr(tok, attr, None)
        if v is not None:
            return int(v() if callable(v) else v)
    raise ConfigError(f"tokenizer {tok!r}: cannot tell its vocabulary size")


def model_config_for(cfg, tok=None) -> ModelConfig:
    """The runtime ModelConfig: architecture of cfg.model (vocab from the tokenizer if configured)."""
    mc = cfg.runtime_model()
    if tok is not None:
        n = tokenizer_size(tok)
        if cfg.tokenizer.set_model_vocab:  # a model built for this tokenizer: its size and chat ids
            m = cfg.tokenizer.vocab_multiple
            mc = mc.replace(vocab_size=-(-n // m) * m)
            ids = {k: getattr(tok, a, None) for k, a in (("eos_token_id", "eos_id"), ("pad_token_id", "pad_id"))}
            mc = mc.replace(**{k: v for k, v in ids.items() if v is not None and getattr(mc, k) is None})
        elif mc.vocab_size < n:
            raise ConfigError(f"config key 'model.vocab_size': {mc.vocab_size} is smaller than tokenizer "
                              f"{cfg.tokenizer.name!r}'s {n} tokens")
    return mc


def make_mesh(cfg, devices=None):
    """The device mesh of `cfg.mesh` over `devices` (None: all); a bad layout is a ConfigError naming the section
    (and how many devices a rollout pool, `rollout.devices`, left it)."""
    try:
        return sharding.make_mesh(cfg.mesh.axes(), devices)
    except ValueError as e:
        left = "" if devices is None else f" (the {len(devices)} devices rollout.devices leaves to train on)"
        raise ConfigError(f"config section 'mesh': {e}{left}") from None


def state_shardings(model_config: ModelConfig, tx, mesh) -> tuple[dict, dict]:
    """(abstract train state, its NamedShardings) without allocating anything. The LM step's state and the RL
    update's params and opt_state (train/rl/step.py) are laid out so, in and out of every step."""
    abs_params = models.abstract_params(model_config)
    abs_state = jax.eval_shape(lambda p: init_train_state(p, tx, jax.random.key(0)), abs_params)
    ps = models.param_shardings(model_config, mesh)
    rep = NamedSharding(mesh, P())
    shard = {
        "params": ps,
        "opt_state": opt_state_shardings(abs_state["opt_state"], ps, mesh),
        "step": rep, "rng": rep, "nonfinite": rep,
    }
    return abs_state, shard


def restore_latest(ckpt: Checkpointer, abs_state, shardings, run_dict: dict, log=print, fallback: bool = True):
    """(step, state, this process's data state) of the workdir's latest checkpoint, or (None, None, None); says
    which run-config keys changed since it was written (train.steps and checkpoint.* may change freely)."""
    found = ckpt.restore_newest_intact(abstract_like(abs_state, shardings), fallback=fallback, log=log)
    if found is None:
        return None, None, None
    latest, state, data_state, stored = found
    changed = [d for d in config_lib.diff(stored, run_dict) if not d.startswith(("train.steps", "checkpoint."))]
    if changed:
        log(f"resume: the run config differs from the checkpoint's in: {changed}")
    return latest, state, data_state


def initial_params(cfg, model_config: ModelConfig, mesh, param_shardings, log=print):
    """Parameters to start from: init.from_hf, init.from_workdir, or random (seed = train.seed)."""
    init = cfg.init
    if init.from_hf:
        loaded, params = models.load_hf(init.from_hf, mesh=mesh)
        bad = arch_diff(loaded, model_config)
        if bad:
            raise ConfigError(f"init.from_hf={init.from_hf}: its config.json differs from the run config's model "
                              f"in {bad}")
        log(f"init: weights from HF directory {init.from_hf}")
        return jax.tree.map(lambda x, s: jax.device_put(x, s), params, param_shardings)
    if init.from_workdir:
        src = Checkpointer(init.from_workdir, read_only=True)
        stored = config_lib.model_from_dict(src.run_config(init.step)["model"])
        bad = arch_diff(stored, model_config)
        if bad:
            raise ConfigError(f"init.from_workdir={init.from_workdir}: its model differs from the run config's "
                              f"model in {bad}")
        target = abstract_like(models.abstract_params(model_config), param_shardings)
        params, step = src.restore_params(init.step, target)
        src.close()
        log(f"init: weights from {init.from_workdir} checkpoint step {step}")
        return params
    log(f"init: random weights (seed {cfg.train.seed})")
    key = jax.random.fold_in(jax.random.key(cfg.train.seed), 0)
    return models.init_params(model_config, key, mesh)


class StopFlag:
    """SIGTERM / first SIGINT set a flag the loop checks between steps (a second SIGINT interrupts)."""

    def __init__(self, install: bool):
        self.event = threading.Event()
        self.old = {}
        if install and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if signum == signal.SIGINT and self.event.is_set():
            raise KeyboardInterrupt
        self.event.set()

    def is_set(self) -> bool:
        flag = self.event.is_set()
        if jax.process_count() > 1:  # every host must stop at the same step
            flag = any(gather_json(flag))  # no device program (checkpoints.gather_json)
        return flag

    def restore(self):
        for sig, old in self.old.items():
            signal.signal(sig, old)
