"""The discrete-event model of synchronous vs asynchronous RL (mimesis_jax/plan/async_model.py, issue #44 item 7):
step times, busy fractions and staleness on schedules small enough to work out by hand (each test derives its
numbers in comments), the staleness bound on random schedules, the synchronous schedule as the serial sum of its
phases (computed here with NumPy from the drawn dialogues), and the projection script end to end on the tiny
config. Pure Python: no JAX program runs."""

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


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_staleness_never_exceeds_the_bound_and_nothing_is_dropped(staleness):
    w, p, plans = _random_case(seed=staleness)
    r = simulate(w, p, Schedule("async", rollout_devices=3, max_staleness=staleness), plans, warmup_steps=0)
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


@pytest.mark.parametrize("schedule, needle", [
    (Schedule("async", rollout_devices=4, max_staleness=1), "--rollout-devices 4"),
    (Schedule("async", rollout_devices=0, max_staleness=1), "--rollout-devices 0"),
    (Schedule("sync", max_staleness=2), "--max-staleness 2"),
    (Schedule("rounds", max_staleness=1), "--max-staleness 1"),
    (Schedule("overlap"), "--schedule 'overlap'"),
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


def test_projection_script_names_a_bad_split():
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = _script().main(["--config", "configs/tiny_agentrl.py:csd", "--rollout-devices", "16"])
    assert rc == 2 and "--rollout-devices 16" in err.getvalue()
