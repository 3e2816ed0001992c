"""FanToM: theory of mind in a multi-party conversation (choice family, single turn; one SOUL domain of Eq 4).

Protocol (OdysSim ``agents/fantom``, this project's wording): a conversation, optional notes and one question are
put to the policy, which reasons and writes its final answer inside ``<answer></answer>``. The answer is read
from the FIRST ``<answer>`` tag only, as OdysSim's ``re.search`` does (a reply without one scores 0;
``lenient=True`` reads the last tag). Reward r_d in [0, 1] depends on
``question_type``, as in OdysSim:

* ``tom:belief:*:multiple-choice`` -- the options are inside the question text; ``correct_answer`` is the option
  index 0-3 (``a``-``d``). 1.0 when the tag holds exactly that letter, as OdysSim reads it: "b", "(b)", "b)",
  "b.", any case; "b. text" or "Option B" score 0 (lenient: `parse_choice`).
* ``*:list`` -- ``correct_answer`` / ``wrong_answer`` are name lists. 1.0 when every correct name and no wrong
  name occurs in the answer as a whole word (case-insensitive).
* ``*:binary`` -- ``correct_answer`` is ``yes``, ``no`` or ``no:long``. 1.0 when the answer says the right
  polarity and not the other one (`says_yes` / `says_no`: a hedge naming both scores 0).
* ``fact*`` -- token F1 between gold and answer normalised as OdysSim does (lower case, articles, then
  punctuation removed): with c common tokens (multiset),
  p = c / |answer tokens|, r = c / |gold tokens|, F1 = 2pr / (p + r); 0 when c = 0 or either side is empty.

Record (OdysSim's field names, one flattened question per row): ``context`` str (the conversation),
``question_type`` str, ``correct_answer`` (int or digit str for multiple-choice; list of str or a "['A', 'B']"
str for list questions; str otherwise), ``complete_question`` str (the question with its embedded options and
instructions; ``question`` str is used when it is absent -- one of the two is required); optional
``wrong_answer`` (list or str, list questions), ``extra_info`` str (notes), ``missed_info_accessibility``,
``tom_type``, ``set_id``, ``part_id``.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.sim_env import SimTurn
from mimesis_jax.envs.soul.base import ChoiceEnv, extract_tag, first_tag, parse_choice, register

MC_LETTERS = "ABCD"
BINARY_GOLD = {"yes": "yes", "no": "no", "no:long": "no"}


def question_kind(question_type: str) -> str | None:
    """'choice' | 'list' | 'binary' | 'fact' for a FanToM question_type, None when it is none of them."""
    if question_type.startswith("tom:belief:") and question_type.endswith(":multiple-choice"):
        return "choice"
    if question_type.endswith(":list"):
        return "list"
    if question_type.endswith(":binary"):
        return "binary"
    if question_type.startswith("fact"):
        return "fact"
    return None


def name_list(value) -> list[str]:
    """A list of names from a list or a "['A', 'B']" / "A, B" string (brackets and quotes stripped)."""
    items = value if isinstance(value, list) else str(value).split(",")
    names = (str(x).strip(" []'\"") for x in items)
    return [n for n in names if n]


def has_word(name: str, text: str) -> bool:
    """`name` occurs in `text` as a whole word (not inside a longer word), case-insensitive."""
    return re.search(rf"(?<!\w){re.escape(name.lower())}(?!\w)", text.lower()) is not None


def _says(text: str, starts: tuple[str, ...], inside: tuple[str, ...]) -> bool:
    t = text.lower().strip().strip("'\"")
    return t.startswith(starts) or any(p in t for p in inside)


def says_yes(text: str) -> bool:
    """Starts with yes/true, or contains ' yes,' / ' yes ' / ' yes.' / ' knows '."""
    return _says(text, ("yes", "true"), (" yes,", " yes ", " yes.", " knows "))


def says_no(text: str) -> bool:
    """Starts with no/false, or contains ' no,' / ' no ' / ' no.' / ' does not know ' / " doesn't know "."""
    return _says(text, ("no", "false"), (" no,", " no ", " no.", " does not know ", " doesn't know "))


def _f1_norm(s: str) -> str:
    """OdysSim's order: lower case, articles out, THEN punctuation out ("a.m." -> "m"), whitespace collapsed."""
    s = re.sub(r"\b(a|an|the)\b", " ", s.lower())
    return " ".join(s.translate(str.maketrans("", "", string.punctuation)).split())


def token_f1(gold: str, predicted: str) -> float:
    """SQuAD-style token F1 of `predicted` against `gold` (both normalised as OdysSim does, `_f1_norm`)."""
    g, p = _f1_norm(gold).split(), _f1_norm(predicted).split()
    common = sum((Counter(g) & Counter(p)).values())
    if not g or not p or common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


@register
class FanToM(ChoiceEnv):
    name = "fantom"
    protocol = ("multi-party conversation + a theory-of-mind question (multiple-choice, list, yes/no or fact); "
                "answer inside <answer></answer>")
    reward_doc = ("per question_type: letter match (multiple-choice), all correct and no wrong names (list), "
                  "right polarity only (binary), token F1 (fact)")
    record_format = ("context, question_type, correct_answer, complete_question (or question); optional "
                     "wrong_answer, extra_info, missed_info_accessibility, set_id, part_id")
    fields = (("context", str, False), ("question_type", str, False), ("correct_answer", (int, str, list), False),
              ("complete_question", str, True), ("question", str, True), ("wrong_answer", (str, list), True),
              ("extra_info", str, True))

    @classmethod
    def parse_record(cls, record, where):
        record = super().parse_record(record, where)
        if not record.get("complete_question") and not record.get("question"):
            raise EnvError(f"{where}: missing field 'complete_question' (or 'question')")
        kind = question_kind(record["question_type"])
        gold = record["correct_answer"]
        if kind is None:
            raise EnvError(f"{where}: field 'question_type' {record['question_type']!r} is not a FanToM type "
                           f"(tom:belief:*:multiple-choice, *:list, *:binary, fact*)")
        if kind == "choice":
            if isinstance(gold, list) or not str(gold).strip().isdigit() or int(gold) >= len(MC_LETTERS):
                raise EnvError(f"{where}: field 'correct_answer' must be an option index 0-3 for a "
                               f"multiple-choice question, got {gold!r}")
        elif kind == "list":
            if isinstance(gold, int) or not name_list(gold):
                raise EnvError(f"{where}: field 'correct_answer' must be a non-empty list of names for a list "
                               f"question, got {gold!r}")
        elif kind == "binary":
            if not isinstance(gold, str) or gold.strip().lower() not in BINARY_GOLD:
                raise EnvError(f"{where}: field 'correct_answer' must be 'yes', 'no' or 'no:long' for a binary "
                               f"question, got {gold!r}")
        elif not isinstance(gold, str) or not gold.strip():
            raise EnvError(f"{where}: field 'correct_answer' must be a non-empty str for a fact question, "
                           f"got {gold!r}")
        return record

    def kind(self) -> str:
        return question_kind(self.record["question_type"])

    def gold(self):
        """The gold letter (multiple-choice), name list (list), 'yes'/'no' (binary) or answer text (fact)."""
        gold, kind = self.record["correct_answer"], self.kind()
        if kind == "choice":
            return MC_LETTERS[int(gold)]
        if kind == "list":
            return name_list(gold)
        if kind == "binary":
            return BINARY_GOLD[gold.strip().lower()]
        return gold

    def initial_messages(self):
        question = self.record.get("complete_question") or self.record["question"]
        return [{"role": "user", "content": self.prompt(
            "question", context=self.record["context"], notes=self.record.get("extra_info") or "(none)",
            question=question)}]

    def score(self, answer: str) -> tuple[float, str | None]:
        """(reward, what was read from the answer) for the text inside the <answer> tag."""
        kind, gold = self.kind(), self.gold()
        if kind == "choice":
            if self.lenient:
                letter = parse_choice(answer, MC_LETTERS)
            else:  # OdysSim: the whole tag content is one letter a-d, optionally "(b)", "b)", "b."
                m = re.match(r"^\(?([a-d])\)?\.?$", answer.strip().lower())
                letter = m.group(1).upper() if m else None
            return (1.0 if letter == gold else 0.0), letter
        if kind == "list":
            wrong = name_list(self.record.get("wrong_answer") or [])
            ok = all(has_word(n, answer) for n in gold) and not any(has_word(n, answer) for n in wrong)
            return (1.0 if ok else 0.0), answer
        if kind == "binary":
            yes, no = says_yes(answer), says_no(answer)
            ok = (yes and not no) if gold == "yes" else (no and not yes)
            return (1.0 if ok else 0.0), answer
        return token_f1(gold, answer), answer

    def step(self, thought, utterance):
        self.replies.append(utterance)
        # OdysSim reads the FIRST <answer> tag (lenient: the last one)
        answer = (extract_tag(utterance) if self.lenient else first_tag(utterance)) if utterance else None
        reward, predicted = self.score(answer) if answer else (0.0, None)
        return SimTurn(done=True, reward=reward,
                       info={"predicted": predicted, "gold": self.gold(), "correct": reward == 1.0,
                             "parsed": predicted is not None, "question_type": self.record["question_type"],
                             "end": "answered"})
