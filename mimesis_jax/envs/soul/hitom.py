"""HiToM: higher-order theory of mind over a story with deceptive agents (choice family, single turn).

Protocol (OdysSim ``agents/hitom``, this project's wording): the story, optional extra notes and a question with
lettered options "A. ..., B. ..." are put to the policy, which reasons and answers with the letter inside
``<answer></answer>``. Reward: 1.0 when the chosen letter's option text equals ``correct_answer``, else 0.0.

Record (OdysSim's field names): ``story`` str, ``question`` str, ``choices`` str ("A. opt, B. opt, ..."),
``correct_answer`` str (an option's text); optional ``extra_info`` str, ``deception``, ``story_length``,
``question_order``, ``index``.
"""

from __future__ import annotations

import re

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.soul.base import ChoiceEnv, register

_CHOICE_RE = re.compile(r"([A-Z])\.\s*(.+?)(?=,\s*[A-Z]\.\s|$)", re.DOTALL)


def split_choices(choices: str) -> dict[str, str]:
    """'A. red box, B. green bag' -> {'A': 'red box', 'B': 'green bag'}."""
    return {k: v.strip() for k, v in _CHOICE_RE.findall(choices.strip())}


@register
class HiToM(ChoiceEnv):
    name = "hitom"
    protocol = "story + higher-order belief question with lettered options; answer the letter in <answer></answer>"
    reward_doc = "accuracy: 1 if the chosen option's text equals correct_answer, else 0"
    record_format = "story, question, choices ('A. x, B. y'), correct_answer (option text); optional extra_info"
    fields = (("story", str, False), ("question", str, False), ("choices", str, False),
              ("correct_answer", str, False), ("extra_info", str, True))

    @classmethod
    def parse_record(cls, record, where):
        record = super().parse_record(record, where)
        opts = split_choices(record["choices"])
        if len(opts) < 2:
            raise EnvError(f"{where}: field 'choices' must list lettered options 'A. ..., B. ...'")
        if record["correct_answer"].strip() not in opts.values():
            raise EnvError(f"{where}: field 'correct_answer' {record['correct_answer']!r} is not one of the choices")
        return record

    answer_letters = "A-Z"  # OdysSim: <answer>\s*([A-Z])\s*</answer>, case-insensitive

    def options(self):
        return split_choices(self.record["choices"])

    def is_correct(self, predicted):
        # OdysSim: the letter must name a parsed choice whose text equals correct_answer
        return self.options().get(predicted.upper(), "").strip() == self.record["correct_answer"].strip()

    def gold(self):
        want = self.record["correct_answer"].strip()
        return next(k for k, v in self.options().items() if v == want)

    def initial_messages(self):
        return [{"role": "user", "content": self.prompt(
            "question", story=self.record["story"], notes=self.record.get("extra_info") or "(none)",
            question=self.record["question"], choices=self.record["choices"])}]
