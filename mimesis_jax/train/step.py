"""The sharded language-model loss and its jitted loss+grad step.

Batch convention shared by every stage of the project: a dict of [B, T] arrays

    tokens       int32   token ids (packed rows allowed)
    positions    int32   RoPE positions, restarting at each packed segment
    segment_ids  int32   1, 2, ... per packed segment; 0 = padding
    loss_mask    float32 1 where the token is a *target* (its log-prob given its prefix is trained on)

The LM loss is the token mean of -log p over target tokens of the whole (global) batch, so the normaliser
does not depend on how the batch is split over devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mimesis_jax.algorithms.logprobs import next_token_mask, token_logprobs
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.sharding import param_shardings, use_mesh


def target_weights(batch) -> jax.Array:
    """[B, T-1] weights of the next-token predictions tokens[:, 1:] (0 across segment boundaries)."""
    w = batch["loss_mask"][:, 1:].astype(jnp.float32)
    if "segment_ids" in batch:
        w = w * next_token_mask(batch["segment_ids"]).astype(jnp.float32)
    return w


def lm_loss_sums(config: ModelConfig, params, batch) -> tuple[jax.Array, jax.Array]:
    """(sum of -log p over target tokens, number of target tokens) of one (micro-)batch."""
    lp = token_logprobs(config, params, batch["tokens"], batch.get("positions"), batch.get("segment_ids"))
    w = target_weights(batch)
    return -(lp * w).sum(), w.sum()


def lm_loss(config: ModelConfig, params, batch) -> jax.Array:
    nll, n = lm_loss_sums(config, params, batch)
    return nll / jnp.maximum(n, 1.0)


def make_grad_step(config: ModelConfig, mesh=None, rules=None):
    """A jitted (params, batch) -> (loss, grads). With a mesh, grads come back sharded like the params.

    Inputs should already be placed (`sharding.shard_params`, `sharding.shard_batch`).
    """
    fn = jax.value_and_grad(lambda p, b: lm_loss(config, p, b))
    if mesh is None:
        return jax.jit(fn)
    ps = param_shardings(config, mesh, rules)
    jitted = jax.jit(fn, out_shardings=(jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()), ps))

    def step(params, batch):
        with use_mesh(mesh):
            return jitted(params, batch)
    return step
