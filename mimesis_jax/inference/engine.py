"""Multi-turn rollout engine: persistent per-dialogue caches, a paged KV pool and continuous batching.

This module is the scheduler (admission, rounds); the settings and requests (`EngineConfig`, `EngineRequest`,
importable from here too) are in inference/engine_requests.py, the jitted programs in inference/engine_programs.py,
the pages and cached dialogues in inference/page_pool.py, the Generator over it in inference/generators.py.

    engine = RolloutEngine(config, params, EngineConfig(slots=16), stop_ids=(im_end,))
    samples = engine.generate_tokens(prompts, keys=episode_ids, max_tokens=256, temperature=1.0, seed=seeds)
    ...                                   # next turn: prompts extend the previous ones -> only the suffix is run
    engine.release(episode_id)            # the episode ended: its pages and state slot go back to the pools

Why: in RL the rollouts dominate wall time, and a per-turn `sampler.generate` re-prefills every dialogue's
whole context each turn, pads every row to the longest prompt and decodes until the slowest row stops.

**Persistent dialogue state.** A dialogue (identified by its key) keeps, between calls, the tokens the model
has consumed, the cache pages holding their keys/values (every full-attention layer) and, for Qwen3.5, a
state slot holding each linear layer's conv window and DeltaNet state. When a new prompt for that key starts
with those tokens, only the suffix (tool result, user turn, assistant header, and the last sampled token,
which was never fed back) is prefilled. If the history diverged (e.g. a chat template dropped a thought), the
dialogue resumes from its longest common prefix (Qwen3) or from the state snapshot it took at its last prompt's
last whole turn (Qwen3.5), else it is recomputed from position 0 (inference/page_pool.py, rollback). The engine is
token-exact: a sample's log-probs are those of the model's full forward over the final sequence
(`algorithms.logprobs.token_logprobs`) up to fp32 rounding, and sampling uses the sampler's rule and keys
(`sampler.choose_tokens`; row key fold_in(key(seed), salt), step key fold_in(row key, step)), so the same seeds draw
the same tokens as `sampler.generate`.

**Paged cache** (models/paged_cache.py). Keys/values live in pages of `page_size` tokens from one pool of
`num_pages` pages (page 0 is a trash page for padding writes); each dialogue has a page table. A request
reserves, when it is admitted, the pages for its prompt plus `max_tokens` new tokens, so it never runs out
mid-flight; when it finishes, pages beyond the dialogue's consumed tokens are returned.

**Pool policy (memory bounded by configuration).** When a request cannot get its pages (or, Qwen3.5, a state
slot) while requests run on its replica, it waits for them to finish (admission control: inference/page_pool.py);
only with nothing running there the engine evicts the replica's least-recently-used *idle* dialogue (one not in a
running request): its pages and slot are freed, and it is recomputed from scratch when it returns. If nothing is
left to evict, `EngineError` names the config key to raise (`EngineConfig.num_pages` / `num_states`). A prompt +
max_tokens longer than a page table (`max_pages_per_seq * page_size`) is rejected up front.

**Replicas.** On a mesh with batch axes the engine is one data-parallel replica per block of them
(inference/engine_programs.py): each has `slots` decode slots, `num_pages` pages and `num_states` state slots of
its own, and every dialogue stays on the replica it was assigned when it first arrived (page_pool.py `home`).

**Continuous batching.** `slots` decode slots; a waiting request takes a slot as soon as one frees. Each
scheduler round runs one prefill chunk (up to `prefill_rows` requests x `prefill_chunk` tokens, right-padded)
and then a burst of up to `decode_steps` one-token steps of every decoding slot (a compiled while-loop that
returns early when a slot finishes and a request is waiting). The compiled shapes are fixed by EngineConfig:
prefill programs [r, prefill_chunk] for r = 1, 2, 4 .. prefill_rows (a lone joining request does not pay for
prefill_rows rows) and one decode program [slots], each per page-table width (`table_widths`) and per
sampling-filter candidate count. A decode burst works on a slot-major copy of its rows' pages (no page gather
per step; see `engine_programs.decode_program`).

**Driving the scheduler.** `generate_tokens` queues a call's requests and runs scheduler rounds until they are
done (the RL runners' path). `submit(prompt, ..., on_token=f)` queues one request from any thread and returns its
`EngineRequest` handle at once; `step()` runs one round, `cancel(request)` ends one. `EngineLoop(engine)` runs the
rounds on a background thread: requests submitted meanwhile (e.g. by `serve`'s HTTP handlers) join the running
batch as slots free, and their tokens reach `on_token` as each decode burst returns (streaming). Per-call state
lives in the requests, so a request draws the same tokens whatever shares its batch (the sampling filter of a
program is the candidate count its rows need, exact for every row).

Statistics (`engine.stats`): prefill tokens, decode steps, slot-steps used / offered (decode-slot utilisation),
evictions, recomputed dialogues, rolled-back dialogues (resumed from a common prefix or a snapshot), reused (not
re-prefilled) tokens, the most pages in use at once (`pages_peak`).
The RL stages log them per step (`engine/*`, train/rl/chat_models.EngineMeter); the pools' sizes come from the
`rollout.engine*` keys (inference/engine_sizing.py).
"""


from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from typing import Sequence

import jax
import numpy as np

from mimesis_jax import models, sharding
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.inference import engine_programs, sampler
from mimesis_jax.inference.protocol import derive_seed
from mimesis_jax.inference.engine_requests import EngineConfig, EngineRequest, make_requests
from mimesis_jax.inference.page_pool import EngineError, PagePool
from mimesis_jax.inference.sampler import Sample

log = logging.getLogger(__name__)


class RolloutEngine:
    """Token-level sampler with persistent dialogue state; `generate_tokens` has LocalChatModel's contract
    plus `keys` (one hashable per prompt, None = stateless). See the module docstring."""

    def __init__(self, config: ModelConfig, params, engine_config: EngineConfig | None = None, *,
                 stop_ids: Sequence[int] = (), seed: int = 0, decode_attention=None, mesh=None):
        self.config, self.mesh = config, mesh
        self.params = params  # placed on the mesh (the property's setter)
        self.ec = engine_config or EngineConfig()
        self.ec.validate()
        if not models.has_part(config, "paged"):
            raise EngineError(f"config key 'model_type': {config.model_type!r} has no paged forward")
        self.stop_ids = [int(t) for t in stop_ids]
        self.seed = seed
        self.decode_fn = decode_attention
        self.broken: str | None = None  # why the engine cannot serve (its pool was lost and not rebuilt)
        self.stats = dict(prefill_tokens=0, prefill_calls=0, decode_calls=0, decode_steps=0, slot_steps_used=0,
                          slot_steps_offered=0, evictions=0, recomputed=0, rolled_back=0, reused_tokens=0,
                          rebuilds=0, pages_peak=0)
        self.pool = PagePool(config, self.ec, self.stats, mesh)
        self.replicas = self.pool.replicas  # data-parallel replicas, each with ec.slots slots and its own pool
        self._calls = 0
        self._lock = threading.RLock()  # envs on worker threads may share one engine (calls are serialised)
        self._submit_lock, self._serial_lock = threading.Lock(), threading.Lock()
        self._inbox: deque = deque()  # submitted requests not yet seen by the scheduler (any thread appends)
        self._waiting: list[EngineRequest] = []  # seen, waiting for a slot (FIFO)
        self._slots: list[EngineRequest | None] = [None] * self.num_slots  # replica k: k * ec.slots ..
        self._wake = threading.Event()  # set by submit / cancel: an EngineLoop waiting for work wakes up
        self._submitted = 0
        self._serial = 0
        self._warmed: set[int] = set()  # sampling filters every program is compiled for (EngineConfig.precompile)

    @property
    def lock(self):
        """The lock every engine call holds (re-entrant): a caller whose own state must move together with an
        engine call (EngineGenerator's call counter and seeds) holds it around both."""
        return self._lock

    @property
    def params(self):
        return self._params

    @params.setter
    def params(self, params) -> None:
        """New weights; with a mesh they are placed as models.shard_params says (tensor-parallel heads, MLP and
        vocab on the tensor axis, embed on fsdp)."""
        self._params = params if self.mesh is None else models.shard_params(self.config, params, self.mesh)

    @contextlib.contextmanager
    def _on_mesh(self):
        """The context the programs run in, from dispatch to their fetched outputs: the engine's mesh made current
        (XLA partitions them by the params' and pool's shardings and the activation rules) and the one-program-
        on-a-mesh-at-a-time lock the static sampler takes (`sampler._MESH_LOCK`: two multi-device programs
        enqueued from two threads in different orders could wait on each other's collectives -- another engine,
        a sampler, or an RL update beside asynchronous rollouts, train/rl/async_rollouts.py); nothing without a
        mesh."""
        if self.mesh is None:
            yield
            return
        with sampler._MESH_LOCK, sharding.use_mesh(self.mesh):
            yield

    def _new_pools(self) -> None:
        """A fresh KV pool (and Qwen3.5 state slots), every page and slot free, no dialogue cached."""
        self.pool.reset()

    def _cache_lost(self) -> bool:
        return self.pool.lost()

    def _recover(self) -> None:
        """After a failed program call: when its donated pool was lost, a new pool and state slots (every cached
        dialogue is forgotten: it is recomputed when it returns). If that fails too (e.g. the memory is still
        taken), `broken` says why: the engine refuses work (EngineError) and `serve`'s /health answers 503
        until a later submit rebuilds it."""
        if self.broken is None and not self._cache_lost():
            return
        try:
            self._new_pools()
        except Exception as e:  # noqa: BLE001 -- reported through `broken`
            self.broken = (f"the rollout engine lost its KV pool in a failed program call and could not rebuild "
                           f"it ({type(e).__name__}: {e})")
            log.error("%s", self.broken)
            return
        self.broken = None
        self.stats["rebuilds"] += 1
        log.warning("rollout engine: a failed program call lost the KV pool; rebuilt a fresh pool")

    def _check_healthy(self) -> None:
        if self.broken is not None:
            with self._lock:
                self._recover()
            if self.broken is not None:
                raise EngineError(self.broken)

    # ------------------------------------------------------------------------------------ pools
    @property
    def max_len(self) -> int:
        return self.ec.max_pages_per_seq * self.ec.page_size

    def pages_in_use(self) -> int:
        return self.pool.pages_in_use()

    def release(self, key) -> None:
        """Forgets dialogue `key` (the episode ended or was cancelled): its pages and state slot are freed."""
        with self._lock:
            self.pool.release(key)

    def release_all(self) -> None:
        """Forgets every dialogue, and the replica assignments of evicted ones."""
        for key in list(self.pool.dialogues):
            self.release(key)
        with self._lock:
            for key in [k for k in self.pool.home if k not in self.pool.dialogues]:
                del self.pool.home[key]

    @property
    def num_slots(self) -> int:
        """Decode slots over all replicas (ec.slots each)."""
        return self.replicas * self.ec.slots

    @staticmethod
    def _key(r: EngineRequest):
        return r.key if r.key is not None else ("__anon__", r.serial)

    def _admit(self, r: EngineRequest, slot: int, running_here: bool) -> bool:
        """Gives r its dialogue's pages (and state slot) for prompt + max_new and the slot (one of its replica's);
        False = wait for a request running on that replica to free pages (page_pool: admission control)."""
        key = self._key(r)
        d = r.dialogue = self.pool.open(key, r.prompt, r.index)
        cp = self._checkpoint(r)
        try:
            ok = self.pool.reserve(d, len(r.prompt) + r.max_new - 1, r.index, running_here)
        except EngineError:
            ok = False
            raise
        finally:
            if not ok:
                self.pool.drop_if_empty(key)
        if not ok:
            return False
        self.pool.touch(key)
        self.stats["reused_tokens"] += len(d.tokens)  # once per admitted request (a waiting one retries open)
        self.stats["rolled_back"] += d.rolled_back
        d.rolled_back = False
        self.pool.restore_if_due(d)
        r.checkpoint = cp if cp > len(d.tokens) and self.pool.take_snapshot_slot(d) else -1
        r.pos = len(d.tokens)
        r.pending = r.prompt[r.pos:]
        r.slot = slot
        return True

    def _checkpoint(self, r: EngineRequest) -> int:
        """Where r's dialogue snapshots its state (EngineConfig.checkpoint; -1 = none): Qwen3.5 requests with a
        dialogue key only (an anonymous dialogue is released when its request ends)."""
        if not self.pool.has_state or self.ec.checkpoint == "off" or r.key is None:
            return -1
        if self.ec.checkpoint == "turn":  # after the prompt's last stop id, found from its end
            for i in range(len(r.prompt) - 1, -1, -1):
                if r.prompt[i] in r.stops:
                    return i + 1
        return len(r.prompt)

    def _copy_states(self) -> None:
        """Runs the state-slot copies the pool queued (snapshots, restores): engine_programs.copy_state_program,
        prefill_rows rows per replica (a prefill round's snapshots in one call; its gather holds that many slots)."""
        for src, dst in self.pool.copy_rows(self.ec.prefill_rows):
            with self._on_mesh():
                self.pool.cache = engine_programs.copy_state_program(self.config, self.pool.cache, src, dst)

    def _finish(self, r: EngineRequest, reason: str) -> None:
        r.finish = reason
        d = r.dialogue
        self.pool.keep(d, r.prompt + r.out[:-1])  # the last sampled token was never fed to the model
        if r.key is None:
            self.pool.release(d.key)

    def _drop(self, r: EngineRequest, reason: str, error: str | None = None) -> None:
        """Ends r without a (further) token: cancelled or failed. Its dialogue is forgotten (its cache may hold
        a half-written turn), its slot freed, and its callback told (token None)."""
        d = r.dialogue
        if d is not None:
            d.busy = False
            self.pool.release(d.key)
        elif r.key is None:
            self.pool.home.pop(self._key(r), None)
        if 0 <= r.slot < len(self._slots) and self._slots[r.slot] is r:
            self._slots[r.slot] = None
        r.finish, r.error = reason, error
        self._notify(r, None, None)

    @staticmethod
    def _notify(r: EngineRequest, tok, lp) -> None:
        if r.on_token is not None:
            r.on_token(r, tok, lp)

    # ------------------------------------------------------------------------------------ the API
    def generate_tokens(self, prompts: Sequence[Sequence[int]], *, keys: Sequence | None = None, max_tokens=256,
                        temperature=1.0, top_p=1.0, top_k=0, seed=None, stop_ids=None,
                        logprob_temperature: str | float = "sampling") -> list[Sample]:
        """Samples a continuation of every prompt (see the module docstring); settings as `sampler.generate`.

        keys: one dialogue key per prompt (None entries or keys=None: stateless requests). Returns one Sample
        per prompt, in order (tokens through the stop id, log-probs at the request's temperature). Requests
        submitted from other threads (`submit`) share the slots meanwhile."""
        self._check_healthy()
        with self._lock:
            reqs = self._requests(prompts, keys, max_tokens, temperature, top_p, top_k, seed, stop_ids,
                                  logprob_temperature)
            if not reqs:
                return []
            if self.ec.precompile:
                for f in sorted({self._filtering([r]) for r in reqs} - self._warmed):
                    self.warmup(f)
                    self._warmed.add(f)
            self._calls += 1
            self._inbox.extend(reqs)
            try:
                while any(r.finish is None for r in reqs):
                    self._step()
                    bad = next((r for r in reqs if r.finish == "error"), None)
                    if bad is not None:  # the call fails as a whole: its other requests end too
                        for r in reqs:
                            if r.finish is None:
                                self._drop(r, "cancelled")
                        self._waiting[:] = [w for w in self._waiting if w.finish is None]
                        raise bad.exception
            except BaseException as e:
                if not any(r.exception is e for r in reqs):
                    self._fail_all(e)
                raise
            return [r.sample() for r in reqs]

    def submit(self, prompt: Sequence[int], *, key=None, max_tokens=256, temperature=1.0, top_p=1.0, top_k=0,
               seed=None, stop_ids=None, logprob_temperature: str | float = "sampling",
               on_token=None) -> EngineRequest:
        """Queues one request and returns its handle at once (any thread; the request is validated here, so a
        bad one raises ValueError / EngineError now). It joins the running batch at the next scheduler round:
        whoever drives the scheduler (`step`, `run_until_idle`, a `generate_tokens` call, or an `EngineLoop`)
        runs it alongside everything else. Settings as `generate_tokens` for one prompt; `on_token` see
        EngineRequest. seed=None: one derived from (engine seed, submission count). A broken engine (`broken`)
        raises EngineError."""
        self._check_healthy()
        with self._submit_lock:
            if seed is None:
                seed = [derive_seed(self.seed, 1 << 40, self._submitted)]
            elif not isinstance(seed, (list, tuple, np.ndarray)):
                seed = [seed]
            (r,) = self._requests([prompt], None if key is None else [key], max_tokens, temperature, top_p, top_k,
                                  seed, stop_ids, logprob_temperature, first_index=self._submitted)
            self._submitted += 1
            r.on_token = on_token
            self._inbox.append(r)
        self._wake.set()
        return r

    def cancel(self, r: EngineRequest) -> None:
        """Asks the scheduler to end `r` (any thread): at its next round r finishes "cancelled", its slot and
        pages are freed and its dialogue forgotten. No effect on a finished request."""
        r.cancelled = True
        self._wake.set()

    def has_work(self) -> bool:
        return bool(self._inbox) or bool(self._waiting) or any(s is not None for s in self._slots)

    def step(self) -> bool:
        """One scheduler round (admission, one prefill chunk, one burst of decode steps); returns has_work().
        A failing program call ends every queued and running request with finish "error" and re-raises."""
        with self._lock:
            try:
                self._step()
            except BaseException as e:
                self._fail_all(e)
                raise
            return self.has_work()

    def cancel_all(self) -> None:
        """Ends every queued and running request with finish "cancelled" (their dialogues are forgotten)."""
        with self._lock:
            self._end_all("cancelled")

    def run_until_idle(self) -> None:
        while self.step():
            pass

    def _fail_all(self, e: BaseException) -> None:
        self.pool.copies = []
        self._end_all("error", f"{type(e).__name__}: {e}")
        self._slots = [None] * self.num_slots
        self._recover()

    def _end_all(self, reason: str, error: str | None = None) -> None:
        """Ends every queued and running request with finish `reason` (their dialogues are forgotten)."""
        while self._inbox:
            self._waiting.append(self._inbox.popleft())
        for r in [s for s in self._slots if s is not None] + self._waiting:
            if r.finish is None:
                self._drop(r, reason, error)
        self._waiting.clear()

    def _requests(self, prompts, keys, max_tokens, temperature, top_p, top_k, seed, stop_ids, logprob_temperature,
                  first_index: int = 0) -> list[EngineRequest]:
        """Validated requests (`engine_requests.make_requests`; errors name the request by its index in the call)."""
        return make_requests(prompts, keys, max_tokens, temperature, top_p, top_k, seed, stop_ids,
                             logprob_temperature, ec=self.ec, vocab_size=self.config.vocab_size,
                             default_stops=self.stop_ids, engine_seed=self.seed, call=self._calls,
                             next_serial=self._next_serial, first_index=first_index)

    def _next_serial(self) -> int:
        with self._serial_lock:
            self._serial += 1
            return self._serial


    # ------------------------------------------------------------------------------------ scheduling
    def _samp(self, rows: list[EngineRequest | None]):
        def col(f, fill, dtype):
            return np.asarray([f(r) if r is not None else fill for r in rows], dtype)
        return (col(lambda r: r.seed, 0, np.uint32), col(lambda r: r.salt, 0, np.uint32),
                col(lambda r: r.temperature, 0.0, np.float32), col(lambda r: r.lp_temperature, 1.0, np.float32),
                col(lambda r: r.top_k, 0, np.int32), col(lambda r: r.top_p, 1.0, np.float32))

    def _filtering(self, rows: list[EngineRequest | None]):
        """The static sampling-filter setting of a program call over `rows`: the top-k candidate count the rows
        need (`sampler.candidate_count`). It is exact for every row (a row's filtered logits do not depend on a
        larger count), so a request draws the same tokens whatever shares its batch."""
        live = [r for r in rows if r is not None]
        return sampler.candidate_count([r.top_k for r in live], [r.top_p for r in live], self.config.vocab_size)

    def table_widths(self) -> list[int]:
        """The page-table widths programs are compiled for: 8, 16, 32, then steps of 1.5x and 4/3 (48, 64, 96,
        128, 192, ...) up to max_pages_per_seq (and it). Attention work grows with the width, so finer steps
        above 32 pages (where it dominates a step) waste less on rounding up."""
        w, out = 8, []
        while w < self.ec.max_pages_per_seq:
            out.append(w)
            w = 2 * w if w < 32 else (w * 3 // 2 if w & (w - 1) == 0 else w * 4 // 3)
        return out + [self.ec.max_pages_per_seq]

    def prefill_row_counts(self) -> list[int]:
        """The row counts prefill programs are compiled for: powers of two below prefill_rows, and it. A request
        joining a running batch is usually prefilled alone, and a [1, C] chunk costs about a quarter of [4, C]."""
        r, out = 1, []
        while r < self.ec.prefill_rows:
            out.append(r)
            r *= 2
        return out + [self.ec.prefill_rows]

    def _table(self, rows: list[EngineRequest | None]) -> np.ndarray:
        return self.pool.table([r.dialogue.pages if r is not None else None for r in rows], self.table_widths())

    def _record(self, r: EngineRequest, tok: int, lp: float) -> None:
        r.out.append(int(tok))
        r.lps.append(float(lp))
        if int(tok) in r.stops:
            self._finish(r, "stop")
        elif len(r.out) >= r.max_new:
            self._finish(r, "length")
        self._notify(r, int(tok), float(lp))

    def _step(self) -> None:
        """One round: new and cancelled requests, FIFO admission into free slots, one prefill chunk, one decode
        burst (see the module docstring)."""
        self._take_new_and_cancelled()
        self._admit_waiting()
        self._copy_states()  # restores of the dialogues just admitted, before their prefill
        self._prefill_round()
        self._decode_round()

    def _take_new_and_cancelled(self) -> None:
        """Moves submitted requests to the waiting queue and ends the cancelled ones."""
        slots, waiting = self._slots, self._waiting
        while self._inbox:
            waiting.append(self._inbox.popleft())
        for r in [s for s in slots if s is not None and s.cancelled] + [w for w in waiting if w.cancelled]:
            if r.finish is None:
                self._drop(r, "cancelled")
        waiting[:] = [w for w in waiting if w.finish is None]

    def _admit_waiting(self) -> None:
        """FIFO admission, per replica, into the replica's free slots: a request waits while an earlier one of
        its replica waits (no slot, or its pages are held by running requests); a request that can never be
        admitted ends alone with finish "error"."""
        slots, waiting, S = self._slots, self._waiting, self.ec.slots
        blocked: set[int] = set()
        i = 0
        while i < len(waiting) and len(blocked) < self.replicas:
            w = waiting[i]
            k = self.pool.replica_of(self._key(w))
            mine = range(k * S, (k + 1) * S)
            free = next((si for si in mine if slots[si] is None), None)
            if k in blocked or free is None:
                blocked.add(k)
                i += 1
                continue
            try:
                ok = self._admit(w, free, any(slots[si] is not None for si in mine))
            except (EngineError, ValueError) as e:
                waiting.pop(i)
                w.exception = e
                self._drop(w, "error", str(e))
                continue
            if not ok:
                blocked.add(k)
                i += 1
                continue
            slots[free] = waiting.pop(i)

    def _prefill_rows(self) -> list[EngineRequest | None]:
        """This round's prefill rows: per replica up to prefill_rows requests with prompt tokens pending, each
        replica's block padded (None) to the smallest prefill row count holding the fullest block."""
        S = self.ec.slots
        per = [[r for r in self._slots[k * S:(k + 1) * S] if r is not None and r.pending][:self.ec.prefill_rows]
               for k in range(self.replicas)]
        most = max(len(p) for p in per)
        if not most:
            return []
        R = next(n for n in self.prefill_row_counts() if n >= most)
        return [r for p in per for r in p + [None] * (R - len(p))]

    def _prefill_round(self) -> None:
        """One prefill chunk of up to prefill_rows requests per replica with prompt tokens pending; a request
        whose prompt ends in it records its first sampled token."""
        slots, C = self._slots, self.ec.prefill_chunk
        rows = self._prefill_rows()
        if not rows:
            return
        B = len(rows)
        tokens = np.zeros((B, C), np.int32)
        starts = np.zeros((B,), np.int32)
        nval = np.zeros((B,), np.int32)
        sslots = np.zeros((B,), np.int32)
        for i, r in enumerate(rows):
            if r is None:
                continue
            chunk = r.pending[:C if r.checkpoint <= r.pos else min(C, r.checkpoint - r.pos)]
            tokens[i, :len(chunk)] = chunk
            starts[i], nval[i], sslots[i] = r.pos, len(chunk), r.dialogue.state
        pool = self.pool
        with self._on_mesh():
            pool.cache, tok, lp = engine_programs.prefill_program(
                self.config, self._filtering(rows), self.decode_fn, self.params, pool.cache, tokens, starts, nval,
                self._table(rows), sslots, self._samp(rows))
            tok, lp = jax.device_get((tok, lp))
        self.stats["prefill_calls"] += 1
        self.stats["prefill_tokens"] += int(nval.sum())
        for i, r in enumerate(rows):
            if r is None:
                continue
            r.pos += int(nval[i])
            r.pending = r.pending[int(nval[i]):]
            if r.pos == r.checkpoint:
                pool.snapshot(r.dialogue, r.prompt[:r.pos])
        self._copy_states()  # the snapshots of this chunk, before a decode burst moves the states on
        for i, r in enumerate(rows):
            if r is None:
                continue
            if not r.pending:
                self._record(r, tok[i], lp[i])
                if r.finish:
                    slots[r.slot] = None

    def _decode_inputs(self, dec: list[EngineRequest | None]):
        """The per-row arguments of a decode burst over `dec` (one per slot; None = idle)."""
        tok = np.asarray([r.out[-1] if r else 0 for r in dec], np.int32)
        pos = np.asarray([r.pos if r else 0 for r in dec], np.int32)
        live = np.asarray([r is not None for r in dec])
        sslots = np.asarray([r.dialogue.state if r else 0 for r in dec], np.int32)
        steps = np.asarray([len(r.out) if r else 0 for r in dec], np.int32)
        remaining = np.asarray([r.max_new - len(r.out) if r else 1 for r in dec], np.int32)
        ns = sampler.Buckets().stops(max(len(r.stops) for r in dec if r))
        stop_arr = np.full((len(dec), ns), -1, np.int32)
        for i, r in enumerate(dec):
            if r is not None and r.stops:
                stop_arr[i, :len(r.stops)] = r.stops
        return (tok, pos, live, self._table(dec), sslots, self._samp(dec), steps, remaining, stop_arr)

    def _decode_round(self) -> None:
        """A burst of decode steps of every decoding slot (each replica's burst ends on its own). Prefill goes
        first: while prompts are pending, decode runs only when at least half the slots can use it."""
        slots, S = self._slots, self.ec.slots
        dec = [r if (r is not None and not r.pending and r.finish is None) else None for r in slots]
        n_dec = sum(r is not None for r in dec)
        prefilling = any(r is not None and r.pending for r in slots)
        if not n_dec or (prefilling and 2 * n_dec < len(slots)):
            return
        stop_early = bool(self._waiting) or bool(self._inbox) or prefilling
        pool = self.pool
        with self._on_mesh():
            pool.cache, out_tok, out_lp, count, _, n_run = engine_programs.decode_program(
                self.config, self._filtering(dec), self.decode_fn, self.ec.decode_steps, self.params, pool.cache,
                *self._decode_inputs(dec), np.bool_(stop_early))
            out_tok, out_lp, count, n_run = jax.device_get((out_tok, out_lp, count, n_run))
        self.stats["decode_calls"] += 1
        self.stats["decode_steps"] += int(np.max(n_run))
        self.stats["slot_steps_offered"] += int(np.sum(n_run)) * S
        self.stats["slot_steps_used"] += int(count.sum())
        for i, r in enumerate(dec):
            if r is None:
                continue
            for j in range(int(count[i])):
                r.pos += 1
                self._record(r, out_tok[i, j], out_lp[i, j])
            if r.finish:
                slots[i] = None

    def warmup(self, filtering: int = 0) -> None:
        """Compiles the prefill and decode programs for every page-table width and prefill row count with
        all-idle batches (which write only the trash page / slot), so that timed runs exclude compilation.
        `filtering`: the requests' candidate count (`sampler.candidate_count`; 0 = no top-k / top-p). It is a
        static argument matched by type as well as value, so it is normalised to the int `_filtering` passes
        (a bool False would compile programs no call uses)."""
        filtering = int(filtering)
        with self._on_mesh():
            self._warmup(filtering)
            jax.block_until_ready(self.pool.cache)

    def decode_args(self, width: int, filtering: int = 0) -> tuple:
        """The arguments of an all-idle decode burst over page tables `width` wide (warmup; what a test lowers
        to read the compiled program's memory_analysis)."""
        ec, S = self.ec, self.num_slots
        zs = np.zeros((S,), np.int32)
        return (self.config, int(filtering), self.decode_fn, ec.decode_steps, self.params, self.pool.cache, zs, zs,
                np.zeros((S,), bool), np.zeros((S, width), np.int32), zs, self._samp([None] * S), zs, zs + 1,
                np.full((S, sampler.Buckets().stops(0)), -1, np.int32), np.bool_(False))

    def _warmup(self, filtering: int) -> None:
        ec, pool = self.ec, self.pool
        for w in self.table_widths():
            for R in self.prefill_row_counts():
                R *= self.replicas
                pool.cache, tok, _ = engine_programs.prefill_program(
                    self.config, filtering, self.decode_fn, self.params, pool.cache,
                    np.zeros((R, ec.prefill_chunk), np.int32), np.zeros((R,), np.int32), np.zeros((R,), np.int32),
                    np.zeros((R, w), np.int32), np.zeros((R,), np.int32), self._samp([None] * R))
            pool.cache, *_ = engine_programs.decode_program(*self.decode_args(w, filtering))
        if pool.has_state:
            zs = np.zeros((self.replicas * ec.prefill_rows,), np.int32)
            pool.cache = engine_programs.copy_state_program(self.config, pool.cache, zs, zs)


class EngineLoop:
    """Runs a RolloutEngine's scheduler on a background thread, so that requests `submit`ted from any thread
    (e.g. an HTTP server's handlers, one per choice) join the running batch as slots free -- continuous batching
    across calls -- and their `on_token` callbacks fire as each decode burst returns. The thread sleeps while the
    engine has no work. `close()` stops it; requests still queued or running end with finish "cancelled".
    A failed program call ends the requests in flight with finish "error" (their callbacks say why) and the loop
    goes on serving new ones."""

    def __init__(self, engine: RolloutEngine, *, name: str = "mimesis-engine-loop"):
        self.engine = engine
        self._stop = threading.Event()
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, prompt, **kwargs) -> EngineRequest:
        if self._stop.is_set():
            raise EngineError("the engine loop is closed")
        return self.engine.submit(prompt, **kwargs)

    def _run(self) -> None:
        eng = self.engine
        while not self._stop.is_set():
            eng._wake.clear()  # noqa: SLF001 -- cleared before looking, so a submit after the look wakes us
            if not eng.has_work():
                eng._wake.wait(1.0)  # noqa: SLF001
                continue
            try:
                eng.step()
            except Exception:  # noqa: BLE001 -- the requests in flight were ended with "error"; keep serving
                self.failures += 1
                log.exception("rollout engine step failed")

    def close(self) -> None:
        self._stop.set()
        self.engine._wake.set()  # noqa: SLF001
        self._thread.join(timeout=60)
        self.engine.cancel_all()
