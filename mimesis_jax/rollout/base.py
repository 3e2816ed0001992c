"""The one interface every chat model sits behind: local JAX sampler, remote OpenAI-compatible endpoint,
scripted model for tests. Users (simulators), judges and coaches are all `ChatModel`s.

    response = model.chat([{"role": "system", "content": ...}, {"role": "user", "content": ...}])
    response.text       # the generated text
    response.token_ids  # the generated token ids when the model is local (token-exact rollouts), else None
    response.logprobs   # per-token log-probs at temperature 1 when known, else None
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence, runtime_checkable

Message = dict  # {"role": "system" | "user" | "assistant" | "tool", "content": str, ...}


@dataclasses.dataclass
class ChatResponse:
    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str = "stop"  # stop | length | error
    meta: dict = dataclasses.field(default_factory=dict)


@runtime_checkable
class ChatModel(Protocol):
    def chat(self, messages: Sequence[Message], *, max_tokens: int | None = None,
             temperature: float | None = None, stop: Sequence[str] | None = None) -> ChatResponse:
        ...


class ScriptedChatModel:
    """Replies from a list (cycled) or a function of the messages; records every call. For tests and demos."""

    def __init__(self, replies, cycle: bool = True):
        self._replies = replies
        self._cycle = cycle
        self._i = 0
        self.calls: list[list[Message]] = []

    def chat(self, messages, *, max_tokens=None, temperature=None, stop=None) -> ChatResponse:
        self.calls.append([dict(m) for m in messages])
        if callable(self._replies):
            out = self._replies(messages)
        else:
            if self._i >= len(self._replies) and not self._cycle:
                raise IndexError(f"ScriptedChatModel: no reply left after {len(self._replies)} calls")
            out = self._replies[self._i % len(self._replies)]
            self._i += 1
        return out if isinstance(out, ChatResponse) else ChatResponse(text=str(out))
