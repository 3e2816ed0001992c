"""HF checkpoints <-> parameter pytrees, streamed tensor by tensor.

Reads a HF model directory (config.json + model.safetensors, or a sharded model.safetensors.index.json) and
writes one that `transformers.AutoModelForCausalLM.from_pretrained` loads. Neither direction ever holds the
whole model on the host: `read_checkpoint` reads one tensor at a time and puts each parameter straight onto
its devices (a stacked [layers, ...] parameter is assembled from its per-layer tensors in per-device shard
buffers), and `write_checkpoint` fetches one tensor at a time and writes shards of at most `max_shard_bytes`.
Host memory peaks at about one stacked parameter (load) or one shard (save) on top of the result.

This module only converts: the caller (`models.load_hf` / `models.save_hf`) hands it the family's table of
tensors and the target shapes and shardings, so it depends on neither the model registry nor sharding rules.

Each family's HF module (qwen3_hf.py, qwen3_5_hf.py) provides ``hf_tensors(config)``: a list of `HFTensor` entries, one per HF tensor name,
saying where it lives in our pytree (a path and, for stacked layers, the index on the leading axis), its HF
shape, and how to convert in each direction, and ``hf_name``: None, or ``hf_name(name) -> name | None`` normalising names
of a checkpoint (e.g. strips a multimodal prefix; None = a tensor this project deliberately ignores, such as
vision or multi-token-prediction weights). Every other tensor must be consumed: a missing, misshaped or
unexpected tensor is an error that names it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Callable, Iterable

import jax
import ml_dtypes
import numpy as np
from jax.experimental import multihost_utils
from safetensors import safe_open
from safetensors.numpy import save_file

from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import ModelConfig

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


def read_config(path: str, dtype: str = "float32", **runtime) -> ModelConfig:
    """The ModelConfig of a HF directory's config.json; `dtype` is the parameter (and default compute) dtype."""
    if dtype not in _NP_DTYPES:
        raise ConfigError(f"load_hf: dtype must be one of {list(_NP_DTYPES)}, got {dtype!r}")
    runtime.setdefault("dtype", dtype)
    runtime.setdefault("param_dtype", dtype)
    return ModelConfig.from_hf_dir(path, **runtime)


# ------------------------------------------------------------------------------------------ reading
class _TensorSource:
    """Names and shapes of the tensors of a HF directory (single file or sharded index), read from the
    safetensors headers only; `get` reads one tensor. A file is opened per tensor, so no memory map (whose
    touched pages count as resident) outlives the read of one tensor."""

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
        self.shapes: dict[str, tuple[int, ...]] = {}  # normalised name -> shape on disk
        self.ignored: list[str] = []
        for fn in files:
            full = os.path.join(path, fn)
            if not os.path.exists(full):
                raise CheckpointError(f"{full}: listed in the index but missing")
            try:
                with safe_open(full, "numpy") as f:
                    shapes = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
            except Exception as e:  # safetensors raises its own error types
                raise CheckpointError(f"{full}: cannot read safetensors file ({e})") from None
            for n, shape in shapes.items():
                norm = normalize(n)
                if norm is None:
                    self.ignored.append(n)
                    continue
                if norm in self.where:
                    raise CheckpointError(f"{full}: tensor {n!r} appears twice (as {norm!r})")
                self.where[norm] = (full, n)
                self.shapes[norm] = shape

    def get(self, name: str) -> np.ndarray:
        full, orig = self.where[name]
        with safe_open(full, "numpy") as f:
            return f.get_tensor(orig)


def read_checkpoint(path: str, config: ModelConfig, entries: list[HFTensor], target,
                    normalize: Callable[[str], str | None] | None = None):
    """Params read from the safetensors of HF directory `path`, streamed tensor by tensor.

    `entries` is the family's `hf_tensors(config)`; `target` the params pytree of `jax.ShapeDtypeStruct`s
    (shape, dtype and, optionally, the `sharding` each parameter is placed with; default: the first local
    device). Names, shapes and coverage are all checked from the headers before any tensor is read.
    """
    src = _TensorSource(path, normalize or (lambda n: n))
    for e in entries:
        if e.name not in src.where:
            raise CheckpointError(f"{path}: missing tensor {e.name!r}")
        if src.shapes[e.name] != tuple(e.hf_shape):
            raise CheckpointError(f"{path}: tensor {e.name!r} has shape {src.shapes[e.name]}, expected "
                                  f"{tuple(e.hf_shape)} from config.json")
    extra = sorted(set(src.where) - {e.name for e in entries})
    if config.tie_word_embeddings:
        extra = [n for n in extra if n != "lm_head.weight"]  # some tied checkpoints also store the head
    if extra:
        raise CheckpointError(f"{path}: unexpected tensor(s) not used by model_type {config.model_type!r}: "
                              f"{extra[:5]}{' ...' if len(extra) > 5 else ''}")
    by_path: dict[tuple[str, ...], list[HFTensor]] = {}
    for e in entries:
        by_path.setdefault(e.path, []).append(e)
    leaves = _leaves_by_path(target)
    for p, want in leaves.items():
        _check_coverage(path, p, want.shape, by_path.get(p, []))

    def read(e: HFTensor, shape, dtype) -> np.ndarray:
        w = src.get(e.name)
        w = e.to_ours(w if w.dtype == np.float32 else w.astype(np.float32)).astype(dtype, copy=False)
        if w.shape != tuple(shape):
            raise CheckpointError(f"{path}: parameter {'/'.join(e.path)} got shape {w.shape} from tensor "
                                  f"{e.name!r}, expected {tuple(shape)}")
        return w

    placed = {p: _assemble(want, by_path[p], read) for p, want in leaves.items()}
    return jax.tree.unflatten(jax.tree.structure(target), [placed[p] for p in leaves])


def _check_coverage(path: str, p: tuple[str, ...], shape, group: list[HFTensor]) -> None:
    """Every parameter is provided exactly once: by one unstacked tensor, or by one tensor per layer."""
    name = "/".join(p)
    if not group:
        raise CheckpointError(f"{path}: no tensor provides parameter {name}")
    if group[0].index is None:
        if len(group) != 1:
            raise CheckpointError(f"{path}: parameter {name} is provided by several tensors "
                                  f"{[e.name for e in group]}")
        return
    got = sorted(e.index for e in group)
    if got != list(range(shape[0])):
        raise CheckpointError(f"{path}: parameter {name} needs one tensor per layer 0..{shape[0] - 1}, got "
                              f"layers {got}")


def _assemble(want, group: list[HFTensor], read) -> jax.Array:
    """One parameter placed on its devices from its tensor(s), holding at most this host's shards of it plus
    one tensor. Each distinct shard (devices holding the same slice share it) is filled, for a stacked
    parameter, layer by layer from the per-layer tensors, then copied to its devices."""
    sharding = want.sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    shape, dtype = tuple(want.shape), np.dtype(want.dtype)
    devices_of: dict[tuple[tuple[int, int], ...], list] = {}
    for d, idx in sharding.addressable_devices_indices_map(shape).items():
        key = tuple(s.indices(n)[:2] for s, n in zip(idx, shape)) if idx is not None else ()
        key = key + tuple((0, n) for n in shape[len(key):])
        devices_of.setdefault(key, []).append(d)
    sl = lambda key: tuple(slice(a, b) for a, b in key)  # noqa: E731
    if group[0].index is None:
        w = read(group[0], shape, dtype)
        shards = {key: w[sl(key)] for key in devices_of}
    else:
        shards = {key: np.empty(tuple(b - a for a, b in key), dtype) for key in devices_of}
        for e in group:
            w = read(e, shape[1:], dtype)
            for key, buf in shards.items():
                (lo, hi), rest = key[0], key[1:]
                if lo <= e.index < hi:
                    buf[e.index - lo] = w[sl(rest)]
            del w
    arrays = [jax.device_put(shards[key], d) for key, devs in devices_of.items() for d in devs]
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


# ------------------------------------------------------------------------------------------ writing
def write_checkpoint(path: str, config: ModelConfig, entries: list[HFTensor], params,
                     max_shard_bytes: int = 4 << 30) -> None:
    """Writes config.json + safetensors in `config.param_dtype` (sharded with an index above
    `max_shard_bytes`), fetching one tensor at a time from `params` (device or host arrays; arrays that span
    several processes are gathered leaf slice by leaf slice, every process taking part, process 0 writing).
    Host memory peaks at about one shard plus one tensor."""
    np_dtype = np.dtype(_NP_DTYPES[config.param_dtype])
    plan = _plan_shards(entries, np_dtype.itemsize, max_shard_bytes)
    writer = jax.process_index() == 0
    if writer:
        os.makedirs(path, exist_ok=True)
    names = ["model.safetensors"] if len(plan) == 1 else [
        f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))]
    for fn, shard in zip(names, plan):
        tensors = {}
        for e in shard:
            w = _fetch(_get(params, e.path), e.index)
            tensors[e.name] = np.ascontiguousarray(e.to_hf(w).astype(np_dtype, copy=False))
            del w
        if writer:
            save_file(tensors, os.path.join(path, fn), metadata={"format": "pt"})
        del tensors
    if not writer:
        return
    if len(plan) > 1:
        weight_map = {e.name: fn for fn, shard in zip(names, plan) for e in shard}
        total = sum(math.prod(e.hf_shape) * np_dtype.itemsize for e in entries)
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config.to_hf_dict(), f, indent=2)


def _plan_shards(entries: Iterable[HFTensor], itemsize: int, max_shard_bytes: int) -> list[list[HFTensor]]:
    """Entries grouped in order into files of at most `max_shard_bytes` (a larger tensor gets its own file),
    from the HF shapes alone, so the layout is known before any tensor is fetched."""
    shards: list[list[HFTensor]] = [[]]
    size = 0
    for e in entries:
        nbytes = math.prod(e.hf_shape) * itemsize
        if size and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += nbytes
    return shards


def _fetch(leaf, index: int | None) -> np.ndarray:
    """One parameter, or one layer of a stacked one, as a float32 host array."""
    x = leaf if index is None else leaf[index]
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x), np.float32)


# ------------------------------------------------------------------------------------------ helpers
def _get(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def _leaves_by_path(tree) -> dict[tuple[str, ...], object]:
    """{(key, ...): leaf} of a nested-dict pytree, in jax's flattening order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {tuple(str(k.key) for k in kp): leaf for kp, leaf in flat}
