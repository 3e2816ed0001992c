"""Key/value cache of the full-attention layers, shared by both model families.

A cache is a plain dict pytree:

* ``k``, ``v``: [L_attn, B, S, KVH, Dh] keys (after RoPE) and values of every full-attention layer;
* ``segment_ids``: [B, S] int32, the segment id of each filled slot (0 = empty or left padding);
* ``index``: int32 scalar, the next slot to write. All rows write the same slots, so prompts of different
  lengths are left-padded with segment id 0 (see inference/sampler.py) and positions stay per-row explicit.

Model families add their own recurrent state next to these keys (the Qwen3.5 conv window and DeltaNet state).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def init_kv(num_layers: int, batch: int, max_len: int, kv_heads: int, head_dim: int, dtype) -> dict:
    shape = (num_layers, batch, max_len, kv_heads, head_dim)
    return {
        "k": jnp.zeros(shape, dtype),
        "v": jnp.zeros(shape, dtype),
        "segment_ids": jnp.zeros((batch, max_len), jnp.int32),
        "index": jnp.zeros((), jnp.int32),
    }


def kv_axes() -> dict:
    """Logical axes of the cache arrays, for placing a cache on a mesh."""
    return {
        "k": ("layers", "act_batch", "act_cache_length", "act_kv_heads", "head_dim"),
        "v": ("layers", "act_batch", "act_cache_length", "act_kv_heads", "head_dim"),
        "segment_ids": ("act_batch", "act_cache_length"),
        "index": (),
    }


def write_segments(cache: dict, segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Writes the new tokens' segment ids at the cache index; returns (all slot segment ids, query slots)."""
    index = cache["index"]
    seg = jax.lax.dynamic_update_slice(cache["segment_ids"], segment_ids.astype(jnp.int32), (0, index))
    B, T = segment_ids.shape
    q_slots = jnp.broadcast_to(index + jnp.arange(T, dtype=jnp.int32), (B, T))
    return seg, q_slots


def write_layer(k_cache: jax.Array, v_cache: jax.Array, k: jax.Array, v: jax.Array, index: jax.Array):
    """Writes one layer's new keys/values [B, T, KVH, Dh] at slot `index` of its [B, S, KVH, Dh] cache."""
    k_cache = jax.lax.dynamic_update_slice(k_cache, k.astype(k_cache.dtype), (0, index, 0, 0))
    v_cache = jax.lax.dynamic_update_slice(v_cache, v.astype(v_cache.dtype), (0, index, 0, 0))
    return k_cache, v_cache
