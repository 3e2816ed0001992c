"""Agent evaluation matrix (`python -m mimesis_jax evalagent`): agents x evaluation users x UserRL gyms x seeds.

    python -m mimesis_jax evalagent --agent base=runs/agent_base_hf --agent rl=runs/agent_rl \\
        --user mimesis=runs/sim_hf --user gpt=https://api.example/v1 --user-model gpt=gpt-4o \\
        --user-key-env gpt=OPENAI_API_KEY --seeds 3 --out runs/evalagent

Every cell (agent, user, gym, seed) runs each task of the gym once, agent at temperature 0 (pass@1), as Eq 2
episodes (agent <-> gym <-> user) through the runner of the `rollout` command (episodes/userrl.episode_tasks
+ episodes/agent.run_episodes). A user spec is wrapped as `rollout` and agent RL wrap it
(chat/specs.user_and_judge): a local MIMESIS simulator writes `user` turns in its own framing
(SimulatorAsResponder), a remote model is asked as an assistant. The gym's judge is `--judge` when given (one judge
for every user), else each user's model asked as an assistant.

Scores are UserRL's evaluation scores (envs/userrl/scoring.py: the sum of the step rewards, TravelGym's per-aspect
rule, eval reward table); a cell's mean is the mean over tasks of per-task means (`scoring.summarize`). Episodes
where the user refused its role or a model failed are INVALID: counted per cell and in `summary.json`'s
"invalid", never averaged in as zeros (docs/reference/metrics.md, "Agent performance"). Aggregates (docs/reference/metrics.md; eval/metrics.py):

* per gym and agent: mean and SE (`metrics.mean_and_se`) over the users x seeds cell means (cells with no valid
  episode are left out; "n" says how many remain);
* Avg (`metrics.average`, paper Table 2) and MR (`metrics.mean_rank`: ranks within each gym, ties share the mean
  rank) over the gyms where every agent has a mean ("ranked_gyms"); Avg's SE is over the (user, seed)
  replicates' own gym averages (replicates with a gym without valid episodes left out).

Resumable: each finished cell is written atomically to `OUT/cells/<agent>__<user>__<gym>__seed<k>.json` and
skipped when present. `OUT/matrix.json` records every name's spec and the settings that change scores; reusing a
name with another spec, or changing a setting, is an error naming it. Then `OUT/summary.json` and a table.
Seed k sets the env seeds (`episode_tasks(seed=k)`) and the runner's sampling seed; the users' and judges' own
sampling streams are their models' (gyms ask them at temperature 0 by default).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import re
import sys
import time
from typing import Any, Callable, Mapping, Sequence

from mimesis_jax.data import jsonio
from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.userrl import GYM_MODULES, load_tasks, scoring, shipped_tasks
from mimesis_jax.envs.userrl.retriever import from_option as retriever_from_option
from mimesis_jax.episodes.agent import EpisodeConfig, run_episodes
from mimesis_jax.episodes.userrl import episode_tasks
from mimesis_jax.eval import metrics
from mimesis_jax.errors import ConfigError
from mimesis_jax.chat import specs  # module, not names: tests patch specs.agent_from_spec / user_and_judge
from mimesis_jax.chat.specs import ModelSpec, close_models

CELLS_DIR = "cells"
MATRIX_FILE = "matrix.json"
SUMMARY_FILE = "summary.json"
# UserRL's evaluation uses TravelGym's "eval" reward table
GYM_OPTIONS = {"TravelGym": {"reward_variant": "eval"}}
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9.-])?")
_CELL_KEYS = ("agent", "user", "gym", "seed", "episodes", "mean_score", "n_valid", "n_invalid")
_EPISODE_KEYS = ("task_id", "score", "status", "invalid_reason")


# ------------------------------------------------------------------------------------------ the matrix
@dataclasses.dataclass
class Entry:
    """One named agent or evaluation user of the matrix.

    spec: JSON-able record of what the name stands for (stored in matrix.json and compared on resume).
    load: builds it on first use -- an agent: a Generator with a `.tok` (inference/protocol.py); a user: the pair
    (user ChatModel, judge ChatModel) the gyms talk to.
    """

    name: str
    spec: dict
    load: Callable[[], Any]


@dataclasses.dataclass
class EvalConfig:
    """Settings of a matrix. All but `batch` change scores and are recorded in matrix.json."""

    max_turns: int = 16  # agent turns per episode (paper: 16)
    agent_max_tokens: int = 512
    data_dir: str | None = None  # gym data files under UserRL's names (None: shipped)
    judge: dict | None = None  # the shared judge's spec record (None: each user's model asked as an assistant)
    retriever: str | None = None  # SearchGym backend spec (None: the shipped corpus)
    batch: int = 32  # episodes per run_episodes call

    def settings(self) -> dict:
        s = dataclasses.asdict(self)
        s.pop("batch")
        s["temperature"] = 0.0
        return s


def cell_name(agent: str, user: str, gym: str, seed: int) -> str:
    return f"{agent}__{user}__{gym}__seed{seed}"


def cell_path(out_dir: str, agent: str, user: str, gym: str, seed: int) -> str:
    return os.path.join(out_dir, CELLS_DIR, cell_name(agent, user, gym, seed) + ".json")


def write_json(path: str, obj) -> None:
    """Atomic write: a temporary file in the same folder, then os.replace."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def _check_names(kind: str, entries: Sequence[Entry]) -> None:
    seen = set()
    for e in entries:
        if not isinstance(e.name, str) or not _NAME.fullmatch(e.name) or "__" in e.name:
            raise EnvError(f"{kind} name {e.name!r}: use letters, digits, '.', '-', '_' (no '__', not starting or "
                           "ending with '_'); it is part of the cell file names")
        if e.name in seen:
            raise EnvError(f"{kind} name {e.name!r} is given twice")
        seen.add(e.name)
    if not entries:
        raise EnvError(f"no {kind}s to evaluate")


def check_matrix(out_dir: str, agents: Sequence[Entry], users: Sequence[Entry], config: EvalConfig) -> None:
    """Compares this run's names and settings with OUT/matrix.json (error naming the first difference), then
    records the union of both."""
    path = os.path.join(out_dir, MATRIX_FILE)
    now = json.loads(json.dumps({"agents": {e.name: e.spec for e in agents}, "users": {e.name: e.spec for e in users},
                                 "settings": config.settings()}))
    if os.path.exists(path):
        old = jsonio.read_json(path, error=EnvError)
        for key in ("agents", "users", "settings"):
            if not isinstance(old, dict) or not isinstance(old.get(key), dict):
                raise EnvError(f"{path}: missing field {key!r}")
        for kind in ("agents", "users"):
            for name, spec in now[kind].items():
                if name in old[kind] and old[kind][name] != spec:
                    raise EnvError(f"{path}: {kind[:-1]} {name!r} was evaluated with spec {old[kind][name]} and is "
                                   f"now given as {spec}; use a new name (or a new --out)")
            now[kind] = {**old[kind], **now[kind]}
        for key, value in now["settings"].items():
            if old["settings"].get(key) != value:
                raise EnvError(f"{path}: setting {key!r} was {old['settings'].get(key)!r} and is now {value!r}; "
                               "cells of both would be mixed (use a new --out)")
    write_json(path, now)


def read_cell(path: str, agent: str, user: str, gym: str, seed: int, task_ids: Sequence[str]) -> dict:
    """A finished cell file, checked against the cell it should be and this run's tasks of its gym."""
    cell = jsonio.read_json(path, error=EnvError)
    if not isinstance(cell, dict):
        raise EnvError(f"{path}: a cell file must hold an object")
    for key in _CELL_KEYS:
        if key not in cell:
            raise EnvError(f"{path}: missing field {key!r}")
    for key, want in (("agent", agent), ("user", user), ("gym", gym), ("seed", seed)):
        if cell[key] != want:
            raise EnvError(f"{path}: field {key!r} is {cell[key]!r}, expected {want!r}")
    if not isinstance(cell["episodes"], list):
        raise EnvError(f"{path}: field 'episodes' must be a list")
    for i, ep in enumerate(cell["episodes"]):
        for key in _EPISODE_KEYS:
            if not isinstance(ep, dict) or key not in ep:
                raise EnvError(f"{path}: episodes[{i}] has no field {key!r}")
    if not (cell["mean_score"] is None or isinstance(cell["mean_score"], (int, float))):
        raise EnvError(f"{path}: field 'mean_score' must be a number or null")
    if not isinstance(cell["n_invalid"], int):
        raise EnvError(f"{path}: field 'n_invalid' must be an integer")
    got = [ep["task_id"] for ep in cell["episodes"]]
    if got != list(task_ids):
        raise EnvError(f"{path}: its tasks {got} differ from this run's {gym} tasks {list(task_ids)} (were --tasks "
                       "or --max-tasks changed?); delete the cell or use a new --out")
    return cell


def make_cell(agent: str, user: str, gym: str, seed: int, trajectories) -> dict:
    """The cell record of one (agent, user, gym, seed): its episodes' UserRL evaluation scores and their mean."""
    scores = [scoring.score_trajectory(t) for t in trajectories]
    summary = scoring.summarize(scores)[gym]
    return {
        "agent": agent, "user": user, "gym": gym, "seed": seed,
        "episodes": [{"task_id": s.task_id, "score": s.eval_score, "status": t.status,
                      "invalid_reason": t.invalid_reason, "train_reward": s.train_reward,
                      "turns": t.meta.get("turns"), "end_reason": t.meta.get("end_reason")}
                     for s, t in zip(scores, trajectories)],
        "mean_score": summary.mean_eval_score, "n_valid": summary.valid, "n_invalid": summary.invalid,
    }


def _run_pair(agent, user, judge, a: str, u: str, pending: Sequence[tuple[str, int]], tasks, config: EvalConfig,
              retriever, out_dir: str, cells: dict, log) -> None:
    """Runs the pending (gym, seed) cells of one agent and one user, seed by seed, `config.batch` episodes per
    runner call; each cell is written (and added to `cells`) as soon as its last episode ends."""
    for seed, group in itertools.groupby(pending, key=lambda c: c[1]):
        gyms = [g for g, _ in group]
        work = [(g, i, t) for g in gyms for i, t in enumerate(tasks[g])]
        done: dict[str, list] = {g: [] for g in gyms}
        ecfg = EpisodeConfig(max_turns=config.max_turns, agent_max_tokens=config.agent_max_tokens,
                             agent_temperature=0.0, seed=seed)
        for start in range(0, len(work), config.batch):
            chunk = work[start:start + config.batch]
            eps = []
            for g, piece in itertools.groupby(chunk, key=lambda w: w[0]):
                piece = list(piece)  # env seeds depend on (seed, task index in its gym) only: cells rerun alike
                eps += episode_tasks([t for _, _, t in piece], first_group=piece[0][1], first_rollout_id=len(eps),
                                     seed=seed, data_dir=config.data_dir, user=user, judge=judge,
                                     retriever=retriever, gym_options=GYM_OPTIONS)
            for (g, _, _), traj in zip(chunk, run_episodes(agent, None, eps, ecfg, tokenizer=agent.tok)):
                done[g].append(traj)
                if len(done[g]) == len(tasks[g]):
                    cell = make_cell(a, u, g, seed, done[g])
                    write_json(cell_path(out_dir, a, u, g, seed), cell)
                    cells[a, u, g, seed] = cell
                    log(f"{cell_name(a, u, g, seed)}: mean {_f(cell['mean_score'])} "
                        f"({cell['n_valid']} valid, {cell['n_invalid']} invalid)")


def evaluate(out_dir: str, agents: Sequence[Entry], users: Sequence[Entry], tasks: Mapping[str, Sequence],
             seeds: Sequence[int], config: EvalConfig | None = None, *, retriever=None, log=print) -> dict:
    """Runs every missing cell of agents x users x gyms (the keys of `tasks`: gym -> its Task list) x seeds,
    then writes and returns OUT/summary.json. Models are loaded only for cells still to run (each agent once,
    each user once); bad names, changed specs/settings and cell files that do not fit raise EnvError."""
    config = config or EvalConfig()
    _check_names("agent", agents)
    _check_names("user", users)
    if config.batch < 1 or config.max_turns < 1:
        raise EnvError(f"batch and max_turns must be >= 1, got batch={config.batch}, max_turns={config.max_turns}")
    gyms = list(tasks)
    if not gyms:
        raise EnvError("no gyms to evaluate")
    for g in gyms:
        if not tasks[g]:
            raise EnvError(f"gym {g}: no tasks")
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise EnvError(f"seeds must be distinct and at least one, got {seeds}")
    os.makedirs(os.path.join(out_dir, CELLS_DIR), exist_ok=True)
    check_matrix(out_dir, agents, users, config)

    cells: dict[tuple, dict] = {}
    pending: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for a, u, s, g in itertools.product(agents, users, seeds, gyms):
        path = cell_path(out_dir, a.name, u.name, g, s)
        if os.path.exists(path):
            cells[a.name, u.name, g, s] = read_cell(path, a.name, u.name, g, s, [t.id for t in tasks[g]])
        else:
            pending.setdefault((a.name, u.name), []).append((g, s))
    n_pending = sum(len(v) for v in pending.values())
    log(f"{len(cells)} cell(s) already done, {n_pending} to run -> {out_dir}")
    loaded_users: dict[str, tuple] = {}
    try:
        for a in agents:
            todo = [u for u in users if (a.name, u.name) in pending]
            if not todo:
                continue
            agent = a.load()  # a token-level agent (local sampler, remote /completions, scripted): holds no thread
            for u in todo:
                if u.name not in loaded_users:
                    loaded_users[u.name] = tuple(u.load())
                user, judge = loaded_users[u.name]
                _run_pair(agent, user, judge, a.name, u.name, pending[a.name, u.name], tasks, config, retriever,
                          out_dir, cells, log)
    finally:  # a judge shared by every user is closed once
        close_models(*{id(m): m for pair in loaded_users.values() for m in pair}.values())
    summary = summarize_matrix(cells, [a.name for a in agents], [u.name for u in users], gyms, seeds)
    write_json(os.path.join(out_dir, SUMMARY_FILE), summary)
    return summary


# ------------------------------------------------------------------------------------------ aggregates
def summarize_matrix(cells: Mapping[tuple, Mapping], agents: Sequence[str], users: Sequence[str],
                     gyms: Sequence[str], seeds: Sequence[int]) -> dict:
    """summary.json from the cell records keyed (agent, user, gym, seed); see the module docstring."""
    def mean(a, u, g, s):
        return cells[a, u, g, s]["mean_score"]

    per_gym, invalid, per_user = {}, {}, {u: {} for u in users}
    for a in agents:
        per_gym[a], invalid[a] = {}, {}
        for g in gyms:
            vals = [mean(a, u, g, s) for u in users for s in seeds if mean(a, u, g, s) is not None]
            if vals:
                m, se = metrics.mean_and_se(vals)
                per_gym[a][g] = {"mean": m, "se": se, "n": len(vals)}
            else:
                per_gym[a][g] = {"mean": None, "se": None, "n": 0}
            invalid[a][g] = sum(int(cells[a, u, g, s]["n_invalid"]) for u in users for s in seeds)
        for u in users:
            per_user[u][a] = {}
            for g in gyms:
                vals = [mean(a, u, g, s) for s in seeds if mean(a, u, g, s) is not None]
                per_user[u][a][g] = sum(vals) / len(vals) if vals else None
    ranked = [g for g in gyms if all(per_gym[a][g]["mean"] is not None for a in agents)]
    avg: dict[str, dict] = {a: {"mean": None, "se": None} for a in agents}
    mr: dict[str, float | None] = {a: None for a in agents}
    if ranked:
        table = {a: {g: per_gym[a][g]["mean"] for g in ranked} for a in agents}
        mr = metrics.mean_rank(table)
        for a, m in metrics.average(table).items():
            replicates = {f"{u}/{s}": {g: mean(a, u, g, s) for g in ranked} for u in users for s in seeds
                          if all(mean(a, u, g, s) is not None for g in ranked)}
            se = metrics.mean_and_se(list(metrics.average(replicates).values()))[1] if replicates else None
            avg[a] = {"mean": m, "se": se}
    return {"agents": list(agents), "users": list(users), "gyms": list(gyms), "seeds": list(seeds),
            "per_gym": per_gym, "avg": avg, "mr": mr, "invalid": invalid, "per_user": per_user,
            "ranked_gyms": ranked}


def _f(x, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def format_table(summary: Mapping) -> str:
    """Per-gym mean +/- SE, Avg, MR and invalid episodes per agent; then each user's per-gym means."""
    gyms, agents = summary["gyms"], summary["agents"]
    width = max([len(a) for a in agents] + [len(u) for u in summary["users"]] + [6]) + 2
    head = f"{'agent':<{width}}" + "".join(f"{g:>16}" for g in gyms) + f"{'Avg':>16}{'MR':>7}{'invalid':>9}"
    rows = [head]
    for a in agents:
        cells = "".join(f"{_f(summary['per_gym'][a][g]['mean']) + '+-' + _f(summary['per_gym'][a][g]['se']):>16}"
                        for g in gyms)
        avg = summary["avg"][a]
        rows.append(f"{a:<{width}}{cells}{_f(avg['mean']) + '+-' + _f(avg['se']):>16}{_f(summary['mr'][a], 2):>7}"
                    f"{sum(summary['invalid'][a].values()):>9}")
    left_out = [g for g in gyms if g not in summary["ranked_gyms"]]
    if left_out:
        rows.append(f"Avg and MR leave out {left_out}: some agent has no valid episode there")
    for u in summary["users"]:
        rows.append(f"\nuser {u}")
        for a in agents:
            rows.append(f"{a:<{width}}" + "".join(f"{_f(summary['per_user'][u][a][g]):>16}" for g in gyms))
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------ command line
def add_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--out", required=True, help="output folder (cells/, matrix.json, summary.json); resumed")
    p.add_argument("--agent", action="append", required=True, metavar="NAME=SPEC",
                   help="an agent: tiny | HF dir | training workdir | http(s)://host:port/v1 (repeatable)")
    p.add_argument("--user", action="append", required=True, metavar="NAME=SPEC",
                   help="an evaluation user: a simulator or any chat model, same spec forms (repeatable)")
    per = " ([NAME=]VALUE, repeatable: NAME= sets one name, a bare value every other)"
    p.add_argument("--agent-model", action="append", default=[], help="remote agent: the served model name" + per)
    p.add_argument("--agent-tokenizer", action="append", default=[],
                   help="tokenizer spec (remote agent: required)" + per)
    p.add_argument("--agent-key-env", action="append", default=[], help="remote: env var with the API key" + per)
    p.add_argument("--agent-max-tokens", type=int, default=512, help="tokens per agent turn")
    p.add_argument("--user-model", action="append", default=[], help="remote user: the served model name" + per)
    p.add_argument("--user-tokenizer", action="append", default=[], help="local user: tokenizer override" + per)
    p.add_argument("--user-key-env", action="append", default=[], help="remote: env var with the API key" + per)
    p.add_argument("--user-style", action="append", default=[],
                   help="simulator | assistant (default: simulator for local models, assistant for remote)" + per)
    p.add_argument("--user-thinking", action="extend", nargs="*", default=None, metavar="NAME",
                   help="local simulators write <think> thought first (no names: every user)")
    p.add_argument("--user-max-tokens", type=int, default=512)
    p.add_argument("--judge", default=None,
                   help="one judge for every user (spec as above; default: each user's model asked as an assistant)")
    p.add_argument("--judge-model", default=None, help="remote judge: the served model name")
    p.add_argument("--judge-key-env", default=None, help="remote judge: env var with the API key")
    p.add_argument("--judge-max-tokens", type=int, default=512)
    p.add_argument("--gyms", default=",".join(GYM_MODULES), help="comma-separated UserRL gyms (default: all eight)")
    p.add_argument("--tasks", nargs="+", default=None, help="task files/folders (default: the shipped split)")
    p.add_argument("--split", choices=("train", "test"), default="test", help="shipped split when no --tasks")
    p.add_argument("--max-tasks", type=int, default=None, help="first N tasks of each gym")
    p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1")
    p.add_argument("--max-turns", type=int, default=16, help="agent turns per episode (paper: 16)")
    p.add_argument("--batch", type=int, default=32, help="episodes run together (one sampler call per turn)")
    p.add_argument("--data-dir", default=None, help="gym data files under UserRL's names (default: shipped)")
    p.add_argument("--retriever", default=None, help="SearchGym backend: bm25:CORPUS.jsonl or http(s)://URL")
    p.add_argument("--retriever-key-env", default=None, help="env var holding the search service's key")
    return p


def _named(values: Sequence[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        name, sep, spec = v.partition("=")
        if not sep or not name or not spec:
            raise EnvError(f"{flag} {v!r}: expected NAME=SPEC")
        if name in out:
            raise EnvError(f"{flag}: name {name!r} is given twice")
        out[name] = spec
    return out


def _per_name(values: Sequence[str], names: Sequence[str], flag: str) -> dict[str, str | None]:
    """[NAME=]VALUE options: NAME= (a declared name) sets that name, a bare value every name not set by name."""
    own: dict[str, str] = {}
    shared = None
    for v in values:
        name, sep, value = v.partition("=")
        if sep and name in names:
            if name in own:
                raise EnvError(f"{flag}: {name!r} is set twice")
            own[name] = value
        elif shared is not None:
            raise EnvError(f"{flag}: two values for every name ({shared!r}, {v!r}); prefix them with NAME=")
        else:
            shared = v
    return {n: own.get(n, shared) for n in names}


def _model_spec(spec: str, flag: str, model_flag: str, *, model_name=None, tokenizer=None, key_env=None,
                max_tokens=512, thinking=False):
    s = ModelSpec(spec, model_name=model_name, tokenizer=tokenizer, api_key_env=key_env, max_tokens=max_tokens,
                  thinking=thinking)
    if not s.remote and spec != "tiny":
        if not os.path.isdir(spec):
            raise EnvError(f"{flag}: {spec!r} is neither tiny, a folder (HF dir / training workdir) nor an http(s) "
                           "URL")
        s.spec = os.path.abspath(spec)
    if s.remote and not model_name:
        raise EnvError(f"{flag}: a remote model needs its served model name ({model_flag})")
    return s


def _record(spec, **extra) -> dict:
    return {**dataclasses.asdict(spec), **extra}


def _entries(args) -> tuple[list[Entry], list[Entry], dict | None]:
    agent_specs, user_specs = _named(args.agent, "--agent"), _named(args.user, "--user")
    an, un = list(agent_specs), list(user_specs)
    a_model = _per_name(args.agent_model, an, "--agent-model")
    a_tok = _per_name(args.agent_tokenizer, an, "--agent-tokenizer")
    a_key = _per_name(args.agent_key_env, an, "--agent-key-env")
    u_model = _per_name(args.user_model, un, "--user-model")
    u_tok = _per_name(args.user_tokenizer, un, "--user-tokenizer")
    u_key = _per_name(args.user_key_env, un, "--user-key-env")
    u_style = _per_name(args.user_style, un, "--user-style")
    thinking = set(un) if args.user_thinking == [] else set(args.user_thinking or ())
    if thinking - set(un):
        raise EnvError(f"--user-thinking names unknown users {sorted(thinking - set(un))}")

    agents = []
    for name, spec in agent_specs.items():
        s = _model_spec(spec, f"--agent {name}", "--agent-model", model_name=a_model[name], tokenizer=a_tok[name],
                        key_env=a_key[name], max_tokens=args.agent_max_tokens)
        if s.remote and not s.tokenizer:
            raise EnvError(f"--agent {name}: a remote agent needs --agent-tokenizer (to decode prompts and encode "
                           "replies)")
        agents.append(Entry(name, _record(s), lambda s=s: specs.agent_from_spec(s)))

    judge_spec, judge_cache = None, []
    if args.judge:
        judge_spec = _model_spec(args.judge, "--judge", "--judge-model", model_name=args.judge_model,
                                 key_env=args.judge_key_env, max_tokens=args.judge_max_tokens)

    def shared_judge():
        if not judge_cache:
            judge_cache.append(specs.chat_model_from_spec(judge_spec, style="assistant"))
        return judge_cache[0]

    users = []
    for name, spec in user_specs.items():
        s = _model_spec(spec, f"--user {name}", "--user-model", model_name=u_model[name], tokenizer=u_tok[name],
                        key_env=u_key[name], max_tokens=args.user_max_tokens, thinking=name in thinking)
        style = u_style[name] or ("assistant" if s.remote else "simulator")
        if style not in ("simulator", "assistant"):
            raise EnvError(f"--user-style {name}: expected simulator or assistant, got {style!r}")
        if judge_spec is None:
            def load(s=s, style=style):
                return specs.user_and_judge(s, None, user_style=style)
        else:
            def load(s=s, style=style):
                return specs.chat_model_from_spec(s, style=style), shared_judge()
        users.append(Entry(name, _record(s, style=style), load))
    return agents, users, None if judge_spec is None else _record(judge_spec)


def load_gym_tasks(gyms: Sequence[str], sources: Sequence[str] | None, split: str,
                   max_tasks: int | None) -> dict[str, list]:
    """gym -> its tasks (file order; the first `max_tasks`), from task files/folders or the shipped split. A gym
    without tasks is an error naming where they were looked for."""
    unknown = [g for g in gyms if g not in GYM_MODULES]
    if unknown:
        raise EnvError(f"--gyms: unknown gyms {unknown}; known: {list(GYM_MODULES)}")
    if max_tasks is not None and max_tasks < 1:
        raise EnvError(f"--max-tasks must be >= 1, got {max_tasks}")
    found = ([t for src in sources for t in load_tasks(src, gyms=gyms)] if sources
             else shipped_tasks(split, gyms))
    out: dict[str, list] = {g: [] for g in gyms}
    for t in found:
        out[t.gym].append(t)
    for g in gyms:
        if not out[g]:
            where = f"the task files {list(sources)}" if sources else f"the shipped {split} split"
            raise EnvError(f"gym {g}: no tasks in {where} (choose --gyms)")
        out[g] = out[g][:max_tasks]
    return out


def run(args) -> int:
    t0 = time.perf_counter()
    try:
        if args.seeds < 1:
            raise EnvError(f"--seeds must be >= 1, got {args.seeds}")
        gyms = [g.strip() for g in args.gyms.split(",") if g.strip()]
        tasks = load_gym_tasks(gyms, args.tasks, args.split, args.max_tasks)
        agents, users, judge = _entries(args)
        config = EvalConfig(max_turns=args.max_turns, agent_max_tokens=args.agent_max_tokens, data_dir=args.data_dir,
                            judge=judge, retriever=args.retriever, batch=args.batch)
        summary = evaluate(args.out, agents, users, tasks, range(args.seeds), config,
                           retriever=retriever_from_option(args.retriever, args.retriever_key_env))
    except (EnvError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(summary))
    print(f"{len(agents)} agent(s) x {len(users)} user(s) x {len(gyms)} gym(s) x {args.seeds} seed(s) in "
          f"{time.perf_counter() - t0:.1f} s -> {os.path.join(args.out, SUMMARY_FILE)}")
    return 0
