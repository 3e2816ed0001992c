"""SocSci210: predict one survey participant's answer in a social-science experiment (choice family, single turn).

Protocol (OdysSim ``agents/socsci210``, this project's wording): the stored survey prompt -- the participant's
demographics, the experimental condition (stimulus) and the outcome question with its response format -- is put
to the policy together with this project's instructions: reason briefly about how this person would answer, then
give the answer alone inside ``<answer></answer>``. No judge and no partner.

Reward (a numeric closeness, not plain accuracy; r_d of Eq 4). The content of the FIRST ``<answer>`` tag (OdysSim's
``re.search``; ``lenient=True``: the last tag) must be
exactly an integer (binary outcomes also accept ``yes`` = 1 / ``no`` = 0); anything else scores 0.

* ``ordinal`` (the default):  r = 1 - |clip(pred, r_min, r_max) - response| / (r_max - r_min), in [0, 1];
* ``binary`` / ``categorical``: r = 1 if pred == response else 0.

Record (OdysSim's field names): ``prompt_text`` str (the full survey prompt) -- or, when it is absent, the
upstream wrapper ``conversations[0].messages[0].content``; ``response`` number (or a numeric string: the
participant's true answer); optional ``response_type`` str in {ordinal, binary, categorical} (default ordinal),
``r_min`` / ``r_max`` numbers (defaults 0 and 7, or 0 and 1 for binary), ``study_id``, ``condition_id``,
``outcome_id``. This module checks more than OdysSim: an unknown ``response_type``, ``r_max <= r_min``, an
ordinal ``response`` outside the scale, a binary ``response`` other than 0/1 (yes is 1, as the parser reads it)
or a non-integer categorical ``response`` is an `EnvError`.

The prompt comes from `base.stored_prompt` (``prompt_text``, else ``conversations``), as for social_r1 and humanllm.
"""

from __future__ import annotations

import re

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.sim_env import SimTurn
from mimesis_jax.envs.soul.base import SoulEnv, extract_tag, first_tag, register, stored_prompt

RESPONSE_TYPES = ("ordinal", "binary", "categorical")
EXACT_MATCH_TYPES = ("binary", "categorical")
_INT_RE = re.compile(r"-?\d+")


def number_text(x: float) -> str:
    """1.0 -> '1', 2.5 -> '2.5' (scale bounds as the prompt shows them)."""
    return str(int(x)) if float(x).is_integer() else str(x)


def parse_prediction(text: str | None, response_type: str, lenient: bool = False) -> float | None:
    """The predicted answer: the FIRST <answer> content (OdysSim's ``re.search``; lenient: the last one),
    exactly an integer (binary: also yes/no, any case), else None."""
    inner = extract_tag(text or "") if lenient else first_tag(text)
    if inner is None:
        return None
    if response_type == "binary" and inner.lower() in ("yes", "no"):
        return 1.0 if inner.lower() == "yes" else 0.0
    return float(int(inner)) if _INT_RE.fullmatch(inner) else None


def closeness_reward(pred: float | None, gold: float, r_min: float, r_max: float, response_type: str) -> float:
    """r_d: exact match for binary/categorical, 1 - |clip(pred) - gold| / (r_max - r_min) for ordinal; 0 if None."""
    if pred is None:
        return 0.0
    if response_type in EXACT_MATCH_TYPES:
        return 1.0 if pred == gold else 0.0
    clipped = min(max(pred, r_min), r_max)
    return max(0.0, 1.0 - abs(clipped - gold) / (r_max - r_min))


@register
class SocSci210(SoulEnv):
    name = "socsci210"
    family = "choice"
    multi_turn = False
    max_policy_turns = 1
    protocol = ("survey prompt (participant demographics, condition, outcome question); predict this person's "
                "answer, an integer (or yes/no) in <answer></answer>")
    reward_doc = ("ordinal: 1 - |clip(pred, r_min, r_max) - response| / (r_max - r_min); binary/categorical: "
                  "exact match; 0 when the answer is not a bare integer (or yes/no) in <answer>")
    record_format = ("prompt_text (or conversations[0].messages[0].content), response (number); optional "
                     "response_type (ordinal|binary|categorical), r_min, r_max, study_id, condition_id, outcome_id")
    fields = (("prompt_text", str, True), ("conversations", list, True), ("response", (int, float, str), False),
              ("response_type", str, True), ("r_min", (int, float), True), ("r_max", (int, float), True))

    @classmethod
    def parse_record(cls, record, where):
        record = super().parse_record(record, where)
        rtype = (record.get("response_type") or "ordinal").strip().lower()
        if rtype not in RESPONSE_TYPES:
            raise EnvError(f"{where}: field 'response_type' must be one of {RESPONSE_TYPES}, got {rtype!r}")
        r_min = float(record["r_min"]) if record.get("r_min") is not None else 0.0
        r_max = float(record["r_max"]) if record.get("r_max") is not None else (1.0 if rtype == "binary" else 7.0)
        if r_max <= r_min:
            raise EnvError(f"{where}: field 'r_max' ({number_text(r_max)}) must exceed 'r_min' "
                           f"({number_text(r_min)})")
        try:
            gold = float(record["response"])
        except ValueError:
            raise EnvError(f"{where}: field 'response' must be a number, got {record['response']!r}") from None
        if rtype == "binary" and gold not in (0.0, 1.0):
            raise EnvError(f"{where}: field 'response' must be 0 (no) or 1 (yes) for a binary outcome, got {gold}")
        if rtype == "categorical" and not gold.is_integer():
            raise EnvError(f"{where}: field 'response' must be an integer for a categorical outcome, got {gold}")
        if rtype == "ordinal" and not r_min <= gold <= r_max:
            raise EnvError(f"{where}: field 'response' {number_text(gold)} is outside the scale "
                           f"[{number_text(r_min)}, {number_text(r_max)}]")
        return {**record, "prompt_text": stored_prompt(record, where), "response": gold, "response_type": rtype,
                "r_min": r_min, "r_max": r_max}

    def initial_messages(self):
        r = self.record
        answer_format = self.prompt(f"format_{r['response_type']}", lo=number_text(r["r_min"]),
                                    hi=number_text(r["r_max"]))
        return [{"role": "user", "content": self.prompt("question", survey=r["prompt_text"],
                                                        answer_format=answer_format)}]

    def step(self, thought, utterance):
        self.replies.append(utterance)
        r = self.record
        pred = parse_prediction(utterance, r["response_type"], self.lenient)
        reward = closeness_reward(pred, r["response"], r["r_min"], r["r_max"], r["response_type"])
        return SimTurn(done=True, reward=reward,
                       info={"predicted": pred, "gold": r["response"], "exact": pred == r["response"],
                             "parsed": pred is not None, "end": "answered"})
