"""Host-side (NumPy) packing of sampled dialogues into the fixed-shape arrays of the GRPO(+CSD) step.

A list of `data.trajectory.Trajectory` becomes one `PackedRL`:

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
* **LM-head positions** (the head and its log-softmax run only there, see csd.py), listed per head group: the
  G = B / rows_multiple consecutive rows one device holds in one micro-batch (rows_multiple = micro-batches x
  batch-sharding devices; G = 1 is one list per row), flattened (`head_arrays`). ``head_idx`` [B, Ka]: a group's
  G rows hold, flattened, r x T + t for every agent token of the group (r its row in the group, t its trunk
  index; group order = row order, exactly the ones of ``agent_mask``; its log-prob comes from the hidden state at
  index - 1); with fused branches ``branch_head_idx`` [B, Kc]: for the k-th coached token of the group (the ones
  of ``coached_mask``) r x Tb + its branch index (its ``teacher_src``). Ka and Kc stay counts per row (G x Ka
  entries per group). Entries past a group's count are 0 (index 0 of a row is never an agent token).

Rows (`_assign_rows`): first fit, longest trajectory first, gives the fewest rows; then the per-row teacher-branch,
agent and coached tokens are balanced over the rows by a multi-dimensional first fit under the smallest caps that
fit, because a branch is tied to its trunk row (it attends to its trajectory's trunk prefix), so the longest
per-row branch block sets the branch row length Tb. The rows are then ordered into head groups with even agent
tokens (`_group_rows`: longest processing time first), and the fullest group sets the head counts (its agent /
coached tokens over its G rows, rounded up). Shapes
are bucketed so that the jitted step compiles once per bucket: the trunk row length on the coarse `bucket`
ladder (usually fixed: the context limit), the row count, Tb and the head counts on finer ladders of their own
(`ROW_STEPS`, `BRANCH_STEPS`, `HEAD_STEPS`).

Shape ladders (`ShapeLadder`, what the RL learner packs with when rollout.row_len is fixed): instead of each
dimension on its own fine ladder (dozens of (rows, Ka, Tb, Kc) combinations, each a compilation of the step), a
short ladder derived from the config gives a known, bounded set of step programs (`ShapeLadder.programs`):
* rows: `ROW_RUNGS` fractions (1/2, 3/4, 1) of the most rows a mini-batch can need (one row per dialogue:
  mini_batch_prompts x group_size, per process), each rounded up to rows_multiple; `rollout.row_rungs` sets
  other multiples of it (e.g. (2.0,): one program of two rows per dialogue, for Stage I.3 runs whose multi-turn
  segments each near a whole row);
* head_idx: the row length, and with `rollout.head_rungs` also those fractions of it (rounded up to 64), per row
  of a head group: a mini-batch whose head groups' agent tokens fit G x a smaller head takes it, so the LM head
  runs on fewer padded positions;
* CSD (fused teacher): branch_tokens on `BRANCH_RUNGS` fractions (1/2, 1) of the longest branch block the config
  allows; branch_head_idx at `rollout.branch_head_rungs` fractions of each head rung (rounded up to 64; 1 always
  among them), capped at min(Tb, head): a row's coached tokens are some of its agent tokens and sit in its
  branches, and only the coached share of its turns fills the teacher's head; a mini-batch without a coached turn
  is packed in the fused layout with empty branches, so it reuses a CSD program.
GRPO: 3 programs x the head rungs, CSD: 3 x 2 x the head rungs x the branch-head rungs, less those the caps make
equal (1 rung of each by default: 3 and 6). Both RL stages pack this way (Stage I.3: GRPO programs, its segments the
trajectories). A mini-batch takes the cheapest program (trunk rows x 3 + branch tokens: the
forward and backward of the trunk, the forward of the branches; at equal cost the smaller head) whose shapes it
fits (`_ladder_rows`: `_first_fit` under the row caps, longest trunk first or fullest cap first, or for CSD with each
row also within head and branch_head; the rows ordered into head groups even against both heads, then checked
against G x head and G x branch_head). Padding is masked (zero masks and weights, segment and
branch id 0, head index 0), so the loss and gradients are the unpadded batch's. A mini-batch that fits no program
(a dialogue past the config's bounds) falls back to the fine ladders (`PackedRL.ladder_overflow`): one more
program, counted by the step's num_compilations.
All counts that normalise the loss are taken over the whole batch here, before it is split into micro-batches or
over devices.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from mimesis_jax.algorithms.grpo import loss_token_weights
from mimesis_jax.config.choices import LOSS_AGGS

TEACHER_MODES = ("fused", "naive", "none")
TRUNK_KEYS = ("tokens", "positions", "segment_ids")
TOKEN_KEYS = ("agent_mask", "coached_mask", "advantages", "old_logp", "grpo_weight", "csd_weight", "teacher_src")
BRANCH_KEYS = ("branch_tokens", "branch_positions", "branch_ids", "branch_trunk_segment", "branch_prefix_len")
NAIVE_KEYS = ("naive_tokens", "naive_positions", "naive_segment_ids")
HEAD_KEYS = ("head_idx", "branch_head_idx")  # [B, Ka] always; [B, Kc] with fused branches (per head group)
ROW_STEPS = 8  # `bucket` ladder steps per octave of the row count: at most 1/9 of the rows left empty
BRANCH_STEPS = 16  # ... of the branch row length: at most 1/17 padding from the ladder
HEAD_STEPS = 8  # ... of the LM-head counts (head_idx, branch_head_idx)
ROW_RUNGS = (1 / 2, 3 / 4, 1)  # `ShapeLadder` rows: fractions of the most rows a mini-batch can need
BRANCH_RUNGS = (1 / 2, 1)  # `ShapeLadder` CSD branch row length: fractions of the longest branch block
HEAD_RUNGS = (1,)  # `ShapeLadder` LM-head counts per row: fractions of the row length
BRANCH_HEAD_RUNGS = (1,)  # `ShapeLadder` branch-head counts per row: fractions of the head count
SHAPE_FIELDS = ("rows", "row_len", "head", "branch", "branch_head")  # a shape key: B, T, Ka, Tb, Kc (0: none)


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
    dropped_tail_tokens: int = 0  # trailing public tokens (after a trajectory's last agent token) past row_len
    ladder_overflow: bool = False  # packed with a ShapeLadder but fitting none of its programs (fine ladders)
    head_group: int = 1  # rows per LM-head group (`head_arrays`): rows / rows_multiple

    @property
    def shape_key(self) -> tuple[int, ...]:
        return shape_key(self.arrays)

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


def bucket(n: int, multiple: int, steps: int = 2) -> int:
    """The smallest `multiple` x m >= n with m on a geometric ladder of `steps` values per octave: every integer up
    to 2 x steps, then k x 2^e with steps <= k < 2 x steps. steps = 2: 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (1 and 1.5
    times powers of two; at most 1/3 padding beyond the multiple, ~2 log2(range) shapes); steps = 8: 1 .. 16, 18,
    20, .., 30, 32, 36, ... (at most 1/9 padding, ~8 log2(range) shapes)."""
    m = max(1, int(math.ceil(n / multiple)))
    if m <= 2 * steps:
        return m * multiple
    e = 0
    while steps << (e + 1) < m:
        e += 1
    return -(-m // (1 << e)) * (1 << e) * multiple


def shape_key(arrays: dict) -> tuple[int, ...]:
    """(rows, row_len, head, branch, branch_head) of a packed batch's host arrays ([B, ...]): B, T, Ka, Tb, Kc,
    0 for a layout it lacks (naive teacher rows: branch = K x Tn)."""
    B, T = arrays["tokens"].shape
    Ka = arrays["head_idx"].shape[1]
    if "branch_tokens" in arrays:
        return (B, T, Ka, arrays["branch_tokens"].shape[1], arrays["branch_head_idx"].shape[1])
    if "naive_tokens" in arrays:
        return (B, T, Ka, arrays["naive_tokens"].shape[1] * arrays["naive_tokens"].shape[2], 0)
    return (B, T, Ka, 0, 0)


def _round_up(n: int, multiple: int) -> int:
    return -(-int(n) // int(multiple)) * int(multiple)


@dataclasses.dataclass(frozen=True)
class ShapeLadder:
    """The fixed rungs a run's mini-batches are packed to (module docstring): row counts, LM-head counts and, with
    fused CSD branches, branch row lengths and branch-head counts: `branch_head` fractions of the head count
    (rounded up to pad_multiple), each capped at min(branch, head) (a row's coached tokens are some of its agent
    tokens and sit in its branches); () = (1,): branch_head = min(branch, head)."""

    row_len: int
    rows: tuple[int, ...]  # ascending
    branch: tuple[int, ...] = ()  # ascending; () = no teacher branches (GRPO)
    head: tuple[int, ...] = ()  # ascending LM-head counts per row; () = row_len only
    branch_head: tuple[float, ...] = ()  # fractions of the head count; () = (1,)
    pad_multiple: int = 64  # what the branch-head fractions round up to

    @property
    def fused(self) -> bool:
        return bool(self.branch)

    def key(self, rows: int, branch: int = 0, head: int = 0, branch_head: float = 1.0) -> tuple[int, ...]:
        """The program of `rows` rows, a `branch` branch row (0: GRPO), `head` LM-head positions per row (0: the
        row) and a branch head of the `branch_head` fraction of the head (capped at min(branch, head))."""
        T = self.row_len
        K = head or T
        if not branch:
            return (rows, T, K, 0, 0)
        Kc = min(branch, K, _round_up(max(1, math.ceil(branch_head * K)), self.pad_multiple))
        return (rows, T, K, branch, Kc)

    def cost(self, key: tuple[int, ...]) -> int:
        """Tokens through the model, weighted: the trunk's forward and backward (3 x), the branches' forward."""
        return key[0] * (3 * key[1] + key[3])

    def programs(self) -> list[tuple[int, ...]]:
        """Every step program's shape key, cheapest first (the order a mini-batch tries them in; at equal cost the
        smaller head first)."""
        keys = {self.key(B, Tb, K, f) for B in self.rows for Tb in (self.branch or (0,))
                for K in (self.head or (self.row_len,)) for f in (self.branch_head or (1.0,))}
        return sorted(keys, key=lambda k: (self.cost(k), k))

    def fit(self, sizes: np.ndarray, rows_multiple: int = 1) -> tuple[int, ...] | None:
        """The cheapest program whose shapes the trajectories fit: sizes [D, N] as `_assign_rows` takes them
        (trunk, then branch / agent / coached tokens with branches, else agent tokens). None: no program fits."""
        found = self._fit(sizes, rows_multiple)
        return None if found is None else found[0]

    def _fit(self, sizes: np.ndarray, rows_multiple: int) -> tuple[tuple[int, ...], list[list[int]]] | None:
        """(the cheapest fitting program, its rows in head-group order: `_ladder_rows`) or None."""
        for k in self.programs():
            if k[0] % rows_multiple:
                continue
            rows = _ladder_rows(sizes, k, self.fused, k[0] // rows_multiple)
            if rows is not None:
                return k, rows
        return None


def _ladder_caps(key: tuple[int, ...], fused: bool) -> list[int]:
    """Per-row caps of a program (trunk, then branch / agent / coached tokens, or agent tokens): a row's agent
    (coached) tokens are bounded by its head group's G x head (G x branch_head) positions, checked per group."""
    B, T, Ka, Tb, Kc = key
    return [T, Tb, T, Tb] if fused else [T, T]


def _group_rows(loads: np.ndarray, group: int, caps: Sequence[int] | None = None) -> list[int]:
    """Row order that puts `group` consecutive rows in each head group with even loads: longest processing time
    first (rows by decreasing load, each to the group with room whose load after it is smallest). loads [B] (one
    load, e.g. agent tokens) or [D, B] with caps [D] (e.g. agent and coached tokens against the program's head and
    branch head): the load of a row or group is then its largest fraction of the caps. Returns the row indices in
    their new order (group 0's rows, then group 1's, ...)."""
    w = np.atleast_2d(np.asarray(loads, np.float64))
    if caps is not None:
        w = w / np.maximum(np.asarray(caps, np.float64), 1)[:, None]
    B = w.shape[1]
    if group <= 1 or group >= B:
        return list(range(B))
    n = B // group
    members: list[list[int]] = [[] for _ in range(n)]
    sums = np.zeros((n, len(w)), np.float64)
    full = np.zeros(n, bool)
    for r in np.argsort(-w.max(0), kind="stable"):
        g = int(np.argmin(np.where(full, np.inf, (sums + w[:, r]).max(1))))  # ties: the first group
        members[g].append(int(r))
        sums[g] += w[:, r]
        full[g] = len(members[g]) >= group
    return [r for m in members for r in m]


def _group_need(sizes: np.ndarray, rows: list[list[int]], group: int) -> tuple[int, int]:
    """The most agent and coached tokens (0 without a coached dimension) of one head group of `group`
    consecutive rows."""
    loads = np.array([[int(sizes[d, r].sum()) for r in rows] for d in range(1, len(sizes))], np.int64)
    agent = loads[-2] if len(sizes) == 4 else loads[-1]
    coached = loads[-1] if len(sizes) == 4 else np.zeros_like(agent)
    g = max(1, group)
    return int(agent.reshape(-1, g).sum(1).max()), int(coached.reshape(-1, g).sum(1).max())


def _order_rows(sizes: np.ndarray, rows: list[list[int]], B: int, group: int,
                heads: Sequence[int] | None = None) -> list[list[int]]:
    """rows padded to B (empty rows last) and ordered into head groups of `group` rows (`_group_rows`) with even
    agent tokens, or with heads = (head, branch_head) of a fused program, even fractions of both."""
    rows = [list(r) for r in rows] + [[] for _ in range(B - len(rows))]
    if heads is not None and len(sizes) == 4:
        loads = np.array([[int(sizes[d][r].sum()) for r in rows] for d in (2, 3)], np.int64)
        order = _group_rows(loads, group, heads)
    else:
        agent = sizes[-2] if len(sizes) == 4 else sizes[-1]
        order = _group_rows(np.array([int(agent[r].sum()) for r in rows], np.int64), group)
    return [rows[i] for i in order]


def _ladder_rows(sizes: np.ndarray, key: tuple[int, ...], fused: bool, group: int) -> list[list[int]] | None:
    """Rows of one ladder program, or None if the trajectories do not fit it: a first fit into at most B rows
    under the row caps (longest trunk first, else the items filling most of some cap first, else with fused
    branches the items filling most of a row's share of the heads, each row within head and branch_head), ordered
    into head groups (`_order_rows`, even against both heads) whose agent (coached) tokens fit group x head
    (group x branch_head)."""
    caps = np.array(_ladder_caps(key, fused), np.int64)
    if np.any(sizes.max(1) > caps):
        return None
    heads = (key[2], key[4]) if fused else (key[2],)
    if any(int(x.sum()) > key[0] * h for x, h in zip(sizes[2:] if fused else sizes[1:], heads)):
        return None  # more agent (coached) tokens than all the rows' head (branch head) positions
    tight = np.max(sizes / np.maximum(caps, 1)[:, None], axis=0)
    tries = [(sizes[0], caps), (tight, caps)]
    if fused:  # each row within the heads too: the groups then fit whatever their order
        within = np.array([key[1], key[3], key[2], key[4]], np.int64)
        tries.append((np.max(sizes / np.maximum(within, 1)[:, None], axis=0), within))
    for o, c in tries:
        rows = _first_fit(np.argsort(-o, kind="stable"), sizes, c, max_rows=key[0])
        if rows is None:
            continue
        rows = _order_rows(sizes, rows, key[0], group, (key[2], key[4]) if fused else None)
        agent, coached = _group_need(sizes, rows, group)
        if agent <= group * key[2] and coached <= group * (key[4] if fused else 0):
            return rows
    return None


def shape_ladder(row_len: int, max_rows: int, rows_multiple: int = 1, branch_max: int = 0,
                 pad_multiple: int = 64, row_rungs: Sequence[float] = ROW_RUNGS,
                 head_rungs: Sequence[float] = HEAD_RUNGS,
                 branch_head_rungs: Sequence[float] = BRANCH_HEAD_RUNGS) -> ShapeLadder:
    """The ladder of a run: rows at `row_rungs` (default `ROW_RUNGS`) of max_rows (the most rows a mini-batch
    can need: one per dialogue), rounded up to rows_multiple; LM-head counts at `head_rungs` (default
    `HEAD_RUNGS`) of row_len, rounded up to pad_multiple, row_len always among them; with branch_max > 0 (the
    longest CSD branch block of one dialogue) branch rungs at `BRANCH_RUNGS` of it, rounded up to pad_multiple, and
    branch-head counts at `branch_head_rungs` (default `BRANCH_HEAD_RUNGS`) of each head count (`ShapeLadder`)."""
    if row_len < 1 or max_rows < 1 or rows_multiple < 1:
        raise ValueError(f"shape_ladder: row_len={row_len}, max_rows={max_rows}, rows_multiple={rows_multiple} "
                         "must be >= 1")
    rows = tuple(sorted({_round_up(max(1, math.ceil(f * max_rows)), rows_multiple) for f in row_rungs}))
    head = tuple(sorted({min(int(row_len), _round_up(max(1, math.ceil(f * row_len)), pad_multiple))
                         for f in head_rungs} | {int(row_len)}))
    branch = ()
    if branch_max > 0:
        branch = tuple(sorted({_round_up(max(1, math.ceil(f * branch_max)), pad_multiple) for f in BRANCH_RUNGS}))
    bh = tuple(sorted({float(f) for f in branch_head_rungs} | {1.0})) if branch else ()
    return ShapeLadder(int(row_len), rows, branch, head if len(head) > 1 else (), bh if len(bh) > 1 else (),
                       int(pad_multiple))


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
def _first_fit(order, sizes: np.ndarray, caps, max_rows: int | None = None) -> list[list[int]] | None:
    """First fit of the items in `order` into rows; sizes [dims, items], caps [dims]. None if more than
    max_rows rows would be needed."""
    caps = np.asarray(caps, np.int64)
    used = np.zeros((0, len(caps)), np.int64)
    rows: list[list[int]] = []
    for i in order:
        s = sizes[:, i]
        fits = np.flatnonzero(np.all(used + s <= caps, axis=1))
        if len(fits):
            rows[fits[0]].append(i)
            used[fits[0]] += s
        elif max_rows is not None and len(rows) >= max_rows:
            return None
        else:
            rows.append([i])
            used = np.vstack([used, s[None]])
    return rows


def _assign_rows(sizes: np.ndarray, caps: Sequence[int | None], num_rows: int | None,
                 rows_multiple: int) -> tuple[list[list[int]], int]:
    """Trajectories -> rows (lists of trajectory indices) and the row count B.

    sizes [D, N]: per trajectory its trunk tokens (dimension 0) and the per-row loads to balance (fused: branch
    tokens, agent tokens, coached tokens; else agent tokens); caps [D]: the row length, then fixed caps or None.
    1. First fit, longest trunk first: the fewest rows, R (with num_rows given and more rows needed, the items
       filling most of some cap first, as `ShapeLadder.fit` tries).
    2. B = num_rows, else R on the `ROW_STEPS` ladder of rows_multiple.
    3. Balance the loads over the B rows: caps = s x (the per-row mean of each load), s growing from 1 (or the
       largest item) by 1/128 steps, until a first fit (items by decreasing max over dimensions of size / cap)
       fits in B rows. The longest per-row load sets the branch row length and the head counts, so this is
       what keeps their padding low. Falls back to step 1's rows once the caps reach step 1's loads.
    """
    big = np.iinfo(np.int64).max // 4
    fixed = np.array([big if c is None else int(c) for c in caps], np.int64)
    base = _first_fit(np.argsort(-sizes[0], kind="stable"), sizes, fixed)
    if num_rows is not None and len(base) > num_rows:  # the fullest-cap-first order `ShapeLadder.fit` also tries
        tight = np.max(sizes / np.maximum(fixed, 1)[:, None], axis=0)
        base = _first_fit(np.argsort(-tight, kind="stable"), sizes, fixed, max_rows=int(num_rows)) or base
    B = bucket(len(base), rows_multiple, ROW_STEPS) if num_rows is None else int(num_rows)
    if B < len(base) or B % rows_multiple:
        raise ValueError(f"num_rows={B}: the trajectories need {len(base)} rows of {caps[0]} tokens and the row "
                         f"count must be a multiple of rows_multiple={rows_multiple}")
    loads = sizes[1:]
    mean = loads.sum(1) / B
    on = mean > 0
    if not on.any():
        return base, B
    hi = np.array([max(int(load[r].sum()) for r in base) for load in loads])  # step 1's loads
    scale = max(1.0, float((loads.max(1)[on] / mean[on]).max()))
    while True:
        cap = np.minimum(np.where(on, np.ceil(scale * mean), big), fixed[1:]).astype(np.int64)
        if np.all(cap >= hi):
            return base, B
        key = np.max(sizes / np.concatenate([fixed[:1], np.maximum(cap, 1)])[:, None], axis=0)
        rows = _first_fit(np.argsort(-key, kind="stable"), sizes, np.concatenate([fixed[:1], cap]), max_rows=B)
        if rows is not None:
            return rows, B
        scale *= 1 + 1 / 128


def _choose_shapes(sizes: np.ndarray, caps: list, *, fused: bool, ladder: ShapeLadder | None, num_rows, head_len,
                   branch_len, branch_head_len, rows_multiple: int, pad_multiple: int):
    """Rows and the shape key (B, T, Ka, Tb, Kc; Tb = Kc = 0 without fused branches) of one batch from its
    per-trajectory sizes (as `_assign_rows` takes them): a ladder's cheapest fitting program (`ShapeLadder.fit`),
    or the needs on the fine ladders (None arguments) / the fixed shapes given (`_assign_rows`). The rows come in
    head-group order (`_order_rows`: B / rows_multiple consecutive rows per group); the head counts are per row,
    a group's agent (coached) tokens over its rows rounded up. Returns (rows, key, ladder overflow)."""
    T = int(caps[0])
    if ladder is not None:
        found = ladder._fit(sizes, rows_multiple)
        if found is not None:
            return found[1], found[0], False
    rows, B = _assign_rows(sizes, caps, num_rows, rows_multiple)
    group = B // rows_multiple
    rows = _order_rows(sizes, rows, B, group)
    need = [max(int(x[r].sum()) for r in rows) for x in sizes]  # the longest per-row trunk and loads
    agent, coached = _group_need(sizes, rows, group)

    def head_count(need: int, fixed: int | None, cap: int) -> int:
        return min(bucket(need, pad_multiple, HEAD_STEPS), cap) if fixed is None else int(fixed)

    Ka = head_count(-(-agent // group), head_len, T)
    Tb = Kc = 0
    if fused:
        Tb = bucket(need[1], pad_multiple, BRANCH_STEPS) if branch_len is None else int(branch_len)
        Kc = head_count(-(-coached // group), branch_head_len, Tb)
    return rows, (B, T, Ka, Tb, Kc), ladder is not None


def ladder_shape_key(sizes: np.ndarray, ladder: ShapeLadder, rows_multiple: int = 1) -> tuple[tuple[int, ...], bool]:
    """(shape key, overflow) that `pack_trajectories(..., ladder=ladder)` gives trajectories of these sizes
    ([4, N] trunk / branch / agent / coached tokens with a fused ladder, else [2, N] trunk / agent tokens),
    without building any array: what the loop's packing picks, for counting programs over many mini-batches."""
    sizes = np.asarray(sizes, np.int64)
    key = ladder.fit(sizes, rows_multiple)
    if key is not None:  # a fitting program fixes every shape
        return key, False
    caps = [ladder.row_len] + [None] * (len(sizes) - 1)
    _, key, overflow = _choose_shapes(sizes, caps, fused=ladder.fused, ladder=ladder, num_rows=None, head_len=None,
                                      branch_len=None, branch_head_len=None, rows_multiple=rows_multiple,
                                      pad_multiple=64)
    return key, overflow


def pack_trajectories(trajectories: Sequence, advantages: Sequence[Sequence[float]] | None = None, *,
                      teacher: str = "fused", loss_agg: str = "token-mean", use_rollout_logprobs: bool = True,
                      row_len: int | None = None, branch_len: int | None = None, naive_len: int | None = None,
                      num_rows: int | None = None, head_len: int | None = None,
                      branch_head_len: int | None = None, rows_multiple: int = 1,
                      pad_multiple: int = 64, ladder: ShapeLadder | None = None) -> PackedRL:
    """Packs trajectories into trunk rows, teacher branches, LM-head index arrays and per-token arrays.

    advantages[i][t]: the advantage of agent turn t of trajectory i (grpo.trajectory_turn_advantages); None
    gives zeros (scoring only). use_rollout_logprobs: take old log-probs from Segment.logprobs (an agent
    segment without them is an error); False leaves zeros for the step to recompute.
    Rows: see `_assign_rows` (first fit by length, then the teacher-branch load balanced over the rows).
    A trajectory longer than row_len keeps its first row_len tokens when its last agent token ends within them
    (the dropped trailing public tokens carry no loss and are counted in `dropped_tail_tokens`); else it is an
    error. row_len / branch_len / naive_len / num_rows / head_len / branch_head_len fix the shapes; None picks the need
    on a ladder (row_len: `bucket` of the longest trajectory; branch_len: the longest per-row need on the
    `BRANCH_STEPS` ladder of pad_multiple; the head counts: the fullest head group's tokens per row on the
    `HEAD_STEPS` ladder, capped at the row lengths; num_rows: the `ROW_STEPS` ladder of rows_multiple, e.g.
    micro-batches x batch-sharding devices, which also sets the head groups: num_rows / rows_multiple rows
    each, see the module docstring; a fixed head_len still bounds each row's agent tokens). In a
    training loop fix row_len (the context limit); the other shapes then vary over a handful of values each
    (fix them too for exactly one compiled step: a batch that does not fit is an error).
    ladder: pack to the cheapest of its programs the batch fits (module docstring; row_len is the ladder's, the
    other shape arguments must be None; a fused ladder packs the fused layout even without a coached turn).
    """
    if teacher not in TEACHER_MODES:
        raise ValueError(f"teacher must be one of {TEACHER_MODES}, got {teacher!r}")
    if loss_agg not in LOSS_AGGS:
        raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, got {loss_agg!r}")
    if not len(trajectories):
        raise ValueError("pack_trajectories: no trajectories")
    if ladder is not None:
        fixed = dict(branch_len=branch_len, naive_len=naive_len, num_rows=num_rows, head_len=head_len,
                     branch_head_len=branch_head_len)
        given = [k for k, v in fixed.items() if v is not None]
        if given or row_len not in (None, ladder.row_len):
            raise ValueError(f"pack_trajectories: ladder sets the shapes; got {given or ['row_len']} too")
        if ladder.fused != (teacher == "fused"):
            raise ValueError(f"pack_trajectories: a {'fused' if ladder.fused else 'GRPO'} ladder with "
                             f"teacher={teacher!r}")
        row_len = ladder.row_len
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
    trunk = np.array([len(l.tokens) for l in lays], np.int64)
    T = bucket(int(trunk.max()), pad_multiple) if row_len is None else int(row_len)
    blen = np.array([sum(len(b[0]) for b in l.branches) for l in lays], np.int64)
    n_agent_tr = np.array([sum(n for _, n, _, _ in l.turns) for l in lays], np.int64)
    n_coached_tr = np.array([sum(n for _, n, c, _ in l.turns if c is not None) for l in lays], np.int64)
    Tb_cap = None if branch_len is None else int(branch_len)
    dropped_tail = 0
    for i, lay in enumerate(lays):
        if trunk[i] > T:  # the tokens after the last agent token carry no loss (causal): drop what passes T
            end = max([s + n for s, n, _, _ in lay.turns if n] or [0])
            if end > T:
                raise ValueError(f"trajectory {i}: {trunk[i]} tokens exceed row_len={T} (its last agent token "
                                 f"ends at {end}; only tokens after it can be dropped)")
            dropped_tail += int(trunk[i]) - T
            lay.tokens = lay.tokens[:T]
            trunk[i] = T
        if Tb_cap is not None and blen[i] > Tb_cap:
            raise ValueError(f"trajectory {i}: its teacher branches need {blen[i]} tokens > branch_len={Tb_cap}")
        if head_len is not None and n_agent_tr[i] > head_len:
            raise ValueError(f"trajectory {i}: {n_agent_tr[i]} agent tokens > head_len={head_len}")
        if branch_head_len is not None and n_coached_tr[i] > branch_head_len:
            raise ValueError(f"trajectory {i}: {n_coached_tr[i]} coached tokens > branch_head_len={branch_head_len}")
    any_coached = any(l.branches or l.naive for l in lays)
    mode = teacher if any_coached or (ladder is not None and ladder.fused) else "none"
    fused = mode == "fused"
    if fused:  # balanced per row: branch tokens (-> Tb), agent tokens (-> Ka), coached tokens (-> Kc)
        sizes, caps = np.stack([trunk, blen, n_agent_tr, n_coached_tr]), [T, Tb_cap, head_len, branch_head_len]
    else:
        sizes, caps = np.stack([trunk, n_agent_tr]), [T, head_len]
    rows, (B, _, Ka, Tb, Kc), overflow = _choose_shapes(
        sizes, caps, fused=fused, ladder=ladder, num_rows=num_rows, head_len=head_len, branch_len=Tb_cap,
        branch_head_len=branch_head_len, rows_multiple=rows_multiple, pad_multiple=pad_multiple)

    arr = {k: np.zeros((B, T), np.int32) for k in TRUNK_KEYS}
    for k in TOKEN_KEYS:
        arr[k] = np.zeros((B, T), np.int32 if k == "teacher_src" else np.float32)
    arr["head_idx"] = np.zeros((B, Ka), np.int32)
    seq_ids = np.full((B, T), -1, np.int64)
    if fused:
        for k in BRANCH_KEYS:
            arr[k] = np.zeros((B, Tb), np.int32)
        arr["branch_head_idx"] = np.zeros((B, Kc), np.int32)
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
    group = B // rows_multiple
    arr.update(head_arrays(arr, group, Ka, Kc if fused else None))
    n_agent = int(arr["agent_mask"].sum())
    n_coached = int(arr["coached_mask"].sum())
    arr["grpo_weight"] = loss_token_weights(arr["agent_mask"], seq_ids, loss_agg)
    arr["csd_weight"] = (arr["coached_mask"] / n_coached if n_coached else arr["coached_mask"]).astype(np.float32)
    n_seq = len({i for i in range(len(lays)) if any(n for _, n, _, _ in lays[i].turns)})
    return PackedRL(arr, slots, n_agent, n_coached, n_seq, mode, bool(use_rollout_logprobs), dropped_tail,
                    overflow, group)


def head_arrays(arrays: dict, group: int, head: int, branch_head: int | None = None) -> dict[str, np.ndarray]:
    """The LM-head index arrays of packed host arrays ([B, ...]) for head groups of `group` consecutive rows:
    head_idx [B, head], whose `group` rows [g x group, (g + 1) x group) hold, flattened, the agent tokens of those
    rows in order as r x T + t (r the row within the group, t the trunk index; 0 = padding: index 0 of a row is
    never an agent token), and with branch_head, branch_head_idx [B, branch_head]: the group's coached tokens in
    the same order as r x Tb + (the token's teacher_src). group = 1 is one list per row. A ValueError when a
    group's tokens exceed its group x head (group x branch_head) entries."""
    mask = arrays["agent_mask"]
    B, T = mask.shape
    if group < 1 or B % group:
        raise ValueError(f"head group of {group} rows must be >= 1 and divide the {B} rows")
    n = B // group
    out = {}
    specs = [("head_idx", "agent_mask", head, None)]
    if branch_head is not None:
        specs.append(("branch_head_idx", "coached_mask", branch_head, arrays["branch_tokens"].shape[1]))
    for key, mk, width, Tb in specs:
        idx = np.zeros((n, group * int(width)), np.int32)
        flat = arrays[mk].reshape(n, group * T)
        for g in range(n):
            on = np.flatnonzero(flat[g])
            if len(on) > idx.shape[1]:
                raise ValueError(f"{key}: head group {g} has {len(on)} tokens > {group} rows x {width}")
            if Tb is not None:  # coached token (r, t) -> its branch index in the group: r x Tb + teacher_src
                on = (on // T) * Tb + arrays["teacher_src"].reshape(n, group * T)[g, on]
            idx[g, :len(on)] = on
        out[key] = idx.reshape(B, int(width))
    return out


def regroup_heads(arrays: dict, group: int) -> dict[str, np.ndarray]:
    """Packed host arrays ([B, ...]) with their LM-head index arrays rebuilt for head groups of `group` rows
    (`head_arrays`), each as wide as before or as a group's tokens need if more: for a consumer whose groups
    differ from the packer's (packed with another rows_multiple)."""
    B = arrays["agent_mask"].shape[0]
    if group < 1 or B % group:
        raise ValueError(f"head group of {group} rows must be >= 1 and divide the {B} rows")

    def width(key, mask):
        need = int(mask.reshape(B // group, -1).sum(1).max()) if mask.size else 0
        return max(arrays[key].shape[1], -(-need // group))
    fused = "branch_head_idx" in arrays
    return dict(arrays, **head_arrays(arrays, group, width("head_idx", arrays["agent_mask"]),
                                      width("branch_head_idx", arrays["coached_mask"]) if fused else None))


def unpack_turns(packed: PackedRL, per_token: np.ndarray) -> list[list[np.ndarray]]:
    """Per trajectory, per agent turn: the values of a [B, T] token-aligned array on that turn's tokens."""
    per_token = np.asarray(per_token)
    if per_token.shape != packed.arrays["tokens"].shape:
        per_token = per_token.reshape(packed.arrays["tokens"].shape)
    return [[per_token[s.row, s.start:s.start + s.length].astype(np.float32) for s in turns]
            for turns in packed.turns]


# ------------------------------------------------------------------------- multi-process assembly
# One PPO mini-batch on P processes: every process packs its own trajectories (whole GRPO groups), the shapes and
# the loss normalisers are agreed on (`layout_info` of every process -> `common_layout`: on a ShapeLadder, the
# cheapest of its programs holding every process's shapes), and `conform` pads the local arrays to the common
# shapes and re-folds the GLOBAL normalisers into the token weights. The global batch is then process 0's rows,
# process 1's rows, ... (per micro-batch): its loss is the one of packing all trajectories together, only the row
# layout (and so the fp32 summation order) differs.
_MODE_CODE = {"none": 0, "fused": 1, "naive": 2}


def layout_info(packed: PackedRL | None) -> dict:
    """This process's shapes and normaliser counts for one mini-batch (JSON-ready); None = no trajectories here."""
    if packed is None:
        return {"rows": 0, "mode": 0, "n_agent": 0, "n_coached": 0, "n_seq": 0}
    a = packed.arrays
    info = {"rows": packed.num_rows, "mode": _MODE_CODE[packed.teacher], "n_agent": packed.num_agent_tokens,
            "n_coached": packed.num_coached_tokens, "n_seq": packed.num_sequences,
            "T": int(a["tokens"].shape[1]), "Ka": int(a["head_idx"].shape[1])}
    if packed.teacher == "fused":
        info.update(Tb=int(a["branch_tokens"].shape[1]), Kc=int(a["branch_head_idx"].shape[1]))
    elif packed.teacher == "naive":
        info.update(K=int(a["naive_tokens"].shape[1]), Tn=int(a["naive_tokens"].shape[2]))
    return info


def common_layout(infos: Sequence[dict], rows_multiple: int = 1, ladder: ShapeLadder | None = None) -> dict:
    """The shapes every process pads to (the largest of each; rows at least `rows_multiple`), the teacher layout
    and the global counts (sums) that normalise the loss. Fused and naive teachers cannot mix (one config).
    ladder (the one the processes packed with): the largest shapes are raised to the cheapest of its programs that
    holds them all, so the step compiles only programs the plan lists (the field-wise largest of two programs,
    e.g. one's head and the other's branch head, need not be one); none holds them (a process's batch past the
    ladder, `PackedRL.ladder_overflow`): the largest shapes."""
    modes = {i["mode"] for i in infos} - {0}
    if len(modes) > 1:
        raise ValueError(f"processes packed different teacher layouts {sorted(modes)}")
    if not any(i["rows"] for i in infos):
        raise ValueError("common_layout: no process has trajectories in this mini-batch")
    out = {"mode": next(iter(modes), 0), "rows": max(max(i["rows"] for i in infos), int(rows_multiple)),
           "groups": int(rows_multiple)}
    for k in ("T", "Ka", "Tb", "Kc", "K", "Tn"):
        vals = [i[k] for i in infos if k in i]
        if vals:
            out[k] = max(vals)
    for k in ("n_agent", "n_coached", "n_seq"):
        out[k] = sum(int(i[k]) for i in infos)
    if ladder is not None and out["mode"] == _MODE_CODE["fused" if ladder.fused else "none"]:
        need = (out["rows"], out["T"], out["Ka"], out.get("Tb", 0), out.get("Kc", 0))
        for k in ladder.programs():
            if k[1] == need[1] and k[0] % max(1, int(rows_multiple)) == 0 and all(a >= b for a, b in zip(k, need)):
                out.update(rows=k[0], Ka=k[2], **({"Tb": k[3], "Kc": k[4]} if ladder.fused else {}))
                break
    return out


def _pad_to(x: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    if tuple(x.shape) == tuple(shape):
        return x
    if any(s < n for s, n in zip(shape, x.shape)):
        raise ValueError(f"cannot pad an array of shape {x.shape} to {tuple(shape)}")
    return np.pad(x, [(0, s - n) for s, n in zip(shape, x.shape)])


def conform(packed: PackedRL | None, layout: dict, loss_agg: str = "token-mean") -> dict[str, np.ndarray]:
    """This process's rows of one mini-batch in the common `layout`: every array padded with zeros (padding rows
    and columns carry no loss: zero masks, segment id 0, head index 0), a layout this process lacks (no coached
    turn here, or no trajectory at all) filled with zeros, and the loss weights re-normalised by the global
    counts: grpo_weight = agent_mask / (agent tokens of all processes) for token-mean (x local / global sequences
    for seq-mean), csd_weight = coached_mask / (coached tokens of all processes) -- Eq 6 and Eq 10's normalisers
    are those of the whole mini-batch, whatever process holds a token."""
    mode = {v: k for k, v in _MODE_CODE.items()}[layout["mode"]]
    B, T = layout["rows"], layout["T"]
    shapes = {k: (B, T) for k in TRUNK_KEYS + TOKEN_KEYS}
    shapes["head_idx"] = (B, layout["Ka"])
    if mode == "fused":
        shapes.update({k: (B, layout["Tb"]) for k in BRANCH_KEYS})
        shapes["branch_head_idx"] = (B, layout["Kc"])
    elif mode == "naive":
        shapes.update({k: (B, layout["K"], layout["Tn"]) for k in NAIVE_KEYS})
    src = {} if packed is None else dict(packed.arrays)
    if packed is not None and packed.teacher != "none" and packed.teacher != mode:
        raise ValueError(f"conform: packed with teacher {packed.teacher!r}, the common layout is {mode!r}")
    if mode == "naive" and packed is not None and packed.teacher == "naive":
        tn_old, tn_new = src["naive_tokens"].shape[2], layout["Tn"]
        if tn_new != tn_old:  # teacher_src indexes the flattened [K * Tn] axis: re-index for the wider Tn
            ts, on = src["teacher_src"], src["coached_mask"] > 0
            src["teacher_src"] = np.where(on, (ts // tn_old) * tn_new + ts % tn_old, 0).astype(ts.dtype)
    groups = int(layout.get("groups", 1))
    if B % groups:
        raise ValueError(f"conform: {B} rows do not split into {groups} head groups")
    if packed is not None and packed.num_rows != B:  # padding rows at the end of each head group: its rows stay
        n = packed.num_rows // packed.head_group   # together (head_arrays rebuilds its lists below)
        if n != groups:
            raise ValueError(f"conform: packed in {n} head groups, the common layout has {groups} (rows_multiple)")
        r = np.arange(packed.num_rows)
        new_row = (r // packed.head_group) * (B // groups) + r % packed.head_group
        for k, v in src.items():
            rows = np.zeros((B,) + v.shape[1:], v.dtype)
            rows[new_row] = v
            src[k] = rows
    out = {}
    for k, shape in shapes.items():
        dtype = np.float32 if k in TOKEN_KEYS and k != "teacher_src" else np.int32
        out[k] = _pad_to(src[k], shape) if k in src else np.zeros(shape, dtype)
    out.update(head_arrays(out, B // groups, layout["Ka"], layout["Kc"] if mode == "fused" else None))
    agent = out["agent_mask"].astype(np.float64)
    if loss_agg == "token-mean":
        n = layout["n_agent"]
        out["grpo_weight"] = (agent / n if n else np.zeros_like(agent)).astype(np.float32)
    elif loss_agg == "seq-mean":
        n_local = 0 if packed is None else packed.num_sequences
        scale = n_local / layout["n_seq"] if layout["n_seq"] else 0.0
        out["grpo_weight"] = (out["grpo_weight"].astype(np.float64) * scale).astype(np.float32)
    else:
        raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, got {loss_agg!r}")
    coached = out["coached_mask"].astype(np.float64)
    nc = layout["n_coached"]
    out["csd_weight"] = (coached / nc if nc else coached).astype(np.float32)
    return out
