"""Flash attention as Pallas kernels (`attention_impl="pallas"`): forward, dq and dk/dv kernels under a custom VJP.

Same math, masks and conventions as the pure-JAX blockwise backend (models/blockwise_attention.py, whose module
docstring writes out the online softmax and the flash-attention-2 backward): per query i over its visible keys j,
s_ij = scale * q_i . k_j, lse_i = log sum_j exp(s_ij), o_i = sum_j exp(s_ij - lse_i) v_j; the backward recomputes
P_ij = exp(s_ij - lse_i) and, with D_i = sum_d dO_id O_id - dlse_i,

    dV_j = sum_i P_ij dO_i;   dS_ij = P_ij (dO_i . v_j - D_i);
    dQ_i = scale sum_j dS_ij k_j;   dK_j = scale sum_i dS_ij q_i.

The mask is never materialised: each kernel evaluates `masks.block_visible` on the block's slices of the
`MaskSpec` (segment ids and token indices of queries and keys), so packed segments, causal order, KV-cache slots
and both key groups of a CSD teacher branch (`attend_groups` merges them by their lse; the lse output is
differentiable through the dlse term above) all run through the same kernels. Key blocks that cannot hold a
visible pair are skipped: the per-block ranges of `blockwise_attention.block_ranges` bound each kernel's inner
loop (the mask inside a block stays exact, so skipping never changes the result).

Kernels (grids; "full" = the whole padded sequence of one row and head is the kernel's block):

* forward, grid (B, H, nq): a query block [bq, Dh] of head h against the full K/V of KV head h // G, looping over
  key blocks [lo, hi) with the online softmax (fp32 m, l, acc) -> o [bq, Dh], lse [bq];
* dq, grid (B, H, nq): the same loop recomputing P and accumulating dq;
* dk/dv, grid (B, KVH, nk): a key block against the full queries of the G query heads sharing that KV head,
  looping over query blocks [lo, hi) and the G heads, so GQA gradients are summed inside the kernel (no atomics).

Scores, softmax statistics and gradient accumulators are fp32 whatever the input dtype (bf16 allowed; P and dS
are cast to the input dtype for their matmuls, as in the blockwise backend). Lengths are padded to whole blocks
with segment 0 (visible to nothing); a query that sees no key returns o = 0, lse = -inf and zero gradients.

Backends: on CPU the kernels run in Pallas interpret mode (`interpret=None` picks it when
``kernel_platform() == "cpu"``: the default backend, or the platform `lowering_for` names when a CPU host
exports for an accelerator), which is how the tests check them against the dense and blockwise paths. On
GPUs they are lowered through Triton (`compiler_params`; jax's default there, Mosaic GPU, wants warpgroup-level
kernels): block sizes are powers of two >= 16 (Triton's smallest dot tile; head_dim should be >= 16 too), and the
tests lower all three kernels for CUDA from a CPU host (jax.export), but compiling and running them on a GPU is not
exercised by this repository's tests. On TPUs these kernels are not used (the Mosaic lowering wants (8, 128)-
aligned blocks, which their 1-D spec blocks are not): `pallas_attention` hands over to jax's Splash kernel
(models/splash_attention.py) for the specs Splash expresses exactly -- packed segments with causal order in array
positions: the training / scoring forward and the own-branch group of a CSD teacher branch -- and to the blockwise
backend for the others (the CSD trunk group's branch prefixes, KV-cache decoding), chosen from the spec's values
(`splash_attention.splash_expressible`). jax's GPU kernel (ops.gpu.attention) takes causal + segment ids only, so
GPUs keep these kernels for every spec.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt
from jax.sharding import PartitionSpec as P

from mimesis_jax.models.blockwise_attention import block_ranges
from mimesis_jax.models.masks import MaskSpec, block_visible, pad_spec
from mimesis_jax.models.splash_attention import splash_or_blockwise
from mimesis_jax.sharding import kernel_split

_F32 = jnp.float32
_NT = (((1,), (1,)), ((), ()))  # a [m, d] x b [n, d] -> [m, n]
_NN = (((1,), (0,)), ((), ()))  # a [m, n] x b [n, d] -> [m, d]
_TN = (((0,), (0,)), ((), ()))  # a [m, n] x b [m, d] -> [n, d]


def pallas_block_layout(T: int, block: int) -> tuple[int, int]:
    """(block size b, number of blocks n) for length T: b is a power of two >= 16 (Triton's smallest dot tile):
    the largest power of two <= `block` (at least 16), or less when T fits in a smaller one; n = ceil(T / b)."""
    if block < 1:
        raise ValueError(f"block size must be >= 1, got {block}")
    cap = max(16, 1 << (int(block).bit_length() - 1))
    b = min(cap, max(16, pl.next_power_of_2(T)))
    return b, -(-T // b)


def _dot(a, b, dims):
    return jax.lax.dot_general(a, b, dims, preferred_element_type=_F32)


def _visible(qs, qi, ks, ki):
    """`masks.block_visible` on one row's block slices: [bq] x [bk] -> bool [bq, bk]."""
    return block_visible(qs[None], qi[None], ks[None], ki[None])[0]


# ----------------------------------------------------------------------------------------------- kernels
def _fwd_kernel(lo_ref, hi_ref, qs_ref, qi_ref, ks_ref, ki_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *,
                scale, bk):
    b, i = pl.program_id(0), pl.program_id(2)
    q, qs, qi = q_ref[...], qs_ref[...], qi_ref[...]
    bq, dh = q.shape

    def body(j, carry):
        m, l, acc = carry
        sl = pl.ds(pl.multiple_of(j * bk, bk), bk)
        v = v_ref[sl, :]
        s = jnp.where(_visible(qs, qi, ks_ref[sl], ki_ref[sl]), _dot(q, k_ref[sl, :], _NT) * scale, -jnp.inf)
        m_new = jnp.maximum(m, s.max(-1))
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.exp(s - m_safe[:, None])
        alpha = jnp.exp(m - m_safe)
        return m_new, alpha * l + p.sum(-1), alpha[:, None] * acc + _dot(p.astype(v.dtype), v, _NN)

    init = (jnp.full((bq,), -jnp.inf, _F32), jnp.zeros((bq,), _F32), jnp.zeros((bq, dh), _F32))
    m, l, acc = jax.lax.fori_loop(lo_ref[b, i], hi_ref[b, i], body, init)
    ok = l > 0
    l1 = jnp.where(ok, l, 1.0)
    o_ref[...] = jnp.where(ok[:, None], acc / l1[:, None], 0.0).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(ok, m + jnp.log(l1), -jnp.inf)


def _dq_kernel(lo_ref, hi_ref, qs_ref, qi_ref, ks_ref, ki_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
               dq_ref, *, scale, bk):
    b, i = pl.program_id(0), pl.program_id(2)
    q, do, qs, qi = q_ref[...], do_ref[...], qs_ref[...], qi_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]

    def body(j, dq):
        sl = pl.ds(pl.multiple_of(j * bk, bk), bk)
        k, v = k_ref[sl, :], v_ref[sl, :]
        s = _dot(q, k, _NT) * scale
        p = jnp.where(_visible(qs, qi, ks_ref[sl], ki_ref[sl]), jnp.exp(s - lse[:, None]), 0.0)
        ds = p * (_dot(do, v, _NT) - delta[:, None])
        return dq + _dot(ds.astype(k.dtype), k, _NN)

    dq = jax.lax.fori_loop(lo_ref[b, i], hi_ref[b, i], body, jnp.zeros(q.shape, _F32))
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(lo_ref, hi_ref, qs_ref, qi_ref, ks_ref, ki_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
                dk_ref, dv_ref, *, scale, bq, groups):
    b, j = pl.program_id(0), pl.program_id(2)
    k, v, ks, ki = k_ref[...], v_ref[...], ks_ref[...], ki_ref[...]

    def body(i, carry):
        dk, dv = carry
        sl = pl.ds(pl.multiple_of(i * bq, bq), bq)
        mask = _visible(qs_ref[sl], qi_ref[sl], ks, ki)
        for g in range(groups):  # the query heads sharing this KV head
            q, do = q_ref[g, sl, :], do_ref[g, sl, :]
            p = jnp.where(mask, jnp.exp(_dot(q, k, _NT) * scale - lse_ref[g, sl][:, None]), 0.0)
            dv = dv + _dot(p.astype(do.dtype), do, _TN)
            ds = p * (_dot(do, v, _NT) - delta_ref[g, sl][:, None])
            dk = dk + _dot(ds.astype(q.dtype), q, _TN)
        return dk, dv

    zeros = jnp.zeros(k.shape, _F32)
    dk, dv = jax.lax.fori_loop(lo_ref[b, j], hi_ref[b, j], body, (zeros, zeros))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


# ----------------------------------------------------------------------------------------------- wrappers
def _layout(q, k, spec, block_q, block_k):
    """Padded head-major operands and the blocked spec: q [B, H, Tq', Dh], k [B, KVH, Tk', Dh], spec arrays
    [B, Tq'] / [B, Tk'], and the key-block range per query block ([B, nq] x2) and vice versa ([B, nk] x2)."""
    B, Tq, H, Dh = q.shape
    Tk, KVH = k.shape[1], k.shape[2]
    bq, nq = pallas_block_layout(Tq, block_q)
    bk, nk = pallas_block_layout(Tk, block_k)
    spec = pad_spec(spec, nq * bq, nk * bk)
    blk = lambda x, n, b_: x.reshape(B, n, 1, b_)  # noqa: E731  (per row: block_ranges with a batch of 1)
    ranges = jax.vmap(lambda *a: sum(block_ranges(*a), ()))(
        blk(spec.q_segment, nq, bq), blk(spec.q_index, nq, bq), blk(spec.k_segment, nk, bk),
        blk(spec.k_index, nk, bk))
    ranges = tuple(x.astype(jnp.int32) for x in ranges)  # [B, nq] x2, [B, nk] x2
    return (B, Tq, Tk, H, KVH, Dh), (bq, nq, bk, nk), spec, ranges


def _heads(x, T):
    """[B, t, h, Dh] -> [B, h, T, Dh] zero-padded along t to T."""
    return jnp.pad(x, ((0, 0), (0, T - x.shape[1]), (0, 0), (0, 0))).transpose(0, 2, 1, 3)


def _rows(x, T):
    """[B, t, H] -> [B, H, T] zero-padded."""
    return jnp.pad(x, ((0, 0), (0, T - x.shape[1]), (0, 0))).transpose(0, 2, 1)


def _common_specs(B, nq, nk, bq, bk, Tqp, Tkp, Dh, G, q_side: bool):
    """BlockSpecs of (range lo, range hi, q segment, q index, k segment, k index, q-like, k, v) for the grids
    (B, H, nq) (q_side) or (B, KVH, nk)."""
    n = nq if q_side else nk
    full = pl.BlockSpec((B, n), lambda b, h, i: (0, 0))
    if q_side:
        qrow = pl.BlockSpec((None, bq), lambda b, h, i: (b, i))
        krow = pl.BlockSpec((None, Tkp), lambda b, h, i: (b, 0))
        qmat = pl.BlockSpec((None, None, bq, Dh), lambda b, h, i: (b, h, i, 0))
        kmat = pl.BlockSpec((None, None, Tkp, Dh), lambda b, h, i: (b, h // G, 0, 0))
    else:
        qrow = pl.BlockSpec((None, Tqp), lambda b, h, j: (b, 0))
        krow = pl.BlockSpec((None, bk), lambda b, h, j: (b, j))
        qmat = pl.BlockSpec((None, G, Tqp, Dh), lambda b, h, j: (b, h, 0, 0))
        kmat = pl.BlockSpec((None, None, bk, Dh), lambda b, h, j: (b, h, j, 0))
    return [full, full, qrow, qrow, krow, krow, qmat, kmat, kmat]


def _forward(q, k, v, spec, scale, block_q, block_k, interpret):
    (B, Tq, Tk, H, KVH, Dh), (bq, nq, bk, nk), spec, (qlo, qhi, _, _) = _layout(q, k, spec, block_q, block_k)
    G, Tqp, Tkp = H // KVH, nq * bq, nk * bk
    in_specs = _common_specs(B, nq, nk, bq, bk, Tqp, Tkp, Dh, G, q_side=True)
    o, lse = pl.pallas_call(
        functools.partial(_fwd_kernel, scale=scale, bk=bk), grid=(B, H, nq), in_specs=in_specs,
        out_specs=[pl.BlockSpec((None, None, bq, Dh), lambda b, h, i: (b, h, i, 0)),
                   pl.BlockSpec((None, None, bq), lambda b, h, i: (b, h, i))],
        out_shape=[jax.ShapeDtypeStruct((B, H, Tqp, Dh), q.dtype), jax.ShapeDtypeStruct((B, H, Tqp), _F32)],
        interpret=interpret, name="mimesis_flash_fwd", compiler_params=compiler_params(),
    )(qlo, qhi, spec.q_segment, spec.q_index, spec.k_segment, spec.k_index, _heads(q, Tqp), _heads(k, Tkp),
      _heads(v, Tkp))
    return o.transpose(0, 2, 1, 3)[:, :Tq], lse.transpose(0, 2, 1)[:, :Tq]


def _backward(q, k, v, spec, o, lse, do, dlse, scale, block_q, block_k, interpret):
    (B, Tq, Tk, H, KVH, Dh), (bq, nq, bk, nk), spec, (qlo, qhi, klo, khi) = _layout(q, k, spec, block_q, block_k)
    G, Tqp, Tkp = H // KVH, nq * bq, nk * bk
    delta = jnp.sum(do.astype(_F32) * o.astype(_F32), axis=-1) - dlse.astype(_F32)  # [B, Tq, H]
    lse = jnp.where(jnp.isfinite(lse), lse, 0.0)  # rows that see nothing: every P is masked to 0 anyway
    qh, kh, vh, doh = _heads(q, Tqp), _heads(k, Tkp), _heads(v, Tkp), _heads(do, Tqp)
    lseh, deltah = _rows(lse, Tqp), _rows(delta, Tqp)
    segs = (spec.q_segment, spec.q_index, spec.k_segment, spec.k_index)

    in_q = _common_specs(B, nq, nk, bq, bk, Tqp, Tkp, Dh, G, q_side=True)
    row_q = pl.BlockSpec((None, None, bq), lambda b, h, i: (b, h, i))
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, scale=scale, bk=bk), grid=(B, H, nq),
        in_specs=in_q + [in_q[6], row_q, row_q], out_specs=in_q[6],
        out_shape=jax.ShapeDtypeStruct((B, H, Tqp, Dh), q.dtype), interpret=interpret, name="mimesis_flash_dq",
        compiler_params=compiler_params(),
    )(qlo, qhi, *segs, qh, kh, vh, doh, lseh, deltah)

    in_k = _common_specs(B, nq, nk, bq, bk, Tqp, Tkp, Dh, G, q_side=False)
    row_k = pl.BlockSpec((None, G, Tqp), lambda b, h, j: (b, h, 0))
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, scale=scale, bq=bq, groups=G), grid=(B, KVH, nk),
        in_specs=in_k + [in_k[6], row_k, row_k], out_specs=[in_k[7], in_k[7]],
        out_shape=[jax.ShapeDtypeStruct((B, KVH, Tkp, Dh), k.dtype), jax.ShapeDtypeStruct((B, KVH, Tkp, Dh), v.dtype)],
        interpret=interpret, name="mimesis_flash_dkv", compiler_params=compiler_params(),
    )(klo, khi, *segs, qh, kh, vh, doh, lseh, deltah)
    unh = lambda x, T: x.transpose(0, 2, 1, 3)[:, :T]  # noqa: E731
    return unh(dq, Tq), unh(dk, Tk), unh(dv, Tk)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _flash(q, k, v, spec, scale, block_q, block_k, interpret):
    return _forward(q, k, v, spec, scale, block_q, block_k, interpret)


def _flash_fwd(q, k, v, spec, scale, block_q, block_k, interpret):
    o, lse = _forward(q, k, v, spec, scale, block_q, block_k, interpret)
    return (o, lse), (q, k, v, spec, o, lse)


def _flash_bwd(scale, block_q, block_k, interpret, res, cts):
    q, k, v, spec, o, lse = res
    do, dlse = cts
    dq, dk, dv = _backward(q, k, v, spec, o, lse, do, dlse, scale, block_q, block_k, interpret)
    return dq, dk, dv, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def compiler_params():
    """Triton parameters except on TPU: jax lowers Pallas to Mosaic GPU on GPUs by default, whose warpgroup
    programming model these kernels are not written for; the parameters select Triton there (they are ignored in
    interpret mode, and also let a CPU host lower the kernels for CUDA, see the tests)."""
    return None if kernel_platform() == "tpu" else plt.CompilerParams(num_warps=4, num_stages=2)


_TARGET: list[str] = []  # the platform `lowering_for` targets (innermost last); empty: the default backend


def kernel_platform() -> str:
    """The platform the attention kernels are traced for: jax's default backend, or the one `lowering_for`
    names (a CPU host exporting a program for an accelerator)."""
    return _TARGET[-1] if _TARGET else jax.default_backend()


@contextlib.contextmanager
def lowering_for(platform: str):
    """Trace the kernels for `platform` ("cpu", "cuda" or "tpu") instead of the default backend, e.g. on a CPU
    host before `jax.export.export(fn, platforms=(platform,))`: the choice of kernel (Triton, Splash / TPU
    paged, interpret mode) is made at trace time from `kernel_platform()`, and jax.export only lowers. jax's
    trace caches do not see the choice, so they are cleared on entry and exit (a program traced under it is
    never reused outside it, nor one traced outside reused under it)."""
    if platform not in ("cpu", "cuda", "rocm", "tpu"):
        raise ValueError(f"lowering_for: platform must be cpu, cuda, rocm or tpu, got {platform!r}")
    jax.clear_caches()
    _TARGET.append(platform)
    try:
        yield
    finally:
        _TARGET.pop()
        jax.clear_caches()


def on_tpu() -> bool:
    """Whether the TPU path (Splash / blockwise) replaces these kernels: the kernels target a TPU."""
    return kernel_platform() == "tpu"


def default_interpret() -> bool:
    """Pallas interpret mode where no kernel compiler exists: the kernels target the CPU."""
    return kernel_platform() == "cpu"


def pallas_attention(q: jax.Array, k: jax.Array, v: jax.Array, spec: MaskSpec, *, scale: float, block_q: int,
                     block_k: int, interpret: bool | None = None) -> tuple[jax.Array, jax.Array]:
    """q [B, Tq, H, Dh], k/v [B, Tk, KVH, Dh], spec over (Tq, Tk) -> (o [B, Tq, H, Dh] in q's dtype,
    lse [B, Tq, H] fp32; -inf where a query sees no key). Differentiable in q, k, v (and through lse).
    `interpret=None` runs the kernels in interpret mode on CPU only. On TPU: `splash_or_blockwise`."""
    interpret = default_interpret() if interpret is None else bool(interpret)
    if on_tpu():  # Splash where it expresses the spec, blockwise elsewhere (module docstring)
        return splash_or_blockwise(q, k, v, spec, scale=scale, block_q=block_q, block_k=block_k, interpret=interpret)
    return _per_device(lambda q, k, v, spec: _flash(q, k, v, spec, float(scale), int(block_q), int(block_k),
                                                    interpret), q, k, v, spec)


def _per_device(fn, q, k, v, spec):
    """`fn(q, k, v, spec)` on each device's rows and heads under the current mesh (`jax.set_mesh`), through
    shard_map: XLA cannot partition a Pallas (Triton) call, so without it every device would gather the whole
    batch and run every row's and head's attention. Rows split as act_batch, query and KV heads as act_heads /
    act_kv_heads when both split over the same axes (contiguous chunks keep head h on KV head h // G), else
    heads replicated; the mask spec follows the rows. No mesh or one device: `fn` as is."""
    split = kernel_split(q.shape[0], q.shape[2], k.shape[2])
    if split is None:
        return fn(q, k, v, spec)
    mesh, rows, heads = split
    x, s = P(rows, None, heads, None), P(rows, None)
    return jax.shard_map(fn, mesh=mesh, in_specs=(x, x, x, MaskSpec(s, s, s, s)), out_specs=(x, P(rows, None, heads)),
                         check_vma=False)(q, k, v, spec)
