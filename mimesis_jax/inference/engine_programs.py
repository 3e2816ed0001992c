"""The rollout engine's two jitted programs: one prefill chunk and one burst of decode steps over the paged cache
(models/paged_cache.py), sampling with the sampler's rule and keys (`sampler.choose_tokens`; row key
fold_in(key(seed), salt), step key fold_in(row key, step)). Shapes are fixed by EngineConfig; the scheduler
(inference/engine.py) pads every call to them.

**Replicas.** On a mesh with batch axes (the act_batch rule's axes of more than one device, `replica_axes`) the
engine is R data-parallel replicas: the pool's page and slot dims hold one block per replica, split over those
axes (paged_cache.pool_axes(replicas=True)), and every row argument is R blocks of rows, replica-major. The
programs run their body in shard_map over the batch axes, one replica per block of devices: a row's page table
and state slot are indices into its own replica's pages (local ids; each replica's page 0 and slot 0 are its
trash), so a gather or write never leaves the replica's devices. Inside, the tensor axis stays automatic (heads
split as without replicas) and the config's rules lose the batch axes (`local_config`). The weights enter
replicated over the batch axes (a training layout sharded over fsdp is gathered at the program's start)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from mimesis_jax import models, sharding
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.models.paged_attention import slot_major_decode_attention
from mimesis_jax.models.paged_cache import TRASH_PAGE, pool_axes
from mimesis_jax.inference.sampler import choose_tokens

P = jax.sharding.PartitionSpec
# the page / slot dim of each cache leaf (paged_cache.pool_axes)
PAGE_DIM = {"k": 2, "v": 2, "conv": 1, "state": 1}


def replica_axes(mesh, config=None) -> tuple[str, ...]:
    """The mesh axes the engine's data-parallel replicas span: those of the act_batch rule (config's rules) that
    `mesh` has with more than one device; () without a mesh or without such axes (one replica)."""
    if mesh is None:
        return ()
    target = sharding.rules_of(config).get("act_batch")
    target = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
    shape = dict(mesh) if isinstance(mesh, Mapping) else dict(mesh.shape)
    return tuple(a for a in target if shape.get(a, 1) > 1)


def replica_count(mesh, config=None) -> int:
    """How many replicas the engine has on `mesh` (a Mesh or its axis sizes; the product of `replica_axes`'
    sizes; 1 without a mesh)."""
    shape = {} if mesh is None else dict(mesh) if isinstance(mesh, Mapping) else dict(mesh.shape)
    return math.prod(shape[a] for a in replica_axes(mesh, config))


@functools.lru_cache(maxsize=None)
def local_config(config: ModelConfig, axes: tuple[str, ...]) -> ModelConfig:
    """The config a replica's body runs with: its sharding rules without the replica axes (inside shard_map they
    are manual, so no constraint may name them), the rest (tensor) as before."""
    def strip(target):
        if target is None:
            return None
        kept = tuple(a for a in ((target,) if isinstance(target, str) else target) if a not in axes)
        return None if not kept else (kept[0] if len(kept) == 1 else kept)
    return config.replace(sharding_rules=tuple((k, strip(v)) for k, v in sharding.rules_table(config)))


def _pin(config, cache):
    """The cache constrained to its mesh layout (paged_cache.pool_axes: heads over tensor, pages and slots over the
    replica axes) under the current mesh, so a program's output pool has its input's sharding (donation reuses
    the buffers; the next call takes it as is). A no-op without a mesh (the one-device engine)."""
    return {k: sharding.constrain(x, pool_axes(cache, replicas=True)[k], config) for k, x in cache.items()}


def _per_replica(config, body, params, cache, rows, shared, n_row_outs: int):
    """body(config, params, cache, *rows, *shared) -> (cache, *row outputs): run as is with one replica, else in
    shard_map over the replica axes (module docstring), each replica on its own pages, slots and block of rows.
    rows: arrays (or tuples of arrays) whose dim 0 is R blocks of rows; shared: replicated arguments."""
    mesh = jax.sharding.get_abstract_mesh()
    axes = () if mesh.empty else replica_axes(mesh, config)
    if not axes:
        return body(config, params, cache, *rows, *shared)
    local = local_config(config, axes)
    R = math.prod(dict(mesh.shape)[a] for a in axes)
    bad = {k: x.shape[PAGE_DIM[k]] for k, x in cache.items() if x.shape[PAGE_DIM[k]] % R}
    if bad:
        raise ValueError(f"the engine's pool holds one block of pages / state slots per replica ({R} on mesh axes "
                         f"{axes}), but its {bad} are no multiple of {R} (allocate it as inference/page_pool.py "
                         f"PagePool.layout does)")
    cspec = {k: P(*([None] * PAGE_DIM[k] + [axes])) for k in cache}
    fn = jax.shard_map(lambda p, c, r, s: body(local, p, c, *r, *s), mesh=mesh,
                       in_specs=(P(), cspec, P(axes), P()), out_specs=(cspec,) + (P(axes),) * n_row_outs,
                       axis_names=set(axes), check_vma=False)
    return fn(params, cache, tuple(rows), tuple(shared))


def _row_keys(seeds, salts):
    return jax.vmap(lambda s, t: jax.random.fold_in(jax.random.key(s), t))(seeds, salts)


def _pick(config, params, h, samp, steps, filtering):
    seeds, salts, temp, lp_temp, top_k, top_p = samp
    keys = jax.vmap(jax.random.fold_in)(_row_keys(seeds, salts), steps)
    logits = models.logits_from_hidden(config, params, h)
    return choose_tokens(logits, keys, temp, top_k, top_p, filtering, lp_temp)


@functools.partial(jax.jit, static_argnums=(0, 1, 2), donate_argnums=(4,))
def prefill_program(config: ModelConfig, filtering, decode_fn, params, cache, tokens, starts, n_valid,
                     page_tables, state_slots, samp):
    """One prefill chunk [R, C]; returns (cache, first token [R], its log-prob [R]) sampled after each row's
    last real token (used only for rows whose prompt ends in this chunk). With replicas the R rows are one
    block per replica (module docstring)."""
    def body(cfg, params, cache, tokens, starts, n_valid, page_tables, state_slots, samp):
        fam = models.family(cfg, "paged")
        h, cache = fam.forward_paged(cfg, params, _pin(cfg, cache), tokens, starts, n_valid, page_tables,
                                     state_slots, decode_fn)
        last = jnp.take_along_axis(h, jnp.maximum(n_valid - 1, 0)[:, None, None], axis=1)[:, 0]
        tok, lp = _pick(cfg, params, last, samp, jnp.zeros_like(n_valid), filtering)
        return _pin(cfg, cache), tok, lp
    cache, tok, lp = _per_replica(config, body, params, cache,
                                  (tokens, starts, n_valid, page_tables, state_slots, samp), (), 2)
    return _pin(config, cache), tok, lp


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(1,))
def copy_state_program(config: ModelConfig, cache, src, dst):
    """Copies state slot src[i] onto dst[i] (every linear layer's conv window and DeltaNet state): the rollout
    engine's snapshots and their restores (inference/page_pool.py, rollback). src, dst: [R * n] slot ids, one
    block of n rows per replica (local ids; idle rows copy trash slot 0 onto itself); one shape, compiled once."""
    def body(cfg, params, cache, src, dst):
        cache = _pin(cfg, cache)
        out = dict(cache)
        for name in ("conv", "state"):
            out[name] = cache[name].at[:, dst].set(cache[name][:, src])
        return (_pin(cfg, out),)
    (cache,) = _per_replica(config, body, (), cache, (src, dst), (), 0)
    return _pin(config, cache)


def _burst_copy(cache, page_tables):
    """The rows' pages of every full-attention layer, copied into row-major blocks of W + 1 pages per row
    ([L, KVH, S * (W + 1), page, Dh]; row b's extra last page is a scratch page), and the page tables that
    address the copy ([S, W + 1])."""
    S, W = page_tables.shape
    scratch = jnp.full((S, 1), TRASH_PAGE, jnp.int32)
    flat = jnp.concatenate([page_tables, scratch], axis=1).reshape(-1)
    work = dict(cache, k=cache["k"][:, :, flat], v=cache["v"][:, :, flat])
    return work, jnp.arange(S * (W + 1), dtype=jnp.int32).reshape(S, W + 1)


def _burst_write_back(cache, work, page_tables, pos, count, n_steps: int):
    """Copies the pages a burst wrote (row b's positions pos[b] .. pos[b] + count[b] - 1) from the working copy
    back to the pool; every other page of the copy is unchanged and dropped."""
    S, W = page_tables.shape
    P = cache["k"].shape[3]
    span = (P - 1 + n_steps - 1) // P + 1  # pages n_steps consecutive positions can touch
    first = pos // P
    j = first[:, None] + jnp.arange(span, dtype=jnp.int32)[None]  # [S, span] logical pages
    last = (pos + count - 1) // P
    used = (count[:, None] > 0) & (j <= last[:, None]) & (j < W)
    jc = jnp.minimum(j, W - 1)
    dst = jnp.where(used, jnp.take_along_axis(page_tables, jc, axis=1), TRASH_PAGE).reshape(-1)
    src = (jnp.arange(S, dtype=jnp.int32)[:, None] * (W + 1) + jc).reshape(-1)
    out = dict(work)
    for name in ("k", "v"):
        out[name] = cache[name].at[:, :, dst].set(work[name][:, :, src])
    return out


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3), donate_argnums=(5,))
def decode_program(config: ModelConfig, filtering, decode_fn, n_steps: int, params, cache, tok, pos, live,
                    page_tables, state_slots, samp, steps, remaining, stops, stop_early):
    """Up to n_steps one-token steps of every live slot. tok [S]: the last sampled token (fed at position
    pos); steps [S]: index of the next sample; remaining [S]: samples left. Returns (cache, tokens [S, n],
    log-probs [S, n], count [S] new tokens per slot, done [S], steps run [replicas]: each replica's burst
    returns early on its own).

    Without a `decode_fn` (the jnp path), the burst first copies the rows' pages into a slot-major working
    copy (`_burst_copy`), steps on it with paged_attention.slot_major_decode_attention (no per-step page
    gather: on a CPU the gather cost as much as the attention itself), and writes the touched pages back at
    the end. Rows that are not active write their token to their own scratch page of the copy (position
    W * page_size) and to state slot 0."""
    body = functools.partial(_decode_body, filtering, decode_fn, n_steps)
    cache, *out = _per_replica(config, body, params, cache, (tok, pos, live, page_tables, state_slots, samp, steps,
                                                             remaining, stops), (stop_early,), 5)
    return (_pin(config, cache), *out)


def _decode_body(filtering, decode_fn, n_steps, config, params, cache, tok, pos, live, page_tables, state_slots,
                 samp, steps, remaining, stops, stop_early):
    """decode_program on one replica's rows and pool; the steps run come back as a [1] array."""
    fam = models.family(config, "paged")
    cache = _pin(config, cache)
    S = tok.shape[0]
    burst = decode_fn is None and "k" in cache
    if burst:
        W = page_tables.shape[1]
        work, tables = _burst_copy(cache, page_tables)
        fn, idle_pos = slot_major_decode_attention, W * cache["k"].shape[3]
    else:
        work, tables, fn, idle_pos = cache, page_tables, decode_fn, None

    def cond(c):
        i, _, _, _, _, done, _, freed = c
        return (i < n_steps) & ~jnp.all(done) & ~(stop_early & freed)

    def body(c):
        i, tok, work, out_tok, out_lp, done, count, _ = c
        act = ~done
        if burst:  # every row writes: inactive ones to their scratch page (and state slot 0)
            at, n_valid = jnp.where(act, pos + i, idle_pos), jnp.ones_like(pos)
        else:
            at, n_valid = pos + i, act.astype(jnp.int32)
        h, work = fam.forward_paged(config, params, work, tok[:, None], at, n_valid, tables,
                                    jnp.where(act, state_slots, 0), fn)
        new, lp = _pick(config, params, h[:, 0], samp, steps + i, filtering)
        out_tok = out_tok.at[:, i].set(jnp.where(act, new, 0))
        out_lp = out_lp.at[:, i].set(jnp.where(act, lp, 0.0))
        count = count + act.astype(jnp.int32)
        fin = act & (jnp.any(new[:, None] == stops, axis=-1) | (i + 1 >= remaining))
        return i + 1, jnp.where(act, new, tok), work, out_tok, out_lp, done | fin, count, jnp.any(fin)

    done0 = ~live
    c = (jnp.int32(0), tok, work, jnp.zeros((S, n_steps), jnp.int32), jnp.zeros((S, n_steps), jnp.float32),
         done0, jnp.zeros((S,), jnp.int32), jnp.bool_(False))
    i, _, work, out_tok, out_lp, done, count, _ = jax.lax.while_loop(cond, body, c)
    cache = _burst_write_back(cache, work, page_tables, pos, count, n_steps) if burst else work
    return _pin(config, cache), out_tok, out_lp, count, done, i.reshape(1)
