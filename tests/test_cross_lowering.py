"""Cross-lowering for the accelerators (issue 25 item 7): from this CPU host, `jax.export` lowers the whole sharded
RL update (GRPO and fused CSD), the static sampler's generate program and the rollout engine's prefill and
decode programs for `cuda` and for `tpu`, on a 4-device abstract mesh (fsdp 2 x tensor 2), bf16 compute,
`attention_impl="pallas"`; nothing is compiled or run. A lowering error of any of them on either platform fails
here.

The kernels are chosen at trace time (models/pallas_attention.py `kernel_platform`), so each export runs under
`lowering_for(platform)`: Triton kernels for CUDA (flash forward / dq / dk-dv, the paged decode kernel), Splash
and jax's TPU paged-decode kernel (Mosaic `tpu_custom_call`) for TPU. Per platform and program the test checks
`exp.platforms`, which kernel custom calls the module holds (how many, which kernels, none of the other
platform's), that every pallas_call runs inside a shard_map (XLA cannot partition one: a bare Mosaic call does not
lower under a multi-device mesh, a bare Triton call would gather every operand onto every GPU), that each @main
argument carries the mesh sharding it was given (Shardy `sdy.sharding` attributes; `exp.in_shardings_hlo` is None
under Shardy) and its dtype, that the program is bf16 where intended (activations, KV pages) and fp32 where the
master weights are, and that it is one 4-device SPMD program on the fsdp x tensor mesh.

Where TPU has no kernel: the static sampler's prefill and decode attend over a KV cache (queries != keys), which
Splash does not express, so on TPU they run the blockwise backend (no custom call, checked); so do the CSD
trunk-group branch prefixes. The engine's prefill chunks use the gathered-pages jnp path on both platforms; its
decode steps use the paged kernel handed to it (`decode_attention=paged_attention`).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import optax
import pytest
from jax import export
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P

from mimesis_jax import models
from mimesis_jax.config.rl import RLConfig
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.models.paged_attention import paged_attention
from mimesis_jax.models.pallas_attention import kernel_platform, lowering_for
from mimesis_jax.inference import engine_programs, sampler
from mimesis_jax.train.rl.step import make_rl_step

MESH = AbstractMesh((2, 2), ("fsdp", "tensor"))
TRITON = "__gpu$xla.gpu.triton"
PLATFORMS = ("cuda", "tpu")
# head_dim 128 and 128-blocks: the shapes Splash and the TPU paged kernel take (Mosaic's (8, 128) tiles)
SMALL = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=128, rope_theta=10000.0, dtype="bfloat16", attention_impl="pallas",
             attention_block_q=128, attention_block_k=128, logits_seq_chunk=64, logits_vocab_chunk=128)
QWEN3 = ModelConfig(model_type="qwen3", **SMALL)
QWEN3_5 = ModelConfig(model_type="qwen3_5_text", partial_rotary_factor=0.25, attn_output_gate=True,
                      layer_types=("linear_attention", "full_attention"), full_attention_interval=2,
                      linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32,
                      linear_num_key_heads=2, linear_num_value_heads=4, **SMALL)


def _abstract(tree, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


def _params(config):
    return _abstract(models.abstract_params(config), models.param_shardings(config, MESH))


def _replicated(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(MESH, P()))


def _rows(shape, dtype):
    """Rows split over the fsdp axis (the batch axes of sharding.py's default rules)."""
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(MESH, P("fsdp", *(None,) * (len(shape) - 1))))


# ------------------------------------------------------------------------------------------- the programs
def _rl_update(config, alpha):
    """The sharded update RLStep compiles (adamw, one micro-batch of 4 rows x 256 tokens)."""
    step = make_rl_step(config, optax.adamw(1e-5), MESH, RLConfig(alpha=alpha))
    params = _params(config)
    opt = _abstract(jax.eval_shape(step.optimizer.init, models.abstract_params(config)),
                    step._opt_shardings(params))
    M, B, T = 1, 4, 256
    shapes = {k: ((M, B, T), jnp.int32) for k in ("tokens", "positions", "segment_ids", "teacher_src")}
    shapes |= {k: ((M, B, T), jnp.float32)
               for k in ("agent_mask", "coached_mask", "advantages", "old_logp", "grpo_weight", "csd_weight")}
    shapes["head_idx"] = ((M, B, 64), jnp.int32)
    if alpha:
        shapes |= {k: ((M, B, 128), jnp.int32) for k in ("branch_tokens", "branch_positions", "branch_ids",
                                                        "branch_trunk_segment", "branch_prefix_len")}
        shapes["branch_head_idx"] = ((M, B, 32), jnp.int32)
    batch = {k: jax.ShapeDtypeStruct(s, d, sharding=step._batch_sharding(s)) for k, (s, d) in shapes.items()}
    return step._compiled(params), (params, opt, batch, None)  # the jitted update RLStep calls


def _sampler(config):
    """generate_bucket: prefill of 4 prompts x 128 tokens, then up to 16 decode steps, top-k/top-p filtered."""
    B, Pl = 4, 128
    i32, f32 = jnp.int32, jnp.float32
    inputs = (_rows((B, Pl), i32), _rows((B, Pl), i32), _rows((B, Pl), i32), _rows((B,), i32), _rows((B,), f32),
              _rows((B,), f32), _rows((B,), i32), _rows((B,), f32), _rows((B,), i32), _rows((B, 4), i32),
              _rows((B,), jnp.uint32), _rows((B,), jnp.uint32), _rows((B,), jnp.bool_))
    filtering = sampler.candidate_count([20], [0.9], config.vocab_size)
    assert filtering > 0  # the filtered path (top-k candidates), not plain sampling
    return (lambda p, *xs: sampler.generate_bucket(config, p, 16, filtering, *xs)), (_params(config),) + inputs


# slots, page-table width, page size, pool pages, state slots: on fsdp 2 the engine is 2 replicas, its pool one
# block of 32 pages and 5 state slots per replica (inference/page_pool.py)
S, W, PAGE, NUM_PAGES, STATES = 4, 8, 16, 64, 10


def _cache(config):
    shapes = jax.eval_shape(lambda: models.family(config, "paged").init_paged_cache(config, NUM_PAGES, PAGE, STATES))
    return jax.tree.map(lambda a: _replicated(a.shape, a.dtype), shapes)


def _samp(n):
    return (_replicated((n,), jnp.uint32), _replicated((n,), jnp.uint32), _replicated((n,), jnp.float32),
            _replicated((n,), jnp.float32), _replicated((n,), jnp.int32), _replicated((n,), jnp.float32))


def _engine_decode(config):
    """decode_program: a burst of 4 one-token steps of 4 slots with the Pallas paged-decode kernel."""
    i32 = jnp.int32
    v = lambda dt=i32: _replicated((S,), dt)  # noqa: E731
    args = (_params(config), _cache(config), v(), v(), v(jnp.bool_), _replicated((S, W), i32), v(), _samp(S), v(),
            v(), _replicated((S, 2), i32), _replicated((), jnp.bool_))
    return (lambda *a: engine_programs.decode_program(config, 0, paged_attention, 4, *a)), args


def _engine_prefill(config):
    """prefill_program: one chunk of 2 rows x 64 tokens over the paged cache."""
    R, C, i32 = 2, 64, jnp.int32
    args = (_params(config), _cache(config), _replicated((R, C), i32), _replicated((R,), i32),
            _replicated((R,), i32), _replicated((R, W), i32), _replicated((R,), i32), _samp(R))
    return (lambda *a: engine_programs.prefill_program(config, 0, paged_attention, *a)), args


PROGRAMS = {
    "grpo_update": lambda: _rl_update(QWEN3, 0.0),
    "csd_update": lambda: _rl_update(QWEN3, 0.01),
    "sampler_qwen3_5": lambda: _sampler(QWEN3_5),
    "engine_decode_qwen3": lambda: _engine_decode(QWEN3),
    "engine_prefill_qwen3_5": lambda: _engine_prefill(QWEN3_5),
}

# kernel custom calls each program's module holds: (Triton calls on cuda, Mosaic tpu_custom_call on tpu).
# grpo: flash fwd + dq + dk/dv (Triton) / Splash fwd + fused dkv (Mosaic). csd adds the teacher branches' own group
# (Triton fwd + bwd; on TPU the own-branch group is a Splash forward, the trunk group blockwise). The sampler: the
# flash forward for the prefill and for a decode step (cuda), blockwise on TPU. Engine decode: the paged kernel
# (one call site inside the layer scan); engine prefill: the jnp gathered-pages path.
KERNELS = {
    "grpo_update": (3, 2),
    "csd_update": (5, 3),
    "sampler_qwen3_5": (2, 0),
    "engine_decode_qwen3": (2, 1),  # a Triton call per layer; TPU: both layers call one outlined shard_map body
    "engine_prefill_qwen3_5": (0, 0),
}
NAMES = {"cuda": {"grpo_update": {"mimesis_flash_fwd", "mimesis_flash_dq", "mimesis_flash_dkv"},
                  "csd_update": {"mimesis_flash_fwd", "mimesis_flash_dq", "mimesis_flash_dkv"},
                  "sampler_qwen3_5": {"mimesis_flash_fwd"}, "engine_decode_qwen3": {"mimesis_paged_decode"}},
         "tpu": {"grpo_update": {"splash_mha_fwd_segmented_residuals", "splash_mha_dkv_segmented_no_residuals"},
                 "csd_update": {"splash_mha_fwd_segmented_residuals", "splash_mha_dkv_segmented_no_residuals"},
                 "engine_decode_qwen3": {"paged_flash_attention_kernel_inline_seq_dim"}}}


def _export(program, platform):
    """Exports the library's jitted program (a lambda closing over its static arguments, under a plain jit); the
    mesh shardings travel on the ShapeDtypeStructs."""
    fn, args = PROGRAMS[program]()
    with lowering_for(platform), jax.sharding.use_abstract_mesh(MESH):
        assert kernel_platform() == platform
        jitted = jax.jit(fn)
        exp = export.export(jitted, platforms=(platform,),
                            disabled_checks=[export.DisabledSafetyCheck.custom_call(TRITON)])(*args)
        jaxpr = jitted.trace(*args).jaxpr  # the trace export lowered (cached), for where the kernels sit
    return exp, args, jaxpr


def _sdy(a: jax.ShapeDtypeStruct) -> str:
    """The Shardy sharding jax writes on an argument of this mesh sharding: one {axes} per dimension."""
    spec = tuple(a.sharding.spec) + (None,) * (len(a.shape) - len(a.sharding.spec))
    dims = ["{" + ", ".join(f'"{n}"' for n in ((d,) if isinstance(d, str) else (d or ()))) + "}" for d in spec]
    return "[" + ", ".join(dims) + "]"


def _main_args(text: str) -> list[tuple[str, str]]:
    """(tensor type, sdy sharding) of each argument of the exported module's @main."""
    sig = next(line for line in text.splitlines() if "func.func public @main(" in line)
    sig = sig[:sig.index(") -> (")]
    out = []
    for chunk in re.split(r"%arg\d+: ", sig)[1:]:
        m = re.search(r"#sdy\.sharding<@mesh, (\[.*?\])>", chunk)
        out.append((chunk[:chunk.index(">") + 1], m.group(1) if m else None))
    return out


def _pallas_calls(jaxpr, in_shard_map: bool = False) -> tuple[int, int]:
    """(pallas_calls inside a shard_map, outside any) in a jaxpr, nested jaxprs included."""
    inside = outside = 0
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        name = eqn.primitive.name
        if name == "pallas_call":
            inside, outside = (inside + 1, outside) if in_shard_map else (inside, outside + 1)
            continue
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (tuple, list)) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    i, o = _pallas_calls(inner, in_shard_map or name == "shard_map")
                    inside, outside = inside + i, outside + o
    return inside, outside


def _kernel_names(text, platform):
    if platform == "cuda":  # the Pallas call's name travels in the Triton call's name attribute
        return set(re.findall(r'name = "(mimesis_\w+)"', text))
    return set(re.findall(r'kernel_name = "(\w+)"', text))


@pytest.mark.parametrize("program", list(PROGRAMS))
@pytest.mark.parametrize("platform", PLATFORMS)
def test_program_exports_for_accelerator(platform, program):
    exp, args, jaxpr = _export(program, platform)
    text = exp.mlir_module()
    assert exp.platforms == (platform,)
    assert exp.nr_devices == MESH.size == 4

    # the attention kernels, and no kernel of the other platform
    n_triton, n_mosaic = text.count(TRITON), text.count("tpu_custom_call")
    want = KERNELS[program][PLATFORMS.index(platform)]
    assert (n_triton, n_mosaic) == ((want, 0) if platform == "cuda" else (0, want)), (n_triton, n_mosaic)
    assert NAMES.get(platform, {}).get(program, set()) <= _kernel_names(text, platform), _kernel_names(text,
                                                                                                      platform)
    if want:  # every kernel runs per device inside shard_map (XLA cannot partition a Triton / Mosaic call)
        assert "sdy.manual_computation" in text
        inside, outside = _pallas_calls(jaxpr)
        assert outside == 0 and inside > 0, (inside, outside)

    # every input's exported sharding is the mesh sharding it was given (Shardy: the @main argument attributes)
    leaves = [a for a in jax.tree.leaves(args) if isinstance(a, jax.ShapeDtypeStruct)]
    assert len(leaves) == len(exp.in_avals)
    main = _main_args(text)  # the arguments the program uses (jit drops unused ones, e.g. GRPO's teacher_src)
    kept = [leaves[i] for i in sorted(exp.module_kept_var_idx)]
    assert len(main) == len(kept) >= len(leaves) - 3
    for a, (ty, got) in zip(kept, main):
        assert got == _sdy(a), (a, ty, got)
        assert ty.startswith("tensor<") and ty.endswith({"float32": "f32>", "bfloat16": "bf16>"}.get(str(a.dtype),
                                                                                                    ">"))
    assert sum(any(d is not None for d in a.sharding.spec) for a in leaves) >= len(jax.tree.leaves(args[0])) // 2
    assert 'sdy.mesh @mesh = <["fsdp"=2, "tensor"=2]>' in text

    # bf16 where intended: activations / KV pages; fp32 master weights in, fp32 weights out
    assert "bf16" in text
    dicts = [a for a in args if isinstance(a, dict)]
    params = dicts[0]  # then the update's batch / the engine's cache
    assert {str(x.dtype) for x in jax.tree.leaves(params)} == {"float32"}
    if program.startswith("engine"):
        assert str(dicts[1]["k"].dtype) == "bfloat16"
    if program.endswith("update"):  # new params: fp32, sharded like the params given
        n = len(jax.tree.leaves(params))
        assert all(str(o.dtype) == "float32" for o in exp.out_avals[:n])
        assert exp.out_avals[:n] == exp.in_avals[:n]
