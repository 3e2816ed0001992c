"""A sampled dialogue, recorded token-exactly as ordered segments.

Segments are `(kind, tokens)` with kind in
  * ``public`` -- context every reader sees: system prompt, the user's public utterances, tool results, and the
    assistant *header* of each agent turn (recorded as its own public segment right before the agent segment);
  * ``agent``  -- tokens the agent sampled (its reply up to and including the stop token), with their log-probs;
  * ``coach``  -- a CSD hindsight note for the next agent turn (Eq 7), seen only by the teacher.

Placement rule (docs/decisions.md): a coach segment sits after the last user/tool message and BEFORE the
assistant header of its turn, i.e. immediately before the public header segment that precedes the agent segment.
The student sequence is every non-coach segment; the teacher context of agent turn t is every non-coach segment
before coach_t, then coach_t, then the non-coach segments after it up to and including agent_t.
"""

from __future__ import annotations

import dataclasses
from typing import Any

KINDS = ("public", "agent", "coach")


@dataclasses.dataclass
class Segment:
    kind: str
    tokens: list[int]
    logprobs: list[float] | None = None  # agent segments: the sampler's log-probs (at the sampling temperature)
    text: str | None = None  # decoded text, for logs and the coach prompt (never re-tokenised)
    version: int | None = None  # agent segments: the policy version that sampled them (Sample.version; None: unknown)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"segment kind must be one of {KINDS}, got {self.kind!r}")
        self.tokens = [int(t) for t in self.tokens]
        if self.logprobs is not None and len(self.logprobs) != len(self.tokens):
            raise ValueError(f"{self.kind} segment: {len(self.logprobs)} log-probs for {len(self.tokens)} tokens")


@dataclasses.dataclass
class Trajectory:
    segments: list[Segment]
    turn_rewards: list[float] = dataclasses.field(default_factory=list)  # one per agent turn
    env_info: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # one per environment step
    user_thoughts: list[str | None] = dataclasses.field(default_factory=list)  # simulator thought after turn t
    user_utterances: list[str | None] = dataclasses.field(default_factory=list)  # public x_{t+1} after turn t
    group_id: int = 0  # GRPO group (same task)
    rollout_id: int = 0  # unique per sampled dialogue; FoldGRPO counts each once
    task: dict[str, Any] = dataclasses.field(default_factory=dict)
    status: str = "ok"  # ok | invalid
    invalid_reason: str | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)  # rollout extras (end reason, turns, ...)

    # ------------------------------------------------------------------ views
    def agent_indices(self) -> list[int]:
        return [i for i, s in enumerate(self.segments) if s.kind == "agent"]

    @property
    def num_agent_turns(self) -> int:
        return len(self.agent_indices())

    def student_segments(self) -> list[Segment]:
        return [s for s in self.segments if s.kind != "coach"]

    def student_tokens(self) -> list[int]:
        return [t for s in self.student_segments() for t in s.tokens]

    def coach_for_turn(self) -> list[int | None]:
        """For each agent turn (in order), the index of its coach segment, or None."""
        out, pending = [], None
        for i, s in enumerate(self.segments):
            if s.kind == "coach":
                if pending is not None:
                    raise ValueError(f"segment {i}: two coach segments before one agent turn")
                pending = i
            elif s.kind == "agent":
                out.append(pending)
                pending = None
        if pending is not None:
            raise ValueError("a coach segment after the last agent turn belongs to no turn")
        return out

    def teacher_sequence(self, turn: int) -> tuple[list[int], int]:
        """The naive teacher sequence of agent turn `turn` and the offset of its agent tokens in it."""
        agents = self.agent_indices()
        coach = self.coach_for_turn()[turn]
        end = agents[turn]
        toks: list[int] = []
        for i, s in enumerate(self.segments[: end + 1]):
            if s.kind == "coach" and i != coach:
                continue
            if i == end:
                return toks + s.tokens, len(toks)
            toks.extend(s.tokens)
        raise AssertionError("unreachable")

    def validate(self) -> None:
        """Checks the placement rule: every coach segment is followed by a public header, then its agent turn."""
        segs = self.segments
        for i, s in enumerate(segs):
            if s.kind != "coach":
                continue
            if not (i + 2 < len(segs) and segs[i + 1].kind == "public" and segs[i + 2].kind == "agent"):
                raise ValueError(f"coach segment {i} must be followed by the assistant header (public) and its "
                                 "agent segment")
        self.coach_for_turn()

    def insert_coach(self, turn: int, tokens: list[int], text: str | None = None) -> None:
        """Places a coach note for agent turn `turn` before that turn's assistant header segment."""
        agents = self.agent_indices()
        a = agents[turn]
        if a == 0 or self.segments[a - 1].kind != "public":
            raise ValueError(f"agent turn {turn} has no public header segment before it")
        if a >= 2 and self.segments[a - 2].kind == "coach":
            raise ValueError(f"agent turn {turn} already has a coach note")
        self.segments.insert(a - 1, Segment("coach", tokens, text=text))
