"""Environments in which the *simulator* is the policy (Stage I joint RL, docs/reference/paper.md Eq 4).

In Stage II the agent is sampled and the simulator is a fixed side (envs/agent_env.py). Stage I flips that: the
simulator is sampled and log-probbed, and the other sides -- the ABCD support agent, a SOUL task's interlocutor,
the judges -- are fixed `ChatModel`s the environment calls itself. One protocol covers all 24 domains:

    view = env.reset(seed)               # the policy's messages so far (its own view, true roles)
    turn = env.step(thought, utterance)  # after each policy turn: SimTurn(done, messages, reward, info)

* ``env.policy_role`` is the role the policy writes: ``"user"`` for the ABCD customer (the simulator sees the
  support agent as ``assistant``, data/chat.py's simulator framing), ``"assistant"`` for SOUL tasks, where the
  task is put to the model as a user message and the simulator answers or role-plays in the reply.
* ``env.thinking``: render the policy's turns with the thinking template. The policy's private thought goes to
  `step` beside its utterance; only the utterance enters the view (the runner appends it as a ``policy_role``
  message), so the other side never sees the thought.
* ``SimTurn.messages`` are appended to the view before the policy's next turn (the other side's reply, or a
  next question); ``SimTurn.done`` ends the episode and then ``reward`` (in [0, 1], r_d of Eq 4) must be set.
* A fixed side that refuses, fails, or whose answer cannot be parsed after one retry raises
  `envs.agent_env.InvalidEpisode(reason)`: the episode is INVALID (dropped from the group), never a reward of 0.
* ``utterance=None`` means the policy produced no public reply (e.g. it never closed its thought): that is the
  policy's own failure, so the env scores it like any other bad reply (most return reward 0 and finish).

Each policy turn becomes one training segment with its own context (episodes/simulator.py); all segments of a
rollout share its rollout id, so FoldGRPO (`grpo.group_advantages(..., fold=True)`) counts the rollout once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

Message = dict  # {"role", "content"}, as chat/base.py (not imported: rollout depends on envs)
POLICY_ROLES = ("user", "assistant")


@dataclasses.dataclass
class SimTurn:
    done: bool
    messages: list[Message] = dataclasses.field(default_factory=list)
    reward: float | None = None
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.done:
            if self.reward is None:
                raise ValueError("SimTurn(done=True) needs a reward")
            r = float(self.reward)
            if not 0.0 <= r <= 1.0:
                raise ValueError(f"SimTurn reward must be in [0, 1] (r_d of Eq 4), got {r}")
            self.reward = r
        for i, m in enumerate(self.messages):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or \
                    not isinstance(m.get("content"), str):
                raise ValueError(f"SimTurn.messages[{i}] must be a {{role, content}} message, got {m!r}")


class SimEnv:
    """Base class of simulator-side environments; subclasses set the class attributes and implement both methods."""

    domain: str = "?"
    policy_role: str = "assistant"
    thinking: bool = True
    multi_turn: bool = False
    max_policy_turns: int = 1  # the runner ends the episode (asking `finish`) after this many policy turns

    def reset(self, seed: int | None = None) -> list[Message]:
        raise NotImplementedError

    def step(self, thought: str | None, utterance: str | None) -> SimTurn:
        raise NotImplementedError

    def finish(self, reason: str) -> SimTurn:
        """Scores an episode the runner had to stop (turn or context limit). Default: reward 0."""
        return SimTurn(done=True, reward=0.0, info={"end": reason})

    def transcript(self) -> list[Message]:
        """The dialogue as the other sides saw it, for logs (default: nothing extra)."""
        return []
