"""TwinVoice: picking the reply a given persona wrote (choice family, single turn; one SOUL domain of Eq 4).

Protocol (OdysSim ``agents/twinvoice``, this project's wording): the persona's earlier posts, an anchor post and
2-4 candidate replies (lettered A, B, ...) are put to the policy, which reasons and gives the letter of the reply
the persona wrote inside ``<answer></answer>``. Reward: 1.0 when the letter read as OdysSim
reads it (`ChoiceEnv`: the first ``<answer>X</answer>``, X in A-D) is the one at ``answer_idx``, else 0.0.

Record (OdysSim's field names; the agent reads the first alias present): ``conversation_history`` / ``history``
(list, or a JSON string of a list; str items are shown as they are, other items as compact JSON),
``anchor_post`` str, ``answer_choices`` / ``choices`` (2-4 str, a list or a JSON string of one), ``answer_idx``
int (0-based index of the persona's reply); optional ``dimension``, ``id``, ``user_id``.
"""

from __future__ import annotations

import json

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.soul.base import ChoiceEnv, aliased_field, register

LETTERS = "ABCD"


def _json_list(value, where: str, key: str) -> list:
    """A list as is, or a str holding a JSON list, read; anything else is an EnvError naming `key`."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise EnvError(f"{where}: field {key!r} must be a list or a JSON string of a list") from None
    if not isinstance(value, list):
        raise EnvError(f"{where}: field {key!r} must be a list or a JSON string of a list")
    return value


@register
class TwinVoice(ChoiceEnv):
    name = "twinvoice"
    protocol = "persona's past posts + an anchor post + candidate replies; letter of the persona's reply in <answer>"
    reward_doc = "accuracy: 1 if the chosen letter is the choice at answer_idx, else 0"
    record_format = ("history (or conversation_history), anchor_post, choices (or answer_choices; 2-4), answer_idx "
                     "(0-based int); lists may be JSON strings")
    fields = (("anchor_post", str, False), ("answer_idx", int, False))

    @classmethod
    def parse_record(cls, record, where):
        record = dict(super().parse_record(record, where))
        history = aliased_field(record, ("conversation_history", "history"), (list, str), where)
        record["history"] = _json_list(history, where, "history")
        choices = _json_list(aliased_field(record, ("answer_choices", "choices"), (list, str), where), where,
                             "choices")
        if not 2 <= len(choices) <= len(LETTERS) or not all(isinstance(c, str) and c.strip() for c in choices):
            raise EnvError(f"{where}: field 'choices' must hold 2 to 4 non-empty strings")
        record["choices"] = choices
        if not 0 <= record["answer_idx"] < len(choices):
            raise EnvError(f"{where}: field 'answer_idx' {record['answer_idx']} is not an index of the "
                           f"{len(choices)} choices")
        return record

    def options(self):
        return {LETTERS[i]: c.strip() for i, c in enumerate(self.record["choices"])}

    def gold(self):
        return LETTERS[self.record["answer_idx"]]

    def initial_messages(self):
        history = [h if isinstance(h, str) else json.dumps(h, ensure_ascii=False) for h in self.record["history"]]
        return [{"role": "user", "content": self.prompt(
            "question", history="\n".join(f"- {h}" for h in history) or "(none)",
            anchor=self.record["anchor_post"], options="\n".join(f"{k}. {v}" for k, v in self.options().items()))}]
