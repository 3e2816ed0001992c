"""`attention_impl="pallas"` on TPUs: jax's Splash attention kernel for the masks it can express, blockwise otherwise.

Splash (jax.experimental.pallas.ops.tpu.splash_attention) is jax's tuned TPU flash-attention kernel. Its mask is a
static per-head mask fixed at trace time (here `CausalMask`: key position <= query position in the arrays) and-ed
with data-dependent segment ids (`SegmentIds(q, kv)`: equal ids only). Our masks are `MaskSpec`s (models/masks.py):

    visible(q, k) = (q_segment == k_segment) & (q_segment != 0) & (k_segment != 0) & (k_index <= q_index).

Which specs Splash expresses exactly (`splash_expressible`, checked on the spec's values, so never silently wrong):

* packed rows, `causal_spec(segment_ids)`: Tq == Tk, q_segment == k_segment and, on every non-padding token,
  q_index == k_index == its array position. Then `k_index <= q_index` is the static causal mask and the segment
  test is Splash's. Segment 0 (padding) must see nothing: Splash lets padding see earlier padding (0 == 0), so
  those rows are overwritten afterwards with o = 0, lse = -inf (their cotangents are then 0, so they add nothing
  to any gradient). This is the training / scoring forward of every stage: models build it with token indices =
  array positions (RoPE positions are separate and may restart per segment; they do not enter the mask), and
  it covers the own-branch key group of a CSD teacher branch (`branch_specs(...)[1]` is `causal_spec(branch_ids)`)
  and a KV-cache prefill that fills slots 0..T-1 of a T-slot cache.
* not expressed, so run by the blockwise backend (models/blockwise_attention.py): the trunk key group of a CSD
  branch (a branch token sees its trajectory's trunk keys before the insertion point `prefix_len`; the branches of
  one trajectory have nested prefixes, which no segment-id equality or static mask represents), KV-cache decoding
  (Tq != Tk; queries at data-dependent slots) and any other spec with Tq != Tk or indices that are not positions.

Dispatch (`splash_or_blockwise`): a shape mismatch (Tq != Tk) picks blockwise at trace time; otherwise the
predicate is a traced boolean and `lax.cond` runs Splash or blockwise (on TPU only the taken branch executes; the
check reads the four [B, T] int arrays once). With concrete (non-traced) specs the choice is made in Python.

The Splash call: q [B, T, H, Dh] is pre-scaled by `scale` (Splash does not scale) and laid out per example as
[H, T', Dh] with k/v [KVH, T', Dh] (Splash's MHA kernel groups query heads over KV heads itself, as HF's
repeat_kv: head h reads KV head h // (H // KVH)), vmapped over the batch. T is padded with segment 0 to T', a
multiple of the block sizes, which are multiples of 128 (Splash's lane width; `splash_block_layout`). The custom
VJP runs Splash's own fused dq/dk/dv backward kernel with D_i = sum_d dO_id O_id - dlse_i, so the lse output is
differentiable too (`attend_groups` merges key groups through it; Splash's public VJP covers o only). That
backward entry point (`_splash_attention_bwd_dkv`) is private to jax: the pinned jax version's, exercised by the
interpret-mode tests. Scores, softmax statistics and accumulators are fp32 inside the kernels.

Under a mesh (`jax.set_mesh`, as the train steps run) the kernel runs in shard_map on each device's rows and heads
(`_per_device`): XLA cannot partition a Pallas call and would otherwise gather q, k, v whole onto every device.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
from jax.sharding import PartitionSpec as P

from mimesis_jax.models.blockwise_attention import blockwise_attention
from mimesis_jax.models.masks import MaskSpec
from mimesis_jax.sharding import kernel_split

_LANES = 128  # Splash's key blocks (and so its padded lengths) are multiples of the TPU lane width


def splash_block_layout(T: int, block_q: int, block_k: int) -> tuple[int, int, int]:
    """(query block, key block, padded length T') for a length T: each block is the configured size rounded down
    to a multiple of 128 (at least 128) and at most T rounded up to 128; T' is T rounded up to both blocks."""
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be >= 1, got block_q={block_q}, block_k={block_k}")
    t128 = -(-T // _LANES) * _LANES

    def blk(b):
        return min(max(_LANES, b // _LANES * _LANES), t128)

    bq, bk = blk(block_q), blk(block_k)
    step = math.lcm(bq, bk)
    return bq, bk, -(-T // step) * step


def splash_expressible(spec: MaskSpec):
    """Whether Splash's causal mask + segment ids equal `spec` exactly (module docstring): False when Tq != Tk
    (decided from shapes), else a scalar bool over the whole batch -- a traced one when the spec is traced."""
    B, Tq = spec.q_segment.shape
    if spec.k_segment.shape != (B, Tq):
        return False
    pos = jnp.arange(Tq, dtype=jnp.int32)[None]
    real = spec.q_segment != 0
    ok = (spec.q_segment == spec.k_segment).all()
    return ok & jnp.where(real, (spec.q_index == pos) & (spec.k_index == pos), True).all()


@functools.lru_cache(maxsize=32)
def _kernel(H: int, T: int, bq: int, bk: int, interpret: bool):
    """(Splash MHA kernel, its BlockSizes) for H query heads over length T with the causal mask, built once per
    shape (its mask info is computed in NumPy at trace time). The kernel maps one example's q [H, T, Dh],
    k/v [KVH, T, Dh] and SegmentIds to (o [H, T, Dh], (lse [H, T],)); the backward reuses its dk/dv mask info."""
    sizes = sk.BlockSizes(block_q=bq, block_kv=bk, block_kv_compute=bk, block_q_dkv=bq, block_kv_dkv=bk,
                          block_kv_dkv_compute=bk, use_fused_bwd_kernel=True)
    mask = sm.MultiHeadMask([sm.CausalMask((T, T)) for _ in range(H)])
    with jax.ensure_compile_time_eval():  # its mask-info arrays are constants, never tracers of the first caller
        return sk.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, save_residuals=True,
                                  interpret=interpret), sizes


def _collapsed(info):
    """The dk/dv mask info as Splash's own wrapper passes it to its kernels (partial mask blocks flattened)."""
    if info is None or info.partial_mask_blocks is None:
        return info
    return info._replace(partial_mask_blocks=info.partial_mask_blocks.reshape(
        -1, *info.partial_mask_blocks.shape[-2:]))


def _forward(q, k, v, seg, bq, bk, interpret):
    """q [B, H, T', Dh] (pre-scaled), k/v [B, KVH, T', Dh], seg [B, T'] -> o [B, H, T', Dh], lse [B, H, T']."""
    kern, _ = _kernel(q.shape[1], q.shape[2], bq, bk, interpret)
    o, (lse,) = jax.vmap(lambda q_, k_, v_, s_: kern(q_, k_, v_, segment_ids=sk.SegmentIds(s_, s_)))(q, k, v, seg)
    return o, lse


def _backward(q, k, v, seg, lse, do, di, bq, bk, interpret):
    kern, sizes = _kernel(q.shape[1], q.shape[2], bq, bk, interpret)

    def one(q_, k_, v_, s_, lse_, do_, di_):
        dq, dk, dv = sk._splash_attention_bwd_dkv(
            q_, k_, v_, sk.SegmentIds(s_, s_), None, lse_, do_, di_, bq=sizes.block_q_dkv, bkv=sizes.block_kv_dkv,
            bkv_compute=sizes.block_kv_dkv_compute, is_mqa=False, mask_info=_collapsed(kern.dkv_mask_info),
            mask_value=kern.kwargs["mask_value"], attn_logits_soft_cap=None, use_fused_bwd_kernel=True,
            q_layout=sizes.q_layout, k_layout=sizes.k_layout, v_layout=sizes.v_layout,
            mask_function=kern.kwargs["mask_function"], interpret=interpret)
        return dq, dk, dv

    return jax.vmap(one)(q, k, v, seg, lse, do, di)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _splash(q, k, v, seg, bq, bk, interpret):
    return _forward(q, k, v, seg, bq, bk, interpret)


def _splash_fwd(q, k, v, seg, bq, bk, interpret):
    o, lse = _forward(q, k, v, seg, bq, bk, interpret)
    return (o, lse), (q, k, v, seg, o, lse)


def _splash_bwd(bq, bk, interpret, res, cts):
    q, k, v, seg, o, lse = res
    do, dlse = cts
    di = jnp.einsum("bhsd,bhsd->bhs", o.astype(jnp.float32), do.astype(jnp.float32)) - dlse.astype(jnp.float32)
    dq, dk, dv = _backward(q, k, v, seg, lse, do, di, bq, bk, interpret)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_splash.defvjp(_splash_fwd, _splash_bwd)


def _per_device(fn, q, k, v, seg):
    """`fn(q, k, v, seg)` on each device's rows and heads under the current mesh (`jax.set_mesh`), through
    shard_map: XLA cannot partition a Pallas kernel, and would otherwise gather every operand on every device.
    Rows split as the act_batch rule says, query and KV heads as act_heads / act_kv_heads when both split over
    the same mesh axes (contiguous head chunks keep head h on KV head h // G); otherwise heads are replicated.
    Default rules (attention gets no config); other placements are resharded at the boundary, never wrong."""
    split = kernel_split(q.shape[0], q.shape[1], k.shape[1])
    if split is None:
        return fn(q, k, v, seg)
    mesh, rows, heads = split
    x, s = P(rows, heads, None, None), P(rows, heads, None)
    return jax.shard_map(fn, mesh=mesh, in_specs=(x, x, x, P(rows, None)), out_specs=(x, s), check_vma=False)(
        q, k, v, seg)


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, spec: MaskSpec, *, scale: float, block_q: int,
                     block_k: int, interpret: bool = False) -> tuple[jax.Array, jax.Array]:
    """Splash on a spec it expresses (`splash_expressible`; the caller's responsibility -- use
    `splash_or_blockwise` otherwise): q [B, T, H, Dh], k/v [B, T, KVH, Dh] -> (o [B, T, H, Dh] in q's dtype,
    lse [B, T, H] fp32, -inf on padding), differentiable in q, k, v and through lse."""
    B, T, H, Dh = q.shape
    bq, bk, Tp = splash_block_layout(T, block_q, block_k)

    def heads(x):  # [B, T, h, Dh] -> [B, h, T', Dh]
        return jnp.pad(x, ((0, 0), (0, Tp - T), (0, 0), (0, 0))).transpose(0, 2, 1, 3)

    seg = jnp.pad(spec.q_segment, ((0, 0), (0, Tp - T)))
    o, lse = _per_device(lambda *a: _splash(*a, bq, bk, bool(interpret)),
                         heads(q * jnp.asarray(scale, q.dtype)), heads(k), heads(v), seg)
    real = (spec.q_segment != 0)[..., None]
    o = jnp.where(real[..., None], o.transpose(0, 2, 1, 3)[:, :T], 0).astype(q.dtype)
    return o, jnp.where(real, lse.transpose(0, 2, 1)[:, :T], -jnp.inf)


def splash_or_blockwise(q: jax.Array, k: jax.Array, v: jax.Array, spec: MaskSpec, *, scale: float, block_q: int,
                        block_k: int, interpret: bool = False) -> tuple[jax.Array, jax.Array]:
    """The TPU path of `attention_impl="pallas"`: Splash where `splash_expressible(spec)`, the blockwise backend
    otherwise (module docstring). Same signature and results as `pallas_attention` / `blockwise_attention`."""
    kw = dict(scale=float(scale), block_q=int(block_q), block_k=int(block_k))
    ok = splash_expressible(spec)
    if ok is False:
        return blockwise_attention(q, k, v, spec, **kw)

    def splash(q, k, v, spec):
        return splash_attention(q, k, v, spec, interpret=interpret, **kw)

    def blockwise(q, k, v, spec):
        return blockwise_attention(q, k, v, spec, **kw)

    if not isinstance(ok, jax.core.Tracer):
        return (splash if bool(ok) else blockwise)(q, k, v, spec)
    return jax.lax.cond(ok, splash, blockwise, q, k, v, spec)
