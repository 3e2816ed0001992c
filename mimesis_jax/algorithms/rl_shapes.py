"""Which shapes a batch of RL trajectories is packed to (the shape policy of algorithms/rl_batch.py): its rows
(which trajectories share a trunk row, in head-group order) and its shape key (rows, row_len, head, branch,
branch_head: B, T, Ka, Tb, Kc), from per-trajectory numbers alone (trunk, branch, agent and coached tokens). The
arrays themselves are filled in rl_batch.py (`pack_trajectories`).

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
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

ROW_STEPS = 8  # `bucket` ladder steps per octave of the row count: at most 1/9 of the rows left empty
BRANCH_STEPS = 16  # ... of the branch row length: at most 1/17 padding from the ladder
HEAD_STEPS = 8  # ... of the LM-head counts (head_idx, branch_head_idx)
ROW_RUNGS = (1 / 2, 3 / 4, 1)  # `ShapeLadder` rows: fractions of the most rows a mini-batch can need
BRANCH_RUNGS = (1 / 2, 1)  # `ShapeLadder` CSD branch row length: fractions of the longest branch block
HEAD_RUNGS = (1,)  # `ShapeLadder` LM-head counts per row: fractions of the row length
BRANCH_HEAD_RUNGS = (1,)  # `ShapeLadder` branch-head counts per row: fractions of the head count
SHAPE_FIELDS = ("rows", "row_len", "head", "branch", "branch_head")  # a shape key: B, T, Ka, Tb, Kc (0: none)


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




@dataclasses.dataclass(frozen=True)
class PackShape:
    """The shapes one batch is packed to, numbers only (`pack_shape`): `rows` the trajectory indices of each trunk
    row in head-group order (`group` consecutive rows per LM-head group), `key` the shape key (B, T, Ka, Tb, Kc;
    Tb = Kc = 0 without fused branches), `naive` (K, Tn): K teacher rows of Tn tokens per trunk row with naive
    teacher rows (else (0, 0)), `overflow`: packed with a ladder but fitting none of its programs."""

    rows: list[list[int]]
    key: tuple[int, int, int, int, int]
    group: int
    overflow: bool = False
    naive: tuple[int, int] = (0, 0)


def pack_shape(trunk: np.ndarray, branch: np.ndarray, agent: np.ndarray, coached: np.ndarray, *, row_len: int,
               mode: str, ladder: ShapeLadder | None = None, num_rows: int | None = None,
               head_len: int | None = None, branch_len: int | None = None, branch_head_len: int | None = None,
               rows_multiple: int = 1, pad_multiple: int = 64, naive_rows: Sequence[int] = (), naive_need: int = 0,
               naive_len: int | None = None) -> PackShape:
    """The shape policy of `rl_batch.pack_trajectories`: from per-trajectory counts ([N] each: trunk tokens (at most
    row_len), teacher-branch tokens, agent tokens, coached tokens; with mode "naive" also each trajectory's teacher
    rows and the longest teacher sequence) the rows and shapes (`_choose_shapes`). The shape arguments fixed (not
    None) must hold every trajectory: else a ValueError naming the trajectory and the argument."""
    for i in range(len(trunk)):
        if branch_len is not None and branch[i] > branch_len:
            raise ValueError(f"trajectory {i}: its teacher branches need {branch[i]} tokens > branch_len={branch_len}")
        if head_len is not None and agent[i] > head_len:
            raise ValueError(f"trajectory {i}: {agent[i]} agent tokens > head_len={head_len}")
        if branch_head_len is not None and coached[i] > branch_head_len:
            raise ValueError(f"trajectory {i}: {coached[i]} coached tokens > branch_head_len={branch_head_len}")
    fused = mode == "fused"
    if fused:  # balanced per row: branch tokens (-> Tb), agent tokens (-> Ka), coached tokens (-> Kc)
        sizes = np.stack([trunk, branch, agent, coached])
        caps = [row_len, None if branch_len is None else int(branch_len), head_len, branch_head_len]
    else:
        sizes, caps = np.stack([trunk, agent]), [row_len, head_len]
    rows, key, overflow = _choose_shapes(
        sizes, caps, fused=fused, ladder=ladder, num_rows=num_rows, head_len=head_len,
        branch_len=None if branch_len is None else int(branch_len), branch_head_len=branch_head_len,
        rows_multiple=rows_multiple, pad_multiple=pad_multiple)
    naive = (0, 0)
    if mode == "naive":
        Tn = bucket(naive_need, pad_multiple) if naive_len is None else int(naive_len)
        if naive_need > Tn:
            raise ValueError(f"a teacher sequence has {naive_need} tokens > naive_len={Tn}")
        naive = (max(sum(naive_rows[i] for i in row) for row in rows), Tn)
    return PackShape(rows, key, key[0] // rows_multiple, overflow, naive)
