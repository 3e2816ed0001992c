"""The programs a run compiles, built by the loops' own code on abstract inputs, with the per-device bytes of
XLA's memory analysis next to the planner's (`python -m mimesis_jax plan --compiled`, tests/test_plan_compiled.py).

Nothing is allocated: every program is lowered on jax.ShapeDtypeStruct inputs carrying the NamedShardings the
loop places its arrays with, and compiled ahead of time. The programs, per stage:

* LM stages (mid-training, SFT): the train step of train/loop.py `compiled_functions` (its state shardings, the
  batch over the batch mesh axes as `sharding.global_batch` places it), rows = train.global_batch;
* RL stages: the update of train/rl/step.py `make_rl_step` (built as the learner builds it, with the optimizer's
  schedule), once per program of the run's shape ladder (Workload.programs: Stage II with rollout.row_len set),
  else once on the planner's worst-case shapes; and the static sampler's `generate_bucket` on the training mesh
  (the policy's StaticGenerator, chat_models.policy_model: params as the learner shards them, inputs over the batch axes).

  With rl.old_logprobs=recompute, the old-log-prob scoring pass (RLStep._score_fn: a no-gradient forward) on the
  largest update program's batch, planned by budget.scoring_peak.

* RL stages with rollout.engine=true: instead of the sampler, the rollout engine's decode burst
  (inference/engine_programs.py `decode_program`, the jnp path) and its largest prefill chunk (`prefill_program`:
  prefill_rows x prefill_chunk tokens), page tables max_pages_per_seq wide, in the engine's replica layout
  (budget.engine_mesh: as the loops run it, chat_models.policy_model on distributed.rollout_mesh, the weights
  resharded into it at every update, replicated over the replicas and split over tensor; the pool as
  inference/engine_sizing.py sizes it for the config, one block per replica, heads over tensor). Planned by
  budget.engine_decode_peak and engine_prefill_peak: the engine's parameters + pool + the burst's slot-major page
  copy, or one layer's forward over the gathered pages and the LM head's table, + a copy of every layer's weight
  shards (the paged forward unrolls the layers, models/qwen3_paged.py, and XLA materialises each layer's static
  slice of the stacked weights, out of the decode loop and from the prefill's start; budget.engine_layer_copies).
  The figures: docs/engine.md, "Plan."

Compiled bytes of one call: arguments + results - results aliased to donated arguments + scratch. Planned bytes:
the train-step peak of budget.plan for an update; for the sampler, the rollout peak less the optimizer state (it
stays resident but is no argument of the sampler).

bf16 on the CPU backend: XLA computes bf16 in float32 there, and its float normalization holds float32 stand-ins
for bf16 values that an accelerator program does not (the whole saved-activation stack's among them).
`normalization_split` (plan/normalization.py, where the rule is written) reads them from the compiled program's
dumped buffer assignment; `program_memory` splits them out of every program it compiles and compares the plan with the rest, compiled -
copies. The rule catches convert-made copies only: a value the normalized program computes and carries in
float32 (the sampler's KV cache through its decode loop) stays in the rest.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from mimesis_jax import models, sharding
from mimesis_jax.algorithms.rl_batch import BEHAV_KEY, BRANCH_KEYS, TOKEN_KEYS, TRUNK_KEYS
from mimesis_jax.errors import ConfigError
from mimesis_jax.inference.weight_sync import engine_dtype, rollout_sync
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.plan.budget import engine_decode_peak, engine_mesh, engine_prefill_peak, plan, scoring_peak
from mimesis_jax.plan.devices import Device, device_for
from mimesis_jax.plan.normalization import (  # noqa: F401  (plan.compiled's names for them, as before)
    Normalization, normalization_split, split_compile, splits, without_persistent_cache)
from mimesis_jax.plan.workload import Workload, runtime_model, workload_from_config
from mimesis_jax.profiling import memory_bytes

# CPU code generation options only (LLVM effort): XLA's buffer assignment, hence the memory analysis, is unchanged;
# the compiles are quicker.
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
# QUICK adds the CPU backend's older (non-MLIR) fusion emitters: quicker compiles still, whose fusions differ a
# little from FAST's (bytes: docs/scale-out.md, "Figures behind the code"). For the tests; `plan --compiled`
# reports FAST's.
QUICK = FAST | {"xla_cpu_use_fusion_emitters": False}
TOLERANCE = 0.10  # |planned / compiled - 1| the tests accept
# the programs whose bf16 rest (compiled - normalization copies - heap gaps) tests/test_plan_compiled.py compares
# with the plan (the update programs, the old-log-prob scoring pass, the static sampler and the engine's decode
# burst); the engine's prefill is compared in float32 only
SPLIT_CHECKED = ("rl update", "train step", "old log-probs", "sampler", "engine decode", "engine prefill")
PALLAS_ON_CPU = ("attention_impl=pallas: the CPU backend cannot compile its GPU (Triton) or TPU (Splash) kernels and "
                 "runs them in Pallas interpret mode (models/pallas_attention.py), so these compiled bytes are the "
                 "interpreter's; a GPU or TPU compile decides the kernels' own")


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
    name: str
    planned: int  # bytes per device, budget.plan
    compiled: int  # bytes per device, compiled.memory_analysis()
    copies: int | None = None  # of `compiled`, the CPU's float-normalization copies (`normalization_split`); None:
    # not split (float32 compute, another backend, or a program the split does not cover)
    gaps: int = 0  # of `compiled`, where split: the temp heap's fragmentation (Normalization.gaps)

    @property
    def rest(self) -> int:
        """The compiled bytes less the normalization copies and, where split, the heap's fragmentation: what the
        plan is compared with."""
        return self.compiled - (self.copies or 0) - self.gaps

    @property
    def ratio(self) -> float:
        return self.planned / self.rest


def compiled_total(compiled) -> int:
    """Peak bytes of one call per device: arguments + results - results aliased to donated arguments + scratch."""
    temp, output = memory_bytes(compiled)
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes) + output - int(m.alias_size_in_bytes) + temp


def within(planned: int, compiled: int, tol: float = TOLERANCE) -> bool:
    return abs(planned / compiled - 1) <= tol


def abstract(tree, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


def need_devices(mesh: dict) -> None:
    """ConfigError unless this process sees at least the mesh's devices (fake CPU devices will do)."""
    n, have = math.prod(mesh.values()), jax.device_count()
    if have < n:
        raise ConfigError(f"--compiled: the mesh {mesh} needs {n} devices, this process sees {have}; run with "
                          f"XLA_FLAGS=--xla_force_host_platform_device_count={n} JAX_PLATFORMS=cpu")


def _mesh(axes: dict):
    need_devices(axes)
    return sharding.make_mesh(axes)


# ------------------------------------------------------------------------------------------- programs
def lm_step_memory(mc: ModelConfig, rows: int, T: int, axes: dict, grad_accum: int, opt_cfg, total_steps: int = 10,
                   skip_nonfinite: bool = False, options: dict = FAST) -> int:
    """The LM train step of train/loop.py (`compiled_functions`) on `rows` rows of T tokens."""
    from mimesis_jax.train.loop import compiled_functions

    mesh = _mesh(axes)
    _, _, abs_state, shard, _, step = compiled_functions(mc, opt_cfg, total_steps, mesh, grad_accum, skip_nonfinite)
    batch = {k: jax.ShapeDtypeStruct((rows, T), jnp.float32 if k == "loss_mask" else jnp.int32,
                                     sharding=sharding.batch_sharding(mesh, (rows, T)))
             for k in ("tokens", "positions", "segment_ids", "loss_mask")}
    with sharding.use_mesh(mesh):
        return compiled_total(step.jitted.lower(abstract(abs_state, shard), batch).compile(options))


def rl_batch_shapes(w: Workload, behaviour: bool = False) -> dict[str, tuple[tuple[int, ...], object]]:
    """The [M, B/M, ...] arrays of one update as the packer lays them out (algorithms/rl_batch.py: trunk and
    per-token arrays, the head index, with fused CSD branches the branch arrays and their head index; with
    `behaviour`, rl.behavior_is_cap > 0, the behaviour log-probs)."""
    M, B = w.microbatches, w.rows // w.microbatches
    shapes = {k: ((M, B, w.row_len), jnp.int32) for k in TRUNK_KEYS}
    shapes |= {k: ((M, B, w.row_len), jnp.int32 if k == "teacher_src" else jnp.float32) for k in TOKEN_KEYS}
    shapes["head_idx"] = ((M, B, w.head_len), jnp.int32)
    if w.branch_len:
        shapes |= {k: ((M, B, w.branch_len), jnp.int32) for k in BRANCH_KEYS}
        shapes["branch_head_idx"] = ((M, B, w.branch_head_len), jnp.int32)
    if behaviour:
        shapes[BEHAV_KEY] = ((M, B, w.row_len), jnp.float32)
    return shapes


def update_memory(step, shapes: dict[str, tuple[tuple[int, ...], object]], ref: bool | None = None,
                  options: dict | None = QUICK) -> int:
    """Compiled bytes per device of the RLStep `step`'s update (train/rl/step.py) on a batch of `shapes` ({name:
    ([M, B/M, ...], dtype)}, as `rl_batch_shapes` gives them): params and optimizer state sharded as the step
    places them, the batch over the mesh's batch axes (RLStep._batch_sharding), the reference params (ref; default:
    rl.kl_coef > 0) like the params. options: XLA compile options; None compiles as the loop's own call does, so
    after the loop has run the update on these shapes the program is jax's cached one, not compiled again."""
    params = _abstract_params(step)
    opt = abstract(jax.eval_shape(step.optimizer.init, models.abstract_params(step.config)),
                   step._opt_shardings(params))
    batch = {k: jax.ShapeDtypeStruct(s, d, sharding=step._batch_sharding(s)) for k, (s, d) in shapes.items()}
    if ref is None:
        ref = getattr(step.rl, "kl_coef", 0.0) > 0
    return compiled_total(step.lower(params, opt, batch, params if ref else None).compile(options))


def _abstract_params(step):
    """The RLStep's params as abstract arrays, sharded as the step places them."""
    return abstract(models.abstract_params(step.config), models.param_shardings(step.config, step.mesh))


def _rl_step(w: Workload, rl):
    """The RLStep of train/rl/step.py, built as train/rl/learner.py `setup` builds it."""
    from mimesis_jax.train.optim import make_optimizer, make_schedule
    from mimesis_jax.train.rl.step import make_rl_step

    tx = make_optimizer(w.optimizer, w.total_updates, w.model)
    return make_rl_step(w.model, tx, _mesh(w.mesh), rl, schedule=make_schedule(w.optimizer, w.total_updates))


def rl_step_memory(w: Workload, rl, options: dict = FAST) -> int:
    """The RL update of train/rl/step.py, built as train/rl/learner.py `setup` builds it."""
    return update_memory(_rl_step(w, rl), rl_batch_shapes(w, rl.behavior_is_cap > 0),
                         options=options)


def scoring_memory(w: Workload, rl, options: dict = FAST) -> int:
    """The old-log-prob scoring pass (RLStep._score_fn, as recompute_old_logprobs calls it) on w's update batch:
    params sharded as the step places them, the batch's scoring arrays over the batch axes."""
    from mimesis_jax.train.rl.step import SCORE_KEYS

    step = _rl_step(w, rl)
    params = _abstract_params(step)
    batch = {k: jax.ShapeDtypeStruct(s, d, sharding=step._batch_sharding(s))
             for k, (s, d) in rl_batch_shapes(w).items() if k in SCORE_KEYS}
    with sharding.use_mesh(step.mesh):
        return compiled_total(step._score.lower(params, batch).compile(options))


def sampler_memory(w: Workload, filtering: int = 0, stops: int = 0, options: dict = FAST) -> int:
    """One `generate_bucket` call of w.rollout's shapes on the training mesh, inputs as sampler._generate_chunk
    places them (`filtering`: the static candidate count; 0 with the policy's top_k = 0, top_p = 1; `stops`: the
    stop-token columns, 0 = the bucket of one stop token)."""
    from mimesis_jax.inference import sampler

    mesh = _mesh(w.mesh)
    r = w.rollout
    B, Pl = r.batch, r.prompt_len
    params = abstract(models.abstract_params(w.model), models.param_shardings(w.model, mesh))

    def arr(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding.batch_sharding(mesh, shape, w.model))

    i32, f32 = jnp.int32, jnp.float32
    S = stops or sampler.Buckets().stops(1)
    inputs = (arr((B, Pl), i32), arr((B, Pl), i32), arr((B, Pl), i32), arr((B,), i32), arr((B,), f32), arr((B,), f32),
              arr((B,), i32), arr((B,), f32), arr((B,), i32), arr((B, S), i32), arr((B,), jnp.uint32),
              arr((B,), jnp.uint32), arr((B,), jnp.bool_))
    with sharding.use_mesh(mesh):
        lowered = sampler.generate_bucket.lower(w.model, params, r.new_tokens, filtering, *inputs)
    return compiled_total(lowered.compile(options))


def engine_decode_memory(w: Workload, options: dict = FAST) -> int:
    """One decode burst of the rollout engine sized for w (w.engine) in its replica layout (`_engine_inputs`),
    page tables max_pages_per_seq wide, no sampling filter, the jnp attention path (inference/engine.py
    `decode_args` gives a real engine's arguments of the same shapes)."""
    from mimesis_jax.inference import engine_programs, sampler

    m = w.model
    ec, mesh, params, cache, replicas = _engine_inputs(w)
    S = replicas * ec.slots  # every replica's slots, replica-major (inference/engine_programs.py)
    arr, samp = _arr, _sampling_args(S)
    i32 = jnp.int32
    with sharding.use_mesh(mesh):
        lowered = engine_programs.decode_program.lower(
            m, 0, None, ec.decode_steps, params, cache, arr(i32, S), arr(i32, S), arr(jnp.bool_, S),
            arr(i32, S, ec.max_pages_per_seq), arr(i32, S), samp, arr(i32, S), arr(i32, S),
            arr(i32, S, sampler.Buckets().stops(0)), arr(jnp.bool_))
    return compiled_total(lowered.compile(options))


def _arr(dtype, *shape):
    return jax.ShapeDtypeStruct(shape, dtype)


def _sampling_args(n: int) -> tuple:
    """The engine programs' per-row sampling arguments (seeds, salts, temperature, log-prob temperature, top-k,
    top-p) for n rows, abstract and unplaced (the programs replicate them)."""
    i32, f32, u32 = jnp.int32, jnp.float32, jnp.uint32
    return (_arr(u32, n), _arr(u32, n), _arr(f32, n), _arr(f32, n), _arr(i32, n), _arr(f32, n))


def _engine_inputs(w: Workload):
    """(EngineConfig, mesh, params, pool) of the rollout engine sized for w (w.engine) in its replica layout
    (budget.engine_mesh over w's devices), as the RL loops run it (chat_models.policy_model: RolloutEngine on
    distributed.rollout_mesh, the params resharded into that layout by inference/weight_sync.py), abstract: the
    params as models.param_shardings lays them out there (replicated over the replicas, split over tensor) and the
    paged pool of the model family's `init_paged_cache` split as inference/page_pool.py splits it: one block of
    pages and state slots per data-parallel replica, heads over tensor (paged_cache.pool_axes(replicas=True)); and
    the replica count."""
    from mimesis_jax.inference.engine_programs import replica_count
    from mimesis_jax.models import paged_cache

    m, ec = w.model, w.engine.engine_config()
    mesh = _mesh(engine_mesh(w.mesh))
    init = models.family(m, "paged").init_paged_cache
    R = replica_count(mesh, m)
    shapes = jax.eval_shape(lambda: init(m, R * ec.num_pages, ec.page_size, R * ec.states))
    cache = abstract(shapes, sharding.tree_shardings(mesh, paged_cache.pool_axes(shapes, replicas=True), shapes, m))
    params = abstract(models.abstract_params(m), models.param_shardings(m, mesh))
    narrow = engine_dtype(m)
    params = jax.tree.map(lambda x, cast: jax.ShapeDtypeStruct(x.shape, narrow, sharding=x.sharding)
                          if cast and narrow else x, params, models.compute_cast_mask(m))
    return ec, mesh, params, cache, R


def engine_prefill_memory(w: Workload, options: dict = FAST) -> int:
    """One prefill chunk of the rollout engine sized for w (w.engine) in its replica layout (`_engine_inputs`):
    inference/engine_programs.py `prefill_program` on its largest call, prefill_rows x prefill_chunk tokens over page
    tables max_pages_per_seq wide, no sampling filter, the jnp attention path (as inference/engine.py `_warmup`
    calls it)."""
    from mimesis_jax.inference import engine_programs

    m = w.model
    ec, mesh, params, cache, replicas = _engine_inputs(w)
    R = replicas * ec.prefill_rows  # every replica's rows, replica-major
    C, arr, samp = ec.prefill_chunk, _arr, _sampling_args(R)
    i32 = jnp.int32
    with sharding.use_mesh(mesh):
        lowered = engine_programs.prefill_program.lower(
            m, 0, None, params, cache, arr(i32, R, C), arr(i32, R), arr(i32, R),
            arr(i32, R, ec.max_pages_per_seq), arr(i32, R), samp)
    return compiled_total(lowered.compile(options))


# ----------------------------------------------------------------------------------------- per config
def weight_sync_memory(model: ModelConfig, axes: dict, processes: int, options: dict = FAST,
                       layout: dict | None = None, engine: bool = False) -> int:
    """Compiled per-device bytes of the largest program of the weight sync (inference/weight_sync.py) from the
    training mesh `axes` to each of `processes` processes' blocks (laid out as `layout` says: `rollout.mesh` parsed,
    config/layout.py rollout_layout; None: the blocks as they are), the processes emulated on this one's devices,
    built as the loop builds it (weight_sync.rollout_sync; `engine`: the rollout engine's copy, its matrices cast to
    the compute dtype inside the programs): what plan/memory.py `weight_sync_bytes(..., engine=engine).peak` plans."""
    sync = rollout_sync(model, _mesh(axes), layout, engine, processes=processes)
    return max(compiled_total(c) for _, c in sync.compiled(models.abstract_params(model), options))


def program_workloads(w: Workload) -> list[tuple[str, Workload]]:
    """(name, workload) of each update program: one per ladder program (rows x row_len x head x branch x
    branch_head), else the planner's worst-case shapes."""
    if w.kind == "lm" or not w.programs:
        return [("train step" if w.kind == "lm" else "rl update", w)]
    out = []
    for k in w.programs:
        rows, T, head, branch, branch_head = k
        name = "rl update " + "x".join(str(v) for v in k)
        out.append((name, dataclasses.replace(w, rows=rows, row_len=T, head_len=head, branch_len=branch,
                                              branch_head_len=branch_head)))
    return out


def program_memory(cfg, mesh: dict, device: str | Device = "cpu", largest_only: bool = False,
                   sampler: bool = True, options: dict = FAST, updates: bool = True,
                   split: bool | None = None, on_pool: bool = False) -> list[ProgramMemory]:
    """Planned and compiled per-device bytes of every program `cfg`'s loop compiles on `mesh` (a dict of axis
    sizes; this process must see that many devices). largest_only: of the update ladder, its last (largest)
    program only, and of the sampler's prompt ladder its longest rung (else every rung); sampler=False leaves the
    sampler (or engine) out, updates=False the update and scoring programs (one process's rollout of several:
    cfg = workload.process_config, mesh = workload.process_mesh); options: XLA compile options (FAST or QUICK);
    split: each program's float-normalization copies split out (`normalization_split`, ProgramMemory.copies),
    default `splits(model)`; on_pool: `mesh` is a rollout pool's (workload.workload_from_config)."""
    need_devices(mesh)
    w = workload_from_config(cfg, mesh, runtime_model(cfg), on_pool=on_pool)
    dev = device if isinstance(device, Device) else device_for(device, w.num_devices)
    out = []
    progs = program_workloads(w) if updates else []
    if split is None:
        split = splits(w.model)

    def measure(name: str, planned: int, compile_fn) -> ProgramMemory:
        if not split:
            return ProgramMemory(name, planned, compile_fn(options))
        compiled, n = split_compile(compile_fn, options)
        return ProgramMemory(name, planned, compiled, n.extra, n.gaps)

    for name, wp in (progs[-1:] if largest_only else progs):
        if w.kind == "lm":
            t = cfg.train

            def compile_fn(opts, wp=wp):
                return lm_step_memory(wp.model, wp.rows, wp.row_len, mesh, wp.microbatches, cfg.optimizer,
                                      t.steps, t.nonfinite == "skip", opts)
        else:
            def compile_fn(opts, wp=wp):
                return rl_step_memory(wp, cfg.rl, opts)
        out.append(measure(name, plan(wp, dev).train_peak, compile_fn))
    if updates and w.kind != "lm" and getattr(cfg.rl, "old_logprobs", None) == "recompute":
        name, wp = progs[-1]
        out.append(measure("old log-probs " + name.removeprefix("rl update").strip() if w.programs
                           else "old log-probs", scoring_peak(wp), lambda opts: scoring_memory(wp, cfg.rl, opts)))
    if sampler and w.kind != "lm" and w.engine is not None:
        p, e = plan(w, dev), w.engine
        ec = e.engine_config()
        out.append(measure(f"engine prefill {ec.prefill_rows}x{ec.prefill_chunk}, {e.max_pages_per_seq} pages",
                           engine_prefill_peak(w), lambda opts: engine_prefill_memory(w, opts)))
        out.append(measure(f"engine decode {e.slots}x{e.max_pages_per_seq} pages", engine_decode_peak(w),
                           lambda opts: engine_decode_memory(w, opts)))
    if sampler and w.kind != "lm" and w.engine is None:
        # every prompt rung of the loop's sampler ladder (workload.sampler_prompts; w.rollout is the longest)
        prompts = sorted(set(w.sampler_prompts) | {w.rollout.prompt_len})
        for P in prompts[-1:] if largest_only else prompts:
            ws = dataclasses.replace(w, rollout=dataclasses.replace(w.rollout, prompt_len=P))
            p, r = plan(ws, dev), ws.rollout
            out.append(measure(f"sampler {r.batch}x{r.prompt_len}+{r.new_tokens}",
                               p.rollout_peak - p.item("optimizer state"),
                               lambda opts, ws=ws: sampler_memory(ws, options=opts)))
    return out


def format_programs(rows: list[ProgramMemory], model: ModelConfig) -> str:
    """The `plan --compiled` table: program | planned GiB | compiled GiB | planned / compiled; where a row's
    float-normalization copies were split out (bf16 on CPU, `normalization_split`), also its copies, its temp heap's
    fragmentation (gaps) and the rest (compiled - copies - gaps), and the ratio is planned / rest."""
    split = any(r.copies is not None for r in rows)
    if not split:
        lines = [f"  {'program':40s} {'planned GiB':>12s} {'compiled GiB':>13s} {'ratio':>7s}"]
        for r in rows:
            lines.append(f"  {r.name:40s} {r.planned / 2 ** 30:12.2f} {r.compiled / 2 ** 30:13.2f} {r.ratio:7.3f}")
    else:
        lines = [f"  {'program':40s} {'planned GiB':>12s} {'compiled GiB':>13s} {'copies GiB':>11s} "
                 f"{'gaps GiB':>9s} {'rest GiB':>9s} {'ratio':>7s}"]
        for r in rows:
            copies, gaps, rest = ("-", "-", "-") if r.copies is None else (
                f"{r.copies / 2 ** 30:.2f}", f"{r.gaps / 2 ** 30:.2f}", f"{r.rest / 2 ** 30:.2f}")
            lines.append(f"  {r.name:40s} {r.planned / 2 ** 30:12.2f} {r.compiled / 2 ** 30:13.2f} {copies:>11s} "
                         f"{gaps:>9s} {rest:>9s} {r.ratio:7.3f}")
        names = ", ".join(r.name for r in rows if r.copies is not None)
        checked = [r.name for r in rows if r.copies is not None and r.name.startswith(SPLIT_CHECKED)]
        unchecked = [r.name for r in rows if r.copies is not None and not r.name.startswith(SPLIT_CHECKED)]
        lines.append(f"  note: compiled for the CPU backend, which computes {model.dtype} in float32; copies: the "
                     "float32 stand-ins its float normalization holds at the peak (plan/compiled.py "
                     "`normalization_split`: convert-produced float32 buffers of bf16 values and float32 values read "
                     "only through converts to bf16, float32 broadcasts of jax's bf16 ones, values of a bf16 "
                     "argument updated in place (the engine's page pool), read from XLA's buffer assignment), "
                     "gaps: its temp heap's fragmentation (the plan has none; a GPU allocates its heap "
                     "differently), rest = compiled - copies - gaps, "
                     f"ratio = planned / rest; split for: {names}; checked this way (tests/test_plan_compiled.py "
                     "holds the bf16 update programs', the scoring pass's, the sampler's and the engine's decode "
                     "burst's and prefill's rest within 10% of the plan): "
                     f"{', '.join(checked) or 'none'}"
                     + (f"; not checked this way, in float32 only (their bf16 rest is not held to the plan): "
                        f"{', '.join(unchecked)}"
                        if unchecked else "")
                     + "; the other rows are compiled totals (planned / compiled); --set train.dtype=float32 "
                     "compares like with like")
    if not split and jax.default_backend() == "cpu" and model.dtype != "float32":
        lines.append(f"  note: compiled for the CPU backend, which computes {model.dtype} in float32: its float "
                     "normalization adds float32 copies of the saved-activation stack and of the KV cache that a GPU "
                     "program does not hold; --set train.dtype=float32 compares like with like")
    if jax.default_backend() == "cpu" and model.attention_impl == "pallas":
        lines.append(f"  note: {PALLAS_ON_CPU}")
    return "\n".join(lines)
