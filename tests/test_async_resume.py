"""Safe to stop (issue #44 item 5; train/rl/async_rollouts.py "Resume"): the tiny Stage II GRPO loop with
rl.async_deterministic=true and rl.max_staleness N = 1, 2 dies during step 3 (an error in its rollouts' hook, with
steps 3 .. 2 + N sampled or sampling beside it) after the checkpoint of step 2; the rerun restores the versions
the in-flight steps sampled with, regenerates them from their draws and seeds and finishes the run. Its steps 3-4
log what the uninterrupted 4-step run logged (every non-timing metric, at fp32 tolerance) and its final weights
are that run's, and the resumed steps draw the same tasks and rollout ids. A checkpoint without the versions
(written with N = 0) resumes on a new schedule from its own version, and says so. Stage I.3 (simulator RL, the
same learner) resumes as exactly, its per-domain running rewards (data state) included."""

import dataclasses
import os

import jax
import numpy as np
import pytest

from helpers import run_tiny_grpo, tiny_grpo_config
from mimesis_jax.chat.base import SimulatorAsResponder
from mimesis_jax.checkpoints import load_trained
from mimesis_jax.config import tiny_qwen3
from mimesis_jax.envs.toy import ToyCoach, ToyUser
from mimesis_jax.train.rl import agent as A, simulator as S
from mimesis_jax.train.rl.learner import BUSY_KEYS, COMPILATION_KEYS

STEPS = 4
TIMING = ("rollout_s", "coach_s", "train_s", "rollout_tokens_per_s", "train_tokens_per_s", "step_s",
          "rollout_wait_s", "groups_in_flight") + COMPILATION_KEYS + BUSY_KEYS  # process-local / wall clock


class Killed(RuntimeError):
    pass


def _cut(workdir, *sets):
    """The run dies while step 3's rollouts are taken (after step 2's checkpoint); then the same command again."""
    def die_at_3(step, trajs):
        if step == 3:
            raise Killed

    user = ToyUser()
    with pytest.raises(Killed):
        A.run(tiny_grpo_config(STEPS, *sets), str(workdir), user_side=A.UserSide(
            user, SimulatorAsResponder(user), user, ToyCoach()), on_rollouts=die_at_3, handle_signals=False,
            log=lambda *a: None)
    return run_tiny_grpo(workdir, STEPS, *sets)


def _same(a: dict, b: dict, step: int) -> None:
    keys = set(a) - set(TIMING)
    assert keys == set(b) - set(TIMING), step
    for k in sorted(keys):
        if isinstance(a[k], float):
            assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-6), (step, k)
        else:
            assert b[k] == a[k], (step, k)


@pytest.mark.parametrize("n", [1, 2])
def test_a_deterministic_asynchronous_run_resumes_exactly(n, tmp_path):
    sets = (f"rl.max_staleness={n}", "rl.async_deterministic=true", "checkpoint.every=2")
    straight, straight_seen = run_tiny_grpo(tmp_path / "straight", STEPS, *sets)
    resumed, seen = _cut(tmp_path / "cut", *sets)
    assert resumed.start_step == 2 and sorted(resumed.metrics) == [3, 4]
    for step in (3, 4):
        _same(straight.metrics[step], resumed.metrics[step], step)
        # the replayed versions: step s (1-based) sampled by version max(0, s - 1 - N), as in the straight run
        assert resumed.metrics[step]["staleness_max"] == (step - 1) - max(0, step - 1 - n)
        assert ([(t.rollout_id, t.task) for t in seen[step]]
                == [(t.rollout_id, t.task) for t in straight_seen[step]])
    _, want, _, _ = load_trained(straight.workdir)
    _, got, _, _ = load_trained(resumed.workdir)
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)


def test_a_checkpoint_without_the_versions_resumes_on_a_new_schedule(tmp_path):
    """Killed with N = 0 (its checkpoint holds no earlier version), resumed with N = 1 under the fixed lag: the
    generator starts at version 2, so step 3 samples with the version that trains it and step 4 one behind."""
    sets = ("rl.async_deterministic=true", "checkpoint.every=2")

    def die_at_3(step, trajs):
        if step == 3:
            raise Killed

    user = ToyUser()
    side = A.UserSide(user, SimulatorAsResponder(user), user, ToyCoach())
    with pytest.raises(Killed):
        A.run(tiny_grpo_config(STEPS, "rl.max_staleness=0", *sets), str(tmp_path), user_side=side,
              on_rollouts=die_at_3, handle_signals=False, log=lambda *a: None)
    said = []
    res = A.run(tiny_grpo_config(STEPS, "rl.max_staleness=1", *sets), str(tmp_path), user_side=side,
                handle_signals=False, log=said.append)
    assert res.start_step == 2 and [res.metrics[s]["staleness_max"] for s in (3, 4)] == [0, 1]
    assert any("holds no policy versions [1]" in line for line in said), said


# Stage I.3 cut small: the two SOUL domains with the shortest prompts (userllm: single-turn, judged; mirrorbench: two
# turns against a partner), both scored by the rule-based toy judge against the toy agent, 512-token rows, one update
# program (two rows per rollout), and the tiny Qwen3 of the agent configs in place of the tiny Qwen3.5 (the learner's
# asynchronous path is the same; the Qwen3.5 step is dearer to compile)
SIM_BASE = ["train.progress_bar=false", "train.tensorboard=false", f"train.steps={STEPS}",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.mini_batch_prompts=1",
            "rollout.max_tokens=8", "domains.max_user_turns=2",
            "domains.weights=(('userllm', 1.0), ('mirrorbench', 1.0))",
            "rollout.row_len=512", "rollout.max_context_tokens=512", "rollout.row_rungs=(2.0,)", "rollout.max_batch=4",
            "checkpoint.async_save=false", "mesh.fsdp=1", "rl.max_staleness=1", "rl.async_deterministic=true",
            "checkpoint.every=2"]


def _simrl(workdir, on_rollouts):
    cfg = S.load(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                              "tiny_simrl.py"), SIM_BASE)
    return S.run(dataclasses.replace(cfg, model=tiny_qwen3()), str(workdir), handle_signals=False,
                 on_rollouts=on_rollouts, log=lambda *a: None)


def test_a_deterministic_asynchronous_simulator_rl_run_resumes_exactly(tmp_path):
    """simrl with N = 1 under the fixed lag dies during step 3 (step 4's rollouts admitted beside it) after step 2's
    checkpoint; the rerun replays steps 3-4 with versions 1-2: their rows (rewards per domain, running means, update
    metrics), rollouts and the final weights are the uninterrupted run's."""
    seen, got = {}, {}
    straight = _simrl(tmp_path / "straight", lambda step, outs: seen.__setitem__(step, outs))

    def die_at_3(step, outs):
        if step == 3:
            raise Killed

    with pytest.raises(Killed):
        _simrl(tmp_path / "cut", die_at_3)
    resumed = _simrl(tmp_path / "cut", lambda step, outs: got.__setitem__(step, outs))
    assert resumed.start_step == 2 and sorted(resumed.metrics) == [3, 4]
    # the weights move in steps 1-3 (else a replay with the wrong version could not show)
    assert all(straight.metrics[s]["grad_norm"] > 0 for s in (1, 2, 3))
    for step in (3, 4):
        _same(straight.metrics[step], resumed.metrics[step], step)
        assert resumed.metrics[step]["staleness_max"] == 1
        assert ([(o.rollout_id, o.domain, o.task, o.reward) for o in got[step]]
                == [(o.rollout_id, o.domain, o.task, o.reward) for o in seen[step]])
    _, want, _, _ = load_trained(straight.workdir)
    _, have, _, _ = load_trained(resumed.workdir)
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(have)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
