"""`EngineChatModel`: `local.LocalChatModel` whose sampling goes through a RolloutEngine (inference/engine.py)."""

from __future__ import annotations

import threading

from mimesis_jax.chat.local import LocalChatModel
from mimesis_jax.inference.protocol import derive_seed
from mimesis_jax.inference.engine import EngineConfig, RolloutEngine


class EngineChatModel:
    """`local.LocalChatModel` whose sampling goes through a RolloutEngine: a drop-in agent for
    `episode.run_episodes` / policy for `sim_episode.run_sim_episodes`, and an in-process simulator (ChatModel)
    whose `chat_batch` takes `keys` (one dialogue key per conversation).

    Built like LocalChatModel plus `engine_config`; `set_params` swaps in new weights (after an RL step) and
    drops every cached dialogue, whose keys/values were computed with the old ones. `mesh` (a process-local
    mesh, None = one device): the engine's params, KV pool and state slots are sharded over it
    (RolloutEngine's `mesh`; docs/engine.md "On a mesh").
    """

    def __init__(self, config, params, tokenizer, *, engine_config: EngineConfig | None = None, decode_attention=None,
                 mesh=None, **local_kwargs):
        self.local = LocalChatModel(config, params, tokenizer, **local_kwargs)
        self.tok = tokenizer
        self.engine = RolloutEngine(config, params, engine_config, stop_ids=self.local.stop_ids,
                                    seed=self.local.seed, decode_attention=decode_attention, mesh=mesh)
        self._call = threading.local()  # the keys of the chat_batch running on this thread
        self.local.generate_tokens = self.generate_tokens  # chat_batch samples through the engine

    def __getattr__(self, name):
        return getattr(self.local, name)

    def set_params(self, params) -> None:
        self.engine.release_all()
        self.engine.params = self.local.params = params

    def release(self, key) -> None:
        self.engine.release(key)

    def generate_tokens(self, prompts, *, keys=None, max_tokens=None, temperature=None, top_p=None, top_k=None,
                        seed=None):
        with self.engine._lock:  # noqa: SLF001 -- the call counter and the engine move together
            return self._generate_tokens(prompts, keys, max_tokens, temperature, top_p, top_k, seed)

    def _generate_tokens(self, prompts, keys, max_tokens, temperature, top_p, top_k, seed):
        lm = self.local
        keys = keys if keys is not None else getattr(self._call, "keys", None)
        if seed is None:
            seed = [derive_seed(lm.seed, lm._calls, i) for i in range(len(prompts))]  # noqa: SLF001
        lm._calls += 1  # noqa: SLF001
        return self.engine.generate_tokens(
            prompts, keys=keys, max_tokens=lm.max_tokens if max_tokens is None else max_tokens,
            temperature=lm.temperature if temperature is None else temperature,
            top_p=lm.top_p if top_p is None else top_p, top_k=lm.top_k if top_k is None else top_k, seed=seed)

    def chat_batch(self, conversations, *, keys=None, **kwargs):
        # keys travel to generate_tokens in a thread-local slot: another thread's direct generate_tokens call
        # never sees them
        with self.engine._lock:  # noqa: SLF001 -- one call at a time: the per-call seeds count calls
            self._call.keys = keys
            try:
                return self.local.chat_batch(conversations, **kwargs)
            finally:
                self._call.keys = None

    def chat(self, messages, **kwargs):
        return self.chat_batch([messages], **kwargs)[0]
