"""Building blocks shared by the model families: parameter specs, RMSNorm, RoPE, SwiGLU, projections.

Every function here is pure: parameters come in as arrays, nothing is stored on objects.
Parameters are stored in `config.param_dtype` (fp32 master weights) and cast to `config.dtype` where they
are used, so under FSDP the all-gather moves compute-dtype bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax.linen import initializers as flax_init

from mimesis_jax.models.config import ModelConfig
from mimesis_jax.sharding import constrain


# --------------------------------------------------------------------------------------------- specs
@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """Shape, logical axis names (one per dim) and initialiser of one parameter."""

    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    init: str = "normal"  # normal | zeros | ones | a_log | dt_bias
    fan_in_dims: tuple[int, ...] = ()

    def __post_init__(self):
        if len(self.shape) != len(self.axes):
            raise ValueError(f"ParamSpec shape {self.shape} and axes {self.axes} differ in rank")


def is_spec(x: Any) -> bool:
    return isinstance(x, ParamSpec)


def spec_axes(specs):
    """The logical-axes pytree (tuples of names) matching a spec pytree."""
    return jax.tree.map(lambda s: s.axes, specs, is_leaf=is_spec)


def spec_shapes(config: ModelConfig, specs):
    """`jax.ShapeDtypeStruct`s of the parameters, for abstract evaluation without allocating."""
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, config.weight_dtype), specs, is_leaf=is_spec)


def init_from_specs(config: ModelConfig, specs, rng: jax.Array):
    """Initialises every parameter of a spec pytree with Flax's initialisers: matrices ~ N(0, initializer_range)
    as HF does, norms at their neutral value, the DeltaNet decay parameters as transformers draws them."""
    leaves, treedef = jax.tree.flatten(specs, is_leaf=is_spec)
    keys = jax.random.split(rng, len(leaves))
    dtype = config.weight_dtype
    out = []
    inits = {
        "normal": flax_init.normal(stddev=config.initializer_range),
        "zeros": flax_init.zeros_init(),
        "ones": flax_init.ones_init(),
        "dt_bias": flax_init.ones_init(),
        # Qwen3.5 gated DeltaNet: A ~ U(0, 16) (as transformers), stored as log(A)
        "a_log": lambda key, shape, dtype: jnp.log(jax.random.uniform(key, shape, dtype, 1e-2, 16.0)),
    }
    for key, s in zip(keys, leaves):
        if s.init not in inits:
            raise ValueError(f"unknown initialiser {s.init!r}")
        out.append(inits[s.init](key, s.shape, jnp.float32).astype(dtype))
    return jax.tree.unflatten(treedef, out)


# ----------------------------------------------------------------------------------------- norms
def rms_norm(x: jax.Array, weight: jax.Array, eps: float, *, offset: float = 0.0) -> jax.Array:
    """RMSNorm in fp32: x / sqrt(mean(x^2) + eps) * (offset + weight).

    Qwen3 uses offset 0 (weight initialised at 1); the Qwen3.5 family uses offset 1 (weight at 0) and
    multiplies in fp32 before casting back. Qwen3 casts the normalised x back to the input dtype and then
    multiplies by the weight; both orders agree exactly in fp32, and in bf16 the difference is one rounding.
    """
    dtype = x.dtype
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if offset:
        return (xf * (offset + weight.astype(jnp.float32))).astype(dtype)
    return weight.astype(dtype) * xf.astype(dtype)


# ------------------------------------------------------------------------------------------ rope
def rope_tables(positions: jax.Array, rotary_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos/sin tables [B, T, rotary_dim] for integer positions [B, T] (HF 'default' RoPE, fp32)."""
    inv_freq = 1.0 / (theta ** (np.arange(0, rotary_dim, 2, dtype=np.float32) / rotary_dim))
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate-half RoPE on the first `rotary_dim` features of x [B, T, H, Dh]; the rest pass through."""
    rot = cos.shape[-1]
    xr, xp = x[..., :rot], x[..., rot:]
    c = cos[:, :, None, :].astype(x.dtype)
    s = sin[:, :, None, :].astype(x.dtype)
    half = rot // 2
    rotated = jnp.concatenate([-xr[..., half:], xr[..., :half]], axis=-1)
    out = xr * c + rotated * s
    return jnp.concatenate([out, xp], axis=-1) if xp.shape[-1] else out


# ------------------------------------------------------------------------------------------- mlp
def swiglu(x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array, constrain: Callable | None = None) -> jax.Array:
    """down(silu(x @ gate) * (x @ up)); gate/up [D, I], down [I, D]."""
    dt = x.dtype
    with jax.named_scope("mlp"):
        g = jnp.einsum("btd,di->bti", x, gate.astype(dt))
        u = jnp.einsum("btd,di->bti", x, up.astype(dt))
        h = jax.nn.silu(g) * u
        if constrain is not None:
            h = constrain(h, ("act_batch", "act_length", "act_mlp"))
        return jnp.einsum("bti,id->btd", h, down.astype(dt))


def remat_policy(name: str):
    """Maps a config remat name to a jax.checkpoint policy (None means: no remat)."""
    cp = jax.checkpoint_policies
    return {
        "none": None,
        "full": cp.nothing_saveable,
        "dots": cp.checkpoint_dots,
        "dots_no_batch": cp.checkpoint_dots_with_no_batch_dims,
    }[name]


def maybe_remat(fn: Callable, config: ModelConfig, static_argnums: tuple[int, ...] = ()) -> Callable:
    policy = remat_policy(config.remat)
    if policy is None:
        return fn
    return jax.checkpoint(fn, policy=policy, prevent_cse=not config.scan_layers, static_argnums=static_argnums)


def default_positions_segments(tokens: jax.Array, positions=None, segment_ids=None):
    """Positions 0..T-1 and one segment per row, where the caller gave none."""
    B, T = tokens.shape
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    if segment_ids is None:
        segment_ids = jnp.ones((B, T), jnp.int32)
    return positions, segment_ids


def embed_lookup(embedding: jax.Array, tokens: jax.Array, dtype, config: ModelConfig | None = None) -> jax.Array:
    """Rows of a [V, D] table for token ids [B, T] -> [B, T, D] in `dtype`, split over the batch axes.

    Under a mesh the table is first gathered over its `embed` (FSDP) axis, as FSDP does for every weight, and
    only stays split over `vocab`: a gather whose table is split along D would have to be re-laid-out from
    D-split to batch-split, which XLA's SPMD partitioner can only do by replicating it.
    """
    narrowing = jnp.dtype(dtype).itemsize < embedding.dtype.itemsize  # cast before the gather only if smaller
    table = constrain(embedding.astype(dtype) if narrowing else embedding, ("vocab", None), config)
    rows = jnp.take(table, tokens, axis=0).astype(dtype)
    return constrain(rows, ("act_batch", "act_length", "act_embed"), config)
