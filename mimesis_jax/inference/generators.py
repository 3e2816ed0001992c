"""The two generators of this project behind the one protocol (inference/protocol.py):

* `StaticGenerator` -- the static sampler (inference/sampler.py): every call prefills its prompts whole in
  bucketed programs; nothing is kept between calls, so `keys` and `release` change nothing.
* `EngineGenerator` -- the rollout engine (inference/engine.py): paged KV cache and Qwen3.5 state slots kept per
  dialogue key, so the next turn of a dialogue prefills only its new tokens; continuous batching.

Same seeds give the same tokens on both (tests/test_generators.py). A generator on a mesh places the weights it is
given as `models.shard_params` lays them out on that mesh (no copy when they already are), once, in `set_params`:
the sampler and the engine's programs then take them as placed, call after call.
"""

from __future__ import annotations

from typing import Sequence

from mimesis_jax.inference import sampler
from mimesis_jax.inference.engine import RolloutEngine
from mimesis_jax.inference.engine_requests import EngineConfig
from mimesis_jax.inference.protocol import Generator, Sample, Sampling, per_request, request_seeds
from mimesis_jax.models import shard_params


class _Seeded(Generator):
    """Per-request seeds: the protocol's rule (`request_seeds`) over this generator's seed and call count."""

    def __init__(self, seed: int, version: int):
        self.seed, self.version, self._calls = seed, version, 0

    def _columns(self, sampling, n: int) -> dict:
        reqs = per_request(sampling, n)
        seeds = request_seeds(reqs, self.seed, self._calls)
        self._calls += 1
        return dict(max_tokens=[s.max_tokens for s in reqs], temperature=[s.temperature for s in reqs],
                    top_p=[s.top_p for s in reqs], top_k=[s.top_k for s in reqs], seed=seeds)

    def _stamped(self, samples: list[Sample]) -> list[Sample]:
        for s in samples:
            s.version = self.version
        return samples


class StaticGenerator(_Seeded):
    """The static sampler over (config, params). mesh: the mesh it samples on (rows over its batch axes, params as
    models.shard_params lays them out); None = one device. buckets / max_batch: inference/sampler.py's shape
    buckets and per-call cap."""

    def __init__(self, config, params, *, stop_ids: Sequence[int], seed: int = 0, mesh=None,
                 buckets: sampler.Buckets | None = None, max_batch: int = 0, version: int = 0):
        super().__init__(seed, version)
        self.config, self.mesh, self.buckets, self.max_batch = config, mesh, buckets, max_batch
        self.stop_ids = tuple(int(t) for t in stop_ids)
        self.params = None
        self.set_params(params, version)

    def set_params(self, params, version: int) -> None:
        self.params = params if self.mesh is None or params is None else shard_params(self.config, params,
                                                                                       self.mesh)
        self.version = version

    def generate(self, prompts, sampling, *, keys=None, cancel=None) -> list[Sample]:
        c = self._columns(sampling, len(prompts))
        return self._stamped(sampler.generate(
            self.config, self.params, prompts, stop_ids=self.stop_ids, seed=c["seed"], mesh=self.mesh,
            buckets=self.buckets, max_batch=self.max_batch, cancel=None if self.mesh is not None else cancel,
            max_new_tokens=c["max_tokens"], temperature=c["temperature"], top_p=c["top_p"], top_k=c["top_k"]))


class EngineGenerator(_Seeded):
    """The rollout engine over (config, params): `engine_config` sizes its slots and pools (EngineConfig), `mesh`
    shards its weights, pages and state slots (docs/engine.md, "On a mesh"). `set_params` drops every cached
    dialogue: their keys/values were computed with the old weights. Calls from several threads run one at a
    time under the engine's one lock (`RolloutEngine.lock`, held around the seeds and the call); `engine` is the
    RolloutEngine itself (the server submits to it directly)."""

    def __init__(self, config, params, engine_config: EngineConfig | None = None, *, stop_ids: Sequence[int],
                 seed: int = 0, mesh=None, decode_attention=None, version: int = 0):
        super().__init__(seed, version)
        self.config = config
        self.engine = RolloutEngine(config, params, engine_config, stop_ids=stop_ids, seed=seed,
                                    decode_attention=decode_attention, mesh=mesh)

    @property
    def params(self):
        return self.engine.params

    def set_params(self, params, version: int) -> None:
        with self.engine.lock:
            self.engine.release_all()
            self.engine.params = params
            self.version = version

    def generate(self, prompts, sampling, *, keys=None, cancel=None) -> list[Sample]:
        with self.engine.lock:  # the call counter and the engine move together
            c = self._columns(sampling, len(prompts))
            return self._stamped(self.engine.generate_tokens(
                prompts, keys=keys, max_tokens=c["max_tokens"], temperature=c["temperature"], top_p=c["top_p"],
                top_k=c["top_k"], seed=c["seed"]))

    def release(self, keys) -> None:
        for k in keys:
            self.engine.release(k)
