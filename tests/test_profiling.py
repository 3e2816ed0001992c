"""The benchmark measurement helpers: memory analysis that tracks what a program allocates, timing that runs the
program, a skip that never runs an over-budget program, and a relative difference checked against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mimesis_jax import profiling


def _outer(n):
    def f(x):
        # [n, n] intermediates a matmul must materialise (scratch grows with n^2); the output is one row (4n bytes)
        m = jnp.tanh(jnp.outer(x, x))
        return (m @ m)[0]
    return f


def test_memory_tracks_the_intermediate_and_output_sizes():
    small = profiling.measure(_outer(64), (jnp.ones(64),), repeats=1)
    big = profiling.measure(_outer(512), (jnp.ones(512),), repeats=1)
    if big.temp_bytes is None:
        pytest.skip("this backend gives no memory analysis")
    assert big.temp_bytes >= 512 * 512 * 4 > small.temp_bytes
    assert (big.output_bytes, small.output_bytes) == (512 * 4, 64 * 4)
    assert big.peak_bytes == big.temp_bytes + 512 * 4
    np.testing.assert_allclose(np.asarray(big.out), np.full(512, 512 * np.tanh(1.0) ** 2), rtol=1e-5)
    assert big.time is not None and big.time > 0


def test_over_budget_program_is_compiled_but_not_run():
    calls = []

    def f(x):
        jax.debug.callback(lambda: calls.append(1))
        return _outer(256)(x)

    m = profiling.measure(f, (jnp.ones(256),), repeats=2, max_temp_bytes=1)
    if m.temp_bytes is None:
        pytest.skip("this backend gives no memory analysis")
    assert m.time is None and m.out is None and m.temp_bytes > 1
    assert calls == []
    profiling.measure(f, (jnp.ones(256),), repeats=2)
    assert len(calls) == 3  # one warm-up and two timed calls


def test_max_rel_diff_matches_numpy():
    rng = np.random.RandomState(0)
    a = {"x": rng.randn(5, 3), "y": rng.randn(7)}
    b = {"x": a["x"] + 1e-3 * rng.randn(5, 3), "y": a["y"] * 1.01}
    want = max(np.abs(a[k] - b[k]).max() / np.abs(b[k]).max() for k in a)
    got = profiling.max_rel_diff(jax.tree.map(jnp.asarray, a), jax.tree.map(jnp.asarray, b))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    with pytest.raises(ValueError, match="leaves"):
        profiling.max_rel_diff([jnp.ones(2)], [jnp.ones(2), jnp.ones(2)])


def test_best_time_rejects_zero_repeats():
    with pytest.raises(ValueError, match="repeats"):
        profiling.best_time(lambda: jnp.ones(1), 0)
