"""Every other program of the paper configs against the plan, beside the largest ones in test_plan_compiled.py:
every rung of the RL shape ladders (float32), every paper config's programs in bf16 with the CPU's
float-normalization copies split out (plan/normalization.py `normalization_split`), and the weight sync of 2
processes (inference/weight_sync.py). A module of its own so xdist (`--dist loadfile`) runs it beside
test_plan_compiled.py; each test compiles in a subprocess with the config's fake CPU devices, QUICK options."""


import pytest

from helpers import run_script as _run_script
from mimesis_jax.plan import memory, workload
from mimesis_jax.plan.budget import plan
from mimesis_jax.plan.compiled import TOLERANCE, within
from mimesis_jax.plan.devices import GiB, device_for

F32 = ["train.dtype=float32"]
# the paper RL configs sample through the rollout engine (issue #43 item 5); the static sampler, whose programs are
# compiled here, is this
STATIC = ["rollout.engine=false", "rollout.max_batch=256"]


# the rest of each paper RL config's ladders, float32, QUICK: every update program the ladder lists but the largest
# (test_plan_compiled.py), and every sampler prompt rung but the longest (there too: it is not compiled here and
# dropped, the rungs are built as plan/compiled.py `program_memory` builds them)
RUNGS_SCRIPT = r"""
import dataclasses, json, sys
from mimesis_jax.plan import workload
from mimesis_jax.plan.compiled import QUICK, program_workloads, rl_step_memory, sampler_memory
from mimesis_jax.plan.budget import plan
from mimesis_jax.plan.devices import device_for
out = []
for name in sys.argv[1:]:
    cfg = workload.load_run_config("configs/" + name, ["train.dtype=float32", "rollout.engine=false",
                                                       "rollout.max_batch=256"])  # the static sampler
    mesh = dict(cfg.mesh.axes())
    w = workload.workload_from_config(cfg, mesh, workload.runtime_model(cfg))
    dev = device_for("a100-80g", 16)
    for rung, wp in program_workloads(w)[:-1]:
        out.append([name, rung, plan(wp, dev).train_peak, rl_step_memory(wp, cfg.rl, QUICK)])
    if name.endswith("grpo"):  # the Stage II sampler's prompt ladder (the CSD config samples with the same)
        for P in sorted(set(w.sampler_prompts) | {w.rollout.prompt_len})[:-1]:
            ws = dataclasses.replace(w, rollout=dataclasses.replace(w.rollout, prompt_len=P))
            p, r = plan(ws, dev), ws.rollout
            out.append([name, f"sampler {r.batch}x{r.prompt_len}+{r.new_tokens}",
                        p.rollout_peak - p.item("optimizer state"), sampler_memory(ws, options=QUICK)])
print("RESULT " + json.dumps(out))
"""
RL_CONFIGS = ("qwen3_8b_agentrl.py:grpo", "qwen3_8b_agentrl.py:csd", "mimesis_simrl.py:4b", "mimesis_simrl.py:9b")


@pytest.mark.slow
@pytest.mark.parametrize("configs", [RL_CONFIGS[1:2], RL_CONFIGS[:1] + RL_CONFIGS[2:]], ids=["csd", "grpo-simrl"])
def test_every_ladder_program_matches_the_plan(configs):
    """Beside the largest programs (test_plan_compiled.py): every other update program of each paper RL config's
    shape ladder (the CSD ladder's 32, the GRPO ladder's 5, each simulator's 8) and the Stage II sampler's shorter
    prompt rungs, the programs the ladders' names say, each compiled and within 10% of its plan."""
    rows = _run_script(RUNGS_SCRIPT, 16, *configs)
    want = []
    for name in configs:
        cfg = workload.load_run_config("configs/" + name, F32 + STATIC)
        w = workload.workload_from_config(cfg, dict(cfg.mesh.axes()), workload.runtime_model(cfg))
        rungs = ["rl update " + "x".join(map(str, p)) for p in w.programs]
        assert len(rungs) == len(set(rungs)) == {"grpo": 6, "csd": 33}.get(name.split(":")[1], 9), rungs
        want += [(name, r) for r in rungs[:-1]]
        if name.endswith("grpo"):
            assert len(w.sampler_prompts) == 4 and w.rollout.prompt_len == max(w.sampler_prompts)
            r = w.rollout
            want += [(name, f"sampler {r.batch}x{P}+{r.new_tokens}") for P in sorted(w.sampler_prompts)[:-1]]
    assert [(c, n) for c, n, *_ in rows] == want
    off = [(c, n, round(p / q, 3)) for c, n, p, q in rows if not within(p, q, TOLERANCE)]
    assert not off, off


# the other paper configs' programs in bf16 (the dtype they train in), each split as test_plan_compiled.py splits
# its bf16 programs: the largest update program, its old-log-prob scoring pass and its longest sampler rung (Stage II CSD, both simulators), the 9B SFT
# and both mid-training train steps, and one process's sampler of 2; QUICK compile options. A spec's programs:
# "all", or "updates" (the update and scoring programs only), or "rollout" (one process's of 2)
BF16_ALL_SCRIPT = r"""
import json, sys
from mimesis_jax.plan import workload
from mimesis_jax.plan.compiled import QUICK, program_memory
out = []
for spec in sys.argv[1:]:
    name, programs, *extra = spec.split(",")
    cfg = workload.load_run_config("configs/" + name, extra)
    mesh = dict(cfg.mesh.axes())
    if programs == "rollout":
        cfg, mesh = workload.process_config(cfg, 2), workload.process_mesh(mesh, 2)
    for p in program_memory(cfg, mesh, "a100-80g", largest_only=True, updates=programs != "rollout",
                            sampler=programs != "updates", options=QUICK):
        out.append([spec, p.name, p.planned, p.compiled, p.copies, p.rest])
print("RESULT " + json.dumps(out))
"""
SCORED = "rl.old_logprobs=recompute"
SAMPLER = ",".join(STATIC)  # the RL configs' static sampler
BF16_ALL = {  # spec (config, programs, overrides): the programs it lists
    # the CSD config's sampler is the Stage II GRPO config's program exactly (the same model, mesh and rollout
    # shapes: test_csd_samples_with_the_stage_ii_sampler below), split and checked in bf16 by test_plan_compiled.py
    # (test_bf16_programs_less_their_copies_match_the_plan, "qwen3_8b_agentrl.py:grpo sampler"); not compiled twice
    f"qwen3_8b_agentrl.py:csd,updates,{SAMPLER}": ["rl update 128x9344x9344x12800x9344",
                                                   "old log-probs 128x9344x9344x12800x9344"],
    f"mimesis_simrl.py:4b,all,{SCORED},{SAMPLER}": ["rl update 128x16384x16384x0x0",
                                                    "old log-probs 128x16384x16384x0x0", "sampler 256x14336+2048"],
    f"mimesis_simrl.py:9b,all,{SCORED},{SAMPLER}": ["rl update 128x16384x16384x0x0",
                                                    "old log-probs 128x16384x16384x0x0", "sampler 256x14336+2048"],
    "mimesis_sft.py:9b,all": ["train step"],
    f"qwen3_8b_agentrl.py:grpo,rollout,{SAMPLER}": ["sampler 128x7296+2048"],
    f"mimesis_simrl.py:4b,rollout,{SAMPLER}": ["sampler 128x14336+2048"],
    f"mimesis_simrl.py:9b,rollout,{SAMPLER}": ["sampler 128x14336+2048"],
    "mimesis_midtrain.py:4b,all": ["train step"],
    "mimesis_midtrain.py:9b,all": ["train step"],
}


def test_csd_samples_with_the_stage_ii_sampler():
    """What lets the bf16 test below leave the CSD config's sampler to test_plan_compiled.py's Stage II one: the
    static sampler program (plan/compiled.py `sampler_memory`) is a function of the workload's model, mesh and
    rollout shapes, and those are the Stage II GRPO config's, as is the plan it is compared with."""
    got = []
    for name in ("qwen3_8b_agentrl.py:grpo", "qwen3_8b_agentrl.py:csd"):
        cfg = workload.load_run_config("configs/" + name, STATIC)
        w = workload.workload_from_config(cfg, dict(cfg.mesh.axes()), workload.runtime_model(cfg))
        p = plan(w, device_for("a100-80g", w.num_devices))
        got.append((w.model, w.mesh, w.rollout, w.sampler_prompts, p.rollout_peak - p.item("optimizer state")))
    assert got[0] == got[1]


@pytest.mark.slow
@pytest.mark.parametrize("devices", [16, 32])
def test_every_other_paper_programs_bf16_rest_matches_the_plan(devices):
    """bf16, every paper config beside the Stage II GRPO and 4B SFT programs of test_plan_compiled.py (the CSD
    config's sampler among the Stage II ones, test_csd_samples_with_the_stage_ii_sampler): each
    program compiled on the config's mesh (32 devices for mid-training; one process's sub-mesh of 2 for the
    2-process samplers), its float-normalization copies split out by `normalization_split` (the rule
    test_plan_compiled.py reads against the HLO), and the rest within 10% of the bf16 plan (the ratios are in
    docs/scale-out.md)."""
    specs = [s for s in BF16_ALL if (s.startswith("mimesis_midtrain")) == (devices == 32)]
    rows = _run_script(BF16_ALL_SCRIPT, devices, *specs)
    assert [(s, n) for s, n, *_ in rows] == [(s, n) for s in specs for n in BF16_ALL[s]]
    for spec, name, planned, compiled, copies, rest in rows:
        assert copies is not None and 0 < copies < compiled and rest <= compiled - copies, (spec, name)
        assert within(planned, rest, TOLERANCE), (spec, name, planned / GiB, rest / GiB)


SYNC_SCRIPT = r"""
import json, jax
from mimesis_jax import models
from mimesis_jax.plan import workload
from mimesis_jax.plan.compiled import QUICK, weight_sync_memory
from mimesis_jax.plan.memory import weight_sync_bytes
out = []
for name in ("qwen3_8b_agentrl.py:grpo", "mimesis_simrl.py:9b"):
    cfg = workload.load_run_config("configs/" + name, [])
    m, mesh = workload.runtime_model(cfg), dict(cfg.mesh.axes())
    local = workload.process_mesh(mesh, 2)
    b = weight_sync_bytes(m, mesh, local)
    largest = max(x.size * x.dtype.itemsize for x in jax.tree.leaves(models.abstract_params(m)))
    out.append([name, b.peak, b.moved, b.copy, weight_sync_memory(m, mesh, 2, QUICK), largest])
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_weight_sync_of_two_processes_is_planned_and_never_holds_a_whole_weight():
    """The weight sync (inference/weight_sync.py) from the paper meshes' training layout to 2 processes' blocks,
    compiled on 16 devices: its largest program per device within 10% of `weight_sync_bytes` and under half of
    one whole copy of the largest weight; the copy it leaves is the process block's parameter bytes, and what it
    moves is that less what the device holds already: Stage II's fsdp=8 shards become fsdp=4 ones, the 9B
    simulator's params are replicated over data=2, the axis the processes split, so nothing moves."""
    rows = {name: r for name, *r in _run_script(SYNC_SCRIPT, 16)}
    for name, (peak, moved, copy, compiled, largest) in rows.items():
        assert within(peak, compiled, TOLERANCE) and compiled < largest / 2, (name, peak, compiled, largest)
        cfg = workload.load_run_config("configs/" + name, [])
        m, mesh = workload.runtime_model(cfg), dict(cfg.mesh.axes())
        local = workload.process_mesh(mesh, 2)
        assert copy == memory.param_bytes(m, local)
        assert moved == (copy - memory.param_bytes(m, mesh) if name.startswith("qwen3") else 0)
