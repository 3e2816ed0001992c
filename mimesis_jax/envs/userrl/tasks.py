"""UserRL task records: loading verl task files (parquet as published, or the project's JSONL in the same row
schema) and building the env of a task.

A row (docs/reference/environments.md): `data_source` (e.g. `interact_function`), `prompt` (chat messages: system = environment
description and tool rules, user = the task opening), `ability`, `reward_model` {env_name, id, ground_truth, style,
per-gym fields}, `extra_info` {index, split, need_tools_kwargs, tools_kwargs.interact_with_env.create_kwargs}.
The create arguments name the gym (`env_name`) and select the record in its data file (`id`; TurtleGym `title`).
Struct columns of a parquet file that mixes gyms carry every gym's keys, absent ones as null: nulls are dropped.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any, Iterable

import numpy as np

from mimesis_jax.config.mixture import USERRL_GYMS
from mimesis_jax.data import jsonio
from mimesis_jax.envs import agent_env
from mimesis_jax.envs.agent_env import EnvError, register
from mimesis_jax.envs.userrl.common import TASKS_DIR

# UserRL env name -> the stem of its module under mimesis_jax.envs.userrl and of its task files
GYM_MODULES = {name: name.removesuffix("Gym").lower() for name in USERRL_GYMS}  # TravelGym -> travel.py
TRAIN_GYMS = ("TravelGym", "TurtleGym", "FunctionGym", "TauGym", "PersuadeGym")
EVAL_ONLY_GYMS = ("IntentionGym", "TelepathyGym", "SearchGym")

_CLASSES: dict[str, type] = {}


def register_gym(name: str):
    """Class decorator for a UserRL gym: `make_env` finds it by its UserRL name, `envs.make(name, ...)` too."""
    if name not in GYM_MODULES:
        raise EnvError(f"unknown UserRL gym {name!r}; known: {sorted(GYM_MODULES)}")

    def deco(cls):
        _CLASSES[name] = cls
        cls.name = name
        return register(name)(cls)
    return deco


def gym_class(name: str) -> type:
    """The env class of a UserRL gym (its module registered it when the package envs/userrl/ was imported), or of
    another registered env class that builds from a Task (`from_task`, e.g. envs/toy.py's ToyKeyword)."""
    if name in _CLASSES:
        return _CLASSES[name]
    cls = agent_env.registered_class(name)  # e.g. ToyKeyword, registered when envs/toy.py is imported
    if cls is None or not hasattr(cls, "from_task"):
        raise EnvError(f"unknown gym {name!r}; known: {sorted(GYM_MODULES)} and registered envs with from_task "
                       f"(ToyKeyword: import mimesis_jax.envs.toy)")
    return cls


@dataclasses.dataclass
class Task:
    """One UserRL task: which gym, which record, what the agent sees first."""

    gym: str  # the UserRL env name, e.g. "FunctionGym"
    id: str  # the record id (TurtleGym: the story title)
    prompt: list[dict]  # chat messages the agent starts from
    create_kwargs: dict[str, Any]  # the env's create arguments (without env_name)
    data_source: str = ""
    split: str = ""
    index: int | None = None
    ability: str = ""
    reward_model: dict[str, Any] = dataclasses.field(default_factory=dict)
    source: str = ""  # "file:row" it came from

    def to_row(self) -> dict:
        """The verl row of this task (what `load_tasks` reads back)."""
        return {
            "data_source": self.data_source, "prompt": [dict(m) for m in self.prompt], "ability": self.ability,
            "reward_model": {"env_name": self.gym, "id": self.id, **self.reward_model},
            "extra_info": {"index": self.index, "need_tools_kwargs": True, "split": self.split,
                           "tools_kwargs": {"interact_with_env": {
                               "create_kwargs": {"env_name": self.gym, **self.create_kwargs}}}},
        }


def _drop_nulls(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


def task_from_row(row: dict, where: str) -> Task:
    """A verl row -> Task; every missing or mistyped field is an error naming `where` (file and row) and it."""
    if not isinstance(row, dict):
        raise EnvError(f"{where}: a task row must be an object, got {type(row).__name__}")
    prompt = row.get("prompt")
    if isinstance(prompt, np.ndarray):  # numpy arrays from some parquet readers
        prompt = prompt.tolist()
    if not isinstance(prompt, list) or not prompt:
        raise EnvError(f"{where}: field 'prompt' must be a non-empty list of chat messages")
    for j, m in enumerate(prompt):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise EnvError(f"{where}: field 'prompt[{j}]' must be a message with string 'role' and 'content'")
        if m["role"] not in ("system", "user", "assistant"):
            raise EnvError(f"{where}: field 'prompt[{j}].role' must be system/user/assistant, got {m['role']!r}")
    extra = row.get("extra_info")
    if not isinstance(extra, dict):
        raise EnvError(f"{where}: missing field 'extra_info'")
    try:
        create = extra["tools_kwargs"]["interact_with_env"]["create_kwargs"]
    except (KeyError, TypeError):
        raise EnvError(f"{where}: missing field 'extra_info.tools_kwargs.interact_with_env.create_kwargs'") from None
    if not isinstance(create, dict):
        raise EnvError(f"{where}: field 'extra_info.tools_kwargs.interact_with_env.create_kwargs' must be an object")
    create = _drop_nulls(create)
    reward_model = row.get("reward_model")
    reward_model = _drop_nulls(reward_model) if isinstance(reward_model, dict) else {}
    gym = create.pop("env_name", None) or reward_model.get("env_name")
    if not isinstance(gym, str) or not gym:
        raise EnvError(f"{where}: missing field 'extra_info.tools_kwargs.interact_with_env.create_kwargs.env_name'")
    if gym not in GYM_MODULES:
        raise EnvError(f"{where}: field 'create_kwargs.env_name' names unknown gym {gym!r}; known: "
                       f"{sorted(GYM_MODULES)}")
    task_id = create.get("id", create.get("title", reward_model.get("id")))
    if task_id is None or (isinstance(task_id, str) and not task_id):
        raise EnvError(f"{where}: missing field 'create_kwargs.id' (TurtleGym/TelepathyGym: 'title')")
    index = extra.get("index")
    return Task(gym=gym, id=str(task_id), prompt=[{"role": m["role"], "content": m["content"]} for m in prompt],
                create_kwargs=create, data_source=str(row.get("data_source") or ""),
                split=str(extra.get("split") or ""), index=None if index is None else int(index),
                ability=str(row.get("ability") or ""),
                reward_model={k: v for k, v in reward_model.items() if k not in ("env_name", "id")}, source=where)


def _rows(path: pathlib.Path) -> Iterable[tuple[int, Any]]:
    suffix = "".join(path.suffixes[-1:]).lower()
    if suffix == ".parquet":
        # lazy (b): pyarrow only for .parquet rows
        import pyarrow.parquet as pq
        try:
            table = pq.read_table(path)
        except Exception as e:
            raise EnvError(f"{path}: not a readable parquet file ({e})") from None
        yield from enumerate(table.to_pylist())
    elif suffix == ".jsonl":
        try:
            for n, rec in jsonio.iter_jsonl(path):
                yield n - 1, rec  # rows count lines from 0
        except jsonio.DataFileError as e:
            raise EnvError(f"{e.path}, row {e.line - 1}: {e.reason}" if e.line else jsonio.located(e)) from None
    elif suffix == ".json":
        data = jsonio.read_json(path, error=EnvError)
        if not isinstance(data, list):
            raise EnvError(f"{path}: a .json task file must hold a list of rows")
        yield from enumerate(data)
    else:
        raise EnvError(f"{path}: task files are .parquet, .jsonl or .json")


def load_tasks(path: str | os.PathLike, *, gyms: Iterable[str] | None = None) -> list[Task]:
    """Tasks of a verl task file (UserRL's parquet, or JSONL/JSON rows of the same schema), or of every such file in
    a folder (sorted by name). `gyms` keeps only those gyms. Malformed rows raise EnvError naming file, row, field."""
    p = pathlib.Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix.lower() in (".parquet", ".jsonl", ".json"))
        if not files:
            raise EnvError(f"task folder {p} holds no .parquet/.jsonl/.json files")
    elif p.is_file():
        files = [p]
    else:
        raise EnvError(f"task file {p} does not exist")
    keep = None if gyms is None else set(gyms)
    if keep is not None and not keep <= set(GYM_MODULES):
        raise EnvError(f"unknown gyms {sorted(keep - set(GYM_MODULES))}; known: {sorted(GYM_MODULES)}")
    out = []
    for f in files:
        for i, row in _rows(f):
            task = task_from_row(row, f"{f}, row {i}")
            if keep is None or task.gym in keep:
                out.append(task)
    return out


def shipped_tasks(split: str = "train", gyms: Iterable[str] | None = None) -> list[Task]:
    """The project's own invented tasks (`tasks/<gym>_<split>.jsonl`), all gyms or `gyms`."""
    if split not in ("train", "test"):
        raise EnvError(f"split must be 'train' or 'test', got {split!r}")
    wanted = list(GYM_MODULES) if gyms is None else list(gyms)
    out = []
    for gym in wanted:
        if gym not in GYM_MODULES:
            raise EnvError(f"unknown UserRL gym {gym!r}; known: {sorted(GYM_MODULES)}")
        f = TASKS_DIR / f"{GYM_MODULES[gym]}_{split}.jsonl"
        if f.is_file():
            out.extend(load_tasks(f))
    return out


def make_env(task: Task, *, data_dir=None, user=None, judge=None, retriever=None, seed=None, max_steps=None,
             **options):
    """The env of `task`: its gym's class built from the task's create arguments and the gym's data files in
    `data_dir` (UserRL's file names; None = the shipped files). `user` / `judge` are ChatModels (the gym's other
    side), `retriever` SearchGym's backend, `max_steps` overrides the gym's own turn limit; `options` go to the
    gym (e.g. TravelGym's reward variant)."""
    if not isinstance(task, Task):
        raise EnvError(f"make_env expects a Task (from load_tasks), got {type(task).__name__}")
    cls = gym_class(task.gym)
    return cls.from_task(task, data_dir=data_dir, user=user, judge=judge, retriever=retriever, seed=seed,
                         max_steps=max_steps, **options)
