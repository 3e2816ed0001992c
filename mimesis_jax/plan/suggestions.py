"""When a config does not fit, or fits only within the planner's error: re-plan single changes and pairs of them
(remat full, data or tensor folded into fsdp, more micro-batches, fewer sequences per sampler call, shorter rows,
more fsdp devices) and report the cheapest that fits with room for that error (costs in `_knobs`)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Sequence

from mimesis_jax.config import RunConfig
from mimesis_jax.errors import ConfigError
from mimesis_jax.plan.budget import Plan, plan_config
from mimesis_jax.plan.devices import mesh_text
from mimesis_jax.plan.workload import load_run_config


@dataclasses.dataclass(frozen=True)
class Suggestion:
    change: str  # what to pass: --set ... and/or --mesh ...
    overrides: tuple[str, ...]
    mesh: dict
    plan: Plan


def _knobs(cfg, mesh: dict) -> list[list[tuple[float, tuple[str, ...], dict | None]]]:
    """Per knob, its options as (cost, --set overrides, mesh or None). Costs order the search: remat full 1;
    one halving of data or tensor into fsdp (same device count) 1 per step; k x the micro-batches log2 k; the
    sequences per sampler call (rollout.max_batch) / k (RL; more, smaller sampler calls, the same samples)
    log2 k; rows / k (shorter contexts) 6 log2 k; k x the fsdp devices (more hardware) 8 + 2 log2 k."""
    lm = isinstance(cfg, RunConfig)
    knobs = []
    if cfg.train.remat != "full":
        knobs.append([(1.0, ("train.remat=full",), None)])
    moves, m, steps = [], dict(mesh), 0
    for src in ("data", "tensor"):
        while m[src] > 1 and m[src] % 2 == 0:
            m, steps = dict(m, **{src: m[src] // 2, "fsdp": m["fsdp"] * 2}), steps + 1
            moves.append((float(steps), (), m))
    knobs.append(moves)
    micro = []
    for k in (2, 4, 8, 16):
        if lm and cfg.train.global_batch % (cfg.train.grad_accum * k) == 0:
            micro.append((math.log2(k), (f"train.grad_accum={cfg.train.grad_accum * k}",), None))
        elif not lm:
            micro.append((math.log2(k), (f"rl.num_microbatches={cfg.rl.num_microbatches * k}",), None))
    knobs.append(micro)
    if not lm:
        r = cfg.rollout
        total = r.prompts_per_step * r.group_size
        per_call = min(r.max_batch, total) if r.max_batch else total
        knobs.append([(math.log2(k), (f"rollout.max_batch={per_call // k}",), None)
                      for k in (2, 4, 8, 16, 32, 64) if per_call // k >= 1])
    rows = []
    for k in (2, 4, 8):
        if lm:
            rows.append((6 * math.log2(k), (f"data.seq_len={cfg.data.seq_len // k}",), None))
        else:
            r = cfg.rollout
            sets = ((f"rollout.row_len={r.row_len // k}",) if r.row_len else ()) + (
                (f"rollout.max_context_tokens={r.max_context_tokens // k}",) if r.max_context_tokens else ())
            rows.append((6 * math.log2(k), sets, None))
    knobs.append(rows)
    knobs.append([(8 + 2 * math.log2(k), (), dict(mesh, fsdp=mesh["fsdp"] * k)) for k in (2, 4)])
    return [k for k in knobs if k]


def _candidates(cfg, mesh: dict, max_knobs: int = 2) -> list[tuple[float, tuple[str, ...], dict]]:
    """Every combination of at most `max_knobs` knobs (one option each), cheapest first."""
    out = []
    knobs = _knobs(cfg, mesh)
    for n in range(1, max_knobs + 1):
        for combo in itertools.combinations(knobs, n):
            for opts in itertools.product(*combo):
                meshes = [mm for _, _, mm in opts if mm is not None]
                if len(meshes) > 1:
                    continue
                out.append((sum(c for c, _, _ in opts), tuple(x for _, sets, _ in opts for x in sets),
                            meshes[0] if meshes else dict(mesh)))
    return sorted(out, key=lambda c: c[0])


def suggest(path: str, overrides: Sequence[str], mesh: dict, device: str, rows: int | None = None,
            error: float = 0.0) -> Suggestion | None:
    """The cheapest change (see `_knobs`; single knobs and pairs) under which the config fits with a margin of at
    least its peak's budget.error_bytes(peak, error) (Plan.clears; error 0: it fits), or None."""
    cfg = load_run_config(path, overrides)
    for _, sets, m in _candidates(cfg, mesh):
        try:
            p = plan_config(load_run_config(path, list(overrides) + list(sets)), m, device, rows)
        except (ConfigError, ValueError):
            continue  # not a valid config (e.g. the batch no longer splits)
        if p.clears(error):
            change = " ".join([f"--set {x}" for x in sets] + ([f"--mesh {mesh_text(m)}"] if m != mesh else []))
            if math.prod(m.values()) != math.prod(mesh.values()):
                change += f" ({math.prod(m.values())} devices)"
            return Suggestion(change, sets, m, p)
    return None

