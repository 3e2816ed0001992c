"""Request batching over a `LocalChatModel`: `BatchingEngine` samples concurrent requests (prompt ids +
SamplingParams) together in ONE sampler call (up to max_batch, waiting at most batch_wait_ms for company), every
request keeping its own settings; `BatchedChatModel` is that batching in-process, a ChatModel whose concurrent
`chat` calls (the envs of a rollout, each asking its user or judge) share sampler calls. The HTTP server
(serve/server.py) puts the same `BatchingEngine` behind its default backend.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time

import numpy as np

from mimesis_jax.chat.base import ChatModel, ChatResponse
from mimesis_jax.chat.local import LocalChatModel
from mimesis_jax.chat.stream import Detokenizer, SamplingParams, TokenEvent

log = logging.getLogger(__name__)


class _Job:
    def __init__(self, req, callback=None):
        self.req, self.done, self.result, self.error, self.callback = req, threading.Event(), None, None, callback
        self.cancelled, self.flags, self.row = False, None, -1  # flags[row]: the running batch's cancel array

    def cancel(self):
        """The caller went away (any thread): skipped if still queued, stopped within a few steps if running."""
        self.cancelled = True
        flags = self.flags
        if flags is not None:
            flags[self.row] = True


class BatchingEngine:
    """Collects concurrent requests (prompt ids + SamplingParams) and samples them together with
    `LocalChatModel.generate`: one generator call per batch. A request without a seed goes to the generator
    unseeded and gets the protocol's seed (inference/protocol.py `request_seeds`: the generator's seed, its call
    count, the row), so unseeded requests differ, share one call counter with the model's direct calls, and
    seeded ones do not depend on their batch."""

    def __init__(self, model: LocalChatModel, *, max_batch: int = 32, batch_wait_ms: float = 5.0):
        self.model, self.max_batch, self.wait = model, int(max_batch), batch_wait_ms / 1000.0
        self._q: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self.batch_sizes: list[int] = []  # one entry per sampler call, for tests and logs
        self.cancelled_tokens: list[int] = []  # tokens sampled for each request cancelled while in a batch
        self._thread = threading.Thread(target=self._loop, name="mimesis-serve-batcher", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids, params: SamplingParams) -> _Job:
        """Blocks until the sample is ready: `job.result` (a sampler.Sample) or `job.error` (a message)."""
        job = _Job((list(prompt_ids), params))
        self._q.put(job)
        job.done.wait()
        return job

    def submit_async(self, prompt_ids, params: SamplingParams) -> asyncio.Future:
        """A future of the running event loop, resolved from the engine thread with a sampler.Sample."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def settle(job):
            if fut.cancelled():
                return
            if job.error is not None:
                fut.set_exception(RuntimeError(job.error))
            else:
                fut.set_result(job.result)
        job = _Job((list(prompt_ids), params), lambda job: loop.call_soon_threadsafe(settle, job))
        fut.add_done_callback(lambda f: job.cancel() if f.cancelled() else None)  # the client went away
        self._q.put(job)
        return fut

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
        for j in jobs:
            if j.cancelled:  # went away while queued: never sampled
                j.error = "cancelled"
                self.cancelled_tokens.append(0)
                j.done.set()
        jobs = [j for j in jobs if not j.cancelled]
        if not jobs:
            return
        m, ps = self.model, [j.req[1] for j in jobs]
        self.batch_sizes.append(len(jobs))
        flags = np.zeros((len(jobs),), bool)
        for i, j in enumerate(jobs):
            j.row, j.flags = i, flags
            if j.cancelled:  # cancelled between the look above and now
                flags[i] = True
        try:
            out = m.generate([j.req[0] for j in jobs], [
                m.sampling(max_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
                           seed=p.seed) for p in ps], cancel=flags)
            for j, r in zip(jobs, out):
                j.result = r
                if j.cancelled:
                    self.cancelled_tokens.append(len(r.tokens))
        except Exception as e:  # noqa: BLE001 -- reported to every waiting client as a 500
            log.exception("batched generation failed")
            for j in jobs:
                j.error = f"{type(e).__name__}: {e}"
        for j in jobs:
            j.done.set()
            if j.callback is not None:
                try:
                    j.callback(j)
                except RuntimeError:  # the waiting event loop is closed (server shut down): nobody to tell
                    pass



class BatchedChatModel(ChatModel):
    """A ChatModel whose concurrent `chat` calls (from many threads: e.g. the envs of a rollout batch, each asking
    its user or judge) are sampled together through one `BatchingEngine` -- in-process, no HTTP. Close it when done.
    """

    def __init__(self, model: LocalChatModel, *, max_batch: int = 64, batch_wait_ms: float = 20.0):
        self.model = model
        self.engine = BatchingEngine(model, max_batch=max_batch, batch_wait_ms=batch_wait_ms)
        self.max_concurrency = int(max_batch)  # chat_batch's pool sends this many calls at once: one batch

    def chat(self, messages, *, max_tokens=None, temperature=None, stop=None, top_p=None, top_k=None, seed=None,
             enable_thinking=None, **_):
        think = self.model.enable_thinking if enable_thinking is None else enable_thinking
        prompt = self.model.render(list(messages), think)
        job = self.engine.submit(prompt, SamplingParams(max_tokens, temperature, top_p, top_k, seed))
        if job.error is not None:
            return ChatResponse(text="", finish_reason="error", meta={"error": job.error})
        det, s = Detokenizer(self.model.tok, self.model.stop_ids, list(stop or [])), job.result
        for i, (t, lp) in enumerate(zip(s.tokens, s.logprobs)):
            det.push(TokenEvent(int(t), float(lp), s.finish_reason if i == len(s.tokens) - 1 else None))
            if det.finish_reason is not None:
                break
        return ChatResponse(text=det.text, token_ids=det.tokens, logprobs=det.logprobs, finish_reason=det.finish_reason,
                            meta={"prompt_ids": prompt, "thinking": think, "model": self.model.name})

    def close(self) -> None:
        self.engine.close()

