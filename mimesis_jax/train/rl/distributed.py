"""The multi-process side of both RL stages (train/rl/learner.py): which tasks a process runs, gathering the
per-episode summaries, the sampler's copy of the parameters, and the seeds that make a P-process run sample the
one-process run's episodes.

Several processes (jax.distributed, `--distributed`; launch/*.sh): every process draws the same task list,
samples only its share (`process_share`: task i on process i % P, every rollout of a group with it, so group
statistics -- Eq 4-5 advantages, FoldGRPO -- are exact locally) with a process-local copy of the policy
(`rollout_params`), and the kept groups of all processes, in group-id order, are cut into the same PPO
mini-batches everywhere (`global_groups`). Step metrics are computed from per-episode summaries gathered from every
process (`gather_list`, identical on all); process 0 logs (`primary_log`).
"""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from mimesis_jax.checkpoints import gather_json


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
    full = multihost_utils.process_allgather(params, tiled=True)
    return jax.device_put(full, jax.local_devices()[0])


def step_array(step: int, mesh):
    """The train state's step counter as a replicated (global) array, as a checkpoint on many hosts needs."""
    return jax.device_put(np.asarray(step, np.int32), NamedSharding(mesh, PartitionSpec()))
