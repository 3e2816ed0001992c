"""The one interface every chat model sits behind: local JAX sampler, remote OpenAI-compatible endpoint,
scripted model for tests. Users (simulators), judges and coaches are all `ChatModel`s.

    response = model.chat([{"role": "system", "content": ...}, {"role": "user", "content": ...}])
    response.text       # the generated text
    response.token_ids  # the generated token ids when the model is local (token-exact rollouts), else None
    response.logprobs   # per-token log-probs (local models: at the sampling temperature) when known, else None
"""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import logging
from typing import Sequence

log = logging.getLogger(__name__)

Message = dict  # {"role": "system" | "user" | "assistant" | "tool", "content": str, ...}


@dataclasses.dataclass
class ChatResponse:
    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str = "stop"  # stop | length | error
    meta: dict = dataclasses.field(default_factory=dict)


class ChatModel(abc.ABC):
    """What every chat model subclasses. `chat` is the one method to write; the rest have defaults:

    - `chat_batch(conversations, *, keys=None, **kwargs)`: one response per conversation, in order -- by default
      `chat` on a
      pool of `max_concurrency` threads, a conversation whose `chat` raises answered by
      ChatResponse("", finish_reason="error") with the error in `meta["error"]`. A model that samples many
      conversations in one call (a local sampler) overrides it. `keys` name the conversations' dialogues (one per
      conversation; the episode runners pass them): a model that keeps per-dialogue state (a LocalChatModel on the
      rollout engine) reuses it for the next turn of a key; by default they change nothing.
    - `max_concurrency` (1): how many `chat` calls may run on this model at once (`chat_batch`'s pool; the gyms'
      calls through envs/model_io.py). A remote endpoint or a thread-safe batcher raises it.
    - `release(keys)`: forget the dialogue state kept under each of `keys` (a model without dialogue state:
      nothing); the same call as a Generator's (inference/protocol.py).
    - `close()`: stop what the model holds (threads, engines; by default nothing).
    """

    max_concurrency: int = 1

    @abc.abstractmethod
    def chat(self, messages: Sequence[Message], *, max_tokens: int | None = None,
             temperature: float | None = None, stop: Sequence[str] | None = None, **kwargs) -> ChatResponse:
        """The reply to `messages`."""

    def chat_batch(self, conversations: Sequence[Sequence[Message]], *, keys: Sequence | None = None,
                   **kwargs) -> list[ChatResponse]:
        """One response per conversation, in order: `chat` on `max_concurrency` threads, failures per conversation
        (`keys`: no dialogue state kept here, so nothing to reuse)."""
        conversations = list(conversations)

        def one(messages):
            try:
                return self.chat(messages, **kwargs)
            except Exception as e:  # noqa: BLE001 -- reported per conversation, not swallowed
                log.error("chat failed: %s", e)
                return ChatResponse("", finish_reason="error", meta={"error": f"{type(e).__name__}: {e}"})

        workers = min(max(1, int(self.max_concurrency)), len(conversations))
        if workers <= 1:
            return [one(m) for m in conversations]
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, conversations))

    def release(self, keys: Sequence) -> None:
        """Forget the dialogue state kept under each of `keys`; a model without dialogue state keeps none."""

    def close(self) -> None:
        """Stop what the model holds; a model that holds nothing has nothing to stop."""


class ScriptedChatModel(ChatModel):
    """Replies from a list (cycled) or a function of the messages; records every call. For tests and demos."""

    def __init__(self, replies, cycle: bool = True):
        self._replies = replies
        self._cycle = cycle
        self._i = 0
        self.calls: list[list[Message]] = []

    def chat(self, messages, *, max_tokens=None, temperature=None, stop=None, **kwargs) -> ChatResponse:
        self.calls.append([dict(m) for m in messages])
        if callable(self._replies):
            out = self._replies(messages)
        else:
            if self._i >= len(self._replies) and not self._cycle:
                raise IndexError(f"ScriptedChatModel: no reply left after {len(self._replies)} calls")
            out = self._replies[self._i % len(self._replies)]
            self._i += 1
        return out if isinstance(out, ChatResponse) else ChatResponse(text=str(out))


class SimulatorAsResponder(ChatModel):
    """Lets a user *simulator* answer where a gym asks a chat model for the user's reply.

    Gyms (envs/userrl) talk to their user model the way any chat endpoint is asked for a role-played reply: the
    gym's side speaks as ``user`` and the simulated user answers as ``assistant`` (UserRL, tau-bench). A MIMESIS
    simulator instead sees the dialogue with its true roles and writes the next ``user`` turn (data/chat.py's
    framing; `LocalChatModel(generation_role="user")` or `serve --generation-role user`). This wrapper swaps
    ``user`` <-> ``assistant`` in the messages (system stays), so the simulator reads the agent side as
    ``assistant`` and its own earlier replies as ``user``, and returns its turn unchanged.
    """

    _SWAP = {"user": "assistant", "assistant": "user"}

    def __init__(self, simulator):
        self.simulator = simulator

    @staticmethod
    def flip(messages: Sequence[Message]) -> list[Message]:
        return [{**m, "role": SimulatorAsResponder._SWAP.get(m.get("role"), m.get("role"))} for m in messages]

    def chat(self, messages, **kwargs) -> ChatResponse:
        return self.simulator.chat(self.flip(messages), **kwargs)

    def chat_batch(self, conversations, **kwargs) -> list[ChatResponse]:
        """The simulator's own `chat_batch` (a local model: one sampler call) over the flipped conversations."""
        return self.simulator.chat_batch([self.flip(c) for c in conversations], **kwargs)

    @property
    def max_concurrency(self) -> int:
        return self.simulator.max_concurrency

    def release(self, keys) -> None:
        self.simulator.release(keys)

    def close(self) -> None:
        self.simulator.close()


# ------------------------------------------------------------------------------------ many chats
def chat_many(model: ChatModel, conversations: Sequence[Sequence[Message]], **kwargs) -> list[ChatResponse]:
    """Runs every conversation on `model` (its `chat_batch`); failures become ChatResponse(text="",
    finish_reason="error"): each failed conversation's own (the default `chat_batch`), or every conversation's
    when the whole batch raises."""
    conversations = list(conversations)
    if not conversations:
        return []
    try:
        return list(model.chat_batch(conversations, **kwargs))
    except Exception as e:  # noqa: BLE001 -- reported per conversation, not swallowed
        log.error("chat_batch failed for %d conversations: %s", len(conversations), e)
        return [ChatResponse("", finish_reason="error", meta={"error": f"{type(e).__name__}: {e}"})
                for _ in conversations]
