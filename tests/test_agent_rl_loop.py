"""Stage II end to end (train/rl/agent.py) on the tiny configs and the toy gym: metrics, invalid episodes
excluded and counted, single-survivor groups skipped, resume == uninterrupted, the agentrl command's SIGTERM,
checkpoint and validation, context budgets. The step-level references (Eq 6 off-policy mini-batches, Eq 10 CSD
gradient, alpha = 0) are in tests/test_agent_rl_references.py. Both modules compile at XLA's fast level
(tests/conftest.py): the tiny loops here cost their compiles, not their runs (measured with and without the
`optimized` mark); the agentrl command's subprocess gets the same setting and one CPU device, as a user runs
it (tests/helpers.py subprocess_env; the sharded checkpoint's resume is
test_resume_reproduces_the_uninterrupted_run's)."""

import dataclasses
import os

import numpy as np
import pytest

from helpers import subprocess_env
from mimesis_jax.envs.toy import ToyCoach, ToyUser
from mimesis_jax.inference import sampler
from mimesis_jax.chat.base import ChatResponse, SimulatorAsResponder
from mimesis_jax.train.rl import agent as L
from mimesis_jax.train.rl.learner import BUSY_KEYS, COMPILATION_KEYS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING = ("rollout_s", "coach_s", "train_s", "rollout_tokens_per_s",
          "train_tokens_per_s", "step_s") + COMPILATION_KEYS + BUSY_KEYS  # process-local: a resumed process compiles again


def _cfg(name="tiny_agentrl.py:csd", *sets):
    base = ["train.progress_bar=false", "train.tensorboard=false", "rollout.prompts_per_step=4",
            "rollout.group_size=3", "rollout.mini_batch_prompts=2", "rollout.agent_max_tokens=12",
            "rollout.row_len=256", "checkpoint.async_save=false"]
    return L.load(os.path.join(ROOT, "configs", name), base + list(sets))


class SometimesRefusingUser(ToyUser):
    """The toy user, refusing its role for replies whose text hashes to 0 mod 4 (deterministic)."""

    def chat(self, messages, **kw):
        last = next((m["content"] for m in reversed(messages) if m["role"] == "assistant"), "")
        if sum(map(ord, last)) % 4 == 0:
            return ChatResponse(text="As an AI language model, I cannot pretend to be a user.")
        return super().chat(messages, **kw)


def _side(user=None):
    user = user or ToyUser()
    return L.UserSide(user, SimulatorAsResponder(user), user, ToyCoach())


def _strip(rec):
    return {k: v for k, v in rec.items() if k not in TIMING}


SAMPLER = {}  # the sampler shapes `straight`'s run called that no earlier test of this process had


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    wd = tmp_path_factory.mktemp("straight")
    seen = {}
    before = sampler.call_shapes()
    res = L.run(_cfg("tiny_agentrl.py:csd", "train.steps=3"), str(wd), user_side=_side(SometimesRefusingUser()),
                on_rollouts=lambda step, trajs: seen.__setitem__(step, trajs), handle_signals=False,
                log=lambda *a: None)
    SAMPLER["new"] = sampler.call_shapes() - before
    return res, seen


def test_policy_samples_on_its_prompt_ladder_and_counts_its_programs(straight):
    """The policy's sampler (AgentLearner.policy_buckets: chat_models.ladder_buckets): a 256-token budget less 12
    new tokens gives prompt rungs 64 / 128 / 192 / 256, every call padded to the 12 dialogues in flight (16) and
    16 new tokens; the run's calls use those programs only, and each record's num_compilations is the sum of its
    parts, never decreasing, the sampler's at most its 4 programs (the toy user and coach sample nothing), all of
    them compiled in the first step (this run's prompts reach rungs 64 and 192 there)."""
    from mimesis_jax.train.rl.chat_models import ladder_buckets

    res, _ = straight
    r = _cfg("tiny_agentrl.py:csd").rollout
    b = ladder_buckets(r, r.agent_max_tokens, 12)
    assert b.prompt_rungs == (64, 128, 192, 256) and b.batch(12) == 16 and b.new_tokens(12) == 16
    assert {s[:3] for s in SAMPLER["new"]} <= {(16, p, 16) for p in b.prompt_rungs}
    recs = [res.metrics[s] for s in (1, 2, 3)]
    for rec in recs:
        assert rec["num_compilations"] == sum(rec[k] for k in COMPILATION_KEYS[1:])
        assert rec["compilations/sampler"] <= 4 and rec["compilations/engine"] == 0
    assert [rec["num_compilations"] for rec in recs] == sorted(rec["num_compilations"] for rec in recs)
    assert recs[-1]["compilations/sampler"] >= len(SAMPLER["new"])  # each new shape compiled once
    assert all(rec["compilations/sampler"] == recs[0]["compilations/sampler"] for rec in recs)  # none after step 1


def test_loop_metrics_invalid_and_skipped_groups(straight):
    res, seen = straight
    assert sorted(res.metrics) == [1, 2, 3] and res.final_step == 3 and res.checkpoint_step == 3
    total_invalid = 0
    for step, rec in res.metrics.items():
        trajs = seen[step]
        assert all(np.isfinite(v) for v in rec.values() if isinstance(v, float)), rec
        invalid = [t for t in trajs if t.status != "ok"]
        total_invalid += len(invalid)
        assert rec["invalid"] == len(invalid) and rec["invalid_frac"] == pytest.approx(len(invalid) / len(trajs))
        assert all("refused its role" in t.invalid_reason for t in invalid)
        valid_per_group = {}
        for t in trajs:
            valid_per_group.setdefault(t.group_id, 0)
            valid_per_group[t.group_id] += t.status == "ok"
        assert rec["skipped_groups"] == sum(v < 2 for v in valid_per_group.values())
        assert rec["trained_groups"] == sum(v >= 2 for v in valid_per_group.values())
        valid = [t for t in trajs if t.status == "ok"]
        assert rec["reward_mean"] == pytest.approx(np.mean([np.mean(t.turn_rewards) for t in valid]))
        assert rec["updates"] == -(-rec["trained_groups"] // 2)
        assert rec["coach_notes"] == sum(s.kind == "coach" for t in valid for s in t.segments)
        assert len({t.rollout_id for t in trajs}) == len(trajs) == 12
    ids = [t.rollout_id for s in seen.values() for t in s]
    assert len(set(ids)) == len(ids) == 36  # unique across the run
    assert total_invalid > 0  # the refusing user did refuse somewhere
    lines = open(os.path.join(res.workdir, "metrics.jsonl")).read().splitlines()
    assert len(lines) == 3 and '"reward/ToyKeyword"' in lines[0] and '"mean_w"' in lines[0]


def test_resume_reproduces_the_uninterrupted_run(straight, tmp_path):
    res, _ = straight
    cfg = _cfg("tiny_agentrl.py:csd", "train.steps=2", "checkpoint.every=1")
    first = L.run(cfg, str(tmp_path), user_side=_side(SometimesRefusingUser()), handle_signals=False,
                  log=lambda *a: None)
    assert first.final_step == 2
    cont = L.run(cfg.replace(train=dataclasses.replace(cfg.train, steps=3)), str(tmp_path),
                 user_side=_side(SometimesRefusingUser()), handle_signals=False, log=lambda *a: None)
    assert cont.start_step == 2 and sorted(cont.metrics) == [3]
    got = {**first.metrics, **cont.metrics}
    for step in (1, 2, 3):
        assert _strip(got[step]) == _strip(res.metrics[step]), step


def test_alpha_zero_runs_the_grpo_loop(tmp_path):
    a = L.run(_cfg("tiny_agentrl.py:grpo", "train.steps=2"), str(tmp_path / "g"), user_side=_side(),
              handle_signals=False, log=lambda *a: None)
    b = L.run(_cfg("tiny_agentrl.py:csd", "train.steps=2", "rl.alpha=0.0"), str(tmp_path / "c"), user_side=_side(),
              handle_signals=False, log=lambda *a: None)
    for step in (1, 2):
        assert _strip(a.metrics[step]) == _strip(b.metrics[step])
        assert a.metrics[step]["coach_notes"] == 0 and a.metrics[step]["csd_loss"] == 0.0


@pytest.mark.slow
def test_agentrl_command_sigterm_checkpoint_resume_and_validation(tmp_path):
    """`python -m mimesis_jax agentrl`: SIGTERM after a logged step -> a checkpoint and exit 0; the rerun resumes
    from it; validation at temperature 0 logs the evaluation score of every validation gym."""
    import signal
    import subprocess
    import sys
    import time

    wd = tmp_path / "run"
    cmd = [sys.executable, "-m", "mimesis_jax", "agentrl", "--config", os.path.join(ROOT, "configs",
                                                                                    "tiny_agentrl.py:csd"),
           "--workdir", str(wd), "--set", "train.steps=1000", "checkpoint.every=1000", "train.progress_bar=false",
           "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.mini_batch_prompts=2",
           "rollout.agent_max_tokens=8", "validation.every=1", "validation.sources=('toy:3',)"]
    env = subprocess_env(PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = wd / "metrics.jsonl"
    deadline = time.time() + 400
    try:
        while time.time() < deadline and proc.poll() is None:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 1:
                break
            time.sleep(0.2)
        assert proc.poll() is None and metrics.exists(), proc.stdout.read() if proc.poll() is not None else "slow"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "stop requested: checkpoint saved at step" in out and "(stopped by signal)" in out
    import json

    recs = [json.loads(x) for x in metrics.read_text().splitlines()]
    stopped = recs[-1]["step"]
    assert 0 <= recs[0]["val/ToyKeyword"] <= 1 and recs[0]["val/invalid"] == 0
    assert recs[0]["val/overall"] == recs[0]["val/ToyKeyword"]  # one validation gym
    from mimesis_jax.checkpoints import Checkpointer
    assert Checkpointer(str(wd), read_only=True).latest_step() == stopped
    again = subprocess.run(cmd[:-9] + ["train.steps=%d" % (stopped + 1), "train.progress_bar=false",
                                      "rollout.prompts_per_step=2", "rollout.group_size=2",
                                      "rollout.mini_batch_prompts=2", "rollout.agent_max_tokens=8",
                                      "validation.every=1", "validation.sources=('toy:3',)"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resume: {wd} from step {stopped}" in again.stdout
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()][-1] == stopped + 1


# --------------------------------------------------------------------------------- bounded dialogues
SMALL_STEP = ("train.steps=1", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.mini_batch_prompts=1",
              "rollout.agent_max_tokens=24")


def test_row_len_equal_to_the_context_limit_trains(tmp_path):
    """row_len == rollout.max_context_tokens (as the paper configs set it): every dialogue fits its row (the tool
    result / user turn after the last agent turn is dropped when it does not fit, and counted), the step trains."""
    seen = {}
    res = L.run(_cfg("tiny_agentrl.py:csd", *SMALL_STEP, "rollout.mini_batch_prompts=2", "rollout.row_len=120",
                     "rollout.max_context_tokens=120"),
                str(tmp_path), user_side=_side(), handle_signals=False, log=lambda *a: None,
                on_rollouts=lambda step, trajs: seen.__setitem__(step, trajs))
    rec, trajs = res.metrics[1], seen[1]
    assert all(len(t.student_tokens()) <= 120 for t in trajs)
    cut = [t for t in trajs if t.meta.get("dropped_tail_tokens")]
    assert cut and rec["context_cut"] == len(cut)  # the limit did bind (before the fix: "N tokens exceed row_len")
    assert rec["context_cut_tokens"] == sum(t.meta["dropped_tail_tokens"] for t in cut)
    assert all(t.meta["end_reason"] == "context_limit" for t in cut)
    assert rec["updates"] == 1 and np.isfinite(rec["loss"]) and rec["no_agent_turn"] == 0
    assert rec["coach_notes"] > 0  # CSD on: the coached turns' teacher branches packed beside the 120-token rows



def test_dialogues_with_no_agent_turn_are_skipped_and_counted(tmp_path):
    """A prompt that leaves no room for a first agent turn: the dialogue ends ok with no turn; the loop counts it
    (no_agent_turn), leaves it out of its group (here every group is skipped) and of the reward means."""
    seen = {}
    res = L.run(_cfg("tiny_agentrl.py:grpo", *SMALL_STEP, "rollout.row_len=60", "rollout.max_context_tokens=60"),
                str(tmp_path), user_side=_side(), handle_signals=False, log=lambda *a: None,
                on_rollouts=lambda step, trajs: seen.__setitem__(step, trajs))
    rec, trajs = res.metrics[1], seen[1]
    assert all(t.status == "ok" and t.num_agent_turns == 0 for t in trajs) and len(trajs) == 4
    assert (rec["no_agent_turn"], rec["skipped_groups"], rec["trained_groups"], rec["updates"]) == (4, 2, 0, 0)
    assert rec["invalid"] == 0 and rec["reward_mean"] == 0.0


@pytest.mark.parametrize("sets,match", [
    (("rollout.row_len=100", "rollout.max_context_tokens=120"), r"'rollout.row_len': must be >= rollout.max_context"),
    (("rollout.row_len=0", "rollout.max_context_tokens=30"), r"'rollout.max_context_tokens': = 30 leaves no room .*"
     r"rollout.agent_max_tokens=24 \+ 16 header tokens need 40; raise rollout.max_context_tokens"),
    (("rollout.row_len=30", "rollout.max_context_tokens=0"), r"'rollout.row_len': = 30 leaves no room"),
    (("rollout.row_len=600", "rollout.max_context_tokens=500", "gyms.max_prompt_tokens=480"),
     r"a prompt of gyms.max_prompt_tokens=480 \+ rollout.agent_max_tokens=24 \+ 16 header tokens need 520"),
])
def test_context_budget_errors_name_the_key(sets, match):
    from mimesis_jax.errors import ConfigError
    with pytest.raises(ConfigError, match=match):
        _cfg("tiny_agentrl.py:grpo", "rollout.agent_max_tokens=24", *sets).validate()


def test_paper_configs_budget_a_first_turn():
    for name in ("qwen3_8b_agentrl.py:grpo", "qwen3_8b_agentrl.py:csd"):
        cfg = L.load(os.path.join(ROOT, "configs", name)).validate()
        r = cfg.rollout
        assert r.row_len == r.max_context_tokens == L.context_budget(r)
        assert r.max_context_tokens >= cfg.gyms.max_prompt_tokens + r.agent_max_tokens + L.HEADER_TOKENS
