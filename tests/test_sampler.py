"""The JAX sampler against independent references: argmax decoding through `forward`, `token_logprobs`, a NumPy
top-k/top-p filter, and itself (seeds, batching, buckets, sharding)."""

import functools
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mimesis_jax import models, sharding
from mimesis_jax.algorithms.logprobs import token_logprobs
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.profiling import count_compilations
from mimesis_jax.inference import sampler

QWEN3 = dict(model_type="qwen3", vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=10000.0, initializer_range=0.3)
QWEN3_5 = dict(model_type="qwen3_5_text", vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=10000.0, initializer_range=0.2,
               partial_rotary_factor=0.25, attn_output_gate=True, full_attention_interval=2,
               layer_types=("linear_attention", "full_attention") * 2, linear_conv_kernel_dim=4,
               linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4)
# Qwen3.5's own recurrent decode differs from its chunked forward by ~1e-5 at init 0.3 (a property of the model,
# not the sampler), so its weights are drawn at 0.2 (logits still O(5)).
FAMILIES = ["qwen3"] + (["qwen3_5_text"] if importlib.util.find_spec("mimesis_jax.models.qwen3_5") else [])


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    config = ModelConfig(**(QWEN3 if request.param == "qwen3" else QWEN3_5))
    return config, models.init_params(config, jax.random.key(1))


def _prompts(vocab, lengths, seed=0):
    rng = np.random.RandomState(seed)
    return [[int(t) for t in rng.randint(0, vocab, size=L)] for L in lengths]


# One shape bucket for (almost) every call in this file: two compiled programs per family (filtering off / on).
BK = sampler.Buckets(min_batch=8, min_prompt=32, min_new=16)
T_REF = 48  # fixed length of the reference sequences (right-padded; causal, so padding never changes a prefix)


def gen(config, params, prompts, **kw):
    return sampler.generate(config, params, prompts, buckets=BK, **kw)


def _padded(seq):
    buf = np.zeros((1, T_REF), np.int32)
    buf[0, :len(seq)] = seq
    return buf


@functools.partial(jax.jit, static_argnums=0)
def _ref_logprobs(config, params, buf):
    return token_logprobs(config, params, buf)


def ref_logprobs(config, params, prompt, new):
    """Reference: `token_logprobs` of prompt + new, at the positions of the new tokens."""
    seq = list(prompt) + list(new)
    return np.asarray(_ref_logprobs(config, params, _padded(seq)))[0, len(prompt) - 1:len(seq) - 1]


def _argmax_decode(config, params, prompt, n):
    """Reference: re-run the whole sequence through `forward` and take the argmax of the last real position."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(jnp.argmax(models.forward(config, params, _padded(seq))[0, len(seq) - 1])))
    return seq[len(prompt):]


def test_greedy_equals_argmax_forward_and_logprobs_equal_token_logprobs(model):
    config, params = model
    prompts = _prompts(config.vocab_size, (3, 11, 6))
    out = gen(config, params, prompts, max_new_tokens=9, temperature=0.0)
    for p, s in zip(prompts, out):
        assert s.tokens == _argmax_decode(config, params, p, 9)
        assert s.finish_reason == "length" and s.prompt_len == len(p)
        ref = ref_logprobs(config, params, p, s.tokens)
        np.testing.assert_allclose(s.logprobs, ref, atol=1e-5, rtol=0)


@functools.partial(jax.jit, static_argnums=0)
def _ref_logits(config, params, buf):
    return models.forward(config, params, buf)


def np_logprobs(config, params, prompt, new, temperature):
    """Reference: NumPy log_softmax(logits / T) of the `forward` logits, at the positions of the new tokens."""
    seq = list(prompt) + list(new)
    z = np.asarray(_ref_logits(config, params, _padded(seq)), np.float64)[0, len(prompt) - 1:len(seq) - 1]
    z = z / temperature
    lse = z.max(-1) + np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1))
    return z[np.arange(len(new)), list(new)] - lse


def test_sampled_logprobs_are_at_the_sampling_temperature(model):
    """At temperature 0.7 with top-k/top-p the returned log-probs are log softmax(logits / 0.7), unfiltered (the
    default); logprob_temperature=1.0 gives temperature-1 log-probs of the same tokens, with no new program."""
    config, params = model
    prompts = _prompts(config.vocab_size, (4, 9, 6), seed=1)
    kw = dict(max_new_tokens=12, top_p=0.9, top_k=30, seed=5)
    out = gen(config, params, prompts, temperature=[0.7, 1.6, 0.0], **kw)
    n = sampler.trace_count()
    at1 = gen(config, params, prompts, temperature=[0.7, 1.6, 0.0], logprob_temperature=1.0, **kw)
    assert sampler.trace_count() == n
    for p, s, s1, t in zip(prompts, out, at1, (0.7, 1.6, 1.0)):  # a greedy request scores at T = 1
        assert len(s.tokens) == 12 and s1.tokens == s.tokens
        np.testing.assert_allclose(s.logprobs, np_logprobs(config, params, p, s.tokens, t), atol=2e-5, rtol=0)
        np.testing.assert_allclose(s1.logprobs, np_logprobs(config, params, p, s.tokens, 1.0), atol=2e-5, rtol=0)
    assert not np.allclose(out[0].logprobs, at1[0].logprobs, atol=1e-2)
    with pytest.raises(ValueError, match="logprob_temperature"):
        gen(config, params, prompts, temperature=0.7, logprob_temperature="greedy", **kw)
    with pytest.raises(ValueError, match="logprob_temperature"):
        gen(config, params, prompts, temperature=0.7, logprob_temperature=0.0, **kw)


def test_same_seed_same_samples_different_seed_differs(model):
    config, params = model
    prompts = _prompts(config.vocab_size, (5, 5, 8), seed=2)
    kw = dict(max_new_tokens=16, temperature=1.0)
    a = gen(config, params, prompts, seed=7, **kw)
    b = gen(config, params, prompts, seed=7, **kw)
    c = gen(config, params, prompts, seed=8, **kw)
    assert [s.tokens for s in a] == [s.tokens for s in b]
    assert [s.logprobs for s in a] == [s.logprobs for s in b]
    assert [s.tokens for s in a] != [s.tokens for s in c]
    # an int seed gives each row its own stream: two rows with the same prompt differ (GRPO groups)
    g = gen(config, params, [prompts[0]] * 2, seed=7, **kw)
    assert g[0].tokens != g[1].tokens


def test_mixed_lengths_batched_equal_one_by_one(model):
    config, params = model
    prompts = _prompts(config.vocab_size, (2, 13, 7, 1, 20), seed=3)
    greedy = gen(config, params, prompts, max_new_tokens=8, temperature=0.0)
    seeds = [11, 12, 13, 14, 15]
    sampled = gen(config, params, prompts, max_new_tokens=8, temperature=1.0, top_k=40, seed=seeds)
    for i, p in enumerate(prompts):
        alone = gen(config, params, [p], max_new_tokens=8, temperature=0.0)[0]
        assert alone.tokens == greedy[i].tokens
        np.testing.assert_allclose(alone.logprobs, greedy[i].logprobs, atol=1e-5)
        alone = gen(config, params, [p], max_new_tokens=8, temperature=1.0, top_k=40, seed=[seeds[i]])[0]
        assert alone.tokens == sampled[i].tokens


def test_stop_ids_and_per_request_limits(model):
    config, params = model
    prompts = _prompts(config.vocab_size, (4, 6, 5), seed=4)
    free = gen(config, params, prompts, max_new_tokens=10, temperature=0.0)
    stop_a = free[0].tokens[3]  # row 0 must stop at the first occurrence of this token
    first = free[0].tokens.index(stop_a)
    out = gen(config, params, prompts, max_new_tokens=[10, 4, 10], temperature=0.0,
                           stop_ids=[[stop_a], [], [free[2].tokens[0]]])
    assert out[0].tokens == free[0].tokens[:first + 1] and out[0].finish_reason == "stop"
    assert out[1].tokens == free[1].tokens[:4] and out[1].finish_reason == "length"
    assert out[2].tokens == free[2].tokens[:1] and out[2].finish_reason == "stop"
    assert len(out[0].logprobs) == len(out[0].tokens)
    np.testing.assert_allclose(out[1].logprobs, free[1].logprobs[:4], atol=1e-6)


def test_top_k_one_is_greedy(model):
    config, params = model
    prompts = _prompts(config.vocab_size, (3, 7), seed=5)
    g = gen(config, params, prompts, max_new_tokens=6, temperature=0.0)
    k1 = gen(config, params, prompts, max_new_tokens=6, temperature=1.5, top_k=1, seed=3)
    assert [s.tokens for s in g] == [s.tokens for s in k1]


# ------------------------------------------------------------------------------- sampling rules
def _np_filtered_probs(logits, temperature, top_k, top_p):
    """Reference written from the definitions: temperature, keep the k largest, keep the smallest set of the
    largest tokens whose probability mass reaches p; renormalise."""
    z = logits / temperature
    order = np.argsort(-z, kind="stable")
    keep = np.zeros_like(z, bool)
    k = len(z) if top_k == 0 else top_k
    keep[order[:k]] = True
    zk = np.where(keep, z, -np.inf)
    p = np.exp(zk - zk.max())
    p /= p.sum()
    mass, chosen = 0.0, np.zeros_like(keep)
    for idx in order[:k]:
        chosen[idx] = True
        mass += p[idx]
        if mass >= top_p:
            break
    q = np.where(chosen, p, 0.0)
    return q / q.sum()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.6, 5, 1.0), (1.3, 0, 0.7), (0.9, 6, 0.5)])
def test_choose_tokens_follows_the_filtered_distribution(temperature, top_k, top_p):
    rng = np.random.RandomState(0)
    V, n = 12, 40000
    logits = (rng.randn(V) * 1.5).astype(np.float32)
    ref = _np_filtered_probs(logits.astype(np.float64), temperature, top_k, top_p)
    keys = jax.random.split(jax.random.key(3), n)
    f = jax.jit(lambda k: sampler.choose_tokens(
        jnp.broadcast_to(jnp.asarray(logits), (n, V)), k, jnp.full((n,), temperature), jnp.full((n,), top_k),
        jnp.full((n,), top_p), True))
    tok, lp = f(keys)
    freq = np.bincount(np.asarray(tok), minlength=V) / n
    assert np.all(freq[ref == 0] == 0), "a filtered-out token was drawn"
    tol = 4.5 * np.sqrt(ref * (1 - ref) / n) + 1e-3  # ~4.5 standard errors per token
    assert np.all(np.abs(freq - ref) <= tol), f"frequencies {freq.round(4)} vs reference {ref.round(4)}"
    z = logits.astype(np.float64) / temperature  # log-probs at the sampling temperature, unfiltered
    lsm = z - np.log(np.exp(z - z.max()).sum()) - z.max()
    np.testing.assert_allclose(np.asarray(lp), lsm[np.asarray(tok)], atol=1e-5)


def test_filter_logits_matches_numpy_per_row():
    rng = np.random.RandomState(1)
    logits = rng.randn(6, 20).astype(np.float32)
    ks = np.array([0, 1, 3, 20, 7, 0])
    ps = np.array([1.0, 0.5, 0.9, 0.3, 1.0, 0.05], np.float32)
    out = np.asarray(sampler.filter_logits(jnp.asarray(logits), jnp.asarray(ks), jnp.asarray(ps)))
    for r in range(6):
        ref = _np_filtered_probs(logits[r].astype(np.float64), 1.0, int(ks[r]), float(ps[r]))
        assert np.array_equal(np.isfinite(out[r]), ref > 0), f"row {r}: kept set differs"


def _np_old_filter_keep(z, top_k, top_p):
    """The kept set of the former sort-based filter, in NumPy: sort the row, keep the first k, then the first
    tokens (in that order) whose preceding renormalised mass is below p (at least one); ties with a threshold
    kept. Independent of `lax.top_k`."""
    V = len(z)
    desc = np.sort(z)[::-1]
    k = V if top_k <= 0 else min(top_k, V)
    e = np.exp(desc[:k] - desc[0])
    probs = e / e.sum()
    before = np.cumsum(probs) - probs
    n_keep = k if top_p >= 1.0 else max(1, int(np.sum(before < top_p)))
    return z >= desc[n_keep - 1]


def test_top_k_candidates_filter_equals_the_sort_filter_for_many_k_and_p():
    """lax.top_k candidates (static count from `candidate_count`) keep exactly the tokens the full-sort filter
    keeps, on tie-free logits, for every (k, p) pair; a call whose rows all set top_k uses fewer than V
    candidates, one with a top_p-only row uses all V."""
    rng = np.random.RandomState(7)
    V = 300
    ks = [0, 1, 2, 5, 17, 33, 64, 100, 299, 300, 1000]
    ps = [1.0, 0.99, 0.9, 0.5, 0.2, 0.01]
    pairs = [(k, p) for k in ks for p in ps]
    z = (rng.randn(len(pairs), V) * 2.0 + np.stack([rng.permutation(V) for _ in pairs]) * 1e-3).astype(np.float32)
    assert all(len(np.unique(row)) == V for row in z)  # tie-free
    with_k = [i for i, (k, _) in enumerate(pairs) if k > 0]
    assert sampler.candidate_count([pairs[i][0] for i in with_k], [pairs[i][1] for i in with_k], V) == 300
    assert sampler.candidate_count([5, 17, 1], [0.5, 1.0, 0.9], V) == 64  # at least MIN_CANDIDATES
    assert sampler.candidate_count([0, 100], [1.0, 1.0], V) == 128 and sampler.candidate_count([0], [1.0], V) == 0
    assert sampler.candidate_count([0, 3], [0.9, 1.0], V) == V  # top-p without top-k: the whole ordering
    groups = [list(range(len(pairs))), with_k] + [[i for i, (k, _) in enumerate(pairs) if k == kk]
                                                  for kk in (1, 17, 64, 100)]  # 64, 64, 64, 128 candidates
    for rows in groups:
        k_arr = np.array([pairs[i][0] for i in rows], np.int32)
        p_arr = np.array([pairs[i][1] for i in rows], np.float32)
        C = sampler.candidate_count(k_arr, p_arr, V)
        if C == 0:
            continue
        out = np.asarray(sampler.filter_logits(jnp.asarray(z[rows]), jnp.asarray(k_arr), jnp.asarray(p_arr), C))
        for j, i in enumerate(rows):
            ref = _np_old_filter_keep(z[i].astype(np.float64), *pairs[i])
            assert np.array_equal(np.isfinite(out[j]), ref), f"(k, p) = {pairs[i]}, {C} candidates: kept set differs"
            np.testing.assert_array_equal(out[j][ref], z[i][ref])  # kept logits pass through unchanged


def test_sampled_tokens_equal_the_sort_filter_path_for_fixed_keys():
    """choose_tokens with the top_k candidates draws the very tokens a categorical over the sort filter's kept
    set draws with the same keys (the same Gumbel noise over the same finite logits)."""
    rng = np.random.RandomState(8)
    B, V, T = 64, 500, 0.8
    z = (rng.randn(B, V) * 2.0 + np.stack([rng.permutation(V) for _ in range(B)]) * 1e-3).astype(np.float32)
    k_arr = rng.choice([1, 3, 10, 40, 200], size=B).astype(np.int32)
    p_arr = rng.choice([1.0, 0.9, 0.6, 0.3], size=B).astype(np.float32)
    keys = jax.random.split(jax.random.key(5), B)
    temp = jnp.full((B,), T, jnp.float32)
    C = sampler.candidate_count(k_arr, p_arr, V)
    assert C == 256
    tok, _ = sampler.choose_tokens(jnp.asarray(z), keys, temp, jnp.asarray(k_arr), jnp.asarray(p_arr), C)
    scaled = np.asarray(jnp.asarray(z) / jnp.maximum(temp, 1e-6)[:, None])
    keep = np.stack([_np_old_filter_keep(scaled[r].astype(np.float64), int(k_arr[r]), float(p_arr[r]))
                     for r in range(B)])
    old = jax.vmap(jax.random.categorical)(keys, jnp.where(jnp.asarray(keep), jnp.asarray(scaled), -jnp.inf))
    np.testing.assert_array_equal(np.asarray(tok), np.asarray(old))
    assert len(set(np.asarray(tok).tolist())) > 10  # real draws, not one argmax


def test_first_argmax_equals_numpy_argmax_with_ties_and_filtered_entries():
    rng = np.random.RandomState(3)
    x = rng.randint(-3, 4, size=(32, 1000)).astype(np.float32)  # many ties at the row maximum
    x[rng.rand(*x.shape) < 0.5] = -np.inf
    x[5] = -np.inf
    x[5, 7] = 0.0  # a row with one finite entry
    np.testing.assert_array_equal(np.asarray(sampler.first_argmax(jnp.asarray(x))), np.argmax(x, axis=-1))


@pytest.mark.parametrize("temps", [(0.0, 1.0, 0.7, 0.0, 1.3, 1.0, 0.0, 2.0), (0.0,) * 8])
def test_choose_tokens_draws_what_jax_categorical_draws(temps):
    """Unfiltered rows draw jax.random.categorical(key, logits / T) with their own keys (the token of the plain
    loop, bit for bit); greedy rows (T = 0) take np.argmax of the raw logits; the log-prob is log_softmax at T."""
    rng = np.random.RandomState(4)
    B, V = len(temps), 3000
    z = (rng.randn(B, V) * 3.0).astype(np.float32)
    temp = jnp.asarray(temps, jnp.float32)
    keys = jax.random.split(jax.random.key(11), B)
    off_k, off_p = jnp.zeros((B,), jnp.int32), jnp.ones((B,), jnp.float32)
    tok, lp = sampler.choose_tokens(jnp.asarray(z), keys, temp, off_k, off_p, 0)
    tok = np.asarray(tok)
    for r, t in enumerate(temps):
        want = np.argmax(z[r]) if t == 0 else int(jax.random.categorical(keys[r], jnp.asarray(z[r]) / t))
        assert tok[r] == want, r
        zt = z[r].astype(np.float64) / (t if t > 0 else 1.0)
        ref = zt[tok[r]] - (zt.max() + np.log(np.exp(zt - zt.max()).sum()))
        assert float(lp[r]) == pytest.approx(ref, abs=1e-4)


def test_max_batch_chunks_sample_what_one_call_samples(model):
    """max_batch splits the prompts into consecutive compiled calls (here two of batch 2 against one call of
    batch 8); an int seed keys row r by its global index, so the samples are those of the single call."""
    config, params = model
    prompts = _prompts(config.vocab_size, (3, 9, 5, 12), seed=10)
    kw = dict(max_new_tokens=8, temperature=1.0, top_k=20)
    for seed in (4, [21, 22, 23, 24]):
        whole = gen(config, params, prompts, seed=seed, **kw)
        chunked = sampler.generate(config, params, prompts, seed=seed, max_batch=2, **kw,
                                   buckets=sampler.Buckets(min_batch=2, min_prompt=32, min_new=16))
        assert [s.tokens for s in chunked] == [s.tokens for s in whole]
        # other batch shapes, other fp32 summation orders: Qwen3.5's DeltaNet layers drift by ~3e-5
        np.testing.assert_allclose(np.concatenate([s.logprobs for s in chunked]),
                                   np.concatenate([s.logprobs for s in whole]), atol=1e-4)
    assert len({tuple(s.tokens) for s in whole}) == len(prompts)
    with pytest.raises(ValueError, match="max_batch must be an int >= 0"):
        gen(config, params, prompts, max_batch=-1, **kw)


def test_local_chat_model_max_batch_chunks_the_sampler_calls(monkeypatch):
    """LocalChatModel(max_batch=N) hands N to the sampler: its calls hold at most N sequences, the replies are
    those of max_batch=0 (same seeds), and a bad value is refused naming the argument."""
    from mimesis_jax.data.tokenizer import load_tokenizer
    from mimesis_jax.chat.local import LocalChatModel

    tok = load_tokenizer("tiny")
    config = ModelConfig(**dict(QWEN3, vocab_size=tok.vocab_size))
    params = models.init_params(config, jax.random.key(2))
    convs = [[{"role": "user", "content": f"Order number {i} please"}] for i in range(5)]
    kw = dict(max_tokens=6, temperature=1.0, seed=9, buckets=BK)
    sizes = []
    real = sampler._generate_chunk
    monkeypatch.setattr(sampler, "_generate_chunk", lambda *a, **k: sizes.append(len(a[2])) or real(*a, **k))
    whole = LocalChatModel(config, params, tok, **kw).chat_batch(convs)
    assert sizes == [5]
    chunked = LocalChatModel(config, params, tok, max_batch=2, **kw).chat_batch(convs)
    assert sizes == [5, 2, 2, 1]
    assert [r.token_ids for r in chunked] == [r.token_ids for r in whole]
    assert [r.text for r in chunked] == [r.text for r in whole]
    with pytest.raises(ValueError, match="max_batch must be an int >= 0"):
        LocalChatModel(config, params, tok, max_batch=-2)


# ----------------------------------------------------------------------------- buckets, mesh, errors
def test_compiled_once_per_bucket():
    """Family-independent bucketing logic, checked on qwen3: calls inside one bucket reuse one program."""
    config = ModelConfig(**QWEN3)
    params = models.init_params(config, jax.random.key(1))
    gen(config, params, _prompts(config.vocab_size, (3, 9)), max_new_tokens=5, temperature=0.0)
    n = sampler.trace_count()
    with count_compilations() as later_rounds:  # XLA compilations of anything, counted from jax's compile events
        gen(config, params, _prompts(config.vocab_size, (31, 2, 4, 5, 6, 7, 8, 9), seed=9), max_new_tokens=16,
            temperature=1.0)  # same bucket (8, 32, 16), same filtering flag
        gen(config, params, _prompts(config.vocab_size, (1,), seed=8), max_new_tokens=1, temperature=0.0)
        gen(config, params, _prompts(config.vocab_size, (4, 5), seed=7), max_new_tokens=9, temperature=0.8,
            seed=[3, 4])
    assert sampler.trace_count() == n
    assert later_rounds.count == 0, later_rounds.names
    gen(config, params, _prompts(config.vocab_size, (33,)), max_new_tokens=5, temperature=0.0)  # prompt bucket 64
    assert sampler.trace_count() == n + 1
    assert BK.batch(9) == 16 and BK.batch(3, multiple=4) == 8 and BK.prompt(33) == 64 and BK.new_tokens(17) == 32
    assert sampler.Buckets(prompt_step=1024).prompt(1500) == 2048 and sampler.Buckets().prompt(2049) == 3072


def test_fixed_buckets_give_one_shape_within_their_bounds():
    """Buckets.fixed (the simulator RL loop's sampler, chat_models.fixed_buckets): every call within the bounds
    gets the same (batch, prompt, new tokens); past them the usual ladders."""
    from mimesis_jax.config.rl import SimRolloutConfig
    from mimesis_jax.train.rl.chat_models import fixed_buckets

    bk = sampler.Buckets.fixed(6, 1528, 8)
    assert {(bk.batch(n), bk.prompt(p), bk.new_tokens(8)) for n in (1, 4, 6) for p in (1, 700, 1100, 1528)} == \
        {(8, 1528, 8)}
    assert (bk.batch(9), bk.prompt(1529)) == (16, 2048) and bk.batch(3, multiple=16) == 16
    r = SimRolloutConfig(max_tokens=8, row_len=1536, max_context_tokens=1536, max_batch=4)
    got = fixed_buckets(r, 8, 6)
    assert {(got.batch(n), got.prompt(1), got.new_tokens(8)) for n in (2, 4)} == {(4, 1528, 8)}  # 6 = 4 + 2: chunks
    assert fixed_buckets(SimRolloutConfig(max_tokens=8), 8, 6) is None  # no context budget: the default ladders


def test_sharded_equals_single_device(model, monkeypatch):
    """On a mesh the sampler takes the params as placed there and does not place them again (a tree walk per
    call): it samples what one device samples; params not on the mesh are refused by name."""
    config, params = model
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    prompts = _prompts(config.vocab_size, (3, 8, 5), seed=6)
    ref = gen(config, params, prompts, max_new_tokens=6, temperature=1.0, seed=[1, 2, 3])
    placed = models.shard_params(config, params, mesh)
    with pytest.raises(ValueError, match=r"params must already be placed on that mesh.*models\.shard_params"):
        gen(config, params, prompts, max_new_tokens=6, temperature=1.0, seed=[1, 2, 3], mesh=mesh)

    def no_placing(*a, **k):
        raise AssertionError("sampler.generate placed params that were already on its mesh")
    monkeypatch.setattr(models, "shard_params", no_placing)
    out = gen(config, placed, prompts, max_new_tokens=6, temperature=1.0, seed=[1, 2, 3], mesh=mesh)
    assert [s.tokens for s in out] == [s.tokens for s in ref]
    np.testing.assert_allclose(np.concatenate([s.logprobs for s in out]), np.concatenate([s.logprobs for s in ref]),
                               atol=1e-5)


def test_bad_requests_name_the_request(model):
    config, params = model
    ok = [[1, 2], [3]]
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        sampler.generate(config, params, [[1], []], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"prompt 0: token id out of range"):
        sampler.generate(config, params, [[1, config.vocab_size]], max_new_tokens=2)
    with pytest.raises(ValueError, match="request 1: max_new_tokens"):
        sampler.generate(config, params, ok, max_new_tokens=[3, 0])
    with pytest.raises(ValueError, match="request 0: top_p"):
        sampler.generate(config, params, ok, max_new_tokens=2, top_p=[0.0, 1.0])
    with pytest.raises(ValueError, match="temperature: got 3 values for 2 prompts"):
        sampler.generate(config, params, ok, max_new_tokens=2, temperature=[1.0, 1.0, 1.0])
    assert sampler.generate(config, params, [], max_new_tokens=2) == []
