"""The sharded language-model loss and step, and the two pieces every training step of the project is built from.

One step design. Every step -- the LM step here (`make_train_step`) and the RL update (train/rl/step.py
`RLStep`) -- is `accumulate_gradients` (a lax.scan over micro-batches around a callback giving one micro-batch's
loss and metric sums; gradients summed in the parameters' dtype and sharding) followed by `apply_gradients` (the
optax update). The state is the train-state dict below (`init_train_state`, what the checkpoints store); the RL
update takes its params and opt_state. The learning rate of an update is read from the optimizer's own update
count (`schedule_count`: optax's ScaleByScheduleState.count, the updates applied so far), the count the optimizer
itself applies the schedule at; never from `step`, which counts steps (an RL step makes one update per mini-batch,
or none).

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
    step       int32 scalar, steps taken (an LM step is one optimizer update; an RL step makes several or none)
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


def schedule_count(opt_state) -> jax.Array:
    """The update count the optimizer's learning-rate schedule reads (optax's ScaleByScheduleState.count): the
    number of updates applied so far; the next update uses schedule(count)."""
    is_sched = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
    found = [x for x in jax.tree.leaves(opt_state, is_leaf=is_sched) if is_sched(x)]
    if len(found) != 1:
        raise ValueError(f"step(schedule=...): the optimizer state holds {len(found)} learning-rate schedule "
                         "counts (optax ScaleByScheduleState), not one: build the optimizer with one schedule "
                         "(train/optim.make_optimizer)")
    return found[0].count


def accumulate_gradients(loss_sums, params, micro_batches, *, grad_shardings=None, stacked: bool = True):
    """The gradient accumulation of every step: (loss sum, gradient sum, metric sums) over micro-batches.

    `loss_sums(params, mb) -> (loss, sums)`: the loss of one micro-batch (differentiated) and a dict of metric
    sums (not differentiated). `micro_batches` is a pytree of [M, ...] arrays, scanned over M (lax.scan), each
    micro-batch's gradient added in turn; `stacked=False` takes one batch (no leading axis): one gradient, no loop
    and nothing to accumulate. The accumulator is in each parameter's dtype and, given `grad_shardings` (the
    params' shardings), laid out like the parameter, as is each micro-batch's gradient before it is added.
    """
    grad_fn = jax.value_and_grad(loss_sums, has_aux=True)

    def constrained(g):
        return g if grad_shardings is None else jax.lax.with_sharding_constraint(g, grad_shardings)

    if not stacked:
        (loss, sums), g = grad_fn(params, micro_batches)
        return loss, g, sums

    def body(carry, mb):
        loss_acc, g_acc, sums_acc = carry
        (loss, sums), g = grad_fn(params, mb)
        g_acc = constrained(jax.tree.map(lambda a, b: a + b.astype(a.dtype), g_acc, constrained(g)))
        return (loss_acc + loss, g_acc, jax.tree.map(jnp.add, sums_acc, sums)), None

    loss0, sums0 = jax.eval_shape(lambda: loss_sums(params, jax.tree.map(lambda x: x[0], micro_batches)))
    zeros = lambda tree: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), tree)  # noqa: E731
    init = (zeros(loss0), constrained(zeros(params)), zeros(sums0))
    (loss, g, sums), _ = jax.lax.scan(body, init, micro_batches)
    return loss, g, sums


def apply_gradients(tx: optax.GradientTransformation, params, opt_state, grads, schedule=None):
    """The optimizer update of every step: (new params, new optimizer state, the schedule count n it read).

    The learning rate of this update is schedule(n), n = schedule_count(opt_state) the updates applied before it
    (the LR source of every step: the optimizer's own count); n is None without a `schedule`.
    """
    with jax.named_scope("optimizer"):
        n = None if schedule is None else schedule_count(opt_state)
        updates, new_opt = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_opt, n


def _lm_loss_sums(config: ModelConfig, constrain_rows: bool):
    """The LM loss callback of `accumulate_gradients`: (NLL sum, {"targets": target count})."""
    def fn(params, mb):
        if constrain_rows:
            mb = jax.tree.map(lambda x: constrain(x, ("act_batch",) + (None,) * (x.ndim - 1), config), mb)
        nll, n = lm_loss_sums(config, params, mb)
        return nll, {"targets": n}
    return fn


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
    micro = batch if grad_accum == 1 else jax.tree.map(lambda x: split_micro_batches(x, grad_accum), batch)
    nll, g, sums = accumulate_gradients(_lm_loss_sums(config, grad_accum > 1), params, micro,
                                        grad_shardings=grad_shardings, stacked=grad_accum > 1)
    n = sums["targets"]
    denom = jnp.maximum(n, 1.0)
    loss = nll / denom
    grads = jax.tree.map(lambda x, p: (x / denom).astype(p.dtype), g, params)
    grad_norm = optax.tree.norm(grads)
    new_params, new_opt, count = apply_gradients(tx, params, opt_state, grads, schedule)
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
        metrics["lr"] = jnp.asarray(schedule(count), jnp.float32)
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
