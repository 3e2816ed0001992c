"""The sharded language-model loss and its jitted loss+grad step.

Batch convention shared by every stage of the project: a dict of [B, T] arrays

    tokens       int32   token ids (packed rows allowed)
    positions    int32   RoPE positions, restarting at each packed segment
    segment_ids  int32   1, 2, ... per packed segment; 0 = padding
    loss_mask    float32 1 where the token is a *target* (its log-prob given its prefix is trained on)

The LM loss is the token mean of -log p over target tokens of the whole (global) batch, so the normaliser
does not depend on how the batch is split over devices -- or over gradient-accumulation micro-batches:
`make_train_step` sums NLL and gradients over micro-batches and divides once by the global target count.

The train state is a plain dict pytree (what the checkpoint stores):

    params     fp32 master weights, sharded by the logical-axis rules
    opt_state  optax state; moments follow their parameter's sharding
    step       int32 scalar, optimizer steps taken
    rng        uint32 key data, split once per step (for stochastic stages; the LM loss is deterministic)
    nonfinite  int32 scalar, steps whose update was skipped because the loss or gradient was not finite
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from mimesis_jax.algorithms.logprobs import next_token_mask, token_logprobs
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.models import param_shardings
from mimesis_jax.sharding import constrain, use_mesh


def target_weights(batch) -> jax.Array:
    """[B, T-1] weights of the next-token predictions tokens[:, 1:] (0 across segment boundaries)."""
    w = batch["loss_mask"][:, 1:].astype(jnp.float32)
    if "segment_ids" in batch:
        w = w * next_token_mask(batch["segment_ids"]).astype(jnp.float32)
    return w


def lm_loss_sums(config: ModelConfig, params, batch) -> tuple[jax.Array, jax.Array]:
    """(sum of -log p over target tokens, number of target tokens) of one (micro-)batch."""
    lp = token_logprobs(config, params, batch["tokens"], batch.get("positions"), batch.get("segment_ids"))
    with jax.named_scope("loss"):
        w = target_weights(batch)
        return -(lp * w).sum(), w.sum()


def lm_loss(config: ModelConfig, params, batch) -> jax.Array:
    nll, n = lm_loss_sums(config, params, batch)
    return nll / jnp.maximum(n, 1.0)


def make_grad_step(config: ModelConfig, mesh=None, rules=None):
    """A jitted (params, batch) -> (loss, grads). With a mesh, grads come back sharded like the params.

    Inputs should already be placed (`models.shard_params`, `sharding.shard_batch`).
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


# ------------------------------------------------------------------------------------- full train step
def init_train_state(params, tx: optax.GradientTransformation, rng: jax.Array) -> dict:
    """The train-state dict of fresh parameters (call under jit with the state shardings as out_shardings).

    `rng` is a typed PRNG key or its uint32 key data.
    """
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        rng = jax.random.key_data(rng)
    return {
        "params": params,
        "opt_state": tx.init(params),
        "step": jnp.zeros((), jnp.int32),
        "rng": jnp.asarray(rng, jnp.uint32),
        "nonfinite": jnp.zeros((), jnp.int32),
    }


def split_micro_batches(x: jax.Array, n: int) -> jax.Array:
    """[B, ...] -> [n, B/n, ...] with micro-batch j = rows j, j+n, j+2n, ... .

    Strided, so that when B is split over the batch mesh axes each device's rows spread evenly over the
    micro-batches and no micro-batch idles part of the mesh (the reshape needs no communication).
    """
    B = x.shape[0]
    if B % n:
        raise ValueError(f"batch of {B} rows does not split into {n} micro-batches")
    return jnp.swapaxes(x.reshape((B // n, n) + x.shape[1:]), 0, 1)


def _accumulate(config: ModelConfig, params, batch, grad_accum: int, grad_shardings):
    """(sum NLL, target count, sum of NLL gradients) over `grad_accum` micro-batches (a lax.scan)."""
    grad_fn = jax.value_and_grad(lambda p, b: lm_loss_sums(config, p, b), has_aux=True)
    if grad_accum == 1:
        (nll, n), g = grad_fn(params, batch)
        return nll, n, g
    micro = jax.tree.map(lambda x: split_micro_batches(x, grad_accum), batch)

    def body(carry, mb):
        g_acc, nll_acc, n_acc = carry
        mb = jax.tree.map(lambda x: constrain(x, ("act_batch",) + (None,) * (x.ndim - 1), config), mb)
        (nll, n), g = grad_fn(params, mb)
        g_acc = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_acc, g)
        if grad_shardings is not None:
            g_acc = jax.lax.with_sharding_constraint(g_acc, grad_shardings)
        return (g_acc, nll_acc + nll, n_acc + n), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    if grad_shardings is not None:
        zeros = jax.lax.with_sharding_constraint(zeros, grad_shardings)
    (g, nll, n), _ = jax.lax.scan(body, (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32)), micro)
    return nll, n, g


def train_step(config: ModelConfig, tx: optax.GradientTransformation, state: dict, batch: dict, *,
               grad_accum: int = 1, skip_nonfinite: bool = False, schedule=None, grad_shardings=None):
    """One optimizer step on a global batch; returns (new state, metrics).

    loss = sum over target tokens of -log p / number of target tokens in the whole global batch; the
    gradient is that same quantity's gradient (micro-batch sums, one division). With `skip_nonfinite`
    a step whose loss or gradient norm is not finite leaves params and optimizer moments unchanged (the
    optimizer's step counts still advance) and increments `nonfinite`; otherwise the update is applied as
    computed (the host loop then stops the run).
    """
    params, opt_state = state["params"], state["opt_state"]
    nll, n, g = _accumulate(config, params, batch, grad_accum, grad_shardings)
    denom = jnp.maximum(n, 1.0)
    loss = nll / denom
    grads = jax.tree.map(lambda x, p: (x / denom).astype(p.dtype), g, params)
    grad_norm = optax.tree.norm(grads)
    with jax.named_scope("optimizer"):
        updates, new_opt = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    if skip_nonfinite:
        # Floating leaves (weights, moments) keep their old values; integer leaves (optax step counts) advance,
        # so the learning-rate schedule stays aligned with the step number after a skipped update.
        keep = lambda new, old: jax.tree.map(  # noqa: E731
            lambda a, b: jnp.where(finite, a, b) if jnp.issubdtype(a.dtype, jnp.floating) else a, new, old)
        new_params, new_opt = keep(new_params, params), keep(new_opt, opt_state)
    rng, _ = jax.random.split(jax.random.wrap_key_data(state["rng"]))
    new_state = {
        "params": new_params,
        "opt_state": new_opt,
        "step": state["step"] + 1,
        "rng": jax.random.key_data(rng),
        "nonfinite": state["nonfinite"] + (~finite).astype(jnp.int32),
    }
    metrics = {
        "loss": loss,
        "grad_norm": grad_norm,
        "target_tokens": n,
        "tokens": (batch["segment_ids"] != 0).sum().astype(jnp.float32) if "segment_ids" in batch
        else jnp.asarray(batch["tokens"].size, jnp.float32),
        "finite": finite,
        "param_norm": optax.tree.norm(new_params),
    }
    if schedule is not None:
        metrics["lr"] = jnp.asarray(schedule(state["step"]), jnp.float32)
    return new_state, metrics


def make_train_step(config: ModelConfig, tx, mesh, state_shardings, *, grad_accum: int = 1,
                    skip_nonfinite: bool = False, schedule=None, hparams=None):
    """The jitted, sharded `train_step`: (state, batch) -> (state, metrics), state donated.

    `state_shardings` is the state's pytree of NamedShardings (params by the rules, optimizer moments like
    their params, scalars replicated); the batch comes in already placed over the batch mesh axes
    (`sharding.batch_sharding`), metrics come back replicated. With `hparams` (a dict of scalars:
    train/optim.schedule_hparams) `tx` and `schedule` are functions of it, called inside the program on its traced
    values: the numbers are inputs of the compiled step, not constants in it, so runs that differ only in them
    share one program (in memory when the same, on disk through XLA's persistent compilation cache).
    """
    grad_shardings = state_shardings["params"]
    replicated = NamedSharding(mesh, P())

    def fn(state, batch, hp=None):
        t, s = (tx, schedule) if hparams is None else (tx(hp), schedule and schedule(hp))
        return train_step(config, t, state, batch, grad_accum=grad_accum, skip_nonfinite=skip_nonfinite,
                          schedule=s, grad_shardings=grad_shardings)

    jitted = jax.jit(fn, out_shardings=(state_shardings, replicated), donate_argnums=(0,))
    bound = jitted if hparams is None else _BoundHparams(jitted, hparams)

    def step(state, batch):
        with use_mesh(mesh):
            return bound(state, batch)
    step.jitted = bound
    return step


class _BoundHparams:
    """A jitted (state, batch, hparams) seen as (state, batch): calls and `lower` pass the run's hparams."""

    def __init__(self, jitted, hparams):
        self.jitted, self.hparams = jitted, hparams

    def __call__(self, state, batch):
        return self.jitted(state, batch, self.hparams)

    def lower(self, state, batch):
        return self.jitted.lower(state, batch, self.hparams)
