"""The CSD coach, Eq 7 (docs/reference/paper.md §4.2), without its model call: `build_coach_prompt` (the
documented template below) and `coach_requests` write the coach's prompts, one per agent turn that can have a
hindsight note; `note_from_reply` reads a note out of the coach's answer; `coach_note_message` +
`add_coach_notes` turn a note into a coach segment placed before the turn's assistant header (data/trajectory.py
placement rule). The chat call that asks a coach model for the notes is Stage II's (train/rl/agent.py
`coach_notes_batch`, `coach_notes`); the loss the notes feed is algorithms/csd.py.
"""

from __future__ import annotations

from typing import Callable, Sequence

from mimesis_jax.data.chat import render_turn
from mimesis_jax.data.trajectory import Trajectory

Message = dict  # {"role", "content"}: a chat message, as chat/base.py (not imported: no model I/O here)

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


def note_from_reply(text: str | None) -> str | None:
    """The note in a coach's answer: the stripped text, or None when it is empty or exactly NONE (any case)."""
    text = (text or "").strip()
    return None if not text or text.upper() == NO_NOTE else text


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

