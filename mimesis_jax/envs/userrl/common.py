"""What every UserRL gym shares: the base env, calls to its other side, prompt templates, data files, named errors.

The other side of a gym -- the user (the frozen simulator, in-process or over HTTP), the judge and the classifier
-- is any `ChatModel` (chat/base.py), called by the gym itself inside `step` as UserRL's gyms call their
OpenAI-compatible endpoint, at temperature 0 by default. Each role's prompt is a template stored as data next to
the gyms (`prompts/<gym>.toml`, `string.Template` placeholders `$name`), never buried in code.

Talking to the user model: a gym asks it for the user's reply the way any chat endpoint is asked for a role-played
reply -- system = the role and what the user privately knows, the gym/agent side as `user` messages, the simulated
user's earlier replies as `assistant` -- so a remote assistant model (UserRL's baselines) answers correctly as is.
A MIMESIS simulator, which writes `user` turns in its own framing, is wrapped in `rollout.base.SimulatorAsResponder`
(the `rollout` command and the RL stages do this for local simulators), which swaps the two roles.

Failure rules (docs/reference/paper.md 4.3, docs/reference/metrics.md): a user model that refuses its role (chat/refusal.py) or any model
call that fails raises `InvalidEpisode`, and the episode runner marks the episode INVALID with the reason -- never
a reward of 0. A judge/classifier answer that does not parse is asked again once (same prompt); a second failure is
INVALID too.

Thoughts: a user model that writes `<think>thought</think> utterance` (the MIMESIS simulator with thinking on)
has its thought kept private: only the utterance reaches the agent's feedback, and the thought is reported in the
step's `info["user_thought"]` for the CSD coach (Eq 7).
"""

from __future__ import annotations

import functools
import os
import pathlib
import random
from typing import Any, Callable, Sequence

from mimesis_jax.data import jsonio
from mimesis_jax.envs.agent_env import Env, EnvError, InvalidEpisode, StepResult, parse_action
from mimesis_jax.chat.base import Message
from mimesis_jax.chat.thoughts import response_thought, split_thought
from mimesis_jax.chat.refusal import RefusalDetector
from mimesis_jax.envs.model_io import call_model, field, fill, load_templates

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
DATA_DIR = PACKAGE_DIR / "data"  # the project's own small gym data files, under UserRL's file names
TASKS_DIR = PACKAGE_DIR / "tasks"  # the project's own task files (verl row schema, JSONL)
PROMPTS_DIR = PACKAGE_DIR / "prompts"


# ------------------------------------------------------------------------------------ prompts
def load_prompts(gym_file: str) -> dict[str, str]:
    """The templates of one gym: `prompts/<gym_file>.toml`, a table of name -> template text."""
    return load_templates(PROMPTS_DIR / f"{gym_file}.toml")


# ------------------------------------------------------------------------------------ data files
def data_file(name: str, data_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """The gym data file `name` (UserRL's own file name) in `data_dir` (default: the shipped files).

    `data_dir` may hold the file directly or anywhere below it (e.g. a checkout of UserRL's `gyms/` folder)."""
    root = DATA_DIR if data_dir is None else pathlib.Path(data_dir)
    if not root.is_dir():
        raise EnvError(f"gym data folder {root} does not exist")
    direct = root / name
    if direct.is_file():
        return direct
    found = sorted(root.rglob(name))
    if not found:
        raise EnvError(f"gym data file {name!r} not found in {root}")
    return found[0]


@functools.lru_cache(maxsize=64)
def _read_json(path: str, mtime: float) -> Any:
    return jsonio.read_json(path, error=EnvError)


def read_json(path: str | os.PathLike) -> Any:
    """A JSON data file, parsed once per process (cached on path + modification time); errors name the file."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise EnvError(f"data file {p} does not exist")
    return _read_json(str(p), p.stat().st_mtime)


def build_gym(cls, options: dict, *args, **kwargs):
    """`cls(*args, **kwargs, **options)` for a gym's `from_task`: an option the gym does not take (a TypeError
    from its constructor) is an EnvError naming the gym and the caller's options, not a traceback."""
    try:
        return cls(*args, **kwargs, **options)
    except TypeError as e:
        raise EnvError(f"{cls.name}: bad options {sorted(options)} ({e})") from None


def index_records(records, key: str, where: str) -> dict[str, dict]:
    """{record[key]: record} for a list of records; duplicate or missing keys are errors naming the row."""
    if not isinstance(records, list):
        raise EnvError(f"{where}: expected a list of records, got {type(records).__name__}")
    out: dict[str, dict] = {}
    for i, r in enumerate(records):
        k = field(r, key, (str, int), f"{where}, record {i}")
        if str(k) in out:
            raise EnvError(f"{where}, record {i}: duplicate {key} {k!r}")
        out[str(k)] = r
    return out


# ------------------------------------------------------------------------------------ the base env
# UserRL's training path creates every gym through `InteractTool.create(instance_id, env_name, max_turns=15, ...)`
# (verl/tools/interact_tool.py); its task rows carry no `max_turns`, so 15 is the limit a tool-created env gets
# unless the rollout config overrides it (UserRL's own train.sh passes multi_turn.max_turns=16).
USERRL_TOOL_MAX_TURNS = 15

class UserRLEnv(Env):
    """Base of the eight gyms: step counting, the `[action]/[answer]/[search]` dispatch, truncation at
    `max_steps`, and the calls to the user / judge / classifier models.

    Subclasses set `name` (the UserRL env name), `prompt_file`, `default_max_steps`, implement
    `_reset() -> (feedback, info)` and the handlers `_action/_answer/_search(content) -> (feedback, reward,
    terminated, info)` for the choices they allow (others answer `choice_not_allowed`), and a classmethod
    `from_task(task, *, data_dir, user, judge, retriever, seed, max_steps)`.
    """

    name = "userrl"
    prompt_file = ""
    default_max_steps = 20
    invalid_action_feedback = ("That step was not understood: call interact_with_env with choice 'action', 'answer' "
                               "or 'search' as the environment description says.")

    def __init__(self, *, user=None, judge=None, max_steps: int | None = None, temperature: float | None = 0.0,
                 max_tokens: int | None = 1024, user_thinking: bool = False, refusal_rules=None, seed=None):
        self.user, self.judge = user, judge
        self.max_steps = int(self.default_max_steps if max_steps is None else max_steps)
        if self.max_steps < 1:
            raise EnvError(f"{self.name}: max_steps must be >= 1, got {self.max_steps}")
        self.temperature, self.max_tokens, self.user_thinking = temperature, max_tokens, user_thinking
        self.refusal = RefusalDetector(refusal_rules)
        self.seed = seed
        self.rng = random.Random(seed)
        self.step_count = 0
        self.done = False
        self._turn_user: dict[str, str | None] = {}

    # -------------------------------------------------------------- templates
    def prompt(self, key: str, **values) -> str:
        table = load_prompts(self.prompt_file)
        if key not in table:
            raise EnvError(f"prompt file {PROMPTS_DIR / (self.prompt_file + '.toml')}: no template {key!r}")
        return fill(table[key], f"{self.prompt_file}.{key}", **values)

    # -------------------------------------------------------------- other sides
    def ask_user(self, messages: Sequence[Message], *, role: str = "user") -> str:
        """The user model's public utterance; its private thought goes to this step's info (CSD coach)."""
        r = call_model(self.user, messages, role, temperature=self.temperature, max_tokens=self.max_tokens)
        thought, utterance = response_thought(r, thinking=self.user_thinking)
        reason = self.refusal.check(utterance, thought)
        if reason is None and not utterance:
            reason = f"{role} turn has no utterance (finish_reason={r.finish_reason})"
        if reason is not None:
            raise InvalidEpisode(f"{self.name}: {reason}")
        self._turn_user = {"user_thought": thought, "user_utterance": utterance}
        return utterance

    @property
    def user_turn(self) -> dict[str, str | None]:
        """This step's user turn so far: {"user_thought", "user_utterance"}, or {} when the user was not asked."""
        return dict(self._turn_user)

    def clear_user_turn(self) -> None:
        self._turn_user = {}

    def set_user_turn(self, thought: str | None, utterance: str | None) -> None:
        """Overrides what this step reports as the user's private thought and public utterance (for gyms whose
        user answers in a structured form, e.g. JSON {thought, response})."""
        self._turn_user = {"user_thought": thought, "user_utterance": utterance}

    def ask_parsed(self, model, messages: Sequence[Message], parse: Callable[[str], Any], *, role: str = "judge"):
        """A judge/classifier answer through `parse` (raises ValueError on a bad answer); one retry, then INVALID."""
        errors = []
        for _ in range(2):
            r = call_model(model, messages, role, temperature=self.temperature, max_tokens=self.max_tokens)
            _, visible = split_thought(r.text)
            try:
                return parse(visible or "")
            except (ValueError, KeyError, TypeError) as e:
                errors.append(f"{e}")
        raise InvalidEpisode(f"{self.name}: the {role}'s answer did not parse twice: {errors[-1]}")

    # -------------------------------------------------------------- protocol
    def reset(self, seed=None):
        if seed is not None:
            self.rng = random.Random(seed)
        self.step_count, self.done, self._turn_user = 0, False, {}
        feedback, info = self._reset()
        return {"feedback": feedback}, info

    def step(self, action_text: str) -> StepResult:
        if self.done:
            raise EnvError(f"{self.name}: the episode has ended; call reset() first")
        self.step_count += 1
        self._turn_user = {}
        parsed = parse_action(action_text)
        if parsed is None:
            feedback, reward, terminated, info = self.invalid_action_feedback, 0.0, False, {
                "invalid_action": "no [action]/[answer]/[search] prefix"}
        else:
            choice, content = parsed
            handler = getattr(self, f"_{choice}", None)
            if handler is None:
                feedback, reward, terminated, info = self.choice_not_allowed(choice), 0.0, False, {
                    "invalid_action": f"choice {choice!r} is not allowed in {self.name}"}
            else:
                feedback, reward, terminated, info = handler(content)
        return self._finish(feedback, reward, terminated, info)

    def invalid_action(self, reason: str) -> StepResult:
        if self.done:
            raise EnvError(f"{self.name}: the episode has ended; call reset() first")
        self.step_count += 1
        self._turn_user = {}
        return self._finish(self.invalid_action_feedback, 0.0, False, {"invalid_action": reason})

    def choice_not_allowed(self, choice: str) -> str:
        return self.invalid_action_feedback

    def _finish(self, feedback: str, reward: float, terminated: bool, info: dict) -> StepResult:
        truncated = not terminated and self.step_count >= self.max_steps
        self.done = bool(terminated or truncated)
        info = {**info, "step": self.step_count, "to_user": None, **self._turn_user}
        return {"feedback": feedback}, float(reward), bool(terminated), bool(truncated), info

    # -------------------------------------------------------------- to implement
    def _reset(self) -> tuple[str, dict]:
        raise NotImplementedError

    @classmethod
    def from_task(cls, task, *, data_dir=None, user=None, judge=None, retriever=None, seed=None, max_steps=None,
                  **options) -> "UserRLEnv":
        raise NotImplementedError
