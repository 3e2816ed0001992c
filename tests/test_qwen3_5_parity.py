"""Qwen3.5 hybrid (simulator backbone) against transformers' Qwen3_5ForCausalLM in torch, fp32."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from helpers import assert_trees_equal, hf_greedy, hf_logits, randomize_torch_model
from mimesis_jax import models
from mimesis_jax.models import qwen3_5
from mimesis_jax.algorithms.logprobs import token_logprobs
from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import ModelConfig

pytest.importorskip("torch")

BASE = dict(vocab_size=97, hidden_size=32, intermediate_size=48, max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
CONFIGS = {
    # 3 linear + 1 full; GQA in both mixers (2 key heads serve 4 value heads)
    "l4_gqa": dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
                   linear_num_key_heads=2, linear_num_value_heads=4),
    # two repeats of the block (the layer scan runs twice); equal key/value heads, Dk != Dv, kernel 3, tied
    "l8_tied": dict(num_hidden_layers=8, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                    linear_conv_kernel_dim=3, linear_key_head_dim=16, linear_value_head_dim=12,
                    linear_num_key_heads=2, linear_num_value_heads=2, tie_word_embeddings=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}),
}


def make_hf_qwen3_5(path: str, seed: int = 0, **cfg) -> str:
    """A random transformers Qwen3_5ForCausalLM (fp32) saved to `path`.

    On top of helpers.randomize_torch_model: the DeltaNet's gated norm has a plain weight (x * w, not
    x * (1 + w)), so it is drawn around 1; A is spread over [0.05, 2] so some heads keep their state for
    tens of tokens and the state carried across 64-token chunks matters.
    """
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**{**BASE, **cfg})).to(torch.float32).eval()
    randomize_torch_model(model, seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):
                p.copy_(torch.log(0.05 + 1.95 * torch.rand(p.shape, generator=g)))
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module", params=list(CONFIGS))
def checkpoint(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    return make_hf_qwen3_5(path, seed=len(request.param), **CONFIGS[request.param])


def _ids(vocab, shape, seed=0):
    return np.random.RandomState(seed).randint(0, vocab, size=shape).astype(np.int32)


BUCKET = (3, 128)  # every forward call is right-padded to this shape: one compile per config


def _logits(config, params, ids, pos=None, seg=None):
    """forward() on [B, T] rows, computed inside a right-padded [3, 128] batch (padding has segment id 0 and
    comes after every real token, so causally it cannot change them; this keeps the test to one compile)."""
    B, T = ids.shape
    pos = np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)) if pos is None else pos
    seg = np.ones((B, T), np.int32) if seg is None else seg
    grow = lambda a: np.pad(a, ((0, BUCKET[0] - B), (0, BUCKET[1] - T)))  # noqa: E731
    return np.asarray(models.forward(config, params, grow(ids), grow(pos), grow(seg)))[:B, :T]


_extend = jax.jit(models.extend, static_argnums=0)


def _extend_logits(config, params, cache, toks, pos, seg):
    h, cache = _extend(config, params, cache, jnp.asarray(toks), jnp.asarray(pos), jnp.asarray(seg))
    return np.asarray(models.logits_from_hidden(config, params, h)), cache


def _separate(config, params, seqs):
    """Each sequence run on its own (one row each, right-padded with segment id 0: one compile)."""
    n = max(s.shape[1] for s in seqs)
    ids = np.zeros((len(seqs), n), np.int32)
    seg = np.zeros((len(seqs), n), np.int32)
    for i, s in enumerate(seqs):
        ids[i, :s.shape[1]], seg[i, :s.shape[1]] = s[0], 1
    pos = np.broadcast_to(np.arange(n, dtype=np.int32), (len(seqs), n))
    out = _logits(config, params, ids, pos, seg)
    return [out[i:i + 1, :s.shape[1]] for i, s in enumerate(seqs)]


def test_logits_match_transformers(checkpoint):
    """70 tokens: two chunks of the chunked rule, the second one partial."""
    config, params = models.load_hf(checkpoint)
    assert config.layer_types == tuple(json.load(open(os.path.join(checkpoint, "config.json")))["layer_types"])
    ids = _ids(config.vocab_size, (2, 70))
    ref = hf_logits(checkpoint, ids)
    ours = _logits(config, params, ids)
    err = np.abs(ours - ref).max()
    print(f"max |logit diff| = {err:.3e} (max |logit| {np.abs(ref).max():.2f})")
    assert np.abs(ref).max() > 0.5, "reference logits too small for a meaningful comparison"
    assert err <= 1e-4


@pytest.mark.user_emitters  # two summation orders compared at 1e-5: the quick emitters' fusions give 1.3e-5
def test_python_loop_equals_scan(tmp_path):
    """On the 8-layer model, where the layer scan runs over two repeats of the block."""
    config, params = models.load_hf(make_hf_qwen3_5(str(tmp_path), seed=len("l8_tied"), **CONFIGS["l8_tied"]))
    ids = _ids(config.vocab_size, (2, 70))
    np.testing.assert_allclose(_logits(config.replace(scan_layers=False), params, ids), _logits(config, params, ids),
                               atol=1e-5)


def test_save_hf_roundtrip_loads_in_transformers(checkpoint, tmp_path):
    config, params = models.load_hf(checkpoint)
    out = str(tmp_path / "export")
    models.save_hf(out, config, params)
    ids = _ids(config.vocab_size, (1, 9), seed=2)
    np.testing.assert_allclose(hf_logits(out, ids), hf_logits(checkpoint, ids), atol=1e-6)
    src = load_file(os.path.join(checkpoint, "model.safetensors"))
    dst = load_file(os.path.join(out, "model.safetensors"))
    assert sorted(src) == sorted(dst)
    for name in src:  # byte-exact tensors, so the grouped q/k/v layout converts back exactly
        np.testing.assert_array_equal(src[name], dst[name], err_msg=name)
    config2, params2 = models.load_hf(out)
    assert config2 == config
    assert_trees_equal(params, params2)


def test_greedy_generate_matches_transformers(checkpoint):
    config, params = models.load_hf(checkpoint)
    ids = _ids(config.vocab_size, (2, 5), seed=3)
    ref = hf_greedy(checkpoint, ids, 16)
    ours = np.asarray(models.greedy_generate(config, params, ids, 16))
    np.testing.assert_array_equal(ours, ref)


def test_cache_prefill_decode_extend_equal_forward(checkpoint):
    """Through the cache: a prefill across a chunk boundary, one-token decode steps and a multi-token extend
    give the logits of each sequence run alone. Row 0 is left-padded; row 1 packs two sequences whose
    boundary falls inside the prefill, so their state and conv window reset there."""
    config, params = models.load_hf(checkpoint)
    a, b, c = (_ids(config.vocab_size, (1, n), seed=4 + i) for i, n in enumerate((74, 50, 30)))
    pad, total = 6, 80
    toks = np.zeros((2, total), np.int32)
    toks[0, pad:], toks[1] = a[0], np.concatenate([b[0], c[0]])
    seg = np.stack([np.r_[np.zeros(pad), np.ones(74)], np.r_[np.ones(50), np.full(30, 2)]]).astype(np.int32)
    pos = np.stack([np.r_[np.zeros(pad), np.arange(74)], np.r_[np.arange(50), np.arange(30)]]).astype(np.int32)
    cache = models.init_cache(config, 2, total)
    outs = []
    for lo, hi in ((0, 70), (70, 71), (71, 72), (72, 80)):  # prefill, two decode steps, extend by 8
        out, cache = _extend_logits(config, params, cache, toks[:, lo:hi], pos[:, lo:hi], seg[:, lo:hi])
        outs.append(out)
    got = np.concatenate(outs, axis=1)
    ref_a, ref_b, ref_c = _separate(config, params, [a, b, c])
    np.testing.assert_allclose(got[0, pad:], ref_a[0], atol=1e-4)
    np.testing.assert_allclose(got[1, :50], ref_b[0], atol=1e-4)
    np.testing.assert_allclose(got[1, 50:], ref_c[0], atol=1e-4)
    assert int(cache["index"]) == total and cache["state_seg"].tolist() == [1, 2]


def test_packed_equals_separate(checkpoint):
    """Segment boundaries exactly at a chunk boundary (64) and inside a chunk (104), then padding."""
    config, params = models.load_hf(checkpoint)
    lens = (64, 40, 20)
    seqs = [_ids(config.vocab_size, (1, n), seed=10 + i) for i, n in enumerate(lens)]
    packed = np.concatenate(seqs + [np.zeros((1, 4), np.int32)], axis=1)
    pos = np.concatenate([np.arange(n) for n in lens] + [np.zeros(4)])[None].astype(np.int32)
    seg = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lens)] + [np.zeros(4)])[None].astype(np.int32)
    packed[0, -4:] = 7  # padding tokens' ids must not matter either
    out = _logits(config, params, packed, pos, seg)
    start = 0
    for ref, n in zip(_separate(config, params, seqs), lens):
        # chunks start at different tokens in the packed row: same math, different fp32 rounding (in float64
        # the two agree to 5e-7); 1e-4 is the bar of the transformers parity test
        np.testing.assert_allclose(out[:, start:start + n], ref, atol=1e-4)
        start += n


def test_token_logprobs_match_log_softmax(checkpoint):
    config, params = models.load_hf(checkpoint)
    config = config.replace(logits_seq_chunk=16, logits_vocab_chunk=40)  # several chunks of each kind
    ids = _ids(config.vocab_size, (2, 70), seed=7)
    logits = _logits(config, params, ids)
    ref = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    ref = np.take_along_axis(np.asarray(ref), ids[:, 1:, None], axis=-1)[..., 0]
    got = np.asarray(jax.jit(token_logprobs, static_argnums=0)(config, params, jnp.asarray(ids)))
    np.testing.assert_allclose(got, ref, atol=2e-5)


def test_full_multimodal_checkpoint_layout(checkpoint, tmp_path):
    """A full `qwen3_5` checkpoint: text weights under model.language_model., plus mtp.* and model.visual.*
    tensors and a nested text_config -- loads to the same model."""
    config, params = models.load_hf(checkpoint)
    tensors = load_file(os.path.join(checkpoint, "model.safetensors"))
    full = {("model.language_model." + n[len("model."):] if n.startswith("model.") else n): t
            for n, t in tensors.items()}
    full["mtp.fc.weight"] = np.ones((4, 4), np.float32)
    full["mtp.layers.0.mlp.up_proj.weight"] = np.ones((3, 2), np.float32)
    full["model.visual.patch_embed.proj.weight"] = np.ones((2, 3), np.float32)
    out = tmp_path / "full"
    out.mkdir()
    save_file(full, str(out / "model.safetensors"), metadata={"format": "pt"})
    text_cfg = json.load(open(os.path.join(checkpoint, "config.json")))
    text_cfg.pop("architectures", None)
    tied = text_cfg.pop("tie_word_embeddings")  # transformers reads the full model's flag at the top level
    json.dump({"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
               "text_config": text_cfg, "vision_config": {"depth": 1}, "tie_word_embeddings": tied},
              open(out / "config.json", "w"))
    config2, params2 = models.load_hf(str(out))
    assert config2 == config
    assert_trees_equal(params, params2)
    del full["model.language_model.norm.weight"]
    save_file(full, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="model.norm.weight"):
        models.load_hf(str(out))


def test_irregular_layer_pattern_matches_transformers(tmp_path):
    """A pattern with no repeating block (the Python-unrolled path of the runner): full, lin, lin, full, lin."""
    types = ["full_attention", "linear_attention", "linear_attention", "full_attention", "linear_attention"]
    path = make_hf_qwen3_5(str(tmp_path), seed=3, **{**CONFIGS["l4_gqa"], "num_hidden_layers": 5,
                                                     "layer_types": types})
    config, params = models.load_hf(path)
    assert qwen3_5.layer_block(config) == (tuple(types), 1)
    ids = _ids(config.vocab_size, (2, 70), seed=8)
    ref = hf_logits(path, ids)
    assert np.abs(_logits(config, params, ids) - ref).max() <= 1e-4


def test_linear_context_bookkeeping():
    """Resets, conv taps and the carried segment ids of `linear_context` on a hand-checked example (K = 3)."""
    seg = jnp.asarray([[0, 0, 1, 1, 1], [2, 2, 0, 3, 3], [5, 5, 0, 5, 5]])
    state_seg = jnp.asarray([0, 2, 5])  # row 1 continues segment 2, row 2 continues 5 across a pad
    window_seg = jnp.asarray([[0, 0], [1, 2], [5, 5]])
    ctx = qwen3_5.linear_context(seg, state_seg, window_seg)
    np.testing.assert_array_equal(ctx["reset"], [[0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(ctx["valid"], np.asarray(seg) != 0)
    # tap j reads input t - 2 + j; live iff that input has the token's own (non-zero) segment
    np.testing.assert_array_equal(ctx["taps"][2], np.asarray(seg) != 0)
    np.testing.assert_array_equal(ctx["taps"][1], [[0, 0, 0, 1, 1], [1, 1, 0, 0, 1], [1, 1, 0, 0, 1]])
    np.testing.assert_array_equal(ctx["taps"][0], [[0, 0, 0, 0, 1], [0, 1, 0, 0, 0], [1, 1, 0, 1, 0]])
    np.testing.assert_array_equal(ctx["state_seg"], [1, 3, 5])
    np.testing.assert_array_equal(ctx["window_seg"], [[1, 1], [3, 3], [5, 5]])
    # an all-padding step changes nothing
    pad = qwen3_5.linear_context(jnp.zeros((1, 1), jnp.int32), jnp.asarray([4]), jnp.asarray([[4, 4]]))
    assert not bool(pad["reset"].any()) and int(pad["state_seg"][0]) == 4
    np.testing.assert_array_equal(pad["window_seg"], [[4, 0]])


# ------------------------------------------------------------------------------ configs and errors
def test_config_roundtrips_a_real_qwen3_5_text_config():
    from transformers import Qwen3_5TextConfig

    hf = Qwen3_5TextConfig(vocab_size=100, hidden_size=64, num_hidden_layers=6, full_attention_interval=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                           rope_parameters={"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5},
                           linear_num_key_heads=2, linear_num_value_heads=6, eos_token_id=[1, 2])
    ours = ModelConfig.from_hf_dict(hf.to_dict())
    assert ours.layer_types == ("linear_attention", "linear_attention", "full_attention") * 2
    assert (ours.partial_rotary_factor, ours.rope_theta, ours.rotary_dim) == (0.5, 5e5, 8)
    assert ours.attn_output_gate and ours.eos_token_id == (1, 2)
    back = Qwen3_5TextConfig(**ours.to_hf_dict())
    for key in ("layer_types", "rope_parameters", "linear_num_value_heads", "linear_key_head_dim", "head_dim",
                "num_key_value_heads", "linear_conv_kernel_dim", "eos_token_id", "vocab_size"):
        assert getattr(back, key) == getattr(hf, key), key
    assert ModelConfig.from_hf_dict(ours.to_hf_dict()) == ours
    # transformers' defaults when keys are absent: interval 4, partial rotary 0.25
    d = hf.to_dict()
    del d["layer_types"]
    d["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4}
    d["num_hidden_layers"] = 8
    c = ModelConfig.from_hf_dict(d)
    assert c.layer_types == tuple(Qwen3_5TextConfig(num_hidden_layers=8).layer_types)
    assert c.partial_rotary_factor == 0.25


def test_unsupported_inputs_raise_clear_errors(checkpoint):
    config, params = models.load_hf(checkpoint)
    ids = jnp.asarray(_ids(config.vocab_size, (1, 4)))
    with pytest.raises(NotImplementedError, match="branches"):
        models.hidden_states(config, params, ids, branch={"tokens": ids})
    with pytest.raises(ConfigError, match="attention_bias"):
        models.param_specs(config.replace(attention_bias=True))
