"""UserLLM: write one turn of a human user chatting with an AI system (judge family, single turn).

Protocol (OdysSim ``agents/userllm``, this project's wording): the policy is told the user's intent and, unless
this is the first turn, the conversation so far; it writes the user's next message, or only
``<|endconversation|>`` when the intent has been met. Anything after the marker is dropped.

Reward (Eq 4's r_d), routed by the record's ``source`` as in OdysSim:

* ``prism`` (any source containing "prism"): r = (overlap + termination + human) / 3, where
  overlap = |I & U| / |U| over the stop-word-filtered lower-case word sets of the intent (I) and the reply (U)
  (0 when either set is empty; a kept end marker counts as the word "endconversation", as in OdysSim);
  termination = 1 when "the reply holds <|endconversation|>" equals ``is_last_turn``, else 0; human = the
  AI-detector call: OdysSim asks an LLM detector (in place of the Pangram API) whether the reply without the
  marker was written by an AI or a human -- here a judge call with its own prompt (``detector``) answering
  HUMAN (1) or AI (0); an empty reply scores 0 without a call. NB: OdysSim ADDS the overlap, although the
  userLLM suite reports it as lower-is-better (intent decomposition); this follows OdysSim.
* ``commonsense_qa`` -- role adherence, no judge: the user should ask, not answer. With m the number of the
  question's choice texts found in the reply (lower-case alphanumerics, whole words), r = 0 when m is 1 or 2
  (the user answered) or when m is the number of choices (the question repeated), else 1.
* ``natural_questions`` -- intent adherence: given the user's question and an AI reply that steers elsewhere
  (``assistant_suggestion_turn``), a judge call decides whether the user's reply insists on the original
  question (REFUSED, r = 1) or follows the suggestion (ACCEPTED, r = 0); an empty reply scores 0 without a call.

A judge answer that is not exactly one of its two labels is asked again once, then the episode is INVALID.
(OdysSim's quality auditor is switched off there and is left out here.)

Record (OdysSim's field names; the row's ``extra_info``): ``source`` str; the intent from ``intent`` (a leading
"You are a user chatting with an assistant language model to" is dropped), else ``intent_summary``, else
``opening_prompt``, else the first line of ``conversation_history`` -- one must be non-empty;
``conversation_history`` str (missing or "" = first turn); prism: ``is_last_turn`` (bool, 0/1 or
"true"/"false"); commonsense_qa: ``choices`` (list of texts or of {``text``}, {``text``: [...]}, or that as a JSON
string); natural_questions: ``question`` and ``assistant_suggestion_turn`` str. Optional ``id``.
"""

from __future__ import annotations

import json
import re

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.model_io import field
from mimesis_jax.envs.soul.base import JudgeEnv, register
from mimesis_jax.chat.thoughts import split_thought

END = "<|endconversation|>"
INTENT_PREFIX = "You are a user chatting with an assistant language model to"
STOPWORDS = frozenset((
    "a an and are as at be but by can could did do does for from had has have how i if in into is it its me might "
    "my of on or our should so that the their them then there these they this to us was we were what when where "
    "which who why will with would you your").split())
_CJK = "\u4e00-\u9fff\u3040-\u30ff"
_TOKEN_RE = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+")
_TRUE, _FALSE = ("true", "1", "yes", "y"), ("false", "0", "no", "n")


def content_words(text: str) -> set[str]:
    """Lower-case word tokens (each CJK character its own token), stop words and non-alphanumeric tokens dropped."""
    return {t for t in _TOKEN_RE.findall(text.lower()) if t not in STOPWORDS and t.isalnum()}


def intent_overlap(intent: str, reply: str) -> float:
    """|I & U| / |U| of the content-word sets of the intent and the reply; 0 when either is empty."""
    i, u = content_words(intent), content_words(reply)
    return len(i & u) / len(u) if i and u else 0.0


def _match_form(s: str) -> str:
    s = re.sub(r"\s+", " ", re.sub(r"[^0-9a-z]+", " ", s.lower())).strip()
    return f" {s} "


def choices_mentioned(reply: str, choices: list[str]) -> int:
    """How many choice texts occur (as whole words, case and punctuation ignored) in the reply."""
    r = _match_form(reply)
    return sum(1 for c in choices if _match_form(c) in r)


def as_bool(value, where: str, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise EnvError(f"{where}: field {key!r} must be a boolean (true/false, 0/1), got {value!r}")


def choice_texts(value, where: str) -> list[str]:
    """The choice texts of a record's ``choices`` in any of its stored forms."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise EnvError(f"{where}: field 'choices' is a string but not valid JSON ({e.msg})") from None
    if isinstance(value, dict):
        value = value.get("text")
    if not isinstance(value, list):
        raise EnvError(f"{where}: field 'choices' must be a list of texts, a list of {{text}}, or {{text: [...]}}")
    texts = [str((c.get("text") if isinstance(c, dict) else c) or "").strip() for c in value]
    texts = [t for t in texts if t]
    if not texts:
        raise EnvError(f"{where}: field 'choices' holds no choice text")
    return texts


def parse_label(text: str, labels: tuple[str, str]) -> str:
    """The one label (of two, any case) a judge's visible answer names; ValueError when it names neither or both."""
    visible = split_thought(text or "")[1] or ""
    found = {w.upper() for w in re.findall(r"[A-Za-z]+", visible)} & set(labels)
    if len(found) != 1:
        raise ValueError(f"expected exactly one of {labels}, got {visible[:200]!r}")
    return found.pop()


@register
class UserLLM(JudgeEnv):
    name = "userllm"
    protocol = ("write the next message of a human user with a given intent (or <|endconversation|>), "
                "from the conversation so far")
    reward_doc = ("by source: prism (intent overlap + end-marker accuracy + AI-detector HUMAN) / 3; "
                  "commonsense_qa role adherence (no choice answered); natural_questions judge: insists on "
                  "the question (1) or not (0)")
    record_format = ("source, intent (or intent_summary / opening_prompt), conversation_history; prism: "
                     "is_last_turn; commonsense_qa: choices; natural_questions: question, assistant_suggestion_turn")
    fields = (("source", str, False), ("intent", str, True), ("intent_summary", str, True),
              ("opening_prompt", str, True), ("conversation_history", str, True), ("id", (str, int), True))

    @classmethod
    def parse_record(cls, record, where):
        record = dict(super().parse_record(record, where))
        kind = cls.source_kind(record["source"], where)
        if not cls.intent(record):
            raise EnvError(f"{where}: field 'intent' is missing or empty (nor intent_summary, opening_prompt or "
                           f"conversation_history gives one)")
        if kind == "prism":
            if "is_last_turn" not in record:
                raise EnvError(f"{where}: missing field 'is_last_turn'")
            record["is_last_turn"] = as_bool(record["is_last_turn"], where, "is_last_turn")
        elif kind == "commonsense_qa":
            if "choices" not in record:
                raise EnvError(f"{where}: missing field 'choices'")
            record["choices"] = choice_texts(record["choices"], where)
        else:
            for key in ("question", "assistant_suggestion_turn"):
                if not field(record, key, str, where).strip():
                    raise EnvError(f"{where}: field {key!r} is empty")
        return record

    def __init__(self, record: dict, **kwargs):
        super().__init__(record, **kwargs)
        self.kind = self.source_kind(record["source"], "userllm record")
        self.user_intent = self.intent(record)

    @staticmethod
    def source_kind(source: str, where: str) -> str:
        s = source.strip().lower()
        if "prism" in s:
            return "prism"
        if s in ("commonsense_qa", "natural_questions"):
            return s
        raise EnvError(f"{where}: field 'source' must be commonsense_qa, natural_questions or a prism source "
                       f"(it picks the reward), got {source!r}")

    @staticmethod
    def intent(record: dict) -> str:
        raw = (record.get("intent") or record.get("intent_summary") or "").strip()
        at = raw.lower().find(INTENT_PREFIX.lower())
        if at != -1:
            raw = raw[at + len(INTENT_PREFIX):].lstrip(" :-\u2014") or raw
        if raw:
            return raw
        if (record.get("opening_prompt") or "").strip():
            return record["opening_prompt"].strip()
        history = (record.get("conversation_history") or "").strip()
        if history:
            first = history.splitlines()[0].strip()
            return first.split(":", 1)[1].strip() if first.lower().startswith("<user>:") else first
        return ""

    def initial_messages(self):
        history = self.record.get("conversation_history") or ""
        if not history:
            return [{"role": "user", "content": self.prompt("first_turn", intent=self.user_intent)}]
        return [{"role": "user", "content": self.prompt("next_turn", intent=self.user_intent,
                                                        history=history, end=END)}]

    # -------------------------------------------------------------- reward
    @staticmethod
    def clean(utterance: str) -> str:
        """The reply as scored: cut after the first end marker."""
        return utterance.split(END)[0].strip() + END if END in utterance else utterance

    def judge_messages(self):
        """The call of this record's judged metric (prism: the AI detector; natural_questions: intent adherence)."""
        reply = self.clean(self.replies[-1])
        if self.kind == "prism":
            return [{"role": "user", "content": self.prompt("detector", text=reply.replace(END, "").strip())}]
        return [{"role": "user", "content": self.prompt("adherence", question=self.record["question"],
                                                        suggestion=self.record["assistant_suggestion_turn"],
                                                        reply=reply)}]

    def judge_reward(self):
        reply = self.clean(self.replies[-1])
        if self.kind == "commonsense_qa":
            choices = self.record["choices"]
            m = choices_mentioned(reply, choices)
            r = 0.0 if m in (1, 2) or m == len(choices) else 1.0
            return r, {"role_adherence": r, "choices_mentioned": m}
        if self.kind == "natural_questions":
            r = 0.0
            if reply.strip():
                r = 1.0 if self.ask_judge(self.judge_messages(),
                                          lambda t: parse_label(t, ("REFUSED", "ACCEPTED"))) == "REFUSED" else 0.0
            return r, {"intent_adherence": r}
        overlap = intent_overlap(self.user_intent, reply)
        termination = 1.0 if (END in reply) == self.record["is_last_turn"] else 0.0
        human = 0.0
        if reply.replace(END, "").strip():
            human = 1.0 if self.ask_judge(self.judge_messages(),
                                          lambda t: parse_label(t, ("HUMAN", "AI"))) == "HUMAN" else 0.0
        return (overlap + termination + human) / 3, {"intent_overlap": overlap, "termination": termination,
                                                      "ai_detector": human}
