"""Qwen3 (agent model) against transformers' Qwen3ForCausalLM in torch, fp32."""


import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_trees_equal, hf_greedy, hf_logits, make_hf_qwen3
from mimesis_jax import models

pytest.importorskip("torch")

CONFIGS = {
    "untied_gqa": dict(),
    "tied": dict(tie_word_embeddings=True),
    "kv1": dict(num_key_value_heads=1),
    "headdim_ne": dict(hidden_size=24, num_attention_heads=3, num_key_value_heads=3, head_dim=16),
    "odd_vocab_3layers": dict(vocab_size=131, num_hidden_layers=3, intermediate_size=40,
                              rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    "attn_bias": dict(attention_bias=True),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def checkpoint(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    make_hf_qwen3(path, seed=len(request.param), **CONFIGS[request.param])
    return path


def _ids(vocab, shape, seed=0):
    return np.random.RandomState(seed).randint(0, vocab, size=shape).astype(np.int32)


def test_logits_match_transformers(checkpoint):
    config, params = models.load_hf(checkpoint)
    ids = _ids(config.vocab_size, (2, 13))
    ref = hf_logits(checkpoint, ids)
    ours = np.asarray(models.forward(config, params, ids))
    err = np.abs(ours - ref).max()
    print(f"max |logit diff| = {err:.3e} (max |logit| {np.abs(ref).max():.2f})")
    assert np.abs(ref).max() > 0.5, "reference logits too small for a meaningful comparison"
    assert err <= 1e-4


def test_python_loop_equals_scan(checkpoint):
    config, params = models.load_hf(checkpoint)
    ids = _ids(config.vocab_size, (2, 7), seed=1)
    a = models.forward(config, params, ids)
    b = models.forward(config.replace(scan_layers=False), params, ids)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_save_hf_roundtrip_loads_in_transformers(checkpoint, tmp_path):
    config, params = models.load_hf(checkpoint)
    out = str(tmp_path / "export")
    models.save_hf(out, config, params)
    ids = _ids(config.vocab_size, (1, 9), seed=2)
    np.testing.assert_allclose(hf_logits(out, ids), hf_logits(checkpoint, ids), atol=1e-6)
    config2, params2 = models.load_hf(out)
    assert config2 == config
    assert_trees_equal(params, params2)


def test_greedy_generate_matches_transformers(checkpoint):
    config, params = models.load_hf(checkpoint)
    ids = _ids(config.vocab_size, (2, 5), seed=3)
    ref = hf_greedy(checkpoint, ids, 16)
    ours = np.asarray(models.greedy_generate(config, params, ids, 16))
    np.testing.assert_array_equal(ours, ref)


def test_kv_cache_decoding_equals_full_forward(checkpoint):
    """Prefill + one-token extend steps give the logits of `forward` on the whole sequence."""
    config, params = models.load_hf(checkpoint)
    ids = _ids(config.vocab_size, (2, 10), seed=4)
    full = np.asarray(models.forward(config, params, ids))
    cache = models.init_cache(config, 2, 10)
    pos = np.broadcast_to(np.arange(10, dtype=np.int32), (2, 10))
    h, cache = models.extend(config, params, cache, jnp.asarray(ids[:, :6]), jnp.asarray(pos[:, :6]))
    steps = [models.logits_from_hidden(config, params, h)]
    for t in range(6, 10):
        h, cache = models.extend(config, params, cache, jnp.asarray(ids[:, t:t + 1]), jnp.asarray(pos[:, t:t + 1]))
        steps.append(models.logits_from_hidden(config, params, h))
    np.testing.assert_allclose(np.concatenate([np.asarray(s) for s in steps], axis=1), full, atol=2e-5)


def test_packed_equals_separate(checkpoint):
    config, params = models.load_hf(checkpoint)
    a = _ids(config.vocab_size, (1, 7), seed=5)
    b = _ids(config.vocab_size, (1, 5), seed=6)
    packed = np.concatenate([a, b, np.zeros((1, 3), np.int32)], axis=1)  # two sequences + padding
    pos = np.concatenate([np.arange(7), np.arange(5), np.zeros(3)])[None].astype(np.int32)
    seg = np.concatenate([np.full(7, 1), np.full(5, 2), np.zeros(3)])[None].astype(np.int32)
    out = np.asarray(models.forward(config, params, packed, pos, seg))
    np.testing.assert_allclose(out[:, :7], np.asarray(models.forward(config, params, a)), atol=2e-5)
    np.testing.assert_allclose(out[:, 7:12], np.asarray(models.forward(config, params, b)), atol=2e-5)
