"""Rollouts on the training mesh (train/rl/chat_models.policy_model, train/rl/distributed.rollout_mesh /
rollout_params; docs/decisions.md, "Rollouts on the mesh").

* the rollout program the loop builds (policy_model(...).generate, as the episode runners call
  it) on the 8 fake devices under fsdp=8: its params live sharded as the learner's (bytes per device = the
  planner's exact param bytes; each fully split leaf 1/8 of its bytes), its compiled per-device memory is within
  the planner's rollout number and a fraction of the program without the mesh (every device holding the whole
  batch, as the loops sampled before);
* its samples equal the unsharded sampler's (params on one device, no mesh) token for token, greedy and at
  temperature 1;
* an in-process Stage II simulator (build_user_side) sharded once on the rollout mesh, its judge sharing the
  arrays (its samples there equal the one-device engine's: test_engine_rl.py), and with rollout.engine its own
  engine on that mesh: weights and pool split over `tensor`;
* the sub-mesh of a process (local_rollout_mesh) on layouts of 2 processes x 4 devices;
* slow: 2 jax.distributed processes x 4 CPU devices: each process's rollout params live sharded on its own 4
  devices (no leaf on one device, no full copy on a device) and its samples equal the one-process unsharded ones.
"""

import json
import os
import types

import jax
import numpy as np
import pytest

from helpers import run_two_processes
from mimesis_jax import models, sharding
from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.plan import budget, devices, memory, workload
from mimesis_jax.plan.compiled import TOLERANCE
from mimesis_jax.inference import sampler
from mimesis_jax.train.rl import distributed
from mimesis_jax.train.rl.chat_models import policy_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 2 ** 20
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _tiny():
    cfg = workload.load_run_config("configs/tiny_agentrl.py:grpo")
    return cfg, workload.runtime_model(cfg), load_tokenizer("tiny")


def _policy(mc, tok, params, mesh, max_tokens):
    r = types.SimpleNamespace(engine=False, max_batch=0, mesh="", generator="jax", devices=0)  # the RolloutConfig fields policy_model reads
    return policy_model(mc, tok, r, params, name="agent", max_tokens=max_tokens, in_flight=1, mesh=mesh)


def _prompts(n, length, vocab, seed=0):
    rng = np.random.RandomState(seed)
    return [rng.randint(3, vocab, size=length - (i % 3)).tolist() for i in range(n)]


def _captured_program(model, prompts, **kw):
    """(args, mesh) of the one generate_bucket call `model.generate(prompts)` makes, without running it."""
    seen = []
    real = sampler.generate_bucket

    def record(config, params, n_new, filtering, *inputs, **k):
        seen.append((config, params, n_new, filtering, inputs, jax.sharding.get_abstract_mesh()))
        B = inputs[0].shape[0]
        return np.zeros((B, n_new), np.int32), np.zeros((B, n_new), np.float32), np.ones((B,), np.int32)
    sampler.generate_bucket = record
    try:
        model.generate(prompts, model.sampling(**kw))
    finally:
        sampler.generate_bucket = real
    assert len(seen) == 1
    return seen[0]


def _compiled_bytes(captured, mesh):
    config, params, n_new, filtering, inputs, _ = captured
    if mesh is None:
        lowered = sampler.generate_bucket.lower(config, params, n_new, filtering, *inputs)
    else:
        with sharding.use_mesh(mesh):
            lowered = sampler.generate_bucket.lower(config, params, n_new, filtering, *inputs)
    m = lowered.compile(FAST).memory_analysis()
    return int(m.argument_size_in_bytes) + int(m.output_size_in_bytes) + int(m.temp_size_in_bytes)


def _bytes_on(tree, device):
    return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards if s.device == device)


def test_loop_rollout_program_is_sharded_and_within_the_plan():
    cfg, mc, tok = _tiny()
    axes = {"data": 1, "fsdp": 8, "tensor": 1}
    mesh = sharding.make_mesh(axes)
    w = workload.workload_from_config(cfg, axes, mc)
    assert w.rollout == workload.Rollout(32, 256, 32)  # the grpo step's 32 dialogues, <= 256-token prompts, 24 new
    params = models.init_params(mc, jax.random.key(0), mesh)  # as the learner holds them
    prompts = _prompts(32, 250, mc.vocab_size)

    model = _policy(mc, tok, params, mesh, 24)
    got = _captured_program(model, prompts)
    assert got[2] == 32 and got[4][0].shape == (32, 256)
    assert not got[5].empty and dict(got[5].shape) == axes  # the program runs under the training mesh
    for x in got[4]:  # every input's rows split 8 ways
        assert x.sharding.shard_shape(x.shape)[0] == x.shape[0] // 8
    dev = jax.devices()[0]
    per_dev = _bytes_on(got[1], dev)
    assert per_dev == memory.param_bytes(mc, axes)  # the planner's exact parameter bytes
    total = sum(x.nbytes for x in jax.tree.leaves(got[1]))
    for path, x in jax.tree_util.tree_leaves_with_path(got[1]):
        if len(x.sharding.device_set) == 8 and x.sharding.shard_shape(x.shape) != x.shape:
            assert _bytes_on(x, dev) * 8 == x.nbytes, jax.tree_util.keystr(path)  # fully split: 1/8 here
    assert got[1]["embed"].sharding.shard_shape(got[1]["embed"].shape)[1] == mc.hidden_size // 8
    sharded = _compiled_bytes(got, mesh)

    # the loop before: the same sharded params, no mesh -- every device runs the whole 32-row batch
    before = _captured_program(type(model)(mc, params, tok, max_tokens=24), prompts)
    assert before[5].empty
    unsharded = _compiled_bytes(before, None)
    plan = budget.plan(w, devices.DEVICES["cpu"])
    planned = plan.rollout_peak - plan.item("optimizer state")  # the sampler alone (test_plan.py's comparison)
    print(f"rollout program per device: {unsharded / MiB:.1f} MiB without the mesh, {sharded / MiB:.1f} MiB on "
          f"fsdp=8 (plan {planned / MiB:.1f} MiB); params {per_dev / MiB:.3f} of {total / MiB:.3f} MiB")
    assert abs(planned / sharded - 1) <= 0.15, (planned, sharded)
    assert sharded * 4 < unsharded, (sharded, unsharded)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_mesh_samples_equal_the_unsharded_samples(temperature):
    _, mc, tok = _tiny()
    mesh = sharding.make_mesh({"data": 2, "fsdp": 4, "tensor": 1})
    params = models.init_params(mc, jax.random.key(1), mesh)
    prompts = _prompts(5, 9, mc.vocab_size, seed=2)  # padded to 8 rows: 2 x 4 batch shards
    seeds = [11, 12, 13, 14, 15]
    model = _policy(mc, tok, params, mesh, 8)
    assert model.mesh is mesh
    got = model.generate(prompts, [model.sampling(temperature=temperature, seed=s) for s in seeds])
    host = jax.device_get(params)
    ref = sampler.generate(mc, jax.device_put(host, jax.devices()[0]), prompts, max_new_tokens=8,
                           temperature=temperature, stop_ids=model.stop_ids, seed=seeds)
    assert [s.tokens for s in got] == [s.tokens for s in ref]
    assert sum(len(s.tokens) for s in ref) > len(prompts)  # several decode steps compared, not only the first
    np.testing.assert_allclose(np.concatenate([s.logprobs for s in got]), np.concatenate([s.logprobs for s in ref]),
                               atol=1e-4)


def test_in_process_simulator_is_sharded_once_on_the_rollout_mesh():
    from mimesis_jax.config.rl import UserSideConfig
    from mimesis_jax.chat.specs import tiny_model
    from mimesis_jax.train.rl.chat_models import build_user_side

    mesh = sharding.make_mesh({"data": 2, "fsdp": 4, "tensor": 1})
    side = build_user_side(UserSideConfig(simulator="tiny", simulator_thinking=False, simulator_max_tokens=4),
                           mesh=distributed.rollout_mesh(mesh))
    try:
        sim, judge = side.simulator, side.judge.model
        assert sim.mesh is mesh and judge.mesh is mesh
        for a, b in zip(jax.tree.leaves(sim.params), jax.tree.leaves(judge.params)):
            assert a is b and len(a.sharding.device_set) == 8  # one sharded copy, shared by the judge
        assert sim.params["embed"].sharding.shard_shape(sim.params["embed"].shape)[1] == 64 // 4
        config, params, _ = tiny_model("qwen3_5", 0)  # the unsharded simulator: same spec, same seed
        for a, b in zip(jax.tree.leaves(sim.params), jax.tree.leaves(params)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # the same weights, only placed
        # its samples on the mesh equal the one-device engine's: test_engine_rl.py, agentrl engine vs static
    finally:
        side.close()


def test_in_process_engine_simulator_runs_on_the_rollout_mesh():
    """rollout.engine=true: the Stage II simulator's own engine is built on the rollout mesh (data=4 x tensor=2),
    its weights laid out as models.shard_params says and each device holding exactly half of its data-parallel
    replica's block of KV pages, conv windows and DeltaNet states (4 replicas over `data`, the heads split over
    `tensor`); the same engine on one mesh equals the one-device engine's tokens: test_engine_mesh.py."""
    from mimesis_jax.config.rl import UserSideConfig
    from mimesis_jax.inference.engine import EngineConfig
    from mimesis_jax.train.rl.chat_models import build_user_side

    mesh = sharding.make_mesh({"data": 4, "tensor": 2})
    ec = EngineConfig(slots=2, page_size=4, num_pages=16, max_pages_per_seq=8, prefill_chunk=8, prefill_rows=1,
                      decode_steps=2, num_states=5)
    side = build_user_side(UserSideConfig(simulator="tiny", simulator_thinking=False, simulator_max_tokens=4),
                           engine_config=lambda config: ec, mesh=distributed.rollout_mesh(mesh))
    try:
        eng = side.simulator.generator.engine
        assert eng.mesh is mesh and eng.ec == ec
        want = models.shard_params(eng.config, side.simulator.params, mesh)
        for a, b in zip(jax.tree.leaves(eng.params), jax.tree.leaves(want)):
            assert a.sharding.is_equivalent_to(b.sharding, a.ndim)
        heads = {"k": 1, "v": 1, "conv": 3, "state": 2}  # paged_cache.pool_axes' heads dim of each leaf
        assert set(eng.pool.cache) == set(heads)  # the tiny Qwen3.5: attention pages and linear-attention states
        for key, x in eng.pool.cache.items():
            assert x.sharding.spec[heads[key]] == "tensor", key
            assert {s.data.nbytes for s in x.addressable_shards} == {x.nbytes // (4 * 2)}, key
            assert len(x.sharding.device_set) == 8
    finally:
        side.close()


class _FakeDevice:
    def __init__(self, i, process):
        self.id, self.process_index = i, process

    def __repr__(self):
        return f"D{self.id}@{self.process_index}"


@pytest.mark.parametrize("shape,want", [((1, 8, 1), (1, 4, 1)), ((2, 4, 1), (1, 4, 1)), ((1, 4, 2), (1, 2, 2))])
def test_local_rollout_mesh_is_the_process_block(shape, want, monkeypatch):
    # 2 processes x 4 devices, process-major as jax.devices() orders them; this process is 1
    devs = np.asarray([_FakeDevice(i, i // 4) for i in range(8)], dtype=object).reshape(shape)
    fake = types.SimpleNamespace(devices=devs, axis_names=("data", "fsdp", "tensor"), axis_types=None,
                                 shape=dict(zip(("data", "fsdp", "tensor"), shape)))
    built = []
    monkeypatch.setattr(sharding, "Mesh", lambda d, names, axis_types=None: built.append((d, names)) or d)  # where local_rollout_mesh lives
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    local = distributed.local_rollout_mesh(fake)
    assert local.shape == want and [d.id for d in local.flat] == [4, 5, 6, 7]
    # processes interleaved on fsdp: the local devices are still a grid of the mesh (rows 0-1 x columns 1, 3)
    def grid(owner):
        return types.SimpleNamespace(devices=np.asarray([_FakeDevice(i, owner(i)) for i in range(8)], dtype=object)
                                     .reshape(2, 4, 1), axis_names=("data", "fsdp", "tensor"), axis_types=None)
    local = distributed.local_rollout_mesh(grid(lambda i: i % 2))
    assert local.shape == (2, 2, 1) and [d.id for d in local.flat] == [1, 3, 5, 7]
    # no grid (devices 0, 1 of row 0 and 2, 3 of row 1): every local device on fsdp, in the mesh's order
    local = distributed.local_rollout_mesh(grid(lambda i: int(i in (0, 1, 6, 7))))
    assert local.shape == (1, 4, 1) and [d.id for d in local.flat] == [0, 1, 6, 7]


# ------------------------------------------------------------------------------------------ 2 processes
WORKER = r"""
import json, os, sys
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")  # as the CLI's --distributed does
jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
import numpy as np, types
from mimesis_jax import models, sharding
from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.plan import workload
from mimesis_jax.train.rl.chat_models import policy_model
cfg = workload.load_run_config("configs/tiny_agentrl.py:grpo")
mc, tok = workload.runtime_model(cfg), load_tokenizer("tiny")
mesh = sharding.make_mesh({"data": 1, "fsdp": 8, "tensor": 1})
params = models.init_params(mc, jax.random.key(1), mesh)
from jax.experimental import multihost_utils


def no_gather(*a, **k):
    raise AssertionError("the rollout parameters were gathered through the host")


multihost_utils.process_allgather = no_gather  # the sync must move them device to device
model = policy_model(mc, tok, types.SimpleNamespace(engine=False, max_batch=0, mesh="", generator="jax", devices=0), params, name="agent",
                     max_tokens=8, in_flight=1, mesh=mesh)
# the sync's programs (inference/weight_sync.py) against their plan: the largest per-device bytes of one
from mimesis_jax.plan.memory import weight_sync_bytes
from mimesis_jax.train.rl import distributed
sync = distributed._weight_sync(mc, mesh)
mem = [c.memory_analysis() for _, c in sync.compiled(params)]
compiled = max(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
               for m in mem)
planned = weight_sync_bytes(mc, dict(mesh.shape), dict(model.mesh.shape)).peak
local = set(jax.local_devices())
leaves = []
for x in jax.tree.leaves(model.params):
    leaves.append({"devices": sorted(d.id for d in x.sharding.device_set), "local": x.sharding.device_set == local,
                   "shard": list(x.sharding.shard_shape(x.shape)), "shape": list(x.shape), "nbytes": x.nbytes,
                   "on_first": sum(s.data.nbytes for s in x.addressable_shards if s.device == jax.local_devices()[0])})
prompts, seeds, temps = json.loads(sys.argv[3])
mine = [i for i in range(len(prompts)) if i % 2 == jax.process_index()]
out = model.generate([prompts[i] for i in mine], [model.sampling(seed=seeds[i], temperature=temps[i]) for i in mine])
json.dump({"mesh": dict(model.mesh.shape), "leaves": leaves, "rows": mine, "tokens": [s.tokens for s in out],
           "sync": [planned, compiled]},
          open(sys.argv[4], "w"))
"""


@pytest.mark.slow
def test_two_processes_sample_on_their_own_devices(tmp_path):
    _, mc, tok = _tiny()
    prompts = _prompts(6, 7, mc.vocab_size, seed=3)
    seeds, temps = [21, 22, 23, 24, 25, 26], [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    run_two_processes(WORKER, json.dumps([prompts, seeds, temps]), tmp_path, ROOT)

    mesh = sharding.make_mesh({"data": 1, "fsdp": 8, "tensor": 1})
    params = jax.device_put(jax.device_get(models.init_params(mc, jax.random.key(1), mesh)), jax.devices()[0])
    ref = sampler.generate(mc, params, prompts, max_new_tokens=8, temperature=temps, seed=seeds,
                           stop_ids=sorted({int(tok.im_end_id), int(tok.eos_id)}))
    full = sum(x.nbytes for x in jax.tree.leaves(params))
    for i in range(2):
        got = json.load(open(tmp_path / f"{i}.json"))
        assert got["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
        assert all(leaf["local"] and len(leaf["devices"]) == 4 for leaf in got["leaves"])
        assert len({tuple(leaf["devices"]) for leaf in got["leaves"]}) == 1  # every leaf on the same 4
        on_first = sum(leaf["on_first"] for leaf in got["leaves"])
        split = [leaf for leaf in got["leaves"] if leaf["shard"] != leaf["shape"]]
        assert split and all(leaf["on_first"] * 4 == leaf["nbytes"] for leaf in split)
        assert on_first < full / 3  # far from the whole fp32 model on one device
        print(f"process {i}: rollout params on its first device {on_first / MiB:.3f} of {full / MiB:.3f} MiB")
        assert got["tokens"] == [ref[r].tokens for r in got["rows"]]
        # the weight sync's largest program per device: within the plan, under one whole copy of the largest weight
        planned, compiled = got["sync"]
        largest = max(x.nbytes for x in jax.tree.leaves(params))
        assert abs(planned / compiled - 1) <= TOLERANCE and compiled < largest, (planned, compiled, largest)


@pytest.mark.parametrize("shape", [(1, 8, 2), (2, 4, 2), (1, 16, 1), (4, 2, 2)])
@pytest.mark.parametrize("processes", [2, 4])
def test_the_plans_process_mesh_is_the_loops(shape, processes, monkeypatch):
    """workload.process_mesh (what `plan --processes` plans a process's rollout on) is the sub-mesh
    distributed.local_rollout_mesh builds on every process, for the paper meshes and process-major devices."""
    from mimesis_jax.plan.workload import process_mesh
    n = int(np.prod(shape))
    devs = np.asarray([_FakeDevice(i, i // (n // processes)) for i in range(n)], dtype=object).reshape(shape)
    names = ("data", "fsdp", "tensor")
    fake = types.SimpleNamespace(devices=devs, axis_names=names, axis_types=None, shape=dict(zip(names, shape)))
    monkeypatch.setattr(sharding, "Mesh", lambda d, names, axis_types=None: d)  # where local_rollout_mesh lives
    want = process_mesh(dict(zip(names, shape)), processes)
    for me in range(processes):
        monkeypatch.setattr(jax, "process_index", lambda me=me: me)
        local = distributed.local_rollout_mesh(fake)
        assert local.shape == tuple(want.values()), (me, local.shape, want)
        assert sorted(d.id for d in local.flat) == list(range(me * n // processes, (me + 1) * n // processes))


def test_each_process_caps_its_sampler_calls_at_its_share_of_max_batch(monkeypatch):
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    assert [distributed.process_max_batch(b) for b in (256, 5, 1, 0)] == [128, 3, 1, 0]
    monkeypatch.setattr(jax, "process_count", lambda: 1)
    assert distributed.process_max_batch(256) == 256


def test_weight_sync_on_one_process_casts_on_the_devices_and_keeps_the_layout():
    """The weight sync (inference/weight_sync.py) on one process, to bfloat16: every array equals the training
    array cast by NumPy, laid out as models.shard_params lays it out on the mesh (the rollout mesh of one process
    is the training mesh), and a second sync of new values reuses the programs of the first."""
    from mimesis_jax.inference.weight_sync import WeightSync
    _, mc, _ = _tiny()
    mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    params = models.init_params(mc, jax.random.key(3), mesh)
    sync = WeightSync(mc, mesh, dtype=jax.numpy.bfloat16)
    got = sync(params)
    want = models.param_shardings(mc, mesh)
    for x, y, sh in zip(jax.tree.leaves(params), jax.tree.leaves(got), jax.tree.leaves(want)):
        assert y.dtype == jax.numpy.bfloat16
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x).astype(jax.numpy.bfloat16))
        assert y.sharding.is_equivalent_to(sh, x.ndim)
    sync(jax.tree.map(lambda x: x * 2, params))
    assert len(sync._programs) == len(jax.tree.leaves(params))
    assert [f._cache_size() for f in sync._programs.values()] == [1] * len(sync._programs)  # compiled once each
