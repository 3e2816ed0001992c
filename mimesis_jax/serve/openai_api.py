"""The OpenAI-compatible HTTP API of `serve`, as a FastAPI app over a `Backend`.

`create_app(backend, model_name)` serves `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`
and `GET /health`. The backend renders chat messages to prompt ids and streams a choice's tokens
(`TokenEvent`: id, log-prob, finish reason on the last); detokenisation, stop strings, `n`, log-probs, thinking
splits and SSE framing live here, so every backend answers alike (serve/server.py has the backend over the
batching sampler and the server around the app).

Chat fields: `messages` (string content or a list of text parts), `max_tokens` / `max_completion_tokens`,
`temperature`, `top_p`, `stop` (string or list), `seed`, `n` (1..max_n; choice 0 uses the request's seed, choice
i > 0 one derived from (seed, i)), `stream` (SSE chunks in OpenAI's format, then `data: [DONE]`;
`stream_options.include_usage` adds a usage chunk), `logprobs` (bool; `top_logprobs` 0 only: the sampler returns
the chosen token's log-prob, no alternatives), and the extensions `top_k`, `chat_template_kwargs.enable_thinking`
and `return_token_ids` (the generated `token_ids` on each choice). With thinking on, the thought is returned in
`reasoning_content` and the public reply in `content` (as vLLM's reasoning parsers do). Completions fields:
`prompt` (a string, a list of strings, a list of token ids or a list of such lists; no chat template is applied),
`logprobs` (0 only: `tokens`, `token_logprobs`, `text_offset`), `echo` false, and the same sampling fields.
A bad request gets HTTP 400 with an OpenAI-style JSON error naming the offending field (invalid text such as a
lone surrogate included; prompt tokens + max_tokens beyond `backend.context()` too, checked before any work, so
a stream is refused before its first byte). `create_app`'s guards answer in the same shape: 401 without a
configured API key, 413 beyond the body limit, 429 (Retry-After) beyond the choices in flight, 503 while the
backend reports itself unhealthy. A client that disconnects cancels its choices (streamed or not).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import hmac
import json
import time
import uuid
from typing import AsyncGenerator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from mimesis_jax.chat.stream import Detokenizer, SamplingParams, TokenEvent  # noqa: F401  (the app's names)
from mimesis_jax.chat.thoughts import THINK_CLOSE, THINK_OPEN, split_thought
from mimesis_jax.inference.protocol import derive_seed
from mimesis_jax.serve.openai_requests import (  # noqa: F401  (openai_api's names for them, as before)
    ROLES, BadRequest, parse_completion_request, parse_request)


# ------------------------------------------------------------------------------------ backends
class Backend(abc.ABC):
    """What the HTTP app needs from a model; every backend subclasses it. `render` and `generate` are abstract;
    `context`, `health` and `held` default to "no limit of its own", "healthy" and "holds nothing".
    A subclass sets `tok` (the tokenizer: encode / decode / vocab_size), `stop_ids` and `max_tokens` (the default
    max_tokens of a request)."""

    tok: object
    stop_ids: tuple[int, ...]
    max_tokens: int

    @abc.abstractmethod
    def render(self, messages: list[dict], enable_thinking: bool | None) -> tuple[list[int], bool]:
        """(prompt ids with the generation prompt, whether the thinking template was used)"""

    @abc.abstractmethod
    def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncGenerator[TokenEvent, None]:
        """An async generator of a choice's tokens in order (all at once or one by one); the app stops iterating
        and closes it (`aclose`) once a stop string completes or the client goes away."""

    def context(self) -> tuple[int | None, str | None]:
        """(most prompt + completion tokens, what sets it: a flag or config key), checked before any work; (None,
        None): no limit but each request's max_tokens."""
        return None, None

    def health(self) -> str | None:
        """None, or why the backend cannot serve now (/health answers 503 with it, requests are refused)."""
        return None

    def held(self) -> dict:
        """What the backend holds now, reported by /health (e.g. the engine's KV pages)."""
        return {}


class _ThoughtStream:
    """Routes a thinking turn's streamed text: before `</think>` to `reasoning_content`, after it to `content`
    (the whitespace opening the reply dropped). Streamed deltas are not stripped like the non-streamed fields."""

    def __init__(self):
        self.open, self.close = THINK_OPEN, THINK_CLOSE
        self.buf, self.closed, self.started = "", False, False

    def feed(self, delta: str, final: bool) -> tuple[str, str]:
        if self.closed:
            if not self.started:
                delta = delta.lstrip()
                self.started = bool(delta)
            return "", delta
        self.buf += delta
        if self.close in self.buf:
            thought, _, rest = self.buf.partition(self.close)
            self.closed, self.buf = True, ""
            return thought.replace(self.open, "", 1), self.feed(rest, final)[1]
        keep = 0 if final else max([n for n in range(1, len(self.close)) if self.buf.endswith(self.close[:n])] or [0])
        out, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
        return out.replace(self.open, "", 1), ""


def _choice_seed(seed: int | None, i: int) -> int | None:
    """Choice 0 keeps the request's seed (n=1 and n>1 agree on it); choice i > 0 gets one derived from (seed, i)."""
    return seed if seed is None or i == 0 else derive_seed(seed, i)


async def _events(backend, prompt, params, stops):
    """(detokenizer, text delta, new ids, their log-probs, finish reason) per token of one choice, until it
    finishes (the finish reason is this step's: a consumer may read the item after the detokenizer moved on)."""
    det = Detokenizer(backend.tok, backend.stop_ids, stops)
    async with contextlib.aclosing(backend.generate(prompt, params)) as gen:
        async for ev in gen:
            delta, ids, lps = det.push(ev)
            yield det, delta, ids, lps, det.finish_reason
            if det.finish_reason is not None:
                break


def _chat_logprobs(tok, ids, lps) -> list[dict]:
    out = []
    for t, lp in zip(ids, lps):
        s = tok.decode([t])
        out.append({"token": s, "logprob": lp, "bytes": list(s.encode()), "top_logprobs": []})
    return out


def _completion_logprobs(tok, ids, lps, offset: int) -> dict:
    pieces = [tok.decode([t]) for t in ids]
    starts = [offset + sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
    return {"tokens": pieces, "token_logprobs": list(lps), "top_logprobs": None, "text_offset": starts}


def _chat_message(text: str, thinking: bool) -> dict:
    if not thinking:
        return {"role": "assistant", "content": text}
    thought, utterance = split_thought(text, thinking=True)
    return {"role": "assistant", "content": utterance or "", "reasoning_content": thought}


def _error(status: int, message: str, param=None, kind="invalid_request_error", code=None, headers=None):
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status, headers=headers)


class _Guard:
    """ASGI middleware in front of the app: the API keys (`Authorization: Bearer KEY`, compared in constant time
    with every configured key; /health is open) and the declared body size (Content-Length; a chunked body is
    counted as it is read, in `_Routes._body`). Keys are never logged or echoed."""

    def __init__(self, app, keys=(), max_body_bytes: int = 0):
        self.app, self.keys, self.max_body = app, [k.encode() for k in keys], int(max_body_bytes)

    def _authorized(self, headers) -> bool:
        auth = headers.get(b"authorization", b"")
        token = auth[7:].strip() if auth[:7].lower() == b"bearer " else b""
        ok = False
        for k in self.keys:  # every key compared, whichever matches: the time does not say which one
            ok |= hmac.compare_digest(token, k)
        return ok

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.keys and scope.get("path") != "/health" and not self._authorized(headers):
            resp = _error(401, "invalid or missing API key: send the header 'Authorization: Bearer KEY' with a key "
                               "given to serve --api-key (or MIMESIS_API_KEY)", code="invalid_api_key",
                          headers={"WWW-Authenticate": "Bearer"})
            return await resp(scope, receive, send)
        size = headers.get(b"content-length")
        if self.max_body and size is not None and size.isdigit() and int(size) > self.max_body:
            resp = _error(413, f"request body of {int(size)} bytes exceeds the {self.max_body}-byte limit "
                               "(serve --max-body-bytes)", code="request_too_large")
            return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


async def _disconnected(request) -> None:
    """Returns when the client of a request whose body was read goes away."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _TooLarge(Exception):
    """A chunked request body grew past the body limit while it was read."""


async def _pump(q: asyncio.Queue, i: int, backend, prompt, params, stops) -> None:
    """Puts choice `i`'s events on `q` as (i, event), a failure as (i, exception), then (i, None)."""
    try:
        async for item in _events(backend, prompt, params, stops):
            await q.put((i, item))
    except Exception as e:  # noqa: BLE001 -- sent to the client as an error event
        await q.put((i, e))
    await q.put((i, None))


class _Routes:
    """The route handlers of one app and what they share: the backend, the limits and the number of choices
    queued or generating (touched by the event loop's thread only: no lock).

    A request is read and checked (`_body`, `_max_tokens`), admitted or turned away (`_respond`), then answered
    whole (`_answer`) or as an SSE stream (`_stream`)."""

    def __init__(self, backend: Backend, model_name: str, max_tokens_limit: int, max_n: int, max_queued: int,
                 max_body_bytes: int):
        self.backend, self.tok, self.model_name, self.active = backend, backend.tok, model_name, 0
        self.max_tokens_limit, self.max_n, self.max_queued, self.max_body = (max_tokens_limit, max_n, max_queued,
                                                                             max_body_bytes)

    async def http_error(self, request, exc: HTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}", kind=kind)

    async def health(self):
        why = self.backend.health()
        if why:
            return JSONResponse({"status": "unhealthy", "error": why}, status_code=503)
        # what is held right now: choices queued or generating, and the backend's own (the engine's KV pages)
        held = self.backend.held()
        return {"status": "ok", "active_choices": self.active, **held}

    async def list_models(self):
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "mimesis_jax"}]}

    async def chat_completions(self, request: Request):
        try:
            req = parse_request(await self._body(request), self.max_tokens_limit, self.max_n)
            if self._queue_full(req["n"]):
                return self._busy()
            prompt, thinking = self.backend.render(req["messages"], req["enable_thinking"])
            req["max_tokens"] = self._max_tokens([prompt], req, "messages")
        except BadRequest as e:
            return _error(400, str(e), e.param)
        except _TooLarge:
            return self._too_large()
        choices = [(prompt, self._sampling(req, i)) for i in range(req["n"])]
        return await self._respond("chat", req, choices, thinking, request)

    async def completions(self, request: Request):
        try:
            req = parse_completion_request(await self._body(request), self.max_tokens_limit, self.tok.vocab_size,
                                           self.max_n)
            if self._queue_full(req["n"] * len(req["prompts"])):
                return self._busy()
            prompts = [list(self.tok.encode(p)) if isinstance(p, str) else list(p) for p in req["prompts"]]
            req["max_tokens"] = self._max_tokens(prompts, req, "prompt")
        except BadRequest as e:
            return _error(400, str(e), e.param)
        except _TooLarge:
            return self._too_large()
        choices = [(p, self._sampling(req, k * req["n"] + i)) for k, p in enumerate(prompts) for i in range(req["n"])]
        return await self._respond("text", req, choices, False, request)

    async def _body(self, request: Request):
        data = b""
        async for chunk in request.stream():
            data += chunk
            if self.max_body and len(data) > self.max_body:
                raise _TooLarge()
        try:
            return json.loads(data or b"null")
        except ValueError as e:
            why = e.msg if isinstance(e, json.JSONDecodeError) else e
            raise BadRequest(f"request body is not valid JSON ({why})") from None

    def _too_large(self):
        return _error(413, f"request body exceeds the {self.max_body}-byte limit (serve --max-body-bytes)",
                      code="request_too_large")

    def _max_tokens(self, prompts, req, prompt_param):
        """max_tokens for the request (the default clipped to the context); BadRequest when prompt + max_tokens
        cannot fit: before any work, so a stream is refused before its first byte."""
        backend = self.backend
        limit, source = backend.context()
        longest = max(len(p) for p in prompts)
        mt = req["max_tokens"]
        if limit is None:
            return mt or backend.max_tokens
        if longest + 1 > limit:
            raise BadRequest(f"'{prompt_param}': the prompt has {longest} tokens; with at least 1 new token that "
                             f"exceeds the context of {limit} tokens ({source})", prompt_param)
        if mt is None:
            return min(backend.max_tokens, limit - longest)
        if longest + mt > limit:
            f = req["max_tokens_field"]
            raise BadRequest(f"'{f}': prompt ({longest} tokens) + {f} ({mt}) = {longest + mt} exceeds the context "
                             f"of {limit} tokens ({source}); lower {f} to at most {limit - longest}", f)
        return mt

    def _sampling(self, req, i) -> SamplingParams:
        return SamplingParams(req["max_tokens"] or self.backend.max_tokens, req["temperature"], req["top_p"],
                              req["top_k"], _choice_seed(req["seed"], i))

    def _queue_full(self, n):
        return self.max_queued and self.active + n > self.max_queued

    def _busy(self):
        return _error(429, f"the server is at its limit of {self.max_queued} queued choices (serve --max-queued); "
                           "retry later", kind="rate_limit_error", code="queue_full", headers={"Retry-After": "1"})

    async def _respond(self, kind, req, choices, thinking, request=None):
        """Admits the choices (429 when the queue is full, 503 while the backend is unhealthy) and counts them
        until they are answered, the stream ends or the client goes away (499, its generation cancelled)."""
        if self._queue_full(len(choices)):  # checked again: the prompt was rendered meanwhile
            return self._busy()
        why = self.backend.health()
        if why:
            return _error(503, why, kind="server_error", code="unhealthy", headers={"Retry-After": "5"})
        self.active += len(choices)
        if not req["stream"]:
            work = asyncio.ensure_future(self._answer(kind, req, choices, thinking))
            gone = asyncio.ensure_future(_disconnected(request)) if request is not None else None
            try:
                await asyncio.wait([work] + ([gone] if gone else []), return_when=asyncio.FIRST_COMPLETED)
                if not work.done():  # the client went away: its generation is cancelled
                    work.cancel()
                    return _error(499, "client closed the request")
                return work.result()
            finally:
                if gone is not None:
                    gone.cancel()
                self.active -= len(choices)

        async def counted(gen):
            try:
                async for x in gen:
                    yield x
            finally:
                self.active -= len(choices)
        return await self._answer(kind, req, choices, thinking, counted)

    async def _answer(self, kind, req, choices, thinking, counted=None):
        n_prompt = sum(len(p) for p, _ in choices[::req["n"]])  # each prompt once, however many choices
        head = {"id": f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}",
                "created": int(time.time()), "model": self.model_name}
        if req["stream"]:
            return StreamingResponse(counted(self._stream(kind, req, choices, thinking, head, n_prompt)),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

        async def run(prompt, params):
            det = None
            async for det, *_ in _events(self.backend, prompt, params, req["stop"]):
                pass
            return det
        try:
            dets = await asyncio.gather(*(run(p, s) for p, s in choices))
        except Exception as e:  # noqa: BLE001 -- the engine's failure, reported as a 500
            return _error(500, f"{type(e).__name__}: {e}", kind="server_error")
        out = [self._choice(kind, req, i, d.tokens, d.logprobs, d.finish_reason,
                            {"message": _chat_message(d.text, thinking)} if kind == "chat" else None, d.text, 0)
               for i, d in enumerate(dets)]
        n_out = sum(len(d.tokens) for d in dets)
        return {**head, "object": "chat.completion" if kind == "chat" else "text_completion", "choices": out,
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}}

    def _choice(self, kind, req, i: int, ids, lps, finish, chat: dict | None, text: str, offset: int) -> dict:
        """One choice of an answer or a stream chunk: (chat) the `chat` fields (message or delta); (text) `text`,
        its log-probs counted from character `offset`; then the token ids when asked."""
        c = {"index": i, "finish_reason": finish}
        if kind == "chat":
            c.update(chat)
            c["logprobs"] = {"content": _chat_logprobs(self.tok, ids, lps)} if req["logprobs"] else None
        else:
            c["text"] = text
            c["logprobs"] = _completion_logprobs(self.tok, ids, lps, offset) if req["logprobs"] else None
        if req["return_token_ids"]:
            c["token_ids"] = list(ids)
        return c

    async def _stream(self, kind, req, choices, thinking, head, n_prompt):
        """SSE: (chat) a role delta per choice, then content deltas (with their log-probs), the finish reason on
        each choice's last chunk, the usage chunk when asked, then `data: [DONE]`."""
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"

        def sse(choice_list, **extra):
            return f"data: {json.dumps({**head, 'object': obj, 'choices': choice_list, **extra})}\n\n"

        q: asyncio.Queue = asyncio.Queue()
        tasks = [asyncio.create_task(_pump(q, i, self.backend, p, s, req["stop"])) for i, (p, s) in enumerate(choices)]
        splitters = [_ThoughtStream() if thinking else None for _ in choices]
        offsets = [0] * len(choices)
        n_out = 0
        try:
            if kind == "chat":
                for i in range(len(choices)):
                    yield sse([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}])
            left = len(tasks)
            while left:
                i, item = await q.get()
                if item is None:
                    left -= 1
                    continue
                if isinstance(item, Exception):
                    err = {"message": f"{type(item).__name__}: {item}", "type": "server_error", "param": None,
                           "code": None}
                    yield f"data: {json.dumps({'error': err})}\n\n"
                    break
                _, delta, ids, lps, finish = item
                n_out += len(ids)
                if not (delta or ids or finish):
                    continue
                chat = None
                if kind == "chat":
                    d = {"content": delta}
                    if thinking:
                        r, text = splitters[i].feed(delta, finish is not None)
                        d = {k: v for k, v in (("reasoning_content", r), ("content", text)) if v}
                    chat = {"delta": d}
                yield sse([self._choice(kind, req, i, ids, lps, finish, chat, delta, offsets[i])])
                offsets[i] += len(delta)
            if req["include_usage"]:
                yield sse([], usage={"prompt_tokens": n_prompt, "completion_tokens": n_out,
                                     "total_tokens": n_prompt + n_out})
            yield "data: [DONE]\n\n"
        finally:
            for t in tasks:
                t.cancel()


def create_app(backend: Backend, model_name: str, *, max_tokens_limit: int = 32768, max_n: int = 16,
               api_keys=(), max_queued: int = 0, max_body_bytes: int = 0):
    """The FastAPI app of the OpenAI-compatible API over `backend` (see the module docstring); its routes are
    the handlers of `_Routes`.

    api_keys: accepted bearer keys (none = no authentication; 401 otherwise). max_queued: most choices queued or
    generating at once (0 = unbounded; beyond it 429 with Retry-After). max_body_bytes: largest request body
    (0 = unbounded; beyond it 413). Every request's prompt tokens + max_tokens are checked against
    `backend.context()` before any work (400 naming the field and what sets the limit)."""
    if not isinstance(backend, Backend):
        raise TypeError(f"create_app: backend must subclass serve.openai_api.Backend, got {type(backend).__name__}")
    app = FastAPI(title="mimesis_jax serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(_Guard, keys=list(api_keys), max_body_bytes=max_body_bytes)
    routes = _Routes(backend, model_name, max_tokens_limit, max_n, max_queued, max_body_bytes)
    app.add_exception_handler(HTTPException, routes.http_error)
    app.add_api_route("/health", routes.health, methods=["GET"])
    for prefix in ("/v1", ""):
        app.add_api_route(f"{prefix}/models", routes.list_models, methods=["GET"])
        app.add_api_route(f"{prefix}/chat/completions", routes.chat_completions, methods=["POST"])
        app.add_api_route(f"{prefix}/completions", routes.completions, methods=["POST"])
    return app
