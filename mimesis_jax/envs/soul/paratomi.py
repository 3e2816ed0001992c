"""ParaToMI: object-location theory of mind over paraphrased ToMi stories (choice family, single turn; one SOUL
domain of Eq 4).

Protocol (OdysSim ``agents/paratomi``, this project's wording): the story, optional notes, the question and, when
the record has them, the candidate locations are put to the policy, which reasons and writes the most specific
location inside ``<answer></answer>``. The answer is the content of the FIRST ``<answer>`` tag, as OdysSim's
``re.search`` reads it; a reply without one scores 0 (``lenient=True``: `parse_exact`, the last tag, else the
text after the last "Answer:"). Reward, as OdysSim: 1.0 when ``correct_answer``
occurs in the answer as a whole word (case-insensitive) AND no other candidate does (so listing every
candidate scores 0); else 0.0.

Record (OdysSim's field names): ``story`` (list of sentences, a Python-list literal string of them, or plain
text), ``question`` str, ``correct_answer`` str; optional ``cands`` (list of str, or a Python-list literal
string), ``extra_info`` str (notes), ``qType``, ``qTypeRaw``, ``index``. `parse_record` returns the record with
``story`` joined into one str and ``cands`` as a list of str (literal strings are read with `ast.literal_eval`,
never executed).
"""

from __future__ import annotations

import ast
import re

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.soul.base import ChoiceEnv, first_tag, register


def _as_list(value) -> list:
    """A list as is; a str holding a Python list literal, read; any other str, a list of itself."""
    if isinstance(value, list):
        return value
    if value.strip().startswith("["):
        try:
            parsed = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            parsed = None
        if isinstance(parsed, list):
            return parsed
    return [value]


def _str_items(items: list, where: str, key: str) -> list[str]:
    bad = [x for x in items if not isinstance(x, str)]
    if bad:
        raise EnvError(f"{where}: field {key!r} must list strings, got {bad[0]!r}")
    return [x.strip() for x in items if x.strip()]


def contains_word(needle: str, text: str) -> bool:
    """`needle` occurs in `text` as a whole word (not inside a longer word), case-insensitive."""
    return bool(needle) and re.search(rf"(?<!\w){re.escape(needle.lower())}(?!\w)", text.lower()) is not None


@register
class ParaToMI(ChoiceEnv):
    name = "paratomi"
    protocol = "story + location question (optional candidates); most specific location in <answer></answer>"
    reward_doc = "1 if correct_answer is in the answer as a whole word and no other candidate is, else 0"
    record_format = ("story (list or str), question, correct_answer; optional cands (list or list-literal str), "
                     "extra_info")
    fields = (("story", (str, list), False), ("question", str, False), ("correct_answer", str, False),
              ("cands", (str, list), True), ("extra_info", str, True))

    @classmethod
    def parse_record(cls, record, where):
        record = dict(super().parse_record(record, where))
        record["story"] = " ".join(_str_items(_as_list(record["story"]), where, "story"))
        if not record["story"]:
            raise EnvError(f"{where}: field 'story' is empty")
        if not record["correct_answer"].strip():
            raise EnvError(f"{where}: field 'correct_answer' is empty")
        record["cands"] = _str_items(_as_list(record.get("cands") or []), where, "cands")
        return record

    def strict_extract(self, utterance):
        return first_tag(utterance) or None  # OdysSim: the FIRST <answer> tag's content; none or empty scores 0

    def gold(self):
        return self.record["correct_answer"].strip()

    def is_correct(self, predicted):
        gold = self.gold()
        others = [c for c in self.record["cands"] if c.lower() != gold.lower()]
        return contains_word(gold, predicted) and not any(contains_word(c, predicted) for c in others)

    def initial_messages(self):
        cands = self.record["cands"]
        section = self.prompt("candidates", candidates=", ".join(cands)) if cands else ""
        return [{"role": "user", "content": self.prompt(
            "question", story=self.record["story"], notes=self.record.get("extra_info") or "(none)",
            question=self.record["question"], candidates=section)}]
