"""The rollout engine sized for the run (inference/engine_sizing.py, `rollout.engine_states` / `engine_memory_gib`):
page and state bytes against the arrays `init_paged_cache` allocates and hand formulas, the paper Stage II
config's pool with and without a budget (arithmetic only), the keys' errors, and a 12-dialogue x 3-turn loop of
the tiny Qwen3.5 on the engine: with derived state slots nothing is evicted and each turn reuses the previous
turn's whole prefix; with today's 4 x slots + 1 slots or a budget that holds fewer dialogues, the LRU evicts
exactly what a cyclic turn loop over more dialogues than slots must."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mimesis_jax import models
from mimesis_jax.config import (AgentRLConfig, RolloutConfig, load_config, qwen3_5_model, qwen3_model, tiny_qwen3,
                                tiny_qwen3_5)
from mimesis_jax.errors import ConfigError
from mimesis_jax.plan.workload import runtime_model
from mimesis_jax.inference.engine import RolloutEngine
from mimesis_jax.inference.engine_sizing import GiB, engine_sizing, page_bytes, state_bytes
from mimesis_jax.train.rl.chat_models import EngineMeter, rollout_engine_config, rollout_sizing

PAPER = "configs/qwen3_8b_agentrl.py:csd"


def _kv_page_bytes(config, page_size, tensor=1):
    """By hand, per device: K and V of `page_size` tokens for every full-attention layer, each KV head's head_dim
    values in the compute dtype, the KV heads split over `tensor` devices."""
    layers = config.layer_types.count("full_attention")
    heads = config.num_key_value_heads // tensor
    return 2 * layers * heads * page_size * config.head_dim * jnp.dtype(config.dtype).itemsize


def _state_slot_bytes(config):
    """By hand: per gated-DeltaNet layer, the causal conv's last kernel-1 inputs (queries and keys of every key
    head, values of every value head; compute dtype) and the fp32 recurrent state [value heads, Dk, Dv]."""
    layers = config.layer_types.count("linear_attention")
    if not layers:
        return 0
    dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
    hk, hv = config.linear_num_key_heads, config.linear_num_value_heads
    conv = (config.linear_conv_kernel_dim - 1) * (2 * hk * dk + hv * dv) * jnp.dtype(config.dtype).itemsize
    return layers * (conv + hv * dk * dv * 4)


def _allocated(config, pages, states, page_size):
    shapes = jax.eval_shape(lambda: models.family(config, "paged").init_paged_cache(config, pages, page_size,
                                                                                   states))
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(shapes))


@pytest.mark.parametrize("name", ["tiny_qwen3", "tiny_qwen3_5", "qwen3_8b", "qwen3_5_9b"])
def test_bytes_are_what_init_paged_cache_allocates(name):
    config = {"tiny_qwen3": tiny_qwen3, "tiny_qwen3_5": tiny_qwen3_5, "qwen3_8b": lambda: qwen3_model("8b"),
              "qwen3_5_9b": lambda: qwen3_5_model("9b")}[name]().replace(dtype="bfloat16")
    pb, sb = page_bytes(config, 16), state_bytes(config)
    assert _allocated(config, 7, 5, 16) == 7 * pb + 5 * sb
    assert (pb, sb) == (_kv_page_bytes(config, 16), _state_slot_bytes(config))
    assert (sb > 0) == ("qwen3_5" in name)  # only Qwen3.5 has recurrent state


def _paper(*sets):
    cfg = load_config(PAPER, ["rollout.engine=true", "rollout.max_batch=0", *sets], kind=(AgentRLConfig,))
    return cfg, runtime_model(cfg)


def test_paper_stage2_pool_fits_its_budget_instead_of_1_3_tb():
    cfg, model = _paper()
    r, D = cfg.rollout, cfg.rollout.prompts_per_step * cfg.rollout.group_size  # every dialogue in flight
    pb = _kv_page_bytes(model, r.engine_page_size)
    per_seq = math.ceil(r.max_context_tokens / r.engine_page_size)  # pages of the longest dialogue
    uncapped = rollout_sizing(dataclasses.replace(r, engine_memory_gib=0.0), model, D)
    assert uncapped.num_pages == D * per_seq + 1 and uncapped.pool_bytes == (D * per_seq + 1) * pb  # + trash page
    budget = int(r.engine_memory_gib * GiB)
    assert 0 < budget < uncapped.pool_bytes  # the config's budget is what caps the pool
    capped = rollout_sizing(r, model, D)  # the config's rollout.engine_memory_gib
    assert capped.num_pages == budget // pb and capped.pool_bytes == (budget // pb) * pb <= budget
    assert rollout_engine_config(r, model, D).num_pages == budget // pb


def test_budget_splits_state_slots_and_pages():
    config = qwen3_5_model("9b").replace(dtype="bfloat16")
    pb, sb = page_bytes(config, 16), state_bytes(config)
    budget = 16 * GiB
    s = engine_sizing(config, dialogues=512, max_context=16384, page_size=16, slots=16, memory_gib=16)
    states = budget // 2 // sb  # the 1,041 slots of 512 dialogues (a state and a snapshot each) need more than half
    assert (s.num_states, s.num_pages) == (states, (budget - states * sb) // pb) and s.pool_bytes <= budget
    fits = engine_sizing(config, dialogues=4, max_context=16384, page_size=16, slots=16, memory_gib=16)
    # under the budget: the uncapped rule
    assert (fits.num_states, fits.num_pages) == (2 * 4 + 16 + 1, 4 * (16384 // 16) + 1)


def test_keys_are_checked():
    for sets, key in ((["rollout.engine_states=-1"], "rollout.engine_states"),
                      (["rollout.engine_states=1"], "rollout.engine_states"),
                      (["rollout.engine_memory_gib=-2.0"], "rollout.engine_memory_gib")):
        with pytest.raises(ConfigError, match=f"'{key}'"):
            _paper(*sets)
    cfg, model = _paper("rollout.engine_memory_gib=0.001")  # 1 MiB: not one 9,344-token dialogue (1.3 GiB)
    with pytest.raises(ConfigError, match="'rollout.engine_memory_gib': 0.001 GiB cannot hold one dialogue"):
        rollout_sizing(cfg.rollout, model, 1024)
    cfg, model = _paper("rollout.engine_pages=100000")
    with pytest.raises(ConfigError, match="'rollout.engine_memory_gib'.*rollout.engine_pages=100000"):
        rollout_sizing(cfg.rollout, model, 1024)


# ---------------------------------------------------------------------------------- the turn loop on the engine
D, TURNS, SLOTS, NEW = 12, 3, 2, 4


def _turn_loop(engine_states=0, memory_gib=0.0):
    """12 dialogues x 3 greedy turns (4 new tokens, then 2 'user' tokens) on the tiny Qwen3.5's engine sized
    by rollout_engine_config; returns (engine config, engine/* per turn, the expected reuse)."""
    config = tiny_qwen3_5()
    r = dataclasses.replace(RolloutConfig(), engine=True, max_batch=0, engine_slots=SLOTS,
                            engine_page_size=16, max_context_tokens=64, engine_states=engine_states,
                            engine_memory_gib=memory_gib)
    ec = dataclasses.replace(rollout_engine_config(r, config, D), prefill_rows=1, prefill_chunk=16,
                             decode_steps=NEW)
    engine = RolloutEngine(config, _params(), ec)
    meter = EngineMeter({"engine": engine})
    rng = np.random.RandomState(0)
    ctx = [list(rng.randint(0, config.vocab_size, size=3 + i % 4)) for i in range(D)]
    recs, reuse = [], []
    for _ in range(TURNS):
        meter.start()
        out = engine.generate_tokens(ctx, keys=list(range(D)), max_tokens=NEW, temperature=0.0)
        recs.append(meter.record())
        reuse.append(sum(len(c) + len(s.tokens) - 1 for c, s in zip(ctx, out)))  # what the next turn may reuse
        ctx = [c + s.tokens + list(rng.randint(0, config.vocab_size, size=2)) for c, s in zip(ctx, out)]
    return ec, recs, reuse


_PARAMS = []


def _params():
    if not _PARAMS:
        _PARAMS.append(models.init_params(tiny_qwen3_5(), jax.random.key(0)))
    return _PARAMS[0]


def test_turn_loop_with_derived_state_slots_reuses_every_prefix():
    ec, recs, reuse = _turn_loop()
    # a state and a snapshot slot per dialogue; 64-token dialogues, 16-token pages
    assert (ec.states, ec.num_pages) == (2 * D + SLOTS + 1, D * (64 // 16) + 1)
    assert [r["engine/evictions"] for r in recs] == [0, 0, 0]
    assert [r["engine/recomputed"] for r in recs] == [0, 0, 0]
    assert [r["engine/reused_tokens"] for r in recs] == [0, reuse[0], reuse[1]]


def _lru_misses(capacity):
    """Evictions of a naive LRU cache of `capacity` over D keys visited in order, TURNS times."""
    cache, evictions = [], 0
    for _ in range(TURNS):
        for k in range(D):
            if k in cache:
                cache.remove(k)
            elif len(cache) == capacity:
                cache.pop(0)
                evictions += 1
            cache.append(k)
    return evictions


@pytest.mark.parametrize("case", ["old default slots", "budget"])
def test_turn_loop_with_fewer_slots_evicts_exactly_the_lru_misses(case):
    cfg = tiny_qwen3_5()
    sb = state_bytes(cfg)
    if case == "old default slots":  # EngineConfig's 4 x slots + 1 before rollout.engine_states
        ec, recs, _ = _turn_loop(engine_states=4 * SLOTS + 1)
    else:  # a budget whose half holds 11 state slots: 10 dialogues at once, pages to spare
        ec, recs, _ = _turn_loop(memory_gib=(23 * sb + 0.5) / GiB)
        assert ec.states == 11 and ec.num_pages == (23 * sb - 11 * sb) // page_bytes(cfg, 16)
    capacity = ec.states - 1
    assert _lru_misses(capacity) == (D - capacity) + (TURNS - 1) * D  # 28 with 8 slots, 26 with 10
    assert sum(r["engine/evictions"] for r in recs) == _lru_misses(capacity)
    assert [r["engine/reused_tokens"] for r in recs] == [0, 0, 0]  # a cyclic loop over more dialogues: LRU thrashes


def test_plan_counts_the_engine_when_the_config_turns_it_on():
    from mimesis_jax.plan import budget, workload
    mesh = {"data": 1, "fsdp": 8, "tensor": 2}
    cfg = workload.load_run_config(PAPER)  # the paper setting: the engine on, no sampler-call cap
    assert (cfg.rollout.engine, cfg.rollout.max_batch, cfg.rollout.mesh) == (True, 0, "")
    p = budget.plan_config(cfg, mesh, "a100-80g")
    r, model = cfg.rollout, workload.runtime_model(cfg)
    # the engine runs in its replica layout data=8, fsdp=1, tensor=2 with its own copy of the weights, every
    # parameter split over tensor only (Qwen3-8B: its embedding and LM head along the vocabulary, the layers along
    # heads and MLP; the norms whole): the embedding and the layers' matrices in bf16 (the compute dtype), the
    # LM head and the norms in fp32, by hand from the widths
    V, D, L, F = 151_936, 4096, 36, 12288
    matrices, norms = (2 * D * D + 2 * D * 1024 + 3 * D * F) // 2, 2 * 128 + 2 * D
    assert p.item("engine parameters") == 2 * (V * D // 2 + L * matrices) + 4 * (V * D // 2 + L * norms + D)
    # the pages the config's budget holds per device: one replica's (8 replicas), each device with its share of
    # the KV heads (split over tensor)
    device_page = _kv_page_bytes(model, r.engine_page_size, tensor=mesh["tensor"])
    pages = int(r.engine_memory_gib * GiB) // device_page
    assert p.item("engine pool") == pages * device_page
    assert p.item("KV cache") == 0  # the static sampler's cache is not built
    resident = p.item("parameters") + p.item("optimizer state")
    assert p.rollout_peak == (resident + p.item("engine parameters") + p.item("engine pool")
                              + p.item("engine programs"))
    assert p.fits
    static = workload.load_run_config(PAPER, ["rollout.engine=false", "rollout.max_batch=256"])
    off = budget.plan_config(static, mesh, "a100-80g")
    assert off.item("engine pool") == 0 and off.item("KV cache") > 0


def test_paper_simrl_mesh_sizes_each_replica_per_device():
    """MIMESIS-9B's 512 rollouts on its mesh (data 2 x fsdp 4 x tensor 2: 8 replicas, heads split in 2) under
    16 GiB per device: each replica holds 64 dialogues, each with a state and a snapshot slot, and its pages take
    the rest of the device's budget -- by hand from the per-device page and slot bytes."""
    config = qwen3_5_model("9b").replace(dtype="bfloat16")
    mesh = {"data": 2, "fsdp": 4, "tensor": 2}
    s = engine_sizing(config, dialogues=512, max_context=16384, page_size=16, slots=16, memory_gib=16, mesh=mesh)
    pbd, sbd = _kv_page_bytes(config, 16, tensor=2), _state_slot_bytes(config) // 2
    assert (s.replicas, s.dialogues, s.device_page_bytes, s.device_state_bytes) == (8, 64, pbd, sbd)
    assert (s.page_bytes, s.state_bytes) == (page_bytes(config, 16), state_bytes(config))  # a whole replica's
    budget = 16 * GiB
    assert s.num_states == 2 * 64 + 16 + 1  # under half the budget: two per dialogue + the slots' + trash
    assert s.num_pages == (budget - s.num_states * sbd) // pbd
    assert s.device_pool_bytes == s.num_pages * pbd + s.num_states * sbd <= budget
    # without the mesh the same budget holds fewer state slots than dialogues (so that engine evicts)
    one = engine_sizing(config, dialogues=512, max_context=16384, page_size=16, slots=16, memory_gib=16)
    assert one.replicas == 1 and one.num_states == budget // 2 // state_bytes(config) < 512
