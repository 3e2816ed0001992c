"""TurtleGym: a "turtle soup" lateral-thinking riddle (docs/reference/environments.md, the gym table; UserRL's TurtleGym).

The agent reads a short, puzzling riddle (the *surface*) and must explain the hidden story behind it (the
*bottom*). Rules, as UserRL's `StoryEnv` with the create arguments of its `env_manager` (read there, written here
in this project's own code):

* `[action] <question>` -- the host (this gym's user model, `ask_user`) sees the surface and the bottom and answers
  the question, asked to say Yes / No / Maybe. Each question is a fresh, stateless call (UserRL keeps no history
  for the host). The host's answer is the step's feedback, verbatim: UserRL takes the `response` field of the
  host's JSON as is and does not check it against Yes/No/Maybe, so neither does this gym. A host that answers in
  UserRL's JSON form `{"thought", "response"}` has its `response` shown and its `thought` kept private; a JSON
  answer without a `response` text is a failed host turn (INVALID; UserRL shows a fixed no-feedback text with
  reward 0). Reward: the shaped 0 (below).
* `[answer] <story>` -- the judge (`ask_parsed`, role "judge") scores each rubric statement of the story's
  `evaluation` list 0 / 0.5 / 1 (the rubric is shown without its weights). The story's score is
  `sum(weight_i * judgment_i)`, accumulated in rubric order from 0.0 as UserRL does, NOT normalised by the sum of
  the weights (UserRL's weights sum to 1). Base reward = max(0, score - best so far); the best is then raised to
  the score if higher. The episode terminates when score >= success_threshold (1.0, as UserRL's env_manager sets;
  the gym config's own default is 0.9). The feedback lists the statements judged exactly 1 ("covered").
* shaping (UserRL's config defaults): reward = base * reward_scale (1.0) - step_penalty (0.0) * step_count, then,
  with normalize_rewards (True), clipped to [0, 1]. Every step is shaped, questions included.
* `[search] <text>` -- UserRL has no search here, but its step sends everything that is not `[answer]`/`[finish]`
  to the host with the 8-character prefix cut off, so a `[search]` is answered as a question. Kept.
* the turn limit is 15, UserRL's `InteractTool.create(max_turns=15)` (its gym's
  own config default is 20); `max_turns` in the create arguments or `max_steps` override it;
  the step that reaches it truncates the episode.
* the task is selected by its `title` (case-insensitive, first match in file order, as UserRL); stories whose
  `judgment` is not "Yes" are skipped on load, as UserRL does. The create arguments' `surface`/`bottom` are not
  used by the env (UserRL only copies them into the reward model), the data file's are.

Choices where UserRL is ambiguous or failure-prone (recorded here):
* Judge answers: UserRL `literal_eval`s the text and multiplies any value it finds; a failed parse or a wrong
  number of scores gives a fixed no-feedback text and reward 0. Here a judge answer must be a JSON object whose
  `scores` list has one entry per statement, each `score` one of 0, 0.5, 1 (the values the judge is told to use);
  anything else is asked again once, then the episode is INVALID (project rule: failures are never a reward 0).
* Termination tolerance: the in-order float sum of some rubrics is 0.9999999999999999 for a perfect answer (138
  of UserRL's 471 stories, e.g. weights 0.5, 0.2, 0.2, 0.1), so in UserRL a perfect answer to those never ends
  the episode. Here the test is `score >= success_threshold - threshold_tolerance` with tolerance 1e-9; pass
  `threshold_tolerance=0.0` for UserRL's exact comparison. Rewards themselves are UserRL's exact floats.
* UserRL's `[finish]` choice (ends with reward 0) is not part of this project's tool (choices action/answer/search)
  and is not implemented; text without a known prefix gets the invalid-action answer with reward 0 (UserRL would
  send it to the host).
* The host's messages follow the gyms' user-model convention (envs/userrl/common.py): system = the host's
  instructions and the story, then the agent's question as a `user` message; the host answers as `assistant`.
"""

from __future__ import annotations

import functools
import math
import pathlib

from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.model_io import field, parse_json_object
from mimesis_jax.envs.userrl.common import USERRL_TOOL_MAX_TURNS, UserRLEnv, build_gym, data_file, read_json
from mimesis_jax.envs.userrl.tasks import register_gym

STORY_FILE = "all_stories_refined.json"
# feedback of an [answer] (this project's wording); the covered statements go between header and footer
COVERED_HEADER = "Key points your story already captures:"
COVERED_FOOTER = ("Parts of the hidden story may still be missing: more questions, then another answer, can earn "
                  "more.")
NONE_COVERED = "None of the key points shows up in your story so far."
JUDGE_VALUES = (0, 0.5, 1)  # the only per-statement judgments a judge may give


# ------------------------------------------------------------------------------------ shared by TurtleGym/Telepathy
def shaped_reward(base: float, step_count: int, *, reward_scale: float, step_penalty: float,
                  normalize: bool) -> float:
    """UserRL's step reward: base * reward_scale - step_penalty * step_count, clipped to [0, 1] when normalising."""
    reward = base * reward_scale - step_penalty * step_count
    if normalize:
        reward = max(0.0, min(1.0, reward))
    return reward


def host_answer(env: UserRLEnv, utterance: str) -> str:
    """The public answer of a Yes/No host (TurtleGym, TelepathyGym): the utterance verbatim, or the `response`
    text when the host answered in UserRL's JSON form (its `thought` then stays private, in the turn's info)."""
    text = utterance.strip()
    if not (text.startswith("{") or text.startswith("```")):
        return text
    try:
        obj = parse_json_object(text)
    except ValueError:
        return text  # braces but no JSON object: plain text
    response = obj.get("response")
    if not isinstance(response, str) or not response.strip():
        raise InvalidEpisode(f"{env.name}: the host answered a JSON object without a 'response' text: {text[:200]!r}")
    response = response.strip()
    thought = env.user_turn.get("user_thought")
    if not thought and isinstance(obj.get("thought"), str):
        thought = obj["thought"].strip()
    env.set_user_turn(thought, response)
    return response


def check_shaping(name: str, reward_scale: float, step_penalty: float) -> None:
    if not isinstance(reward_scale, (int, float)) or not reward_scale > 0:
        raise EnvError(f"{name}: reward_scale must be > 0, got {reward_scale!r}")
    if not isinstance(step_penalty, (int, float)) or not math.isfinite(step_penalty):
        raise EnvError(f"{name}: step_penalty must be a number, got {step_penalty!r}")


def turn_limit(name: str, task, max_steps):
    """`max_steps` if given, else the create arguments' `max_turns` (UserRL's env_manager), else None (default)."""
    if max_steps is not None:
        return max_steps
    limit = task.create_kwargs.get("max_turns")
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise EnvError(f"{name}: create_kwargs 'max_turns' must be an integer, got {limit!r}")
    return limit


# ------------------------------------------------------------------------------------ data
@functools.lru_cache(maxsize=8)
def _stories(path: str, mtime: float) -> tuple[dict, ...]:
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise EnvError(f"{path}: expected an object mapping story ids to stories, got {type(raw).__name__}")
    out = []
    for sid, rec in raw.items():
        where = f"{path}, story {sid!r}"
        if not isinstance(rec, dict):
            raise EnvError(f"{where}: expected an object, got {type(rec).__name__}")
        if rec.get("judgment") != "Yes":  # UserRL loads only stories judged usable
            continue
        title = field(rec, "new_title", str, where, optional=True, default=f"Story {sid}")
        surface = field(rec, "new_surface", str, where)
        bottom = field(rec, "new_bottom", str, where)
        evaluation = field(rec, "evaluation", list, where)
        if not evaluation:
            raise EnvError(f"{where}: field 'evaluation' must list at least one statement")
        criteria = []
        for j, item in enumerate(evaluation):
            w = f"{where}, field 'evaluation[{j}]'"
            statement = field(item, "statement", str, w)
            weight = field(item, "score", (int, float), w)
            if not math.isfinite(weight) or weight < 0:
                raise EnvError(f"{w}: field 'score' (the statement's weight) must be a number >= 0, got {weight!r}")
            criteria.append({"statement": statement, "score": weight})
        out.append({"id": str(sid), "title": title, "surface": surface, "bottom": bottom, "evaluation": criteria})
    return tuple(out)


def load_stories(path) -> list[dict]:
    """UserRL's story file (an object: story id -> {new_title, new_surface, new_bottom, evaluation[{statement,
    score}], judgment, ...}) as validated stories {id, title, surface, bottom, evaluation}, in file order."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise EnvError(f"data file {p} does not exist")
    return list(_stories(str(p), p.stat().st_mtime))


def find_story(stories: list[dict], title: str, path) -> dict:
    """The first story whose title matches `title` case-insensitively (UserRL's get_story_by_title)."""
    wanted = str(title).lower()
    for story in stories:
        if story["title"].lower() == wanted:
            return story
    raise EnvError(f"{path}: no story titled {title!r} (TurtleGym task id)")


# ------------------------------------------------------------------------------------ judge answers
def parse_judgments(text: str, n: int) -> list:
    """The judge's per-statement judgments: {"scores": [{"score": 0|0.5|1, ...}] * n}; ValueError otherwise."""
    obj = parse_json_object(text)
    scores = obj.get("scores")
    if not isinstance(scores, list):
        raise ValueError("the answer has no 'scores' list")
    if len(scores) != n:
        raise ValueError(f"expected {n} scores (one per statement), got {len(scores)}")
    out = []
    for i, item in enumerate(scores):
        if not isinstance(item, dict) or "score" not in item:
            raise ValueError(f"scores[{i}] has no 'score'")
        value = item["score"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value not in JUDGE_VALUES:
            raise ValueError(f"scores[{i}].score must be 0, 0.5 or 1, got {value!r}")
        out.append(value)
    return out


# ------------------------------------------------------------------------------------ the gym
@register_gym("TurtleGym")
class TurtleGym(UserRLEnv):
    """One turtle-soup story: Yes/No questions to the host, rubric-judged answers (rules: module docstring)."""

    prompt_file = "turtle"
    default_max_steps = USERRL_TOOL_MAX_TURNS  # what UserRL's InteractTool passes, not the gym config's own default
    invalid_action_feedback = ("Invalid action. Call interact_with_env with choice 'action' and a Yes-or-No question, "
                               "or choice 'answer' and your version of the hidden story.")

    def __init__(self, story: dict, *, user=None, judge=None, max_steps=None, success_threshold: float = 1.0,
                 threshold_tolerance: float = 1e-9, reward_scale: float = 1.0, step_penalty: float = 0.0,
                 normalize_rewards: bool = True, max_tokens: int | None = 2048, **kwargs):
        super().__init__(user=user, judge=judge, max_steps=max_steps, max_tokens=max_tokens, **kwargs)
        for key in ("title", "surface", "bottom", "evaluation"):
            if key not in story:
                raise EnvError(f"{self.name}: the story has no {key!r} (use load_stories)")
        if not isinstance(success_threshold, (int, float)) or not 0 <= success_threshold <= 1:
            raise EnvError(f"{self.name}: success_threshold must lie in [0, 1], got {success_threshold!r}")
        if not isinstance(threshold_tolerance, (int, float)) or not 0 <= threshold_tolerance < 0.01:
            raise EnvError(f"{self.name}: threshold_tolerance must be in [0, 0.01), got {threshold_tolerance!r}")
        check_shaping(self.name, reward_scale, step_penalty)
        self.story = story
        self.success_threshold, self.threshold_tolerance = float(success_threshold), float(threshold_tolerance)
        self.reward_scale, self.step_penalty = reward_scale, step_penalty
        self.normalize_rewards = bool(normalize_rewards)
        self.best_score = 0.0

    # -------------------------------------------------------------- protocol
    def _reset(self):
        self.best_score = 0.0
        info = {"title": self.story["title"], "total_criteria": len(self.story["evaluation"])}
        return ("Welcome to TurtleGym. Ask Yes-or-No questions about the riddle, or give your explanation of the "
                "hidden story."), info

    def _reward(self, base: float) -> float:
        return shaped_reward(base, self.step_count, reward_scale=self.reward_scale, step_penalty=self.step_penalty,
                             normalize=self.normalize_rewards)

    def _action(self, content: str):
        messages = [{"role": "system", "content": self.prompt("host_system", surface=self.story["surface"],
                                                                bottom=self.story["bottom"])},
                    {"role": "user", "content": self.prompt("host_question", question=content)}]
        reply = host_answer(self, self.ask_user(messages, role="host"))
        return reply, self._reward(0.0), False, {"question": content, "best_score": self.best_score}

    def _search(self, content: str):
        return self._action(content)  # UserRL answers a [search] as a question (module docstring)

    def _answer(self, content: str):
        criteria = self.story["evaluation"]
        protocol = "\n".join(f"{i}. {c['statement']}" for i, c in enumerate(criteria, 1))
        messages = [{"role": "system", "content": self.prompt("judge_system")},
                    {"role": "user", "content": self.prompt(
                        "judge_user", surface=self.story["surface"], bottom=self.story["bottom"], story=content,
                        count=len(criteria), protocol=protocol)}]
        judgments = self.ask_parsed(self.judge, messages, lambda text: parse_judgments(text, len(criteria)),
                                    role="judge")
        score = 0.0
        for criterion, judgment in zip(criteria, judgments):
            score += criterion["score"] * judgment
        base = max(0.0, score - self.best_score)
        self.best_score = max(self.best_score, score)
        covered = [c["statement"] for c, j in zip(criteria, judgments) if j == 1]
        if covered:
            feedback = "\n".join([COVERED_HEADER, *(f"- {s}" for s in covered), COVERED_FOOTER])
        else:
            feedback = NONE_COVERED
        terminated = score >= self.success_threshold - self.threshold_tolerance
        info = {"score": score, "best_score": self.best_score, "judgments": list(judgments), "covered": covered}
        return feedback, self._reward(base), terminated, info

    # -------------------------------------------------------------- construction
    @classmethod
    def from_task(cls, task, *, data_dir=None, user=None, judge=None, retriever=None, seed=None, max_steps=None,
                  **options) -> "TurtleGym":
        path = data_file(STORY_FILE, data_dir)
        title = task.create_kwargs.get("title", task.id)
        story = find_story(load_stories(path), title, path)
        limit = turn_limit(cls.name, task, max_steps)
        return build_gym(cls, options, story, user=user, judge=judge, seed=seed, max_steps=limit)
