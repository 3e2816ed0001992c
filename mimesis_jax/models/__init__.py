"""Models: one functional API over every family (Qwen3 agent, Qwen3.5 simulator).

    config, params = load_hf(path)                  # HF directory -> (ModelConfig, param pytree)
    save_hf(path, config, params)                   # -> directory transformers loads to the same logits
    params = init_params(config, rng)               # random init (optionally directly sharded on a mesh)
    params = shard_params(config, params, mesh)     # placed by the logical-axis rules (param_shardings)
    logits = forward(config, params, input_ids)     # [B, T, V] fp32, inference / tests only
    ids = greedy_generate(config, params, prompt_ids, max_new_tokens)

A family has three modules, dispatched by `config.model_type` (`family(config, part)`): the model (qwen3.py,
qwen3_5.py: param_specs, hidden_states, init_cache, cache_axes, extend), its paged decode for the rollout engine
(qwen3_paged.py, qwen3_5_paged.py: init_paged_cache, forward_paged) and its HF tensor table (qwen3_hf.py,
qwen3_5_hf.py: hf_tensors, hf_name: a function or None), which hf.py converts with. `has_part` says whether a
family implements a part.

Imports run one way: this package uses `sharding` (rules, meshes, constraints) and `hf` (conversion), and
hands them the specs and tensor tables of the family; neither imports the models package back.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp

from mimesis_jax import sharding
from mimesis_jax.models import hf
from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.models.layers import init_from_specs, is_spec, spec_axes, spec_shapes

def _parts(model_type: str) -> dict | None:
    """{part: module} of a family ("model", "paged": the rollout engine's paged cache, "hf": the HF tensor
    table), None for a model_type without an implementation. The modules are imported here, on first use, not
    with this package: they bring the attention kernels, which a command that never builds a model (and
    `import mimesis_jax.cli`) should not pay for."""
    if model_type == "qwen3":
        from mimesis_jax.models import qwen3, qwen3_hf, qwen3_paged
        return {"model": qwen3, "paged": qwen3_paged, "hf": qwen3_hf}
    if model_type == "qwen3_5_text":
        from mimesis_jax.models import qwen3_5, qwen3_5_hf, qwen3_5_paged
        return {"model": qwen3_5, "paged": qwen3_5_paged, "hf": qwen3_5_hf}
    return None


def has_part(config: ModelConfig, part: str) -> bool:
    """Whether `config.model_type`'s family implements `part` (an unknown model_type implements none)."""
    parts = _parts(config.model_type)
    return parts is not None and part in parts


def family(config: ModelConfig, part: str = "model"):
    """The module implementing `part` of `config.model_type`: "model", "paged" (the rollout engine's paged
    cache) or "hf" (the HF tensor table)."""
    parts = _parts(config.model_type)
    if parts is None:
        raise ConfigError(f"config key 'model_type': no implementation for {config.model_type!r}")
    if part not in parts:
        raise ConfigError(f"config key 'model_type': {config.model_type!r} has no {part!r} part")
    return parts[part]


def param_specs(config: ModelConfig):
    return family(config).param_specs(config)


def param_axes(config: ModelConfig):
    """Pytree of logical axis names, one tuple per parameter."""
    return spec_axes(param_specs(config))


def abstract_params(config: ModelConfig):
    """Pytree of jax.ShapeDtypeStruct: shapes without allocating (for planning and abstract checks)."""
    return spec_shapes(config, param_specs(config))


def param_shardings(config: ModelConfig, mesh, rules=None):
    """NamedSharding of every parameter of `config`'s model, as the rules say (`rules`, else
    `config.sharding_rules`, else sharding.DEFAULT_RULES)."""
    return sharding.tree_shardings(mesh, param_axes(config), abstract_params(config),
                                   rules if rules is not None else config)


def shard_params(config: ModelConfig, params, mesh, rules=None):
    """Places every parameter on `mesh` as the rules say (works for host numpy arrays and device arrays)."""
    return jax.tree.map(jax.device_put, params, param_shardings(config, mesh, rules))


def init_params(config: ModelConfig, rng: jax.Array, mesh=None, rules=None):
    """Random parameters. With a mesh, every parameter is created directly in its sharded layout."""
    return _init_fn(config, mesh, rules, _CHEAP_INIT["on"])(rng)


# Inside `cheap_init_compile()` (what `rehearse` runs in) the random init compiles at LLVM's lowest effort on a
# CPU: its threefry / erfinv code otherwise costs more than the rest of a tiny run. Its values then differ from the
# default compile's by about 1 ulp, so runs and tests keep the default: a seed's weights do not depend on where
# they were initialised (figures: docs/scale-out.md, "Figures behind the code").
CPU_INIT_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
_CHEAP_INIT = {"on": False}


@contextlib.contextmanager
def cheap_init_compile():
    """Random inits (`init_params`) inside compile at LLVM's lowest effort on a CPU (see CPU_INIT_OPTIONS)."""
    before, _CHEAP_INIT["on"] = _CHEAP_INIT["on"], True
    try:
        yield
    finally:
        _CHEAP_INIT["on"] = before


@functools.lru_cache(maxsize=32)
def _init_fn(config: ModelConfig, mesh, rules, cheap: bool = False):
    fn = functools.partial(init_from_specs, config, param_specs(config))
    platform = (mesh.devices.flat[0] if mesh is not None else jax.devices()[0]).platform
    options = CPU_INIT_OPTIONS if cheap and platform == "cpu" else None
    if mesh is None:
        return jax.jit(fn, compiler_options=options)
    return jax.jit(fn, out_shardings=param_shardings(config, mesh, rules), compiler_options=options)


def compute_cast_mask(config: ModelConfig):
    """Pytree of bools, True for every parameter the forward casts to the compute dtype before it reads it: each
    with an `embed` axis (the layers' matrices and the embedding table) but the LM head's weight, which
    `logits_from_hidden` reads in float32 (the embedding too, when tied). A copy with those cast to the compute
    dtype and the rest (norm scales, DeltaNet gates and conv taps, read in float32) kept computes bit for bit what
    the parameters do (inference/weight_sync.py `WeightSync(exact=True)`)."""
    head = "embed" if config.tie_word_embeddings else "lm_head"
    flat, tree = jax.tree_util.tree_flatten_with_path(param_axes(config), is_leaf=lambda x: isinstance(x, tuple))
    return jax.tree_util.tree_unflatten(tree, ["embed" in axes and jax.tree_util.keystr(path) != f"['{head}']"
                                               for path, axes in flat])


def lm_head_weight(config: ModelConfig, params) -> jax.Array:
    """[V, D] output projection (the embedding when tied)."""
    return params["embed"] if config.tie_word_embeddings else params["lm_head"]


def hidden_states(config: ModelConfig, params, input_ids, positions=None, segment_ids=None, branch=None):
    """Final-norm hidden states; see the family module. Returns (trunk [B,T,D], branches [B,Tb,D] or None)."""
    return family(config).hidden_states(config, params, input_ids, positions, segment_ids, branch)


def logits_from_hidden(config: ModelConfig, params, hidden: jax.Array) -> jax.Array:
    w = lm_head_weight(config, params)
    return jnp.einsum("...d,vd->...v", hidden.astype(jnp.float32), w.astype(jnp.float32))


@functools.partial(jax.jit, static_argnums=0)
def _forward(config, params, input_ids, positions, segment_ids):
    h, _ = hidden_states(config, params, input_ids, positions, segment_ids)
    return logits_from_hidden(config, params, h)


def forward(config: ModelConfig, params, input_ids, positions=None, segment_ids=None) -> jax.Array:
    """Full logits [B, T, V] in float32. For inference and tests: training never builds these."""
    input_ids = jnp.asarray(input_ids, jnp.int32)
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
    pos = None if positions is None else jnp.asarray(positions, jnp.int32)
    seg = None if segment_ids is None else jnp.asarray(segment_ids, jnp.int32)
    return _forward(config, params, input_ids, pos, seg)


def init_cache(config: ModelConfig, batch: int, max_len: int):
    return family(config).init_cache(config, batch, max_len)


def cache_axes(config: ModelConfig):
    return family(config).cache_axes(config)


def extend(config: ModelConfig, params, cache, tokens, positions, segment_ids=None):
    """Feeds new tokens through the model on top of a decoding cache: (hidden [B,T,D], new cache)."""
    return family(config).extend(config, params, cache, tokens, positions, segment_ids)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _greedy(config, params, prompt_ids, max_new_tokens):
    B, P = prompt_ids.shape
    cache = init_cache(config, B, P + max_new_tokens)
    pos = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
    h, cache = extend(config, params, cache, prompt_ids, pos)
    first = jnp.argmax(logits_from_hidden(config, params, h[:, -1]), axis=-1).astype(jnp.int32)

    def step(carry, i):
        tok, cache = carry
        h, cache = extend(config, params, cache, tok[:, None], jnp.full((B, 1), P + i, jnp.int32))
        nxt = jnp.argmax(logits_from_hidden(config, params, h[:, -1]), axis=-1).astype(jnp.int32)
        return (nxt, cache), tok

    (last, _), toks = jax.lax.scan(step, (first, cache), jnp.arange(max_new_tokens - 1))
    return jnp.concatenate([toks.T, last[:, None]], axis=1) if max_new_tokens > 1 else first[:, None]


def greedy_generate(config: ModelConfig, params, prompt_ids, max_new_tokens: int) -> jax.Array:
    """Greedy decoding with the KV cache: [B, P] equal-length prompts -> [B, max_new_tokens] new ids.

    Runs exactly max_new_tokens steps (no EOS stop; the sampler in rollout/ handles stop tokens).
    """
    prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
    if prompt_ids.ndim != 2:
        raise ValueError(f"prompt_ids must be [batch, length], got shape {prompt_ids.shape}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    return _greedy(config, params, prompt_ids, int(max_new_tokens))


def load_hf(path: str, dtype: str = "float32", mesh=None, rules=None, **runtime):
    """(config, params) from a HF directory. `dtype` is the parameter (and default compute) dtype; `runtime`
    sets runtime fields of the config (attention backend, remat, ...).

    Streamed: one tensor at a time is read and each parameter goes straight to its devices (with a mesh, in
    its sharded layout), so the host never holds the model (see hf.read_checkpoint).
    """
    config = hf.read_config(path, dtype, **runtime)
    fam = family(config, "hf")
    shapes = abstract_params(config)
    if mesh is not None:
        shapes = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes,
                              param_shardings(config, mesh, rules))
    params = hf.read_checkpoint(path, config, fam.hf_tensors(config), shapes, fam.hf_name)
    return config, params


def save_hf(path: str, config: ModelConfig, params, max_shard_bytes: int = 4 << 30) -> None:
    """Writes config.json + safetensors in `config.param_dtype` that transformers loads (sharded with an index
    above `max_shard_bytes`); one tensor at a time is fetched from `params` (see hf.write_checkpoint)."""
    hf.write_checkpoint(path, config, family(config, "hf").hf_tensors(config), params, max_shard_bytes)


__all__ = [
    "ModelConfig", "family", "param_specs", "param_axes", "abstract_params", "param_shardings",
    "shard_params", "init_params",
    "lm_head_weight", "compute_cast_mask", "hidden_states", "logits_from_hidden", "forward", "init_cache", "cache_axes", "extend",
    "greedy_generate", "load_hf", "save_hf", "is_spec",
]
