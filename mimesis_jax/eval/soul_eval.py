"""SOUL-Index (docs/reference/metrics.md, docs/reference/paper.md 5): a simulator's mean score over the SOUL tasks, per axis and overall, as
mean +/- standard error over evaluation seeds.

`evaluate` runs the simulator the way Stage I's joint RL does (train/rl/simulator.py): the simulator is the
token-level policy (a `LocalChatModel`), each task record becomes an environment through
`envs.domains.make_domain_env` (judge / partner sides from `SideModels`), and all of a seed's episodes go through
`episodes.simulator.run_sim_episodes`, at temperature 0. A seed k sets the sampler seed (``SimEpisodeConfig.seed
= k``) and every environment's seed (``SeedSequence([k, task index, record index])``). Per task and seed the score
is 100 x the mean reward r_d (Eq 4) over the VALID rollouts; invalid rollouts (a judge or partner that failed or
answered unreadably twice) are counted apart (``n_invalid``), never scored 0. A task with no valid rollout at a
seed has no score there (null).

`aggregate` turns per-task, per-seed scores (from `evaluate` or precomputed) into the ``soul`` section:

* per task: mean and SE (`metrics.mean_and_se`) over its scored seeds, and the per-seed scores;
* per axis (CONV, SS, COG, ROLE, EVAL; ``data/soul_axes.toml`` holds this project's task -> axis assignment,
  the paper does not print one): at each seed the mean over the axis's tasks, then mean and SE over seeds;
* the index: at each seed the mean over all tasks, then mean and SE over seeds.

A task missing a score at some seed is left out of its axis and of the index (so every seed averages the same
tasks) and listed in ``excluded_tasks``.
"""

from __future__ import annotations

import pathlib
from typing import Any, Mapping, Sequence

import numpy as np

from mimesis_jax.envs import soul
from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.domains import domain, make_domain_env
from mimesis_jax.envs.model_io import read_toml
from mimesis_jax.episodes.simulator import SimEpisodeConfig, SimEpisodeTask, run_sim_episodes
from mimesis_jax.eval import metrics
from mimesis_jax.eval.usi import DATA_DIR

AXES = ("CONV", "SS", "COG", "ROLE", "EVAL")
AXES_PATH = DATA_DIR / "soul_axes.toml"


def load_axes(path: str | pathlib.Path = AXES_PATH) -> dict[str, str]:
    """task -> axis from `path`: the axes must be exactly `AXES`, the tasks exactly the registered SOUL tasks."""
    data = read_toml(path, "SOUL axes file")
    axes, tasks = data.get("axes"), data.get("tasks")
    if not isinstance(axes, dict) or sorted(axes) != sorted(AXES):
        raise EnvError(f"{path}: [axes] must describe exactly {list(AXES)}, got {sorted(axes or {})}")
    if not isinstance(tasks, dict):
        raise EnvError(f"{path}: no [tasks] table")
    names = soul.task_names()
    missing, unknown = sorted(set(names) - set(tasks)), sorted(set(tasks) - set(names))
    if missing or unknown:
        raise EnvError(f"{path}: [tasks] must assign every SOUL task once; missing {missing}, unknown {unknown}")
    for t, a in tasks.items():
        if a not in AXES:
            raise EnvError(f"{path}: tasks.{t} = {a!r} is not one of {list(AXES)}")
    return dict(tasks)


def _mean(xs) -> float:
    return sum(xs) / len(xs)


def _pair(values: Sequence[float]) -> dict[str, float]:
    mean, se = metrics.mean_and_se(values)
    return {"mean": mean, "se": se}


def aggregate(scores: Mapping[str, Sequence[float | None]], axes: Mapping[str, str] | None = None) -> dict:
    """The ``soul`` section from per-task, per-seed scores (0-100; None where a seed has no valid rollout).

    Every task must have the same number of seeds and an axis in `axes` (default: `load_axes()`); errors name the
    task."""
    axes = load_axes() if axes is None else axes
    if not scores:
        raise EnvError("SOUL aggregation: no task scores")
    n_seeds = {t: len(v) for t, v in scores.items()}
    if min(n_seeds.values()) < 1 or len(set(n_seeds.values())) != 1:
        raise EnvError(f"SOUL aggregation: every task needs the same number (>= 1) of seed scores, got {n_seeds}")
    S = next(iter(n_seeds.values()))
    tasks: dict[str, Any] = {}
    for t, vals in sorted(scores.items()):
        if t not in axes:
            raise EnvError(f"SOUL aggregation: task {t!r} has no axis (known tasks: {sorted(axes)})")
        for k, v in enumerate(vals):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 100):
                raise EnvError(f"SOUL aggregation: task {t!r}, seed {k}: score must be a number in [0, 100] or "
                               f"null, got {v!r}")
        got = [float(v) for v in vals if v is not None]
        tasks[t] = {**(_pair(got) if got else {"mean": None, "se": None}),
                    "seeds": [None if v is None else float(v) for v in vals]}
    complete = [t for t in tasks if None not in tasks[t]["seeds"]]
    out_axes = {}
    for axis in AXES:
        members = [t for t in complete if axes[t] == axis]
        if members:
            out_axes[axis] = _pair([_mean([tasks[t]["seeds"][k] for t in members]) for k in range(S)])
    index = _pair([_mean([tasks[t]["seeds"][k] for t in complete]) for k in range(S)]) if complete else None
    return {"tasks": tasks, "axes": out_axes, "index": index, "n_seeds": S,
            "excluded_tasks": sorted(set(tasks) - set(complete))}


def check_sides(tasks: Sequence[str], sides) -> None:
    """An error naming the first task whose fixed sides (judge, partner) are not all in `sides`."""
    for t in tasks:
        missing = [s for s in domain(t).sides if getattr(sides, s) is None]
        if missing:
            raise EnvError(f"SOUL task {t!r} needs the fixed side(s) {missing} (a --judge / --partner model)")


def evaluate(policy, records: Mapping[str, Sequence[dict]], sides, seeds: Sequence[int], *, thinking: bool = False,
             max_tokens: int = 1024, max_context_tokens: int | None = None, max_turns: int | None = None,
             env_workers: int = 16, tokenizer=None, log=None) -> dict:
    """Runs every record of every task once per seed; returns {"scores": {task: [score per seed]}, "n_valid":
    {task: n}, "n_invalid": {task: n}, "invalid": [{"task", "seed", "record", "reason"}]}.

    policy: token-level sampler (`LocalChatModel` of the simulator); records: task -> parsed records
    (`domains.domain(task).load` / `.samples`); sides: `envs.domains.SideModels`; max_turns caps multi-turn
    tasks' policy turns (None: each task's own)."""
    names = list(records)
    check_sides(names, sides)
    for t in names:
        if not records[t]:
            raise EnvError(f"SOUL task {t!r}: no records to evaluate")
    scores: dict[str, list[float | None]] = {t: [] for t in names}
    n_valid = {t: 0 for t in names}
    n_invalid = {t: 0 for t in names}
    invalid = []
    for seed in seeds:
        tasks = []
        for ti, t in enumerate(names):
            options = {"max_turns": max_turns} if (max_turns and domain(t).multi_turn) else {}
            for i, rec in enumerate(records[t]):
                env_seed = int(np.random.SeedSequence([int(seed), ti, i]).generate_state(1)[0])
                env = make_domain_env(t, rec, sides, seed=env_seed, **options)
                env.thinking = thinking
                tasks.append(SimEpisodeTask(env, group_id=len(tasks), rollout_id=len(tasks), domain=t,
                                            task={"domain": t, "record": i, "seed": int(seed)}))
        cfg = SimEpisodeConfig(max_tokens=max_tokens, temperature=0.0, seed=int(seed),
                               max_context_tokens=max_context_tokens, env_workers=env_workers)
        outs = run_sim_episodes(policy, tasks, cfg, tokenizer=tokenizer)
        for t in names:
            rewards = []
            for o in outs:
                if o.domain != t:
                    continue
                if o.status == "ok":
                    rewards.append(o.reward)
                else:
                    invalid.append({"task": t, "seed": int(seed), "record": o.task["record"],
                                    "reason": o.invalid_reason})
            n_valid[t] += len(rewards)
            n_invalid[t] += sum(1 for o in outs if o.domain == t and o.status != "ok")
            scores[t].append(100.0 * _mean(rewards) if rewards else None)
        if log is not None:
            log(f"soul seed {seed}: " + ", ".join(f"{t} {s[-1]:.1f}" if s[-1] is not None else f"{t} -"
                                                  for t, s in scores.items()))
    return {"scores": scores, "n_valid": n_valid, "n_invalid": n_invalid, "invalid": invalid}


def soul_section(run: Mapping[str, Any], axes: Mapping[str, str] | None = None) -> dict:
    """`aggregate` of an `evaluate` result, with each task's valid / invalid rollout counts and the invalid list."""
    out = aggregate(run["scores"], axes)
    for t, entry in out["tasks"].items():
        entry["n_valid"], entry["n_invalid"] = run["n_valid"][t], run["n_invalid"][t]
    out["n_invalid"] = sum(run["n_invalid"].values())
    out["invalid"] = list(run["invalid"])
    return out
