"""Multi-turn GRPO (docs/reference/paper.md §4.1, Eq 5-6) and FoldGRPO (docs/reference/paper.md §3.3) against NumPy written from the formulas."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mimesis_jax.algorithms import grpo
from mimesis_jax.data.trajectory import Segment, Trajectory


# ------------------------------------------------------------------ references, written from the formulas
def ref_credits(r, method, gamma):
    n = len(r)
    if method == "equalized":
        return [1.0] * n
    if method == "r2g":  # c_t = sum_{t' >= t} gamma^(t'-t) r_t'  (a direct double sum)
        return [sum(gamma ** (k - t) * r[k] for k in range(t, n)) for t in range(n)]
    return [0.5 + 0.5 * (1 - math.exp(-2 * x)) / (1 - math.exp(-2)) for x in r]  # EM


def ref_score(r, method, gamma):
    return sum(r) / len(r) if method == "sum" else sum(gamma ** t * x for t, x in enumerate(r))


def ref_group_advantages(scores, groups, rollouts, eps=1e-6, divide_std=True):
    out = []
    for i in range(len(scores)):
        seen, vals = set(), []
        for j in range(len(scores)):  # first segment of each rollout id of i's group
            if groups[j] == groups[i] and rollouts[j] not in seen:
                seen.add(rollouts[j])
                vals.append(scores[j])
        if len(vals) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(vals) / len(vals)
            std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        out.append((scores[i] - mean) / (std + eps) if divide_std else scores[i] - mean)
    return out


# --------------------------------------------------------------------------------------------- credits
def test_credits_by_hand():
    r = [1.0, 0.0, 0.5]
    np.testing.assert_allclose(grpo.credits_r2g(r, 0.8), [1.32, 0.4, 0.5])
    np.testing.assert_allclose(grpo.credits_equalized(r), [1, 1, 1])
    np.testing.assert_allclose(grpo.credits_em([0.0, 1.0]), [0.5, 1.0])
    assert grpo.score_sum(r) == pytest.approx(0.5)  # the mean of the turn rewards ("Sum", as UserRL)
    assert grpo.score_r2g(r, 0.8) == pytest.approx(1.32)  # = the r2g credit of turn 0


@pytest.mark.parametrize("method", grpo.CREDIT_METHODS)
@pytest.mark.parametrize("gamma", [0.8, 0.5, 1.0])
def test_credits_and_scores_match_numpy(method, gamma):
    rng = np.random.RandomState(0)
    for n in (1, 2, 5, 16):
        r = rng.uniform(-0.5, 1.5, n).tolist()
        np.testing.assert_allclose(grpo.turn_credits(r, method, gamma), ref_credits(r, method, gamma), rtol=1e-12)
        for score in grpo.SCORE_METHODS:
            assert grpo.trajectory_score(r, score, gamma) == pytest.approx(ref_score(r, score, gamma), rel=1e-12)


def test_bad_methods_and_rewards_are_named():
    with pytest.raises(ValueError, match="turn credit method"):
        grpo.turn_credits([1.0], "sum")
    with pytest.raises(ValueError, match="trajectory score method"):
        grpo.trajectory_score([1.0], "mean")
    with pytest.raises(ValueError, match="no turn rewards"):
        grpo.score_sum([])
    with pytest.raises(ValueError, match="non-finite"):
        grpo.credits_em([float("nan")])


# ---------------------------------------------------------------------------------- normalisation
def test_group_normalisation_matches_numpy():
    rng = np.random.RandomState(1)
    scores = rng.randn(20).tolist()
    groups = rng.randint(0, 5, 20).tolist()
    for divide_std in (True, False):
        np.testing.assert_allclose(grpo.group_normalize(scores, groups, divide_std=divide_std),
                                   ref_group_advantages(scores, groups, list(range(20)), divide_std=divide_std),
                                   rtol=1e-12, atol=1e-12)


def test_single_member_group_has_mean_0_and_std_1():
    adv = grpo.group_normalize([0.7, 2.0, 4.0], [5, 9, 9])
    assert adv[0] == pytest.approx(0.7 / (1 + 1e-6), rel=1e-12)
    np.testing.assert_allclose(adv[1:], [-1 / (math.sqrt(2) + 1e-6), 1 / (math.sqrt(2) + 1e-6)], rtol=1e-12)
    assert grpo.group_normalize([3.0], [0], divide_std=False)[0] == 3.0


def test_equal_scores_give_zero_advantages():
    np.testing.assert_array_equal(grpo.group_normalize([0.5, 0.5, 0.5], [1, 1, 1]), [0, 0, 0])


def test_foldgrpo_counts_each_rollout_once():
    # rollout 10 is folded into three segments (different scores); group stats use its FIRST segment only.
    scores = [1.0, 5.0, 9.0, 2.0, 3.0, 7.0]
    groups = [0, 0, 0, 0, 0, 1]
    rollouts = [10, 10, 10, 11, 12, 13]
    adv = grpo.group_advantages(scores, groups, rollouts, fold=True)
    np.testing.assert_allclose(adv, ref_group_advantages(scores, groups, rollouts), rtol=1e-12)
    m, s = 2.0, 1.0  # over {1, 2, 3}
    np.testing.assert_allclose(adv[:5], [(x - m) / (s + 1e-6) for x in scores[:5]], rtol=1e-12)
    assert adv[5] == pytest.approx(7.0 / (1 + 1e-6))  # group 1 has a single rollout
    # duplicating a rollout's segment does not move the statistics: plain GRPO on the unique ones agrees
    np.testing.assert_allclose(adv[[0, 3, 4]], grpo.group_normalize([1.0, 2.0, 3.0], [0, 0, 0]), rtol=1e-12)
    # a group with several segments but ONE rollout id is a single-member group
    np.testing.assert_allclose(grpo.group_advantages([4.0, 6.0], [0, 0], [3, 3], fold=True),
                               [4 / (1 + 1e-6), 6 / (1 + 1e-6)])


def test_foldgrpo_random_against_numpy():
    rng = np.random.RandomState(2)
    for _ in range(5):
        n = 30
        scores, groups, rollouts = rng.randn(n).tolist(), rng.randint(0, 4, n).tolist(), rng.randint(0, 12, n).tolist()
        for divide_std in (True, False):
            np.testing.assert_allclose(grpo.group_advantages(scores, groups, rollouts, fold=True,
                                                             divide_std=divide_std),
                                       ref_group_advantages(scores, groups, rollouts, divide_std=divide_std),
                                       rtol=1e-10, atol=1e-12)


def test_turn_advantages_are_credit_times_normalised_score():
    rng = np.random.RandomState(3)
    rewards = [rng.rand(n).tolist() for n in (3, 1, 4, 2, 5)]
    groups, rollouts = [0, 0, 0, 1, 1], [0, 1, 1, 2, 3]
    for credit in grpo.CREDIT_METHODS:
        for score in grpo.SCORE_METHODS:
            got = grpo.turn_advantages(rewards, groups, rollouts, credit=credit, score=score, gamma=0.8, fold=True)
            s = [ref_score(r, score, 0.8) for r in rewards]
            a = ref_group_advantages(s, groups, rollouts)
            for g, r, ai in zip(got, rewards, a):
                np.testing.assert_allclose(g, np.asarray(ref_credits(r, credit, 0.8)) * ai, rtol=1e-10, atol=1e-12)


def test_duplicate_rollout_ids_raise_unless_folding():
    with pytest.raises(ValueError, match=r"rollout id 7 appears 2 times \(segments \[1, 2\]\) but no folding"):
        grpo.group_advantages([1.0, 2.0, 3.0], [0, 0, 0], [5, 7, 7])
    trs = [_traj([1.0], 0, 4), _traj([0.0], 0, 4)]
    with pytest.raises(ValueError, match="rollout id 4 appears 2 times"):
        grpo.trajectory_turn_advantages(trs)
    # the same ids with folding: one member -> mean 0, std 1
    got = grpo.trajectory_turn_advantages(trs, fold=True)
    np.testing.assert_allclose([g[0] for g in got], [1.0 / (1 + 1e-6), 0.0])
    # without rollout ids every segment is its own rollout
    np.testing.assert_allclose(grpo.group_advantages([1.0, 3.0], [0, 0]),
                               [-1 / (2 ** 0.5 + 1e-6), 1 / (2 ** 0.5 + 1e-6)])


def _traj(rewards, group, rollout, status="ok"):
    segs = [Segment("public", [1])]
    for _ in rewards:
        segs += [Segment("public", [2]), Segment("agent", [3, 4])]
    return Trajectory(segs, turn_rewards=list(rewards), group_id=group, rollout_id=rollout, status=status)


def test_trajectory_turn_advantages_and_named_errors():
    trs = [_traj([1.0, 0.0], 0, 0), _traj([0.0], 0, 1), _traj([0.5, 0.5, 0.5], 1, 2)]
    got = grpo.trajectory_turn_advantages(trs, credit="r2g", gamma=0.8)
    want = grpo.turn_advantages([t.turn_rewards for t in trs], [0, 0, 1], [0, 1, 2], credit="r2g", gamma=0.8)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    with pytest.raises(ValueError, match="trajectory 1 has status 'invalid'"):
        grpo.trajectory_turn_advantages([trs[0], _traj([0.0], 0, 1, status="invalid")])
    bad = _traj([1.0], 0, 0)
    bad.turn_rewards = [1.0, 2.0]
    with pytest.raises(ValueError, match="trajectory 0: 2 turn rewards for 1 agent turns"):
        grpo.trajectory_turn_advantages([bad])


# ------------------------------------------------------------------------------------ loss weights
def test_loss_token_weights_fold_in_the_global_normaliser():
    mask = np.array([[0, 1, 1, 1, 0, 1], [1, 1, 0, 0, 0, 0]], np.float32)
    seq = np.array([[0, 0, 0, 0, 1, 1], [2, 2, 3, 3, 3, 3]])
    w = grpo.loss_token_weights(mask, seq, "token-mean")
    np.testing.assert_allclose(w, mask / 6)
    w = grpo.loss_token_weights(mask, seq, "seq-mean")  # sequences 0 (3 tokens), 1 (1), 2 (2); 3 has none
    np.testing.assert_allclose(w, [[0, 1 / 9, 1 / 9, 1 / 9, 0, 1 / 3], [1 / 6, 1 / 6, 0, 0, 0, 0]], rtol=1e-6)
    assert grpo.loss_token_weights(np.zeros((1, 3)), np.zeros((1, 3)), "token-mean").sum() == 0
    with pytest.raises(ValueError, match="loss aggregation"):
        grpo.loss_token_weights(mask, seq, "sum")


# ---------------------------------------------------------------------------------------- Eq 5-6
def ref_surrogate(logp, old, adv, el, eh):
    rho = np.exp(logp - old)
    unc, clp = rho * adv, np.clip(rho, 1 - el, 1 + eh) * adv
    loss = -np.minimum(unc, clp)
    # d loss / d logp: the unclipped term's derivative where it is the minimum, else 0 (the clip is flat)
    grad = np.where(unc <= clp, -rho * adv, 0.0)
    return loss, grad, (-clp > -unc).astype(np.float32)


@pytest.mark.parametrize("el,eh", [(0.2, 0.2), (0.1, 0.28)])
def test_clipped_surrogate_value_gradient_and_clip_fraction(el, eh):
    rng = np.random.RandomState(4)
    n = 400
    old = -rng.rand(n) * 3
    logp = old + rng.uniform(-0.5, 0.5, n)
    adv = rng.randn(n)
    w = rng.rand(n) * (rng.rand(n) > 0.3)  # some tokens not trained on (weight 0)
    ref_loss, ref_grad, ref_clip = ref_surrogate(logp, old, adv, el, eh)
    f = lambda lp: grpo.grpo_loss(lp, jnp.asarray(old, jnp.float32), jnp.asarray(adv, jnp.float32),  # noqa: E731
                                  jnp.asarray(w, jnp.float32), el, eh)
    (loss, clipped), g = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp, jnp.float32))
    assert float(loss) == pytest.approx(float((w * ref_loss).sum()), rel=1e-5)
    np.testing.assert_allclose(np.asarray(g), w * ref_grad, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(clipped), ref_clip * (w != 0))
    assert 0.1 < ref_clip[w != 0].mean() < 0.9


def test_masked_tokens_cannot_poison_the_gradient():
    """A huge log-ratio on a weight-0 token (padding, user text) gives neither inf nor nan."""
    logp = jnp.array([-1.0, 0.0, -2.0])
    old = jnp.array([-1.2, -500.0, -2.0])  # token 1: exp(500) would overflow
    adv = jnp.array([1.0, -3.0, 0.5])
    w = jnp.array([0.5, 0.0, 0.5])
    (loss, _), g = jax.value_and_grad(lambda lp: grpo.grpo_loss(lp, old, adv, w), has_aux=True)(logp)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(g))) and float(g[1]) == 0.0
    # and a trained token with a stale old log-prob is bounded by the log-ratio clamp, not inf
    (loss, _), g = jax.value_and_grad(lambda lp: grpo.grpo_loss(lp, old, adv, jnp.ones(3)), has_aux=True)(logp)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(g)))
