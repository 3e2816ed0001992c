"""The rollout layout (`rollout.mesh`, issue #43 item 3; docs/decisions.md, "Rollout layout"): decode in
data-parallel replicas x tensor parallelism over the devices of the training mesh.

* the key: "" keeps the training layout (the training mesh and arrays themselves, no copy); a bad value or one
  that does not use exactly a process's devices is a one-line ConfigError naming rollout.mesh;
* the paper structure (a subprocess with 16 fake devices): the 9B simulator config's mesh (data 2 x fsdp 4 x
  tensor 2) and model structure at width 64, its weights synced into replica=4,tensor=4 -- every array the
  training array's values, split 4 ways where it has a head / MLP / vocabulary axis and whole elsewhere; the
  sampler there gives the unsharded one-device sampler's tokens and log-probs for the same seeds; its compiled
  program gathers no array at all, where the training layout's gathers the weights over fsdp; and at the paper's
  own widths the sampler program and the sync's largest program within the plan (`plan --compiled`'s rows);
* `plan --set rollout.mesh=...` prints the rollout in that layout (its own parameter copy per device, by hand)
  and the sync into it;
* slow: 2 jax.distributed processes x 4 CPU devices, each syncing into its own replica=2,tensor=2 without a host
  gather; its samples equal the one-process unsharded ones.
"""

import argparse
import json
import math
import re
import os

import jax
import numpy as np
import pytest

from helpers import run_script, run_two_processes
from mimesis_jax import models, sharding
from mimesis_jax.commands import plan as plan_cli
from mimesis_jax.config.layout import rollout_layout
from mimesis_jax.errors import ConfigError
from mimesis_jax.models.layers import is_spec
from mimesis_jax.plan import workload
from mimesis_jax.plan.budget import plan_config
from mimesis_jax.plan.compiled import TOLERANCE
from mimesis_jax.plan.devices import GiB
from mimesis_jax.inference import sampler
from mimesis_jax.train.rl import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the logical parameter axes the rules split over `tensor` (sharding.DEFAULT_RULES): written out here, so the
# per-device bytes below are counted by hand, not by the rules' machinery
TENSOR_AXES = {"vocab", "heads", "kv_heads", "mlp", "lin_heads", "lin_kv_heads"}


def _copy_bytes(model, tensor: int) -> int:
    """Per-device bytes of fp32 parameters replicated over the replicas and split `tensor` ways on the leaves with a
    tensor axis (every such dim of the paper models divides by 4)."""
    return sum(math.prod(s.shape) * 4 // (tensor if TENSOR_AXES & set(s.axes) else 1)
               for s in jax.tree.leaves(models.param_specs(model), is_leaf=is_spec))


# ------------------------------------------------------------------------------------------ the key
@pytest.mark.parametrize("text,want", [("replica=4,tensor=4", {"replica": 4, "tensor": 4}),
                                       ("tensor=2", {"replica": -1, "tensor": 2}),
                                       (" tensor = 8 , replica = 2 ", {"replica": 2, "tensor": 8})])
def test_the_key_parses_to_replicas_and_tensor(text, want):
    assert rollout_layout("") is None
    assert rollout_layout(text) == want


@pytest.mark.parametrize("text", ["replica=4,fsdp=4", "replica=4,replica=2", "tensor=0", "tensor=-1", "replica",
                                  "replica=4;tensor=4"])
def test_a_bad_key_is_one_line_naming_it(text):
    with pytest.raises(ConfigError) as e:
        workload.load_run_config("configs/mimesis_simrl.py:9b", [f"rollout.mesh={text}"])
    msg = str(e.value)
    assert msg.startswith("config key 'rollout.mesh': expected 'replica=R,tensor=T'") and "\n" not in msg
    assert msg.endswith(f"(got {text!r})")


def test_the_layout_must_use_exactly_the_process_devices():
    assert sharding.layout_axes({"replica": -1, "tensor": 4}, 16) == {"data": 4, "fsdp": 1, "tensor": 4}
    assert sharding.layout_axes({"replica": 2, "tensor": -1}, 16) == {"data": 2, "fsdp": 1, "tensor": 8}
    for layout in ({"replica": 4, "tensor": 8}, {"replica": -1, "tensor": 3}):
        with pytest.raises(ConfigError, match=r"^config key 'rollout.mesh': (replica=4,)?tensor=\d must use exactly "
                                              r"the 16 devices each process rolls out on"):
            sharding.layout_axes(layout, 16)
    mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    with pytest.raises(ConfigError, match="rollout.mesh': replica=4,tensor=4 must use exactly the 8 devices"):
        distributed.rollout_mesh(mesh, "replica=4,tensor=4")


def test_the_default_is_the_training_layout_itself():
    """rollout.mesh = "" (and the old call without a rollout section): the training mesh and its arrays, no copy."""
    mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    cfg = workload.load_run_config("configs/tiny_agentrl.py:grpo")
    assert cfg.rollout.mesh == ""
    mc = workload.runtime_model(cfg)
    params = models.init_params(mc, jax.random.key(0), mesh)
    for rollout in (None, cfg.rollout, ""):
        assert distributed.rollout_mesh(mesh, rollout) is mesh
        assert distributed.rollout_params(mc, params, mesh, rollout) is params
    layout = distributed.rollout_mesh(mesh, "replica=2,tensor=4")
    assert dict(layout.shape) == {"data": 2, "fsdp": 1, "tensor": 4}
    assert [d.id for d in layout.devices.flat] == [d.id for d in mesh.devices.flat]  # tensor groups: neighbours
    assert all(t == jax.sharding.AxisType.Auto for t in layout.axis_types)


# ------------------------------------------------------------------------------ the paper structure
PAPER = r"""
import json, re
import jax, jax.numpy as jnp, numpy as np
from mimesis_jax import models, sharding
from mimesis_jax.inference import sampler
from mimesis_jax.plan import workload
from mimesis_jax.plan.compiled import QUICK, program_memory, weight_sync_memory
from mimesis_jax.plan.memory import weight_sync_bytes
from mimesis_jax.plan.rehearse import narrow_model
from mimesis_jax.train.rl import distributed

LAYOUT = "replica=4,tensor=4"
# the static sampler in the layout (the config's default is the rollout engine)
cfg = workload.load_run_config("configs/mimesis_simrl.py:9b", ["train.dtype=float32", "rollout.engine=false",
                                                              "rollout.max_batch=256", "rollout.mesh=" + LAYOUT])
mc = narrow_model(workload.runtime_model(cfg), 4, width=64)
mesh = sharding.make_mesh(dict(cfg.mesh.axes()))
params = models.init_params(mc, jax.random.key(1), mesh)
rm = distributed.rollout_mesh(mesh, cfg.rollout)
rp = distributed.rollout_params(mc, params, mesh, cfg.rollout)
first = jax.devices()[0]
leaves = []
for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(rp), jax.tree.leaves(params)):
    leaves.append({"path": jax.tree_util.keystr(path), "nbytes": x.nbytes, "devices": len(x.sharding.device_set),
                   "mesh": dict(x.sharding.mesh.shape),
                   "on_first": sum(s.data.nbytes for s in x.addressable_shards if s.device == first),
                   "equal": bool(np.array_equal(np.asarray(x), np.asarray(y)))})
rng = np.random.RandomState(0)
prompts = [rng.randint(3, mc.vocab_size, size=9 - i % 3).tolist() for i in range(6)]
seeds, temps = [11, 12, 13, 14, 15, 16], [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
got = sampler.generate(mc, rp, prompts, max_new_tokens=8, temperature=temps, seed=seeds, mesh=rm)
one = jax.device_put(jax.device_get(params), first)
ref = sampler.generate(mc, one, prompts, max_new_tokens=8, temperature=temps, seed=seeds)

def gathers(m):
    # the all-gathers of the compiled sampler program (8 rows of 16 prompt tokens + 8 new) on mesh m
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            models.abstract_params(mc), models.param_shardings(mc, m))
    arr = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=sharding.batch_sharding(m, shape, mc))
    B, P, i32, f32 = 8, 16, jnp.int32, jnp.float32
    inputs = (arr((B, P), i32), arr((B, P), i32), arr((B, P), i32), arr((B,), i32), arr((B,), f32), arr((B,), f32),
              arr((B,), i32), arr((B,), f32), arr((B,), i32), arr((B, sampler.Buckets().stops(1)), i32),
              arr((B,), jnp.uint32), arr((B,), jnp.uint32), arr((B,), jnp.bool_))
    with sharding.use_mesh(m):
        text = sampler.generate_bucket.lower(mc, abstract, 8, 0, *inputs).compile().as_text()
    return [[int(d) for d in s.split(",")] for s in re.findall(r"= f32\[([\d,]+)\]\{[\d,]*\} all-gather\(", text)]

# the paper's own widths: the rows `plan --compiled` adds for the layout (commands/plan.py _rollout_programs)
rows = []
for p in program_memory(workload.process_config(cfg, 1), dict(rm.shape), "a100-80g", largest_only=True,
                        updates=False, options=QUICK):
    rows.append([p.name, p.planned, p.compiled])
big, axes = workload.runtime_model(cfg), dict(cfg.mesh.axes())
rows.append(["weight sync", weight_sync_bytes(big, axes, dict(rm.shape)).peak,
             weight_sync_memory(big, axes, 1, QUICK, distributed.layout_of(cfg.rollout))])
# Stage II's mesh (fsdp 8 x tensor 2) into replica=4,tensor=4: its [V, D] tables change device groups row-wise
from mimesis_jax.inference.weight_sync import WeightSync
from mimesis_jax.plan.compiled import compiled_total
from mimesis_jax.config.layout import rollout_layout
c2 = workload.load_run_config("configs/qwen3_8b_agentrl.py:grpo", ["train.dtype=float32"])
m2, axes2 = workload.runtime_model(c2), dict(c2.mesh.axes())
sync = WeightSync(m2, sharding.make_mesh(axes2), processes=1, layout=rollout_layout(LAYOUT))
progs = {path: compiled_total(c) for path, c in sync.compiled(models.abstract_params(m2), QUICK)}
rows.append(["stage2 weight sync", weight_sync_bytes(m2, axes2, dict(rm.shape)).peak, max(progs.values())])
table = ["stage2 embed", progs["['embed']"], m2.vocab_size * m2.hidden_size * 4]
# the engine's sync (Stage II CSD, the config as it is: bf16 compute, the engine's replica layout), built as the
# loop builds it (weight_sync.rollout_sync, engine=True: the matrices cast to bf16 inside the programs), 1 and 2
# processes: its largest program and the largest cast one (a stacked MLP weight) per device
from mimesis_jax.inference.weight_sync import rollout_sync
from mimesis_jax.plan.memory import weight_sync_leaves
c3 = workload.load_run_config("configs/qwen3_8b_agentrl.py:csd", [])
m3, axes3 = workload.runtime_model(c3), dict(c3.mesh.axes())
mesh3 = sharding.make_mesh(axes3)
engine_sync = []
for P in (1, 2):
    s3 = rollout_sync(m3, mesh3, distributed.layout_of(c3.rollout, mesh3), engine=True, processes=P)
    comp3 = {path: compiled_total(c) for path, c in s3.compiled(models.abstract_params(m3), QUICK)}
    local3 = workload.rollout_axes(c3, axes3, P)
    plans = dict(zip(comp3, weight_sync_leaves(m3, axes3, local3, engine=True)))
    up = "['layers']['mlp']['up']"
    engine_sync.append([P, np.dtype(s3.dtype).name, s3.exact, weight_sync_bytes(m3, axes3, local3, engine=True).peak,
                        max(comp3.values()), plans[up].peak, comp3[up]])
print("RESULT " + json.dumps({"table": table, "engine_sync": engine_sync,
    "mesh": dict(rm.shape), "leaves": leaves, "tokens": [s.tokens for s in got], "ref": [s.tokens for s in ref],
    "logprobs": [list(map(float, s.logprobs)) for s in got],
    "ref_logprobs": [list(map(float, s.logprobs)) for s in ref],
    "gathers": {"rollout": gathers(rm), "training": gathers(mesh)}, "rows": rows,
    "hidden": mc.hidden_size, "intermediate": mc.intermediate_size}))
"""


@pytest.fixture(scope="module")
def paper():
    return run_script(PAPER, 16)


def test_the_paper_mesh_syncs_into_the_layout(paper):
    """Every array of the narrowed 9B simulator (its structure: Qwen3.5, 3 DeltaNet + 1 attention layers) holds
    the training array's values on all 16 devices of replica=4,tensor=4 (data=4, fsdp=1, tensor=4), a quarter of it
    per device where it has a tensor axis, the whole of it elsewhere."""
    from mimesis_jax.plan.rehearse import narrow_model

    cfg = workload.load_run_config("configs/mimesis_simrl.py:9b", ["train.dtype=float32"])
    mc = narrow_model(workload.runtime_model(cfg), 4, width=64)
    assert paper["mesh"] == {"data": 4, "fsdp": 1, "tensor": 4}
    specs = jax.tree.leaves(models.param_specs(mc), is_leaf=is_spec)
    assert len(specs) == len(paper["leaves"])
    for s, leaf in zip(specs, paper["leaves"]):
        assert leaf["equal"] and leaf["devices"] == 16 and leaf["mesh"] == paper["mesh"], leaf
        split = 4 if TENSOR_AXES & set(s.axes) else 1
        assert leaf["on_first"] * split == leaf["nbytes"] == math.prod(s.shape) * 4, (leaf, s.axes)
    assert sum(leaf["on_first"] for leaf in paper["leaves"]) == _copy_bytes(mc, 4)


def test_the_layout_samples_the_unsharded_samples(paper):
    """Greedy and temperature-1 rows, 6 prompts padded to 8 rows over 4 replicas: the one-device tokens, and their
    log-probs to fp32 summation order."""
    assert paper["tokens"] == paper["ref"]
    assert sum(len(t) for t in paper["ref"]) > 6  # several decode steps compared, not only the first
    np.testing.assert_allclose(np.concatenate(paper["logprobs"]), np.concatenate(paper["ref_logprobs"]), atol=1e-4)


def test_the_layout_gathers_no_weight(paper):
    """The sampler program in the layout compiles without a single all-gather; in the training layout (fsdp=4) it
    gathers the weights, e.g. each layer's MLP gate [hidden, intermediate / tensor=2] over fsdp."""
    assert paper["gathers"]["rollout"] == []
    assert [paper["hidden"], paper["intermediate"] // 2] in paper["gathers"]["training"]


def test_the_layout_programs_at_paper_width_are_within_the_plan(paper):
    """What `plan --compiled --set rollout.mesh=replica=4,tensor=4` compiles for the 9B simulator (float32, QUICK):
    its sampler program (256 rollouts per call over 4 replicas) and the weight sync's largest program."""
    (name, planned, compiled), *syncs = paper["rows"]
    assert name == "sampler 256x14336+2048"
    assert abs(planned / compiled - 1) <= TOLERANCE, (planned / GiB, compiled / GiB)
    assert [s[0] for s in syncs] == ["weight sync", "stage2 weight sync"]  # and Stage II's mesh into the layout
    for sync, s_planned, s_compiled in syncs:
        assert abs(s_planned / s_compiled - 1) <= TOLERANCE, (sync, s_planned / GiB, s_compiled / GiB)


def test_the_engine_sync_compiled_as_the_loop_builds_it_is_within_the_plan(paper):
    """The weight sync into the rollout engine (Stage II CSD at the paper's widths, bf16 compute, the engine's
    replica layout, 1 and 2 processes), built by weight_sync.rollout_sync as the loop builds it: bf16 copies of the
    cast matrices (exact); its largest program, and its largest cast one (a stacked MLP weight: each layer cast on
    its training shard and gathered in bf16), within 10% of `weight_sync_bytes(..., engine=True)`."""
    for P, dtype, exact, planned, compiled, up_planned, up_compiled in paper["engine_sync"]:
        assert (dtype, exact) == ("bfloat16", True), P
        assert abs(planned / compiled - 1) <= TOLERANCE, (P, planned / GiB, compiled / GiB)
        assert abs(up_planned / up_compiled - 1) <= TOLERANCE, (P, up_planned / GiB, up_compiled / GiB)


def test_the_engine_sync_moves_and_leaves_the_cast_copy():
    """`weight_sync_bytes(..., engine=True)` of Stage II CSD (fsdp 8 x tensor 2 into the engine's data 8 x tensor 2),
    counted here by hand from the parameter specs: the copy holds the matrices and the embedding (an `embed` axis,
    not the LM head) in bf16, the rest in fp32, split 2 ways where a tensor axis is; each device receives its copy
    less what its training shard (split 8 ways more on `embed`) already holds, in the copy's dtype. The copy is
    `engine_param_bytes`'; the fp32 sync moves the wide bytes."""
    from mimesis_jax.plan.memory import engine_param_bytes, weight_sync_bytes

    cfg = workload.load_run_config("configs/qwen3_8b_agentrl.py:csd")
    m, mesh = workload.runtime_model(cfg), dict(cfg.mesh.axes())
    local = workload.rollout_axes(cfg, mesh, 1)
    assert mesh == {"data": 1, "fsdp": 8, "tensor": 2} and local == {"data": 8, "fsdp": 1, "tensor": 2}
    copy = moved = moved32 = 0
    flat = jax.tree_util.tree_flatten_with_path(models.param_specs(m), is_leaf=is_spec)[0]
    for path, s in flat:
        n, t = math.prod(s.shape), 2 if TENSOR_AXES & set(s.axes) else 1
        src = n // (t * (8 if "embed" in s.axes else 1))
        item = 2 if "embed" in s.axes and jax.tree_util.keystr(path) != "['lm_head']" else 4
        copy += n // t * item
        moved += (n // t - src) * item
        moved32 += (n // t - src) * 4
    b = weight_sync_bytes(m, mesh, local, engine=True)
    assert (b.copy, b.moved) == (copy, moved)
    assert b.copy == engine_param_bytes(m, local)
    assert weight_sync_bytes(m, mesh, local).moved == moved32 > moved


def test_a_table_changing_device_groups_moves_in_row_pieces(paper):
    """Stage II's [V, D] embedding (vocabulary split over tensor=2 pairs in training, over tensor=4 groups in the
    layout): its sync program holds less than half the whole table (row pieces, inference/weight_sync.py
    row_pieces), where one reshard rebuilds the whole table on every device."""
    _, compiled, whole = paper["table"]
    assert compiled * 2 < whole, (compiled / GiB, whole / GiB)


@pytest.mark.parametrize("rows,src,dst,want", [(151_936, 2, 4, (4, 16)), (151_936, 2, 2, (1, 1)),
                                               (248_320, 2, 8, (8, 16)), (10, 2, 4, (4, 1)), (24, 1, 4, (4, 2))])
def test_row_pieces(rows, src, dst, want):
    """(row blocks, pieces per block): the lcm of the two splits, and the largest power of two <= 16 dividing
    each block (1: rows that do not divide, moved whole); the same split moves no row between device groups."""
    from mimesis_jax.inference.weight_sync import row_pieces

    assert row_pieces(rows, src, dst) == want


# ------------------------------------------------------------------------------------------ plan
def test_plan_prints_the_rollout_in_the_layout(capsys):
    """`plan --set rollout.mesh=replica=4,tensor=4` on the 9B simulator config with the static sampler: the rollout
    line names the layout, its parameter copy per device is the fp32 model split 4 ways on its tensor axes (by
    hand), the rollout peak is the training state + that program, and the sync line the bytes each device receives
    (copy - training shard)."""
    name, layout = "configs/mimesis_simrl.py:9b", "replica=4,tensor=4"
    static = ["rollout.engine=false", "rollout.max_batch=256"]
    argv = ["--config", name, "--set", *static, f"rollout.mesh={layout}"]
    assert plan_cli.run(plan_cli.add_args(argparse.ArgumentParser()).parse_args(argv)) == 0
    out = capsys.readouterr().out.splitlines()
    i = next(i for i, line in enumerate(out) if line.startswith("rollout on one process"))
    cfg = workload.load_run_config(name, static + [f"rollout.mesh={layout}"])
    m, mesh = workload.runtime_model(cfg), dict(cfg.mesh.axes())
    p, pp = plan_config(cfg, mesh, "a100-80g"), plan_config(cfg, {"data": 4, "fsdp": 1, "tensor": 4}, "a100-80g")
    copy = _copy_bytes(m, 4)
    assert pp.item("parameters") == copy
    assert out[i].startswith(f"rollout on one process: the rollout layout rollout.mesh={layout} (data=4,fsdp=1,"
                             f"tensor=4 per process), sampler calls of {cfg.rollout.max_batch} x ")
    state = p.item("parameters") + p.item("optimizer state")
    program = pp.rollout_peak - pp.item("optimizer state")
    assert out[i + 1].split() == (f"its rollout program {program / GiB:.2f} GiB per device (of which its own "
                                  f"parameter copy {copy / GiB:.2f} GiB) + the training state kept on every device "
                                  f"{state / GiB:.2f} GiB = rollout peak {(state + program) / GiB:.2f} GiB").split()
    assert out[i + 2].endswith(f"on 1 process in the rollout layout rollout.mesh={layout}")
    (sync,) = [x for x in out if x.startswith(f"weight sync into the rollout layout rollout.mesh={layout}")]
    assert f": {(copy - p.item('parameters')) / GiB:.2f} GiB received per device, " in sync, sync


def test_plan_names_the_key_of_a_layout_off_the_devices(capsys):
    argv = ["--config", "configs/mimesis_simrl.py:9b", "--set", "rollout.mesh=replica=4,tensor=8"]
    assert plan_cli.run(plan_cli.add_args(argparse.ArgumentParser()).parse_args(argv)) == 2
    assert capsys.readouterr().err == ("error: config key 'rollout.mesh': replica=4,tensor=8 must use exactly the 16 "
                                       "devices each process rolls out on (the training mesh's devices per "
                                       "process)\n")


# ------------------------------------------------------------------------------------------ 2 processes
WORKER = r"""
import json, sys
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")  # as the CLI's --distributed does
jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
import numpy as np
from jax.experimental import multihost_utils
from mimesis_jax import models, sharding
from mimesis_jax.inference import sampler
from mimesis_jax.plan import workload
from mimesis_jax.train.rl import distributed


def no_gather(*a, **k):
    raise AssertionError("the rollout parameters were gathered through the host")


multihost_utils.process_allgather = no_gather  # the sync must move them device to device
cfg = workload.load_run_config("configs/tiny_agentrl.py:grpo", ["rollout.mesh=replica=2,tensor=2"])
mc = workload.runtime_model(cfg)
mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
params = models.init_params(mc, jax.random.key(1), mesh)
rm = distributed.rollout_mesh(mesh, cfg.rollout)
rp = distributed.rollout_params(mc, params, mesh, cfg.rollout)
first = jax.local_devices()[0]
leaves = [{"local": x.sharding.device_set == set(jax.local_devices()), "nbytes": x.nbytes,
           "on_first": sum(s.data.nbytes for s in x.addressable_shards if s.device == first)}
          for x in jax.tree.leaves(rp)]
prompts, seeds, temps = json.loads(sys.argv[3])
mine = [i for i in range(len(prompts)) if i % 2 == jax.process_index()]
out = sampler.generate(mc, rp, [prompts[i] for i in mine], max_new_tokens=8, temperature=[temps[i] for i in mine],
                       seed=[seeds[i] for i in mine], mesh=rm)
json.dump({"mesh": dict(rm.shape), "leaves": leaves, "rows": mine, "tokens": [s.tokens for s in out],
           "logprobs": [list(map(float, s.logprobs)) for s in out]}, open(sys.argv[4], "w"))
"""


@pytest.mark.slow
def test_two_processes_sync_into_their_own_layouts(tmp_path):
    """2 processes x 4 devices, training mesh fsdp=4 x tensor=2 across both: each process's copy lives on its own 4
    devices as replica=2 x tensor=2 (half of each tensor-split array per device), moved without a host gather, and
    its rows' samples equal the one-process unsharded sampler's."""
    cfg = workload.load_run_config("configs/tiny_agentrl.py:grpo")
    mc = workload.runtime_model(cfg)
    rng = np.random.RandomState(3)
    prompts = [rng.randint(3, mc.vocab_size, size=7 - i % 3).tolist() for i in range(6)]
    seeds, temps = [21, 22, 23, 24, 25, 26], [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    run_two_processes(WORKER, json.dumps([prompts, seeds, temps]), tmp_path, ROOT)

    mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    params = jax.device_put(jax.device_get(models.init_params(mc, jax.random.key(1), mesh)), jax.devices()[0])
    ref = sampler.generate(mc, params, prompts, max_new_tokens=8, temperature=temps, seed=seeds)
    specs = jax.tree.leaves(models.param_specs(mc), is_leaf=is_spec)
    for i in range(2):
        got = json.load(open(tmp_path / f"{i}.json"))
        assert got["mesh"] == {"data": 2, "fsdp": 1, "tensor": 2}
        for s, leaf in zip(specs, got["leaves"]):
            assert leaf["local"] and leaf["on_first"] * (2 if TENSOR_AXES & set(s.axes) else 1) == leaf["nbytes"]
        assert sum(leaf["on_first"] for leaf in got["leaves"]) == _copy_bytes(mc, 2)
        assert got["tokens"] == [ref[r].tokens for r in got["rows"]]
        np.testing.assert_allclose(np.concatenate(got["logprobs"]),
                                   np.concatenate([ref[r].logprobs for r in got["rows"]]), atol=1e-4)


# ------------------------------------------------------------------------------------------ rehearse
def test_rehearse_measures_the_sampler_and_the_sync_in_the_layout():
    """rehearse's program rows with rollout.mesh=replica=2,tensor=4 on a training mesh of fsdp=4 x tensor=2: the
    sampler's row is compiled on the layout's mesh, a `weight_sync` row names the layout and its largest program
    holds less than the largest weight, and the report's text says where the sampler ran."""
    import types

    from mimesis_jax.commands import rehearse as rehearse_cli

    cfg = workload.load_run_config("configs/tiny_agentrl.py:grpo", ["rollout.mesh=replica=2,tensor=4"])
    mc = workload.runtime_model(cfg)
    run_state = types.SimpleNamespace(mesh=sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2}), model_config=mc,
                                      step_fn=types.SimpleNamespace(shape_keys=()))
    shapes = {(8, 64, 16, sampler.Buckets().stops(1), 0)}
    rows, _ = rehearse_cli._programs(run_state, cfg, shapes, updates=False)
    layout = {"data": 2, "fsdp": 1, "tensor": 4}
    assert [(r["program"], r["mesh"]) for r in rows] == [("sampler", layout), ("weight_sync", layout)]
    sync = rows[1]
    assert sync["shape"] == {"layout": "replica=2,tensor=4"}
    # its largest program holds less than one whole copy of the largest array (the sync moves pieces; its plan is
    # held at the paper's widths above, not at this tiny one, where the loops' bookkeeping outweighs the arrays)
    largest = max(math.prod(s.shape) * 4 for s in jax.tree.leaves(models.param_specs(mc), is_leaf=is_spec))
    assert sync["compiled_bytes"] < largest, (sync, largest)
    rep = {"model": {"type": "qwen3", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "intermediate": 128,
                     "vocab": 1024},
           "stage": "agentrl", "engine": False, "mesh": {"data": 1, "fsdp": 4, "tensor": 2}, "num_devices": 8,
           "processes": 1, "rollout_mesh": cfg.rollout.mesh, "prompts_per_step": 1, "group_size": 2,
           "mini_batch_prompts": 1, "updates_per_step": 1, "max_turns": 1, "row_len": 0, "max_context_tokens": 0,
           "csd": False, "dtype": "float32", "plan_programs": [], "programs": rows, "measure_compilations": [],
           "measure_s": 0.0, "compilations": {"total": 0, "rl_update": 0, "old_logprobs": 0, "sampler": 0,
                                              "engine": 0, "other": 0},
           "compile_s": 0.0, "steps": [], "param_change": None, "tolerance": TOLERANCE}
    text = rehearse_cli.format_report(rep, "x")
    assert "  (the sampler runs in the rollout layout rollout.mesh=replica=2,tensor=4: data=2,fsdp=1,tensor=4 per " \
           "process)" in text
    assert re.search(r"^  weight_sync layout=replica=2,tensor=4 ", text, re.M), text


def test_the_rehearsal_splits_its_heads_over_the_layout_tensor_axis():
    """narrow_config keeps every head count a multiple of rollout.mesh's tensor axis when it is the larger one (the
    9B simulator trains on tensor=2 and here decodes on tensor=4): 4 KV heads, 4 DeltaNet key heads."""
    from mimesis_jax.plan.rehearse import narrow_config

    paper = workload.load_run_config("configs/mimesis_simrl.py:9b", ["rollout.mesh=replica=4,tensor=4"])
    tm = narrow_config(paper).model
    assert (tm.num_key_value_heads, tm.linear_num_key_heads) == (4, 4)
    assert tm.intermediate_size % (8 * 4) == 0
