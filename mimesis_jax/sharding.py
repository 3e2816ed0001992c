"""Meshes, logical-axis rules and placement of parameters, activations and batches.

Layers name the axes of their tensors with *logical* names; a rules table maps each logical name to zero or
more *mesh* axes. The same model code then runs on 1 CPU device, 8 fake CPU devices or a pod slice.

Parameter axes:  vocab, embed, heads, kv_heads, head_dim, mlp, layers, norm, plus the Qwen3.5 linear-attention
                 axes (lin_heads, lin_kv_heads, lin_dim, conv).
Activation axes: act_batch, act_length, act_embed, act_heads, act_kv_heads, act_mlp, act_vocab.

Rule semantics (written down because the paper is silent and users must predict placements):
* a logical name maps to a mesh axis, a tuple of mesh axes, or None (replicated);
* mesh axes that the current mesh lacks, or that another dim of the same tensor already uses, are dropped;
* if a dim is not divisible by the product of its mesh axes, trailing mesh axes are dropped until it is
  (e.g. kv_heads=1 on tensor=2 stays replicated; a batch of 2 on data=2 x fsdp=2 uses data only).

This module knows axes and shapes, not models: the models package imports it (for `constrain`) and hands it
its parameter axes (`models.param_shardings`, `models.shard_params` call `tree_shardings`); nothing here
imports the models package back.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from flax.linen import partitioning as flax_partitioning
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    # parameters
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("lin_heads", "tensor"),
    ("lin_kv_heads", "tensor"),
    ("head_dim", None),
    ("lin_dim", None),
    ("conv", None),
    ("layers", None),
    ("norm", None),
    # activations
    ("act_batch", ("data", "fsdp")),
    ("act_length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    ("act_cache_length", None),
)


def rules_table(config_or_rules=None) -> tuple[tuple[str, Any], ...]:
    """The rules as (logical, mesh) pairs, from a ModelConfig (its `sharding_rules`), a table/dict, or None
    (DEFAULT_RULES). A logical name may appear several times: later entries are fallbacks (Flax semantics)."""
    rules = getattr(config_or_rules, "sharding_rules", config_or_rules)
    if rules is None:
        rules = DEFAULT_RULES
    pairs = rules.items() if isinstance(rules, Mapping) else rules
    return tuple((str(k), tuple(v) if isinstance(v, list) else v) for k, v in pairs)


def rules_of(config_or_rules=None) -> dict[str, Any]:
    """The rules as a dict {logical: first mesh target} (lookups such as the batch axes)."""
    out: dict[str, Any] = {}
    for k, v in rules_table(config_or_rules):
        out.setdefault(k, v)
    return out


# ------------------------------------------------------------------------------------------ meshes
def make_mesh(axes: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh with Auto axis types, e.g. make_mesh({"data": 2, "fsdp": 2, "tensor": 2}).

    Axis sizes may be -1 once to absorb the remaining devices. Works after `jax.distributed.initialize` on
    many hosts: `jax.devices()` is then the global device list, and the mesh spans every process.
    """
    names = tuple(axes)
    for n in names:
        if n not in MESH_AXES:
            raise ValueError(f"mesh axis {n!r} is not one of {MESH_AXES}")
    sizes = list(axes.values())
    devices = list(devices) if devices is not None else jax.devices()
    if sizes.count(-1) > 1:
        raise ValueError(f"mesh {dict(axes)}: at most one axis may be -1")
    if -1 in sizes:
        rest = math.prod(s for s in sizes if s != -1)
        if len(devices) % rest:
            raise ValueError(f"mesh {dict(axes)}: {len(devices)} devices are not divisible by {rest}")
        sizes[sizes.index(-1)] = len(devices) // rest
    if math.prod(sizes) != len(devices):
        if math.prod(sizes) > len(devices):
            raise ValueError(f"mesh {dict(axes)} needs {math.prod(sizes)} devices, {len(devices)} available")
        devices = devices[: math.prod(sizes)]
    try:
        return jax.make_mesh(tuple(sizes), names, axis_types=(AxisType.Auto,) * len(names), devices=devices)
    except TypeError:  # older jax without `devices=`
        return Mesh(np.asarray(devices).reshape(sizes), names, axis_types=(AxisType.Auto,) * len(names))


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, local_device_ids=None) -> None:
    """Multi-controller start-up. On TPU pods and SLURM clusters every argument can be None (auto-detected)."""
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id, local_device_ids=local_device_ids)


# ------------------------------------------------------------------------------- logical -> mesh
def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], mesh_shape: Mapping[str, int],
                    rules=None) -> P:
    """PartitionSpec for one tensor of `shape` whose dims are named `axes`.

    Flax's `logical_to_mesh_axes` resolves the names (rule order is priority; a mesh axis serves one dim; a
    repeated logical name is a fallback), then mesh axes the mesh lacks (or of size 1) are dropped and a dim
    that the remaining axes do not divide drops trailing axes until they do.
    """
    table = rules_table(rules)
    known = {k for k, _ in table}
    for name in axes:
        if name is not None and name not in known:
            raise KeyError(f"logical axis {name!r} has no sharding rule; rules cover {sorted(known)}")
    resolved = flax_partitioning.logical_to_mesh_axes(tuple(axes), table)
    out = []
    for entry, dim in zip(tuple(resolved) + (None,) * (len(shape) - len(resolved)), shape):
        target = () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))
        target = [a for a in target if mesh_shape.get(a, 1) > 1]
        while target and dim % math.prod(mesh_shape[a] for a in target):
            target.pop()
        out.append(None if not target else (target[0] if len(target) == 1 else tuple(target)))
    return P(*out)


def kernel_split(batch: int, heads: int, kv_heads: int):
    """How a Pallas attention kernel splits under the current mesh (`jax.set_mesh`) when run per device through
    shard_map (XLA cannot partition a Pallas call): (mesh, rows axis, heads axis), or None with no mesh or one
    device. Rows split as the act_batch rule says; query and KV heads as act_heads / act_kv_heads when both split
    over the same mesh axes (contiguous head chunks keep head h on KV head h // G), else heads are replicated.
    Axes already manual (inside the rollout engine's per-replica shard_map) are not split again."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return None
    shape = {a: n for a, n in mesh.shape.items() if a not in mesh.manual_axes}
    rows = logical_to_spec(("act_batch",), (batch,), shape)[0]
    q_axis = logical_to_spec(("act_heads",), (heads,), shape)[0]
    kv_axis = logical_to_spec(("act_kv_heads",), (kv_heads,), shape)[0]
    return mesh, rows, (q_axis if q_axis == kv_axis else None)


def _mesh_shape(mesh) -> dict[str, int]:
    return dict(mesh.shape)


def named_sharding(mesh: Mesh, axes, shape, rules=None) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(axes, shape, _mesh_shape(mesh), rules))


def tree_shardings(mesh: Mesh, axes_tree, shapes_tree, rules=None):
    """NamedShardings for a pytree, given matching pytrees of logical axes and of shapes (or arrays)."""
    is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x)
    flat_axes, treedef = jax.tree.flatten(axes_tree, is_leaf=is_axes)
    flat_shapes = treedef.flatten_up_to(shapes_tree)
    out = [named_sharding(mesh, a, getattr(s, "shape", s), rules) for a, s in zip(flat_axes, flat_shapes)]
    return jax.tree.unflatten(treedef, out)


def batch_spec(ndim: int = 2, rules=None, shape=None, mesh=None) -> P:
    """PartitionSpec of a [batch, length, ...] input: batch over the act_batch mesh axes."""
    axes = ("act_batch",) + (None,) * (ndim - 1)
    if shape is None or mesh is None:
        target = rules_of(rules)["act_batch"]
        return P(target, *([None] * (ndim - 1)))
    return logical_to_spec(axes, shape, _mesh_shape(mesh), rules)


def batch_shard_count(mesh: Mesh | None, rules=None) -> int:
    """How many ways the row (batch) axis is split on `mesh` under the act_batch rule (1 without a mesh):
    batches are padded to a multiple of this so every row shard is equal."""
    if mesh is None:
        return 1
    target = rules_of(rules)["act_batch"]
    target = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
    return int(math.prod(dict(mesh.shape).get(a, 1) for a in target))


def batch_sharding(mesh: Mesh, shape, rules=None) -> NamedSharding:
    return NamedSharding(mesh, batch_spec(len(shape), rules, shape, mesh))


def shard_batch(batch, mesh: Mesh, rules=None):
    """device_put every [B, ...] array of a batch pytree with its batch dim split over the batch mesh axes."""
    return jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, np.shape(x), rules)), batch)


def global_batch(local_batch, mesh: Mesh, global_batch_size: int | None = None, rules=None):
    """Assembles a global [B, ...] batch from each process's local rows (multi-host data loading).

    Every process passes its own `local_batch` (e.g. the per-host shard of a data pipeline with
    process_index/process_count); the result is one global jax.Array per leaf, split over the batch axes.
    On a single process this is `shard_batch`.
    """
    n = jax.process_count()

    def one(x):
        x = np.asarray(x)
        gshape = ((global_batch_size or x.shape[0] * n),) + x.shape[1:]
        return jax.make_array_from_process_local_data(batch_sharding(mesh, gshape, rules), x, gshape)
    return jax.tree.map(one, local_batch)


# ------------------------------------------------------------------------------------- activations
def constrain(x: jax.Array, axes: Sequence[str | None], config=None) -> jax.Array:
    """with_sharding_constraint by logical axes under the current mesh (`jax.set_mesh`); a no-op without one.

    Rules come from `config.sharding_rules` (a static jit argument), so changing them re-traces.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    spec = logical_to_spec(axes, x.shape, dict(mesh.shape), config)
    return jax.lax.with_sharding_constraint(x, spec)


def use_mesh(mesh: Mesh):
    """Context manager making `mesh` current for jit-traced code (activation constraints, shard_map)."""
    return jax.set_mesh(mesh)


def describe(tree) -> dict[str, str]:
    """{'path': 'PartitionSpec'} of a pytree of arrays: for logs and for tests that assert placements."""
    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        key = "/".join(str(getattr(p, "key", getattr(p, "idx", p))) for p in path)
        sh = getattr(x, "sharding", None)
        out[key] = str(getattr(sh, "spec", sh))
    return out


def local_rollout_mesh(mesh: Mesh, process: int | None = None, process_of=None) -> Mesh:
    """This process's (or `process`'s) part of the training `mesh` as a mesh of its own: the same axis names, each
    axis as long as the block of local devices spans it (2 processes x 4 devices under fsdp=8: fsdp=4 here; under
    data=2,fsdp=4: data=1,fsdp=4), the local devices in the order they have in `mesh`. A layout whose local
    devices are no sub-grid of `mesh` (a hand-made device order) gets every local device on one axis the sampler
    splits rows over (fsdp, else data, else the first axis), the others 1. process_of: a device's process (default
    its process_index; the planner and tests pass one that emulates several processes on one)."""
    devs = np.asarray(mesh.devices)
    me = jax.process_index() if process is None else process
    process_of = process_of or (lambda d: d.process_index)
    local = np.vectorize(lambda d: process_of(d) == me)(devs)
    n_local = int(local.sum())
    if n_local == 0:
        raise ValueError(f"the mesh {dict(mesh.shape)} holds no device of process {me}")
    spans = [np.unique(ix) for ix in np.nonzero(local)]
    block = devs[np.ix_(*spans)]
    if block.size == n_local:  # a sub-grid: its shape on the same axes
        return Mesh(block, mesh.axis_names, axis_types=mesh.axis_types)
    names = mesh.axis_names
    axis = next((a for a in ("fsdp", "data") if a in names), names[0])
    shape = tuple(n_local if a == axis else 1 for a in names)
    ordered = [d for d in devs.flat if process_of(d) == me]
    return Mesh(np.asarray(ordered, dtype=object).reshape(shape), names, axis_types=mesh.axis_types)


# ------------------------------------------------------------------------------------- rollout layout
# `rollout.mesh` (config/rl.py RolloutSection): the layout decode runs in, over the same devices of a process as
# the training mesh. Its axes are the mesh axes they become: `replica` -> data (rows split, weights replicated: the
# rules give parameters no data axis), `tensor` -> tensor (heads, MLP and vocabulary split); fsdp is 1, so no
# weight is split over an axis the decode loop would gather it along (docs/decisions.md, "Rollout layout").
def layout_axes(layout: Mapping[str, int], devices: int) -> dict[str, int]:
    """The rollout mesh's axis sizes on a process of `devices` devices: {"data": replicas, "fsdp": 1, "tensor":
    T}. ConfigError naming rollout.mesh unless its axes multiply to `devices`."""
    from mimesis_jax.errors import ConfigError

    r, t = layout["replica"], layout["tensor"]
    if r == -1 and t > 0 and devices % t == 0:
        r = devices // t
    elif t == -1 and r > 0 and devices % r == 0:
        t = devices // r
    if r * t != devices or r < 1 or t < 1:
        given = ",".join(f"{a}={v}" for a, v in layout.items() if v != -1)
        raise ConfigError(f"config key 'rollout.mesh': {given} must use exactly the {devices} devices each "
                          f"process rolls out on (the training mesh's devices per process)")
    return {"data": r, "fsdp": 1, "tensor": t}


def layout_mesh(block: Mesh, layout: Mapping[str, int] | None) -> Mesh:
    """The rollout mesh over `block` (one process's devices of the training mesh, `local_rollout_mesh`): `block`
    itself without a layout, else its devices in the training mesh's order reshaped to `layout_axes` (tensor
    innermost: a tensor group is adjacent devices), Auto axis types."""
    if layout is None:
        return block
    axes = layout_axes(layout, block.devices.size)
    devices = np.asarray(block.devices).reshape(tuple(axes.values()))
    return Mesh(devices, tuple(axes), axis_types=(AxisType.Auto,) * len(axes))
