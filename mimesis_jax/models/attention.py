"""Attention: masks and the scaled-dot-product backends.

Every caller builds a boolean mask [B, Tq, Tk] (True = may attend) from explicit token indices and segment
ids; the backend never guesses causality. This one mask vocabulary serves:

* training on packed rows  (`segment_causal_mask`: same segment, key index <= query index, segment 0 = pad);
* KV-cache decoding        (`cache_mask`: keys are cache slots with their own segment ids);
* the fused CSD pass       (`branch_mask`: a teacher branch sees the trunk before its insertion point and
                             itself causally; see algorithms/csd.py).

`dot_product_attention` is the dense reference backend (fp32 softmax, GQA without repeating K/V).
Accelerator kernels (cuDNN / Pallas / Splash) belong behind the same signature, tested against this one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_NEG = -0.7 * float(jnp.finfo(jnp.float32).max)


def segment_causal_mask(segment_ids: jax.Array) -> jax.Array:
    """[B, T] segment ids (0 = padding) -> [B, T, T]: same non-zero segment and key index <= query index."""
    T = segment_ids.shape[1]
    idx = jnp.arange(T)
    causal = idx[None, :, None] >= idx[None, None, :]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    valid = (segment_ids != 0)[:, :, None]
    return causal & same & valid


def cache_mask(q_segment_ids: jax.Array, q_slots: jax.Array, k_segment_ids: jax.Array) -> jax.Array:
    """Mask of queries at cache slots `q_slots` [B, Tq] over all cache slots [B, S] with segment ids.

    A slot whose segment id is 0 is empty (never written, or left padding) and is never attended.
    """
    S = k_segment_ids.shape[1]
    k_slots = jnp.arange(S)
    causal = k_slots[None, None, :] <= q_slots[:, :, None]
    same = q_segment_ids[:, :, None] == k_segment_ids[:, None, :]
    valid = (k_segment_ids != 0)[:, None, :] & (q_segment_ids != 0)[:, :, None]
    return causal & same & valid


def branch_mask(trunk_segment_ids: jax.Array, branch_trunk_segment: jax.Array, branch_prefix_len: jax.Array,
                branch_ids: jax.Array) -> jax.Array:
    """Mask of branch queries over [trunk keys ; branch keys], shape [B, Tb, T + Tb].

    trunk_segment_ids [B, T]: the trunk's segment ids (several trajectories may be packed in one row).
    branch_trunk_segment [B, Tb]: the trunk segment the branch token's trajectory lives in.
    branch_prefix_len [B, Tb]: trunk key indices < this value are visible (the insertion point).
    branch_ids [B, Tb]: which branch of the row the token belongs to (0 = padding); branches are causal in
    themselves and never see each other.
    """
    T = trunk_segment_ids.shape[1]
    t_idx = jnp.arange(T)
    to_trunk = (trunk_segment_ids[:, None, :] == branch_trunk_segment[:, :, None]) & (
        t_idx[None, None, :] < branch_prefix_len[:, :, None]) & (branch_ids != 0)[:, :, None]
    to_self = segment_causal_mask(branch_ids)
    return jnp.concatenate([to_trunk, to_self], axis=-1)


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                          scale: float | None = None) -> jax.Array:
    """Dense attention. q [B, Tq, H, Dh], k/v [B, Tk, KVH, Dh], mask [B, Tq, Tk] -> [B, Tq, H, Dh].

    Query heads are grouped over KV heads (head h uses KV head h // (H // KVH), as HF's repeat_kv does)
    without materialising repeated K/V. Softmax runs in fp32. A fully-masked query row (padding) returns
    a finite, meaningless value that callers mask out.
    """
    B, Tq, H, Dh = q.shape
    KVH = k.shape[2]
    G = H // KVH
    scale = Dh ** -0.5 if scale is None else scale
    qg = q.reshape(B, Tq, KVH, G, Dh)
    s = jnp.einsum("bqkgd,bskd->bkgqs", qg, k, preferred_element_type=jnp.float32) * scale
    s = jnp.where(mask[:, None, None, :, :], s, _NEG)
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    o = jnp.einsum("bkgqs,bskd->bqkgd", p, v)
    return o.reshape(B, Tq, H, Dh)
