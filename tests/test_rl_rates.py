"""The RL stages' token rates are the real counts over the measured seconds: tokens the policy sampled per second
of rollout time (rollout_tokens_per_s) and tokens trained per second of update time (train_tokens_per_s); the
progress bar shows each under its own name (rollout_tok_s, train_tok_s)."""

import os

import pytest

from mimesis_jax.algorithms import grpo
from mimesis_jax.data.tokenizer import load_tokenizer
from env_helpers import SecretWordEnv
from mimesis_jax.envs import tool_call_text
from mimesis_jax.envs.userrl import scoring
from mimesis_jax.episodes.agent import EpisodeConfig, EpisodeTask, ScriptedAgent, run_episodes
from mimesis_jax.episodes.simulator import SimRollout
from mimesis_jax.data.trajectory import Segment, Trajectory
from mimesis_jax.train.rl import agent as agent_rl_loop, learner as rl_run, simulator as simulator_rl
from mimesis_jax.train.metrics import MetricsLogger

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_train_tokens_per_s_is_the_trained_tokens_over_the_update_seconds():
    ms = [{"loss": 1.0, "clip_frac": 0.1, "agent_tokens": 100}, {"loss": 3.0, "clip_frac": 0.3, "agent_tokens": 60}]
    rec = rl_run.update_record(ms, 0.5)
    assert rec["train_tokens_per_s"] == 320.0 and rec["loss"] == 2.0 and rec["clip_frac_last"] == 0.3
    assert "train_tokens_per_s" not in rl_run.update_record([], 0.5)  # no update, no rate (never a fake 0)


def _sim_rollout(rid, sampled_per_turn):
    segs = [Trajectory(segments=[Segment("public", [1, 2, 3]), Segment("agent", list(range(n)), [0.0] * n)],
                       rollout_id=rid) for n in sampled_per_turn]
    return SimRollout(segments=segs, domain="echo", group_id=0, rollout_id=rid, reward=0.5)


def test_simrl_rollout_tokens_per_s_counts_every_sampled_token():
    outs = [_sim_rollout(1, [5, 7]), _sim_rollout(2, [4])]
    gathered = simulator_rl.gathered_outcomes(outs)  # what each step's record reads (one process)
    rec = simulator_rl.step_record(gathered, 0, {}, rollout_s=4.0, train_s=1.0)
    assert rec["rollout_tokens_per_s"] == 4.0  # (5 + 7 + 4) / 4.0 s
    assert simulator_rl.step_record(gathered, 0, {}, rollout_s=2.0)["rollout_tokens_per_s"] == 8.0


def test_agentrl_rollout_tokens_per_s_counts_the_agent_tokens():
    tok = load_tokenizer("tiny")
    reply = tool_call_text("search", "hint")
    n = len(tok.encode(reply)) + 1
    tasks = [EpisodeTask(SecretWordEnv("banana", hint="fruit", max_steps=k),
                         [{"role": "system", "content": "Find the word."}, {"role": "user", "content": "Hi."}],
                         task={"gym": "TurtleGym", "id": f"t{k}"}, rollout_id=k) for k in (1, 2)]
    trajs = run_episodes(ScriptedAgent(tok, [reply]), None, tasks, EpisodeConfig(max_turns=3))
    cfg = agent_rl_loop.load(os.path.join(ROOT, "configs", "tiny_agentrl.py") + ":grpo", [])
    rec = agent_rl_loop._step_record(trajs, [], 0, 0, 0, 0, scoring, grpo, cfg, rollout_s=0.25, coach_s=0.0,
                                     train_s=1.0)
    assert rec["rollout_tokens_per_s"] == pytest.approx(3 * n / 0.25, rel=1e-12)  # 1 + 2 agent turns


def test_progress_bar_names_each_rate(tmp_path):
    log = MetricsLogger(str(tmp_path), total_steps=2, start_step=0, tensorboard=False, progress_bar=True,
                        stage="agentrl")
    log.log(1, {"loss": 0.5, "rollout_tokens_per_s": 1234.4, "train_tokens_per_s": 567.6})
    bar = str(log.bar)
    assert "rollout_tok_s=1234" in bar and "train_tok_s=568" in bar and " tok_s=" not in bar
    log.close()
