"""`python -m mimesis_jax rehearse`: a paper RL config narrowed to tiny widths with its structure kept
(plan/rehearse.py `narrow_config`), run for a step or two on this machine's devices, with what it cost.

    python -m mimesis_jax rehearse --config configs/qwen3_8b_agentrl.py:csd [--engine config|off|on|both] [--steps 1]

On a CPU (JAX_PLATFORMS unset or cpu) in one process it gives the CPU backend the config's mesh of fake devices
itself (`provide_cpu_devices`: jax_num_cpu_devices, set before the backend starts); where it cannot (a backend
already started, another platform, several processes) too few devices are a one-line error naming the flags.

On several processes (jax.distributed: `--distributed`, as every launch/local.sh stage) the config's mesh spans
all processes' devices, e.g. 2 x 8 for the 16-device paper RL configs, and process 0 prints:

    NUM_PROCESSES=2 XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \\
        launch/local.sh rehearse configs/qwen3_8b_agentrl.py:csd runs/rehearse_2proc --tokens 32

(the sampler's memory is then that of each process's part of the mesh, where it runs: train/rl/distributed.py
rollout_mesh; its cost on a CPU, docs/scale-out.md, keeps it out of CI).

`--set train.dtype=float32` rehearses (and plans) in fp32: on a CPU the bf16 programs compile larger than the
planner, sized for accelerators, counts, the fp32 ones close to it (docs/scale-out.md), so fp32 is the honest
compare there.

Prints, per rollout mode (rollout.engine off / on):
* every program the loop compiled: the RL update once per batch shape (the shape ladder's programs for Stage II),
  the static sampler once per bucket -- each program's compiled bytes per device (XLA's memory analysis of the
  executable the run compiled, lowered again on abstract inputs of its shapes and shardings, which jax answers
  from its cache: plan/compiled.py `update_memory`, `sampler_memory`, `compiled_total`; any it compiles again
  are named) next to the planner's for that shape (`plan`: the train-step peak; the sampler: the rollout peak
  less the optimizer state) and their ratio, marked `ok` within plan/compiled.py TOLERANCE, else `OFF` and
  listed again at the end (`off_programs`: what the tests assert empty). With `rollout.mesh` set the sampler
  programs are those of that rollout layout (train/rl/distributed.py rollout_mesh), and a `weight_sync` row
  naming the layout gives the sync's largest program into it (plan/compiled.py weight_sync_memory). The rollout
  engine's programs are counted, not measured here (`plan --compiled` compiles the engine's decode burst:
  plan/compiled.py engine_decode_memory);
* the compilations of the run (jax's compile events, profiling.count_compilations): the update's, the old-log-prob
  scoring's, the sampler's, the engine's and the rest (eager ops, initialisation, checkpointing);
* per step: rollout / coach / train seconds, the tokens generated and trained, and from the learner's step record
  `num_compilations` (the update, old-log-prob, sampler and engine programs compiled so far; its parts
  `compilations/update`, `compilations/old_logprobs`, `compilations/sampler`, `compilations/engine`), `reward_mean`, `loss` (None without an update) and
  the policy engine's `engine/reused_tokens` and `engine/evictions` (0 with the engine off);
* `param_change`: the L2 norm of the parameters' change over the run (one process; None on several), > 0 once
  an update moved them.
`--json FILE` writes the same as JSON. The run happens in --workdir (default: a temporary directory, removed) and
writes no checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time

import jax

from mimesis_jax.algorithms.rl_batch import BRANCH_KEYS, SHAPE_FIELDS
from mimesis_jax.config.layout import layout_text
from mimesis_jax.errors import ConfigError
from mimesis_jax.plan.budget import plan
from mimesis_jax.plan.devices import DEVICES, mesh_text
from mimesis_jax.plan.rehearse import narrow_config
from mimesis_jax.plan.workload import Rollout, load_run_config, workload_from_config

# rollout.engine per rehearsal: None = as the config sets it (the paper RL configs: on)
MODES = {"config": (None,), "off": (False,), "on": (True,), "both": (False, True)}
# the policy engine's per-step counters the report copies from the learner's step record (0 with the engine off)
ENGINE_KEYS = ("engine/reused_tokens", "engine/evictions")
MiB = 2 ** 20


def add_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--config", required=True, help="configs/<name>.py[:variant] (AgentRLConfig or SimRLConfig)")
    p.add_argument("--engine", default="config", choices=sorted(MODES), help="rollout.engine: as the config "
                   "sets it (default; the paper RL configs: on), off (the static sampler, with the config's "
                   "rollout.max_batch: add --set rollout.max_batch=256 for the paper configs' static setting), on "
                   "(with rollout.max_batch=0), or both one after the other")
    p.add_argument("--steps", type=int, default=1, help="RL steps per mode (default 1)")
    p.add_argument("--width", type=int, default=64, help="hidden size of the narrowed model (default 64)")
    p.add_argument("--repeats", type=int, default=None, help="repeats of the layer pattern's period (default: the "
                   "fewest making >= 2 layers: Qwen3 2, Qwen3.5 1)")
    p.add_argument("--tokens", type=int, default=16, help="the token budgets are divided by this (default 16)")
    p.add_argument("--batch", type=int, default=16, help="prompts per step are divided by this (default 16)")
    p.add_argument("--workdir", default=None, help="run here (default: a temporary directory, removed)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the report as JSON")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override the paper config before it is narrowed")
    g = p.add_argument_group("multi-host (launch/local.sh rehearse: the mesh spans every process's devices)")
    g.add_argument("--distributed", action="store_true", help="initialise jax.distributed first")
    g.add_argument("--coordinator", default=None, help="host:port of process 0 (auto-detected if omitted)")
    g.add_argument("--num-processes", type=int, default=None)
    g.add_argument("--process-id", type=int, default=None)
    return p


def mesh_size(cfg) -> int:
    axes = cfg.mesh.axes()
    if any(v < 1 for v in axes.values()):
        raise ConfigError(f"config section 'mesh': rehearse needs fixed axis sizes, got {axes}")
    return math.prod(axes.values())


# ------------------------------------------------------------------------------------------- measuring
def _step_shapes(key) -> dict[str, tuple[int, ...]]:
    """RLStep.shape_keys entry -> {array name: [M, B/M, ...] shape}."""
    return {k: tuple(v) for k, v in key[1:]}


def _program_workload(w, shapes: dict):
    M, B, T = shapes["tokens"]
    branch = shapes[BRANCH_KEYS[0]][2] if BRANCH_KEYS[0] in shapes else 0
    branch_head = shapes["branch_head_idx"][2] if "branch_head_idx" in shapes else 0
    return dataclasses.replace(w, rows=M * B, microbatches=M, row_len=T, head_len=shapes["head_idx"][2],
                               branch_len=branch, branch_head_len=branch_head)


def _update_shapes(key, w) -> dict:
    """A RLStep.shape_keys entry -> update_memory's {name: (shape, dtype)} (the dtypes the packer gives them)."""
    import jax.numpy as jnp
    from mimesis_jax.plan.compiled import rl_batch_shapes

    dtypes = {k: d for k, (_, d) in rl_batch_shapes(w, behaviour=True).items()}
    return {k: (s, dtypes.get(k, jnp.int32)) for k, s in _step_shapes(key).items()}


def _programs(run_state, cfg, sampler_shapes, options=None, updates: bool = True) -> tuple[list[dict], object]:
    """The memory of the programs the run compiled. options=None: each is lowered as the loop called it, so jax
    hands back the executable the loop compiled (an input that differs from the loop's compiles it again, and
    rehearse_once counts that); else compiled again with these XLA options (plan/compiled.py QUICK)."""
    from mimesis_jax.plan.compiled import sampler_memory, update_memory, within

    from mimesis_jax.train.rl.distributed import rollout_mesh

    model, step_fn = run_state.model_config, run_state.step_fn
    axes = {k: int(v) for k, v in run_state.mesh.shape.items()}
    w = workload_from_config(cfg, axes, model)
    # the sampler runs on this process's part of the mesh when there are several, in the rollout layout where
    # rollout.mesh sets one (train/rl/distributed.py)
    local = {k: int(v) for k, v in rollout_mesh(run_state.mesh, cfg.rollout).shape.items()}
    ws = w if local == axes else workload_from_config(cfg, local, model)
    device = DEVICES["cpu"]
    out = []
    for key in sorted(step_fn.shape_keys if updates else (), key=lambda k: [s for _, s in k[1:]]):
        wp = _program_workload(w, _step_shapes(key))
        planned = plan(wp, device).train_peak
        compiled = update_memory(step_fn, _update_shapes(key, wp), ref=key[0], options=options)
        shape = dict(zip(SHAPE_FIELDS, (wp.rows, wp.row_len, wp.head_len, wp.branch_len, wp.branch_head_len)))
        out.append({"program": "rl_update", "shape": shape, "compiled_bytes": compiled, "plan_bytes": planned,
                    "ok": within(planned, compiled)})
    for B, P, N, S, filtering in sorted(sampler_shapes):
        wp = dataclasses.replace(ws, rollout=Rollout(B, P, N))
        p = plan(wp, device)
        planned = p.rollout_peak - p.item("optimizer state")
        compiled = sampler_memory(wp, filtering, S, options=options)
        out.append({"program": "sampler", "shape": {"batch": B, "prompt": P, "new_tokens": N}, "mesh": local,
                    "compiled_bytes": compiled, "plan_bytes": planned, "ok": within(planned, compiled)})
    out += _layout_programs(run_state, cfg, local, options)
    return out, w


def _layout_programs(run_state, cfg, local: dict, options=None) -> list[dict]:
    """With rollout.mesh set, the weight sync into that layout (inference/weight_sync.py): its largest program's
    compiled bytes per device next to the plan's (plan/memory.py weight_sync_bytes), the row naming the layout; with
    rollout.engine the sync into the engine's copy (its matrices cast to the compute dtype), as the loop runs it."""
    from mimesis_jax.plan.compiled import FAST, weight_sync_memory, within
    from mimesis_jax.plan.memory import weight_sync_bytes
    from mimesis_jax.train.rl.distributed import layout_of

    layout = layout_of(cfg.rollout, run_state.mesh)
    if layout is None:
        return []
    model, axes = run_state.model_config, {k: int(v) for k, v in run_state.mesh.shape.items()}
    engine = bool(cfg.rollout.engine)
    planned = weight_sync_bytes(model, axes, local, engine).peak
    compiled = weight_sync_memory(model, axes, jax.process_count(), options or FAST, layout, engine)
    return [{"program": "weight_sync", "shape": {"layout": layout_text(layout)}, "mesh": local,
             "compiled_bytes": compiled, "plan_bytes": planned, "ok": within(planned, compiled)}]


def _count(names, *parts) -> int:
    return sum(any(p in n for p in parts) for n in names)


def rehearse_once(cfg, workdir: str, log=print) -> dict:
    """Runs the narrowed config `cfg` in `workdir`; the report of one mode (module docstring)."""
    from mimesis_jax import models, profiling
    from mimesis_jax.plan.compiled import TOLERANCE
    from mimesis_jax.inference import sampler
    from mimesis_jax.train.rl import agent, simulator
    from mimesis_jax.train.rl.distributed import layout_of
    from mimesis_jax.train.rl.learner import COMPILATION_KEYS, ENGINE_PROGRAMS, SAMPLER_PROGRAM, SCORE_PROGRAM

    stage = agent.AgentLearner if hasattr(cfg, "users") else simulator.SimulatorLearner
    before = sampler.call_shapes()
    # no checkpoint: nothing of the run is kept, and orbax's save compiles a slice per sharded leaf (288 programs
    # for the 9B simulator's rehearsal)
    # the random weights compile at LLVM's lowest effort (models.cheap_init_compile): nothing compares them
    with models.cheap_init_compile():
        learner = stage(cfg, workdir, handle_signals=False, log=log, save_checkpoints=False)
        initial = _snapshot_initial_params(learner)
        with profiling.count_compilations() as comp:
            result = learner.run()
    names = list(comp.names)
    run_state = learner.run_state
    param_change = _param_change(initial, run_state.state["params"])
    t0 = time.perf_counter()
    with profiling.count_compilations() as again:
        # process 0 reports (several processes: its sampler programs are those of its part of the mesh)
        shapes = sampler.call_shapes() - before if jax.process_index() == 0 else set()
        programs, w = _programs(run_state, learner.cfg, shapes, updates=jax.process_index() == 0)
    measure_s = time.perf_counter() - t0
    r = cfg.rollout
    steps = []
    for s in sorted(result.metrics):
        rec = result.metrics[s]
        steps.append({"step": s, "rollout_s": rec.get("rollout_s", 0.0), "coach_s": rec.get("coach_s", 0.0),
                      "train_s": rec.get("train_s", 0.0),
                      "generated_tokens": round(rec.get("rollout_tokens_per_s", 0.0) * rec.get("rollout_s", 0.0)),
                      "trained_tokens": round(rec.get("train_tokens_per_s", 0.0) * rec.get("train_s", 0.0)),
                      "updates": rec.get("updates", 0),
                      **{k: rec.get(k, 0) for k in COMPILATION_KEYS},
                      "reward_mean": rec.get("reward_mean", 0.0), "loss": rec.get("loss"),
                      **{k: rec.get(k, 0) for k in ENGINE_KEYS}})
    rl_update = _count(names, "_rl_update")
    # the programs the learner's step record counts (train/rl/learner.py compilation_record), by the same names
    counts = {"total": len(names), "rl_update": rl_update, "old_logprobs": _count(names, SCORE_PROGRAM),
              "sampler": _count(names, SAMPLER_PROGRAM), "engine": _count(names, *ENGINE_PROGRAMS)}
    counts["other"] = counts["total"] - sum(v for k, v in counts.items() if k != "total")
    return {
        "name": cfg.name, "stage": learner.stage, "engine": bool(r.engine),
        "model": {"type": run_state.model_config.model_type, "layers": run_state.model_config.num_hidden_layers,
                  "layer_types": list(run_state.model_config.layer_types or ()),
                  "hidden": run_state.model_config.hidden_size,
                  "heads": run_state.model_config.num_attention_heads,
                  "kv_heads": run_state.model_config.num_key_value_heads,
                  "intermediate": run_state.model_config.intermediate_size,
                  "vocab": run_state.model_config.vocab_size},
        "mesh": {k: int(v) for k, v in run_state.mesh.shape.items()}, "num_devices": int(run_state.mesh.size),
        "processes": jax.process_count(), "rollout_mesh": layout_text(layout_of(r, run_state.mesh)),
        "dtype": cfg.train.dtype,
        "group_size": r.group_size, "prompts_per_step": r.prompts_per_step,
        "mini_batch_prompts": r.mini_batch_prompts, "updates_per_step": cfg.updates_per_step(),
        "max_turns": getattr(r, "max_turns", getattr(getattr(cfg, "domains", None), "max_user_turns", 0)),
        "row_len": r.row_len, "max_context_tokens": r.max_context_tokens, "csd": cfg.rl.alpha > 0,
        "plan_programs": [dict(zip(SHAPE_FIELDS, k)) for k in w.programs],
        "programs": programs, "tolerance": TOLERANCE, "compilations": counts, "compiled_names": names,
        "steps": steps, "measure_s": measure_s, "measure_compilations": list(again.names),
        "compile_s": comp.seconds, "param_change": param_change,
    }


def _snapshot_initial_params(learner) -> dict:
    """Fills the returned dict with a host copy of the learner's first parameters once its state exists (the
    learner's on_setup hook; the update donates the device buffers). One process only: another's shards are not
    addressable here."""
    box: dict = {}
    setup = learner.on_setup

    def on_setup():
        setup()
        if jax.process_count() == 1:
            box["params"] = jax.device_get(learner.run_state.state["params"])
    learner.on_setup = on_setup
    return box


def _param_change(initial: dict, params) -> float | None:
    """The L2 norm of (the run's last parameters - its first), over every leaf; None on several processes."""
    import numpy as np

    if "params" not in initial:
        return None
    after = jax.device_get(params)
    sq = sum(float(np.sum((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
             for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(initial["params"])))
    return math.sqrt(sq)


def off_programs(rep: dict) -> list[dict]:
    """The programs of a report whose plan is off their compiled bytes by more than the report's tolerance
    (plan/compiled.py `within`, recomputed from the two numbers, not read from their `ok`)."""
    from mimesis_jax.plan.compiled import within

    return [p for p in rep["programs"] if not within(p["plan_bytes"], p["compiled_bytes"], rep["tolerance"])]


def format_report(rep: dict, path: str) -> str:
    m = rep["model"]
    lines = [
        f"rehearse: {path} ({rep['stage']}, rollout.engine {'on' if rep['engine'] else 'off'}): {m['type']} "
        f"{m['layers']} layers, hidden {m['hidden']}, {m['heads']}/{m['kv_heads']} heads, MLP {m['intermediate']}, "
        f"vocab {m['vocab']}; mesh {mesh_text(rep['mesh'])} ({rep['num_devices']} devices"
        f"{', %d processes' % rep['processes'] if rep['processes'] > 1 else ''})",
        f"  {rep['prompts_per_step']} prompts x group {rep['group_size']}, mini-batch {rep['mini_batch_prompts']} "
        f"({rep['updates_per_step']} updates/step), max turns {rep['max_turns']}, row_len {rep['row_len']}, "
        f"max_context_tokens {rep['max_context_tokens']}, CSD {'on' if rep['csd'] else 'off'}, {rep['dtype']}",
    ]
    if rep["plan_programs"]:
        lines.append(f"  plan lists {len(rep['plan_programs'])} update program(s): "
                     + ", ".join("x".join(str(v) for v in p.values()) for p in rep["plan_programs"]))
    else:
        lines.append("  plan lists no bounded update programs (no context budget: rollout.row_len = "
                     "max_context_tokens = 0)")
    lines.append(f"  {'program':10s} {'shape':44s} {'compiled MiB':>12s} {'plan MiB':>9s} {'plan/comp':>9s}")
    for p in rep["programs"]:
        shape = " ".join(f"{k}={v}" for k, v in p["shape"].items() if v)
        ratio = p["plan_bytes"] / p["compiled_bytes"]
        lines.append(f"  {p['program']:10s} {shape:44s} {p['compiled_bytes'] / MiB:12.2f} "
                     f"{p['plan_bytes'] / MiB:9.2f} {ratio:9.3f} {'ok' if p['ok'] else 'OFF'}")
    local = [p["mesh"] for p in rep["programs"] if p.get("mesh") and p["mesh"] != rep["mesh"]]
    if local and rep.get("rollout_mesh"):
        lines.append(f"  (the sampler runs in the rollout layout rollout.mesh={rep['rollout_mesh']}: "
                     f"{mesh_text(local[0])} per process)")
    elif local:
        lines.append(f"  (the sampler runs on each process's part of the mesh: {mesh_text(local[0])})")
    if rep["engine"]:
        lines.append("  rollout engine programs: counted below, memory not measured here "
                     "(plan --compiled measures the decode burst)")
    again = rep["measure_compilations"]
    lines.append(f"  (their memory read from the executables the run compiled, {len(again)} compiled again"
                 f"{': ' + ', '.join(again) if again else ''}: {rep['measure_s']:.1f} s)")
    c = rep["compilations"]
    lines.append(f"  compilations: {c['total']} (update {c['rl_update']}, old log-probs {c['old_logprobs']}, "
                 f"sampler {c['sampler']}, engine {c['engine']}, other {c['other']}), {rep['compile_s']:.1f} s")
    for s in rep["steps"]:
        loss = "-" if s["loss"] is None else f"{s['loss']:.6g}"
        lines.append(f"  step {s['step']}: rollout {s['rollout_s']:.1f} s, coach {s['coach_s']:.1f} s, train "
                     f"{s['train_s']:.1f} s ({s['updates']} updates); tokens generated {s['generated_tokens']}, "
                     f"trained {s['trained_tokens']}; reward_mean {s['reward_mean']:.4f}, loss {loss}; "
                     f"programs compiled so far {s['num_compilations']} (update {s['compilations/update']}, "
                     f"old log-probs {s['compilations/old_logprobs']}, sampler {s['compilations/sampler']}, engine "
                     f"{s['compilations/engine']}); engine reused tokens "
                     f"{s['engine/reused_tokens']}, evictions {s['engine/evictions']}")
    if rep["param_change"] is not None:
        lines.append(f"  parameter change over the run (L2 norm): {rep['param_change']:.6g}")
    off = off_programs(rep)
    if off:
        lines.append(f"  {len(off)} program(s) OFF the plan by more than {rep['tolerance']:.0%}: "
                     + ", ".join(p["program"] for p in off))
    return "\n".join(lines)


def _flag_device_count() -> int:
    """--xla_force_host_platform_device_count in XLA_FLAGS, else -1."""
    m = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(m.group(1)) if m else -1


def provide_cpu_devices(n: int, *, distributed: bool = False) -> bool:
    """Gives the CPU backend `n` devices (jax_num_cpu_devices) when it may: the platform is the CPU's
    (JAX_PLATFORMS unset or starting with cpu; unset, an accelerator's backend still wins and is what the caller's
    device count sees), one process (each of several processes keeps the devices its launcher gave it), no backend
    started yet (the count is read once, at the start), and fewer configured than `n` (jax_num_cpu_devices, else
    XLA_FLAGS' --xla_force_host_platform_device_count). True when it set the count."""
    from jax._src import xla_bridge

    platforms = jax.config.jax_platforms or ""
    if distributed or (platforms and platforms.split(",")[0] != "cpu") or xla_bridge.backends_are_initialized():
        return False
    configured = jax.config.jax_num_cpu_devices
    if max(configured, _flag_device_count() if configured < 0 else -1) >= n:
        return False
    jax.config.update("jax_num_cpu_devices", n)
    return True


def run(args) -> int:
    """`python -m mimesis_jax rehearse`: 0, or 2 for a bad config / flag or too few devices (one line)."""
    try:
        if args.steps < 1:
            raise ConfigError(f"--steps {args.steps}: must be >= 1")
        cfg = load_run_config(args.config, args.overrides)
        if not hasattr(cfg, "rollout"):
            raise ConfigError(f"--config {args.config}: rehearse runs RL configs (AgentRLConfig, SimRLConfig)")
        narrowed = narrow_config(cfg, width=args.width, repeats=args.repeats, tokens=args.tokens, batch=args.batch,
                                 steps=args.steps)
        n = mesh_size(narrowed)
        provide_cpu_devices(n, distributed=args.distributed)
        have = len(jax.devices())
        if have < n:
            per = -(-n // jax.process_count())
            where = "this process sees" if jax.process_count() == 1 else f"{jax.process_count()} processes see"
            raise ConfigError(f"--config {args.config}: the mesh {mesh_text(narrowed.mesh.axes())} needs {n} "
                              f"devices, {where} {have}; run with "
                              f"XLA_FLAGS=--xla_force_host_platform_device_count={per} JAX_PLATFORMS=cpu")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    reports, lead = [], jax.process_index() == 0  # several processes (--distributed): process 0 reports
    for on in MODES[args.engine]:
        c = narrowed
        if on is not None:  # the engine's slots bound its batch: rollout.max_batch 0 with it on
            batch = 0 if on else c.rollout.max_batch
            c = c.replace(rollout=dataclasses.replace(c.rollout, engine=on, max_batch=batch))
        on = c.rollout.engine
        with contextlib.ExitStack() as stack:
            if args.workdir is None:
                wd = tempfile.mkdtemp(prefix="rehearse_")
                stack.callback(shutil.rmtree, wd, True)
            else:
                wd = f"{args.workdir}/engine_{'on' if on else 'off'}"
            rep = rehearse_once(c, wd, log=lambda *a, **k: None)
        reports.append(rep)
        if lead:
            print(format_report(rep, args.config), flush=True)
    if args.json and lead:
        with open(args.json, "w") as f:
            json.dump({"config": args.config, "reports": reports}, f, indent=2)
    idle = [r for r in reports if not any(s["updates"] for s in r["steps"])]
    if idle:  # nothing rolled out or trained: a rehearsal that measured nothing is not a pass
        r = idle[0]
        print(f"error: --config {args.config}: the rehearsal (rollout.engine {'on' if r['engine'] else 'off'}) "
              f"trained nothing: no rollout fit max_context_tokens {r['max_context_tokens']} (--tokens "
              f"{args.tokens}); use a smaller --tokens", file=sys.stderr)
        return 2
    return 0
