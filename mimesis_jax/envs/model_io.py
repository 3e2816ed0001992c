"""What every environment that calls other models shares: prompt templates stored as data, calls to a fixed
side (user, judge, support agent, interlocutor) with the failure rules, robust JSON extraction, record fields.

Used by the UserRL gyms (envs/userrl), the ABCD behaviour environment (envs/abcd/env.py) and the SOUL tasks
(envs/soul). Failure rules (docs/reference/paper.md 4.3, docs/reference/metrics.md): a model call that raises or answers with an error is
`InvalidEpisode` -- the episode is INVALID with the reason, never a reward of 0. The env threads run at most a
model's `max_concurrency` calls on it at once: a local (in-process) model one request at a time, a remote endpoint
or a batcher as many as it declares.
"""

from __future__ import annotations

import functools
import json
import os
import string
import threading
import tomllib
import weakref
from typing import Any, Sequence

from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.chat.base import ChatModel, ChatResponse, Message
from mimesis_jax.chat.thoughts import split_thought


# ------------------------------------------------------------------------------------ prompt templates
def read_toml(path: str | os.PathLike, what: str) -> dict:
    """The TOML table of `path`; a missing or malformed file is an EnvError naming `what` ("prompt file", ...) and
    the path."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise EnvError(f"{what} {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise EnvError(f"{what} {path}: {e}") from None


@functools.lru_cache(maxsize=None)
def load_templates(path: str | os.PathLike) -> dict[str, str]:
    """A TOML file of prompt templates: a table of name -> template text (`string.Template`, `$name`)."""
    table = read_toml(path, "prompt file")
    bad = [k for k, v in table.items() if not isinstance(v, str)]
    if bad:
        raise EnvError(f"prompt file {path}: entries {bad} are not strings")
    return table


def fill(template: str, where: str, **values) -> str:
    """`string.Template` substitution ($name); a missing value is an error naming the template."""
    try:
        return string.Template(template).substitute({k: str(v) for k, v in values.items()})
    except KeyError as e:
        raise EnvError(f"prompt template {where}: no value for placeholder ${e.args[0]}") from None
    except ValueError as e:
        raise EnvError(f"prompt template {where}: {e}") from None


# ------------------------------------------------------------------------------------ record fields
def field(record: dict, key: str, types, where: str, *, optional: bool = False, default=None):
    """record[key] checked against `types`; the error names the file/record (`where`) and the field."""
    if not isinstance(record, dict):
        raise EnvError(f"{where}: expected an object, got {type(record).__name__}")
    if key not in record or record[key] is None:
        if optional:
            return default
        raise EnvError(f"{where}: missing field {key!r}")
    value = record[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise EnvError(f"{where}: field {key!r} must be {_names(types)}, got bool")
    if not isinstance(value, types):
        raise EnvError(f"{where}: field {key!r} must be {_names(types)}, got {type(value).__name__}")
    return value


def _names(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in types)


# ------------------------------------------------------------------------------------ model calls
_GATES: dict[int, tuple[weakref.ref, threading.BoundedSemaphore]] = {}
_GATES_GUARD = threading.Lock()


def _model_gate(model: ChatModel) -> threading.BoundedSemaphore:
    """The env threads' shared gate of `model`: at most `model.max_concurrency` of its calls run at once (a local
    model, 1: one request at a time; a remote endpoint or a batcher: its own limit)."""
    with _GATES_GUARD:
        ref, gate = _GATES.get(id(model), (None, None))
        if ref is None or ref() is not model:  # new, or a dead model's id reused
            gate = threading.BoundedSemaphore(max(1, int(model.max_concurrency)))
            _GATES[id(model)] = (weakref.ref(model, lambda _, k=id(model): _GATES.pop(k, None)), gate)
        return gate


def call_model(model: ChatModel | None, messages: Sequence[Message], role: str, *, temperature: float | None = 0.0,
               max_tokens: int | None = None) -> ChatResponse:
    """One chat call to a gym's other side; a missing model, an exception or an error response is INVALID."""
    if model is None:
        raise EnvError(f"this gym needs a {role} model (pass {role}=<ChatModel>)")
    if not isinstance(model, ChatModel):
        raise EnvError(f"the {role} model must subclass ChatModel (chat/base.py), got {type(model).__name__}")
    kwargs: dict[str, Any] = {}
    if temperature is not None:
        kwargs["temperature"] = temperature
    if max_tokens is not None:
        kwargs["max_tokens"] = max_tokens
    gate = _model_gate(model)
    try:
        with gate:
            response = model.chat(list(messages), **kwargs)
    except Exception as e:  # endpoint down, retries exhausted, ...
        raise InvalidEpisode(f"{role} model call failed: {type(e).__name__}: {e}") from e
    if response.finish_reason == "error":
        raise InvalidEpisode(f"{role} model call failed: {response.meta.get('error', 'unknown error')}")
    return response


def parse_json_object(text: str) -> dict:
    """The first JSON object in a model's answer (code fences and prose around it tolerated); ValueError else."""
    _, visible = split_thought(text)
    visible = visible or ""
    start = visible.find("{")
    while start != -1:
        depth, in_str, esc = 0, False, False
        for i in range(start, len(visible)):
            ch = visible[i]
            if in_str:
                esc = (ch == "\\") and not esc
                if ch == '"' and not esc:
                    in_str = False
                elif ch != "\\":
                    esc = False
                continue
            if ch == '"':
                in_str = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    try:
                        obj = json.loads(visible[start:i + 1])
                    except json.JSONDecodeError:
                        break
                    if isinstance(obj, dict):
                        return obj
                    break
        start = visible.find("{", start + 1)
    raise ValueError(f"no JSON object in the answer {visible[:200]!r}")
