"""PersuadeGym (docs/reference/environments.md, "The gyms"): talk the user out of a claim it holds.

The user model plays a *persuadee* who starts at "Strongly Agree" with a claim and the argument it gave for it
(one record of UserRL's `all_statements_refined.json`: `{"id", "claim", "argument"}`). Each agent step sends one
persuasive argument; the persuadee answers with a JSON object `{"thought", "response", "stance"}` where the stance
is one of the seven levels

    Strongly Agree, Agree, Partly Agree, Neutral, Partly Disagree, Disagree, Strongly Disagree.

Rules, as UserRL's PersuadeGym computes them:

* **reward** per step = levels moved toward disagreement *relative to the previous step's stance* (not the best
  stance so far): moved <= 0 -> 0.0; moved >= 6 -> 1.0; else `round(moved / 6, 6)` (0.166667, 0.333333, 0.5,
  0.666667, 0.833333), then clipped to [0, 1] (UserRL's `normalize_rewards`; step penalty 0). Moving back toward
  agreement gives 0 and lowers the reference for the next step, so regained ground is rewarded again.
* **termination**: the step whose new stance is "Strongly Disagree"; truncation after `max_steps` (default 15,
  UserRL's `InteractTool.create(max_turns=15)`; its gym's config default is 20; the training/eval runs use 16
  turns, docs/reference/environments.md).
* **choices**: UserRL sends every action to the persuadee. `[action] x` and `[answer] x` pass the argument `x`;
  `[search] x` passes the text *with* its prefix, `"[search] x"` (UserRL strips only the action/answer prefixes).
  The task prompt advertises only `answer`.
* **what the agent sees**: only the persuadee's `response` (the step feedback). The JSON `thought` is private and
  goes to `info["user_thought"]` (with any `<think>` block of the user model before it); the stance goes to
  `info["stance"]`, never to the feedback.
* The persuadee prompt is stateless, as UserRL's: each step one system + one user message carrying the claim, the
  initial argument, the previous stance, the whole exchange so far and the latest argument.

Choices where UserRL is silent, lenient or unreachable here (written down, as the brief asks):

* An unparseable persuadee answer (no JSON object, no non-empty string `response`, or a `stance` outside the seven
  levels) is asked again once with the same prompt; a second failure is an INVALID episode (`InvalidEpisode`).
  UserRL instead shows a canned could-not-understand reply with reward 0 and, for an unknown stance string,
  stores it so that every later step scores 0. Stances are matched ignoring case and extra whitespace. This retry
  is a gym-local helper (`_ask_persuadee`, a loop around `ask_user`) since `ask_parsed` is for judges and records
  no user turn. A refusal (chat/refusal.py) is INVALID at once, without a retry.
* A failing user model is INVALID (common.call_model), not UserRL's canned reply.
* UserRL's `[finish]` action cannot be sent through `interact_with_env` (choices action/answer/search only).
* The record is selected by the task's `id`; the create arguments `claim`/`argument` are ignored in favour of the
  data file, as UserRL's environment manager does. A `max_turns` create argument (UserRL's tool option) sets the
  step limit when `max_steps` is not given.
"""

from __future__ import annotations

import re

from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.model_io import field, parse_json_object
from mimesis_jax.envs.userrl.common import (USERRL_TOOL_MAX_TURNS, UserRLEnv, build_gym, data_file, index_records,
                                            read_json)
from mimesis_jax.envs.userrl.tasks import register_gym

DATA_FILE = "all_statements_refined.json"
STANCES = ("Strongly Agree", "Agree", "Partly Agree", "Neutral", "Partly Disagree", "Disagree", "Strongly Disagree")
INITIAL_STANCE = STANCES[0]
FINAL_STANCE = STANCES[-1]
_STANCE_KEYS = {s.lower(): s for s in STANCES}


# ------------------------------------------------------------------------------------ rules
def levels_moved(previous: str, current: str) -> int:
    """Levels from `previous` to `current` on the 7-point scale; positive = toward disagreement."""
    return STANCES.index(current) - STANCES.index(previous)


def persuasion_reward(previous: str, current: str) -> float:
    """UserRL's step reward: max(0, levels moved) / 6 rounded to 6 places, 1.0 from 6 levels on, in [0, 1]."""
    moved = levels_moved(previous, current)
    if moved <= 0:
        reward = 0.0
    elif moved >= 6:
        reward = 1.0
    else:
        reward = round(moved / 6, 6)
    return max(0.0, min(1.0, reward))


def canonical_stance(value) -> str:
    """One of STANCES from the persuadee's stance text (case and whitespace tolerated); ValueError otherwise."""
    if not isinstance(value, str):
        raise ValueError(f"'stance' must be a string, got {type(value).__name__}")
    key = re.sub(r"\s+", " ", value).strip().strip(".").lower()
    if key not in _STANCE_KEYS:
        raise ValueError(f"'stance' {value!r} is not one of {list(STANCES)}")
    return _STANCE_KEYS[key]


def parse_persuadee(text: str) -> dict:
    """The persuadee's JSON answer -> {"thought": str | None, "response": str, "stance": canonical stance}."""
    obj = parse_json_object(text)
    response = obj.get("response")
    if not isinstance(response, str) or not response.strip():
        raise ValueError("the answer has no non-empty string 'response'")
    if "stance" not in obj:
        raise ValueError("the answer has no 'stance'")
    thought = obj.get("thought")
    return {"thought": thought.strip() if isinstance(thought, str) and thought.strip() else None,
            "response": response.strip(), "stance": canonical_stance(obj["stance"])}


# ------------------------------------------------------------------------------------ data
def validate_statement(record, where: str) -> dict:
    """A statement record {id, claim, argument}; errors name `where` (file and record) and the field."""
    sid = field(record, "id", (str, int), where)
    claim = field(record, "claim", str, where)
    argument = field(record, "argument", str, where)
    if not str(sid).strip():
        raise EnvError(f"{where}: field 'id' is empty")
    if not claim.strip():
        raise EnvError(f"{where}: field 'claim' is empty")
    if not argument.strip():
        raise EnvError(f"{where}: field 'argument' is empty")
    return {"id": str(sid), "claim": claim, "argument": argument}


def load_statements(path) -> dict[str, dict]:
    """{id: statement} of a UserRL `all_statements_refined.json` (a list of {id, claim, argument}), validated."""
    records = read_json(path)
    table = index_records(records, "id", str(path))
    return {key: validate_statement(rec, f"{path}, record {i} (id {key!r})")
            for i, (key, rec) in enumerate(table.items())}


# ------------------------------------------------------------------------------------ the gym
@register_gym("PersuadeGym")
class PersuadeEnv(UserRLEnv):
    """Persuade the user model away from `statement["claim"]` (module docstring for the rules)."""

    prompt_file = "persuade"
    default_max_steps = USERRL_TOOL_MAX_TURNS  # what UserRL's InteractTool passes, not the gym config's own default

    def __init__(self, statement: dict, *, user=None, judge=None, max_steps: int | None = None, **options):
        super().__init__(user=user, judge=judge, max_steps=max_steps, **options)
        self.statement = validate_statement(statement, f"{self.name} statement")
        self.stance = INITIAL_STANCE
        self.best_level = 0
        self.history: list[tuple[str, str]] = []  # (argument as the persuadee read it, its public response)

    # -------------------------------------------------------------- episode
    def _reset(self):
        self.stance = INITIAL_STANCE
        self.best_level = 0
        self.history = []
        feedback = self.prompt("welcome", stance=self.stance.lower(), claim=self.statement["claim"],
                               argument=self.statement["argument"])
        return feedback, {"statement_id": self.statement["id"], "initial_stance": self.stance}

    def _action(self, content: str):
        return self._persuade(content)

    def _answer(self, content: str):
        return self._persuade(content)

    def _search(self, content: str):
        return self._persuade(f"[search] {content}".strip())  # UserRL keeps this prefix in the argument

    def _persuade(self, argument: str):
        reply = self._ask_persuadee(self._persuadee_messages(argument))
        previous, current = self.stance, reply["stance"]
        reward = persuasion_reward(previous, current)
        self.stance = current
        self.best_level = max(self.best_level, STANCES.index(current))
        self.history.append((argument, reply["response"]))
        info = {"previous_stance": previous, "stance": current, "levels_moved": levels_moved(previous, current),
                "best_stance": STANCES[self.best_level]}
        return reply["response"], reward, current == FINAL_STANCE, info

    # -------------------------------------------------------------- the persuadee
    def _persuadee_messages(self, argument: str) -> list[dict]:
        if self.history:
            history = "\n\n".join(self.prompt("history_entry", turn=i, argument=a, response=r)
                                  for i, (a, r) in enumerate(self.history, 1))
        else:
            history = self.prompt("history_empty")
        user = self.prompt("persuadee_turn", claim=self.statement["claim"], argument=self.statement["argument"],
                           stance=self.stance, history=history, latest=argument, stances=", ".join(STANCES))
        return [{"role": "system", "content": self.prompt("persuadee_system", stances=", ".join(STANCES))},
                {"role": "user", "content": user}]

    def _ask_persuadee(self, messages: list[dict]) -> dict:
        """The persuadee's parsed answer: asked once more when it does not parse, then INVALID. Only `response`
        becomes the turn's public utterance; the JSON thought (after any <think> thought) stays private."""
        errors = []
        for _ in range(2):
            raw = self.ask_user(messages)  # a refusal or a failed call raises InvalidEpisode here
            try:
                reply = parse_persuadee(raw)
            except ValueError as e:
                errors.append(str(e))
                continue
            thoughts = [t for t in (self.user_turn.get("user_thought"), reply["thought"]) if t]
            self.set_user_turn("\n\n".join(thoughts) if thoughts else None, reply["response"])
            return reply
        self.clear_user_turn()
        raise InvalidEpisode(f"{self.name}: the persuadee's answer did not parse twice: {errors[-1]}")

    # -------------------------------------------------------------- construction
    @classmethod
    def from_task(cls, task, *, data_dir=None, user=None, judge=None, retriever=None, seed=None, max_steps=None,
                  **options) -> "PersuadeEnv":
        path = data_file(DATA_FILE, data_dir)
        statements = load_statements(path)
        key = str(task.create_kwargs.get("id", task.id))
        if key not in statements:
            raise EnvError(f"{path}: no statement with id {key!r} (task {task.source or task.id})")
        if max_steps is None and task.create_kwargs.get("max_turns") is not None:
            max_steps = int(task.create_kwargs["max_turns"])
        return build_gym(cls, options, statements[key], user=user, judge=judge, seed=seed, max_steps=max_steps)
