"""The off-policy correction of asynchronous RL (issue #44 item 4; docs/stage2.md "Off-policy correction"): the
decoupled objective's formulas (grpo.behaviour_weight, grpo.decoupled_grpo_loss) against NumPy written from the
formulas, its identity case (behaviour = proximal gives exactly Eq 6), the behaviour log-probs in the packed batch,
a tiny RLStep update against a reference loss computed by hand, the config checks of rl.behavior_is_cap, and one
step of the RL loop (train/rl/learner.py) logging the gap to the step-start policy."""

import copy
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rl_helpers import ScriptedDraws, random_batch, scaled_params, tiny_config
from mimesis_jax.algorithms import csd, grpo, rl_batch
from mimesis_jax.errors import ConfigError
from mimesis_jax.train.rl import agent as A, learner as L
from mimesis_jax.train.rl.step import RLConfig, make_rl_step, prepare_batch

EPS_LOW, EPS_HIGH = 0.2, 0.28
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------------------ NumPy, from the formulas
def np_weight(prox, behav, cap):
    """u = min(pi_prox / pi_behav, cap); capped where the ratio passes the cap."""
    ratio = np.exp(np.float64(prox) - np.float64(behav))
    return np.minimum(ratio, cap), ratio > cap


def np_decoupled(logp, prox, behav, adv, w, cap, eps_low=EPS_LOW, eps_high=EPS_HIGH):
    """L = sum_k w_k u_k (-min(r_k A_k, clip(r_k, 1 - eps_low, 1 + eps_high) A_k)), r = pi_theta / pi_prox,
    computed only on tokens of nonzero weight."""
    on = w != 0
    logp, prox, behav, adv, w = (np.float64(x)[on] for x in (logp, prox, behav, adv, w))
    r = np.exp(logp - prox)
    u, _ = np_weight(prox, behav, cap)
    per_tok = -np.minimum(r * adv, np.clip(r, 1 - eps_low, 1 + eps_high) * adv)
    return float(np.sum(w * u * per_tok))


def np_decoupled_grad(logp, prox, behav, adv, w, cap, eps_low=EPS_LOW, eps_high=EPS_HIGH):
    """d L / d log pi_theta per token: -w u A r where the unclipped term is the one taken, 0 where the clip is."""
    logp, prox, behav, adv, w = (np.float64(x) for x in (logp, prox, behav, adv, w))
    r = np.exp(logp - prox)
    u, _ = np_weight(prox, behav, cap)
    unclipped_taken = r * adv <= np.clip(r, 1 - eps_low, 1 + eps_high) * adv
    return np.where((w != 0) & unclipped_taken, -w * u * adv * r, 0.0)


def _tokens(seed, n=64):
    rng = np.random.RandomState(seed)
    behav = -rng.rand(n) * 4
    prox = behav + rng.randn(n) * 0.8  # weights on both sides of 1 and past a cap of 2
    logp = prox + rng.randn(n) * 0.3  # ratios inside and outside the clip range
    adv = rng.randn(n)
    w = (rng.rand(n) < 0.8) / 50.0
    return [np.float32(x) for x in (logp, prox, behav, adv, w)]


# ------------------------------------------------------------------------------------------------ formulas
def test_behaviour_weight_is_the_truncated_ratio():
    _, prox, behav, _, _ = _tokens(0)
    u, capped = grpo.behaviour_weight(jnp.asarray(prox), jnp.asarray(behav), 2.0)
    want_u, want_capped = np_weight(prox, behav, 2.0)
    assert 0 < want_capped.sum() < len(prox) and (want_u < 1).any()  # the data exercises both sides of the cap
    np.testing.assert_allclose(np.asarray(u), want_u, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(capped), want_capped.astype(np.float32))
    # the weight is a constant of the update: no gradient flows through it
    g = jax.grad(lambda p: jnp.sum(grpo.behaviour_weight(p, jnp.asarray(behav), 2.0)[0]))(jnp.asarray(prox))
    np.testing.assert_array_equal(np.asarray(g), 0.0)


def test_decoupled_loss_and_its_gradient_match_the_formula():
    logp, prox, behav, adv, w = _tokens(1)
    args = [jnp.asarray(x) for x in (logp, prox, behav, adv, w)]

    def loss(lp):
        return grpo.decoupled_grpo_loss(lp, args[1], args[2], args[3], args[4], 2.0, EPS_LOW, EPS_HIGH)[0]

    got, clipped, capped = grpo.decoupled_grpo_loss(*args[:3], args[3], args[4], 2.0, EPS_LOW, EPS_HIGH)
    assert float(got) == pytest.approx(np_decoupled(logp, prox, behav, adv, w, 2.0), rel=1e-5)
    r = np.exp(np.float64(logp) - prox)
    on = w != 0
    want_clipped = on & (-np.clip(r, 1 - EPS_LOW, 1 + EPS_HIGH) * adv > -r * adv)
    assert 0 < want_clipped.sum() < on.sum()
    np.testing.assert_array_equal(np.asarray(clipped), want_clipped.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(capped), (on & np_weight(prox, behav, 2.0)[1]).astype(np.float32))
    np.testing.assert_allclose(np.asarray(jax.grad(loss)(args[0])), np_decoupled_grad(logp, prox, behav, adv, w, 2.0),
                               rtol=1e-5, atol=1e-8)


def test_behaviour_equal_to_proximal_is_exactly_eq6():
    logp, prox, _, adv, w = _tokens(2)
    a = [jnp.asarray(x) for x in (logp, prox, adv, w)]
    plain, plain_clipped = grpo.grpo_loss(a[0], a[1], a[2], a[3], EPS_LOW, EPS_HIGH)
    for cap in (1.0, 5.0):
        dec, clipped, capped = grpo.decoupled_grpo_loss(a[0], a[1], a[1], a[2], a[3], cap, EPS_LOW, EPS_HIGH)
        assert float(dec) == float(plain)  # u = exp(0) = 1 exactly: bit for bit the plain loss
        np.testing.assert_array_equal(np.asarray(clipped), np.asarray(plain_clipped))
        assert float(jnp.sum(capped)) == 0.0


def test_masked_tokens_carry_no_loss_and_no_nan():
    logp, prox, behav, adv, w = _tokens(3)
    w[:5] = 0.0
    behav[:5] = -np.inf  # e.g. padding: a masked token's values must not reach the loss or its gradient
    prox[:5] = 0.0
    args = [jnp.asarray(x) for x in (logp, prox, behav, adv, w)]
    g = jax.grad(lambda lp: grpo.decoupled_grpo_loss(lp, *args[1:], 2.0)[0])(args[0])
    assert np.all(np.isfinite(np.asarray(g))) and np.all(np.asarray(g)[:5] == 0)
    got = float(grpo.decoupled_grpo_loss(*args, 2.0)[0])
    assert got == pytest.approx(np_decoupled(logp, prox, behav, adv, w, 2.0, 0.2, 0.2), rel=1e-5)


# ------------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("kw,msg", [
    (dict(behavior_is_cap=2.0), "> 0 needs old_logprobs=recompute"),
    (dict(behavior_is_cap=0.5, old_logprobs="recompute"), "must be 0 \\(off\\) or a finite number >= 1"),
    (dict(behavior_is_cap=float("inf"), old_logprobs="recompute"), "must be 0 \\(off\\) or a finite number >= 1"),
    (dict(behavior_is_cap=-1.0, old_logprobs="recompute"), "must be 0 \\(off\\) or a finite number >= 1"),
])
def test_config_errors_name_the_key(kw, msg):
    with pytest.raises(ConfigError, match="RLConfig key 'behavior_is_cap': " + msg) as e:
        RLConfig(**kw)
    assert "\n" not in str(e.value)


def test_valid_caps():
    assert RLConfig(behavior_is_cap=1.0, old_logprobs="recompute").behavior_is_cap == 1.0
    assert RLConfig().behavior_is_cap == 0.0


# ------------------------------------------------------------------------------------------------ the batch
CFG = tiny_config()
ROW_LEN = 128


@pytest.fixture(scope="module")
def trajectories():
    return random_batch(5, CFG.vocab_size, (2, 3, 1, 2))


def test_batch_keeps_the_behaviour_logprobs_only_when_on(trajectories):
    off = prepare_batch(trajectories, RLConfig(alpha=0.3, old_logprobs="recompute"), row_len=ROW_LEN)
    on = prepare_batch(trajectories, RLConfig(alpha=0.3, old_logprobs="recompute", behavior_is_cap=2.0),
                       row_len=ROW_LEN)
    assert rl_batch.BEHAV_KEY not in off.arrays
    assert set(on.arrays) == set(off.arrays) | {rl_batch.BEHAV_KEY}
    for k, v in off.arrays.items():
        np.testing.assert_array_equal(on.arrays[k], v)
    behav = on.arrays[rl_batch.BEHAV_KEY]
    for tr, slots in zip(trajectories, on.turns):
        for seg, s in zip([tr.segments[a] for a in tr.agent_indices()], slots):
            np.testing.assert_array_equal(behav[s.row, s.start:s.start + s.length], np.float32(seg.logprobs))
    assert np.all(behav[on.arrays["agent_mask"] == 0] == 0)
    # two processes' shares: the common layout carries the array, zeros for a process without trajectories
    layout = rl_batch.common_layout([rl_batch.layout_info(on), rl_batch.layout_info(None)])
    np.testing.assert_array_equal(rl_batch.conform(on, layout)[rl_batch.BEHAV_KEY], behav)
    assert not rl_batch.conform(None, layout)[rl_batch.BEHAV_KEY].any()
    assert rl_batch.BEHAV_KEY not in rl_batch.conform(off, rl_batch.common_layout([rl_batch.layout_info(off)]))


# ------------------------------------------------------------------------------------------------- the step
def _behaviour_near(trajectories, params, seed):
    """Copies of `trajectories` whose rollout log-probs are those of `params` + N(0, 0.6) noise: behaviour log-probs
    close to the proximal ones, as an asynchronous rollout a version or two behind would record."""
    rng = np.random.RandomState(seed)
    out = copy.deepcopy(trajectories)
    for tr, turns in zip(out, csd.score(CFG, params, trajectories, row_len=ROW_LEN)):
        for a, (s, _) in zip(tr.agent_indices(), turns):
            tr.segments[a].logprobs = (s + rng.randn(len(s)) * 0.6).tolist()
    return out


def test_step_update_matches_a_hand_computed_loss(trajectories):
    """One RLStep update (2 micro-batches, alpha > 0) with the switch on: the proximal log-probs recomputed with
    params P0, the update at params P1 (so r != 1); the loss = the decoupled GRPO term computed in NumPy from the
    per-token log-probs + alpha x the CSD term, which is the one of the plain objective."""
    cap = 1.5
    rl = RLConfig(alpha=0.3, old_logprobs="recompute", behavior_is_cap=cap, num_microbatches=2, eps_low=EPS_LOW,
                  eps_high=EPS_HIGH)
    step = make_rl_step(CFG, optax.sgd(0.0), None, rl)
    p0, p1 = scaled_params(CFG, scale=5.0), scaled_params(CFG, scale=5.2)
    trajectories = _behaviour_near(trajectories, p0, 7)
    packed = prepare_batch(trajectories, rl, rows_multiple=step.rows_multiple(), row_len=ROW_LEN)
    batch = step.recompute_old_logprobs(p0, step.place(packed))
    _, _, m = step(p1, step.init_opt_state(p1), batch)  # donates p1
    p1 = scaled_params(CFG, scale=5.2)

    prox = [s for turns in csd.score(CFG, p0, trajectories, row_len=ROW_LEN) for s, _ in turns]
    cur = csd.score(CFG, p1, trajectories, row_len=ROW_LEN)
    logp = np.concatenate([s for turns in cur for s, _ in turns])
    prox = np.concatenate(prox)
    behav = np.concatenate([tr.segments[a].logprobs for tr in trajectories for a in tr.agent_indices()])
    adv_turns = grpo.trajectory_turn_advantages(trajectories)
    adv = np.concatenate([np.full(len(s), a) for turns, advs in zip(cur, adv_turns) for (s, _), a in zip(turns, advs)])
    n = len(logp)
    coach = [tr.coach_for_turn() for tr in trajectories]
    csd_terms = [jax.nn.sigmoid(5.0 * (t - s)) * s for turns, cs in zip(cur, coach) for (s, t), c in zip(turns, cs)
                 if c is not None]
    l_csd = -sum(float(np.sum(x)) for x in csd_terms) / sum(len(x) for x in csd_terms)
    l_grpo = np_decoupled(logp, prox, behav, adv, np.full(n, 1.0 / n), cap)
    u, capped = np_weight(prox, behav, cap)
    assert 0 < capped.sum() < n and (u < 1).any()  # the batch exercises the truncation and weights below 1
    assert float(m["grpo_loss"]) == pytest.approx(l_grpo, rel=2e-5)
    assert float(m["loss"]) == pytest.approx(l_grpo + 0.3 * l_csd, rel=2e-5)
    assert float(m["csd_loss"]) == pytest.approx(l_csd, rel=2e-5)
    assert float(m["behav_logp_gap"]) == pytest.approx(np.mean(np.abs(prox - behav)), rel=1e-5)
    assert float(m["behav_capped_frac"]) == capped.sum() / n


# ------------------------------------------------------------------------------------------------- the loop
class _ScriptedStage(ScriptedDraws, L.RLLearner):
    """One step of 2 groups of 2 fixed random dialogues, whose rollout log-probs are the step-start policy's
    (csd.score, at the step's parameters before any update) + N(0, 0.6) noise; `prox` keeps the former."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.prox, self.seen_groups = [], []

    def rollouts(self, model, items, *, group_size, first_group, first_rid, **kw):
        rng = np.random.RandomState(self.drawn)
        groups = [random_batch(first_rid + i, 60, (2,) * group_size, coach_prob=0.0) for i in range(len(items))]
        run = self.run_state
        for i, g in enumerate(groups):
            for k, tr in enumerate(g):
                tr.group_id, tr.rollout_id = first_group + i, first_rid + i * group_size + k
            scored = csd.score(run.step_fn.config, run.state["params"], g, mesh=run.mesh, row_len=64)
            self.prox.append([np.concatenate([s for s, _ in turns]) for turns in scored])
            for tr, turns in zip(g, scored):
                for a, (s, _) in zip(tr.agent_indices(), turns):
                    tr.segments[a].logprobs = (s + rng.randn(len(s)) * 0.6).tolist()
        self.seen_groups = groups
        return groups


def test_loop_logs_the_gap_to_the_step_start_policy(tmp_path):
    """Two updates in one step (mini-batches of one group): both measure the gap against the proximal log-probs of
    the parameters at the step's start (the second update does not re-score with the first one's result), and the
    step logs the mean of the two updates' gaps and capped fractions."""
    cap = 1.5
    cfg = A.load(os.path.join(ROOT, "configs", "tiny_agentrl.py") + ":grpo",
                 ["train.progress_bar=false", "train.tensorboard=false", "train.steps=1", "rollout.prompts_per_step=2",
                  "rollout.group_size=2", "rollout.mini_batch_prompts=1", "rollout.row_len=64",
                  "checkpoint.async_save=false", "rl.old_logprobs=recompute", f"rl.behavior_is_cap={cap}"])
    stage = _ScriptedStage(cfg, str(tmp_path), handle_signals=False, log=lambda *a: None)
    rec = stage.run().metrics[1]
    assert rec["updates"] == 2
    behav = [[np.concatenate([tr.segments[a].logprobs for a in tr.agent_indices()]) for tr in g]
             for g in stage.seen_groups]
    gaps, capped = [], []
    for p, b in zip(stage.prox, behav):
        p, b = np.concatenate(p), np.concatenate(b)
        gaps.append(np.mean(np.abs(p - b)))
        capped.append(np.mean(np.exp(np.float64(p) - b) > cap))
    assert 0 < np.mean(capped) < 1
    assert rec["behav_logp_gap"] == pytest.approx(np.mean(gaps), rel=1e-5)
    assert rec["behav_capped_frac"] == pytest.approx(np.mean(capped), rel=1e-6)


def test_planner_compiles_the_update_with_the_switch_on():
    """`plan` and `rehearse` compile the update on the planner's batch: with the switch on it carries behav_logp (the
    update would refuse a batch without it), and the plan's peak still holds the compiled program."""
    from mimesis_jax.plan import budget, devices, workload
    from mimesis_jax.plan.compiled import QUICK, rl_batch_shapes, rl_step_memory, within

    cfg = workload.load_run_config("configs/tiny_agentrl.py:grpo",
                                   ["rl.old_logprobs=recompute", "rl.behavior_is_cap=2.0"])
    w = workload.workload_from_config(cfg, {"data": 1, "fsdp": 8, "tensor": 1}, workload.runtime_model(cfg))
    assert rl_batch_shapes(w, True)[rl_batch.BEHAV_KEY] == rl_batch_shapes(w)["old_logp"]
    planned = budget.plan(w, devices.DEVICES["cpu"]).train_peak
    compiled = rl_step_memory(w, cfg.rl, QUICK)
    assert within(planned, compiled), (planned, compiled)
