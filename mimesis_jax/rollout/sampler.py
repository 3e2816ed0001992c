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
* **Left padding.** The KV cache is written at one shared slot index for all rows, so shorter prompts are
  LEFT-padded with segment id 0 (never attended; for Qwen3.5 never folded into the recurrent state) while each
  row's positions are its own: 0..len-1 for the prompt, then len, len+1, ... for generated tokens.
* **Prefill** is one `models.extend` over the padded prompts; **decoding** is a `lax.while_loop` of one-token
  `extend` calls that stops as soon as every row is finished (a stop id or its own max_new_tokens).
* **Sampling** per row, from fp32 logits of the last position ([B, V], never [B, T, V]):
  temperature 0 = greedy (argmax); otherwise logits / temperature, then top-k (0 = off), then top-p (nucleus:
  the smallest prefix of the sorted distribution whose mass reaches p; 1.0 = off), then a categorical draw.
  Tokens tied with the top-k / top-p threshold logit are kept.
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
* **Sharding.** With a mesh, params are placed by `sharding.shard_params`, inputs are split over the batch mesh
  axes, the cache follows `models.cache_axes`, and the program runs under `sharding.use_mesh(mesh)`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mimesis_jax import models, sharding
from mimesis_jax.models.config import ModelConfig

_TRACES = {"count": 0}


@dataclasses.dataclass
class Sample:
    """One generated continuation."""

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (ended with a stop id) | "length" (hit max_new_tokens)
    prompt_len: int = 0


@dataclasses.dataclass(frozen=True)
class Buckets:
    """Shape buckets: shapes are rounded up so that a compiled program is reused across calls."""

    min_batch: int = 1
    min_prompt: int = 16
    prompt_step: int = 1024  # beyond this length prompts round up to a multiple of it, not a power of two
    min_new: int = 8
    min_stops: int = 4

    def batch(self, n: int, multiple: int = 1) -> int:
        b = max(self.min_batch, _next_pow2(n))
        return int(math.ceil(b / multiple) * multiple)

    def prompt(self, n: int) -> int:
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


# ----------------------------------------------------------------------------------------- sampling
def filter_logits(logits: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Top-k then top-p (nucleus) filtering of [B, V] logits; filtered entries become -inf.

    top_k [B] int (<= 0 keeps all), top_p [B] float (>= 1 keeps all). Ties with a threshold logit are kept.
    """
    V = logits.shape[-1]
    desc = -jnp.sort(-logits, axis=-1)
    k = jnp.where(top_k <= 0, V, jnp.minimum(top_k, V))
    kth = jnp.take_along_axis(desc, (k - 1)[:, None], axis=-1)
    logits = jnp.where(logits < kth, -jnp.inf, logits)
    desc_k = jnp.where(jnp.arange(V)[None, :] < k[:, None], desc, -jnp.inf)
    probs = jax.nn.softmax(desc_k, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = (mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0)
    n_keep = jnp.maximum(jnp.sum(keep & (jnp.arange(V)[None, :] < k[:, None]), axis=-1), 1)
    pth = jnp.take_along_axis(desc, (n_keep - 1)[:, None], axis=-1)
    return jnp.where(logits < pth, -jnp.inf, logits)


def choose_tokens(logits: jax.Array, keys: jax.Array, temperature: jax.Array, top_k: jax.Array,
                  top_p: jax.Array, filtering: bool, logprob_temperature: jax.Array | None = None
                  ) -> tuple[jax.Array, jax.Array]:
    """Picks one token per row from fp32 logits [B, V]; returns (tokens [B], log-probs [B]).

    The log-prob is log_softmax(logits / logprob_temperature)[token], unfiltered; logprob_temperature [B]
    defaults to the sampling temperature (1 where a row is greedy).
    """
    logits = logits.astype(jnp.float32)
    if logprob_temperature is None:
        logprob_temperature = jnp.where(temperature > 0.0, temperature, 1.0)
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
    if filtering:
        scaled = filter_logits(scaled, top_k, top_p)
    drawn = jax.vmap(lambda k, l: jax.random.categorical(k, l))(keys, scaled).astype(jnp.int32)
    tok = jnp.where(temperature <= 0.0, greedy, drawn)
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


@functools.partial(jax.jit, static_argnums=(0, 2, 3))
def _generate_bucket(config: ModelConfig, params, n_new: int, filtering: bool, tokens, positions, segments,
                     lengths, temperature, lp_temperature, top_k, top_p, max_new, stops, seeds, salts, live):
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
        return i + 1, new, cache, out_tok, out_lp, done, count

    carry = (jnp.int32(1), tok, cache, out_tok, out_lp, done, count)
    _, _, _, out_tok, out_lp, _, count = jax.lax.while_loop(cond, body, carry)
    return out_tok, out_lp, count


# ---------------------------------------------------------------------------------------- the API
def _per_request(name: str, value, n: int, cast) -> list:
    if isinstance(value, (list, tuple, np.ndarray)):
        if len(value) != n:
            raise ValueError(f"{name}: got {len(value)} values for {n} prompts")
        return [cast(v) for v in value]
    return [cast(value)] * n


def _stop_lists(stop_ids, n: int) -> list[list[int]]:
    stop_ids = list(stop_ids or ())
    if stop_ids and all(isinstance(s, (list, tuple, np.ndarray)) for s in stop_ids):
        if len(stop_ids) != n:
            raise ValueError(f"stop_ids: got {len(stop_ids)} per-request lists for {n} prompts")
        return [[int(t) for t in s] for s in stop_ids]
    if any(isinstance(s, (list, tuple, np.ndarray)) for s in stop_ids):
        raise ValueError("stop_ids: give either a sequence of ints (shared) or one sequence per prompt")
    return [[int(t) for t in stop_ids]] * n


def generate(config: ModelConfig, params, prompts: Sequence[Sequence[int]], *, max_new_tokens,
             temperature=1.0, top_p=1.0, top_k=0, stop_ids=(), seed=0, mesh=None,
             buckets: Buckets | None = None, logprob_temperature: str | float = "sampling") -> list[Sample]:
    """Samples a continuation of every prompt (token id lists of any lengths) in one batched program.

    See the module docstring for the sampling rules, the log-prob temperature ("sampling": each request's own
    temperature, 1 when greedy; or one float for all), per-request settings, seeding and buckets.
    """
    n = len(prompts)
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
    max_new = _per_request("max_new_tokens", max_new_tokens, n, int)
    temps = _per_request("temperature", temperature, n, float)
    tps = _per_request("top_p", top_p, n, float)
    tks = _per_request("top_k", top_k, n, int)
    stops = _stop_lists(stop_ids, n)
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
        seeds, salts = _per_request("seed", seed, n, int), [0] * n
    else:
        seeds, salts = [int(seed)] * n, list(range(n))

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

    filtering = any(k > 0 for k in tks) or any(p < 1.0 for p in tps)
    inputs = (tokens, positions, segments, lengths, pad(temps, 0.0, np.float32), pad(lp_temps, 1.0, np.float32),
              pad(tks, 0, np.int32), pad(tps, 1.0, np.float32), pad(max_new, 1, np.int32), stop_arr,
              pad([s % (1 << 32) for s in seeds], 0, np.uint32), pad(salts, 0, np.uint32), live)
    if mesh is None:
        out_tok, out_lp, count = _generate_bucket(config, params, N, filtering, *inputs)
    else:
        params = sharding.shard_params(config, params, mesh)
        placed = [jax.device_put(x, sharding.batch_sharding(mesh, x.shape, config)) for x in inputs]
        with sharding.use_mesh(mesh):
            out_tok, out_lp, count = _generate_bucket(config, params, N, filtering, *placed)
    out_tok, out_lp, count = jax.device_get((out_tok, out_lp, count))
    samples = []
    for i in range(n):
        c = int(count[i])
        toks = [int(t) for t in out_tok[i, :c]]
        finish = "stop" if toks and toks[-1] in stops[i] else "length"
        samples.append(Sample(toks, [float(x) for x in out_lp[i, :c]], finish, len(prompts[i])))
    return samples
