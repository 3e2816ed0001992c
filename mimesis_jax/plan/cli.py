"""`python -m mimesis_jax plan`: the plan of a config as a table, and a change that fits when it does not."""

from __future__ import annotations

import argparse
import sys

import jax

from mimesis_jax.models.config import ConfigError
from mimesis_jax.plan.budget import Plan, plan_config
from mimesis_jax.plan.compiled import format_programs, need_devices, program_memory
from mimesis_jax.plan.devices import DEVICES, GiB, HEADROOM, config_mesh, mesh_text, parse_mesh
from mimesis_jax.plan.suggestions import suggest
from mimesis_jax.plan.workload import batch_shards, load_run_config, programs_text


def add_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--config", required=True, help="configs/<name>.py (RunConfig, AgentRLConfig or SimRLConfig)")
    p.add_argument("--mesh", default=None, help="data=A,fsdp=B,tensor=C (default: the config's mesh)")
    p.add_argument("--device", default="a100-80g", help=f"one of {', '.join(DEVICES)}")
    p.add_argument("--rows", type=int, default=None,
                   help="rows per optimizer update (default: train.global_batch; RL: one per dialogue / rollout)")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE")
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
        p = plan_config(cfg, mesh, args.device, args.rows)
        print(format_plan(p, args.config))
        if getattr(args, "compiled", False):
            print(f"compiled programs ({jax.default_backend()} backend, {jax.device_count()} devices):")
            print(format_programs(program_memory(cfg, mesh, p.device), p.workload.model))
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

