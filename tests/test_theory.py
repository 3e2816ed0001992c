"""The theory lab (mimesis_jax/theory, docs/reference/paper.md §7 / Appendix E): hand-worked examples, independent checks of the
exact machinery (enumeration, finite differences), every claim on seed 0, and the `theory` command."""

import argparse
import json
import math
import os

import numpy as np
import pytest

from mimesis_jax.theory import claims as C
from mimesis_jax.commands import theory as cli
from mimesis_jax.theory import mdp as M
from mimesis_jax.theory.updates import (
    AdamW,
    closed_form_update,
    covariance,
    maximise_weighted_likelihood,
    weighted_log_likelihood,
)

CLAIM_NAMES = [
    "E.1 closed form p+ = p w / Z",
    "E.1 E_p+[A^p] = Cov_p(w,A^p)/Z",
    "E.1 J(p+) >= J(p) when Cov >= 0",
    "E.1 Cov < 0 -> J drops (failure)",
    "E.1 Z(s) = 0 keeps p",
    "E.2 aligned: GRPO+aCSD step wins",
    "E.2 lambda < 0 (failure)",
    "E.2 large random e (failure)",
    "E.2 all GRPO advantages 0, CSD != 0",
    "E.2 AdamW exact: aligned wins",
    "E.2 AdamW exact: lambda<0 (failure)",
    "E.2 AdamW sampled: aligned wins",
    "E.2 AdamW sampled: lambda<0 (failure)",
    "E.2 AdamW sampled: noise only (failure)",
]


# ------------------------------------------------------------------------------ Proposition E.1 by hand
def test_e1_identity_on_a_hand_computed_three_action_example():
    # p = (1/2, 1/4, 1/4), w = (1, 1/2, 0), A = (1, -1, -1) (E_p A = 1/2 - 1/4 - 1/4 = 0)
    # Z = 1/2 + 1/8 + 0 = 5/8 ; p+ = (1/2, 1/8, 0) / (5/8) = (4/5, 1/5, 0)
    # E_{p+} A = 4/5 - 1/5 = 3/5 ; Cov_p(w, A) = E[wA] - E[w] E[A] = 1/2 - 1/8 - 0 = 3/8 ; 3/8 / 5/8 = 3/5
    p, w, A = np.array([0.5, 0.25, 0.25]), np.array([1.0, 0.5, 0.0]), np.array([1.0, -1.0, -1.0])
    p_plus = closed_form_update(p, w)
    np.testing.assert_allclose(p_plus, [0.8, 0.2, 0.0], rtol=0, atol=1e-15)
    assert covariance(p, w, A) == pytest.approx(0.375, abs=1e-15)
    assert float(p_plus @ A) == pytest.approx(0.6, abs=1e-15)
    assert covariance(p, w, A) / float(p @ w) == pytest.approx(0.6, abs=1e-15)


def test_closed_form_matches_the_numerical_maximiser():
    # p w = (0.1, 0.27, 0.12), Z = 0.49 -> p+ = (10, 27, 12) / 49
    p, w = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.9, 0.6])
    expected = np.array([10.0, 27.0, 12.0]) / 49.0
    np.testing.assert_allclose(closed_form_update(p, w), expected, rtol=0, atol=1e-15)
    np.testing.assert_allclose(maximise_weighted_likelihood(p, w), expected, rtol=0, atol=1e-12)
    # F(p+) = sum p w log p+ is the maximum: above the uniform distribution and p itself
    f_max = 0.1 * math.log(10 / 49) + 0.27 * math.log(27 / 49) + 0.12 * math.log(12 / 49)
    assert float(weighted_log_likelihood(expected, p, w)) == pytest.approx(f_max, abs=1e-15)
    assert f_max > float(weighted_log_likelihood(np.full(3, 1 / 3), p, w))
    assert f_max > float(weighted_log_likelihood(p, p, w))


def test_zero_weight_keeps_p_and_the_objective_is_flat():
    p = np.array([[0.6, 0.4], [0.1, 0.9]])
    w = np.array([[0.0, 0.0], [0.5, 1.0]])
    out = closed_form_update(p, w)
    np.testing.assert_array_equal(out[0], p[0])  # Z = 0: kept exactly
    # Z = 0.05 + 0.9 = 0.95: (0.05, 0.9) / 0.95
    np.testing.assert_allclose(out[1], [0.05 / 0.95, 0.9 / 0.95], rtol=0, atol=1e-15)
    assert float(weighted_log_likelihood(np.array([0.99, 0.01]), p[0], w[0])) == 0.0
    with pytest.raises(ValueError, match="non-negative"):
        closed_form_update(p, -w)


# ----------------------------------------------------------------------- exact machinery, checked apart
def test_dynamic_programming_matches_enumeration_of_every_trajectory():
    rng = np.random.default_rng(3)
    mdp = M.random_mdp(rng, 2, 3, 3)
    pi = M.random_policy(rng, mdp)
    assert M.evaluate(mdp, pi).J == pytest.approx(M.enumerate_return(mdp, pi), abs=1e-13)
    # one step by hand: J = sum_s mu0(s) sum_a pi(a|s) R(s, a)
    one = M.FiniteMDP(P=np.ones((1, 2, 2, 2)) / 2, R=np.array([[[1.0, 0.0], [0.5, 0.25]]]), mu0=np.array([0.3, 0.7]))
    pol = np.array([[[0.2, 0.8], [0.6, 0.4]]])
    assert M.evaluate(one, pol).J == pytest.approx(0.3 * 0.2 + 0.7 * (0.6 * 0.5 + 0.4 * 0.25), abs=1e-15)


def test_return_gradient_matches_central_finite_differences():
    rng = np.random.default_rng(4)
    mdp = M.random_mdp(rng, 3, 3, 4)
    theta = rng.standard_normal(mdp.R.shape)
    g = M.return_gradient(mdp, theta)
    h = 1e-6
    for idx in [(0, 0, 0), (1, 2, 1), (3, 1, 2), (2, 0, 1)]:
        up, down = theta.copy(), theta.copy()
        up[idx] += h
        down[idx] -= h
        fd = (M.evaluate(mdp, M.softmax(up)).J - M.evaluate(mdp, M.softmax(down)).J) / (2 * h)
        assert g[idx] == pytest.approx(fd, abs=1e-8)


def test_exact_csd_direction_is_lambda_g_when_e_is_zero():
    # the per-state b(s) is centred away: sum_a pi (b + lambda A - E_pi[b + lambda A]) grad log pi = lambda g
    rng = np.random.default_rng(5)
    mdp = M.random_mdp(rng, 3, 4, 3)
    pi = M.random_policy(rng, mdp)
    d, A = M.visitation(mdp, pi), M.evaluate(mdp, pi).A
    c = M.weighted_direction(pi, d, rng.uniform(size=(3, 3, 1)) + 0.7 * A)
    np.testing.assert_allclose(c, 0.7 * M.weighted_direction(pi, d, A), rtol=0, atol=1e-15)


def test_group_direction_and_score_bound_by_hand():
    # one state, one step, pi = (1/2, 1/2); actions 0 and 1 with weights +1 and -1:
    # (1/2) [ (1)(e0 - pi) + (-1)(e1 - pi) ] = (1/2) [ (1/2, -1/2) - (-1/2, 1/2) ] = (1/2, -1/2)
    pi = np.array([[[0.5, 0.5]]])
    grp = M.Group(states=np.array([[0], [0]]), actions=np.array([[0], [1]]), returns=np.array([1.0, 1.0]))
    np.testing.assert_allclose(M.group_direction(pi, [grp], [np.array([[1.0], [-1.0]])]), [[[0.5, -0.5]]])
    # S = ||onehot(a) - pi|| = sqrt(1/4 + 1/4)
    assert M.score_gradient_bound(pi) == pytest.approx(math.sqrt(0.5), abs=1e-15)


def test_adamw_first_step_by_hand():
    # fresh state: m_hat = g, v_hat = g^2 -> theta - lr (g / (|g| + eps) + wd theta), g = -direction
    opt = AdamW(lr=0.1, eps=1e-8, weight_decay=0.01)
    theta = np.array([1.0, -2.0])
    new, state = opt.step(theta, np.array([0.5, -0.25]), opt.init(theta))
    expected = theta + 0.1 * np.array([0.5 / (0.5 + 1e-8), -0.25 / (0.25 + 1e-8)]) - 0.1 * 0.01 * theta
    np.testing.assert_allclose(new, expected, rtol=0, atol=1e-15)
    assert state.t == 1
    np.testing.assert_allclose(state.m, [-0.05, 0.025], rtol=0, atol=1e-15)
    np.testing.assert_allclose(state.v, [0.001 * 0.25, 0.001 * 0.0625], rtol=0, atol=1e-15)


def test_zero_advantage_group_by_hand():
    # one state, one step, both actions rewarded 1: every z-normalised advantage is (1 - 1) / (0 + eps) = 0.
    # teacher (0.8, 0.2) vs student (0.5, 0.5): w_a = sigmoid(5 log(teacher_a / 0.5)) = 1 / (1 + (0.5 / t_a)^5)
    pi, teacher = np.array([[[0.5, 0.5]]]), np.array([[[0.8, 0.2]]])
    grp = M.Group(states=np.array([[0], [0]]), actions=np.array([[0], [1]]), returns=np.array([1.0, 1.0]))
    adv = C.grpo_group_weights(grp)
    np.testing.assert_array_equal(adv, np.zeros((2, 1)))
    np.testing.assert_array_equal(M.group_direction(pi, [grp], [adv]), np.zeros((1, 1, 2)))
    w = C.csd_group_weights(pi, teacher, grp, beta=5.0)
    w0, w1 = 1 / (1 + (0.5 / 0.8) ** 5), 1 / (1 + (0.5 / 0.2) ** 5)
    np.testing.assert_allclose(w[:, 0], [w0, w1], rtol=1e-6)  # Eq 9 runs in float32 (algorithms/csd.py)
    # sum (w - w_bar)(onehot - pi) / 2 = (w0 - w1) / 4 * (1, -1)
    c = M.group_direction(pi, [grp], [w - w.mean()])
    np.testing.assert_allclose(c[0, 0], [(w0 - w1) / 4, -(w0 - w1) / 4], rtol=1e-6)


def test_monotone_weights_order_like_the_advantage():
    A = np.array([[0.3, -0.2, 0.1]])
    w = C.monotone_weights(np.random.default_rng(0), A)
    assert list(np.argsort(w[0])) == [1, 2, 0]  # the order of A
    w = C.monotone_weights(np.random.default_rng(0), A, increasing=False)
    assert list(np.argsort(w[0])) == [0, 2, 1]


# ------------------------------------------------------------------------------------- claims, seed 0
def test_prop_e1_claims_on_seed_0():
    closed = C.prop_e1_closed_form(0)
    assert closed.passed and closed.details["n_states"] == 200 and closed.details["max_abs_err"] < 1e-12
    ident = C.prop_e1_identity(0)
    assert ident.passed and len(ident.details["lhs"]) == C.HORIZON
    improve = C.prop_e1_improvement(0)
    assert improve.passed and min(improve.details["gains"]) > 0 and improve.details["min_cov"] >= 0
    drop = C.prop_e1_negative_covariance(0)  # the documented failure: every trial loses return
    assert drop.passed and max(drop.details["gains"]) < 0 and drop.details["max_cov"] <= 0
    zero = C.prop_e1_zero_weight(0)
    assert zero.passed and zero.details["max_change_where_z0"] == 0.0 and zero.details["n_zero_states"] > 0


def test_thm_e2_sweep_on_seed_0():
    sweep, (aligned, reverse, noisy) = C.thm_e2_sweep(0)
    assert aligned.passed and reverse.passed and noisy.passed
    # the row counts follow from the inequality lambda |g| > S H eps on the grid, 8 draws per cell
    bound_cells = sum(lam * sweep.g_norm > sweep.score_bound * C.HORIZON * eps
                      for lam in sweep.lambdas for eps in sweep.epsilons)
    reverse_cells = sum(lam < 0 and -lam * sweep.g_norm > sweep.score_bound * C.HORIZON * eps
                        for lam in sweep.lambdas for eps in sweep.epsilons)
    assert aligned.details["wins"] == aligned.details["n"] == 8 * bound_cells
    assert reverse.details["wins"] == 0 and reverse.details["n"] == 8 * reverse_cells
    assert noisy.details["n"] == 8 * sum(lam >= 0 for lam in sweep.lambdas)
    assert noisy.details["wins"] < noisy.details["n"]
    # at the smallest step: every aligned cell wins in every draw, lambda = -1 never wins
    assert np.all(sweep.wins[:, :, 0][sweep.bound] == 1.0)
    assert np.all(sweep.wins[sweep.lambdas.index(-1.0), :, 0] == 0.0)


def test_thm_e2_zero_advantage_and_adamw_on_seed_0():
    zero = C.thm_e2_zero_advantage_group(0)
    assert zero.passed and zero.details["csd_norm"] > 0 and zero.details["reward"] in (0.0, 1.0)
    aligned, reverse = C.thm_e2_adamw_exact(0)
    assert aligned.passed and aligned.details["adamw_diff"] > 0 and aligned.details["sgd_diff"] > 0
    assert reverse.passed and reverse.details["adamw_diff"] < 0
    curves, (a, r, n) = C.thm_e2_adamw_sampled(0)
    assert curves.J.shape == (4, 32, 11)
    np.testing.assert_array_equal(curves.J[:, :, 0], np.broadcast_to(curves.J[0, :, 0], (4, 32)))  # same branch
    diff = curves.J[1, :, -1] - curves.J[0, :, -1]
    assert a.details["mean_diff"] == pytest.approx(diff.mean(), abs=1e-15)
    assert a.details["se"] == pytest.approx(diff.std(ddof=1) / math.sqrt(32), rel=1e-12)
    assert a.passed and r.passed and n.passed


# ------------------------------------------------------------------------------------------ the command
def _parse(argv):
    p = argparse.ArgumentParser()
    cli.add_args(p)
    return p.parse_args(argv)


def test_run_exits_0_and_prints_every_claim(tmp_path, capsys):
    out = tmp_path / "theory"
    assert cli.run(_parse(["--out", str(out), "--seed", "1"])) == 0
    table = capsys.readouterr().out
    lines = table.splitlines()
    assert [c.strip() for c in lines[0].split("|")] == ["claim", "setting", "measured", "expected", "pass"]
    for name in CLAIM_NAMES:
        assert any(line.startswith(name) and line.rstrip().endswith("| yes") for line in lines), name
    data = json.loads((out / "theory.json").read_text())
    assert [c["claim"] for c in data["claims"]] == CLAIM_NAMES
    assert data["all_pass"] is True and all(c["pass"] for c in data["claims"]) and data["seed"] == 1
    for plot in data["plots"]:
        with open(out / plot, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_run_rejects_bad_arguments(tmp_path, capsys):
    not_a_dir = tmp_path / "file.txt"
    not_a_dir.write_text("x")
    assert cli.run(_parse(["--out", str(not_a_dir)])) == 2
    assert str(not_a_dir) in capsys.readouterr().err
    assert cli.run(_parse(["--out", str(tmp_path / "o"), "--seed", "-1"])) == 2
    assert "--seed" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o")
