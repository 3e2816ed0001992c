"""Decode attention over a paged KV cache: one new query token per sequence against its pages.

Layout (agreed with the inference engine):

* q [B, H, Dh]: the current token's queries (query head h reads KV head h // (H // KVH), as HF's repeat_kv);
* k_pages, v_pages [KVH, P, page_size, Dh]: the shared page pool;
* page_table [B, pages_per_seq] int32: sequence b's logical page n lives in pool page page_table[b, n]
  (any order; entries past the sequence's last page are ignored and may hold anything in [0, P));
* lengths [B] int32: sequence b's tokens are its logical positions 0 .. lengths[b] - 1 (the new token included).

    out[b, h] = sum_t softmax_t(scale * q[b, h] . K_b[t]) V_b[t],   t < lengths[b],

with K_b[t] = k_pages[h // G, page_table[b, t // page_size], t % page_size]; a sequence of length 0 gets 0.

`paged_attention` runs a Pallas kernel over the grid (B, KVH): the G query heads of one KV head form a [G, Dh]
block, the kernel walks the sequence's used pages through the page table (the last one partly masked) with the
online softmax of models/blockwise_attention.py (fp32 statistics and accumulator whatever the input dtype). On
CPU it runs in interpret mode (the tests check it against `paged_attention_reference`, which gathers the pages
into a dense [B, T, KVH, Dh] cache and calls the dense backend). On TPU, where the portable kernel would hold a
head's whole page pool in VMEM, `paged_attention` hands the same arguments to jax's tuned TPU kernel
(jax.experimental.pallas.ops.tpu.paged_attention, the same layout; q pre-scaled since that kernel does not scale).
Under a multi-device mesh either kernel runs per device in shard_map (XLA cannot partition a Pallas call). The TPU
path is lowered for TPU from this CPU host by tests/test_cross_lowering.py but not run by this repository's tests.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from mimesis_jax.models.attention import dense_attention
from mimesis_jax.models.masks import make_spec
from mimesis_jax.models.pallas_attention import compiler_params, kernel_platform
from mimesis_jax.sharding import kernel_split

_F32 = jnp.float32
_NEG = -0.7 * float(jnp.finfo(jnp.float32).max)  # a masked score (as models/paged_cache.py)


def _check(q, k_pages, v_pages, page_table, lengths):
    if q.ndim != 3 or k_pages.ndim != 4 or k_pages.shape != v_pages.shape:
        raise ValueError(f"paged_attention: q {q.shape} must be [B, H, Dh] and k_pages/v_pages "
                         f"{k_pages.shape}/{v_pages.shape} [KVH, P, page_size, Dh]")
    B, H, Dh = q.shape
    KVH = k_pages.shape[0]
    if k_pages.shape[3] != Dh or H % KVH:
        raise ValueError(f"paged_attention: head_dim {Dh} vs {k_pages.shape[3]}, or KV heads {KVH} do not divide "
                         f"query heads {H}")
    if page_table.ndim != 2 or page_table.shape[0] != B or lengths.shape != (B,):
        raise ValueError(f"paged_attention: page_table {page_table.shape} must be [B={B}, pages_per_seq] and "
                         f"lengths {lengths.shape} [B]")


def paged_attention_reference(q, k_pages, v_pages, page_table, lengths, *, scale: float | None = None):
    """The formula through the dense backend: gather each sequence's pages into [B, pages_per_seq * page_size,
    KVH, Dh], mask positions >= length, attend. For tests and as a fallback."""
    _check(q, k_pages, v_pages, page_table, lengths)
    B, H, Dh = q.shape
    KVH, _, S, _ = k_pages.shape
    T = page_table.shape[1] * S

    def gather(pages):  # [KVH, P, S, Dh] -> [B, T, KVH, Dh]
        return pages[:, page_table].reshape(KVH, B, T, Dh).transpose(1, 2, 0, 3)

    pos = jnp.arange(T, dtype=jnp.int32)
    kseg = (pos[None] < lengths[:, None]).astype(jnp.int32)
    spec = make_spec(jnp.ones((B, 1), jnp.int32), kseg, jnp.full((B, 1), T, jnp.int32), jnp.broadcast_to(pos, (B, T)))
    scale = Dh ** -0.5 if scale is None else float(scale)
    o, _ = dense_attention(q[:, None], gather(k_pages), gather(v_pages), spec, scale)
    return o[:, 0]


def slot_major_decode_attention(q, k_pages, v_pages, page_table, lengths, *, scale: float | None = None):
    """`paged_attention` for a pool laid out slot-major: row b's pages are pool pages b * W .. (b + 1) * W - 1
    in order (W = P / B; page_table [B, W] must be that identity table and is used only for its shape).

    The rollout engine's decode bursts (inference/engine_programs.py) copy the decoding rows' pages into such a pool once
    per burst, so a step reads each row's keys through a reshape instead of gathering its pages: on a CPU the
    per-step gather cost as much as the attention. fp32 scores and softmax (the formula of the module
    docstring; lengths [B], a row of length 0 gets 0) -> [B, H, Dh] in q's dtype."""
    _check(q, k_pages, v_pages, page_table, lengths)
    B, H, Dh = q.shape
    KVH, P, S, _ = k_pages.shape
    if P != B * page_table.shape[1]:
        raise ValueError(f"slot_major_decode_attention: the pool's {P} pages are not {B} rows x "
                         f"{page_table.shape[1]} pages")
    G, T = H // KVH, page_table.shape[1] * S
    scale = Dh ** -0.5 if scale is None else float(scale)
    k, v = k_pages.reshape(KVH, B, T, Dh), v_pages.reshape(KVH, B, T, Dh)
    qg = q.reshape(B, KVH, G, Dh).transpose(1, 0, 2, 3)  # [KVH, B, G, Dh]: batch axes lead, as in k and v
    s = jnp.einsum("kbgd,kbtd->kbgt", qg, k, preferred_element_type=_F32) * scale
    mask = (jnp.arange(T, dtype=jnp.int32)[None] < lengths[:, None])[None, :, None]  # [1, B, 1, T]
    s = jnp.where(mask, s, _NEG)
    p = jnp.where(mask, jax.nn.softmax(s, axis=-1), 0.0)
    o = jnp.einsum("kbgt,kbtd->kbgd", p.astype(v.dtype), v, preferred_element_type=_F32)
    return o.transpose(1, 0, 2, 3).reshape(B, H, Dh).astype(q.dtype)


def _paged_kernel(table_ref, len_ref, q_ref, k_ref, v_ref, o_ref, *, scale, page_size):
    b = pl.program_id(0)
    q = q_ref[...].astype(_F32)  # [G, Dh]
    length = len_ref[b]

    def body(n, carry):
        m, l, acc = carry
        page = table_ref[b, n]
        k, v = k_ref[page], v_ref[page]  # [page_size, Dh]
        # broadcast-multiply-sum, not a matmul: G query heads is usually below the 16 rows of a GPU dot tile
        s = jnp.sum(q[:, None, :] * k[None].astype(_F32), axis=-1) * scale  # [G, page_size]
        valid = n * page_size + jnp.arange(page_size, dtype=jnp.int32) < length
        s = jnp.where(valid[None], s, -jnp.inf)
        m_new = jnp.maximum(m, s.max(-1))
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.exp(s - m_safe[:, None])
        alpha = jnp.exp(m - m_safe)
        pv = jnp.sum(p[:, :, None] * v[None].astype(_F32), axis=1)  # [G, Dh]
        return m_new, alpha * l + p.sum(-1), alpha[:, None] * acc + pv

    G, Dh = q.shape
    init = (jnp.full((G,), -jnp.inf, _F32), jnp.zeros((G,), _F32), jnp.zeros((G, Dh), _F32))
    n_pages = jnp.minimum((length + page_size - 1) // page_size, table_ref.shape[1])
    _, l, acc = jax.lax.fori_loop(0, n_pages, body, init)
    o_ref[...] = jnp.where(l[:, None] > 0, acc / jnp.where(l > 0, l, 1.0)[:, None], 0.0).astype(o_ref.dtype)


def _tpu_paged(q, k_pages, v_pages, page_table, lengths, scale):
    # lazy (b): the Pallas TPU kernel only on TPU
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as tpu_paged
    pps = page_table.shape[1]
    per_block = max(d for d in range(1, min(pps, 8) + 1) if pps % d == 0)

    def kernel(q, k_pages, v_pages, lengths, page_table):
        return tpu_paged(q, k_pages, v_pages, lengths, page_table, pages_per_compute_block=per_block)

    o = _per_device(kernel, (q * scale).astype(q.dtype), k_pages, v_pages, lengths, page_table)
    return jnp.where((lengths > 0)[:, None, None], o, 0).astype(q.dtype)


def _per_device(kernel, q, k_pages, v_pages, lengths, page_table):
    """`kernel` on each device's rows and KV heads under the current mesh (`jax.set_mesh`), through shard_map: XLA
    cannot partition a Pallas call (a Mosaic one under a multi-device mesh does not even lower: "Mosaic kernels
    cannot be automatically partitioned"; a Triton one would get every operand gathered onto every device).
    Rows and heads split as sharding.kernel_split says, each KV head with its pages; the page tables and lengths
    follow the rows."""
    split = kernel_split(q.shape[0], q.shape[1], k_pages.shape[0])
    if split is None:
        return kernel(q, k_pages, v_pages, lengths, page_table)
    mesh, rows, heads = split
    pool = P(heads, None, None, None)
    return jax.shard_map(kernel, mesh=mesh, in_specs=(P(rows, heads, None), pool, pool, P(rows), P(rows, None)),
                         out_specs=P(rows, heads, None), check_vma=False)(q, k_pages, v_pages, lengths, page_table)


def paged_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array,
                    lengths: jax.Array, *, scale: float | None = None, interpret: bool | None = None) -> jax.Array:
    """Decode attention over a paged cache (layout in the module docstring) -> out [B, H, Dh] in q's dtype.
    `interpret=None`: interpret mode on CPU; on TPU (interpret not forced) jax's TPU paged kernel is used."""
    _check(q, k_pages, v_pages, page_table, lengths)
    Dh = q.shape[2]
    scale = Dh ** -0.5 if scale is None else float(scale)
    page_table, lengths = jnp.asarray(page_table, jnp.int32), jnp.asarray(lengths, jnp.int32)
    backend = kernel_platform()
    if interpret is None and backend == "tpu":
        return _tpu_paged(q, k_pages, v_pages, page_table, lengths, scale)
    interpret = backend == "cpu" if interpret is None else bool(interpret)
    kernel = functools.partial(_portable, scale=scale, interpret=interpret)
    return _per_device(kernel, q, k_pages, v_pages, lengths, page_table)


def _portable(q, k_pages, v_pages, lengths, page_table, *, scale: float, interpret: bool):
    """The portable Pallas kernel (Triton on GPUs, interpret mode on CPU) over grid (rows, KV heads)."""
    B, H, Dh = q.shape
    KVH, n_pages, S, _ = k_pages.shape
    G = H // KVH
    pool = pl.BlockSpec((None, n_pages, S, Dh), lambda b, h: (h, 0, 0, 0))
    o = pl.pallas_call(
        functools.partial(_paged_kernel, scale=scale, page_size=S), grid=(B, KVH),
        in_specs=[pl.BlockSpec(page_table.shape, lambda b, h: (0, 0)), pl.BlockSpec((B,), lambda b, h: (0,)),
                  pl.BlockSpec((None, None, G, Dh), lambda b, h: (b, h, 0, 0)), pool, pool],
        out_specs=pl.BlockSpec((None, None, G, Dh), lambda b, h: (b, h, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((B, KVH, G, Dh), q.dtype), interpret=interpret,
        name="mimesis_paged_decode", compiler_params=compiler_params(),
    )(page_table, lengths, q.reshape(B, KVH, G, Dh), k_pages, v_pages)
    return o.reshape(B, H, Dh)
