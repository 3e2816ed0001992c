"""Blockwise ("flash") attention in pure JAX: O(block) memory in the forward and the backward pass.

Math (per query row i, KV head kh, query head g of the group; s_ij = scale * q_i . k_j over the visible keys j
of the row, see models/masks.py):

    lse_i = log sum_j exp(s_ij),        o_i = sum_j exp(s_ij - lse_i) v_j,

computed over key blocks with the online softmax (running max m, running sum l, running numerator acc):

    m' = max(m, max_j s_ij);   l' = exp(m - m') l + sum_j exp(s_ij - m');
    acc' = exp(m - m') acc + sum_j exp(s_ij - m') v_j;           o = acc / l,   lse = m + log l.

The backward pass (`jax.custom_vjp`) recomputes each block's probabilities P_ij = exp(s_ij - lse_i) from the saved
lse (never storing P) and accumulates, with D_i = sum_d dO_id O_id - dlse_i:

    dV_j += sum_i P_ij dO_i;   dP_ij = dO_i . v_j;   dS_ij = P_ij (dP_ij - D_i);
    dQ_i += scale sum_j dS_ij k_j;   dK_j += scale sum_i dS_ij q_i.

(The dlse term makes the log-sum-exp itself differentiable: d lse_i / d s_ij = P_ij.) Neither pass holds more than
a few [B, H, bq, bk] fp32 blocks; scores, sums and gradient accumulators are fp32 whatever the input dtype
(bf16 allowed). GQA: query head h = kh * G + g reads KV head kh; K/V are never repeated. A query that sees no key
returns o = 0 and lse = -inf, with zero gradients.

Blocks that cannot hold a visible pair are skipped: per (query block, key block) a conservative test on the
spec's per-block ranges (segment ranges overlap, smallest key index <= largest query index) gives, per query
block, the contiguous range of key blocks that may matter (and per key block the range of query blocks for the
backward). A packed causal row thus costs about half the full product; skipped or not, the per-block mask is
exact, so the result does not depend on the test. Block sizes are upper bounds: a length T is cut into
ceil(T / block) equal blocks (rounded up to a multiple of 8) and padded with segment 0.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from mimesis_jax.models.masks import MaskSpec, block_visible, pad_spec

_F32 = jnp.float32


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_layout(T: int, block: int) -> tuple[int, int]:
    """(block size b, number of blocks n) for length T under the upper bound `block`: n * b >= T, n minimal,
    b = ceil(T / n) rounded up to a multiple of 8 (but never above `block`)."""
    if block < 1:
        raise ValueError(f"block size must be >= 1, got {block}")
    if T <= block:
        return T, 1
    b = min(block, _cdiv(_cdiv(T, _cdiv(T, block)), 8) * 8)
    return b, _cdiv(T, b)


def _blocks(x: jax.Array, n: int, b: int) -> jax.Array:
    """[B, T, ...] -> [n, B, b, ...], zero-padded along T to n * b."""
    T = x.shape[1]
    if n * b != T:
        x = jnp.pad(x, [(0, 0), (0, n * b - T)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape((x.shape[0], n, b) + x.shape[2:]), 1, 0)


def _unblocks(x: jax.Array, T: int) -> jax.Array:
    """[n, B, b, ...] -> [B, T, ...] (drops the padding)."""
    n, B, b = x.shape[:3]
    return jnp.moveaxis(x, 0, 1).reshape((B, n * b) + x.shape[3:])[:, :T]


def block_ranges(qs, qi, ks, ki):
    """Per query block the key-block range [lo, hi) that may hold visible pairs, and per key block the
    query-block range. Inputs are blocked spec arrays [nq, B, bq] and [nk, B, bk] (padding has segment 0)."""
    big, small = jnp.iinfo(jnp.int32).max, jnp.iinfo(jnp.int32).min

    def stats(seg, idx):  # per block and row, over the non-padding entries: [n, B] each
        ok = seg != 0
        return (jnp.where(ok, seg, big).min(-1), jnp.where(ok, seg, small).max(-1),
                jnp.where(ok, idx, big).min(-1), jnp.where(ok, idx, small).max(-1))

    qs_lo, qs_hi, _, qi_hi = stats(qs, qi)
    ks_lo, ks_hi, ki_lo, _ = stats(ks, ki)
    maybe = ((qs_lo[:, None] <= ks_hi[None]) & (ks_lo[None] <= qs_hi[:, None])
             & (ki_lo[None] <= qi_hi[:, None])).any(-1)  # [nq, nk]

    def span(m):
        j = jnp.arange(m.shape[1], dtype=jnp.int32)
        return jnp.where(m, j, m.shape[1]).min(-1), jnp.where(m, j + 1, 0).max(-1)

    return span(maybe), span(maybe.T)


def _at(x: jax.Array, i) -> jax.Array:
    return jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False)


def _prepare(q, k, spec, block_q, block_k):
    B, Tq, H, Dh = q.shape
    Tk, KVH = k.shape[1], k.shape[2]
    bq, nq = block_layout(Tq, block_q)
    bk, nk = block_layout(Tk, block_k)
    spec = pad_spec(spec, nq * bq, nk * bk)
    qs, qi = (x.reshape(B, nq, bq).swapaxes(0, 1) for x in (spec.q_segment, spec.q_index))
    ks, ki = (x.reshape(B, nk, bk).swapaxes(0, 1) for x in (spec.k_segment, spec.k_index))
    return (B, Tq, H, Dh, KVH, H // KVH), (bq, nq, bk, nk), (qs, qi, ks, ki)


def _forward(q, k, v, spec, scale, block_q, block_k):
    (B, Tq, H, Dh, KVH, G), (bq, nq, bk, nk), (qs, qi, ks, ki) = _prepare(q, k, spec, block_q, block_k)
    qb = _blocks(q.reshape(B, Tq, KVH, G, Dh), nq, bq)  # [nq, B, bq, KVH, G, Dh]
    kb, vb = _blocks(k, nk, bk), _blocks(v, nk, bk)  # [nk, B, bk, KVH, Dh]
    (lo, hi), _ = block_ranges(qs, qi, ks, ki)

    def query_block(xs):
        qblk, qsb, qib, lo_i, hi_i = xs

        def key_step(j, carry):
            m, l, acc = carry
            kblk, vblk = _at(kb, j), _at(vb, j)
            mask = block_visible(qsb, qib, _at(ks, j), _at(ki, j))[:, None, None]  # [B, 1, 1, bq, bk]
            s = jnp.einsum("bqkgd,bskd->bkgqs", qblk, kblk, preferred_element_type=_F32) * scale
            s = jnp.where(mask, s, -jnp.inf)
            m_new = jnp.maximum(m, s.max(-1))
            m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
            p = jnp.exp(s - m_safe[..., None])
            alpha = jnp.exp(m - m_safe)
            l = alpha * l + p.sum(-1)
            acc = alpha[..., None] * acc + jnp.einsum("bkgqs,bskd->bkgqd", p.astype(vblk.dtype), vblk,
                                                      preferred_element_type=_F32)
            return m_new, l, acc

        init = (jnp.full((B, KVH, G, bq), -jnp.inf, _F32), jnp.zeros((B, KVH, G, bq), _F32),
                jnp.zeros((B, KVH, G, bq, Dh), _F32))
        m, l, acc = jax.lax.fori_loop(lo_i, hi_i, key_step, init)
        ok = l > 0
        l1 = jnp.where(ok, l, 1.0)
        o = jnp.where(ok[..., None], acc / l1[..., None], 0.0)
        lse = jnp.where(ok, m + jnp.log(l1), -jnp.inf)
        return o.transpose(0, 3, 1, 2, 4).astype(q.dtype), lse.transpose(0, 3, 1, 2)

    o, lse = jax.lax.map(query_block, (qb, qs, qi, lo, hi))
    return _unblocks(o, Tq).reshape(B, Tq, H, Dh), _unblocks(lse, Tq).reshape(B, Tq, H)


def _backward(q, k, v, spec, o, lse, do, dlse, scale, block_q, block_k):
    (B, Tq, H, Dh, KVH, G), (bq, nq, bk, nk), (qs, qi, ks, ki) = _prepare(q, k, spec, block_q, block_k)
    delta = jnp.sum(do.astype(_F32) * o.astype(_F32), axis=-1) - dlse.astype(_F32)  # [B, Tq, H]
    lse = jnp.where(jnp.isfinite(lse), lse, 0.0)  # rows that see nothing: every P is masked to 0 anyway

    def rows(x):  # [B, Tq, H] -> [nq, B, KVH, G, bq]
        return _blocks(x.reshape(B, Tq, KVH, G), nq, bq).transpose(0, 1, 3, 4, 2)

    qb = _blocks(q.reshape(B, Tq, KVH, G, Dh), nq, bq)
    dob = _blocks(do.reshape(B, Tq, KVH, G, Dh), nq, bq)
    lseb, deltab = rows(lse), rows(delta)
    kb, vb = _blocks(k, nk, bk), _blocks(v, nk, bk)
    _, (lo, hi) = block_ranges(qs, qi, ks, ki)

    def key_block(dq, xs):
        kblk, vblk, ksb, kib, lo_j, hi_j = xs

        def query_step(i, carry):
            dk, dv, dq = carry
            qblk, doblk = _at(qb, i), _at(dob, i)
            mask = block_visible(_at(qs, i), _at(qi, i), ksb, kib)[:, None, None]
            s = jnp.einsum("bqkgd,bskd->bkgqs", qblk, kblk, preferred_element_type=_F32) * scale
            p = jnp.where(mask, jnp.exp(s - _at(lseb, i)[..., None]), 0.0)
            dv = dv + jnp.einsum("bkgqs,bqkgd->bskd", p.astype(doblk.dtype), doblk, preferred_element_type=_F32)
            dp = jnp.einsum("bqkgd,bskd->bkgqs", doblk, vblk, preferred_element_type=_F32)
            ds = p * (dp - _at(deltab, i)[..., None])
            dk = dk + jnp.einsum("bkgqs,bqkgd->bskd", ds.astype(qblk.dtype), qblk, preferred_element_type=_F32)
            dq_i = jnp.einsum("bkgqs,bskd->bqkgd", ds.astype(kblk.dtype), kblk, preferred_element_type=_F32)
            dq = jax.lax.dynamic_update_index_in_dim(dq, _at(dq, i) + dq_i, i, 0)
            return dk, dv, dq

        zeros = jnp.zeros((B, bk, KVH, Dh), _F32)
        dk, dv, dq = jax.lax.fori_loop(lo_j, hi_j, query_step, (zeros, zeros, dq))
        return dq, (dk, dv)

    dq0 = jnp.zeros((nq, B, bq, KVH, G, Dh), _F32)
    dq, (dk, dv) = jax.lax.scan(key_block, dq0, (kb, vb, ks, ki, lo, hi))
    dq = (_unblocks(dq, Tq) * scale).reshape(B, Tq, H, Dh).astype(q.dtype)
    dk = (_unblocks(dk, k.shape[1]) * scale).astype(k.dtype)
    return dq, dk, _unblocks(dv, v.shape[1]).astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _flash(q, k, v, spec, scale, block_q, block_k):
    return _forward(q, k, v, spec, scale, block_q, block_k)


def _flash_fwd(q, k, v, spec, scale, block_q, block_k):
    o, lse = _forward(q, k, v, spec, scale, block_q, block_k)
    return (o, lse), (q, k, v, spec, o, lse)


def _flash_bwd(scale, block_q, block_k, res, cts):
    q, k, v, spec, o, lse = res
    do, dlse = cts
    dq, dk, dv = _backward(q, k, v, spec, o, lse, do, dlse, scale, block_q, block_k)
    return dq, dk, dv, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, spec: MaskSpec, *, scale: float,
                        block_q: int, block_k: int) -> tuple[jax.Array, jax.Array]:
    """q [B, Tq, H, Dh], k/v [B, Tk, KVH, Dh], spec over (Tq, Tk) -> (o [B, Tq, H, Dh] in q's dtype,
    lse [B, Tq, H] fp32; -inf where a query sees no key). Differentiable in q, k, v (and through lse)."""
    return _flash(q, k, v, spec, float(scale), int(block_q), int(block_k))
