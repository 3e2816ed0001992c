"""Checkpoints of a training run: orbax `CheckpointManager` under WORKDIR/checkpoints/<step>/.

Each step directory holds five items:

    params       fp32 weights                           (orbax StandardSave: sharded, every host writes its shards)
    opt_state    optax state                            (StandardSave)
    train_state  {step, rng, nonfinite}                 (StandardSave)
    data_iter    {"process_count": P, "states": [...]}  (JsonSave: every process's data-iterator state)
    run_config   the RunConfig as a dict                (JsonSave)

Orbax writes into a temporary directory and renames it when complete (atomic: a crash mid-save never leaves a
step that looks finished), keeps the `keep` most recent steps, and with `async_save` copies arrays to host
memory and writes them in a background thread while training continues. Restoring takes the target
shardings of the *current* mesh, so a run can resume on a different device layout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

STATE_KEYS = ("step", "rng", "nonfinite")


class CheckpointError(RuntimeError):
    """A missing or unusable checkpoint; the message names the directory and step."""


def checkpoint_dir(workdir: str) -> str:
    return os.path.join(os.path.abspath(workdir), "checkpoints")


def gather_json(obj: Any) -> list:
    """Every process's JSON-serialisable `obj`, as a list indexed by process (a collective on many hosts)."""
    if jax.process_count() == 1:
        return [json.loads(json.dumps(obj))]
    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    lengths = multihost_utils.process_allgather(np.asarray([data.size], np.int32))
    width = int(np.max(lengths))
    padded = np.zeros((width,), np.uint8)
    padded[: data.size] = data
    every = multihost_utils.process_allgather(padded)
    return [json.loads(bytes(every[i][: int(lengths[i][0])]).decode()) for i in range(jax.process_count())]


@contextlib.contextmanager
def _quiet_absl(quiet: bool):
    logger = logging.getLogger("absl")
    level = logger.level
    if quiet:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class Checkpointer:
    """Saving and restoring the train state, data-iterator state and run config of one workdir."""

    def __init__(self, workdir: str, *, keep: int = 3, async_save: bool = True, read_only: bool = False):
        self.directory = checkpoint_dir(workdir)
        if read_only and not os.path.isdir(self.directory):
            raise CheckpointError(f"{self.directory}: no checkpoints directory (is {workdir!r} a training workdir?)")
        with _quiet_absl(read_only):  # read-only managers log warnings about the options they ignore
            options = ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                create=not read_only,
                read_only=read_only,
                enable_async_checkpointing=async_save and not read_only,
            )
            self.manager = ocp.CheckpointManager(self.directory, options=options)

    # ------------------------------------------------------------------------------------------ query
    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def resolve_step(self, step: int | None) -> int:
        """`step` if it exists, the latest for None / -1; a clear error otherwise."""
        steps = self.all_steps()
        if not steps:
            raise CheckpointError(f"{self.directory}: no finished checkpoint")
        if step is None or step < 0:
            return steps[-1]
        if step not in steps:
            raise CheckpointError(f"{self.directory}: no checkpoint at step {step}; available steps {steps}")
        return step

    # ------------------------------------------------------------------------------------------- save
    def save(self, step: int, state: dict, data_state: Any, run_config: dict) -> None:
        """Saves (asynchronously if configured) one step. `data_state` is this process's iterator state."""
        items = dict(
            params=ocp.args.StandardSave(state["params"]),
            opt_state=ocp.args.StandardSave(state["opt_state"]),
            train_state=ocp.args.StandardSave({k: state[k] for k in STATE_KEYS}),
            data_iter=ocp.args.JsonSave({"process_count": jax.process_count(), "states": gather_json(data_state)}),
            run_config=ocp.args.JsonSave(run_config),
        )
        self.manager.save(int(step), args=ocp.args.Composite(**items), force=True)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()

    # ---------------------------------------------------------------------------------------- restore
    def restore(self, step: int, abstract_state: dict) -> tuple[dict, Any, dict]:
        """(state placed as `abstract_state`'s shardings say, this process's data state, run config dict)."""
        step = self.resolve_step(step)
        ab = abstract_state
        try:
            r = self.manager.restore(step, args=ocp.args.Composite(
                params=ocp.args.StandardRestore(ab["params"]),
                opt_state=ocp.args.StandardRestore(ab["opt_state"]),
                train_state=ocp.args.StandardRestore({k: ab[k] for k in STATE_KEYS}),
                data_iter=ocp.args.JsonRestore(),
                run_config=ocp.args.JsonRestore(),
            ))
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{self.directory}/{step}: cannot restore the train state into the current "
                                  f"model/optimizer layout ({type(e).__name__}: {e})") from None
        state = {"params": r.params, "opt_state": r.opt_state, **dict(r.train_state)}
        data = r.data_iter
        if data["process_count"] != jax.process_count():
            raise CheckpointError(
                f"{self.directory}/{step}: saved by {data['process_count']} processes, resumed with "
                f"{jax.process_count()}; the data position cannot be carried over exactly")
        return state, data["states"][jax.process_index()], r.run_config

    def restore_params(self, step: int | None, abstract_params) -> tuple[Any, int]:
        """Only the parameters (for SFT initialisation and export): (params, step)."""
        step = self.resolve_step(step)
        try:
            r = self.manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params)))
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{self.directory}/{step}: cannot restore params for this model "
                                  f"({type(e).__name__}: {e})") from None
        return r.params, step

    def run_config(self, step: int | None = None) -> dict:
        """The run config stored with a step (latest by default)."""
        step = self.resolve_step(step)
        return self.manager.restore(step, args=ocp.args.Composite(run_config=ocp.args.JsonRestore())).run_config


def abstract_like(tree, shardings):
    """ShapeDtypeStructs carrying shardings: the restore target for orbax."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
