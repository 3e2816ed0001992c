"""The one generation protocol (issue #43 item 1): what the RL loops, the episode runners, the chat models and
the server sample through, whatever runs underneath (the static sampler, the rollout engine; inference/generators.py).

    gen.set_params(params, version=3)           # the policy's weights after update 3
    out = gen.generate(prompts, Sampling(max_tokens=64, temperature=1.0, seed=7), keys=[("agent", 12)])
    out[0].tokens, out[0].logprobs, out[0].version   # sampled ids, their log-probs, the weights' version
    gen.release([("agent", 12)])                 # the dialogue ended: free what the generator kept for it
    gen.close()

* `generate(prompts, sampling, *, keys=None, cancel=None)`: token ids in (one list per request), one `Sample` per
  request out, in order, each stamped with the version of the weights that sampled it. `sampling` is one
  `Sampling` for every request or one per request. `keys` name dialogues: a generator that keeps per-dialogue
  state (the engine's cached pages) reuses it for the next turn of the same key; a stateless one ignores them.
  `cancel`: a bool array another thread may set per request; a set request ends early (its sample is discarded
  by whoever cancelled it) -- honoured by the single-device static sampler, ignored elsewhere.
* `set_params(params, version)`: the weights every later `generate` samples with; what a generator cached under
  the old weights is dropped. `version` is the policy's update count (the learner's step).
* `release(keys)`: the dialogues ended; nothing happens for keys the generator never saw.
* `close()`: frees what the generator holds; it is not used afterwards.

Randomness: a request whose `Sampling.seed` is None gets `derive_seed(generator seed, call count, index)`
(`request_seeds`, the one place the rule is written; whoever batches requests for a generator, as
chat/batching.py does, passes unseeded requests through unseeded), so repeated calls draw fresh samples and a run
is reproducible; an explicit seed makes a request's sample independent
of its batch (inference/sampler.py, "Randomness").
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Sequence

import numpy as np


def derive_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) % (1 << 63) for p in parts]).generate_state(1)[0])


@dataclasses.dataclass
class Sample:
    """One generated continuation."""

    tokens: list[int]
    logprobs: list[float] | None
    finish_reason: str  # "stop" (ended with a stop id) | "length" (hit max_new_tokens)
    prompt_len: int = 0
    version: int | None = None  # the policy version whose weights sampled it (None: a model outside training)


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How one request is sampled. temperature 0 = greedy; top_k 0 and top_p 1 = off (inference/sampler.py)."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None  # None: derived from the generator's seed and call count


def per_request(sampling: Sampling | Sequence[Sampling], n: int) -> list[Sampling]:
    """One Sampling per request: `sampling` repeated, or checked to hold exactly `n`."""
    if isinstance(sampling, Sampling):
        return [sampling] * n
    out = list(sampling)
    if len(out) != n or not all(isinstance(s, Sampling) for s in out):
        raise ValueError(f"generate: sampling must be one Sampling or one per request ({n}), got {sampling!r}")
    return out


def request_seeds(reqs: Sequence[Sampling], seed: int, call: int) -> list[int]:
    """The seed each request samples with: its own, else derive_seed(seed, call, its index in the call), where
    `seed` is the generator's and `call` counts the generator's earlier calls."""
    return [r.seed if r.seed is not None else derive_seed(seed, call, i) for i, r in enumerate(reqs)]


class Generator(abc.ABC):
    """Token ids in, sampled token ids, their log-probs and the policy version out (the module docstring)."""

    version: int = 0

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling | Sequence[Sampling], *,
                 keys: Sequence | None = None, cancel: np.ndarray | None = None) -> list[Sample]:
        ...

    @abc.abstractmethod
    def set_params(self, params, version: int) -> None:
        ...

    def release(self, keys: Sequence) -> None:
        """The dialogues `keys` ended. A generator without per-dialogue state has nothing to free."""

    def close(self) -> None:
        """Frees what the generator holds. One that holds nothing beyond its arrays has nothing to do."""
