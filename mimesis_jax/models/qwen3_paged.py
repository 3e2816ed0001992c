"""Qwen3 on the rollout engine's paged cache (inference/engine.py, models/paged_cache.py). The model itself is
models/qwen3.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mimesis_jax.models import paged_cache
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.models.layers import embed_lookup, rms_norm, rope_tables
from mimesis_jax.models.qwen3 import attn_out, mlp, qkv


def init_paged_cache(config: ModelConfig, num_pages: int, page_size: int, num_states: int = 0) -> dict:
    """Page pools of the rollout engine (models/paged_cache.py); Qwen3 keeps no per-dialogue state."""
    return paged_cache.init_pages(config.num_hidden_layers, config.num_key_value_heads, num_pages, page_size,
                                  config.head_dim, config.compute_dtype)


def forward_paged(config: ModelConfig, params: dict, cache: dict, tokens: jax.Array, starts: jax.Array,
                  n_valid: jax.Array, page_tables: jax.Array, state_slots: jax.Array | None = None,
                  decode_fn=None):
    """Runs new tokens on top of a paged cache (the rollout engine's prefill chunks and decode steps).

    tokens [B, T] right-padded: row b holds n_valid[b] real tokens at positions starts[b] .. starts[b] +
    n_valid[b] - 1 of its dialogue, whose earlier keys/values are in the pages `page_tables[b]`. The new
    keys/values are written to those pages (padding to the trash page) and each query attends causally over
    its dialogue (paged_cache.attend_paged). Returns (hidden [B, T, D], new cache); rows with n_valid = 0 are
    idle and change nothing but the trash page. `state_slots` is unused (Qwen3 has no recurrent state).
    """
    dt = config.compute_dtype
    T = tokens.shape[1]
    page_size = cache["k"].shape[3]
    positions = starts[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
    slots = paged_cache.token_slots(page_tables, starts, n_valid, T, page_size)
    cos, sin = rope_tables(positions, config.rotary_dim, config.rope_theta)
    x = embed_lookup(params["embed"], tokens, dt, config)

    kp, vp = cache["k"], cache["v"]
    for i in range(config.num_hidden_layers):  # unrolled: each layer updates the stacked pools in place
        lp = jax.tree.map(lambda a: a[i], params["layers"])
        h = rms_norm(x, lp["input_norm"], config.rms_norm_eps)
        q, k, v = qkv(config, lp["attn"], h, cos, sin)
        kp, vp = paged_cache.write_pages(kp, vp, i, k, v, slots)
        o = paged_cache.attend_paged(q, kp, vp, i, page_tables, starts, decode_fn)
        x = x + attn_out(config, lp["attn"], o)
        x = x + mlp(config, lp, x)
    return rms_norm(x, params["final_norm"], config.rms_norm_eps), {"k": kp, "v": vp}
