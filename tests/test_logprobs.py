"""The memory-safe log-prob path equals log_softmax of the full logits, values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mimesis_jax import models
from mimesis_jax.algorithms.logprobs import chunked_logsumexp, next_token_mask, token_logprobs
from mimesis_jax.models import ModelConfig

BASE = ModelConfig(vocab_size=1001, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8, initializer_range=0.3)


def _full_logprobs(config, params, ids):
    logits = models.forward(config, params, ids)[:, :-1]
    return jnp.take_along_axis(jax.nn.log_softmax(logits, -1), jnp.asarray(ids)[:, 1:, None], -1)[..., 0]


@pytest.mark.parametrize("seq_chunk,vocab_chunk,vocab", [
    (4, 128, 1001),   # neither chunk divides: padded tokens and padded vocabulary rows
    (16, 1001, 1001),  # one vocab chunk, one sequence chunk
    (3, 64, 1024),     # exact vocab split
    (5, 97, 97),      # vocab == chunk
])
def test_token_logprobs_match_full_softmax(seq_chunk, vocab_chunk, vocab):
    cfg = BASE.replace(vocab_size=vocab, logits_seq_chunk=seq_chunk, logits_vocab_chunk=vocab_chunk)
    params = models.init_params(cfg, jax.random.key(1))
    ids = np.random.RandomState(0).randint(0, vocab, (3, 12))
    lp = token_logprobs(cfg, params, ids)
    assert lp.shape == (3, 11) and lp.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(lp), np.asarray(_full_logprobs(cfg, params, ids)), atol=2e-6, rtol=0)


@pytest.mark.parametrize("tied", [False, True])
def test_token_logprob_gradients_match_full_softmax(tied):
    cfg = BASE.replace(tie_word_embeddings=tied, logits_seq_chunk=4, logits_vocab_chunk=200)
    params = models.init_params(cfg, jax.random.key(2))
    ids = np.random.RandomState(1).randint(0, cfg.vocab_size, (2, 9))
    weights = jnp.asarray(np.random.RandomState(2).rand(2, 8), jnp.float32)
    g1 = jax.grad(lambda p: (token_logprobs(cfg, p, ids) * weights).sum())(params)
    g2 = jax.grad(lambda p: (_full_logprobs(cfg, p, ids) * weights).sum())(params)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        rel = np.abs(np.asarray(a) - np.asarray(b)).max() / (np.abs(np.asarray(b)).max() + 1e-30)
        assert rel <= 1e-5


def test_chunked_logsumexp_against_numpy():
    rng = np.random.RandomState(0)
    h = rng.randn(2, 7, 5).astype(np.float32)
    W = rng.randn(53, 5).astype(np.float32)
    logits = h @ W.T
    ref = logits.max(-1) + np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1))
    out = chunked_logsumexp(jnp.asarray(h), jnp.asarray(W), 3, 10)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-6, atol=1e-6)
    # its VJP equals softmax-weighted sums (d lse / d h = softmax @ W)
    g = jax.grad(lambda x: chunked_logsumexp(x, jnp.asarray(W), 3, 10).sum())(jnp.asarray(h))
    p = np.exp(logits - ref[..., None])
    np.testing.assert_allclose(np.asarray(g), p @ W, rtol=1e-5, atol=1e-6)


def test_bf16_compute_stays_close_to_fp32():
    cfg = BASE.replace(logits_seq_chunk=4, logits_vocab_chunk=256)
    params = models.init_params(cfg, jax.random.key(4))
    ids = np.random.RandomState(3).randint(0, cfg.vocab_size, (2, 10))
    lp32 = token_logprobs(cfg, params, ids)
    lp16 = token_logprobs(cfg.replace(dtype="bfloat16"), params, ids)
    assert lp16.dtype == jnp.float32
    assert float(jnp.abs(lp16 - lp32).max()) < 0.15


def test_next_token_mask_stops_at_segment_boundaries_and_padding():
    seg = jnp.asarray([[1, 1, 1, 2, 2, 0, 0]])
    np.testing.assert_array_equal(np.asarray(next_token_mask(seg)), [[True, True, False, True, False, False]])
