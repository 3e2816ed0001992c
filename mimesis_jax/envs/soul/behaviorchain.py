"""BehaviorChain: choose a fictional persona's next behaviour in a chain of context-behaviour steps (choice family,
single turn).

Protocol (OdysSim ``agents/behavior_chain``, task name ``behaviorchain``; this project's wording): the policy sees
the persona's profile, the story before the chain, the chain's earlier steps (context, then what the persona did)
and the current context, and picks which of four behaviours A-D the persona most likely shows next, answering the
letter inside ``<answer></answer>``.

Reward (r_d of Eq 4): accuracy -- 1.0 when the parsed letter equals ``right_option_letter``, else 0.0 (also when no
letter can be read).

Record (OdysSim's field names). In OdysSim's verl rows the task's row is stored as a JSON string:
``extra_info = {"raw": "<json object>"}``; a record with a string ``raw`` is decoded, otherwise the record itself
is the row. Row fields: ``current_context`` str, ``right_option_letter`` str (A-D), the options as
``options_dict`` {A, B, C, D: str} or ``options`` [4 str]; optional ``persona_name`` str (default "the persona"),
``profile_text`` (or ``profile``) str, the prior story as ``history_truncated`` [{chapter_num, chapter_content} |
str] or ``history_text`` str, the earlier steps as ``prior_chain`` [{context, behavior}] or ``prior_chain_text``
str. Missing optional sections are shown as "(none)".
"""

from __future__ import annotations

import json

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.model_io import field
from mimesis_jax.envs.soul.base import ChoiceEnv, register

LETTERS = ("A", "B", "C", "D")
NONE = "(none)"


def _options(row: dict, where: str) -> dict[str, str]:
    """The four options as {letter: text}, from ``options_dict`` or the list ``options``."""
    if row.get("options_dict") is not None:
        opts = field(row, "options_dict", dict, where)
        if sorted(opts) != list(LETTERS) or not all(isinstance(v, str) and v.strip() for v in opts.values()):
            raise EnvError(f"{where}: field 'options_dict' must map exactly A, B, C, D to non-empty texts")
        return {k: opts[k].strip() for k in LETTERS}
    opts = field(row, "options", list, where)
    if len(opts) != len(LETTERS) or not all(isinstance(v, str) and v.strip() for v in opts):
        raise EnvError(f"{where}: field 'options' must list exactly 4 non-empty texts (A-D)")
    return {k: v.strip() for k, v in zip(LETTERS, opts)}


def _history(row: dict, where: str) -> str:
    items = field(row, "history_truncated", list, where, optional=True)
    if items:
        parts = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                parts.append(item.strip())
                continue
            at = f"{where}, field 'history_truncated' item {i}"
            content = field(item, "chapter_content", str, at).strip()
            chapter = field(item, "chapter_num", (str, int), at, optional=True)
            chapter = str(chapter).strip() if chapter is not None else ""
            parts.append(f"{chapter}\n{content}" if chapter and content else content)
        return "\n\n".join(p for p in parts if p) or NONE
    return (field(row, "history_text", str, where, optional=True) or "").strip() or NONE


def _prior_chain(row: dict, where: str) -> list[dict]:
    steps = field(row, "prior_chain", list, where, optional=True) or []
    out = []
    for i, step in enumerate(steps):
        at = f"{where}, field 'prior_chain' item {i}"
        out.append({k: field(step, k, str, at, optional=True, default="").strip() for k in ("context", "behavior")})
    return out


@register
class BehaviorChain(ChoiceEnv):
    name = "behaviorchain"
    protocol = ("persona profile, prior story, earlier context-behaviour steps and the current context; pick the "
                "persona's next behaviour A-D in <answer></answer>")
    reward_doc = "accuracy: 1 if the chosen letter equals right_option_letter, else 0"
    record_format = ("raw (JSON string of the row) or the row: current_context, right_option_letter, options_dict "
                     "{A-D} | options [4]; optional persona_name, profile_text|profile, history_truncated|"
                     "history_text, prior_chain [{context, behavior}]|prior_chain_text")
    fields = (("current_context", str, False), ("right_option_letter", str, False), ("persona_name", str, True),
              ("profile_text", str, True), ("profile", str, True), ("prior_chain_text", str, True))

    @classmethod
    def parse_record(cls, record, where):
        if isinstance(record.get("raw"), str):
            try:
                row = json.loads(record["raw"])
            except json.JSONDecodeError as e:
                raise EnvError(f"{where}: field 'raw' is not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise EnvError(f"{where}: field 'raw' must hold a JSON object, got {type(row).__name__}")
            where = f"{where}, field 'raw'"
        else:
            row = record
        row = super().parse_record(row, where)
        letter = row["right_option_letter"].strip().upper()
        if letter not in LETTERS:
            raise EnvError(f"{where}: field 'right_option_letter' must be one of A-D, got "
                           f"{row['right_option_letter']!r}")
        if not row["current_context"].strip():
            raise EnvError(f"{where}: field 'current_context' is empty")
        return {**row, "right_option_letter": letter, "options_dict": _options(row, where),
                "history_text": _history(row, where), "prior_chain": _prior_chain(row, where)}

    def options(self):
        return self.record["options_dict"]

    def gold(self):
        return self.record["right_option_letter"]

    def chain_text(self) -> str:
        steps = self.record["prior_chain"]
        if steps:
            return "\n".join(self.prompt("step", n=i + 1, context=s["context"] or NONE,
                                         behavior=s["behavior"] or NONE) for i, s in enumerate(steps))
        return (self.record.get("prior_chain_text") or "").strip() or NONE

    def initial_messages(self):
        r = self.record
        profile = (r.get("profile_text") or r.get("profile") or "").strip() or NONE
        options = "\n".join(f"{k}. {v}" for k, v in r["options_dict"].items())
        return [{"role": "user", "content": self.prompt(
            "question", name=(r.get("persona_name") or "").strip() or "the persona", profile=profile,
            history=r["history_text"], chain=self.chain_text(), context=r["current_context"].strip(),
            options=options)}]
