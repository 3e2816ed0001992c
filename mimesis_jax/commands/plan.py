"""`python -m mimesis_jax plan`: the plan of a config as a table, its verdict (FITS, TIGHT: it fits only within
the planner's checked error, or DOES NOT FIT; `checked_error`), and a change that fits with room for that error
when it does not."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Sequence

import jax

from mimesis_jax.errors import ConfigError
from mimesis_jax.plan.budget import (Plan, error_bytes, plan_config, pool_rollout_peak, process_rollout_peak,
                                     rollout_copy, verdict)
from mimesis_jax.plan.compiled import (SPLIT_CHECKED, TOLERANCE, ProgramMemory, format_programs, need_devices,
                                       program_memory, weight_sync_memory)
from mimesis_jax.plan.devices import DEVICES, GiB, HEADROOM, config_mesh, mesh_text, parse_mesh
from mimesis_jax.plan import mix
from mimesis_jax.plan.memory import weight_sync_bytes
from mimesis_jax.plan.suggestions import suggest
from mimesis_jax.plan.workload import (batch_multiple, batch_shards, load_run_config, pool_size, process_config,
                                      programs_text, rollout_axes, rollout_mesh_text)
from mimesis_jax.config.layout import rollout_layout


def add_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--config", required=True, help="configs/<name>.py (RunConfig, AgentRLConfig or SimRLConfig)")
    p.add_argument("--mesh", default=None, help="data=A,fsdp=B,tensor=C (default: the config's mesh)")
    p.add_argument("--device", default="a100-80g", help=f"one of {', '.join(DEVICES)}")
    p.add_argument("--rows", type=int, default=None,
                   help="rows per optimizer update (default: train.global_batch; RL: one per dialogue / rollout)")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE")
    p.add_argument("--processes", type=int, default=1,
                   help="RL stages: the run's jax.distributed processes (default 1); with N > 1 each process rolls "
                        "out its share of the tasks on its own sub-mesh, with its own copy of the parameters, and "
                        "the plan adds that rollout phase per device (and, with --compiled, its programs)")
    p.add_argument("--compiled", action="store_true",
                   help="also build and compile (abstract inputs, nothing allocated) the programs the loop compiles "
                        "and print their per-device bytes from XLA's memory analysis next to the plan's; needs the "
                        "mesh's devices (fake CPU ones: XLA_FLAGS=--xla_force_host_platform_device_count=N "
                        "JAX_PLATFORMS=cpu); a planned / compiled ratio under 1 - plan/compiled.py TOLERANCE widens "
                        "the verdicts' planner error to 1 - that ratio; bf16 on CPU: each program's "
                        "float-normalization copies and its heap's gaps (fragmentation) are split out and the ratio is "
                        "planned / (compiled - copies - gaps)")
    return p


def _gib(n: int) -> str:
    return f"{n / GiB:9.2f}"


def checked_error(programs: Sequence[ProgramMemory] = ()) -> tuple[float, str]:
    """(error, what it is) the verdicts leave room for: a planned peak may under-count the compiled one by
    budget.error_bytes(peak, error) = peak / (1 - error) - peak. The error is plan/compiled.py TOLERANCE, the bound
    the tests hold every planned program to (|planned / compiled - 1| <= TOLERANCE), or, with --compiled, 1 - the
    compiled programs' smallest planned / compiled ratio when that is larger (those programs under-counted by more);
    for a bf16 program on CPU with its float-normalization copies split out, planned / (compiled - copies - gaps)
    (ProgramMemory.ratio). A bf16 program split but not of SPLIT_CHECKED (none of the loops' programs today: a
    program whose bf16 rest is not held to the plan) measures the CPU backend, not the plan: it does not widen the
    error (it is checked in float32)."""
    error = TOLERANCE, (f"{TOLERANCE:.0%}: plan/compiled.py TOLERANCE, the tests' bound on |planned / compiled - 1| "
                        "of every planned program")
    programs = [r for r in programs if r.copies is None or r.name.startswith(SPLIT_CHECKED)]
    worst = min(programs, key=lambda r: r.ratio, default=None)
    if worst is not None and 1 - worst.ratio > TOLERANCE:
        error = 1 - worst.ratio, (f"{1 - worst.ratio:.1%}: 1 - the compiled programs' smallest planned / compiled "
                                  f"ratio, {worst.ratio:.3f} ({worst.name}), worse than TOLERANCE's {TOLERANCE:.0%}")
    return error


def _verdict(total: int, usable: int, error: float) -> str:
    return (f"margin {(usable - total) / GiB:+.2f} GiB, planner error {error_bytes(total, error) / GiB:.2f} GiB -> "
            f"{verdict(total, usable, error)}")


def format_plan(p: Plan, path: str = "", error: tuple[float, str] | None = None) -> str:
    """The plan's table and its verdict with room for error = (fraction, what it is), default `checked_error()`."""
    error = error or checked_error()
    w, m, d = p.workload, p.workload.model, p.device
    rows_mb = w.rows // w.microbatches
    shards = batch_shards(m, w.mesh, rows_mb)
    peak_flops = "n/a" if d.peak_bf16_flops is None else f"{d.peak_bf16_flops / 1e12:.0f} TFLOP/s bf16"
    lines = [
        f"plan: {path or w.name} ({w.kind}, {m.model_type}) on {w.num_devices} x {d.name} "
        f"({d.bytes / GiB:.1f} GiB, {peak_flops}; {d.source}), mesh {mesh_text(w.mesh)}",
        f"per device: {rows_mb // shards} row(s) x {w.row_len} tokens per micro-batch ({w.rows} rows per update, "
        f"{w.microbatches} micro-batch(es)), remat {m.remat}, {m.attention_impl} attention, {m.dtype} compute",
    ]
    lines += [f"  note: {n}" for n in w.notes]
    if m.attention_impl == "pallas":
        lines.append("  note: attention_impl=pallas is planned as blockwise (its fp32 score blocks, which the kernels "
                     "keep on chip: an over-count); the rollout engine's paged attention is the jnp path either way")
    lines += programs_text(w)
    lines.append(f"  {'phase':8s}  {'component':28s} {'GiB':>9s}  formula")
    for it in p.items:
        lines.append(f"  {it.phase:8s}  {it.name:28s} {_gib(it.bytes)}  {it.formula}")
    lines.append(f"train step peak ({p.train_phase}): {p.train_peak / GiB:.2f} GiB")
    if w.pool:
        lines.append(f"rollout peak: none on these devices (rollout.devices={w.pool}: on the rollout pool, below)")
    elif w.rollout is not None:
        lines.append(f"rollout peak: {p.rollout_peak / GiB:.2f} GiB")
    lines.append(f"total {p.total / GiB:.2f} GiB of {d.bytes / GiB:.2f} GiB ({p.usable / GiB:.2f} GiB usable after "
                 f"{HEADROOM:.0%} headroom): {_verdict(p.total, p.usable, error[0])}")
    lines.append(f"  planner error: total / (1 - e) - total, e = {error[1]}; FITS needs a margin of at least it, "
                 "TIGHT fits within it")
    return "\n".join(lines)


def rollout_where(processes: int, layout: str, local: dict) -> str:
    """Where the rollout runs, for the plan's lines: each process's sub-mesh, or the rollout layout
    (`rollout.mesh`) over each process's devices (on one process: the training mesh's devices)."""
    each = "each of {} processes".format(processes) if processes > 1 else "one process"
    if layout:
        return f"{each}: the rollout layout rollout.mesh={layout} ({mesh_text(local)} per process)"
    return f"{each}: its sub-mesh {mesh_text(local)}"


def format_process_rollout(p: Plan, pp: Plan, processes: int, tasks: int, error: float = TOLERANCE,
                           layout: str = "") -> str:
    """The rollout phase on each of `processes` processes, or in the rollout layout `layout` (`rollout.mesh`; pp:
    the plan of one process's share on its sub-mesh or layout), its verdict with room for the planner's `error`
    (see `checked_error`)."""
    peak = process_rollout_peak(p, pp)
    state = p.item("parameters") + p.item("optimizer state")
    rollout = peak - state
    total = max(p.train_peak, peak)
    w = pp.workload
    if w.engine is not None:
        what = f"an engine for {w.engine.dialogues} dialogues in flight ({w.engine.pool_bytes / GiB:.2f} GiB pool)"
    else:
        what = f"sampler calls of {w.rollout.batch} x ({w.rollout.prompt_len} + {w.rollout.new_tokens}) tokens"
    return "\n".join([
        f"rollout on {rollout_where(processes, layout, pp.workload.mesh)}, "
        f"{what} ({-(-tasks // processes)} of {tasks} tasks per step)",
        f"  its rollout program {rollout / GiB:.2f} GiB per device (of which its own parameter copy "
        f"{rollout_copy(pp) / GiB:.2f} GiB) + the training state kept on every device "
        f"{state / GiB:.2f} GiB = rollout peak {peak / GiB:.2f} GiB",
        f"total {total / GiB:.2f} GiB of {p.device.bytes / GiB:.2f} GiB ({p.usable / GiB:.2f} GiB usable): "
        f"{_verdict(total, p.usable, error)} on {processes} process{'es' if processes > 1 else ''}"
        + (f" in the rollout layout rollout.mesh={layout}" if layout else "")])


def pool_sync_axes(cfg, mesh: dict) -> dict:
    """The axes of the weight sync's target on a rollout pool: the training devices laid out as the pool lays its
    devices out (replicas x the pool's tensor split, train/rl/distributed.py `_to_pool`); each shard then copied to
    the pool device that holds it."""
    tensor = rollout_axes(cfg, mesh, 1)["tensor"]
    return {"data": math.prod(mesh.values()) // tensor, "fsdp": 1, "tensor": tensor}


def format_pool_rollout(cfg, p: Plan, pp: Plan, processes: int, error: float = TOLERANCE) -> list[str]:
    """The rollout phase on each process's rollout pool (`rollout.devices`; pp: the plan of one process's share on
    the pool's devices), the weight sync staged on the training devices, and the verdict over both sides."""
    n, w = pool_size(cfg), pp.workload
    peak = pool_rollout_peak(pp)
    total = max(p.train_peak, peak)
    if w.engine is not None:
        what = f"an engine for {w.engine.dialogues} dialogues in flight ({w.engine.pool_bytes / GiB:.2f} GiB pool)"
    else:
        what = f"sampler calls of {w.rollout.batch} x ({w.rollout.prompt_len} + {w.rollout.new_tokens}) tokens"
    tasks = cfg.rollout.prompts_per_step
    staged = pool_sync_axes(cfg, p.workload.mesh)
    sync = weight_sync_bytes(p.workload.model, p.workload.mesh, staged, w.engine is not None)
    state = p.item("parameters") + p.item("optimizer state")
    return [
        f"rollout on the rollout pool: rollout.devices={n} of each process's devices ({processes} process"
        f"{'es' if processes > 1 else ''}), laid out {mesh_text(w.mesh)}; the training mesh {mesh_text(p.workload.mesh)} "
        f"on the others; {what} ({-(-tasks // processes)} of {tasks} tasks per step)",
        f"  a pool device: its rollout program {peak / GiB:.2f} GiB (of which its own parameter copy "
        f"{rollout_copy(pp) / GiB:.2f} GiB), no training state = pool peak {peak / GiB:.2f} GiB",
        f"  a training device: train peak {p.train_peak / GiB:.2f} GiB; the weight sync staged on it in the pool's "
        f"layout ({mesh_text(staged)}) then copied shard by shard into the pool: {sync.moved / GiB:.2f} GiB "
        f"received per device, its largest program {sync.peak / GiB:.2f} GiB, at most "
        f"{(state + sync.copy + sync.work) / GiB:.2f} GiB with the training state and the staged copy",
        f"total {total / GiB:.2f} GiB of {p.device.bytes / GiB:.2f} GiB ({p.usable / GiB:.2f} GiB usable): "
        f"{_verdict(total, p.usable, error)} with a rollout pool of {n} devices per process"]


def format_weight_sync(p: Plan, pp: Plan, layout: str = "") -> str:
    """The weight sync into each process's rollout devices (inference/weight_sync.py), or into the rollout layout
    `layout` (`rollout.mesh`), per device: the bytes it receives, the sync's largest program, and the bound with the
    training state and the copy it leaves. With the rollout engine (pp's workload has one) the copy is the engine's,
    its matrices cast to the compute dtype inside the sync (weight_sync.rollout_sync(engine=True))."""
    engine = pp.workload.engine is not None
    sync = weight_sync_bytes(p.workload.model, p.workload.mesh, pp.workload.mesh, engine)
    state = p.item("parameters") + p.item("optimizer state")
    into = f"the rollout layout rollout.mesh={layout}" if layout else "each process's devices"
    return (f"weight sync into {into} (device to device, one array at a time): "
            f"{sync.moved / GiB:.2f} GiB received per device, its largest program {sync.peak / GiB:.2f} GiB per "
            f"device (working set {sync.work / GiB:.2f} GiB); at most {(state + sync.copy + sync.work) / GiB:.2f} GiB "
            "with the training state and the copy")


def process_suggestion(args, cfg, mesh: dict, p: Plan, processes: int, error: float = TOLERANCE) -> str:
    """The largest rollout.max_batch (halving the config's) under which the rollout phase FITS on `processes`
    processes with room for the planner's `error`, or what to try instead."""
    cap = cfg.rollout.max_batch or cfg.rollout.prompts_per_step * cfg.rollout.group_size
    on = (f"on {processes} processes" if processes > 1
          else f"in the rollout layout rollout.mesh={rollout_mesh_text(cfg, mesh)}")  # the engine's default too
    train = verdict(p.train_peak, p.usable, error)
    if train != "FITS":  # the engine's batch is its slots: its knob is the pool's budget
        knob = "rollout.engine_memory_gib" if cfg.rollout.engine else "rollout.max_batch"
        return (f"suggestion: no {knob} FITS {on}: the train step alone "
                f"({p.train_peak / GiB:.2f} GiB) {'is TIGHT' if train == 'TIGHT' else train}; change it first (the "
                f"plan's suggestion), then re-plan")
    if not cfg.rollout.engine:
        local = rollout_axes(cfg, mesh, processes)
        while cap > 1:
            cap //= 2
            c = load_run_config(args.config, list(args.overrides) + [f"rollout.max_batch={cap}"])
            pp = plan_config(process_config(c, processes), local, args.device, args.rows)
            total = max(p.train_peak, process_rollout_peak(p, pp))
            if verdict(total, p.usable, error) == "FITS":
                return (f"suggestion: --set rollout.max_batch={cap} -> rollout peak "
                        f"{process_rollout_peak(p, pp) / GiB:.2f} GiB, total {total / GiB:.2f} GiB, "
                        f"{_verdict(total, p.usable, error)} {on}")
    return (f"suggestion: no rollout.max_batch FITS {on}; lower rollout.engine_memory_gib "
            "(engine) or add devices (--mesh)")


HEAD_MIX_MINIBATCHES = 20  # mini-batches of the synthetic mix `plan` packs for the LM-head padding line


def head_padding_text(cfg, model, mesh: dict) -> str | None:
    """The plan's line on the LM head's padding of an RL config: its positions per update (rows x head of the
    ladder programs taken) against the real agent tokens, and with the fused CSD teacher its head's positions (rows
    x branch_head) against the real coached tokens and both heads' positions against both real counts, on
    `HEAD_MIX_MINIBATCHES` mini-batches of the synthetic paper-like mix (plan/mix.py; one process's ladder). None
    where the shapes are not on a ladder or the mix does not fit the config."""
    hp = mix.head_padding(cfg, cfg.rl.num_microbatches * batch_multiple(model, mesh), HEAD_MIX_MINIBATCHES)
    if hp is None:
        return None
    n = hp["minibatches"]
    teacher = ""
    if hp["fused"]:
        both = (hp["head"] + hp["branch_head"]) / max(1, hp["agent"] + hp["coached"])
        teacher = (f"; teacher head {hp['branch_head'] / n:.0f} vs {hp['coached'] / n:.0f} real coached tokens "
                   f"({hp['branch_head'] / max(1, hp['coached']):.2f}x), both heads {both:.2f}x")
    return (f"LM head: {hp['head'] / n:.0f} positions per update vs {hp['agent'] / n:.0f} real agent tokens "
            f"({hp['head'] / hp['agent']:.2f}x){teacher} on a synthetic paper-like mix ({n} mini-batches, "
            f"plan/mix.py; {hp['programs']} step programs taken)")


def _load(args):
    """(config, mesh) of the command line, its flags checked (one-line ConfigErrors naming them)."""
    if args.device not in DEVICES:
        raise ConfigError(f"--device {args.device!r}: unknown device; expected one of {sorted(DEVICES)}")
    cfg = load_run_config(args.config, args.overrides)
    # with a rollout pool (rollout.devices per process) the training mesh takes the other devices
    train_devices = max(1, jax.device_count() - pool_size(cfg) * args.processes)
    mesh = parse_mesh(args.mesh) if args.mesh is not None else config_mesh(cfg.mesh, train_devices)
    if args.rows is not None and args.rows < 1:
        raise ConfigError(f"--rows {args.rows}: must be >= 1")
    if args.compiled:
        if args.rows is not None:
            raise ConfigError("--compiled: builds the loop's own shapes; drop --rows")
        need_devices(mesh)  # before the plan is printed: the one-line error names the flag to set
    return cfg, mesh


def _rollout_programs(cfg_p, mesh: dict, local: dict, p: Plan, processes: int, layout) -> list[ProgramMemory]:
    """The compiled programs of one process's rollout on `local` (its sub-mesh or the rollout layout) and the
    weight sync into it (into the engine's copy with rollout.engine: built as the loop builds it), next to their
    plan."""
    pool = pool_size(cfg_p)
    rows = program_memory(cfg_p, local, p.device, updates=False, on_pool=pool > 0)
    model, engine = p.workload.model, bool(cfg_p.rollout.engine)
    if pool:  # staged on the training devices in the pool's layout, then copied shard by shard (no program)
        staged = pool_sync_axes(cfg_p, mesh)
        rows.append(ProgramMemory("weight sync (largest program)", weight_sync_bytes(model, mesh, staged, engine).peak,
                                  weight_sync_memory(model, mesh, 1, layout={"replica": -1, "tensor": staged["tensor"]},
                                                     engine=engine)))
        return rows
    rows.append(ProgramMemory("weight sync (largest program)", weight_sync_bytes(model, mesh, local, engine).peak,
                              weight_sync_memory(model, mesh, processes, layout=layout, engine=engine)))
    return rows


def _print_suggestion(args, mesh: dict, p: Plan, error: float) -> None:
    s = suggest(args.config, args.overrides, mesh, args.device, args.rows, error)
    if s is None:
        print("suggestion: no change of at most two of remat full, more fsdp, up to 16x the micro-batches, "
              "rollout.max_batch down to 1/64, rows down to 1/8, up to 4x the fsdp devices fits with a "
              "margin of at least the planner error")
    else:
        print(f"suggestion: {s.change} -> total {s.plan.total / GiB:.2f} GiB, "
              f"{_verdict(s.plan.total, s.plan.usable, error)}")


def run(args) -> int:
    """`python -m mimesis_jax plan`: prints the plan and its verdict (and, unless it FITS, a change that does).
    0, or 2 for a bad config, --mesh or --device (the message names it).

    The rollout is planned apart from the training mesh on several processes (each on its own sub-mesh) and with
    `rollout.mesh` set (each process's devices in that layout, one process too): that rollout's plan, its verdict
    and the weight sync into it."""
    try:
        cfg, mesh = _load(args)
        compiled, processes = args.compiled, args.processes
        local = rollout_axes(cfg, mesh, processes)  # one-line errors: --processes, rollout.mesh
        text = rollout_mesh_text(cfg, mesh)
        layout = rollout_layout(text)
        p = plan_config(cfg, mesh, args.device, args.rows)
        if processes > 1 and p.workload.kind == "lm":
            raise ConfigError(f"--processes {processes}: only the RL stages roll out per process; an LM stage's "
                              "plan is the same on any number of processes")
        pool = pool_size(cfg)
        apart = processes > 1 or layout is not None
        if apart:
            cfg_p = process_config(cfg, processes)
            pp = plan_config(cfg_p, local, args.device, args.rows, on_pool=pool > 0)
        programs, process_programs = [], []
        if compiled:  # compiled first: their ratios can widen the verdicts' error
            # with a rollout layout the loop's sampler runs in it, not on the training mesh
            programs = program_memory(cfg, mesh, p.device, sampler=layout is None)
            if apart:
                process_programs = _rollout_programs(cfg_p, mesh, local, p, processes, layout)
        error = checked_error(programs + process_programs)
        print(format_plan(p, args.config, error))
        if pool:
            pass  # the pool's layout is printed with its plan below
        elif layout is not None and not cfg.rollout.mesh:
            print(f"  note: rollout.engine: the engine decodes in its replica layout rollout.mesh={text} (its "
                  "default, config/layout.py engine_layout), as the rollout phase above and below plan it")
        elif layout is not None:
            print(f"  note: rollout.mesh={text}: the policy decodes in that layout (below), not in the training "
                  "layout of the rollout phase above")
        head = head_padding_text(cfg, p.workload.model, mesh) if p.workload.kind != "lm" else None
        if head:
            print(head)
        if pool:
            print("\n".join(format_pool_rollout(cfg, p, pp, processes, error[0])))
        elif apart:
            print(format_process_rollout(p, pp, processes, cfg.rollout.prompts_per_step, error[0], text))
            if verdict(max(p.train_peak, process_rollout_peak(p, pp)), p.usable, error[0]) != "FITS":
                print(process_suggestion(args, cfg, mesh, p, processes, error[0]))
            print(format_weight_sync(p, pp, text))
        if compiled:
            print(f"compiled programs ({jax.default_backend()} backend, {jax.device_count()} devices):")
            print(format_programs(programs, p.workload.model))
            if apart:
                print(f"compiled rollout program on {rollout_where(processes, text, local)}:")
                print(format_programs(process_programs, p.workload.model))
        if not p.clears(error[0]):
            _print_suggestion(args, mesh, p, error[0])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
