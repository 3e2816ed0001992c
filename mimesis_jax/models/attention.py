"""Scaled dot-product attention behind one function, `attend`, with masks given as `MaskSpec`s.

Callers describe which keys each query sees by segment ids and token indices (models/masks.py): packed
training rows (`causal_spec`), the KV cache (`cache_spec`) and the CSD teacher branches (`branch_specs`: two
key groups, attended separately and merged exactly by `merge_partials`, see `attend_groups`). No model path
builds a dense [B, Tq, Tk] mask; only the dense reference backend does, internally.

Backends (``impl``; a model takes it from ``config.attention_impl``):

* ``dense``: the reference. Builds the boolean mask from the spec, fp32 scores and softmax over the whole
  [B, H, Tq, Tk] product. Memory O(Tq Tk) per head: fine for tests, tiny models and decoding.
* ``blockwise``: flash attention in pure JAX (models/blockwise_attention.py): query x key blocks with an
  online softmax and a recomputing custom VJP, memory O(block^2) per head, blocks that cannot hold a visible
  pair skipped. Block sizes are ``config.attention_block_q`` / ``attention_block_k``.
* ``pallas``: the same flash algorithm as Pallas kernels (models/pallas_attention.py: forward, dq and dk/dv
  kernels, the mask evaluated from the spec inside each kernel). Interpret mode on CPU (tests; slow), compiled
  kernels on accelerators. Same block-size fields (rounded to powers of two there). On TPU: jax's Splash kernel
  where it expresses the spec, blockwise otherwise (models/splash_attention.py; blocks rounded to multiples of 128).

Both compute, per query i over its visible keys j (s_ij = scale * q_i . k_j, scale = Dh^-1/2 by default),
``o_i = sum_j softmax_j(s_ij) v_j`` and ``lse_i = log sum_j exp(s_ij)``, group query heads over KV heads
(head h reads KV head h // (H // KVH), as HF's repeat_kv, without repeating K/V) and return o = 0, lse = -inf
(and zero gradients) for a query that sees no key (padding). A cuDNN backend is not offered: jax.nn's cuDNN
attention takes only causal / sequence-length masks, which cannot express packed segments or cache slots.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mimesis_jax.models.blockwise_attention import blockwise_attention
from mimesis_jax.models.masks import (MaskSpec, branch_mask, branch_specs, cache_mask, cache_spec,  # noqa: F401
                                      causal_spec, dense_mask, segment_causal_mask)
from mimesis_jax.models.pallas_attention import pallas_attention

IMPLS = ("dense", "blockwise", "pallas")
_NEG = -0.7 * float(jnp.finfo(jnp.float32).max)


def _check(q, k, v, spec: MaskSpec):
    B, Tq, H, Dh = q.shape
    if k.ndim != 4 or k.shape != v.shape or k.shape[0] != B or k.shape[3] != Dh or H % k.shape[2]:
        raise ValueError(f"attention: q {q.shape} and k/v {k.shape}/{v.shape} must be [B, Tq, H, Dh] and "
                         f"[B, Tk, KVH, Dh] with KVH dividing H")
    if spec.q_segment.shape != (B, Tq) or spec.k_segment.shape != (B, k.shape[1]):
        raise ValueError(f"attention: mask spec shapes {spec.q_segment.shape} / {spec.k_segment.shape} do not "
                         f"match queries {(B, Tq)} / keys {(B, k.shape[1])}")


def dense_attention(q: jax.Array, k: jax.Array, v: jax.Array, spec: MaskSpec, scale: float):
    """Reference backend: (o [B, Tq, H, Dh], lse [B, Tq, H]) from the whole fp32 score tensor and dense mask."""
    B, Tq, H, Dh = q.shape
    KVH = k.shape[2]
    qg = q.reshape(B, Tq, KVH, H // KVH, Dh)
    s = jnp.einsum("bqkgd,bskd->bkgqs", qg, k, preferred_element_type=jnp.float32) * scale
    mask = dense_mask(spec)[:, None, None]  # [B, 1, 1, Tq, Tk]
    s = jnp.where(mask, s, _NEG)
    m = jax.lax.stop_gradient(s.max(-1, keepdims=True))
    e = jnp.where(mask, jnp.exp(s - m), 0.0)
    l = e.sum(-1, keepdims=True)
    ok = l > 0
    l1 = jnp.where(ok, l, 1.0)
    p = e / l1
    o = jnp.einsum("bkgqs,bskd->bqkgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    lse = jnp.where(ok, m + jnp.log(l1), -jnp.inf)[..., 0]  # [B, KVH, G, Tq]
    return o.reshape(B, Tq, H, Dh).astype(q.dtype), lse.transpose(0, 3, 1, 2).reshape(B, Tq, H)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, spec: MaskSpec, *, impl: str = "dense",
           scale: float | None = None, return_lse: bool = False, block_q: int = 512, block_k: int = 512):
    """Attention of q [B, Tq, H, Dh] over k/v [B, Tk, KVH, Dh] where `spec` allows -> o [B, Tq, H, Dh]
    (and lse [B, Tq, H] fp32 with `return_lse`). See the module docstring for the math and the backends."""
    _check(q, k, v, spec)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    with jax.named_scope("attention_core"):
        if impl == "dense":
            o, lse = dense_attention(q, k, v, spec, scale)
        elif impl == "blockwise":
            o, lse = blockwise_attention(q, k, v, spec, scale=scale, block_q=block_q, block_k=block_k)
        elif impl == "pallas":
            o, lse = pallas_attention(q, k, v, spec, scale=scale, block_q=block_q, block_k=block_k)
        else:
            raise ValueError(f"attention: unknown impl {impl!r}; expected one of {IMPLS}")
    return (o, lse) if return_lse else o


def merge_partials(o1: jax.Array, lse1: jax.Array, o2: jax.Array, lse2: jax.Array):
    """Exact softmax over the union of two disjoint key groups from each group's own result:

        lse = log(exp(lse1) + exp(lse2)),   o = exp(lse1 - lse) o1 + exp(lse2 - lse) o2.

    o [B, Tq, H, Dh], lse [B, Tq, H]; a group a query sees nothing of has lse = -inf (weight 0); a query that
    sees neither gets o = 0, lse = -inf, and finite (zero) gradients.
    """
    m = jnp.maximum(lse1, lse2)
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
    w1, w2 = jnp.exp(lse1 - m), jnp.exp(lse2 - m)
    tot = w1 + w2
    ok = tot > 0
    tot1 = jnp.where(ok, tot, 1.0)
    o = (w1 / tot1)[..., None] * o1.astype(jnp.float32) + (w2 / tot1)[..., None] * o2.astype(jnp.float32)
    lse = jnp.where(ok, m + jnp.log(tot1), -jnp.inf)
    return o.astype(o1.dtype), lse


def attend_groups(q: jax.Array, groups, **kw):
    """Attention of q over several disjoint key groups [(k, v, spec), ...] as one softmax over their union:
    each group attended on its own (`attend` with return_lse), the partial results merged by `merge_partials`.
    Keyword arguments go to `attend`; returns o (and lse with return_lse=True)."""
    want_lse = kw.pop("return_lse", False)
    o = lse = None
    for k, v, spec in groups:
        og, lg = attend(q, k, v, spec, return_lse=True, **kw)
        o, lse = (og, lg) if o is None else merge_partials(o, lse, og, lg)
    return (o, lse) if want_lse else o


def config_kwargs(config) -> dict:
    """The backend options a `models.ModelConfig` selects: impl and block sizes, for `attend(..., **kw)`."""
    return {"impl": config.attention_impl, "block_q": config.attention_block_q,
            "block_k": config.attention_block_k}
