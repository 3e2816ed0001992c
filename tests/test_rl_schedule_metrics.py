"""The RL loop (train/rl/learner.py) on a scripted stage (fixed random dialogues, groups dropped on chosen steps,
the tiny model's real update): the learning-rate schedule counts the optimizer updates actually made (skipped
groups make fewer, a step with none does not advance it), the logged lr is the one each update applied (a NumPy
warmup + cosine written here from the config values), and with train.metrics_sync_every = K the update metrics
reach the host once per K steps (and at SIGTERM and the end) while metrics.jsonl holds the rows of K = 1."""

import json
import os
import signal

import numpy as np
import pytest

from rl_helpers import ScriptedDraws
from mimesis_jax.data.trajectory import Segment, Trajectory
from mimesis_jax.errors import ConfigError
from mimesis_jax.train.rl import agent as A, learner as L
from mimesis_jax.train.rl.step import schedule_count

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEPT = [2, 0, 1, 2, 0, 1]  # groups kept per step (of 2): updates made per step, one per kept group
PEAK, WARM, MIN_RATIO = 1e-3, 3, 0.1
TIMING = ("train_s", "train_tokens_per_s", "step_s") + L.COMPILATION_KEYS + L.BUSY_KEYS  # compilations: per process


def _cfg(*sets):
    base = ["train.progress_bar=false", "train.tensorboard=false", f"train.steps={len(KEPT)}",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.mini_batch_prompts=1",
            "rollout.row_len=64", "rl.old_logprobs=rollout", "checkpoint.async_save=false", "checkpoint.every=100",
            f"optimizer.lr={PEAK}", "optimizer.schedule=cosine", f"optimizer.warmup_steps={WARM}",
            f"optimizer.min_lr_ratio={MIN_RATIO}"]
    return A.load(os.path.join(ROOT, "configs", "tiny_agentrl.py") + ":grpo", base + list(sets))


def _dialogue(rng, group, rid):
    """Fixed lengths (one packed shape for every update), random tokens, two agent turns with log-probs."""
    def toks(n):
        return rng.randint(1, 50, size=n).tolist()

    segs = [Segment("public", toks(6))]
    for _ in range(2):
        segs += [Segment("public", toks(4)), Segment("agent", toks(5), logprobs=(-rng.rand(5) * 3).tolist())]
    return Trajectory(segs, turn_rewards=[1.0, 0.0], group_id=group, rollout_id=rid)


class ScriptedStage(ScriptedDraws, L.RLLearner):
    """Rollouts are fixed random dialogues; step s keeps its first KEPT[s - 1] groups; SIGTERM during step
    `term_at` (the process signals itself; the loop's handler sets the stop flag)."""

    def __init__(self, *a, term_at=None, **kw):
        super().__init__(*a, **kw)
        self.term_at = term_at

    def banner(self, start):
        return f"scripted from {start}"

    def rollouts(self, model, items, *, group_size, first_group, first_rid, **kw):
        rng = np.random.RandomState(self.drawn)
        return [[_dialogue(rng, first_group + i, first_rid + i * group_size + k) for k in range(group_size)]
                for i in range(len(items))]

    def filter_groups(self, outs):
        if self.drawn == self.term_at:
            os.kill(os.getpid(), signal.SIGTERM)
        n = KEPT[self.drawn - 1]
        return outs[:n], {"skipped": len(outs) - n}

    def record(self, outs, kept, counts, times):
        return {"skipped_groups": counts["skipped"], "train_s": times["trained"] - times["advantages"]}


def _np_lr(n, total):
    """Warmup peak * (n + 1) / WARM for n < WARM, then cosine from peak to peak * MIN_RATIO over the rest."""
    if n < WARM:
        return PEAK * (n + 1) / WARM
    t = min(n - WARM, total - WARM) / (total - WARM)
    return PEAK * ((1 - MIN_RATIO) * 0.5 * (1 + np.cos(np.pi * t)) + MIN_RATIO)


def _rows(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in f if line.strip()]


@pytest.fixture(scope="module")
def every_step(tmp_path_factory):
    wd = str(tmp_path_factory.mktemp("k1"))
    learner = ScriptedStage(_cfg(), wd, handle_signals=False, log=lambda *a: None)
    fetches = []
    mp = pytest.MonkeyPatch()
    mp.setattr(L, "fetch_metrics", lambda tree: fetches.append(len(tree)) or L.jax.device_get(tree))
    try:
        res = learner.run()
    finally:
        mp.undo()
    return learner, res, fetches, wd


def test_schedule_counts_the_updates_made_and_logs_the_applied_lr(every_step):
    learner, res, _, _ = every_step
    total = len(KEPT) * 2  # the schedule's horizon: train.steps x updates per step
    made = np.cumsum(KEPT)
    assert [res.metrics[s]["updates"] for s in range(1, 7)] == KEPT
    assert int(schedule_count(learner.run_state.state["opt_state"])) == made[-1] == 6  # skipped steps: no advance
    for s, n in zip(range(1, 7), made):
        rec = res.metrics[s]
        if KEPT[s - 1] == 0:
            assert "lr" not in rec and "opt_steps" not in rec  # no update, no applied lr
        else:  # the step's last update is update n - 1 (0-based) of the run
            assert rec["opt_steps"] == n
            assert rec["lr"] == pytest.approx(_np_lr(n - 1, total), rel=1e-6), s
    # the applied lrs at the updates really made (0-based 1, 2, 4, 5), not at step x updates per step - 1
    assert [res.metrics[s]["lr"] for s in (1, 3, 4, 6)] == pytest.approx([_np_lr(n, total) for n in (1, 2, 4, 5)],
                                                                         rel=1e-6)
    # a synchronous run logs step_s too: the wall clock from one step's record to the next spans its update
    for s in range(1, 7):
        assert res.metrics[s]["step_s"] >= res.metrics[s]["train_s"] > 0, (s, res.metrics[s])


def test_metrics_fetched_every_k_steps_and_rows_unchanged_through_sigterm_and_resume(every_step, tmp_path):
    _, _, fetches_k1, wd_k1 = every_step
    assert fetches_k1 == [1, 1, 1, 1]  # K = 1: one fetch per step that made updates
    wd, fetches = str(tmp_path), []
    mp = pytest.MonkeyPatch()
    mp.setattr(L, "fetch_metrics", lambda tree: fetches.append(len(tree)) or L.jax.device_get(tree))
    try:
        cfg = _cfg("train.metrics_sync_every=3")
        first = ScriptedStage(cfg, wd, term_at=4, log=lambda *a: None).run()
        assert first.preempted and first.final_step == first.checkpoint_step == 4
        assert fetches == [2, 1]  # steps 1-3 at once (K), step 4 at the SIGTERM checkpoint
        rest = ScriptedStage(cfg, wd, handle_signals=False, log=lambda *a: None).run()
        assert rest.start_step == 4 and rest.final_step == 6
        assert fetches == [2, 1, 1]  # steps 5-6 at the end (step 5 made no update)
    finally:
        mp.undo()
    assert _rows(wd) == _rows(wd_k1) and [r["step"] for r in _rows(wd)] == [1, 2, 3, 4, 5, 6]


def test_metrics_sync_every_errors_name_the_key():
    with pytest.raises(ConfigError, match="train.metrics_sync_every"):
        _cfg("train.metrics_sync_every=0").validate()
