"""The TPU path of attention_impl="pallas" (models/splash_attention.py): jax's Splash kernel in interpret mode on
CPU against the dense reference backend (values, log-sum-exps and gradients wrt q, k, v through o and lse) on
packed rows with padding, GQA / MQA and lengths that are not block multiples; the chooser (`splash_expressible`)
on every MaskSpec kind; the dispatch (Splash for expressible specs, blockwise otherwise, eager and under jit); the
CSD branch groups (own group through Splash, trunk group through blockwise, merged by their lse); a tiny Qwen3
under the TPU dispatch equal to dense; and the lowering of forward + backward for TPU from this CPU host."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_helpers import tiny_config
from mimesis_jax import models
from mimesis_jax.algorithms.logprobs import token_logprobs
from mimesis_jax.models import pallas_attention as pallas_mod
from mimesis_jax.models import splash_attention as splash_mod
from mimesis_jax.models.attention import attend_groups, dense_attention
from mimesis_jax.models.masks import branch_specs, cache_spec, causal_spec, make_spec
from mimesis_jax.models.splash_attention import splash_block_layout, splash_expressible, splash_or_blockwise


def _qkv(rng, B, Tq, Tk, H, KVH, Dh=16):
    return tuple(jnp.asarray(rng.randn(*s), jnp.float32) for s in ((B, Tq, H, Dh), (B, Tk, KVH, Dh), (B, Tk, KVH, Dh)))


def _packed(B, T, lengths, lead_pad=0):
    """Rows of consecutive segments 1, 2, ... of the given lengths after `lead_pad * b` padding tokens."""
    seg = np.zeros((B, T), np.int32)
    for b in range(B):
        t = lead_pad * b
        for s, n in enumerate(lengths, 1):
            seg[b, t:min(t + n, T)] = s
            t += n
    return jnp.asarray(seg)


def _objective(fn, spec, r_o, r_lse):
    """sum(o * r_o) + sum(lse * r_lse) over rows that see something: gradients through both outputs."""
    def f(q, k, v):
        o, lse = fn(q, k, v, spec)
        return jnp.sum(o * r_o) + jnp.sum(jnp.where(jnp.isfinite(lse), lse * r_lse, 0.0)), (o, lse)
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))


def _dense(scale):
    return lambda q, k, v, spec: dense_attention(q, k, v, spec, scale)


def _splash(scale, bq=128, bk=128):
    return lambda q, k, v, spec: splash_mod.splash_attention(q, k, v, spec, scale=scale, block_q=bq, block_k=bk,
                                                             interpret=True)


# ------------------------------------------------------------------------------------------ layout, chooser
def test_block_layout():
    assert splash_block_layout(200, 512, 512) == (256, 256, 256)  # blocks shrink to T rounded up to 128
    assert splash_block_layout(300, 128, 256) == (128, 256, 512)  # T' a multiple of both blocks
    assert splash_block_layout(40, 16, 16) == (128, 128, 128)  # at least Splash's lane width
    assert splash_block_layout(1000, 300, 512) == (256, 512, 1024)  # rounded down to multiples of 128
    with pytest.raises(ValueError, match="block sizes"):
        splash_block_layout(10, 0, 128)


def test_chooser_on_every_spec_kind():
    seg = _packed(2, 30, (12, 9), lead_pad=3)
    own = causal_spec(seg)
    trunk = jnp.asarray(np.repeat([[1] * 20 + [2] * 10], 2, 0))

    def branches(Tb):  # branch 1 inserted at trunk position 7, branch 2 at 15, then branch padding
        bid = jnp.asarray(np.repeat([[1] * 6 + [2] * 5 + [0] * (Tb - 11)], 2, 0))
        return branch_specs(trunk, jnp.where(bid > 0, 1, 0), jnp.where(bid == 1, 7, 15), bid)

    to_trunk, to_self = branches(22)
    square_trunk, _ = branches(30)  # Tb == T: decided from the values
    ones = jnp.ones((2, 8), jnp.int32)
    prefill = cache_spec(ones, jnp.broadcast_to(jnp.arange(8), (2, 8)), ones)  # slots 0..7 of an 8-slot cache
    decode = cache_spec(ones[:, :1], jnp.full((2, 1), 7), ones)
    restart = jnp.asarray(np.concatenate([np.arange(12), np.arange(18)])[None].repeat(2, 0))
    indices_restart = make_spec(seg, seg, restart, restart)  # token indices that are not array positions
    cross = make_spec(seg, jnp.where(seg == 2, 1, seg), *causal_spec(seg)[2:])  # q / k segments differ
    want = {"packed": (own, True), "branch_own_group": (to_self, True), "prefill_from_slot_0": (prefill, True),
            "branch_trunk_group": (to_trunk, False), "branch_trunk_group_square": (square_trunk, False),
            "decode": (decode, False), "indices_not_positions": (indices_restart, False), "cross": (cross, False)}
    jitted = jax.jit(splash_expressible)
    for name, (spec, ok) in want.items():
        assert bool(splash_expressible(spec)) is ok, name
        if spec.q_segment.shape == spec.k_segment.shape:
            assert bool(jitted(spec)) is ok, name  # traced: a boolean for lax.cond
        else:
            assert splash_expressible(spec) is False, name  # shapes alone: decided at trace time
    pos = jnp.broadcast_to(jnp.arange(30), (2, 30))
    pad_idx = make_spec(seg, seg, jnp.where(seg == 0, 99, pos), jnp.where(seg == 0, -5, pos))
    assert bool(splash_expressible(pad_idx))  # padding tokens' indices do not matter (they see nothing)


# ------------------------------------------------------------------------------------------ values and gradients
@pytest.mark.parametrize("H, KVH, T, lengths", [(4, 2, 200, (70, 1, 90, 25)), (2, 1, 256, (128, 120))])
def test_splash_equals_dense_values_and_gradients(H, KVH, T, lengths):
    """Packed rows with leading / trailing padding (a length-1 segment too), GQA and MQA, T not a block multiple
    (200 -> 256 with 128-blocks: 2 x 2 query x key blocks, the upper one skipped by the causal mask)."""
    rng = np.random.RandomState(5)
    spec = causal_spec(_packed(2, T, lengths, lead_pad=5))
    q, k, v = _qkv(rng, 2, T, T, H, KVH)
    r_o, r_lse = jnp.asarray(rng.randn(*q.shape), jnp.float32), jnp.asarray(rng.randn(2, T, H), jnp.float32)
    scale = 0.21
    (_, (od, ld)), gd = _objective(_dense(scale), spec, r_o, r_lse)(q, k, v)
    (_, (os_, ls)), gs = _objective(_splash(scale), spec, r_o, r_lse)(q, k, v)
    fin = np.isfinite(np.asarray(ld))
    np.testing.assert_array_equal(np.isfinite(np.asarray(ls)), fin)
    assert not fin.all() and fin.any()  # padding rows: lse = -inf, o = 0
    np.testing.assert_allclose(np.asarray(os_), np.asarray(od), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(os_)[~fin], 0.0)
    np.testing.assert_allclose(np.asarray(ls)[fin], np.asarray(ld)[fin], atol=1e-5)
    for name, a, b in zip("qkv", gs, gd):
        assert np.abs(np.asarray(b)).max() > 0.1
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, err_msg=f"d{name}")


def test_bf16_inputs():
    """bf16 q/k/v (q pre-scaled in bf16, fp32 statistics inside Splash): o in bf16, lse fp32, close to the fp32
    dense result on the same (bf16-rounded) inputs; gradients in bf16, close as well."""
    rng = np.random.RandomState(6)
    spec = causal_spec(_packed(1, 128, (50, 70)))
    lo = tuple(x.astype(jnp.bfloat16) for x in _qkv(rng, 1, 128, 128, 4, 2))
    hi = tuple(x.astype(jnp.float32) for x in lo)
    r_o, r_lse = jnp.asarray(rng.randn(1, 128, 4, 16), jnp.float32), jnp.asarray(rng.randn(1, 128, 4), jnp.float32)
    (_, (od, ld)), gd = _objective(_dense(0.25), spec, r_o, r_lse)(*hi)
    (_, (os_, ls)), gs = _objective(_splash(0.25), spec, r_o, r_lse)(*lo)
    assert os_.dtype == jnp.bfloat16 and ls.dtype == jnp.float32 and gs[0].dtype == jnp.bfloat16
    fin = np.isfinite(np.asarray(ld))
    np.testing.assert_allclose(np.asarray(os_, np.float32), np.asarray(od), atol=3e-2)
    np.testing.assert_allclose(np.asarray(ls)[fin], np.asarray(ld)[fin], atol=3e-2)
    for a, b in zip(gs, gd):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b), atol=5e-2 * np.abs(np.asarray(b)).max())


def test_dispatch_picks_splash_or_blockwise_and_is_exact_both_ways(monkeypatch):
    rng = np.random.RandomState(8)
    T = 40
    seg = _packed(1, T, (15, 20), lead_pad=0)
    expressible = causal_spec(seg)
    idx = jnp.asarray(rng.permutation(T)[None].astype(np.int32))
    scrambled = make_spec(seg, seg, idx, idx)  # same shapes, indices not positions: Splash would be wrong
    q, k, v = _qkv(rng, 1, T, T, 4, 2)
    calls = []
    real = splash_mod.splash_attention
    monkeypatch.setattr(splash_mod, "splash_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    kw = dict(scale=0.25, block_q=128, block_k=128, interpret=True)
    jitted = jax.jit(lambda q, k, v, spec: splash_or_blockwise(q, k, v, spec, **kw))
    for spec, used in ((expressible, 1), (scrambled, 0)):
        od, ld = dense_attention(q, k, v, spec, 0.25)
        calls.clear()
        o, lse = splash_or_blockwise(q, k, v, spec, **kw)  # concrete spec: chosen in Python
        assert len(calls) == used
        oj, lj = jitted(q, k, v, spec)  # traced spec: lax.cond on the predicate
        for a, b in ((o, od), (oj, od), (lse, ld), (lj, ld)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_csd_branch_groups_through_the_tpu_dispatch(monkeypatch):
    """Branch queries over [trunk ; own branch] keys via attend_groups(impl="pallas") with the TPU dispatch on:
    the own group goes through Splash, the trunk group through blockwise; merged by their lse they equal the
    dense backend (values and gradients wrt the branch queries and both groups' keys and values)."""
    monkeypatch.setattr(pallas_mod, "on_tpu", lambda: True)
    rng = np.random.RandomState(4)
    B, T, Tb = 2, 40, 26
    trunk = np.zeros((B, T), np.int32)
    trunk[:, :22], trunk[:, 22:35] = 1, 2
    bid = np.zeros((B, Tb), np.int32)
    bid[:, :9], bid[:, 9:15], bid[:, 15:23] = 1, 2, 3
    bts = np.select([bid == 3, bid > 0], [2, 1], 0).astype(np.int32)
    prefix = np.select([bid == 1, bid == 2, bid == 3], [6, 17, 30], 0).astype(np.int32)
    to_trunk, to_self = branch_specs(*(jnp.asarray(x) for x in (trunk, bts, prefix, bid)))
    assert bool(splash_expressible(to_self)) and splash_expressible(to_trunk) is False
    qb, kb, vb = _qkv(rng, B, Tb, Tb, 4, 2)
    _, kt, vt = _qkv(rng, B, T, T, 4, 2)
    r = jnp.asarray(rng.randn(*qb.shape), jnp.float32)

    def loss(impl):
        def f(qb, kt, vt, kb, vb):
            return jnp.sum(r * attend_groups(qb, [(kt, vt, to_trunk), (kb, vb, to_self)], impl=impl, block_q=128,
                                             block_k=128))
        return jax.jit(jax.value_and_grad(f, range(5)))

    got, want = loss("pallas")(qb, kt, vt, kb, vb), loss("dense")(qb, kt, vt, kb, vb)
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-5)
    for a, b in zip(got[1], want[1]):
        assert np.abs(np.asarray(b)).max() > 0.05
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


def _tiny_qwen3(monkeypatch):
    """A tiny Qwen3 (dense and pallas configs), a packed row with restarting positions, the TPU dispatch forced
    on, and the list that records each (traced or eager) Splash call."""
    monkeypatch.setattr(pallas_mod, "on_tpu", lambda: True)
    calls = []
    real = splash_mod.splash_attention
    monkeypatch.setattr(splash_mod, "splash_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    dense = tiny_config(initializer_range=0.2, vocab_size=67, head_dim=16)
    splash = dense.replace(attention_impl="pallas", attention_block_q=128, attention_block_k=256)
    rng = np.random.RandomState(7)
    seg = np.asarray(_packed(1, 37, (13, 9, 11)))  # three segments, 4 padding tokens
    pos = np.concatenate([np.arange(13), np.arange(9), np.arange(11), np.zeros(4, int)])[None].astype(np.int32)
    toks = np.where(seg > 0, rng.randint(1, 67, seg.shape), 0).astype(np.int32)
    return dense, splash, models.init_params(dense, jax.random.key(0)), (toks, pos, seg), calls


def test_tiny_qwen3_forward_under_the_tpu_dispatch_equals_dense(monkeypatch):
    """models.forward of a tiny Qwen3 with attention_impl="pallas" and the TPU dispatch forced on (Splash in
    interpret mode for the packed training row) equals the dense backend."""
    dense, splash, params, (toks, pos, seg), calls = _tiny_qwen3(monkeypatch)
    a = np.asarray(models.forward(dense, params, toks, pos, seg))
    b = np.asarray(models.forward(splash, params, toks, pos, seg))
    assert calls and np.abs(a).max() > 0.5
    np.testing.assert_allclose(b, a, atol=2e-5)


@pytest.mark.slow
def test_tiny_qwen3_logprob_gradients_under_the_tpu_dispatch_equal_dense(monkeypatch):
    dense, splash, params, (toks, pos, seg), calls = _tiny_qwen3(monkeypatch)

    def lp_grad(cfg):
        return jax.jit(jax.grad(lambda p: jnp.sum(token_logprobs(cfg, p, toks, pos, seg) * (seg[:, 1:] != 0))))(params)

    grads = lp_grad(dense), lp_grad(splash)
    assert calls
    for ga, gb in zip(*(jax.tree.leaves(g) for g in grads)):
        np.testing.assert_allclose(np.asarray(gb), np.asarray(ga), atol=2e-5 * max(1.0, np.abs(ga).max()))


def test_lowers_for_tpu_forward_and_backward():
    """From this CPU host: the jitted value-and-grad of the TPU path (bf16, head_dim 128) exports for TPU with
    Splash's forward (with residuals) and fused dq/dk/dv kernels as Mosaic custom calls."""
    from jax import export

    def f(q, k, v, seg):
        def loss(q, k, v):
            o, lse = splash_or_blockwise(q, k, v, causal_spec(seg), scale=128 ** -0.5, block_q=512, block_k=512)
            return jnp.sum(o.astype(jnp.float32)) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))
        return jax.value_and_grad(loss, (0, 1, 2))(q, k, v)

    args = [jax.ShapeDtypeStruct((2, 384, h, 128), jnp.bfloat16) for h in (8, 2, 2)]
    text = export.export(jax.jit(f), platforms=["tpu"])(*args, jax.ShapeDtypeStruct((2, 384), jnp.int32)).mlir_module()
    names = set(re.findall(r"splash_mha_\w+", text))
    assert {"splash_mha_fwd_segmented_residuals", "splash_mha_dkv_segmented_no_residuals"} <= names, names


@pytest.mark.parametrize("KVH", [2, 1])
def test_splash_runs_per_device_under_a_mesh(KVH):
    """Under a data x tensor mesh the kernel runs inside shard_map on each device's rows and heads (GQA: query
    and KV heads split together; one KV head: heads replicated); values and gradients equal the dense backend."""
    from mimesis_jax import sharding

    mesh = sharding.make_mesh({"data": 2, "tensor": 2}, jax.devices()[:4])
    rng = np.random.RandomState(9)
    spec = causal_spec(_packed(2, 100, (40, 50), lead_pad=4))
    q, k, v = _qkv(rng, 2, 100, 100, 4, KVH)
    r_o, r_lse = jnp.asarray(rng.randn(*q.shape), jnp.float32), jnp.asarray(rng.randn(2, 100, 4), jnp.float32)
    (_, (od, ld)), gd = _objective(_dense(0.3), spec, r_o, r_lse)(q, k, v)
    with sharding.use_mesh(mesh):
        f = _objective(_splash(0.3), spec, r_o, r_lse)
        jaxpr = str(jax.make_jaxpr(f)(q, k, v))
        heads = "'tensor'" if KVH == 2 else "None"
        assert f"P('data', {heads}, None, None), P('data', {heads}, None, None)" in jaxpr
        (_, (os_, ls)), gs = jax.block_until_ready(f(q, k, v))
    fin = np.isfinite(np.asarray(ld))
    np.testing.assert_allclose(np.asarray(os_), np.asarray(od), atol=1e-5)
    np.testing.assert_allclose(np.asarray(ls)[fin], np.asarray(ld)[fin], atol=1e-5)
    for name, a, b in zip("qkv", gs, gd):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, err_msg=f"d{name}")
