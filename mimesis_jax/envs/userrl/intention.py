"""IntentionGym (docs/reference/environments.md, "The gyms"; evaluation only): uncover the missing details of a vague request.

A task (one record of UserRL's `all_intentions_train.json` / `all_intentions_test.json`: `{"id", "category",
"task", "missing_details": [{"description", "importance", "inquiry", "options"}]}`, importance 1-3, stored as a
number or a digit string) is a vague request with hidden missing details. Each agent step is a clarifying question
that goes to two other sides, in this order:

1. the **responder** (the user model, `ask_user`): plays the person who made the request and answers the
   question. It sees the request text, its category, the last 3 exchanges and the question -- *not* the missing
   details. It answers JSON `{"thought", "response"}`; only `response` reaches the agent (the step feedback), the
   thought goes to `info["user_thought"]`. A reply with no JSON object at all is taken whole as the response
   (UserRL's fallback).
2. the **evaluator** (the judge, `ask_parsed`): sees the request, the *still uncovered* details numbered from 0
   (importance label and example inquiry), the last 3 exchanges and the question, and returns JSON
   `{"analysis", "is_task_related", "covered_detail_indices"}`.

Rules, as UserRL's IntentionGym computes them:

* indices refer to the still-uncovered details; out-of-range indices and items that are not non-negative integers
  (or digit strings) are ignored; `is_task_related` false (any falsy value) means nothing is covered;
* **reward** = by the highest importance among the details covered by this question, {3: 1.0, 2: 0.7, 1: 0.4};
  when it covers n > 1 details, minus 0.2 x (n - 1) floored at 0 (`max(0.0, base - 0.2 * (n - 1))`, plain float
  arithmetic, no rounding: 0.7 - 0.2 = 0.49999999999999994 as in UserRL); then clipped to [0, 1] (step penalty
  0, scale 1). Only newly covered details count -- covered ones leave the list the evaluator sees;
* **termination**: the step after which no detail is left; truncation after `max_steps` (default 15, UserRL's
  `InteractTool.create(max_turns=15)`; IntentionEnv's own config default is 20).
* **choices**: UserRL treats every action as a question. `[action] x` / `[answer] x` ask `x`; `[search] x` asks
  `"[search] x"` with its prefix (UserRL strips only the action/answer prefixes). The task prompt advertises only
  `action`.

Choices where UserRL is lenient, ambiguous or differs (written down, as the brief asks):

* UserRL's responder prompt formats the WHOLE task record into "ORIGINAL TASK REQUEST", so in practice its responder
  does see the missing details (with their options), although its code comment says it must not. Here the
  responder sees only the request text and category (docs/reference/environments.md: "a responder that does not see the missing
  details"); `responder_sees_record=True` reproduces UserRL's behaviour by putting the record (JSON) in its place.
* The evaluator answer must be a JSON object with a `covered_detail_indices` list; otherwise it is asked again
  once, then the episode is INVALID (UserRL counts an unparseable evaluator answer as "nothing covered").
* A responder JSON object without a non-empty string `response` is asked again once, then INVALID (UserRL shows an
  empty reply); a refusal is INVALID at once; a failing model is INVALID (UserRL shows a canned reply).
* A detail index repeated in one evaluator answer counts once (UserRL would count the detail twice, and penalise it).
* At the step limit with details left the step is `truncated` (UserRL reports terminated and truncated both true);
  the episode ends at the same step either way.
* History lines hold the question as asked, without the `[action]` prefix UserRL leaves in them.
* UserRL's `[finish]` action cannot be sent through `interact_with_env`.
* The task is found by `id` in the train file, then the test file (as UserRL merges them); a `max_turns` create
  argument sets the step limit when `max_steps` is not given.
"""

from __future__ import annotations

import json

from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.model_io import field, parse_json_object
from mimesis_jax.envs.userrl.common import (USERRL_TOOL_MAX_TURNS, UserRLEnv, build_gym, data_file, index_records,
                                            read_json)
from mimesis_jax.envs.userrl.tasks import register_gym

DATA_FILES = ("all_intentions_train.json", "all_intentions_test.json")  # UserRL's lookup order
IMPORTANCE_REWARD = {3: 1.0, 2: 0.7, 1: 0.4}
DEFAULT_IMPORTANCE_REWARD = 0.4
MULTI_DETAIL_PENALTY = 0.2
IMPORTANCE_LABEL = {1: "LOW", 2: "MEDIUM", 3: "HIGH"}
HISTORY_WINDOW = 3  # exchanges shown to the responder and the evaluator


# ------------------------------------------------------------------------------------ rules
def coverage_reward(importances: list[int]) -> float:
    """UserRL's step reward for the details newly covered by one question (their importances)."""
    if not importances:
        return 0.0
    reward = IMPORTANCE_REWARD.get(max(importances), DEFAULT_IMPORTANCE_REWARD)
    if len(importances) > 1:
        reward = max(0.0, reward - MULTI_DETAIL_PENALTY * (len(importances) - 1))
    return max(0.0, min(1.0, reward))


def parse_coverage(text: str) -> list[int]:
    """The evaluator's JSON answer -> the indices it marks as covered ([] when not task related)."""
    obj = parse_json_object(text)
    if "covered_detail_indices" not in obj:
        raise ValueError("the answer has no 'covered_detail_indices'")
    raw = obj["covered_detail_indices"]
    if not isinstance(raw, list):
        raise ValueError(f"'covered_detail_indices' must be a list, got {type(raw).__name__}")
    if not obj.get("is_task_related", True):
        return []
    out = []
    for item in raw:
        if isinstance(item, bool):
            continue
        if isinstance(item, int) and item >= 0:
            out.append(item)
        elif isinstance(item, str) and item.isdigit():
            out.append(int(item))
    return out


def parse_responder(text: str) -> dict:
    """The responder's answer -> {"thought", "response"}: its JSON object, or the whole text when it has none."""
    try:
        obj = parse_json_object(text)
    except ValueError:
        return {"thought": None, "response": text.strip()}
    response = obj.get("response")
    if not isinstance(response, str) or not response.strip():
        raise ValueError("the answer's JSON object has no non-empty string 'response'")
    thought = obj.get("thought")
    return {"thought": thought.strip() if isinstance(thought, str) and thought.strip() else None,
            "response": response.strip()}


# ------------------------------------------------------------------------------------ data
def importance_of(detail, where: str) -> int:
    value = field(detail, "importance", (int, str), where)
    if isinstance(value, str) and not value.strip().isdigit():
        raise EnvError(f"{where}: field 'importance' is {value!r}, not one of 1, 2, 3")
    level = int(value)
    if level not in (1, 2, 3):
        raise EnvError(f"{where}: field 'importance' is {value!r}, not one of 1, 2, 3")
    return level


def validate_intention(record, where: str) -> dict:
    """A task record; errors name `where` (file and record) and the field. Returns a normalised copy."""
    tid = field(record, "id", (str, int), where)
    task = field(record, "task", str, where)
    if not task.strip():
        raise EnvError(f"{where}: field 'task' is empty")
    category = field(record, "category", str, where, optional=True, default="General")
    details = field(record, "missing_details", list, where)
    clean = []
    for j, d in enumerate(details):
        dwhere = f"{where}, missing_details[{j}]"
        description = field(d, "description", str, dwhere)
        if not description.strip():
            raise EnvError(f"{dwhere}: field 'description' is empty")
        inquiry = field(d, "inquiry", str, dwhere, optional=True)
        options = field(d, "options", list, dwhere, optional=True, default=[])
        clean.append({"description": description, "importance": importance_of(d, dwhere), "inquiry": inquiry,
                      "options": [str(o) for o in options]})
    return {"id": str(tid), "category": category, "task": task, "missing_details": clean, "record": record}


def load_intentions(path) -> dict[str, dict]:
    """{id: task} of one UserRL intentions file (a list of task records), validated."""
    table = index_records(read_json(path), "id", str(path))
    return {key: validate_intention(rec, f"{path}, record {i} (id {key!r})")
            for i, (key, rec) in enumerate(table.items())}


# ------------------------------------------------------------------------------------ the gym
@register_gym("IntentionGym")
class IntentionEnv(UserRLEnv):
    """Ask clarifying questions until every missing detail of `intention` is covered (module docstring)."""

    prompt_file = "intention"
    default_max_steps = USERRL_TOOL_MAX_TURNS  # what UserRL's InteractTool passes, not the gym config's own default

    def __init__(self, intention: dict, *, user=None, judge=None, max_steps: int | None = None,
                 responder_sees_record: bool = False, **options):
        super().__init__(user=user, judge=judge, max_steps=max_steps, **options)
        raw = intention.get("record", intention) if isinstance(intention, dict) else intention
        self.intention = validate_intention(raw, f"{self.name} task")
        self.responder_sees_record = bool(responder_sees_record)
        self.remaining: list[dict] = []
        self.covered: list[dict] = []
        self.history: list[tuple[str, str]] = []

    # -------------------------------------------------------------- episode
    def _reset(self):
        self.remaining = list(self.intention["missing_details"])
        self.covered, self.history = [], []
        feedback = self.prompt("welcome", task=self.intention["task"], category=self.intention["category"])
        return feedback, {"task_id": self.intention["id"], "missing_details": len(self.remaining)}

    def _action(self, content: str):
        return self._question(content)

    def _answer(self, content: str):
        return self._question(content)

    def _search(self, content: str):
        return self._question(f"[search] {content}".strip())  # UserRL keeps this prefix in the question

    def _question(self, question: str):
        response = self._respond(question)
        indices = self.ask_parsed(self.judge, self._evaluator_messages(question), parse_coverage, role="judge")
        chosen = []
        for i in indices:
            if 0 <= i < len(self.remaining) and i not in chosen:
                chosen.append(i)
        newly = [self.remaining[i] for i in chosen]
        self.remaining = [d for i, d in enumerate(self.remaining) if i not in chosen]
        self.covered.extend(newly)
        reward = coverage_reward([d["importance"] for d in newly])
        self.history.append((question, response))
        total = len(self.intention["missing_details"])
        info = {"covered_indices": chosen, "evaluator_indices": list(indices),
                "newly_covered": [d["description"] for d in newly], "remaining": len(self.remaining),
                "coverage": len(self.covered) / total if total else 1.0}
        return response, reward, not self.remaining, info

    # -------------------------------------------------------------- the other sides
    def _history(self, entry_key: str) -> str:
        recent = self.history[-HISTORY_WINDOW:]
        if not recent:
            return self.prompt("history_empty")
        return "\n".join(self.prompt(entry_key, n=i, question=q, response=r) for i, (q, r) in enumerate(recent, 1))

    def _respond(self, question: str) -> str:
        request = (json.dumps(self.intention["record"], ensure_ascii=False) if self.responder_sees_record
                   else self.intention["task"])
        messages = [{"role": "system", "content": self.prompt("responder_system")},
                    {"role": "user", "content": self.prompt(
                        "responder_turn", task=request, category=self.intention["category"], question=question,
                        history=self._history("responder_history_entry"))}]
        errors = []
        for _ in range(2):
            raw = self.ask_user(messages)  # a refusal or a failed call raises InvalidEpisode here
            try:
                reply = parse_responder(raw)
            except ValueError as e:
                errors.append(str(e))
                continue
            thoughts = [t for t in (self.user_turn.get("user_thought"), reply["thought"]) if t]
            self.set_user_turn("\n\n".join(thoughts) if thoughts else None, reply["response"])
            return reply["response"]
        self.clear_user_turn()
        raise InvalidEpisode(f"{self.name}: the responder's answer did not parse twice: {errors[-1]}")

    def _evaluator_messages(self, question: str) -> list[dict]:
        lines = []
        for i, d in enumerate(self.remaining):
            lines.append(self.prompt("detail_line", index=i, label=IMPORTANCE_LABEL[d["importance"]],
                                     description=d["description"]))
            if d["inquiry"]:
                lines.append(self.prompt("detail_inquiry", inquiry=d["inquiry"]))
        return [{"role": "system", "content": self.prompt("evaluator_system")},
                {"role": "user", "content": self.prompt(
                    "evaluator_turn", task=self.intention["task"], category=self.intention["category"],
                    details="\n".join(lines), history=self._history("evaluator_history_entry"),
                    question=question)}]

    # -------------------------------------------------------------- construction
    @classmethod
    def from_task(cls, task, *, data_dir=None, user=None, judge=None, retriever=None, seed=None, max_steps=None,
                  **options) -> "IntentionEnv":
        key = str(task.create_kwargs.get("id", task.id))
        searched = []
        for name in DATA_FILES:
            try:
                path = data_file(name, data_dir)
            except EnvError:
                continue
            searched.append(str(path))
            table = load_intentions(path)
            if key in table:
                break
        else:
            if not searched:
                raise EnvError(f"IntentionGym: none of the data files {list(DATA_FILES)} found in "
                               f"{data_dir or 'the shipped data folder'}")
            raise EnvError(f"IntentionGym: no task with id {key!r} in {searched} (task {task.source or task.id})")
        if max_steps is None and task.create_kwargs.get("max_turns") is not None:
            max_steps = int(task.create_kwargs["max_turns"])
        return build_gym(cls, options, table[key], user=user, judge=judge, seed=seed, max_steps=max_steps)
