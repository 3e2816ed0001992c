"""Coached On-Policy Self-Distillation, CSD (docs/reference/paper.md §4.2, Eq 8-11): the loss and the fused
teacher/student scoring pass. The coach of Eq 7 (prompts, notes, coach segments) is algorithms/coach.py.

Pieces, each named after what it computes:

* Eq 8 `csd_delta`, Eq 9 `csd_weights`, Eq 10 `csd_loss`, Eq 11 `combined_loss`.
* The scoring passes over a packed batch (algorithms/rl_batch.py):
  `fused_logprobs` -- ONE pass through the layers: the trunk (student sequences, with gradient) and one
  branch per coached turn (teacher: stop-gradient parameters, stop-gradient trunk K/V, positions continuing
  from the insertion point; see models/qwen3.hidden_states). The shared context is computed once; the
  branches carry no tangent, so they add no backward work and save no activations (tests/test_csd.py checks
  the backward jaxpr and the compiled FLOPs, with and without remat, scanned and unrolled layers).
  `naive_packed_logprobs` -- the reference: each coached turn's full teacher sequence as its own row through
  the plain forward (no gradient).
  The LM head and its log-softmax run only where a log-prob is used: at the hidden states that predict the
  agent tokens of the trunk (batch['head_idx']) and the coached agent tokens of the branches
  (batch['branch_head_idx']), gathered before `logprobs_from_hidden`. The positions are listed per head group:
  the rows one device holds in one micro-batch (`head_group`: rows / batch-sharding devices under the current
  mesh), flattened, so the head count (a fixed, bucketed count per row x the group's rows; rl_batch) follows the
  group's agent tokens, not its longest row's.
  Every log-prob is log_softmax(logits / temperature) (the sampling temperature; 1 by default).
* `score(config, params, trajectories)` -> per trajectory, per agent segment, (student, teacher) log-probs;
  `naive_score` computes the same one sequence at a time through `logprobs.token_logprobs` (tests, benchmarks).

Teacher and student score the SAME sampled tokens: agent token k of turn t is predicted by the student from
the trunk position before it (the last header token for k = 0) and by the teacher from the branch position
before it (coach_t + header_t + agent_t[:k] after the trunk prefix).
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mimesis_jax import sharding
from mimesis_jax.algorithms.logprobs import logprobs_from_hidden, token_logprobs
from mimesis_jax.algorithms.rl_batch import PackedRL, pack_trajectories, regroup_heads, unpack_turns
from mimesis_jax.models import hidden_states
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.data.trajectory import Trajectory


# ---------------------------------------------------------------------------------------- Eq 8-11
def csd_delta(teacher_logp: jax.Array, student_logp: jax.Array) -> jax.Array:
    """Eq 8: Delta = log pi_thetabar(y | c, H, h, y<k) - log pi_theta(y | c, H, y<k), both under stop-gradient."""
    return jax.lax.stop_gradient(teacher_logp) - jax.lax.stop_gradient(student_logp)


def csd_weights(delta: jax.Array, beta: float) -> jax.Array:
    """Eq 9: w = sg(sigmoid(beta * Delta)), beta > 0."""
    return jax.lax.stop_gradient(jax.nn.sigmoid(beta * delta))


def csd_loss(student_logp: jax.Array, w: jax.Array, weights: jax.Array) -> jax.Array:
    """Eq 10: L_CSD = -E_{(t,k) ~ C}[w log pi_theta(y_{t,k} | c, H_t, y_{t,<k})].

    `weights` = coached mask / |C| with |C| the number of coached tokens in the GLOBAL batch (rl_batch), so
    the sum over micro-batches and devices is the mean over C whatever the split.
    """
    return -jnp.sum(jnp.where(weights != 0, weights * w * student_logp, 0.0))


def combined_loss(grpo_loss: jax.Array, csd_loss_value: jax.Array, alpha: float) -> jax.Array:
    """Eq 11: L = L_GRPO + alpha * L_CSD, alpha >= 0."""
    return grpo_loss + alpha * csd_loss_value


# ------------------------------------------------------------------------------- scoring passes
def _token_aligned(lp: jax.Array) -> jax.Array:
    """[B, T-1] log-probs of tokens 1..T-1 -> [B, T] aligned with the tokens (entry 0 is 0)."""
    return jnp.pad(lp, ((0, 0), (1, 0)))


def _gather_teacher(src: jax.Array, batch) -> jax.Array:
    """Teacher log-prob of every trunk token from the teacher source array [B, X] via batch['teacher_src']."""
    return jnp.take_along_axis(src, batch["teacher_src"], axis=1)


def head_group(rows: int, config=None) -> int:
    """Rows per LM-head group of a [rows, ...] (micro-)batch under the current mesh: rows / (the ways the
    act_batch rule splits them), so one group is the rows one device holds (all rows without a mesh). The
    packer groups B / rows_multiple rows (rl_batch.head_arrays): the same with rows_multiple = micro-batches x
    batch-sharding devices."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return rows
    axes = sharding.logical_to_spec(("act_batch",), (rows,), dict(mesh.shape), config)[0]
    axes = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    split = int(np.prod([dict(mesh.shape)[a] for a in axes])) if axes else 1
    return rows // split


def _grouped(x: jax.Array, group: int) -> jax.Array:
    """[B, L, ...] -> [B / group, group x L, ...]: one head group's rows flattened (rows of a group sit on one
    device, so no data moves)."""
    return x.reshape((x.shape[0] // group, group * x.shape[1]) + x.shape[2:])


def _head_logprobs(config: ModelConfig, params, h: jax.Array, tokens: jax.Array, idx: jax.Array,
                   temperature, group: int = 1) -> jax.Array:
    """log p(token at idx | prefix) [B, K] from the hidden states [B, T, D] at idx - 1 only: the LM head and its
    log-softmax run on B x K gathered positions instead of B x T. idx [B, K] indexes each head group's flattened
    group x T positions (rl_batch.head_arrays; group = 1: one row each)."""
    B, K = idx.shape
    gi = _grouped(idx, group)
    hk = jnp.take_along_axis(_grouped(h, group), jnp.maximum(gi - 1, 0)[..., None], axis=1)
    lp = logprobs_from_hidden(config, params, hk, jnp.take_along_axis(_grouped(tokens, group), gi, axis=1),
                              temperature)
    return lp.reshape(B, K)


def _scatter_rows(lp: jax.Array, mask: jax.Array, group: int = 1) -> jax.Array:
    """[B, K] values of the mask's tokens in head-group order -> [B, T] token-aligned (0 off the mask). The k-th
    masked token of a group (its rows flattened) takes entry k of the group's flattened group x K values
    (cumulative count - 1): a gather, so its transpose is a scatter-add."""
    on = _grouped(mask, group) > 0
    vals = _grouped(lp, group)
    slot = jnp.clip(jnp.cumsum(on, axis=1, dtype=jnp.int32) - 1, 0, vals.shape[1] - 1)
    return jnp.where(on, jnp.take_along_axis(vals, slot, axis=1), 0.0).reshape(mask.shape)


def _student_from_hidden(config: ModelConfig, params, h: jax.Array, batch, temperature) -> jax.Array:
    toks = batch["tokens"]
    if "head_idx" in batch:
        g = head_group(toks.shape[0], config)
        return _scatter_rows(_head_logprobs(config, params, h, toks, batch["head_idx"], temperature, g),
                             batch["agent_mask"], g)
    # no head positions (a batch of trunk keys only): every position through the head
    return _token_aligned(logprobs_from_hidden(config, params, h[:, :-1], toks[:, 1:], temperature))


def student_logprobs(config: ModelConfig, params, batch, temperature: float = 1.0) -> jax.Array:
    """Student log-probs [B, T] (token-aligned, with gradient) from the trunk alone, log_softmax(logits / T).

    With batch['head_idx'] the head runs on the agent tokens only and other entries are 0; without it, on every
    position (the value at a non-agent token is then the log-prob of that token)."""
    h, _ = hidden_states(config, params, batch["tokens"], batch["positions"], batch["segment_ids"])
    return _student_from_hidden(config, params, h, batch, temperature)


def fused_logprobs(config: ModelConfig, params, batch, temperature: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """(student [B, T] with gradient, teacher [B, T] stop-gradient) from ONE trunk + branches pass.

    The teacher value is meaningful on coached agent tokens only (batch['coached_mask']); the LM head runs on the
    branch positions of batch['branch_head_idx'] (if present; else on every branch position).
    """
    toks = batch["tokens"]
    branch = {"tokens": batch["branch_tokens"], "positions": batch["branch_positions"],
              "branch_ids": batch["branch_ids"], "trunk_segment": batch["branch_trunk_segment"],
              "prefix_len": batch["branch_prefix_len"]}
    h, hb = hidden_states(config, params, toks, batch["positions"], batch["segment_ids"], branch)
    student = _student_from_hidden(config, params, h, batch, temperature)
    frozen = jax.lax.stop_gradient(params)
    hb, btoks = jax.lax.stop_gradient(hb), batch["branch_tokens"]
    if "branch_head_idx" in batch:
        g = head_group(toks.shape[0], config)
        teacher = _scatter_rows(_head_logprobs(config, frozen, hb, btoks, batch["branch_head_idx"], temperature, g),
                                batch["coached_mask"], g)
    else:
        src = _token_aligned(logprobs_from_hidden(config, frozen, hb[:, :-1], btoks[:, 1:], temperature))
        teacher = _gather_teacher(src, batch)
    return student, jax.lax.stop_gradient(teacher)


def naive_packed_logprobs(config: ModelConfig, params, batch, temperature: float = 1.0) -> jax.Array:
    """Reference teacher: every coached turn's full teacher sequence as its own row ([B, K, Tn]) through the
    plain forward with stop-gradient parameters; returns the token-aligned teacher log-probs [B, T]."""
    B, K, Tn = batch["naive_tokens"].shape
    flat = lambda a: a.reshape(B * K, Tn)  # noqa: E731
    frozen = jax.lax.stop_gradient(params)
    toks = flat(batch["naive_tokens"])
    h, _ = hidden_states(config, frozen, toks, flat(batch["naive_positions"]), flat(batch["naive_segment_ids"]))
    src = _token_aligned(logprobs_from_hidden(config, frozen, h[:, :-1], toks[:, 1:], temperature))
    return jax.lax.stop_gradient(_gather_teacher(src.reshape(B, K * Tn), batch))


def student_teacher_logprobs(config: ModelConfig, params, batch, teacher: str, temperature: float = 1.0):
    """(student, teacher-or-None) for a packed (micro-)batch; teacher in fused | naive | none; both at the
    sampling temperature T: log_softmax(logits / T)."""
    if teacher == "fused":
        return fused_logprobs(config, params, batch, temperature)
    student = student_logprobs(config, params, batch, temperature)
    if teacher == "naive":
        return student, naive_packed_logprobs(config, params, batch, temperature)
    if teacher == "none":
        return student, None
    raise ValueError(f"teacher must be fused | naive | none, got {teacher!r}")


@functools.partial(jax.jit, static_argnums=(0, 3))
def _score_jit(config, params, batch, teacher):
    s, t = student_teacher_logprobs(config, params, batch, teacher)
    return s, (s if t is None else t)


def score(config: ModelConfig, params, trajectories: Sequence[Trajectory], *, mesh=None, teacher: str = "fused",
          row_len: int | None = None, pad_multiple: int = 16) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Student and teacher log-probs of every agent token, from one fused pass (or the packed naive path).

    Returns, per trajectory, per agent segment (in order), a pair of float32 arrays (student_logp,
    teacher_logp) with one entry per agent token. A turn without a coach note has teacher = student.
    With a mesh, rows are split over its batch axes and parameters are used as they are placed.
    """
    packed = pack_trajectories(trajectories, teacher=teacher, use_rollout_logprobs=False, row_len=row_len,
                               rows_multiple=sharding.batch_shard_count(mesh, config), pad_multiple=pad_multiple)
    return score_packed(config, params, packed, mesh)


def score_packed(config: ModelConfig, params, packed: PackedRL, mesh=None):
    """`score` on an already packed batch (rows a multiple of sharding.batch_shard_count(mesh, config))."""
    arrays = {k: v for k, v in packed.arrays.items()}
    shards = sharding.batch_shard_count(mesh, config)
    if packed.num_rows % shards == 0 and packed.num_rows // shards != packed.head_group:
        arrays = regroup_heads(arrays, packed.num_rows // shards)  # packed for other head groups
    if mesh is None:
        s, t = _score_jit(config, params, arrays, packed.teacher)
    else:
        with sharding.use_mesh(mesh):
            s, t = _score_jit(config, params, sharding.shard_batch(arrays, mesh, config), packed.teacher)
    s, t = np.asarray(s), np.asarray(t)
    t = np.where(packed.arrays["coached_mask"] > 0, t, s)
    return [list(zip(a, b)) for a, b in zip(unpack_turns(packed, s), unpack_turns(packed, t))]


@functools.partial(jax.jit, static_argnums=0)
def _plain_logprobs(config, params, tokens):
    return token_logprobs(config, params, tokens)


def naive_score(config: ModelConfig, params, trajectories: Sequence[Trajectory], pad_multiple: int = 64):
    """Reference for `score`: every student sequence and every coached turn's full teacher sequence
    (Trajectory.teacher_sequence) as its own row through the plain forward (`token_logprobs`: no packing,
    no branches). Rows are right-padded to one length (causal attention: padding after a sequence cannot
    change its log-probs) so one compiled call serves all. Same return structure as `score`."""
    seqs: list[list[int]] = []
    plan = []  # per trajectory: per turn (student row, start, n, teacher row or None, teacher offset)
    for tr in trajectories:
        coach_of = tr.coach_for_turn()
        seqs.append(tr.student_tokens())
        srow = len(seqs) - 1
        pos, starts = 0, {}
        for i, s in enumerate(tr.segments):
            if s.kind != "coach":
                starts[i] = pos
                pos += len(s.tokens)
        turns = []
        for t, a in enumerate(tr.agent_indices()):
            n = len(tr.segments[a].tokens)
            if coach_of[t] is None:
                turns.append((srow, starts[a], n, None, 0))
                continue
            seq, off = tr.teacher_sequence(t)
            seqs.append(seq)
            turns.append((srow, starts[a], n, len(seqs) - 1, off))
        plan.append(turns)
    L = max(len(s) for s in seqs)
    L = int(np.ceil(L / pad_multiple) * pad_multiple)
    arr = np.zeros((len(seqs), L), np.int32)
    for i, s in enumerate(seqs):
        arr[i, :len(s)] = s
    lp = np.asarray(_plain_logprobs(config, params, jnp.asarray(arr)))  # [N, L-1]: entry j predicts token j+1
    out = []
    for turns in plan:
        row = []
        for srow, st, n, trow, off in turns:
            s = lp[srow, st - 1: st - 1 + n].astype(np.float32)
            t = s.copy() if trow is None else lp[trow, off - 1: off - 1 + n].astype(np.float32)
            row.append((s, t))
        out.append(row)
    return out
