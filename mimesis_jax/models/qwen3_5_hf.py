"""Qwen3.5 <-> HF `Qwen3_5ForCausalLM` tensor names (the table models/hf.py converts with). The model itself is
models/qwen3_5.py."""

from __future__ import annotations

import numpy as np

from mimesis_jax.models.config import ModelConfig
from mimesis_jax.models.hf import HFTensor, linear_in, linear_out
from mimesis_jax.models.qwen3_5 import FULL, LINEAR, check_supported, linear_dims


def hf_name(name: str) -> str | None:
    """Normalises a checkpoint tensor name: the text part of a full `qwen3_5` checkpoint loses its
    ``model.language_model.`` prefix; vision (``model.visual.*``) and multi-token-prediction (``mtp.*``)
    tensors are ignored (None)."""
    if name.startswith(("mtp.", "model.visual.", "visual.")):
        return None
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    return name


def _grouped_qkv(config: ModelConfig):
    """HF rows [q (Hk*Dk) | k (Hk*Dk) | v (Hv*Dv), ...] <-> ours [Hk, 2 Dk + r Dv, ...] (grouped by key head)."""
    Hk, Hv, Dk, Dv, r, Cg = linear_dims(config)

    def to_groups(w):
        rest = w.shape[1:]
        q = w[:Hk * Dk].reshape((Hk, Dk) + rest)
        k = w[Hk * Dk:2 * Hk * Dk].reshape((Hk, Dk) + rest)
        v = w[2 * Hk * Dk:].reshape((Hk, r * Dv) + rest)
        return np.concatenate([q, k, v], axis=1)

    def from_groups(w):
        rest = w.shape[2:]
        parts = (w[:, :Dk], w[:, Dk:2 * Dk], w[:, 2 * Dk:])
        return np.concatenate([p.reshape((-1,) + rest) for p in parts], axis=0)

    qkv = (lambda w: np.ascontiguousarray(to_groups(w).transpose(2, 0, 1)),  # [C, D] -> [D, Hk, Cg]
           lambda w: np.ascontiguousarray(from_groups(w.transpose(1, 2, 0))))
    conv = (lambda w: np.ascontiguousarray(to_groups(w[:, 0, :]).transpose(2, 0, 1)),  # [C, 1, K] -> [K, Hk, Cg]
            lambda w: np.ascontiguousarray(from_groups(w.transpose(1, 2, 0))[:, None, :]))
    return qkv, conv


def hf_tensors(config: ModelConfig):
    """HF `Qwen3_5ForCausalLM` tensor names and their place in our params (see models/hf.py)."""
    check_supported(config)
    D, H, KVH, Dh, I, V = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                           config.head_dim, config.intermediate_size, config.vocab_size)
    Hk, Hv, Dk, Dv, _, _ = linear_dims(config)
    C, K = 2 * Hk * Dk + Hv * Dv, config.linear_conv_kernel_dim
    ident = (lambda w: w, lambda w: w)
    qkv, conv = _grouped_qkv(config)
    out = [HFTensor("model.embed_tokens.weight", ("embed",), None, (V, D)),
           HFTensor("model.norm.weight", ("final_norm",), None, (D,))]
    if not config.tie_word_embeddings:
        out.append(HFTensor("lm_head.weight", ("lm_head",), None, (V, D)))
    seen = {LINEAR: 0, FULL: 0}
    for i, t in enumerate(config.layer_types):
        j = seen[t]
        seen[t] += 1
        rows = [
            ("input_layernorm.weight", ("input_norm",), (D,), ident),
            ("post_attention_layernorm.weight", ("post_norm",), (D,), ident),
            ("mlp.gate_proj.weight", ("mlp", "gate"), (I, D), linear_in((I,))),
            ("mlp.up_proj.weight", ("mlp", "up"), (I, D), linear_in((I,))),
            ("mlp.down_proj.weight", ("mlp", "down"), (D, I), linear_out((I,))),
        ]
        if t == LINEAR:
            group, m = "linear_layers", "linear_attn."
            rows += [
                (m + "in_proj_qkv.weight", ("mixer", "qkv"), (C, D), qkv),
                (m + "conv1d.weight", ("mixer", "conv"), (C, 1, K), conv),
                (m + "in_proj_z.weight", ("mixer", "z"), (Hv * Dv, D), linear_in((Hv, Dv))),
                (m + "in_proj_b.weight", ("mixer", "b"), (Hv, D), linear_in((Hv,))),
                (m + "in_proj_a.weight", ("mixer", "a"), (Hv, D), linear_in((Hv,))),
                (m + "A_log", ("mixer", "A_log"), (Hv,), ident),
                (m + "dt_bias", ("mixer", "dt_bias"), (Hv,), ident),
                (m + "norm.weight", ("mixer", "norm"), (Dv,), ident),
                (m + "out_proj.weight", ("mixer", "out"), (D, Hv * Dv), linear_out((Hv, Dv))),
            ]
        else:
            group, m = "full_layers", "self_attn."
            rows += [
                (m + "q_proj.weight", ("attn", "q_gate"), (H * 2 * Dh, D), linear_in((H, 2 * Dh))),
                (m + "k_proj.weight", ("attn", "k"), (KVH * Dh, D), linear_in((KVH, Dh))),
                (m + "v_proj.weight", ("attn", "v"), (KVH * Dh, D), linear_in((KVH, Dh))),
                (m + "o_proj.weight", ("attn", "o"), (D, H * Dh), linear_out((H, Dh))),
                (m + "q_norm.weight", ("attn", "q_norm"), (Dh,), ident),
                (m + "k_norm.weight", ("attn", "k_norm"), (Dh,), ident),
            ]
        for name, path, shape, (to_ours, to_hf) in rows:
            out.append(HFTensor(f"model.layers.{i}.{name}", (group,) + path, j, shape, to_ours, to_hf))
    return out
