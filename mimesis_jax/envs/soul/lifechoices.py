"""LifeChoices: persona-driven decisions of literary characters (choice family, single turn; one SOUL domain of
Eq 4).

Protocol (OdysSim ``agents/lifechoices``, this project's wording): the policy plays a book character given the
character's name, memories (``input_text``), a scenario, a question and lettered options, and gives the letter
of the choice the character would make inside ``<answer></answer>``. Reward: 1.0 when the letter read by
`read_choice` equals the first letter of ``Correct Answer``, else 0.0.

Reading the letter follows OdysSim's ``extract_choice``: the reply is stripped and upper-cased; a reply that is
just A-D is that letter; else the first match, in order, of ``<answer>X</answer>``, a leading ``X.``/``X)``/
``X:``/``X,``, ``CHOICE X``, ``ANSWER X``, ``(X)``, a trailing X. ONE DIFFERENCE, on purpose: OdysSim's last
fallback is the first A-D character anywhere in the upper-cased reply, which is usually the A of ``<ANSWER>``
itself or a letter inside a word ("I THINK..." -> no, "BECAUSE" -> B); this project's last fallback is the first
STANDALONE A-D (not inside a word), so a reply with no letter of its own scores 0. (``lenient=True`` selects the
forgiving `parse_choice` reader.)

Record (OdysSim's field names): ``character_name`` str, ``input_text`` str (the character's memories),
``Multiple Choice Question`` object with ``Scenario`` str, ``Question`` str, ``Options`` list of 2-4 str (lettered
A, B, ... in order) and ``Correct Answer`` str (a letter, possibly followed by text: "B" or "B. ..."); optional
``book`` str.
"""

from __future__ import annotations

import re

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.model_io import field
from mimesis_jax.envs.soul.base import ChoiceEnv, register

MCQ = "Multiple Choice Question"
_PATTERNS = (r"<answer>\s*([ABCD])\s*</answer>", r"^([ABCD])\s*[.):,]", r"choice[:\s]+([ABCD])",
             r"answer[:\s]+([ABCD])", r"\(([ABCD])\)", r"^([ABCD])$", r"([ABCD])\s*$")
_STANDALONE = re.compile(r"(?<![A-Z0-9_])([ABCD])(?![A-Z0-9_])")


def read_choice(reply: str | None) -> str | None:
    """The chosen letter as OdysSim's lifechoices reader finds it, except the last fallback (module docstring)."""
    if not reply:
        return None
    text = reply.strip().upper()
    if text in ("A", "B", "C", "D"):
        return text
    for pattern in _PATTERNS:
        m = re.search(pattern, text, re.IGNORECASE)
        if m:
            return m.group(1).upper()
    m = _STANDALONE.search(text)  # OdysSim: the first A-D character anywhere (see the module docstring)
    return m.group(1) if m else None


@register
class LifeChoices(ChoiceEnv):
    name = "lifechoices"
    protocol = "play a book character (memories + scenario) and pick the option they would choose; letter in <answer>"
    reward_doc = "accuracy: 1 if the chosen letter equals the first letter of Correct Answer, else 0"
    record_format = ("character_name, input_text, 'Multiple Choice Question' {Scenario, Question, Options (2-4), "
                     "Correct Answer (letter)}; optional book")
    fields = (("character_name", str, False), ("input_text", str, False), (MCQ, dict, False), ("book", str, True))

    @classmethod
    def parse_record(cls, record, where):
        record = super().parse_record(record, where)
        mcq, inner = record[MCQ], f"{where}, field {MCQ!r}"
        for key in ("Scenario", "Question", "Correct Answer"):
            field(mcq, key, str, inner)
        options = field(mcq, "Options", list, inner)
        if not 2 <= len(options) <= 4 or not all(isinstance(o, str) and o.strip() for o in options):
            raise EnvError(f"{inner}: field 'Options' must list 2 to 4 non-empty strings")
        letters = list("ABCD"[:len(options)])
        if mcq["Correct Answer"].strip()[:1].upper() not in letters:
            raise EnvError(f"{inner}: field 'Correct Answer' {mcq['Correct Answer']!r} is not one of the option "
                           f"letters {', '.join(letters)}")
        return record

    def strict_extract(self, utterance):
        return read_choice(utterance)

    def options(self):
        return {"ABCD"[i]: text.strip() for i, text in enumerate(self.record[MCQ]["Options"])}

    def gold(self):
        return self.record[MCQ]["Correct Answer"].strip()[0].upper()

    def initial_messages(self):
        mcq = self.record[MCQ]
        return [{"role": "user", "content": self.prompt(
            "question", character=self.record["character_name"], book=self.record.get("book") or "unknown",
            memories=self.record["input_text"], scenario=mcq["Scenario"], question=mcq["Question"],
            options="\n".join(f"{k}. {v}" for k, v in self.options().items()))}]
