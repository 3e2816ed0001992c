"""The ABCD realistic-behaviour environment (docs/reference/paper.md 3.4): the simulator plays a customer who performs an
assigned behaviour (B1..B13 of Table 5) or none (N) against a fixed support agent, and a judge scores it (Eq 12-13).

One of the 24 environments of the joint RL stage (Eq 4, domain ``abcd_behaviour``), on the `SimEnv` protocol
(envs/sim_env.py). The policy writes the CUSTOMER's turns (``policy_role = "user"``); in its view the support
agent is ``assistant``. The fixed agent sees the same dialogue with the same roles (customer ``user``, itself
``assistant``) under its own system prompt. Prompts are data: ``envs/abcd/data/prompts.toml``.

An episode:

1. **Behaviour.** Fixed per environment: given, or drawn at construction with
   ``assign_behaviour(np.random.default_rng(seed), neutral_share)`` (N with probability 1/3 by default). Building
   the envs of one GRPO group from the same record and seed gives every rollout of the group the same behaviour;
   ``reset`` never redraws it (its seed is unused: nothing else is random here).
2. **Replay** (``reset``). The identity-verification prefix (`dataset.identity_verification_turns`) is replayed
   verbatim: customer turns -> ``user``, agent turns -> ``assistant``. A run of consecutive ``action`` turns is
   folded, one ``[action: <text>]`` note per line (template ``action_note``), into the agent turn that follows it
   immediately, above its text; when a customer turn follows instead (or the replay ends), the run becomes an
   ``assistant`` message of its own. The replay always ends on an action (the identity check), so that last
   message also gets the ``replay_close`` line and the customer speaks next. An empty replay (FAQ and
   troubleshooting flows) is replaced by one ``assistant`` greeting (``agent_greeting``).
3. **Dialogue** (``step``). Each policy turn appends the customer's utterance. The customer ends the chat by
   writing ``config.end_marker`` (``[END]``, which its prompt asks for on the last line of its last message);
   the episode also ends after ``config.max_user_turns`` customer turns (8, docs/reference/paper.md 3.4; replayed turns do not
   count). Otherwise the fixed agent answers; its visible reply (any thinking removed) is the step's message.
   An agent call that fails or answers nothing raises `InvalidEpisode`.
4. **Judge.** One call: system = the rubric, user = facts, policy, required actions, the card and the whole
   transcript (replay marked as context only). It must answer ONE JSON object
   ``{"e", "p", "n", "c", "meta_narration", "rationale"}`` with e, p, n, c in [0, 1] and a boolean flag; a bad
   answer is sent back once with a correction request, a second bad answer raises `InvalidEpisode`.
   For neutral N the judge reads e as "stays cooperative, free of any deliberately difficult conduct" and p is
   fixed at 1 (nothing has to happen at a particular time): the judge is told so and the environment sets
   p = 1.0 whatever it wrote.
5. **Reward.** Meta-narration = the judge's flag OR (``config.pattern_check`` and the narrow rule
   `behaviour.meta_narration_rule` matches one of the POLICY's customer utterances; the replayed turns were
   written by a real customer and are not checked). Looser matches (`behaviour.meta_narration_candidates`:
   "As a frustrated customer", "my role", "out of character", "I will pretend") decide nothing: they are listed
   in the judge's request ($candidates) and in ``info["meta_candidates"]``, and the judge's flag decides. r = `behaviour.behaviour_reward` (Eq 12 with
   ``config.weights``; Eq 13 zeroes ``config.meta_narration_zeroed``, e and p by default).
   ``utterance=None`` or an empty utterance (no public reply) finishes at once with reward 0 and no judge call
   (``end = "no_utterance"``); so does ``finish`` before any customer turn.

``info`` of the final step: behaviour, reward, scores (the judged e/p/n/c before Eq 13, None when not judged),
meta_narration, meta_source ("judge" | "pattern" | "both" | None), meta_match (the rule's matched text),
meta_candidates (the candidate phrases shown to the judge),
judge_rationale, end ("customer_ended" | "max_user_turns" | "no_utterance" | the runner's reason), user_turns.
`behaviour_report` aggregates such infos per behaviour.

Guidelines lookup (`policy_entry`): ``guidelines.json`` as ABCD releases it, ``{flow name: {"description",
"subflows": {subflow name: {"actions": [{"type", "button", "text", "subtext"}], "instructions": [...]}}}}``,
keyed by display names ("Product Defect", "Return Due to Color") while records use ids ("product_defect",
"return_color"). A name matches an id when its lower-cased words joined by ``_`` equal it; otherwise the entry
whose name shares the most words with the id (then the fewest extra words) is taken, and a tie or no shared word
is an error. This resolves all 10 flows and 55 subflows of the public release (checked against its files).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from typing import Any, Mapping, Sequence

import numpy as np

from mimesis_jax.envs.abcd import dataset as abcd
from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.abcd.behaviour import (
    ALL_IDS, BEHAVIOUR_IDS, BEHAVIOURS, CARD_FIELDS, NEUTRAL, SCORE_KEYS, BehaviourCard, assign_behaviour,
    behaviour_reward, meta_narration_candidates, meta_narration_rule, resolve_weights,
)
from mimesis_jax.envs.model_io import call_model, fill, load_templates, parse_json_object
from mimesis_jax.envs.sim_env import Message, SimEnv, SimTurn
from mimesis_jax.chat.base import ChatModel
from mimesis_jax.chat.thoughts import response_thought

DOMAIN = "abcd_behaviour"
PROMPTS_PATH = os.path.join(abcd.DATA_DIR, "prompts.toml")
META_SOURCES = ("judge", "pattern", "both")


# ------------------------------------------------------------------------------------ config
@dataclasses.dataclass(frozen=True)
class BehaviourEnvConfig:
    """Settings of the behaviour environment; every bad value raises EnvError naming its key."""

    neutral_share: float = 1.0 / 3.0  # P(N) when the behaviour is drawn (docs/reference/paper.md 3.4)
    max_user_turns: int = 8  # policy (customer) turns after the replay (docs/reference/paper.md 3.4)
    weights: Mapping[str, float] | None = None  # Eq 12 weights, any subset of e/p/n/c (stored completed by
    # DEFAULT_WEIGHTS); None = DEFAULT_WEIGHTS
    meta_narration_zeroed: tuple[str, ...] = ("e", "p")  # Eq 13: scores set to 0 under meta-narration
    pattern_check: bool = True  # meta-narration also when detect_meta_narration matches a customer turn
    end_marker: str = "[END]"  # the customer ends the chat by writing this
    agent_max_tokens: int | None = 512
    agent_temperature: float | None = 0.0
    judge_max_tokens: int | None = 1024
    judge_temperature: float | None = 0.0

    def __post_init__(self):
        def bad(key: str, expected: str):
            return EnvError(f"BehaviourEnvConfig: {key} must be {expected}, got {getattr(self, key)!r}")

        ns = self.neutral_share
        if isinstance(ns, bool) or not isinstance(ns, (int, float)) or not 0.0 <= float(ns) <= 1.0:
            raise bad("neutral_share", "a number in [0, 1]")
        if isinstance(self.max_user_turns, bool) or not isinstance(self.max_user_turns, int) \
                or self.max_user_turns < 1:
            raise bad("max_user_turns", "an int >= 1")
        if self.weights is not None:
            if not isinstance(self.weights, Mapping):
                raise bad("weights", f"None or a mapping with keys from {SCORE_KEYS}")
            try:
                object.__setattr__(self, "weights", resolve_weights(self.weights))
            except EnvError as e:
                raise EnvError(f"BehaviourEnvConfig: weights: {e}") from None
        zeroed = self.meta_narration_zeroed
        if isinstance(zeroed, str) or not isinstance(zeroed, (tuple, list)) or \
                not all(k in SCORE_KEYS for k in zeroed):
            raise bad("meta_narration_zeroed", f"a tuple of keys from {SCORE_KEYS}")
        object.__setattr__(self, "meta_narration_zeroed", tuple(zeroed))
        if not isinstance(self.pattern_check, bool):
            raise bad("pattern_check", "a bool")
        if not isinstance(self.end_marker, str) or not self.end_marker.strip():
            raise bad("end_marker", "a non-empty string")
        for key in ("agent_max_tokens", "judge_max_tokens"):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise bad(key, "None or an int >= 1")
        for key in ("agent_temperature", "judge_temperature"):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v < 0):
                raise bad(key, "None or a finite number >= 0")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "BehaviourEnvConfig":
        """A config from a plain mapping (a run config's section); an unknown key is an error naming it."""
        names = {f.name for f in dataclasses.fields(cls)}
        for k in values:
            if k not in names:
                raise EnvError(f"BehaviourEnvConfig: unknown key {k!r} (known: {sorted(names)})")
        return cls(**values)


# ------------------------------------------------------------------------------------ prompts and text
def prompt(key: str, **values) -> str:
    """Template ``key`` of data/prompts.toml filled with ``values``."""
    table = load_templates(PROMPTS_PATH)
    if key not in table:
        raise EnvError(f"prompt file {PROMPTS_PATH}: no template {key!r}")
    return fill(table[key], f"abcd/data/prompts.toml:{key}", **values)


def _kv_lines(values: Mapping[str, Any]) -> str:
    """'- key: value' lines (lists joined with ', ') for the fields the record has; a field that is absent,
    None, an empty string or an empty list (the release's storewide / FAQ conversations have empty product lists
    and no email or username) gets no line; '- (none)' when no field is left."""
    present = [(k, v) for k, v in values.items() if v is not None and v != "" and v != []]
    if not present:
        return "- (none)"
    return "\n".join(f"- {k}: {', '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in present)


def scenario_facts(record: abcd.Conversation) -> str:
    """The scenario block (prompts.toml ``scenario_facts``): flow/subflow, personal, order and product fields."""
    sc = record.scenario
    return prompt("scenario_facts", flow=sc["flow"], subflow=sc["subflow"], personal=_kv_lines(sc["personal"]),
                  order=_kv_lines(sc["order"]), product=_kv_lines(sc["product"]))


def card_text(card: BehaviourCard, neutral_key: str, behaviour_key: str) -> str:
    """A behaviour card through its template (the neutral one for N), with every card field."""
    key = neutral_key if card.id == NEUTRAL else behaviour_key
    return prompt(key, **{f: getattr(card, f) for f in CARD_FIELDS})


# ------------------------------------------------------------------------------------ guidelines and kb
def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def _match_name(names: Sequence[str], ident: str, what: str) -> str:
    """The display name in ``names`` for the id ``ident`` (module docstring: exact, else most shared words)."""
    exact = [n for n in names if _norm(n) == ident]
    if len(exact) == 1:
        return exact[0]
    if len(exact) > 1:
        raise EnvError(f"{what}: several entries match {ident!r}: {exact}")
    words = set(ident.split("_"))
    ranked = sorted(((len(words & set(_norm(n).split("_"))), -len(set(_norm(n).split("_")) - words), n)
                     for n in names), key=lambda t: (t[0], t[1]), reverse=True)
    if not ranked or ranked[0][0] == 0:
        raise EnvError(f"{what}: no entry matches {ident!r} (entries: {list(names)})")
    if len(ranked) > 1 and ranked[1][:2] == ranked[0][:2]:
        raise EnvError(f"{what}: {ident!r} matches {ranked[0][2]!r} and {ranked[1][2]!r} equally")
    return ranked[0][2]


def policy_entry(guidelines: Mapping, flow: str, subflow: str) -> tuple[str, dict, str, dict]:
    """(flow name, flow entry, subflow name, subflow entry) of ``guidelines`` for a record's flow/subflow ids."""
    if not isinstance(guidelines, Mapping):
        raise EnvError(f"guidelines: expected a JSON object, got {type(guidelines).__name__}")
    flow_name = _match_name(list(guidelines), flow, "guidelines")
    fentry = guidelines[flow_name]
    where = f"guidelines[{flow_name!r}]"
    if not isinstance(fentry, Mapping) or not isinstance(fentry.get("subflows"), Mapping):
        raise EnvError(f"{where}: field 'subflows' is missing or not an object")
    if not isinstance(fentry.get("description", ""), str):
        raise EnvError(f"{where}: field 'description' must be a string")
    sub_name = _match_name(list(fentry["subflows"]), subflow, f"{where}.subflows")
    sentry = fentry["subflows"][sub_name]
    swhere = f"{where}.subflows[{sub_name!r}]"
    if not isinstance(sentry, Mapping):
        raise EnvError(f"{swhere}: expected an object")
    for key in ("instructions", "actions"):
        if not isinstance(sentry.get(key), list):
            raise EnvError(f"{swhere}: field {key!r} is missing or not a list")
    for i, ins in enumerate(sentry["instructions"]):
        if not isinstance(ins, str):
            raise EnvError(f"{swhere}: field 'instructions[{i}]' must be a string")
    for i, act in enumerate(sentry["actions"]):
        if not isinstance(act, Mapping):
            raise EnvError(f"{swhere}: field 'actions[{i}]' must be an object")
        for key in ("button", "text"):
            if not isinstance(act.get(key), str):
                raise EnvError(f"{swhere}: field 'actions[{i}].{key}' is missing or not a string")
        if not isinstance(act.get("type", ""), str):
            raise EnvError(f"{swhere}: field 'actions[{i}].type' must be a string")
        sub = act.get("subtext", [])
        if not isinstance(sub, list) or not all(isinstance(s, str) for s in sub):
            raise EnvError(f"{swhere}: field 'actions[{i}].subtext' must be a list of strings")
    return flow_name, dict(fentry), sub_name, dict(sentry)


def policy_text(guidelines: Mapping, flow: str, subflow: str) -> str:
    """The guidelines entry of flow/subflow as text (prompts.toml ``policy``): instructions, then numbered steps
    "Button (type): text" with their subtext as indented '- ' lines."""
    flow_name, fentry, sub_name, sentry = policy_entry(guidelines, flow, subflow)
    steps = []
    for i, act in enumerate(sentry["actions"], 1):
        kind = f" ({act['type']})" if act.get("type") else ""
        steps.append(f"{i}. {act['button']}{kind}: {act['text']}")
        steps.extend(f"   - {s}" for s in act.get("subtext", []))
    return prompt("policy", flow_name=flow_name, flow_description=fentry.get("description", ""),
                  subflow_name=sub_name, instructions="\n".join(f"- {s}" for s in sentry["instructions"]) or "- (none)",
                  steps="\n".join(steps) or "(none)")


def required_actions(kb: Mapping, subflow: str) -> list[str]:
    """kb.json's action sequence for ``subflow``; a missing or malformed entry is an error naming it."""
    if not isinstance(kb, Mapping):
        raise EnvError(f"kb: expected a JSON object {{subflow: [actions]}}, got {type(kb).__name__}")
    acts = kb.get(subflow)
    if not isinstance(acts, list) or not all(isinstance(a, str) for a in acts):
        raise EnvError(f"kb: subflow {subflow!r} is missing or does not map to a list of action names")
    return list(acts)


@functools.lru_cache(maxsize=1)
def shipped_kb() -> dict[str, list[str]]:
    """The shipped data/kb.json, read once."""
    return abcd.load_kb(abcd.KB_PATH)


@functools.lru_cache(maxsize=1)
def shipped_guidelines() -> dict:
    """The shipped data/guidelines.json, read once."""
    return abcd.load_guidelines(abcd.GUIDELINES_PATH)


# ------------------------------------------------------------------------------------ replay
def replay_messages(turns: Sequence[tuple[str, str]]) -> list[Message]:
    """The replayed turns as chat messages (module docstring, step 2); a greeting when there are none."""
    if not turns:
        return [{"role": "assistant", "content": prompt("agent_greeting")}]
    out: list[Message] = []
    notes: list[str] = []
    for speaker, text in turns:
        if speaker == "action":
            notes.append(prompt("action_note", text=text))
        elif speaker == "agent":
            out.append({"role": "assistant", "content": "\n".join(notes + [text])})
            notes = []
        else:
            if notes:
                out.append({"role": "assistant", "content": "\n".join(notes)})
                notes = []
            out.append({"role": "user", "content": text})
    if notes:
        out.append({"role": "assistant", "content": "\n".join(notes + [prompt("replay_close")])})
    return out


# ------------------------------------------------------------------------------------ judge answers
def parse_judgement(text: str) -> dict:
    """The judge's JSON -> {"scores": {e, p, n, c}, "meta_narration": bool, "rationale": str}; ValueError says
    what is wrong (no object, a missing/non-numeric/out-of-range score, a non-boolean flag)."""
    obj = parse_json_object(text)
    scores = {}
    for k in SCORE_KEYS:
        if k not in obj:
            raise ValueError(f"score {k!r} is missing")
        v = obj[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0.0 <= v <= 1.0:
            raise ValueError(f"score {k!r} must be a number in [0, 1], got {v!r}")
        scores[k] = float(v)
    flag = obj.get("meta_narration")
    if not isinstance(flag, bool):
        raise ValueError(f"'meta_narration' must be true or false, got {flag!r}")
    rationale = obj.get("rationale", "")
    if not isinstance(rationale, str):
        raise ValueError(f"'rationale' must be a string, got {type(rationale).__name__}")
    return {"scores": scores, "meta_narration": flag, "rationale": rationale.strip()}


# ------------------------------------------------------------------------------------ the environment
class BehaviourEnv(SimEnv):
    """The ABCD realistic-behaviour environment (module docstring); the policy is the customer."""

    domain = DOMAIN
    policy_role = "user"
    thinking = True
    multi_turn = True

    def __init__(self, record: abcd.Conversation, *, agent: ChatModel, judge: ChatModel, kb: Mapping,
                 guidelines: Mapping, behaviour: str | None = None, config: BehaviourEnvConfig | None = None,
                 seed: int | None = None):
        if not isinstance(record, abcd.Conversation):
            raise EnvError(f"{DOMAIN}: record must be an abcd.Conversation, got {type(record).__name__}")
        self.config = BehaviourEnvConfig() if config is None else config
        if not isinstance(self.config, BehaviourEnvConfig):
            raise EnvError(f"{DOMAIN}: config must be a BehaviourEnvConfig, got {type(self.config).__name__}")
        for role, model in (("agent", agent), ("judge", judge)):
            if not isinstance(model, ChatModel):
                raise EnvError(f"{DOMAIN}: {role} must subclass ChatModel (chat/base.py), got {model!r}")
        self.record, self.agent, self.judge = record, agent, judge
        self.where = f"{DOMAIN} convo_id={record.convo_id!r}"
        if behaviour is None:
            behaviour = assign_behaviour(np.random.default_rng(seed), self.config.neutral_share)
        if behaviour not in ALL_IDS:
            raise EnvError(f"{self.where}: behaviour must be one of {ALL_IDS}, got {behaviour!r}")
        self.behaviour = behaviour
        self.card = BEHAVIOURS[behaviour]
        self.max_policy_turns = self.config.max_user_turns
        try:
            self.policy = policy_text(guidelines, record.flow, record.subflow)
            self.actions = required_actions(kb, record.subflow)
        except EnvError as e:
            raise EnvError(f"{self.where}: {e}") from None
        self.facts = scenario_facts(record)
        self.replay = abcd.identity_verification_turns(record)
        self.customer_system = prompt("customer_system", facts=self.facts,
                                      card=card_text(self.card, "neutral_card", "behaviour_card"),
                                      end_marker=self.config.end_marker)
        self.required_actions_text = "\n".join(f"{i}. {a}" for i, a in enumerate(self.actions, 1)) or "(none)"
        self.agent_system = prompt("agent_system", facts=self.facts, policy=self.policy,
                                   required_actions=self.required_actions_text,
                                   action_note=prompt("action_note", text="<what you did>"))
        self._dialogue: list[Message] = []
        self._replay_len = 0
        self._utterances: list[str] = []
        self._started = False
        self._done = False

    # -------------------------------------------------------------- protocol
    def reset(self, seed: int | None = None) -> list[Message]:
        """The customer's view: its system prompt, then the replay (module docstring, step 2)."""
        self._dialogue = replay_messages(self.replay)
        self._replay_len = len(self._dialogue)
        self._utterances = []
        self._started, self._done = True, False
        return [{"role": "system", "content": self.customer_system}] + [dict(m) for m in self._dialogue]

    def step(self, thought: str | None, utterance: str | None) -> SimTurn:
        if not self._started:
            raise EnvError(f"{self.where}: call reset() before step()")
        if self._done:
            raise EnvError(f"{self.where}: the episode has ended; call reset() first")
        if utterance is None or not utterance.strip():
            return self._end("no_utterance", judged=False)
        self._dialogue.append({"role": "user", "content": utterance})
        self._utterances.append(utterance)
        if self.config.end_marker in utterance:
            return self._end("customer_ended")
        if len(self._utterances) >= self.config.max_user_turns:
            return self._end("max_user_turns")
        reply = self._agent_reply()
        self._dialogue.append({"role": "assistant", "content": reply})
        return SimTurn(done=False, messages=[{"role": "assistant", "content": reply}])

    def finish(self, reason: str) -> SimTurn:
        """The runner's stop (turn or context limit): judged like a normal end, reward 0 before any customer turn."""
        if not self._started:
            raise EnvError(f"{self.where}: call reset() before finish()")
        if self._done:
            raise EnvError(f"{self.where}: the episode has ended; call reset() first")
        return self._end(reason, judged=bool(self._utterances))

    def transcript(self) -> list[Message]:
        """The dialogue, replay included: customer as ``user``, support agent as ``assistant``."""
        return [dict(m) for m in self._dialogue]

    # -------------------------------------------------------------- the other sides
    def _agent_reply(self) -> str:
        messages = [{"role": "system", "content": self.agent_system}] + [dict(m) for m in self._dialogue]
        r = call_model(self.agent, messages, "support agent", temperature=self.config.agent_temperature,
                       max_tokens=self.config.agent_max_tokens)
        _, reply = response_thought(r)
        if not reply:
            raise InvalidEpisode(f"{self.where}: the support agent gave no reply (finish_reason={r.finish_reason})")
        return reply

    def _transcript_lines(self, messages: Sequence[Message]) -> str:
        return "\n".join(prompt("transcript_customer" if m["role"] == "user" else "transcript_agent",
                                text=m["content"]) for m in messages)

    def _judge(self) -> dict:
        replay = self._dialogue[: self._replay_len] if self.replay else []
        request = prompt("judge_request", facts=self.facts, policy=self.policy,
                         required_actions=self.required_actions_text,
                         card=card_text(self.card, "judge_card_neutral", "judge_card_behaviour"),
                         replay=self._transcript_lines(replay) if replay else prompt("transcript_no_replay"),
                         dialogue=self._transcript_lines(self._dialogue[len(replay):]),
                         candidates="\n".join(f"- {c!r}" for c in self._candidates()) or "- (none)")
        messages = [{"role": "system", "content": prompt("judge_system", end_marker=self.config.end_marker)},
                    {"role": "user", "content": request}]
        error = ""
        for attempt in range(2):
            r = call_model(self.judge, messages, "behaviour judge", temperature=self.config.judge_temperature,
                           max_tokens=self.config.judge_max_tokens)
            try:
                return parse_judgement(r.text)
            except ValueError as e:
                error = str(e)
            messages = messages + [{"role": "assistant", "content": r.text},
                                   {"role": "user", "content": prompt("judge_retry", error=error)}]
        raise InvalidEpisode(f"{self.where}: the behaviour judge's answer did not parse twice: {error}")

    def _candidates(self) -> list[str]:
        """The policy's phrases META_NARRATION_CANDIDATES marks, first occurrence of each, in order."""
        return list(dict.fromkeys(c for u in self._utterances for c in meta_narration_candidates(u)))

    # -------------------------------------------------------------- the end
    def _end(self, end: str, *, judged: bool = True) -> SimTurn:
        info: dict[str, Any] = {"behaviour": self.behaviour, "reward": 0.0, "scores": None, "meta_narration": None,
                                "meta_source": None, "meta_match": None, "meta_candidates": None,
                                "judge_rationale": None, "end": end,
                                "user_turns": len(self._utterances)}
        if judged:
            verdict = self._judge()
            scores = dict(verdict["scores"])
            if self.behaviour == NEUTRAL:
                scores["p"] = 1.0
            match = None
            if self.config.pattern_check:
                match = next((m for m in map(meta_narration_rule, self._utterances) if m is not None), None)
            source = {(True, True): "both", (True, False): "judge", (False, True): "pattern"}.get(
                (verdict["meta_narration"], match is not None))
            reward = behaviour_reward(scores, meta_narration=source is not None, weights=self.config.weights,
                                      meta_narration_zeroed=self.config.meta_narration_zeroed)
            info.update(reward=reward, scores=scores, meta_narration=source is not None, meta_source=source,
                        meta_match=match, meta_candidates=self._candidates(), judge_rationale=verdict["rationale"])
        self._done = True
        return SimTurn(done=True, reward=info["reward"], info=info)


def make_behaviour_env(record: abcd.Conversation, *, agent: ChatModel, judge: ChatModel, seed: int | None = None,
                       config: BehaviourEnvConfig | None = None, kb: Mapping | None = None,
                       guidelines: Mapping | None = None, behaviour: str | None = None) -> BehaviourEnv:
    """A BehaviourEnv with kb/guidelines defaulting to the shipped data/ files (read once per process)."""
    return BehaviourEnv(record, agent=agent, judge=judge, kb=shipped_kb() if kb is None else kb,
                        guidelines=shipped_guidelines() if guidelines is None else guidelines,
                        behaviour=behaviour, config=config, seed=seed)


# ------------------------------------------------------------------------------------ reporting
def _summary(rows: list[tuple[float, bool | None]]) -> dict:
    judged = [m for _, m in rows if m is not None]
    return {"count": len(rows), "judged": len(judged),
            "mean_reward": sum(r for r, _ in rows) / len(rows) if rows else None,
            "meta_narration_rate": sum(judged) / len(judged) if judged else None}


def behaviour_report(infos: Sequence[Mapping]) -> dict:
    """Per behaviour id (in B1..B13, N order, those present), then "behaviours" (B1..B13 pooled, the paper's
    aggregate behaviour reward) and "overall": {count, judged, mean_reward, meta_narration_rate}. The mean
    reward is over all episodes (no_utterance ones count as 0); the meta-narration rate over judged episodes
    (``meta_narration`` not None); None where there is nothing to average. Infos are final-step infos."""
    rows: dict[str, list[tuple[float, bool | None]]] = {}
    for i, info in enumerate(infos):
        if not isinstance(info, Mapping):
            raise EnvError(f"behaviour_report: info #{i} is not a mapping")
        b = info.get("behaviour")
        if b not in ALL_IDS:
            raise EnvError(f"behaviour_report: info #{i} field 'behaviour' must be one of {ALL_IDS}, got {b!r}")
        r = info.get("reward")
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 <= r <= 1.0:
            raise EnvError(f"behaviour_report: info #{i} field 'reward' must be a number in [0, 1], got {r!r}")
        m = info.get("meta_narration")
        if m is not None and not isinstance(m, bool):
            raise EnvError(f"behaviour_report: info #{i} field 'meta_narration' must be a bool or None, got {m!r}")
        rows.setdefault(b, []).append((float(r), m))
    report = {b: _summary(rows[b]) for b in ALL_IDS if b in rows}
    report["behaviours"] = _summary([x for b in BEHAVIOUR_IDS for x in rows.get(b, [])])
    report["overall"] = _summary([x for b in ALL_IDS for x in rows.get(b, [])])
    return report
