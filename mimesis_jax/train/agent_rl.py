"""Stage II update: one jitted, sharded multi-turn GRPO (+ CSD) step on packed dialogues (paper.md §4.1-4.2).

    rl = RLConfig(alpha=0.01, beta=5.0, num_microbatches=4)
    step = make_rl_step(config, optax.adamw(1e-6), mesh, rl)
    opt_state = step.init_opt_state(params)                    # sharded like the params
    packed = prepare_batch(trajectories, rl, rows_multiple=step.rows_multiple(), row_len=4096)
    batch = step.place(packed)                                 # [M, B/M, ...] on the mesh
    batch = step.recompute_old_logprobs(params, batch)         # only with rl.old_logprobs == "recompute"
    params, opt_state, metrics = step(params, opt_state, batch)

The step scans over the M micro-batches (gradient accumulation in the parameters' dtype and sharding), then
applies the optimizer once. Loss per micro-batch (Eq 11): L = L_GRPO (Eq 6) + alpha L_CSD (Eq 10). Both
normalisers (agent tokens or sequences for GRPO, coached tokens for CSD) are counts of the whole batch folded
into per-token weights on the host (algorithms/rl_batch.py), so the accumulated sum is the global loss
whatever the number of micro-batches or devices. With alpha == 0, or a batch without coached turns, no
teacher work is traced at all: the step is exactly the GRPO step.

Metrics (global over the batch): loss, grpo_loss, csd_loss (L_CSD before alpha), mean_w (Eq 9 weight over
coached tokens), frac_delta_pos (fraction of coached tokens with Delta > 0), clip_frac (agent tokens whose
clip is active), entropy (mean -log pi_theta of the sampled agent tokens: a one-sample entropy estimate),
approx_kl (mean log pi_old - log pi_theta), grad_norm (before the optimizer), agent_tokens, coached_tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from mimesis_jax import sharding
from mimesis_jax.algorithms import csd, grpo
from mimesis_jax.algorithms.rl_batch import PackedRL, pack_trajectories
from mimesis_jax.models.config import ModelConfig

OLD_LOGPROBS = ("rollout", "recompute")


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """Hyper-parameters of the Stage II update (defaults: paper.md §4.1 Table 13 and UserRL settings)."""

    eps_low: float = 0.2  # Eq 6 lower clip range
    eps_high: float = 0.2  # Eq 6 upper clip range
    loss_agg: str = "token-mean"  # token-mean | seq-mean (grpo.loss_token_weights)
    alpha: float = 0.01  # Eq 11 weight of L_CSD; 0 = plain GRPO
    beta: float = 5.0  # Eq 9 temperature of the CSD weight
    teacher: str = "fused"  # fused (one pass) | naive (reference: separate teacher rows)
    old_logprobs: str = "rollout"  # rollout (Segment.logprobs) | recompute (scoring pass before the update)
    num_microbatches: int = 1
    # advantages (host side, grpo.trajectory_turn_advantages)
    credit: str = "equalized"
    score: str = "sum"
    gamma: float = 0.8
    adv_eps: float = 1e-6
    divide_std: bool = True

    def __post_init__(self):
        def need(cond, key, msg):
            if not cond:
                raise ValueError(f"RLConfig key '{key}': {msg} (got {getattr(self, key)!r})")

        need(self.eps_low >= 0 and self.eps_high >= 0, "eps_low", "clip ranges must be >= 0")
        need(self.loss_agg in grpo.LOSS_AGGS, "loss_agg", f"must be one of {grpo.LOSS_AGGS}")
        need(self.alpha >= 0, "alpha", "must be >= 0")
        need(self.beta > 0, "beta", "must be > 0")
        need(self.teacher in ("fused", "naive"), "teacher", "must be fused or naive")
        need(self.old_logprobs in OLD_LOGPROBS, "old_logprobs", f"must be one of {OLD_LOGPROBS}")
        need(isinstance(self.num_microbatches, int) and self.num_microbatches >= 1, "num_microbatches", ">= 1")
        need(self.credit in grpo.CREDIT_METHODS, "credit", f"must be one of {grpo.CREDIT_METHODS}")
        need(self.score in grpo.SCORE_METHODS, "score", f"must be one of {grpo.SCORE_METHODS}")


def prepare_batch(trajectories: Sequence, rl: RLConfig, **pack_kw) -> PackedRL:
    """Advantages (grpo) + packing (rl_batch) of one optimizer step's trajectories, on the host."""
    adv = grpo.trajectory_turn_advantages(trajectories, credit=rl.credit, score=rl.score, gamma=rl.gamma,
                                          eps=rl.adv_eps, divide_std=rl.divide_std)
    teacher = rl.teacher if rl.alpha > 0 else "none"
    return pack_trajectories(trajectories, adv, teacher=teacher, loss_agg=rl.loss_agg,
                             use_rollout_logprobs=rl.old_logprobs == "rollout", **pack_kw)


def batch_teacher(batch, rl: RLConfig) -> str:
    """The teacher layout a (traced) batch carries and the step uses: none when alpha == 0."""
    if rl.alpha == 0:
        return "none"
    if "branch_tokens" in batch:
        return "fused"
    if "naive_tokens" in batch:
        return "naive"
    return "none"


def rl_loss(config: ModelConfig, rl: RLConfig, params, mb, teacher: str | None = None):
    """Eq 11 on one micro-batch: (loss, sums for the metrics). `teacher` overrides the batch's layout
    (tests use it to run the teacher pass with alpha = 0)."""
    teacher = batch_teacher(mb, rl) if teacher is None else teacher
    student, teacher_lp = csd.student_teacher_logprobs(config, params, mb, teacher)
    agent = mb["agent_mask"]
    l_grpo, clipped = grpo.grpo_loss(student, mb["old_logp"], mb["advantages"], mb["grpo_weight"], rl.eps_low,
                                     rl.eps_high)
    sg_student = jax.lax.stop_gradient(student)
    sums = {
        "grpo_loss": l_grpo,
        "clipped": jnp.sum(clipped * agent),
        "neg_logp": -jnp.sum(jnp.where(agent > 0, sg_student, 0.0)),
        "log_ratio": jnp.sum(jnp.where(agent > 0, mb["old_logp"] - sg_student, 0.0)),
        "agent": jnp.sum(agent),
    }
    if teacher_lp is None:
        return l_grpo, sums | {"csd_loss": jnp.zeros(()), "w": jnp.zeros(()), "delta_pos": jnp.zeros(()),
                               "coached": jnp.sum(mb["coached_mask"])}
    coached = mb["coached_mask"]
    delta = jnp.where(coached > 0, csd.csd_delta(teacher_lp, student), 0.0)
    w = csd.csd_weights(delta, rl.beta)
    l_csd = csd.csd_loss(student, w, mb["csd_weight"])
    sums |= {"csd_loss": l_csd, "w": jnp.sum(w * coached), "delta_pos": jnp.sum((delta > 0) * coached),
             "coached": jnp.sum(coached)}
    return csd.combined_loss(l_grpo, l_csd, rl.alpha), sums


def _zeros(tree):
    return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), tree)


class RLStep:
    """The jitted, sharded GRPO(+CSD) update; see the module docstring. Build with `make_rl_step`."""

    def __init__(self, config: ModelConfig, optimizer: optax.GradientTransformation, mesh=None,
                 rl: RLConfig = RLConfig()):
        self.config, self.optimizer, self.mesh, self.rl = config, optimizer, mesh, rl
        self._param_sh = None if mesh is None else sharding.param_shardings(config, mesh)
        self._opt_sh = None
        self._step = None
        self._lg = None
        self._score = jax.jit(self._score_fn)

    # ---------------------------------------------------------------------------------- placement
    def rows_multiple(self) -> int:
        """Row counts must be a multiple of this: micro-batches x batch-sharding devices."""
        return self.rl.num_microbatches * sharding.batch_shard_count(self.mesh, self.config)

    def _batch_sharding(self, shape):
        spec = sharding.logical_to_spec((None, "act_batch") + (None,) * (len(shape) - 2), shape,
                                        dict(self.mesh.shape), self.config)
        return NamedSharding(self.mesh, spec)

    def place(self, packed: PackedRL | dict) -> dict:
        """Host arrays -> [M, B/M, ...] device arrays, rows split over the mesh's batch axes."""
        arrays = packed.microbatches(self.rl.num_microbatches) if isinstance(packed, PackedRL) else packed
        if isinstance(packed, PackedRL) and self.rl.old_logprobs == "rollout" and not packed.old_logp_from_rollout:
            raise ValueError("the batch was packed without rollout log-probs but RLConfig.old_logprobs='rollout'")
        if self.mesh is None:
            return {k: jnp.asarray(v) for k, v in arrays.items()}
        return {k: jax.device_put(v, self._batch_sharding(v.shape)) for k, v in arrays.items()}

    def init_opt_state(self, params):
        """Optimizer state, every parameter-shaped leaf sharded like its parameter."""
        if self.mesh is None:
            return jax.jit(self.optimizer.init)(params)
        return jax.jit(self.optimizer.init, out_shardings=self._opt_shardings(params))(params)

    def _opt_shardings(self, params):
        if self._opt_sh is None:
            abstract = jax.eval_shape(self.optimizer.init, params)
            rep = NamedSharding(self.mesh, P())
            self._opt_sh = optax.tree_map_params(self.optimizer, lambda _, s: s, abstract, self._param_sh,
                                                 transform_non_params=lambda _: rep)
        return self._opt_sh

    # ------------------------------------------------------------------------------ old log-probs
    def _score_fn(self, params, batch):
        def one(mb):
            return jnp.where(mb["agent_mask"] > 0, csd.student_logprobs(self.config, params, mb), 0.0)
        return jax.lax.map(one, batch)

    def recompute_old_logprobs(self, params, batch: dict) -> dict:
        """batch with old_logp = log pi_theta of the current params (a no-gradient scoring pass)."""
        with self._mesh_ctx():
            old = self._score(params, {k: batch[k] for k in ("tokens", "positions", "segment_ids", "agent_mask")})
        return dict(batch, old_logp=old)

    # ------------------------------------------------------------------------------------- update
    def _mesh_ctx(self):
        import contextlib
        return contextlib.nullcontext() if self.mesh is None else sharding.use_mesh(self.mesh)

    def _update(self, params, opt_state, batch):
        config, rl = self.config, self.rl
        grad_fn = jax.value_and_grad(lambda p, mb: rl_loss(config, rl, p, mb), has_aux=True)

        def constrain_grads(g):
            return g if self._param_sh is None else jax.lax.with_sharding_constraint(g, self._param_sh)

        def body(carry, mb):
            gsum, ssum = carry
            (loss, sums), g = grad_fn(params, mb)
            gsum = jax.tree.map(lambda a, b: a + b.astype(a.dtype), gsum, constrain_grads(g))
            ssum = jax.tree.map(jnp.add, ssum, sums | {"loss": loss})
            return (gsum, ssum), None

        g0 = constrain_grads(jax.tree.map(jnp.zeros_like, params))
        s0 = _zeros(jax.eval_shape(lambda: rl_loss(config, rl, params, jax.tree.map(lambda x: x[0], batch))[1]
                                   | {"loss": jnp.zeros(())}))
        (grads, s), _ = jax.lax.scan(body, (g0, s0), batch)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        nz = lambda x: jnp.maximum(x, 1.0)  # noqa: E731
        metrics = {
            "loss": s["loss"], "grpo_loss": s["grpo_loss"], "csd_loss": s["csd_loss"],
            "mean_w": s["w"] / nz(s["coached"]), "frac_delta_pos": s["delta_pos"] / nz(s["coached"]),
            "clip_frac": s["clipped"] / nz(s["agent"]), "entropy": s["neg_logp"] / nz(s["agent"]),
            "approx_kl": s["log_ratio"] / nz(s["agent"]), "grad_norm": optax.tree.norm(grads),
            "agent_tokens": s["agent"], "coached_tokens": s["coached"],
        }
        return params, opt_state, metrics

    def _compiled(self, params):
        if self._step is None:
            if self.mesh is None:
                self._step = jax.jit(self._update, donate_argnums=(0, 1))
            else:
                rep = NamedSharding(self.mesh, P())
                self._step = jax.jit(self._update, donate_argnums=(0, 1),
                                     out_shardings=(self._param_sh, self._opt_shardings(params), rep))
        return self._step

    def __call__(self, params, opt_state, batch):
        """One optimizer update; params and opt_state are donated. Returns (params, opt_state, metrics)."""
        with self._mesh_ctx():
            return self._compiled(params)(params, opt_state, batch)

    def lower(self, params, opt_state, batch):
        """The lowered update (for .compile().memory_analysis() / cost_analysis() in benchmarks)."""
        with self._mesh_ctx():
            return self._compiled(params).lower(params, opt_state, batch)

    def _loss_and_grads(self, params, batch):
        config, rl = self.config, self.rl

        def body(carry, mb):
            (loss, sums), g = jax.value_and_grad(lambda p: rl_loss(config, rl, p, mb), has_aux=True)(params)
            return jax.tree.map(jnp.add, carry, (loss, g, sums)), None

        _, s0 = jax.eval_shape(lambda: rl_loss(config, rl, params, jax.tree.map(lambda x: x[0], batch)))
        init = (jnp.zeros(()), jax.tree.map(jnp.zeros_like, params), _zeros(s0))
        return jax.lax.scan(body, init, batch)[0]

    def loss_and_grads(self, params, batch):
        """(accumulated loss, grads, metric sums) without an optimizer update: for tests and debugging."""
        if self._lg is None:
            self._lg = jax.jit(self._loss_and_grads)
        with self._mesh_ctx():
            return self._lg(params, batch)


def make_rl_step(config: ModelConfig, optimizer: optax.GradientTransformation, mesh=None,
                 rl: RLConfig = RLConfig()) -> RLStep:
    """The jitted, sharded GRPO(+CSD) update with micro-batched gradient accumulation (see RLStep)."""
    return RLStep(config, optimizer, mesh, rl)
