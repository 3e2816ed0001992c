"""Memory planner: does a run config fit its mesh, per device, before any device is touched?

    python -m mimesis_jax plan --config configs/mimesis_sft.py:9b --device a100-80g
    python -m mimesis_jax plan --config configs/qwen3_8b_agentrl.py:csd --mesh data=1,fsdp=16,tensor=1 --device h200

The mesh defaults to the config's own (`mesh.*`; an axis of -1 absorbs the devices this process sees). The
number of devices is the mesh product and they need not exist: the plan is shapes and arithmetic.

Per device, for RunConfig (mid-training / SFT), AgentRLConfig (Stage II GRPO + CSD) and SimRLConfig (Stage I
joint RL):

* **exact, by abstract evaluation**: parameters (fp32 master weights), gradients (fp32, split like the parameters;
  two buffers where micro-batch gradients are summed into an accumulator: train.grad_accum > 1 and every RL
  update) and the optimizer state (`jax.eval_shape` of the run's optax chain: AdamW's two moments split like
  their parameter, step counts replicated). A leaf's bytes per device = global bytes / the product of the mesh
  axes its dims are split over (`sharding.logical_to_spec`: the trainer's rules and divisibility fall-back).
* **activations, by formula** (`layer_residuals`, per layer type, b = micro-batch rows on one device, T = row
  length, head / MLP / vocabulary widths after the tensor split). The remat policy picks what a layer keeps for
  the backward: none = its whole tensor table, dots = the matmul outputs, dots_no_batch = those without batch
  dims (not the attention scores), full = its input only (b T D in the compute dtype). The backward of a layer
  then holds that table again (recomputed under remat, sliced copies without), the fp32 cotangents, the
  attention backward (dense: fp32 [b,H,T,T] scores; blockwise: [b,H,bq,bk] blocks) and its fp32 weight
  gradient (plus its weights gathered over fsdp). `layer_backward_phase` says which saved stacks are live then.
* the chunked log-prob head (algorithms/logprobs.py) and the [V, D] embedding / head tables gathered over fsdp,
  with their fp32 gradients;
* the CSD teacher branches (Stage II with rl.alpha > 0): Tb branch tokens per trunk row, one no-gradient layer
  forward at a time (nothing saved), attending the trunk and branch keys;
* the rollout phase (RL configs): the sampler's KV cache and, for Qwen3.5, the DeltaNet state and conv window
  (`init_cache` shapes placed by `cache_axes`) for one sampler call -- rollout.max_batch sequences (0: the whole
  rollout batch, prompts_per_step x group_size), bucketed, at the longest context -- one prefill layer's working
  set and the logits, next to the parameters and optimizer state (resident while the policy samples). Chunked
  calls run one after another, so only one chunk's cache is live.

RL row counts depend on the data; the default is the worst case Stage II allows (every dialogue fills a row of
rollout.row_len tokens) and one row per rollout for Stage I's joint RL (a rollout's segments pack into one row);
`--rows` overrides it.

The peak is the larger of the train step and the rollout phase; a config FITS when the peak is at most the
device's memory less `HEADROOM`. When it does not, `suggest` re-plans single changes and pairs of them (remat
full, data or tensor folded into fsdp, more micro-batches, fewer sequences per sampler call (rollout.max_batch),
shorter rows, more fsdp devices) and reports the cheapest that fits (costs in `_knobs`).

The formulas were checked against XLA's compiled memory analysis (`profiling.memory_bytes`: arguments + results -
aliased + scratch) of the LM train step, the RL step and the sampler on fake-device CPU meshes
(tests/test_plan.py): within 15% for no remat, full remat and dots, dense and blockwise attention, Qwen3 and
Qwen3.5, with and without CSD branches. CPU XLA keeps some bf16 intermediates in fp32, so bf16 programs compile
larger there than this (GPU-minded) count; on GPU/TPU the fusions differ in detail: read the margin accordingly.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
import sys
from typing import Sequence

from mimesis_jax.models.config import DTYPES, ConfigError, ModelConfig

GiB = 2 ** 30
HEADROOM = 0.05  # of the device's memory, kept free for the runtime and allocator fragmentation
NOTE_TOKENS = 32  # chat-template tokens around one CSD coach note plus the turn's assistant header
MESH_AXES = ("data", "fsdp", "tensor")


# ------------------------------------------------------------------------------------------- devices
@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    bytes: int  # memory of one device (accelerator HBM)
    peak_bf16_flops: float | None  # dense bf16 matmul peak, FLOP/s
    source: str


DEVICES = {
    "a100-80g": Device("a100-80g", 80 * GiB, 312e12, "NVIDIA A100 datasheet: 80 GB HBM2e, 312 TFLOP/s dense BF16"),
    "a100-40g": Device("a100-40g", 40 * GiB, 312e12, "NVIDIA A100 datasheet: 40 GB HBM2, 312 TFLOP/s dense BF16"),
    "h100-80g": Device("h100-80g", 80 * GiB, 989e12, "NVIDIA H100 SXM datasheet: 80 GB HBM3, 989 TFLOP/s dense BF16"),
    "h200": Device("h200", 141 * 10 ** 9, 989e12, "NVIDIA H200 SXM datasheet: 141 GB HBM3e, 989 TFLOP/s dense BF16"),
    "tpu-v4": Device("tpu-v4", 32 * GiB, 275e12, "Google Cloud TPU v4 docs: 32 GiB HBM2 per chip, 275 TFLOP/s BF16"),
    "tpu-v5e": Device("tpu-v5e", 16 * GiB, 197e12, "Google Cloud TPU v5e docs: 16 GiB HBM2 per chip, 197 TFLOP/s"),
    "tpu-v5p": Device("tpu-v5p", 95 * GiB, 459e12, "Google Cloud TPU v5p docs: 95 GiB HBM2e per chip, 459 TFLOP/s"),
    "cpu": Device("cpu", 0, None, "this host's physical memory shared by the mesh's devices; no nominal peak"),
}


def device_for(name: str, num_devices: int) -> Device:
    """The named device; 'cpu' is this host's RAM split over the mesh's (fake) devices."""
    if name not in DEVICES:
        raise ConfigError(f"--device {name!r}: unknown device; expected one of {sorted(DEVICES)}")
    dev = DEVICES[name]
    if name == "cpu":
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        dev = dataclasses.replace(dev, bytes=ram // max(1, num_devices))
    return dev


def parse_mesh(text: str) -> dict[str, int]:
    """'data=A,fsdp=B,tensor=C' (any subset; missing axes are 1) -> {axis: size}."""
    out = {a: 1 for a in MESH_AXES}
    seen = set()
    for part in text.split(","):
        key, sep, val = part.partition("=")
        key = key.strip()
        if not sep or key not in MESH_AXES:
            raise ConfigError(f"--mesh {text!r}: {part!r} is not axis=size with axis one of {MESH_AXES}")
        if key in seen:
            raise ConfigError(f"--mesh {text!r}: axis {key!r} given twice")
        try:
            size = int(val)
        except ValueError:
            raise ConfigError(f"--mesh {text!r}: size {val!r} of axis {key!r} is not an integer") from None
        if size < 1:
            raise ConfigError(f"--mesh {text!r}: size {size} of axis {key!r} must be >= 1")
        seen.add(key)
        out[key] = size
    return out


def config_mesh(mesh_cfg, visible_devices: int) -> dict[str, int]:
    """A MeshConfig's axes with -1 resolved against `visible_devices` (the devices this process sees)."""
    axes = dict(mesh_cfg.axes())
    rest = math.prod(v for v in axes.values() if v != -1)
    for k, v in axes.items():
        if v == -1:
            axes[k] = max(1, visible_devices // rest)
    return axes


# ------------------------------------------------------------------------------------------ workload
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

    @property
    def num_devices(self) -> int:
        return math.prod(self.mesh.values())


def _sampler_shapes(batch: int, longest_prompt: int, new_tokens: int, batch_multiple: int) -> Rollout:
    from mimesis_jax.rollout.sampler import Buckets

    b = Buckets()
    return Rollout(b.batch(batch, batch_multiple), b.prompt(max(1, longest_prompt)), b.new_tokens(new_tokens))


def _batch_multiple(model: ModelConfig, mesh: dict) -> int:
    """The product of the batch mesh axes (sharding.batch_shard_count without a Mesh): row counts of the packer
    and the sampler's batch are padded to a multiple of it."""
    from mimesis_jax.sharding import rules_of

    target = rules_of(model)["act_batch"]
    target = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
    return math.prod(mesh.get(a, 1) for a in target)


def _batch_shards(model: ModelConfig, mesh: dict, rows: int) -> int:
    """How many ways `rows` rows are split over the batch mesh axes (the act_batch rule, with its
    divisibility fall-back)."""
    return _divisor(("act_batch",), (rows,), mesh, model)


def workload_from_config(cfg, mesh: dict, model: ModelConfig, rows: int | None = None) -> Workload:
    """The per-update workload of a RunConfig, AgentRLConfig or SimRLConfig on `mesh`.

    RL row counts are data-dependent; the default assumes the worst case the config allows for Stage II (every
    dialogue fills a row of rollout.row_len tokens) and one row per rollout for Stage I's joint RL (each rollout's
    segments pack into one row). `rows` overrides it (and train.global_batch for a RunConfig).
    """
    from mimesis_jax.algorithms.rl_batch import ROW_STEPS, bucket
    from mimesis_jax.config import RunConfig

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
    multiple = M * _batch_multiple(model, mesh)
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
    roll = _sampler_shapes(per_call, longest, max_new, _batch_multiple(model, mesh))
    notes.append(f"rollout: {rollout_batch} sequences in {-(-rollout_batch // per_call)} sampler call(s) of <= "
                 f"{per_call} (rollout.max_batch={r.max_batch})")
    per = "given by --rows" if rows is not None else "one per " + ("dialogue" if kind == "agentrl" else "rollout")
    notes.append(f"rows per update: {n} ({per}), {M} micro-batch(es)")
    return Workload(kind, name, model, mesh, cfg.optimizer, cfg.train.steps * cfg.updates_per_step(), n, M, T,
                    head, True, branch, branch_head, roll, tuple(notes))


# ------------------------------------------------------------------------------------- exact state
def _divisor(axes: Sequence[str | None], shape: Sequence[int], mesh: dict, rules) -> int:
    from mimesis_jax.sharding import logical_to_spec

    spec = logical_to_spec(tuple(axes), tuple(shape), mesh, rules)
    d = 1
    for entry in spec:
        for a in (() if entry is None else ((entry,) if isinstance(entry, str) else entry)):
            d *= mesh[a]
    return d


def param_bytes(model: ModelConfig, mesh: dict) -> int:
    """Parameter bytes on one device: sum over leaves of global bytes / mesh axes the leaf is split over."""
    import jax

    from mimesis_jax.models import param_specs
    from mimesis_jax.models.layers import is_spec

    item = DTYPES[model.param_dtype].dtype.itemsize
    return sum(math.prod(s.shape) * item // _divisor(s.axes, s.shape, mesh, model)
               for s in jax.tree.leaves(param_specs(model), is_leaf=is_spec))


def optimizer_bytes(model: ModelConfig, mesh: dict, opt_cfg, total_updates: int) -> int:
    """Optimizer-state bytes on one device, from jax.eval_shape of the run's optax chain: a parameter-shaped leaf
    (Adam's moments) is split like its parameter, everything else (step counts) is replicated."""
    import jax
    import optax

    from mimesis_jax.models import abstract_params, param_specs
    from mimesis_jax.models.layers import is_spec
    from mimesis_jax.train.optim import make_optimizer

    tx = make_optimizer(opt_cfg, max(1, total_updates), model)
    params = abstract_params(model)
    state = jax.eval_shape(tx.init, params)
    divs = jax.tree.map(lambda s: _divisor(s.axes, s.shape, mesh, model), param_specs(model), is_leaf=is_spec)
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
        return n // _divisor((logical,), (n,), mesh, model)

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
    blockwise: its blocks; `attention` replaces this term); DeltaNet = 2 [b,P,Hk,Cg] + 4 fp32 [b,P,Hv,Dv] + 3 fp32
    [b,Hv,P,C] chunk matrices."""
    c = DTYPES[model.dtype].dtype.itemsize
    bp = b * P
    mlp = 2 * bp * w.I * c
    if layer_type == "linear_attention":
        mixer = 2 * bp * w.Hk * w.Cg * c + 4 * bp * w.Hv * w.Dv * 4 + 3 * bp * w.Hv * min(64, P) * 4
    else:
        mixer = bp * (w.H * (3 if model.attn_output_gate else 1) + 2 * w.KVH) * w.Dh * c
        if attention is not None:
            mixer += attention
        elif model.attention_impl == "dense":
            mixer += 2 * b * w.H * P * S * 4 + b * P * S
        else:
            mixer += attention_blocks(model, w, b, P, S)
    return 2 * bp * w.D * c + max(mlp, mixer)


def attention_blocks(model: ModelConfig, w: Widths, b: int, Tq: int, Tk: int) -> int:
    """Working set of one attention call beyond its inputs: dense, 3 fp32 [b,H,Tq,Tk] score tensors and the
    boolean mask; blockwise, 3 fp32 [b,H,bq,bk] blocks, the fp32 accumulators of a query block and the fp32
    output."""
    from mimesis_jax.models.blockwise_attention import block_layout

    if model.attention_impl == "dense":
        return 3 * b * w.H * Tq * Tk * 4 + b * w.H * Tq * Tk
    bq, _ = block_layout(Tq, model.attention_block_q)
    bk, _ = block_layout(Tk, model.attention_block_k)
    return 3 * b * w.H * bq * bk * 4 + 2 * b * w.H * bq * w.Dh * 4 + b * Tq * w.H * w.Dh * 4


def head_bytes(model: ModelConfig, w: Widths, b: int, n: int) -> tuple[int, int]:
    """(kept, backward working set) of the chunked log-prob head over n positions of b rows: kept = its input
    hidden states and fp32 log-sum-exp; working set = 3 fp32 [b, seq-chunk, vocab-chunk] logit blocks and the
    fp32 gradient of the hidden states."""
    from mimesis_jax.algorithms.logprobs import _vocab_layout

    c = DTYPES[model.dtype].dtype.itemsize
    cs = min(model.logits_seq_chunk, n)
    _, vc = _vocab_layout(w.V, model.logits_vocab_chunk)
    return b * n * (w.D * c + 8), 3 * b * cs * vc * 4 + b * n * w.D * 4


def layer_weight_bytes(model: ModelConfig, mesh: dict, layer_type: str, split: bool = False) -> int:
    """fp32 bytes of one layer's weights gathered over fsdp (still split over tensor), or with `split` as they
    are stored (split over every mesh axis the rules give)."""
    import jax

    from mimesis_jax.models import param_specs
    from mimesis_jax.models.layers import is_spec

    specs = param_specs(model)
    key = "layers" if model.model_type == "qwen3" else {"linear_attention": "linear_layers",
                                                          "full_attention": "full_layers"}[layer_type]
    tmesh = mesh if split else {"tensor": mesh.get("tensor", 1)}
    return sum(math.prod(s.shape[1:]) * 4 // _divisor(s.axes, s.shape, tmesh, model)
               for s in jax.tree.leaves(specs[key], is_leaf=is_spec))


def table_bytes(model: ModelConfig, mesh: dict) -> int:
    """fp32 bytes of one [V, D] table gathered over fsdp (split over tensor along the vocabulary)."""
    V, D = model.vocab_size, model.hidden_size
    return V * D * 4 // _divisor(("vocab", None), (V, D), {"tensor": mesh.get("tensor", 1)}, model)


def cache_bytes(model: ModelConfig, mesh: dict, batch: int, length: int) -> dict[str, int]:
    """Per-device bytes of the sampler's cache arrays (KV cache, DeltaNet state and conv window)."""
    import jax

    from mimesis_jax import models

    shapes = jax.eval_shape(lambda: models.init_cache(model, batch, length))
    axes = models.cache_axes(model)
    return {k: v.size * v.dtype.itemsize // _divisor(axes[k], v.shape, mesh, model) for k, v in shapes.items()}


# ------------------------------------------------------------------------------------------- the plan
@dataclasses.dataclass(frozen=True)
class Item:
    phase: str  # resident | train | rollout
    name: str
    bytes: int
    formula: str


@dataclasses.dataclass(frozen=True)
class Plan:
    workload: Workload
    device: Device
    items: tuple[Item, ...]
    train_peak: int
    rollout_peak: int
    train_phase: str  # the train-step phase that peaks

    @property
    def total(self) -> int:
        return max(self.train_peak, self.rollout_peak)

    @property
    def usable(self) -> int:
        return int(self.device.bytes * (1 - HEADROOM))

    @property
    def margin(self) -> int:
        return self.usable - self.total

    @property
    def fits(self) -> bool:
        return self.margin >= 0

    def item(self, name: str) -> int:
        return sum(i.bytes for i in self.items if i.name == name)


def _layer_types(model: ModelConfig) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in model.layer_types:
        out[t] = out.get(t, 0) + 1
    return out


def layer_backward_phase(model: ModelConfig, saved: dict[str, int], table: dict[str, int],
                         extras: dict[str, int], carry_bytes: int) -> tuple[int, int]:
    """(peak of the layer backward loop beyond the gradients, largest one-layer working set).

    saved[t] / table[t] / extras[t]: per layer of type t, the bytes kept under the remat policy, its whole
    tensor table (recomputed under remat) and the backward extras (attention backward, cotangents, gathered
    weights); carry_bytes: the layer input kept under remat. Without remat, the backward of a scanned stack
    reads its iteration's saved tensors as copies sliced from the stack: a Qwen3 layer, or a whole Qwen3.5
    block (its runs of same-type layers). Every stack stays live until the loop ends. A Qwen3.5 model of a single
    block is unrolled by XLA: its runs free their tensors as the backward passes them (last run first), and only
    runs of more than one layer are sliced.
    """
    counts = _layer_types(model)
    total = sum(saved[t] * n for t, n in counts.items())
    # without remat the saved tensors are read as sliced copies; under remat the layer recomputes what it did
    # not save (its whole table under full remat)
    none = model.remat == "none"
    recompute = {t: 0 if none else table[t] - saved[t] + carry_bytes for t in counts}
    copied = {t: saved[t] if none else 0 for t in counts}
    if model.model_type != "qwen3_5_text":
        work = {t: copied[t] + recompute[t] + extras[t] for t in counts}
        return total + max(work.values()), max(work.values())
    from mimesis_jax.models.qwen3_5 import layer_block

    block, repeats = layer_block(model)
    if repeats > 1:
        block_saved = sum(copied[t] for t in block)
        work = {t: block_saved + recompute[t] + extras[t] for t in counts}
        return total + max(work.values()), max(work.values())
    alive, peak, one = 0, 0, 0
    runs = [(t, len(list(g))) for t, g in itertools.groupby(block)]  # runs of same-type layers, in forward order
    for t, n in runs:  # a run's backward still sees its own and the earlier runs' saved tensors
        alive += saved[t] * n
        work = (copied[t] if n > 1 else 0) + recompute[t] + extras[t]
        peak, one = max(peak, alive + work), max(one, work)
    return peak, one


def plan(w: Workload, device: Device) -> Plan:
    """Per-device memory of one optimizer update (and, for RL, of the rollout phase) of workload `w`.

    Train-step peak = resident (parameters, optimizer state, the update's batch) + the largest of its phases:
    forward (saved activations + the gathered [V, D] tables + CSD branches + the last layer's attention: 2 fp32
    dense scores, or its blocks), LM-head backward, layer backward (`layer_backward_phase` + the fp32 gradient of
    the hidden states), embedding backward and the optimizer update; the backward phases with the gradient
    buffers. Rollout peak = parameters + optimizer state + caches (+ a copy of a K or V stack) + prefill.
    """
    m, mesh = w.model, w.mesh
    c = DTYPES[m.dtype].dtype.itemsize
    W = widths(m, mesh)
    items: list[Item] = []

    def add(phase, name, nbytes, formula):
        items.append(Item(phase, name, int(nbytes), formula))
        return int(nbytes)

    P = add("resident", "parameters", param_bytes(m, mesh),
            "fp32 master weights: global bytes / product of the mesh axes each leaf is split over (exact)")
    O = add("resident", "optimizer state", optimizer_bytes(m, mesh, w.optimizer, w.total_updates),
            "AdamW mu + nu (+ step counts), split like their parameters (exact, jax.eval_shape)")
    rows_mb = w.rows // w.microbatches
    shards = _batch_shards(m, mesh, rows_mb)
    b, T = rows_mb // shards, w.row_len
    rows_dev = w.rows // shards
    if w.kind == "lm":
        batch = rows_dev * T * 4 * 4
        what = "4 [rows, T] int32/fp32 arrays"
    else:
        batch = rows_dev * 4 * (10 * T + w.head_len + 5 * w.branch_len + w.branch_head_len)
        what = "10 [rows, T] arrays + head / branch index arrays"
    batch = add("resident", "batch", batch, f"{what}; {w.rows} rows per update split {shards} ways")
    n_grads = 2 if w.accumulate else 1
    G = add("train", "gradients", n_grads * P, f"{n_grads} x fp32 parameter-shaped"
            + (" (accumulator + micro-batch gradient)" if w.accumulate else " (no accumulation)"))

    per_type = []
    dense = m.attention_impl == "dense"
    scores = b * W.H * T * T  # elements of one dense [b,H,T,T] score tensor
    attn_fwd = 0  # the attention being computed when the last layer's forward peaks: 2 fp32 scores, or blocks
    if "full_attention" in m.layer_types:
        attn_fwd = 8 * scores if dense else attention_blocks(m, W, b, T, T)
    saved_of, table_of, extras_of = {}, {}, {}
    for lt, count in _layer_types(m).items():
        ts = layer_residuals(m, W, lt, b, T)
        saved_of[lt] = saved_bytes(m, ts, b, T, W)
        table_of[lt] = sum(t.bytes for t in ts)
        attn = 0
        if lt == "full_attention":
            attn = 4 * scores if dense else attention_blocks(m, W, b, T, T)  # one more fp32 score, or blocks
        weights = layer_weight_bytes(m, mesh, lt)
        gather = weights + (weights * c // 4 if layer_weight_bytes(m, mesh, lt, split=True) < weights else 0)
        extras_of[lt] = attn + 3 * b * T * W.D * 4 + 2 * b * T * W.I * 4 + gather
        per_type.append(f"{count} x {lt} ({saved_of[lt] / GiB:.3f} GiB each)")
    saved = add("train", "activations (saved)", sum(saved_of[t] * n for t, n in _layer_types(m).items()),
                f"remat={m.remat}, attention={m.attention_impl}, b={b} rows x T={T} per device: " + ", ".join(per_type))
    layer_phase, one_layer = layer_backward_phase(m, saved_of, table_of, extras_of, b * T * W.D * c)
    add("train", "layer backward (one layer)", one_layer,
        "saved tensors sliced from the stack (a Qwen3.5 block at a time) + the layer's tensors recomputed (remat) "
        "+ attention backward (dense: one more fp32 [b,H,T,T]; blockwise: its blocks) + fp32 cotangents 3 [b,T,D] "
        "+ 2 [b,T,I] + its fp32 weight gradient (and its weights gathered over fsdp, compute dtype)")
    kept, head_work = head_bytes(m, W, b, w.head_len)
    kept = add("train", "LM head (kept)", kept, f"hidden states + fp32 log-sum-exp of {w.head_len} positions per row")
    table = table_bytes(m, mesh)
    tc = table * c // 4  # one [V, D] table in the compute dtype
    n_tables = 2 if m.tie_word_embeddings else 4
    which = "embedding" if m.tie_word_embeddings else "embedding and head"
    tables = add("train", "embedding / head tables", n_tables * tc,
                 f"{n_tables} [V, D] tables in the compute dtype ({which} gathered over fsdp, and re-laid-out copies)")
    head_peak = add("train", "LM head (backward)", head_work + table + 2 * tc,
                    "3 fp32 logit blocks [b, seq-chunk, vocab-chunk] + fp32 d(hidden) + fp32 d(head) [V, D] "
                    "+ the head gathered (compute dtype, twice)")
    branch = 0
    if w.branch_len:
        Tb = w.branch_len
        bkept, _ = head_bytes(m, W, b, w.branch_head_len)
        branch = add("train", "CSD branches (forward)",
                     prefill_bytes(m, W, "full_attention", b, Tb, T + Tb, attention_blocks(m, W, b, Tb, T)
                                   + attention_blocks(m, W, b, Tb, Tb) + (4 * b * W.H * Tb * (T + Tb) if dense else 0))
                     + b * Tb * W.D * c + bkept,
                     f"one layer's no-gradient forward (as `prefill_bytes`) over b={b} branch rows of Tb={Tb} "
                     "tokens, attending the trunk keys and the branch keys as two groups (dense: 4 fp32 [b,H,Tb,keys] "
                     "and the mask per group), + the branch stream and its head inputs; stop-gradient: nothing "
                     "saved per layer")
    embed = add("train", "embedding (backward)", table + tc,
                "the dense fp32 gradient of the [V, D] table + the gathered table")
    opt_tmp = add("train", "optimizer update", P, "one fp32 parameter-shaped update tree (clip + AdamW)")
    phases = {
        "forward": saved + kept + tables + branch + attn_fwd,
        "head backward": G + saved + kept + head_peak,
        "layer backward": G + b * T * W.D * 4 + layer_phase,
        "embedding backward": G + embed,
        "optimizer": G + opt_tmp,
    }
    train_peak = P + O + batch + max(phases.values())
    rollout_peak = 0
    if w.rollout is not None:
        r = w.rollout
        S = r.prompt_len + r.new_tokens
        caches = cache_bytes(m, mesh, r.batch, S)
        kv = add("rollout", "KV cache", sum(v for k, v in caches.items() if k not in ("state", "conv")),
                 f"{r.batch} sequences x {S} slots (prompt {r.prompt_len} + {r.new_tokens} new), "
                 "full-attention layers, compute dtype; the peak adds a copy of its K or V stack (the update)")
        rec = 0
        if "state" in caches:
            rec = add("rollout", "recurrent state", caches["state"] + caches["conv"],
                      "DeltaNet fp32 state [B,Hv,Dk,Dv] + conv window, per linear layer")
        bp = r.batch // _batch_shards(m, mesh, r.batch)
        pf = max(prefill_bytes(m, W, lt, bp, r.prompt_len, S) for lt in _layer_types(m))
        pf = add("rollout", "prefill + logits", pf + 2 * bp * W.V * 4 + bp * r.prompt_len * W.D * c,
                 f"one layer's forward over {bp} prompts x {r.prompt_len} tokens per device (attending {S} cache "
                 "slots) + the final hidden states + 2 fp32 [B, V] logit buffers")
        rollout_peak = P + O + kv + kv // 2 + rec + pf
    return Plan(w, device, tuple(items), int(train_peak), int(rollout_peak), max(phases, key=phases.get))


# ---------------------------------------------------------------------------------------- configs
def load_run_config(path: str, overrides: Sequence[str] = ()):
    """A RunConfig, AgentRLConfig or SimRLConfig from a config file (+ --set overrides)."""
    from mimesis_jax.config import AgentRLConfig, RunConfig, SimRLConfig, load_config

    return load_config(path, overrides, kind=(RunConfig, AgentRLConfig, SimRLConfig))


def runtime_model(cfg) -> ModelConfig:
    """The model the trainer runs (compute dtype, remat; the vocabulary of a tokenizer-built tiny model)."""
    from mimesis_jax.train.loop import model_config_for

    tok = None
    if cfg.tokenizer.set_model_vocab:
        from mimesis_jax.data.tokenizer import load_tokenizer

        tok = load_tokenizer(cfg.tokenizer.name)
    return model_config_for(cfg, tok)


def plan_config(cfg, mesh: dict, device: str, rows: int | None = None) -> Plan:
    model = runtime_model(cfg)
    w = workload_from_config(cfg, mesh, model, rows)
    return plan(w, device_for(device, w.num_devices))


# ------------------------------------------------------------------------------------- suggestions
@dataclasses.dataclass(frozen=True)
class Suggestion:
    change: str  # what to pass: --set ... and/or --mesh ...
    overrides: tuple[str, ...]
    mesh: dict
    plan: Plan


def _knobs(cfg, mesh: dict) -> list[list[tuple[float, tuple[str, ...], dict | None]]]:
    """Per knob, its options as (cost, --set overrides, mesh or None). Costs order the search: remat full 1;
    one halving of data or tensor into fsdp (same device count) 1 per step; k x the micro-batches log2 k; the
    sequences per sampler call (rollout.max_batch) / k (RL; more, smaller sampler calls, the same samples)
    log2 k; rows / k (shorter contexts) 6 log2 k; k x the fsdp devices (more hardware) 8 + 2 log2 k."""
    from mimesis_jax.config import RunConfig

    lm = isinstance(cfg, RunConfig)
    knobs = []
    if cfg.train.remat != "full":
        knobs.append([(1.0, ("train.remat=full",), None)])
    moves, m, steps = [], dict(mesh), 0
    for src in ("data", "tensor"):
        while m[src] > 1 and m[src] % 2 == 0:
            m, steps = dict(m, **{src: m[src] // 2, "fsdp": m["fsdp"] * 2}), steps + 1
            moves.append((float(steps), (), m))
    knobs.append(moves)
    micro = []
    for k in (2, 4, 8, 16):
        if lm and cfg.train.global_batch % (cfg.train.grad_accum * k) == 0:
            micro.append((math.log2(k), (f"train.grad_accum={cfg.train.grad_accum * k}",), None))
        elif not lm:
            micro.append((math.log2(k), (f"rl.num_microbatches={cfg.rl.num_microbatches * k}",), None))
    knobs.append(micro)
    if not lm:
        r = cfg.rollout
        total = r.prompts_per_step * r.group_size
        per_call = min(r.max_batch, total) if r.max_batch else total
        knobs.append([(math.log2(k), (f"rollout.max_batch={per_call // k}",), None)
                      for k in (2, 4, 8, 16, 32, 64) if per_call // k >= 1])
    rows = []
    for k in (2, 4, 8):
        if lm:
            rows.append((6 * math.log2(k), (f"data.seq_len={cfg.data.seq_len // k}",), None))
        else:
            r = cfg.rollout
            sets = ((f"rollout.row_len={r.row_len // k}",) if r.row_len else ()) + (
                (f"rollout.max_context_tokens={r.max_context_tokens // k}",) if r.max_context_tokens else ())
            rows.append((6 * math.log2(k), sets, None))
    knobs.append(rows)
    knobs.append([(8 + 2 * math.log2(k), (), dict(mesh, fsdp=mesh["fsdp"] * k)) for k in (2, 4)])
    return [k for k in knobs if k]


def _candidates(cfg, mesh: dict, max_knobs: int = 2) -> list[tuple[float, tuple[str, ...], dict]]:
    """Every combination of at most `max_knobs` knobs (one option each), cheapest first."""
    out = []
    knobs = _knobs(cfg, mesh)
    for n in range(1, max_knobs + 1):
        for combo in itertools.combinations(knobs, n):
            for opts in itertools.product(*combo):
                meshes = [mm for _, _, mm in opts if mm is not None]
                if len(meshes) > 1:
                    continue
                out.append((sum(c for c, _, _ in opts), tuple(x for _, sets, _ in opts for x in sets),
                            meshes[0] if meshes else dict(mesh)))
    return sorted(out, key=lambda c: c[0])


def _mesh_text(mesh: dict) -> str:
    return ",".join(f"{a}={mesh[a]}" for a in MESH_AXES)


def suggest(path: str, overrides: Sequence[str], mesh: dict, device: str, rows: int | None = None
            ) -> Suggestion | None:
    """The cheapest change (see `_knobs`; single knobs and pairs) under which the config fits, or None."""
    cfg = load_run_config(path, overrides)
    for _, sets, m in _candidates(cfg, mesh):
        try:
            p = plan_config(load_run_config(path, list(overrides) + list(sets)), m, device, rows)
        except (ConfigError, ValueError):
            continue  # not a valid config (e.g. the batch no longer splits)
        if p.fits:
            change = " ".join([f"--set {x}" for x in sets] + ([f"--mesh {_mesh_text(m)}"] if m != mesh else []))
            if math.prod(m.values()) != math.prod(mesh.values()):
                change += f" ({math.prod(m.values())} devices)"
            return Suggestion(change, sets, m, p)
    return None


# ----------------------------------------------------------------------------------------------- CLI
def add_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--config", required=True, help="configs/<name>.py (RunConfig, AgentRLConfig or SimRLConfig)")
    p.add_argument("--mesh", default=None, help="data=A,fsdp=B,tensor=C (default: the config's mesh)")
    p.add_argument("--device", default="a100-80g", help=f"one of {', '.join(DEVICES)}")
    p.add_argument("--rows", type=int, default=None,
                   help="rows per optimizer update (default: train.global_batch; RL: one per dialogue / rollout)")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE")
    return p


def _gib(n: int) -> str:
    return f"{n / GiB:9.2f}"


def format_plan(p: Plan, path: str = "") -> str:
    w, m, d = p.workload, p.workload.model, p.device
    rows_mb = w.rows // w.microbatches
    shards = _batch_shards(m, w.mesh, rows_mb)
    peak_flops = "n/a" if d.peak_bf16_flops is None else f"{d.peak_bf16_flops / 1e12:.0f} TFLOP/s bf16"
    lines = [
        f"plan: {path or w.name} ({w.kind}, {m.model_type}) on {w.num_devices} x {d.name} "
        f"({d.bytes / GiB:.1f} GiB, {peak_flops}; {d.source}), mesh {_mesh_text(w.mesh)}",
        f"per device: {rows_mb // shards} row(s) x {w.row_len} tokens per micro-batch ({w.rows} rows per update, "
        f"{w.microbatches} micro-batch(es)), remat {m.remat}, {m.attention_impl} attention, {m.dtype} compute",
    ]
    lines += [f"  note: {n}" for n in w.notes]
    lines.append(f"  {'phase':8s}  {'component':28s} {'GiB':>9s}  formula")
    for it in p.items:
        lines.append(f"  {it.phase:8s}  {it.name:28s} {_gib(it.bytes)}  {it.formula}")
    lines.append(f"train step peak ({p.train_phase}): {p.train_peak / GiB:.2f} GiB")
    if w.rollout is not None:
        lines.append(f"rollout peak: {p.rollout_peak / GiB:.2f} GiB")
    verdict = "FITS" if p.fits else "DOES NOT FIT"
    lines.append(f"total {p.total / GiB:.2f} GiB of {d.bytes / GiB:.2f} GiB ({p.usable / GiB:.2f} GiB usable after "
                 f"{HEADROOM:.0%} headroom): margin {p.margin / GiB:+.2f} GiB -> {verdict}")
    return "\n".join(lines)


def run(args) -> int:
    """`python -m mimesis_jax plan`: prints the plan (and a change that fits when it does not). 0, or 2 for a bad
    config, --mesh or --device (the message names it)."""
    try:
        if args.device not in DEVICES:
            raise ConfigError(f"--device {args.device!r}: unknown device; expected one of {sorted(DEVICES)}")
        cfg = load_run_config(args.config, args.overrides)
        if args.mesh is not None:
            mesh = parse_mesh(args.mesh)
        else:
            import jax

            mesh = config_mesh(cfg.mesh, jax.device_count())
        if args.rows is not None and args.rows < 1:
            raise ConfigError(f"--rows {args.rows}: must be >= 1")
        p = plan_config(cfg, mesh, args.device, args.rows)
        print(format_plan(p, args.config))
        if not p.fits:
            s = suggest(args.config, args.overrides, mesh, args.device, args.rows)
            if s is None:
                print("suggestion: no change of at most two of remat full, more fsdp, up to 16x the micro-batches, "
                      "rollout.max_batch down to 1/64, rows down to 1/8, up to 4x the fsdp devices fits")
            else:
                print(f"suggestion: {s.change} -> total {s.plan.total / GiB:.2f} GiB, margin "
                      f"{s.plan.margin / GiB:+.2f} GiB -> FITS")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0

