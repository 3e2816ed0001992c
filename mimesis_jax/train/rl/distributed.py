"""The multi-process side of both RL stages (train/rl/learner.py): which tasks a process runs, gathering the
per-episode summaries, the sampler's copy of the parameters, and the seeds that make a P-process run sample the
one-process run's episodes.

Several processes (jax.distributed, `--distributed`; launch/*.sh): every process draws the same task list,
samples only its share (`process_share`: task i on process i % P, every rollout of a group with it, so group
statistics -- Eq 4-5 advantages, FoldGRPO -- are exact locally) with a process-local copy of the policy sharded
over its own devices (`rollout_params` on `local_rollout_mesh`), and the kept groups of all processes, in
group-id order, are cut into the same PPO mini-batches everywhere (`global_groups`). Step metrics are computed
from per-episode summaries gathered from every process (`gather_list`, identical on all); process 0 logs
(`primary_log`).
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mimesis_jax import models
from mimesis_jax.checkpoints import gather_json
from mimesis_jax.errors import ConfigError
from mimesis_jax.inference.weight_sync import WeightSync, rollout_sync
from mimesis_jax.config.layout import decode_layout, rollout_layout
from mimesis_jax.config.rl import RolloutSection
from mimesis_jax.sharding import layout_mesh, local_rollout_mesh


def step_seed(seed: int, step: int) -> int:
    """The rollout seed of RL step `step` (0-based): a pure function of (train.seed, step), so resumes match.

    Multi-process contract: the seed does not depend on the process. Every process draws the same task list
    (identical samplers), runs the tasks of `process_share`, and each episode's seeds derive from (this seed, the
    task's GLOBAL group index, its GLOBAL rollout id, turn) -- so the union of the processes' episodes is the
    episode set of a one-process run, and a run is reproducible for any fixed process count (the updates equal
    the one-process run's up to fp32 summation order: the packed rows are laid out per process)."""
    return int(np.random.SeedSequence([seed, step + 1]).generate_state(1)[0])


def is_primary() -> bool:
    return jax.process_index() == 0


def primary_log(log):
    """`log` on process 0, a no-op elsewhere (every process computes the same numbers)."""
    return log if is_primary() else (lambda *a, **k: None)


def process_share(n: int, first: int = 0) -> list[int]:
    """The indices k < n of n consecutive tasks of a step, from its task `first` on (a part of the step rolled on
    its own, rl.async_early_updates: its first task's place in the step), that this process runs: task first + k of
    the step runs on process (first + k) % process_count, whatever part it is rolled in. Whole GRPO groups stay on
    their process (every rollout of a task runs there), so group statistics (Eq 4-5 advantages, FoldGRPO's
    unique-rollout counts) are exact locally; interleaving spreads the consecutive groups of each PPO mini-batch
    over the processes."""
    p, i = jax.process_count(), jax.process_index()
    return [k for k in range(n) if (first + k) % p == i]


def process_max_batch(max_batch: int) -> int:
    """`rollout.max_batch` on this process. The key caps the sequences of one sampler call on the whole mesh; each
    of P processes samples on its 1/P of the devices (`rollout_mesh`), so it calls with at most
    ceil(max_batch / P): the per-device batch, hence the KV cache `plan` sized, is the one-process run's whatever
    the process count (docs/decisions.md, "Rollouts on the mesh"). 0 (no cap) stays 0."""
    return -(-max_batch // jax.process_count()) if max_batch else 0


def gather_list(items: Sequence) -> list:
    """Every process's JSON-ready `items`, concatenated in process order (the list itself on one process)."""
    if jax.process_count() == 1:
        return list(items)
    return [x for part in gather_json(list(items)) for x in part]


def global_groups(local_ids: Sequence[int]) -> list[int]:
    """The sorted union over processes of group ids (e.g. the groups kept for training)."""
    return sorted({int(g) for g in gather_list(list(local_ids))})


def layout_of(rollout, mesh=None) -> dict | None:
    """The layout decode runs in for `rollout`: a rollout section (config/rl.py RolloutSection: `rollout.mesh`, and
    with `rollout.engine` or a rollout pool (`rollout.devices`) and no `rollout.mesh` the engine's replica layout
    over `mesh`'s tensor axis, config/layout.py decode_layout), or the key's text itself, or None; None (the
    training layout) where it is unset or "", the engine is off and there is no pool."""
    if rollout is None or isinstance(rollout, str):
        return rollout_layout(rollout or "")
    tensor = 1 if mesh is None else dict(mesh.shape).get("tensor", 1)
    return decode_layout(rollout.mesh, rollout.engine or pool_size(rollout) > 0, tensor)


# ------------------------------------------------------------------------------------------ the rollout pool
# `rollout.devices` = N > 0 (config/rl.py): each process's last N devices sample (the policy and the in-process
# frozen models), the training mesh holds the rest -- on several processes every process's other devices; the two
# run their programs at the same time (async_rollouts.py). Each process samples its share of the tasks on its own
# pool (`pool_mesh`) and copies the weights into it from its own training devices (`_to_pool`).
def pool_size(rollout) -> int:
    """`rollout.devices` of a rollout section (config/rl.py RolloutSection): the devices per process of the rollout
    pool (0: none, also for a `rollout.mesh` text, no section or another object with the layout fields)."""
    return int(rollout.devices) if isinstance(rollout, RolloutSection) else 0


def _process_devices(process: int) -> list:
    return [d for d in jax.devices() if d.process_index == process]


def pool_devices(n: int, process: int | None = None) -> list:
    """This process's (or `process`'s) rollout pool: its last `n` devices in jax.devices() order. ConfigError
    naming rollout.devices unless at least one device is left to train on."""
    mine = _process_devices(jax.process_index() if process is None else process)
    if not 0 < n < len(mine):
        raise ConfigError(f"config key 'rollout.devices': {n} leaves no device to train on a process of "
                          f"{len(mine)} devices; use 1 to {len(mine) - 1}, or 0 (the rollouts share the training "
                          "devices)")
    return mine[-n:]


def training_devices(rollout) -> list | None:
    """The devices the training mesh is built on: every process's devices but its rollout pool (`pool_devices`),
    in jax.devices() order; None (all of them) without a pool."""
    n = pool_size(rollout)
    if not n:
        return None
    pools = {d.id for p in range(jax.process_count()) for d in pool_devices(n, p)}
    return [d for d in jax.devices() if d.id not in pools]


def pool_mesh(rollout, mesh: Mesh) -> Mesh:
    """The mesh the rollout pool samples on: its devices laid out as `layout_of` says (rollout.mesh, else
    data-parallel replicas x the training mesh's tensor split), fsdp 1. ConfigError naming rollout.devices where
    that layout does not split the pool, or its tensor split does not split the training devices (the weights are
    laid out that way on them first: `rollout_params`)."""
    n, layout = pool_size(rollout), layout_of(rollout, mesh)
    t = layout["tensor"] if layout["tensor"] > 0 else n // layout["replica"]
    train = len(jax.devices()) // jax.process_count() - n
    if n % t or train % t:
        raise ConfigError(f"config key 'rollout.devices': a pool of {n} devices beside {train} training devices "
                          f"per process cannot both split tensor={t} ways (the rollout layout's tensor axis); "
                          "choose a multiple of it, or set rollout.mesh")
    block = Mesh(np.asarray(pool_devices(n), dtype=object).reshape(1, n, 1), ("data", "fsdp", "tensor"))
    return layout_mesh(block, layout)


def _to_pool(config, params, mesh: Mesh, rollout, engine: bool = False):
    """The training parameters copied into the rollout pool, device to device: first laid out on the training
    devices as the pool lays them out (a weight sync to replicas x the pool's tensor split, inference/
    weight_sync.py), so every shard the pool needs exists whole on some training device; then each shard copied
    to the pool devices that hold it (jax.device_put between two shardings of the same shards: no host copy).
    Several processes: the weight sync is a program over every process's training devices (every process calls
    it) that leaves on each process's own training devices the copy its pool needs, each shard then copied within
    the process; nothing is gathered on a host."""
    pool = pool_mesh(rollout, mesh)
    staged = _weight_sync(config, mesh, (("replica", -1), ("tensor", dict(pool.shape)["tensor"])), engine)(params)
    return models.shard_params(config, staged, pool)


def rollout_mesh(mesh: Mesh | None, rollout=None) -> Mesh | None:
    """The mesh this process samples on. One process: the training mesh itself (the sampler's rows split over its
    batch axes, its params sharded as the learner's). Several: this process's `local_rollout_mesh`, because each
    process samples its own episodes (`process_share`): a program over the global mesh would need every process
    to run it with the same inputs. None stays None (no mesh: one device).

    rollout: the rollout section (or its `rollout.mesh` text). With `rollout.mesh` set, or with `rollout.engine`
    (its default layout, config/layout.py engine_layout: the tensor split kept, the other devices replicas), those
    devices laid out as `layout_of` says instead (sharding.layout_mesh: data = the replicas, tensor = the
    tensor-parallel split, fsdp 1); a layout whose axes do not multiply to the process's device count is a
    ConfigError naming rollout.mesh. With a rollout pool (`rollout.devices`): the pool's own mesh (`pool_mesh`),
    devices the training mesh does not hold."""
    if mesh is None:
        return None
    if pool_size(rollout):
        return pool_mesh(rollout, mesh)
    block = mesh if jax.process_count() == 1 else local_rollout_mesh(mesh)
    return layout_mesh(block, layout_of(rollout, mesh))


def sides_mesh(mesh: Mesh | None, rollout) -> Mesh | None:
    """The mesh the in-process frozen models (user simulator, judge, coach, Stage I.3's sides) sample on: the rollout
    pool with one (`rollout.devices`), else `rollout_mesh(mesh)` (the training layout)."""
    return rollout_mesh(mesh, rollout) if pool_size(rollout) else rollout_mesh(mesh)


def host_params(params):
    """The full parameters on this process: the sharded training arrays as they are on one process; on several,
    a host (NumPy) copy gathered from every process's shards (a collective: every process calls it). What the
    rollout engine is given without a mesh (chat_models.engine_params)."""
    if jax.process_count() == 1:
        return params
    return multihost_utils.process_allgather(params, tiled=True)


def rollout_params(config, params, mesh: Mesh | None, rollout=None, engine: bool = False):
    """The parameters the sampler uses, placed on `rollout_mesh(mesh, rollout)` as `models.shard_params` lays them
    out.

    The training layout (`rollout.mesh` unset, the engine off), one process: the training parameters as they are
    (already sharded on the training mesh: no copy). Several, or a rollout layout (`rollout.mesh`, or the engine's
    default, `layout_of`) on any number of processes:
    resharded device to device from the training layout to this process's rollout mesh
    (inference/weight_sync.py: every process calls it; no host copy, no device holds more than its shards) --
    every device of every host samples, and no device holds a full fp32 copy (docs/decisions.md, "Rollouts on
    the mesh", "Rollout layout"). Without a mesh (several processes): the host-gathered copy on this process's
    first device. With a rollout pool (`rollout.devices`): copied device to device into the pool (`_to_pool`).

    engine: the rollout engine's copy (weight_sync.rollout_sync: with a weight sync, the matrices in the compute
    dtype where it is narrower, weight_sync.engine_dtype, cast exactly -- the parameters the forward casts to it
    anyway, so the samples are unchanged); else the training dtype."""
    if mesh is not None and pool_size(rollout):
        return _to_pool(config, params, mesh, rollout, engine)
    layout = layout_of(rollout, mesh)
    if mesh is not None and layout is not None:
        return _weight_sync(config, mesh, tuple(layout.items()), engine)(params)
    if jax.process_count() == 1:
        return params
    if mesh is None:
        return jax.device_put(host_params(params), jax.local_devices()[0])
    return _weight_sync(config, mesh, (), engine)(params)


@functools.lru_cache(maxsize=4)
def _weight_sync(config, mesh: Mesh, layout: tuple = (), engine: bool = False) -> WeightSync:
    return rollout_sync(config, mesh, dict(layout), engine)


def step_array(step: int, mesh):
    """The train state's step counter as a replicated (global) array, as a checkpoint on many hosts needs."""
    return jax.device_put(np.asarray(step, np.int32), NamedSharding(mesh, PartitionSpec()))
