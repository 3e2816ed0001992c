"""The programs a run compiles, built by the loops' own code on abstract inputs, with the per-device bytes of
XLA's memory analysis next to the planner's (tests/test_plan.py compares them; a `plan --compiled` command is
planned, not built yet).

Nothing is allocated: each program is lowered on jax.ShapeDtypeStruct inputs carrying the NamedShardings the loop
places its arrays with, and compiled ahead of time:

* `lm_step_memory`: the LM train step of train/loop.py `compiled_functions` (its state shardings, the batch over the
  batch mesh axes);
* `rl_step_memory`: the RL update of train/rl/step.py `make_rl_step`, built as the learner builds it (with the
  optimizer's schedule), on one Workload's shapes;
* `sampler_memory`: the static sampler's `generate_bucket` on the training mesh (params as the learner shards
  them, inputs over the batch axes).

Not built here yet: the old-log-prob scoring pass and the rollout engine's programs.

Compiled bytes of one call: arguments + results - results aliased to donated arguments + scratch.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from mimesis_jax import models, sharding
from mimesis_jax.algorithms.rl_batch import BRANCH_KEYS, TOKEN_KEYS, TRUNK_KEYS
from mimesis_jax.models.config import ConfigError, ModelConfig
from mimesis_jax.plan.workload import Workload
from mimesis_jax.profiling import memory_bytes

# CPU code generation options only (LLVM effort): XLA's buffer assignment, hence the memory analysis, is unchanged;
# the compiles take half the time.
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
TOLERANCE = 0.15  # |planned / compiled - 1| the tests accept


def compiled_total(compiled) -> int:
    """Peak bytes of one call per device: arguments + results - results aliased to donated arguments + scratch."""
    temp, output = memory_bytes(compiled)
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes) + output - int(m.alias_size_in_bytes) + temp


def within(planned: int, compiled: int, tol: float = TOLERANCE) -> bool:
    return abs(planned / compiled - 1) <= tol


def abstract(tree, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


def need_devices(mesh: dict) -> None:
    """ConfigError unless this process sees at least the mesh's devices (fake CPU devices will do)."""
    n, have = math.prod(mesh.values()), jax.device_count()
    if have < n:
        raise ConfigError(f"--compiled: the mesh {mesh} needs {n} devices, this process sees {have}; run with "
                          f"XLA_FLAGS=--xla_force_host_platform_device_count={n} JAX_PLATFORMS=cpu")


def _mesh(axes: dict):
    need_devices(axes)
    return sharding.make_mesh(axes)


# ------------------------------------------------------------------------------------------- programs
def lm_step_memory(mc: ModelConfig, rows: int, T: int, axes: dict, grad_accum: int, opt_cfg, total_steps: int = 10,
                   skip_nonfinite: bool = False) -> int:
    """The LM train step of train/loop.py (`compiled_functions`) on `rows` rows of T tokens."""
    from mimesis_jax.train.loop import compiled_functions

    mesh = _mesh(axes)
    _, _, abs_state, shard, _, step = compiled_functions(mc, opt_cfg, total_steps, mesh, grad_accum, skip_nonfinite)
    batch = {k: jax.ShapeDtypeStruct((rows, T), jnp.float32 if k == "loss_mask" else jnp.int32,
                                     sharding=sharding.batch_sharding(mesh, (rows, T)))
             for k in ("tokens", "positions", "segment_ids", "loss_mask")}
    with sharding.use_mesh(mesh):
        return compiled_total(step.jitted.lower(abstract(abs_state, shard), batch).compile(FAST))


def rl_batch_shapes(w: Workload) -> dict[str, tuple[tuple[int, ...], object]]:
    """The [M, B/M, ...] arrays of one update as the packer lays them out (algorithms/rl_batch.py: trunk and
    per-token arrays, the head index, with fused CSD branches the branch arrays and their head index)."""
    M, B = w.microbatches, w.rows // w.microbatches
    shapes = {k: ((M, B, w.row_len), jnp.int32) for k in TRUNK_KEYS}
    shapes |= {k: ((M, B, w.row_len), jnp.int32 if k == "teacher_src" else jnp.float32) for k in TOKEN_KEYS}
    shapes["head_idx"] = ((M, B, w.head_len), jnp.int32)
    if w.branch_len:
        shapes |= {k: ((M, B, w.branch_len), jnp.int32) for k in BRANCH_KEYS}
        shapes["branch_head_idx"] = ((M, B, w.branch_head_len), jnp.int32)
    return shapes


def rl_step_memory(w: Workload, rl) -> int:
    """The RL update of train/rl/step.py, built as train/rl/learner.py `setup` builds it."""
    from mimesis_jax.train.optim import make_optimizer, make_schedule
    from mimesis_jax.train.rl.step import make_rl_step

    mesh = _mesh(w.mesh)
    tx = make_optimizer(w.optimizer, w.total_updates, w.model)
    step = make_rl_step(w.model, tx, mesh, rl, schedule=make_schedule(w.optimizer, w.total_updates))
    params = abstract(models.abstract_params(w.model), models.param_shardings(w.model, mesh))
    opt = abstract(jax.eval_shape(tx.init, models.abstract_params(w.model)), step._opt_shardings(params))
    batch = {k: jax.ShapeDtypeStruct(s, d, sharding=step._batch_sharding(s)) for k, (s, d) in rl_batch_shapes(w).items()}
    ref = params if getattr(rl, "kl_coef", 0.0) > 0 else None
    return compiled_total(step.lower(params, opt, batch, ref).compile(FAST))


def sampler_memory(w: Workload, filtering: int = 0, stops: int = 0) -> int:
    """One `generate_bucket` call of w.rollout's shapes on the training mesh, inputs as sampler._generate_chunk
    places them (`filtering`: the static candidate count; 0 with the policy's top_k = 0, top_p = 1; `stops`: the
    stop-token columns, 0 = the bucket of one stop token)."""
    from mimesis_jax.rollout import sampler

    mesh = _mesh(w.mesh)
    r = w.rollout
    B, Pl = r.batch, r.prompt_len
    params = abstract(models.abstract_params(w.model), models.param_shardings(w.model, mesh))

    def arr(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding.batch_sharding(mesh, shape, w.model))

    i32, f32 = jnp.int32, jnp.float32
    S = stops or sampler.Buckets().stops(1)
    inputs = (arr((B, Pl), i32), arr((B, Pl), i32), arr((B, Pl), i32), arr((B,), i32), arr((B,), f32), arr((B,), f32),
              arr((B,), i32), arr((B,), f32), arr((B,), i32), arr((B, S), i32), arr((B,), jnp.uint32),
              arr((B,), jnp.uint32), arr((B,), jnp.bool_))
    with sharding.use_mesh(mesh):
        lowered = sampler.generate_bucket.lower(w.model, params, r.new_tokens, filtering, *inputs)
    return compiled_total(lowered.compile(FAST))
