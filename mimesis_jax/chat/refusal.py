"""Rule-based detection of a user simulator that refuses (or drops) its role.

A user model that answers "As an AI language model, I can't pretend to be a customer" produced no user turn:
the episode is marked INVALID with the reason (never scored as reward 0, which would teach the agent
something false). Rules are named regular expressions, matched case-insensitively against the public
utterance and, by default, the private thought. The defaults cover explicit refusals and the assistant voice
leaking into the user's turn; pass your own table (or extend `DEFAULT_RULES`) to change them.
"""

from __future__ import annotations

import re
from typing import Mapping

DEFAULT_RULES: dict[str, str] = {
    "as_an_ai": r"\bas an? (?:ai|artificial intelligence|language model|llm)\b",
    "i_am_an_ai": r"\bi(?:'m| am) (?:just |only )?an? (?:ai|artificial intelligence|language model|large language model"
                  r"|ai assistant|virtual assistant|chatbot)\b",
    "cannot_roleplay": r"\bi (?:can(?:'|no)?t|cannot|won't|will not|am unable to|'m unable to|am not able to)"
                       r" (?:role-?play|pretend|play (?:the|this) role|act as|simulate|impersonate)",
    "break_character": r"\b(?:breaking|break|step(?:ping)? out of) (?:character|role)\b",
    "assistant_voice": r"\bhow (?:can|may) i (?:help|assist) you(?: today)?\b",
}


class RefusalDetector:
    """Finds the first matching rule in a user turn: `check(utterance, thought) -> reason | None`."""

    def __init__(self, rules: Mapping[str, str] | None = None, *, check_thought: bool = True):
        table = DEFAULT_RULES if rules is None else dict(rules)
        self.rules: dict[str, re.Pattern] = {}
        for name, pattern in table.items():
            try:
                self.rules[name] = re.compile(pattern, re.IGNORECASE)
            except re.error as e:
                raise ValueError(f"refusal rule {name!r}: invalid regular expression {pattern!r} ({e})") from None
        self.check_thought = check_thought

    def check(self, utterance: str | None, thought: str | None = None) -> str | None:
        fields = [("utterance", utterance)] + ([("thought", thought)] if self.check_thought else [])
        for where, text in fields:
            if not text:
                continue
            for name, rx in self.rules.items():
                m = rx.search(text)
                if m:
                    return f"user model refused its role: rule {name!r} matched {m.group(0)!r} in its {where}"
        return None
