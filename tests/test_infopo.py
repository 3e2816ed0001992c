"""InfoPO credit baseline (algorithms/infopo.py, docs/reference/paper.md §4.3): the information gain against an independent
reference (the observed and the masked sequences scored one by one with `token_logprobs`, subtracted and averaged),
the combined turn advantage against hand-worked numbers, the config checks, and a 2-step tiny agent RL run with
rl.credit = "infopo" whose logged infopo_ig_mean matches the reference at the initial parameters."""

import dataclasses
import math
import os

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rl_helpers import random_batch, scaled_params, tiny_config
from mimesis_jax.algorithms import infopo
from mimesis_jax.algorithms.logprobs import token_logprobs
from mimesis_jax.envs.toy import ToyCoach, ToyUser
from mimesis_jax.chat.base import SimulatorAsResponder
from mimesis_jax.data.trajectory import Segment, Trajectory
from mimesis_jax.train.rl import agent as L
from mimesis_jax.train.rl.step import RLConfig, make_rl_step, prepare_batch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = tiny_config()
PH = [7, 8, 9]  # the placeholder of the unit tests
PAD = 128


def _hand_trajectory() -> Trajectory:
    """Four turns: f_0 = closing + tool + user (a coach note before header 1, never part of the IG), f_1 = closing +
    tool, turn 2 followed by the header only (empty feedback: no IG), turn 3 last (no follow-up)."""
    P = lambda *t: Segment("public", list(t))  # noqa: E731
    return Trajectory([
        P(11, 12, 13, 14, 15), P(3, 4), Segment("agent", [21, 22, 23, 24]),
        P(5), P(31, 32, 33, 34, 35, 36), P(41, 42, 43),
        Segment("coach", [60, 61, 62]), P(3, 4), Segment("agent", [25, 26, 27, 28, 29]),
        P(5), P(37, 38, 39, 40),
        P(3, 4), Segment("agent", [50, 51, 52]),
        P(3, 4), Segment("agent", [53, 54]),
    ], turn_rewards=[0.0, 0.0, 0.0, 0.0])


def _cat(segs):
    return [x for s in segs for x in s.tokens]


def _reference_pairs(tr: Trajectory, ph):
    """{t: (observed sequence, masked sequence, |y_{t+1}|)} written out from the segment list: the observed one is
    the student sequence through y_{t+1}; the masked one replaces the segments between y_t and the header before
    y_{t+1} by the placeholder ph."""
    segs = tr.student_segments()
    agents = [i for i, s in enumerate(segs) if s.kind == "agent"]
    out = {}
    for t in range(len(agents) - 1):
        a, b = agents[t], agents[t + 1]
        if b - a < 3:  # only the header between the two turns
            continue
        observed = _cat(segs[:b + 1])
        masked = _cat(segs[:a + 1]) + ph + _cat(segs[b - 1:b + 1])
        out[t] = (observed, masked, len(segs[b].tokens))
    return out


def _reference_gains(config, params, trajs, ph, temperature=1.0):
    """IG_t = mean_k [log pi_T(y_{t+1,k} | observed) - log pi_T(y_{t+1,k} | masked)], every sequence its own
    right-padded row through token_logprobs (causal: padding after a sequence changes none of its log-probs)."""
    pairs = [_reference_pairs(tr, ph) for tr in trajs]
    seqs = [q for p in pairs for o, m, _ in p.values() for q in (o, m)]
    pad = max(PAD, max(map(len, seqs)))
    ids = np.zeros((len(seqs), pad), np.int32)
    for i, q in enumerate(seqs):
        ids[i, :len(q)] = q
    lp = np.asarray(token_logprobs(config, params, jnp.asarray(ids), temperature=temperature), np.float64)
    out, k = [], 0
    for tr, p in zip(trajs, pairs):
        ig = np.full(tr.num_agent_turns, np.nan)
        for t, (o, m, n) in p.items():
            obs = lp[k, len(o) - n - 1:len(o) - 1]  # entry j predicts token j + 1
            msk = lp[k + 1, len(m) - n - 1:len(m) - 1]
            ig[t] = np.mean(obs - msk)
            k += 2
        out.append(ig)
    return out


@pytest.mark.parametrize("temperature, per_call", [(1.0, None), (0.7, 2)])
def test_information_gain_matches_the_token_logprobs_reference(temperature, per_call):
    trajs = [_hand_trajectory()] + random_batch(3, CFG.vocab_size, (3, 2, 1), coach_prob=0.5)
    params = scaled_params(CFG)
    step = make_rl_step(CFG, optax.sgd(0.1), None, RLConfig(alpha=0.0, temperature=temperature,
                                                             old_logprobs="recompute"))
    got = infopo.information_gains(trajs, infopo.rl_step_scorer(step, params, max_per_call=per_call), PH)
    ref = _reference_gains(CFG, params, trajs, PH, temperature)
    assert [np.isnan(g).tolist() for g in got] == [[False, False, True, True], [False, False, True],
                                                   [False, True], [True]]
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(r))
        np.testing.assert_allclose(g[~np.isnan(g)], r[~np.isnan(r)], rtol=1e-5, atol=2e-6)
    assert np.abs(got[0][:2]).min() > 1e-2  # masking the feedback does move the follow-up turn


def test_masked_followups_layout():
    tr = _hand_trajectory()
    items = infopo.masked_followups(tr, PH)
    assert [t for t, _, _ in items] == [0, 1]
    assert items[0][1] == [11, 12, 13, 14, 15, 3, 4, 21, 22, 23, 24] + PH + [3, 4]
    assert items[0][2] == [25, 26, 27, 28, 29]
    assert items[1][1] == ([11, 12, 13, 14, 15, 3, 4, 21, 22, 23, 24, 5, 31, 32, 33, 34, 35, 36, 41, 42, 43, 3, 4,
                            25, 26, 27, 28, 29] + PH + [3, 4])
    assert items[1][2] == [50, 51, 52]
    with pytest.raises(ValueError, match="placeholder is empty"):
        infopo.masked_followups(tr, [])


# ----------------------------------------------------------------------------------------- the advantage
def _traj(rewards, group, rid):
    segs = [Segment("public", [1])]
    for _ in rewards:
        segs += [Segment("public", [2]), Segment("agent", [3])]
    return Trajectory(segs, turn_rewards=list(rewards), group_id=group, rollout_id=rid)


NAN = float("nan")
TRAJS = [
    _traj([1.0, 0.0], 0, 0), _traj([0.0, 0.0], 0, 1),  # group 0: S = 0.5, 0
    _traj([0.5, 0.5, 0.5], 1, 2), _traj([0.5, 0.5, 0.5], 1, 3), _traj([0.5, 0.5, 0.5], 1, 4),  # group 1: tied
    _traj([1.0, 1.0], 2, 5), _traj([0.0, 1.0], 2, 6),  # group 2: S = 1, 0.5; a single defined IG
]
IGS = [np.array(x) for x in ([0.3, NAN], [0.1, NAN], [0.2, -0.1, NAN], [0.4, NAN, NAN], [0.0, 0.3, NAN],
                             [0.5, NAN], [NAN, NAN])]


def test_infopo_advantage_hand_worked():
    eps, coef, tau = 1e-6, 0.5, 0.05
    got = infopo.infopo_advantages(TRAJS, IGS, coef=coef, gate_tau=tau, eps=eps)
    sd_s = math.sqrt(2 * 0.25 ** 2)  # groups 0 and 2: two scores 0.25 apart from their mean
    a = 0.25 / (sd_s + eps)  # the GRPO advantage (equalized credit)
    gate = 1 / (1 + math.exp(sd_s / tau))
    z0 = 0.1 / (math.sqrt(2 * 0.1 ** 2) + eps)  # group 0 IGs 0.3, 0.1: mean 0.2
    sd1 = math.sqrt((0.04 ** 2 + 0.26 ** 2 + 0.24 ** 2 + 0.16 ** 2 + 0.14 ** 2) / 4)  # group 1: mean 0.16
    z1 = lambda x: (x - 0.16) / (sd1 + eps)  # noqa: E731
    expected = [
        [a + coef * gate * z0, a], [-a - coef * gate * z0, -a],
        [coef * 0.5 * z1(0.2), coef * 0.5 * z1(-0.1), 0.0],  # tied outcomes: A = 0, gate = sigmoid(0) = 1/2
        [coef * 0.5 * z1(0.4), 0.0, 0.0], [coef * 0.5 * z1(0.0), coef * 0.5 * z1(0.3), 0.0],
        [a, a], [-a, -a],  # one defined IG: no baseline, no information term
    ]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-12)


def test_infopo_advantage_without_gate_or_std():
    got = infopo.infopo_advantages(TRAJS, IGS, coef=2.0, gate_tau=0.0, eps=1e-6, divide_std=False)
    expected = [[0.25 + 2 * 0.1, 0.25], [-0.25 - 2 * 0.1, -0.25],
                [2 * (0.2 - 0.16), 2 * (-0.1 - 0.16), 0.0], [2 * (0.4 - 0.16), 0.0, 0.0],
                [2 * (0.0 - 0.16), 2 * (0.3 - 0.16), 0.0], [0.25, 0.25], [-0.25, -0.25]]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)


def test_bad_inputs_and_config():
    with pytest.raises(ValueError, match="6 information-gain lists for 7 trajectories"):
        infopo.infopo_advantages(TRAJS, IGS[:6], coef=1.0, gate_tau=0.0)
    with pytest.raises(ValueError, match="trajectory 1: 3 information gains for 2 agent turns"):
        infopo.infopo_advantages(TRAJS[:2], [IGS[0], np.zeros(3)], coef=1.0, gate_tau=0.0)
    bad = dataclasses.replace(TRAJS[0], status="invalid", invalid_reason="refused")
    with pytest.raises(ValueError, match="trajectory 0 has status 'invalid'"):
        infopo.infopo_advantages([bad, TRAJS[1]], IGS[:2], coef=1.0, gate_tau=0.0)
    with pytest.raises(ValueError, match="RLConfig key 'infopo_coef'"):
        RLConfig(credit="infopo", infopo_coef=-1.0)
    with pytest.raises(ValueError, match="RLConfig key 'infopo_gate_tau'"):
        RLConfig(credit="infopo", infopo_gate_tau=float("inf"))
    with pytest.raises(ValueError, match="RLConfig key 'credit'"):
        RLConfig(credit="info")
    with pytest.raises(ValueError, match="needs a scoring pass"):
        prepare_batch(TRAJS, RLConfig(credit="infopo"))


# --------------------------------------------------------------------------------------------- the loop
def test_tiny_infopo_run_logs_the_information_gain(tmp_path):
    from mimesis_jax.data.tokenizer import load_tokenizer
    from mimesis_jax.train.rl import learner as rl_run

    sets = ["train.progress_bar=false", "train.tensorboard=false", "rollout.prompts_per_step=2",
            "rollout.group_size=3", "rollout.mini_batch_prompts=1", "rollout.agent_max_tokens=8",
            "rollout.row_len=256", "checkpoint.async_save=false", "train.steps=2"]
    cfg = L.load(os.path.join(ROOT, "configs", "tiny_agentrl.py:infopo"), sets)
    assert cfg.rl.credit == "infopo" and cfg.rl.alpha == 0.0
    user = ToyUser()
    seen = {}
    res = L.run(cfg, str(tmp_path / "run"), user_side=L.UserSide(user, SimulatorAsResponder(user), user, ToyCoach()),
                on_rollouts=lambda step, trajs: seen.__setitem__(step, trajs), handle_signals=False,
                log=lambda *a: None)
    assert sorted(res.metrics) == [1, 2]
    for step, rec in res.metrics.items():
        assert all(np.isfinite(v) for v in rec.values() if isinstance(v, float)), rec
        kept = [t for t in seen[step] if t.status == "ok"]
        assert rec["trained_groups"] == 2 and rec["updates"] == 2
        assert rec["infopo_turns"] == sum(t.num_agent_turns - 1 for t in kept) > 0
    lines = open(os.path.join(res.workdir, "metrics.jsonl")).read().splitlines()
    assert len(lines) == 2 and all('"infopo_ig_mean"' in x for x in lines)

    # step 1 scored with the initial parameters: the reference IG of its dialogues, written out per segment
    tok = load_tokenizer(cfg.tokenizer.name)
    init = rl_run.setup(cfg, str(tmp_path / "init"), tok, log=lambda *a: None)
    init.ckpt.close()
    ref = _reference_gains(init.model_config, init.state["params"], [t for t in seen[1] if t.status == "ok"],
                           infopo.placeholder_tokens(tok))
    values = np.concatenate([r[np.isfinite(r)] for r in ref])
    assert len(values) == res.metrics[1]["infopo_turns"]
    assert res.metrics[1]["infopo_ig_mean"] == pytest.approx(float(values.mean()), rel=1e-4, abs=2e-6)
