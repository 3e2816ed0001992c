"""Attention backends and masks: the spec builders against the mask rules written out per entry, the dense backend
against NumPy, blockwise == dense (values, log-sum-exps and gradients) on packed / cache / branch / arbitrary /
fully-masked specs with GQA and lengths that are not block multiples, the compiled memory of the two backends, and
whole models (Qwen3, Qwen3.5, CSD branches) under both backends."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_helpers import check_bf16_long_attention, random_batch, tiny_config
from mimesis_jax import models
from mimesis_jax.algorithms.logprobs import token_logprobs
from mimesis_jax.algorithms.rl_batch import pack_trajectories
from mimesis_jax.errors import ConfigError
from mimesis_jax.models import ModelConfig
from mimesis_jax.models.attention import attend, attend_groups, merge_partials
from mimesis_jax.models.blockwise_attention import block_ranges, block_layout
from mimesis_jax.models.masks import (MaskSpec, branch_mask, branch_specs, cache_mask, cache_spec, causal_spec,
                                      dense_mask, make_spec, segment_causal_mask)


# ------------------------------------------------------------------------------------------ references
def np_attention(q, k, v, mask, scale=None):
    """From the formula, in float64: per row, softmax over the visible keys (K/V heads repeated as HF's
    repeat_kv); a row that sees nothing gives o = 0 and lse = -inf."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, Tq, H, Dh = q.shape
    G = H // k.shape[2]
    k, v = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)
    scale = Dh ** -0.5 if scale is None else scale
    o, lse = np.zeros(q.shape), np.full((B, Tq, H), -np.inf)
    for b in range(B):
        for i in range(Tq):
            vis = np.asarray(mask[b, i])
            if not vis.any():
                continue
            for h in range(H):
                s = scale * k[b, vis, h] @ q[b, i, h]
                lse[b, i, h] = np.log(np.exp(s - s.max()).sum()) + s.max()
                o[b, i, h] = np.exp(s - lse[b, i, h]) @ v[b, vis, h]
    return o, lse


def masked_attention(q, k, v, mask):
    """The plain JAX formula with an explicit mask [B, Tq, Tk] (gradient reference for key-group merges)."""
    G = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    s = jnp.where(mask[:, None], s, -jnp.inf)
    m = jnp.where(mask[:, None].any(-1, keepdims=True), s.max(-1, keepdims=True), 0.0)
    e = jnp.where(mask[:, None], jnp.exp(s - m), 0.0)
    p = e / jnp.maximum(e.sum(-1, keepdims=True), 1e-30)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def _packed_segments(rng, B, T, lead_pad=0):
    """Rows of consecutive segments 1, 2, ... of random lengths, trailing padding (0), optional leading padding."""
    seg = np.zeros((B, T), np.int32)
    for b in range(B):
        t, s = lead_pad * b, 1
        while t < T - 3:
            n = rng.randint(1, max(2, T // 3))
            seg[b, t:min(T - 2, t + n)] = s
            t, s = t + n, s + 1
    return seg


def _qkv(rng, B, Tq, Tk, H, KVH, Dh=8, dtype=jnp.float32):
    return tuple(jnp.asarray(rng.randn(*s), dtype) for s in ((B, Tq, H, Dh), (B, Tk, KVH, Dh), (B, Tk, KVH, Dh)))


def _cache_case(rng, B, S, index, Tq, left_pad):
    kseg = np.zeros((B, S), np.int32)
    for b, lp in enumerate(left_pad):
        kseg[b, lp:index + Tq] = 1
    qseg = kseg[:, index:index + Tq]
    slots = np.broadcast_to(index + np.arange(Tq, dtype=np.int32), (B, Tq))
    return cache_spec(jnp.asarray(qseg), jnp.asarray(slots), jnp.asarray(kseg))


def _branch_case(rng):
    """Two trajectories packed in each trunk row, three teacher branches per row (and branch padding)."""
    B, T, Tb = 2, 30, 21
    trunk = np.zeros((B, T), np.int32)
    trunk[:, :17], trunk[:, 17:27] = 1, 2
    bid = np.zeros((B, Tb), np.int32)
    bid[:, :7], bid[:, 7:12], bid[:, 12:18] = 1, 2, 3
    bts = np.where(bid == 3, 2, np.where(bid > 0, 1, 0)).astype(np.int32)
    prefix = np.select([bid == 1, bid == 2, bid == 3], [5, 12, 23], 0).astype(np.int32)
    return tuple(jnp.asarray(x) for x in (trunk, bts, prefix, bid))


def _spec_cases():
    rng = np.random.RandomState(0)
    seg = jnp.asarray(_packed_segments(rng, 2, 45, lead_pad=3))
    long = jnp.asarray(_packed_segments(rng, 1, 100))
    arb = make_spec(rng.randint(0, 4, (2, 33)), rng.randint(0, 4, (2, 29)), rng.randint(0, 20, (2, 33)),
                    rng.randint(0, 20, (2, 29)))
    dead = np.asarray(_packed_segments(rng, 2, 24))
    dead[0] = 0  # a whole row of padding: every query of it sees nothing
    return {  # name -> (spec, H, KVH, block_q, block_k)
        "packed_gqa2": (causal_spec(seg), 4, 2, 16, 8),
        "packed_kv1_long": (causal_spec(long), 4, 1, 24, 40),
        "packed_mha_one_block": (causal_spec(seg), 2, 2, 512, 512),
        "cache_prefill": (_cache_case(rng, 2, 40, 12, 9, (0, 3)), 4, 2, 4, 16),
        "cache_decode": (_cache_case(rng, 2, 40, 25, 1, (2, 0)), 4, 1, 8, 8),
        "arbitrary": (arb, 6, 3, 8, 8),
        "fully_masked_rows": (causal_spec(jnp.asarray(dead)), 4, 2, 8, 8),
    }


SPEC_CASES = _spec_cases()


# ------------------------------------------------------------------------------------------ masks
def test_spec_builders_follow_the_mask_rules():
    rng = np.random.RandomState(1)
    seg = _packed_segments(rng, 2, 20, lead_pad=2)
    m = np.asarray(segment_causal_mask(jnp.asarray(seg)))
    for b, i, j in np.ndindex(2, 20, 20):
        assert m[b, i, j] == (seg[b, i] != 0 and seg[b, i] == seg[b, j] and j <= i)
    spec = _cache_case(rng, 2, 12, 5, 3, (0, 2))
    kseg, slots = np.asarray(spec.k_segment), np.asarray(spec.q_index)
    m = np.asarray(cache_mask(spec.q_segment, spec.q_index, spec.k_segment))
    for b, i, j in np.ndindex(2, 3, 12):
        assert m[b, i, j] == (kseg[b, j] != 0 and kseg[b, j] == kseg[b, 5 + i] and j <= slots[b, i])
    assert m.any(-1).all() and not m[:, :, 8:].any()  # empty slots after the queries are never seen
    trunk, bts, prefix, bid = (np.asarray(x) for x in _branch_case(rng))
    m = np.asarray(branch_mask(*(jnp.asarray(x) for x in (trunk, bts, prefix, bid))))
    T = trunk.shape[1]
    for b, i, j in np.ndindex(*m.shape):
        if j < T:  # trunk keys before the insertion point, in the branch's trajectory
            want = bid[b, i] != 0 and trunk[b, j] == bts[b, i] and j < prefix[b, i]
        else:  # its own branch, causally
            want = bid[b, i] != 0 and bid[b, j - T] == bid[b, i] and j - T <= i
        assert m[b, i, j] == want
    assert not m[bid == 0].any()
    with pytest.raises(ValueError, match="MaskSpec"):
        make_spec(np.zeros((2, 3)), np.zeros((2, 4)), np.zeros((2, 4)), np.zeros((2, 4)))


def test_block_layout_and_ranges():
    assert block_layout(56, 512) == (56, 1)
    assert block_layout(600, 512) == (304, 2)  # two equal blocks, not 512 + 88
    assert block_layout(100, 24) == (24, 5)
    for T in range(1, 300, 7):
        for blk in (1, 8, 20, 64):
            b, n = block_layout(T, blk)
            assert b <= max(blk, 1) and n * b >= T and (n - 1) * b < T
    # a causal row of 8 blocks x 8 blocks: query block i needs key blocks 0..i, key block j query blocks j..7
    idx = jnp.arange(64, dtype=jnp.int32).reshape(8, 1, 8)
    seg = jnp.ones_like(idx)
    (lo, hi), (lo_t, hi_t) = block_ranges(seg, idx, seg, idx)
    assert lo.tolist() == [0] * 8 and hi.tolist() == list(range(1, 9))
    assert lo_t.tolist() == list(range(8)) and hi_t.tolist() == [8] * 8
    seg2 = jnp.asarray(np.repeat([1, 2], 32).reshape(8, 1, 8))  # two packed segments: the second skips the first
    (lo, hi), _ = block_ranges(seg2, idx, seg2, idx)
    assert lo.tolist() == [0] * 4 + [4] * 4 and hi.tolist() == list(range(1, 9))


# ------------------------------------------------------------------------------------------ backends
@pytest.mark.parametrize("case", list(SPEC_CASES))
def test_dense_backend_matches_numpy(case):
    spec, H, KVH, _, _ = SPEC_CASES[case]
    B, Tq = spec.q_segment.shape
    q, k, v = _qkv(np.random.RandomState(2), B, Tq, spec.k_segment.shape[1], H, KVH)
    o, lse = attend(q, k, v, spec, impl="dense", return_lse=True)
    ro, rlse = np_attention(q, k, v, np.asarray(dense_mask(spec)))
    np.testing.assert_allclose(np.asarray(o), ro, atol=2e-6)
    np.testing.assert_array_equal(np.isinf(np.asarray(lse)), np.isinf(rlse))
    np.testing.assert_allclose(np.asarray(lse)[np.isfinite(rlse)], rlse[np.isfinite(rlse)], atol=2e-6)


def _objective(impl, spec, r_o, r_lse, **kw):
    """sum(o * r_o) + sum(lse * r_lse) over rows that see something: exercises both outputs' gradients."""
    def f(q, k, v):
        o, lse = attend(q, k, v, spec, impl=impl, return_lse=True, **kw)
        return jnp.sum(o * r_o) + jnp.sum(jnp.where(jnp.isfinite(lse), lse * r_lse, 0.0)), (o, lse)
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))


@pytest.mark.parametrize("case", list(SPEC_CASES))
def test_blockwise_equals_dense_values_and_gradients(case):
    spec, H, KVH, bq, bk = SPEC_CASES[case]
    B, Tq = spec.q_segment.shape
    rng = np.random.RandomState(3)
    q, k, v = _qkv(rng, B, Tq, spec.k_segment.shape[1], H, KVH)
    r_o, r_lse = jnp.asarray(rng.randn(*q.shape), jnp.float32), jnp.asarray(rng.randn(B, Tq, H), jnp.float32)
    (_, (od, ld)), gd = _objective("dense", spec, r_o, r_lse)(q, k, v)
    (_, (ob, lb)), gb = _objective("blockwise", spec, r_o, r_lse, block_q=bq, block_k=bk)(q, k, v)
    np.testing.assert_allclose(np.asarray(ob), np.asarray(od), atol=1e-5)
    np.testing.assert_array_equal(np.isinf(np.asarray(lb)), np.isinf(np.asarray(ld)))
    fin = np.isfinite(np.asarray(ld))
    np.testing.assert_allclose(np.asarray(lb)[fin], np.asarray(ld)[fin], atol=1e-5)
    for name, a, b in zip("qkv", gb, gd):
        assert np.isfinite(np.asarray(a)).all(), name
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, err_msg=f"d{name}")
    dead = ~np.asarray(dense_mask(spec)).any(-1)  # queries that see nothing: output 0, gradient 0
    np.testing.assert_array_equal(np.asarray(ob)[dead], 0.0)
    np.testing.assert_array_equal(np.asarray(gb[0])[dead], 0.0)
    if case == "fully_masked_rows":
        assert dead[0].all() and not dead[1].all()


@pytest.mark.parametrize("impl", ["dense", "blockwise"])
def test_branch_groups_merge_exactly(impl):
    """Branch queries over [trunk ; own branch] keys: two attended groups merged by their log-sum-exps equal one
    softmax over the concatenated keys with the concatenated mask (values and gradients)."""
    rng = np.random.RandomState(4)
    trunk, bts, prefix, bid = _branch_case(rng)
    B, T, Tb = 2, trunk.shape[1], bid.shape[1]
    qb, kb, vb = _qkv(rng, B, Tb, Tb, 4, 2)
    _, kt, vt = _qkv(rng, B, T, T, 4, 2)
    to_trunk, to_self = branch_specs(trunk, bts, prefix, bid)
    mask = branch_mask(trunk, bts, prefix, bid)
    r = jnp.asarray(rng.randn(*qb.shape), jnp.float32)

    def merged(qb, kt, vt, kb, vb):
        return jnp.sum(r * attend_groups(qb, [(kt, vt, to_trunk), (kb, vb, to_self)], impl=impl, block_q=8,
                                         block_k=8))

    def reference(qb, kt, vt, kb, vb):
        kk, vv = jnp.concatenate([kt, kb], 1), jnp.concatenate([vt, vb], 1)
        return jnp.sum(r * masked_attention(qb, kk, vv, mask))

    args = (qb, kt, vt, kb, vb)
    got, want = (jax.jit(jax.value_and_grad(f, range(5)))(*args) for f in (merged, reference))
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-5)
    for a, b in zip(got[1], want[1]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    # every branch token sees its own first token; pads see nothing; the first branch sees 5 trunk keys
    assert np.asarray(dense_mask(to_trunk)).sum(-1)[0, 0] == 5


def test_merge_partials_of_a_key_split_is_the_whole_softmax():
    rng = np.random.RandomState(5)
    seg = jnp.asarray(_packed_segments(rng, 2, 20))
    spec = causal_spec(seg)
    q, k, v = _qkv(rng, 2, 20, 20, 4, 2)
    o, lse = attend(q, k, v, spec, return_lse=True)
    cut = 7  # keys [0, 7) and [7, 20): early queries see nothing of the second group
    a = MaskSpec(spec.q_segment, spec.k_segment[:, :cut], spec.q_index, spec.k_index[:, :cut])
    b = MaskSpec(spec.q_segment, spec.k_segment[:, cut:], spec.q_index, spec.k_index[:, cut:])
    o1, l1 = jax.jit(lambda q, k, v: attend(q, k, v, a, return_lse=True))(q, k[:, :cut], v[:, :cut])
    o2, l2 = jax.jit(lambda q, k, v: attend(q, k, v, b, return_lse=True, impl="blockwise", block_q=8, block_k=4))(
        q, k[:, cut:], v[:, cut:])
    assert np.isinf(np.asarray(l2)).any() and np.isinf(np.asarray(lse)).any()
    om, lm = merge_partials(o1, l1, o2, l2)
    np.testing.assert_allclose(np.asarray(om), np.asarray(o), atol=1e-6)
    fin = np.isfinite(np.asarray(lse))
    np.testing.assert_array_equal(np.isfinite(np.asarray(lm)), fin)
    np.testing.assert_allclose(np.asarray(lm)[fin], np.asarray(lse)[fin], atol=1e-6)
    g = jax.jit(jax.grad(lambda o2: jnp.sum(merge_partials(o1, l1, o2, l2)[0])))(o2)
    assert np.isfinite(np.asarray(g)).all()


def test_bf16_long_sequence_matches_fp32_reference_and_carries_are_fp32():
    """bf16 q/k/v at T = 1024 (64 key blocks of 16 per late query): the output's mean error against a float64
    NumPy reference on the same bf16-rounded inputs stays at the fp32-accumulation level (measured 1.5e-4: the
    bf16 rounding of p and of the output), well under what a bf16 output accumulator gives (3.8e-4 measured);
    lse within 1e-5 (6e-7 measured; a bf16 running sum is off by ~1e-3). Every float loop carry of the forward and
    backward programs (m, l, acc; dq, dk, dv) is float32 in the jaxpr."""
    check_bf16_long_attention("blockwise")


def test_bf16_inputs_accumulate_in_fp32():
    spec, H, KVH, bq, bk = SPEC_CASES["packed_gqa2"]
    q, k, v = _qkv(np.random.RandomState(6), 2, 45, 45, H, KVH)
    ref = attend(q, k, v, spec, impl="dense")
    lo = tuple(x.astype(jnp.bfloat16) for x in (q, k, v))
    def loss(q, k, v):
        o, lse = attend(q, k, v, spec, impl="blockwise", return_lse=True, block_q=bq, block_k=bk)
        return jnp.sum(o.astype(jnp.float32) ** 2), (o, lse)

    (_, (o, lse)), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(*lo)
    assert o.dtype == jnp.bfloat16 and lse.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(o, np.float32), np.asarray(ref), atol=5e-2)
    assert all(g.dtype == jnp.bfloat16 and np.isfinite(np.asarray(g, np.float32)).all() for g in grads)


def test_blockwise_compiled_memory_is_far_below_dense():
    """fwd + bwd at T = 2048: the dense path holds [B, H, T, T] fp32 scores; the blockwise one a few blocks."""
    B, T, H, KVH, Dh = 1, 2048, 4, 2, 16
    shapes = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((B, T, H, Dh), (B, T, KVH, Dh), (B, T, KVH, Dh))]
    seg = jax.ShapeDtypeStruct((B, T), jnp.int32)

    def temp_bytes(impl):
        def loss(q, k, v, seg):
            return jnp.sum(attend(q, k, v, causal_spec(seg), impl=impl, block_q=256, block_k=256) ** 2)
        fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
        return fn.lower(*shapes, seg).compile().memory_analysis().temp_size_in_bytes

    dense, blockwise = temp_bytes("dense"), temp_bytes("blockwise")
    print(f"compiled temp bytes at T={T}: dense {dense / 2**20:.1f} MiB, blockwise {blockwise / 2**20:.2f} MiB")
    assert dense >= B * H * T * T * 4  # at least one fp32 score tensor
    assert blockwise * 10 < dense, (blockwise, dense)


# ------------------------------------------------------------------------------------------ models
def _packed_row(rng, vocab, lengths, T):
    toks, pos, seg = np.zeros((1, T), np.int32), np.zeros((1, T), np.int32), np.zeros((1, T), np.int32)
    t = 0
    for s, n in enumerate(lengths, 1):
        toks[0, t:t + n], pos[0, t:t + n], seg[0, t:t + n] = rng.randint(1, vocab, n), np.arange(n), s
        t += n
    return toks, pos, seg


QWEN3_5 = ModelConfig(model_type="qwen3_5_text", vocab_size=67, hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                      partial_rotary_factor=0.25, attn_output_gate=True, full_attention_interval=2,
                      linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
                      linear_num_value_heads=4, initializer_range=0.2)
MODELS = {"qwen3": tiny_config(initializer_range=0.2, vocab_size=67), "qwen3_5": QWEN3_5}
BLOCKWISE = dict(attention_impl="blockwise", attention_block_q=8, attention_block_k=16)
PALLAS = dict(attention_impl="pallas", attention_block_q=16, attention_block_k=16)  # interpret mode on CPU
BACKENDS = {"blockwise": BLOCKWISE, "pallas": PALLAS}


@pytest.mark.parametrize("name, backend", [("qwen3", "blockwise"), ("qwen3_5", "blockwise"), ("qwen3", "pallas")])
def test_model_forward_logprob_grads_and_decoding_equal_across_backends(name, backend):
    dense = MODELS[name]
    block = dense.replace(**BACKENDS[backend])
    params = models.init_params(dense, jax.random.key(0))
    rng = np.random.RandomState(7)
    toks, pos, seg = _packed_row(rng, dense.vocab_size, (13, 9, 11), 37)  # two restarts, 4 padding tokens
    a = np.asarray(models.forward(dense, params, toks, pos, seg))
    b = np.asarray(models.forward(block, params, toks, pos, seg))
    assert np.abs(a).max() > 0.5
    np.testing.assert_allclose(b, a, atol=2e-5)

    def lp_grad(cfg):
        return jax.jit(jax.grad(lambda p: jnp.sum(token_logprobs(cfg, p, toks, pos, seg) * (seg[:, 1:] != 0))))(params)

    # (the blockwise gradient under full remat: its backward recomputes the flash forward, then runs its VJP)
    for ga, gb in zip(jax.tree.leaves(lp_grad(dense)), jax.tree.leaves(lp_grad(block.replace(remat="full")))):
        np.testing.assert_allclose(np.asarray(gb), np.asarray(ga), atol=2e-5 * max(1.0, np.abs(ga).max()))

    # prefill of a left-padded prompt, then single-token decoding, equals the dense full forward
    ids = rng.randint(1, dense.vocab_size, (2, 12)).astype(np.int32)
    full = np.asarray(models.forward(dense, params, ids))
    extend = jax.jit(models.extend, static_argnums=0)
    cache = models.init_cache(block, 2, 16)
    pad = np.zeros((2, 3), np.int32)
    pos_p = np.concatenate([pad, np.broadcast_to(np.arange(8, dtype=np.int32), (2, 8))], 1)
    seg_p = np.concatenate([pad, np.ones((2, 8), np.int32)], 1)
    h, cache = extend(block, params, cache, jnp.asarray(np.concatenate([pad, ids[:, :8]], 1)),
                             jnp.asarray(pos_p), jnp.asarray(seg_p))
    out = [models.logits_from_hidden(block, params, h[:, 3:])]
    for t in range(8, 12):
        h, cache = extend(block, params, cache, jnp.asarray(ids[:, t:t + 1]), jnp.full((2, 1), t, jnp.int32))
        out.append(models.logits_from_hidden(block, params, h))
    np.testing.assert_allclose(np.concatenate([np.asarray(x) for x in out], 1), full, atol=2e-5)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_csd_branches_equal_across_backends(backend):
    """Fused trunk + teacher branches (hidden states of both) under dense and blockwise / pallas attention."""
    cfg = MODELS["qwen3"]
    params = models.init_params(cfg, jax.random.key(1))
    packed = pack_trajectories(random_batch(3, cfg.vocab_size, (3, 5, 2)), row_len=96, pad_multiple=16)
    a = {k: jnp.asarray(v) for k, v in packed.arrays.items()}
    assert packed.teacher == "fused" and packed.num_coached_tokens > 0
    branch = {"tokens": a["branch_tokens"], "positions": a["branch_positions"], "branch_ids": a["branch_ids"],
              "trunk_segment": a["branch_trunk_segment"], "prefix_len": a["branch_prefix_len"]}
    outs = [models.hidden_states(c, params, a["tokens"], a["positions"], a["segment_ids"], branch)
            for c in (cfg, cfg.replace(**BACKENDS[backend]))]
    for x, y in zip(*outs):
        assert np.abs(np.asarray(x)).max() > 0.1
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=2e-5)


def test_config_validates_attention_fields():
    cfg = tiny_config()
    assert cfg.attention_impl == "dense"
    with pytest.raises(ConfigError, match="'attention_impl'"):
        cfg.replace(attention_impl="flash")
    for key in ("attention_block_q", "attention_block_k"):
        for bad in (0, -8, 2.5, True):
            with pytest.raises(ConfigError, match=f"'{key}'"):
                cfg.replace(**{key: bad})
    hf = cfg.replace(**BLOCKWISE).to_hf_dict()
    assert not any(k.startswith("attention_") and k != "attention_bias" and k != "attention_dropout" for k in hf)
    assert ModelConfig.from_hf_dict(hf, attention_impl="blockwise").attention_impl == "blockwise"
