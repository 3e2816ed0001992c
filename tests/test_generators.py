"""The generation protocol (inference/protocol.py) and its two generators (inference/generators.py), against
independent references: `sampler.generate` called directly with the seeds the protocol's rule derives (NumPy's
SeedSequence of (generator seed, call count, index)), the same call after a weight change, and the engine's own
bookkeeping (pages freed by `release`, dropped by `set_params`)."""

import functools
import threading

import jax
import numpy as np
import pytest

from mimesis_jax import models
from mimesis_jax.chat.batching import BatchingEngine
from mimesis_jax.chat.local import LocalChatModel
from mimesis_jax.chat.stream import SamplingParams
from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.inference import sampler
from mimesis_jax.inference.engine import EngineConfig
from mimesis_jax.inference.generators import EngineGenerator, StaticGenerator
from mimesis_jax.inference.protocol import Generator, Sample, Sampling
from mimesis_jax.models.config import ModelConfig
from test_sampler import QWEN3  # noqa: E402  (the sampler tests' tiny model)

EC = EngineConfig(slots=2, page_size=4, num_pages=64, max_pages_per_seq=16, prefill_chunk=8, prefill_rows=2,
                  decode_steps=4, num_states=8)
STOPS = (1, 2)


@functools.lru_cache(maxsize=None)
def _model():
    config = ModelConfig(**QWEN3)
    return config, models.init_params(config, jax.random.key(1)), models.init_params(config, jax.random.key(2))


def _prompts(config, rng):
    return [list(rng.randint(3, config.vocab_size, size=n)) for n in (5, 9, 3)]


def _seed_of(seed, call, i):  # the protocol's rule, written out with NumPy
    return int(np.random.SeedSequence([seed, call, i]).generate_state(1)[0])


def _reference(config, params, prompts, reqs):
    return sampler.generate(config, params, prompts, stop_ids=STOPS, seed=[r.seed for r in reqs],
                            max_new_tokens=[r.max_tokens for r in reqs], temperature=[r.temperature for r in reqs],
                            top_p=[r.top_p for r in reqs], top_k=[r.top_k for r in reqs])


def _same(got, want):
    assert [s.tokens for s in got] == [s.tokens for s in want]
    np.testing.assert_allclose(np.concatenate([s.logprobs for s in got]), np.concatenate([s.logprobs for s in want]),
                               atol=1e-5)


@pytest.mark.parametrize("kind", ["static", "engine"])
def test_a_generator_samples_as_the_sampler_with_its_derived_seeds_and_follows_set_params(kind):
    config, p1, p2 = _model()
    rng = np.random.RandomState(0)
    prompts = _prompts(config, rng)
    gen = (StaticGenerator(config, p1, stop_ids=STOPS, seed=5, version=3) if kind == "static"
           else EngineGenerator(config, p1, EC, stop_ids=STOPS, seed=5, version=3))
    assert isinstance(gen, Generator)
    reqs = [Sampling(max_tokens=6, temperature=1.0), Sampling(max_tokens=4, temperature=0.0),
            Sampling(max_tokens=6, temperature=0.7, top_k=5, seed=99)]
    got = gen.generate(prompts, reqs)  # call 0: unseeded requests get _seed_of(5, 0, i)
    want = _reference(config, p1, prompts, [Sampling(6, 1.0, seed=_seed_of(5, 0, 0)),
                                            Sampling(4, 0.0, seed=_seed_of(5, 0, 1)), reqs[2]])
    _same(got, want)
    assert [s.version for s in got] == [3, 3, 3] and [s.prompt_len for s in got] == [5, 9, 3]
    again = gen.generate(prompts[:1], reqs[0])  # call 1: a fresh draw
    _same(again, _reference(config, p1, prompts[:1], [Sampling(6, 1.0, seed=_seed_of(5, 1, 0))]))

    gen.set_params(p2, version=4)  # new weights: the next samples are the new policy's
    fixed = [Sampling(max_tokens=6, temperature=1.0, seed=7)] * 3
    after = gen.generate(prompts, fixed)
    _same(after, _reference(config, p2, prompts, fixed))
    assert [s.version for s in after] == [4, 4, 4]
    assert [s.tokens for s in after] != [s.tokens for s in _reference(config, p1, prompts, fixed)]


def test_the_engine_generator_keeps_keyed_dialogues_until_released_or_new_weights():
    config, p1, p2 = _model()
    rng = np.random.RandomState(1)
    prompts = _prompts(config, rng)
    gen = EngineGenerator(config, p1, EC, stop_ids=STOPS)
    keys = [("agent", 0), ("agent", 1), ("agent", 2)]
    first = gen.generate(prompts, Sampling(max_tokens=4, temperature=0.0), keys=keys)
    eng = gen.engine
    assert set(eng.pool.dialogues) == set(keys)
    longer = [p + s.tokens + [7, 8] for p, s in zip(prompts, first)]
    second = gen.generate(longer, Sampling(max_tokens=4, temperature=0.0), keys=keys)
    # the second turn prefilled only what the first left uncached: the prompts grew by the samples and 2 tokens
    assert eng.stats["reused_tokens"] == sum(len(p) + len(s.tokens) - 1 for p, s in zip(prompts, first))
    _same(second, _reference(config, p1, longer, [Sampling(4, 0.0, seed=_seed_of(0, 1, i)) for i in range(3)]))
    gen.release(keys[:2])
    assert set(eng.pool.dialogues) == {keys[2]}
    gen.release([("never", "seen")])  # nothing happens for a key the generator never saw
    gen.set_params(p2, version=1)  # the cached keys/values were the old weights'
    assert not eng.pool.dialogues and eng.pages_in_use() == 0


def test_sampling_must_be_one_or_one_per_request():
    config, p1, _ = _model()
    gen = StaticGenerator(config, p1, stop_ids=STOPS)
    with pytest.raises(ValueError, match=r"one Sampling or one per request \(2\)"):
        gen.generate([[3, 4], [5, 6]], [Sampling()])
    with pytest.raises(ValueError, match=r"one Sampling or one per request"):
        gen.generate([[3, 4]], [{"max_tokens": 4}])


def test_a_chat_model_over_a_given_generator_passes_keys_and_follows_its_weights():
    """LocalChatModel over a generator built elsewhere (the learner's policy): its chat turns go through that
    generator with their dialogue keys, and `set_params` on the model reaches it."""
    tok = load_tokenizer("tiny")
    config = ModelConfig(**{**QWEN3, "vocab_size": -(-tok.vocab_size // 64) * 64})
    p1, p2 = models.init_params(config, jax.random.key(1)), models.init_params(config, jax.random.key(2))
    gen = EngineGenerator(config, p1, EC, stop_ids=(tok.im_end_id, tok.eos_id))
    model = LocalChatModel(config, None, tok, generator=gen, max_tokens=4, temperature=0.0)
    conv = [{"role": "user", "content": "hello there"}]
    r = model.chat_batch([conv], keys=["d"])[0]
    assert gen.engine.pool.dialogues.keys() == {"d"}
    want = sampler.generate(config, p1, [model.render(conv)], stop_ids=model.stop_ids, max_new_tokens=4,
                            temperature=0.0, seed=0)[0]
    assert r.token_ids == want.tokens
    model.set_params(p2, version=2)
    assert model.version == 2 and model.params is gen.params and not gen.engine.pool.dialogues
    model.release(["d"])  # released after new weights: nothing left, nothing fails


def test_the_engine_generator_derives_its_seeds_under_the_engines_lock(monkeypatch):
    """One lock: the call counter and seeds move under RolloutEngine.lock, the lock every engine call (and the
    server's submissions) takes, not under a second lock of the generator's own."""
    config, p1, _ = _model()
    gen = EngineGenerator(config, p1, EC, stop_ids=STOPS)
    lock, held, columns = gen.engine.lock, [], gen._columns

    def taken_elsewhere():  # from another thread: is the engine's lock held (by the generating thread)?
        free = lock.acquire(blocking=False)
        if free:
            lock.release()
        held.append(not free)

    def watched(sampling, n):
        t = threading.Thread(target=taken_elsewhere)
        t.start()
        t.join()
        return columns(sampling, n)
    monkeypatch.setattr(gen, "_columns", watched)
    monkeypatch.setattr(gen.engine, "generate_tokens",
                        lambda prompts, **kw: [Sample([1], [0.0], "stop", len(p)) for p in prompts])
    gen.generate([[3, 4], [5]], Sampling(max_tokens=2))
    assert held == [True]


def test_batched_requests_sample_with_the_protocols_seeds_on_the_models_call_counter(monkeypatch):
    """The BatchingEngine derives no seeds of its own: an unseeded request in a batch samples with the protocol's
    rule (generator seed, call count, row), on the same call counter as the model's direct calls; a seeded one
    keeps its seed. The sampler is replaced by a recorder (no program is compiled)."""
    config, p1, _ = _model()
    calls = []

    def recorder(config, params, prompts, *, seed, **kw):
        calls.append((list(prompts), list(seed)))
        return [Sample([1], [0.0], "stop", len(p)) for p in prompts]
    monkeypatch.setattr(sampler, "generate", recorder)
    tok = type("Tok", (), {"im_end_id": 1, "eos_id": 2})()
    model = LocalChatModel(config, p1, tok, seed=5)
    batcher = BatchingEngine(model, max_batch=3, batch_wait_ms=60_000)  # the batch closes at its 3rd request
    try:
        asks = {3: SamplingParams(max_tokens=2), 4: SamplingParams(max_tokens=2, seed=42),
                5: SamplingParams(max_tokens=2)}
        threads = [threading.Thread(target=batcher.submit, args=([t], asks[t])) for t in asks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        batcher.close()
    model.generate([[6]], model.sampling())  # a direct call after the batch: the generator's call 1
    assert len(calls) == 2
    (prompts, seeds), direct = calls
    assert sorted(p[0] for p in prompts) == [3, 4, 5]
    assert seeds == [42 if p == [4] else _seed_of(5, 0, i) for i, p in enumerate(prompts)]
    assert direct == ([[6]], [_seed_of(5, 1, 0)])
