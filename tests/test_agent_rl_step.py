"""The jitted, sharded GRPO(+CSD) step (train/rl/step.py): the loss normaliser does not depend on micro-batches
or devices, the loss equals the per-token formula, old log-probs from the rollout or recomputed, metrics,
placement and donation, one compile per bucket, and an end-to-end episode -> coach -> update run."""

import jax
import numpy as np
import optax
import pytest

from rl_helpers import random_batch, scaled_params, tiny_config, tree_rel_err
from mimesis_jax import models, sharding
from mimesis_jax.algorithms import coach as coach_lib
from mimesis_jax.algorithms import csd, grpo
from mimesis_jax.train.rl.agent import coach_notes
from mimesis_jax.train.rl.step import RLConfig, make_rl_step, prepare_batch

CFG = tiny_config()
TURNS = (2, 6, 1, 3, 4, 2, 5, 1)
ROW_LEN = 192
SPLITS = {  # (mesh, micro-batches)
    "1dev_M1": (None, 1), "1dev_M4": (None, 4),
    "fsdp8_M1": ({"fsdp": 8}, 1), "fsdp4_tensor2_M2": ({"fsdp": 4, "tensor": 2}, 2),
}


@pytest.fixture(scope="module")
def trajectories():
    trs = random_batch(11, CFG.vocab_size, TURNS)
    trs[2].group_id = 7  # a single-member group
    return trs


def _run(trajectories, split, rl_kw):
    mesh_axes, M = SPLITS[split]
    mesh = None if mesh_axes is None else sharding.make_mesh(mesh_axes)
    rl = RLConfig(num_microbatches=M, **rl_kw)
    step = make_rl_step(CFG, optax.sgd(1.0), mesh, rl)
    params = scaled_params(CFG)
    params = params if mesh is None else models.shard_params(CFG, params, mesh)
    packed = prepare_batch(trajectories, rl, rows_multiple=step.rows_multiple(), row_len=ROW_LEN, pad_multiple=16)
    batch = step.place(packed)
    if rl.old_logprobs == "recompute":
        batch = step.recompute_old_logprobs(params, batch)
    loss, grads, sums = step.loss_and_grads(params, batch)
    return packed, float(loss), jax.tree.map(np.asarray, grads), {k: float(v) for k, v in sums.items()}


@pytest.fixture(scope="module")
def token_mean_runs(trajectories):
    rl_kw = dict(alpha=0.3, old_logprobs="recompute")
    return {s: _run(trajectories, s, rl_kw) for s in SPLITS}


def test_micro_batches_and_devices_do_not_change_loss_or_grads(token_mean_runs):
    _, loss0, g0, s0 = token_mean_runs["1dev_M1"]
    for split, (packed, loss, g, sums) in token_mean_runs.items():
        assert packed.num_rows % SPLITS[split][1] == 0
        assert loss == pytest.approx(loss0, rel=1e-5), split
        assert tree_rel_err(g, g0) <= 1e-5, split
        for k in ("agent", "coached", "clipped"):
            assert sums[k] == s0[k], (split, k)
    rows = {split: r[0].num_rows for split, r in token_mean_runs.items()}
    assert len(set(rows.values())) > 1, f"the splits should pack different row counts: {rows}"


def test_loss_is_the_global_token_mean_of_the_formula(trajectories, token_mean_runs):
    """With old log-probs recomputed (rho = 1): L = -(1/N) sum_tokens A + alpha (-(1/|C|) sum_C w log pi)."""
    packed, loss, _, sums = token_mean_runs["fsdp4_tensor2_M2"]
    scored = csd.score(CFG, scaled_params(CFG), trajectories, row_len=ROW_LEN)
    adv = grpo.trajectory_turn_advantages(trajectories)
    coach = [tr.coach_for_turn() for tr in trajectories]
    n_agent = sum(len(s) for turns in scored for s, _ in turns)
    a_sum = sum(a * len(s) for turns, advs in zip(scored, adv) for (s, _), a in zip(turns, advs))
    csd_terms = [(jax.nn.sigmoid(5.0 * (t - s)) * s) for turns, cs in zip(scored, coach)
                 for (s, t), c in zip(turns, cs) if c is not None]
    n_c = sum(len(x) for x in csd_terms)
    want = -a_sum / n_agent + 0.3 * (-sum(float(np.sum(x)) for x in csd_terms) / n_c)
    assert sums["agent"] == n_agent == packed.num_agent_tokens and sums["coached"] == n_c
    assert loss == pytest.approx(want, rel=2e-5)


def test_seq_mean_normaliser(trajectories):
    """seq-mean: L_GRPO = -(1/#sequences) sum_i mean over i's tokens of A (rho = 1), on two different splits."""
    rl_kw = dict(alpha=0.0, old_logprobs="recompute", loss_agg="seq-mean")
    _, loss1, g1, _ = _run(trajectories, "1dev_M4", rl_kw)
    _, loss8, g8, _ = _run(trajectories, "fsdp8_M1", rl_kw)
    adv = grpo.trajectory_turn_advantages(trajectories)
    per_seq = []
    for tr, a in zip(trajectories, adv):
        n = [len(tr.segments[i].tokens) for i in tr.agent_indices()]
        per_seq.append(float(np.dot(n, a)) / sum(n))
    assert loss1 == pytest.approx(-np.mean(per_seq), rel=1e-5)
    assert loss8 == pytest.approx(loss1, rel=1e-5) and tree_rel_err(g8, g1) <= 1e-5


def test_old_logprobs_from_the_rollout_or_recomputed(trajectories):
    params = scaled_params(CFG)
    rl = RLConfig(alpha=0.3, old_logprobs="recompute")
    step = make_rl_step(CFG, optax.sgd(1.0), None, rl)
    packed = prepare_batch(trajectories, rl, row_len=ROW_LEN, pad_multiple=16)
    assert not packed.arrays["old_logp"].any()
    batch = step.recompute_old_logprobs(params, step.place(packed))
    scored = csd.score(CFG, params, trajectories, row_len=ROW_LEN)
    old = np.asarray(batch["old_logp"]).reshape(packed.arrays["tokens"].shape)
    for turns, slots in zip(scored, packed.turns):
        for (s, _), slot in zip(turns, slots):
            np.testing.assert_allclose(old[slot.row, slot.start:slot.start + slot.length], s, rtol=1e-5, atol=1e-5)
    assert not old[packed.arrays["agent_mask"] == 0].any()
    with pytest.raises(ValueError, match="old_logprobs='rollout'"):
        make_rl_step(CFG, optax.sgd(1.0), None, RLConfig()).place(packed)
    rollout = prepare_batch(trajectories, RLConfig(), row_len=ROW_LEN, pad_multiple=16)
    for tr, slots in zip(trajectories, rollout.turns):
        for a, slot in zip(tr.agent_indices(), slots):
            np.testing.assert_allclose(rollout.arrays["old_logp"][slot.row, slot.start:slot.start + slot.length],
                                       tr.segments[a].logprobs, rtol=1e-6)


def test_step_metrics_placement_donation_and_one_compile_per_bucket(trajectories):
    mesh = sharding.make_mesh({"fsdp": 4, "tensor": 2})
    rl = RLConfig(alpha=0.3, old_logprobs="recompute", num_microbatches=2)
    lr = 1e3  # SGD, large, so that the update is well above the rounding of params - update
    step = make_rl_step(CFG, optax.sgd(lr), mesh, rl)
    params = models.shard_params(CFG, scaled_params(CFG), mesh)
    bucket = dict(rows_multiple=step.rows_multiple(), row_len=ROW_LEN, num_rows=8, branch_len=160)
    batch = step.recompute_old_logprobs(params, step.place(prepare_batch(trajectories, rl, **bucket)))
    loss, grads, _ = step.loss_and_grads(params, batch)
    host_params = jax.tree.map(np.asarray, scaled_params(CFG))  # (a zero-copy view of params would block donation)
    opt_state = step.init_opt_state(params)
    new, opt_state, m = step(params, opt_state, batch)
    jax.block_until_ready(m)
    assert all(x.is_deleted() for x in jax.tree.leaves(params)), "params must be donated"
    want_sh = models.param_shardings(CFG, mesh)
    for x, sh in zip(jax.tree.leaves(new), jax.tree.leaves(want_sh)):
        assert x.sharding.is_equivalent_to(sh, x.ndim)
    assert float(m["loss"]) == pytest.approx(float(loss), rel=1e-6)
    assert float(m["grad_norm"]) == pytest.approx(float(optax.tree.norm(grads)), rel=1e-5)
    assert abs(float(m["approx_kl"])) < 1e-6 and float(m["clip_frac"]) == 0.0  # on-policy: rho = 1
    assert 0.0 < float(m["mean_w"]) < 1.0 and 0.0 < float(m["frac_delta_pos"]) < 1.0
    scored = csd.score(CFG, host_params, trajectories, row_len=ROW_LEN)
    ent = -np.mean(np.concatenate([s for turns in scored for s, _ in turns]))
    assert float(m["entropy"]) == pytest.approx(ent, rel=1e-5)
    moved = jax.tree.map(lambda a, b: a - np.asarray(b), host_params, new)
    assert tree_rel_err(moved, jax.tree.map(lambda g: lr * np.asarray(g), grads)) <= 1e-5
    # a second batch of the same bucket (different dialogues) reuses the compiled step
    other = random_batch(12, CFG.vocab_size, TURNS)
    batch2 = step.recompute_old_logprobs(new, step.place(prepare_batch(other, rl, **bucket)))
    new2, _, m2 = step(new, opt_state, batch2)
    jax.block_until_ready(m2)
    assert np.isfinite(float(m2["loss"])) and step.num_compilations == 1


def test_learner_state_update_compiles_only_on_its_first_step():
    """The update as the learner runs it (train state from init_train_state under the state shardings, the
    run's optimizer: clipping + AdamW with a warmup/cosine schedule and a decay mask, on a mesh): step 1 compiles
    one update program; steps 2 and 3 (other dialogues, the same bucket, the state step 1 returned) compile
    nothing at all, counted from jax's compile events, not by timing."""
    from mimesis_jax.config.sections import OptimizerConfig
    from mimesis_jax.profiling import count_compilations
    from mimesis_jax.train.optim import make_optimizer
    from mimesis_jax.train.state import state_shardings
    from mimesis_jax.train.step import init_train_state

    mesh = sharding.make_mesh({"fsdp": 4, "tensor": 2})
    tx = make_optimizer(OptimizerConfig(lr=1e-3, warmup_steps=2, weight_decay=0.1, clip_norm=1.0), 10, CFG)
    rl = RLConfig(num_microbatches=1)
    step = make_rl_step(CFG, tx, mesh, rl)
    _, shardings = state_shardings(CFG, tx, mesh)
    params = models.shard_params(CFG, scaled_params(CFG), mesh)
    state = jax.jit(lambda p, r: init_train_state(p, tx, r), out_shardings=shardings,
                    donate_argnums=(0,))(params, jax.random.key(0))
    params, opt_state = state["params"], state["opt_state"]
    counts = []
    for seed in (40, 41, 42):
        trs = random_batch(seed, CFG.vocab_size, (2, 3, 1, 2), coach_prob=0.0)
        packed = prepare_batch(trs, rl, rows_multiple=step.rows_multiple(), row_len=96, num_rows=8, pad_multiple=16)
        with count_compilations() as c:
            params, opt_state, m = step(params, opt_state, step.place(packed))
            jax.block_until_ready(m)
        counts.append(c)
        assert np.isfinite(float(m["loss"]))
    assert counts[0].count_of("_rl_update") == 1
    assert [c.count for c in counts[1:]] == [0, 0], [c.names for c in counts[1:]]
    assert step.num_compilations == 1


def test_rl_config_errors_name_the_key():
    with pytest.raises(ValueError, match="'alpha'"):
        RLConfig(alpha=-1.0)
    with pytest.raises(ValueError, match="'teacher'"):
        RLConfig(teacher="none")
    with pytest.raises(ValueError, match="'old_logprobs'"):
        RLConfig(old_logprobs="sampler")


def test_episode_runner_to_coached_update():
    """Episodes from the runner (scripted agent / env / user), notes from a scripted coach rendered with the chat
    template, then one GRPO + CSD update with recomputed old log-probs: the contract between the pieces."""
    from mimesis_jax.data.tokenizer import load_tokenizer
    from env_helpers import SecretWordEnv
    from mimesis_jax.envs import tool_call_text
    from mimesis_jax.chat.base import ScriptedChatModel
    from mimesis_jax.episodes.agent import EpisodeConfig, EpisodeTask, ScriptedAgent, run_episodes

    tok = load_tokenizer("tiny")
    cfg = tiny_config(vocab_size=1024)
    replies = [tool_call_text("action", "What is it?"), tool_call_text("action", "Is it red?"),
               tool_call_text("answer", "banana")]
    by_turn = lambda prompt, _: replies[prompt.count("Reward:")]  # noqa: E731  (one tool result per past turn)
    tasks = [EpisodeTask(env=SecretWordEnv("banana", hint="fruit"), group_id=0, task={"goal": "find the word"},
                         agent_messages=[{"role": "system", "content": "Find the secret word."},
                                         {"role": "user", "content": "Guess my word."}],
                         user_messages=[{"role": "system", "content": "Your word is banana."}]) for _ in range(2)]
    user = ScriptedChatModel(["<think>\nIt keeps asking.\n</think>\n\nIt is a fruit."])
    trajs = run_episodes(ScriptedAgent(tok, by_turn), user, tasks, EpisodeConfig(max_turns=3))
    coach = ScriptedChatModel(["Ask for a hint about the category first."])
    render = coach_lib.chat_note_renderer(tok)
    for tr in trajs:
        notes = coach_notes(coach, tr, decode=tok.decode)
        assert notes[:2] == ["Ask for a hint about the category first."] * 2 and notes[2] is None
        assert coach_lib.add_coach_notes(tr, notes, render) == 2
        tr.validate()
    note_ids = render(coach_lib.coach_note_message(notes[0]))
    assert tok.decode(note_ids).count(coach_lib.COACH_NOTE_PREFIX) == 1
    params = scaled_params(cfg)
    rl = RLConfig(alpha=0.5, old_logprobs="recompute")
    step = make_rl_step(cfg, optax.adamw(1e-2), None, rl)
    batch = step.recompute_old_logprobs(params, step.place(prepare_batch(trajs, rl, pad_multiple=16)))
    before = jax.tree.map(np.asarray, params)
    new, _, m = step(params, step.init_opt_state(params), batch)
    assert float(m["coached_tokens"]) > 0 and 0 < float(m["mean_w"]) < 1
    assert float(m["grpo_loss"]) == 0.0  # identical dialogues: every GRPO advantage is 0 ...
    assert tree_rel_err(jax.tree.map(np.asarray, new), before) > 1e-4  # ... yet CSD moves the agent
