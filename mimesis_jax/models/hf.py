"""HF checkpoints <-> (ModelConfig, params).

Reads a HF model directory (config.json + model.safetensors, or a sharded model.safetensors.index.json),
lazily and tensor by tensor, and writes one that `transformers.AutoModelForCausalLM.from_pretrained` loads.

Each family module provides ``hf_tensors(config)``: a list of `HFTensor` entries, one per HF tensor name,
saying where it lives in our pytree (a path and, for stacked layers, the index on the leading axis), its HF
shape, and how to convert in each direction. Optionally ``hf_name(name) -> name | None`` normalises names
of a checkpoint (e.g. strips a multimodal prefix; None = a tensor this project deliberately ignores, such as
vision or multi-token-prediction weights). Every other tensor must be consumed: a missing, misshaped or
unexpected tensor is an error that names it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

import jax
import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from mimesis_jax.models.config import ConfigError, ModelConfig

_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


class CheckpointError(ValueError):
    """A broken checkpoint; the message names the file and tensor."""


@dataclasses.dataclass(frozen=True)
class HFTensor:
    name: str  # HF tensor name, e.g. "model.layers.3.self_attn.q_proj.weight"
    path: tuple[str, ...]  # where it lives in our params pytree
    index: int | None  # position on the stacked leading axis (None = not stacked)
    hf_shape: tuple[int, ...]
    to_ours: Callable[[np.ndarray], np.ndarray] = lambda w: w
    to_hf: Callable[[np.ndarray], np.ndarray] = lambda w: w


def linear_in(shape_out: tuple[int, ...]):
    """HF Linear weight [out, in] -> ours [in, *shape_out] (and back)."""
    def to_ours(w):
        return np.ascontiguousarray(w.T).reshape((w.shape[1],) + tuple(shape_out))

    def to_hf(w):
        return np.ascontiguousarray(w.reshape(w.shape[0], -1).T)
    return to_ours, to_hf


def linear_out(shape_in: tuple[int, ...]):
    """HF Linear weight [out, in] with `in` = prod(shape_in) -> ours [*shape_in, out] (and back)."""
    def to_ours(w):
        return np.ascontiguousarray(w.T).reshape(tuple(shape_in) + (w.shape[0],))

    def to_hf(w):
        return np.ascontiguousarray(w.reshape(-1, w.shape[-1]).T)
    return to_ours, to_hf


# ------------------------------------------------------------------------------------------ reading
class _TensorSource:
    """Lazy access to the tensors of a HF directory (single file or sharded index)."""

    def __init__(self, path: str, normalize: Callable[[str], str | None]):
        self.path = path
        single = os.path.join(path, "model.safetensors")
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            try:
                with open(index) as f:
                    weight_map = json.load(f)["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise CheckpointError(f"{index}: not a valid safetensors index ({e!r})") from None
            files = sorted(set(weight_map.values()))
        elif os.path.exists(single):
            files = ["model.safetensors"]
        else:
            raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json")
        self.where: dict[str, tuple[str, str]] = {}  # normalised name -> (file, original name)
        self.ignored: list[str] = []
        for fn in files:
            full = os.path.join(path, fn)
            if not os.path.exists(full):
                raise CheckpointError(f"{full}: listed in the index but missing")
            try:
                with safe_open(full, "numpy") as f:
                    names = list(f.keys())
            except Exception as e:  # safetensors raises its own error types
                raise CheckpointError(f"{full}: cannot read safetensors file ({e})") from None
            for n in names:
                norm = normalize(n)
                if norm is None:
                    self.ignored.append(n)
                    continue
                if norm in self.where:
                    raise CheckpointError(f"{full}: tensor {n!r} appears twice (as {norm!r})")
                self.where[norm] = (full, n)

    def get(self, name: str) -> np.ndarray:
        full, orig = self.where[name]
        with safe_open(full, "numpy") as f:
            return f.get_tensor(orig)


def load_hf(path: str, dtype: str = "float32", mesh=None, rules=None, **runtime):
    """(config, params) from a HF directory. `dtype` is the parameter (and default compute) dtype.

    With a mesh, each parameter is placed directly in its sharded layout.
    """
    from mimesis_jax.models import family, param_specs

    if dtype not in _NP_DTYPES:
        raise ConfigError(f"load_hf: dtype must be one of {list(_NP_DTYPES)}, got {dtype!r}")
    runtime.setdefault("dtype", dtype)
    runtime.setdefault("param_dtype", dtype)
    config = ModelConfig.from_hf_dir(path, **runtime)
    fam = family(config)
    normalize = getattr(fam, "hf_name", lambda n: n)
    src = _TensorSource(path, normalize)
    entries = fam.hf_tensors(config)
    specs = param_specs(config)
    np_dtype = _NP_DTYPES[config.param_dtype]

    flat: dict[tuple[str, ...], np.ndarray] = {}
    consumed = set()
    for e in entries:
        if e.name not in src.where:
            raise CheckpointError(f"{path}: missing tensor {e.name!r}")
        w = src.get(e.name)
        if tuple(w.shape) != tuple(e.hf_shape):
            raise CheckpointError(f"{path}: tensor {e.name!r} has shape {tuple(w.shape)}, expected {tuple(e.hf_shape)} "
                                  f"from config.json")
        consumed.add(e.name)
        w = e.to_ours(w.astype(np.float32) if w.dtype != np.float32 else w)
        spec = _get(specs, e.path)
        if e.index is None:
            flat[e.path] = w.astype(np_dtype)
        else:
            buf = flat.get(e.path)
            if buf is None:
                buf = flat[e.path] = np.zeros(spec.shape, np_dtype)
            buf[e.index] = w
    extra = sorted(set(src.where) - consumed)
    if config.tie_word_embeddings:
        extra = [n for n in extra if n != "lm_head.weight"]  # some tied checkpoints also store the head
    if extra:
        raise CheckpointError(f"{path}: unexpected tensor(s) not used by model_type {config.model_type!r}: "
                              f"{extra[:5]}{' ...' if len(extra) > 5 else ''}")
    params = _unflatten(flat)
    for path_, spec in _flatten_specs(specs):
        if path_ not in flat:
            raise CheckpointError(f"{path}: no tensor provides parameter {'/'.join(path_)}")
        if flat[path_].shape != spec.shape:
            raise CheckpointError(f"{path}: parameter {'/'.join(path_)} got shape {flat[path_].shape}, "
                                  f"expected {spec.shape}")
    if mesh is not None:
        from mimesis_jax.sharding import shard_params

        params = shard_params(config, params, mesh, rules)
    else:
        params = jax.tree.map(lambda a: jax.numpy.asarray(a), params)
    return config, params


# ------------------------------------------------------------------------------------------ writing
def save_hf(path: str, config: ModelConfig, params, max_shard_bytes: int = 4 << 30) -> None:
    """Writes config.json + safetensors (sharded with an index above `max_shard_bytes`)."""
    from mimesis_jax.models import family

    os.makedirs(path, exist_ok=True)
    fam = family(config)
    np_dtype = _NP_DTYPES[config.param_dtype]
    host = jax.tree.map(lambda a: np.asarray(jax.device_get(a)), params)
    tensors: dict[str, np.ndarray] = {}
    for e in fam.hf_tensors(config):
        w = _get(host, e.path)
        w = w if e.index is None else w[e.index]
        tensors[e.name] = np.ascontiguousarray(e.to_hf(np.asarray(w, np.float32)).astype(np_dtype))
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for n, t in tensors.items():
        if size and size + t.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][n] = t
        size += t.nbytes
    if len(shards) == 1:
        save_file(shards[0], os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, sh in enumerate(shards):
            fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(sh, os.path.join(path, fn), metadata={"format": "pt"})
            weight_map.update({n: fn for n in sh})
        total = sum(t.nbytes for t in tensors.values())
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config.to_hf_dict(), f, indent=2)


# ------------------------------------------------------------------------------------------ helpers
def _get(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def _unflatten(flat: dict[tuple[str, ...], np.ndarray]) -> dict:
    out: dict = {}
    for path, v in flat.items():
        d = out
        for p in path[:-1]:
            d = d.setdefault(p, {})
        d[path[-1]] = v
    return out


def _flatten_specs(specs, prefix=()):
    from mimesis_jax.models.layers import is_spec

    if is_spec(specs):
        yield prefix, specs
        return
    for k, v in specs.items():
        yield from _flatten_specs(v, prefix + (k,))
