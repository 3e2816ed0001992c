"""AlignX: predict which of two responses a particular user prefers (choice family, single turn).

Protocol (OdysSim ``agents/alignx``, this project's wording): the policy sees what is known about the user -- a
persona description, up to ``n_icl`` earlier preference pairs and up to ``n_ugc`` earlier comments by the user --
then a post and two candidate responses A and B, and answers the letter of the one this user would prefer inside
``<answer></answer>``. Which of ``chosen`` / ``rejected`` is shown as A is fixed per record from its ``index``
(``random.Random(index).random() < 0.5`` puts ``chosen`` at B), so a policy gains nothing from a position bias
and reruns show the same order.

Reward (r_d of Eq 4): accuracy -- 1.0 when the parsed letter is the one showing ``chosen``, else 0.0 (also when
no letter can be read).

Record (OdysSim's field names): ``raw_prompt`` str (the post), ``chosen`` str, ``rejected`` str (non-empty);
optional ``demographic`` str (the persona; the raw AlignX name ``Demographic Information`` is read too), ``profile``
str (the persona when ``demographic`` is empty), ``icl_pairs`` list of {prompt, chosen, rejected} (raw name
``Pair-wise Comparative Feedback``), ``ugc`` list of {prompt, comment} (raw name ``User-Generated Content``),
``n_icl`` / ``n_ugc`` int (how many of each to show, default 2), ``index`` int (default 0). An earlier pair or
comment with a missing or non-string text is an `EnvError` (OdysSim skips it silently).
"""

from __future__ import annotations

import random

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.model_io import field
from mimesis_jax.envs.soul.base import ChoiceEnv, register

# canonical field -> the raw AlignX name read when the canonical one is absent
ALIASES = {"demographic": "Demographic Information", "icl_pairs": "Pair-wise Comparative Feedback",
           "ugc": "User-Generated Content"}
PAIR_KEYS = ("prompt", "chosen", "rejected")
COMMENT_KEYS = ("prompt", "comment")


def chosen_is_b(index: int) -> bool:
    """The record's fixed A/B order: True when ``chosen`` is shown as response B."""
    return random.Random(index).random() < 0.5


def _items(record: dict, key: str, keys: tuple, where: str) -> list[dict]:
    items = record.get(key)
    if items is None:
        return []
    if not isinstance(items, list):
        raise EnvError(f"{where}: field {key!r} must be a list, got {type(items).__name__}")
    for i, item in enumerate(items):
        for k in keys:
            field(item, k, str, f"{where}, field {key!r} item {i}")
    return items


@register
class AlignX(ChoiceEnv):
    name = "alignx"
    protocol = ("user persona + earlier preferences/comments, a post and responses A/B; answer the letter this "
                "user prefers in <answer></answer>")
    reward_doc = "accuracy: 1 if the chosen letter shows the user's preferred response, else 0"
    record_format = ("raw_prompt, chosen, rejected; optional demographic, profile, icl_pairs [{prompt, chosen, "
                     "rejected}], ugc [{prompt, comment}], n_icl, n_ugc, index")
    fields = (("raw_prompt", str, False), ("chosen", str, False), ("rejected", str, False),
              ("demographic", str, True), ("profile", str, True), ("n_icl", int, True), ("n_ugc", int, True),
              ("index", int, True))

    @classmethod
    def parse_record(cls, record, where):
        record = dict(record)
        for key, raw in ALIASES.items():
            if record.get(key) is None and record.get(raw) is not None:
                record[key] = record[raw]
        record = super().parse_record(record, where)
        for key in ("raw_prompt", "chosen", "rejected"):
            if not record[key].strip():
                raise EnvError(f"{where}: field {key!r} is empty")
        if record["chosen"].strip() == record["rejected"].strip():
            raise EnvError(f"{where}: fields 'chosen' and 'rejected' hold the same text")
        for key in ("n_icl", "n_ugc"):
            if record.get(key) is not None and record[key] < 0:
                raise EnvError(f"{where}: field {key!r} must be >= 0, got {record[key]}")
        return {**record, "icl_pairs": _items(record, "icl_pairs", PAIR_KEYS, where),
                "ugc": _items(record, "ugc", COMMENT_KEYS, where)}

    answer_letters = "AB"        # OdysSim: <answer>\s*([AB])\s*</answer> with no re.IGNORECASE:
    answer_ignore_case = False  # <answer>b</answer> and <ANSWER>B</ANSWER> score 0 there and here

    def options(self):
        chosen, rejected = self.record["chosen"].strip(), self.record["rejected"].strip()
        a, b = (rejected, chosen) if chosen_is_b(self.record.get("index") or 0) else (chosen, rejected)
        return {"A": a, "B": b}

    def gold(self):
        return "B" if chosen_is_b(self.record.get("index") or 0) else "A"

    def user_context(self) -> str:
        """The persona, earlier preference pairs and earlier comments, as sections ('' when there are none)."""
        r = self.record
        parts = []
        persona = (r.get("demographic") or "").strip() or (r.get("profile") or "").strip()
        if persona:
            parts.append(self.prompt("persona", persona=persona))
        n_icl = 2 if r.get("n_icl") is None else r["n_icl"]
        pairs = [self.prompt("pair", n=i + 1, post=p["prompt"].strip(), chosen=p["chosen"].strip(),
                             rejected=p["rejected"].strip()) for i, p in enumerate(r["icl_pairs"][:n_icl])]
        if pairs:
            parts.append(self.prompt("pairs", pairs="\n\n".join(pairs)))
        n_ugc = 2 if r.get("n_ugc") is None else r["n_ugc"]
        comments = [self.prompt("comment", post=c["prompt"].strip(), comment=c["comment"].strip())
                    for c in r["ugc"][:n_ugc]]
        if comments:
            parts.append(self.prompt("comments", comments="\n\n".join(comments)))
        return "\n\n".join(parts)

    def initial_messages(self):
        opts = self.options()
        context = self.user_context() or self.prompt("no_context")
        return [{"role": "user", "content": self.prompt("question", context=context,
                                                        post=self.record["raw_prompt"].strip(),
                                                        a=opts["A"], b=opts["B"])}]
