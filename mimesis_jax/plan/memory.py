"""The byte formulas: exact state by abstract evaluation (parameters, optimizer state), activations per layer
type (the remat policy's saved tensors, prefill, attention blocks, the log-prob head, the tables) and the
sampler's cache (see the package docstring for what each counts)."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import optax

from mimesis_jax import models
from mimesis_jax.algorithms.logprobs import vocab_layout
from mimesis_jax.inference.weight_sync import engine_dtype, row_pieces
from mimesis_jax.models import abstract_params, param_specs
from mimesis_jax.models.blockwise_attention import block_layout
from mimesis_jax.models.config import DTYPES, ModelConfig
from mimesis_jax.models.layers import is_spec
from mimesis_jax.models.qwen3_5 import CHUNK_SIZE
from mimesis_jax.sharding import logical_to_spec
from mimesis_jax.train.optim import make_optimizer


def divisor(axes: Sequence[str | None], shape: Sequence[int], mesh: dict, rules) -> int:
    spec = logical_to_spec(tuple(axes), tuple(shape), mesh, rules)
    d = 1
    for entry in spec:
        for a in (() if entry is None else ((entry,) if isinstance(entry, str) else entry)):
            d *= mesh[a]
    return d


def param_bytes(model: ModelConfig, mesh: dict) -> int:
    """Parameter bytes on one device: sum over leaves of global bytes / mesh axes the leaf is split over."""
    item = DTYPES[model.param_dtype].dtype.itemsize
    return sum(math.prod(s.shape) * item // divisor(s.axes, s.shape, mesh, model)
               for s in jax.tree.leaves(param_specs(model), is_leaf=is_spec))


def engine_dtype_bytes(model: ModelConfig) -> int:
    """The itemsize the engine's copy holds its matrices in (inference/weight_sync.py engine_dtype): the compute
    dtype's where narrower than the parameters', else the parameters'."""
    return (engine_dtype(model) or DTYPES[model.param_dtype]).dtype.itemsize


def engine_param_bytes(model: ModelConfig, mesh: dict, cast_only: bool = False) -> int:
    """Per-device bytes of the rollout engine's copy of the parameters on `mesh` (its replica layout): the leaves
    models.compute_cast_mask marks in `engine_dtype_bytes`, the rest in the parameters' dtype. cast_only: only the
    cast leaves, and none where the cast is no narrowing (where the training arrays are already laid out as the
    engine takes them, the rest is a view of them, inference/weight_sync.py)."""
    stored, narrow = DTYPES[model.param_dtype].dtype.itemsize, engine_dtype_bytes(model)
    specs = jax.tree.leaves(param_specs(model), is_leaf=is_spec)
    total = 0
    for s, cast in zip(specs, jax.tree.leaves(models.compute_cast_mask(model))):
        if cast_only and not (cast and narrow < stored):
            continue
        total += math.prod(s.shape) * (narrow if cast else stored) // divisor(s.axes, s.shape, mesh, model)
    return total


@dataclasses.dataclass(frozen=True)
class SyncBytes:
    """The weight sync of several processes (inference/weight_sync.py), per device: `peak` the largest one
    program holds (its training shard, its rollout shard and the reshard's working set), `work` the largest
    working set alone, `copy` the rollout copy it leaves, `moved` the bytes a device receives (its rollout shards
    less the part of its training shards they hold)."""

    peak: int
    work: int
    copy: int
    moved: int


def weight_sync_bytes(model: ModelConfig, mesh: dict, local: dict, engine: bool = False) -> SyncBytes:
    """Per-device bytes of the weight sync from the training `mesh` (axis sizes) to one process's `local` block
    (workload.process_mesh), the rollout copy in the parameters' dtype, or with `engine` as the rollout engine's
    copy (weight_sync.rollout_sync(engine=True)): the leaves models.compute_cast_mask marks in `engine_dtype_bytes`,
    the rest in the parameters' dtype, as `engine_param_bytes` counts the copy. The sync's programs cast on the
    devices holding the training shard, before the collective (inference/weight_sync.py: a whole array's shard, or
    each piece's), so the bytes moved and what a collective gathers are the narrow ones; the training shard stays
    in the parameters' dtype. Summed over `weight_sync_leaves`."""
    leaves = weight_sync_leaves(model, mesh, local, engine)
    return SyncBytes(max(x.peak for x in leaves), max(x.work for x in leaves), sum(x.copy for x in leaves),
                     sum(x.moved for x in leaves))


def weight_sync_leaves(model: ModelConfig, mesh: dict, local: dict, engine: bool = False) -> list[SyncBytes]:
    """`weight_sync_bytes` of each parameter array (its one sync program), in the parameters' leaf order."""
    item = DTYPES[model.param_dtype].dtype.itemsize
    narrow = engine_dtype_bytes(model) if engine else item
    specs = jax.tree.leaves(param_specs(model), is_leaf=is_spec)
    return [_sync_leaf(model, s, mesh, local, item, narrow if cast else item)
            for s, cast in zip(specs, jax.tree.leaves(models.compute_cast_mask(model)))]


def _sync_leaf(model: ModelConfig, s, mesh: dict, local: dict, item: int, out_item: int) -> SyncBytes:
    n = math.prod(s.shape)
    src, dst = n // divisor(s.axes, s.shape, mesh, model), n // divisor(s.axes, s.shape, local, model)
    src_b, dst_b = src * item, dst * out_item
    work = 0
    if dst != src:  # a reshard: a copy of the training shard laid out for the collective, and what it gathers
        # (a stacked weight one layer at a time: its layer's slice and gathered slice; a table whose rows
        # change device groups one row piece at a time, weight_sync.row_pieces)
        L = s.shape[0] if s.axes[0] == "layers" and s.shape[0] > 1 else 1
        if L == 1 and len(s.shape) > 1:
            L = row_pieces(s.shape[0], divisor(s.axes[:1], s.shape[:1], mesh, model),
                           divisor(s.axes[:1], s.shape[:1], local, model))[1]
        gather = len(s.shape) > 1 and L == 1 and divisor(s.axes, s.shape, local, model) == divisor(
            s.axes[:1], s.shape[:1], local, model) == divisor(s.axes[:1], s.shape[:1], mesh, model)
        # a table whose rows stay where they are and whose other dims are gathered whole: one all-gather into
        # the output, no copy of the training shard beside it
        if out_item < item:  # cast first: the cast shard (or piece) is what the collective reads, and a piece
            # program keeps no whole copy of the training shard beside it
            cs = src * out_item
            work = cs if gather else (src_b + cs + dst_b) // L if L > 1 else cs + dst_b
        else:
            work = dst_b if gather else src_b + (src_b + dst_b) // L if L > 1 else src_b + dst_b
    return SyncBytes(src_b + dst_b + work, work, dst_b, (dst - src) * out_item)


def optimizer_bytes(model: ModelConfig, mesh: dict, opt_cfg, total_updates: int) -> int:
    """Optimizer-state bytes on one device, from jax.eval_shape of the run's optax chain: a parameter-shaped leaf
    (Adam's moments) is split like its parameter, everything else (step counts) is replicated."""
    tx = make_optimizer(opt_cfg, max(1, total_updates), model)
    params = abstract_params(model)
    state = jax.eval_shape(tx.init, params)
    divs = jax.tree.map(lambda s: divisor(s.axes, s.shape, mesh, model), param_specs(model), is_leaf=is_spec)
    sized = optax.tree_map_params(tx, lambda leaf, d: leaf.size * leaf.dtype.itemsize // d, state, divs,
                                  transform_non_params=lambda leaf: leaf.size * leaf.dtype.itemsize)
    return int(sum(jax.tree.leaves(sized)))


# ------------------------------------------------------------------------------------ activations
@dataclasses.dataclass(frozen=True)
class Widths:
    """Per-device sizes of the activation dims after the tensor split (the act_* rules)."""

    D: int
    I: int
    H: int
    KVH: int
    Dh: int
    V: int
    Hk: int = 0  # DeltaNet key heads (Qwen3.5)
    Hv: int = 0  # DeltaNet value heads
    Dk: int = 0
    Dv: int = 0
    Cg: int = 0  # fused q/k/v channels per key head


def widths(model: ModelConfig, mesh: dict) -> Widths:
    def per(logical: str, n: int) -> int:
        return n // divisor((logical,), (n,), mesh, model)

    w = Widths(model.hidden_size, per("act_mlp", model.intermediate_size),
               per("act_heads", model.num_attention_heads), per("act_kv_heads", model.num_key_value_heads),
               model.head_dim, per("act_vocab", model.vocab_size))
    if model.model_type == "qwen3_5_text":
        Hk, Hv = model.linear_num_key_heads, model.linear_num_value_heads
        Dk, Dv = model.linear_key_head_dim, model.linear_value_head_dim
        w = dataclasses.replace(w, Hk=per("act_kv_heads", Hk), Hv=per("act_heads", Hv), Dk=Dk, Dv=Dv,
                                Cg=2 * Dk + (Hv // Hk) * Dv)
    return w


@dataclasses.dataclass(frozen=True)
class Tensor:
    """`count` tensors of `elems` elements of `item` bytes each; `dot`: a matmul output, `batched`: of a matmul
    with batch dims (attention scores and the DeltaNet chunk products)."""

    what: str
    count: int
    elems: int
    item: int
    dot: bool = False
    batched: bool = False

    @property
    def bytes(self) -> int:
        return self.count * self.elems * self.item


def layer_residuals(model: ModelConfig, w: Widths, layer_type: str, b: int, T: int) -> list[Tensor]:
    """The tensors one layer keeps for its backward pass (remat none), per device, for b rows of T tokens.

    Counts are those of XLA's buffer assignment for this code (CPU, fp32 and bf16 compiles of the layers):
    attention layer = 6 [b,T,D] (residual stream, RMSNorm statistics) + 6 [b,T,I] (gate, up, SiLU, product)
    + 4 query-shaped + 4 key/value-shaped [b,T,heads,Dh] (+2 for Qwen3.5's output gate) + the attention
    (dense: 3 fp32 [b,H,T,T] scores; blockwise: the fp32 log-sum-exp [b,T,H]);
    DeltaNet layer = 6 [b,T,D] + 6 [b,T,I] + 7 [b,T,Hk,Cg] (fused q/k/v around the conv) + 2 [b,T,Hk,Dk] +
    15 fp32 [b,T,Hv,Dv] (q/k/v per value head, chunk-form U, W, reads, writes) + 6 fp32 [b,Hv,T,C] chunk
    matrices (C = 64-token chunks) + 1 fp32 [b,T,Hv,Dk+Dv].
    """
    c = DTYPES[model.dtype].dtype.itemsize
    f = 4
    BT = b * T
    mlp = [Tensor("[b,T,D] residual stream + norms", 4, BT * w.D, f),
           Tensor("[b,T,D] projections out", 2, BT * w.D, c, True),
           Tensor("[b,T,I] gate/up", 2, BT * w.I, c, True), Tensor("[b,T,I] SiLU, product", 4, BT * w.I, c)]
    if layer_type == "linear_attention":
        C = min(64, T)
        return mlp + [
            Tensor("[b,T,Hk,Cg] fused q/k/v", 1, BT * w.Hk * w.Cg, c, True),
            Tensor("[b,T,Hk,Cg] conv, SiLU", 6, BT * w.Hk * w.Cg, c),
            Tensor("[b,T,Hk,Dk] q/k", 2, BT * w.Hk * w.Dk, f),
            Tensor("[b,T,Hv,Dv] z", 1, BT * w.Hv * w.Dv, c, True),
            Tensor("[b,T,Hv,Dv] per-head q/k/v, chunk U/W, reads", 14, BT * w.Hv * w.Dv, f),
            Tensor("[b,T,Hv,Dk+Dv] chunk rhs", 1, BT * w.Hv * (w.Dk + w.Dv), f, True, True),
            Tensor("[b,Hv,T,C] chunk matrices", 6, BT * w.Hv * C, f, True, True),
        ]
    q = BT * w.H * w.Dh
    kv = BT * w.KVH * w.Dh
    out = mlp + [Tensor("[b,T,H,Dh] q", 1, q, c, True), Tensor("[b,T,H,Dh] q norm/rope, attention out", 3, q, c),
                 Tensor("[b,T,KVH,Dh] k/v", 2, kv, c, True), Tensor("[b,T,KVH,Dh] k norm/rope", 2, kv, c)]
    if model.attn_output_gate:
        out.append(Tensor("[b,T,H,Dh] output gate", 2, q, c, True))
    if model.attention_impl == "dense":
        out += [Tensor("[b,H,T,T] fp32 scores", 1, b * w.H * T * T, f, True, True),
                Tensor("[b,H,T,T] fp32 softmax", 2, b * w.H * T * T, f)]
    else:
        out.append(Tensor("[b,T,H] fp32 log-sum-exp", 1, BT * w.H, f))
    return out


def saved_bytes(model: ModelConfig, tensors: list[Tensor], b: int, T: int, w: Widths) -> int:
    """Bytes one layer keeps for the backward under the remat policy (see the module docstring)."""
    c = DTYPES[model.dtype].dtype.itemsize
    carry = b * T * w.D * c
    if model.remat == "none":
        return sum(t.bytes for t in tensors)
    if model.remat == "full":
        return carry
    if model.remat == "dots":
        return carry + sum(t.bytes for t in tensors if t.dot)
    return carry + sum(t.bytes for t in tensors if t.dot and not t.batched)  # dots_no_batch


def prefill_bytes(model: ModelConfig, w: Widths, layer_type: str, b: int, P: int, S: int,
                  attention: int | None = None) -> int:
    """Working set of one layer's forward over b prompts of P tokens with no gradient (the sampler's prefill):
    the residual stream and its norm (2 [b,P,D]) plus the larger of the MLP (2 [b,P,I]) and the mixer: attention
    = q/k/v (+ gate) + the attention over S cache slots (dense: 2 fp32 [b,H,P,S] and the boolean mask;
    blockwise: its blocks; `attention` replaces this term); DeltaNet = the larger of its two stages
    (`deltanet_prefill`)."""
    c = DTYPES[model.dtype].dtype.itemsize
    bp = b * P
    mlp = 2 * bp * w.I * c
    if layer_type == "linear_attention":
        mixer = deltanet_prefill(model, w, b, P)
    else:
        mixer = bp * (w.H * (3 if model.attn_output_gate else 1) + 2 * w.KVH) * w.Dh * c
        if attention is not None:
            mixer += attention
        elif model.attention_impl == "dense":
            # at the scores' peak q and k are consumed; the values are read as a copy laid out [b, KVH, Dh, S]
            mixer = 2 * b * w.H * P * S * 4 + b * P * S + b * w.KVH * w.Dh * S * c
        else:
            mixer += attention_blocks(model, w, b, P, S)
    return 2 * bp * w.D * c + max(mlp, mixer)


def deltanet_prefill(model: ModelConfig, w: Widths, b: int, P: int) -> int:
    """Working set of one gated-DeltaNet mixer (models/qwen3_5.py `_gated_deltanet`) over b prompts of P tokens
    with no gradient, beyond the layer input: the larger of
    * the projection stage: the fused q/k/v projection, the conv's padded input and its output (3 [b,P,Hk,Cg],
      compute dtype) + l2-normalised q and k before the head repeat (2 [b,P,Hk,Dk]) + 2 fp32 [b,P,Hv,Dv] (v * beta
      and the chunk scan's output buffer, allocated up front);
    * the chunked rule's solve (models/gated_delta.py `chunk_gated_delta_rule`, all fp32, at the concatenation of
      its right-hand side): chunked q and k, k * beta, the scan inputs Qs and Ks, k * beta * e^gamma and the
      right-hand side's key half (7 [b,P,Hv,Dk]); v * beta, the right-hand side's value half and the scan output
      (3 [b,P,Hv,Dv]); the decay matrix Gamma (1 [b,Hv,P,C], C-token chunks);
    * the intra-chunk read (at its chunk-major copy for the scan over chunks): Gamma, Q K^T and (Q K^T * Gamma)
      chunk-major (3 [b,Hv,P,C], fp32), a half-chunk block of the unit-lower inverse ([b,Hv,P,C/4]), the
      right-hand side (1 [b,P,Hv,Dk] + 1 [b,P,Hv,Dv]), the chunk-major Qs and Ks (2 [b,P,Hv,Dk]), the scan's
      output buffer and the value projection (2 [b,P,Hv,Dv]). The [C, C] terms outgrow the head-dim terms when
      the head dims are below the chunk: the paper's 128-wide heads peak at the solve, the rehearsal's 16-wide ones
      (plan/rehearse.py HEAD_DIM) here.
    Counted from XLA's buffer assignment of the sampler's prefill (mimesis_simrl.py:4b on 16 fake CPU devices:
    the solve is the program's peak; its rehearsal, `rehearse --config configs/mimesis_simrl.py:9b`: the read)."""
    c = DTYPES[model.dtype].dtype.itemsize
    bp = b * P
    C = min(CHUNK_SIZE, P)
    uk, uv = bp * w.Hv * w.Dk * 4, bp * w.Hv * w.Dv * 4
    gamma = bp * w.Hv * C * 4
    projection = 3 * bp * w.Hk * w.Cg * c + 2 * bp * w.Hk * w.Dk * c + 2 * uv
    solve = 7 * uk + 3 * uv + gamma
    read = 3 * gamma + gamma // 4 + 3 * uk + 3 * uv
    return max(projection, solve, read)


def attention_blocks(model: ModelConfig, w: Widths, b: int, Tq: int, Tk: int) -> int:
    """Working set of one attention call beyond its inputs: dense, 3 fp32 [b,H,Tq,Tk] score tensors and the
    boolean mask; blockwise, 3 fp32 [b,H,bq,bk] blocks, the fp32 accumulators of a query block and the fp32
    output."""
    if model.attention_impl == "dense":
        return 3 * b * w.H * Tq * Tk * 4 + b * w.H * Tq * Tk
    bq, _ = block_layout(Tq, model.attention_block_q)
    bk, _ = block_layout(Tk, model.attention_block_k)
    return 3 * b * w.H * bq * bk * 4 + 2 * b * w.H * bq * w.Dh * 4 + b * Tq * w.H * w.Dh * 4


def head_bytes(model: ModelConfig, w: Widths, b: int, n: int) -> tuple[int, int]:
    """(kept, backward working set) of the chunked log-prob head over n positions of b rows: kept = its input
    hidden states and fp32 log-sum-exp; working set = 3 fp32 [b, seq-chunk, vocab-chunk] logit blocks and the
    fp32 gradient of the hidden states."""
    c = DTYPES[model.dtype].dtype.itemsize
    cs = min(model.logits_seq_chunk, n)
    _, vc = vocab_layout(w.V, model.logits_vocab_chunk)
    return b * n * (w.D * c + 8), 3 * b * cs * vc * 4 + b * n * w.D * 4


def layer_weight_bytes(model: ModelConfig, mesh: dict, layer_type: str, split: bool = False) -> int:
    """fp32 bytes of one layer's weights gathered over fsdp (still split over tensor), or with `split` as they
    are stored (split over every mesh axis the rules give)."""
    specs = param_specs(model)
    key = "layers" if model.model_type == "qwen3" else {"linear_attention": "linear_layers",
                                                          "full_attention": "full_layers"}[layer_type]
    tmesh = mesh if split else {"tensor": mesh.get("tensor", 1)}
    return sum(math.prod(s.shape[1:]) * 4 // divisor(s.axes, s.shape, tmesh, model)
               for s in jax.tree.leaves(specs[key], is_leaf=is_spec))


def table_bytes(model: ModelConfig, mesh: dict) -> int:
    """fp32 bytes of one [V, D] table gathered over fsdp (split over tensor along the vocabulary)."""
    V, D = model.vocab_size, model.hidden_size
    return V * D * 4 // divisor(("vocab", None), (V, D), {"tensor": mesh.get("tensor", 1)}, model)


def engine_pool_bytes(model: ModelConfig, mesh: dict, num_pages: int, page_size: int, states: int) -> int:
    """Per-device bytes of the rollout engine's pool on `mesh` (RolloutEngine(mesh=...), inference/page_pool.py):
    its KV pages and Qwen3.5 state slots split over heads as paged_cache.pool_axes lays them out (exact,
    jax.eval_shape); every device holds every page and slot of its heads."""
    from mimesis_jax.models import paged_cache

    init = models.family(model, "paged").init_paged_cache
    shapes = jax.eval_shape(lambda: init(model, num_pages, page_size, states))
    axes = paged_cache.pool_axes(shapes)
    return sum(v.size * v.dtype.itemsize // divisor(axes[k], v.shape, mesh, model) for k, v in shapes.items())


def kv_head_split(model: ModelConfig, mesh: dict) -> int:
    """How many ways the KV heads are split on `mesh` (1 where `tensor` does not divide them)."""
    return divisor(("act_kv_heads",), (model.num_key_value_heads,), mesh, model)


def cache_bytes(model: ModelConfig, mesh: dict, batch: int, length: int) -> dict[str, int]:
    """Per-device bytes of the sampler's cache arrays (KV cache, DeltaNet state and conv window)."""
    shapes = jax.eval_shape(lambda: models.init_cache(model, batch, length))
    axes = models.cache_axes(model)
    return {k: v.size * v.dtype.itemsize // divisor(axes[k], v.shape, mesh, model) for k, v in shapes.items()}

