"""An OpenAI-compatible HTTP server for a local model (e.g. the frozen user simulator), on localhost.

    python -m mimesis_jax serve --checkpoint HF_DIR --port 8000 [--tokenizer SPEC] [--generation-role user]
    python -m mimesis_jax serve --checkpoint WORKDIR [--step N] --port 8000  # a training run's checkpoint
    python -m mimesis_jax.rollout.serve --checkpoint HF_DIR --port 0       # HF directories only

Endpoints: `POST /v1/chat/completions`, `GET /v1/models`, `GET /health`. Standard library `ThreadingHTTPServer`;
concurrent requests are collected by one worker (up to `--max-batch`, waiting at most `--batch-wait-ms` for
company) and sampled together in ONE batched sampler call, every request keeping its own settings.

Request fields: `messages` (required; string content or a list of text parts), `max_tokens` /
`max_completion_tokens`, `temperature`, `top_p`, `stop` (string or list), `seed`, `n` (1 only), `stream` (false
only), `logprobs` (bool), and the extensions `top_k`, `chat_template_kwargs.enable_thinking` and
`return_token_ids` (adds the generated `token_ids` to the choice). With thinking on, the thought is returned in
`message.reasoning_content` and the public reply in `message.content` (as vLLM's reasoning parsers do).
A bad request gets HTTP 400 with an OpenAI-style JSON error naming the offending field.
"""

from __future__ import annotations

import argparse
import http.server
import json
import logging
import os
import queue
import threading
import time
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mimesis_jax.rollout.endpoints import LocalChatModel

log = logging.getLogger(__name__)
ROLES = ("system", "user", "assistant", "tool")


class BadRequest(ValueError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


# ------------------------------------------------------------------------------------ requests
def _content_text(content, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, p in enumerate(content):
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                raise BadRequest(f"messages[{i}].content[{j}]: only text parts are supported", f"messages[{i}]")
            parts.append(p["text"])
        return "".join(parts)
    raise BadRequest(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}]")


def parse_request(body, max_tokens_limit: int) -> dict:
    """Validates a chat-completions body; returns the sampling request or raises BadRequest naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    messages = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest(f"messages[{i}] must be an object with a role in {list(ROLES)}", f"messages[{i}]")
        messages.append({"role": m["role"], "content": _content_text(m.get("content"), i)})

    def number(name, lo, hi, default, integer=False):
        v = body.get(name, default)
        if v is None:
            return default
        ok = isinstance(v, int) if integer else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok or not lo <= v <= hi:
            kind = "an integer" if integer else "a number"
            raise BadRequest(f"'{name}' must be {kind} in [{lo}, {hi}], got {v!r}", name)
        return v

    if body.get("n", 1) != 1:
        raise BadRequest("only n=1 is supported", "n")
    if body.get("stream", False):
        raise BadRequest("streaming is not supported; send stream=false", "stream")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    body = {**body, "max_tokens": max_tokens}
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise BadRequest("'stop' must be a non-empty string or a list of them", "stop")
    kw = body.get("chat_template_kwargs") or {}
    if not isinstance(kw, dict) or not isinstance(kw.get("enable_thinking", False), bool):
        raise BadRequest("'chat_template_kwargs.enable_thinking' must be a boolean", "chat_template_kwargs")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest(f"'seed' must be an integer, got {seed!r}", "seed")
    return {
        "messages": messages,
        "max_tokens": number("max_tokens", 1, max_tokens_limit, None, integer=True),
        "temperature": number("temperature", 0.0, 2.0, None),
        "top_p": number("top_p", 1e-9, 1.0, None),
        "top_k": number("top_k", 0, 1 << 30, None, integer=True),
        "stop": stop,
        "seed": seed,
        "enable_thinking": kw.get("enable_thinking"),
        "logprobs": bool(body.get("logprobs", False)),
        "return_token_ids": bool(body.get("return_token_ids", False)),
    }


# ------------------------------------------------------------------------------------ batching
class _Job:
    def __init__(self, req):
        self.req, self.done, self.result, self.error = req, threading.Event(), None, None


class BatchingEngine:
    """Collects concurrent requests and samples them together with `LocalChatModel.chat_batch`."""

    def __init__(self, model: LocalChatModel, *, max_batch: int = 32, batch_wait_ms: float = 5.0):
        self.model, self.max_batch, self.wait = model, int(max_batch), batch_wait_ms / 1000.0
        self._q: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self.batch_sizes: list[int] = []  # one entry per sampler call, for tests and logs
        self._thread = threading.Thread(target=self._loop, name="mimesis-serve-batcher", daemon=True)
        self._thread.start()

    def submit(self, req) -> _Job:
        job = _Job(req)
        self._q.put(job)
        job.done.wait()
        return job

    def close(self):
        self._stop.set()
        self._q.put(None)
        self._thread.join(timeout=10)

    def _loop(self):
        while not self._stop.is_set():
            job = self._q.get()
            if job is None:
                continue
            jobs, deadline = [job], time.monotonic() + self.wait
            while len(jobs) < self.max_batch:
                try:
                    nxt = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is not None:
                    jobs.append(nxt)
            self._run(jobs)

    def _run(self, jobs):
        reqs = [j.req for j in jobs]
        self.batch_sizes.append(len(jobs))
        try:
            out = self.model.chat_batch(
                [r["messages"] for r in reqs], max_tokens=[r["max_tokens"] or self.model.max_tokens for r in reqs],
                temperature=[self.model.temperature if r["temperature"] is None else r["temperature"] for r in reqs],
                top_p=[self.model.top_p if r["top_p"] is None else r["top_p"] for r in reqs],
                top_k=[self.model.top_k if r["top_k"] is None else r["top_k"] for r in reqs],
                seed=[r["seed"] for r in reqs], stop=[r["stop"] for r in reqs],
                enable_thinking=[self.model.enable_thinking if r["enable_thinking"] is None else r["enable_thinking"]
                                 for r in reqs])
            for j, r in zip(jobs, out):
                j.result = r
        except Exception as e:  # noqa: BLE001 -- reported to every waiting client as a 500
            log.exception("batched generation failed")
            for j in jobs:
                j.error = f"{type(e).__name__}: {e}"
        for j in jobs:
            j.done.set()


class BatchedChatModel:
    """A ChatModel whose concurrent `chat` calls (from many threads: e.g. the envs of a rollout batch, each asking
    its user or judge) are sampled together through one `BatchingEngine` -- in-process, no HTTP. Close it when done.
    """

    def __init__(self, model: "LocalChatModel", *, max_batch: int = 64, batch_wait_ms: float = 20.0):
        self.model = model
        self.engine = BatchingEngine(model, max_batch=max_batch, batch_wait_ms=batch_wait_ms)
        self.max_concurrency = int(max_batch)  # chat_many sends this many calls at once: one batch

    def chat(self, messages, *, max_tokens=None, temperature=None, stop=None, top_p=None, top_k=None, seed=None,
             enable_thinking=None, **_):
        from mimesis_jax.rollout.base import ChatResponse

        job = self.engine.submit({"messages": list(messages), "max_tokens": max_tokens, "temperature": temperature,
                                  "top_p": top_p, "top_k": top_k, "seed": seed, "stop": list(stop or []),
                                  "enable_thinking": enable_thinking})
        if job.error is not None:
            return ChatResponse(text="", finish_reason="error", meta={"error": job.error})
        return job.result

    def close(self):
        self.engine.close()


# ------------------------------------------------------------------------------------ the server
def completion_body(model_name: str, req: dict, resp, tok) -> dict:
    from mimesis_jax.rollout.endpoints import split_thought

    thinking = bool(resp.meta.get("thinking"))
    message = {"role": "assistant", "content": resp.text}
    if thinking:
        thought, utterance = split_thought(resp.text, thinking=True)
        message = {"role": "assistant", "content": utterance or "", "reasoning_content": thought}
    choice = {"index": 0, "message": message, "finish_reason": resp.finish_reason}
    if req["logprobs"]:
        choice["logprobs"] = {"content": [{"token": tok.decode([t]), "logprob": lp}
                                          for t, lp in zip(resp.token_ids, resp.logprobs)]}
    if req["return_token_ids"]:
        choice["token_ids"] = list(resp.token_ids)
    n_prompt = len(resp.meta.get("prompt_ids", []))
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": model_name, "choices": [choice],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": len(resp.token_ids),
                      "total_tokens": n_prompt + len(resp.token_ids)}}


class ChatServer:
    """`ThreadingHTTPServer` around a LocalChatModel. `port=0` picks a free port (see `.port` / `.url`)."""

    def __init__(self, model: LocalChatModel, *, host: str = "127.0.0.1", port: int = 8000, model_name: str = "local",
                 max_batch: int = 32, batch_wait_ms: float = 5.0, max_tokens_limit: int = 32768):
        self.model, self.model_name, self.max_tokens_limit = model, model_name, int(max_tokens_limit)
        self.engine = BatchingEngine(model, max_batch=max_batch, batch_wait_ms=batch_wait_ms)
        self.httpd = http.server.ThreadingHTTPServer((host, port), self._handler_class())
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.httpd.server_address[0]}:{self.port}/v1"

    def start(self) -> "ChatServer":
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="mimesis-serve", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self):
        self.httpd.serve_forever()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.engine.close()

    def _handler_class(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):  # requests go to logging, not stderr
                log.debug("%s %s", self.address_string(), fmt % args)

            def _send(self, status: int, body: dict):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, message: str, param=None, kind="invalid_request_error"):
                self._send(status, {"error": {"message": message, "type": kind, "param": param, "code": None}})

            def do_GET(self):
                if self.path.rstrip("/") in ("/v1/models", "/models"):
                    self._send(200, {"object": "list", "data": [
                        {"id": server.model_name, "object": "model", "created": 0, "owned_by": "mimesis_jax"}]})
                elif self.path.rstrip("/") == "/health":
                    self._send(200, {"status": "ok"})
                else:
                    self._error(404, f"no route {self.path}", kind="not_found_error")

            def do_POST(self):
                if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                    self._error(404, f"no route {self.path}", kind="not_found_error")
                    return
                try:
                    n = int(self.headers.get("Content-Length", "0"))
                    body = json.loads(self.rfile.read(n) or b"null")
                    req = parse_request(body, server.max_tokens_limit)
                except json.JSONDecodeError as e:
                    self._error(400, f"request body is not valid JSON ({e.msg})")
                    return
                except BadRequest as e:
                    self._error(400, str(e), e.param)
                    return
                job = server.engine.submit(req)
                if job.error is not None:
                    self._error(500, job.error, kind="server_error")
                    return
                self._send(200, completion_body(server.model_name, req, job.result, server.model.tok))

        return Handler


# ------------------------------------------------------------------------------------ command line
def add_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--checkpoint", required=True,
                        help="HF model directory (config.json + safetensors); through `python -m mimesis_jax serve` "
                             "also a training workdir (its latest checkpoint, or --step)")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step of a training workdir (default latest)")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer spec for data.tokenizer.load_tokenizer: tiny | qwen3 | qwen3_5 | hf:DIR | "
                             "sentencepiece:FILE (default: hf:CHECKPOINT when it holds tokenizer files; a workdir's "
                             "run tokenizer)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--model-name", default=None, help="the model id reported (default: checkpoint dir name)")
    parser.add_argument("--generation-role", choices=("assistant", "user"), default="assistant",
                        help="role of the generated turn; 'user' serves a simulator in its own framing")
    parser.add_argument("--enable-thinking", action="store_true", help="thinking template by default")
    parser.add_argument("--max-tokens", type=int, default=512, help="default max_tokens of a request")
    parser.add_argument("--max-tokens-limit", type=int, default=32768, help="largest max_tokens accepted")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--seed", type=int, default=0)
    return parser


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def _load_weights(args, trained_loader):
    """(config, params, default tokenizer spec or None, where the weights came from) for --checkpoint: a HF
    directory (config.json + safetensors) or, when the caller supplies `trained_loader` (the CLI passes
    train.export.load_trained), a training workdir's orbax checkpoint at --step."""
    import jax
    import jax.numpy as jnp

    from mimesis_jax import models

    ckpt = args.checkpoint
    if not os.path.isdir(ckpt):
        raise SystemExit(f"--checkpoint {ckpt}: not a directory")
    if os.path.isfile(os.path.join(ckpt, "config.json")):
        if args.step is not None:
            raise SystemExit(f"--step {args.step}: {ckpt} is a HF directory (one set of weights); --step selects a "
                             "checkpoint of a training workdir")
        tok = f"hf:{ckpt}" if any(os.path.exists(os.path.join(ckpt, f)) for f in TOKENIZER_FILES) else None
        config, params = models.load_hf(ckpt, dtype=args.dtype)
        return config, params, tok, f"{ckpt}/config.json"
    if trained_loader is not None and os.path.isdir(os.path.join(ckpt, "checkpoints")):
        config, params, step, tok = trained_loader(ckpt, args.step)
        if args.dtype != "float32":
            params = jax.tree.map(lambda x: x.astype(jnp.dtype(args.dtype)), params)
            config = config.replace(param_dtype=args.dtype, dtype=args.dtype)
        return config, params, tok, f"{ckpt} step {step}"
    kinds = "a HF directory (no config.json)" + (" nor a training workdir (no checkpoints/)" if trained_loader else "")
    raise SystemExit(f"--checkpoint {ckpt}: neither {kinds}")


def load_chat_model(checkpoint: str, *, step: int | None = None, tokenizer: str | None = None,
                    dtype: str = "float32", generation_role: str = "assistant", enable_thinking: bool = False,
                    max_tokens: int = 512, seed: int = 0, name: str | None = None,
                    trained_loader=None) -> "LocalChatModel":
    """A LocalChatModel from a HF directory or (with `trained_loader`) a training workdir, with the checkpoint's
    tokenizer unless `tokenizer` names one. What `serve` and `rollout` load models with."""
    from mimesis_jax.data.tokenizer import load_tokenizer
    from mimesis_jax.rollout.endpoints import LocalChatModel

    args = argparse.Namespace(checkpoint=checkpoint, step=step, dtype=dtype)
    config, params, default_tok, source = _load_weights(args, trained_loader)
    spec = tokenizer or default_tok
    if spec is None:
        raise SystemExit(f"--checkpoint {checkpoint} holds no tokenizer files ({', '.join(TOKENIZER_FILES)}); "
                         "pass --tokenizer SPEC (e.g. tiny, qwen3, qwen3_5, hf:DIR)")
    tok = load_tokenizer(spec)
    if tok.vocab_size > config.vocab_size:
        raise SystemExit(f"--tokenizer {spec}: {tok.vocab_size} ids do not fit the model's vocab_size "
                         f"{config.vocab_size} ({source})")
    name = name or os.path.basename(os.path.normpath(checkpoint))
    return LocalChatModel(config, params, tok, generation_role=generation_role, enable_thinking=enable_thinking,
                          max_tokens=max_tokens, seed=seed, name=name)


def build_server(args, trained_loader=None) -> ChatServer:
    model = load_chat_model(args.checkpoint, step=args.step, tokenizer=args.tokenizer, dtype=args.dtype,
                            generation_role=args.generation_role, enable_thinking=args.enable_thinking,
                            max_tokens=args.max_tokens, seed=args.seed, name=args.model_name,
                            trained_loader=trained_loader)
    return ChatServer(model, host=args.host, port=args.port, model_name=model.name, max_batch=args.max_batch,
                      batch_wait_ms=args.batch_wait_ms, max_tokens_limit=args.max_tokens_limit)


def run(args, trained_loader=None) -> int:
    server = build_server(args, trained_loader)
    print(f"serving {server.model_name} on {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = add_args(argparse.ArgumentParser(prog="mimesis_jax serve", description=__doc__.splitlines()[0]))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
