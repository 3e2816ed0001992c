"""Checkpoints of a training run: orbax `CheckpointManager` under WORKDIR/checkpoints/<step>/.

Each step directory holds five items:

    params       fp32 weights                           (orbax StandardSave: sharded, every host writes its shards)
    opt_state    optax state                            (StandardSave)
    train_state  {step, rng, nonfinite}                 (StandardSave)
    data_iter    {"process_count": P, "states": [...]}  (JsonSave: every process's data-iterator state)
    run_config   the RunConfig as a dict                (JsonSave)

and an asynchronous RL run's (`rl.max_staleness` = N > 0) a sixth, `lagged_params` {"v<k>": fp32 weights of
policy version k} (StandardSave): the earlier versions the steps in flight past the checkpoint sample with, so a
resume regenerates them exactly (train/rl/async_rollouts.py "Resume").

Orbax writes into a temporary directory and renames it when complete (atomic: a crash mid-save never leaves a
step that looks finished), keeps the `keep` most recent steps, and with `async_save` copies arrays to host
memory and writes them in a background thread while training continues. Restoring takes the target
shardings of the *current* mesh, so a run can resume on a different device layout.

Verification: once a step is complete, process 0 records the size and CRC-32 of every file in it in
WORKDIR/checkpoint_checksums/<step>.json. A restore checks the step's files against that record first, so a
truncated or bit-flipped file is named (item and file) before orbax reads it. Resuming (`restore_newest_intact`)
falls back to the newest step that verifies and restores, logging why, and moves the broken step to
WORKDIR/checkpoints_corrupt/ so the run can write that step again; `checkpoint.fallback=false` makes a broken
latest step an error instead. Steps written before checksums existed are restored unverified.

Reading a trained workdir (`load_trained`: its model config, float32 parameters and tokenizer spec) is here, below
rollout/, so `serve`, `rollout`, the evaluations and the RL stages' chat models load a workdir by importing it;
the trainers (train/) write the checkpoints.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import shutil
import threading
from typing import Any, Callable
import zlib

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from mimesis_jax import models, sharding
from mimesis_jax.models.config import model_from_dict

STATE_KEYS = ("step", "rng", "nonfinite")


class CheckpointError(RuntimeError):
    """A missing or unusable checkpoint; the message names the directory and step."""


def checkpoint_dir(workdir: str) -> str:
    return os.path.join(os.path.abspath(workdir), "checkpoints")


def _file_crc(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


def _step_files(step_dir: str) -> dict[str, list[int]]:
    """{path relative to the step directory: [size, crc32]} of every file under it."""
    out = {}
    for root, _, files in os.walk(step_dir):
        for name in files:
            full = os.path.join(root, name)
            out[os.path.relpath(full, step_dir)] = [os.path.getsize(full), _file_crc(full)]
    return dict(sorted(out.items()))


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def _path_names(path) -> tuple[str, ...]:
    """A pytree key path as plain names: a dict key, a sequence index and a namedtuple field all become strings
    (orbax stores an optax namedtuple's fields as named keys and a tuple's items as "0", "1", ...)."""
    out = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                out.append(str(getattr(k, attr)))
                break
        else:
            out.append(str(k))
    return tuple(out)


def _stored_shapes(item_dir: str) -> dict[tuple[str, ...], tuple[int, ...]] | None:
    """{key path: global shape} of the arrays of one saved StandardSave item, from its metadata only (no array is
    read); None when the metadata cannot be read (the restore then reports what is wrong)."""
    try:
        md = ocp.StandardCheckpointHandler().metadata(epath.Path(item_dir))
    except Exception:  # noqa: BLE001 - no metadata / an older layout: leave it to the restore
        return None
    leaves = jax.tree_util.tree_flatten_with_path(md)[0]
    return {_path_names(p): tuple(v.shape) for p, v in leaves if hasattr(v, "shape") and v.shape is not None}


def _check_layout(step_dir: str, items: dict[str, Any]) -> None:
    """Raises a one-line CheckpointError when an array of `items` ({item name: abstract tree}) has a different shape
    in the checkpoint, or is not in it, BEFORE orbax starts reading: a restore that fails part-way leaves orbax's
    pending async reads to print "Event loop is closed" / "Exception ignored" traces at exit."""
    for item, abstract in items.items():
        stored = _stored_shapes(os.path.join(step_dir, item))
        if stored is None:
            continue
        for path, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]:
            if not hasattr(leaf, "shape"):
                continue
            key = _path_names(path)
            name = item + "".join(f"[{k}]" for k in key)
            if key not in stored:
                raise CheckpointError(f"{step_dir}: cannot restore into the current model/optimizer "
                                      f"layout: {name} is not in the checkpoint (was the model or optimizer config "
                                      "changed? resume with the config it was saved with, or use a new --workdir)")
            if tuple(leaf.shape) != stored[key]:
                raise CheckpointError(f"{step_dir}: cannot restore into the current model/optimizer "
                                      f"layout: {name} has shape {stored[key]} in the checkpoint and "
                                      f"{tuple(leaf.shape)} in the current model (was the model config changed? "
                                      "resume with the config it was saved with, or use a new --workdir)")


GATHER_TIMEOUT_MS = 24 * 3600 * 1000  # how long a process waits for a slower peer's part of a gather
_GATHERS = itertools.count()  # this process's gathers so far: every process makes the same gathers in order
_GATHER_LOCK = threading.Lock()


def gather_json(obj: Any) -> list:
    """Every process's JSON-serialisable `obj`, as a list indexed by process (a collective on many hosts: every
    process calls it, in the same order as the others).

    Through jax.distributed's key-value store (the coordination service), not a device program: a collective
    program over every device would be enqueued beside the programs other threads run on some of them (the
    asynchronous RL rollouts, train/rl/async_rollouts.py), and two multi-device programs enqueued in different
    orders on two devices can wait on each other. Each process writes its part under the gather's number and
    reads the others'; the part of two gathers back is deleted (every process has read it by then: none starts
    gather n before every part of gather n - 1 exists, and none writes that before it has read gather n - 2)."""
    if jax.process_count() == 1:
        return [json.loads(json.dumps(obj))]
    from jax._src import distributed  # the coordination service's client (what multihost_utils itself uses)

    client, me = distributed.global_state.client, jax.process_index()
    with _GATHER_LOCK:
        n = next(_GATHERS)
    client.key_value_set(f"mimesis_gather/{n}/{me}", json.dumps(obj))
    every = [json.loads(client.blocking_key_value_get(f"mimesis_gather/{n}/{p}", GATHER_TIMEOUT_MS))
             for p in range(jax.process_count())]
    if n >= 2:
        client.key_value_delete(f"mimesis_gather/{n - 2}/{me}")
    return every


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
        self.sums_dir = os.path.join(os.path.abspath(workdir), "checkpoint_checksums")
        self.corrupt_dir = os.path.join(os.path.abspath(workdir), "checkpoints_corrupt")
        self.read_only = read_only
        self._unsummed: list[int] = []
        self._async = async_save and not read_only
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
    def save(self, step: int, state: dict, data_state: Any, run_config: dict, lagged: dict | None = None) -> None:
        """Saves (asynchronously if configured) one step. `data_state` is this process's iterator state; `lagged`
        ({version: params}, optional): earlier policy versions, the `lagged_params` item (`restore_lagged`)."""
        extra = {"lagged_params": ocp.args.StandardSave({f"v{v}": p for v, p in lagged.items()})} if lagged else {}
        items = dict(**extra,
            params=ocp.args.StandardSave(state["params"]),
            opt_state=ocp.args.StandardSave(state["opt_state"]),
            train_state=ocp.args.StandardSave({k: state[k] for k in STATE_KEYS}),
            data_iter=ocp.args.JsonSave({"process_count": jax.process_count(), "states": gather_json(data_state)}),
            run_config=ocp.args.JsonSave(run_config),
        )
        self.manager.wait_until_finished()
        self._write_checksums()
        self.manager.save(int(step), args=ocp.args.Composite(**items), force=True)
        self._unsummed.append(int(step))
        if not self._async:
            self._write_checksums()

    def wait(self) -> None:
        self.manager.wait_until_finished()
        self._write_checksums()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self._write_checksums()
        self.manager.close()

    def _write_checksums(self) -> None:
        """Records the files of every step saved since the last call (they are complete: orbax has finished)."""
        steps, self._unsummed = self._unsummed, []
        if jax.process_index() != 0 or self.read_only:
            return
        os.makedirs(self.sums_dir, exist_ok=True)
        for step in steps:
            step_dir = os.path.join(self.directory, str(step))
            if not os.path.isdir(step_dir):  # already garbage-collected by keep
                continue
            tmp = os.path.join(self.sums_dir, f"{step}.json.tmp")
            with open(tmp, "w") as f:
                json.dump(_step_files(step_dir), f)
            os.replace(tmp, os.path.join(self.sums_dir, f"{step}.json"))
        live = {str(s) for s in self.manager.all_steps()} | {str(s) for s in self._unsummed}
        for name in os.listdir(self.sums_dir):
            if name.endswith(".json") and name[:-5] not in live:
                os.remove(os.path.join(self.sums_dir, name))

    def verify(self, step: int) -> None:
        """Checks a step's files against the sizes and CRC-32s recorded when it was saved (steps without a record,
        written before checksums existed, pass); a mismatch is a CheckpointError naming the item and the file."""
        record = os.path.join(self.sums_dir, f"{step}.json")
        if not os.path.exists(record):
            return
        with open(record) as f:
            want = json.load(f)
        step_dir = os.path.join(self.directory, str(step))
        for rel, (size, crc) in want.items():
            full = os.path.join(step_dir, rel)
            what = f"{step_dir}/{rel} (item '{rel.split(os.sep)[0]}')"
            if not os.path.exists(full):
                raise CheckpointError(f"checkpoint step {step} is corrupt: {what} is missing")
            if os.path.getsize(full) != size:
                raise CheckpointError(f"checkpoint step {step} is corrupt: {what} has {os.path.getsize(full)} "
                                      f"bytes, {size} were written")
            if _file_crc(full) != crc:
                raise CheckpointError(f"checkpoint step {step} is corrupt: {what} does not match the checksum "
                                      "written at save")

    # ---------------------------------------------------------------------------------------- restore
    def restore(self, step: int, abstract_state: dict) -> tuple[dict, Any, dict]:
        """(state placed as `abstract_state`'s shardings say, this process's data state, run config dict)."""
        step = self.resolve_step(step)
        self.verify(step)
        ab = abstract_state
        _check_layout(os.path.join(self.directory, str(step)),
                      {"params": ab["params"], "opt_state": ab["opt_state"],
                       "train_state": {k: ab[k] for k in STATE_KEYS}})
        r = self._restore(step, ocp.args.Composite(
            params=ocp.args.StandardRestore(ab["params"]),
            opt_state=ocp.args.StandardRestore(ab["opt_state"]),
            train_state=ocp.args.StandardRestore({k: ab[k] for k in STATE_KEYS}),
            data_iter=ocp.args.JsonRestore(),
            run_config=ocp.args.JsonRestore(),
        ), "the train state into the current model/optimizer layout")
        state = {"params": r.params, "opt_state": r.opt_state, **dict(r.train_state)}
        data = r.data_iter
        if data["process_count"] != jax.process_count():
            raise CheckpointError(
                f"{self.directory}/{step}: saved by {data['process_count']} processes, resumed with "
                f"{jax.process_count()}; the data position cannot be carried over exactly")
        return state, data["states"][jax.process_index()], r.run_config

    def restore_newest_intact(self, abstract_state: dict, *, fallback: bool = True,
                              log: Callable[[str], None] = print):
        """(step, state, data state, run config) of the newest step that verifies and restores, or None when the
        workdir has no step. A broken newer step is logged and moved to checkpoints_corrupt/ (so training can
        write that step again); with `fallback=False` it is an error instead."""
        for step in reversed(self.all_steps()):
            try:
                state, data, run_config = self.restore(step, abstract_state)
            except CheckpointError as e:
                if "is corrupt" not in str(e) or not fallback:
                    raise
                older = [s for s in self.all_steps() if s < step]
                if not older:
                    raise CheckpointError(f"{e}; no older step to fall back to") from None
                log(f"resume: {e}; falling back to step {older[-1]} (checkpoint.fallback=false to stop instead)")
                self._quarantine(step)
                continue
            return step, state, data, run_config
        return None

    def _quarantine(self, step: int) -> None:
        if jax.process_index() == 0:
            os.makedirs(self.corrupt_dir, exist_ok=True)
            dest = os.path.join(self.corrupt_dir, str(step))
            if os.path.exists(dest):
                shutil.rmtree(dest)
            shutil.move(os.path.join(self.directory, str(step)), dest)
            record = os.path.join(self.sums_dir, f"{step}.json")
            if os.path.exists(record):
                os.remove(record)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"quarantine checkpoint {step}")
        self.manager.reload()

    def restore_params(self, step: int | None, abstract_params) -> tuple[Any, int]:
        """Only the parameters (for SFT initialisation and export): (params, step)."""
        step = self.resolve_step(step)
        self.verify(step)
        _check_layout(os.path.join(self.directory, str(step)), {"params": abstract_params})
        r = self._restore(step, ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params)),
                          "params for this model")
        return r.params, step

    def restore_lagged(self, step: int, abstract_params, versions) -> dict:
        """The policy versions `versions` saved with `step` (`save`'s `lagged`), each placed as `abstract_params`."""
        step = self.resolve_step(step)
        if not versions:
            return {}
        r = self._restore(step, ocp.args.Composite(lagged_params=ocp.args.StandardRestore(
            {f"v{v}": abstract_params for v in versions})), f"the policy versions {list(versions)}")
        return {v: r.lagged_params[f"v{v}"] for v in versions}

    def _restore(self, step: int, args, what: str):
        """`manager.restore(step, args)`; a layout mismatch or a damaged step becomes one CheckpointError."""
        try:
            return self.manager.restore(step, args=args)
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{self.directory}/{step}: cannot restore {what} ({_first_line(e)})") from None
        except Exception as e:  # noqa: BLE001 - orbax / TensorStore read errors of a damaged step
            raise CheckpointError(f"checkpoint step {step} is corrupt: {self.directory}/{step} cannot be read "
                                  f"({_first_line(e)})") from None

    def run_config(self, step: int | None = None) -> dict:
        """The run config stored with a step (latest by default)."""
        step = self.resolve_step(step)
        try:
            return self.manager.restore(step, args=ocp.args.Composite(run_config=ocp.args.JsonRestore())).run_config
        except Exception as e:  # noqa: BLE001 - unreadable or damaged metadata of a step
            raise CheckpointError(f"checkpoint step {step} is corrupt: {self.directory}/{step}/run_config cannot "
                                  f"be read ({_first_line(e)})") from None


def abstract_like(tree, shardings):
    """ShapeDtypeStructs carrying shardings: the restore target for orbax."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def load_trained(workdir: str, step: int | None = None):
    """The parameters of a training workdir's checkpoint at `step` (latest if None), in float32:
    (model config, params, step, the run's tokenizer spec or None). Used by export, `serve`, `rollout`, the
    evaluations and the RL stages' frozen models."""
    ck = Checkpointer(workdir, read_only=True)
    try:
        step = ck.resolve_step(step)
        run = ck.run_config(step)
        mc = model_from_dict(run["model"]).replace(param_dtype="float32", dtype="float32")
        mesh = sharding.make_mesh({"fsdp": -1})
        target = abstract_like(models.abstract_params(mc), models.param_shardings(mc, mesh))
        params, step = ck.restore_params(step, target)
    finally:
        ck.close()
    return mc, params, step, (run.get("tokenizer") or {}).get("name")
