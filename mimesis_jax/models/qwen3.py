"""Qwen3 dense decoder (the agent model), as pure functions of (config, params, inputs).

Architecture (HF `Qwen3ForCausalLM`): token embedding; per layer
``x += o(attn(rope(knorm(k(norm(x)))), ...))`` with GQA, RMSNorm on q and k over head_dim, RoPE, then
``x += down(silu(gate(norm(x))) * up(norm(x)))``; final RMSNorm; LM head (tied or untied).

Parameter pytree (layers stacked on a leading axis so they can be scanned)::

    embed [V, D]                       (vocab, embed)
    lm_head [V, D]                     (vocab, embed)          only when tie_word_embeddings is False
    final_norm [D]                     (norm,)
    layers/input_norm, post_norm [L, D]
    layers/attn/q [L, D, H, Dh]   k, v [L, D, KVH, Dh]   o [L, H, Dh, D]   q_norm, k_norm [L, Dh]
    layers/attn/{q,k,v}_bias, o_bias  only when attention_bias is True
    layers/mlp/gate, up [L, D, I]   down [L, I, D]

Entry points used by models/__init__.py: `param_specs`, `hidden_states` (training / scoring, optionally with
CSD teacher branches, see algorithms/csd.py), `init_cache` + `extend` (KV-cache prefill and decoding).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mimesis_jax.models import kv_cache
from mimesis_jax.models.attention import attend, attend_groups, branch_specs, cache_spec, causal_spec, config_kwargs
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.models.layers import (ParamSpec, apply_rope, default_positions_segments, embed_lookup, maybe_remat,
                                      rms_norm, rope_tables, swiglu)
from mimesis_jax.sharding import constrain


# ------------------------------------------------------------------------------------------ params
def param_specs(config: ModelConfig) -> dict:
    L, D, H, KVH, Dh, I, V = (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                              config.num_key_value_heads, config.head_dim, config.intermediate_size,
                              config.vocab_size)
    attn = {
        "q": ParamSpec((L, D, H, Dh), ("layers", "embed", "heads", "head_dim")),
        "k": ParamSpec((L, D, KVH, Dh), ("layers", "embed", "kv_heads", "head_dim")),
        "v": ParamSpec((L, D, KVH, Dh), ("layers", "embed", "kv_heads", "head_dim")),
        "o": ParamSpec((L, H, Dh, D), ("layers", "heads", "head_dim", "embed")),
        "q_norm": ParamSpec((L, Dh), ("layers", "head_dim"), "ones"),
        "k_norm": ParamSpec((L, Dh), ("layers", "head_dim"), "ones"),
    }
    if config.attention_bias:
        attn.update(
            q_bias=ParamSpec((L, H, Dh), ("layers", "heads", "head_dim"), "zeros"),
            k_bias=ParamSpec((L, KVH, Dh), ("layers", "kv_heads", "head_dim"), "zeros"),
            v_bias=ParamSpec((L, KVH, Dh), ("layers", "kv_heads", "head_dim"), "zeros"),
            o_bias=ParamSpec((L, D), ("layers", "norm"), "zeros"),
        )
    specs = {
        "embed": ParamSpec((V, D), ("vocab", "embed")),
        "final_norm": ParamSpec((D,), ("norm",), "ones"),
        "layers": {
            "input_norm": ParamSpec((L, D), ("layers", "norm"), "ones"),
            "post_norm": ParamSpec((L, D), ("layers", "norm"), "ones"),
            "attn": attn,
            "mlp": {
                "gate": ParamSpec((L, D, I), ("layers", "embed", "mlp")),
                "up": ParamSpec((L, D, I), ("layers", "embed", "mlp")),
                "down": ParamSpec((L, I, D), ("layers", "mlp", "embed")),
            },
        },
    }
    if not config.tie_word_embeddings:
        specs["lm_head"] = ParamSpec((V, D), ("vocab", "embed"))
    return specs


# ------------------------------------------------------------------------------------------ layers
def qkv(config: ModelConfig, p: dict, h: jax.Array, cos: jax.Array, sin: jax.Array):
    dt = h.dtype
    q = jnp.einsum("btd,dhk->bthk", h, p["q"].astype(dt))
    k = jnp.einsum("btd,dhk->bthk", h, p["k"].astype(dt))
    v = jnp.einsum("btd,dhk->bthk", h, p["v"].astype(dt))
    if config.attention_bias:
        q, k, v = q + p["q_bias"].astype(dt), k + p["k_bias"].astype(dt), v + p["v_bias"].astype(dt)
    q = rms_norm(q, p["q_norm"], config.rms_norm_eps)
    k = rms_norm(k, p["k_norm"], config.rms_norm_eps)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    q = constrain(q, ("act_batch", "act_length", "act_heads", None), config)
    k = constrain(k, ("act_batch", "act_length", "act_kv_heads", None), config)
    v = constrain(v, ("act_batch", "act_length", "act_kv_heads", None), config)
    return q, k, v


def attn_out(config: ModelConfig, p: dict, o: jax.Array) -> jax.Array:
    out = jnp.einsum("bthk,hkd->btd", o, p["o"].astype(o.dtype))
    if config.attention_bias:
        out = out + p["o_bias"].astype(o.dtype)
    return out


def mlp(config: ModelConfig, lp: dict, x: jax.Array) -> jax.Array:
    h = rms_norm(x, lp["post_norm"], config.rms_norm_eps)
    m = lp["mlp"]
    return swiglu(h, m["gate"], m["up"], m["down"], lambda a, ax: constrain(a, ax, config))


def _residual(config, x):
    return constrain(x, ("act_batch", "act_length", "act_embed"), config)


def _layer(config: ModelConfig, lp: dict, x: jax.Array, rope, spec, branch_in=None):
    """One decoder layer on the trunk and, if given, on the CSD teacher branches.

    branch_in = (xb, rope_b, (trunk_spec_b, self_spec_b)): the branches use stop-gradient copies of the same
    (already gathered) layer parameters and stop-gradient trunk K/V, so they carry no tangent and cost no
    backward work. A branch query attends to two key groups, the trunk's and its own branch's, merged
    exactly by their log-sum-exps (attention.attend_groups).
    """
    cos, sin = rope
    kw = config_kwargs(config)
    with jax.named_scope("trunk"):
        h = rms_norm(x, lp["input_norm"], config.rms_norm_eps)
        with jax.named_scope("attention"):
            q, k, v = qkv(config, lp["attn"], h, cos, sin)
            x = _residual(config, x + attn_out(config, lp["attn"], attend(q, k, v, spec, **kw)))
        x = _residual(config, x + mlp(config, lp, x))
    if branch_in is None:
        return x, None
    xb, (cos_b, sin_b), (to_trunk, to_self) = branch_in
    with jax.named_scope("csd_branches"):
        pb = jax.lax.stop_gradient(lp)
        hb = rms_norm(xb, pb["input_norm"], config.rms_norm_eps)
        with jax.named_scope("attention"):
            qb, kb, vb = qkv(config, pb["attn"], hb, cos_b, sin_b)
            groups = [(jax.lax.stop_gradient(k), jax.lax.stop_gradient(v), to_trunk), (kb, vb, to_self)]
            xb = _residual(config, xb + attn_out(config, pb["attn"], attend_groups(qb, groups, **kw)))
        xb = _residual(config, xb + mlp(config, pb, xb))
    return x, xb


def _run_layers(config: ModelConfig, layers: dict, x, rope, spec, branch=None):
    """Applies all layers (lax.scan over the stacked params, or a Python loop); returns (x, xb)."""
    def body(carry, lp):
        x, xb = carry
        bin_ = None if branch is None else (xb, branch[0], branch[1])
        x, xb = _layer(config, lp, x, rope, spec, bin_)
        return (x, xb), None

    body = maybe_remat(body, config)
    xb0 = None if branch is None else branch[2]
    if config.scan_layers:
        (x, xb), _ = jax.lax.scan(body, (x, xb0), layers)
    else:
        carry = (x, xb0)
        for i in range(config.num_hidden_layers):
            carry, _ = body(carry, jax.tree.map(lambda a: a[i], layers))
        x, xb = carry
    return x, xb


def hidden_states(config: ModelConfig, params: dict, tokens: jax.Array, positions=None, segment_ids=None,
                  branch: dict | None = None):
    """Final-norm hidden states [B, T, D] of the trunk (and [B, Tb, D] of the branches, else None).

    tokens/positions/segment_ids: [B, T]; segment id 0 marks padding; a packed row holds several segments
    whose positions restart. `branch` (CSD teacher branches, all [B, Tb]): ``tokens``, ``positions``,
    ``branch_ids`` (0 = pad), ``trunk_segment`` and ``prefix_len`` -- see masks.branch_specs.
    """
    positions, segment_ids = default_positions_segments(tokens, positions, segment_ids)
    dt = config.compute_dtype
    x = _residual(config, embed_lookup(params["embed"], tokens, dt, config))
    rope = rope_tables(positions, config.rotary_dim, config.rope_theta)
    spec = causal_spec(segment_ids)
    br = None
    if branch is not None:
        emb = jax.lax.stop_gradient(params["embed"])
        xb = _residual(config, embed_lookup(emb, branch["tokens"], dt, config))
        rope_b = rope_tables(branch["positions"], config.rotary_dim, config.rope_theta)
        specs_b = branch_specs(segment_ids, branch["trunk_segment"], branch["prefix_len"], branch["branch_ids"])
        br = (rope_b, specs_b, xb)
    x, xb = _run_layers(config, params["layers"], x, rope, spec, br)
    x = rms_norm(x, params["final_norm"], config.rms_norm_eps)
    if xb is not None:
        xb = rms_norm(xb, jax.lax.stop_gradient(params["final_norm"]), config.rms_norm_eps)
    return x, xb


# ------------------------------------------------------------------------------------------ decoding
def init_cache(config: ModelConfig, batch: int, max_len: int) -> dict:
    return kv_cache.init_kv(config.num_hidden_layers, batch, max_len, config.num_key_value_heads,
                            config.head_dim, config.compute_dtype)


def cache_axes(config: ModelConfig) -> dict:
    return kv_cache.kv_axes()


def extend(config: ModelConfig, params: dict, cache: dict, tokens: jax.Array, positions: jax.Array,
           segment_ids: jax.Array | None = None):
    """Runs T new tokens [B, T] through the model on top of `cache`; returns (hidden [B, T, D], cache).

    Prefill is `extend` with the prompt; decoding is `extend` with one token per row.
    """
    if segment_ids is None:
        segment_ids = jnp.ones(tokens.shape, jnp.int32)
    dt = config.compute_dtype
    index = cache["index"]
    seg_all, q_slots = kv_cache.write_segments(cache, segment_ids)
    spec = cache_spec(segment_ids, q_slots, seg_all)
    kw = config_kwargs(config)
    cos, sin = rope_tables(positions, config.rotary_dim, config.rope_theta)
    x = embed_lookup(params["embed"], tokens, dt, config)

    def body(x, inputs):
        lp, kc, vc = inputs
        with jax.named_scope("trunk"):
            h = rms_norm(x, lp["input_norm"], config.rms_norm_eps)
            with jax.named_scope("attention"):
                q, k, v = qkv(config, lp["attn"], h, cos, sin)
                kc, vc = kv_cache.write_layer(kc, vc, k, v, index)
                x = x + attn_out(config, lp["attn"], attend(q, kc, vc, spec, **kw))
            x = x + mlp(config, lp, x)
        return x, (kc, vc)

    if config.scan_layers:
        x, (ks, vs) = jax.lax.scan(body, x, (params["layers"], cache["k"], cache["v"]))
    else:
        ks, vs = [], []
        for i in range(config.num_hidden_layers):
            x, (kc, vc) = body(x, jax.tree.map(lambda a: a[i], (params["layers"], cache["k"], cache["v"])))
            ks.append(kc)
            vs.append(vc)
        ks, vs = jnp.stack(ks), jnp.stack(vs)
    x = rms_norm(x, params["final_norm"], config.rms_norm_eps)
    new_cache = {"k": ks, "v": vs, "segment_ids": seg_all, "index": index + tokens.shape[1]}
    return x, new_cache
