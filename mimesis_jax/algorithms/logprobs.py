"""Memory-safe log-probabilities of chosen tokens.

log p(y_t | prefix) = h_t . w_{y_t} - logsumexp_v(h_t . w_v)

computed from final hidden states h [B, T, D] and the LM head W [V, D] without ever building [B, T, V]
logits: the log-sum-exp runs over sequence chunks (`config.logits_seq_chunk` tokens) and, inside each, over
vocabulary chunks (`config.logits_vocab_chunk` entries) with an online max/sum in fp32. Its gradient is a
custom VJP that recomputes each [B, chunk, vocab-chunk] block once, so the backward pass also never holds
more than one block (plus dW, which the optimizer needs anyway).

Vocabulary chunks are *strided* (chunk j = rows j, j + n, j + 2n, ... of W) so that when W's vocab axis is
split over the `tensor` mesh axis, every chunk stays split the same way and no chunk needs a gather.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from mimesis_jax.models import hidden_states, lm_head_weight
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.models.layers import embed_lookup

_NEG_INF = -jnp.inf


def vocab_layout(V: int, vocab_chunk: int) -> tuple[int, int]:
    """(n_chunks, chunk_size) with n_chunks * chunk_size >= V; prefers an exact split (no padding)."""
    n = max(1, math.ceil(V / vocab_chunk))
    for cand in range(n, 2 * n + 1):
        if V % cand == 0:
            return cand, V // cand
    return n, math.ceil(V / n)


def _prep(h, W, seq_chunk, vocab_chunk):
    B, T, D = h.shape
    V = W.shape[0]
    cs = min(seq_chunk, T)
    nt = math.ceil(T / cs)
    nv, vc = vocab_layout(V, vocab_chunk)
    if nt * cs != T:
        h = jnp.pad(h, ((0, 0), (0, nt * cs - T), (0, 0)))
    if nv * vc != V:
        W = jnp.pad(W, ((0, nv * vc - V), (0, 0)))
    hs = jnp.moveaxis(h.reshape(B, nt, cs, D), 1, 0)  # [nt, B, cs, D]
    Ws = W.reshape(vc, nv, D)  # strided vocab chunks: chunk j = Ws[:, j]
    return hs, Ws, (B, T, D, V, cs, nt, nv, vc)


def _chunk_logits(hc, Ws, j, V, nv, vc):
    wj = jax.lax.dynamic_index_in_dim(Ws, j, axis=1, keepdims=False)  # [vc, D]
    logits = jnp.einsum("bcd,vd->bcv", hc, wj, preferred_element_type=jnp.float32)
    valid = (jnp.arange(vc) * nv + j) < V
    return jnp.where(valid, logits, _NEG_INF), wj


def _lse_fwd_impl(h, W, seq_chunk, vocab_chunk):
    hs, Ws, (B, T, D, V, cs, nt, nv, vc) = _prep(h, W, seq_chunk, vocab_chunk)

    def per_seq_chunk(_, hc):
        def per_vocab_chunk(carry, j):
            m, s = carry
            logits, _ = _chunk_logits(hc, Ws, j, V, nv, vc)
            m_new = jnp.maximum(m, logits.max(-1))
            s = s * jnp.exp(m - m_new) + jnp.exp(logits - m_new[..., None]).sum(-1)
            return (m_new, s), None

        init = (jnp.full(hc.shape[:2], _NEG_INF, jnp.float32), jnp.zeros(hc.shape[:2], jnp.float32))
        (m, s), _ = jax.lax.scan(per_vocab_chunk, init, jnp.arange(nv))
        return None, m + jnp.log(s)

    _, lse = jax.lax.scan(per_seq_chunk, None, hs)  # [nt, B, cs]
    return jnp.moveaxis(lse, 0, 1).reshape(B, nt * cs)[:, :T]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def chunked_logsumexp(h: jax.Array, W: jax.Array, seq_chunk: int, vocab_chunk: int) -> jax.Array:
    """logsumexp_v(h . W_v) for h [B, T, D], W [V, D] -> [B, T] fp32, chunked in T and V."""
    return _lse_fwd_impl(h, W, seq_chunk, vocab_chunk)


def _lse_fwd(h, W, seq_chunk, vocab_chunk):
    lse = _lse_fwd_impl(h, W, seq_chunk, vocab_chunk)
    return lse, (h, W, lse)


def _lse_bwd(seq_chunk, vocab_chunk, res, g):
    h, W, lse = res
    hs, Ws, (B, T, D, V, cs, nt, nv, vc) = _prep(h, W, seq_chunk, vocab_chunk)
    pad_t = nt * cs - T
    lse_p = jnp.pad(lse, ((0, 0), (0, pad_t)))
    g_p = jnp.pad(g.astype(jnp.float32), ((0, 0), (0, pad_t)))  # padded tokens carry no cotangent
    lses = jnp.moveaxis(lse_p.reshape(B, nt, cs), 1, 0)
    gs = jnp.moveaxis(g_p.reshape(B, nt, cs), 1, 0)

    def per_vocab_chunk(dh, j):
        def per_seq_chunk(dwj, xs):
            hc, lc, gc = xs
            logits, wj = _chunk_logits(hc, Ws, j, V, nv, vc)
            p = jnp.exp(logits - lc[..., None]) * gc[..., None]  # [B, cs, vc], zero on padded vocab
            dhc = jnp.einsum("bcv,vd->bcd", p, wj.astype(jnp.float32))
            dwj = dwj + jnp.einsum("bcv,bcd->vd", p, hc.astype(jnp.float32))
            return dwj, dhc

        dwj, dhcs = jax.lax.scan(per_seq_chunk, jnp.zeros((vc, D), jnp.float32), (hs, lses, gs))
        return dh + dhcs, dwj

    dh0 = jnp.zeros((nt, B, cs, D), jnp.float32)
    dhs, dws = jax.lax.scan(per_vocab_chunk, dh0, jnp.arange(nv))  # dws [nv, vc, D]
    dh = jnp.moveaxis(dhs, 0, 1).reshape(B, nt * cs, D)[:, :T]
    dW = jnp.swapaxes(dws, 0, 1).reshape(nv * vc, D)[:V]
    return dh.astype(h.dtype), dW.astype(W.dtype)


chunked_logsumexp.defvjp(_lse_fwd, _lse_bwd)


def _check_temperature(temperature) -> None:
    if isinstance(temperature, (int, float)) and not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")


def logprobs_from_hidden(config: ModelConfig, params, hidden: jax.Array, targets: jax.Array,
                         temperature: float = 1.0) -> jax.Array:
    """log p(targets | hidden) [B, T] fp32 from final hidden states [B, T, D], memory-safe.

    temperature T: log_softmax(logits / T) (the sampler's distribution at temperature T); logits / T =
    (hidden / T) . W, so the hidden states are scaled (in fp32) before the head.
    """
    _check_temperature(temperature)
    with jax.named_scope("logprob_head"):
        W = lm_head_weight(config, params)
        if not (isinstance(temperature, (int, float)) and temperature == 1.0):
            hidden = hidden.astype(jnp.float32) / temperature
        h = hidden.astype(config.compute_dtype)
        Wc = W.astype(config.compute_dtype)
        target_logit = jnp.einsum("btd,btd->bt", h.astype(jnp.float32),
                                  embed_lookup(Wc, targets, jnp.float32, config))
        lse = chunked_logsumexp(h, Wc, config.logits_seq_chunk, config.logits_vocab_chunk)
        return target_logit - lse


def token_logprobs(config: ModelConfig, params, input_ids, positions=None, segment_ids=None,
                   temperature: float = 1.0) -> jax.Array:
    """log p(input_ids[:, 1:] | prefix) [B, T-1] in float32; never materialises [B, T, V] logits.

    Equals log_softmax(forward(...) / temperature)[:, :-1] gathered at input_ids[:, 1:]. With packed rows the
    entry at a segment boundary (first token of a segment predicted from the previous segment) is meaningless:
    callers mask it (see `next_token_mask`).
    """
    input_ids = jnp.asarray(input_ids, jnp.int32)
    h, _ = hidden_states(config, params, input_ids, positions, segment_ids)
    return logprobs_from_hidden(config, params, h[:, :-1], input_ids[:, 1:], temperature)


def next_token_mask(segment_ids: jax.Array) -> jax.Array:
    """[B, T-1] True where token t+1 continues the segment of token t (and is not padding)."""
    return (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] != 0)
