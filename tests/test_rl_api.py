"""What a GRPO loop on the public API relies on: the KL-to-reference term (value and gradient against a per-token
NumPy reference), the update at the sampling temperature, donation errors, and counting compilations."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rl_helpers import random_batch, scaled_params, tiny_config, tree_rel_err
from mimesis_jax import models
from mimesis_jax.algorithms.logprobs import token_logprobs
from mimesis_jax.profiling import count_compilations
from mimesis_jax.train.rl import step as agent_rl
from mimesis_jax.train.rl.step import RLConfig, make_rl_step, prepare_batch

CFG = tiny_config()
TURNS = (2, 3, 1, 2)
PACK = dict(row_len=96, pad_multiple=16)


@pytest.fixture(scope="module")
def trajectories():
    trs = random_batch(21, CFG.vocab_size, TURNS, coach_prob=0.0)
    for tr in trs:  # equal returns in every group: every GRPO advantage is 0, so the loss is the KL term alone
        tr.turn_rewards = [0.5] * len(tr.turn_rewards)
    return trs


def _student_rows(trajectories):
    """Right-padded student sequences and, per trajectory, the positions of its agent tokens."""
    seqs, where = [], []
    for tr in trajectories:
        pos, at = 0, []
        for seg in tr.student_segments():
            if seg.kind == "agent":
                at += range(pos, pos + len(seg.tokens))
            pos += len(seg.tokens)
        seqs.append(tr.student_tokens())
        where.append(at)
    buf = np.zeros((len(seqs), max(map(len, seqs))), np.int32)
    for i, s in enumerate(seqs):
        buf[i, :len(s)] = s
    rows = np.concatenate([[i] * len(a) for i, a in enumerate(where)]).astype(int)
    cols = np.concatenate(where).astype(int)
    return buf, rows, cols


def _agent_logprobs(params, buf, rows, cols):
    """log pi(token) of every agent token through the plain forward (`token_logprobs`: no packing)."""
    return token_logprobs(CFG, params, jnp.asarray(buf))[rows, cols - 1]


def _np_kl(logp, ref, estimator):
    """Schulman's estimators with r = pi_ref / pi_theta, and their derivatives with respect to log pi_theta."""
    log_r = ref - logp
    return {"k1": (-log_r, np.ones_like(logp)),
            "k2": (0.5 * log_r ** 2, -log_r),
            "k3": (np.exp(log_r) - 1.0 - log_r, 1.0 - np.exp(log_r))}[estimator]


@pytest.mark.parametrize("estimator", agent_rl.KL_ESTIMATORS)
def test_reference_kl_equals_numpy_per_token(estimator):
    rng = np.random.RandomState(0)
    logp, ref = -3 * rng.rand(2, 40), -3 * rng.rand(2, 40)
    w = rng.rand(2, 40) * (rng.rand(2, 40) < 0.7)
    logp[w == 0] = -1e30  # a masked token must not leak inf/nan into the value or the gradient
    value, grad = jax.value_and_grad(agent_rl.reference_kl)(jnp.asarray(logp), jnp.asarray(ref), jnp.asarray(w),
                                                           estimator)
    k, dk = _np_kl(np.where(w > 0, logp, 0.0), ref, estimator)
    assert float(value) == pytest.approx(float(np.sum(w * k)), rel=1e-5)
    np.testing.assert_allclose(np.asarray(grad), np.where(w > 0, w * dk, 0.0), rtol=1e-5, atol=1e-7)


def test_step_kl_term_donation_and_compile_count(trajectories):
    """One update with kl_coef > 0: kl_ref, the loss and the parameter move (SGD: -lr x gradient) equal a per-token
    reference (plain-forward log-probs, NumPy k3 and its derivative, a vjp); then donation errors, and one compiled
    program per batch shape."""
    kl_coef, lr = 0.7, 1e3  # large lr: the move is well above the rounding of params - update
    rl = RLConfig(alpha=0.0, kl_coef=kl_coef, kl_estimator="k3")
    step = make_rl_step(CFG, optax.sgd(lr, momentum=0.9), None, rl)  # first step of momentum SGD: -lr x g
    params, ref = scaled_params(CFG, seed=0), scaled_params(CFG, seed=1)
    host = jax.tree.map(np.asarray, scaled_params(CFG, seed=0))
    opt_state = step.init_opt_state(params)
    batch = step.place(prepare_batch(trajectories, rl, **PACK))
    with pytest.raises(ValueError, match="needs ref_params"):
        step(params, opt_state, batch)
    with pytest.raises(ValueError, match="shares arrays with params"):
        step(params, opt_state, batch, params)
    with pytest.raises(ValueError, match="kl_coef == 0"):
        make_rl_step(CFG, optax.sgd(lr), None, RLConfig(alpha=0.0))(params, opt_state, batch, ref)
    assert step.num_compilations == 0

    new, new_opt, m = step(params, opt_state, batch, ref)
    assert step.num_compilations == 1
    buf, rows, cols = _student_rows(trajectories)
    f = jax.jit(lambda p: _agent_logprobs(p, buf, rows, cols))
    logp, vjp = jax.vjp(f, host)
    ref_lp = jax.vjp(f, ref)[0]  # (the same compiled program as the line above)
    logp, ref_lp = np.asarray(logp, np.float64), np.asarray(ref_lp, np.float64)
    n = len(logp)  # token-mean: the GRPO normaliser (all agent tokens of the batch)
    k, dk = _np_kl(logp, ref_lp, "k3")
    assert float(m["agent_tokens"]) == n and float(m["kl_ref"]) == pytest.approx(k.sum() / n, rel=1e-4)
    assert float(m["loss"]) == pytest.approx(kl_coef * k.sum() / n, rel=1e-4)  # GRPO part 0 (advantages 0)
    (grad,) = vjp(jnp.asarray(kl_coef * dk / n, jnp.float32))
    moved = jax.tree.map(lambda a, b: (a - np.asarray(b)) / lr, host, new)
    assert tree_rel_err(moved, grad) <= 1e-4

    assert all(x.is_deleted() for x in jax.tree.leaves(params)) and not any(
        x.is_deleted() for x in jax.tree.leaves(ref)), "params are donated, the reference is not"
    with pytest.raises(ValueError, match="params holds an array that was already donated"):
        step(params, new_opt, batch, ref)
    with pytest.raises(ValueError, match="opt_state holds an array that was already donated"):
        step(new, opt_state, batch, ref)
    with count_compilations() as same:
        new, new_opt, m = step(new, new_opt, batch, ref)  # same bucket: the compiled program is reused
    assert same.count_of("_rl_update") == 0 and step.num_compilations == 1
    wider = step.place(prepare_batch(trajectories, rl, row_len=128, pad_multiple=16))
    with count_compilations() as other:
        new, new_opt, m = step(new, new_opt, wider, ref)  # a new row length: one more program
    jax.block_until_ready(m)
    assert other.count_of("_rl_update") == 1 and step.num_compilations == 2 and "kl_ref" in m


def test_count_compilations_counts_new_shapes_only():
    @jax.jit
    def double_it(x):
        return 2 * x

    a, b = jnp.ones(3), jnp.ones(5)
    with count_compilations() as c:
        double_it(a), double_it(a), double_it(b)
    assert c.count_of("double_it") == 2 and c.count >= 2 and c.seconds > 0
    with count_compilations() as again:
        double_it(a), double_it(b)
    assert again.count_of("double_it") == 0


def test_config_errors_name_the_key():
    for kw, key in ((dict(temperature=0.0), "temperature"), (dict(kl_coef=-0.1), "kl_coef"),
                    (dict(kl_estimator="k4"), "kl_estimator")):
        with pytest.raises(ValueError, match=f"'{key}'"):
            RLConfig(**kw)


def test_update_scores_at_the_sampling_temperature(trajectories):
    """Old (recomputed) and student log-probs of the update are log softmax(logits / T) of the forward logits."""
    T = 0.7
    rl = RLConfig(alpha=0.0, temperature=T, old_logprobs="recompute")
    step = make_rl_step(CFG, optax.sgd(1.0), None, rl)
    params = scaled_params(CFG)
    packed = prepare_batch(trajectories, rl, **PACK)
    batch = step.recompute_old_logprobs(params, step.place(packed))
    buf, rows, cols = _student_rows(trajectories)
    z = np.asarray(models.forward(CFG, params, jnp.asarray(buf)), np.float64)[rows, cols - 1] / T
    lse = z.max(-1) + np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1))
    want = z[np.arange(len(rows)), buf[rows, cols]] - lse
    old = np.asarray(batch["old_logp"]).reshape(packed.arrays["tokens"].shape)
    got = np.concatenate([old[s.row, s.start:s.start + s.length] for slots in packed.turns for s in slots])
    np.testing.assert_allclose(got, want, atol=2e-5)
    sums = jax.jit(lambda p, mb: agent_rl.rl_loss(CFG, rl, p, mb)[1])(params, jax.tree.map(lambda x: x[0], batch))
    assert float(sums["neg_logp"]) == pytest.approx(-want.sum(), rel=1e-5)  # the update's student log-probs
