"""Mistakes: simulating a student's misconception on a multiple-choice maths question (choice family, single turn;
one SOUL domain of Eq 4).

Protocol (OdysSim ``agents/mistakes``, this project's wording): a system message casts the policy as a K-12
student who holds a given misconception; the user message gives the question, its lettered options and the
misconception. The policy reasons as that student and gives the letter the student would pick inside
``<answer></answer>``. Reward: 1.0 when the letter read as OdysSim reads it (`ChoiceEnv`: the first
``<answer>X</answer>``, X in A-D) equals ``TargetOption`` (the wrong option the misconception leads to), else 0.0.

Record (OdysSim's field names; the agent also reads the lower-case alias after the slash): ``QuestionText`` /
``question`` str, ``AnswerAText`` .. ``AnswerDText`` str (an empty or missing one is not offered; at least two
must be present), ``MisconceptionName`` / ``misconception_text`` str, ``TargetOption`` / ``target_option`` str (a
letter of a present option); optional ``TargetAnswer``, ``MisconceptionId``, ``id``.
"""

from __future__ import annotations

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.soul.base import ChoiceEnv, aliased_field, register

LETTERS = "ABCD"


@register
class Mistakes(ChoiceEnv):
    name = "mistakes"
    protocol = "maths MCQ + a student misconception; answer as that student, option letter in <answer></answer>"
    reward_doc = "accuracy: 1 if the chosen letter equals TargetOption (the misconception's wrong option), else 0"
    record_format = ("QuestionText, AnswerAText..AnswerDText (2-4 present), MisconceptionName, TargetOption (letter); "
                     "lower-case aliases question, misconception_text, target_option")
    fields = tuple((f"Answer{x}Text", str, True) for x in LETTERS)

    @classmethod
    def parse_record(cls, record, where):
        record = dict(super().parse_record(record, where))
        record["QuestionText"] = aliased_field(record, ("QuestionText", "question"), str, where)
        record["MisconceptionName"] = aliased_field(record, ("MisconceptionName", "misconception_text"), str, where)
        record["TargetOption"] = aliased_field(record, ("TargetOption", "target_option"), str, where)
        present = [x for x in LETTERS if (record.get(f"Answer{x}Text") or "").strip()]
        if len(present) < 2:
            raise EnvError(f"{where}: fields 'AnswerAText'..'AnswerDText' must hold at least two options")
        if record["TargetOption"].strip().upper() not in present:
            raise EnvError(f"{where}: field 'TargetOption' {record['TargetOption']!r} is not one of the option "
                           f"letters {', '.join(present)}")
        return record

    def options(self):
        texts = {x: (self.record.get(f"Answer{x}Text") or "").strip() for x in LETTERS}
        return {x: t for x, t in texts.items() if t}

    def gold(self):
        return self.record["TargetOption"].strip().upper()

    def initial_messages(self):
        return [{"role": "system", "content": self.prompt("system", letters=", ".join(self.letters()))},
                {"role": "user", "content": self.prompt(
                    "question", question=self.record["QuestionText"].strip(),
                    options="\n".join(f"{k}. {v}" for k, v in self.options().items()),
                    misconception=self.record["MisconceptionName"].strip())}]
