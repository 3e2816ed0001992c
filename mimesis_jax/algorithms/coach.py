"""The CSD coach, Eq 7 (docs/reference/paper.md §4.2): the chat I/O of coaching. `build_coach_prompt` (the
documented template below) and `coach_notes` / `coach_notes_batch` ask any `ChatModel` for one hindsight note per
agent turn; `coach_note_message` + `add_coach_notes` turn a note into a coach segment placed before the turn's
assistant header (data/trajectory.py placement rule). The loss the notes feed is algorithms/csd.py.
"""

from __future__ import annotations

from typing import Callable, Sequence

from mimesis_jax.data.chat import render_turn
from mimesis_jax.rollout.base import ChatModel, Message
from mimesis_jax.rollout.endpoints import chat_many
from mimesis_jax.data.trajectory import Trajectory

COACH_SYSTEM = (
    "You are a coach for a conversational assistant. You read one turn of a finished conversation together "
    "with what the user privately thought about the assistant's reply and what the user said next. Write a "
    "short note (at most three sentences) telling the assistant how that reply should have been better for "
    "this user: what it misunderstood, missed or should have asked. Speak to the assistant in the second "
    "person. Do not write a new reply, do not quote the user's private thought, and do not reveal the user's "
    "next message. If the reply needed no improvement, answer exactly NONE."
)
COACH_USER_TEMPLATE = (
    "## Task\n{task_context}\n\n"
    "## Conversation so far (public)\n{public_history}\n\n"
    "## The assistant's reply\n{reply}\n\n"
    "## The user's private thought about this reply\n{user_thought}\n\n"
    "## The user's next message\n{next_utterance}\n\n"
    "Write the coaching note for the assistant's reply."
)
NO_NOTE = "NONE"
COACH_NOTE_PREFIX = "Coach note (feedback on your next reply): "


def build_coach_prompt(task_context: str, public_history: str, reply: str, user_thought: str | None,
                       next_utterance: str) -> list[Message]:
    """Eq 7 input: h_t = G(c, H_t, y_t, z_t, x_{t+1}) as chat messages for the coach model G.

    The system message is `COACH_SYSTEM`; the user message fills `COACH_USER_TEMPLATE` with the task context
    c, the public history H_t, the sampled reply y_t, the simulator's private thought z_t ("(not available)"
    when the simulator produced none) and its next utterance x_{t+1}. The note is hindsight: it is written
    after y_t was sampled and is only ever shown to the teacher.
    """
    thought = user_thought if user_thought else "(not available)"
    body = COACH_USER_TEMPLATE.format(task_context=task_context or "(none)", public_history=public_history,
                                      reply=reply, user_thought=thought, next_utterance=next_utterance)
    return [{"role": "system", "content": COACH_SYSTEM}, {"role": "user", "content": body}]


def task_context_text(task: dict) -> str:
    """Default task context c for the coach: the task dict's scalar fields as ``key: value`` lines."""
    lines = [f"{k}: {v}" for k, v in task.items() if isinstance(v, (str, int, float, bool))]
    return "\n".join(lines)


def _segment_text(tr: Trajectory, i: int, decode: Callable[[list[int]], str] | None) -> str:
    s = tr.segments[i]
    if s.text is not None:
        return s.text
    if decode is None:
        raise ValueError(f"segment {i} ({s.kind}) has no text and no decode function was given")
    return decode(s.tokens)


def coach_requests(trajectory: Trajectory, *, decode: Callable[[list[int]], str] | None = None,
                   task_context: str | None = None, turns: Sequence[int] | None = None
                   ) -> list[tuple[int, list[Message]]]:
    """The Eq 7 coach prompts of one trajectory: [(agent turn t, messages)] for the turns that can have a note.

    A turn gets none when it is not in `turns` (default: all) or when the simulator said nothing after it (no
    x_{t+1}: nothing to learn in hindsight; `user_utterances` shorter than the number of turns means the missing
    trailing turns have none). Public history H_t = the text of every non-coach segment before the turn's agent
    segment (Segment.text, else `decode(tokens)`; neither is an error naming the segment).
    """
    agents = trajectory.agent_indices()
    n = len(agents)
    if len(trajectory.user_utterances) > n or len(trajectory.user_thoughts) > n:
        raise ValueError(f"trajectory has {n} agent turns but {len(trajectory.user_utterances)} user utterances "
                         f"and {len(trajectory.user_thoughts)} user thoughts")
    ctx = task_context_text(trajectory.task) if task_context is None else task_context
    wanted = set(range(n)) if turns is None else set(turns)
    bad = [t for t in wanted if not 0 <= t < n]
    if bad:
        raise ValueError(f"turns {sorted(bad)} out of range for a trajectory with {n} agent turns")
    out = []
    for t, a in enumerate(agents):
        nxt = trajectory.user_utterances[t] if t < len(trajectory.user_utterances) else None
        if t not in wanted or nxt is None:
            continue
        thought = trajectory.user_thoughts[t] if t < len(trajectory.user_thoughts) else None
        history = "".join(_segment_text(trajectory, i, decode) for i in range(a)
                          if trajectory.segments[i].kind != "coach")
        out.append((t, build_coach_prompt(ctx, history, _segment_text(trajectory, a, decode), thought, nxt)))
    return out


def coach_notes_batch(coach: ChatModel, trajectories: Sequence[Trajectory], *,
                      decode: Callable[[list[int]], str] | None = None, task_contexts: Sequence[str] | None = None,
                      max_tokens: int = 256, temperature: float = 0.0) -> list[list[str | None]]:
    """Eq 7 notes for many trajectories through ONE batched call (rollout.endpoints.chat_many): per trajectory,
    per agent turn, the note or None (see `coach_requests`; a coach answer of exactly NONE, or nothing, is None).
    A failed coach call is an error naming the trajectory and the turn, never a silent skip."""
    reqs = []  # (trajectory index, turn, messages)
    for i, tr in enumerate(trajectories):
        ctx = None if task_contexts is None else task_contexts[i]
        try:
            reqs += [(i, t, m) for t, m in coach_requests(tr, decode=decode, task_context=ctx)]
        except ValueError as e:
            raise ValueError(f"trajectory {i}: {e}") from None
    responses = chat_many(coach, [m for _, _, m in reqs], max_tokens=max_tokens, temperature=temperature)
    notes: list[list[str | None]] = [[None] * tr.num_agent_turns for tr in trajectories]
    for (i, t, _), resp in zip(reqs, responses):
        if resp.finish_reason == "error":
            raise RuntimeError(f"trajectory {i}: coach failed on agent turn {t}: {resp.meta or resp.text!r}")
        text = (resp.text or "").strip()
        notes[i][t] = None if not text or text.upper() == NO_NOTE else text
    return notes


def coach_notes(coach: ChatModel, trajectory: Trajectory, *, decode: Callable[[list[int]], str] | None = None,
                task_context: str | None = None, turns: Sequence[int] | None = None, max_tokens: int = 256,
                temperature: float = 0.0) -> list[str | None]:
    """One Eq 7 note per agent turn of one trajectory (in order), None where there is none (`coach_requests`).

    The coach answering exactly NONE (or nothing) means no note; a coach reply with finish_reason "error" is an
    error naming the turn, never a silent skip.
    """
    notes: list[str | None] = [None] * trajectory.num_agent_turns
    for t, msgs in coach_requests(trajectory, decode=decode, task_context=task_context, turns=turns):
        resp = coach.chat(msgs, max_tokens=max_tokens, temperature=temperature)
        if resp.finish_reason == "error":
            raise RuntimeError(f"coach failed on agent turn {t}: {resp.meta or resp.text!r}")
        text = (resp.text or "").strip()
        notes[t] = None if not text or text.upper() == NO_NOTE else text
    return notes


def coach_note_message(note: str, role: str = "system") -> Message:
    """The chat turn that carries a note into the teacher's context: ``{role, COACH_NOTE_PREFIX + note}``.

    It is rendered with the agent's chat template (e.g. data.chat.render_turn) into the coach segment, which
    sits after the last user/tool message and before the assistant header of the coached turn.
    """
    return {"role": role, "content": COACH_NOTE_PREFIX + note}


def chat_note_renderer(tok) -> Callable[[Message], list[int]]:
    """`render` for `add_coach_notes`: the note's chat turn through the agent's template (data.chat.render_turn),
    i.e. ``<|im_start|>system\\n{COACH_NOTE_PREFIX}{note}<|im_end|>\\n`` for the Qwen template."""
    return lambda message: list(render_turn(tok, message).ids)


def add_coach_notes(trajectory: Trajectory, notes: Sequence[str | None],
                    render: Callable[[Message], list[int]], role: str = "system") -> int:
    """Renders each note (`render(message) -> token ids`) and inserts it as the coach segment of its turn.

    Returns the number of notes inserted. A turn that already has a coach note is an error.
    """
    if len(notes) != trajectory.num_agent_turns:
        raise ValueError(f"{len(notes)} notes for {trajectory.num_agent_turns} agent turns")
    count = 0
    for t, note in enumerate(notes):
        if note is None:
            continue
        msg = coach_note_message(note, role)
        ids = [int(i) for i in render(msg)]
        if not ids:
            raise ValueError(f"agent turn {t}: the rendered coach note is empty")
        trajectory.insert_coach(t, ids, text=msg["content"])
        count += 1
    return count

