"""CoSER: given-circumstance acting -- role-play one character of a book scene (judge family, multi-turn).

Protocol (OdysSim ``agents/coser``, this project's wording, made compact): OdysSim lets the trained model voice
every speaking character (one context each) while a fixed model narrates the Environment and a second fixed model
picks the next speaker. Here the policy voices ONE character (the ``character`` option; default the first
speaking character that is not the Environment) and the fixed ``partner`` voices everything else in one context:
the other characters, the Environment, and who speaks when (it stops where the policy's character is due).

* The policy's view: a system message (book, its character's profile, plot summary, scenario, the other
  characters' profiles, its inner motivation, the output format: ``[thought]`` -- hidden from the others --,
  ``(action)`` and speech, or only action and speech when ``wo_thought``) and a user message opening the scene
  (with the partner's opening lines when the first speaking character is not the policy's).
* The partner's view: its own system message, the policy's lines as ``user`` (inner thoughts removed,
  prefixed ``Name:``) and its own as ``assistant``; the policy sees the partner's lines as ``user`` messages,
  their inner thoughts removed too (OdysSim broadcasts every line without its thoughts).
* The scene ends after ``max_policy_turns`` policy turns (default 5: OdysSim runs 10 speaking rounds, about half
  of them the character's) or when the partner writes ``<END SCENE>`` once the policy has spoken at least
  ``min_policy_turns`` (3) times -- OdysSim likewise ignores an early end signal; an early marker is dropped and
  the scene goes on. An empty policy reply ends the scene (then judged), no reply at all (utterance None) scores 0.

Reward (Eq 4's r_d): ONE judge call scores the scene against the book's reference conversation on OdysSim's four
dimensions, each 1-10, in one JSON object: storyline_consistency, character_fidelity, anthropomorphism,
storyline_quality (fidelity and anthropomorphism are judged on the policy's character, the partner's being
fixed). r = mean over the four of (s - 1) / 9 -- OdysSim's mean of (s - 1) * 100 / 9, divided by 100. Inner
thoughts are removed from both conversations before judging. A missing or out-of-range dimension is asked again
once, then the episode is INVALID.

Record (OdysSim's field names; the row's ``extra_info``): ``circumstance`` (object, or that object as a JSON
string) with ``book`` str, ``scenario`` str, ``plot`` {``summary`` str, optional ``key_characters``
[{``name``, ``description``}]}, ``character_profiles`` {name: str}, ``dialogues`` [{``character``, ``message``}]
(the reference), ``speaking_characters_w_env`` [str], ``major_characters`` [str], optional ``key_characters``
[{``name``, ``motivation`` or ``thought``}]; optional ``wo_thought`` bool; optional ``continue_from`` int
(OdysSim replays that many reference rounds first; only 0 is supported here).
"""

from __future__ import annotations

import json
import re

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.model_io import field
from mimesis_jax.envs.sim_env import SimTurn
from mimesis_jax.envs.soul.base import JudgeEnv, parse_dimensions, register

ENVIRONMENT = "Environment"
END_SCENE = "<END SCENE>"
DIMENSIONS = ("storyline_consistency", "character_fidelity", "anthropomorphism", "storyline_quality")


def remove_thoughts(text: str) -> str:
    """A line as the other characters see it: ``[inner thoughts]`` removed, spaces and blank lines collapsed."""
    text = re.sub(r"\[.*?\]", "", text, flags=re.DOTALL)
    lines = [" ".join(ln.split()) for ln in text.split("\n")]
    return "\n".join(ln for ln in lines if ln)


def with_speaker(text: str, name: str) -> str:
    """``Name: text`` unless a line of `text` already starts with the speaker's name."""
    if any(ln.strip().startswith((f"{name}:", f"{name}\uff1a")) for ln in text.split("\n")):
        return text
    return f"{name}: {text}"


def _str_list(obj: dict, key: str, where: str, *, optional: bool = False) -> list[str]:
    value = field(obj, key, list, where, optional=optional, default=[])
    if not all(isinstance(x, str) for x in value):
        raise EnvError(f"{where}: field {key!r} must be a list of strings")
    return value


def _dict_list(obj: dict, key: str, keys: tuple[str, ...], where: str, *, optional: bool = False,
               optional_keys: tuple[str, ...] = ()) -> list[dict]:
    value = field(obj, key, list, where, optional=optional, default=[])
    for i, item in enumerate(value):
        for k in keys + optional_keys:
            field(item, k, str, f"{where}, {key}[{i}]", optional=k in optional_keys)
    return value


@register
class CoSER(JudgeEnv):
    name = "coser"
    multi_turn = True
    max_policy_turns = 5
    min_policy_turns = 3  # the partner's end marker counts only after this many policy turns
    score_range = (1.0, 10.0)
    protocol = ("play one character of a book scene ([thought] (action) speech); the partner voices the other "
                "characters and the Environment; up to max_turns turns")
    reward_doc = ("judge scores the scene vs the book's reference on 4 dimensions (1-10, one JSON): "
                  "r = mean of (s - 1) / 9")
    record_format = ("circumstance {book, scenario, plot{summary, key_characters}, character_profiles, dialogues"
                     "[{character, message}], speaking_characters_w_env, major_characters, key_characters}; "
                     "optional wo_thought, continue_from (0)")
    fields = (("circumstance", (dict, str), False), ("wo_thought", bool, True), ("continue_from", int, True))

    def __init__(self, record: dict, *, character: str | None = None, **kwargs):
        super().__init__(record, **kwargs)
        circ = record["circumstance"]
        speakers = [c for c in circ["speaking_characters_w_env"] if c != ENVIRONMENT]
        self.character = character if character is not None else speakers[0]
        if self.character not in speakers:
            raise EnvError(f"SOUL task 'coser': character {self.character!r} is not one of the scene's speaking "
                           f"characters {speakers}")
        self.log: list[tuple[str, str]] = []  # ("policy" | "partner", text as written)

    @classmethod
    def parse_record(cls, record, where):
        record = dict(super().parse_record(record, where))
        circ = record["circumstance"]
        if isinstance(circ, str):
            try:
                circ = json.loads(circ)
            except json.JSONDecodeError as e:
                raise EnvError(f"{where}: field 'circumstance' is not valid JSON ({e.msg})") from None
            if not isinstance(circ, dict):
                raise EnvError(f"{where}: field 'circumstance' must be an object")
        at = f"{where}, circumstance"
        for key in ("book", "scenario"):
            field(circ, key, str, at)
        plot = field(circ, "plot", dict, at)
        field(plot, "summary", str, f"{at}.plot")
        _dict_list(plot, "key_characters", ("name",), f"{at}.plot", optional=True, optional_keys=("description",))
        profiles = field(circ, "character_profiles", dict, at)
        if not all(isinstance(v, str) for v in profiles.values()):
            raise EnvError(f"{at}: field 'character_profiles' must map names to strings")
        _dict_list(circ, "dialogues", ("character", "message"), at)
        speakers = _str_list(circ, "speaking_characters_w_env", at)
        if not [c for c in speakers if c != ENVIRONMENT]:
            raise EnvError(f"{at}: field 'speaking_characters_w_env' names no character besides {ENVIRONMENT}")
        _str_list(circ, "major_characters", at)
        _dict_list(circ, "key_characters", ("name",), at, optional=True, optional_keys=("motivation", "thought"))
        if record.get("continue_from") or 0:
            raise EnvError(f"{where}: field 'continue_from' must be 0 (replaying reference rounds is not supported)")
        record["circumstance"] = circ
        return record

    # -------------------------------------------------------------- the scene's material
    @property
    def circ(self) -> dict:
        return self.record["circumstance"]

    def profile(self, name: str) -> str:
        """OdysSim's enhanced profile: the plot's description of a key character, then the character profile."""
        parts = [c.get("description", "").strip("\n") for c in self.circ["plot"].get("key_characters", [])
                 if c["name"] == name and c.get("description")]
        parts.append(self.circ["character_profiles"].get(name, "").strip("\n"))
        return "\n\n".join(p for p in parts if p).strip()

    def others(self) -> list[str]:
        return [c for c in self.circ["speaking_characters_w_env"] if c not in (ENVIRONMENT, self.character)]

    def _profiles(self, names) -> str:
        out = [f"### {n}\n{self.profile(n)}" for n in names if self.profile(n)]
        return "\n\n".join(out) or "(none)"

    def motivation(self) -> str:
        for c in self.circ.get("key_characters", []):
            if c["name"] == self.character:
                return c.get("motivation") or c.get("thought") or "(none)"
        return "(none)"

    # -------------------------------------------------------------- views
    def initial_messages(self):
        fmt = self.prompt("format_plain" if self.record.get("wo_thought") else "format_thought")
        system = self.prompt("character", book=self.circ["book"], character=self.character,
                             profile=self.profile(self.character) or "(none)", plot=self.circ["plot"]["summary"],
                             scenario=self.circ["scenario"], others=self._profiles(self.others()),
                             motivation=self.motivation(), format=fmt)
        self.log = []
        opening = self.prompt("scene_start")
        if self.circ["speaking_characters_w_env"][0] != self.character:
            shown, _ = self._partner_turn()
            opening = "\n\n".join(x for x in (opening, shown) if x)
        return [{"role": "system", "content": system}, {"role": "user", "content": opening}]

    def partner_messages(self):
        system = self.prompt("world", book=self.circ["book"], character=self.character,
                             plot=self.circ["plot"]["summary"], scenario=self.circ["scenario"],
                             cast=", ".join(self.others() + [ENVIRONMENT]), profiles=self._profiles(self.others()),
                             end=END_SCENE)
        msgs = [{"role": "system", "content": system}]
        pending = [self.prompt("scene_start")]
        for who, text in self.log:
            if who == "partner":
                msgs.append({"role": "user", "content": "\n\n".join(pending)})
                msgs.append({"role": "assistant", "content": text})
                pending = []
            else:
                pending.append(with_speaker(remove_thoughts(text) or "(stays silent)", self.character))
        msgs.append({"role": "user", "content": "\n\n".join(pending + [self.prompt("your_turn",
                                                                                    character=self.character)])})
        return msgs

    def _partner_turn(self) -> tuple[str, bool]:
        """Asks the partner; logs its lines (end marker removed); returns (what the policy sees, marker seen)."""
        reply = self.ask_partner(self.partner_messages())
        ended = END_SCENE in reply
        reply = reply.replace(END_SCENE, "").strip()
        if reply:
            self.log.append(("partner", reply))
        return remove_thoughts(reply), ended

    # -------------------------------------------------------------- protocol
    def step(self, thought, utterance):
        if (last := self._take_reply(utterance, blank_ends=True)) is not None:
            return last
        self.log.append(("policy", utterance))
        if len(self.replies) >= self.max_policy_turns:
            return self._finish("judged")
        shown, ended = self._partner_turn()
        if ended and len(self.replies) >= self.min_policy_turns:
            if shown:
                self.view.append({"role": "user", "content": shown})
            return self._finish("partner_ended")
        msg = {"role": "user", "content": shown or self.prompt("scene_goes_on", character=self.character)}
        self.view.append(msg)
        return SimTurn(done=False, messages=[msg])

    # -------------------------------------------------------------- judging
    def simulation_text(self) -> str:
        lines = []
        for who, text in self.log:
            clean = remove_thoughts(text)
            if clean:
                lines.append(with_speaker(clean, self.character) if who == "policy" else clean)
        return "\n\n".join(lines) or "(the scene has no lines)"

    def reference_text(self) -> str:
        out = []
        for d in self.circ["dialogues"]:
            msg = d["message"] if d["character"] == ENVIRONMENT else remove_thoughts(d["message"])
            out.append(f"{d['character']}: {msg}".strip("\n"))
        return "\n\n".join(out)

    def judge_messages(self):
        rubric = self.prompt("judge", book=self.circ["book"], character=self.character,
                             major=", ".join(self.circ["major_characters"]), plot=self.circ["plot"]["summary"],
                             scenario=self.circ["scenario"],
                             profiles=self._profiles([c for c in self.circ["speaking_characters_w_env"]
                                                      if c != ENVIRONMENT]),
                             reference=self.reference_text())
        return [{"role": "system", "content": rubric},
                {"role": "user", "content": self.prompt("judge_scene", scene=self.simulation_text())}]

    def judge_reward(self):
        lo, hi = self.score_range
        scores = self.ask_judge(self.judge_messages(), lambda t: parse_dimensions(t, {d: (lo, hi) for d in DIMENSIONS}))
        return sum((scores[d] - lo) / (hi - lo) for d in DIMENSIONS) / len(DIMENSIONS), scores
