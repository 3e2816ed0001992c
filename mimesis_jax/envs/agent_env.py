"""The environment protocol (docs/reference/environments.md), the `interact_with_env` tool, and a registry.

Protocol (Gymnasium-like, as UserRL's gyms)::

    obs, info = env.reset(seed=None)                                   # obs = {"feedback": str}
    obs, reward, terminated, truncated, info = env.step(action_text)   # action_text = "[action] ..." etc.

The agent acts through ONE tool, `interact_with_env(choice, content)` with choice in {action, answer, search};
the environment receives `format_action(choice, content)` = "[choice] content" and the tool returns
`tool_feedback(feedback, reward)` = feedback + "\\nReward: {reward}" to the agent.

Hooks the episode runner (episodes/agent.py) uses, with defaults in `Env`:
* `invalid_action(reason)` -- the answer to a malformed tool call (no call, bad JSON, unknown choice): the
  env's invalid-action feedback, reward 0, the episode continues. Gyms that answer invalid input themselves can
  override it to route through `step`.
* `info["to_user"]` after a step -- the text the user simulator receives from the agent this turn, or None when
  the user is not addressed (then no user turn follows). When the key is absent the runner uses the content of
  an `[action]` step and None for `[answer]` / `[search]`.
* `info["user_thought"]` / `info["user_utterance"]` -- set by envs that talk to their user model themselves (the
  UserRL gyms): the runner records them as the simulator's private thought and public utterance of this turn
  (what the CSD coach reads, Eq 7). Such envs set `info["to_user"] = None`: the reply is already in the feedback.
* `tool_mode` (class attribute, default True) -- False for free-text envs (toy and dialogue-only envs): the runner
  sends the agent's whole visible reply (thinking removed) to `step` instead of parsing a tool call.
* raising `InvalidEpisode(reason)` from `step` -- the other side refused or failed: the episode is INVALID.
* `observe_user(utterance) -> (reward, terminated, info)` -- lets an env react to the user's public utterance
  (e.g. a user who ends the conversation); the reward is added to the turn's reward. Default: (0.0, False, {}).
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

CHOICES = ("action", "answer", "search")
TOOL_NAME = "interact_with_env"

INTERACT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": ("Take one step in the environment described in the system prompt. Call it once per turn; "
                        "the result is the environment's feedback followed by the step's reward."),
        "parameters": {
            "type": "object",
            "properties": {
                "choice": {
                    "type": "string",
                    "enum": list(CHOICES),
                    "description": ("'action' to act or talk to the user, 'answer' to submit an answer, 'search' to "
                                    "query the environment; the system prompt says which are allowed."),
                },
                "content": {
                    "type": "string",
                    "description": "The action, answer or search query, in the format the system prompt asks for.",
                },
            },
            "required": ["choice", "content"],
        },
    },
}

StepResult = tuple[dict, float, bool, bool, dict]


class EnvError(ValueError):
    """Bad environment configuration or use; the message names the environment and the key."""


class InvalidEpisode(RuntimeError):
    """Raised by an environment whose other side (user, judge, classifier model) refused its role, failed, or gave
    an answer that could not be parsed: the episode runner marks the episode INVALID with this reason -- never a
    reward of 0 (docs/reference/paper.md 4.3, docs/reference/metrics.md)."""


# ------------------------------------------------------------------------------------- actions
_ACTION_RE = re.compile(r"^\s*\[(action|answer|search)\]\s?(.*)$", re.DOTALL)


def format_action(choice: str, content: str) -> str:
    """The text an environment receives for a tool call: "[choice] content"."""
    if choice not in CHOICES:
        raise EnvError(f"choice must be one of {CHOICES}, got {choice!r}")
    return f"[{choice}] {content}"


def parse_action(text: str) -> tuple[str, str] | None:
    """"[choice] content" -> (choice, content); None when the text does not start with a known prefix."""
    m = _ACTION_RE.match(text)
    return None if m is None else (m.group(1), m.group(2).strip())


def tool_feedback(feedback: str, reward: float) -> str:
    """What the tool returns to the agent (docs/reference/environments.md): the feedback, then the step's reward."""
    return f"{feedback}\nReward: {reward}"


# ------------------------------------------------------------------------------------ tool calls
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)


class ToolCall:
    """A parsed agent reply: `choice`/`content` when it holds exactly one valid call, else `error` says why."""

    __slots__ = ("choice", "content", "error")

    def __init__(self, choice: str | None = None, content: str | None = None, error: str | None = None):
        self.choice, self.content, self.error = choice, content, error

    @property
    def ok(self) -> bool:
        return self.error is None

    def __repr__(self):
        return f"ToolCall(choice={self.choice!r}, content={self.content!r}, error={self.error!r})"


def parse_tool_call(reply: str) -> ToolCall:
    """Parses Qwen's tool-call format from an agent reply (text after the assistant header):

        <tool_call>\\n{"name": "interact_with_env", "arguments": {"choice": ..., "content": ...}}\\n</tool_call>

    Whitespace around the JSON is tolerated, `arguments` may also be a JSON-encoded string, a numeric `content`
    is turned into text, and calls inside a `<think>` block do not count. Exactly one call is expected per turn.
    """
    bodies = _TOOL_CALL_RE.findall(visible_reply(reply))
    if not bodies:
        return ToolCall(error="no <tool_call> found in the reply")
    if len(bodies) > 1:
        return ToolCall(error=f"expected exactly one {TOOL_NAME} call per turn, got {len(bodies)}")
    try:
        call = json.loads(bodies[0].strip())
    except json.JSONDecodeError as e:
        return ToolCall(error=f"tool call is not valid JSON ({e.msg})")
    if not isinstance(call, dict):
        return ToolCall(error="tool call must be a JSON object with 'name' and 'arguments'")
    if call.get("name") != TOOL_NAME:
        return ToolCall(error=f"unknown tool {call.get('name')!r}; the only tool is {TOOL_NAME}")
    args = call.get("arguments", call.get("parameters"))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            return ToolCall(error=f"tool call arguments are not valid JSON ({e.msg})")
    if not isinstance(args, dict):
        return ToolCall(error="tool call 'arguments' must be an object with 'choice' and 'content'")
    choice, content = args.get("choice"), args.get("content")
    if choice not in CHOICES:
        return ToolCall(error=f"choice must be one of {list(CHOICES)}, got {choice!r}")
    if isinstance(content, bool) or not isinstance(content, (str, int, float)):
        return ToolCall(error=f"content must be a string, got {type(content).__name__}")
    return ToolCall(choice=choice, content=str(content))


def visible_reply(reply: str) -> str:
    """The part of an agent reply outside `<think>` blocks (an unclosed block hides the rest), stripped."""
    visible = _THINK_RE.sub("", reply)
    if "<think>" in visible:
        visible = visible[: visible.index("<think>")]
    return visible.strip()


def tool_call_text(choice: str, content: str) -> str:
    """The canonical text of one call (what a well-behaved agent writes; used by scripted agents and tests)."""
    body = json.dumps({"name": TOOL_NAME, "arguments": {"choice": choice, "content": content}}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


# ------------------------------------------------------------------------------------------ envs
class Env:
    """Base class of environments. Subclasses implement `reset` and `step`; the hooks have defaults."""

    name = "env"
    tool_mode = True  # False: step() receives the agent's visible reply text (no interact_with_env parsing)
    invalid_action_feedback = ("Invalid action. Call interact_with_env with choice 'action', 'answer' or 'search' "
                               "and the content the environment description asks for.")

    def reset(self, seed: int | None = None) -> tuple[dict, dict]:
        raise NotImplementedError

    def step(self, action_text: str) -> StepResult:
        raise NotImplementedError

    def invalid_action(self, reason: str) -> StepResult:
        return {"feedback": self.invalid_action_feedback}, 0.0, False, False, {"invalid_action": reason}

    def observe_user(self, utterance: str) -> tuple[float, bool, dict]:
        return 0.0, False, {}

    def user_messages(self) -> list[dict] | None:
        """The starting view of the runner's simulator when it plays this env's user (free-text envs); None: the
        env's own user model answers (a gym's `user`)."""
        return None


_REGISTRY: dict[str, Callable[..., Env]] = {}


def register(name: str):
    """Class decorator: `@register("travel")` makes the env constructible with `make("travel", **kwargs)`."""
    def deco(factory):
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise EnvError(f"environment {name!r} is already registered (by {_REGISTRY[name]!r})")
        _REGISTRY[name] = factory
        return factory
    return deco


def make(name: str, **kwargs) -> Env:
    if name not in _REGISTRY:
        raise EnvError(f"unknown environment {name!r}; registered: {sorted(_REGISTRY)}")
    try:
        return _REGISTRY[name](**kwargs)
    except TypeError as e:
        raise EnvError(f"environment {name!r}: bad arguments {sorted(kwargs)} ({e})") from None


def registered() -> list[str]:
    return sorted(_REGISTRY)


def registered_class(name: str) -> Callable[..., Env] | None:
    """The env class (or factory) registered under `name`, None if there is none."""
    return _REGISTRY.get(name)
