"""Social-R1: one social-reasoning multiple-choice question (choice family, single turn).

Protocol (OdysSim ``agents/social_r1``, this project's wording): the record's stored question text -- a short
story, a question about the people in it and lettered options -- is put to the policy with this project's
instructions: think briefly, then give the letter of the answer inside ``<answer></answer>``.

Reward (r_d of Eq 4): accuracy -- 1.0 when the parsed letter equals the gold letter, else 0.0 (also when no
letter can be read). The valid letters are the option lines of the prompt ("A. ...", "B) ..." at a line start);
when the prompt has fewer than two such lines (options written inline), every letter A-Z counts, as in OdysSim.

Record (OdysSim's field names): the question text as ``prompt_text`` str, else ``conversations[0].messages[0]
.content`` (the upstream wrapper), else ``prompt`` str; the gold as ``answer_letter`` str, else (also when it is "",
as OdysSim) ``answer_text``
str starting with the letter ("B. in the drawer"). A gold that is not a letter, or not among the prompt's option
letters, is an `EnvError` (OdysSim falls back to the text's first character).
"""

from __future__ import annotations

import re
import string

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.soul.base import ChoiceEnv, register, stored_prompt

_OPTION_LINE_RE = re.compile(r"^\s*([A-Z])[\.\)]\s+", re.MULTILINE)
_GOLD_TEXT_RE = re.compile(r"\s*([A-Za-z])(?:[\.\)]\s*.*)?", re.DOTALL)


def option_letters(prompt: str) -> list[str]:
    """The letters of the prompt's option lines (sorted, distinct); A-Z when fewer than two are found."""
    found = sorted(set(_OPTION_LINE_RE.findall(prompt)))
    return found if len(found) >= 2 else list(string.ascii_uppercase)


def gold_letter(record: dict, where: str) -> str:
    """``answer_letter``, else the leading letter of ``answer_text`` ("B. text", "B) text" or "B")."""
    letter = record.get("answer_letter")
    if isinstance(letter, str) and not letter.strip():
        letter = None  # OdysSim: an empty answer_letter falls back to answer_text
    if letter is not None:
        if not isinstance(letter, str) or not re.fullmatch(r"\s*[A-Za-z]\s*", letter):
            raise EnvError(f"{where}: field 'answer_letter' must be one letter, got {letter!r}")
        return letter.strip().upper()
    text = record.get("answer_text")
    if text is None:
        raise EnvError(f"{where}: missing field 'answer_letter' (or 'answer_text')")
    m = _GOLD_TEXT_RE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise EnvError(f"{where}: field 'answer_text' must start with the option letter ('B. ...'), got {text!r}")
    return m.group(1).upper()


@register
class SocialR1(ChoiceEnv):
    name = "social_r1"
    protocol = "story + social-reasoning question with lettered options; answer the letter in <answer></answer>"
    reward_doc = "accuracy: 1 if the chosen letter equals the gold letter, else 0"
    record_format = ("prompt_text (or conversations[0].messages[0].content, or prompt); answer_letter, or "
                     "answer_text 'B. option'")
    fields = (("prompt_text", str, True), ("conversations", list, True), ("prompt", str, True))

    @classmethod
    def parse_record(cls, record, where):
        record = super().parse_record(record, where)
        prompt = stored_prompt(record, where, fallback="prompt")
        gold = gold_letter(record, where)
        letters = option_letters(prompt)
        if gold not in letters:
            field_name = "answer_letter" if str(record.get("answer_letter") or "").strip() else "answer_text"
            raise EnvError(f"{where}: field {field_name!r} gives {gold!r}, which is not an option letter of the "
                           f"prompt ({', '.join(letters)})")
        return {**record, "prompt_text": prompt, "answer_letter": gold}

    answer_letters = "A-Z"  # OdysSim: <answer>\s*([A-Z])\s*</answer>, case-insensitive

    def letters(self):
        return option_letters(self.record["prompt_text"])

    def gold(self):
        return self.record["answer_letter"]

    def initial_messages(self):
        return [{"role": "user", "content": self.prompt("question", question=self.record["prompt_text"])}]
