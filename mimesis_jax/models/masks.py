"""Attention masks as segment ids and token indices (`MaskSpec`), never as dense [B, Tq, Tk] tensors.

A `MaskSpec` holds four int32 arrays, ``q_segment [B, Tq]``, ``q_index [B, Tq]``, ``k_segment [B, Tk]`` and
``k_index [B, Tk]``, and states which keys each query may see:

    visible(q, k) = (q_segment == k_segment) & (q_segment != 0) & (k_segment != 0) & (k_index <= q_index)

Segment 0 is padding (or an empty cache slot) and sees / is seen by nothing. Every mask of the project is
one spec (or, for a CSD branch, two: one per key group, merged by their log-sum-exps in attention.py):

* packed training rows (`causal_spec`): segments = the row's segment ids, indices = arange(T);
* the KV cache (`cache_spec`): queries at their cache slots, keys = all S slots with the cache's segment ids;
* CSD teacher branches (`branch_specs`): the trunk group (a branch token sees the trunk of its trajectory
  before the insertion point) and the branch's own group (causal inside the branch).

Backends evaluate `visible` block by block from slices of the spec (`block_visible`); `dense_mask` builds the
whole [B, Tq, Tk] boolean mask for the dense reference backend and for tests.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class MaskSpec(NamedTuple):
    """Which keys a query may see (see the module docstring); a pytree of four int32 arrays."""

    q_segment: jax.Array  # [B, Tq]
    k_segment: jax.Array  # [B, Tk]
    q_index: jax.Array  # [B, Tq]
    k_index: jax.Array  # [B, Tk]


def _i32(x) -> jax.Array:
    return jnp.asarray(x).astype(jnp.int32)


def make_spec(q_segment, k_segment, q_index, k_index) -> MaskSpec:
    """A spec with int32 arrays; checks that the [B, Tq] and [B, Tk] shapes agree."""
    qs, ks, qi, ki = (_i32(x) for x in (q_segment, k_segment, q_index, k_index))
    if qs.ndim != 2 or qs.shape != qi.shape or ks.ndim != 2 or ks.shape != ki.shape or qs.shape[0] != ks.shape[0]:
        raise ValueError(f"MaskSpec: q_segment/q_index must be [B, Tq] and k_segment/k_index [B, Tk], got "
                         f"{qs.shape}, {qi.shape}, {ks.shape}, {ki.shape}")
    return MaskSpec(qs, ks, qi, ki)


def _arange(B: int, T: int) -> jax.Array:
    return jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))


def causal_spec(segment_ids: jax.Array) -> MaskSpec:
    """Packed rows [B, T]: same non-zero segment and key row index <= query row index."""
    B, T = segment_ids.shape
    idx = _arange(B, T)
    return make_spec(segment_ids, segment_ids, idx, idx)


def cache_spec(q_segment_ids: jax.Array, q_slots: jax.Array, k_segment_ids: jax.Array) -> MaskSpec:
    """Queries [B, Tq] at cache slots `q_slots` over all S cache slots with segment ids `k_segment_ids` [B, S].

    A slot whose segment id is 0 is empty (never written, or left padding) and is never attended.
    """
    B, S = k_segment_ids.shape
    return make_spec(q_segment_ids, k_segment_ids, q_slots, _arange(B, S))


def branch_specs(trunk_segment_ids: jax.Array, branch_trunk_segment: jax.Array, branch_prefix_len: jax.Array,
                 branch_ids: jax.Array) -> tuple[MaskSpec, MaskSpec]:
    """The two key groups of CSD teacher-branch queries [B, Tb]: (over the trunk keys, over the branch keys).

    trunk_segment_ids [B, T]: the trunk's segment ids (several trajectories may be packed in one row).
    branch_trunk_segment [B, Tb]: the trunk segment the branch token's trajectory lives in.
    branch_prefix_len [B, Tb]: trunk key indices < this value are visible (the insertion point), i.e. the
    trunk group's query index is prefix_len - 1.
    branch_ids [B, Tb]: which branch of the row the token belongs to (0 = padding, which sees nothing in
    either group); branches are causal in themselves and never see each other.
    """
    B, T = trunk_segment_ids.shape
    Tb = branch_ids.shape[1]
    bid = _i32(branch_ids)
    to_trunk = make_spec(jnp.where(bid != 0, _i32(branch_trunk_segment), 0), trunk_segment_ids,
                         _i32(branch_prefix_len) - 1, _arange(B, T))
    return to_trunk, causal_spec(bid)


def block_visible(q_segment: jax.Array, q_index: jax.Array, k_segment: jax.Array, k_index: jax.Array) -> jax.Array:
    """The visibility rule on (slices of) a spec: [B, tq] queries x [B, tk] keys -> bool [B, tq, tk]."""
    qs, qi = q_segment[:, :, None], q_index[:, :, None]
    ks, ki = k_segment[:, None, :], k_index[:, None, :]
    return (qs == ks) & (qs != 0) & (ks != 0) & (ki <= qi)


def dense_mask(spec: MaskSpec) -> jax.Array:
    """The whole boolean mask [B, Tq, Tk] of a spec (reference backend and tests only)."""
    return block_visible(spec.q_segment, spec.q_index, spec.k_segment, spec.k_index)


def pad_spec(spec: MaskSpec, tq: int, tk: int) -> MaskSpec:
    """Right-pads the query side to length tq and the key side to tk with segment 0 (visible to nothing)."""
    def pad(x, n):
        return jnp.pad(x, ((0, 0), (0, n - x.shape[1])))
    return MaskSpec(pad(spec.q_segment, tq), pad(spec.k_segment, tk), pad(spec.q_index, tq), pad(spec.k_index, tk))


# ------------------------------------------------------------------------------ dense views (reference, tests)
def segment_causal_mask(segment_ids: jax.Array) -> jax.Array:
    """[B, T] segment ids (0 = padding) -> [B, T, T]: `dense_mask(causal_spec(segment_ids))`."""
    return dense_mask(causal_spec(segment_ids))


def cache_mask(q_segment_ids: jax.Array, q_slots: jax.Array, k_segment_ids: jax.Array) -> jax.Array:
    """[B, Tq, S]: `dense_mask(cache_spec(...))`."""
    return dense_mask(cache_spec(q_segment_ids, q_slots, k_segment_ids))


def branch_mask(trunk_segment_ids: jax.Array, branch_trunk_segment: jax.Array, branch_prefix_len: jax.Array,
                branch_ids: jax.Array) -> jax.Array:
    """Mask of branch queries over the concatenated keys [trunk ; branch], shape [B, Tb, T + Tb]."""
    a, b = branch_specs(trunk_segment_ids, branch_trunk_segment, branch_prefix_len, branch_ids)
    return jnp.concatenate([dense_mask(a), dense_mask(b)], axis=-1)
