"""ABCD realistic-behaviour cards, the behaviour reward (docs/reference/paper.md 3.4, Eq 12-13) and meta-narration detection.

* ``BEHAVIOURS``: the 13 behaviours of Table 5 (B1..B13) and neutral ``N``, as cards
  {id, name, definition, looks_like, when, must_not} read from ``data/behaviours.json`` (this project's
  own wording of Table 5).
* ``behaviour_reward(scores)``: Eq 12, r = (w_e e + w_p p + w_n n + w_c c) / (w_e + w_p + w_n + w_c) with judged
  components e (expression), p (placement in time), n (naturalness), c (task/fact/policy consistency), each in
  [0, 1]; default weights e 2.0, p 1.5, n 0.75, c 0.75 (sum 5.0). Eq 13 (this project's form; the paper does
  not print it): when the rollout *describes* the behaviour instead of performing it (meta-narration), e = p = 0.
* ``meta_narration_rule(text)``: the first sure meta-narration match in a customer turn (zeroes e and p), else
  None; ``meta_narration_candidates(text)``: looser matches shown to the judge, which decides.
* ``assign_behaviour(rng)``: neutral with probability ``neutral_share`` (default 1/3, docs/reference/paper.md 3.4), else
  uniform over B1..B13.
"""

from __future__ import annotations

import math
import os
import random
import re
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from mimesis_jax.data import jsonio
from mimesis_jax.envs.agent_env import EnvError

BEHAVIOURS_PATH = os.path.join(os.path.dirname(__file__), "data", "behaviours.json")
CARD_FIELDS = ("id", "name", "definition", "looks_like", "when", "must_not")
BEHAVIOUR_IDS = tuple(f"B{i}" for i in range(1, 14))  # the 13 behaviours, without neutral
NEUTRAL = "N"
ALL_IDS = BEHAVIOUR_IDS + (NEUTRAL,)

SCORE_KEYS = ("e", "p", "n", "c")
DEFAULT_WEIGHTS: dict[str, float] = {"e": 2.0, "p": 1.5, "n": 0.75, "c": 0.75}
META_NARRATION_ZEROED = ("e", "p")  # Eq 13 default: expression and placement score 0


@dataclass(frozen=True)
class BehaviourCard:
    id: str
    name: str
    definition: str
    looks_like: str
    when: str       # where in the dialogue the behaviour belongs
    must_not: str   # what must not happen while performing it


def load_behaviours(path=BEHAVIOURS_PATH) -> dict[str, BehaviourCard]:
    """Read the behaviour cards: a JSON list of objects with CARD_FIELDS, ids exactly B1..B13 and N."""
    try:
        data = jsonio.read_json(path)
    except jsonio.DataFileError as e:
        raise EnvError(f"behaviour cards file {os.fspath(path)!r} is not readable JSON: {jsonio.located(e)}") from e
    if not isinstance(data, list):
        raise EnvError(f"behaviour cards file {os.fspath(path)!r}: expected a list of cards")
    cards: dict[str, BehaviourCard] = {}
    for i, c in enumerate(data):
        if not isinstance(c, dict):
            raise EnvError(f"behaviour cards file {os.fspath(path)!r}: card #{i} is not an object")
        for k in CARD_FIELDS:
            if not isinstance(c.get(k), str) or not c[k].strip():
                raise EnvError(f"behaviour cards file {os.fspath(path)!r}: card {c.get('id', i)!r} field {k!r} "
                               f"is missing or empty")
        if c["id"] in cards:
            raise EnvError(f"behaviour cards file {os.fspath(path)!r}: duplicate card id {c['id']!r}")
        cards[c["id"]] = BehaviourCard(**{k: c[k] for k in CARD_FIELDS})
    if set(cards) != set(ALL_IDS):
        raise EnvError(f"behaviour cards file {os.fspath(path)!r}: ids must be exactly {ALL_IDS}, "
                       f"got {tuple(cards)}")
    return {k: cards[k] for k in ALL_IDS}


BEHAVIOURS: dict[str, BehaviourCard] = load_behaviours()


# ------------------------------------------------------------------------------------- reward
def _unit(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EnvError(f"behaviour reward: {what} must be a number in [0, 1], got {value!r}")
    v = float(value)
    if math.isnan(v) or not 0.0 <= v <= 1.0:
        raise EnvError(f"behaviour reward: {what} must be in [0, 1], got {value!r}")
    return v


def resolve_weights(weights: Mapping[str, float] | None = None) -> dict[str, float]:
    """DEFAULT_WEIGHTS updated by ``weights`` (any subset of e/p/n/c); each >= 0, sum > 0."""
    w = dict(DEFAULT_WEIGHTS)
    for k, v in (weights or {}).items():
        if k not in SCORE_KEYS:
            raise EnvError(f"behaviour reward: unknown weight key {k!r} (expected {SCORE_KEYS})")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise EnvError(f"behaviour reward: weight {k!r} must be a finite number >= 0, got {v!r}")
        w[k] = float(v)
    if sum(w.values()) <= 0:
        raise EnvError("behaviour reward: the weights sum to 0")
    return w


def behaviour_reward(scores: Mapping[str, float], *, meta_narration: bool = False,
                     weights: Mapping[str, float] | None = None,
                     meta_narration_zeroed: tuple[str, ...] = META_NARRATION_ZEROED) -> float:
    """Eq 12: r = sum_k w_k s_k / sum_k w_k over k in (e, p, n, c); Eq 13: meta-narration zeroes e and p."""
    if not isinstance(scores, Mapping):
        raise EnvError(f"behaviour reward: scores must be a mapping with keys {SCORE_KEYS}")
    for k in scores:
        if k not in SCORE_KEYS:
            raise EnvError(f"behaviour reward: unknown score key {k!r} (expected {SCORE_KEYS})")
    s = {}
    for k in SCORE_KEYS:
        if k not in scores:
            raise EnvError(f"behaviour reward: score key {k!r} is missing")
        s[k] = _unit(scores[k], f"score {k!r}")
    if meta_narration:
        for k in meta_narration_zeroed:
            if k not in SCORE_KEYS:
                raise EnvError(f"behaviour reward: meta_narration_zeroed names unknown key {k!r}")
            s[k] = 0.0
    w = resolve_weights(weights)
    return sum(w[k] * s[k] for k in SCORE_KEYS) / sum(w[k] for k in SCORE_KEYS)


# ------------------------------------------------------------------------------------- meta-narration
# Meta-narration = the simulated customer DESCRIBES the behaviour or its role instead of performing it
# (docs/reference/paper.md 3.4: "I will now act like an annoyed customer"). The judge decides (its ``meta_narration`` flag). Two
# pattern sets help it, both case-insensitive (name, regex):
# * META_NARRATION_PATTERNS, the RULE: forms no real customer writes (an AI/simulation disclosure, announcing a
#   performance of a customer/role, stage directions, the role-play, the script, a behaviour card's name or id).
#   A match zeroes e and p on its own (Eq 13) when ``pattern_check`` is on.
# * META_NARRATION_CANDIDATES: forms that are often in-character speech ("As a frustrated customer, I want...",
#   "In my role as office manager...", "that is out of character for you guys", "I will pretend I did not hear
#   that"). A match never zeroes anything: the matched text is shown to the judge, which decides.
_STAGE_WORDS = (r"sighs?|sighing|groans?|huffs?|scoffs?|grumbles?|frowns?|rolls? (?:my |his |her )?eyes|"
                r"eye ?roll|taps? (?:my |his |her )?(?:foot|fingers)|clears? (?:my |his |her )?throat|"
                r"crosses? (?:my |his |her )?arms|impatiently|angrily|annoyed|frustrated|irritated|exasperated")
_ACTOR = r"(?:the |a |an )?(?:user|customer|simulated (?:user|customer)|caller|client)"
_NAME_PHRASES = "|".join(re.escape(c.name.lower()) for c in BEHAVIOURS.values() if c.id != NEUTRAL)
_I_WILL = r"\b(?:I(?:'ll| will| shall| am going to|'m going to| am gonna|'m gonna)|let me)\s+(?:now\s+)?"
META_NARRATION_PATTERNS: tuple[tuple[str, re.Pattern], ...] = tuple((n, re.compile(p, re.I)) for n, p in (
    # "As an AI language model", "I am a simulated user", "I'm just an AI"
    ("discloses_simulation", r"\bas an? (?:AI|artificial intelligence|language model)\b(?: (?:language )?model)?|"
                             r"\bI(?:'m| am) (?:just |only )?(?:an? )?(?:AI|simulated|simulation|virtual|fictional|"
                             r"role-?played?|scripted) (?:user|customer|assistant|model|character|persona)\b|"
                             r"\bI(?:'m| am) (?:just |only )?(?:an AI|a language model|a simulation)\b"),
    # announcing a performance: "I will (now) act like an annoyed customer", "I'll play the part of"
    ("announces_act", _I_WILL + r"(?:(?:act|behave)\s+(?:like|as)\s+(?:an?|the)\s+(?:\w+\s+){0,2}?"
                      r"(?:customer|user|client|character|persona)\b|"
                      r"(?:act|behave)\s+(?:annoyed|impatient|angry|difficult|rude)\b|act\s+out\b|"
                      r"portray\b|simulate\b|role-?play\b|stay in character\b|"
                      r"play\s+(?:the|a|an|my)\s+(?:\w+\s+)?(?:role|part|character)\b|"
                      r"play\s+(?:the|a|an|my)\s+(?:\w+\s+)?(?:customer|user)\b(?!\s+card))"),
    # talking about the assigned role or behaviour: "my persona", "my role here", "following my assigned behaviour"
    ("mentions_role", r"\b(?:my|this|the assigned|the target|the required) persona\b|"
                      r"\b(?:assigned|target|required) (?:behaviou?r|character|role|conduct)\b|"
                      r"\bmy role (?:here|in this (?:chat|conversation|scenario|simulation|exercise|role-?play))\b|"
                      r"\bbehaviou?r (?:card|pattern|id)\b"),
    # the role-play itself: "in this role-play", "staying in character", "breaking character"
    ("in_character", r"\brole-?play(?:ing|ed)?\b|\b(?:stay(?:s|ed|ing)?|remain(?:s|ed|ing)?|keep(?:s|ing)?) in character\b|"
                     r"\bbreak(?:s|ing)? character\b|\bbroke character\b|\(\s*OOC\b"),
    # talking about the script: "my instructions say", "according to the scenario"
    ("mentions_script", r"\b(?:my|the) (?:instructions|scenario|prompt|script) (?:says?|tells? me|asks? me)\b|"
                        r"\baccording to (?:my|the) (?:instructions|scenario|script|prompt)\b"),
    # stage directions: "*sighs*", "(rolls eyes)", "[frustrated]", "(the user sighs)"
    ("stage_direction", r"\*\s*(?:" + _STAGE_WORDS + r")[^*\n]{0,40}\*|\(\s*(?:" + _STAGE_WORDS + r")[^)\n]{0,40}\)|"
                        r"\[\s*(?:" + _STAGE_WORDS + r")[^\]\n]{0,40}\]|"
                        r"[(*\[]\s*" + _ACTOR + r"\s+(?:" + _STAGE_WORDS + r"|\w+s)\b[^)*\]\n]{0,40}[)*\]]"),
    # naming a behaviour: a card name ("goalpost shifting") or "behaviour B7" from Table 5
    ("names_behaviour", r"(?:" + _NAME_PHRASES + r")|\bbehaviou?r\s+B(?:1[0-3]|[1-9])\b"),
))
META_NARRATION_CANDIDATES: tuple[tuple[str, re.Pattern], ...] = tuple((n, re.compile(p, re.I)) for n, p in (
    ("pretends", _I_WILL + r"pretend\b"),
    ("casts_self", r"\bas an? (?:\w+ )?(?:annoyed|impatient|angry|frustrated|difficult|demanding|entitled|rude|"
                   r"uncooperative|confused) (?:customer|user|client|person)\b"),
    ("my_role", r"\bmy role\b|\bmy character\b"),
    ("character", r"\b(?:in|out of) character\b"),
    ("behaviour_id", r"\bB(?:1[0-3]|[1-9]):"),
))


def _check_text(text, who: str) -> None:
    if not isinstance(text, str):
        raise EnvError(f"{who}: text must be a string, got {type(text).__name__}")


def meta_narration_rule(text: str) -> str | None:
    """The matched text of the first META_NARRATION_PATTERNS hit (the rule: zeroes e and p), else None."""
    _check_text(text, "meta_narration_rule")
    for _, pat in META_NARRATION_PATTERNS:
        m = pat.search(text)
        if m:
            return m.group(0)
    return None


def meta_narration_candidates(text: str) -> list[str]:
    """The matched texts of META_NARRATION_CANDIDATES in ``text`` (shown to the judge; they decide nothing)."""
    _check_text(text, "meta_narration_candidates")
    return [m.group(0) for _, pat in META_NARRATION_CANDIDATES for m in pat.finditer(text)]


def detect_meta_narration(text: str) -> str | None:
    """The rule's match (`meta_narration_rule`), else the first candidate's, else None: anything worth a look.
    Only the rule's match zeroes scores; see the section comment."""
    _check_text(text, "detect_meta_narration")
    hit = meta_narration_rule(text)
    if hit is None:
        cands = meta_narration_candidates(text)
        hit = cands[0] if cands else None
    return hit


# ------------------------------------------------------------------------------------- assignment
def assign_behaviour(rng, neutral_share: float = 1.0 / 3.0) -> str:
    """One behaviour id: ``N`` with probability neutral_share, else uniform over B1..B13. ``rng`` is a
    numpy Generator or a ``random.Random``; one draw per call."""
    if isinstance(neutral_share, bool) or not isinstance(neutral_share, (int, float)) \
            or not 0.0 <= float(neutral_share) <= 1.0:
        raise EnvError(f"assign_behaviour: neutral_share must be in [0, 1], got {neutral_share!r}")
    if not isinstance(rng, (np.random.Generator, random.Random)):
        raise EnvError(f"assign_behaviour: rng must be a numpy Generator or a random.Random, got {type(rng).__name__}")
    u = float(rng.random())
    if u < neutral_share:
        return NEUTRAL
    i = int((u - neutral_share) / (1.0 - neutral_share) * len(BEHAVIOUR_IDS))
    return BEHAVIOUR_IDS[min(i, len(BEHAVIOUR_IDS) - 1)]
