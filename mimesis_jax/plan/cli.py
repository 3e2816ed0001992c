"""`python -m mimesis_jax plan`: the plan of a config as a table, and a change that fits when it does not."""

from __future__ import annotations

import argparse
import sys

import jax

from mimesis_jax.models.config import ConfigError
from mimesis_jax.plan.budget import Plan, plan_config, process_rollout_peak
from mimesis_jax.plan.compiled import format_programs, need_devices, program_memory
from mimesis_jax.plan.devices import DEVICES, GiB, HEADROOM, config_mesh, mesh_text, parse_mesh
from mimesis_jax.plan.suggestions import suggest
from mimesis_jax.plan.workload import batch_shards, load_run_config, process_config, process_mesh, programs_text


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
                        "JAX_PLATFORMS=cpu)")
    return p


def _gib(n: int) -> str:
    return f"{n / GiB:9.2f}"


def format_plan(p: Plan, path: str = "") -> str:
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
    if w.rollout is not None:
        lines.append(f"rollout peak: {p.rollout_peak / GiB:.2f} GiB")
    verdict = "FITS" if p.fits else "DOES NOT FIT"
    lines.append(f"total {p.total / GiB:.2f} GiB of {d.bytes / GiB:.2f} GiB ({p.usable / GiB:.2f} GiB usable after "
                 f"{HEADROOM:.0%} headroom): margin {p.margin / GiB:+.2f} GiB -> {verdict}")
    return "\n".join(lines)


def format_process_rollout(p: Plan, pp: Plan, processes: int, tasks: int) -> str:
    """The rollout phase on each of `processes` processes (pp: the plan of one process's share on its sub-mesh)."""
    peak = process_rollout_peak(p, pp)
    rollout = pp.rollout_peak - pp.item("optimizer state")
    total = max(p.train_peak, peak)
    w = pp.workload
    if w.engine is not None:
        what = f"an engine for {w.engine.dialogues} dialogues in flight ({w.engine.pool_bytes / GiB:.2f} GiB pool)"
    else:
        what = f"sampler calls of {w.rollout.batch} x ({w.rollout.prompt_len} + {w.rollout.new_tokens}) tokens"
    verdict = "FITS" if total <= p.usable else "DOES NOT FIT"
    return "\n".join([
        f"rollout on each of {processes} processes: its sub-mesh {mesh_text(pp.workload.mesh)}, "
        f"{what} ({-(-tasks // processes)} of {tasks} tasks per step)",
        f"  its rollout program {rollout / GiB:.2f} GiB per device (of which its own parameter copy "
        f"{pp.item('parameters') / GiB:.2f} GiB) + the training state kept on every device "
        f"{(p.item('parameters') + p.item('optimizer state')) / GiB:.2f} GiB = rollout peak {peak / GiB:.2f} GiB",
        f"total {total / GiB:.2f} GiB of {p.device.bytes / GiB:.2f} GiB ({p.usable / GiB:.2f} GiB usable): "
        f"margin {(p.usable - total) / GiB:+.2f} GiB -> {verdict} on {processes} processes"])


def process_suggestion(args, cfg, mesh: dict, p: Plan, processes: int) -> str:
    """The largest rollout.max_batch (halving the config's) under which the rollout phase fits on `processes`
    processes, or what to try instead."""
    cap = cfg.rollout.max_batch or cfg.rollout.prompts_per_step * cfg.rollout.group_size
    if not cfg.rollout.engine:
        local = process_mesh(mesh, processes)
        while cap > 1:
            cap //= 2
            c = load_run_config(args.config, list(args.overrides) + [f"rollout.max_batch={cap}"])
            pp = plan_config(process_config(c, processes), local, args.device, args.rows)
            if max(p.train_peak, process_rollout_peak(p, pp)) <= p.usable:
                return (f"suggestion: --set rollout.max_batch={cap} -> rollout peak "
                        f"{process_rollout_peak(p, pp) / GiB:.2f} GiB -> FITS on {processes} processes")
    return (f"suggestion: no rollout.max_batch fits on {processes} processes; lower rollout.engine_memory_gib "
            "(engine) or add devices (--mesh)")


def run(args) -> int:
    """`python -m mimesis_jax plan`: prints the plan (and a change that fits when it does not). 0, or 2 for a bad
    config, --mesh or --device (the message names it)."""
    try:
        if args.device not in DEVICES:
            raise ConfigError(f"--device {args.device!r}: unknown device; expected one of {sorted(DEVICES)}")
        cfg = load_run_config(args.config, args.overrides)
        if args.mesh is not None:
            mesh = parse_mesh(args.mesh)
        else:
            mesh = config_mesh(cfg.mesh, jax.device_count())
        if args.rows is not None and args.rows < 1:
            raise ConfigError(f"--rows {args.rows}: must be >= 1")
        if getattr(args, "compiled", False):
            if args.rows is not None:
                raise ConfigError("--compiled: builds the loop's own shapes; drop --rows")
            need_devices(mesh)  # before the plan is printed: the one-line error names the flag to set
        processes = getattr(args, "processes", 1)
        local = process_mesh(mesh, processes)  # the one-line error for a count that does not divide the mesh
        p = plan_config(cfg, mesh, args.device, args.rows)
        if processes > 1 and p.workload.kind == "lm":
            raise ConfigError(f"--processes {processes}: only the RL stages roll out per process; an LM stage's "
                              "plan is the same on any number of processes")
        print(format_plan(p, args.config))
        if processes > 1:
            cfg_p = process_config(cfg, processes)
            pp = plan_config(cfg_p, local, args.device, args.rows)
            print(format_process_rollout(p, pp, processes, cfg.rollout.prompts_per_step))
            if max(p.train_peak, process_rollout_peak(p, pp)) > p.usable:
                print(process_suggestion(args, cfg, mesh, p, processes))
        if getattr(args, "compiled", False):
            print(f"compiled programs ({jax.default_backend()} backend, {jax.device_count()} devices):")
            print(format_programs(program_memory(cfg, mesh, p.device), p.workload.model))
            if processes > 1:
                print(f"compiled rollout program of one process (its sub-mesh {mesh_text(local)}):")
                print(format_programs(program_memory(cfg_p, local, p.device, updates=False), p.workload.model))
        if not p.fits:
            s = suggest(args.config, args.overrides, mesh, args.device, args.rows)
            if s is None:
                print("suggestion: no change of at most two of remat full, more fsdp, up to 16x the micro-batches, "
                      "rollout.max_batch down to 1/64, rows down to 1/8, up to 4x the fsdp devices fits")
            else:
                print(f"suggestion: {s.change} -> total {s.plan.total / GiB:.2f} GiB, margin "
                      f"{s.plan.margin / GiB:+.2f} GiB -> FITS")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0

