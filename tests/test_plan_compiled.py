"""The plan against the programs the loops compile (mimesis_jax/plan/compiled.py): the paper RL configs
(Stage II GRPO and CSD, the 4B and 9B simulators) at their own sizes and on their own 16-device mesh (a
subprocess with 16 fake CPU devices), the 4B and 9B mid-training and SFT stages on their 32 and 8 (a subprocess
with 32), and the CLI's error when the process sees fewer devices than the mesh.

The programs compile in float32 compute (train.dtype=float32): XLA's CPU backend computes bfloat16 in float32,
and its float normalization adds float32 copies of the whole saved-activation stack (the backward scan's
dynamic-slice input, hoisted out of the loop) and of the KV cache that GPU programs do not hold (measured on
qwen3_8b_agentrl.py:grpo in bf16: update 31.29 planned / 48.88 compiled GiB, of which 20.5 GiB is the float32
stack; sampler 45.55 / 76.09). The bf16 programs are compared apart, with those copies and the heap's gaps split
out of their buffer assignment (plan/normalization.py `normalization_split`), within 10%: the Stage II GRPO update, its
old-log-prob scoring pass and its static sampler, the engine's decode and prefill, and the 4B SFT train step, read
against the HLO (every other paper config's programs in bf16, every ladder rung and the weight sync:
test_plan_every_program.py). Compile time does not grow with the
model width (scanned layers, abstract inputs), so the paper widths are kept."""

import argparse
import dataclasses
import functools
import math
import re

import jax
import pytest

from helpers import run_script as _run_script
from mimesis_jax.commands import plan as plan_cli
from mimesis_jax.plan import budget, memory, workload
from mimesis_jax.plan.budget import (engine_prefill_bytes, engine_prefill_copies, engine_prefill_peak, plan,
                                     plan_config, scoring_peak)
from mimesis_jax.plan.compiled import (PALLAS_ON_CPU, QUICK, TOLERANCE, ProgramMemory, engine_decode_memory,
                                       engine_prefill_memory, format_programs, program_memory, program_workloads,
                                       scoring_memory, within)
from mimesis_jax.plan.devices import GiB, device_for
from mimesis_jax.plan.memory import layer_weight_bytes, table_bytes

F32 = ["train.dtype=float32"]
# the paper RL configs sample through the rollout engine (issue #43 item 5); the static sampler, whose programs most
# tests here compile, is this
STATIC = ["rollout.engine=false", "rollout.max_batch=256"]

# per config: the largest update program of the shape ladder, and the sampler where its shapes are new; QUICK
# compile options (plan/compiled.py)
SCRIPT = r"""
import json
from mimesis_jax.plan import workload
from mimesis_jax.plan.budget import engine_decode_peak, engine_mesh, engine_prefill_peak, plan
from mimesis_jax.plan.compiled import QUICK, engine_decode_memory, engine_prefill_memory, program_memory
from mimesis_jax.plan.devices import device_for
out = []
for name, sampler in (("qwen3_8b_agentrl.py:grpo", True), ("qwen3_8b_agentrl.py:csd", False),
                      ("mimesis_simrl.py:4b", True), ("mimesis_simrl.py:9b", True)):
    # the static sampler (rollout.engine=false rollout.max_batch=256); the engine's programs follow
    cfg = workload.load_run_config("configs/" + name, ["train.dtype=float32", "rollout.engine=false",
                                                       "rollout.max_batch=256"])
    for p in program_memory(cfg, dict(cfg.mesh.axes()), "a100-80g", largest_only=True, sampler=sampler,
                            options=QUICK):
        out.append([name, p.name, p.planned, p.compiled])
# the Stage II GRPO config on the rollout engine (rollout.engine=true): its decode burst and largest prefill in the
# engine's replica layout (data=8, fsdp=1, tensor=2 over the 16 devices)
cfg = workload.load_run_config("configs/qwen3_8b_agentrl.py:grpo",
                               ["train.dtype=float32", "rollout.engine=true", "rollout.max_batch=0"])
w = workload.workload_from_config(cfg, dict(cfg.mesh.axes()), workload.runtime_model(cfg))
out.append(["qwen3_8b_agentrl.py:grpo engine", "engine decode", engine_decode_peak(w), engine_decode_memory(w, QUICK)])
out.append(["qwen3_8b_agentrl.py:grpo engine", "engine prefill", engine_prefill_peak(w),
            engine_prefill_memory(w, QUICK)])
# the engine pool's per-device bytes as the engine's own shardings cut it (inference/page_pool.py), Qwen3 and Qwen3.5
import jax, math
from mimesis_jax import models, sharding
from mimesis_jax.models import paged_cache
for name in ("qwen3_8b_agentrl.py:grpo", "mimesis_simrl.py:9b"):
    cfg = workload.load_run_config("configs/" + name, ["train.dtype=float32", "rollout.engine=true",
                                                       "rollout.max_batch=0"])
    w = workload.workload_from_config(cfg, dict(cfg.mesh.axes()), workload.runtime_model(cfg))
    ec, m = w.engine.engine_config(), w.model
    shapes = jax.eval_shape(lambda: models.family(m, "paged").init_paged_cache(m, ec.num_pages, ec.page_size,
                                                                             ec.states))
    lay = engine_mesh(dict(cfg.mesh.axes()))  # the engine's replica layout
    sh = sharding.tree_shardings(sharding.make_mesh(lay), paged_cache.pool_axes(shapes), shapes, m)
    shard = sum(math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize for x, s in
                zip(jax.tree.leaves(shapes), jax.tree.leaves(sh)))
    out.append([name + " engine", "engine pool", plan(w, device_for("a100-80g", 16)).item("engine pool"), shard])
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def rl_programs():
    """{(config, program): (planned GiB, compiled GiB)} from one 16-device subprocess, each program compiled once."""
    rows = _run_script(SCRIPT, 16)
    return {(c, n): (planned / 2 ** 30, compiled / 2 ** 30) for c, n, planned, compiled in rows}


@pytest.mark.slow
def test_paper_rl_programs_are_the_loops_on_their_16_device_mesh(rl_programs):
    assert list(rl_programs) == [("qwen3_8b_agentrl.py:grpo", "rl update 128x9344x9344x0x0"),
                                 ("qwen3_8b_agentrl.py:grpo", "old log-probs 128x9344x9344x0x0"),
                                 ("qwen3_8b_agentrl.py:grpo", "sampler 256x7296+2048"),
                                 ("qwen3_8b_agentrl.py:csd", "rl update 128x9344x9344x12800x9344"),
                                 ("qwen3_8b_agentrl.py:csd", "old log-probs 128x9344x9344x12800x9344"),
                                 ("mimesis_simrl.py:4b", "rl update 128x16384x16384x0x0"),
                                 ("mimesis_simrl.py:4b", "sampler 256x14336+2048"),
                                 ("mimesis_simrl.py:9b", "rl update 128x16384x16384x0x0"),
                                 ("mimesis_simrl.py:9b", "sampler 256x14336+2048"),
                                 ("qwen3_8b_agentrl.py:grpo engine", "engine decode"),
                                 ("qwen3_8b_agentrl.py:grpo engine", "engine prefill"),
                                 ("qwen3_8b_agentrl.py:grpo engine", "engine pool"),
                                 ("mimesis_simrl.py:9b engine", "engine pool")]


@pytest.mark.slow
@pytest.mark.parametrize("config", ["qwen3_8b_agentrl.py:grpo", "qwen3_8b_agentrl.py:csd", "mimesis_simrl.py:4b",
                                    "mimesis_simrl.py:9b", "qwen3_8b_agentrl.py:grpo engine"])
def test_paper_rl_programs_match_the_plan(rl_programs, config):
    got = {n: v for (c, n), v in rl_programs.items() if c == config}
    assert got and all(within(*v, TOLERANCE) for v in got.values()), got


@pytest.mark.slow
def test_engine_pool_is_planned_as_the_engine_shards_it(rl_programs):
    """rollout.engine=true on the paper meshes (tensor=2): the plan's per-device pool equals, to the byte, what the
    engine's own shardings put on a device -- half of every KV page (Qwen3 8B) and of every conv window and
    DeltaNet state (the Qwen3.5 9B simulator); the decode burst that runs on it is within the plan (above)."""
    for config in ("qwen3_8b_agentrl.py:grpo engine", "mimesis_simrl.py:9b engine"):
        planned, shard = rl_programs[(config, "engine pool")]
        assert planned == shard, (config, planned, shard)



# the bf16 programs as the paper configs train them: the Stage II GRPO update, its old-log-prob scoring pass and its
# static sampler (the longest prompt rung) on its 16 devices and the 4B SFT train step on its 8, compiled with a
# dump of XLA's buffer assignment; the float-normalization copies split out by plan/compiled.py
# `normalization_split`; the HLO text (and the program before optimization) comes back for the test's own reading
# of the copies
BF16_SCRIPT = r"""
import glob, json, math, tempfile
from mimesis_jax.plan import workload
from mimesis_jax.plan.budget import engine_decode_peak, engine_prefill_peak, plan, scoring_peak
from mimesis_jax.plan.compiled import (QUICK, engine_decode_memory, engine_prefill_memory, lm_step_memory,
                                       normalization_split, without_persistent_cache,
                                       program_workloads, rl_step_memory, sampler_memory, scoring_memory)
from mimesis_jax.plan.devices import device_for
out = []


def split(compile_fn):
    with tempfile.TemporaryDirectory() as d, without_persistent_cache():
        compiled = compile_fn(QUICK | {"xla_dump_to": d, "xla_dump_hlo_as_text": True})
        n = normalization_split(d)
        # the program before XLA's optimizations, of the module the split read
        (before,) = [open(f.replace("cpu_after_optimizations", "before_optimizations")).read()
                     for f in glob.glob(d + "/*cpu_after_optimizations.txt") if open(f).read() == n.hlo]
        return compiled, (n, before)


def row(name, planned, compiled, nb, stack=None):
    n, before = nb
    out.append(dict(config=name, planned=planned, compiled=compiled, temp=n.temp, peak=n.peak, rest_peak=n.rest_peak,
                    copies=n.copies, charged=n.charged, hlo=n.hlo, before=before, live=n.live, peak_time=n.peak_time,
                    stack=stack))


for name, sets in (("qwen3_8b_agentrl.py:grpo", ["rollout.engine=false", "rollout.max_batch=256"]),
                   ("mimesis_sft.py:4b", [])):  # Stage II with its static sampler
    cfg = workload.load_run_config("configs/" + name, sets)
    mesh = dict(cfg.mesh.axes())
    w = workload.workload_from_config(cfg, mesh, workload.runtime_model(cfg))
    _, wp = program_workloads(w)[-1]
    if w.kind == "lm":
        t = cfg.train
        compiled, n = split(lambda opts: lm_step_memory(wp.model, wp.rows, wp.row_len, mesh, wp.microbatches,
                                                        cfg.optimizer, t.steps, t.nonfinite == "skip", opts))
    else:
        compiled, n = split(lambda opts: rl_step_memory(wp, cfg.rl, opts))
    m = wp.model
    stack = [m.num_hidden_layers, wp.rows // wp.microbatches // math.prod(mesh[a] for a in ("data", "fsdp")), wp.row_len,
             m.hidden_size]
    row(name, plan(wp, device_for("a100-80g", w.num_devices)).train_peak, compiled, n, stack)
    if w.kind != "lm":  # its old-log-prob scoring pass (rl.old_logprobs=recompute)
        compiled, n = split(lambda opts: scoring_memory(wp, cfg.rl, opts))
        row(name + " old log-probs", scoring_peak(wp), compiled, n)
        # its static sampler (the longest prompt rung, w.rollout)
        p = plan(w, device_for("a100-80g", w.num_devices))
        compiled, n = split(lambda opts: sampler_memory(w, options=opts))
        m, r = w.model, w.rollout  # the KV cache: layers x rows per device x length x KV heads per device x head dim
        cache = [m.num_hidden_layers, r.batch // math.prod(mesh[a] for a in ("data", "fsdp")),
                 r.prompt_len + r.new_tokens, m.num_key_value_heads // mesh["tensor"], m.head_dim]
        row(name + " sampler", p.rollout_peak - p.item("optimizer state"), compiled, n)
        out[-1]["cache"] = cache
# the rollout engine's decode burst (rollout.engine=true), its page pool updated in place
cfg = workload.load_run_config("configs/qwen3_8b_agentrl.py:grpo", ["rollout.engine=true", "rollout.max_batch=0"])
w = workload.workload_from_config(cfg, dict(cfg.mesh.axes()), workload.runtime_model(cfg))
p = plan(w, device_for("a100-80g", w.num_devices))
compiled, n = split(lambda opts: engine_decode_memory(w, opts))
row("qwen3_8b_agentrl.py:grpo engine decode", engine_decode_peak(w), compiled, n)
out[-1]["pool"] = p.item("engine pool")
# and its largest prefill chunk (the same pool updated in place)
compiled, n = split(lambda opts: engine_prefill_memory(w, opts))
row("qwen3_8b_agentrl.py:grpo engine prefill", engine_prefill_peak(w), compiled, n)
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def bf16_programs():
    return _run_script(BF16_SCRIPT, 16)


@functools.lru_cache(maxsize=2)
def _index(hlo: str) -> tuple[dict, dict]:
    """({instruction: its defining lines}, {computation: its body's lines}) of an HLO module's text, read once."""
    lines, bodies, body = {}, {}, None
    for x in hlo.splitlines():
        if c := re.match(r"(?:ENTRY )?%(\S+) .*\{$", x):
            body = bodies.setdefault(c[1], [])
        elif x == "}":
            body = None
        elif body is not None:
            body.append(x)
            if m := re.match(r"\s+(?:ROOT )?%(\S+) = ", x):
                lines.setdefault(m[1], []).append(x)
    return lines, bodies


def _defining_line(hlo: str, name: str) -> str:
    (line,) = _index(hlo)[0][name]
    return line


def _is_bf16(hlo: str, name: str) -> bool:
    return bool(re.search(rf"%{re.escape(name)} = bf16\[", hlo))


def _body(hlo: str, computation: str) -> list[str]:
    return _index(hlo)[1][computation]


def _readers(lines: list[str], name: str) -> list[str]:
    """The instructions of `lines` with the value `name` among their operands."""
    return [x for x in lines if re.search(rf" \S+\(([^)]*, )?%{re.escape(name)}[,)]", x.split("=", 1)[-1])]


def _inserted_bf16_convert(line: str) -> bool:
    return bool(re.search(r"= bf16\[\S* convert\(", line)) and "op_name" not in line


def test_bf16_normalization_copies_are_float32_converts_of_bf16_values(bf16_programs):
    """Every copy the split counts at the bf16 programs' peak is, read from the optimized HLO here, a float32
    buffer made by a `convert` without jax's op_name (an XLA-inserted one) from a bf16 value -- a convert of a bf16
    instruction, or a fusion whose root (through bitcasts) is one -- or a float32 value that every reader converts
    to bf16 first with such a convert (a standalone one, or in a fusion every use of the parameter it is passed as:
    the normalized MLP dots' float32 outputs), half its bytes. Its charge, read from the live-range dump here:
    a copy of a bf16 value the fusion computes, half its bytes; a copy of a bf16 buffer of its own, all of them
    while that buffer is live at the peak, and once it has died, half for one copy reading it (the un-normalized
    program holds that bf16 value instead) and all for any other. Among the update programs' copies the float32
    copy of the whole saved-activation stack (layers x rows per device x T x D elements) of the config. The copies
    live at the peak hold at least what the split takes off the peak (compiled = rest + copies + gaps). A float32
    `broadcast` is a copy, half its bytes, exactly when its op_name names a bf16 broadcast of the program before
    XLA's optimizations: the sampler's zero KV cache (layers x rows per device x cache length x KV heads per
    device x head dim elements). A value of a bf16 argument the module updates in place (input_output_alias) --
    its element count, made from that argument or another such value, or a loop's tuple element -- is a copy, all
    its bytes: the engine decode burst's and prefill's page pool, converted whole to float32 (K and V: twice the
    plan's pool in each)."""
    assert any(p["stack"] is None for p in bf16_programs)  # the scoring pass is among them
    lines = {p["config"]: p["hlo"].splitlines() for p in bf16_programs}
    read_as_bf16, broadcasts, in_place = 0, [], {}
    for p in bf16_programs:
        hlo, copies, t = p["hlo"], p["copies"], p["peak_time"]
        assert copies, p["config"]
        ranges = {k: (int(a), int(b)) for k, a, b in re.findall(r"^\s+(\S+\{[\d,]*\}):(\d+)-(\d+)$", p["live"], re.M)}
        dead = {}  # bf16 buffer that died before the peak -> the charges of the copies reading it
        # the bf16 arguments the module updates in place (input_output_alias) and the values charged as theirs
        aliased = {int(i) for i in re.findall(r"\{[\d,]*\}: \((\d+), \{\}", hlo.split("\n", 1)[0])}
        entry = hlo.split("\nENTRY ", 1)[1].split("\n}", 1)[0]
        pools = {m[1]: math.prod(int(d) for d in m[2].split(",")) for m in re.finditer(
            r"^\s+%(\S+) = bf16\[([\d,]+)\]\S* parameter\((\d+)\)", entry, re.M) if int(m[3]) in aliased}
        carried = {n for n, sh, ex, src in p["charged"] if src is None and ex == math.prod(
            int(d) for d in re.match(r"\w+\[([\d,]*)\]", sh)[1].split(",") if d) * (2 if sh.startswith("bf16") else 4)}
        for name, shape, excess, src in copies:
            line = _defining_line(hlo, name)
            dims = [int(d) for d in re.match(r"(?:f32|bf16)\[([\d,]*)\]", shape)[1].split(",") if d]
            if pools and math.prod(dims) in pools.values() and name in carried:
                # a value of the in-place updated argument: all its bytes, made from that argument or another value
                # charged as its (a convert, a copy, an update), or a tuple element a loop carries it in
                operands = re.findall(r"%([^\s,)]+)", line.split("=", 1)[1].split(")")[0])
                assert src is None and excess == math.prod(dims) * (2 if shape.startswith("bf16") else 4), line
                # through the bf16 values the round trip makes back from a charged one and the tuple elements read
                # off a charged loop (the prefill's pool read off each float32 scatter loop, converted back to bf16,
                # then to float32 again)
                for _ in range(3):
                    back = [o for o in operands if o not in pools and o not in carried
                            and re.search(rf"%{re.escape(o)} = (bf16\[|\S+ get-tuple-element\()", hlo)]
                    operands += [x for o in back for x in re.findall(
                        r"%([^\s,)]+)", _defining_line(hlo, o).split("=", 1)[1].split(")")[0])]
                assert set(operands) & (set(pools) | carried) or re.search(r"= \(.*\) (while|parameter)\(", line), line
                in_place[p["config"]] = in_place.get(p["config"], 0) + excess
                continue
            assert f"= {shape} " in line and shape.startswith("f32[")
            nbytes = math.prod(dims) * 4
            if " broadcast(" in line:  # checked below with the program before XLA's optimizations
                continue
            m = re.search(r"= \S+ convert\(%([^\s,)]+)\)", line)
            calls = re.search(r" fusion\((.*?)\).*calls=%([^\s,]+)", line)
            root = None
            if calls:
                body = _body(hlo, calls[2])
                root = next(x for x in body if x.lstrip().startswith("ROOT "))
                # through bitcasts and slices to the value they view (the engine's prefill slices a layer out of
                # a converted bf16 weight stack: convert_slice_fusion)
                sliced = False
                while " bitcast(" in root or " slice(" in root:
                    sliced = sliced or " slice(" in root
                    s = re.search(r"(?:bitcast|slice)\(%([^\s,)]+)\)", root)[1]
                    root = next(x for x in body if re.match(rf"\s+(ROOT )?%{re.escape(s)} = ", x))
            if not m and not (root and re.search(r"= f32\[\S* convert\(", root)):
                # no convert: every reader converts it to bf16 first
                readers = _readers(lines[p["config"]], name)
                assert readers, line
                for r in readers:
                    if " fusion(" not in r:
                        assert _inserted_bf16_convert(r), (line, r)
                        continue
                    operands = re.findall(r"%([^\s,)]+)", re.search(r" fusion\((.*?)\)", r)[1])
                    body = _body(hlo, re.search(r"calls=%([^\s,]+)", r)[1])
                    for i in [i for i, o in enumerate(operands) if o == name]:
                        (param,) = [x for x in body if re.search(rf" parameter\({i}\)", x)]
                        uses = _readers(body, re.match(r"\s+%(\S+) =", param)[1])
                        assert uses and all(_inserted_bf16_convert(u) for u in uses), (line, r, uses)
                assert src is None and excess == nbytes // 2, line
                read_as_bf16 += nbytes
                continue
            if m:  # a standalone convert: its bf16 operand is a buffer of its own
                assert _is_bf16(hlo, m[1]) and "op_name" not in line, line
                operand = m[1]
            else:
                body = "\n".join(_body(hlo, calls[2]))
                s = re.search(r"= f32\[\S* convert\(%([^\s,)]+)\)", root)
                assert s and "op_name" not in root and re.search(rf"%{re.escape(s[1])} = bf16\[", body), root
                own = re.search(rf"%{re.escape(s[1])} = bf16\[\S* parameter\((\d+)\)", body)
                if not own or sliced:  # computed in the fusion (a slice of it: the bf16 slice is a copy too)
                    assert src is None and excess == nbytes // 2, (line, root)
                    continue
                operand = re.findall(r"%([^\s,)]+)", calls[1])[int(own[1])]
            # the buffer read: the operand's own, or the tuple element a get-tuple-element of it names
            gte = re.search(rf"%{re.escape(operand)} = \S+ get-tuple-element\(%([^\s,)]+)\)", hlo)
            assert src.startswith((gte[1] if gte else operand) + "{"), (line, src)
            a, b = ranges.get(src, (0, t))  # no live range: an argument of the program
            if a <= t <= b:
                assert excess == nbytes, (line, src)
            else:
                dead.setdefault(src, []).append(excess / nbytes)
        for src, charges in dead.items():
            assert sorted(charges) == [0.5] + [1.0] * (len(charges) - 1), (p["config"], src, charges)
        if p["stack"]:  # the saved-activation stack's float32 copy: copies shaped [..., T, D], >= layers x rows x T x D
            L, b, T, D = p["stack"]
            shapes = [[int(d) for d in re.match(r"f32\[([\d,]*)\]", sh)[1].split(",") if d] for _, sh, _, _ in copies]
            assert sum(math.prod(s) for s in shapes if s[-2:] == [T, D]) >= L * b * T * D, (p["config"], shapes)
        # the live ranges rebuild XLA's heap: their peak is at most its allocation (the rest leaves the gaps out)
        assert 0 < p["peak"] <= p["temp"]
        assert sum(c[2] for c in copies) >= p["peak"] - p["rest_peak"] > 0
        # the float32 broadcasts of a bf16 broadcast in jax's program, read from both programs here
        jax_bf16 = set(re.findall(r"^\s+(?:ROOT )?%(\S+) = bf16\[\S* broadcast\(", p["before"], re.M))
        charged = {n: (sh, ex) for n, sh, ex, _ in p["charged"]}
        for line in hlo.splitlines():
            b = re.match(r'\s+(?:ROOT )?%(\S+) = (f32\[[\d,]*\])\S* broadcast\(.*op_name="([^"]+)"', line)
            if b and b[1] in charged or b and b[3] in jax_bf16:
                nbytes = math.prod(int(d) for d in re.findall(r"\d+", b[2][4:])) * 4
                assert b[3] in jax_bf16 and charged.get(b[1], (None, 0))[1] == nbytes // 2, line
                broadcasts.append((p["config"], b[2], nbytes))
    assert read_as_bf16  # the scoring pass's MLP dot outputs
    # the engine decode burst's and prefill's page pool (K and V, bf16 per device) held whole in float32 at their
    # peaks: twice its bytes in each
    (engine,) = [p for p in bf16_programs if p["config"].endswith(" engine decode")]
    assert in_place == {engine["config"]: 2 * engine["pool"],
                        engine["config"].replace("decode", "prefill"): 2 * engine["pool"]}, (in_place, engine["pool"])
    (sampler,) = [p for p in bf16_programs if p["config"].endswith(" sampler")]
    assert [b for b in broadcasts if b[0] == sampler["config"]] and all(
        f"f32[{','.join(map(str, sampler['cache']))}]" == sh for c, sh, _ in broadcasts if c == sampler["config"]), \
        broadcasts


def test_bf16_programs_less_their_copies_match_the_plan(bf16_programs):
    """compiled = rest + copies + gaps: the bf16 plan of each program (the GRPO update, its old-log-prob scoring
    pass and its sampler, the SFT step, the engine's decode burst and prefill) within 10% of its rest (the ratios are in docs/scale-out.md)."""
    got = {p["config"]: p for p in bf16_programs}
    assert list(got) == ["qwen3_8b_agentrl.py:grpo", "qwen3_8b_agentrl.py:grpo old log-probs",
                         "qwen3_8b_agentrl.py:grpo sampler", "mimesis_sft.py:4b",
                         "qwen3_8b_agentrl.py:grpo engine decode", "qwen3_8b_agentrl.py:grpo engine prefill"]
    for name, g in got.items():
        if name not in ENGINE_BF16_ROWS:  # test_bf16_engine_programs_less_their_copies_match_the_plan
            _rest_within_plan(name, g)


def _rest_within_plan(name, g):
    rest = g["compiled"] - (g["temp"] - g["rest_peak"])
    assert 0 < rest < g["compiled"]
    assert within(g["planned"], rest, TOLERANCE), (name, g["planned"] / GiB, rest / GiB)


ENGINE_BF16_ROWS = ("qwen3_8b_agentrl.py:grpo engine decode", "qwen3_8b_agentrl.py:grpo engine prefill")


# bf16 on the CPU backend, the Qwen3-8B decode burst's rest (compiled - normalization copies - gaps) is 46.25 GiB
# against 40.96 planned (0.886): 5.3 GiB more than the plan, about half the bf16 burst; the Qwen3.5-9B decode
# (fewer attention layers) is at 0.999 and both prefills within 5%. The float32 compile of the same program is
# within 1% (test_paper_rl_programs_match_the_plan), so the excess is likely the CPU's float normalization of the
# burst's attention (a float32 value computed and carried through the decode loop is no convert-made copy, and
# the split catches only those: plan/compiled.py); unproven without a GPU compile, so the row stays a strict
# xfail
BF16_DECODE_ON_CPU = pytest.mark.xfail(strict=True, reason="bf16 on CPU: the 8B decode burst's rest is 0.886 of "
                                       "its plan (float-normalized attention carried through the decode loop)")


@pytest.mark.parametrize("name", [pytest.param(ENGINE_BF16_ROWS[0], marks=BF16_DECODE_ON_CPU), ENGINE_BF16_ROWS[1]])
def test_bf16_engine_programs_less_their_copies_match_the_plan(bf16_programs, name):
    """The engine's bf16 decode burst and prefill in its replica layout against their plan (budget.engine_decode_peak,
    engine_prefill_peak), the CPU's float-normalization copies split out; apart from the other bf16 programs'
    check so that each row fails on its own."""
    got = {p["config"]: p for p in bf16_programs}
    _rest_within_plan(name, got[name])


LM_CONFIGS = ("mimesis_midtrain.py:4b", "mimesis_midtrain.py:9b", "mimesis_sft.py:4b", "mimesis_sft.py:9b")
# each paper LM stage's train step (its micro-batch scan, full remat, blockwise attention) on its own mesh: 32
# devices for mid-training, 8 for SFT; QUICK compile options
LM_SCRIPT = r"""
import json, sys
from mimesis_jax.plan import workload
from mimesis_jax.plan.compiled import QUICK, program_memory
out = []
for name in sys.argv[1:]:
    cfg = workload.load_run_config("configs/" + name, ["train.dtype=float32"])
    for p in program_memory(cfg, dict(cfg.mesh.axes()), "a100-80g", options=QUICK):
        out.append([name, p.name, p.planned, p.compiled])
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def lm_programs():
    """{config: (program name, planned bytes, compiled bytes)} from one 32-device subprocess, each step compiled
    once."""
    rows = _run_script(LM_SCRIPT, 32, *LM_CONFIGS)
    assert [c for c, *_ in rows] == list(LM_CONFIGS), rows
    return {c: (n, planned, compiled) for c, n, planned, compiled in rows}


@pytest.mark.parametrize("config", LM_CONFIGS)
def test_lm_stage_matches_the_plan_within_10_percent_on_its_mesh(lm_programs, config):
    """The train step of each paper LM stage within 10% of its plan: the layer backward's peak holds the saved
    layer inputs, the scanned block's inputs sliced from them, one layer recomputed with its backward, and the
    [V, D] tables beside it (budget.plan; the ratios are in docs/scale-out.md)."""
    name, planned, compiled = lm_programs[config]
    assert name == "train step"
    assert within(planned, compiled, TOLERANCE), (planned / 2 ** 30, compiled / 2 ** 30)


@pytest.mark.parametrize("config,extra", [("qwen3_8b_agentrl.py:grpo", []),
                                          ("mimesis_simrl.py:4b", ["rl.old_logprobs=recompute"])])
def test_scoring_pass_matches_the_plan_on_8_devices(config, extra):
    """The old-log-prob scoring pass (rl.old_logprobs=recompute) of the largest update program, the paper mesh's
    fsdp axis halved to fit the tests' 8 devices (measured here: Qwen3 8B 13.70 planned / 13.81 compiled GiB, the
    Qwen3.5 4B DeltaNet simulator 17.83 / 19.03)."""
    cfg = workload.load_run_config("configs/" + config, F32 + extra)
    mesh = {"data": 1, "fsdp": 4, "tensor": 2}
    w = workload.workload_from_config(cfg, mesh, workload.runtime_model(cfg))
    _, wp = program_workloads(w)[-1]
    planned, compiled = scoring_peak(wp), scoring_memory(wp, cfg.rl, QUICK)
    assert within(planned, compiled, TOLERANCE), (planned / 2 ** 30, compiled / 2 ** 30)


def test_engine_prefill_working_set_and_copies_by_hand():
    """The rollout engine's largest prefill chunk for the paper Stage II config (4 rows x 64 tokens over 584-page
    tables, Qwen3 8B widths) in the engine's replica layout over its 16 devices (data=8, fsdp=1, tensor=2; the
    training mesh's fsdp=8 becomes 8 replicas): its working set (budget.engine_prefill_bytes) and the copies the
    program holds beyond it (engine_prefill_copies), by hand. The whole program is compiled against the plan on
    16 devices at 36 layers (test_paper_rl_programs_match_the_plan)."""
    cfg = workload.load_run_config("configs/qwen3_8b_agentrl.py:grpo",
                                   F32 + ["rollout.engine=true", "rollout.max_batch=0"])
    w = workload.workload_from_config(cfg, dict(cfg.mesh.axes()), workload.runtime_model(cfg))
    assert budget.engine_mesh(w.mesh) == {"data": 8, "fsdp": 1, "tensor": 2}
    # the gathered K and V 2 [4 rows, 8/2 KV heads, 9,344, 128] + fp32 scores and softmax 2 [4, 32/2 heads, 64,
    # 9,344] + the mask [4, 64, 9,344] + q/k/v [4, 64, (32 + 8 + 8)/2 heads, 128] + the residual stream 2 [4, 64,
    # 4,096], float32: the heads split over tensor=2 as the engine's weights and pool are
    R, C, S = 4, 64, 9344
    work = 2 * R * 4 * S * 128 * 4 + 2 * R * 16 * C * S * 4 + R * C * S + R * C * 24 * 128 * 4 + 2 * R * C * 4096 * 4
    assert engine_prefill_bytes(w) == work
    # 36 layers' weights split over tensor (q and o 4,096 x 4,096, k and v 4,096 x 1,024, gate, up and down 4,096 x
    # 12,288; the four norms whole: q/k norms 128, the two layer norms 4,096) + the [V, D] LM head, vocab split
    # over tensor; float32
    layer = (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288) // 2 + 2 * 128 + 2 * 4096
    assert engine_prefill_copies(w) == 4 * (36 * layer + 151_936 * 4096 // 2)
    # the decode burst holds the same layer copies beside its slot-major page copy: 16 slots x 585 pages x 16
    # tokens x 36 layers x K and V x 4 KV heads x 128, float32
    burst = 16 * 585 * 16 * 36 * 2 * 4 * 128 * 4
    pool = w.engine.num_pages * 16 * 36 * 2 * 4 * 128 * 4
    params = memory.param_bytes(w.model, {"data": 8, "fsdp": 1, "tensor": 2})
    assert budget.engine_decode_peak(w) == params + pool + burst + 4 * 36 * layer


def test_pallas_attention_is_planned_as_blockwise_and_the_cpu_compile_says_it_interprets(capsys):
    """attention_impl=pallas: the plan counts the blockwise backend's blocks (a note says so), and the --compiled
    table notes that the CPU backend compiles the kernels' interpreter, not the kernels (plan/compiled.py)."""
    argv = ["--config", "configs/tiny_sft.py", "--device", "cpu", "--set", "model.attention_impl=pallas"]
    assert plan_cli.run(plan_cli.add_args(argparse.ArgumentParser()).parse_args(argv)) == 0
    out = capsys.readouterr().out
    assert "pallas attention" in out and "note: attention_impl=pallas is planned as blockwise" in out
    cfg = workload.load_run_config("configs/tiny_sft.py", ["model.attention_impl=pallas"])
    w = workload.workload_from_config(cfg, {"data": 1, "fsdp": 8, "tensor": 1}, workload.runtime_model(cfg))
    blockwise = dataclasses.replace(w, model=dataclasses.replace(w.model, attention_impl="blockwise"))
    dev = device_for("cpu", 8)
    assert plan(w, dev).train_peak == plan(blockwise, dev).train_peak
    table = format_programs([ProgramMemory("train step", 3 * 2 ** 30, 2 * 2 ** 30)], w.model)
    assert table.splitlines()[1].split()[-3:] == ["3.00", "2.00", "1.500"]
    assert table.splitlines()[-1] == f"  note: {PALLAS_ON_CPU}"
    assert "interpret mode" in PALLAS_ON_CPU
    assert "note" not in format_programs([ProgramMemory("train step", 1, 1)], blockwise.model)


def test_compiled_table_splits_the_normalization_copies_where_measured():
    """A row with its float-normalization copies split out shows compiled, copies, gaps, rest = compiled - copies -
    gaps and planned / rest; a row without keeps its compiled total and planned / compiled; the note names the split
    rows and, of them, those whose rest the bf16 test above checks (the update programs, the scoring pass, the
    sampler, the engine's decode burst and prefill) and those it does not (here a made-up one)."""
    cfg = workload.load_run_config("configs/tiny_sft.py", ["train.dtype=bfloat16"])
    rows = [ProgramMemory("rl update", 3 * GiB, 5 * GiB, 2 * GiB), ProgramMemory("sampler", 3 * GiB, 4 * GiB),
            ProgramMemory("old log-probs", 4 * GiB, 6 * GiB, 1 * GiB),
            ProgramMemory("other program", 2 * GiB, 9 * GiB, 1 * GiB, GiB // 2),
            ProgramMemory("sampler", 3 * GiB, 7 * GiB, 2 * GiB, 2 * GiB)]
    lines = format_programs(rows, workload.runtime_model(cfg)).splitlines()
    assert lines[0].split()[-6:] == ["GiB", "gaps", "GiB", "rest", "GiB", "ratio"]
    assert lines[1].split()[-6:] == ["3.00", "5.00", "2.00", "0.00", "3.00", "1.000"]
    assert lines[2].split()[-6:] == ["3.00", "4.00", "-", "-", "-", "0.750"]
    assert lines[3].split()[-6:] == ["4.00", "6.00", "1.00", "0.00", "5.00", "0.800"]
    assert lines[4].split()[-6:] == ["2.00", "9.00", "1.00", "0.50", "7.50", "0.267"]
    assert lines[5].split()[-6:] == ["3.00", "7.00", "2.00", "2.00", "3.00", "1.000"]
    note = lines[6]
    assert "rest = compiled - copies - gaps" in note
    assert note.count("split for: rl update, old log-probs, other program, sampler;") == 1
    assert re.search(r"checked this way \(.*\): rl update, old log-probs, sampler; not checked this way, in float32 "
                     r"only \(.*\): other program; the other rows", note), note
    # the smallest ratio, the unchecked split row's 0.267 left out: the unsplit row's 0.750 (split rows: planned / rest)
    assert plan_cli.checked_error(rows)[0] == 0.25
    # a split row the bf16 test does not check measures the CPU backend: it does not widen the error, a checked one does
    low = ProgramMemory("other program", 1 * GiB, 6 * GiB, 1 * GiB)  # planned / rest 0.2
    assert plan_cli.checked_error(rows[:1] + [low])[0] == TOLERANCE
    error, what = plan_cli.checked_error([ProgramMemory("rl update", 1 * GiB, 6 * GiB, 1 * GiB), low])
    assert error == pytest.approx(0.8) and "(rl update)" in what


def test_a_split_program_compiled_before_is_dumped_again():
    """The persistent compilation cache (on in this test run: tests/conftest.py) keys programs without their dump
    options, so a program compiled before would come back from it with no buffer assignment dumped: the split
    compiles it afresh (plan/normalization.py `without_persistent_cache`), the same copies each time."""
    from mimesis_jax.config import tiny_qwen3
    from mimesis_jax.plan.compiled import lm_step_memory, split_compile
    from mimesis_jax.train.optim import OptimizerConfig
    assert jax.config.jax_compilation_cache_dir  # the cache this test is about
    mc = tiny_qwen3().replace(dtype="bfloat16")
    axes = {"data": 1, "fsdp": 2, "tensor": 1}

    def compile_fn(opts):
        return lm_step_memory(mc, 4, 64, axes, 1, OptimizerConfig(), options=opts)
    first, second = split_compile(compile_fn, QUICK), split_compile(compile_fn, QUICK)
    assert first[0] == second[0] and first[1].extra == second[1].extra > 0
    assert jax.config.jax_enable_compilation_cache  # left on


def test_compiled_needs_the_mesh_devices(capsys):
    args = plan_cli.add_args(argparse.ArgumentParser()).parse_args(
        ["--config", "configs/qwen3_8b_agentrl.py:grpo", "--compiled"])
    assert plan_cli.run(args) == 2  # 16 devices, the tests see 8
    err = capsys.readouterr().err
    assert err.startswith("error: --compiled") and "needs 16 devices" in err
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=16" in err


@pytest.mark.parametrize("config,extra", [("qwen3_8b_agentrl.py:grpo", STATIC), ("qwen3_8b_agentrl.py:grpo", [])])
def test_one_process_of_two_rolls_out_within_the_plan(config, extra):
    """The paper Stage II config on 2 processes x 8 devices (2 nodes of 8 GPUs): each process samples its 64 of the
    128 tasks on its own 8 devices with its own parameter copy (distributed.rollout_params) -- the static sampler
    on its sub-mesh data=1,fsdp=4,tensor=2 with at most ceil(max_batch / 2) = 128 sequences per call
    (distributed.process_max_batch), the engine in its replica layout data=4,fsdp=1,tensor=2 -- the programs that
    process compiles, built here on 8 devices, against `plan --processes 2`'s numbers for them (float32 compute,
    QUICK)."""
    cfg = workload.load_run_config("configs/" + config, F32 + extra)
    engine = cfg.rollout.engine  # the config's default; STATIC turns it off
    assert engine == (not extra)
    mesh = dict(cfg.mesh.axes())
    assert workload.process_mesh(mesh, 2) == {"data": 1, "fsdp": 4, "tensor": 2}
    local = workload.rollout_axes(cfg, mesh, 2)
    assert local == ({"data": 4, "fsdp": 1, "tensor": 2} if engine else {"data": 1, "fsdp": 4, "tensor": 2})
    cfg_p = workload.process_config(cfg, 2)
    assert (cfg_p.rollout.prompts_per_step, cfg_p.rollout.max_batch) == (64, 0 if engine else 128)
    programs = program_memory(cfg_p, local, "a100-80g", largest_only=True, updates=False, options=QUICK)
    names = [p.name.split(" ")[:2] for p in programs]
    assert names == ([["engine", "prefill"], ["engine", "decode"]] if engine else [["sampler", "128x7296+2048"]])
    for p in programs:
        assert within(p.planned, p.compiled, TOLERANCE), (p.name, p.planned / 2 ** 30, p.compiled / 2 ** 30)


@pytest.mark.parametrize("config", ["mimesis_simrl.py:4b", "mimesis_simrl.py:9b"])
def test_one_process_of_two_samples_the_simulator_within_the_plan(config):
    """The paper simulator configs on 2 processes x 8 devices: each process's one sampler program (128 of the 256
    rollouts on data=1,fsdp=4,tensor=2, prompts at the 14,336 tokens the context budget leaves) within the plan
    `plan --processes 2` makes for it (float32, QUICK; the static sampler, STATIC)."""
    cfg = workload.load_run_config("configs/" + config, F32 + STATIC)
    local = workload.process_mesh(dict(cfg.mesh.axes()), 2)
    assert local == {"data": 1, "fsdp": 4, "tensor": 2}
    (p,) = program_memory(workload.process_config(cfg, 2), local, "a100-80g", updates=False, options=QUICK)
    assert p.name == "sampler 128x14336+2048"
    assert within(p.planned, p.compiled, TOLERANCE), (p.planned / 2 ** 30, p.compiled / 2 ** 30)


def test_plan_on_processes_prints_the_weight_sync(capsys):
    """`plan --processes 2` on the Stage II config with the static sampler: the sync line gives the bytes each
    device receives, by hand the process block's fp32 parameter bytes less the training shard's (fsdp=8 ->
    fsdp=4)."""
    name = "configs/qwen3_8b_agentrl.py:grpo"
    argv = ["--config", name, "--processes", "2", "--set", *STATIC]
    assert plan_cli.run(plan_cli.add_args(argparse.ArgumentParser()).parse_args(argv)) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("weight sync into each process")]
    cfg = workload.load_run_config(name, STATIC)
    m, mesh = workload.runtime_model(cfg), dict(cfg.mesh.axes())
    assert workload.process_mesh(mesh, 2) == {"data": 1, "fsdp": 4, "tensor": 2}
    moved = memory.param_bytes(m, {"data": 1, "fsdp": 4, "tensor": 2}) - memory.param_bytes(m, mesh)
    assert f": {moved / GiB:.2f} GiB received per device, " in line, line


def test_plan_on_processes_names_the_key_that_fits(capsys):
    """On N processes each process rolls out its share of the tasks on its own sub-mesh, with its own parameter
    copy: the 9B simulator config with the static sampler (STATIC) fits one 16-device process but not 2. `plan
    --processes 2` says so with the figures of the whole mesh's and one process's plans. With the update in 8
    micro-batches (the train step FITS with room for the planner error, budget.verdict) it names the
    rollout.max_batch (the config's halved) under which the rollout FITS on 2 processes too -- re-planned here, it
    does, and twice it does not; in 2 micro-batches the train step alone does not fit, so no rollout.max_batch
    can, and it says that instead."""
    name, n = "configs/mimesis_simrl.py:9b", 2
    e = plan_cli.checked_error()[0]

    def run(*sets):
        argv = ["--config", name, "--processes", str(n), "--set", *STATIC, *sets]
        assert plan_cli.run(plan_cli.add_args(argparse.ArgumentParser()).parse_args(argv)) == 0
        out = capsys.readouterr().out.splitlines()
        i = next(i for i, line in enumerate(out) if line.startswith(f"rollout on each of {n} processes"))
        return out[i:]

    def on_processes(*sets):
        """The config with `sets`, its plan on the whole mesh and one process's plan on its sub-mesh, and the
        rollout peak by hand: the training state every device keeps + that process's rollout program."""
        cfg = workload.load_run_config(name, STATIC + list(sets))
        mesh = dict(cfg.mesh.axes())
        p = plan_config(cfg, mesh, "a100-80g")
        pp = plan_config(workload.process_config(cfg, n), workload.process_mesh(mesh, n), "a100-80g")
        state = p.item("parameters") + p.item("optimizer state")
        return cfg, p, pp, state, state + pp.rollout_peak - pp.item("optimizer state")

    def gib(x):
        return f"{x / GiB:.2f}"

    head, program, total = run()[:3]
    cfg, p, pp, state, peak = on_processes()
    r, mesh = cfg.rollout, dict(cfg.mesh.axes())
    assert p.fits and peak > p.usable  # one process fits; on 2 the rollout phase does not
    # the sub-mesh holds a process's share of the devices; a call samples the process's share of the config's
    # max_batch (at most its tasks' rollouts), each prompt up to the context less the new tokens
    m = re.fullmatch(rf"rollout on each of {n} processes: its sub-mesh (\S+), sampler calls of (\d+) x \((\d+) \+ "
                     rf"(\d+)\) tokens \((\d+) of (\d+) tasks per step\)", head)
    assert m, head
    sub = dict((a, int(v)) for a, v in (kv.split("=") for kv in m[1].split(",")))
    assert math.prod(sub.values()) * n == math.prod(mesh.values()) and sub == pp.workload.mesh
    share = math.ceil(r.prompts_per_step / n)
    batch = min(math.ceil(r.max_batch / n), share * r.group_size)
    assert [int(m[i]) for i in range(2, 7)] == [batch, r.max_context_tokens - r.max_tokens, r.max_tokens, share,
                                                r.prompts_per_step]
    assert program.split() == (f"its rollout program {gib(peak - state)} GiB per device (of which its own parameter "
                               f"copy {gib(pp.item('parameters'))} GiB) + the training state kept on every device "
                               f"{gib(state)} GiB = rollout peak {gib(peak)} GiB").split()
    most = max(p.train_peak, peak)
    assert total.startswith(f"total {gib(most)} GiB of {gib(p.device.bytes)} GiB ({gib(p.usable)} GiB usable): "
                            f"margin {(p.usable - most) / GiB:+.2f} GiB")
    assert total.endswith(f"DOES NOT FIT on {n} processes")
    # in 2 micro-batches the train step alone does not fit with room for the error: no rollout.max_batch can help
    _, p2, _, _, _ = on_processes("rl.num_microbatches=2")
    assert budget.verdict(p2.train_peak, p2.usable, e) != "FITS"
    assert run("rl.num_microbatches=2")[3].startswith(
        f"suggestion: no rollout.max_batch FITS on {n} processes: the train step alone (")
    _, p8, _, _, _ = on_processes("rl.num_microbatches=8")
    assert budget.verdict(p8.train_peak, p8.usable, e) == "FITS"
    line = run("rl.num_microbatches=8")[3]
    m = re.match(rf"suggestion: --set rollout\.max_batch=(\d+) -> rollout peak (\S+) GiB,.*-> FITS on {n} processes$",
                 line)
    assert m, line
    k = int(m[1])
    assert r.max_batch % k == 0 and (r.max_batch // k) & (r.max_batch // k - 1) == 0  # the config's halved
    _, p_k, _, _, peak_k = on_processes("rl.num_microbatches=8", f"rollout.max_batch={k}")
    assert m[2] == gib(peak_k) and budget.verdict(max(p_k.train_peak, peak_k), p_k.usable, e) == "FITS"
    _, p_2k, _, _, peak_2k = on_processes("rl.num_microbatches=8", f"rollout.max_batch={2 * k}")
    assert budget.verdict(max(p_2k.train_peak, peak_2k), p_2k.usable, e) != "FITS"
    assert run("rl.num_microbatches=8", f"rollout.max_batch={k}")[2].endswith(f"-> FITS on {n} processes")
    args = plan_cli.add_args(argparse.ArgumentParser()).parse_args(
        ["--config", "configs/mimesis_simrl.py:9b", "--processes", "3"])
    assert plan_cli.run(args) == 2
    assert capsys.readouterr().err == "error: --processes 3: must be >= 1 and divide the mesh's 16 devices\n"
