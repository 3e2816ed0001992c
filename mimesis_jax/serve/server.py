"""`serve`: an OpenAI-compatible HTTP server for a local model (e.g. the frozen user simulator), on localhost
(`ChatServer`); the command line is commands/serve.py, the checkpoint is loaded by chat/loading.py.

    python -m mimesis_jax serve --checkpoint HF_DIR --port 8000 [--tokenizer SPEC] [--generation-role user]
    python -m mimesis_jax serve --checkpoint WORKDIR [--step N] --port 8000  # a training run's checkpoint

The API (chat and text completions, streaming, n, logprobs; serve/openai_api.py) is a FastAPI app run by
uvicorn (`ChatServer`), bound to 127.0.0.1 unless --host says otherwise. With `--api-key KEY` (repeatable) or
MIMESIS_API_KEY (comma-separated keys) every route but /health needs `Authorization: Bearer KEY` (compared in
constant time; 401 otherwise); without a key any request is served, and binding a non-loopback address warns.
Every request is bounded before any work: prompt tokens + max_tokens within the context (the model's
max_position_embeddings; with --engine also --engine-max-len and the pool), else 400 naming the field and the
limit (a stream is refused before its first byte); at most `--max-queued` choices in flight (429 with
Retry-After beyond); bodies up to `--max-body-bytes` (413 beyond). A client that goes away cancels its
generation on both backends. Its backend here is `EngineBackend`: every choice goes through a `BatchingEngine`, which
samples concurrent requests together in ONE sampler call (up to `--max-batch`, waiting at most `--batch-wait-ms`
for company), every request keeping its own settings. That backend delivers a choice's tokens when its batch is
done, so a stream carries well-formed OpenAI chunks that arrive together; with `--engine` (below) they arrive as
they are sampled.
`BatchedChatModel` (chat/batching.py) is the same batching in-process (no HTTP), for the envs of a rollout.

`--engine` samples through the rollout engine instead (a LocalChatModel over inference/generators.py
`EngineGenerator`: paged KV pool,
`--engine-slots` decode slots, one device) with `StreamingEngineBackend`: the engine's scheduler runs on its own
thread and every choice of every HTTP call is one engine request that takes a decode slot as soon as one frees
(continuous batching across calls: a short completion leaves early, a new request does not wait for a batch to
drain), and a stream receives its tokens as each decode burst of `--engine-decode-steps` tokens returns. The
same seeds give the same tokens as the default backend.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import sys
import threading
import time

from mimesis_jax.chat.batching import BatchingEngine
from mimesis_jax.chat.local import LocalChatModel
from mimesis_jax.inference.protocol import derive_seed
from mimesis_jax.inference.engine import EngineError, EngineLoop
from mimesis_jax.inference.generators import EngineGenerator
from mimesis_jax.chat.stream import TokenEvent
from mimesis_jax.serve.openai_api import Backend, create_app

log = logging.getLogger(__name__)


class EngineBackend(Backend):
    """The `Backend` over a LocalChatModel and a BatchingEngine: a choice's tokens come when its batch is done."""

    def __init__(self, model: LocalChatModel, engine: BatchingEngine):
        self.model, self.engine, self.tok = model, engine, model.tok
        self.stop_ids, self.max_tokens = tuple(model.stop_ids), int(model.max_tokens)

    def context(self):
        return int(self.model.config.max_position_embeddings), "the model's max_position_embeddings"

    def render(self, messages, enable_thinking=None):
        think = self.model.enable_thinking if enable_thinking is None else enable_thinking
        return self.model.render(messages, think), bool(think)

    async def generate(self, prompt_ids, params):
        sample = await self.engine.submit_async(prompt_ids, params)
        last = len(sample.tokens) - 1
        for i, (t, lp) in enumerate(zip(sample.tokens, sample.logprobs)):
            yield TokenEvent(int(t), float(lp), sample.finish_reason if i == last else None)


class StreamingEngineBackend(Backend):
    """The `Backend` of `serve --engine`: every choice is one request of a RolloutEngine (inference/engine.py) whose
    scheduler runs on an `EngineLoop` thread. A request joins the running batch as soon as a decode slot frees --
    requests of different HTTP calls are batched continuously, nobody waits for a batch to drain -- and its tokens
    are yielded as each decode burst (`--engine-decode-steps` tokens) returns them. A client that goes away (or a
    stop string that completes) cancels its request, freeing the slot. An unseeded request gets a seed derived from
    (model seed, request counter); a seeded one draws the same tokens as the default backend."""

    def __init__(self, model):
        self.model, self.tok = model, model.tok
        self.stop_ids, self.max_tokens = tuple(model.stop_ids), int(model.max_tokens)
        self.loop = EngineLoop(model.generator.engine, name="mimesis-serve-engine")
        self._count = 0
        self._count_lock = threading.Lock()

    def context(self):
        """The longest prompt + completion: the engine's page table (--engine-max-len), the pool
        (--engine-pages) and the model's positions, whichever is least."""
        eng = self.loop.engine
        ec = eng.ec
        pool = (ec.num_pages - 1) * ec.page_size
        limits = [(eng.max_len, f"--engine-max-len, {eng.max_len}"),
                  (pool, f"--engine-pages {ec.num_pages} x --engine-page-size {ec.page_size}, less the trash page"),
                  (int(self.model.config.max_position_embeddings), "the model's max_position_embeddings")]
        return min(limits, key=lambda x: x[0])

    def held(self) -> dict:
        """What the engine holds now (/health reports it): KV pages out of the pool, 0 when no request is live."""
        return {"pages_in_use": self.loop.engine.pages_in_use()}

    def health(self):
        """None, or why the engine cannot serve (each look tries to rebuild its pool first)."""
        try:
            self.loop.engine._check_healthy()  # noqa: SLF001
        except EngineError as e:
            return str(e)
        return None

    def render(self, messages, enable_thinking=None):
        think = self.model.enable_thinking if enable_thinking is None else enable_thinking
        return self.model.render(messages, think), bool(think)

    async def generate(self, prompt_ids, params):
        m, loop, q = self.model, asyncio.get_running_loop(), asyncio.Queue()
        with self._count_lock:
            self._count += 1
            n = self._count

        def on_token(r, tok, lp):  # on the engine thread
            try:
                loop.call_soon_threadsafe(q.put_nowait, (tok, lp, r.finish, r.error))
            except RuntimeError:  # the event loop is closed (server shut down): nobody to tell
                pass

        def pick(name, default):
            v = getattr(params, name)
            return default if v is None else v
        req = self.loop.submit(prompt_ids, max_tokens=pick("max_tokens", m.max_tokens),
                               temperature=pick("temperature", m.temperature), top_p=pick("top_p", m.top_p),
                               top_k=pick("top_k", m.top_k),
                               seed=derive_seed(m.seed, 1 << 41, n) if params.seed is None else params.seed,
                               on_token=on_token)
        try:
            while True:
                tok, lp, finish, error = await q.get()
                if tok is None:  # ended without a token: failed or cancelled
                    if finish == "error":
                        raise RuntimeError(error)
                    return
                yield TokenEvent(int(tok), float(lp), finish)
                if finish is not None:
                    return
        finally:
            if not req.done:
                self.loop.engine.cancel(req)

    def close(self):
        self.loop.close()


# ------------------------------------------------------------------------------------ the server
def warn_if_exposed(address: str, url: str, keys) -> bool:
    """Warns (log and stderr) when `address` is not a loopback address and no API key is set; True if it did."""
    if keys or ipaddress.ip_address(address).is_loopback:
        return False
    msg = (f"WARNING: serving on {url}: reachable from other machines, with no authentication "
           "(pass --api-key KEY or set MIMESIS_API_KEY)")
    log.warning(msg)
    print(msg, file=sys.stderr, flush=True)
    return True


class ChatServer:
    """uvicorn serving `create_app` over a LocalChatModel: through a BatchingEngine over the static sampler, or a
    StreamingEngineBackend over the rollout engine (an EngineGenerator); `.engine` is whichever of the two runs the
    requests. The socket is bound at construction, so `port=0` picks a free port known at once (`.port` / `.url`);
    `start()` serves from a thread, `serve_forever()` from the calling one (Ctrl-C / SIGTERM end it); `stop()`
    shuts down and closes the engine."""

    def __init__(self, model: LocalChatModel, *, host: str = "127.0.0.1", port: int = 8000, model_name: str = "local",
                 max_batch: int = 32, batch_wait_ms: float = 5.0, max_tokens_limit: int = 32768, max_n: int = 16,
                 api_keys=(), max_queued: int = 256, max_body_bytes: int = 8 << 20):
        # lazy (b): the ASGI server only when `serve` listens
        import uvicorn

        self.model, self.model_name, self.max_tokens_limit = model, model_name, int(max_tokens_limit)
        if isinstance(model.generator, EngineGenerator):  # the rollout engine: continuous batching
            backend = StreamingEngineBackend(model)
            self.engine = backend
        else:
            self.engine = BatchingEngine(model, max_batch=max_batch, batch_wait_ms=batch_wait_ms)
            backend = EngineBackend(model, self.engine)
        keys = [k for k in api_keys if k]
        self.app = create_app(backend, model_name, max_tokens_limit=max_tokens_limit, max_n=max_n, api_keys=keys,
                              max_queued=max_queued, max_body_bytes=max_body_bytes)
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        self._sock = socket.create_server((host, port), family=family)
        warn_if_exposed(self._sock.getsockname()[0], self.url, keys)
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_config=None, access_log=False, lifespan="off",
                                                     timeout_graceful_shutdown=5))
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    @property
    def url(self) -> str:
        host = self._sock.getsockname()[0]
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/v1"

    def start(self) -> "ChatServer":
        self._thread = threading.Thread(target=self.serve_forever, name="mimesis-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise RuntimeError(f"uvicorn did not start on {self.url}")
        return self

    def serve_forever(self):
        self._server.run(sockets=[self._sock])

    def stop(self):
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._sock.close()
        self.engine.close()
