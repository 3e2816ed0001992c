"""UserRL tasks -> episode-runner tasks, and trajectories -> JSON records (what `rollout`, the RL stage and the
evaluator share).

A UserRL gym talks to its own user / judge models inside `step` (envs/userrl/common.py), so its EpisodeTask has
no `user_messages` (Env.user_messages() is None): the runner's own simulator turn is not used, and the user's
thought/utterance come back in the step info. A free-text env whose `user_messages()` is a persona (envs/toy.py)
uses the runner's simulator turn
instead: pass that simulator (in its own framing) as `run_episodes(..., user=...)`.
`task` on the trajectory records the gym, the task id and where it came from, which is what
`scoring.score_trajectory` reads.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

from mimesis_jax.envs.userrl.scoring import score_trajectory
from mimesis_jax.envs.userrl.tasks import Task, make_env
from mimesis_jax.episodes.agent import EpisodeTask
from mimesis_jax.inference.protocol import derive_seed


def episode_tasks(tasks: Sequence[Task], *, group_size: int = 1, first_group: int = 0, first_rollout_id: int = 0,
                  seed: int = 0, data_dir=None, user=None, judge=None, retriever=None, max_steps=None,
                  gym_options: dict[str, dict] | None = None) -> list[EpisodeTask]:
    """`group_size` episodes per task (a GRPO group shares `group_id`); rollout ids are consecutive from
    `first_rollout_id`, so a caller that advances it per batch never reuses one. Each env is built fresh;
    `gym_options[gym]` are extra create options of that gym (e.g. {"TravelGym": {"reward_variant": "eval"}})."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    out, rid = [], int(first_rollout_id)
    for g, task in enumerate(tasks):
        gid = first_group + g
        for m in range(group_size):
            options = (gym_options or {}).get(task.gym, {})
            env = make_env(task, data_dir=data_dir, user=user, judge=judge, retriever=retriever,
                           seed=derive_seed(seed, gid, m), max_steps=max_steps, **options)
            out.append(EpisodeTask(env=env, agent_messages=[dict(x) for x in task.prompt],
                                   user_messages=env.user_messages(),
                                   group_id=gid, rollout_id=rid,
                                   task={"gym": task.gym, "id": task.id, "source": task.source, "split": task.split},
                                   reset_seed=derive_seed(seed, gid, m)))
            rid += 1
    return out


def _jsonable(x):
    try:
        json.dumps(x)
        return x
    except TypeError:
        if isinstance(x, dict):
            return {str(k): _jsonable(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [_jsonable(v) for v in x]
        return repr(x)


def trajectory_record(traj) -> dict:
    """A JSON-ready record of one trajectory: token-exact segments, rewards, step info, the user's thoughts and
    utterances, status and invalid reason, and both UserRL scores (None when invalid)."""
    score = score_trajectory(traj)
    return {
        "rollout_id": traj.rollout_id, "group_id": traj.group_id, "task": _jsonable(traj.task),
        "status": traj.status, "invalid_reason": traj.invalid_reason,
        "train_reward": score.train_reward, "eval_score": score.eval_score,
        "turn_rewards": list(traj.turn_rewards), "env_info": _jsonable(traj.env_info),
        "user_thoughts": list(traj.user_thoughts), "user_utterances": list(traj.user_utterances),
        "meta": _jsonable(traj.meta),
        "segments": [dataclasses.asdict(s) for s in traj.segments],
    }
