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
* **behaviour log-probs** (``behav_logp`` [B, T], only with ``behaviour_logprobs=True``: the decoupled objective of
  rl.behavior_is_cap > 0, grpo.decoupled_grpo_loss): the sampler's log-prob of each agent token (Segment.logprobs),
  kept beside ``old_logp``, which then holds the proximal log-probs the step recomputes. Without it no such array
  exists: the batch's keys and shapes are those of the plain objective.
* **LM-head positions** (the head and its log-softmax run only there, see csd.py), listed per head group: the
  G = B / rows_multiple consecutive rows one device holds in one micro-batch (rows_multiple = micro-batches x
  batch-sharding devices; G = 1 is one list per row), flattened (`head_arrays`). ``head_idx`` [B, Ka]: a group's
  G rows hold, flattened, r x T + t for every agent token of the group (r its row in the group, t its trunk
  index; group order = row order, exactly the ones of ``agent_mask``; its log-prob comes from the hidden state at
  index - 1); with fused branches ``branch_head_idx`` [B, Kc]: for the k-th coached token of the group (the ones
  of ``coached_mask``) r x Tb + its branch index (its ``teacher_src``). Ka and Kc stay counts per row (G x Ka
  entries per group). Entries past a group's count are 0 (index 0 of a row is never an agent token).

Which trajectories share a row and the shapes (rows, row length, head and branch counts, the shape ladders)
are chosen in algorithms/rl_shapes.py (`pack_shape`, `ShapeLadder`) from per-trajectory counts alone;
`pack_trajectories` here fills the arrays in them.
All counts that normalise the loss are taken over the whole batch here, before it is split into micro-batches or
over devices.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from mimesis_jax.algorithms.grpo import loss_token_weights
from mimesis_jax.algorithms.rl_shapes import (  # noqa: F401 -- also re-exported: callers reach the shape names here
    BRANCH_HEAD_RUNGS, BRANCH_RUNGS, BRANCH_STEPS, HEAD_RUNGS, HEAD_STEPS, ROW_RUNGS, ROW_STEPS, SHAPE_FIELDS,
    PackShape, ShapeLadder, _choose_shapes, bucket, ladder_shape_key, pack_shape, shape_ladder)
from mimesis_jax.config.choices import LOSS_AGGS

TEACHER_MODES = ("fused", "naive", "none")
TRUNK_KEYS = ("tokens", "positions", "segment_ids")
TOKEN_KEYS = ("agent_mask", "coached_mask", "advantages", "old_logp", "grpo_weight", "csd_weight", "teacher_src")
BRANCH_KEYS = ("branch_tokens", "branch_positions", "branch_ids", "branch_trunk_segment", "branch_prefix_len")
NAIVE_KEYS = ("naive_tokens", "naive_positions", "naive_segment_ids")
HEAD_KEYS = ("head_idx", "branch_head_idx")  # [B, Ka] always; [B, Kc] with fused branches (per head group)
BEHAV_KEY = "behav_logp"  # [B, T] the sampler's log-probs, only for the decoupled objective (behaviour_logprobs)


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
                      num_rows: int | None = None, head_len: int | None = None,
                      branch_head_len: int | None = None, rows_multiple: int = 1,
                      pad_multiple: int = 64, ladder: ShapeLadder | None = None,
                      behaviour_logprobs: bool = False) -> PackedRL:
    """Packs trajectories into trunk rows, teacher branches, LM-head index arrays and per-token arrays.

    advantages[i][t]: the advantage of agent turn t of trajectory i (grpo.trajectory_turn_advantages); None
    gives zeros (scoring only). use_rollout_logprobs: take old log-probs from Segment.logprobs (an agent
    segment without them is an error); False leaves zeros for the step to recompute.
    The shapes and rows come from rl_shapes.pack_shape (the shape policy: first fit by length, then the
    teacher-branch load balanced over the rows), the arrays from `_fill` (the filler).
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
    ladder: pack to the cheapest of its programs the batch fits (rl_shapes docstring; row_len is the ladder's, the
    other shape arguments must be None; a fused ladder packs the fused layout even without a coached turn).
    behaviour_logprobs: also pack Segment.logprobs as `behav_logp` (the decoupled objective's pi_behav; an agent
    segment without them is an error), whatever use_rollout_logprobs puts in old_logp.
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
    _check_turn_inputs(lays, advantages, use_rollout_logprobs or behaviour_logprobs)
    trunk = np.array([len(l.tokens) for l in lays], np.int64)
    T = bucket(int(trunk.max()), pad_multiple) if row_len is None else int(row_len)
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
    any_coached = any(l.branches or l.naive for l in lays)
    mode = teacher if any_coached or (ladder is not None and ladder.fused) else "none"
    shape = pack_shape(
        trunk, np.array([sum(len(b[0]) for b in l.branches) for l in lays], np.int64),
        np.array([sum(n for _, n, _, _ in l.turns) for l in lays], np.int64),
        np.array([sum(n for _, n, c, _ in l.turns if c is not None) for l in lays], np.int64),
        row_len=T, mode=mode, ladder=ladder, num_rows=num_rows, head_len=head_len, branch_len=branch_len,
        branch_head_len=branch_head_len, rows_multiple=rows_multiple, pad_multiple=pad_multiple,
        naive_rows=[len(l.naive) for l in lays], naive_need=max([len(s) for l in lays for s, _ in l.naive] or [0]),
        naive_len=naive_len)
    arr, slots = _fill(lays, shape, mode, advantages, use_rollout_logprobs, loss_agg)
    if behaviour_logprobs:
        arr[BEHAV_KEY] = _behaviour_logprobs(lays, slots, arr["tokens"].shape)
    n_seq = len({i for i in range(len(lays)) if any(n for _, n, _, _ in lays[i].turns)})
    return PackedRL(arr, slots, int(arr["agent_mask"].sum()), int(arr["coached_mask"].sum()), n_seq, mode,
                    bool(use_rollout_logprobs), dropped_tail, shape.overflow, shape.group)


def _check_turn_inputs(lays: list[_Layout], advantages, use_rollout_logprobs: bool) -> None:
    """One advantage per agent turn; with use_rollout_logprobs, finite rollout log-probs on every agent turn."""
    if advantages is not None:
        if len(advantages) != len(lays):
            raise ValueError(f"{len(advantages)} advantage lists for {len(lays)} trajectories")
        for i, (a, lay) in enumerate(zip(advantages, lays)):
            if len(a) != len(lay.turns):
                raise ValueError(f"trajectory {i}: {len(a)} turn advantages for {len(lay.turns)} agent turns")
    if use_rollout_logprobs:
        for i, lay in enumerate(lays):
            for (_, n, _, a), lp in zip(lay.turns, lay.logprobs):
                if lp is None and n:
                    raise ValueError(f"trajectory {i}: agent segment {a} has no rollout log-probs; record them "
                                     "in the sampler, or set the step's old_logprobs='recompute' (with "
                                     "behavior_is_cap = 0: the decoupled objective needs them)")
                if lp is not None and not np.all(np.isfinite(lp)):
                    raise ValueError(f"trajectory {i}: agent segment {a} has a non-finite rollout log-prob")


def _behaviour_logprobs(lays: list[_Layout], slots: list[list[TurnSlot]], shape) -> np.ndarray:
    """[B, T] float32: each agent token's rollout log-prob (Segment.logprobs) where `_fill` put the token, 0
    elsewhere."""
    out = np.zeros(shape, np.float32)
    for lay, turns in zip(lays, slots):
        for s, lp in zip(turns, lay.logprobs):
            if s.length:
                out[s.row, s.start:s.start + s.length] = lp
    return out


def _fill(lays: list[_Layout], shape: PackShape, mode: str, advantages, use_rollout_logprobs: bool,
          loss_agg: str) -> tuple[dict[str, np.ndarray], list[list[TurnSlot]]]:
    """The array filler: the packed arrays (module docstring) of trajectories laid out by `_layout`, in the rows and
    shapes the shape policy chose (`rl_shapes.pack_shape`), with the LM-head index arrays and the loss weights
    normalised over the batch; and per trajectory, per agent turn, where it went (`TurnSlot`)."""
    B, T, Ka, Tb, Kc = shape.key
    fused = mode == "fused"
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
        for k in NAIVE_KEYS:
            arr[k] = np.zeros((B,) + shape.naive, np.int32)
    slots: list[list[TurnSlot]] = [[] for _ in lays]
    for r, row in enumerate(shape.rows):
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
                if fused:
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
    arr.update(head_arrays(arr, shape.group, Ka, Kc if fused else None))
    n_coached = int(arr["coached_mask"].sum())
    arr["grpo_weight"] = loss_token_weights(arr["agent_mask"], seq_ids, loss_agg)
    arr["csd_weight"] = (arr["coached_mask"] / n_coached if n_coached else arr["coached_mask"]).astype(np.float32)
    return arr, slots


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
    if BEHAV_KEY in a:  # the decoupled objective's behaviour log-probs (absent otherwise: the info is unchanged)
        info["behav"] = 1
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
    if any("behav" in i for i in infos):  # a process without trajectories still pads a behav_logp of zeros
        out["behav"] = 1
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
    if "behav" in layout:
        shapes[BEHAV_KEY] = (B, T)
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
        dtype = np.float32 if k in TOKEN_KEYS + (BEHAV_KEY,) and k != "teacher_src" else np.int32
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
