"""The rollout engine's admission control (inference/page_pool.py): a request that cannot get its pages while
requests run on its replica waits for them instead of evicting, so a turn loop whose dialogues fit the pool evicts
nothing, however its requests are interleaved; a pool that cannot hold the step's dialogues evicts, and every
eviction is counted. On 4 data-parallel replicas (8 fake devices, data=4 x tensor=2) each replica admits its own
dialogues against its own pages.

The pools are sized from an unbounded reference engine's run of the same calls (greedy, the same stops): the
dialogues' pages at the end of each turn plus one request's headroom (its reservation less what it kept). The
reference's peak (every request of a turn reserved at once) is above that, so requests had to wait."""

import functools
import math

import jax
import numpy as np

from mimesis_jax import models, sharding
from mimesis_jax.config import tiny_qwen3
from mimesis_jax.inference.engine import EngineConfig, RolloutEngine

PS, NEW, TURNS = 4, 12, 2
STOPS = list(range(512))  # greedy rows stop at their first token below 512: replies of 1 and of NEW tokens


@functools.lru_cache(maxsize=None)
def _model():
    config = tiny_qwen3()
    return config, models.init_params(config, jax.random.key(1))


def _ec(slots, num_pages):
    return EngineConfig(slots=slots, page_size=PS, num_pages=num_pages, max_pages_per_seq=16, prefill_chunk=16,
                        prefill_rows=2, decode_steps=4)


def _loop(eng, n, new=NEW, stops=STOPS):
    """TURNS turns of n dialogues (keys 0..n-1); each turn's prompt extends the last one's with its reply and 3
    new tokens. Returns (prompts, samples) per turn."""
    rng = np.random.RandomState(5)
    ctx = [list(rng.randint(1, 1024, size=5 + i % 4)) for i in range(n)]
    turns = []
    for _ in range(TURNS):
        out = eng.generate_tokens(ctx, keys=list(range(n)), max_tokens=new, temperature=0.0, stop_ids=stops)
        turns.append((ctx, out))
        ctx = [c + s.tokens + [1, 2, 3] for c, s in zip(ctx, out)]
    return turns


def _pages(tokens):
    return math.ceil(tokens / PS)


def _capacity(turns, dialogues):
    """Pages the pool needs for `dialogues` (indices) without an eviction: per turn, their pages when the turn
    ends plus the largest headroom one request reserves beyond what it keeps (see the module docstring)."""
    need = 0
    for prompts, out in turns:
        kept = {i: _pages(len(prompts[i]) + len(out[i].tokens) - 1) for i in dialogues}
        slack = max(_pages(len(prompts[i]) + NEW - 1) - kept[i] for i in dialogues)
        need = max(need, sum(kept.values()) + slack)
    return need


def _same_tokens(turns, ref):
    for (_, a), (_, b) in zip(turns, ref):
        assert [s.tokens for s in a] == [s.tokens for s in b]
        assert [s.finish_reason for s in a] == [s.finish_reason for s in b]


def test_requests_wait_for_running_ones_instead_of_evicting():
    config, params = _model()
    n = 6
    ref_eng = RolloutEngine(config, params, _ec(n, 1 + n * 16))  # every dialogue at its longest: no contention
    ref = _loop(ref_eng, n)
    cap = _capacity(ref, range(n))
    assert ref_eng.stats["pages_peak"] > cap  # all of a turn's reservations at once do not fit in `cap`
    eng = RolloutEngine(config, params, _ec(n, 1 + cap))
    got = _loop(eng, n)
    _same_tokens(got, ref)
    assert eng.stats["evictions"] == 0 and eng.stats["recomputed"] == 0
    reused = sum(len(p) + len(s.tokens) - 1 for p, s in zip(*ref[0]))
    assert eng.stats["reused_tokens"] == ref_eng.stats["reused_tokens"] == reused
    assert eng.stats["pages_peak"] <= cap


def test_a_pool_short_of_the_steps_dialogues_evicts_and_counts_it():
    """By hand: 3 dialogues of 4-token prompts, 4 new tokens each (no stop), one slot, 5 usable pages of 4
    tokens. Turn 1: a and b keep 2 pages each (7 tokens fed); c needs 2 with 1 free and nothing running: a
    (least recently used) is evicted. Turn 2 (10-token prompts, 13 positions = 4 pages): a returns evicted and
    needs 4 with 1 free: b, then c are evicted; b needs 4: a is evicted; c needs 4: b is evicted. 1 + 4
    evictions, no prefix reused."""
    config, params = _model()
    eng = RolloutEngine(config, params, _ec(1, 6))
    rng = np.random.RandomState(2)
    ctx = [list(rng.randint(1, 1024, size=4)) for _ in range(3)]
    first = eng.generate_tokens(ctx, keys="abc", max_tokens=4, temperature=0.0, stop_ids=[])
    assert eng.stats["evictions"] == 1 and list(eng.pool.dialogues) == ["b", "c"]
    ctx = [c + s.tokens + [1, 2] for c, s in zip(ctx, first)]
    second = eng.generate_tokens(ctx, keys="abc", max_tokens=4, temperature=0.0, stop_ids=[])
    assert eng.stats["evictions"] == 5 and eng.stats["reused_tokens"] == 0
    assert list(eng.pool.dialogues) == ["c"] and eng.pool.dialogues["c"].pages == [1, 2, 3, 4]
    assert eng.pool.home == {"a": 0, "b": 0, "c": 0}  # evicted dialogues keep their replica until released
    eng.release_all()
    assert eng.pool.home == {} and eng.pages_in_use() == 0
    ref = RolloutEngine(config, params, _ec(1, 64))  # the same calls with room for everything
    ref_first = ref.generate_tokens([c[:4] for c in ctx], keys="abc", max_tokens=4, temperature=0.0, stop_ids=[])
    ref_second = ref.generate_tokens(ctx, keys="abc", max_tokens=4, temperature=0.0, stop_ids=[])
    assert [s.tokens for s in first + second] == [s.tokens for s in ref_first + ref_second]
    assert ref.stats["evictions"] == 0 and ref.stats["reused_tokens"] == 3 * 7


def test_each_replica_admits_its_own_dialogues_against_its_own_pages():
    """8 dialogues on 4 replicas (data=4 x tensor=2): two per replica, in order of arrival; each replica's pool
    holds its two dialogues with one request's headroom (not both requests at once), so requests wait, nothing is
    evicted, and the tokens are the one-device unbounded engine's."""
    config, params = _model()
    n, replicas = 8, 4
    ref_eng = RolloutEngine(config, params, _ec(n, 1 + n * 16))
    ref = _loop(ref_eng, n)
    homes = [[i for i in range(n) if i % replicas == k] for k in range(replicas)]
    cap = max(_capacity(ref, h) for h in homes)
    mesh = sharding.make_mesh({"data": replicas, "tensor": 2})
    eng = RolloutEngine(config, params, _ec(2, 1 + cap), mesh=mesh)
    got = _loop(eng, n)
    assert [eng.pool.dialogues[i].replica for i in range(n)] == [i % replicas for i in range(n)]
    _same_tokens(got, ref)
    assert eng.stats["evictions"] == 0 and eng.stats["recomputed"] == 0
    assert eng.stats["reused_tokens"] == ref_eng.stats["reused_tokens"]
    # the same dialogues on one replica of the same pages would not fit: the capacity is per replica
    assert _capacity(ref, range(n)) > cap


def test_precompile_compiles_every_program_on_the_first_call_and_none_after():
    """EngineConfig.precompile (the RL loops' engines): the first generate_tokens call compiles the prefill
    program for every page-table width x prefill row count and the decode burst for every width -- here widths
    8 and 16 (max_pages_per_seq 16), row counts 1 and 2: 4 + 2 programs -- so a later call with other shapes
    compiles nothing; the tokens are those of an engine that compiles as it goes. (A prefill chunk and burst
    length no other test here uses, so no program is already in jax's cache.)"""
    from mimesis_jax.profiling import count_compilations

    config, params = _model()
    ec = dict(slots=2, page_size=PS, num_pages=64, max_pages_per_seq=16, prefill_chunk=8, prefill_rows=2,
              decode_steps=3)
    eng = RolloutEngine(config, params, EngineConfig(**ec, precompile=True))
    lazy = RolloutEngine(config, params, EngineConfig(**ec))
    rng = np.random.RandomState(4)
    short, long = [list(rng.randint(1, 1024, size=3))], [list(rng.randint(1, 1024, size=40)) for _ in range(3)]
    with count_compilations() as first:
        a = eng.generate_tokens(short, keys=["s"], max_tokens=4, temperature=0.0)
    assert (first.count_of("prefill_program"), first.count_of("decode_program")) == (4, 2)
    with count_compilations() as later:
        b = eng.generate_tokens(long, keys=["x", "y", "z"], max_tokens=20, temperature=0.0)
    assert later.count == 0
    ref = lazy.generate_tokens(short, keys=["s"], max_tokens=4, temperature=0.0) + lazy.generate_tokens(
        long, keys=["x", "y", "z"], max_tokens=20, temperature=0.0)
    assert [s.tokens for s in a + b] == [s.tokens for s in ref]
