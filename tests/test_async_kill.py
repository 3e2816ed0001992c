"""Safe to stop under kill -9 (issue #44 item 5; train/rl/async_rollouts.py "Resume"): `python -m mimesis_jax
agentrl` on the tiny GRPO config, rl.max_staleness=1 rl.async_deterministic=true, 5 steps with a checkpoint every 2,
gets SIGKILL while step 5's rollouts are in flight (the test hook $MIMESIS_HANG_IN_ROLLOUTS holds them there,
learner.hang_if_requested): by then step 2's checkpoint is on disk, step 3's row is logged and step 4 is updating
or waiting for step 5. The same command again resumes from step 2, regenerates steps 3-5 from their draws and seeds
with the versions they sampled with, and ends where the uninterrupted command ends: metrics.jsonl holds each step
once (step 3's row of the killed process dropped and written again), every non-timing value of every row and the
final weights are the uninterrupted run's at fp32 tolerance, and the final checkpoint's next rollout id counts each
step's groups once."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from helpers import subprocess_env
from mimesis_jax.checkpoints import Checkpointer, load_trained
from mimesis_jax.train.metrics import read_metrics
from mimesis_jax.train.rl.learner import BUSY_KEYS, COMPILATION_KEYS, HANG_ENV

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, HANG_AT, EVERY = 5, 5, 2
SETS = ["train.progress_bar=false", "train.tensorboard=false", f"train.steps={STEPS}", "rollout.prompts_per_step=2",
        "rollout.group_size=2", "rollout.mini_batch_prompts=1", "rollout.agent_max_tokens=8", "rollout.row_len=128",
        "checkpoint.async_save=false", f"checkpoint.every={EVERY}", "rl.max_staleness=1",
        "rl.async_deterministic=true"]
TIMING = ("rollout_s", "coach_s", "train_s", "rollout_tokens_per_s", "train_tokens_per_s", "step_s",
          "rollout_wait_s", "groups_in_flight") + COMPILATION_KEYS + BUSY_KEYS  # process-local / wall clock


def _cmd(workdir) -> list[str]:
    return [sys.executable, "-m", "mimesis_jax", "agentrl", "--config",
            os.path.join(ROOT, "configs", "tiny_agentrl.py") + ":grpo", "--workdir", str(workdir), "--set", *SETS]


def _steps(workdir) -> list[int]:
    return [r["step"] for r in read_metrics(str(workdir))] if (workdir / "metrics.jsonl").exists() else []


def _kill_in_flight(workdir, env) -> str:
    """Starts the command with step HANG_AT's rollouts held, waits for that point, step 2's checkpoint (its
    checksums are written once it is complete) and step 3's row, then SIGKILL; the process's output."""
    proc = subprocess.Popen(_cmd(workdir), cwd=ROOT, env=dict(env, **{HANG_ENV: str(HANG_AT)}),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marks = (workdir / f"hanging-in-rollouts-{HANG_AT}", workdir / "checkpoint_checksums" / f"{EVERY}.json")
    deadline, reached = time.monotonic() + 300, False
    try:
        while proc.poll() is None and time.monotonic() < deadline and not reached:
            reached = all(m.exists() for m in marks) and 3 in _steps(workdir)
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert reached, f"no kill point within 300 s: {[str(m) for m in marks]}, rows {_steps(workdir)}"
        proc.send_signal(signal.SIGKILL)
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGKILL, out[-3000:]
    return out


def _next_rollout_id(workdir, step: int) -> int:
    with open(workdir / "checkpoints" / str(step) / "data_iter" / "metadata") as f:
        return json.load(f)["states"][0]["next_rollout_id"]


def test_kill_9_with_a_step_in_flight_then_resume_equals_the_straight_run(tmp_path):
    env = subprocess_env(PYTHONUNBUFFERED="1")
    straight_wd, cut_wd = tmp_path / "straight", tmp_path / "cut"
    straight = subprocess.Popen(_cmd(straight_wd), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    try:
        _kill_in_flight(cut_wd, env)
        # what the kill left: step 2's checkpoint only, rows 1-3 (step 3's follows no checkpoint) and perhaps step
        # 4's: with early updates (rl.async_early_updates) the loop trains step 4 while step 5's rollouts hang
        assert Checkpointer(str(cut_wd), read_only=True).all_steps() == [EVERY]
        assert _steps(cut_wd) in ([1, 2, 3], [1, 2, 3, 4])
        again = subprocess.run(_cmd(cut_wd), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        out = straight.communicate(timeout=300)[0]
    finally:
        if straight.poll() is None:
            straight.kill()
            straight.communicate()
    assert straight.returncode == 0, out[-3000:]
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert f"resume: {cut_wd} from step {EVERY}" in again.stdout, again.stdout[-3000:]
    want, got = read_metrics(str(straight_wd)), read_metrics(str(cut_wd))
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, STEPS + 1))
    for a, b in zip(want, got):
        keys = set(a) - set(TIMING)
        assert keys == set(b) - set(TIMING), a["step"]
        for k in sorted(keys):
            if isinstance(a[k], float):
                assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-6), (a["step"], k)
            else:
                assert b[k] == a[k], (a["step"], k)
    # steps 2-5 trained by version s - 1 sampled with version s - 2: the replayed steps too
    assert [r["staleness_max"] for r in got] == [0, 1, 1, 1, 1]
    assert [r["trained_groups"] for r in got] == [2] * STEPS
    assert _next_rollout_id(cut_wd, STEPS) == _next_rollout_id(straight_wd, STEPS) == STEPS * 2 * 2
    _, w, _, _ = load_trained(str(straight_wd))
    _, g, _, _ = load_trained(str(cut_wd))
    assert jax.tree.structure(w) == jax.tree.structure(g)
    for a, b in zip(jax.tree.leaves(w), jax.tree.leaves(g)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
