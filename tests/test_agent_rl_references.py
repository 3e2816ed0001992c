"""Stage II's step-level references, against formulas written here: the second PPO mini-batch is off-policy and
its loss is a per-token Eq 5-6 reference (ratios and clipping after the first update); the CSD gradient is alpha
times an independently written Eq 10 (the teacher is the same model on the naive teacher sequence); coach notes
never reach the student when alpha = 0. These compile small steps and run them once, so they compile at XLA's fast
level (tests/conftest.py); they pass at the same bounds fully optimized (MIMESIS_TEST_XLA_OPT=full)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rl_helpers import random_batch, scaled_params, tiny_config, tree_rel_err
from mimesis_jax.algorithms import grpo
from mimesis_jax.algorithms.logprobs import token_logprobs
from mimesis_jax.train.rl.step import RLConfig, make_rl_step, prepare_batch

CFG = tiny_config()


PAD = 160  # every reference sequence is right-padded to this length: one compilation for all of them


def _logps(params, seqs):
    """log pi(seq[i] | seq[:i]) for each sequence, from one padded, unpacked forward pass (causal: right padding
    does not change the real tokens' log-probs). Returns [len(seqs), PAD - 1]."""
    assert max(map(len, seqs)) <= PAD
    ids = np.zeros((len(seqs), PAD), np.int32)
    for i, q in enumerate(seqs):
        ids[i, :len(q)] = q
    return token_logprobs(CFG, params, jnp.asarray(ids))


def _student_logps(params, trajs):
    """Per trajectory, per agent turn: log pi(y) of the turn's tokens in the student sequence."""
    lp = _logps(params, [t.student_tokens() for t in trajs])
    out = []
    for row, t in enumerate(trajs):
        turns, pos = [], 0
        for s in t.student_segments():
            if s.kind == "agent":
                turns.append(lp[row, pos - 1:pos - 1 + len(s.tokens)])
            pos += len(s.tokens)
        out.append(turns)
    return out


def test_second_minibatch_is_off_policy_and_matches_eq6():
    trajs = random_batch(3, CFG.vocab_size, (3, 2, 4, 1, 2, 3, 2, 2), coach_prob=0.0)
    rl = RLConfig(alpha=0.0, old_logprobs="recompute", eps_low=0.2, eps_high=0.2)
    step = make_rl_step(CFG, optax.sgd(30.0), None, rl)
    a, b = trajs[:4], trajs[4:]
    p0 = scaled_params(CFG)
    batches = [step.place(prepare_batch(x, rl, row_len=128, pad_multiple=16)) for x in (a, b)]
    batches = [step.recompute_old_logprobs(p0, x) for x in batches]  # fixed once, before any update
    old_b = [np.asarray(x) for turns in _student_logps(p0, b) for x in turns]
    opt = step.init_opt_state(p0)
    p1, opt, m1 = step(scaled_params(CFG), opt, batches[0])
    assert float(m1["clip_frac"]) == 0.0  # the first mini-batch is on-policy: every ratio is 1
    loss, _, sums = step.loss_and_grads(p1, batches[1])
    new_b = [np.asarray(x) for turns in _student_logps(p1, b) for x in turns]
    adv = grpo.trajectory_turn_advantages(b)
    # Eq 5-6, per token, token-mean over the mini-batch's agent tokens
    terms, n_clipped = [], 0
    k = 0
    for t, adv_t in zip(b, adv):
        for turn in range(t.num_agent_turns):
            ratio = np.exp(new_b[k].astype(np.float64) - old_b[k])
            A = adv_t[turn]
            clipped = np.clip(ratio, 0.8, 1.2)
            terms.append(np.minimum(ratio * A, clipped * A))
            n_clipped += int(np.sum(np.minimum(ratio * A, clipped * A) != ratio * A))
            k += 1
    ratios = np.concatenate([np.exp(n - o) for n, o in zip(new_b, old_b)])
    assert np.abs(ratios - 1).max() > 0.2  # the update moved the policy: the second mini-batch is off-policy
    assert float(sums["clipped"]) == n_clipped > 0  # clipping engages
    assert float(loss) == pytest.approx(-np.concatenate(terms).mean(), rel=1e-4, abs=1e-6)


def test_csd_gradient_is_alpha_times_the_eq10_gradient():
    trajs = random_batch(5, CFG.vocab_size, (2, 3, 1, 2), coach_prob=0.8)
    assert any(s.kind == "coach" for t in trajs for s in t.segments)
    alpha, beta = 0.5, 5.0
    params = scaled_params(CFG)
    grads = {}
    for a in (0.0, alpha):
        rl = RLConfig(alpha=a, beta=beta, old_logprobs="recompute")
        step = make_rl_step(CFG, optax.sgd(1.0), None, rl)
        batch = step.recompute_old_logprobs(params, step.place(prepare_batch(trajs, rl, row_len=128,
                                                                               pad_multiple=16)))
        grads[a] = step.loss_and_grads(params, batch)[1]

    def eq10(p):
        """L_CSD = -(1/|C|) sum_{coached tokens} sg(sigmoid(beta (log pi_teacher - log pi_student))) log pi_student,
        the teacher = the same model on the naive teacher sequence (the note in context), stop-gradient."""
        students = _student_logps(p, trajs)
        coached = [(i, turn) for i, t in enumerate(trajs) for turn, c in enumerate(t.coach_for_turn()) if c is not None]
        teacher_seqs = [trajs[i].teacher_sequence(turn) for i, turn in coached]
        teacher_lp = jax.lax.stop_gradient(_logps(p, [q for q, _ in teacher_seqs]))
        total, count = 0.0, 0
        for k, ((i, turn), (_, off)) in enumerate(zip(coached, teacher_seqs)):
            student = students[i][turn]
            n = student.shape[0]
            teacher = teacher_lp[k, off - 1:off - 1 + n]
            w = jax.lax.stop_gradient(jax.nn.sigmoid(beta * (teacher - student)))
            total = total - jnp.sum(w * student)
            count += n
        return total / count

    ref = jax.grad(eq10)(params)
    diff = jax.tree.map(lambda x, y: (x - y) / alpha, grads[alpha], grads[0.0])
    assert tree_rel_err(diff, ref) < 2e-4


def test_coach_notes_never_reach_the_student_when_alpha_is_zero():
    with_notes = random_batch(7, CFG.vocab_size, (2, 3, 1, 2), coach_prob=1.0)
    without = [dataclasses.replace(t, segments=[s for s in t.segments if s.kind != "coach"]) for t in with_notes]
    rl = RLConfig(alpha=0.0, old_logprobs="recompute")
    step = make_rl_step(CFG, optax.sgd(1.0), None, rl)
    params = scaled_params(CFG)
    out = []
    for trs in (with_notes, without):
        batch = step.recompute_old_logprobs(params, step.place(prepare_batch(trs, rl, row_len=128,
                                                                             pad_multiple=16)))
        out.append(step.loss_and_grads(params, batch))
    assert float(out[0][0]) == float(out[1][0])
    assert tree_rel_err(out[0][1], out[1][1]) == 0.0
