"""The discrete-event model of synchronous vs asynchronous RL (mimesis_jax/plan/async_model.py, issue #44 item 7):
step times, busy fractions and staleness on schedules small enough to work out by hand (each test derives its
numbers in comments), the staleness bound on random schedules, the synchronous schedule as the serial sum of its
phases (computed here with NumPy from the drawn dialogues), the shared-devices schedule as sync plus its publishes
where nothing outside the devices takes time, and the projection script end to end on the tiny config. Pure
Python: no JAX program runs."""

from __future__ import annotations

import contextlib
import io
import math

import numpy as np
import pytest

from helpers import load_benchmark

from mimesis_jax.errors import ConfigError
from mimesis_jax.plan.async_model import (DialoguePlan, Programs, Schedule, TurnPlan, Workload, draw_plans,
                                          simulate)


# one group of two dialogues per step, one mini-batch per step; A: replies of 10 then 20 tokens, B: 30 then 10,
# no prompt, no user tokens, user replies at once, a coach note of 0.5 s after the first turn of each
ONE_GROUP = Workload(prompts_per_step=1, group_size=2, mini_batch_prompts=1, csd=True)
A = DialoguePlan(0, (TurnPlan(10, 0, 0.0, 0.5), TurnPlan(20)))
B = DialoguePlan(0, (TurnPlan(30, 0, 0.0, 0.5), TurnPlan(10)))
# 2 devices, a replica per device; 0.1 s per decode step whatever the batch; prefill free; 0.02 device-s per row
# token (a group's rows: 10 + 20 + 30 + 10 = 70 tokens); a weight sync of 0.3 s
TWO_DEVICES = Programs(devices=2, replica_devices=1, replica_slots=4, decode_step_s=0.1, decode_ctx_s=0.0,
                       prefill_tok_s=math.inf, train_token_s=0.02, csd_factor=1.0, sync_s=0.3)


def test_sync_by_hand():
    r = simulate(ONE_GROUP, TWO_DEVICES, Schedule("sync"), [[A, B]] * 3, warmup_steps=0)
    # A on replica 0: turn 0 0-1.0 s, turn 1 1.0-3.0; B on replica 1: 0-3.0, 3.0-4.0. Coach phase: both notes
    # 4.0-4.5. Update: 70 tokens x 0.02 / 2 devices = 0.7 s -> 5.2. Three identical steps.
    assert r.step_end_s == pytest.approx([5.2, 10.4, 15.6])
    assert r.rollout_busy == pytest.approx((3.0 + 4.0) / 2 * 3 / 15.6)
    assert r.trainer_busy == pytest.approx(3 * 0.7 / 15.6)
    assert r.sync_fraction == 0.0
    assert r.staleness_tokens == {0: 210} and r.staleness_max == 0
    assert r.groups_per_hour == pytest.approx(3 * 3600 / 15.6)
    assert r.tokens_per_hour == pytest.approx(210 * 3600 / 15.6)
    assert r.rollout_tok_dev_s == pytest.approx(210 / (15.6 * 2))


def test_rounds_by_hand():
    r = simulate(ONE_GROUP, TWO_DEVICES, Schedule("rounds"), [[A, B]] * 3, warmup_steps=0)
    # round 0: A 0-1.0 s, B 0-3.0 (A waits for B); round 1 from 3.0: A 3.0-5.0, B 3.0-4.0. Coach 5.0-5.5, update
    # 0.7 s -> 6.2. Replica 0 (A) decodes 1.0 + 2.0 s a step, replica 1 (B) 3.0 + 1.0.
    assert r.step_end_s == pytest.approx([6.2, 12.4, 18.6])
    assert r.rollout_busy == pytest.approx((3.0 + 4.0) / 2 * 3 / 18.6)
    assert r.staleness_tokens == {0: 210}


def test_async_by_hand_with_an_in_flight_update():
    r = simulate(ONE_GROUP, TWO_DEVICES, Schedule("async", rollout_devices=1, max_staleness=1), [[A, B]] * 3,
                 warmup_steps=0)
    # One replica rolls out, one device trains (a group's update: 70 x 0.02 = 1.4 s). Version 0 admits groups 0
    # and 1 (group i needs version >= i - 1): both run 0-4.0 s side by side (decode steps do not slow with the
    # batch here). Step 0: update 4.0-5.4, sync 5.4-5.7 -> version 1, which admits group 2. Step 1 (group 1):
    # update 5.7-7.1, sync 7.1-7.4 pauses group 2's decoding: A2 turn 0 5.7-6.7, turn 1 (version 1) 6.7-9.0;
    # B2 turn 0 5.7-9.0 (30 tokens + the pause), turn 1 starts at 9.0 with version 2 -> 10.0. Step 2: update
    # 10.0-11.4, sync -> 11.7.
    assert r.step_end_s == pytest.approx([5.7, 7.4, 11.7])
    assert r.rollout_busy == pytest.approx((4.0 + (7.1 - 5.7) + (10.0 - 7.4)) / 11.7)
    assert r.trainer_busy == pytest.approx(3 * 1.4 / 11.7)
    assert r.sync_fraction == pytest.approx(3 * 0.3 / 11.7)
    # group 0: 70 tokens of version 0 trained by step 0; group 1: 70 of version 0 by step 1; group 2 by step 2:
    # 60 tokens of version 1 and B2's last 10 of version 2
    assert r.staleness_tokens == {0: 80, 1: 130}
    assert r.staleness_mean == pytest.approx(130 / 210) and r.staleness_max == 1
    assert r.rollout_tok_dev_s == pytest.approx(210 / 11.7)  # one rollout device


def test_shared_by_hand_two_groups_at_once():
    r = simulate(ONE_GROUP, TWO_DEVICES, Schedule("shared", max_staleness=1), [[A, B]] * 3, warmup_steps=0)
    # Both replicas roll out and both devices train (a group's update: 70 x 0.02 / 2 = 0.7 s). Version 0 admits
    # groups 0 and 1: A0, A1 on replica 0, B0, B1 on replica 1, side by side. A: turn 0 0-1.0 s, note 1.0-1.5,
    # turn 1 1.0-3.0; B: turn 0 0-3.0, note 3.0-3.5, turn 1 3.0-4.0. Both groups complete at 4.0. Step 0: update
    # 4.0-4.7, publish 4.7-5.0 -> version 1 admits group 2 (A2 replica 0, B2 replica 1) and step 1's update (group
    # 1) starts at once: 5.0-5.7, publish -> 6.0; the devices do not decode meanwhile. Group 2's first turns
    # (version 1, their start) decode from 6.0: A2 6.0-7.0, turn 1 (version 2) 7.0-9.0; B2 6.0-9.0, turn 1
    # (version 2) 9.0-10.0. Step 2: update 10.0-10.7, publish -> 11.0.
    assert r.step_end_s == pytest.approx([5.0, 6.0, 11.0])
    assert r.rollout_busy == pytest.approx((3.0 + 3.0 + 4.0 + 4.0) / (2 * 11.0))
    assert r.trainer_busy == pytest.approx(3 * 0.7 / 11.0)
    assert r.sync_fraction == pytest.approx(3 * 0.3 / 11.0)
    # group 0 (70 tokens, version 0) by step 0; group 1 (version 0) by step 1; group 2 by step 2: first turns
    # (10 + 30) of version 1, last turns (20 + 10) of version 2
    assert r.staleness_tokens == {0: 100, 1: 110} and r.staleness_max == 1
    assert r.rollout_tok_dev_s == pytest.approx(210 / (11.0 * 2))


def test_shared_update_stops_decoding_and_a_turn_after_new_weights_prefills_again():
    w = Workload(prompts_per_step=1, group_size=1, mini_batch_prompts=1, csd=False)
    p = Programs(devices=1, replica_devices=1, replica_slots=2, decode_step_s=0.1, decode_ctx_s=0.0,
                 prefill_tok_s=100.0, train_token_s=0.01, sync_s=0.2)
    one = DialoguePlan(0, (TurnPlan(10),))
    two = DialoguePlan(0, (TurnPlan(10, 5, 0.5), TurnPlan(10)))  # a 5-token user turn 0.5 s after turn 0
    r = simulate(w, p, Schedule("shared", max_staleness=1), [[one], [two], [one]], warmup_steps=0)
    # Groups 0 and 1 decode together from 0 (no prompt, 0.1 s a token): both first turns end at 1.0, group 0's
    # update (10 rows x 0.01 = 0.1 s) 1.0-1.1 and its publish 1.1-1.3 -> version 1 admits group 2 (10 tokens,
    # 1.3-2.3). Dialogue two's user turn comes at 1.5; its turn 1 starts with version 1 (turn 0 had 0), so it
    # prefills its whole context (10 + 5 tokens at 100 tokens/s: 1.5-1.65), then decodes 1.65-2.65. Step 1
    # (25 rows: 0.25 s) 2.65-2.9, publish -> 3.1; step 2: group 2 complete since 2.3, 3.1-3.2, publish -> 3.4.
    assert r.step_end_s == pytest.approx([1.3, 3.1, 3.4])
    assert r.rollout_busy == pytest.approx((1.0 + (2.65 - 1.3)) / 3.4)
    assert r.staleness_tokens == {0: 20, 1: 20}


def test_shared_update_pauses_a_dialogue_mid_decode():
    w = Workload(prompts_per_step=1, group_size=1, mini_batch_prompts=1, csd=False)
    p = Programs(devices=1, replica_devices=1, replica_slots=2, decode_step_s=0.1, decode_ctx_s=0.0,
                 prefill_tok_s=math.inf, train_token_s=0.01, sync_s=0.2)
    short, long = DialoguePlan(0, (TurnPlan(10),)), DialoguePlan(0, (TurnPlan(30),))
    r = simulate(w, p, Schedule("shared", max_staleness=1), [[short], [long], [short]], warmup_steps=0)
    # short (group 0) and long (group 1) decode together; short ends at 1.0 with 20 of long's tokens left. Step 0:
    # update 1.0-1.1, publish 1.1-1.3 (long stopped meanwhile) -> version 1 admits group 2. From 1.3 long and
    # group 2 decode: group 2 ends at 2.3, long at 3.3. Step 1: 30 x 0.01 = 0.3 s -> 3.6, publish -> 3.8;
    # step 2: 3.8-3.9, publish -> 4.1.
    assert r.step_end_s == pytest.approx([1.3, 3.8, 4.1])
    assert r.rollout_busy == pytest.approx((1.0 + 2.0) / 4.1)
    assert r.staleness_tokens == {0: 10, 1: 40}


def test_shared_update_pauses_a_prefill_and_the_queue_behind_it():
    w = Workload(prompts_per_step=1, group_size=1, mini_batch_prompts=1, csd=False)
    p = Programs(devices=1, replica_devices=1, replica_slots=2, decode_step_s=0.1, decode_ctx_s=0.0,
                 prefill_tok_s=100.0, train_token_s=0.01, sync_s=0.2)
    short, long = DialoguePlan(0, (TurnPlan(10),)), DialoguePlan(150, (TurnPlan(20),))
    r = simulate(w, p, Schedule("shared", max_staleness=1), [[short], [long], [short]], warmup_steps=0)
    # short decodes 0-1.0 s while long's 150-token prompt prefills (1.5 s of it). Step 0: update 1.0-1.1, publish
    # 1.1-1.3, the prefill stopped with 50 tokens left -> 1.3-1.8; group 2, admitted at 1.3, queues behind it
    # (its empty prompt done at 1.8) and decodes 1.8-2.8; long decodes 1.8-3.8. Step 1: 170 rows x 0.01 = 1.7 s
    # -> 5.5, publish -> 5.7; step 2: 5.7-5.8, publish -> 6.0.
    assert r.step_end_s == pytest.approx([1.3, 5.7, 6.0])
    assert r.rollout_busy == pytest.approx((1.0 + 2.5) / 6.0)
    assert r.staleness_tokens == {0: 10, 1: 30}


def test_decode_steps_grow_with_the_batch_context_and_prefills_queue():
    w = Workload(prompts_per_step=1, group_size=2, mini_batch_prompts=1, csd=False)
    p = Programs(devices=1, replica_devices=1, replica_slots=2, decode_step_s=0.01, decode_ctx_s=1e-4,
                 prefill_tok_s=1000.0, train_token_s=0.001)
    plans = [[DialoguePlan(100, (TurnPlan(20),)), DialoguePlan(300, (TurnPlan(20),))]]
    r = simulate(w, p, Schedule("sync"), plans, warmup_steps=0)
    # prefills one after another: A 0-0.1 s, B 0.1-0.4. A decodes alone at 0.01 + 1e-4 x 100 = 0.02 s a step:
    # 15 tokens by 0.4; with B the step is 0.01 + 1e-4 x 400 = 0.05 s: A's last 5 by 0.65 (B has 5). B alone at
    # 0.04 s a step: 15 more by 1.25. Update: (120 + 320) x 0.001 = 0.44 s.
    assert r.step_end_s == pytest.approx([1.25 + 0.44])
    assert r.rollout_busy == pytest.approx(1.25 / 1.69)


def _random_case(seed, **kw):
    shape = dict(prompts_per_step=4, group_size=2, mini_batch_prompts=2, max_turns=4, agent_max_tokens=64,
                 max_context_tokens=400, max_prompt_tokens=60, min_prompt_tokens=20, reply_median=20.0,
                 user_tokens_median=10.0, end_prob=0.3, user_median_s=0.5, coach_median_s=0.3)
    w = Workload(**{**shape, **kw})
    p = Programs(devices=4, replica_devices=1, replica_slots=3, decode_step_s=0.01, decode_ctx_s=1e-5,
                 prefill_tok_s=5000.0, train_token_s=0.002, sync_s=0.05, user_concurrency=3)
    return w, p, draw_plans(w, 6, seed)


@pytest.mark.parametrize("kind, staleness", [("async", 0), ("async", 1), ("async", 2), ("shared", 0),
                                              ("shared", 1), ("shared", 2)])
def test_staleness_never_exceeds_the_bound_and_nothing_is_dropped(kind, staleness):
    w, p, plans = _random_case(seed=staleness)
    devices = 3 if kind == "async" else 0
    r = simulate(w, p, Schedule(kind, rollout_devices=devices, max_staleness=staleness), plans, warmup_steps=0)
    assert r.staleness_max <= staleness
    # every group of every step was trained once: the trained tokens are all the drawn ones
    assert sum(r.staleness_tokens.values()) == sum(d.agent_tokens for g in plans for d in g)
    assert len(r.step_end_s) == 6 and np.all(np.diff(r.step_end_s) > 0)
    if staleness:  # the rollout side runs ahead as far as the bound lets it: the bound is reached
        assert r.staleness_max == staleness


def test_rounds_wait_for_the_slowest_turn_of_each_round():
    w, p, plans = _random_case(seed=3, user_median_s=0.0)
    p = Programs(devices=4, replica_devices=1, replica_slots=4, decode_step_s=0.01, decode_ctx_s=0.0,
                 prefill_tok_s=math.inf, train_token_s=0.002)
    r = simulate(w, p, Schedule("rounds"), plans, warmup_steps=0)
    # a round lasts as long as its longest reply among the dialogues that reach it (x 0.01 s); then the coach phase
    # and the updates as in the serial sum below
    expect, t = [], 0.0
    for k in range(6):
        groups = plans[4 * k:4 * k + 4]
        dialogues = [d for g in groups for d in g]
        rounds = max(len(d.turns) for d in dialogues)
        rollout = sum(max(d.turns[j].reply_tokens for d in dialogues if len(d.turns) > j) * 0.01
                      for j in range(rounds))
        notes = [tp.coach_s for d in dialogues for tp in d.turns[:-1]]
        update = sum(sum(d.row_tokens for d in g) * 0.002 * 1.19 / 4 for g in groups)
        t += rollout + (max(notes) if notes else 0.0) + update
        expect.append(t)
    np.testing.assert_allclose(r.step_end_s, expect, rtol=1e-9)
    sync = simulate(w, p, Schedule("sync"), plans, warmup_steps=0)
    assert sync.step_end_s[-1] < r.step_end_s[-1]


def test_sync_without_user_latency_is_the_serial_sum_of_its_phases():
    w, p, plans = _random_case(seed=7, user_median_s=0.0)
    p = Programs(devices=4, replica_devices=1, replica_slots=4, decode_step_s=0.01, decode_ctx_s=0.0,
                 prefill_tok_s=math.inf, train_token_s=0.002)
    r = simulate(w, p, Schedule("sync"), plans, warmup_steps=0)
    # per step: the longest dialogue's decode (its reply tokens x 0.01 s: nothing else waits), then the coach phase
    # (the slowest note: all asked at once), then the step's mini-batches of 2 groups one after another
    expect, t = [], 0.0
    for k in range(6):
        groups = plans[4 * k:4 * k + 4]
        dialogues = [d for g in groups for d in g]
        rollout = max(sum(tp.reply_tokens for tp in d.turns) * 0.01 for d in dialogues)
        notes = [tp.coach_s for d in dialogues for tp in d.turns[:-1]]
        coach = max(notes) if notes else 0.0
        update = sum(sum(d.row_tokens for d in g) * 0.002 * 1.19 / 4 for g in groups)
        t += rollout + coach + update
        expect.append(t)
    np.testing.assert_allclose(r.step_end_s, expect, rtol=1e-9)


def test_shared_at_staleness_0_without_user_latency_is_sync_plus_its_publishes():
    w, p, plans = _random_case(seed=5, user_median_s=0.0, coach_median_s=0.0)
    sync = simulate(w, p, Schedule("sync"), plans, warmup_steps=0)
    shared = simulate(w, p, Schedule("shared", max_staleness=0), plans, warmup_steps=0)
    # nothing outside the devices takes time, so every update stops all the step's rollouts for exactly its own
    # length (a step has 2 mini-batches here: its first update stops rollouts still going): the step's rollouts
    # and updates take what sync's take, plus one publish (sync_s) per step
    expect = np.asarray(sync.step_end_s) + p.sync_s * np.arange(1, 7)
    np.testing.assert_allclose(shared.step_end_s, expect, rtol=1e-9)
    assert shared.staleness_max == 0


@pytest.mark.parametrize("schedule, needle", [
    (Schedule("async", rollout_devices=4, max_staleness=1), "--rollout-devices 4"),
    (Schedule("async", rollout_devices=0, max_staleness=1), "--rollout-devices 0"),
    (Schedule("sync", max_staleness=2), "--max-staleness 2"),
    (Schedule("rounds", max_staleness=1), "--max-staleness 1"),
    (Schedule("overlap"), "--schedule 'overlap'"),
    (Schedule("shared", rollout_devices=2, max_staleness=1), "--rollout-devices 2"),
])
def test_a_schedule_the_model_cannot_run_is_a_one_line_error(schedule, needle):
    w, p, plans = _random_case(seed=0)
    with pytest.raises(ConfigError, match=needle) as e:
        simulate(w, p, schedule, plans)
    assert "\n" not in str(e.value)


def _script():
    return load_benchmark('async_projection')


def test_projection_script_prints_assumptions_and_ratios():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = _script().main(["--config", "configs/tiny_agentrl.py:csd", "--steps", "2", "--rollout-devices", "1",
                             "--devices", "2", "--replica-devices", "1"])
    text = out.getvalue()
    assert rc == 0, text
    assert "assumptions:" in text and "user_median_s = 8.0" in text
    assert "| sync |" in text and "| async, rollout.devices=1, max_staleness=2 |" in text
    assert "| sync in rounds (the learner's loop) |" in text
    assert "best split: rollout.devices=1 of 2" in text
    assert "| async on shared devices, rollout.devices=0, max_staleness=2 |" in text
    assert "shared devices: all 2:" in text and "reprefill = 1" in text


def test_projection_script_names_a_bad_split():
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = _script().main(["--config", "configs/tiny_agentrl.py:csd", "--rollout-devices", "16"])
    assert rc == 2 and "--rollout-devices 16" in err.getvalue()
