"""Qwen3 <-> HF `Qwen3ForCausalLM` tensor names (the table models/hf.py converts with). The model itself is
models/qwen3.py."""

from __future__ import annotations

from mimesis_jax.models.config import ModelConfig
from mimesis_jax.models.hf import HFTensor, linear_in, linear_out


hf_name = None  # a Qwen3 checkpoint's tensor names are the names hf_tensors lists: nothing to normalise


def hf_tensors(config: ModelConfig):
    """HF `Qwen3ForCausalLM` tensor names and their place in our params (see models/hf.py)."""
    D, H, KVH, Dh, I, V = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                           config.head_dim, config.intermediate_size, config.vocab_size)
    out = [HFTensor("model.embed_tokens.weight", ("embed",), None, (V, D)),
           HFTensor("model.norm.weight", ("final_norm",), None, (D,))]
    if not config.tie_word_embeddings:
        out.append(HFTensor("lm_head.weight", ("lm_head",), None, (V, D)))
    ident = (lambda w: w, lambda w: w)
    for i in range(config.num_hidden_layers):
        pre = f"model.layers.{i}."
        rows = [
            ("input_layernorm.weight", ("input_norm",), (D,), ident),
            ("post_attention_layernorm.weight", ("post_norm",), (D,), ident),
            ("self_attn.q_proj.weight", ("attn", "q"), (H * Dh, D), linear_in((H, Dh))),
            ("self_attn.k_proj.weight", ("attn", "k"), (KVH * Dh, D), linear_in((KVH, Dh))),
            ("self_attn.v_proj.weight", ("attn", "v"), (KVH * Dh, D), linear_in((KVH, Dh))),
            ("self_attn.o_proj.weight", ("attn", "o"), (D, H * Dh), linear_out((H, Dh))),
            ("self_attn.q_norm.weight", ("attn", "q_norm"), (Dh,), ident),
            ("self_attn.k_norm.weight", ("attn", "k_norm"), (Dh,), ident),
            ("mlp.gate_proj.weight", ("mlp", "gate"), (I, D), linear_in((I,))),
            ("mlp.up_proj.weight", ("mlp", "up"), (I, D), linear_in((I,))),
            ("mlp.down_proj.weight", ("mlp", "down"), (D, I), linear_out((I,))),
        ]
        if config.attention_bias:
            flat = lambda w: w.reshape(-1)  # noqa: E731
            rows += [
                ("self_attn.q_proj.bias", ("attn", "q_bias"), (H * Dh,), (lambda w: w.reshape(H, Dh), flat)),
                ("self_attn.k_proj.bias", ("attn", "k_bias"), (KVH * Dh,), (lambda w: w.reshape(KVH, Dh), flat)),
                ("self_attn.v_proj.bias", ("attn", "v_bias"), (KVH * Dh,), (lambda w: w.reshape(KVH, Dh), flat)),
                ("self_attn.o_proj.bias", ("attn", "o_bias"), (D,), ident),
            ]
        for name, path, shape, (to_ours, to_hf) in rows:
            out.append(HFTensor(pre + name, ("layers",) + path, i, shape, to_ours, to_hf))
    return out
