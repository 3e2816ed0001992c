"""`LocalChatModel`: a ChatModel over one of this project's generators (the static sampler or the rollout engine,
inference/generators.py). Messages are rendered with `data.chat.render_messages` (the one chat-formatting code
path); token ids and their log-probs come back; `chat_batch` samples many conversations in one generator call."""

from __future__ import annotations

from typing import Sequence

from mimesis_jax.chat.base import ChatModel, ChatResponse, Message
from mimesis_jax.data.chat import render_messages
from mimesis_jax.inference import sampler
from mimesis_jax.inference.engine_requests import EngineConfig
from mimesis_jax.inference.generators import EngineGenerator, StaticGenerator
from mimesis_jax.inference.protocol import Generator, Sample, Sampling


def stop_ids(tokenizer) -> tuple[int, ...]:
    """The ids a turn ends with: `<|im_end|>` and EOS, each once, ascending (what LocalChatModel and the RL
    policy's generator stop at)."""
    return tuple(sorted({int(tokenizer.im_end_id), int(tokenizer.eos_id)}))


def cut_at_stop_strings(tok, tokens: list[int], stops: Sequence[str]) -> tuple[int, str] | None:
    """(number of tokens through the one that completes the earliest stop string, text before it), or None."""
    text = tok.decode(tokens)
    hits = [(text.find(s), s) for s in stops if s and s in text]
    if not hits:
        return None
    pos, s = min(hits)
    lo, hi = 1, len(tokens)  # smallest prefix whose decoded text contains the stop string's end
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tok.decode(tokens[:mid])) >= pos + len(s) and s in tok.decode(tokens[:mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo, text[:pos]


class LocalChatModel(ChatModel, Generator):
    """A ChatModel over one of this project's generators (inference/generators.py), and that Generator itself.

    Built from (config, params, tokenizer): the static sampler, or the rollout engine when `engine_config` is given
    (its pages and state slots kept per dialogue key: `chat_batch(..., keys=...)`, `release(keys)`); or over a
    `generator` built elsewhere (the RL learner's policy: one generator for the run, `set_params` after every
    update). generation_role: the role whose turn is generated ("assistant" for agents; "user" for the simulator,
    which sees the conversation with its true roles and writes the next user turn, data/chat.py's framing).
    enable_thinking: render with the thinking template; the text then holds "{thought}\\n</think>\\n\\n{reply}".
    Each call draws fresh randomness (seed, call counter, request index) unless an explicit seed is given.
    Generation stops at `<|im_end|>` / EOS (the stop token is in `token_ids` and `logprobs`, not in `text`).
    max_batch: sequences per compiled sampler call (0 = a whole batch at once); a larger batch runs in
    consecutive chunks with the same samples (`sampler.generate`), bounding the KV cache of a rollout.
    mesh: the (process-local) mesh the generator samples on; None = one device.
    """

    def __init__(self, config, params, tokenizer, *, generation_role: str = "assistant", enable_thinking: bool = False,
                 tools: list[dict] | None = None, max_tokens: int = 256, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int = 0, mesh=None, buckets: sampler.Buckets | None = None, name: str = "local",
                 max_batch: int = 0, engine_config: EngineConfig | None = None, decode_attention=None,
                 generator: Generator | None = None):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 0:
            raise ValueError(f"LocalChatModel {name!r}: max_batch must be an int >= 0 (0 = no cap), got {max_batch!r}")
        self.config, self.tok = config, tokenizer
        self.generation_role, self.enable_thinking, self.tools = generation_role, enable_thinking, tools
        self.max_tokens, self.temperature, self.top_p, self.top_k = max_tokens, temperature, top_p, top_k
        self.seed, self.mesh, self.name = seed, mesh, name
        self.stop_ids = stop_ids(tokenizer)
        if generator is None and engine_config is not None:
            generator = EngineGenerator(config, params, engine_config, stop_ids=self.stop_ids, seed=seed, mesh=mesh,
                                        decode_attention=decode_attention)
        elif generator is None:
            generator = StaticGenerator(config, params, stop_ids=self.stop_ids, seed=seed, mesh=mesh,
                                        buckets=buckets, max_batch=max_batch)
        self.generator = generator

    # ------------------------------------------------------------------ the Generator protocol, by delegation
    @property
    def params(self):
        return self.generator.params

    @property
    def version(self) -> int:
        return self.generator.version

    def generate(self, prompts, sampling, *, keys=None, cancel=None) -> list[Sample]:
        return self.generator.generate(prompts, sampling, keys=keys, cancel=cancel)

    def set_params(self, params, version: int) -> None:
        self.generator.set_params(params, version)

    def release(self, keys) -> None:
        self.generator.release(keys)

    def close(self) -> None:
        self.generator.close()

    def sampling(self, *, max_tokens=None, temperature=None, top_p=None, top_k=None, seed=None) -> Sampling:
        """A Sampling with this model's settings where an argument is None."""
        return Sampling(max_tokens=self.max_tokens if max_tokens is None else max_tokens,
                        temperature=self.temperature if temperature is None else temperature,
                        top_p=self.top_p if top_p is None else top_p, top_k=self.top_k if top_k is None else top_k,
                        seed=seed)

    # ------------------------------------------------------------------ chat
    def render(self, messages: Sequence[Message], enable_thinking: bool | None = None) -> list[int]:
        think = self.enable_thinking if enable_thinking is None else enable_thinking
        return list(render_messages(self.tok, list(messages), enable_thinking=think, add_generation_prompt=True,
                                    generation_role=self.generation_role, tools=self.tools).ids)

    def chat_batch(self, conversations: Sequence[Sequence[Message]], *, max_tokens=None, temperature=None, stop=None,
                   top_p=None, top_k=None, seed=None, enable_thinking=None, keys=None) -> list[ChatResponse]:
        """Many conversations in one generator call (chunks of `max_batch`, if set). Every setting is a scalar or
        one value per conversation (`stop`: a list of strings, or one list per conversation). keys: one dialogue
        key per conversation (the engine keeps its pages for the next turn; `release` frees them)."""
        n = len(conversations)

        def per(v, default):
            v = default if v is None else v
            return list(v) if isinstance(v, (list, tuple)) else [v] * n
        thinks = per(enable_thinking, self.enable_thinking)
        stops = stop if (stop and isinstance(stop[0], (list, tuple))) else [list(stop or [])] * n
        prompts = [self.render(m, t) for m, t in zip(conversations, thinks)]
        settings = zip(per(max_tokens, None), per(temperature, None), per(top_p, None), per(top_k, None),
                       per(seed, None))
        samples = self.generate(prompts, [self.sampling(max_tokens=a, temperature=b, top_p=c, top_k=d, seed=e)
                                          for a, b, c, d, e in settings], keys=keys)
        out = []
        for s, p, th, st in zip(samples, prompts, thinks, stops):
            toks, lps, finish = list(s.tokens), list(s.logprobs), s.finish_reason
            body = toks[:-1] if finish == "stop" else toks
            text = self.tok.decode(body)
            cut = cut_at_stop_strings(self.tok, body, st) if st else None
            if cut is not None:
                k, text = cut
                toks, lps, finish = toks[:k], lps[:k], "stop"
            out.append(ChatResponse(text=text, token_ids=toks, logprobs=lps, finish_reason=finish,
                                    meta={"prompt_ids": p, "thinking": th, "model": self.name}))
        return out

    def chat(self, messages, *, max_tokens=None, temperature=None, stop=None, **kwargs) -> ChatResponse:
        return self.chat_batch([messages], max_tokens=max_tokens, temperature=temperature, stop=stop, **kwargs)[0]


