"""HumanLLM item selection: rank which items a user buys next (choice family, single turn).

Protocol (OdysSim ``agents/humanllm``, the HumanLLM "Item Selection" task; this project's wording): the policy sees
the user's description and purchase history (the record's stored prompt, cut before its "Candidate 1:" list, with
each "History N:" entry put on its own line) and the candidates relabelled "A: ...", "B: ...", ... (at most 20,
A-T), and answers its top 5 guesses, most likely first, as ``<answer>C,A,M,B,K</answer>``.

Reward (r_d of Eq 4; reciprocal rank, no judge): r = 1 / rank of the true item within the 5 letters, 0 when it is
not among them. As OdysSim: the first ``<answer>X1,X2,X3,X4,X5</answer>`` (5 distinct upper-case
letters, commas, no spaces, lower-case tag) is read, each letter naming an existing candidate; anything else
scores 0. (``lenient=True``: the last tag, spaces around the commas tolerated.)

Record (OdysSim's field names): ``prompt_text`` str (else ``conversations[0].messages[0].content``), ``candidates``
list of 5-20 str (in "Candidate 1..N" order), ``answer_index`` int (0-based index of the true item); optional
``answer_text``, ``answer_letter``, ``task``, ``split``, ``index``. Fewer than 5 or more than 20 candidates, or an
``answer_index`` out of range, is an `EnvError`.
"""

from __future__ import annotations

import re
import string

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.sim_env import SimTurn
from mimesis_jax.envs.soul.base import SoulEnv, extract_tag, register, stored_prompt

TOP_K = 5
LETTERS = string.ascii_uppercase[:20]  # A-T
_HISTORY_RE = re.compile(r"History\s*\d+\s*:")
_CANDIDATES_RE = re.compile(r"Candidate\s*1\s*:")


def history_lines(text: str) -> str:
    """Puts each inline "History N: ..." entry on its own line, renumbered 1..n (text before the first kept)."""
    marks = list(_HISTORY_RE.finditer(text))
    if not marks:
        return text
    head = text[:marks[0].start()].rstrip()
    entries = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        entries.append(f"History {i + 1}: {text[m.end():end].strip().rstrip(',;')}")
    return "\n".join([head] + entries if head else entries)


_STRICT_RE = re.compile(r"<answer>([A-T](?:,[A-T]){%d})</answer>" % (TOP_K - 1))


def parse_ranking(text: str | None, n_candidates: int, lenient: bool = False) -> list[int] | None:
    """The 0-based candidate indices of the answer: exactly TOP_K distinct letters naming candidates.

    Default, as OdysSim: the first match of ``<answer>X1,X2,X3,X4,X5</answer>`` -- upper-case A-T letters and
    commas only (no spaces, case-sensitive tag), so a differently written tag is skipped for a later exact one.
    lenient: the last <answer> tag, spaces around the letters allowed."""
    if not lenient:
        m = _STRICT_RE.search(text or "")
        if not m:
            return None
        letters = m.group(1).split(",")
        if len(set(letters)) != TOP_K or any(LETTERS.index(x) >= n_candidates for x in letters):
            return None
        return [LETTERS.index(x) for x in letters]
    inner = extract_tag(text or "")
    if inner is None:
        return None
    letters = [x.strip() for x in inner.split(",")]
    if len(letters) != TOP_K or len(set(letters)) != TOP_K:
        return None
    if not all(len(x) == 1 and x in LETTERS[:n_candidates] for x in letters):
        return None
    return [LETTERS.index(x) for x in letters]


@register
class HumanLLM(SoulEnv):
    name = "humanllm"
    family = "choice"
    multi_turn = False
    max_policy_turns = 1
    protocol = ("user description, purchase history and up to 20 lettered candidate items; rank the 5 most likely "
                "next purchases as <answer>X1,X2,X3,X4,X5</answer>")
    reward_doc = "reciprocal rank: 1/rank of the true item among the 5 letters, 0 if absent or malformed"
    record_format = ("prompt_text (or conversations[0].messages[0].content), candidates [5-20 str], answer_index "
                     "(0-based); optional answer_text, answer_letter, task, split, index")
    fields = (("prompt_text", str, True), ("conversations", list, True), ("candidates", list, False),
              ("answer_index", int, False))

    @classmethod
    def parse_record(cls, record, where):
        record = super().parse_record(record, where)
        cands = record["candidates"]
        if not TOP_K <= len(cands) <= len(LETTERS):
            raise EnvError(f"{where}: field 'candidates' must list {TOP_K} to {len(LETTERS)} items, got {len(cands)}")
        for i, c in enumerate(cands):
            if not isinstance(c, str) or not c.strip():
                raise EnvError(f"{where}: field 'candidates' item {i} must be a non-empty string, got {c!r}")
        if not 0 <= record["answer_index"] < len(cands):
            raise EnvError(f"{where}: field 'answer_index' {record['answer_index']} is outside [0, {len(cands) - 1}]")
        return {**record, "prompt_text": stored_prompt(record, where)}

    def gold(self) -> str:
        return LETTERS[self.record["answer_index"]]

    def initial_messages(self):
        r = self.record
        head = r["prompt_text"]
        m = _CANDIDATES_RE.search(head)
        if m:
            head = head[:m.start()].rstrip()
        candidates = "\n".join(f"{LETTERS[i]}: {c.strip()}" for i, c in enumerate(r["candidates"]))
        return [{"role": "user", "content": self.prompt("question", user=history_lines(head), candidates=candidates,
                                                        k=TOP_K, last=LETTERS[len(r["candidates"]) - 1])}]

    def step(self, thought, utterance):
        self.replies.append(utterance)
        ranking = parse_ranking(utterance, len(self.record["candidates"]), self.lenient)
        gold = self.record["answer_index"]
        rank = ranking.index(gold) + 1 if ranking and gold in ranking else None
        return SimTurn(done=True, reward=1.0 / rank if rank else 0.0,
                       info={"predicted": [LETTERS[i] for i in ranking] if ranking else None, "gold": self.gold(),
                             "rank": rank, "hit_at_5": rank is not None, "top1": rank == 1,
                             "parsed": ranking is not None, "end": "answered"})
