"""Remote models behind the ChatModel interface (chat/base.py), on the official `openai` client.

* `OpenAIChatModel` -- a remote OpenAI-compatible `/chat/completions` endpoint (API users, judges, coaches): its
  per-request timeout, retries with exponential backoff on 408/409/429/5xx, connection errors and timeouts
  (honouring Retry-After); the API key read from an environment variable at call time and never logged or put in an
  error message.
* `RemoteCompletionsAgent` -- the same over `/completions`, token ids in and out (a token-level agent).
"""

from __future__ import annotations

import concurrent.futures
import os

from mimesis_jax.chat.base import ChatModel, ChatResponse, chat_many
from mimesis_jax.inference.protocol import Generator, Sample, per_request


class EndpointError(RuntimeError):
    """A remote model call failed for good (non-retryable status, bad response, or retries exhausted)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status




# ------------------------------------------------------------------------------------ remote model
_NO_AUTH_KEY = "EMPTY"  # what a server without auth is sent: the client must never fall back to OPENAI_API_KEY
# Chat request fields of the OpenAI API, passed to the client as such; any other keyword (top_k, return_token_ids,
# ...) is an extension and goes in the body through `extra_body`, as vLLM and SGLang read it.
_CHAT_FIELDS = frozenset({"frequency_penalty", "logit_bias", "logprobs", "max_completion_tokens", "max_tokens",
                          "n", "presence_penalty", "reasoning_effort", "response_format", "seed", "stop",
                          "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user"})


class OpenAIChatModel(ChatModel):
    """A remote OpenAI-compatible chat endpoint (`{base_url}/chat/completions`) through the official `openai` client.

    api_key_env: name of the environment variable holding the key, read at every request (None for servers without
    auth: they are sent a dummy key, never OPENAI_API_KEY); the key goes in the Authorization header only, and is
    redacted from anything this class raises (the client redacts it from its own logs).
    The client owns the transport policy: a per-request `timeout`, and up to `max_retries` retries on connection
    errors, timeouts, 408/409/429 and 5xx, after an exponential backoff with jitter (0.5 s doubling up to 8 s) or the
    server's Retry-After. A failure that is final becomes an EndpointError carrying the HTTP status.
    `extra_body` is merged into every request (e.g. {"top_p": 0.95, "chat_template_kwargs": {...}}); a call's
    `enable_thinking` becomes `chat_template_kwargs.enable_thinking` (vLLM's switch).
    Concurrency: `chat_batch` (ChatModel's) runs `max_concurrency` calls at once from a thread pool, all on this
    one client (thread-safe) and its connection pool; the gyms run at most as many calls at once.
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
        # servers' extensions to the OpenAI schema: the parsed objects keep unknown fields in `model_extra`
        msg_extra, choice_extra = msg.model_extra or {}, choice.model_extra or {}
        reasoning = msg_extra.get("reasoning_content") or msg_extra.get("reasoning")
        if reasoning:
            meta["reasoning"] = reasoning
        content_lp = choice.logprobs.content if choice.logprobs is not None else None
        lps = [float(x.logprob) for x in content_lp] if content_lp else None
        return ChatResponse(text=text, token_ids=choice_extra.get("token_ids"), logprobs=lps,
                            finish_reason=choice.finish_reason or "stop", meta=meta)


class RemoteCompletionsAgent(OpenAIChatModel, Generator):
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

    def _one(self, prompt, max_tokens, temperature, top_p, top_k, seed) -> Sample:
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
        return Sample(toks, None, "stop" if finish == "stop" else "length", len(prompt))

    def generate(self, prompts, sampling, *, keys=None, cancel=None) -> list[Sample]:
        """The Generator protocol over the endpoint: one request per prompt (`keys` and `cancel` change nothing:
        the server keeps no dialogue of ours)."""
        reqs = per_request(sampling, len(prompts))
        args = [(p, s.max_tokens, s.temperature, s.top_p, s.top_k, s.seed) for p, s in zip(prompts, reqs)]
        with concurrent.futures.ThreadPoolExecutor(max(1, min(self.max_concurrency, len(args) or 1))) as pool:
            return list(pool.map(lambda a: self._one(*a), args))

    def set_params(self, params, version: int) -> None:
        raise TypeError(f"remote agent {self.base_url}: its weights are the server's; it cannot take new ones")
