"""Weight sync: the training parameters re-laid out for the rollouts, device to device, without a gather.

On one process, in the training layout, the sampler reads the training arrays as they are (the rollout mesh is the
training mesh). On P jax.distributed processes each process samples its own episodes on its own devices
(`sharding.local_rollout_mesh`), so each needs the whole model split over its local devices; with a rollout layout
(`rollout.mesh`, `layout`: sharding.layout_mesh, data = replicas, fsdp 1, tensor) on any number of processes, one
included, each process's devices are laid out that way. The training arrays are split over every process's
devices; the sync is a reshard between two layouts of the same global devices:

    training layout  NamedSharding(training mesh, the rules' spec)
    sync layout      NamedSharding(sync mesh, the same spec)   sync mesh = [replica = P, *one process's block]

(one process's block: its devices of the training mesh as they are, or laid out as `layout` says.) The sync mesh
stacks every process's block along a new `replica` axis that no spec names, so each process's devices hold a
complete copy split as the local rollout mesh splits it. One jitted program per
parameter array (a stacked layer weight is one array: every layer of it at once) casts it to the rollout dtype on
the devices that hold it and reshards it; XLA moves the shards between devices (collectives across processes), so
no device ever holds more than its shard of the training array and its shard of the rollout copy, and the host
never sees a weight. The outputs' local shards are then viewed as arrays on the process's own rollout mesh
(`jax.make_array_from_single_device_arrays`, no copy); an array whose training shards already are its rollout
shards (replicated over a data axis that runs across processes) is viewed so without a program.

Per-device peak of the sync beyond the training state: the rollout copy built so far + one program's working set
(plan/memory.py `weight_sync_bytes`). Every process calls the sync at the same step (the programs span every device).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mimesis_jax import models
from mimesis_jax.models.config import DTYPES, ModelConfig
from mimesis_jax.sharding import layout_mesh, local_rollout_mesh

REPLICA = "replica"


def emulated_processes(mesh: Mesh, processes: int):
    """A device -> process map of `processes` processes owning the mesh's devices in id order, equal shares (as
    jax.distributed numbers the devices of process-major hosts): to plan and compile a sync of several processes
    on one."""
    ids = sorted(d.id for d in np.asarray(mesh.devices).flat)
    if len(ids) % processes:
        raise ValueError(f"{len(ids)} devices do not split over {processes} processes")
    rank = {i: k // (len(ids) // processes) for k, i in enumerate(ids)}
    return lambda d: rank[d.id]


def sync_mesh(mesh: Mesh, processes: int | None = None, layout: dict | None = None) -> Mesh:
    """Every device of the training `mesh` as [replica = process count, *one process's rollout block]: process
    p's devices at index p, laid out as `local_rollout_mesh(mesh, p)` lays them out, or with a `layout`
    (`rollout.mesh`, config/layout.py rollout_layout) as sharding.layout_mesh lays that block out (the same block shape on
    every process, else ValueError). processes: emulate that many (`emulated_processes`) instead of the run's."""
    process_of = None if processes is None else emulated_processes(mesh, processes)
    count = jax.process_count() if processes is None else processes
    blocks = [layout_mesh(local_rollout_mesh(mesh, p, process_of), layout) for p in range(count)]
    shapes = {tuple(b.devices.shape) for b in blocks}
    if len(shapes) != 1:
        raise ValueError(f"the mesh {dict(mesh.shape)} splits into process blocks of different shapes {shapes}: "
                         "the weight sync needs one block shape on every process")
    devices = np.stack([np.asarray(b.devices) for b in blocks])
    block = blocks[0]
    return Mesh(devices, (REPLICA,) + tuple(block.axis_names),
                axis_types=(block.axis_types[0],) + tuple(block.axis_types))


def _same_shards(x, local: NamedSharding) -> bool:
    """Whether each of this process's devices holds, of the training array `x`, exactly the part the rollout
    layout `local` gives it (parameters replicated over a data axis that runs across processes)."""
    want = local.devices_indices_map(x.shape)
    return all(want.get(s.device) == s.index for s in x.addressable_shards)


ROW_PIECES = 16  # the most pieces a non-layered table is moved in (`_row_pieces`)


def _splits(sharding: NamedSharding, dim: int) -> int:
    """How many ways `sharding` splits dimension `dim`."""
    spec = tuple(sharding.spec) + (None,) * (dim + 1)
    names = spec[dim]
    names = () if names is None else (names,) if isinstance(names, str) else tuple(names)
    return math.prod(dict(sharding.mesh.shape)[n] for n in names)


def row_pieces(rows: int, src_splits: int, dst_splits: int) -> tuple[int, int]:
    """(g, c) for a non-layered array of `rows` rows split src_splits ways in the training layout and dst_splits in
    the rollout one: g = lcm of the two (row blocks every device's rows fall in whole), c = the most pieces (a power
    of two <= ROW_PIECES) each block divides into; c = 1 when the rows stay where they are (the same split: a
    gather over the other dims, no rebuild) or do not divide."""
    if src_splits == dst_splits:
        return 1, 1
    g, c = math.lcm(src_splits, dst_splits), ROW_PIECES
    while c > 1 and rows % (g * c):
        c //= 2
    return g, c


def _row_pieces(shape: tuple, src: NamedSharding, out: NamedSharding) -> tuple[int, int]:
    if len(shape) < 2:
        return 1, 1
    return row_pieces(shape[0], _splits(src, 0), _splits(out, 0))


def _widen(sharding: NamedSharding, ndim: int) -> NamedSharding:
    """`sharding` of an [R, ...] array for its [g, c, R / (g c), ...] view: the row split on g."""
    spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
    return NamedSharding(sharding.mesh, PartitionSpec(spec[0], None, None, *spec[1:]))


def _in_pieces(x, dim: int, src: NamedSharding, out: NamedSharding, cast):
    """x moved from `src` to `out` one index of dimension `dim` at a time into the output buffer (each piece pinned
    to the training layout first, so the partitioner does not carry the rollout layout back to the whole array, and
    cast there, on the devices holding its shard, so the collective moves the cast piece)."""
    def body(i, y):
        piece = jax.lax.dynamic_index_in_dim(x, i, dim)
        piece = jax.lax.with_sharding_constraint(cast(piece), src)
        piece = jax.lax.with_sharding_constraint(piece, out)
        return jax.lax.dynamic_update_index_in_dim(y, piece, i, dim)
    y = jax.lax.with_sharding_constraint(jnp.zeros(x.shape, cast(jnp.zeros((), x.dtype)).dtype), out)
    return jax.lax.fori_loop(0, x.shape[dim], body, y)


def engine_dtype(config: ModelConfig):
    """The dtype of the rollout engine's copy of the matrices: the compute dtype where it is narrower than the
    parameters' (the forward casts them to it anyway: models.compute_cast_mask), else None (the training dtype)."""
    compute, stored = config.compute_dtype, DTYPES[config.param_dtype]
    return compute if compute.dtype.itemsize < stored.dtype.itemsize else None


def rollout_sync(config: ModelConfig, mesh: Mesh, layout: dict | None = None, engine: bool = False,
                 processes: int | None = None) -> "WeightSync":
    """The weight sync as the RL loops build it (train/rl/distributed.py rollout_params) and as `plan --compiled`
    compiles it (plan/compiled.py weight_sync_memory), one constructor so the two cannot drift: into `layout`
    (None: each process's block as it is); `engine`: the rollout engine's copy (`engine_dtype`, cast exactly:
    only the leaves models.compute_cast_mask marks, on the devices, inside the sync's programs), else the training
    dtype. processes: emulate that many (planning)."""
    dtype = engine_dtype(config) if engine else None
    return WeightSync(config, mesh, dtype=dtype, processes=processes, layout=layout or None, exact=dtype is not None)


@dataclasses.dataclass
class WeightSync:
    """The rollout copy of `config`'s parameters on this process's devices from the training ones on `mesh`.

    dtype: the rollout copy's dtype (None, the default: the training arrays' own -- the samples then equal the
    training layout's bit for bit; a narrower one, e.g. bfloat16 under bf16 compute, halves the copy and the bytes
    moved, but the RMSNorm scales are read in float32, so samples may differ in the last bits). A sync of the same
    tree structure reuses its compiled programs (one per parameter array)."""

    config: ModelConfig
    mesh: Mesh
    dtype: object = None
    processes: int | None = None  # emulate this many processes (planning, tests); None: the run's own
    # the rollout layout (`rollout.mesh` parsed, config/layout.py rollout_layout); None: each process's block of the
    # training mesh as it is (on one process the training mesh itself)
    layout: dict | None = None
    # with a dtype: cast only the parameters the forward casts to the compute dtype anyway (models.compute_cast_mask:
    # the matrices and the embedding table), keeping the rest (norm scales, the LM head, DeltaNet gates) as they
    # are; the copy then samples bit for bit as the training arrays do, at about half their bytes under bf16
    exact: bool = False

    def __post_init__(self):
        self.global_mesh = sync_mesh(self.mesh, self.processes, self.layout)
        block, names = self.global_mesh.devices[0], self.global_mesh.axis_names[1:]
        self.local = Mesh(block, names, axis_types=self.global_mesh.axis_types[1:])
        if self.processes is None:
            self.local = layout_mesh(local_rollout_mesh(self.mesh), self.layout)
        self._specs = jax.tree.map(lambda s: s.spec, models.param_shardings(self.config, self.local))
        self._axes = models.param_axes(self.config)
        self._cast = models.compute_cast_mask(self.config) if self.exact else None
        self._programs: dict = {}

    def _program(self, path: str, spec, layered: bool, src, shape: tuple, cast: bool = True):
        if path not in self._programs:
            dtype, out = self.dtype if cast else None, NamedSharding(self.global_mesh, spec)
            g, c = (1, 1) if layered else _row_pieces(shape, src, out)

            def whole(x):
                return x if dtype is None else x.astype(dtype)

            def by_layer(x):
                # the stacked layers one at a time into the output buffer: the reshard's working set is one
                # layer's, not the whole stack's
                return _in_pieces(x, 0, src, out, whole)

            def by_rows(x):
                # a [V, ...] table in c row pieces (each of its g row blocks cut c ways): where the two layouts
                # split its rows over different device groups XLA rebuilds what it moves whole (the table on
                # every device), so moving a piece at a time bounds that to a piece
                pieces = x.reshape((g, c, x.shape[0] // (g * c)) + x.shape[1:])
                y = _in_pieces(pieces, 1, _widen(src, x.ndim), _widen(out, x.ndim), whole)
                return y.reshape(x.shape)

            fn = by_layer if layered else by_rows if c > 1 else whole
            self._programs[path] = jax.jit(fn, out_shardings=out)
        return self._programs[path]

    def _leaves(self, params):
        flat, tree = jax.tree_util.tree_flatten_with_path(params)
        specs = jax.tree_util.tree_structure(params).flatten_up_to(self._specs)
        axes = jax.tree_util.tree_structure(params).flatten_up_to(self._axes)
        cast = ([True] * len(flat) if self._cast is None
                else jax.tree_util.tree_structure(params).flatten_up_to(self._cast))
        return [(jax.tree_util.keystr(p), x, s, a[0] == "layers" and s and s[0] is None and x.shape[0] > 1, c)
                for (p, x), s, a, c in zip(flat, specs, axes, cast)], tree

    def __call__(self, params):
        """The rollout copy: every array cast and resharded, one program at a time, then viewed on this process's
        rollout mesh. Every process calls it with its part of the same global arrays."""
        out = []
        flat, tree = self._leaves(params)
        for path, x, spec, layered, cast in flat:
            local = NamedSharding(self.local, spec)
            if (self.dtype is None or not cast) and _same_shards(x, local):  # its rollout shard is there already
                y = x
            else:
                y = self._program(path, spec, layered, x.sharding, x.shape, cast)(x)
            out.append(jax.make_array_from_single_device_arrays(
                y.shape, local, [s.data for s in y.addressable_shards]))
        return jax.tree_util.tree_unflatten(tree, out)

    def compiled(self, params, options: dict | None = None) -> list[tuple[str, object]]:
        """(array path, compiled program) of every sync program for `params` (arrays or jax.ShapeDtypeStructs
        laid out on the training mesh; XLA compile `options`): what `plan` is checked against."""
        out = []
        shardings = models.param_shardings(self.config, self.mesh)
        flat, _ = self._leaves(params)
        for (path, x, spec, layered, cast), sh in zip(flat, jax.tree.leaves(shardings)):
            arg = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh)
            out.append((path, self._program(path, spec, layered, sh, x.shape, cast).lower(arg).compile(options)))
        return out

