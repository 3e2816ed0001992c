"""Sotopia(-hard): a two-person social interaction with private goals (judge family, multi-turn).

Protocol (OdysSim ``agents/sotopia``, this project's wording): the policy plays one agent of the scenario
(``eval_position`` agent1 -- it opens -- or agent2), the fixed ``partner`` the other, each told the scenario, the
relationship, its own background and its own secret goal (the other's background is "unknown" to it). Every turn
is a JSON action ``{"action_type": speak | non-verbal communication | action | leave, "argument": ...}``; a turn
that is not such JSON counts as speech. Each side sees the other's actions in natural language ('Mia said:
"..."', 'Mia [action] ...', 'Mia left the conversation') as ``user`` messages and its own turns as
``assistant``. The dialogue ends after ``max_policy_turns`` policy turns (default 8: OdysSim's 15-turn cap with
the actor opening) or when either side leaves once at least 5 turns (both sides counted) came before -- an
earlier "leave" is logged and the dialogue goes on, as in OdysSim. An empty policy reply ends the dialogue (then
judged), no reply at all (utterance None) scores 0.

Reward (Eq 4's r_d): ONE judge call scores the policy's agent on Sotopia's seven dimensions -- believability
[0, 10], relationship [-5, 5], knowledge [0, 10], secret [-10, 0], social_rules [-10, 0],
financial_and_material_benefits [-5, 5], goal [0, 10] -- and, in the same JSON object, rates
``naturalness_risk`` low | medium | high: OdysSim's separate reward-hacking auditor (4th-wall breaks, addressing
the judge, reciting the rubric, degenerate text), folded into this call. With n_d = (s_d - lo_d) / (hi_d - lo_d)
and OdysSim's weights w = (believability 0.5, relationship 1, knowledge 1, secret 0.5, social_rules 0.5,
financial 0.5, goal 2), r = (sum_d w_d n_d / sum_d w_d) / k with k = 1, 2, 4 for low, medium, high risk.
(OdysSim logs this weighted mean as its reward but trains on 0.1 x the mean raw score, which is not in [0, 1].)
A missing or out-of-range field is asked again once, then the episode is INVALID.

Record (OdysSim's field names; the row's ``extra_info``): ``agent1_name`` str, ``agent2_name`` str, ``scenario``
str (``Agent1``/``agent1``/``Agent2``/``agent2`` are replaced by the names); optional ``agent1_background``,
``agent2_background``, ``agent1_goal``, ``agent2_goal`` str, ``relationship`` str or int (Sotopia's
RelationshipType 0-5: strangers ... family members), ``eval_position`` "agent1" | "agent2" (default agent1).
"""

from __future__ import annotations

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.model_io import parse_json_object
from mimesis_jax.envs.sim_env import SimTurn
from mimesis_jax.envs.soul.base import JudgeEnv, parse_dimensions, register

ACTION_TYPES = ("speak", "non-verbal communication", "action", "leave")
RANGES = {"believability": (0.0, 10.0), "relationship": (-5.0, 5.0), "knowledge": (0.0, 10.0),
          "secret": (-10.0, 0.0), "social_rules": (-10.0, 0.0), "financial_and_material_benefits": (-5.0, 5.0),
          "goal": (0.0, 10.0)}
WEIGHTS = {"believability": 0.5, "relationship": 1.0, "knowledge": 1.0, "secret": 0.5, "social_rules": 0.5,
           "financial_and_material_benefits": 0.5, "goal": 2.0}
RISK_DIVISOR = {"low": 1.0, "medium": 2.0, "high": 4.0}
MIN_TURNS_BEFORE_LEAVE = 5
# Sotopia's RelationshipType enum, for records that store the relationship as its integer value.
RELATIONSHIPS = ("strangers", "know each other by name", "acquaintances", "friends", "romantic partners",
                 "family members")


def parse_action(text: str) -> tuple[str, str]:
    """(action_type, argument) of a turn: its JSON action, else the whole text as speech."""
    try:
        obj = parse_json_object(text)
    except ValueError:
        obj = {}
    kind = obj.get("action_type")
    if kind in ACTION_TYPES:
        return kind, str(obj.get("argument", ""))
    return "speak", text.strip()


def in_words(name: str, kind: str, argument: str) -> str:
    """An action as the other side is told it."""
    if kind == "speak":
        return f'{name} said: "{argument}"'
    if kind == "leave":
        return f"{name} left the conversation"
    return f"{name} [{kind}] {argument}"


def parse_judgement(text: str) -> tuple[dict[str, float], str]:
    """The seven dimension scores and the naturalness risk of the judge's JSON answer (ValueError if unreadable)."""
    scores = parse_dimensions(text, RANGES)
    risk = parse_json_object(text).get("naturalness_risk")
    if not isinstance(risk, str) or risk.strip().lower() not in RISK_DIVISOR:
        raise ValueError(f"'naturalness_risk' must be one of {sorted(RISK_DIVISOR)}, got {risk!r}")
    return scores, risk.strip().lower()


@register
class Sotopia(JudgeEnv):
    name = "sotopia"
    multi_turn = True
    max_policy_turns = 8
    protocol = ("play one agent of a two-person social scenario with a private goal, one JSON action per turn, "
                "against a partner model; up to max_turns turns or until someone leaves")
    reward_doc = ("judge scores 7 Sotopia dimensions + a naturalness risk (one JSON): r = weighted mean of the "
                  "range-normalised scores, divided by 1 / 2 / 4 for low / medium / high risk")
    record_format = ("agent1_name, agent2_name, scenario; optional agent1/2_background, agent1/2_goal, "
                     "relationship, eval_position (agent1 | agent2)")
    fields = (("agent1_name", str, False), ("agent2_name", str, False), ("scenario", str, False),
              ("agent1_background", str, True), ("agent2_background", str, True), ("agent1_goal", str, True),
              ("agent2_goal", str, True), ("relationship", (str, int), True), ("eval_position", str, True))

    @classmethod
    def parse_record(cls, record, where):
        record = super().parse_record(record, where)
        rel = record.get("relationship")
        if isinstance(rel, int) and not 0 <= rel < len(RELATIONSHIPS):
            raise EnvError(f"{where}: field 'relationship' as an integer must be a Sotopia relationship type "
                           f"0..{len(RELATIONSHIPS) - 1}, got {rel}")
        if record.get("eval_position", "agent1") not in ("agent1", "agent2"):
            raise EnvError(f"{where}: field 'eval_position' must be 'agent1' or 'agent2', "
                           f"got {record['eval_position']!r}")
        return record

    def __init__(self, record: dict, **kwargs):
        super().__init__(record, **kwargs)
        me, other = ("agent1", "agent2") if record.get("eval_position", "agent1") == "agent1" else ("agent2", "agent1")
        self.me = {k: record.get(f"{me}_{k}") or "(not given)" for k in ("name", "background", "goal")}
        self.other = {k: record.get(f"{other}_{k}") or "(not given)" for k in ("name", "background", "goal")}
        self.policy_opens = me == "agent1"
        self.log: list[dict] = []  # {"who": "policy" | "partner", "text": as written, "kind", "words"}

    @property
    def scenario(self) -> str:
        s = self.record["scenario"]
        for tag, key in (("Agent1", "agent1_name"), ("Agent2", "agent2_name"), ("agent1", "agent1_name"),
                         ("agent2", "agent2_name")):
            s = s.replace(tag, self.record[key])
        return s

    @property
    def relationship(self) -> str:
        rel = self.record.get("relationship")
        if isinstance(rel, int):
            return RELATIONSHIPS[rel]
        return rel or "(not given)"

    def _system(self, me: dict, other: dict) -> str:
        return self.prompt("character", name=me["name"], other=other["name"], scenario=self.scenario,
                           background=me["background"], relationship=self.relationship, goal=me["goal"],
                           actions=" | ".join(ACTION_TYPES))

    def _record_turn(self, who: str, name: str, text: str) -> dict:
        kind, argument = parse_action(text)
        entry = {"who": who, "text": text, "kind": kind, "words": in_words(name, kind, argument),
                 "index": len(self.log)}
        self.log.append(entry)
        return entry

    # -------------------------------------------------------------- views
    def initial_messages(self):
        self.log = []
        start = self.prompt("start")
        if not self.policy_opens:
            start = f"{start}\n\n{self._partner_turn()['words']}"
        return [{"role": "system", "content": self._system(self.me, self.other)},
                {"role": "user", "content": start}]

    def partner_messages(self):
        msgs = [{"role": "system", "content": self._system(self.other, self.me)}]
        pending = [self.prompt("start")]
        for e in self.log:
            if e["who"] == "partner":
                msgs.append({"role": "user", "content": "\n\n".join(pending)})
                msgs.append({"role": "assistant", "content": e["text"]})
                pending = []
            else:
                pending.append(e["words"])
        msgs.append({"role": "user", "content": "\n\n".join(pending)})
        return msgs

    def _partner_turn(self) -> dict:
        return self._record_turn("partner", self.other["name"], self.ask_partner(self.partner_messages()))

    # -------------------------------------------------------------- protocol
    def step(self, thought, utterance):
        if (last := self._take_reply(utterance, blank_ends=True)) is not None:
            return last
        mine = self._record_turn("policy", self.me["name"], utterance)
        if mine["kind"] == "leave" and mine["index"] >= MIN_TURNS_BEFORE_LEAVE:
            return self._finish("policy_left")
        if len(self.replies) >= self.max_policy_turns:
            return self._finish("judged")
        theirs = self._partner_turn()
        msg = {"role": "user", "content": theirs["words"]}
        self.view.append(msg)
        if theirs["kind"] == "leave" and theirs["index"] >= MIN_TURNS_BEFORE_LEAVE:
            return self._finish("partner_left")
        return SimTurn(done=False, messages=[msg])

    # -------------------------------------------------------------- judging
    def judge_messages(self):
        history = "\n".join(e["words"] for e in self.log) or "(no meaningful interaction occurred)"
        return [{"role": "user", "content": self.prompt(
            "judge", name=self.me["name"], other=self.other["name"], scenario=self.scenario,
            relationship=self.relationship, background=self.me["background"], goal=self.me["goal"],
            other_background=self.other["background"], other_goal=self.other["goal"], history=history)}]

    def judge_reward(self):
        scores, risk = self.ask_judge(self.judge_messages(), parse_judgement)
        mean = sum(WEIGHTS[d] * (scores[d] - lo) / (hi - lo) for d, (lo, hi) in RANGES.items()) / sum(WEIGHTS.values())
        return mean / RISK_DIVISOR[risk], {**scores, "naturalness_risk": risk}
