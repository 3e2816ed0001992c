"""Model endpoints behind the one `ChatModel` interface (rollout/base.py).

* `LocalChatModel`   -- this project's JAX sampler: messages are rendered with `data.chat.render_messages` (the
  one chat-formatting code path), sampled with `rollout.sampler`; token ids and temperature-1 log-probs come back.
  `chat_batch` samples many conversations in one sampler call.
* `OpenAIChatModel`  -- a remote OpenAI-compatible `/chat/completions` endpoint (API users, judges, coaches),
  standard library only: per-request timeout, retries with exponential backoff on 408/429/5xx, connection errors
  and timeouts (honouring Retry-After), the API key read from an environment variable at call time and never
  logged or put in an error message.
* `ScriptedChatModel` (rollout/base.py) -- fixed replies, for tests.

`chat_many(model, conversations)` runs many conversations on any ChatModel (one batched call when the model has
`chat_batch`, else a thread pool of `model.max_concurrency` workers) and turns a failure of one conversation into
a `ChatResponse(finish_reason="error")` instead of an exception, so one bad request does not sink a batch.
`split_thought(text)` separates a simulator turn into its private thought and its public utterance.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import random
import socket
import time
import urllib.error
import urllib.request
from typing import Sequence

import numpy as np

from mimesis_jax.rollout import sampler
from mimesis_jax.rollout.base import ChatResponse, Message

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
def _derive_seed(*parts: int) -> int:
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
    """

    def __init__(self, config, params, tokenizer, *, generation_role: str = "assistant", enable_thinking: bool = False,
                 tools: list[dict] | None = None, max_tokens: int = 256, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int = 0, mesh=None, buckets: sampler.Buckets | None = None, name: str = "local"):
        self.config, self.params, self.tok = config, params, tokenizer
        self.generation_role, self.enable_thinking, self.tools = generation_role, enable_thinking, tools
        self.max_tokens, self.temperature, self.top_p, self.top_k = max_tokens, temperature, top_p, top_k
        self.seed, self.mesh, self.buckets, self.name = seed, mesh, buckets, name
        self.stop_ids = tuple(sorted({int(tokenizer.im_end_id), int(tokenizer.eos_id)}))
        self._calls = 0
        if mesh is not None:
            from mimesis_jax.sharding import shard_params
            self.params = shard_params(config, params, mesh)

    def render(self, messages: Sequence[Message], enable_thinking: bool | None = None) -> list[int]:
        from mimesis_jax.data.chat import render_messages

        think = self.enable_thinking if enable_thinking is None else enable_thinking
        return list(render_messages(self.tok, list(messages), enable_thinking=think, add_generation_prompt=True,
                                    generation_role=self.generation_role, tools=self.tools).ids)

    def generate_tokens(self, prompts: Sequence[Sequence[int]], *, max_tokens=None, temperature=None, top_p=None,
                        top_k=None, seed=None) -> list[sampler.Sample]:
        """Token-level sampling (prompts are token ids): what the episode runner uses for the agent."""
        n = len(prompts)
        if seed is None:
            seed = [_derive_seed(self.seed, self._calls, i) for i in range(n)]
        self._calls += 1
        return sampler.generate(
            self.config, self.params, prompts, stop_ids=self.stop_ids, seed=seed, mesh=self.mesh,
            buckets=self.buckets, max_new_tokens=self.max_tokens if max_tokens is None else max_tokens,
            temperature=self.temperature if temperature is None else temperature,
            top_p=self.top_p if top_p is None else top_p, top_k=self.top_k if top_k is None else top_k)

    def chat_batch(self, conversations: Sequence[Sequence[Message]], *, max_tokens=None, temperature=None, stop=None,
                   top_p=None, top_k=None, seed=None, enable_thinking=None) -> list[ChatResponse]:
        """Many conversations in one sampler call. Every setting is a scalar or one value per conversation
        (`stop`: a list of strings, or one list per conversation)."""
        n = len(conversations)

        def per(v, default):
            v = default if v is None else v
            return list(v) if isinstance(v, (list, tuple)) else [v] * n
        thinks = per(enable_thinking, self.enable_thinking)
        stops = stop if (stop and isinstance(stop[0], (list, tuple))) else [list(stop or [])] * n
        seeds = None if seed is None else [s if s is not None else _derive_seed(self.seed, self._calls, i)
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
_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class OpenAIChatModel:
    """A remote OpenAI-compatible chat endpoint (`{base_url}/chat/completions`), standard library only.

    api_key_env: name of the environment variable holding the key (None for servers without auth); the key is
    read at call time, sent only in the Authorization header, and redacted from anything logged or raised.
    A request is retried up to `max_retries` times on 408/409/425/429/5xx, connection errors and timeouts, after
    min(max_backoff, backoff * 2**attempt) seconds (or the server's Retry-After, capped), times (1 + jitter * U).
    `extra_body` is merged into every request (e.g. {"top_p": 0.95, "chat_template_kwargs": {...}}).
    """

    def __init__(self, base_url: str, model: str, *, api_key_env: str | None = "OPENAI_API_KEY",
                 timeout: float = 60.0, max_retries: int = 5, backoff: float = 1.0, max_backoff: float = 30.0,
                 jitter: float = 0.1, max_tokens: int | None = None, temperature: float | None = None,
                 extra_body: dict | None = None, max_concurrency: int = 8):
        if api_key_env is not None and not os.environ.get(api_key_env):
            raise EndpointError(f"OpenAIChatModel({base_url}): environment variable {api_key_env} is not set "
                                "(pass api_key_env=None for an endpoint without authentication)")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key_env, self.timeout = model, api_key_env, float(timeout)
        self.max_retries, self.backoff, self.max_backoff, self.jitter = int(max_retries), backoff, max_backoff, jitter
        self.max_tokens, self.temperature = max_tokens, temperature
        self.extra_body = dict(extra_body or {})
        self.max_concurrency = int(max_concurrency)

    def __repr__(self):
        return f"OpenAIChatModel(url={self.url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"

    def _key(self) -> str | None:
        return None if self.api_key_env is None else os.environ.get(self.api_key_env)

    def _redact(self, text: str) -> str:
        key = self._key()
        return text.replace(key, "***") if key else text

    def _request_body(self, messages, max_tokens, temperature, stop, extra) -> dict:
        body = {"model": self.model, "messages": [dict(m) for m in messages], **self.extra_body, **extra}
        mt = self.max_tokens if max_tokens is None else max_tokens
        t = self.temperature if temperature is None else temperature
        if mt is not None:
            body["max_tokens"] = int(mt)
        if t is not None:
            body["temperature"] = float(t)
        if stop:
            body["stop"] = list(stop)
        return body

    def _sleep_for(self, attempt: int, retry_after: str | None) -> float:
        delay = min(self.max_backoff, self.backoff * (2 ** attempt))
        if retry_after:
            try:
                delay = min(self.max_backoff, max(delay, float(retry_after)))
            except ValueError:
                pass
        return delay * (1.0 + self.jitter * random.random())

    def chat(self, messages, *, max_tokens=None, temperature=None, stop=None, **extra) -> ChatResponse:
        return self._parse(self._post(self._request_body(messages, max_tokens, temperature, stop, extra)))

    def _post(self, body: dict) -> bytes:
        """POSTs `body` as JSON to `self.url` with the retry policy; returns the raw response body."""
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        key = self._key()
        if self.api_key_env is not None:
            if not key:
                raise EndpointError(f"{self.url}: environment variable {self.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        last = "no attempt made"
        for attempt in range(self.max_retries + 1):
            req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            retry_after = None
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return resp.read()
            except urllib.error.HTTPError as e:
                detail = self._redact(e.read()[:500].decode("utf-8", "replace"))
                last = f"HTTP {e.code}: {detail}"
                if e.code not in _RETRY_STATUS:
                    raise EndpointError(f"{self.url}: {last}", status=e.code) from None
                retry_after = e.headers.get("Retry-After") if e.headers else None
            except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as e:
                last = self._redact(f"{type(e).__name__}: {getattr(e, 'reason', e)}")
            if attempt < self.max_retries:
                delay = self._sleep_for(attempt, retry_after)
                log.warning("%s: attempt %d/%d failed (%s); retrying in %.2fs", self.url, attempt + 1,
                            self.max_retries + 1, last, delay)
                time.sleep(delay)
        raise EndpointError(f"{self.url}: giving up after {self.max_retries + 1} attempts; last error: {last}")

    def _parse(self, raw: bytes) -> ChatResponse:
        try:
            body = json.loads(raw)
            choice = body["choices"][0]
            msg = choice["message"]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
            raise EndpointError(f"{self.url}: malformed completion response ({type(e).__name__}: {e}); body starts "
                                f"{self._redact(raw[:200].decode('utf-8', 'replace'))!r}") from None
        meta = {"model": body.get("model"), "usage": body.get("usage")}
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        if reasoning:
            meta["reasoning"] = reasoning
        lps = None
        content_lp = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
        if content_lp:
            lps = [float(x["logprob"]) for x in content_lp]
        return ChatResponse(text=msg.get("content") or "", token_ids=choice.get("token_ids"), logprobs=lps,
                            finish_reason=choice.get("finish_reason") or "stop", meta=meta)


class RemoteCompletionsAgent(OpenAIChatModel):
    """A remote agent for the episode runner over an OpenAI-compatible `/completions` endpoint (vLLM, SGLang, ...).

    The runner hands token prompts; they are decoded to text (the chat template is already in them), sent as
    `prompt`, and the returned text is encoded back with `tokenizer` (+ `<|im_end|>` when the server stopped).
    Log-probs are None and the ids are re-tokenised, so these rollouts are for evaluation, not for RL updates
    (the RL stages use an in-process agent, whose samples are token-exact). Same key/retry policy as
    OpenAIChatModel.
    """

    def __init__(self, base_url: str, model: str, tokenizer, **kwargs):
        super().__init__(base_url, model, **kwargs)
        self.url = base_url.rstrip("/") + "/completions"
        self.tok = tokenizer

    def __repr__(self):
        return f"RemoteCompletionsAgent(url={self.url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"

    def _one(self, prompt, max_tokens, temperature, top_p, top_k, seed) -> sampler.Sample:
        body = {"model": self.model, "prompt": self.tok.decode(list(prompt)), "max_tokens": int(max_tokens),
                "temperature": float(temperature), "top_p": float(top_p), "stop": ["<|im_end|>"],
                **self.extra_body}
        if top_k:
            body["top_k"] = int(top_k)
        if seed is not None:
            body["seed"] = int(seed)
        raw = self._post(body)
        try:
            choice = json.loads(raw)["choices"][0]
            text, finish = choice["text"], choice.get("finish_reason") or "stop"
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
            raise EndpointError(f"{self.url}: malformed completion response ({type(e).__name__}: {e}); body starts "
                                f"{self._redact(raw[:200].decode('utf-8', 'replace'))!r}") from None
        toks = list(self.tok.encode(text))
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
