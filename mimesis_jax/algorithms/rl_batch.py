"""Host-side (NumPy) packing of sampled dialogues into the fixed-shape arrays of the GRPO(+CSD) step.

A list of `rollout.trajectory.Trajectory` becomes one `PackedRL`:

* **trunk rows** [B, T]: the student sequences (every non-coach segment), one or more trajectories per row,
  each its own segment id (1, 2, ...; 0 = padding) with positions restarting at 0;
* per trunk token (aligned with the token, not with the position that predicts it):
  ``agent_mask`` (1 on sampled agent tokens: the only tokens trained on), ``coached_mask`` (agent tokens of a
  turn with a coach note: the set C of Eq 10), ``advantages`` (A_{i,t} of the token's turn), ``old_logp``
  (the sampler's log-prob, Segment.logprobs), ``grpo_weight`` (agent_mask with the GLOBAL GRPO normaliser
  folded in, see grpo.loss_token_weights), ``csd_weight`` (coached_mask / |C|, |C| = coached tokens in the
  global batch), ``teacher_src`` (where the teacher log-prob of this token sits in the teacher source array);
* **fused teacher branches** [B, Tb] (``teacher="fused"``): for every coached turn t of the row's trajectories
  the tokens coach_t + header_t + agent_t, ``branch_positions`` continuing from the trunk position of the
  header's first token (the insertion point), ``branch_ids`` (1, 2, ... per branch in the row; 0 = pad),
  ``branch_trunk_segment`` (the trunk segment id of its trajectory) and ``branch_prefix_len`` (the row index of
  the header's first token: the branch sees trunk keys before it). See models/attention.branch_mask.
  ``teacher_src`` then indexes the branch axis: the branch token that IS the agent token (its log-prob is
  predicted from the branch token before it).
* **naive teacher rows** [B, K, Tn] (``teacher="naive"``, the reference path): each coached turn's full
  teacher sequence (Trajectory.teacher_sequence) as its own row, K rows per trunk row; ``teacher_src``
  indexes the flattened [K * Tn] axis.

Shapes are bucketed (row length, branch length and row count rounded up on a geometric ladder, see `bucket`)
so the jitted step compiles once per bucket. All counts that normalise the loss are taken over the whole batch
here, before it is split into micro-batches or over devices.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from mimesis_jax.algorithms.grpo import LOSS_AGGS, loss_token_weights

TEACHER_MODES = ("fused", "naive", "none")
TRUNK_KEYS = ("tokens", "positions", "segment_ids")
TOKEN_KEYS = ("agent_mask", "coached_mask", "advantages", "old_logp", "grpo_weight", "csd_weight", "teacher_src")
BRANCH_KEYS = ("branch_tokens", "branch_positions", "branch_ids", "branch_trunk_segment", "branch_prefix_len")
NAIVE_KEYS = ("naive_tokens", "naive_positions", "naive_segment_ids")


@dataclasses.dataclass(frozen=True)
class TurnSlot:
    """Where agent turn t of a trajectory lives: trunk row, trunk index of its first token, length."""

    row: int
    start: int
    length: int
    coached: bool


@dataclasses.dataclass
class PackedRL:
    arrays: dict[str, np.ndarray]  # every array has the row axis first
    turns: list[list[TurnSlot]]  # per trajectory, per agent turn
    num_agent_tokens: int
    num_coached_tokens: int
    num_sequences: int
    teacher: str  # the teacher layout actually packed: fused | naive | none (none when nothing is coached)
    old_logp_from_rollout: bool

    @property
    def num_rows(self) -> int:
        return self.arrays["tokens"].shape[0]

    @property
    def teacher_tokens(self) -> int:
        """Tokens the teacher runs through the model: branch tokens (fused) or teacher-row tokens (naive)."""
        if self.teacher == "fused":
            return int((self.arrays["branch_ids"] != 0).sum())
        if self.teacher == "naive":
            return int((self.arrays["naive_segment_ids"] != 0).sum())
        return 0

    def microbatches(self, num_microbatches: int) -> dict[str, np.ndarray]:
        """Arrays reshaped to [M, B / M, ...] (rows in order) for gradient accumulation."""
        return split_microbatches(self.arrays, num_microbatches)


def split_microbatches(arrays: dict[str, np.ndarray], num_microbatches: int) -> dict[str, np.ndarray]:
    M = int(num_microbatches)
    B = next(iter(arrays.values())).shape[0]
    if M < 1 or B % M:
        raise ValueError(f"num_microbatches={M} must be >= 1 and divide the number of rows ({B})")
    return {k: v.reshape((M, B // M) + v.shape[1:]) for k, v in arrays.items()}


def bucket(n: int, multiple: int) -> int:
    """The smallest `multiple` x m >= n with m on the ladder 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (1 and 1.5 times
    powers of two): at most ~2 log2(range) distinct shapes, at most 1/3 padding beyond the multiple."""
    m = max(1, int(math.ceil(n / multiple)))
    if m <= 2:
        return m * multiple
    p = 1 << (m - 1).bit_length()  # the power of two >= m
    return (3 * p // 4 if 3 * p // 4 >= m else p) * multiple


# --------------------------------------------------------------------------------- per trajectory
@dataclasses.dataclass
class _Layout:
    tokens: list[int]
    turns: list[tuple[int, int, int | None, int]]  # (agent start, length, coach segment index, segment index)
    branches: list[tuple[list[int], int, int]]  # (coach+header+agent tokens, local prefix_len, agent offset)
    naive: list[tuple[list[int], int]]  # (teacher sequence, agent offset)
    logprobs: list[list[float] | None]


def _layout(tr, idx: int, teacher: str) -> _Layout:
    try:
        tr.validate()
        coach_of = tr.coach_for_turn()
    except ValueError as e:
        raise ValueError(f"trajectory {idx}: {e}") from None
    tokens: list[int] = []
    starts = {}
    for i, s in enumerate(tr.segments):
        if s.kind == "coach":
            if not s.tokens:
                raise ValueError(f"trajectory {idx}: coach segment {i} has no tokens")
            continue
        starts[i] = len(tokens)
        tokens.extend(s.tokens)
    turns, branches, naive, logprobs = [], [], [], []
    for t, a in enumerate(tr.agent_indices()):
        seg = tr.segments[a]
        if starts[a] == 0 and seg.tokens:
            raise ValueError(f"trajectory {idx}: agent segment {a} (turn {t}) starts the sequence; its first "
                             "token has no context to be predicted from")
        c = coach_of[t] if teacher != "none" else None
        turns.append((starts[a], len(seg.tokens), c, a))
        logprobs.append(seg.logprobs)
        if c is None:
            continue
        header = tr.segments[a - 1]
        if not header.tokens:
            raise ValueError(f"trajectory {idx}: the header segment {a - 1} of coached turn {t} is empty")
        coach = tr.segments[c].tokens
        if teacher == "fused":
            branches.append((coach + header.tokens + seg.tokens, starts[a - 1], len(coach) + len(header.tokens)))
        else:
            naive.append(tr.teacher_sequence(t))
    return _Layout(tokens, turns, branches, naive, logprobs)


# ------------------------------------------------------------------------------------------ packing
def pack_trajectories(trajectories: Sequence, advantages: Sequence[Sequence[float]] | None = None, *,
                      teacher: str = "fused", loss_agg: str = "token-mean", use_rollout_logprobs: bool = True,
                      row_len: int | None = None, branch_len: int | None = None, naive_len: int | None = None,
                      num_rows: int | None = None, rows_multiple: int = 1, pad_multiple: int = 64) -> PackedRL:
    """Packs trajectories (first-fit, longest first) into trunk rows, teacher branches and per-token arrays.

    advantages[i][t]: the advantage of agent turn t of trajectory i (grpo.trajectory_turn_advantages); None
    gives zeros (scoring only). use_rollout_logprobs: take old log-probs from Segment.logprobs (an agent
    segment without them is an error); False leaves zeros for the step to recompute.
    row_len / branch_len / naive_len / num_rows fix the shapes; None picks the `bucket` of the need (lengths on
    the pad_multiple ladder, rows on the rows_multiple ladder, rows_multiple = e.g. micro-batches x
    batch-sharding devices). In a training loop fix row_len (the context limit) and num_rows (the batch) so
    that only the branch length varies, over a handful of buckets.
    """
    if teacher not in TEACHER_MODES:
        raise ValueError(f"teacher must be one of {TEACHER_MODES}, got {teacher!r}")
    if loss_agg not in LOSS_AGGS:
        raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, got {loss_agg!r}")
    if not len(trajectories):
        raise ValueError("pack_trajectories: no trajectories")
    lays = [_layout(tr, i, teacher) for i, tr in enumerate(trajectories)]
    if advantages is not None:
        if len(advantages) != len(trajectories):
            raise ValueError(f"{len(advantages)} advantage lists for {len(trajectories)} trajectories")
        for i, (a, lay) in enumerate(zip(advantages, lays)):
            if len(a) != len(lay.turns):
                raise ValueError(f"trajectory {i}: {len(a)} turn advantages for {len(lay.turns)} agent turns")
    if use_rollout_logprobs:
        for i, lay in enumerate(lays):
            for (_, n, _, a), lp in zip(lay.turns, lay.logprobs):
                if lp is None and n:
                    raise ValueError(f"trajectory {i}: agent segment {a} has no rollout log-probs; set the "
                                     "step's old_logprobs='recompute' or record them in the sampler")
                if lp is not None and not np.all(np.isfinite(lp)):
                    raise ValueError(f"trajectory {i}: agent segment {a} has a non-finite rollout log-prob")
    need_T = max(len(l.tokens) for l in lays)
    T = bucket(need_T, pad_multiple) if row_len is None else int(row_len)
    blen = [sum(len(b[0]) for b in l.branches) for l in lays]
    Tb_cap = None if branch_len is None else int(branch_len)
    for i, lay in enumerate(lays):
        if len(lay.tokens) > T:
            raise ValueError(f"trajectory {i}: {len(lay.tokens)} tokens exceed row_len={T}")
        if Tb_cap is not None and blen[i] > Tb_cap:
            raise ValueError(f"trajectory {i}: its teacher branches need {blen[i]} tokens > branch_len={Tb_cap}")

    # first fit, longest first (stable): row -> list of trajectory indices
    order = sorted(range(len(lays)), key=lambda i: -len(lays[i].tokens))
    rows: list[list[int]] = []
    used_t: list[int] = []
    used_b: list[int] = []
    for i in order:
        for r in range(len(rows)):
            if used_t[r] + len(lays[i].tokens) <= T and (Tb_cap is None or used_b[r] + blen[i] <= Tb_cap):
                rows[r].append(i)
                used_t[r] += len(lays[i].tokens)
                used_b[r] += blen[i]
                break
        else:
            rows.append([i])
            used_t.append(len(lays[i].tokens))
            used_b.append(blen[i])
    B = bucket(len(rows), rows_multiple) if num_rows is None else int(num_rows)
    if B < len(rows) or B % rows_multiple:
        raise ValueError(f"num_rows={B}: the trajectories need {len(rows)} rows of {T} tokens and the row count "
                         f"must be a multiple of rows_multiple={rows_multiple}")
    any_coached = any(l.branches or l.naive for l in lays)
    mode = teacher if any_coached else "none"

    arr = {k: np.zeros((B, T), np.int32) for k in TRUNK_KEYS}
    for k in TOKEN_KEYS:
        arr[k] = np.zeros((B, T), np.int32 if k == "teacher_src" else np.float32)
    seq_ids = np.full((B, T), -1, np.int64)
    if mode == "fused":
        Tb = bucket(max(used_b), pad_multiple) if Tb_cap is None else Tb_cap
        for k in BRANCH_KEYS:
            arr[k] = np.zeros((B, Tb), np.int32)
    elif mode == "naive":
        K = max(sum(len(lays[i].naive) for i in row) for row in rows)
        need_n = max(len(s) for l in lays for s, _ in l.naive)
        Tn = bucket(need_n, pad_multiple) if naive_len is None else int(naive_len)
        if need_n > Tn:
            raise ValueError(f"a teacher sequence has {need_n} tokens > naive_len={Tn}")
        for k in NAIVE_KEYS:
            arr[k] = np.zeros((B, K, Tn), np.int32)

    slots: list[list[TurnSlot]] = [[] for _ in lays]
    for r, row in enumerate(rows):
        off, boff, nk, bid = 0, 0, 0, 0
        for sid, i in enumerate(row, start=1):
            lay = lays[i]
            L = len(lay.tokens)
            arr["tokens"][r, off:off + L] = lay.tokens
            arr["positions"][r, off:off + L] = np.arange(L)
            arr["segment_ids"][r, off:off + L] = sid
            adv = None if advantages is None else np.asarray(advantages[i], np.float64)
            bi = 0
            for t, (s, n, c, _) in enumerate(lay.turns):
                j = off + s
                arr["agent_mask"][r, j:j + n] = 1.0
                seq_ids[r, j:j + n] = i
                if adv is not None:
                    arr["advantages"][r, j:j + n] = adv[t]
                if lay.logprobs[t] is not None and use_rollout_logprobs:
                    arr["old_logp"][r, j:j + n] = lay.logprobs[t]
                coached = c is not None and mode != "none"
                slots[i].append(TurnSlot(r, j, n, coached))
                if not coached:
                    continue
                arr["coached_mask"][r, j:j + n] = 1.0
                if mode == "fused":
                    btoks, pre, aoff = lay.branches[bi]
                    nb = len(btoks)
                    bid += 1
                    sl = slice(boff, boff + nb)
                    arr["branch_tokens"][r, sl] = btoks
                    arr["branch_positions"][r, sl] = pre + np.arange(nb)  # positions restart per trajectory
                    arr["branch_ids"][r, sl] = bid
                    arr["branch_trunk_segment"][r, sl] = sid
                    arr["branch_prefix_len"][r, sl] = off + pre
                    arr["teacher_src"][r, j:j + n] = boff + aoff + np.arange(n)
                    boff += nb
                else:
                    seq, aoff = lay.naive[bi]
                    Tn = arr["naive_tokens"].shape[2]
                    arr["naive_tokens"][r, nk, :len(seq)] = seq
                    arr["naive_positions"][r, nk, :len(seq)] = np.arange(len(seq))
                    arr["naive_segment_ids"][r, nk, :len(seq)] = 1
                    arr["teacher_src"][r, j:j + n] = nk * Tn + aoff + np.arange(n)
                    nk += 1
                bi += 1
            off += L
    n_agent = int(arr["agent_mask"].sum())
    n_coached = int(arr["coached_mask"].sum())
    arr["grpo_weight"] = loss_token_weights(arr["agent_mask"], seq_ids, loss_agg)
    arr["csd_weight"] = (arr["coached_mask"] / n_coached if n_coached else arr["coached_mask"]).astype(np.float32)
    n_seq = len({i for i in range(len(lays)) if any(n for _, n, _, _ in lays[i].turns)})
    return PackedRL(arr, slots, n_agent, n_coached, n_seq, mode, bool(use_rollout_logprobs))


def unpack_turns(packed: PackedRL, per_token: np.ndarray) -> list[list[np.ndarray]]:
    """Per trajectory, per agent turn: the values of a [B, T] token-aligned array on that turn's tokens."""
    per_token = np.asarray(per_token)
    if per_token.shape != packed.arrays["tokens"].shape:
        per_token = per_token.reshape(packed.arrays["tokens"].shape)
    return [[per_token[s.row, s.start:s.start + s.length].astype(np.float32) for s in turns]
            for turns in packed.turns]
