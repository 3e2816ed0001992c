"""HUMANUAL: write the reply a specific real person wrote (judge family, single turn; six domains, Eq 4's r_d).

Humanual (HumanLM) pairs a context -- a post, thread or conversation -- with the reply one real person wrote to it
and an LLM-written profile of that person. Six domains, one task each, sharing this protocol and rubric (OdysSim
``agents/humanual`` runs the same agent on every domain; only the data differ): ``humanual_book`` (book reviews),
``humanual_chat`` (the person's next message to an AI chat assistant), ``humanual_email`` (corporate email
threads), ``humanual_news`` (comments under news videos), ``humanual_opinion`` (forum posts and comments),
``humanual_politics`` (responses to political blog posts). Each domain's system prompt carries one line saying
where the context comes from (``setting_<source>`` in prompts/humanual.toml); the rubric is shared.

Protocol (this project's wording): system = the persona and how to behave as that person, with the domain line;
user = the context. The policy answers as the person, its reply inside ``<response></response>`` (a reply without
the tags counts whole, as OdysSim's fallback). An empty reply scores 0 without a judge call.

Reward (OdysSim's "v3" response judge): the judge scores the reply against the person's real reply on six
dimensions -- stance, emotion, belief, value, goal, communication -- each in [0, 1];
``r = clip(mean_6(score_d) * length_factor, 0, 1)`` with ``length_factor = min(1, n_gen / (0.3 * n_ref))`` when
the real reply has ``n_ref >= 20`` word tokens (``\\w+``, lower-cased), else 1 (a short reply to a long real one
is scaled down). An unparseable judge answer is asked again once, then the episode is INVALID.

Record (OdysSim's field names, real format): ``prompt`` -- the context, a str, or a list of messages
``{"content": str, ...}`` (or a str holding such a JSON list), whose contents are joined by newlines;
``persona`` str; ``completion`` str (the real reply); optional ``dataset``, ``category``, ``id``.
"""

from __future__ import annotations

import json
import re

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.sim_env import SimTurn
from mimesis_jax.envs.soul.base import JudgeEnv, extract_tag, parse_dimensions, register

DIMENSIONS = ("stance", "emotion", "belief", "value", "goal", "communication")
MIN_REF_TOKENS = 20    # a real reply shorter than this is never length-gated
TARGET_RATIO = 0.3     # a reply of 30% of the real reply's length gets full credit
_TOKEN_RE = re.compile(r"\w+", re.UNICODE)


def word_tokens(text: str) -> list[str]:
    """The lower-cased ``\\w+`` tokens of `text` (what the length factor counts)."""
    return [t.lower() for t in _TOKEN_RE.findall(text or "")]


def length_factor(generated: str, reference: str) -> float:
    """min(1, n_gen / (0.3 * n_ref)) when the reference has >= 20 tokens, else 1."""
    n_ref = len(word_tokens(reference))
    if n_ref < MIN_REF_TOKENS:
        return 1.0
    return min(1.0, len(word_tokens(generated)) / (TARGET_RATIO * n_ref))


def context_text(prompt, where: str) -> str:
    """The context a record's ``prompt`` holds: a str as is, or the contents of a message list (also one stored
    as a JSON string) joined by newlines."""
    if isinstance(prompt, str):
        try:
            parsed = json.loads(prompt)
        except json.JSONDecodeError:
            return prompt
        if not isinstance(parsed, list):
            return prompt
        prompt = parsed
    parts = []
    for i, m in enumerate(prompt):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise EnvError(f"{where}: field 'prompt' item {i} must be a message object with a str 'content'")
        parts.append(m["content"])
    if not parts:
        raise EnvError(f"{where}: field 'prompt' is an empty message list")
    return "\n".join(parts)


class Humanual(JudgeEnv):
    """The shared Humanual protocol; each registered subclass sets `name` and `source` (its settings line)."""

    source = ""
    prompt_file = "humanual"
    score_range = (0.0, 1.0)  # every dimension's scale
    protocol = ("persona (system) + context (user); reply as that person inside <response></response>; one turn")
    reward_doc = ("judge scores stance/emotion/belief/value/goal/communication vs the real reply, each in [0, 1]; "
                  "r = clip(mean * min(1, n_gen / (0.3 n_ref)) [if n_ref >= 20 tokens], 0, 1)")
    record_format = ("prompt (str or [{content}] or its JSON string), persona, completion (the real reply); "
                     "optional dataset, category, id")
    fields = (("prompt", (str, list), False), ("persona", str, False), ("completion", str, False),
              ("dataset", str, True), ("category", str, True), ("id", (str, int), True))

    def __init__(self, record: dict, **kwargs):
        super().__init__(record, **kwargs)
        self.response = ""
        self.details: dict = {}

    @classmethod
    def parse_record(cls, record, where):
        record = super().parse_record(record, where)
        context_text(record["prompt"], where)
        if not record["completion"].strip():
            raise EnvError(f"{where}: field 'completion' is empty")
        return record

    def context(self) -> str:
        return context_text(self.record["prompt"], f"task {self.name}")

    def initial_messages(self):
        return [{"role": "system", "content": self.prompt("system", persona=self.record["persona"],
                                                          setting=self.prompt(f"setting_{self.source}"))},
                {"role": "user", "content": self.prompt("context", context=self.context())}]

    def judge_messages(self):
        return [{"role": "user", "content": self.prompt(
            "judge", rubric=self.prompt("rubric"), context=self.context(), reference=self.record["completion"],
            generated=self.response)}]

    def judge_reward(self):
        ranges = {d: self.score_range for d in DIMENSIONS}
        scores = self.ask_judge(self.judge_messages(), lambda t: parse_dimensions(t, ranges))
        mean = sum(scores.values()) / len(scores)
        factor = length_factor(self.response, self.record["completion"])
        self.details = {"dimension_scores": scores, "length_factor": factor, "response": self.response}
        return min(1.0, max(0.0, mean * factor)), mean

    def step(self, thought, utterance):
        tagged = extract_tag(utterance or "", "response")
        self.response = (tagged if tagged is not None else (utterance or "")).strip()
        if not self.response:
            self.replies.append(utterance)
            return SimTurn(done=True, reward=0.0, info={"end": "empty_response", "policy_turns": len(self.replies)})
        turn = super().step(thought, utterance)
        turn.info.update(self.details)
        return turn


@register
class HumanualBook(Humanual):
    name, source = "humanual_book", "book"


@register
class HumanualChat(Humanual):
    name, source = "humanual_chat", "chat"


@register
class HumanualEmail(Humanual):
    name, source = "humanual_email", "email"


@register
class HumanualNews(Humanual):
    name, source = "humanual_news", "news"


@register
class HumanualOpinion(Humanual):
    name, source = "humanual_opinion", "opinion"


@register
class HumanualPolitics(Humanual):
    name, source = "humanual_politics", "politics"
