"""TelepathyGym: twenty questions -- guess the entity the user has in mind (docs/reference/environments.md, the gym table;
UserRL's TelepathyGym, an evaluation-only gym here).

Rules, as UserRL's `TelepathyEnv` with the create arguments of its `env_manager` (read there, written here in this
project's own code):

* `[action] <question>` -- the user (this gym's user model, `ask_user`) sees only the record's `target_entity` and
  answers the question, asked to say Yes / No / Maybe. Each question is a fresh, stateless call (UserRL builds a
  clue history but leaves it out of its prompts). The answer is the step's feedback verbatim (UserRL does not check
  it against Yes/No/Maybe); a JSON answer `{"thought", "response"}` shows its `response` and keeps the thought
  private, a JSON answer without a `response` text is a failed user turn (INVALID). Reward: the shaped 0 (below).
* `[answer] <guess>` -- the judge (`ask_parsed`, role "judge") sees the target entity and the guess and returns
  `{"thought", "judgment", "feedback"}`; score = 1.0 when the judgment is "Yes", else 0.0. Base reward =
  max(0, score - best so far), the best then raised (so only the first correct guess earns 1.0). A correct guess
  terminates the episode; a wrong guess gets reward 0 and the episode goes on (the agent may guess again). The
  feedback is the judge's `feedback` text.
* shaping (UserRL's config defaults): reward = base * reward_scale (1.0) - step_penalty (0.0) * step_count, then,
  with normalize_rewards (True), clipped to [0, 1]. Every step is shaped, questions included.
* `[search] <text>` -- UserRL has no search here, but its step sends everything that is not `[answer]`/`[finish]`
  to the user with the 8-character prefix cut off, so a `[search]` is answered as a question. Kept (it is left out
  of the clue history, as UserRL).
* the turn limit is 15, UserRL's `InteractTool.create(max_turns=15)` (its gym's
  own config default is 20); `max_turns` in the create arguments or `max_steps` override it.
* the task is selected by its `title` (create arguments `title`, `category`): the first record, in file order, whose
  `title` or `id` equals it case-insensitively (UserRL's get_entity_by_title). `category`, `description` and `goal`
  are not used by the env (they shape the agent's task text).

Choices where UserRL is ambiguous or failure-prone (recorded here):
* Judge answers: UserRL counts only the exact string "Yes" as correct and shows a fixed could-not-evaluate text
  with reward 0 when the answer does not parse or lacks `judgment`/`feedback`. Here `judgment` must be a string
  that reads yes or no (case and a trailing full stop or exclamation mark ignored) and `feedback` a string; anything
  else is asked again once, then the episode is INVALID (project rule: failures are never a reward 0). An empty
  feedback is replaced by a short fixed text.
* UserRL's `[finish]` choice (ends with reward 0) is not part of this project's tool and is not implemented; text
  without a known prefix gets the invalid-action answer with reward 0.
* The user's messages follow the gyms' user-model convention (envs/userrl/common.py): system = the role and the
  target entity, then the agent's question as a `user` message; the user answers as `assistant`.
"""

from __future__ import annotations

import functools
import pathlib

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.model_io import field, parse_json_object
from mimesis_jax.envs.userrl.common import (USERRL_TOOL_MAX_TURNS, UserRLEnv, build_gym, data_file, index_records,
                                            read_json)
from mimesis_jax.envs.userrl.tasks import register_gym
from mimesis_jax.envs.userrl.turtle import check_shaping, host_answer, shaped_reward, turn_limit

ENTITY_FILE = "all_entities_refined.json"
ENTITY_FIELDS = ("id", "title", "description", "goal", "target_entity", "category")
RESET_FEEDBACK = ("TelepathyGym: there is a secret entity on my mind. Narrow it down with questions I can answer "
                  "Yes, No or Maybe, and give your answer when you want to name it.")


# ------------------------------------------------------------------------------------ data
@functools.lru_cache(maxsize=8)
def _entities(path: str, mtime: float) -> tuple[dict, ...]:
    raw = read_json(path)
    index_records(raw, "id", path)  # a list of records with unique ids
    out = []
    for i, rec in enumerate(raw):
        where = f"{path}, record {i}"
        out.append({key: field(rec, key, str, where) for key in ENTITY_FIELDS})
        if not out[-1]["target_entity"].strip():
            raise EnvError(f"{where}: field 'target_entity' is empty")
    return tuple(out)


def load_entities(path) -> list[dict]:
    """UserRL's entity file (a list of {id, title, description, goal, target_entity, category}), validated."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise EnvError(f"data file {p} does not exist")
    return list(_entities(str(p), p.stat().st_mtime))


def find_entity(entities: list[dict], title: str, path) -> dict:
    """The first entity whose title or id matches `title` case-insensitively (UserRL's get_entity_by_title)."""
    wanted = str(title).lower()
    for entity in entities:
        if entity["title"].lower() == wanted or entity["id"].lower() == wanted:
            return entity
    raise EnvError(f"{path}: no entity with title or id {title!r} (TelepathyGym task id)")


# ------------------------------------------------------------------------------------ judge answers
def parse_verdict(text: str) -> tuple[bool, str]:
    """(correct, feedback) from the judge's {"judgment": "Yes"|"No", "feedback": ...}; ValueError otherwise."""
    obj = parse_json_object(text)
    judgment, feedback = obj.get("judgment"), obj.get("feedback")
    if not isinstance(judgment, str):
        raise ValueError("the answer has no 'judgment' text")
    verdict = judgment.strip().rstrip(".!").strip().lower()
    if verdict not in ("yes", "no"):
        raise ValueError(f"'judgment' must be Yes or No, got {judgment!r}")
    if not isinstance(feedback, str):
        raise ValueError("the answer has no 'feedback' text")
    return verdict == "yes", feedback.strip()


# ------------------------------------------------------------------------------------ the gym
@register_gym("TelepathyGym")
class TelepathyGym(UserRLEnv):
    """One entity to guess: Yes/No questions to the user, judged guesses (rules: module docstring)."""

    prompt_file = "telepathy"
    default_max_steps = USERRL_TOOL_MAX_TURNS  # what UserRL's InteractTool passes, not the gym config's own default
    invalid_action_feedback = ("Invalid action. Call interact_with_env with choice 'action' and a Yes-or-No question, "
                               "or choice 'answer' and your guess of the entity.")

    def __init__(self, entity: dict, *, user=None, judge=None, max_steps=None, reward_scale: float = 1.0,
                 step_penalty: float = 0.0, normalize_rewards: bool = True, max_tokens: int | None = 2048, **kwargs):
        super().__init__(user=user, judge=judge, max_steps=max_steps, max_tokens=max_tokens, **kwargs)
        for key in ("title", "target_entity"):
            if key not in entity:
                raise EnvError(f"{self.name}: the entity has no {key!r} (use load_entities)")
        check_shaping(self.name, reward_scale, step_penalty)
        self.entity = entity
        self.reward_scale, self.step_penalty = reward_scale, step_penalty
        self.normalize_rewards = bool(normalize_rewards)
        self.best_score = 0.0
        self.clue_history: list[tuple[str, str]] = []

    # -------------------------------------------------------------- protocol
    def _reset(self):
        self.best_score, self.clue_history = 0.0, []
        info = {"title": self.entity["title"], "category": self.entity.get("category", "")}
        return RESET_FEEDBACK, info

    def _reward(self, base: float) -> float:
        return shaped_reward(base, self.step_count, reward_scale=self.reward_scale, step_penalty=self.step_penalty,
                             normalize=self.normalize_rewards)

    def _ask(self, content: str) -> str:
        messages = [{"role": "system", "content": self.prompt("user_system",
                                                                target_entity=self.entity["target_entity"])},
                    {"role": "user", "content": self.prompt("user_question", question=content)}]
        return host_answer(self, self.ask_user(messages))

    def _action(self, content: str):
        reply = self._ask(content)
        self.clue_history.append((content, reply))
        return reply, self._reward(0.0), False, {"question": content, "best_score": self.best_score}

    def _search(self, content: str):
        reply = self._ask(content)  # UserRL answers a [search] as a question (module docstring)
        return reply, self._reward(0.0), False, {"question": content, "best_score": self.best_score}

    def _answer(self, content: str):
        messages = [{"role": "system", "content": self.prompt("judge_system")},
                    {"role": "user", "content": self.prompt("judge_user", target_entity=self.entity["target_entity"],
                                                            guess=content)}]
        correct, feedback = self.ask_parsed(self.judge, messages, parse_verdict, role="judge")
        score = 1.0 if correct else 0.0
        base = max(0.0, score - self.best_score)
        self.best_score = max(self.best_score, score)
        if not feedback:
            feedback = "That is correct!" if correct else "That is not it. Keep trying!"
        self.clue_history.append((content, feedback))
        info = {"guess": content, "correct": correct, "score": score, "best_score": self.best_score}
        return feedback, self._reward(base), correct, info

    # -------------------------------------------------------------- construction
    @classmethod
    def from_task(cls, task, *, data_dir=None, user=None, judge=None, retriever=None, seed=None, max_steps=None,
                  **options) -> "TelepathyGym":
        path = data_file(ENTITY_FILE, data_dir)
        title = task.create_kwargs.get("title", task.id)
        entity = find_entity(load_entities(path), title, path)
        limit = turn_limit(cls.name, task, max_steps)
        return build_gym(cls, options, entity, user=user, judge=judge, seed=seed, max_steps=limit)
