"""Qwen3.5 hybrid decoder (the user simulator): gated DeltaNet layers + gated full attention.

Architecture (HF `Qwen3_5ForCausalLM`, text part of `Qwen3_5ForConditionalGeneration`), per layer
``x += mixer(norm(x)); x += mlp(norm(x))`` where the mixer follows ``config.layer_types`` (every
`full_attention_interval`-th layer is full attention, the others linear attention):

* **linear attention** (gated DeltaNet): ``[q|k|v] = in_proj_qkv(h)`` -> depthwise causal conv1d (kernel
  `linear_conv_kernel_dim`, SiLU) -> q, k L2-normalised (q also times Dk^-1/2), key heads repeated to the value
  heads; ``beta = sigmoid(in_proj_b(h))``, ``g = -exp(A_log) * softplus(in_proj_a(h) + dt_bias)``; the gated
  delta rule (models/gated_delta.py: chunked for training and prefill, recurrent for one-token decoding); a
  gated RMSNorm per value head ``rmsnorm(o) * w * silu(in_proj_z(h))``; ``out_proj``.
* **full attention**: ``q_proj`` yields per head a query and an output gate; RMSNorm on q and k; partial
  rotate-half RoPE on the first ``head_dim * partial_rotary_factor`` features; GQA;
  ``o_proj(attention * sigmoid(gate))``.

RMSNorms of this family compute ``x_hat * (1 + w)`` with w initialised at 0 (input/post/final norms and the
q/k norms); only the gated norm inside the DeltaNet uses a plain weight ``x_hat * w`` (initialised at 1).

Parameter pytree, stacked per layer *type* (layer i of type t is entry #(layers of type t before i))::

    embed [V, D]   lm_head [V, D] (untied only)   final_norm [D]
    linear_layers/input_norm, post_norm [Nl, D]     mlp/gate, up [Nl, D, I]  down [Nl, I, D]
    linear_layers/mixer/qkv  [Nl, D, Hk, 2 Dk + r Dv]   conv [Nl, K, Hk, 2 Dk + r Dv]
                        z    [Nl, D, Hv, Dv]   b, a [Nl, D, Hv]   A_log, dt_bias [Nl, Hv]   norm [Nl, Dv]
                        out  [Nl, Hv, Dv, D]
    full_layers/input_norm, post_norm, mlp (as above, [Nf, ...])
    full_layers/attn/q_gate [Nf, D, H, 2 Dh]   k, v [Nf, D, KVH, Dh]   o [Nf, H, Dh, D]   q_norm, k_norm [Nf, Dh]

with r = Hv / Hk. The fused q/k/v projection (and its conv) are stored *grouped by key head*: group j holds
q_j, k_j and the r value heads j*r .. j*r+r-1 that read key head j (transformers' repeat_interleave). So when
the key heads are split over the `tensor` mesh axis, each shard owns whole groups and the conv, the rule and
the gated norm run without cross-shard traffic. hf.py converts to and from HF's [q | k | v] row order.

Execution: the layer pattern is split into its shortest repeating block (e.g. 3 linear + 1 full) and the
blocks run under `lax.scan` (``config.scan_layers``) or a Python loop, so one block is compiled once.

Decoding cache (`init_cache`): the KV cache of the full layers (models/kv_cache.py) plus, per linear layer,
the conv window (the last K-1 conv inputs) and the recurrent state [B, Hv, Dk, Dv] (float32); ``conv_seg``
[B, K-1] are the segment ids of the window slots and ``state_seg`` [B] the segment the state belongs to.

Segments (packing, left padding): segment id 0 tokens are padding -- they leave the recurrent state
untouched (beta = 0, g = 0) and no conv tap reads them; the state is zeroed where a new segment starts
(a token whose segment differs from the last non-padding token's) and a conv tap only reads inputs of the
same segment. A packed row thus equals its sequences run separately, and a left-padded prompt equals the
unpadded one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mimesis_jax.models import kv_cache
from mimesis_jax.models.attention import attend, cache_spec, causal_spec, config_kwargs
from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.models.gated_delta import chunk_gated_delta_rule, l2_normalize, recurrent_gated_delta_rule
from mimesis_jax.models.layers import (ParamSpec, apply_rope, default_positions_segments, embed_lookup, maybe_remat,
                                      rms_norm, rope_tables, swiglu)
from mimesis_jax.sharding import constrain

LINEAR, FULL = "linear_attention", "full_attention"
CHUNK_SIZE = 64  # tokens per chunk of the chunked gated delta rule (as transformers / fla)


# ------------------------------------------------------------------------------------------ layout
def layer_block(config: ModelConfig) -> tuple[tuple[str, ...], int]:
    """(shortest repeating block of `layer_types`, number of repeats), e.g. ((lin, lin, lin, full), 8)."""
    types = tuple(config.layer_types)
    L = len(types)
    for p in range(1, L + 1):
        if L % p == 0 and types == types[:p] * (L // p):
            return types[:p], L // p
    raise AssertionError("unreachable")


def layer_counts(config: ModelConfig) -> tuple[int, int]:
    n_lin = sum(t == LINEAR for t in config.layer_types)
    return n_lin, len(config.layer_types) - n_lin


def linear_dims(config: ModelConfig):
    Hk, Hv = config.linear_num_key_heads, config.linear_num_value_heads
    Dk, Dv = config.linear_key_head_dim, config.linear_value_head_dim
    return Hk, Hv, Dk, Dv, Hv // Hk, 2 * Dk + (Hv // Hk) * Dv


def check_supported(config: ModelConfig) -> None:
    if config.model_type != "qwen3_5_text":
        raise ConfigError(f"config key 'model_type': qwen3_5.py implements 'qwen3_5_text', got {config.model_type!r}")
    if not config.attn_output_gate:
        raise ConfigError("config key 'attn_output_gate': qwen3_5_text full attention is always output-gated "
                          "(got False)")
    if config.attention_bias:
        raise ConfigError("config key 'attention_bias': biases are not implemented for qwen3_5_text (got True)")


# ------------------------------------------------------------------------------------------ params
def _common_specs(config: ModelConfig, n: int) -> dict:
    D, I = config.hidden_size, config.intermediate_size
    return {
        "input_norm": ParamSpec((n, D), ("layers", "norm"), "zeros"),
        "post_norm": ParamSpec((n, D), ("layers", "norm"), "zeros"),
        "mlp": {
            "gate": ParamSpec((n, D, I), ("layers", "embed", "mlp")),
            "up": ParamSpec((n, D, I), ("layers", "embed", "mlp")),
            "down": ParamSpec((n, I, D), ("layers", "mlp", "embed")),
        },
    }


def param_specs(config: ModelConfig) -> dict:
    check_supported(config)
    D, V, H, KVH, Dh = (config.hidden_size, config.vocab_size, config.num_attention_heads,
                        config.num_key_value_heads, config.head_dim)
    Hk, Hv, Dk, Dv, _, Cg = linear_dims(config)
    K = config.linear_conv_kernel_dim
    n_lin, n_full = layer_counts(config)
    specs: dict = {
        "embed": ParamSpec((V, D), ("vocab", "embed")),
        "final_norm": ParamSpec((D,), ("norm",), "zeros"),
    }
    if n_lin:
        n = n_lin
        specs["linear_layers"] = dict(_common_specs(config, n), mixer={
            "qkv": ParamSpec((n, D, Hk, Cg), ("layers", "embed", "lin_kv_heads", "lin_dim")),
            "conv": ParamSpec((n, K, Hk, Cg), ("layers", "conv", "lin_kv_heads", "lin_dim")),
            "z": ParamSpec((n, D, Hv, Dv), ("layers", "embed", "lin_heads", "lin_dim")),
            "b": ParamSpec((n, D, Hv), ("layers", "embed", "lin_heads")),
            "a": ParamSpec((n, D, Hv), ("layers", "embed", "lin_heads")),
            "A_log": ParamSpec((n, Hv), ("layers", "lin_heads"), "a_log"),
            "dt_bias": ParamSpec((n, Hv), ("layers", "lin_heads"), "dt_bias"),
            "norm": ParamSpec((n, Dv), ("layers", "lin_dim"), "ones"),
            "out": ParamSpec((n, Hv, Dv, D), ("layers", "lin_heads", "lin_dim", "embed")),
        })
    if n_full:
        n = n_full
        specs["full_layers"] = dict(_common_specs(config, n), attn={
            "q_gate": ParamSpec((n, D, H, 2 * Dh), ("layers", "embed", "heads", "head_dim")),
            "k": ParamSpec((n, D, KVH, Dh), ("layers", "embed", "kv_heads", "head_dim")),
            "v": ParamSpec((n, D, KVH, Dh), ("layers", "embed", "kv_heads", "head_dim")),
            "o": ParamSpec((n, H, Dh, D), ("layers", "heads", "head_dim", "embed")),
            "q_norm": ParamSpec((n, Dh), ("layers", "head_dim"), "zeros"),
            "k_norm": ParamSpec((n, Dh), ("layers", "head_dim"), "zeros"),
        })
    if not config.tie_word_embeddings:
        specs["lm_head"] = ParamSpec((V, D), ("vocab", "embed"))
    return specs


# ------------------------------------------------------------------------------------------ pieces
def norm(config: ModelConfig, x: jax.Array, w: jax.Array) -> jax.Array:
    """The family's zero-centred RMSNorm: x_hat * (1 + w)."""
    return rms_norm(x, w, config.rms_norm_eps, offset=1.0)


def _residual(config: ModelConfig, x: jax.Array) -> jax.Array:
    return constrain(x, ("act_batch", "act_length", "act_embed"), config)


def mlp(config: ModelConfig, lp: dict, x: jax.Array) -> jax.Array:
    h = norm(config, x, lp["post_norm"])
    m = lp["mlp"]
    return swiglu(h, m["gate"], m["up"], m["down"], lambda a, ax: constrain(a, ax, config))


def gated_rms_norm(config: ModelConfig, o: jax.Array, z: jax.Array, w: jax.Array) -> jax.Array:
    """Gated RMSNorm of the DeltaNet output (plain weight, norm before gate): rmsnorm(o) * w * silu(z)."""
    n = rms_norm(o, w, config.rms_norm_eps)
    return (n.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))).astype(o.dtype)


def _full_attention(config: ModelConfig, p: dict, h: jax.Array, ctx: dict, cache: dict | None):
    """Gated full attention; with a layer cache, writes K/V at the cache index and attends over the cache."""
    dt, Dh = h.dtype, config.head_dim
    qg = jnp.einsum("btd,dhk->bthk", h, p["q_gate"].astype(dt))
    q, gate = qg[..., :Dh], qg[..., Dh:]
    k = jnp.einsum("btd,dhk->bthk", h, p["k"].astype(dt))
    v = jnp.einsum("btd,dhk->bthk", h, p["v"].astype(dt))
    q = apply_rope(norm(config, q, p["q_norm"]), *ctx["rope"])
    k = apply_rope(norm(config, k, p["k_norm"]), *ctx["rope"])
    q = constrain(q, ("act_batch", "act_length", "act_heads", None), config)
    k = constrain(k, ("act_batch", "act_length", "act_kv_heads", None), config)
    v = constrain(v, ("act_batch", "act_length", "act_kv_heads", None), config)
    new = None
    if cache is not None:
        kc, vc = kv_cache.write_layer(cache["k"], cache["v"], k, v, ctx["index"])
        k, v, new = kc, vc, {"k": kc, "v": vc}
    o = attend(q, k, v, ctx["spec"], **config_kwargs(config)) * jax.nn.sigmoid(gate)
    return jnp.einsum("bthk,hkd->btd", o, p["o"].astype(dt)), new


def linear_context(segment_ids: jax.Array, state_seg: jax.Array, window_seg: jax.Array) -> dict:
    """Per-token bookkeeping shared by every linear layer of one call.

    segment_ids [B, T] of the new tokens; state_seg [B]: segment of the state entering (0 = none);
    window_seg [B, K-1]: segment ids of the conv window slots (0 = empty). Returns ``valid`` [B, T] (not
    padding), ``reset`` [B, T] (zero the state before this token), ``taps`` [K, B, T] (conv tap k, reading
    input t - (K-1) + k, is live) and the new ``state_seg`` / ``window_seg``.
    """
    B, T = segment_ids.shape
    seg = segment_ids.astype(jnp.int32)
    valid = seg != 0
    # Segment of the last non-padding token before t (or the state's own segment).
    idx = jnp.where(valid, jnp.arange(T, dtype=jnp.int32)[None], -1)
    last = jax.lax.cummax(idx, axis=1)
    before = jnp.concatenate([jnp.full((B, 1), -1, jnp.int32), last[:, :-1]], axis=1)
    prev = jnp.where(before >= 0, jnp.take_along_axis(seg, jnp.maximum(before, 0), axis=1), state_seg[:, None])
    reset = valid & (seg != prev)
    new_state_seg = jnp.where(last[:, -1] >= 0, jnp.take_along_axis(seg, jnp.maximum(last[:, -1:], 0), 1)[:, 0],
                              state_seg)
    Km1 = window_seg.shape[1]
    segcat = jnp.concatenate([window_seg.astype(jnp.int32), seg], axis=1)  # [B, K-1+T]
    taps = jnp.stack([(segcat[:, j:j + T] == seg) & valid for j in range(Km1 + 1)])
    return {"valid": valid, "reset": reset, "taps": taps, "state_seg": new_state_seg,
            "window_seg": segcat[:, T:]}


def deltanet_gates(a: jax.Array, b: jax.Array, A_log: jax.Array, dt_bias: jax.Array, valid: jax.Array):
    """Decay and write strength of the gated delta rule, in float32, per token and value head:

        g = -exp(A_log) * softplus(a + dt_bias)   (log alpha_t <= 0),      beta = sigmoid(b),

    with g = beta = 0 on padding tokens (``valid`` False), which then leave the state untouched.
    """
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    g = -jnp.exp(f32(A_log)) * jax.nn.softplus(f32(a) + f32(dt_bias))
    m = valid[..., None]
    return jnp.where(m, g, 0.0), jnp.where(m, jax.nn.sigmoid(f32(b)), 0.0)


def causal_conv(x: jax.Array, w: jax.Array, window: jax.Array, taps: jax.Array):
    """Depthwise causal conv: y_t = sum_j w[j] * x_{t-(K-1)+j} over live taps; returns (y, new window).

    x [B, T, Hk, Cg] new inputs, w [K, Hk, Cg], window [B, K-1, Hk, Cg] the previous inputs.
    """
    T, K = x.shape[1], w.shape[0]
    xx = jnp.concatenate([window.astype(x.dtype), x], axis=1)
    wd = w.astype(x.dtype)
    y = sum(jnp.where(taps[j][..., None, None], xx[:, j:j + T], 0) * wd[j] for j in range(K))
    return y, xx[:, T:]


def _gated_deltanet(config: ModelConfig, p: dict, h: jax.Array, ctx: dict, cache: dict | None):
    """The linear-attention mixer; returns (out [B, T, D], new layer cache or None)."""
    dt = h.dtype
    B, T, _ = h.shape
    Hk, Hv, Dk, Dv, r, Cg = linear_dims(config)
    K = config.linear_conv_kernel_dim
    mixed = jnp.einsum("btd,dgc->btgc", h, p["qkv"].astype(dt))
    mixed = constrain(mixed, ("act_batch", "act_length", "act_kv_heads", None), config)
    window = jnp.zeros((B, K - 1, Hk, Cg), dt) if cache is None else cache["conv"]
    y, new_window = causal_conv(mixed, p["conv"], window, ctx["taps"])
    y = jax.nn.silu(y)
    q = l2_normalize(y[..., :Dk]) * Dk ** -0.5
    k = l2_normalize(y[..., Dk:2 * Dk])
    v = y[..., 2 * Dk:].reshape(B, T, Hv, Dv)  # value head j*r + i reads key head j
    if r > 1:
        q, k = jnp.repeat(q, r, axis=2), jnp.repeat(k, r, axis=2)
    q = constrain(q, ("act_batch", "act_length", "act_heads", None), config)
    k = constrain(k, ("act_batch", "act_length", "act_heads", None), config)
    v = constrain(v, ("act_batch", "act_length", "act_heads", None), config)
    z = jnp.einsum("btd,dhv->bthv", h, p["z"].astype(dt))
    b = jnp.einsum("btd,dh->bth", h, p["b"].astype(dt))
    a = jnp.einsum("btd,dh->bth", h, p["a"].astype(dt))
    g, beta = deltanet_gates(a, b, p["A_log"], p["dt_bias"], ctx["valid"])
    state = None if cache is None else cache["state"]
    if cache is not None and T == 1:
        o, new_state = recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=state, reset=ctx["reset"])
    else:
        o, new_state = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=CHUNK_SIZE, initial_state=state,
                                              reset=ctx["reset"])
    o = gated_rms_norm(config, o, z, p["norm"])
    out = jnp.einsum("bthv,hvd->btd", o, p["out"].astype(dt))
    if cache is None:
        return out, None
    return out, {"conv": constrain(new_window, ("act_batch", None, "act_kv_heads", None), config),
                 "state": constrain(new_state, ("act_batch", "act_heads", None, None), config)}


def _linear_layer(config, lp, x, ctx, cache):
    with jax.named_scope("deltanet"):
        out, new = _gated_deltanet(config, lp["mixer"], norm(config, x, lp["input_norm"]), ctx, cache)
    x = _residual(config, x + out)
    return _residual(config, x + mlp(config, lp, x)), new


def _full_layer(config, lp, x, ctx, cache):
    with jax.named_scope("attention"):
        out, new = _full_attention(config, lp["attn"], norm(config, x, lp["input_norm"]), ctx, cache)
    x = _residual(config, x + out)
    return _residual(config, x + mlp(config, lp, x)), new


# ------------------------------------------------------------------------------------------ runner
def _stack(items):
    return None if not items else jax.tree.map(lambda *a: jnp.stack(a), *items)


def _runs(block: tuple[str, ...]) -> list[tuple[str, int]]:
    """Consecutive same-type layers of a block: (lin, lin, lin, full) -> [(lin, 3), (full, 1)]."""
    out: list[tuple[str, int]] = []
    for t in block:
        if out and out[-1][0] == t:
            out[-1] = (t, out[-1][1] + 1)
        else:
            out.append((t, 1))
    return out


def _run_layers(config: ModelConfig, params: dict, x, lin_ctx, full_ctx, lin_cache=None, full_cache=None,
                remat: bool = False):
    """Applies every layer in order; returns (x, new linear-layer caches, new full-layer caches).

    Per-type stacks [N_t, ...] are viewed as [repeats, per_block, ...]. With ``config.scan_layers`` the
    block is one `lax.scan` step over the repeats and each run of same-type layers inside it a nested scan,
    so one linear and one full layer are compiled whatever the depth; otherwise every layer is unrolled.
    """
    block, G = layer_block(config)
    n_per_block = {LINEAR: sum(t == LINEAR for t in block), FULL: sum(t == FULL for t in block)}

    def group(tree, n):
        return None if tree is None or n == 0 else jax.tree.map(lambda a: a.reshape((G, n) + a.shape[1:]), tree)

    def ungroup(tree):
        return None if tree is None else jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:]), tree)

    fns = {LINEAR: lambda lp, x, c: _linear_layer(config, lp, x, lin_ctx, c),
           FULL: lambda lp, x, c: _full_layer(config, lp, x, full_ctx, c)}
    if remat:
        fns = {t: maybe_remat(f, config) for t, f in fns.items()}
    xs = {LINEAR: (group(params.get("linear_layers"), n_per_block[LINEAR]), group(lin_cache, n_per_block[LINEAR])),
          FULL: (group(params.get("full_layers"), n_per_block[FULL]), group(full_cache, n_per_block[FULL]))}
    at = lambda tree, i: None if tree is None else jax.tree.map(lambda a: a[i], tree)  # noqa: E731
    sl = lambda tree, i, n: None if tree is None else jax.tree.map(lambda a: a[i:i + n], tree)  # noqa: E731

    def run(fn, x, layer_params, caches):
        """One run of same-type layers ([n, ...] params and caches) -> (x, [n, ...] new caches)."""
        def step(x, inputs):
            return fn(inputs[0], x, inputs[1])
        if config.scan_layers:
            return jax.lax.scan(step, x, (layer_params, caches))
        outs = []
        for i in range(jax.tree.leaves(layer_params)[0].shape[0]):
            x, new = step(x, at((layer_params, caches), i))
            outs.append(new)
        return x, _stack(outs)

    def body(x, xs_g):
        outs = {LINEAR: [], FULL: []}
        used = {LINEAR: 0, FULL: 0}
        for t, n in _runs(block):
            lps, caches = xs_g[t]
            x, new = run(fns[t], x, sl(lps, used[t], n), sl(caches, used[t], n))
            used[t] += n
            if new is not None:
                outs[t].append(new)
        cat = lambda parts: None if not parts else jax.tree.map(lambda *a: jnp.concatenate(a), *parts)  # noqa: E731
        return x, (cat(outs[LINEAR]), cat(outs[FULL]))

    if config.scan_layers:
        x, (lin_new, full_new) = jax.lax.scan(body, x, xs)
    else:
        outs = []
        for g_ in range(G):
            x, out = body(x, at(xs, g_))
            outs.append(out)
        lin_new, full_new = _stack([o[0] for o in outs]), _stack([o[1] for o in outs])
    return x, ungroup(lin_new), ungroup(full_new)


def hidden_states(config: ModelConfig, params: dict, tokens: jax.Array, positions=None, segment_ids=None,
                  branch: dict | None = None):
    """Final-norm hidden states [B, T, D] of (packed) rows; returns (hidden, None).

    tokens/positions/segment_ids: [B, T], segment id 0 = padding, packed segments 1, 2, ...
    """
    if branch is not None:
        raise NotImplementedError("qwen3_5_text: CSD teacher branches are implemented for the Qwen3 agent only "
                                  "(the simulator is scored with plain sequences)")
    positions, segment_ids = default_positions_segments(tokens, positions, segment_ids)
    B = tokens.shape[0]
    K = config.linear_conv_kernel_dim
    x = _residual(config, embed_lookup(params["embed"], tokens, config.compute_dtype, config))
    lin_ctx = linear_context(segment_ids, jnp.zeros((B,), jnp.int32), jnp.zeros((B, K - 1), jnp.int32))
    full_ctx = {"rope": rope_tables(positions, config.rotary_dim, config.rope_theta),
                "spec": causal_spec(segment_ids)}
    with jax.named_scope("trunk"):
        x, _, _ = _run_layers(config, params, x, lin_ctx, full_ctx, remat=True)
    return norm(config, x, params["final_norm"]), None


# ------------------------------------------------------------------------------------------ decoding
def init_cache(config: ModelConfig, batch: int, max_len: int) -> dict:
    n_lin, n_full = layer_counts(config)
    cache = kv_cache.init_kv(n_full, batch, max_len, config.num_key_value_heads, config.head_dim,
                             config.compute_dtype)
    if n_full == 0:
        del cache["k"], cache["v"]
    if n_lin:
        Hk, Hv, Dk, Dv, _, Cg = linear_dims(config)
        Km1 = config.linear_conv_kernel_dim - 1
        cache.update(conv=jnp.zeros((n_lin, batch, Km1, Hk, Cg), config.compute_dtype),
                     conv_seg=jnp.zeros((batch, Km1), jnp.int32),
                     state=jnp.zeros((n_lin, batch, Hv, Dk, Dv), jnp.float32),
                     state_seg=jnp.zeros((batch,), jnp.int32))
    return cache


def cache_axes(config: ModelConfig) -> dict:
    n_lin, n_full = layer_counts(config)
    axes = kv_cache.kv_axes()
    if n_full == 0:
        del axes["k"], axes["v"]
    if n_lin:
        axes.update(conv=("layers", "act_batch", None, "act_kv_heads", None), conv_seg=("act_batch", None),
                    state=("layers", "act_batch", "act_heads", None, None), state_seg=("act_batch",))
    return axes


def extend(config: ModelConfig, params: dict, cache: dict, tokens: jax.Array, positions: jax.Array,
           segment_ids: jax.Array | None = None):
    """Runs T new tokens [B, T] on top of `cache`; returns (hidden [B, T, D], new cache).

    Prefill (T > 1) uses the chunked rule started from the cached state, decoding (T = 1) the recurrent step.
    Left padding (segment id 0) leaves every state untouched; a new segment id resets state and conv window.
    """
    if segment_ids is None:
        segment_ids = jnp.ones(tokens.shape, jnp.int32)
    n_lin, n_full = layer_counts(config)
    T = tokens.shape[1]
    x = embed_lookup(params["embed"], tokens, config.compute_dtype, config)
    seg_all, q_slots = kv_cache.write_segments(cache, segment_ids)
    new_cache = {"segment_ids": seg_all, "index": cache["index"] + T}
    lin_ctx = full_ctx = lin_cache = full_cache = None
    if n_lin:
        lin_ctx = linear_context(segment_ids, cache["state_seg"], cache["conv_seg"])
        lin_cache = {"conv": cache["conv"], "state": cache["state"]}
        new_cache.update(conv_seg=lin_ctx["window_seg"], state_seg=lin_ctx["state_seg"])
    if n_full:
        full_ctx = {"rope": rope_tables(positions, config.rotary_dim, config.rope_theta),
                    "spec": cache_spec(segment_ids, q_slots, seg_all), "index": cache["index"]}
        full_cache = {"k": cache["k"], "v": cache["v"]}
    with jax.named_scope("trunk"):
        x, lin_new, full_new = _run_layers(config, params, x, lin_ctx, full_ctx, lin_cache, full_cache)
    if n_lin:
        new_cache.update(lin_new)
    if n_full:
        new_cache.update(full_new)
    return norm(config, x, params["final_norm"]), new_cache
