"""Paged key/value cache for the rollout engine (inference/engine.py), pure-jnp reference functions.

Memory layout (one pool per full-attention layer, stacked on a leading layer axis)::

    k_pages, v_pages  [L_attn, KVH, num_pages, page_size, Dh]

A dialogue owns a list of pages; its page table row [pages_per_seq] int32 lists them in order, so token
position p of the dialogue lives at (page_table[p // page_size], p % page_size). The cache slot of a token is
its position: RoPE positions and key order are the dialogue's own, with no left padding. Page 0 is the
**trash page**: never handed to a dialogue, it receives the writes of padding tokens (and unused page-table
entries point at it); whatever it holds is masked out.

* `write_pages` scatters a call's new keys/values (right-padded [B, T] rows, `n_valid` real tokens per row
  starting at position `starts`) into the pool.
* `paged_attention` is the prefill/decode attention of queries [B, T] at positions starts + i over their rows'
  pages: key position j is visible to query i iff j <= starts + i (causal within the dialogue).
* `paged_decode_attention(q [B, H, Dh], k_pages, v_pages, page_table [B, P], lengths [B]) -> [B, H, Dh]` is the
  one-token case with the signature a fused (Pallas) paged-decode kernel implements; it is the reference such
  a kernel is tested against.

Both attention functions gather every page of the row's table ([B, KVH, P * page_size] keys) and mask: O(P * page_size)
work per query, which is what a dense decode step over an unpadded per-row cache costs anyway.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

TRASH_PAGE = 0
_NEG = -0.7 * float(jnp.finfo(jnp.float32).max)


def init_pages(num_layers: int, kv_heads: int, num_pages: int, page_size: int, head_dim: int, dtype) -> dict:
    shape = (num_layers, kv_heads, num_pages, page_size, head_dim)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def pool_axes(cache: dict, replicas: bool = False) -> dict:
    """Logical axes of the engine's cache leaves (sharding.py rules) for running it on a mesh: the page pools
    [L, KVH, N, page, Dh] split over KV heads (act_kv_heads), the Qwen3.5 state slots over their heads -- conv
    windows [L_lin, slots, K-1, Hk, Cg] over key heads (act_kv_heads), DeltaNet states [L_lin, slots, Hv, Dk, Dv]
    over value heads (act_heads), as the static sampler's cache (qwen3_5.cache_axes). A heads dim the tensor axis
    does not divide stays replicated (sharding.logical_to_spec).

    replicas: the engine's data-parallel layout (inference/page_pool.py): the page and slot dims hold one block
    per replica and are split over the batch axes (act_batch), so each replica's devices hold only its own
    pages and slots. Without it pages and slots are never split."""
    page = "act_batch" if replicas else None
    axes = {"k": ("layers", "act_kv_heads", page, None, None), "v": ("layers", "act_kv_heads", page, None, None),
            "conv": ("layers", page, None, "act_kv_heads", None), "state": ("layers", page, "act_heads", None, None)}
    return {name: axes[name] for name in cache}


def token_slots(page_table: jax.Array, starts: jax.Array, n_valid: jax.Array, T: int, page_size: int) -> jax.Array:
    """Flat pool slot (page * page_size + offset) of every new token [B, T]; padding goes to the trash page."""
    pos = starts[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
    page = jnp.take_along_axis(page_table, jnp.minimum(pos // page_size, page_table.shape[1] - 1), axis=1)
    slot = page * page_size + pos % page_size
    valid = jnp.arange(T, dtype=jnp.int32)[None] < n_valid[:, None]
    return jnp.where(valid, slot, TRASH_PAGE * page_size)


def write_pages(k_pool: jax.Array, v_pool: jax.Array, layer: int, k: jax.Array, v: jax.Array, slots: jax.Array):
    """Writes layer `layer`'s new k/v [B, T, KVH, Dh] at the flat `slots` [B, T] of the stacked
    [L, KVH, N, page, Dh] pools, in place (one scatter into the whole pool, no per-layer copy)."""
    L, KVH, N, P, Dh = k_pool.shape
    B, T = slots.shape
    idx = slots.reshape(-1)

    def put(pool, x):
        flat = pool.reshape(L, KVH, N * P, Dh)
        flat = flat.at[layer, :, idx].set(x.reshape(B * T, KVH, Dh).astype(pool.dtype))
        return flat.reshape(L, KVH, N, P, Dh)
    return put(k_pool, k), put(v_pool, v)


def gather_pages(pages: jax.Array, page_table: jax.Array, layer: int | None = None) -> jax.Array:
    """The rows' keys or values in position order, head-major [B, KVH, P * page, Dh], from one layer's
    [KVH, N, page, Dh] pool or (with `layer`) from the stacked [L, KVH, N, page, Dh] pools.

    One gather straight into the output layout, then an optimization barrier: left free, XLA (CPU) fuses the
    gather into the score product and re-gathers per element, slower than materialising it once (docs/engine.md)."""
    B, P = page_table.shape
    pool = pages if layer is None else pages[layer]
    KVH, _, page, Dh = pool.shape
    g = pool[jnp.arange(KVH)[None, :, None], page_table[:, None, :]]  # [B, KVH, P, page, Dh]
    return jax.lax.optimization_barrier(g.reshape(B, KVH, P * page, Dh))


def _scores_out(q, k, v, mask, scale):
    """softmax(scale q.k) v over visible keys: q [B, T, H, Dh], k/v [B, KVH, S, Dh], mask [B, T, S].

    The G = H / KVH query heads of a KV head and the T queries form one [G*T, Dh] matrix per (row, KV head), so
    both products are plain batched matmuls (much faster on CPU than a multi-batch-axis einsum)."""
    B, T, H, Dh = q.shape
    KVH, S = k.shape[1], k.shape[2]
    G = H // KVH
    if T == 1:  # decode: one query per row, a batched mat-vec
        qg = q.reshape(B, KVH, G, Dh)
        s = jnp.einsum("bkgd,bksd->bkgs", qg, k, preferred_element_type=jnp.float32) * scale
        m = mask[:, :, None, :].reshape(B, 1, 1, S)
        s = jnp.where(m, s, _NEG)
        p = jnp.where(m, jax.nn.softmax(s, axis=-1), 0.0)
        o = jnp.einsum("bkgs,bksd->bkgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return o.reshape(B, 1, H, Dh).astype(q.dtype)
    qg = q.reshape(B, T, KVH, G, Dh).transpose(0, 2, 3, 1, 4).reshape(B, KVH, G * T, Dh)
    s = jnp.matmul(qg, jnp.swapaxes(k, 2, 3), preferred_element_type=jnp.float32) * scale
    s = s.reshape(B, KVH, G, T, S)
    m = mask[:, None, None]
    s = jnp.where(m, s, _NEG)
    p = jnp.where(m, jax.nn.softmax(s, axis=-1), 0.0).reshape(B, KVH, G * T, S)
    o = jnp.matmul(p.astype(v.dtype), v, preferred_element_type=jnp.float32)  # [B, KVH, G*T, Dh]
    o = o.reshape(B, KVH, G, T, Dh).transpose(0, 3, 1, 2, 4)
    return o.reshape(B, T, H, Dh).astype(q.dtype)


def paged_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array,
                    starts: jax.Array, scale: float | None = None, layer: int | None = None) -> jax.Array:
    """Causal attention of queries q [B, T, H, Dh] (row b's query i at position starts[b] + i) over the keys at
    positions 0 .. starts[b] + i of the row's pages (already holding this call's keys). fp32 scores and
    softmax; query head h reads KV head h // (H // KVH). Pools as in `gather_pages`. Returns [B, T, H, Dh]."""
    B, T, H, Dh = q.shape
    scale = Dh ** -0.5 if scale is None else float(scale)
    k = gather_pages(k_pages, page_table, layer)
    v = gather_pages(v_pages, page_table, layer)
    qpos = starts[:, None] + jnp.arange(T, dtype=jnp.int32)[None]  # [B, T]
    mask = jnp.arange(k.shape[2], dtype=jnp.int32)[None, None] <= qpos[:, :, None]
    return _scores_out(q, k, v, mask, scale)


def paged_decode_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array,
                           lengths: jax.Array, scale: float | None = None) -> jax.Array:
    """One query per row: q [B, H, Dh] attends to the first lengths[b] positions of its pages -> [B, H, Dh].

    k_pages/v_pages [KVH, N, page_size, Dh] (one layer), page_table [B, P] int32, lengths [B] int32 (>= 1 for a
    live row; a row with length 0 returns zeros). The jnp reference for a fused paged-decode kernel.
    """
    B, H, Dh = q.shape
    scale = Dh ** -0.5 if scale is None else float(scale)
    k = gather_pages(k_pages, page_table)
    v = gather_pages(v_pages, page_table)
    mask = (jnp.arange(k.shape[2], dtype=jnp.int32)[None] < lengths[:, None])[:, None]
    return _scores_out(q[:, None], k, v, mask, scale)[:, 0]


def attend_paged(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, layer: int, page_table: jax.Array,
                 starts: jax.Array, decode_fn=None) -> jax.Array:
    """The models' entry, on the stacked pools: a one-token call with a `decode_fn` (the signature of
    `paged_decode_attention`, e.g. a Pallas kernel) gets layer `layer`'s pools; otherwise the rows' pages are
    gathered straight from the stacked pools (`paged_attention`)."""
    if q.shape[1] == 1 and decode_fn is not None:
        return decode_fn(q[:, 0], k_pool[layer], v_pool[layer], page_table, starts + 1)[:, None]
    return paged_attention(q, k_pool, v_pool, page_table, starts, layer=layer)
