"""ThoughtTrace SFT examples (paper Section 4.1 / digest 3.2): the user's thought first, then the utterance.

Each user turn's target is ``<think>\\n{thought}\\n</think>\\n\\n{utterance}<|im_end|>`` (thinking template on), where
the thought is rendered from the user's own self-reports: the *reactions* to the previous assistant reply (how they
took it) and the *reasons* for this message (why they sent it). Loss on the thought and the utterance; the
``<|im_start|>user\\n`` header is context (the rollout engine supplies it, then ``<think>\\n``: see ``chat.py``).

Accepted record schema (HF ``SCAI-JHU/ThoughtTrace``, one JSON object per conversation)::

    {"id": ..., "task_summary": str, "task_expectation": str, "survey_answers": ...,
     "messages": [{"type"|"role": "user"|"assistant", "content": str,
                   "reasons":   [{"label": str, "content": str}, ...],     # on user messages
                   "reactions": [{"label": str, "content": str}, ...]},    # on assistant messages (the reply
                  ...]}                                                    #  they react to), or on the next user one

A self-report may also be a bare label string, and ``"text"`` is accepted for ``"content"``. Labels are normalised
(lower case, ``&`` -> ``and``, other punctuation/spaces -> ``_``) and must be one of the 7 reason / 5 reaction labels
below (``REASON_LABELS``, ``REACTION_LABELS``; the names used in the released data); anything else is a
``RecordError`` naming the record and message. A reaction to the final assistant reply explains no user turn and is
not used.

Thought template (documented, deterministic): for each reaction, its sentence from ``REACTION_LABELS`` followed by
the user's own words; then, on a new line, for each reason, its sentence from ``REASON_LABELS`` followed by the
user's words. A user turn with no self-report keeps an empty think block in the context and is not a target.

The persona system message (when the record has the fields): ``Your task: {task_summary}``, ``What you expect from
the assistant: {task_expectation}``, ``About you: {survey answers as "question: answer; ..."}`` on separate lines.
"""

from __future__ import annotations

import re

import numpy as np

from mimesis_jax.data.chat import ChatFormatError, render_messages
from mimesis_jax.data.midtrain import RecordError, conversation_messages
from mimesis_jax.data.thought_phrases import REACTION_LABELS, REASON_LABELS, template_phrases  # noqa: F401
from mimesis_jax.data.tokenizer import Tokenizer

# Names seen in the dataset card ("Task Motivation & Goal") map to the released label names.
_LABEL_ALIASES = {"task_motivation_and_goal": "task_motivation"}


def normalize_label(label, kind: str, where: str) -> str:
    table = REASON_LABELS if kind == "reasons" else REACTION_LABELS
    if not isinstance(label, str):
        raise RecordError(f"{where}: {kind} label must be a string, got {label!r}")
    key = re.sub(r"[^a-z0-9]+", "_", label.strip().lower().replace("&", " and ")).strip("_")
    key = _LABEL_ALIASES.get(key, key)
    if key not in table:
        raise RecordError(f"{where}: unknown {kind[:-1]} label {label!r}; supported: {sorted(table)}")
    return key


def _reports(items, kind: str, where: str) -> list[tuple[str, str]]:
    """[(label, the user's words)] of a ``reasons`` / ``reactions`` field."""
    if items is None:
        return []
    if not isinstance(items, list):
        raise RecordError(f"{where}: '{kind}' must be a list, got {type(items).__name__}")
    out = []
    for j, it in enumerate(items):
        w = f"{where}.{kind}[{j}]"
        if isinstance(it, str):
            out.append((normalize_label(it, kind, w), ""))
        elif isinstance(it, dict):
            text = it.get("content") if it.get("content") is not None else (it.get("text") or "")
            if not isinstance(text, str):
                raise RecordError(f"{w}: content must be a string, got {type(text).__name__}")
            label = it.get("label") if it.get("label") is not None else it.get("category")
            out.append((normalize_label(label, kind, w), text.strip()))
        else:
            raise RecordError(f"{w}: a self-report must be an object or a label string, got {type(it).__name__}")
    return out


def render_thought(reactions: list[tuple[str, str]], reasons: list[tuple[str, str]]) -> str:
    """The first-person thought of one user turn (template in the module docstring)."""
    def block(items, table):
        return " ".join(table[label] + (" " + text if text else "") for label, text in items)

    parts = [block(reactions, REACTION_LABELS), block(reasons, REASON_LABELS)]
    return "\n".join(p for p in parts if p)


def persona_prompt(record: dict, where: str = "record") -> str | None:
    """The simulator's system message from ``task_summary`` / ``task_expectation`` / ``survey_answers``."""
    lines = []
    for key, lead in (("task_summary", "Your task: "), ("task_expectation", "What you expect from the assistant: ")):
        v = record.get(key)
        if v is None or (isinstance(v, str) and not v.strip()):
            continue
        if not isinstance(v, str):
            raise RecordError(f"{where}: '{key}' must be a string, got {type(v).__name__}")
        lines.append(lead + v.strip())
    survey = _survey(record.get("survey_answers"), where)
    if survey:
        lines.append("About you: " + survey)
    return "\n".join(lines) or None


def _survey(v, where: str) -> str:
    if v is None:
        return ""
    pairs: list[tuple[str, str]] = []
    if isinstance(v, dict):
        pairs = [(str(k), v[k]) for k in v]
    elif isinstance(v, list):
        for j, it in enumerate(v):
            if isinstance(it, str):
                pairs.append(("", it))
            elif isinstance(it, dict):
                q = next((it[k] for k in ("question", "q", "key", "name", "field") if it.get(k) is not None), "")
                a = next((it[k] for k in ("answer", "a", "value", "response") if it.get(k) is not None), None)
                if a is None:
                    raise RecordError(f"{where}: survey_answers[{j}] has no answer/value field: {it!r:.100}")
                pairs.append((str(q), a))
            else:
                raise RecordError(f"{where}: survey_answers[{j}] must be an object or a string")
    else:
        raise RecordError(f"{where}: 'survey_answers' must be an object or a list, got {type(v).__name__}")
    out = []
    for q, a in pairs:
        if isinstance(a, list):
            a = ", ".join(str(x) for x in a)
        a = str(a).strip()
        if a:
            out.append(f"{q.strip()}: {a}" if q.strip() else a)
    return "; ".join(out)


def thoughttrace_messages(record: dict, *, where: str = "record", persona: bool = True) -> tuple[list[dict], list[int]]:
    """(chat messages with user ``"reasoning"`` thoughts, indices of the user turns that are targets)."""
    msgs = conversation_messages(record, where=where)
    raw = next(record[k] for k in ("messages", "conversations", "conversation") if record.get(k) is not None)
    offset = len(msgs) - len(raw)  # a record-level "system" adds one leading message
    if persona and record.get("system") is None:
        p = persona_prompt(record, where)
        if p:
            msgs.insert(0, {"role": "system", "content": p})
            offset += 1
    targets: list[int] = []
    pending: list[tuple[str, str]] = []  # reactions to the latest assistant reply
    for i, m in enumerate(raw):
        w = f"{where}: messages[{i}]"
        msg = msgs[i + offset]
        reasons = _reports(m.get("reasons"), "reasons", w) if isinstance(m, dict) else []
        reactions = _reports(m.get("reactions"), "reactions", w) if isinstance(m, dict) else []
        if msg["role"] == "assistant":
            if reasons:
                raise RecordError(f"{w}: an assistant message carries 'reasons' (they belong to user messages)")
            pending = reactions
        elif msg["role"] == "user":
            if not msg["content"]:
                raise RecordError(f"{w}: empty user message")
            own = pending + reactions
            pending = []
            msg["reasoning"] = render_thought(own, reasons)
            if own or reasons:
                targets.append(i + offset)
        elif reasons or reactions:
            raise RecordError(f"{w}: self-reports on a {msg['role']} message")
    if not targets:
        raise RecordError(f"{where}: no user turn has a self-report (nothing to train on)")
    return msgs[: targets[-1] + 1], targets


def thoughttrace_example(tok: Tokenizer, record: dict, *, where: str = "record", persona: bool = True) -> dict:
    """{"tokens": int32 [T], "loss_mask": int32 [T]}: loss on the targets' think block, utterance and ``<|im_end|>``."""
    msgs, targets = thoughttrace_messages(record, where=where, persona=persona)
    try:
        r = render_messages(tok, msgs, enable_thinking=True)
    except ChatFormatError as e:
        raise RecordError(f"{where}: {e}") from e
    mask = r.mask("user", turns=targets)
    return {"tokens": np.asarray(r.ids, dtype=np.int32), "loss_mask": mask.astype(np.int32)}
