"""A simulator turn's private thought and public utterance: `split_thought(text)` on the text of a turn
`"<think>\\n{thought}\\n</think>\\n\\n{utterance}"`, `response_thought(response)` preferring a server-side split."""

from __future__ import annotations

from mimesis_jax.chat.base import ChatResponse

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


# ------------------------------------------------------------------------------------ thoughts
def split_thought(text: str, *, thinking: bool = False) -> tuple[str | None, str | None]:
    """(thought, utterance) of a generated turn `"<think>\\n{thought}\\n</think>\\n\\n{utterance}"`.

    The opening `<think>` may be absent (it is part of the thinking generation prompt). With `thinking=True`
    a turn without `</think>` never closed its thought: (thought, None) -- the caller must not show any of it.
    Without thinking, a turn with no tags is all utterance: (None, text). Whitespace is stripped.
    """
    if THINK_CLOSE in text:
        head, _, tail = text.partition(THINK_CLOSE)
        head = head.split(THINK_OPEN, 1)[-1]
        return head.strip(), tail.strip()
    if THINK_OPEN in text:
        head, _, rest = text.partition(THINK_OPEN)
        return rest.strip(), None
    if thinking:
        return text.strip(), None
    return None, text.strip()


def response_thought(response: ChatResponse, *, thinking: bool = False) -> tuple[str | None, str | None]:
    """(thought, utterance) of a ChatResponse: a server-side split (`meta["reasoning"]`) wins over the text."""
    reasoning = response.meta.get("reasoning")
    if reasoning:
        _, utterance = split_thought(response.text, thinking=False)
        return reasoning.strip(), utterance
    return split_thought(response.text, thinking=thinking or bool(response.meta.get("thinking")))
