"""The chunked and recurrent gated delta rules against a NumPy reference written from the formula."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mimesis_jax.models import gated_delta
from mimesis_jax.models.gated_delta import l2_normalize, unit_lower_inverse

# jitted: one compile per shape instead of op-by-op dispatch (tests run on a busy 2-core CPU)
chunk_gated_delta_rule = jax.jit(gated_delta.chunk_gated_delta_rule, static_argnames="chunk_size")
recurrent_gated_delta_rule = jax.jit(gated_delta.recurrent_gated_delta_rule)


def numpy_gated_delta(q, k, v, g, beta, S0=None, reset=None):
    """S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T, o_t = S_t^T q_t, with S := 0 before a reset."""
    q, k, v, g, beta = (np.asarray(a, np.float64) for a in (q, k, v, g, beta))
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    S = np.zeros((B, H, Dk, Dv)) if S0 is None else np.array(S0, np.float64)
    o = np.zeros((B, T, H, Dv))
    eye = np.eye(Dk)
    for b in range(B):
        for t in range(T):
            if reset is not None and reset[b, t]:
                S[b] = 0.0
            for h in range(H):
                kk = k[b, t, h]
                S[b, h] = np.exp(g[b, t, h]) * (eye - beta[b, t, h] * np.outer(kk, kk)) @ S[b, h] \
                    + beta[b, t, h] * np.outer(kk, v[b, t, h])
                o[b, t, h] = S[b, h].T @ q[b, t, h]
    return o, S


def _inputs(seed, B=2, T=37, H=3, Dk=8, Dv=6, slow_decay=False):
    rs = np.random.RandomState(seed)
    q = np.asarray(l2_normalize(rs.randn(B, T, H, Dk))) * Dk ** -0.5
    k = np.asarray(l2_normalize(rs.randn(B, T, H, Dk)))
    v = rs.randn(B, T, H, Dv)
    lo = -0.05 if slow_decay else -1.5
    g = rs.uniform(lo, 0.0, (B, T, H))
    beta = rs.uniform(0.05, 1.0, (B, T, H))
    S0 = rs.randn(B, H, Dk, Dv) * 0.5
    f = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    return tuple(map(f, (q, k, v, g, beta, S0)))


@pytest.mark.parametrize("n", [1, 5, 16, 64])
def test_unit_lower_inverse_and_its_gradient(n):
    rs = np.random.RandomState(n)
    A = np.tril(rs.randn(3, n, n) * 0.4, -1)
    ref = np.linalg.inv(np.eye(n) + A)
    np.testing.assert_allclose(np.asarray(unit_lower_inverse(jnp.asarray(A, jnp.float32))), ref, atol=2e-5, rtol=1e-5)
    ones = np.tril(np.ones((n, n)), -1)  # identical keys, beta = 1, no decay: huge powers, bidiagonal inverse
    np.testing.assert_allclose(np.asarray(unit_lower_inverse(jnp.asarray(ones, jnp.float32))),
                               np.linalg.inv(np.eye(n) + ones), atol=1e-6)
    G = rs.randn(3, n, n)
    strict = np.tril(np.ones((n, n)), -1)
    ours = jax.jit(jax.grad(lambda a: jnp.sum(unit_lower_inverse(a * strict) * G)))(jnp.asarray(A, jnp.float32))
    Tt = np.swapaxes(ref, -1, -2)
    want = -(Tt @ G @ Tt) * strict  # d<G, (I + A)^-1> / dA in float64
    np.testing.assert_allclose(np.asarray(ours), want, atol=1e-5 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("chunk", [4, 16, 64])
def test_chunked_and_recurrent_match_numpy(chunk):
    q, k, v, g, beta, S0 = _inputs(0, slow_decay=True)
    ref_o, ref_S = numpy_gated_delta(q, k, v, g, beta, S0)
    o_c, S_c = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=chunk, initial_state=S0)
    o_r, S_r = recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S0)
    assert np.abs(ref_o).max() > 0.1 and np.abs(ref_S).max() > 0.1
    for o, S in ((o_c, S_c), (o_r, S_r)):
        np.testing.assert_allclose(np.asarray(o), ref_o, atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(np.asarray(S), ref_S, atol=2e-5, rtol=1e-4)


def test_resets_inside_and_at_chunk_boundaries():
    """A reset zeroes the state before its token: at chunk starts, inside chunks, at t = 0 and back to back."""
    q, k, v, g, beta, S0 = _inputs(1, T=40, slow_decay=True)
    reset = np.zeros((2, 40), bool)
    reset[0, [0, 8, 13, 14, 31]] = True  # chunk 8: 0 and 8 start chunks; 13, 14 adjacent; 31 inside
    reset[1, [5, 16, 39]] = True  # 16 starts a chunk; 39 is the last token
    ref_o, ref_S = numpy_gated_delta(q, k, v, g, beta, S0, reset)
    for chunk in (8, 16):
        o, S = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=chunk, initial_state=S0, reset=jnp.asarray(reset))
        np.testing.assert_allclose(np.asarray(o), ref_o, atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(np.asarray(S), ref_S, atol=2e-5, rtol=1e-4)
    o, S = recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S0, reset=jnp.asarray(reset))
    np.testing.assert_allclose(np.asarray(o), ref_o, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(S), ref_S, atol=2e-5, rtol=1e-4)


def test_identity_tokens_leave_state_untouched():
    """beta = 0 and g = 0 (how the model encodes padding) pass the state through unchanged."""
    q, k, v, g, beta, S0 = _inputs(2, T=12)
    g = g.at[:, 3:7].set(0.0)
    beta = beta.at[:, 3:7].set(0.0)
    keep = np.r_[0:3, 7:12]
    o_full, S_full = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=4, initial_state=S0)
    sel = lambda a: a[:, keep]  # noqa: E731
    o_drop, S_drop = chunk_gated_delta_rule(sel(q), sel(k), sel(v), sel(g), sel(beta), chunk_size=4,
                                            initial_state=S0)
    np.testing.assert_allclose(np.asarray(S_full), np.asarray(S_drop), atol=1e-5)
    np.testing.assert_allclose(np.asarray(o_full)[:, keep], np.asarray(o_drop), atol=1e-5)


def test_strong_decay_is_finite_with_gradients():
    """Very negative cumulative decays (A ~ 16, 64-token chunks) must not overflow, nor NaN the gradient."""
    q, k, v, g, beta, S0 = _inputs(3, T=70, H=2)
    g = g * 40.0  # cumulative log decays down to about -4000 inside a chunk
    reset = jnp.zeros((2, 70), bool).at[:, 33].set(True)

    def loss(fn, q, k, v, g, beta):
        o, S = fn(q, k, v, g, beta, initial_state=S0, reset=reset)
        return jnp.sum(o ** 2) + jnp.sum(S ** 2)

    chunk = lambda *a, **kw: chunk_gated_delta_rule(*a, chunk_size=64, **kw)  # noqa: E731
    gc = jax.jit(jax.grad(lambda *a: loss(chunk, *a), argnums=(0, 1, 2, 3, 4)))(q, k, v, g, beta)
    gr = jax.jit(jax.grad(lambda *a: loss(recurrent_gated_delta_rule, *a), argnums=(0, 1, 2, 3, 4)))(q, k, v, g, beta)
    for a, b in zip(gc, gr):
        assert np.isfinite(np.asarray(a)).all()
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-4)


def test_gradients_chunked_equal_recurrent():
    q, k, v, g, beta, S0 = _inputs(4, T=29, slow_decay=True)
    reset = jnp.zeros((2, 29), bool).at[0, 11].set(True).at[1, 16].set(True)
    w = jax.random.normal(jax.random.PRNGKey(0), (2, 29, 3, 6))

    def loss(fn, *args):
        o, S = fn(*args[:5], initial_state=args[5], reset=reset)
        return jnp.sum(o * w) + jnp.sum(jnp.sin(S))

    chunk = lambda *a, **kw: chunk_gated_delta_rule(*a, chunk_size=8, **kw)  # noqa: E731
    args = (q, k, v, g, beta, S0)
    gc = jax.jit(jax.grad(lambda *a: loss(chunk, *a), argnums=tuple(range(6))))(*args)
    gr = jax.jit(jax.grad(lambda *a: loss(recurrent_gated_delta_rule, *a), argnums=tuple(range(6))))(*args)
    for a, b in zip(gc, gr):
        assert np.abs(np.asarray(b)).max() > 1e-3
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=5e-5, rtol=1e-4)


def test_matches_transformers_torch_reference():
    """Same numbers as transformers' own torch_chunk_gated_delta_rule (with its in-kernel q/k L2 norm)."""
    torch = pytest.importorskip("torch")
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    rs = np.random.RandomState(5)
    B, T, H, Dk, Dv = 2, 45, 2, 8, 4
    q, k = rs.randn(B, T, H, Dk), rs.randn(B, T, H, Dk)
    v, g, beta = rs.randn(B, T, H, Dv), rs.uniform(-1, 0, (B, T, H)), rs.uniform(0, 1, (B, T, H))
    S0 = rs.randn(B, H, Dk, Dv)
    t = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    ref_o, ref_S = torch_chunk_gated_delta_rule(t(q), t(k), t(v), t(g), t(beta), chunk_size=16,
                                                initial_state=t(S0), output_final_state=True,
                                                use_qk_l2norm_in_kernel=True)
    j = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    o, S = chunk_gated_delta_rule(l2_normalize(j(q)) * Dk ** -0.5, l2_normalize(j(k)), j(v), j(g), j(beta),
                                  chunk_size=64, initial_state=j(S0))
    np.testing.assert_allclose(np.asarray(o), ref_o.numpy(), atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(S), ref_S.numpy(), atol=2e-5, rtol=1e-4)


def test_bad_shapes_raise():
    q, k, v, g, beta, S0 = _inputs(6, T=5)
    with pytest.raises(ValueError, match="initial_state"):
        gated_delta.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=S0[:, :1])
    with pytest.raises(ValueError, match="reset"):
        gated_delta.recurrent_gated_delta_rule(q, k, v, g, beta, reset=jnp.zeros((2, 4), bool))
