"""The rollout engine (inference/engine.py) against independent references: `token_logprobs` of the model's full
forward over the final multi-turn sequence, `sampler.generate` (greedy and seeded sampling, re-prefilling the
whole context each turn), a NumPy paged-attention formula; and its pool bookkeeping (pages freed on release,
eviction and recompute, clear errors)."""

import functools

import jax
import numpy as np
import pytest

from mimesis_jax import models
from mimesis_jax.algorithms.logprobs import token_logprobs
from mimesis_jax.models import paged_cache
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.inference import sampler
from mimesis_jax.inference.engine import EngineConfig, EngineError, RolloutEngine

from test_sampler import QWEN3, QWEN3_5  # noqa: E402  (the sampler tests' tiny models)

# 2 slots for 3 dialogues: the third joins when a slot frees (mid-flight); 4-token pages: every turn crosses
# page boundaries; 8-token prefill chunks: long suffixes take several rounds.
EC = EngineConfig(slots=2, page_size=4, num_pages=64, max_pages_per_seq=16, prefill_chunk=8, prefill_rows=2,
                  decode_steps=4, num_states=8)
BK = sampler.Buckets(min_batch=4, min_prompt=64, min_new=16)
T_REF = 64


@functools.lru_cache(maxsize=None)
def _model(name):
    config = ModelConfig(**(QWEN3 if name == "qwen3" else QWEN3_5))
    return config, models.init_params(config, jax.random.key(1))


# The Qwen3.5 runs of the sampler comparisons compile several extra programs (slow); the quick Qwen3.5 test below
# checks the same exactness against the full forward alone.
FAMILIES = ["qwen3", pytest.param("qwen3_5_text", marks=pytest.mark.slow)]


@functools.partial(jax.jit, static_argnums=0)
def _ref_logprobs(config, params, buf):
    return token_logprobs(config, params, buf)


def ref_logprobs(config, params, seq):
    """log p(seq[t] | seq[:t]) for t >= 1 from the model's full forward (right-padded to T_REF; causal)."""
    buf = np.zeros((1, T_REF), np.int32)
    buf[0, :len(seq)] = seq
    return np.asarray(_ref_logprobs(config, params, buf))[0]


def _dialogues(engine, config, params, n_turns, max_new, rng, temperature=0.0, seeds=None):
    """Runs 3 dialogues for n_turns through the engine (appending random 'tool/user' tokens between turns) and
    checks every turn's samples against sampler.generate on the full context; returns (contexts, spans)."""
    ctx = [list(rng.randint(0, config.vocab_size, size=L)) for L in (5, 9, 3)]
    spans = [[] for _ in ctx]  # (start, tokens, logprobs) of every sampled segment
    for turn in range(n_turns):
        seed = None if seeds is None else [s + turn for s in seeds]
        out = engine.generate_tokens(ctx, keys=["a", "b", "c"], max_tokens=max_new, temperature=temperature,
                                     seed=seed if seed is not None else 0)
        ref = sampler.generate(config, params, ctx, max_new_tokens=max_new, temperature=temperature,
                               seed=seed if seed is not None else 0, buckets=BK)
        for i, (s, r) in enumerate(zip(out, ref)):
            assert s.tokens == r.tokens and s.finish_reason == r.finish_reason and s.prompt_len == len(ctx[i])
            spans[i].append((len(ctx[i]), s.tokens, s.logprobs))
        ctx = [c + s.tokens + list(rng.randint(0, config.vocab_size, size=3 + 2 * i))
               for i, (c, s) in enumerate(zip(ctx, out))]
    return ctx, spans


def _check_logprobs(config, params, ctx, spans):
    for c, sp in zip(ctx, spans):
        lp = ref_logprobs(config, params, c)
        for start, toks, lps in sp:
            assert c[start:start + len(toks)] == toks
            np.testing.assert_allclose(lps, lp[start - 1:start - 1 + len(toks)], atol=3e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_multi_turn_greedy_and_logprobs_equal_full_forward(family):
    """3 turns of 3 dialogues on 2 slots: greedy tokens equal the sampler's on the whole context, and the
    recorded log-probs equal token_logprobs of the final sequence; later turns prefill only the suffix."""
    config, params = _model(family)
    eng = RolloutEngine(config, params, EC)
    ctx, spans = _dialogues(eng, config, params, 3, [6, 3, 9], np.random.RandomState(0))
    _check_logprobs(config, params, ctx, spans)
    total_prompt = sum(start for sp in spans for start, _, _ in sp)
    assert eng.stats["reused_tokens"] > 0
    assert eng.stats["prefill_tokens"] == total_prompt - eng.stats["reused_tokens"]
    assert eng.stats["prefill_tokens"] < total_prompt / 2
    assert eng.stats["recomputed"] == 0 and eng.stats["evictions"] == 0
    for key in "abc":
        eng.release(key)
    assert eng.pages_in_use() == 0 and not eng.pool.dialogues
    assert len(eng.pool.free_states) == EC.states - 1


@pytest.mark.parametrize("family", FAMILIES)
def test_seeded_sampling_matches_sampler(family):
    """Temperature-1 sampling with top-k, per-request seeds: the same tokens as sampler.generate (same keys)."""
    config, params = _model(family)
    eng = RolloutEngine(config, params, EC)
    rng = np.random.RandomState(1)
    ctx = [list(rng.randint(0, config.vocab_size, size=L)) for L in (7, 4, 12)]
    for turn in range(2):
        kw = dict(max_new_tokens=[5, 8, 4], temperature=1.0, top_k=20, seed=[11 + turn, 22 + turn, 33 + turn])
        ref = sampler.generate(config, params, ctx, buckets=BK, **kw)
        kw["max_tokens"] = kw.pop("max_new_tokens")
        out = eng.generate_tokens(ctx, keys=[1, 2, 3], **kw)
        assert [s.tokens for s in out] == [r.tokens for r in ref]
        for s, r in zip(out, ref):
            np.testing.assert_allclose(s.logprobs, r.logprobs, atol=3e-5)
        ctx = [c + s.tokens + [3, 5] for c, s in zip(ctx, out)]


def test_qwen3_5_multi_turn_matches_full_forward():
    """Qwen3.5 (DeltaNet state + conv window in state slots, full layers in pages): 3 dialogues x 3 turns on 2
    slots; every greedy token is the argmax of the full forward's logits at its position and every log-prob
    equals token_logprobs of the final sequence."""
    config, params = _model("qwen3_5_text")
    eng = RolloutEngine(config, params, EC)
    rng = np.random.RandomState(5)
    ctx = [list(rng.randint(0, config.vocab_size, size=L)) for L in (5, 9, 3)]
    spans = [[] for _ in ctx]
    for turn in range(3):
        out = eng.generate_tokens(ctx, keys=["a", "b", "c"], max_tokens=[6, 3, 9], temperature=0.0)
        for i, s in enumerate(out):
            spans[i].append((len(ctx[i]), s.tokens, s.logprobs))
        ctx = [c + s.tokens + list(rng.randint(0, 97, size=3 + 2 * i)) for i, (c, s) in enumerate(zip(ctx, out))]
    _check_logprobs(config, params, ctx, spans)
    for c, sp in zip(ctx, spans):
        buf = np.zeros((1, T_REF), np.int32)
        buf[0, :len(c)] = c
        greedy = np.argmax(np.asarray(models.forward(config, params, buf))[0], axis=-1)
        for start, toks, _ in sp:
            assert list(greedy[start - 1:start - 1 + len(toks)]) == toks
    assert eng.stats["reused_tokens"] > 0 and eng.stats["recomputed"] == 0


def test_stop_ids_diverged_history_and_stateless_calls():
    """A stop id ends a request; a prompt that does not extend the cached history resumes from their longest common
    prefix (Qwen3: pages alone; EngineConfig.checkpoint) or, sharing none, is recomputed (both exact); calls
    without keys leave nothing behind."""
    config = ModelConfig(**QWEN3)
    params = models.init_params(config, jax.random.key(1))
    eng = RolloutEngine(config, params, EC)
    rng = np.random.RandomState(2)
    p = [list(rng.randint(0, 97, size=6))]
    first = eng.generate_tokens(p, keys=["x"], max_tokens=8, temperature=0.0)[0]
    stop = first.tokens[2]
    again = eng.generate_tokens([p[0] + first.tokens + [4]], keys=["x"], max_tokens=8, temperature=0.0,
                                stop_ids=[stop])[0]
    ref = sampler.generate(config, params, [p[0] + first.tokens + [4]], max_new_tokens=8, temperature=0.0,
                           stop_ids=[stop], buckets=BK)[0]
    assert again.tokens == ref.tokens and again.finish_reason == ref.finish_reason
    assert p[0][3] != 9
    reused, prefilled = eng.stats["reused_tokens"], eng.stats["prefill_tokens"]
    for diverged, common in (([p[0][:3] + [9, 9, 9, 9]], 3), ([[(p[0][0] + 1) % 97, 9, 9]], 0)):
        d = eng.generate_tokens(diverged, keys=["x"], max_tokens=5, temperature=0.0)[0]
        assert d.tokens == sampler.generate(config, params, diverged, max_new_tokens=5, temperature=0.0,
                                            buckets=BK)[0].tokens
        assert eng.stats["reused_tokens"] - reused == common
        assert eng.stats["prefill_tokens"] - prefilled == len(diverged[0]) - common
        reused, prefilled = eng.stats["reused_tokens"], eng.stats["prefill_tokens"]
    assert eng.stats["rolled_back"] == 1 and eng.stats["recomputed"] == 1
    eng.release("x")
    eng.release("never-seen")  # no-op
    assert eng.pages_in_use() == 0
    eng.generate_tokens(p + p, max_tokens=3, temperature=0.0)
    assert eng.pages_in_use() == 0 and not eng.pool.dialogues


def test_pool_eviction_recompute_and_errors():
    """A pool that holds one dialogue: the second evicts the idle first one (LRU), which is recomputed exactly
    when it returns; a request that can never fit names the config key; so does an over-long one."""
    config = ModelConfig(**QWEN3)
    params = models.init_params(config, jax.random.key(1))
    ec = EngineConfig(slots=2, page_size=4, num_pages=6, max_pages_per_seq=16, prefill_chunk=8, prefill_rows=2,
                      decode_steps=4)  # 5 usable pages = 20 tokens
    eng = RolloutEngine(config, params, ec)
    rng = np.random.RandomState(3)
    a, b = list(rng.randint(0, 97, size=10)), list(rng.randint(0, 97, size=9))
    sa = eng.generate_tokens([a], keys=["a"], max_tokens=6, temperature=0.0)[0]
    eng.generate_tokens([b], keys=["b"], max_tokens=6, temperature=0.0)
    assert eng.stats["evictions"] == 1 and "a" not in eng.pool.dialogues
    a2 = a + sa.tokens + [1]
    sa2 = eng.generate_tokens([a2], keys=["a"], max_tokens=3, temperature=0.0)[0]
    ref = sampler.generate(config, params, [a2], max_new_tokens=3, temperature=0.0, buckets=BK)[0]
    assert sa2.tokens == ref.tokens
    np.testing.assert_allclose(sa2.logprobs, ref.logprobs, atol=3e-5)
    # both dialogues wanted at once: the second waits for the first to finish, then evicts it
    out = eng.generate_tokens([a2, b], keys=["a", "b"], max_tokens=3, temperature=0.0)
    assert out[0].tokens == ref.tokens
    with pytest.raises(EngineError, match="EngineConfig.num_pages"):
        eng.generate_tokens([list(range(30))], max_tokens=2)
    with pytest.raises(EngineError, match="EngineConfig.max_pages_per_seq"):
        eng.generate_tokens([list(range(60))], max_tokens=8)
    with pytest.raises(ValueError, match="appears twice"):
        eng.generate_tokens([a, a], keys=["z", "z"], max_tokens=2)
    with pytest.raises(ValueError, match="EngineConfig.slots"):
        EngineConfig(slots=0).validate()
    eng.release_all()
    assert eng.pages_in_use() == 0


def test_submit_step_streams_tokens_joins_mid_flight_and_cancels():
    """The submit/step API that `serve --engine` drives: a long request's first tokens reach its callback before it
    finishes (streaming); a request submitted while it runs joins the batch and finishes first (continuous
    batching across calls); both sample exactly what `sampler.generate` does for their seeds (temperature 1); a
    cancelled request frees its slot and pages; a request the pool can never hold ends alone with "error"."""
    config, params = _model("qwen3")
    ec = EngineConfig(slots=2, page_size=4, num_pages=16, max_pages_per_seq=16, prefill_chunk=8, prefill_rows=2,
                      decode_steps=2)  # 15 usable pages: a (7) + c (7) fit together, a 62-token request (16) never
    eng = RolloutEngine(config, params, ec)
    rng = np.random.RandomState(5)
    pa, pb, pc = ([int(t) for t in rng.randint(0, 97, size=n)] for n in (7, 5, 6))
    seen = []
    a = eng.submit(pa, max_tokens=20, temperature=1.0, seed=11, on_token=lambda r, t, lp: seen.append((t, r.finish)))
    assert eng.step() and not a.done and len(seen) == 1 + ec.decode_steps  # prefill's token + one burst
    assert seen[-1][1] is None
    b = eng.submit(pb, max_tokens=3, temperature=1.0, seed=12)
    while not b.done:
        eng.step()
    assert not a.done and len(a.out) < 20  # b joined the running batch and left before a
    c = eng.submit(pc, max_tokens=20, temperature=1.0, seed=13)
    eng.step()
    assert len(c.out) > 0 and not c.done
    eng.cancel(c)
    eng.step()
    assert c.finish == "cancelled" and c.slot >= 0 and eng._slots[c.slot] is None  # noqa: SLF001
    huge = eng.submit(list(range(60)), max_tokens=2)  # waits for a, then cannot fit an empty pool
    eng.run_until_idle()
    assert huge.finish == "error" and "EngineConfig.num_pages" in huge.error and a.finish == "length"
    assert seen[-1] == (a.out[-1], "length") and [t for t, _ in seen] == a.out
    for r, p, s in ((a, pa, 11), (b, pb, 12)):
        ref = sampler.generate(config, params, [p], max_new_tokens=r.max_new, temperature=1.0, seed=[s], buckets=BK)[0]
        assert r.out == ref.tokens
        np.testing.assert_allclose(r.lps, ref.logprobs, atol=3e-5)
    assert eng.pages_in_use() == 0 and not eng.pool.dialogues and not eng.has_work()


def test_a_failed_program_call_rebuilds_the_pool_and_the_next_request_succeeds(monkeypatch):
    """An injected fault: the decode program deletes its donated pool and raises (what a run-time OOM leaves).
    The requests it held end with "error", the engine rebuilds a fresh pool (every page free, no dialogue
    cached), and the next requests sample exactly what `sampler.generate` does. If the rebuild fails too, the
    engine is `broken` and refuses work with EngineError until a later submit rebuilds it."""
    from mimesis_jax.inference import engine_programs

    config, params = _model("qwen3")
    ec = EngineConfig(slots=2, page_size=4, num_pages=16, max_pages_per_seq=16, prefill_chunk=8, prefill_rows=2,
                      decode_steps=2)
    eng = RolloutEngine(config, params, ec)
    rng = np.random.RandomState(7)
    pa, pb, pc = ([int(t) for t in rng.randint(0, 97, size=n)] for n in (7, 5, 6))
    eng.generate_tokens([pa], keys=["idle"], max_tokens=3, temperature=0.0)  # a cached dialogue in the pool
    real, faults = engine_programs.decode_program, {"left": 1}

    def faulty(*args, **kwargs):
        if faults["left"]:
            faults["left"] -= 1
            for x in jax.tree.leaves(args[5]):  # the donated cache is gone, then the call fails
                x.delete()
            raise RuntimeError("injected: RESOURCE_EXHAUSTED while decoding")
        return real(*args, **kwargs)
    monkeypatch.setattr(engine_programs, "decode_program", faulty)
    told = []
    a = eng.submit(pa + [3], max_tokens=8, temperature=1.0, seed=1,
                   on_token=lambda r, t, lp: told.append((t, r.finish)))
    b = eng.submit(pb, max_tokens=8, temperature=1.0, seed=2)
    with pytest.raises(RuntimeError, match="injected"):
        eng.run_until_idle()
    assert a.finish == b.finish == "error" and "injected" in a.error and told[-1] == (None, "error")
    assert eng.stats["rebuilds"] == 1 and eng.broken is None and not eng._cache_lost()  # noqa: SLF001
    assert eng.pages_in_use() == 0 and not eng.pool.dialogues and not eng.has_work()
    c = eng.submit(pc, max_tokens=6, temperature=1.0, seed=13)
    eng.run_until_idle()
    out = eng.generate_tokens([pa, pb], keys=["idle", "b"], max_tokens=5, temperature=1.0, seed=[21, 22])
    for got, p, n, s in ((c.sample(), pc, 6, 13), (out[0], pa, 5, 21), (out[1], pb, 5, 22)):
        ref = sampler.generate(config, params, [p], max_new_tokens=n, temperature=1.0, seed=[s], buckets=BK)[0]
        assert got.tokens == ref.tokens
        np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=3e-5)
    # the rebuild fails as well (the memory is still taken): broken, refusing work, until a rebuild succeeds
    faults["left"] = 1
    new_pools = eng._new_pools  # noqa: SLF001

    def no_memory():
        raise RuntimeError("injected: no memory for a new pool")
    monkeypatch.setattr(eng, "_new_pools", no_memory)
    d = eng.submit(pc, max_tokens=6, temperature=1.0, seed=13)
    with pytest.raises(RuntimeError, match="injected"):
        eng.run_until_idle()
    assert d.finish == "error" and "could not rebuild" in eng.broken
    with pytest.raises(EngineError, match="could not rebuild"):
        eng.submit(pc, max_tokens=2)
    with pytest.raises(EngineError, match="could not rebuild"):
        eng.generate_tokens([pc], max_tokens=2)
    monkeypatch.setattr(eng, "_new_pools", new_pools)
    again = eng.generate_tokens([pc], max_tokens=6, temperature=1.0, seed=[13])[0]  # rebuilt on submission
    assert eng.broken is None and again.tokens == c.out and eng.stats["rebuilds"] == 2


def test_paged_decode_attention_matches_numpy_formula():
    """paged_decode_attention and paged_attention against softmax(q.k / sqrt(d)) v written out per row in
    NumPy over the row's keys in page-table order (GQA: head h reads KV head h // 2)."""
    rng = np.random.RandomState(4)
    KVH, H, N, P, Dh, B = 2, 4, 10, 4, 8, 3
    kp = rng.randn(KVH, N, P, Dh).astype(np.float32)
    vp = rng.randn(KVH, N, P, Dh).astype(np.float32)
    table = np.array([[3, 7, 1, 0], [2, 0, 0, 0], [9, 8, 6, 5]], np.int32)
    lengths = np.array([10, 3, 16], np.int32)
    q = rng.randn(B, H, Dh).astype(np.float32)

    def ref_row(qb, b, L):
        keys = np.concatenate([kp[:, p] for p in table[b]], axis=1)[:, :L]  # [KVH, L, Dh]
        vals = np.concatenate([vp[:, p] for p in table[b]], axis=1)[:, :L]
        out = np.zeros((H, Dh), np.float32)
        for h in range(H):
            s = keys[h // 2] @ qb[h] / np.sqrt(Dh)
            w = np.exp(s - s.max())
            out[h] = (w / w.sum()) @ vals[h // 2]
        return out

    got = np.asarray(paged_cache.paged_decode_attention(q, kp, vp, table, lengths))
    for b in range(B):
        np.testing.assert_allclose(got[b], ref_row(q[b], b, lengths[b]), atol=1e-5)
    T = 3
    qs = rng.randn(B, T, H, Dh).astype(np.float32)
    starts = lengths - T
    got = np.asarray(paged_cache.paged_attention(qs, kp, vp, table, starts))
    for b in range(B):
        for t in range(T):
            np.testing.assert_allclose(got[b, t], ref_row(qs[b, t], b, starts[b] + t + 1), atol=1e-5)


@pytest.mark.slow
def test_episode_runner_with_engine_agent_and_simulator_matches_local_models():
    """run_episodes with LocalChatModel over the engine for the agent (Qwen3) and the simulator (Qwen3.5) records
    the same trajectories as over the static sampler (per-turn sampler.generate), and frees every dialogue at the
    end."""
    from mimesis_jax.data.tokenizer import load_tokenizer
    from mimesis_jax.chat.local import LocalChatModel
    from mimesis_jax.episodes.agent import EpisodeConfig, run_episodes
    from test_episode import ChattyEnv, _task

    tok = load_tokenizer("tiny")
    acfg = ModelConfig(**{**QWEN3, "vocab_size": tok.vocab_size})
    ucfg = ModelConfig(**{**QWEN3_5, "vocab_size": tok.vocab_size})
    ap, up = models.init_params(acfg, jax.random.key(0)), models.init_params(ucfg, jax.random.key(2))
    ec = EngineConfig(slots=2, page_size=32, num_pages=80, max_pages_per_seq=32, prefill_chunk=64, prefill_rows=2,
                      decode_steps=8, num_states=6)

    def tasks():
        ts = [_task(), _task(secret="cherry")]
        for t in ts:
            t.env = ChattyEnv(t.env.secret, hint="fruit")
        for i, t in enumerate(ts):
            t.rollout_id = 100 + i
        return ts

    cfg = EpisodeConfig(max_turns=2, agent_max_tokens=6, user_max_tokens=6, seed=3, user_thinking=False)
    kw = dict(max_tokens=6, temperature=1.0)
    ref = run_episodes(LocalChatModel(acfg, ap, tok), LocalChatModel(ucfg, up, tok, generation_role="user", **kw),
                       tasks(), cfg)
    agent = LocalChatModel(acfg, ap, tok, engine_config=ec)
    user = LocalChatModel(ucfg, up, tok, engine_config=ec, generation_role="user", **kw)
    got = run_episodes(agent, user, tasks(), cfg)
    for a, b in zip(got, ref):
        assert [s.tokens for s in a.segments] == [s.tokens for s in b.segments]
        for sa, sb in zip(a.segments, b.segments):
            if sa.kind == "agent":
                np.testing.assert_allclose(sa.logprobs, sb.logprobs, atol=3e-5)
    assert agent.generator.engine.stats["reused_tokens"] > 0
    assert agent.generator.engine.pages_in_use() == 0 and user.generator.engine.pages_in_use() == 0
