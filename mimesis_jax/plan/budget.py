"""The plan: per-device bytes of each phase of one update (resident state, the train step's phases, the rollout
phase), its peak and whether it fits the device less the headroom, with room for the planner's error
(`error_bytes`, `verdict`)."""

from __future__ import annotations

import dataclasses
import itertools
import math

from mimesis_jax.models.config import DTYPES, ModelConfig
from mimesis_jax.models.qwen3_5 import layer_block
from mimesis_jax.plan.devices import GiB, HEADROOM, Device, device_for
from mimesis_jax.plan.memory import (attention_blocks, cache_bytes, divisor, engine_param_bytes, engine_pool_bytes,
                                     head_bytes,
                                     kv_head_split, layer_residuals, layer_weight_bytes, optimizer_bytes, param_bytes,
                                     prefill_bytes, saved_bytes, table_bytes, vocab_layout, widths)
from mimesis_jax.plan.workload import Workload, batch_shards, runtime_model, workload_from_config


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
        """The peak is at most the usable bytes, taking the plan at its word (see `clears` for its error)."""
        return self.margin >= 0

    def clears(self, error: float) -> bool:
        """The margin is at least the peak's `error_bytes`: the config fits even if the plan under-counts it by
        the planner's error."""
        return self.margin >= error_bytes(self.total, error)

    def item(self, name: str) -> int:
        return sum(i.bytes for i in self.items if i.name == name)


def error_bytes(peak: int, error: float) -> int:
    """How much a planned `peak` may under-count the compiled one when every program is planned within `error`
    of the compiled bytes (|planned / compiled - 1| <= error, as plan/compiled.py `within` tests it): compiled <=
    planned / (1 - error), so peak / (1 - error) - peak."""
    if not 0 <= error < 1:
        raise ValueError(f"planner error {error}: must be in [0, 1)")
    return math.floor(peak / (1 - error)) - peak


def verdict(peak: int, usable: int, error: float) -> str:
    """FITS when the headroom (usable - peak) is at least the peak's `error_bytes`; TIGHT when the peak fits but
    within that error; DOES NOT FIT when the peak exceeds the usable bytes."""
    if peak > usable:
        return "DOES NOT FIT"
    return "FITS" if usable - peak >= error_bytes(peak, error) else "TIGHT"


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
    block (its runs of same-type layers). A scanned Qwen3.5 block slices its iteration's saved tensors under remat
    too (the outer scan's backward reads every layer input of the block before the inner runs start: `block`
    carries, beside the recomputed layer's own). Every stack stays live until the loop ends. A Qwen3.5 model of a
    single block is unrolled by XLA: its runs free their tensors as the backward passes them (last run first), and
    only runs of more than one layer are sliced.
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
    block, repeats = layer_block(model)
    if repeats > 1:
        block_saved = sum(saved[t] for t in block)
        work = {t: block_saved + recompute[t] + extras[t] for t in counts}
        return total + max(work.values()), max(work.values())
    alive, peak, one = 0, 0, 0
    runs = [(t, len(list(g))) for t, g in itertools.groupby(block)]  # runs of same-type layers, in forward order
    for t, n in runs:  # a run's backward still sees its own and the earlier runs' saved tensors
        alive += saved[t] * n
        work = (copied[t] if n > 1 else 0) + recompute[t] + extras[t]
        peak, one = max(peak, alive + work), max(one, work)
    return peak, one


def _gathered_layer(m: ModelConfig, mesh: dict, layer_type: str) -> int:
    """One layer's weights gathered over fsdp in the compute dtype (0 when fsdp does not split them)."""
    weights = layer_weight_bytes(m, mesh, layer_type)
    if layer_weight_bytes(m, mesh, layer_type, split=True) >= weights:
        return 0
    return weights * DTYPES[m.dtype].dtype.itemsize // 4


def plan(w: Workload, device: Device) -> Plan:
    """Per-device memory of one optimizer update (and, for RL, of the rollout phase) of workload `w`.

    Train-step peak = resident (parameters, optimizer state, the update's batch) + the largest of its phases:
    forward (saved activations + the gathered [V, D] tables + CSD branches + the last layer's attention: 2 fp32
    dense scores, or its blocks), LM-head backward, layer backward (`layer_backward_phase` + the gradient of the
    hidden states in the compute dtype + the [V, D] tables beside it: two fp32 gradient buffers, in the LM train
    step also the gathered table(s)), embedding backward and the optimizer update; the backward phases with the gradient
    buffers. Rollout peak (static sampler) = parameters + optimizer state + the larger of its prefill (caches + a
    copy of a K or V stack + one layer's prefill + the 3 gathered [V, D] tables) and its decode (the cache carried
    and the cache updated, both whole, + one layer's keys and values read in blocks + the loop's 2 tables).
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
    shards = batch_shards(m, mesh, rows_mb)
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
        gather = layer_weight_bytes(m, mesh, lt) + _gathered_layer(m, mesh, lt)
        # the cotangents of the layer's compute-dtype tensors are in the compute dtype (bf16 in a bf16 program)
        extras_of[lt] = attn + 3 * b * T * W.D * c + 2 * b * T * W.I * c + gather
        per_type.append(f"{count} x {lt} ({saved_of[lt] / GiB:.3f} GiB each)")
    saved = add("train", "activations (saved)", sum(saved_of[t] * n for t, n in _layer_types(m).items()),
                f"remat={m.remat}, attention={m.attention_impl}, b={b} rows x T={T} per device: " + ", ".join(per_type))
    layer_phase, one_layer = layer_backward_phase(m, saved_of, table_of, extras_of, b * T * W.D * c)
    add("train", "layer backward (one layer)", one_layer,
        "saved tensors sliced from the stack (a Qwen3.5 block at a time) + the layer's tensors recomputed (remat) "
        "+ attention backward (dense: one more fp32 [b,H,T,T]; blockwise: its blocks) + cotangents 3 [b,T,D] "
        "+ 2 [b,T,I] (compute dtype) + its fp32 weight gradient (and its weights gathered over fsdp, compute dtype)")
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
    if w.kind == "lm":  # the LM train step's (train/step.py)
        beside = add("train", "tables (layer backward)", (n_tables // 2) * tc + 2 * table,
                     f"{n_tables // 2} [V, D] {which} table{'s' if n_tables > 2 else ''} gathered over fsdp "
                     "(compute dtype: loop invariants of the micro-batch scan, live throughout it) + 2 dense fp32 "
                     "[V, D] gradient buffers beside the layer backward, the scatter-adds of the LM head's target-row "
                     "gather and of the embedding lookup (the CPU schedule zeroes both before the trunk's backward)")
    else:  # the RL update's (train/rl/step.py): the two gradient buffers, not the gathered tables
        beside = add("train", "tables (layer backward)", 2 * table,
                     "2 dense fp32 [V, D] gradient buffers beside the layer backward, the scatter-adds of the LM "
                     "head's target-row gather and of the embedding lookup")
    embed = add("train", "embedding (backward)", table + tc,
                "the dense fp32 gradient of the [V, D] table + the gathered table")
    opt_tmp = add("train", "optimizer update", P, "one fp32 parameter-shaped update tree (clip + AdamW)")
    phases = {
        "forward": saved + kept + tables + branch + attn_fwd,
        "head backward": G + saved + kept + head_peak,
        "layer backward": G + b * T * W.D * c + layer_phase + beside,
        "embedding backward": G + embed,
        "optimizer": G + opt_tmp,
    }
    train_peak = P + O + batch + max(phases.values())
    rollout_peak = 0  # with a rollout pool (rollout.devices) the rollouts run apart, on it: `pool_rollout_peak`
    if w.engine is not None and not w.pool:
        rollout_peak = P + O + _engine_rollout(w, add)
    elif w.rollout is not None and not w.pool:
        rollout_peak = P + O + _sampler_rollout(w, add, W, c)
    return Plan(w, device, tuple(items), int(train_peak), int(rollout_peak), max(phases, key=phases.get))



def engine_mesh(mesh: dict) -> dict:
    """The axes the rollout engine runs on over the devices of `mesh`: its replica layout (config/layout.py
    engine_layout: the tensor split kept, every other device a data-parallel replica, fsdp 1), as
    train/rl/distributed.py `layout_of` lays a rollout.engine run out where `rollout.mesh` is unset; `mesh` itself
    where it already is that layout (a `rollout.mesh` or process plan)."""
    from mimesis_jax.config.layout import engine_layout
    from mimesis_jax.sharding import layout_axes

    tensor = mesh.get("tensor", 1)
    return layout_axes(engine_layout(tensor), math.prod(mesh.values()))


def _same_layout(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if v > 1} == {k: v for k, v in b.items() if v > 1}


def _engine_rollout(w: Workload, add) -> int:
    """The rollout engine's items (rollout.engine: every dialogue of the step on the engine, in its replica layout
    `engine_mesh`); its peak beyond the parameters and optimizer state."""
    m = w.model
    e, lay = w.engine, engine_mesh(w.mesh)
    own = not _same_layout(lay, w.mesh)
    ep = add("rollout", "engine parameters", engine_param_bytes(m, lay, cast_only=not own),
             f"the engine's copy of the parameters in its replica layout {_axes_text(lay)} (the tensor split "
             "kept, replicated over the replicas; the matrices in the compute dtype, models.compute_cast_mask): "
             "resharded from the training layout at every policy update (inference/weight_sync.py)" if own else
             "the training arrays are already laid out as the engine's replicas take them: only the matrices "
             "cast to a narrower compute dtype are copied (models.compute_cast_mask; none in float32)")
    pool = add("rollout", "engine pool", engine_pool_bytes(m, lay, e.num_pages, e.page_size, e.num_states),
               f"{e.num_pages} KV pages x {e.page_size} tokens (full-attention layers, compute dtype)"
               + (f" + {e.num_states} state slots" if e.state_bytes else "")
               + f" (inference/engine_sizing.py: {e.pool_bytes / 2 ** 30:.2f} GiB in all), split over heads on "
               "`tensor` (paged_cache.pool_axes)")
    S = e.max_pages_per_seq * e.page_size
    ec = e.engine_config()
    kvs = kv_head_split(m, lay)
    pf = engine_prefill_bytes(w) + engine_prefill_copies(w)
    burst = e.slots * (e.max_pages_per_seq + 1) * e.page_bytes // kvs
    layers = engine_layer_copies(w)
    work = add("rollout", "engine programs", max(pf, burst + layers),
               f"the larger of a prefill chunk's ({pf / GiB:.2f} GiB: one layer's forward over {ec.prefill_rows} "
               f"rows x {ec.prefill_chunk} tokens attending their {S} gathered keys and values, a copy of the "
               "layers' weight shards and the LM head's table) and a decode burst's "
               f"({(burst + layers) / GiB:.2f} GiB: the slot-major copy of its rows' pages, {burst / GiB:.2f} GiB "
               f"for {e.slots} slots x {e.max_pages_per_seq + 1} pages, heads split {kvs} ways on `tensor`, and a "
               "copy of the layers' weight shards)")
    return ep + pool + work


def _axes_text(mesh: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in mesh.items())


def _sampler_rollout(w: Workload, add, W, c: int) -> int:
    """The static sampler's items; its peak beyond the parameters and optimizer state: the larger of its prefill
    and its decode."""
    m, mesh = w.model, w.mesh
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
    bp = r.batch // batch_shards(m, mesh, r.batch)
    pf = max(prefill_bytes(m, W, lt, bp, r.prompt_len, S) + _gathered_layer(m, mesh, lt) for lt in _layer_types(m))
    rope = 2 * bp * r.prompt_len * m.rotary_dim * 4
    pf = add("rollout", "prefill + logits", pf + rope + 2 * bp * W.V * 4 + bp * r.prompt_len * W.D * c,
             f"one layer's forward over {bp} prompts x {r.prompt_len} tokens per device (attending {S} cache "
             "slots) with its weights gathered over fsdp (compute dtype) + the rope tables (2 fp32 [b, P, "
             "rotary dims], live through the layer scan) + the final hidden states + 2 fp32 [B, V] logit buffers")
    tc = table_bytes(m, mesh) * c // 4 if _tables_copied(m, mesh) else 0
    st = add("rollout", "sampler tables", 3 * tc,
             "3 [V, D] tables in the compute dtype gathered over fsdp: the prefill's LM head and the decode "
             "loop's embedding and LM head (loop invariants, hoisted out of the loop, live from the start); none "
             "where the tables are neither split over fsdp nor cast (a rollout layout in float32: read in place)")
    n_attn = _layer_types(m).get("full_attention", 0)
    dec = add("rollout", "decode step", kv + rec + (3 * kv // (2 * n_attn) if n_attn else 0)
              + max(_gathered_layer(m, mesh, lt) for lt in _layer_types(m)) + 2 * bp * W.V * 4,
              "the decode loop's updated cache beside the one it carries (the whole KV cache and recurrent "
              "state again) + one layer's keys and values read in blocks (1.5 x its share) + its weights "
              "gathered over fsdp + 2 fp32 [B, V] logit buffers")
    prefill_phase = kv + kv // 2 + rec + pf + st
    decode_phase = kv + rec + dec + 2 * tc
    return max(prefill_phase, decode_phase)


def _tables_copied(m: ModelConfig, mesh: dict) -> bool:
    """Whether the sampler holds copies of the [V, D] tables: gathered over fsdp (their stored shard is smaller than
    the tensor-split table) or cast to a compute dtype other than the parameters'."""
    V, D = m.vocab_size, m.hidden_size
    stored = V * D * 4 // divisor(("vocab", "embed"), (V, D), mesh, m)
    return stored < table_bytes(m, mesh) or m.dtype != m.param_dtype


def engine_prefill_bytes(w: Workload) -> int:
    """Working set of the rollout engine's largest prefill chunk (inference/engine_programs.py `prefill_program`,
    prefill_rows x prefill_chunk tokens over page tables max_pages_per_seq wide) in its replica layout
    (`engine_mesh`), beyond its params and pool: one layer's no-gradient forward (`prefill_bytes`, heads split over
    `tensor` as the engine's weights and pool are; rows and tokens are not split); an attention layer's
    attention is the paged one whatever model.attention_impl says (models/paged_cache.py `paged_attention`): the
    rows' keys and values gathered from their pages (2 [R, KVH, S, Dh], compute dtype), 2 fp32 [R, H, C, S]
    (scores, softmax) and the boolean mask [R, C, S]."""
    m, e = w.model, w.engine
    ec = e.engine_config()
    c = DTYPES[m.dtype].dtype.itemsize
    W = widths(m, engine_mesh(w.mesh))
    R, C, S = ec.prefill_rows, ec.prefill_chunk, e.max_pages_per_seq * e.page_size
    paged = 2 * R * W.KVH * S * W.Dh * c + 2 * R * W.H * C * S * 4 + R * C * S
    return max(prefill_bytes(m, W, lt, R, C, S, paged if lt == "full_attention" else None)
               for lt in _layer_types(m))


def engine_layer_copies(w: Workload) -> int:
    """A copy of every layer's weight shards in the compute dtype, held by each engine program: the paged forward
    unrolls the layers (models/qwen3_paged.py), and XLA materialises every layer's static slice of the stacked
    weights (cast to the compute dtype), all live at once -- out of the decode loop and from the prefill's start.
    Counted, so the plan errs high where a GPU compile slices in place (none was lent here)."""
    m, lay = w.model, engine_mesh(w.mesh)
    c = DTYPES[m.dtype].dtype.itemsize
    return sum(n * layer_weight_bytes(m, lay, lt, split=True) for lt, n in _layer_types(m).items()) * c // 4


def engine_prefill_copies(w: Workload) -> int:
    """What the engine's prefill program holds beyond its working set: the layers' copies
    (`engine_layer_copies`) and the LM head's [V, D] table (split over tensor, compute dtype)."""
    m = w.model
    c = DTYPES[m.dtype].dtype.itemsize
    return int(engine_layer_copies(w) + table_bytes(m, engine_mesh(w.mesh)) * c // 4)


def engine_prefill_peak(w: Workload) -> int:
    """Per-device bytes of the engine's largest prefill chunk in its replica layout (`engine_mesh`): the engine's
    parameters (replicated over the replicas, split over tensor), its pool's shard, `engine_prefill_bytes` and
    `engine_prefill_copies`."""
    return int(_engine_resident(w) + engine_prefill_bytes(w) + engine_prefill_copies(w))


def engine_decode_peak(w: Workload) -> int:
    """Per-device bytes of the engine's decode burst in its replica layout: the engine's parameters, its pool's
    shard, the slot-major copy of its rows' pages and `engine_layer_copies`."""
    m, e, lay = w.model, w.engine, engine_mesh(w.mesh)
    burst = e.slots * (e.max_pages_per_seq + 1) * e.page_bytes // kv_head_split(m, lay)
    return int(_engine_resident(w) + burst + engine_layer_copies(w))


def _engine_resident(w: Workload) -> int:
    """The engine programs' arguments per device: its parameters (in `engine_mesh`) and its pool."""
    m, e, lay = w.model, w.engine, engine_mesh(w.mesh)
    return engine_param_bytes(m, lay) + engine_pool_bytes(m, lay, e.num_pages, e.page_size, e.num_states)


def scoring_peak(w: Workload) -> int:
    """Per-device bytes of the old-log-prob scoring pass (rl.old_logprobs=recompute: train/rl/step.py
    `RLStep._score_fn`, a no-gradient forward mapped over the update's micro-batches): the parameters + its inputs
    (4 [rows, T] arrays and the head index) + its fp32 [rows, T] output + one micro-batch's forward at its peak: the
    residual stream between layers, the gathered [V, D] tables (compute dtype, loop invariants live throughout) and
    the larger of one layer's forward (`prefill_bytes` over T tokens attending T, with its weights gathered over
    fsdp) and the LM head's (its kept inputs + 3 fp32 logit blocks)."""
    m, mesh = w.model, w.mesh
    c = DTYPES[m.dtype].dtype.itemsize
    W = widths(m, mesh)
    rows_mb = w.rows // w.microbatches
    shards = batch_shards(m, mesh, rows_mb)
    b, T, rows_dev = rows_mb // shards, w.row_len, w.rows // shards
    io = rows_dev * 4 * (4 * T + w.head_len) + rows_dev * T * 4
    tables = (1 if m.tie_word_embeddings else 2) * (table_bytes(m, mesh) * c // 4)
    layer = 0
    for lt in _layer_types(m):
        gather = layer_weight_bytes(m, mesh, lt) + _gathered_layer(m, mesh, lt)
        layer = max(layer, prefill_bytes(m, W, lt, b, T, T) + gather)
    kept, _ = head_bytes(m, W, b, w.head_len)
    _, vc = vocab_layout(W.V, m.logits_vocab_chunk)
    head = kept + 3 * b * min(m.logits_seq_chunk, w.head_len) * vc * 4
    return int(param_bytes(m, mesh) + io + b * T * W.D * c + tables + max(layer, head))


def plan_config(cfg, mesh: dict, device: str, rows: int | None = None, *, on_pool: bool = False) -> Plan:
    """The plan of `cfg` on `mesh`; on_pool: of its rollouts on a rollout pool's `mesh` (workload_from_config)."""
    model = runtime_model(cfg)
    w = workload_from_config(cfg, mesh, model, rows, on_pool=on_pool)
    return plan(w, device_for(device, w.num_devices))


def process_rollout_peak(global_plan: Plan, local_plan: Plan) -> int:
    """Per-device bytes of the rollout phase on one of several jax.distributed processes, or in a rollout layout:
    the training state each device keeps (parameters and optimizer state, on the global mesh) + that process's
    rollout program on its own devices (`rollout_copy` + the sampler's caches or the engine's pool and programs).
    local_plan: the plan of workload.process_config on workload.rollout_axes."""
    return global_plan.item("parameters") + global_plan.item("optimizer state") + pool_rollout_peak(local_plan)


def pool_rollout_peak(local_plan: Plan) -> int:
    """Per-device bytes of a process's rollout program on its own devices, `local_plan` the plan of its share
    there: its own copy of the parameters (`rollout_copy`) + the sampler's caches or the engine's pool and
    programs. On a rollout pool (`rollout.devices`) that is the pool device's peak: it keeps no training state."""
    local_rollout = local_plan.rollout_peak - local_plan.item("optimizer state") - local_plan.item("parameters")
    local_rollout -= local_plan.item("engine parameters")
    return rollout_copy(local_plan) + local_rollout


def rollout_copy(local_plan: Plan) -> int:
    """Per-device bytes of a process's (or a rollout layout's) own copy of the parameters, of the plan of its
    rollout on its own devices: the static sampler's, its parameters as the training dtype holds them (the
    weight sync, distributed.rollout_params); the engine's, its copy with the matrices in the compute dtype
    (`memory.engine_param_bytes`)."""
    w = local_plan.workload
    if w.engine is not None:
        return engine_param_bytes(w.model, engine_mesh(w.mesh))
    return local_plan.item("parameters")
