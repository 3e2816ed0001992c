"""The conversation files simulator evaluation reads (tau-bench User-Sim Index, RealUserSim, SimulatorArena).

Format: JSONL, one conversation per line (blank lines are skipped)::

    {"id": "c17", "task_id": "retail_4", "source": "simulator",
     "messages": [{"role": "user", "content": "hi, I need to return a lamp"},
                  {"role": "assistant", "content": "Sure -- what is your order number?"}, ...],
     "success": true, "difficulty": 0.35, ...}

* ``id`` (str or int, required): unique within its file.
* ``task_id`` (str or int, required): the task the conversation was run on; simulator and human conversations of
  the same task are compared (ECE per task; the judge-based metrics pair them by task).
* ``source`` (required): ``"simulator"`` (the simulated user) or ``"human"`` (a real user) -- a loader told which
  side a file holds checks it.
* ``messages`` (required, non-empty): ``{"role": "user" | "assistant", "content": str}``. ``user`` turns are the
  (simulated or real) user's, ``assistant`` turns the agent's; only user turns feed the User-Sim Index features.
* ``success`` (bool or null, optional): did the agent solve the task in this conversation (ECE's success rates).
* ``difficulty`` (number in [0, 1] or null, optional): the task's difficulty, the pooled success rate of reference
  simulators (docs/reference/metrics.md, ECE). Every conversation of a task that gives one must give the same value.
* any other key is kept in ``Conversation.extra`` and otherwise ignored.

Errors (`EnvError`) name the file, the line and the field. Integer ids / task ids are read as strings.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Sequence

from mimesis_jax.data import jsonio
from mimesis_jax.envs.agent_env import EnvError

SOURCES = ("simulator", "human")
ROLES = ("user", "assistant")
_KNOWN = ("id", "task_id", "source", "messages", "success", "difficulty")


@dataclasses.dataclass
class Conversation:
    id: str
    task_id: str
    source: str
    messages: list[dict]
    success: bool | None = None
    difficulty: float | None = None
    where: str = ""  # "FILE, line N": where it was read from, for error messages
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def user_turns(self) -> list[str]:
        return [m["content"] for m in self.messages if m["role"] == "user"]


def _ident(obj: dict, key: str, where: str) -> str:
    if key not in obj:
        raise EnvError(f"{where}: missing field {key!r}")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (str, int)) or (isinstance(v, str) and not v.strip()):
        raise EnvError(f"{where}: field {key!r} must be a non-empty string or an integer, got {v!r}")
    return str(v)


def parse_conversation(obj: Any, where: str, source: str | None = None) -> Conversation:
    """One conversation object checked against the format; `source` (when given) is the side it must be."""
    if not isinstance(obj, dict):
        raise EnvError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    cid = _ident(obj, "id", where)
    where = f"{where} (id {cid})"
    task_id = _ident(obj, "task_id", where)
    src = obj.get("source")
    if src not in SOURCES:
        raise EnvError(f"{where}: field 'source' must be one of {SOURCES}, got {src!r}")
    if source is not None and src != source:
        raise EnvError(f"{where}: field 'source' is {src!r}, but this file must hold {source!r} conversations")
    msgs = obj.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise EnvError(f"{where}: field 'messages' must be a non-empty list, got {msgs!r}"[:300])
    messages = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise EnvError(f"{where}: field 'messages[{i}]' must be an object, got {type(m).__name__}")
        if m.get("role") not in ROLES:
            raise EnvError(f"{where}: field 'messages[{i}].role' must be one of {ROLES}, got {m.get('role')!r}")
        if not isinstance(m.get("content"), str):
            raise EnvError(f"{where}: field 'messages[{i}].content' must be a string, got "
                           f"{type(m.get('content')).__name__}")
        messages.append({"role": m["role"], "content": m["content"]})
    success = obj.get("success")
    if success is not None and not isinstance(success, bool):
        raise EnvError(f"{where}: field 'success' must be true, false or null, got {success!r}")
    difficulty = obj.get("difficulty")
    if difficulty is not None:
        if isinstance(difficulty, bool) or not isinstance(difficulty, (int, float)) or \
                not math.isfinite(difficulty) or not 0.0 <= difficulty <= 1.0:
            raise EnvError(f"{where}: field 'difficulty' must be a number in [0, 1] or null, got {difficulty!r}")
        difficulty = float(difficulty)
    return Conversation(cid, task_id, src, messages, success, difficulty, where,
                        {k: v for k, v in obj.items() if k not in _KNOWN})


def load_conversations(path: str | os.PathLike, source: str | None = None) -> list[Conversation]:
    """Every conversation of a JSONL file (format in the module docstring); `source` checks each one's side."""
    if source is not None and source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    if not os.path.isfile(path):
        raise EnvError(f"conversation file {path} does not exist")
    out: list[Conversation] = []
    seen: dict[str, int] = {}
    for n, obj in jsonio.read_jsonl_numbered(path, error=EnvError):
        where = f"{path}, line {n}"
        conv = parse_conversation(obj, where, source)
        if conv.id in seen:
            raise EnvError(f"{conv.where}: field 'id' {conv.id!r} is already used on line {seen[conv.id]}")
        seen[conv.id] = n
        out.append(conv)
    if not out:
        raise EnvError(f"conversation file {path} holds no conversations")
    return out


@dataclasses.dataclass
class Pair:
    """A simulator conversation and the human reference conversation of the same task."""

    simulator: Conversation
    human: Conversation


def pair_by_task(simulated: Sequence[Conversation], human: Sequence[Conversation]) -> tuple[list[Pair], list[str]]:
    """(pairs, ids of simulator conversations whose task has no human conversation).

    The k-th simulator conversation of a task (file order) is paired with human conversation k mod H of that task
    (H = the task's number of human conversations), so every simulator conversation is judged once."""
    by_task: dict[str, list[Conversation]] = {}
    for h in human:
        by_task.setdefault(h.task_id, []).append(h)
    pairs, unpaired, used = [], [], {}
    for s in simulated:
        refs = by_task.get(s.task_id)
        if not refs:
            unpaired.append(s.id)
            continue
        k = used.get(s.task_id, 0)
        used[s.task_id] = k + 1
        pairs.append(Pair(s, refs[k % len(refs)]))
    return pairs, unpaired


def render_transcript(conv: Conversation) -> str:
    """The conversation as a judge reads it: one ``USER:`` / ``ASSISTANT:`` block per message."""
    return "\n\n".join(f"{m['role'].upper()}: {m['content']}" for m in conv.messages)
