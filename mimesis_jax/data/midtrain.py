"""User-side mid-training examples (paper Section 4.1 / digest 3.1): role-flipped next-utterance prediction.

From a human-assistant conversation, the *human* turns are the targets: the whole conversation is rendered with its
true roles (``chat.render_messages``, thinking disabled) and the loss mask covers every user turn's body plus its
closing ``<|im_end|>`` — the tokens the simulator writes after ``generation_prompt(tok, "user")`` (see the simulator
framing in ``chat.py``). Assistant turns, system messages and all template tokens are context only. One sequence per
conversation; ``last_user_turn_only=True`` keeps the loss on the final user turn only. Messages after the last user
turn are dropped (nothing after them is predicted).

Accepted record layouts (``conversation_messages``):

* ``{"messages": [{"role": "user"|"assistant"|"system"|"tool", "content": ...}, ...]}`` (OpenAI / HF chat);
  ``"type"`` is accepted instead of ``"role"`` (ThoughtTrace) and ``"from"``/``"value"`` instead of
  ``"role"``/``"content"`` (ShareGPT), also under the key ``"conversations"``;
* role aliases: human / customer / client -> user; gpt / bot / model / chatbot / ai -> assistant;
* an optional record-level ``"system"`` string (e.g. a user persona) becomes a leading system message.

Content is stripped of surrounding whitespace; reasoning fields are dropped (thinking is disabled in this stage).
A record without a non-empty user turn, an unknown role, or an empty user message is a ``RecordError``.
"""

from __future__ import annotations

import numpy as np

from mimesis_jax.data.chat import ChatFormatError, render_messages
from mimesis_jax.data.tokenizer import Tokenizer

_ROLE_ALIASES = {
    "user": "user", "human": "user", "customer": "user", "client": "user",
    "assistant": "assistant", "gpt": "assistant", "bot": "assistant", "model": "assistant", "chatbot": "assistant",
    "ai": "assistant",
    "system": "system", "tool": "tool", "function": "tool", "ipython": "tool",
}


class RecordError(ValueError):
    """A record that cannot be turned into a training example (the message says which and why)."""


def _text(value, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in value):
        return "".join(p["text"] for p in value)
    raise RecordError(f"{where}: content must be a string, got {type(value).__name__}")


def _first(m: dict, keys: tuple[str, ...]):
    """The first of `keys` with a value (columnar readers fill absent fields with None)."""
    return next((m[k] for k in keys if m.get(k) is not None), None)


def conversation_messages(record: dict, *, where: str = "record", keep: tuple[str, ...] = ()) -> list[dict]:
    """Normalises a conversation record to ``[{"role", "content", ...}]`` (see the module docstring).

    `keep` names extra message fields to carry over (e.g. ``("tool_calls",)``)."""
    if not isinstance(record, dict):
        raise RecordError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
    raw = None
    for key in ("messages", "conversations", "conversation"):
        if record.get(key) is not None:
            raw = record[key]
            break
    if raw is None:
        raise RecordError(f"{where}: no 'messages' (or 'conversations') field; keys are {sorted(record)[:12]}")
    if not isinstance(raw, list):
        raise RecordError(f"{where}: 'messages' must be a list, got {type(raw).__name__}")
    out: list[dict] = []
    system = record.get("system")
    if system is not None:
        if not isinstance(system, str):
            raise RecordError(f"{where}: 'system' must be a string, got {type(system).__name__}")
        if system.strip():
            out.append({"role": "system", "content": system.strip()})
    for i, m in enumerate(raw):
        w = f"{where}: messages[{i}]"
        if not isinstance(m, dict):
            raise RecordError(f"{w} must be an object, got {type(m).__name__}")
        role = _first(m, ("role", "type", "from"))
        if not isinstance(role, str) or role.lower() not in _ROLE_ALIASES:
            raise RecordError(f"{w}: unknown role {role!r} (accepted: {sorted(_ROLE_ALIASES)})")
        msg = {"role": _ROLE_ALIASES[role.lower()],
               "content": _text(_first(m, ("content", "value", "text")), w).strip()}
        for k in keep:
            if m.get(k) is not None:
                msg[k] = m[k]
        out.append(msg)
    return out


def last_user_index(messages: list[dict], where: str) -> int:
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise RecordError(f"{where}: the conversation has no user turn (nothing to predict)")
    for i in users:
        if not messages[i]["content"]:
            raise RecordError(f"{where}: user message {i} is empty")
    return users[-1]


def midtrain_example(tok: Tokenizer, conversation: dict, *, last_user_turn_only: bool = False,
                     where: str = "record") -> dict:
    """{"tokens": int32 [T], "loss_mask": int32 [T]} with the loss on user turns (role flip)."""
    msgs = conversation_messages(conversation, where=where, keep=("tool_calls",))
    last = last_user_index(msgs, where)
    msgs = msgs[: last + 1]
    try:
        r = render_messages(tok, msgs, enable_thinking=False)
    except ChatFormatError as e:
        raise RecordError(f"{where}: {e}") from e
    mask = r.mask("user", turns=[last] if last_user_turn_only else None)
    return {"tokens": np.asarray(r.ids, dtype=np.int32), "loss_mask": mask.astype(np.int32)}
