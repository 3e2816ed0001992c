"""Paged decode attention (models/paged_attention.py): the Pallas kernel (interpret mode) against the gathered
dense reference, and that reference against NumPy from the formula; sequences spanning page boundaries, lengths
0 / exactly a page multiple / partial last page, unordered page tables with junk past the used pages, GQA, MHA and
MQA, bf16, and shape errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mimesis_jax.models.paged_attention import (paged_attention, paged_attention_reference,
                                                slot_major_decode_attention)


def _case(rng, H, KVH, *, B=4, Dh=8, page_size=4, pool=19, per_seq=4, lengths=(13, 4, 0, 16), dtype=jnp.float32):
    q = rng.randn(B, H, Dh)
    k_pages, v_pages = rng.randn(KVH, pool, page_size, Dh), rng.randn(KVH, pool, page_size, Dh)
    perm = rng.permutation(pool)  # each sequence's pages are distinct pool pages in no particular order
    table = perm[:B * per_seq].reshape(B, per_seq).astype(np.int32)
    for b, n in enumerate(lengths):  # entries past the last used page point anywhere (even at other rows' pages)
        used = -(-n // page_size)
        table[b, used:] = rng.randint(0, pool, per_seq - used)
    arrays = (jnp.asarray(q, dtype), jnp.asarray(k_pages, dtype), jnp.asarray(v_pages, dtype), jnp.asarray(table),
              jnp.asarray(np.asarray(lengths, np.int32)))
    return arrays


def _np_paged(q, k_pages, v_pages, table, lengths):
    """out[b, h] from the formula in float64, walking the page table token by token."""
    q, k_pages, v_pages = (np.asarray(x, np.float64) for x in (q, k_pages, v_pages))
    B, H, Dh = q.shape
    KVH, _, S, _ = k_pages.shape
    out = np.zeros(q.shape)
    for b in range(B):
        for h in range(H):
            kh = h // (H // KVH)
            ks = [k_pages[kh, table[b, t // S], t % S] for t in range(lengths[b])]
            vs = [v_pages[kh, table[b, t // S], t % S] for t in range(lengths[b])]
            if not ks:
                continue
            s = np.stack(ks) @ q[b, h] * Dh ** -0.5
            p = np.exp(s - s.max())
            out[b, h] = (p / p.sum()) @ np.stack(vs)
    return out


@pytest.mark.parametrize("H,KVH", [(4, 2), (4, 4), (6, 1)])
def test_paged_kernel_equals_gathered_reference_and_numpy(H, KVH):
    q, kp, vp, table, lengths = _case(np.random.RandomState(H * 10 + KVH), H, KVH)
    ref = np.asarray(paged_attention_reference(q, kp, vp, table, lengths))
    np.testing.assert_allclose(ref, _np_paged(q, kp, vp, np.asarray(table), np.asarray(lengths)), atol=2e-6)
    out = np.asarray(jax.jit(paged_attention)(q, kp, vp, table, lengths))
    assert out.shape == (4, H, 8) and np.abs(out).max() > 0.1
    np.testing.assert_allclose(out, ref, atol=2e-6)
    np.testing.assert_array_equal(out[2], 0.0)  # length 0: nothing to attend


def test_paged_kernel_sees_only_its_own_valid_tokens():
    """Changing pool pages outside a sequence's used pages (or past its length on its last page) changes
    nothing for it; changing one of its used tokens does."""
    q, kp, vp, table, lengths = _case(np.random.RandomState(1), 4, 2, lengths=(6, 9, 3, 12))
    out = np.asarray(paged_attention(q, kp, vp, table, lengths))
    row, t = 0, np.asarray(table)
    used = set(t[row, :2].tolist())  # length 6, page size 4: pages 0 and 1, the last one half used
    others = [p for p in range(kp.shape[1]) if p not in used]
    kp2 = kp.at[:, others].set(99.0).at[:, t[row, 1], 2:].set(-99.0)
    out2 = np.asarray(paged_attention(q, kp2, vp, table, lengths))
    np.testing.assert_allclose(out2[row], out[row], atol=1e-6)
    kp3 = kp.at[:, t[row, 1], 1].set(5.0)
    assert np.abs(np.asarray(paged_attention(q, kp3, vp, table, lengths))[row] - out[row]).max() > 1e-3


def test_paged_kernel_bf16_and_scale():
    q, kp, vp, table, lengths = _case(np.random.RandomState(2), 4, 2, dtype=jnp.bfloat16)
    out = paged_attention(q, kp, vp, table, lengths, scale=0.5)
    assert out.dtype == jnp.bfloat16
    ref = paged_attention_reference(*(x.astype(jnp.float32) for x in (q, kp, vp)), table, lengths, scale=0.5)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref), atol=3e-2)


@pytest.mark.parametrize("H,KVH", [(4, 2), (6, 1)])
def test_slot_major_decode_attention_equals_numpy(H, KVH):
    """The engine's decode-burst attention over a slot-major pool (row b owns pages b*W .. b*W + W - 1) against
    the NumPy formula walking the same identity page table: lengths 0, a partial page, exactly a page multiple
    and the whole row; junk past each row's length is ignored."""
    rng = np.random.RandomState(7 + H)
    B, W, S, Dh = 4, 3, 4, 8
    lengths = np.asarray([7, 0, 8, 12], np.int32)
    q = rng.randn(B, H, Dh).astype(np.float32)
    kp, vp = (rng.randn(KVH, B * W, S, Dh).astype(np.float32) for _ in range(2))
    table = np.arange(B * W, dtype=np.int32).reshape(B, W)
    want = _np_paged(q, kp, vp, table, lengths)
    out = np.asarray(jax.jit(slot_major_decode_attention)(q, kp, vp, table, lengths))
    np.testing.assert_allclose(out, want, atol=2e-6)
    np.testing.assert_array_equal(out[1], 0.0)
    flat = np.arange(B * W * S).reshape(B, W * S)  # junk after every row's last valid position changes nothing
    junk = np.isin(np.arange(B * W * S), [f for b in range(B) for f in flat[b, lengths[b]:]]).reshape(B * W, S)
    kp2 = np.where(junk[None, :, :, None], 50.0, kp)
    np.testing.assert_allclose(np.asarray(slot_major_decode_attention(q, kp2, vp, table, lengths)), out, atol=1e-6)
    with pytest.raises(ValueError, match="rows x"):
        slot_major_decode_attention(q, kp[:, :-1], vp[:, :-1], table, lengths)


def test_paged_shape_errors():
    q, kp, vp, table, lengths = _case(np.random.RandomState(3), 4, 2)
    with pytest.raises(ValueError, match="k_pages"):
        paged_attention(q, kp[0], vp[0], table, lengths)
    with pytest.raises(ValueError, match="KV heads"):
        paged_attention(jnp.zeros((4, 3, 8)), kp, vp, table, lengths)
    with pytest.raises(ValueError, match="page_table"):
        paged_attention(q, kp, vp, table[:2], lengths)


def test_paged_kernel_lowers_to_triton_for_cuda():
    """No GPU here: lower the kernel for CUDA from this CPU host (jax.export) through the Pallas Triton lowering."""
    from jax import export

    args = (jax.ShapeDtypeStruct((3, 8, 128), jnp.bfloat16), jax.ShapeDtypeStruct((2, 40, 16, 128), jnp.bfloat16),
            jax.ShapeDtypeStruct((2, 40, 16, 128), jnp.bfloat16), jax.ShapeDtypeStruct((3, 6), jnp.int32),
            jax.ShapeDtypeStruct((3,), jnp.int32))
    lowered = export.export(jax.jit(lambda *a: paged_attention(*a, interpret=False)), platforms=["cuda"],
                            disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(*args)
    assert lowered.mlir_module().count("__gpu$xla.gpu.triton") == 1
