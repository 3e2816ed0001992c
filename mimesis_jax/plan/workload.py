"""What one optimizer update of a run config asks of a mesh (rows, row length, micro-batches, CSD branches, the
sampler's shapes), and the config and model the planner reads."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from mimesis_jax.algorithms.rl_batch import ROW_STEPS, SHAPE_FIELDS, bucket
from mimesis_jax.config.choices import NOTE_TOKENS
from mimesis_jax.config import AgentRLConfig, RunConfig, SimRLConfig, load_config
from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.plan.memory import divisor
from mimesis_jax.inference.engine_sizing import rollout_sizing
from mimesis_jax.inference.sampler import Buckets
from mimesis_jax.config.layout import decode_layout, layout_text, rollout_layout
from mimesis_jax.sharding import layout_axes, rules_of
from mimesis_jax.train.rl.chat_models import fixed_buckets, ladder_buckets
from mimesis_jax.train.rl.ladder import ladder_for_config
from mimesis_jax.train.state import model_config_for



@dataclasses.dataclass(frozen=True)
class Rollout:
    batch: int  # sequences per sampler call: min(rollout batch, rollout.max_batch), after the batch bucket
    prompt_len: int  # longest prompt (after the prompt bucket)
    new_tokens: int  # per call (after the new-token bucket)


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one optimizer update of a run config moves through the model (global sizes)."""

    kind: str  # lm | agentrl | simrl
    name: str
    model: ModelConfig  # runtime model: compute dtype, remat, fp32 master weights
    mesh: dict
    optimizer: object  # config.OptimizerConfig
    total_updates: int
    rows: int  # rows per optimizer update, summed over micro-batches
    microbatches: int
    row_len: int
    head_len: int  # positions per row through the LM head
    accumulate: bool  # micro-batch gradients are summed into an accumulator (2 gradient buffers)
    branch_len: int = 0  # CSD teacher-branch row length (0: no CSD)
    branch_head_len: int = 0
    rollout: Rollout | None = None
    notes: tuple[str, ...] = ()
    # the RL step programs the run compiles (rl_batch.ShapeLadder.programs: (rows, row_len, head, branch,
    # branch_head) per program, cheapest first); () = shapes on the fine ladders (rollout.row_len = 0), unbounded
    programs: tuple[tuple[int, ...], ...] = ()
    engine: object = None  # rollout.engine=true: the policy engine's pools (rollout/engine_sizing.EngineSizing)
    # the prompt lengths of the sampler programs the loop's static sampler compiles (batch and new tokens those of
    # `rollout`, whose prompt is the longest): simrl one (chat_models.fixed_buckets), agentrl one per prompt rung
    # (chat_models.ladder_buckets); () = shapes on the sampler's default ladders (no context budget, or the engine)
    sampler_prompts: tuple[int, ...] = ()
    # rollout.devices = N > 0: the rollouts run on each process's pool of N devices apart from the training mesh
    # (train/rl/distributed.py "the rollout pool"), planned apart (commands/plan.py); this mesh only trains
    pool: int = 0

    @property
    def fixed_sampler(self) -> bool:
        """Whether the loop's static sampler compiles a known set of programs (`sampler_prompts`)."""
        return bool(self.sampler_prompts)

    @property
    def num_devices(self) -> int:
        return math.prod(self.mesh.values())


def _sampler_shapes(batch: int, longest_prompt: int, new_tokens: int, batch_multiple: int) -> Rollout:
    b = Buckets()
    return Rollout(b.batch(batch, batch_multiple), b.prompt(max(1, longest_prompt)), b.new_tokens(new_tokens))


def batch_multiple(model: ModelConfig, mesh: dict) -> int:
    """The product of the batch mesh axes (sharding.batch_shard_count without a Mesh): row counts of the packer
    and the sampler's batch are padded to a multiple of it."""
    target = rules_of(model)["act_batch"]
    target = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
    return math.prod(mesh.get(a, 1) for a in target)


def batch_shards(model: ModelConfig, mesh: dict, rows: int) -> int:
    """How many ways `rows` rows are split over the batch mesh axes (the act_batch rule, with its
    divisibility fall-back)."""
    return divisor(("act_batch",), (rows,), mesh, model)


def process_mesh(mesh: dict, processes: int) -> dict:
    """One process's part of `mesh` (axis sizes) when `processes` jax.distributed processes hold equal shares of
    its devices in process-major order, as jax.devices() lists them: the sub-mesh distributed.local_rollout_mesh
    builds, on which that process samples. Its block is the innermost axes whole and a divisor of the next; a
    block that is no sub-grid gets every local device on fsdp (else data), as local_rollout_mesh does."""
    n = math.prod(mesh.values())
    if processes < 1 or n % processes:
        raise ConfigError(f"--processes {processes}: must be >= 1 and divide the mesh's {n} devices")
    left, out = n // processes, {a: 1 for a in mesh}
    for a in reversed(list(mesh)):
        size = mesh[a]
        if left >= size and left % size == 0:
            out[a], left = size, left // size
        elif left < size and size % left == 0:
            out[a], left = left, 1
        else:
            break
    if left != 1:  # no sub-grid: every local device on the axis the sampler splits rows over
        out = {a: 1 for a in mesh}
        out["fsdp" if "fsdp" in mesh else "data" if "data" in mesh else next(iter(mesh))] = n // processes
    return out


def rollout_mesh_text(cfg, mesh: dict) -> str:
    """The layout an RL stage's config decodes in on the training mesh `mesh`, as `rollout.mesh` spells it: the
    key itself, or with `rollout.engine` and the key unset the engine's default (config/layout.py decode_layout:
    the tensor split kept, the other devices replicas); "" (decode in the training layout) else. An LM stage has
    no rollout."""
    if not isinstance(cfg, (AgentRLConfig, SimRLConfig)):
        return ""
    return layout_text(decode_layout(cfg.rollout.mesh, cfg.rollout.engine or pool_size(cfg) > 0,
                                     mesh.get("tensor", 1)))


def pool_size(cfg) -> int:
    """`rollout.devices` of an RL config: the devices of each process's rollout pool (0: none; an LM stage has
    none)."""
    return 0 if isinstance(cfg, RunConfig) else int(cfg.rollout.devices)


def rollout_axes(cfg, mesh: dict, processes: int) -> dict:
    """The mesh (axis sizes) each of `processes` processes samples on: with `rollout.mesh` set, its layout over the
    process's devices (sharding.layout_axes: data = replicas, fsdp 1, tensor; a ConfigError naming rollout.mesh
    unless it uses exactly those devices), else the process's block of `mesh` (`process_mesh`; `mesh` itself on
    one process). With a rollout pool (`rollout.devices` = N): the pool's N devices in that layout (the engine's
    replicas x the training tensor split by default, as train/rl/distributed.py pool_mesh lays them out)."""
    n = pool_size(cfg)
    if n:
        layout = rollout_layout(rollout_mesh_text(cfg, mesh))
        try:
            return layout_axes(layout, n)
        except ConfigError:
            raise ConfigError(f"config key 'rollout.devices': a pool of {n} devices is not split by the rollout "
                              f"layout {rollout_mesh_text(cfg, mesh)} (replicas x tensor)") from None
    local = process_mesh(mesh, processes)
    layout = rollout_layout(rollout_mesh_text(cfg, mesh))
    return local if layout is None else layout_axes(layout, math.prod(local.values()))


def process_config(cfg, processes: int):
    """The config one of `processes` processes rolls out: its share of each step's tasks (distributed.process_share:
    task i on process i % processes, so process 0 gets the most) and of rollout.max_batch
    (distributed.process_max_batch), every other key the same."""
    r = cfg.rollout
    share, cap = -(-r.prompts_per_step // processes), -(-r.max_batch // processes)
    return dataclasses.replace(cfg, rollout=dataclasses.replace(r, prompts_per_step=share, max_batch=cap))


def workload_from_config(cfg, mesh: dict, model: ModelConfig, rows: int | None = None, *,
                         on_pool: bool = False) -> Workload:
    """The per-update workload of a RunConfig, AgentRLConfig or SimRLConfig on `mesh`.

    The rollout engine holds every step in flight (rl.max_staleness + 1 steps' dialogues, train/rl/learner.py
    steps_at_once). With a rollout pool (`rollout.devices`) the workload on the training mesh rolls out nothing
    (`Workload.pool`); on_pool: the workload of the rollouts on the pool's `mesh` instead.

    RL row counts are data-dependent; the default assumes the worst case the config allows for Stage II (every
    dialogue fills a row of rollout.row_len tokens) and one row per rollout for Stage I's joint RL (each rollout's
    segments pack into one row). `rows` overrides it (and train.global_batch for a RunConfig).
    """
    name = getattr(cfg, "name", "") or "config"
    if isinstance(cfg, RunConfig):
        t = cfg.train
        n = t.global_batch if rows is None else rows
        if n % t.grad_accum:
            raise ConfigError(f"--rows {n}: must be a multiple of train.grad_accum={t.grad_accum}")
        return Workload("lm", name, model, mesh, cfg.optimizer, t.steps, n, t.grad_accum, cfg.data.seq_len,
                        cfg.data.seq_len - 1, t.grad_accum > 1)
    r, rl = cfg.rollout, cfg.rl
    kind = "agentrl" if hasattr(cfg, "users") else "simrl"
    max_new = r.agent_max_tokens if kind == "agentrl" else r.max_tokens
    context = r.max_context_tokens or r.row_len
    if not context:
        raise ConfigError(f"{name}: rollout.row_len and rollout.max_context_tokens are both 0 (bucketed from the "
                          "batch): set one of them to plan the row length")
    T = r.row_len or bucket(context, 64)
    per_update = r.mini_batch_prompts * r.group_size
    M = rl.num_microbatches
    multiple = M * batch_multiple(model, mesh)
    n = bucket(per_update, multiple, ROW_STEPS) if rows is None else rows
    if n % M:
        raise ConfigError(f"--rows {n}: must be a multiple of rl.num_microbatches={M}")
    turns = r.max_turns if kind == "agentrl" else cfg.domains.max_user_turns
    notes = []
    agent_tokens = min(T - 1, turns * max_new)
    if kind == "agentrl" and r.max_context_tokens and cfg.gyms.max_prompt_tokens:
        agent_tokens = min(agent_tokens, r.max_context_tokens - cfg.gyms.max_prompt_tokens)
    head = min(bucket(agent_tokens, 64, 8), T)
    branch = branch_head = 0
    if kind == "agentrl" and rl.alpha > 0:
        if rl.teacher != "fused":
            raise ConfigError(f"{name}: rl.teacher={rl.teacher!r}: the planner covers the fused CSD teacher only")
        branch = bucket(agent_tokens + turns * (cfg.users.coach_max_tokens + NOTE_TOKENS), 64, 16)
        branch_head = head
        notes.append(f"CSD branches: every agent turn coached, notes of users.coach_max_tokens="
                     f"{cfg.users.coach_max_tokens} + {NOTE_TOKENS} template tokens")
    rollout_batch = r.prompts_per_step * r.group_size
    per_call = min(rollout_batch, r.max_batch) if r.max_batch else rollout_batch
    longest = max(1, context - max_new)
    # the loop's fixed sampler buckets (the stage's policy_buckets): simrl's one program, agentrl's prompt rungs
    fixed = (fixed_buckets if kind == "simrl" else ladder_buckets)(r, max_new, rollout_batch)
    if fixed is not None:
        roll = Rollout(fixed.batch(per_call, batch_multiple(model, mesh)), fixed.prompt(longest),
                       fixed.new_tokens(max_new))
    else:
        roll = _sampler_shapes(per_call, longest, max_new, batch_multiple(model, mesh))
    notes.append(f"rollout: {rollout_batch} sequences in {-(-rollout_batch // per_call)} sampler call(s) of <= "
                 f"{per_call} (rollout.max_batch={r.max_batch})")
    per = "given by --rows" if rows is not None else "one per " + ("dialogue" if kind == "agentrl" else "rollout")
    notes.append(f"rows per update: {n} ({per}), {M} micro-batch(es)")
    engine = None
    if r.engine:  # the policy samples through one rollout engine on the training mesh instead of the sampler
        at_once = rollout_batch * (rl.max_staleness + 1)  # every step in flight (train/rl/learner.py steps_at_once)
        engine = rollout_sizing(r, model, at_once, mesh=mesh)  # per replica, the budget per device
        notes[-2] = f"rollout: {at_once} dialogues in flight on the rollout engine (one process)"
        notes.append(f"rollout engine pool: {engine.describe()}")
        if kind == "agentrl" and "://" not in cfg.users.simulator and cfg.users.simulator != "toy-user":
            notes.append("an in-process simulator's own engine (same rollout.engine* keys) is not counted")
    ladder = ladder_for_config(cfg, multiple)
    programs = tuple(ladder.programs()) if ladder is not None else ()
    if programs:  # the shapes the loop compiles: each field's top rung (the head is the row, not the agent bound)
        top = ladder_top(programs)
        n = top[0] if rows is None else n
        T, head, branch, branch_head = top[1:]
    if r.devices and not on_pool:
        notes.append(f"rollout.devices={r.devices}: the rollouts run on each process's pool of {r.devices} devices, "
                     "planned apart (below); this mesh only trains")
    return Workload(kind, name, model, mesh, cfg.optimizer, cfg.train.steps * cfg.updates_per_step(), n, M, T,
                    head, True, branch, branch_head, roll, tuple(notes), programs, engine,
                    fixed.prompt_rungs if fixed is not None and engine is None else (), 0 if on_pool else r.devices)


def ladder_top(programs) -> tuple[int, ...]:
    """The largest rung of each shape field (SHAPE_FIELDS) over a ladder's programs: what the planner's figures
    assume. On rl_batch.ShapeLadder it is its largest program (head = row_len, branch_head = min(branch,
    row_len) follow the rows and branch rungs)."""
    return tuple(max(k[i] for k in programs) for i in range(len(SHAPE_FIELDS)))


def programs_text(w: Workload) -> list[str]:
    """The plan's lines naming the RL step programs and the static sampler programs a run compiles (one
    process)."""
    if w.kind == "lm":
        return []
    if not w.programs:
        lines = ["step programs: not bounded (rollout.row_len = 0 or the naive teacher: shapes on the fine "
                 "bucket ladders)"]
    else:
        keys = ", ".join("x".join(str(v) for v in k) for k in w.programs)
        lines = [f"step programs: {len(w.programs)} ({' x '.join(SHAPE_FIELDS)}, cheapest first): {keys}"]
    if w.sampler_prompts:
        r = w.rollout
        keys = ", ".join(f"{r.batch}x{p}+{r.new_tokens}" for p in w.sampler_prompts)
        lines.append(f"sampler programs: {len(w.sampler_prompts)} (batch x prompt + new tokens): {keys}")
    return lines




def load_run_config(path: str, overrides: Sequence[str] = ()):
    """A RunConfig, AgentRLConfig or SimRLConfig from a config file (+ --set overrides)."""
    return load_config(path, overrides, kind=(RunConfig, AgentRLConfig, SimRLConfig))


def runtime_model(cfg) -> ModelConfig:
    """The model the trainer runs (compute dtype, remat; the vocabulary of a tokenizer-built tiny model)."""
    tok = None
    if cfg.tokenizer.set_model_vocab:
        tok = load_tokenizer(cfg.tokenizer.name)
    return model_config_for(cfg, tok)

