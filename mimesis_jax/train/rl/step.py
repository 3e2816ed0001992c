"""The RL update of both stages: one jitted, sharded multi-turn GRPO (+ CSD) step on packed dialogues or
simulator segments (docs/reference/paper.md §4.1-4.2; Stage I.3 uses it with alpha = 0, its FoldGRPO advantages
computed by train/rl/simulator.py).

    rl = RLConfig(alpha=0.01, beta=5.0, num_microbatches=4)
    step = make_rl_step(config, optax.adamw(1e-6), mesh, rl)
    opt_state = step.init_opt_state(params)                    # sharded like the params
    packed = prepare_batch(trajectories, rl, rows_multiple=step.rows_multiple(), row_len=4096)
    batch = step.place(packed)                                 # [M, B/M, ...] on the mesh
    batch = step.recompute_old_logprobs(params, batch)         # only with rl.old_logprobs == "recompute"
    params, opt_state, metrics = step(params, opt_state, batch)  # donates the params and opt_state passed in

The step scans over the M micro-batches, then applies the optimizer once (train/step.py `accumulate_gradients`
and `apply_gradients`, the gradient accumulation and optimizer update of every step). It takes params and
optimizer state in exactly the layout it returns them in (the rules' layout, each moment like its parameter: the
train state's, train/state.py), moving arguments that come in another layout there first, so the first call
compiles the update and later calls of the same batch shapes reuse it.

Loss per micro-batch (Eq 11): L = L_GRPO (Eq 6) + alpha L_CSD (Eq 10). Both normalisers (agent tokens or
sequences for GRPO, coached tokens for CSD) are counts of the whole batch folded into per-token weights on the
host (algorithms/rl_batch.py), so the accumulated sum is the global loss whatever the number of micro-batches or
devices. With alpha == 0, or a batch without coached turns, no
teacher work is traced at all: the step is exactly the GRPO step.

Temperature. Every log-prob of the update (student, old, teacher, reference) is of pi_T = softmax(logits / T)
with T = RLConfig.temperature, which must equal the rollout's sampling temperature (the sampler returns its
log-probs at the sampling temperature by default): the ratio of Eq 5 then compares the policy that sampled
with the one being trained. T = 1 traces exactly the former step.

KL to a reference (not in the paper; its default kl_coef = 0 traces nothing about a reference). With
kl_coef > 0 the loss adds kl_coef * L_KL, L_KL = sum over agent tokens of the GRPO token weight (the same global
normaliser) x k(log pi_theta, log pi_ref), k one of Schulman's per-token estimators of KL(pi_theta || pi_ref)
(`kl_estimate`); the step then takes `ref_params` (never differentiated, never donated). It is unrelated to
CSD's beta (Eq 9), which is a sigmoid temperature, not a KL weight.

Off-policy correction (rl.behavior_is_cap = c > 0; docs/stage2.md "Off-policy correction"). The batch then
carries `behav_logp` (the sampler's log-probs, pi_behav) beside `old_logp`, which `recompute_old_logprobs` fills
with the proximal log-probs (pi_prox: the parameters at the step's start); the GRPO term becomes
grpo.decoupled_grpo_loss: the clip against pi_prox and each token's surrogate x min(pi_prox / pi_behav, c). The CSD
term is unchanged (its teacher is the coached current policy). With c = 0 the batch, the program and the metrics
are exactly those of the plain objective.

Metrics (global over the batch): loss, grpo_loss, csd_loss (L_CSD before alpha), mean_w (Eq 9 weight over
coached tokens), frac_delta_pos (fraction of coached tokens with Delta > 0), clip_frac (agent tokens whose
clip is active), entropy (mean -log pi_theta of the sampled agent tokens: a one-sample entropy estimate),
approx_kl (mean log pi_old - log pi_theta), grad_norm (before the optimizer), agent_tokens, coached_tokens;
kl_ref (L_KL before kl_coef) only when kl_coef > 0; with behavior_is_cap > 0, behav_logp_gap (mean
|log pi_prox - log pi_behav| over agent tokens) and behav_capped_frac (agent tokens whose pi_prox / pi_behav passed
the cap). Built with the optimizer's `schedule`
(make_rl_step(..., schedule=s), as the learner does), the step also returns lr = s(n), the learning rate this
update applied, read from the same count n the optimizer's schedule reads (optax's ScaleByScheduleState: the
updates applied before this one), and opt_steps = n + 1.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding

from mimesis_jax import models, profiling, sharding
from mimesis_jax.algorithms import csd, grpo, rl_batch
from mimesis_jax.algorithms.rl_batch import PackedRL, pack_trajectories
from mimesis_jax.config.choices import KL_ESTIMATORS
from mimesis_jax.config.rl import RLConfig
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.train.optim import opt_state_shardings
from mimesis_jax.train.step import accumulate_gradients, apply_gradients, schedule_count  # noqa: F401 (re-export)
import contextlib

# the decoupled objective's per-step metrics (rl.behavior_is_cap > 0; absent otherwise)
DECOUPLED_METRICS = ("behav_logp_gap", "behav_capped_frac")
# the batch arrays the old-log-prob scoring pass reads (recompute_old_logprobs; plan/compiled.py compiles it)
SCORE_KEYS = ("tokens", "positions", "segment_ids", "agent_mask", "head_idx")


def prepare_batch(trajectories: Sequence, rl: RLConfig, **pack_kw) -> PackedRL:
    """Advantages (grpo) + packing (rl_batch) of one optimizer step's trajectories, on the host."""
    if rl.credit == "infopo":
        raise ValueError("RLConfig.credit='infopo' needs a scoring pass with the current parameters: compute the "
                         "advantages with algorithms/infopo.py (information_gains + infopo_advantages) and pack them "
                         "with rl_batch.pack_trajectories")
    adv = grpo.trajectory_turn_advantages(trajectories, credit=rl.credit, score=rl.score, gamma=rl.gamma,
                                          eps=rl.adv_eps, divide_std=rl.divide_std)
    teacher = rl.teacher if rl.alpha > 0 else "none"
    return pack_trajectories(trajectories, adv, teacher=teacher, loss_agg=rl.loss_agg,
                             use_rollout_logprobs=rl.old_logprobs == "rollout",
                             behaviour_logprobs=rl.behavior_is_cap > 0, **pack_kw)


def batch_teacher(batch, rl: RLConfig) -> str:
    """The teacher layout a (traced) batch carries and the step uses: none when alpha == 0."""
    if rl.alpha == 0:
        return "none"
    if "branch_tokens" in batch:
        return "fused"
    if "naive_tokens" in batch:
        return "naive"
    return "none"


def kl_estimate(logp: jax.Array, ref_logp: jax.Array, estimator: str = "k3") -> jax.Array:
    """Schulman's per-token estimators of KL(pi_theta || pi_ref) at a sampled token, with
    log r = log pi_ref - log pi_theta: k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r (>= 0; DeepSeekMath's
    GRPO uses k3)."""
    log_r = ref_logp - logp
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * jnp.square(log_r)
    if estimator == "k3":
        return jnp.expm1(log_r) - log_r
    raise ValueError(f"kl estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def reference_kl(logp: jax.Array, ref_logp: jax.Array, weights: jax.Array, estimator: str = "k3") -> jax.Array:
    """L_KL = sum_tokens weights x kl_estimate(logp, ref_logp): `weights` are the GRPO token weights (zero off the
    agent tokens, the global normaliser folded in). Tokens of weight 0 are masked before the estimator (no inf x 0
    can reach the gradient)."""
    on = weights != 0
    k = kl_estimate(jnp.where(on, logp, 0.0), jnp.where(on, ref_logp, 0.0), estimator)
    return jnp.sum(weights * k)


def _temperature_kw(rl: RLConfig) -> dict:
    """The log-prob functions' temperature keyword; absent at T = 1 (the T = 1 program is unchanged)."""
    return {} if rl.temperature == 1.0 else {"temperature": rl.temperature}


def policy_loss(rl: RLConfig, student: jax.Array, mb) -> tuple[jax.Array, dict]:
    """The GRPO term of one micro-batch and its metric sums: Eq 6 against old_logp, or with rl.behavior_is_cap > 0
    the decoupled objective (old_logp = the proximal log-probs, behav_logp = the behaviour ones)."""
    agent = mb["agent_mask"]
    sg_student = jax.lax.stop_gradient(student)
    if rl.behavior_is_cap > 0:
        if rl_batch.BEHAV_KEY not in mb:
            raise ValueError(f"RLConfig.behavior_is_cap = {rl.behavior_is_cap} > 0 needs the behaviour log-probs in "
                             "the batch: pack with behaviour_logprobs=True (prepare_batch does)")
        behav = mb[rl_batch.BEHAV_KEY]
        l_grpo, clipped, capped = grpo.decoupled_grpo_loss(student, mb["old_logp"], behav, mb["advantages"],
                                                           mb["grpo_weight"], rl.behavior_is_cap, rl.eps_low,
                                                           rl.eps_high)
        extra = {"behav_gap": jnp.sum(jnp.where(agent > 0, jnp.abs(mb["old_logp"] - behav), 0.0)),
                 "capped": jnp.sum(capped * agent)}
    else:
        l_grpo, clipped = grpo.grpo_loss(student, mb["old_logp"], mb["advantages"], mb["grpo_weight"], rl.eps_low,
                                         rl.eps_high)
        extra = {}
    sums = {
        "grpo_loss": l_grpo,
        "clipped": jnp.sum(clipped * agent),
        "neg_logp": -jnp.sum(jnp.where(agent > 0, sg_student, 0.0)),
        "log_ratio": jnp.sum(jnp.where(agent > 0, mb["old_logp"] - sg_student, 0.0)),
        "agent": jnp.sum(agent),
    }
    return l_grpo, sums | extra


def rl_loss(config: ModelConfig, rl: RLConfig, params, mb, teacher: str | None = None, ref_params=None):
    """Eq 11 on one micro-batch (+ kl_coef L_KL when rl.kl_coef > 0, which needs `ref_params`): (loss, sums for
    the metrics). `teacher` overrides the batch's layout (tests use it to run the teacher pass with alpha = 0)."""
    teacher = batch_teacher(mb, rl) if teacher is None else teacher
    temp = _temperature_kw(rl)
    student, teacher_lp = csd.student_teacher_logprobs(config, params, mb, teacher, **temp)
    with jax.named_scope("loss"):
        l_grpo, sums = policy_loss(rl, student, mb)
        if teacher_lp is None:
            loss = l_grpo
            sums |= {"csd_loss": jnp.zeros(()), "w": jnp.zeros(()), "delta_pos": jnp.zeros(()),
                     "coached": jnp.sum(mb["coached_mask"])}
        else:
            coached = mb["coached_mask"]
            delta = jnp.where(coached > 0, csd.csd_delta(teacher_lp, student), 0.0)
            w = csd.csd_weights(delta, rl.beta)
            l_csd = csd.csd_loss(student, w, mb["csd_weight"])
            sums |= {"csd_loss": l_csd, "w": jnp.sum(w * coached), "delta_pos": jnp.sum((delta > 0) * coached),
                     "coached": jnp.sum(coached)}
            loss = csd.combined_loss(l_grpo, l_csd, rl.alpha)
    if rl.kl_coef > 0:
        if ref_params is None:
            raise ValueError(f"RLConfig.kl_coef = {rl.kl_coef} > 0 needs the reference parameters: "
                             "step(params, opt_state, batch, ref_params=...)")
        ref = csd.student_logprobs(config, jax.lax.stop_gradient(ref_params), mb, **temp)
        with jax.named_scope("loss"):
            l_kl = reference_kl(student, jax.lax.stop_gradient(ref), mb["grpo_weight"], rl.kl_estimator)
        sums["kl_ref"] = l_kl
        loss = loss + rl.kl_coef * l_kl
    return loss, sums


class RLStep:
    """The jitted, sharded GRPO(+CSD) update; see the module docstring. Build with `make_rl_step`."""

    def __init__(self, config: ModelConfig, optimizer: optax.GradientTransformation, mesh=None,
                 rl: RLConfig = RLConfig(), schedule=None):
        self.config, self.optimizer, self.mesh, self.rl = config, optimizer, mesh, rl
        self.schedule = schedule  # the optimizer's lr schedule: the step then reports the lr it applied
        self._param_sh = None if mesh is None else models.param_shardings(config, mesh)
        self._opt_sh = None
        self._step = None
        self._num_compilations = 0
        self._shape_keys: set = set()
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

    def local_rows_multiple(self) -> int:
        """Row counts of ONE process's share of a batch (`place(..., process_local=True)`) must be a multiple of
        this: micro-batches x the batch-sharding devices of one process. The batch axis must be split over at
        least as many devices as there are processes, so that no process needs another's rows."""
        n, p = sharding.batch_shard_count(self.mesh, self.config), jax.process_count()
        if n % p:
            raise ValueError(f"the mesh splits the batch {n} ways, which is not a multiple of the {p} processes: "
                             "give the data/fsdp mesh axes (the batch axes) a multiple of the process count")
        return self.rl.num_microbatches * (n // p)

    def place(self, packed: PackedRL | dict, *, process_local: bool = False) -> dict:
        """Host arrays -> [M, B/M, ...] device arrays, rows split over the mesh's batch axes.

        process_local: `packed` holds only this process's rows (every process passes the same shapes, rows a
        multiple of `local_rows_multiple`); the global batch is, per micro-batch, process 0's rows, then process
        1's, ... (jax.make_array_from_process_local_data) -- no process needs the whole batch."""
        if isinstance(packed, PackedRL):
            group = packed.num_rows // self.rows_multiple() if packed.num_rows % self.rows_multiple() == 0 else 0
            if group and group != packed.head_group:  # packed for other head groups (another rows_multiple)
                packed = dataclasses.replace(packed, arrays=rl_batch.regroup_heads(packed.arrays, group),
                                             head_group=group)
        arrays = packed.microbatches(self.rl.num_microbatches) if isinstance(packed, PackedRL) else packed
        if isinstance(packed, PackedRL) and self.rl.old_logprobs == "rollout" and not packed.old_logp_from_rollout:
            raise ValueError("the batch was packed without rollout log-probs but RLConfig.old_logprobs='rollout'")
        if self.rl.behavior_is_cap > 0 and rl_batch.BEHAV_KEY not in arrays:
            raise ValueError(f"RLConfig.behavior_is_cap = {self.rl.behavior_is_cap} > 0 but the batch has no "
                             f"{rl_batch.BEHAV_KEY}: pack with behaviour_logprobs=True (prepare_batch does)")
        if self.mesh is None:
            return {k: jnp.asarray(v) for k, v in arrays.items()}
        if process_local and jax.process_count() > 1:
            out = {}
            for k, v in arrays.items():
                gshape = (v.shape[0], v.shape[1] * jax.process_count()) + tuple(v.shape[2:])
                out[k] = jax.make_array_from_process_local_data(self._batch_sharding(gshape), v, gshape)
            return out
        return {k: jax.device_put(v, self._batch_sharding(v.shape)) for k, v in arrays.items()}

    def init_opt_state(self, params):
        """Optimizer state, every parameter-shaped leaf sharded like its parameter."""
        if self.mesh is None:
            return jax.jit(self.optimizer.init)(params)
        return jax.jit(self.optimizer.init, out_shardings=self._opt_shardings(params))(params)

    def _opt_shardings(self, params):
        if self._opt_sh is None:  # the layout of the train state's opt_state (train/state.py state_shardings)
            self._opt_sh = opt_state_shardings(jax.eval_shape(self.optimizer.init, params), self._param_sh, self.mesh)
        return self._opt_sh

    # ------------------------------------------------------------------------------ old log-probs
    def _score_fn(self, params, batch):
        temp = _temperature_kw(self.rl)

        def one(mb):
            return jnp.where(mb["agent_mask"] > 0, csd.student_logprobs(self.config, params, mb, **temp), 0.0)
        return jax.lax.map(one, batch)

    def recompute_old_logprobs(self, params, batch: dict) -> dict:
        """batch with old_logp = log pi_theta of the current params at rl.temperature (a no-gradient scoring
        pass)."""
        with self._mesh_ctx():
            old = self._score(params, {k: batch[k] for k in SCORE_KEYS if k in batch})
        if self.mesh is not None:  # laid out as `place` lays out the batch: the update compiles for one input
            old = jax.device_put(old, self._batch_sharding(old.shape))  # sharding (a no-op where XLA chose it)
        return dict(batch, old_logp=old)

    # ------------------------------------------------------------------------------------- update
    def _mesh_ctx(self):
        return contextlib.nullcontext() if self.mesh is None else sharding.use_mesh(self.mesh)

    def _loss_sums(self, ref_params):
        """The callback of `accumulate_gradients`: Eq 11 (+ KL) of one micro-batch and its metric sums."""
        return lambda p, mb: rl_loss(self.config, self.rl, p, mb, ref_params=ref_params)

    def _rl_update(self, params, opt_state, batch, ref_params):
        loss, grads, s = accumulate_gradients(self._loss_sums(ref_params), params, batch,
                                              grad_shardings=self._param_sh)
        s = s | {"loss": loss}
        params, opt_state, n = apply_gradients(self.optimizer, params, opt_state, grads, self.schedule)
        applied = None if n is None else {"lr": jnp.asarray(self.schedule(n), jnp.float32), "opt_steps": n + 1}
        nz = lambda x: jnp.maximum(x, 1.0)  # noqa: E731
        metrics = {
            "loss": s["loss"], "grpo_loss": s["grpo_loss"], "csd_loss": s["csd_loss"],
            "mean_w": s["w"] / nz(s["coached"]), "frac_delta_pos": s["delta_pos"] / nz(s["coached"]),
            "clip_frac": s["clipped"] / nz(s["agent"]), "entropy": s["neg_logp"] / nz(s["agent"]),
            "approx_kl": s["log_ratio"] / nz(s["agent"]), "grad_norm": optax.tree.norm(grads),
            "agent_tokens": s["agent"], "coached_tokens": s["coached"],
        }
        if "kl_ref" in s:
            metrics["kl_ref"] = s["kl_ref"]
        if "behav_gap" in s:  # the decoupled objective (rl.behavior_is_cap > 0)
            metrics["behav_logp_gap"] = s["behav_gap"] / nz(s["agent"])
            metrics["behav_capped_frac"] = s["capped"] / nz(s["agent"])
        if applied is not None:
            metrics |= applied
        return params, opt_state, metrics

    def _state_shardings(self, params):
        """(params', optimizer state's) shardings, in and out of the update alike: with a mesh, the params by the
        rules and the optimizer moments like their params; without one, the default device."""
        if self.mesh is None:
            one = SingleDeviceSharding(jax.devices()[0])
            return one, one
        return self._param_sh, self._opt_shardings(params)

    def _compiled(self, params):
        """The jitted update. It takes params and optimizer state in exactly the layout it returns them in
        (in_shardings = out_shardings), so the program compiled at the first call is the one every later call of
        the same batch shapes runs, whatever layout the first params came in (`_laid_out` moves them)."""
        if self._step is None:
            ps, os_ = self._state_shardings(params)
            rep = ps if self.mesh is None else NamedSharding(self.mesh, P())
            self._step = jax.jit(self._rl_update, donate_argnums=(0, 1), in_shardings=(ps, os_, None, None),
                                 out_shardings=(ps, os_, rep))
        return self._step

    @staticmethod
    def _laid_out(tree, shardings):
        """`tree` with every committed array laid out otherwise than `shardings` (a tree, or one sharding for all)
        moved there; arrays already so laid out (and host or uncommitted ones, which the jitted update places
        itself) are passed as they are, so that the update still donates them."""
        def place(x, s):
            moved = isinstance(x, jax.Array) and x.committed and not x.sharding.is_equivalent_to(s, x.ndim)
            return jax.device_put(x, s) if moved else x
        if isinstance(shardings, jax.sharding.Sharding):
            return jax.tree.map(lambda x: place(x, shardings), tree)
        return jax.tree.map(place, tree, shardings)

    def _check_args(self, params, opt_state, ref_params):
        for what, tree in (("params", params), ("opt_state", opt_state), ("ref_params", ref_params)):
            if any(isinstance(x, jax.Array) and x.is_deleted() for x in jax.tree.leaves(tree)):
                raise ValueError(
                    f"RLStep: {what} holds an array that was already donated (deleted): the step consumes the "
                    "params and opt_state passed to it; use the ones it returned: "
                    "params, opt_state, metrics = step(params, opt_state, batch)")
        if self.rl.kl_coef > 0:
            if ref_params is None:
                raise ValueError(f"RLStep: RLConfig.kl_coef = {self.rl.kl_coef} > 0 needs ref_params (the frozen "
                                 "reference policy's parameters): step(params, opt_state, batch, ref_params)")
            donated = {id(x) for x in jax.tree.leaves(params)}
            if any(id(x) in donated for x in jax.tree.leaves(ref_params)):
                raise ValueError("RLStep: ref_params shares arrays with params, which the step donates: pass a copy "
                                 "(e.g. ref_params = jax.tree.map(jnp.copy, params) before the first step)")
        elif ref_params is not None:
            raise ValueError("RLStep: ref_params given but RLConfig.kl_coef == 0 (no KL term): set kl_coef > 0 to "
                             "use a reference, or drop ref_params")

    def __call__(self, params, opt_state, batch, ref_params=None):
        """One optimizer update: returns (params, opt_state, metrics).

        `params` and `opt_state` are DONATED: their buffers become the results' buffers and the arrays passed in
        are deleted by the call, so keep only the returned ones (passing a donated array again raises a
        ValueError). To keep a copy (e.g. as the reference), copy before the call: jax.tree.map(jnp.copy, params).
        `ref_params` (the frozen reference policy) is required when rl.kl_coef > 0 and refused otherwise; it is
        neither donated nor differentiated, and with a mesh it is placed like the params.
        """
        self._check_args(params, opt_state, ref_params)
        if ref_params is not None and self.mesh is not None:
            ref_params = jax.device_put(ref_params, self._param_sh)
        ps, os_ = self._state_shardings(params)
        params, opt_state = self._laid_out(params, ps), self._laid_out(opt_state, os_)
        with self._mesh_ctx(), profiling.count_compilations() as compiled:
            out = self._compiled(params)(params, opt_state, batch, ref_params)
        self._num_compilations += compiled.count_of("_rl_update")
        self._shape_keys.add((ref_params is not None,) + tuple(sorted((k, tuple(v.shape)) for k, v in batch.items())))
        return out

    @property
    def num_compilations(self) -> int:
        """How many XLA programs the update has compiled so far (counted from jax's compile events: one per shape
        bucket of the batch)."""
        return self._num_compilations

    @property
    def shape_keys(self) -> set:
        """The distinct batch layouts (array names and [M, B/M, ...] shapes) the update was called with."""
        return set(self._shape_keys)

    def lower(self, params, opt_state, batch, ref_params=None):
        """The lowered update (for .compile().memory_analysis() / cost_analysis() in benchmarks)."""
        with self._mesh_ctx():
            return self._compiled(params).lower(params, opt_state, batch, ref_params)

    def _loss_and_grads(self, params, batch, ref_params):
        return accumulate_gradients(self._loss_sums(ref_params), params, batch)

    def loss_and_grads(self, params, batch, ref_params=None):
        """(accumulated loss, grads, metric sums) without an optimizer update: for tests and debugging."""
        if self._lg is None:
            self._lg = jax.jit(self._loss_and_grads)
        with self._mesh_ctx():
            return self._lg(params, batch, ref_params)


def make_rl_step(config: ModelConfig, optimizer: optax.GradientTransformation, mesh=None,
                 rl: RLConfig = RLConfig(), schedule=None) -> RLStep:
    """The jitted, sharded GRPO(+CSD) update with micro-batched gradient accumulation (see RLStep); with the
    optimizer's `schedule` its metrics carry the lr it applied."""
    return RLStep(config, optimizer, mesh, rl, schedule)
