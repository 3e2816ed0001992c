"""Qwen3.5 on the rollout engine's paged cache (inference/engine.py): page pools for the full-attention layers
(models/paged_cache.py) and per-dialogue state slots (conv window, DeltaNet state) for the linear layers. The
model itself is models/qwen3_5.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mimesis_jax.models import paged_cache
from mimesis_jax.models.gated_delta import chunk_gated_delta_rule, l2_normalize, recurrent_gated_delta_rule
from mimesis_jax.models.layers import apply_rope, embed_lookup, rope_tables
from mimesis_jax.models.qwen3_5 import (CHUNK_SIZE, FULL, LINEAR, causal_conv, deltanet_gates, gated_rms_norm,
                                        layer_counts, linear_dims, mlp, norm)
from mimesis_jax.models.config import ModelConfig


def init_paged_cache(config: ModelConfig, num_pages: int, page_size: int, num_states: int) -> dict:
    """The rollout engine's cache (inference/engine.py): page pools of the full layers (models/paged_cache.py)
    and, per linear layer, a pool of `num_states` per-dialogue state slots (conv window [K-1, Hk, Cg] in the
    compute dtype, recurrent state [Hv, Dk, Dv] in float32); slot 0 is the trash slot of idle rows."""
    n_lin, n_full = layer_counts(config)
    cache = {}
    if n_full:
        cache.update(paged_cache.init_pages(n_full, config.num_key_value_heads, num_pages, page_size,
                                            config.head_dim, config.compute_dtype))
    if n_lin:
        Hk, Hv, Dk, Dv, _, Cg = linear_dims(config)
        Km1 = config.linear_conv_kernel_dim - 1
        cache.update(conv=jnp.zeros((n_lin, num_states, Km1, Hk, Cg), config.compute_dtype),
                     state=jnp.zeros((n_lin, num_states, Hv, Dk, Dv), jnp.float32))
    return cache


def _gated_deltanet_paged(config: ModelConfig, p: dict, h: jax.Array, window: jax.Array, state: jax.Array,
                          n_valid: jax.Array):
    """The linear-attention mixer on right-padded rows continuing a dialogue's conv window and state.

    Row b's first n_valid[b] tokens are real; padding has g = beta = 0 (state untouched, see `deltanet_gates`)
    and the new conv window is the K-1 inputs ending at the last real token (not at the padded end).
    Returns (out [B, T, D], new window, new state).
    """
    dt = h.dtype
    B, T, _ = h.shape
    Hk, Hv, Dk, Dv, r, Cg = linear_dims(config)
    K = config.linear_conv_kernel_dim
    valid = jnp.arange(T, dtype=jnp.int32)[None] < n_valid[:, None]
    mixed = jnp.einsum("btd,dgc->btgc", h, p["qkv"].astype(dt))
    y, _ = causal_conv(mixed, p["conv"], window, jnp.broadcast_to(valid, (K, B, T)))
    xx = jnp.concatenate([window.astype(dt), mixed], axis=1)  # [B, K-1+T, Hk, Cg]
    idx = n_valid[:, None] + jnp.arange(K - 1, dtype=jnp.int32)[None]
    new_window = jnp.take_along_axis(xx, idx[:, :, None, None], axis=1)
    y = jax.nn.silu(y)
    q = l2_normalize(y[..., :Dk]) * Dk ** -0.5
    k = l2_normalize(y[..., Dk:2 * Dk])
    v = y[..., 2 * Dk:].reshape(B, T, Hv, Dv)
    if r > 1:
        q, k = jnp.repeat(q, r, axis=2), jnp.repeat(k, r, axis=2)
    z = jnp.einsum("btd,dhv->bthv", h, p["z"].astype(dt))
    b = jnp.einsum("btd,dh->bth", h, p["b"].astype(dt))
    a = jnp.einsum("btd,dh->bth", h, p["a"].astype(dt))
    g, beta = deltanet_gates(a, b, p["A_log"], p["dt_bias"], valid)
    if T == 1:
        o, new_state = recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=state)
    else:
        o, new_state = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=CHUNK_SIZE, initial_state=state)
    o = gated_rms_norm(config, o, z, p["norm"])
    return jnp.einsum("bthv,hvd->btd", o, p["out"].astype(dt)), new_window, new_state


def forward_paged(config: ModelConfig, params: dict, cache: dict, tokens: jax.Array, starts: jax.Array,
                  n_valid: jax.Array, page_tables: jax.Array, state_slots: jax.Array, decode_fn=None):
    """Runs new tokens on top of the engine's cache (see `init_paged_cache`); returns (hidden, new cache).

    tokens [B, T] right-padded, n_valid[b] real tokens at positions starts[b] + i; full layers write to and
    attend over the pages `page_tables[b]` (as qwen3_paged.forward_paged); linear layers continue the conv window and
    recurrent state of state slot `state_slots[b]`; a row starting at position 0 starts from zero state and
    window (no history), whatever its slot held before.
    Rows with n_valid = 0 are idle: they should use state slot 0 and leave every real slot untouched.
    Layers run unrolled in `layer_types` order.
    """
    T = tokens.shape[1]
    positions = starts[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
    x = embed_lookup(params["embed"], tokens, config.compute_dtype, config)
    new = dict(cache)  # every layer updates the stacked pools in place
    if "k" in cache:
        page_size = cache["k"].shape[3]
        slots = paged_cache.token_slots(page_tables, starts, n_valid, T, page_size)
        rope = rope_tables(positions, config.rotary_dim, config.rope_theta)
    seen = {LINEAR: 0, FULL: 0}
    for t in config.layer_types:
        j = seen[t]
        seen[t] += 1
        if t == LINEAR:
            lp = jax.tree.map(lambda a: a[j], params["linear_layers"])
            fresh = (starts == 0)[:, None, None, None]  # position 0: no history, whatever the slot held
            window = jnp.where(fresh, 0, new["conv"][j, state_slots])
            state = jnp.where(fresh, 0.0, new["state"][j, state_slots])
            out, window, state = _gated_deltanet_paged(config, lp["mixer"], norm(config, x, lp["input_norm"]),
                                                       window, state, n_valid)
            new["conv"] = new["conv"].at[j, state_slots].set(window.astype(new["conv"].dtype))
            new["state"] = new["state"].at[j, state_slots].set(state)
        else:
            lp = jax.tree.map(lambda a: a[j], params["full_layers"])
            p = lp["attn"]
            h = norm(config, x, lp["input_norm"])
            dt, Dh = h.dtype, config.head_dim
            qg = jnp.einsum("btd,dhk->bthk", h, p["q_gate"].astype(dt))
            q, gate = qg[..., :Dh], qg[..., Dh:]
            k = jnp.einsum("btd,dhk->bthk", h, p["k"].astype(dt))
            v = jnp.einsum("btd,dhk->bthk", h, p["v"].astype(dt))
            q = apply_rope(norm(config, q, p["q_norm"]), *rope)
            k = apply_rope(norm(config, k, p["k_norm"]), *rope)
            new["k"], new["v"] = paged_cache.write_pages(new["k"], new["v"], j, k, v, slots)
            o = paged_cache.attend_paged(q, new["k"], new["v"], j, page_tables, starts, decode_fn)
            o = o * jax.nn.sigmoid(gate)
            out = jnp.einsum("bthk,hkd->btd", o, p["o"].astype(dt))
        x = x + out
        x = x + mlp(config, lp, x)
    return norm(config, x, params["final_norm"]), new
