"""The gated delta rule (Gated DeltaNet, Yang, Kautz & Hatamizadeh 2024) as pure JAX functions.

Per head, with a matrix state S_t [Dk, Dv], a decay alpha_t = exp(g_t) (g_t <= 0) and a write strength
beta_t in (0, 1), every token does (the paper's "gated delta rule")::

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T          (GDR-state)
    o_t = S_t^T q_t                                                          (GDR-read)

Equivalently, in the order transformers' reference kernel uses: decay the state, read what it predicts for
k_t, write the correction ``delta_t = beta_t (v_t - k_t^T alpha_t S_{t-1})`` as ``S_t = alpha_t S_{t-1} +
k_t delta_t^T``. Queries arrive already scaled (Qwen3.5 passes L2-normalised q times Dk^-1/2 and
L2-normalised k; see `l2_normalize`).

Two evaluations of the same map:

* `recurrent_gated_delta_rule`: the per-token recurrence (decoding, and the plain reference);
* `chunk_gated_delta_rule`: the chunked (WY / UT-transform) form for training and prefill. Inside a chunk of
  C tokens all interactions are matmuls; only the [Dk, Dv] state crosses chunk boundaries (see its docstring
  for the derivation).

Packing: ``reset[b, t] = True`` zeroes the state *before* token t (a new segment starts there), so a packed
row equals its sequences run separately. A reset is the same as alpha_t = 0; the chunked form implements it
by masking interactions across resets instead of putting -inf into log-space cumulative sums. Padding tokens
that must leave the state untouched are expressed by the caller with beta_t = 0 and g_t = 0.

All arithmetic is in float32 (as transformers' and the fla kernels do); outputs come back in v's dtype and
the state in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / sqrt(sum(x^2) + eps) over the last axis, in float32 (the fla / transformers convention)."""
    xf = x.astype(jnp.float32)
    return xf * jax.lax.rsqrt(jnp.sum(xf * xf, axis=-1, keepdims=True) + eps)


def _check(q, k, v, g, beta, initial_state, reset):
    B, T, H, Dk = q.shape
    if k.shape != q.shape:
        raise ValueError(f"gated delta rule: k shape {k.shape} != q shape {q.shape}")
    if v.shape[:3] != (B, T, H):
        raise ValueError(f"gated delta rule: v shape {v.shape} does not start with [B, T, H] = {(B, T, H)}")
    if g.shape != (B, T, H) or beta.shape != (B, T, H):
        raise ValueError(f"gated delta rule: g {g.shape} and beta {beta.shape} must be [B, T, H] = {(B, T, H)}")
    if initial_state is not None and initial_state.shape != (B, H, Dk, v.shape[-1]):
        raise ValueError(f"gated delta rule: initial_state shape {initial_state.shape} != "
                         f"[B, H, Dk, Dv] = {(B, H, Dk, v.shape[-1])}")
    if reset is not None and reset.shape != (B, T):
        raise ValueError(f"gated delta rule: reset shape {reset.shape} != [B, T] = {(B, T)}")


# ------------------------------------------------------------------------------ triangular inverse
def _unit_lower_inverse_impl(A: jax.Array) -> jax.Array:
    n = A.shape[-1]
    m = 1 << max(0, (n - 1).bit_length())  # next power of two; padding keeps the matrix block-diagonal
    batch = A.shape[:-2]
    if m != n:
        A = jnp.pad(A, [(0, 0)] * len(batch) + [(0, m - n), (0, m - n)])
    inv = jnp.ones(batch + (m, 1, 1), A.dtype)  # inverses of the 1x1 diagonal blocks
    b = 1
    while b < m:  # merge pairs of b-blocks: [[X11, 0], [-X22 A21 X11, X22]]
        nb = m // (2 * b)
        diag = jnp.diagonal(A.reshape(batch + (nb, 2 * b, nb, 2 * b)), axis1=-4, axis2=-2)
        a21 = jnp.moveaxis(diag, -1, -3)[..., b:, :b]  # [.., nb, b, b]
        x11, x22 = inv[..., 0::2, :, :], inv[..., 1::2, :, :]
        x21 = -jnp.matmul(jnp.matmul(x22, a21), x11)
        top = jnp.concatenate([x11, jnp.zeros_like(x11)], axis=-1)
        inv = jnp.concatenate([top, jnp.concatenate([x21, x22], axis=-1)], axis=-2)
        b *= 2
    return inv[..., 0, :n, :n]


@jax.custom_vjp
def unit_lower_inverse(A: jax.Array) -> jax.Array:
    """(I + A)^{-1} for strictly lower-triangular A [..., n, n] (the UT transform's matrix).

    Recursive block inversion: starting from 1x1 blocks, pairs of diagonal blocks merge as
    [[M11, 0], [M21, M22]]^{-1} = [[X11, 0], [-X22 M21 X11, X22]] -- log2(n) levels of batched matmuls, as
    stable as forward substitution and far faster than XLA's triangular-solve expansion on CPU. The VJP
    is dA = -(T^T G T^T) restricted to the strictly lower triangle, with T the inverse (its only residual).
    """
    return _unit_lower_inverse_impl(A)


def _uli_fwd(A):
    T = _unit_lower_inverse_impl(A)
    return T, T


def _uli_bwd(T, G):
    Tt = jnp.swapaxes(T, -1, -2)
    n = T.shape[-1]
    strict = jnp.arange(n)[:, None] > jnp.arange(n)[None, :]
    return (jnp.where(strict, -jnp.matmul(jnp.matmul(Tt, G), Tt), 0.0).astype(T.dtype),)


unit_lower_inverse.defvjp(_uli_fwd, _uli_bwd)


# ------------------------------------------------------------------------------------ recurrence
def recurrent_gated_delta_rule(q, k, v, g, beta, *, initial_state=None, reset=None):
    """Token-by-token gated delta rule (GDR-state, GDR-read).

    q, k: [B, T, H, Dk]; v: [B, T, H, Dv]; g (log decay, <= 0), beta: [B, T, H];
    initial_state: [B, H, Dk, Dv] or None (zeros); reset: [B, T] bool or None.
    Returns (o [B, T, H, Dv] in v.dtype, final state [B, H, Dk, Dv] float32).
    """
    _check(q, k, v, g, beta, initial_state, reset)
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    f32 = lambda a: jnp.moveaxis(a.astype(jnp.float32), 1, 0)  # noqa: E731  time-major for the scan
    S0 = jnp.zeros((B, H, Dk, Dv), jnp.float32) if initial_state is None else initial_state.astype(jnp.float32)
    rs = jnp.zeros((T, B), bool) if reset is None else jnp.moveaxis(reset.astype(bool), 1, 0)

    def step(S, xs):
        q_t, k_t, v_t, g_t, b_t, r_t = xs
        S = jnp.where(r_t[:, None, None, None], 0.0, S) * jnp.exp(g_t)[..., None, None]
        pred = jnp.einsum("bhk,bhkv->bhv", k_t, S)
        delta = b_t[..., None] * (v_t - pred)
        S = S + k_t[..., :, None] * delta[..., None, :]
        return S, jnp.einsum("bhk,bhkv->bhv", q_t, S)

    S, o = jax.lax.scan(step, S0, (f32(q), f32(k), f32(v), f32(g), f32(beta), rs))
    return jnp.moveaxis(o, 0, 1).astype(v.dtype), S


# --------------------------------------------------------------------------------------- chunked
def chunk_gated_delta_rule(q, k, v, g, beta, *, chunk_size: int = 64, initial_state=None, reset=None):
    """Chunked gated delta rule: same inputs and outputs as `recurrent_gated_delta_rule`.

    Within a chunk (positions i, j = 1..C, state S_0 entering it), let gamma_i = sum_{s<=i} g_s be the
    cumulative log decay and delta_j = beta_j (v_j - k_j^T alpha_j S_{j-1}) the correction written at j.
    Unrolling (GDR-state),

        S_i = e^{gamma_i} S_0 + sum_{j<=i} e^{gamma_i - gamma_j} k_j delta_j^T,

    and substituting it into delta_j gives a unit lower-triangular system (the UT transform)

        (I + A) Delta = diag(beta) V - diag(beta e^{gamma}) K S_0,
        A_{jm} = beta_j e^{gamma_j - gamma_m} k_j . k_m   for m < j (0 otherwise),

    solved once per chunk for U = (I + A)^{-1} diag(beta) V and W = (I + A)^{-1} diag(beta e^gamma) K, so
    that Delta = U - W S_0 needs only the entering state. Then

        O = diag(e^gamma) Q S_0 + (Q K^T * Gamma) Delta,       Gamma_{ij} = e^{gamma_i - gamma_j} [j <= i]
        S_C = e^{gamma_C} S_0 + (e^{gamma_C - gamma} * K)^T Delta.

    All chunks' U, W and intra-chunk matrices are computed in parallel; a scan over chunks carries S.
    Resets: positions in different "runs" (separated by a reset) never interact (their entries of A and
    Gamma are masked) and S_0 only reaches positions before the chunk's first reset. Every exponent used is
    <= 0 (masked entries are exp(-inf) = 0, also in the gradient), so nothing overflows. The sequence is
    padded to a multiple of C with identity tokens (beta = 0, g = 0).
    """
    _check(q, k, v, g, beta, initial_state, reset)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    C = min(chunk_size, T)
    N = -(-T // C)
    pad = N * C - T
    out_dtype = v.dtype
    f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
    q, k, v, g, beta = f32(q), f32(k), f32(v), f32(g), f32(beta)
    reset = jnp.zeros((B, T), bool) if reset is None else reset.astype(bool)
    if pad:
        q, k, v = (jnp.pad(a, ((0, 0), (0, pad), (0, 0), (0, 0))) for a in (q, k, v))
        g, beta = (jnp.pad(a, ((0, 0), (0, pad), (0, 0))) for a in (g, beta))
        reset = jnp.pad(reset, ((0, 0), (0, pad)))
    # The decay at a reset position multiplies a state that is zeroed anyway: make it neutral.
    g = jnp.where(reset[..., None], 0.0, g)

    # [B, T, H, X] -> [B, N, H, C, X] (heads before the chunk axis so the chunk matrices are [C, C]).
    chunk = lambda a: jnp.moveaxis(a.reshape(B, N, C, H, *a.shape[3:]), 3, 2)  # noqa: E731
    q, k, v = chunk(q), chunk(k), chunk(v)
    g, beta = chunk(g[..., None])[..., 0], chunk(beta[..., None])[..., 0]  # [B, N, H, C]
    run = jnp.cumsum(reset.reshape(B, N, C).astype(jnp.int32), axis=-1)  # run index inside the chunk
    same_run = (run[..., :, None] == run[..., None, :])[:, :, None]  # [B, N, 1, C, C]
    from_start = (run == 0)[:, :, None]  # [B, N, 1, C]: S_0 is still live here
    to_end = (run == run[..., -1:])[:, :, None]  # [B, N, 1, C]: in the same run as the chunk's last token

    gamma = jnp.cumsum(g, axis=-1)  # [B, N, H, C]
    idx = jnp.arange(C)
    lower = idx[:, None] >= idx[None, :]
    live = lower & same_run
    decay = jnp.exp(jnp.where(live, gamma[..., :, None] - gamma[..., None, :], -jnp.inf))  # Gamma, [B,N,H,C,C]
    strict = jnp.where(idx[:, None] > idx[None, :], decay, 0.0)

    kb = k * beta[..., None]
    A = jnp.einsum("bnhik,bnhjk->bnhij", kb, k) * strict
    e_gamma = jnp.exp(gamma) * from_start  # e^{gamma_i}, 0 after a reset
    rhs = jnp.concatenate([v * beta[..., None], kb * e_gamma[..., None]], axis=-1)
    sol = jnp.matmul(unit_lower_inverse(A), rhs)
    U, W = sol[..., :Dv], sol[..., Dv:]  # [B, N, H, C, Dv], [B, N, H, C, Dk]

    P = jnp.einsum("bnhik,bnhjk->bnhij", q, k) * decay  # intra-chunk read, [B, N, H, C, C]
    Qs = q * e_gamma[..., None]  # reads of the entering state
    tail = jnp.exp(jnp.where(to_end, gamma[..., -1:] - gamma, -jnp.inf))
    Ks = k * tail[..., None]  # writes that survive to the chunk's end
    chunk_decay = jnp.exp(gamma[..., -1]) * from_start[..., -1]  # [B, N, H]

    S0 = jnp.zeros((B, H, Dk, Dv), jnp.float32) if initial_state is None else initial_state.astype(jnp.float32)
    tm = lambda a: jnp.moveaxis(a, 1, 0)  # noqa: E731  chunk-major for the scan

    def per_chunk(S, xs):
        U_n, W_n, P_n, Qs_n, Ks_n, d_n = xs
        delta = U_n - jnp.einsum("bhck,bhkv->bhcv", W_n, S)
        o = jnp.einsum("bhck,bhkv->bhcv", Qs_n, S) + jnp.einsum("bhcj,bhjv->bhcv", P_n, delta)
        S = d_n[..., None, None] * S + jnp.einsum("bhck,bhcv->bhkv", Ks_n, delta)
        return S, o

    S, o = jax.lax.scan(per_chunk, S0, (tm(U), tm(W), tm(P), tm(Qs), tm(Ks), tm(chunk_decay)))
    o = jnp.moveaxis(o, 0, 1)  # [B, N, H, C, Dv]
    o = jnp.moveaxis(o, 2, 3).reshape(B, N * C, H, Dv)[:, :T]
    return o.astype(out_dtype), S
