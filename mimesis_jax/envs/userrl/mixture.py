"""Task mixtures over the UserRL gyms: which task files, in which proportions, filtered by prompt length.

UserRL's training set (docs/reference/environments.md) is 2,426 rows -- Travel 925, Tau 500, Turtle 423, Persuade 378,
Function 200 -- with prompts of 1,152 tokens or more dropped; the evaluation set covers all eight gyms. A
`MixtureConfig` names task sources (files/folders of verl rows, or `shipped:train` / `shipped:test` for the
project's own tasks) and per-gym weights. `MixtureSampler` draws gym ~ weights, then a task of that gym uniformly
without replacement within an epoch of that gym; draw k depends only on (seed, k), so a sampler resumes exactly from
its `state` (a counter). Weights default to the gyms' row counts in UserRL's training mixture.

Choice where UserRL is silent: with UserRL's own files, sampling by row-count weights reproduces a shuffled
concatenation's proportions; with smaller files (the shipped samples) it keeps the proportions rather than the
files' accidental sizes.
"""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

import numpy as np

from mimesis_jax.config.mixture import MAX_PROMPT_TOKENS, USERRL_TRAIN_ROWS, MixtureConfig  # noqa: F401 (re-exported)
from mimesis_jax.data.chat import render_messages
from mimesis_jax.envs.agent_env import INTERACT_TOOL, EnvError
from mimesis_jax.envs.toy import toy_tasks
from mimesis_jax.envs.userrl.tasks import GYM_MODULES, Task, load_tasks, shipped_tasks

log = logging.getLogger(__name__)


def resolve_sources(sources: Sequence[str], gyms: Sequence[str] | None = None) -> list[Task]:
    tasks: list[Task] = []
    for src in sources:
        if src.startswith("shipped:"):
            tasks.extend(shipped_tasks(src.split(":", 1)[1], gyms))
        elif src.startswith("toy:"):  # toy:N[:letter[:turns]] -- N ToyKeyword tasks (envs/toy.py), for CPU runs
            parts = src.split(":")
            try:
                n = int(parts[1])
                turns = int(parts[3]) if len(parts) > 3 else 2
                if len(parts) > 4 or turns < 1:
                    raise ValueError
            except (IndexError, ValueError):
                raise EnvError(f"mixture source {src!r}: expected toy:N, toy:N:letter or toy:N:letter:turns "
                               "(turns >= 1)") from None
            tasks.extend(toy_tasks(n, letter=parts[2] if len(parts) > 2 else "s", max_steps=turns))
        else:
            tasks.extend(load_tasks(src, gyms=gyms))
    return tasks


def prompt_tokens(task: Task, tokenizer) -> int:
    """The agent's prompt length in tokens: the task's messages with the tool schema (a tool-mode gym's; the
    free-text ToyKeyword's prompt has none, as the episode runner renders it) and the assistant header."""
    tools = None if task.gym == "ToyKeyword" else [INTERACT_TOOL]
    return len(render_messages(tokenizer, task.prompt, add_generation_prompt=True, tools=tools).ids)


def filter_long_prompts(tasks: Sequence[Task], tokenizer, max_tokens: int = MAX_PROMPT_TOKENS
                        ) -> tuple[list[Task], dict[str, int]]:
    """Drops tasks whose prompt has `max_tokens` tokens or more (UserRL's rule); returns kept tasks and the number
    dropped per gym (also logged). max_tokens <= 0 keeps everything."""
    if max_tokens <= 0:
        return list(tasks), {}
    kept, dropped = [], {}
    for t in tasks:
        if prompt_tokens(t, tokenizer) >= max_tokens:
            dropped[t.gym] = dropped.get(t.gym, 0) + 1
        else:
            kept.append(t)
    if dropped:
        log.info("dropped %d task(s) with prompts of >= %d tokens: %s", sum(dropped.values()), max_tokens, dropped)
    return kept, dropped


def check_gyms(cfg: MixtureConfig) -> None:
    """The mixture's gym names and weights, checked without reading any task or model (so a command can reject a
    typo before it loads its models)."""
    weights = cfg.weight_map()
    known = set(GYM_MODULES) | {"ToyKeyword"}
    unknown = sorted(set(weights) - known) + sorted(set(cfg.gyms) - known)
    if unknown:
        raise EnvError(f"mixture: unknown gyms {unknown}; known: {sorted(known)}")
    if any(w < 0 for w in weights.values()):
        raise EnvError(f"mixture: weights must be >= 0, got {weights}")


def build_tasks(cfg: MixtureConfig, tokenizer=None) -> tuple[list[Task], dict[str, int]]:
    """The mixture's tasks (after gym selection and, with a tokenizer, the prompt-length filter) and drop counts."""
    check_gyms(cfg)
    weights = cfg.weight_map()
    gyms = list(cfg.gyms) or ([g for g, w in weights.items() if w > 0] if weights else None)
    tasks = resolve_sources(cfg.sources, gyms)
    dropped: dict[str, int] = {}
    if tokenizer is not None:
        tasks, dropped = filter_long_prompts(tasks, tokenizer, cfg.max_prompt_tokens)
    if not tasks:
        why = (f"; {sum(dropped.values())} dropped for prompts of >= {cfg.max_prompt_tokens} tokens {dropped} "
               "(a small tokenizer such as 'tiny' makes prompts longer: raise or disable max_prompt_tokens)"
               if dropped else "")
        raise EnvError(f"mixture: no task left from sources {list(cfg.sources)} (gyms {gyms}){why}")
    return tasks, dropped


class MixtureSampler:
    """Draws tasks: gym ~ weights (restricted to gyms that have tasks), then the gym's tasks in a per-epoch
    permutation. Deterministic in (seed, draw index); `state` / `restore(state)` resume exactly."""

    def __init__(self, tasks: Sequence[Task], weights: Mapping[str, float] | None = None, seed: int = 0):
        self.by_gym: dict[str, list[Task]] = {}
        for t in tasks:
            self.by_gym.setdefault(t.gym, []).append(t)
        if not self.by_gym:
            raise EnvError("MixtureSampler: no tasks")
        w = {g: float(len(ts)) for g, ts in self.by_gym.items()} if not weights else {
            g: float(weights.get(g, 0.0)) for g in self.by_gym}
        self.gyms = sorted(g for g, x in w.items() if x > 0)
        if not self.gyms:
            raise EnvError(f"MixtureSampler: every gym with tasks ({sorted(self.by_gym)}) has weight 0")
        total = sum(w[g] for g in self.gyms)
        self.probs = np.array([w[g] / total for g in self.gyms])
        self.seed = int(seed)
        self.draws = 0
        self._per_gym_count = {g: 0 for g in self.gyms}

    @property
    def state(self) -> dict:
        return {"draws": self.draws, "per_gym": dict(self._per_gym_count)}

    def restore(self, state: Mapping) -> None:
        per = dict(state["per_gym"])
        if set(per) != set(self.gyms):
            raise EnvError(f"MixtureSampler.restore: state is for gyms {sorted(per)}, this sampler has {self.gyms}")
        self.draws, self._per_gym_count = int(state["draws"]), {g: int(v) for g, v in per.items()}

    def _task(self, gym: str, k: int) -> Task:
        pool = self.by_gym[gym]
        epoch, pos = divmod(k, len(pool))
        gi = self.gyms.index(gym)
        perm = np.random.default_rng([self.seed, 1, gi, epoch]).permutation(len(pool))
        return pool[int(perm[pos])]

    def sample(self, n: int) -> list[Task]:
        out = []
        for _ in range(n):
            u = np.random.default_rng([self.seed, 0, self.draws]).random()
            gi = min(int(np.searchsorted(np.cumsum(self.probs), u, side="right")), len(self.gyms) - 1)
            gym = self.gyms[gi]
            out.append(self._task(gym, self._per_gym_count[gym]))
            self._per_gym_count[gym] += 1
            self.draws += 1
        return out
