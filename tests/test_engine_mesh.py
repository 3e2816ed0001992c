"""The rollout engine on a mesh (RolloutEngine(mesh=...), docs/engine.md "On a mesh") on 8 fake CPU devices,
data=4 x tensor=2 (4 data-parallel replicas) and data=2 x fsdp=2 x tensor=2 (4 replicas over two batch axes, the
weights' embed split over fsdp as the learner holds them): the tiny Qwen3 and Qwen3.5 draw the one-device
engine's tokens (greedy and seeded temperature-1 rows, two turns of three dialogues, the second turn reusing each
prefix), each dialogue on its own replica with that replica's (local) pages; every device holds exactly its
replica's block of the pool and state slots, half of its heads (so as many bytes as half the one-device pool),
and half of each attention weight; the compiled decode burst's donated pool is aliased to its output."""

import dataclasses
import functools

import jax
import numpy as np
import pytest

from mimesis_jax import models, sharding
from mimesis_jax.config import tiny_qwen3, tiny_qwen3_5
from mimesis_jax.inference import engine_programs
from mimesis_jax.inference.engine import EngineConfig, RolloutEngine

# one page-table width (8) and one prefill row count (1): two programs per engine
EC = EngineConfig(slots=2, page_size=4, num_pages=32, max_pages_per_seq=8, prefill_chunk=8, prefill_rows=1,
                  decode_steps=4, num_states=6)
TENSOR = 2
# tiny_qwen3_5 cut to one linear + one full layer (the engine's programs run layers unrolled: compile time
# follows the layer count; one of each is the structure under test)
CONFIGS = {"qwen3": tiny_qwen3,
           "qwen3_5": lambda: tiny_qwen3_5().replace(num_hidden_layers=2,
                                                     layer_types=("linear_attention", "full_attention"))}


@functools.lru_cache(maxsize=None)
def _model(name):
    config = CONFIGS[name]()
    return config, models.init_params(config, jax.random.key(1))


MESHES = {"data4": {"data": 4, "tensor": TENSOR}, "data2_fsdp2": {"data": 2, "fsdp": 2, "tensor": TENSOR}}
REPLICAS = 4  # data x fsdp on both meshes


def _mesh(name="data4"):
    return sharding.make_mesh(MESHES[name])


def _turns(eng, vocab):
    """Two turns of three dialogues (greedy, and two seeded temperature-1 rows); the second turn's prompts extend
    the first's, so only their suffixes are prefilled."""
    rng = np.random.RandomState(0)
    ctx = [list(rng.randint(0, vocab, size=n)) for n in (5, 9, 3)]
    out = []
    for turn in range(2):
        samples = eng.generate_tokens(ctx, keys="abc", max_tokens=[5, 3, 6], temperature=[0.0, 1.0, 1.0],
                                      seed=[7 + turn, 8 + turn, 9 + turn])
        out.append(samples)
        ctx = [c + s.tokens + list(rng.randint(0, vocab, size=3)) for c, s in zip(ctx, samples)]
    return out


@pytest.mark.parametrize("name,mesh", [("qwen3", "data4"), ("qwen3_5", "data4"), ("qwen3_5", "data2_fsdp2")])
def test_mesh_engine_draws_the_one_device_engines_tokens(name, mesh):
    config, params = _model(name)
    ref_eng, mesh_eng = RolloutEngine(config, params, EC), RolloutEngine(config, params, EC, mesh=_mesh(mesh))
    assert (ref_eng.replicas, mesh_eng.replicas, mesh_eng.num_slots) == (1, REPLICAS, REPLICAS * EC.slots)
    ref, got = _turns(ref_eng, config.vocab_size), _turns(mesh_eng, config.vocab_size)
    for ta, tb in zip(ref, got):
        for a, b in zip(ta, tb):
            assert b.tokens == a.tokens and b.finish_reason == a.finish_reason
            # the tensor-parallel sums (heads, MLP, vocab) round differently: fp32 noise only
            np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5)
    assert mesh_eng.stats["reused_tokens"] == ref_eng.stats["reused_tokens"] > 0
    assert mesh_eng.stats["evictions"] == 0 and mesh_eng.stats["recomputed"] == 0
    # one dialogue per replica (the fewest assigned first), each holding local page ids of its own block: alone
    # there, it got the block's pages 1, 2, .. in order (page 0 is the block's trash page)
    pool = mesh_eng.pool
    assert [pool.dialogues[k].replica for k in "abc"] == [0, 1, 2]
    assert [len(pool.free_by_replica[k]) for k in range(REPLICAS)] == [
        EC.num_pages - 1 - len(pool.dialogues[k].pages) for k in "abc"] + [EC.num_pages - 1]
    for k in "abc":
        assert pool.dialogues[k].pages == list(range(1, len(pool.dialogues[k].pages) + 1))
    # the pool stayed sharded (the programs pin their output cache to the input layout)
    batch = tuple(a for a in ("data", "fsdp") if a in MESHES[mesh])
    for key, x in pool.cache.items():
        assert x.sharding.is_equivalent_to(pool.shardings[key], x.ndim)
        assert x.sharding.spec[HEADS_DIM[key]] == "tensor"
        assert x.sharding.spec[PAGE_DIM[key]] == (batch[0] if len(batch) == 1 else batch)


def _shard_bytes(x):
    sizes = {s.data.nbytes for s in x.addressable_shards}
    assert len(sizes) == 1, sizes
    return sizes.pop()


# which dim of each cache leaf is the heads dim, which the page / state-slot dim (paged_cache.pool_axes)
HEADS_DIM = {"k": 1, "v": 1, "conv": 3, "state": 2}
PAGE_DIM = {"k": 2, "v": 2, "conv": 1, "state": 1}
ATTN = ("q", "k", "v", "o", "q_gate")


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_pool_slots_and_attention_weights_are_split_over_tensor(name):
    config, params = _model(name)
    eng, one = RolloutEngine(config, params, EC, mesh=_mesh()), RolloutEngine(config, params, EC)
    cache = eng.pool.cache
    assert set(cache) == ({"k", "v"} if name == "qwen3" else {"k", "v", "conv", "state"})
    for key, x in cache.items():
        # REPLICAS blocks of the one-device pool's pages / slots, each device holding its block's half
        ref = one.pool.cache[key]
        shape = list(ref.shape)
        shape[PAGE_DIM[key]] *= REPLICAS
        assert x.shape == tuple(shape)
        assert len(x.addressable_shards) == 8
        assert _shard_bytes(x) * TENSOR == ref.nbytes
        shape = list(ref.shape)
        shape[HEADS_DIM[key]] //= TENSOR
        assert {s.data.shape for s in x.addressable_shards} == {tuple(shape)}
    layers = eng.params["layers" if name == "qwen3" else "full_layers"]["attn"]
    leaves = {k: v for k, v in layers.items() if k in ATTN}
    assert len(leaves) == 4
    for k, w in leaves.items():
        assert _shard_bytes(w) * TENSOR == w.nbytes, k
    if name == "qwen3_5":  # the linear layers' head-split weights too
        mixer = eng.params["linear_layers"]["mixer"]
        for k in ("qkv", "z", "out"):
            assert _shard_bytes(mixer[k]) * TENSOR == mixer[k].nbytes, k


def _decode_memory(eng):
    with eng._on_mesh():  # noqa: SLF001
        args = eng.decode_args(EC.max_pages_per_seq)
        return engine_programs.decode_program.lower(*args).compile().memory_analysis(), args


def _per_device_bytes(tree):
    """Bytes one device holds of every array argument: its shard of a jax.Array, the whole of a NumPy one."""
    return sum(_shard_bytes(x) if isinstance(x, jax.Array) else np.asarray(x).nbytes
               for x in jax.tree.leaves(tree))


def test_decode_burst_memory_per_device_follows_the_shards():
    config, params = _model("qwen3_5")
    ref, sharded = RolloutEngine(config, params, EC), RolloutEngine(config, params, EC, mesh=_mesh())
    (m0, _), (m1, a1) = _decode_memory(ref), _decode_memory(sharded)
    pool0, pool1 = _per_device_bytes(ref.pool.cache), _per_device_bytes(sharded.pool.cache)
    params0, params1 = _per_device_bytes(ref.params), _per_device_bytes(sharded.params)
    assert pool1 * TENSOR == pool0
    # a device's arguments shrink by exactly what it no longer holds of the params and the pool (the other
    # inputs are the same small replicated NumPy arrays; jit drops the unused ones alike in both)
    assert m0.argument_size_in_bytes - m1.argument_size_in_bytes == (params0 - params1) + (pool0 - pool1)
    assert m1.argument_size_in_bytes <= _per_device_bytes(a1[4:])
    # the donated pool is the output's pool, on every device
    assert (m0.alias_size_in_bytes, m1.alias_size_in_bytes) == (pool0, pool1)
    # what is not split: norms, biases, gates' per-head scalars replicated on tensor, and the NumPy inputs
    assert 0.5 < params1 / params0 < 0.52
    # the burst's working copy and activations follow the heads: within 5% of half the one-device temp bytes
    # (measured 38,352 / 72,064 = 0.532: the replicated per-row sampling buffers)
    assert abs(m1.temp_size_in_bytes / m0.temp_size_in_bytes - 1 / TENSOR) < 0.05
    total0 = m0.argument_size_in_bytes + m0.temp_size_in_bytes + m0.output_size_in_bytes - m0.alias_size_in_bytes
    total1 = m1.argument_size_in_bytes + m1.temp_size_in_bytes + m1.output_size_in_bytes - m1.alias_size_in_bytes
    assert abs(total1 / total0 - 1 / TENSOR) < 0.03


STOP = 96  # a stop id the tiny models' prompts below hold only where a test puts it


def _rollback_turns(eng, vocab):
    """Two turns of two dialogues (a: greedy, b: seeded temperature 1) whose second prompt extends the first
    PROMPT but not prompt + reply (as a chat template that re-renders the generation header does). a's first
    prompt holds no stop id (its snapshot is at the prompt's end, 8 tokens); b's holds one at index 7 (EngineConfig
    checkpoint "turn": its snapshot is after it, 8 tokens, and the 4 header tokens after it are re-rendered)."""
    rng = np.random.RandomState(3)
    a1 = list(rng.randint(0, STOP, size=8))
    b1 = list(rng.randint(0, STOP, size=7)) + [STOP] + list(rng.randint(0, STOP, size=4))
    kw = dict(keys="ab", temperature=[0.0, 1.0], stop_ids=[STOP])
    first = eng.generate_tokens([a1, b1], max_tokens=[5, 6], seed=[5, 6], **kw)
    a2 = a1 + list(rng.randint(0, STOP, size=11))
    b2 = b1[:8] + list(rng.randint(0, STOP, size=6))
    return first, eng.generate_tokens([a2, b2], max_tokens=[6, 4], seed=[7, 8], **kw), (a2, b2)


def test_a_qwen3_5_dialogue_resumes_from_its_snapshot_with_the_fresh_prefills_tokens():
    """Issue #43 item 4 (inference/page_pool.py, rollback): on 4 replicas x tensor 2, each dialogue's second turn
    restores the state snapshot taken in its first prompt and prefills only the rest -- exactly 8 tokens reused
    per dialogue -- and draws the same tokens with the same log-probs (==) as the engine that recomputes the
    prompt from position 0 (checkpoint "off"; the prefill chunks end at the same positions, so the same programs
    see the same numbers). The snapshot copy program compiles once, in the engine's first call."""
    config, params = _model("qwen3_5")
    got, ref = (RolloutEngine(config, params, dataclasses.replace(EC, checkpoint=c, precompile=True),
                              mesh=_mesh()) for c in ("turn", "off"))
    g1, g2, (a2, b2) = _rollback_turns(got, config.vocab_size)
    compiled = engine_programs.copy_state_program._cache_size()  # noqa: SLF001
    r1, r2, _ = _rollback_turns(ref, config.vocab_size)
    for a, b in zip(g1 + g2, r1 + r2):
        assert a.tokens == b.tokens and a.logprobs == b.logprobs and a.finish_reason == b.finish_reason
    assert got.stats["reused_tokens"] == 16 and got.stats["rolled_back"] == 2 and got.stats["recomputed"] == 0
    assert ref.stats["reused_tokens"] == 0 and ref.stats["recomputed"] == 2 and ref.stats["rolled_back"] == 0
    assert got.stats["prefill_tokens"] == ref.stats["prefill_tokens"] - 16
    assert got.stats["evictions"] == ref.stats["evictions"] == 0
    # a's second prompt holds no stop id: a new snapshot at its end; b's last stop is where it resumed: the
    # snapshot stays
    pool = got.pool
    a, b = pool.dialogues["a"], pool.dialogues["b"]
    assert a.snap_tokens == a2 and b.snap_tokens == b2[:8] and b2[7] == STOP
    assert a.snap and b.snap and {a.snap, b.snap}.isdisjoint({a.state, b.state})
    assert engine_programs.copy_state_program._cache_size() == compiled  # noqa: SLF001
