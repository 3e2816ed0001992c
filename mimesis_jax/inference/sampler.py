"""Batched autoregressive sampling with the KV cache / recurrent state of either model family.

    samples = generate(config, params, prompts, max_new_tokens=64, temperature=1.0, top_p=0.95,
                       stop_ids=(im_end_id,), seed=0, mesh=mesh)
    samples[i].tokens    # generated ids, through the stop token when one was produced
    samples[i].logprobs  # log pi_T(token | prefix) at the request's sampling temperature T (unfiltered)

How a call runs
* **Buckets.** The batch is padded up to a batch bucket (a power of two, and a multiple of the mesh's batch
  shards), the longest prompt up to a prompt bucket (a power of two, then multiples of `prompt_step`) and
  max_new_tokens up to a power of two. One compiled program serves every call that falls in the same bucket
  (`trace_count()` counts compilations, for tests). Filler rows are marked finished from the start.
  `Buckets.fixed(batch, longest_prompt, new_tokens)` puts every call within those bounds in ONE program (the
  simulator RL loop's policy: prompts padded to the longest its context budget allows); `Buckets.ladder(batch,
  prompt_rungs, new_tokens)` in one program per prompt rung (the agent RL loop's policy). A longer prompt falls
  back to the default prompt ladder (one more program).
* **Left padding.** The KV cache is written at one shared slot index for all rows, so shorter prompts are
  LEFT-padded with segment id 0 (never attended; for Qwen3.5 never folded into the recurrent state) while each
  row's positions are its own: 0..len-1 for the prompt, then len, len+1, ... for generated tokens.
* **Chunks** (`max_batch` > 0): at most that many sequences per compiled call; the prompts run in consecutive
  chunks, each bucketed on its own, and the samples equal those of one call (per-row keys, below, use the
  row's global index). What bounds the rollout phase's KV cache and prefill memory (see plan/memory.py).
* **Prefill** is one `models.extend` over the padded prompts; **decoding** is a `lax.while_loop` of one-token
  `extend` calls that stops as soon as every row is finished (a stop id or its own max_new_tokens).
* **Sampling** per row, from fp32 logits of the last position ([B, V], never [B, T, V]):
  temperature 0 = greedy (argmax); otherwise logits / temperature, then top-k (0 = off), then top-p (nucleus:
  the smallest prefix of the sorted distribution whose mass reaches p; 1.0 = off), then a categorical draw
  (jax.random.categorical's Gumbel-max, written out: greedy rows share its single argmax over V, taken as a max
  and a first-index min, `first_argmax`, which XLA vectorises where its (value, index) argmax reduce is not).
  Tokens tied with the top-k / top-p threshold logit are kept. No step sorts the vocabulary for top-k: the
  candidates come from `lax.top_k` with a static count (the largest requested k rounded up to a power of two,
  at least 64: `candidate_count`), each row masks beyond its own k, and top-p runs over those candidates. A request with
  top_k off but top_p < 1 needs the whole ordering, so a call holding one takes all V candidates (a full sort,
  exact; no probability mass is dropped).
* **Log-probs** (`logprob_temperature`). By default ("sampling") the returned log-prob of a token is
  log_softmax(logits / T)[token] at the request's own temperature T (T = 1 for a greedy request, T == 0): the
  policy pi_T = softmax(logits / T) is the one the RL update must score (RLConfig.temperature = T), so that the
  ratio pi_theta / pi_old of Eq 5 compares the same policy at the same temperature. They are NOT filtered by
  top-k / top-p: the update scores full distributions (a vocab-chunked log-softmax, never a sorted, truncated
  one), and an old log-prob from a renormalised nucleus would bias every ratio by the nucleus mass.
  A float (e.g. 1.0, the former behaviour) scores every request at that temperature instead.
* **Per-request settings.** `max_new_tokens`, `temperature`, `top_p`, `top_k` and `seed` take a scalar (shared)
  or a sequence with one value per prompt; `stop_ids` takes a sequence of ints (shared) or a sequence of
  sequences (per prompt).
* **Randomness.** Row r draws step s with key fold_in(row_key_r, s). With an int `seed`, row_key_r =
  fold_in(key(seed), r): rows differ (GRPO groups repeat one prompt). With a list of seeds, row_key_r =
  fold_in(key(seeds[r]), 0): a request's samples then do not depend on what else is in the batch, so one-by-one
  and batched generation agree. Same seeds, same samples.
* **Sharding.** With a mesh, the params must already be on it, laid out as `models.shard_params` lays them out
  (what `StaticGenerator.set_params`, `distributed.rollout_params` and `models.init_params(..., mesh)` give): the
  sampler does not place them again on every call (a tree walk and a device_put per leaf); params elsewhere are
  refused with a ValueError. Inputs are split over the batch mesh axes, the cache follows `models.cache_axes`,
  and the program runs under `sharding.use_mesh(mesh)`. Calls on a mesh from several threads (the RL loops'
  simulator and judge samplers, each behind its own batching thread) run one at a time (`_MESH_LOCK`, held from
  dispatch to the fetched outputs): two multi-device programs enqueued in different orders on different devices
  could wait on each other's collectives.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from mimesis_jax import models, sharding
from mimesis_jax.inference.protocol import Sample
from mimesis_jax.models.config import ModelConfig

_TRACES = {"count": 0}
_CALL_SHAPES: set = set()  # (batch, prompt, new tokens, stops, filtering) of every generate_bucket call
MIN_CANDIDATES = 64  # the fewest top-k candidates a filtering program takes: top_k 1..64 share one program


@dataclasses.dataclass(frozen=True)
class Buckets:
    """Shape buckets: shapes are rounded up so that a compiled program is reused across calls."""

    min_batch: int = 1
    min_prompt: int = 16
    prompt_step: int = 1024  # beyond this length prompts round up to a multiple of it, not a power of two
    min_new: int = 8
    min_stops: int = 4
    prompt_rungs: tuple[int, ...] = ()  # ascending: a prompt of at most the last pads to the smallest >= it

    @classmethod
    def fixed(cls, batch: int, longest_prompt: int, new_tokens: int) -> "Buckets":
        """Buckets putting every call of at most `batch` sequences, prompts of at most `longest_prompt` tokens
        and at most `new_tokens` new tokens in one program: batch and new tokens on their usual ladders from
        those maxima, prompts padded to `longest_prompt` itself (an RL loop whose runner bounds every prompt by
        its context budget: train/rl/learner.py `RLLearner.policy_buckets`)."""
        return cls.ladder(batch, (longest_prompt,), new_tokens)

    @classmethod
    def ladder(cls, batch: int, prompt_rungs, new_tokens: int) -> "Buckets":
        """`fixed` with several prompt lengths: a call of at most `batch` sequences and `new_tokens` new tokens
        pads to those maxima (each rounded up to a power of two) and its longest prompt to the smallest of
        `prompt_rungs` that holds it, so at most len(prompt_rungs) programs serve the run (Stage II:
        chat_models.ladder_buckets)."""
        rungs = tuple(sorted({int(x) for x in prompt_rungs}))
        if not rungs or rungs[0] < 1:
            raise ValueError(f"Buckets.ladder: prompt_rungs must be lengths >= 1, got {prompt_rungs!r}")
        return cls(min_batch=_next_pow2(batch), min_new=_next_pow2(new_tokens), prompt_rungs=rungs)

    def batch(self, n: int, multiple: int = 1) -> int:
        b = max(self.min_batch, _next_pow2(n))
        return int(math.ceil(b / multiple) * multiple)

    def prompt(self, n: int) -> int:
        if self.prompt_rungs and n <= self.prompt_rungs[-1]:
            return next(r for r in self.prompt_rungs if r >= n)
        if n <= self.prompt_step:
            return max(self.min_prompt, _next_pow2(n))
        return int(math.ceil(n / self.prompt_step) * self.prompt_step)

    def new_tokens(self, n: int) -> int:
        return max(self.min_new, _next_pow2(n))

    def stops(self, n: int) -> int:
        return max(self.min_stops, _next_pow2(max(n, 1)))


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def trace_count() -> int:
    """How many times the bucketed generation program has been traced (compiled) in this process."""
    return _TRACES["count"]


def call_shapes() -> set:
    """The bucketed shapes (batch, prompt, new tokens, stops, candidate count) `generate_bucket` has been called with
    in this process (the rehearse command compiles each again to read its memory)."""
    return set(_CALL_SHAPES)


# ----------------------------------------------------------------------------------------- sampling
def candidate_count(top_k: Sequence[int], top_p: Sequence[float], vocab_size: int) -> int:
    """The static number of top candidates `filter_logits` needs for these requests (0: no filtering at all).

    The largest requested k rounded up to a power of two and to at least `MIN_CANDIDATES` (so that nearby k
    share a compiled program), at most the vocabulary. A request with top_k off (0) but top_p < 1 orders the whole vocabulary: then the count is the
    vocabulary (`lax.top_k` over V, a full sort, kept only for that case so that the nucleus is exact).
    """
    ks = [int(k) for k in top_k]
    ps = [float(p) for p in top_p]
    if any(k <= 0 and p < 1.0 for k, p in zip(ks, ps)):
        return int(vocab_size)
    if not any(k > 0 for k in ks):
        return 0
    return min(max(MIN_CANDIDATES, _next_pow2(max(ks))), int(vocab_size))


def filter_logits(logits: jax.Array, top_k: jax.Array, top_p: jax.Array, k_max: int | None = None) -> jax.Array:
    """Top-k then top-p (nucleus) filtering of [B, V] logits; filtered entries become -inf.

    top_k [B] int (<= 0 keeps all), top_p [B] float (>= 1 keeps all). Ties with a threshold logit are kept.
    The candidates are the `k_max` (static; default V) largest logits of each row from `lax.top_k`, never a sort of
    the whole vocabulary: a row's k is min(top_k, k_max), its nucleus is the shortest prefix of those candidates
    whose renormalised mass reaches top_p, and every logit >= the last kept candidate survives. Exact when
    k_max >= every row's top_k and k_max = V for rows with top_k off but top_p < 1 (`candidate_count` picks that);
    with a smaller k_max such a row's mass beyond the k_max candidates is dropped. Rows with both filters off pass
    through unchanged.
    """
    V = logits.shape[-1]
    C = V if k_max is None else max(1, min(int(k_max), V))
    cand, _ = jax.lax.top_k(logits, C)  # [B, C], descending
    k = jnp.where(top_k <= 0, C, jnp.minimum(top_k, C))
    in_k = jnp.arange(C)[None, :] < k[:, None]
    probs = jax.nn.softmax(jnp.where(in_k, cand, -jnp.inf), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = in_k & ((mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0))
    n_keep = jnp.maximum(jnp.sum(keep, axis=-1), 1)
    threshold = jnp.take_along_axis(cand, (n_keep - 1)[:, None], axis=-1)
    off = (top_k <= 0) & (top_p >= 1.0)
    return jnp.where(off[:, None] | (logits >= threshold), logits, -jnp.inf)


def first_argmax(x: jax.Array) -> jax.Array:
    """jnp.argmax(x, -1) of finite-or-(-inf) rows [B, V] (the first index of the row maximum), as a max and then a
    min over the indices where x equals it: two plain reductions, which XLA vectorises, instead of argmax's
    (value, index) pair reduction (docs/benchmarks.md: quicker on a CPU). A row holding NaN gives index V - 1."""
    m = jnp.max(x, axis=-1, keepdims=True)
    idx = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    first = jnp.min(jnp.where(x == m, idx, x.shape[-1]), axis=-1)
    return jnp.minimum(first, x.shape[-1] - 1).astype(jnp.int32)


def choose_tokens(logits: jax.Array, keys: jax.Array, temperature: jax.Array, top_k: jax.Array,
                  top_p: jax.Array, filtering: int, logprob_temperature: jax.Array | None = None
                  ) -> tuple[jax.Array, jax.Array]:
    """Picks one token per row from fp32 logits [B, V]; returns (tokens [B], log-probs [B]).

    `filtering` (static): 0 / False samples the full distribution; otherwise the top-k / top-p candidate count
    of `filter_logits` (True = the whole vocabulary; `candidate_count` gives the smallest exact one).
    The log-prob is log_softmax(logits / logprob_temperature)[token], unfiltered; logprob_temperature [B]
    defaults to the sampling temperature (1 where a row is greedy).
    """
    logits = logits.astype(jnp.float32)
    if logprob_temperature is None:
        logprob_temperature = jnp.where(temperature > 0.0, temperature, 1.0)
    scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
    if filtering:
        scaled = filter_logits(scaled, top_k, top_p, None if filtering is True else int(filtering))
    # The Gumbel-max draw of jax.random.categorical(key, scaled) written out (the same noise, the same sum, the
    # same argmax: the same tokens), so that greedy rows share its one argmax over V (of the raw logits where
    # temperature is 0) instead of a second pass over the vocabulary; a batch with no sampled row draws no noise.
    greedy = (temperature <= 0.0)[:, None]

    def draw():
        gumbel = jax.vmap(lambda k: jax.random.gumbel(k, logits.shape[-1:], jnp.float32))(keys)
        return first_argmax(jnp.where(greedy, logits, gumbel + scaled))

    tok = jax.lax.cond(jnp.all(greedy), lambda: first_argmax(logits), draw)
    lsm = jax.nn.log_softmax(logits / logprob_temperature[:, None], axis=-1)
    lp = jnp.take_along_axis(lsm, tok[:, None], axis=-1)[:, 0]
    return tok, lp


# ------------------------------------------------------------------------------------- the program
def _constrain_cache(config: ModelConfig, cache):
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return cache
    is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x)  # noqa: E731
    return jax.tree.map(lambda axes, x: sharding.constrain(x, axes, config), models.cache_axes(config), cache,
                        is_leaf=is_axes)


_MESH_LOCK = threading.Lock()  # one sampler program on a mesh at a time (module docstring, Sharding)
_CANCEL: dict[int, np.ndarray] = {}  # call id -> bool [rows]: rows whose caller went away (set from any thread)
_CANCEL_IDS = iter(range(1, 1 << 31))
CANCEL_CHECK_EVERY = 4  # decode steps between looks at the cancel flags (one host callback each)


def _cancelled_rows(call_id, n_rows: int) -> np.ndarray:
    flags = _CANCEL.get(int(call_id))
    out = np.zeros((n_rows,), bool)
    if flags is not None:
        k = min(n_rows, len(flags))
        out[:k] = flags[:k]
    return out


@functools.partial(jax.jit, static_argnums=(0, 2, 3), static_argnames=("cancellable",))
def generate_bucket(config: ModelConfig, params, n_new: int, filtering: int, tokens, positions, segments,
                     lengths, temperature, lp_temperature, top_k, top_p, max_new, stops, seeds, salts, live,
                     cancel_id=0, cancellable: bool = False):
    _TRACES["count"] += 1
    B, P = tokens.shape
    row_keys = jax.vmap(lambda s, t: jax.random.fold_in(jax.random.key(s), t))(seeds, salts)

    def pick(logits, step):
        keys = jax.vmap(lambda k: jax.random.fold_in(k, step))(row_keys)
        return choose_tokens(logits, keys, temperature, top_k, top_p, filtering, lp_temperature)

    def is_stop(tok):
        return jnp.any(tok[:, None] == stops, axis=-1)

    cache = _constrain_cache(config, models.init_cache(config, B, P + n_new))
    h, cache = models.extend(config, params, cache, tokens, positions, segments)
    tok, lp = pick(models.logits_from_hidden(config, params, h[:, -1]), 0)
    out_tok = jnp.zeros((B, n_new), jnp.int32).at[:, 0].set(tok)
    out_lp = jnp.zeros((B, n_new), jnp.float32).at[:, 0].set(lp)
    count = live.astype(jnp.int32)
    done = ~live | is_stop(tok) | (max_new <= 1)

    def cond(carry):
        i, _, _, _, _, done, _ = carry
        return (i < n_new) & ~jnp.all(done)

    def body(carry):
        i, tok, cache, out_tok, out_lp, done, count = carry
        pos = (lengths + i - 1)[:, None]
        h, cache = models.extend(config, params, cache, tok[:, None], pos, jnp.ones_like(pos))
        cache = _constrain_cache(config, cache)
        new, lp = pick(models.logits_from_hidden(config, params, h[:, -1]), i)
        write = ~done
        out_tok = out_tok.at[:, i].set(jnp.where(write, new, 0))
        out_lp = out_lp.at[:, i].set(jnp.where(write, lp, 0.0))
        count = count + write.astype(jnp.int32)
        done = done | is_stop(new) | (i + 1 >= max_new)
        if cancellable:  # rows whose caller went away stop (every CANCEL_CHECK_EVERY steps: a host callback)
            gone = jax.lax.cond(
                i % CANCEL_CHECK_EVERY == 0,
                lambda: io_callback(functools.partial(_cancelled_rows, n_rows=B),
                                                     jax.ShapeDtypeStruct((B,), jnp.bool_), cancel_id),
                lambda: jnp.zeros((B,), jnp.bool_))
            done = done | gone
        return i + 1, new, cache, out_tok, out_lp, done, count

    carry = (jnp.int32(1), tok, cache, out_tok, out_lp, done, count)
    _, _, _, out_tok, out_lp, _, count = jax.lax.while_loop(cond, body, carry)
    return out_tok, out_lp, count


# ---------------------------------------------------------------------------------------- the API
def per_request(name: str, value, n: int, cast) -> list:
    if isinstance(value, (list, tuple, np.ndarray)):
        if len(value) != n:
            raise ValueError(f"{name}: got {len(value)} values for {n} prompts")
        return [cast(v) for v in value]
    return [cast(value)] * n


def stop_lists(stop_ids, n: int) -> list[list[int]]:
    stop_ids = list(stop_ids or ())
    if stop_ids and all(isinstance(s, (list, tuple, np.ndarray)) for s in stop_ids):
        if len(stop_ids) != n:
            raise ValueError(f"stop_ids: got {len(stop_ids)} per-request lists for {n} prompts")
        return [[int(t) for t in s] for s in stop_ids]
    if any(isinstance(s, (list, tuple, np.ndarray)) for s in stop_ids):
        raise ValueError("stop_ids: give either a sequence of ints (shared) or one sequence per prompt")
    return [[int(t) for t in stop_ids]] * n


def check_placed(params, mesh) -> None:
    """Raises unless the params are device arrays on `mesh` (one leaf looked at: a cheap check per call, not a
    walk of the tree; a leaf on other devices would fail in the compiled call with a less clear message)."""
    leaf = jax.tree.leaves(params)[0]
    if not (isinstance(leaf, jax.Array) and isinstance(leaf.sharding, jax.sharding.NamedSharding)
            and leaf.sharding.mesh == mesh):
        raise ValueError("sampler.generate(mesh=...): params must already be placed on that mesh; place them once "
                         "with models.shard_params(config, params, mesh) (StaticGenerator.set_params does)")


def generate(config: ModelConfig, params, prompts: Sequence[Sequence[int]], *, max_new_tokens,
             temperature=1.0, top_p=1.0, top_k=0, stop_ids=(), seed=0, mesh=None,
             buckets: Buckets | None = None, logprob_temperature: str | float = "sampling",
             max_batch: int = 0, cancel: np.ndarray | None = None) -> list[Sample]:
    """Samples a continuation of every prompt (token id lists of any lengths) in batched programs.

    See the module docstring for the sampling rules, the log-prob temperature ("sampling": each request's own
    temperature, 1 when greedy; or one float for all), per-request settings, seeding and buckets.
    `max_batch` caps the sequences of one compiled call (0 = all prompts in one call): the prompts then run in
    consecutive chunks of at most `max_batch`, each with its own batch / prompt bucket, so the KV cache and the
    prefill hold one chunk at a time. Row r keeps its key (seed, global index r) whatever the chunking: the
    samples are those of a single call.
    `mesh`: the mesh the params are already placed on (the module docstring, "Sharding"); None = one device.
    `cancel` (no mesh): a bool array [len(prompts)] another thread may set while the call runs; a row set True
    stops decoding within CANCEL_CHECK_EVERY steps (its sample ends early, marked "length"; the caller that
    cancelled it discards it). The other rows' samples do not change.
    """
    prompts = list(prompts)
    n = len(prompts)
    if isinstance(max_batch, bool) or not isinstance(max_batch, (int, np.integer)) or max_batch < 0:
        raise ValueError(f"max_batch must be an int >= 0 (0 = every prompt in one call), got {max_batch!r}")
    if n == 0:
        return []
    buckets = buckets or Buckets()
    V = config.vocab_size
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty: every request needs at least one token")
        arr = np.asarray(p)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"prompt {i} must be a flat list of integer token ids")
        if arr.min() < 0 or arr.max() >= V:
            raise ValueError(f"prompt {i}: token id out of range [0, {V}) (min {arr.min()}, max {arr.max()})")
    max_new = per_request("max_new_tokens", max_new_tokens, n, int)
    temps = per_request("temperature", temperature, n, float)
    tps = per_request("top_p", top_p, n, float)
    tks = per_request("top_k", top_k, n, int)
    stops = stop_lists(stop_ids, n)
    for i in range(n):
        if max_new[i] < 1:
            raise ValueError(f"request {i}: max_new_tokens must be >= 1, got {max_new[i]}")
        if temps[i] < 0 or not math.isfinite(temps[i]):
            raise ValueError(f"request {i}: temperature must be a finite value >= 0, got {temps[i]}")
        if not 0.0 < tps[i] <= 1.0:
            raise ValueError(f"request {i}: top_p must be in (0, 1], got {tps[i]}")
        if tks[i] < 0:
            raise ValueError(f"request {i}: top_k must be >= 0 (0 = off), got {tks[i]}")
    if isinstance(logprob_temperature, str):
        if logprob_temperature != "sampling":
            raise ValueError(f"logprob_temperature must be 'sampling' or a float > 0, got {logprob_temperature!r}")
        lp_temps = [t if t > 0 else 1.0 for t in temps]
    else:
        lpt = float(logprob_temperature)
        if not (lpt > 0 and math.isfinite(lpt)):
            raise ValueError(f"logprob_temperature must be 'sampling' or a finite float > 0, got {lpt}")
        lp_temps = [lpt] * n
    if isinstance(seed, (list, tuple, np.ndarray)):
        seeds, salts = per_request("seed", seed, n, int), [0] * n
    else:
        seeds, salts = [int(seed)] * n, list(range(n))  # the salt is the global row index: chunking keeps it
    if mesh is not None:
        check_placed(params, mesh)
    step = max_batch or n
    samples = []
    for a in range(0, n, step):
        rows = slice(a, min(n, a + step))
        samples += _generate_chunk(config, params, prompts[rows], max_new[rows], temps[rows], lp_temps[rows],
                                   tps[rows], tks[rows], stops[rows], seeds[rows], salts[rows], mesh, buckets,
                                   None if cancel is None or mesh is not None else cancel[rows])
    return samples


def _generate_chunk(config, params, prompts, max_new, temps, lp_temps, tps, tks, stops, seeds, salts, mesh,
                    buckets: Buckets, cancel=None) -> list[Sample]:
    """One compiled call over validated per-request lists (params already placed on `mesh`)."""
    n = len(prompts)
    B = buckets.batch(n, sharding.batch_shard_count(mesh, config))
    P = buckets.prompt(max(len(p) for p in prompts))
    N = buckets.new_tokens(max(max_new))
    S = buckets.stops(max(len(s) for s in stops))
    tokens = np.zeros((B, P), np.int32)
    positions = np.zeros((B, P), np.int32)
    segments = np.zeros((B, P), np.int32)
    lengths = np.ones((B,), np.int32)
    live = np.zeros((B,), bool)
    stop_arr = np.full((B, S), -1, np.int32)
    for i, p in enumerate(prompts):
        L = len(p)
        tokens[i, P - L:] = np.asarray(p, np.int32)
        positions[i, P - L:] = np.arange(L, dtype=np.int32)
        segments[i, P - L:] = 1
        lengths[i] = L
        live[i] = True
        stop_arr[i, :len(stops[i])] = stops[i]
    segments[n:, -1] = 1  # filler rows hold one real token so every row has a defined last hidden state

    def pad(vals, fill, dtype):
        return np.asarray(list(vals) + [fill] * (B - n), dtype)

    filtering = candidate_count(tks, tps, config.vocab_size)
    _CALL_SHAPES.add((B, P, N, S, filtering))
    inputs = (tokens, positions, segments, lengths, pad(temps, 0.0, np.float32), pad(lp_temps, 1.0, np.float32),
              pad(tks, 0, np.int32), pad(tps, 1.0, np.float32), pad(max_new, 1, np.int32), stop_arr,
              pad([s % (1 << 32) for s in seeds], 0, np.uint32), pad(salts, 0, np.uint32), live)
    if mesh is None:
        cid = next(_CANCEL_IDS) if cancel is not None else 0
        if cancel is not None:
            _CANCEL[cid] = cancel
        try:
            out_tok, out_lp, count = generate_bucket(config, params, N, filtering, *inputs, np.int32(cid),
                                                      cancellable=cancel is not None)
            out_tok, out_lp, count = jax.device_get((out_tok, out_lp, count))
        finally:
            _CANCEL.pop(cid, None)
    else:
        placed = [jax.device_put(x, sharding.batch_sharding(mesh, x.shape, config)) for x in inputs]
        with _MESH_LOCK, sharding.use_mesh(mesh):
            out_tok, out_lp, count = generate_bucket(config, params, N, filtering, *placed)
            out_tok, out_lp, count = jax.device_get((out_tok, out_lp, count))
    out_tok, out_lp, count = jax.device_get((out_tok, out_lp, count))
    samples = []
    for i in range(n):
        c = int(count[i])
        toks = [int(t) for t in out_tok[i, :c]]
        finish = "stop" if toks and toks[-1] in stops[i] else "length"
        samples.append(Sample(toks, [float(x) for x in out_lp[i, :c]], finish, len(prompts[i])))
    return samples
