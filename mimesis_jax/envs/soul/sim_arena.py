"""SimulatorArena: play a real user talking to an AI assistant, judged against that user's real conversation
(judge family, multi-turn; tasks ``sim_math`` and ``sim_doc``; Eq 4's r_d).

Protocol (OdysSim ``agents/sim_arena``, this project's wording). The policy plays the USER; a fixed ``partner``
model plays the assistant. The policy's view: a system message (the role, the user's profile, the output format)
and a user message with the task (``sim_math``: the math problem the student is stuck on; ``sim_doc``: the
document type, its goal and the user's notes). Each policy turn is one message, written after a marker --
``sim_math``: "Query: ..." on the first turn and "Response: ..." after; ``sim_doc``: "Message: ..." -- and the text
after the marker is what the assistant sees (the whole text when there is none). The partner (a math tutor who
never gives the solution away / a writing assistant) sees the policy's messages as ``user`` and its own as
``assistant``; its first user message carries the problem or document brief before the policy's first message.
After every policy message the partner replies, up to ``max_policy_turns`` = 8 policy messages (the 8th is
answered too). The policy ends the dialogue by writing "terminate conversation" (that message is not sent);
ending before sending anything scores 0 with no judge call, and so does a turn with no public reply (utterance
None, the policy's own failure). When a dialogue ends, ``sim_doc`` asks the partner for the final document in
full.

Reward: the mean of the available terms below (OdysSim divides Likert scores by their maximum, so a 1 of 5 is
0.2):

* writing style: a judge rates 1-5 how similar the simulated user's messages are to the real user's messages in
  writing style (a list of writing features guides it); term = score / 5;
* interaction style: a judge rates 1-5 how similar the simulated conversation is to the real one in interaction
  style; term = score / 5;
* feature fulfilment: a judge classifies each of the record's target features ("Match" / "No Match") against the
  simulated user's messages; ``sim_math``: one term, the match rate over the interaction-style features;
  ``sim_doc``: one term per category (writing-style and interaction-style features);
* ``sim_doc`` only: document quality: a judge rates the final document 1-10 against the brief and the user's
  document preferences; term = rating / 10.

A feature category with no target features contributes no term (OdysSim counts it as 0, which only scales every
reward of that record by one constant factor; GRPO's per-group normalisation removes it). Every judge answer that
cannot be parsed is asked again once, then the episode is INVALID.

Record (OdysSim's field names, real format; a str field ``raw`` holding a JSON object is merged over the record,
as OdysSim does):
``sim_math``: ``problem`` str, ``human_user_queries`` (list of str, or str), ``human_public_conversation`` (list
of ``{"role": "user"|"assistant", "content": str}``, or str); optional ``user_profile_text`` str,
``target_interaction_style_features`` (list of ``{"Feature Name": str, "Feature Question Answer": str}``, the
answer falling back to "Feature Question").
``sim_doc``: ``document_type`` str, ``intent`` str, ``human_user_queries``, ``human_public_conversation`` (as
above); optional ``pre_writing_materials_text`` str, ``user_profile_text`` str, ``target_writing_style_features``,
``target_interaction_style_features`` (as above), ``target_document_preferences`` str.
"""

from __future__ import annotations

import json

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.model_io import parse_json_object
from mimesis_jax.envs.sim_env import SimTurn
from mimesis_jax.envs.soul.base import JudgeEnv, parse_score, register

STOP = "terminate conversation"
LIKERT = (1.0, 5.0)
DOC_RATING = (1.0, 10.0)
CATEGORIES = {"writing": "writing style", "interaction": "interaction style"}


def _check_features(record: dict, key: str, where: str) -> None:
    feats = record.get(key)
    if feats is None:
        return
    if not isinstance(feats, list):
        raise EnvError(f"{where}: field {key!r} must be a list of feature objects, got {type(feats).__name__}")
    for i, f in enumerate(feats):
        if not isinstance(f, dict):
            raise EnvError(f"{where}: field {key!r} item {i} must be an object, got {type(f).__name__}")
        name = f.get("Feature Name")
        if not isinstance(name, str) or not name.strip():
            raise EnvError(f"{where}: field {key!r} item {i} needs a non-empty str 'Feature Name'")
        if not feature_description(f):
            raise EnvError(f"{where}: field {key!r} item {i} ({name!r}) needs a non-empty str "
                           f"'Feature Question Answer' or 'Feature Question'")


def feature_description(feature: dict) -> str:
    """A target feature's description: its answer, else its question ('' when neither is a non-empty str)."""
    for key in ("Feature Question Answer", "Feature Question"):
        value = feature.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""


def parse_fulfillment(text: str, n: int) -> list[bool]:
    """The judge's per-feature verdicts {"results": [{"classification": "Match" | "No Match", ...}, ...]} in the
    listed order; ValueError unless there are exactly `n` readable verdicts."""
    results = parse_json_object(text).get("results")
    if not isinstance(results, list) or len(results) != n:
        raise ValueError(f"expected a 'results' list with one verdict for each of the {n} features")
    out = []
    for i, r in enumerate(results):
        verdict = r.get("classification") if isinstance(r, dict) else None
        verdict = verdict.strip().lower() if isinstance(verdict, str) else None
        if verdict not in ("match", "no match"):
            raise ValueError(f"result {i}: 'classification' must be 'Match' or 'No Match'")
        out.append(verdict == "match")
    return out


class SimArena(JudgeEnv):
    """The shared SimulatorArena protocol; subclasses set the task's prompt keys, markers, fields and terms."""

    multi_turn = True
    max_policy_turns = 8
    prompt_file = "sim_arena"
    score_range = LIKERT  # the style judges' scale (the document rating's is DOC_RATING)
    kind = ""                       # "math" | "doc": the <kind>_* prompt templates
    markers: tuple[str, ...] = ()   # the policy's message markers, the first found wins
    categories: tuple[str, ...] = ()  # the target feature categories judged for fulfilment
    user_label = assistant_label = ""

    def __init__(self, record: dict, **kwargs):
        super().__init__(record, **kwargs)
        self.queries: list[str] = []
        self.answers: list[str] = []
        self.details: dict = {}  # what scoring produced besides the terms (sim_doc: the final document)

    # -------------------------------------------------------------- records
    @classmethod
    def parse_record(cls, record, where):
        raw = record.get("raw")
        if isinstance(raw, str):
            try:
                extra = json.loads(raw)
            except json.JSONDecodeError as e:
                raise EnvError(f"{where}: field 'raw' is not valid JSON ({e.msg})") from None
            if not isinstance(extra, dict):
                raise EnvError(f"{where}: field 'raw' must hold a JSON object")
            record = {**record, **extra}
        record = super().parse_record(record, where)
        queries = record["human_user_queries"]
        if isinstance(queries, list) and not all(isinstance(q, str) for q in queries):
            raise EnvError(f"{where}: field 'human_user_queries' must be a str or a list of str")
        conversation = record["human_public_conversation"]
        if isinstance(conversation, list):
            for i, m in enumerate(conversation):
                if not isinstance(m, dict) or m.get("role") not in ("user", "assistant") or \
                        not isinstance(m.get("content"), str):
                    raise EnvError(f"{where}: field 'human_public_conversation' item {i} must be a "
                                   f"{{role: user|assistant, content: str}} message")
        for cat in cls.categories:
            _check_features(record, f"target_{cat}_style_features", where)
        return record

    def features(self, category: str) -> list[dict]:
        return self.record.get(f"target_{category}_style_features") or []

    # -------------------------------------------------------------- the dialogue
    def brief(self) -> dict[str, str]:
        """The task's placeholders shared by its prompts."""
        raise NotImplementedError

    def initial_messages(self):
        return [{"role": "system", "content": self.prompt(f"{self.kind}_simulator", **self.brief(),
                                                          profile=self.record.get("user_profile_text") or "")},
                {"role": "user", "content": self.prompt(f"{self.kind}_opening", **self.brief())}]

    def public_text(self, utterance: str) -> str:
        """What the assistant sees of a policy message: the text after its marker, else the whole message."""
        for marker in self.markers:
            if marker in utterance:
                return utterance.split(marker, 1)[1].strip()
        return utterance.strip()

    def partner_messages(self):
        msgs = [{"role": "system", "content": self.prompt(f"{self.kind}_partner_system")}]
        for i, query in enumerate(self.queries):
            content = self.prompt(f"{self.kind}_partner_first", **self.brief(), message=query) if i == 0 else query
            msgs.append({"role": "user", "content": content})
            if i < len(self.answers):
                msgs.append({"role": "assistant", "content": self.answers[i]})
        return msgs

    def step(self, thought, utterance):
        self.replies.append(utterance)
        if utterance is None:
            return SimTurn(done=True, reward=0.0, info={"end": "no_utterance", "policy_turns": len(self.replies)})
        self.view.append({"role": "assistant", "content": utterance})
        query = self.public_text(utterance)
        if not query or STOP in utterance.lower():
            return self._judged("simulator_ended")
        self.queries.append(query)
        answer = self.ask_partner(self.partner_messages())
        self.answers.append(answer)
        if len(self.replies) >= self.max_policy_turns:
            return self._judged("max_turns")
        msg = {"role": "user", "content": answer}
        self.view.append(msg)
        return SimTurn(done=False, messages=[msg])

    def finish(self, reason):
        return self._judged(reason)

    def transcript(self):
        return self.public_conversation()

    def public_conversation(self) -> list[dict]:
        out = []
        for i, query in enumerate(self.queries):
            out.append({"role": "user", "content": query})
            if i < len(self.answers):
                out.append({"role": "assistant", "content": self.answers[i]})
        return out

    def format_conversation(self, messages: list[dict]) -> str:
        return "\n".join(f"- {self.user_label if m['role'] == 'user' else self.assistant_label}: {m['content']}"
                         for m in messages)

    # -------------------------------------------------------------- scoring
    def _judged(self, end: str) -> SimTurn:
        info = {"end": end, "policy_turns": len(self.replies), "messages_sent": len(self.queries)}
        if not self.queries:
            return SimTurn(done=True, reward=0.0, info={**info, "end": f"{end}_before_any_message"})
        terms = self.score_terms()
        return SimTurn(done=True, reward=sum(terms.values()) / len(terms),
                       info={**info, "terms": terms, **self.details})

    def rate(self, template: str, parse, **values):
        return self.ask_judge([{"role": "user", "content": self.prompt(template, **values)}], parse)

    def score_terms(self) -> dict[str, float]:
        """Every available reward term, each in [0, 1]."""
        real_queries = self.record["human_user_queries"]
        real_conversation = self.record["human_public_conversation"]
        lo, hi = self.score_range
        terms = {}
        for cat in ("writing", "interaction"):
            score = self.rate(
                f"{cat}_judge", lambda t: parse_score(t, lo, hi, "similarity_score"),
                task=self.prompt(f"{self.kind}_task", **self.brief()),
                features=self.prompt(f"{self.kind}_{cat}_features"),
                real_queries="\n".join(real_queries) if isinstance(real_queries, list) else real_queries,
                simulated_queries="\n".join(self.queries),
                real_conversation=(self.format_conversation(real_conversation)
                                   if isinstance(real_conversation, list) else real_conversation),
                simulated_conversation=self.format_conversation(self.public_conversation()))
            terms[f"{cat}_style"] = score / hi
        listed = [(cat, f) for cat in self.categories for f in self.features(cat)]
        if listed:
            lines = [f"{i}. [{CATEGORIES[cat]}] {f['Feature Name'].strip()}: {feature_description(f)}"
                     for i, (cat, f) in enumerate(listed, 1)]
            verdicts = self.rate("fulfillment_judge", lambda t: parse_fulfillment(t, len(listed)),
                                 user_label=self.user_label, features="\n".join(lines),
                                 conversation=self.format_conversation(self.public_conversation()))
            for cat in self.categories:
                hits = [v for (c, _), v in zip(listed, verdicts) if c == cat]
                if hits:
                    terms[f"{cat}_fulfillment"] = sum(hits) / len(hits)
        return terms


@register
class SimMath(SimArena):
    name = "sim_math"
    kind = "math"
    markers = ("Response:", "Query:")
    categories = ("interaction",)
    user_label, assistant_label = "Student", "AI Tutor"
    protocol = ("play the profiled student asking a tutor (partner) about a math problem, up to 8 messages "
                "('Query:' then 'Response:'; 'terminate conversation' ends)")
    reward_doc = ("mean of: writing-style Likert/5 and interaction-style Likert/5 vs the real student, and the "
                  "match rate of the record's interaction-style features (when it lists any)")
    record_format = ("problem, human_user_queries, human_public_conversation; optional user_profile_text, "
                     "target_interaction_style_features; 'raw' JSON merged")
    fields = (("problem", str, False), ("human_user_queries", (list, str), False),
              ("human_public_conversation", (list, str), False), ("user_profile_text", str, True),
              ("target_interaction_style_features", list, True))

    def brief(self):
        return {"problem": self.record["problem"].strip()}


@register
class SimDoc(SimArena):
    name = "sim_doc"
    kind = "doc"
    markers = ("Message:",)
    categories = ("writing", "interaction")
    user_label, assistant_label = "User", "AI Writing Assistant"
    protocol = ("play the profiled user co-writing a document with a writing assistant (partner), up to 8 "
                "'Message:' turns ('terminate conversation' ends); the partner then writes the final document")
    reward_doc = ("mean of: document rating/10, writing-style and interaction-style Likert/5 vs the real user, and "
                  "the match rates of the record's writing- and interaction-style features (when it lists any)")
    record_format = ("document_type, intent, human_user_queries, human_public_conversation; optional "
                     "pre_writing_materials_text, user_profile_text, target_writing_style_features, "
                     "target_interaction_style_features, target_document_preferences; 'raw' JSON merged")
    fields = (("document_type", str, False), ("intent", str, False), ("human_user_queries", (list, str), False),
              ("human_public_conversation", (list, str), False), ("pre_writing_materials_text", str, True),
              ("user_profile_text", str, True), ("target_writing_style_features", list, True),
              ("target_interaction_style_features", list, True), ("target_document_preferences", str, True))

    def brief(self):
        return {"document_type": self.record["document_type"], "intent": self.record["intent"],
                "materials": self.record.get("pre_writing_materials_text") or "(none)"}

    def score_terms(self):
        document = self.ask_partner(self.partner_messages() + [{"role": "user",
                                                                "content": self.prompt("doc_final_request")}])
        lo, hi = DOC_RATING
        rating = self.rate("doc_rating_judge", lambda t: parse_score(t, lo, hi, "rating"), **self.brief(),
                            preferences=self.record.get("target_document_preferences") or "(none stated)",
                            document=document)
        self.details["final_document"] = document
        return {"document": rating / hi, **super().score_terms()}
