"""Episode scores as UserRL reports them (docs/reference/environments.md, "Reported score"; UserRL's interact tool and eval script).

* **training reward** -- UserRL's tool returns the MAX step reward of the conversation (0 when no step was taken);
  this is the scalar reward of an episode in RL.
* **evaluation score** -- the SUM of the step rewards; TravelGym instead takes, per aspect (the answer's first
  character: F, H, A, C, R), the maximum reward of its non-empty `[answer]` steps, sums those and divides by the
  task's number of aspects.
* **overall score** -- the mean of per-gym means weighted by each gym's number of unique tasks.

INVALID episodes (user refusal, endpoint failure) have no score: these functions return None for them, and
every aggregate here skips None and counts it apart (docs/reference/metrics.md: never averaged in as zeros).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Sequence

from mimesis_jax.envs.agent_env import EnvError


def training_reward(step_rewards: Sequence[float]) -> float:
    """UserRL's episode reward for RL: the highest step reward (0.0 for an episode with no step)."""
    return float(max(step_rewards)) if len(step_rewards) else 0.0


def travel_aspect_count(task_id: str) -> int:
    """Number of aspects of a TravelGym task id such as `flight:3-151|hotel:2-9` (one `aspect:record` per aspect)."""
    parts = [p for p in str(task_id).split("|") if p.strip()]
    if not parts:
        raise EnvError(f"TravelGym task id {task_id!r} names no aspect")
    return len(parts)


def travel_eval_score(steps: Iterable[Mapping], n_aspects: int) -> float:
    """TravelGym's evaluation score: per aspect (first character of the answer), the max reward of its answers,
    summed and divided by `n_aspects`. `steps` are per-step records with `choice`, `content`, `reward`."""
    if n_aspects < 1:
        raise EnvError(f"TravelGym: n_aspects must be >= 1, got {n_aspects}")
    best: dict[str, float] = {}
    for s in steps:
        content = s.get("content") or ""
        if s.get("choice") == "answer" and content != "":
            key = content[0]
            best[key] = max(best.get(key, 0.0), float(s.get("reward", 0.0)))
    return sum(best.values()) / n_aspects


def evaluation_score(gym: str, steps: Sequence[Mapping], *, task_id: str | None = None) -> float:
    """The evaluation score of one episode of `gym` from its per-step records (`Trajectory.env_info`)."""
    if gym == "TravelGym":
        if task_id is None:
            raise EnvError("TravelGym's evaluation score needs the task id (to count its aspects)")
        return travel_eval_score(steps, travel_aspect_count(task_id))
    return float(sum(float(s.get("reward", 0.0)) for s in steps))


@dataclasses.dataclass(frozen=True)
class EpisodeScore:
    gym: str
    task_id: str
    train_reward: float | None  # None: the episode is INVALID
    eval_score: float | None
    invalid_reason: str | None = None


def score_trajectory(traj) -> EpisodeScore:
    """Both scores of a Trajectory from the episode runner whose `task` holds `gym` and `id` (as the rollout
    command and the RL stage record them). INVALID trajectories score None with their reason."""
    gym, task_id = traj.task.get("gym"), traj.task.get("id")
    if not gym:
        raise EnvError(f"rollout {traj.rollout_id}: trajectory.task has no 'gym' (was it built from a UserRL Task?)")
    if traj.status != "ok":
        return EpisodeScore(gym, str(task_id), None, None, traj.invalid_reason or traj.status)
    rewards = [float(s.get("reward", 0.0)) for s in traj.env_info]
    return EpisodeScore(gym, str(task_id), training_reward(rewards),
                        evaluation_score(gym, traj.env_info, task_id=task_id))


@dataclasses.dataclass
class GymSummary:
    gym: str
    episodes: int
    valid: int
    invalid: int
    unique_tasks: int
    mean_train_reward: float | None
    mean_eval_score: float | None


def summarize(scores: Iterable[EpisodeScore]) -> dict[str, GymSummary]:
    """Per-gym means over VALID episodes (the mean over tasks of per-task means, as UserRL's eval script averages
    per task first), with invalid episodes counted apart."""
    by_gym: dict[str, list[EpisodeScore]] = {}
    for s in scores:
        by_gym.setdefault(s.gym, []).append(s)
    out = {}
    for gym, rows in sorted(by_gym.items()):
        valid = [r for r in rows if r.train_reward is not None]
        per_task: dict[str, list[EpisodeScore]] = {}
        for r in valid:
            per_task.setdefault(r.task_id, []).append(r)

        def task_mean(attr):
            if not per_task:
                return None
            means = [sum(getattr(r, attr) for r in rs) / len(rs) for rs in per_task.values()]
            return sum(means) / len(means)

        out[gym] = GymSummary(gym, len(rows), len(valid), len(rows) - len(valid),
                              len({r.task_id for r in rows}), task_mean("train_reward"), task_mean("eval_score"))
    return out


def overall_score(summaries: Mapping[str, GymSummary], attr: str = "mean_eval_score") -> float | None:
    """Per-gym means weighted by each gym's number of unique tasks (UserRL's overall score); gyms with no valid
    episode are left out."""
    num = den = 0.0
    for s in summaries.values():
        v = getattr(s, attr)
        if v is None:
            continue
        num += s.unique_tasks * v
        den += s.unique_tasks
    return None if den == 0 else num / den
