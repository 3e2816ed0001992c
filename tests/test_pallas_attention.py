"""The Pallas flash-attention kernels (models/pallas_attention.py) in interpret mode against the dense reference
and the pure-JAX blockwise backend: values, log-sum-exps and gradients (q, k, v, through o and lse) on packed /
cache / arbitrary / fully-masked specs with GQA and lengths that are not block multiples, CSD branch key groups,
bf16 inputs, the per-row block skipping and the Triton lowering for CUDA. The whole-model checks (a tiny Qwen3
under attention_impl="pallas" against "dense") are in tests/test_attention.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_helpers import check_bf16_long_attention, tiny_config
from mimesis_jax.models.attention import attend, attend_groups
from mimesis_jax.models.masks import branch_mask, branch_specs, cache_spec, causal_spec, dense_mask, make_spec
from mimesis_jax.models.pallas_attention import _layout, default_interpret, pallas_attention, pallas_block_layout

QWEN3 = tiny_config(initializer_range=0.2, vocab_size=67)
PALLAS = dict(attention_impl="pallas", attention_block_q=16, attention_block_k=16)


# ------------------------------------------------------------------------------------------ cases
def _qkv(rng, B, Tq, Tk, H, KVH, Dh=8, dtype=jnp.float32):
    return tuple(jnp.asarray(rng.randn(*s), dtype) for s in ((B, Tq, H, Dh), (B, Tk, KVH, Dh), (B, Tk, KVH, Dh)))


def _segments(rng, B, T, lead_pad=0):
    """Rows packed with segments 1, 2, ... of random lengths; row b starts after lead_pad * b padding tokens and
    ends with at least two padding tokens."""
    seg = np.zeros((B, T), np.int32)
    for b in range(B):
        t, s = lead_pad * b, 1
        while t < T - 2:
            n = rng.randint(1, T // 3 + 1)
            seg[b, t:min(t + n, T - 2)] = s
            t, s = t + n, s + 1
    return seg


def _cache(B, S, start, Tq, left_pad):
    """Queries at cache slots start .. start + Tq - 1 over S slots; row b's slots before left_pad[b] are empty."""
    kseg = np.zeros((B, S), np.int32)
    for b, lp in enumerate(left_pad):
        kseg[b, lp:start + Tq] = 1
    slots = np.broadcast_to(np.arange(start, start + Tq, dtype=np.int32), (B, Tq))
    return cache_spec(jnp.asarray(kseg[:, start:start + Tq]), jnp.asarray(slots), jnp.asarray(kseg))


def _cases():
    rng = np.random.RandomState(11)
    packed = jnp.asarray(_segments(rng, 2, 45, lead_pad=3))
    dead = _segments(rng, 2, 27)
    dead[1] = 0  # a row of padding only
    arbitrary = make_spec(rng.randint(0, 4, (2, 33)), rng.randint(0, 4, (2, 29)), rng.randint(0, 20, (2, 33)),
                          rng.randint(0, 20, (2, 29)))
    return {  # name -> (spec, H, KVH, block_q, block_k)
        "packed_gqa2": (causal_spec(packed), 4, 2, 16, 16),
        "packed_mqa_long": (causal_spec(jnp.asarray(_segments(rng, 1, 100))), 4, 1, 16, 32),
        "packed_one_block": (causal_spec(packed), 2, 2, 512, 512),
        "cache_prefill": (_cache(2, 40, 12, 9, (0, 3)), 4, 2, 16, 16),
        "cache_decode": (_cache(2, 40, 25, 1, (2, 0)), 4, 1, 16, 16),
        "arbitrary": (arbitrary, 6, 3, 16, 16),
        "fully_masked_rows": (causal_spec(jnp.asarray(dead)), 4, 2, 16, 16),
    }


CASES = _cases()


def masked_attention(q, k, v, mask):
    """The formula with an explicit boolean mask [B, Tq, Tk] in plain JAX (K/V heads repeated as HF's repeat_kv);
    rows that see nothing give 0."""
    G = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    s = jnp.where(mask[:, None], s, -jnp.inf)
    m = jnp.where(mask[:, None].any(-1, keepdims=True), s.max(-1, keepdims=True), 0.0)
    e = jnp.where(mask[:, None], jnp.exp(s - m), 0.0)
    return jnp.einsum("bhqk,bkhd->bqhd", e / jnp.maximum(e.sum(-1, keepdims=True), 1e-30), v)


def _objective(impl, spec, r_o, r_lse, **kw):
    """sum(o * r_o) + sum(lse * r_lse) over rows that see something: exercises both outputs' gradients."""
    def f(q, k, v):
        o, lse = attend(q, k, v, spec, impl=impl, return_lse=True, **kw)
        return jnp.sum(o * r_o) + jnp.sum(jnp.where(jnp.isfinite(lse), lse * r_lse, 0.0)), (o, lse)
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))


def test_runs_in_interpret_mode_on_cpu_and_block_layout():
    assert jax.default_backend() == "cpu" and default_interpret()
    assert pallas_block_layout(45, 16) == (16, 3)
    assert pallas_block_layout(5, 512) == (16, 1)  # Triton's smallest tile
    assert pallas_block_layout(100, 24) == (16, 7)  # block sizes round down to powers of two
    assert pallas_block_layout(300, 512) == (512, 1)
    with pytest.raises(ValueError, match="block size"):
        pallas_block_layout(10, 0)


@pytest.mark.parametrize("case", list(CASES))
def test_pallas_equals_dense_and_blockwise_values_and_gradients(case):
    spec, H, KVH, bq, bk = CASES[case]
    B, Tq = spec.q_segment.shape
    rng = np.random.RandomState(3)
    q, k, v = _qkv(rng, B, Tq, spec.k_segment.shape[1], H, KVH)
    r_o, r_lse = jnp.asarray(rng.randn(*q.shape), jnp.float32), jnp.asarray(rng.randn(B, Tq, H), jnp.float32)
    (_, (od, ld)), gd = _objective("dense", spec, r_o, r_lse)(q, k, v)
    (_, (ob, lb)), gb = _objective("blockwise", spec, r_o, r_lse, block_q=bq, block_k=bk)(q, k, v)
    (_, (op, lp)), gp = _objective("pallas", spec, r_o, r_lse, block_q=bq, block_k=bk)(q, k, v)
    fin = np.isfinite(np.asarray(ld))
    np.testing.assert_array_equal(np.isfinite(np.asarray(lp)), fin)
    for ref in ((od, ld, gd), (ob, lb, gb)):
        np.testing.assert_allclose(np.asarray(op), np.asarray(ref[0]), atol=1e-5)
        np.testing.assert_allclose(np.asarray(lp)[fin], np.asarray(ref[1])[fin], atol=1e-5)
        for name, a, b in zip("qkv", gp, ref[2]):
            assert np.isfinite(np.asarray(a)).all(), name
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, err_msg=f"d{name}")
    dead = ~np.asarray(dense_mask(spec)).any(-1)  # queries that see nothing: output 0, gradient 0
    np.testing.assert_array_equal(np.asarray(op)[dead], 0.0)
    np.testing.assert_array_equal(np.asarray(gp[0])[dead], 0.0)
    assert np.abs(np.asarray(od)).max() > 0.1 and not dead.all()
    if case == "fully_masked_rows":
        assert dead[1].all()


def test_branch_groups_merge_exactly():
    """CSD branch queries over [trunk ; own branch] keys: the two groups through the kernels, merged by their
    lse (`attend_groups`), equal one softmax over the concatenated keys and mask (values and gradients)."""
    rng = np.random.RandomState(4)
    B, T, Tb = 2, 40, 26
    trunk = np.zeros((B, T), np.int32)
    trunk[:, :22], trunk[:, 22:35] = 1, 2  # two trajectories per trunk row, then padding
    bid = np.zeros((B, Tb), np.int32)
    bid[:, :9], bid[:, 9:15], bid[:, 15:23] = 1, 2, 3  # three branches, then branch padding
    bts = np.select([bid == 3, bid > 0], [2, 1], 0).astype(np.int32)  # branch 3 coaches the second trajectory
    prefix = np.select([bid == 1, bid == 2, bid == 3], [6, 17, 30], 0).astype(np.int32)
    trunk, bts, prefix, bid = (jnp.asarray(x) for x in (trunk, bts, prefix, bid))
    qb, kb, vb = _qkv(rng, B, Tb, Tb, 4, 2)
    _, kt, vt = _qkv(rng, B, T, T, 4, 2)
    to_trunk, to_self = branch_specs(trunk, bts, prefix, bid)
    mask = branch_mask(trunk, bts, prefix, bid)
    r = jnp.asarray(rng.randn(*qb.shape), jnp.float32)

    def merged(qb, kt, vt, kb, vb):
        return jnp.sum(r * attend_groups(qb, [(kt, vt, to_trunk), (kb, vb, to_self)], impl="pallas", block_q=16,
                                         block_k=16))

    def reference(qb, kt, vt, kb, vb):
        kk, vv = jnp.concatenate([kt, kb], 1), jnp.concatenate([vt, vb], 1)
        return jnp.sum(r * masked_attention(qb, kk, vv, mask))

    args = (qb, kt, vt, kb, vb)
    got, want = (jax.jit(jax.value_and_grad(f, range(5)))(*args) for f in (merged, reference))
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-5)
    for a, b in zip(got[1], want[1]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    seen = np.asarray(dense_mask(to_trunk)).sum(-1)  # trunk keys per branch query: the prefixes (pads: none)
    np.testing.assert_array_equal(seen[0, [0, 9, 15, 25]], [6, 17, 8, 0])


def test_bf16_long_sequence_matches_fp32_reference_and_carries_are_fp32():
    """bf16 q/k/v at T = 1024 (64 key blocks of 16 per late query): the output's mean error against a float64
    NumPy reference on the same bf16-rounded inputs stays at the fp32-accumulation level (measured 1.5e-4: the
    bf16 rounding of p and of the output), well under what a bf16 output accumulator gives (3.8e-4 measured);
    lse within 1e-5 (6e-7 measured; a bf16 running sum is off by ~1e-3). Every float loop carry of the forward and
    backward programs (m, l, acc; dq, dk, dv) is float32 in the jaxpr."""
    check_bf16_long_attention("pallas")


def test_bf16_inputs_accumulate_in_fp32():
    spec, H, KVH, bq, bk = CASES["packed_gqa2"]
    q, k, v = _qkv(np.random.RandomState(6), 2, 45, 45, H, KVH)
    lo = tuple(x.astype(jnp.bfloat16) for x in (q, k, v))
    ref_o = attend(q, k, v, spec, impl="dense")
    ref_g = jax.grad(lambda *a: jnp.sum(attend(*a, spec, impl="dense") ** 2), argnums=(0, 1, 2))(
        *(x.astype(jnp.float32) for x in lo))

    def loss(q, k, v):
        o, lse = attend(q, k, v, spec, impl="pallas", return_lse=True, block_q=bq, block_k=bk)
        return jnp.sum(o.astype(jnp.float32) ** 2), (o, lse)

    (_, (o, lse)), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(*lo)
    assert o.dtype == jnp.bfloat16 and lse.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(o, np.float32), np.asarray(ref_o), atol=5e-2)
    for g, r in zip(grads, ref_g):
        assert g.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r), atol=0.1 * np.abs(np.asarray(r)).max())


def test_block_skipping_is_per_row():
    """Key-block ranges per (row, query block): a causal row skips the blocks above the diagonal, and a row whose
    short segments end early skips more than a row of one long segment."""
    seg = np.zeros((2, 64), np.int32)
    seg[0] = 1  # one segment over the whole row
    seg[1, :20], seg[1, 20:40] = 1, 2  # two segments, then padding
    spec = causal_spec(jnp.asarray(seg))
    q = jnp.zeros((2, 64, 2, 8))
    _, (bq, nq, bk, nk), _, (qlo, qhi, klo, khi) = _layout(q, q, spec, 16, 16)
    assert (bq, nq, bk, nk) == (16, 4, 16, 4)
    np.testing.assert_array_equal(np.asarray(qlo[0]), [0, 0, 0, 0])
    np.testing.assert_array_equal(np.asarray(qhi[0]), [1, 2, 3, 4])  # the causal diagonal
    # row 1: query block 2 holds only segment 2 (keys 20..39) so it skips key block 0; block 3 is all padding
    np.testing.assert_array_equal(np.asarray(qlo[1]), [0, 0, 1, 4])
    np.testing.assert_array_equal(np.asarray(qhi[1]), [1, 2, 3, 0])
    np.testing.assert_array_equal(np.asarray(klo[0]), [0, 1, 2, 3])
    np.testing.assert_array_equal(np.asarray(khi[0]), [4, 4, 4, 4])


def test_kernels_lower_to_triton_for_cuda():
    """No GPU here: lower the forward and both backward kernels for CUDA from this CPU host (jax.export) to check
    that they pass the Pallas Triton lowering (block shapes, ops, scalar loads); compiling them needs a GPU."""
    from jax import export

    seg = jnp.asarray(np.repeat([[1] * 200 + [2] * 100 + [0] * 20], 3, 0), jnp.int32)  # 320 = 5 blocks of 64
    q, k = jax.ShapeDtypeStruct((3, 320, 4, 64), jnp.bfloat16), jax.ShapeDtypeStruct((3, 320, 2, 64), jnp.bfloat16)

    def loss(q, k, v):
        o, lse = pallas_attention(q, k, v, causal_spec(seg), scale=0.125, block_q=64, block_k=64, interpret=False)
        return jnp.sum(o.astype(jnp.float32)) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))

    lowered = export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=["cuda"], disabled_checks=[
        export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(q, k, k)
    assert lowered.mlir_module().count("__gpu$xla.gpu.triton") == 3  # forward, dq, dk/dv


# ------------------------------------------------------------------------------------------ whole models
# (a tiny Qwen3 forward, log-prob gradients, prefill + decoding and CSD branches under pallas vs dense: the
# backend-parametrized model tests of tests/test_attention.py)


def test_config_accepts_pallas():
    assert QWEN3.replace(attention_impl="pallas").attention_impl == "pallas"
    assert QWEN3.attention_impl == "dense"  # the default stays the dense reference


def _mesh_objective(spec, r):
    def objective(attn):
        return jax.value_and_grad(lambda q, k, v: jnp.sum(attn(q, k, v) * r), (0, 1, 2))
    return objective, lambda q, k, v: pallas_attention(q, k, v, spec, scale=8 ** -0.5, block_q=16, block_k=16)[0]


@pytest.mark.parametrize("KVH", [2, 1])
def test_kernels_are_per_device_under_a_mesh(KVH):
    """Under a data x tensor mesh the kernels are called inside shard_map on each device's rows and heads (GQA:
    query and KV heads split together; one KV head: heads replicated), so XLA never has to gather a Triton call's
    operands onto every device (traced only; the slow test below runs it)."""
    from mimesis_jax import sharding

    mesh = sharding.make_mesh({"data": 2, "tensor": 2}, jax.devices()[:4])
    rng = np.random.RandomState(5)
    spec = causal_spec(jnp.asarray(_segments(rng, 2, 32, lead_pad=3)))
    q, k, v = _qkv(rng, 2, 32, 32, 4, KVH)
    objective, attn = _mesh_objective(spec, q)
    heads = "'tensor'" if KVH == 2 else "None"
    with sharding.use_mesh(mesh):
        jaxpr = str(jax.make_jaxpr(objective(attn))(q, k, v))
    assert f"P('data', None, {heads}, None), P('data', None, {heads}, None)" in jaxpr
    assert jaxpr.count("shard_map") >= 2  # the forward and the backward kernels
    assert "shard_map" not in str(jax.make_jaxpr(objective(attn))(q, k, v))  # no mesh: called as is


@pytest.mark.slow
def test_kernels_under_a_mesh_equal_the_formula():
    """The per-device (shard_map) kernels under a data x tensor mesh: value and q/k/v gradients of a random linear
    objective of o equal the masked formula's."""
    from mimesis_jax import sharding

    mesh = sharding.make_mesh({"data": 2, "tensor": 2}, jax.devices()[:4])
    rng = np.random.RandomState(5)
    spec = causal_spec(jnp.asarray(_segments(rng, 2, 32, lead_pad=3)))
    q, k, v = _qkv(rng, 2, 32, 32, 4, 2)
    r = jnp.asarray(rng.randn(*q.shape), jnp.float32)
    objective, attn = _mesh_objective(spec, r)
    want, gwant = objective(lambda q, k, v: masked_attention(q, k, v, dense_mask(spec)))(q, k, v)
    with sharding.use_mesh(mesh):
        got, ggot = objective(attn)(q, k, v)
    np.testing.assert_allclose(float(got), float(want), atol=1e-4)  # a sum of ~2,000 O(1) terms
    for name, a, b in zip("qkv", ggot, gwant):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, err_msg=f"d{name}")
