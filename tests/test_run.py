"""The run skeleton (train/run.py `Run`) both training loops go through: the LM loop (train/loop.train) and the RL
learner (train/rl/learner.py) each checkpoint on schedule and on a SIGTERM through `Run.save`, and the
non-finite-loss guard (`Run.check_finite`, train.nonfinite) stops either loop naming the step and the last
checkpoint, before that step is saved."""

import math
import os
import signal

import numpy as np
import pytest

from rl_helpers import ScriptedDraws
from mimesis_jax.checkpoints import Checkpointer
from mimesis_jax.config import CheckpointConfig, MeshConfig, OptimizerConfig, RunConfig, TrainConfig
from mimesis_jax.data.trajectory import Segment, Trajectory
from mimesis_jax.errors import ConfigError
from mimesis_jax.models import ModelConfig
from mimesis_jax.train import run as run_lib
from mimesis_jax.train.loop import train
from mimesis_jax.train.metrics import read_metrics
from mimesis_jax.train.rl import agent as A, learner as L
from mimesis_jax.train.synthetic import SyntheticData, SyntheticIterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=8, logits_vocab_chunk=32, logits_seq_chunk=16)
DATA = SyntheticData(vocab_size=64, seq_len=16)
STEPS, EVERY, TERM_AT = 4, 2, 3  # 4 steps, a checkpoint every 2, SIGTERM during step 3: saves at 2 and 3


@pytest.fixture
def saves(monkeypatch):
    """(the Run subclass, step) of every Run.save, in order."""
    seen = []
    real = run_lib.Run.save
    monkeypatch.setattr(run_lib.Run, "save", lambda self, step, *a, **kw: seen.append((type(self).__name__, step))
                        or real(self, step, *a, **kw))
    return seen


def _steps_on_disk(workdir):
    ck = Checkpointer(workdir, read_only=True)
    try:
        return ck.all_steps()
    finally:
        ck.close()


def _lm_cfg(**train_kw) -> RunConfig:
    t = dict(steps=STEPS, global_batch=2, dtype="float32", progress_bar=False, tensorboard=False, prefetch=0)
    t.update(train_kw)
    return RunConfig(stage="midtrain", model=MODEL, data=DATA, optimizer=OptimizerConfig(lr=1e-3, warmup_steps=0),
                     train=TrainConfig(**t), mesh=MeshConfig(data=1, fsdp=1, tensor=1),
                     checkpoint=CheckpointConfig(every=EVERY, keep=5, async_save=False))


def _lm_data_with_sigterm(tok, b, seed, pi, pc):
    class Terminating(SyntheticIterator):
        def __next__(self):  # the batch of step TERM_AT: the process signals itself (the loop's handler catches it)
            if self.index == TERM_AT - 1:
                os.kill(os.getpid(), signal.SIGTERM)
            return super().__next__()
    return Terminating(DATA, b, seed, pi)


def test_lm_loop_saves_on_schedule_and_on_sigterm_through_the_run(tmp_path, saves):
    res = train(_lm_cfg(), str(tmp_path), data=_lm_data_with_sigterm)
    assert res.preempted and res.final_step == res.checkpoint_step == TERM_AT
    assert saves == [("Run", EVERY), ("Run", TERM_AT)]
    assert _steps_on_disk(str(tmp_path)) == [EVERY, TERM_AT]
    assert [r["step"] for r in read_metrics(str(tmp_path))] == list(range(1, TERM_AT + 1))
    assert os.path.exists(os.path.join(str(tmp_path), "run_config.json"))


def _rl_cfg(*sets):
    base = ["train.progress_bar=false", "train.tensorboard=false", f"train.steps={STEPS}", "rollout.prompts_per_step=1",
            "rollout.group_size=2", "rollout.mini_batch_prompts=1", "rollout.row_len=64", "rl.old_logprobs=rollout",
            "checkpoint.async_save=false", f"checkpoint.every={EVERY}"]
    return A.load(os.path.join(ROOT, "configs", "tiny_agentrl.py") + ":grpo", base + list(sets))


class _Stage(ScriptedDraws, L.RLLearner):
    """Fixed random dialogues of two agent turns; SIGTERM during step `term_at`."""

    def __init__(self, *a, term_at=None, **kw):
        super().__init__(*a, **kw)
        self.term_at = term_at

    def rollouts(self, model, items, *, group_size, first_group, first_rid, **kw):
        rng = np.random.RandomState(self.drawn)

        def dialogue(group, rid):
            toks = rng.randint(1, 50, size=16).tolist()  # two agent turns (ScriptedDraws' advantages)
            return Trajectory([Segment("public", toks[:4]), Segment("agent", toks[4:8], logprobs=[-1.0] * 4),
                               Segment("public", toks[8:12]), Segment("agent", toks[12:], logprobs=[-1.0] * 4)],
                              turn_rewards=[1.0, 0.0], group_id=group, rollout_id=rid)
        if self.drawn == self.term_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return [[dialogue(first_group + i, first_rid + i * group_size + k) for k in range(group_size)]
                for i in range(len(items))]


def test_rl_loop_saves_through_the_run_and_its_guard_stops_before_the_bad_step_is_saved(tmp_path, saves,
                                                                                      monkeypatch):
    wd = str(tmp_path)
    first = _Stage(_rl_cfg(), wd, term_at=TERM_AT, log=lambda *a: None).run()
    assert first.preempted and first.final_step == first.checkpoint_step == TERM_AT
    assert saves == [("RLRun", EVERY), ("RLRun", TERM_AT)]
    assert _steps_on_disk(wd) == [EVERY, TERM_AT]
    # the resumed run's update at step 4 reports a NaN loss: the guard stops before step 4's (scheduled) save
    real = L.fetch_metrics
    monkeypatch.setattr(L, "fetch_metrics", lambda tree: [[dict(m, loss=np.float32(np.nan)) for m in ms]
                                                          for ms in real(tree)])
    with pytest.raises(run_lib.NonFiniteLossError,
                       match=rf"step {STEPS}: non-finite loss nan.*the last checkpoint is step {TERM_AT}\. "
                             r"Lower optimizer.lr, check the data\.$"):
        _Stage(_rl_cfg(), wd, handle_signals=False, log=lambda *a: None).run()
    assert saves == [("RLRun", EVERY), ("RLRun", TERM_AT)] and _steps_on_disk(wd) == [EVERY, TERM_AT]
    rows = read_metrics(wd)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert rows[-1]["loss"] == "nan"  # metrics.jsonl writes a non-finite value as text


def test_rl_run_rejects_nonfinite_skip_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="config key 'train.nonfinite'"):
        L.setup(_rl_cfg("train.nonfinite=skip"), str(tmp_path), None)


class _Lines:
    def __init__(self):
        self.lines = []

    def write(self, line):
        self.lines.append(line)


class _Latest:
    def latest_step(self):
        return 7


def test_guard_skip_counts_in_a_row_and_stop_names_the_last_checkpoint(tmp_path):
    run = run_lib.Run(_lm_cfg(nonfinite="skip", max_consecutive_skips=2), str(tmp_path), log=lambda *a: None)
    run.logger, run.ckpt = _Lines(), _Latest()
    run.check_finite(1, math.nan, 1.0, skipped_total=1)
    run.check_finite(2, 1.0, 1.0)  # a finite step resets the count
    run.check_finite(3, 1.0, math.inf, skipped_total=2)
    assert run.logger.lines == ["step 1: non-finite loss nan, grad norm 1.0; update skipped (1 in a row, 1 in total)",
                                "step 3: non-finite loss 1.0, grad norm inf; update skipped (1 in a row, 2 in total)"]
    with pytest.raises(run_lib.NonFiniteLossError, match=r"step 4: 2 non-finite steps in a row "
                                                          r"\(train.max_consecutive_skips=2\)"):
        run.check_finite(4, math.nan, math.nan, skipped_total=3)
    stop = run_lib.Run(_lm_cfg(), str(tmp_path), log=lambda *a: None)
    stop.ckpt = _Latest()
    with pytest.raises(run_lib.NonFiniteLossError, match=r"step 5: non-finite loss inf, grad norm 0.5\. Stopping "
                                                         r"\(train.nonfinite=stop\); the last checkpoint is step 7\. "
                                                         r".*set train.nonfinite=skip"):
        stop.check_finite(5, math.inf, 0.5)
