"""Model endpoints behind the one `ChatModel` interface (chat/base.py).

* `LocalChatModel`   -- this project's JAX sampler: messages are rendered with `data.chat.render_messages` (the
  one chat-formatting code path), sampled with `rollout.sampler`; token ids and temperature-1 log-probs come back.
  `chat_batch` samples many conversations in one sampler call.
* `OpenAIChatModel`  -- a remote OpenAI-compatible `/chat/completions` endpoint (API users, judges, coaches), on
  the official `openai` client: its per-request timeout, retries with exponential backoff on 408/409/429/5xx,
  connection errors and timeouts (honouring Retry-After); the API key read from an environment variable at call
  time and never logged or put in an error message. `RemoteCompletionsAgent`: the same over `/completions`.
* `ScriptedChatModel` (chat/base.py) -- fixed replies, for tests.

`chat_many(model, conversations)` runs many conversations on any ChatModel (one batched call when the model has
`chat_batch`, else a thread pool of `model.max_concurrency` workers) and turns a failure of one conversation into
a `ChatResponse(finish_reason="error")` instead of an exception, so one bad request does not sink a batch.
`split_thought(text)` separates a simulator turn into its private thought and its public utterance.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
from typing import Sequence

import numpy as np

from mimesis_jax.data.chat import render_messages
from mimesis_jax.models import shard_params
from mimesis_jax.inference import sampler
from mimesis_jax.chat.base import ChatResponse, Message

log = logging.getLogger(__name__)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class EndpointError(RuntimeError):
    """A remote model call failed for good (non-retryable status, bad response, or retries exhausted)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


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


# ------------------------------------------------------------------------------------ many chats
def chat_many(model, conversations: Sequence[Sequence[Message]], **kwargs) -> list[ChatResponse]:
    """Runs every conversation on `model`; failures become ChatResponse(text="", finish_reason="error")."""
    conversations = list(conversations)
    if not conversations:
        return []
    if hasattr(model, "chat_batch"):
        try:
            return list(model.chat_batch(conversations, **kwargs))
        except Exception as e:  # noqa: BLE001 -- reported per conversation, not swallowed
            log.error("chat_batch failed for %d conversations: %s", len(conversations), e)
            return [ChatResponse("", finish_reason="error", meta={"error": f"{type(e).__name__}: {e}"})
                    for _ in conversations]

    def one(messages):
        try:
            return model.chat(messages, **kwargs)
        except Exception as e:  # noqa: BLE001
            log.error("chat failed: %s", e)
            return ChatResponse("", finish_reason="error", meta={"error": f"{type(e).__name__}: {e}"})

    workers = max(1, int(getattr(model, "max_concurrency", 1)))
    if workers == 1 or len(conversations) == 1:
        return [one(m) for m in conversations]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(workers, len(conversations))) as pool:
        return list(pool.map(one, conversations))


# ------------------------------------------------------------------------------------ local model
def derive_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) % (1 << 63) for p in parts]).generate_state(1)[0])


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


class LocalChatModel:
    """A ChatModel over this project's sampler: (config, params, tokenizer) + generation settings.

    generation_role: the role whose turn is generated ("assistant" for agents; "user" for the simulator, which
    sees the conversation with its true roles and writes the next user turn, data/chat.py's framing).
    enable_thinking: render with the thinking template; the text then holds "{thought}\\n</think>\\n\\n{reply}".
    Each call draws fresh randomness (seed, call counter, request index) unless an explicit seed is given.
    Generation stops at `<|im_end|>` / EOS (the stop token is in `token_ids` and `logprobs`, not in `text`).
    max_batch: sequences per compiled sampler call (0 = a whole batch at once); a larger batch runs in
    consecutive chunks with the same samples (`sampler.generate`), bounding the KV cache of a rollout.
    """

    def __init__(self, config, params, tokenizer, *, generation_role: str = "assistant", enable_thinking: bool = False,
                 tools: list[dict] | None = None, max_tokens: int = 256, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int = 0, mesh=None, buckets: sampler.Buckets | None = None, name: str = "local",
                 max_batch: int = 0):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 0:
            raise ValueError(f"LocalChatModel {name!r}: max_batch must be an int >= 0 (0 = no cap), got {max_batch!r}")
        self.max_batch = max_batch
        self.config, self.params, self.tok = config, params, tokenizer
        self.generation_role, self.enable_thinking, self.tools = generation_role, enable_thinking, tools
        self.max_tokens, self.temperature, self.top_p, self.top_k = max_tokens, temperature, top_p, top_k
        self.seed, self.mesh, self.buckets, self.name = seed, mesh, buckets, name
        self.stop_ids = tuple(sorted({int(tokenizer.im_end_id), int(tokenizer.eos_id)}))
        self._calls = 0
        if mesh is not None:
            self.params = shard_params(config, params, mesh)

    def render(self, messages: Sequence[Message], enable_thinking: bool | None = None) -> list[int]:
        think = self.enable_thinking if enable_thinking is None else enable_thinking
        return list(render_messages(self.tok, list(messages), enable_thinking=think, add_generation_prompt=True,
                                    generation_role=self.generation_role, tools=self.tools).ids)

    def generate_tokens(self, prompts: Sequence[Sequence[int]], *, max_tokens=None, temperature=None, top_p=None,
                        top_k=None, seed=None, cancel=None) -> list[sampler.Sample]:
        """Token-level sampling (prompts are token ids): what the episode runner uses for the agent. `cancel`:
        sampler.generate's per-row cancel flags (serve sets a row when its client goes away)."""
        n = len(prompts)
        if seed is None:
            seed = [derive_seed(self.seed, self._calls, i) for i in range(n)]
        self._calls += 1
        return sampler.generate(
            self.config, self.params, prompts, stop_ids=self.stop_ids, seed=seed, mesh=self.mesh,
            buckets=self.buckets, max_batch=self.max_batch, cancel=None if self.mesh is not None else cancel,
            max_new_tokens=self.max_tokens if max_tokens is None else max_tokens,
            temperature=self.temperature if temperature is None else temperature,
            top_p=self.top_p if top_p is None else top_p, top_k=self.top_k if top_k is None else top_k)

    def chat_batch(self, conversations: Sequence[Sequence[Message]], *, max_tokens=None, temperature=None, stop=None,
                   top_p=None, top_k=None, seed=None, enable_thinking=None) -> list[ChatResponse]:
        """Many conversations in one sampler call (chunks of `max_batch`, if set). Every setting is a scalar or
        one value per conversation (`stop`: a list of strings, or one list per conversation)."""
        n = len(conversations)

        def per(v, default):
            v = default if v is None else v
            return list(v) if isinstance(v, (list, tuple)) else [v] * n
        thinks = per(enable_thinking, self.enable_thinking)
        stops = stop if (stop and isinstance(stop[0], (list, tuple))) else [list(stop or [])] * n
        seeds = None if seed is None else [s if s is not None else derive_seed(self.seed, self._calls, i)
                                           for i, s in enumerate(per(seed, None))]
        prompts = [self.render(m, t) for m, t in zip(conversations, thinks)]
        samples = self.generate_tokens(prompts, max_tokens=per(max_tokens, self.max_tokens),
                                       temperature=per(temperature, self.temperature),
                                       top_p=per(top_p, self.top_p), top_k=per(top_k, self.top_k), seed=seeds)
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


# ------------------------------------------------------------------------------------ remote model
_NO_AUTH_KEY = "EMPTY"  # what a server without auth is sent: the client must never fall back to OPENAI_API_KEY
# Chat request fields of the OpenAI API, passed to the client as such; any other keyword (top_k, return_token_ids,
# ...) is an extension and goes in the body through `extra_body`, as vLLM and SGLang read it.
_CHAT_FIELDS = frozenset({"frequency_penalty", "logit_bias", "logprobs", "max_completion_tokens", "max_tokens",
                          "n", "presence_penalty", "reasoning_effort", "response_format", "seed", "stop",
                          "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user"})


class OpenAIChatModel:
    """A remote OpenAI-compatible chat endpoint (`{base_url}/chat/completions`) through the official `openai` client.

    api_key_env: name of the environment variable holding the key, read at every request (None for servers without
    auth: they are sent a dummy key, never OPENAI_API_KEY); the key goes in the Authorization header only, and is
    redacted from anything this class raises (the client redacts it from its own logs).
    The client owns the transport policy: a per-request `timeout`, and up to `max_retries` retries on connection
    errors, timeouts, 408/409/429 and 5xx, after an exponential backoff with jitter (0.5 s doubling up to 8 s) or the
    server's Retry-After. A failure that is final becomes an EndpointError carrying the HTTP status.
    `extra_body` is merged into every request (e.g. {"top_p": 0.95, "chat_template_kwargs": {...}}); a call's
    `enable_thinking` becomes `chat_template_kwargs.enable_thinking` (vLLM's switch).
    Concurrency: `chat_many` runs `max_concurrency` calls at once from a thread pool, all on this one client
    (thread-safe) and its connection pool.
    """

    endpoint = "/chat/completions"

    def __init__(self, base_url: str, model: str, *, api_key_env: str | None = "OPENAI_API_KEY",
                 timeout: float = 60.0, max_retries: int = 5, max_tokens: int | None = None,
                 temperature: float | None = None, extra_body: dict | None = None, max_concurrency: int = 8):
        # lazy (b): openai only for remote endpoints
        import openai

        if api_key_env is not None and not os.environ.get(api_key_env):
            raise EndpointError(f"OpenAIChatModel({base_url}): environment variable {api_key_env} is not set "
                                "(pass api_key_env=None for an endpoint without authentication)")
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + self.endpoint
        self.model, self.api_key_env, self.timeout, self.max_retries = model, api_key_env, float(timeout), max_retries
        self.max_tokens, self.temperature = max_tokens, temperature
        self.extra_body = dict(extra_body or {})
        self.max_concurrency = int(max_concurrency)
        self.client = openai.OpenAI(base_url=self.base_url, timeout=self.timeout, max_retries=int(max_retries),
                                    api_key=self._key if api_key_env is not None else _NO_AUTH_KEY)

    def __repr__(self):
        return f"{type(self).__name__}(url={self.url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"

    def _key(self) -> str:
        key = os.environ.get(self.api_key_env or "")
        if not key:
            raise EndpointError(f"{self.url}: environment variable {self.api_key_env} is not set")
        return key

    def _redact(self, text: str) -> str:
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        return text.replace(key, "***") if key else text

    def _call(self, create, **kwargs):
        """`create(**kwargs)` on the client; its final failures become EndpointErrors without the key."""
        # lazy (b): openai only for remote endpoints
        import openai

        try:
            return create(**kwargs)
        except openai.APIStatusError as e:
            raise EndpointError(self._redact(f"{self.url}: HTTP {e.status_code}: {e.message}"),
                                status=e.status_code) from None
        except (openai.APITimeoutError, openai.APIConnectionError) as e:
            raise EndpointError(self._redact(f"{self.url}: giving up after {self.max_retries + 1} attempts; last "
                                             f"error: {type(e).__name__}: {e}")) from None
        except openai.APIError as e:  # e.g. a body that is not a completion
            raise EndpointError(self._redact(f"{self.url}: malformed completion response ({type(e).__name__}: "
                                             f"{e})")) from None

    def _malformed(self, e: Exception, response) -> EndpointError:
        return EndpointError(self._redact(f"{self.url}: malformed completion response ({type(e).__name__}: {e}); "
                                          f"got {str(response)[:200]!r}"))

    def chat(self, messages, *, max_tokens=None, temperature=None, stop=None, enable_thinking=None,
             **extra) -> ChatResponse:
        fields = {"max_tokens": self.max_tokens if max_tokens is None else max_tokens,
                  "temperature": self.temperature if temperature is None else temperature,
                  "stop": list(stop) if stop else None}
        body = dict(self.extra_body)
        for k, v in extra.items():
            (fields if k in _CHAT_FIELDS else body)[k] = v
        if enable_thinking is not None:
            body["chat_template_kwargs"] = {**body.get("chat_template_kwargs", {}), "enable_thinking": enable_thinking}
        fields = {k: v for k, v in fields.items() if v is not None}
        out = self._call(self.client.chat.completions.create, model=self.model,
                         messages=[dict(m) for m in messages], extra_body=body or None, **fields)
        try:
            choice = out.choices[0]
            msg = choice.message
            text = msg.content or ""
        except (AttributeError, IndexError, TypeError) as e:
            raise self._malformed(e, out) from None
        meta = {"model": out.model, "usage": out.usage.model_dump(exclude_none=True) if out.usage else None}
        reasoning = getattr(msg, "reasoning_content", None) or getattr(msg, "reasoning", None)
        if reasoning:
            meta["reasoning"] = reasoning
        content_lp = choice.logprobs.content if choice.logprobs is not None else None
        lps = [float(x.logprob) for x in content_lp] if content_lp else None
        return ChatResponse(text=text, token_ids=getattr(choice, "token_ids", None), logprobs=lps,
                            finish_reason=choice.finish_reason or "stop", meta=meta)


class RemoteCompletionsAgent(OpenAIChatModel):
    """A remote agent for the episode runner over an OpenAI-compatible `/completions` endpoint (vLLM, SGLang, ...).

    The runner hands token prompts; they are decoded to text (the chat template is already in them), sent as
    `prompt`, and the returned text is encoded back with `tokenizer` (+ `<|im_end|>` when the server stopped).
    Log-probs are None and the ids are re-tokenised, so these rollouts are for evaluation, not for RL updates
    (the RL stages use an in-process agent, whose samples are token-exact). Same client, key and retry policy as
    OpenAIChatModel; a batch of prompts runs `max_concurrency` requests at once from a thread pool.
    """

    endpoint = "/completions"

    def __init__(self, base_url: str, model: str, tokenizer, **kwargs):
        super().__init__(base_url, model, **kwargs)
        self.tok = tokenizer

    def _one(self, prompt, max_tokens, temperature, top_p, top_k, seed) -> sampler.Sample:
        body = dict(self.extra_body)
        if top_k:
            body["top_k"] = int(top_k)
        fields = {"seed": int(seed)} if seed is not None else {}
        out = self._call(self.client.completions.create, model=self.model, prompt=self.tok.decode(list(prompt)),
                         max_tokens=int(max_tokens), temperature=float(temperature), top_p=float(top_p),
                         stop=["<|im_end|>"], extra_body=body or None, **fields)
        try:
            text, finish = out.choices[0].text, out.choices[0].finish_reason or "stop"
            toks = list(self.tok.encode(text))
        except (AttributeError, IndexError, TypeError) as e:
            raise self._malformed(e, out) from None
        if finish == "stop":
            toks.append(int(self.tok.im_end_id))
        return sampler.Sample(toks, None, "stop" if finish == "stop" else "length", len(prompt))

    def generate_tokens(self, prompts, *, max_tokens=None, temperature=None, top_p=None, top_k=None, seed=None):
        n = len(prompts)

        def per(v, default):
            v = default if v is None else v
            return list(v) if isinstance(v, (list, tuple)) else [v] * n
        args = zip(prompts, per(max_tokens, self.max_tokens or 1024), per(temperature, self.temperature or 0.0),
                   per(top_p, 1.0), per(top_k, 0), per(seed, None))
        with concurrent.futures.ThreadPoolExecutor(max(1, min(self.max_concurrency, n))) as pool:
            return list(pool.map(lambda a: self._one(*a), args))
