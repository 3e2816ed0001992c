"""A generated token stream as text: `TokenEvent` (one token, its log-prob, why it ended), `SamplingParams` (one
request's settings, None = the model's default) and `Detokenizer` (incremental decoding with stop strings). What
the in-process batcher (chat/batching.py) and the HTTP server (serve/) both read samples through."""

from __future__ import annotations

import dataclasses

from mimesis_jax.chat.local import cut_at_stop_strings


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """One choice's sampling settings; None = the model's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None


@dataclasses.dataclass(frozen=True)
class TokenEvent:
    """One generated token: its id, its log-prob under the sampling policy, and on the last one why it ended
    ("stop": a stop id -- that id is this token -- or "length")."""

    token_id: int
    logprob: float
    finish_reason: str | None = None


class Detokenizer:
    """Turns one choice's TokenEvents into text: incremental decoding, the stop token kept out of the text (but in
    the tokens and log-probs), and stop strings -- the text ends before the earliest one, the tokens through the
    one completing it. Text that could still grow into a stop string, or that ends in a partial character, is held
    back, so streamed deltas add up to the final text.

    Each token costs two decodes of a short window (the ids since the last released text, after a few ids of
    context: what a SentencePiece space or a split multi-byte character needs), not of the whole completion;
    a stop string costs one full `cut_at_stop_strings`, and the finished text is one full decode.
    """

    def __init__(self, tok, stop_ids, stops):
        self.tok, self.stop_ids, self.stops = tok, set(int(s) for s in stop_ids), list(stops)
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.text, self.finish_reason, self._sent_tokens = "", None, 0
        self._decoded, self._prefix, self._read = "", 0, 0  # text of tokens[:_read]; window starts at _prefix

    def _advance(self, body: list[int]) -> str:
        """Decoded text of `body` so far (a trailing partial character not yet included)."""
        before = self.tok.decode(body[self._prefix:self._read])
        after = self.tok.decode(body[self._prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._decoded += after[len(before):]
            self._prefix, self._read = max(self._read - 4, 0), len(body)
        return self._decoded

    def push(self, ev: TokenEvent) -> tuple[str, list[int], list[float]]:
        """(new text, new token ids, their log-probs) released by this event; sets finish_reason when done."""
        self.tokens.append(int(ev.token_id))
        self.logprobs.append(float(ev.logprob))
        finish = ev.finish_reason
        body = self.tokens[:-1] if finish == "stop" and self.tokens[-1] in self.stop_ids else self.tokens
        full = self._advance(body)
        tail = full[max(0, len(self.text) - max((len(s) for s in self.stops), default=0)):]
        if any(s in tail for s in self.stops):
            k, full = cut_at_stop_strings(self.tok, body, self.stops)
            del self.tokens[k:], self.logprobs[k:]
            finish = "stop"
        elif finish is not None:
            full = self.tok.decode(body)
        else:  # hold back any tail that may grow into a stop string
            hold = max([0] + [n for s in self.stops for n in range(1, min(len(s), len(full) + 1))
                              if full.endswith(s[:n])])
            full = full[:len(full) - hold]
        self.finish_reason = finish
        delta = full[len(self.text):]
        if finish is not None or len(full) > len(self.text):
            self.text = full
        new = slice(self._sent_tokens, len(self.tokens))
        self._sent_tokens = len(self.tokens)
        return delta, self.tokens[new], self.logprobs[new]


# ------------------------------------------------------------------------------------ the app
