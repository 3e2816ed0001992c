"""Packing variable-length examples into fixed-length rows with segment ids and positions.

A row of length ``seq_len`` holds one or more examples back to back; per token

    tokens       the example's ids (``pad_id`` after the last example)
    positions    0, 1, ... restarting at each example (RoPE positions)
    segment_ids  1, 2, ... one per example in the row; 0 = padding
    loss_mask    the example's loss mask (float32; 0 on padding)

which is the batch convention of ``train/step.py``: attention never crosses a segment boundary and
``next_token_mask`` drops predictions across boundaries, so the loss of a packed row equals the sum of the
examples' unpacked losses.

Two entry points over one packer:

* ``pack_examples(examples, seq_len)`` -- a whole list at once (reference path for tests and offline use);
* ``PackIterDataset`` -- a grain ``IterDataset`` that packs a stream in windows of ``num_bins`` rows (first fit:
  each example goes to the first row with room; an example that fits nowhere closes the window, whose rows are
  emitted in order, and opens the next). Its iterator state is the parent state at the start of the current
  window, the counters at that point and the number of rows already emitted from the window, so
  ``set_state`` + ``next`` reproduces an uninterrupted run exactly (the window is rebuilt deterministically).

Stream elements are example dicts (``tokens``, ``loss_mask``) or *markers* ``{"_skip": True}`` for records
dropped upstream. Either may carry ``"_stats": {counter: increment}``; the packer sums them when it consumes the
element, so counters such as ``skipped_records`` are exact across checkpoints. Every emitted row carries a copy
of the counters (``"_stats"``) as of the end of its window.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import grain
import numpy as np

ROW_KEYS = ("tokens", "positions", "segment_ids", "loss_mask")


class FirstFitPacker:
    """Up to `num_bins` rows of `seq_len`; `add` places an example in the first row with room."""

    def __init__(self, seq_len: int, num_bins: int, pad_id: int, max_segments: int | None = None):
        if seq_len < 2:
            raise ValueError(f"seq_len must be >= 2, got {seq_len}")
        if num_bins < 1:
            raise ValueError(f"num_bins must be >= 1, got {num_bins}")
        self.seq_len, self.num_bins, self.pad_id, self.max_segments = seq_len, num_bins, pad_id, max_segments
        self.bins: list[list[dict]] = []
        self.fill: list[int] = []

    def add(self, example: dict) -> bool:
        n = len(example["tokens"])
        if n > self.seq_len:
            raise ValueError(f"example of {n} tokens is longer than seq_len={self.seq_len}; truncate it first")
        for b, used in enumerate(self.fill):
            if used + n <= self.seq_len and (self.max_segments is None or len(self.bins[b]) < self.max_segments):
                self.bins[b].append(example)
                self.fill[b] += n
                return True
        if len(self.bins) < self.num_bins:
            self.bins.append([example])
            self.fill.append(n)
            return True
        return False

    def __len__(self) -> int:
        return len(self.bins)

    def rows(self) -> list[dict]:
        return [pack_row(b, self.seq_len, self.pad_id) for b in self.bins]


def pack_row(examples: Sequence[dict], seq_len: int, pad_id: int) -> dict:
    """One row from examples that fit in it."""
    row = {"tokens": np.full(seq_len, pad_id, np.int32), "positions": np.zeros(seq_len, np.int32),
           "segment_ids": np.zeros(seq_len, np.int32), "loss_mask": np.zeros(seq_len, np.float32)}
    t = 0
    for s, ex in enumerate(examples, 1):
        n = len(ex["tokens"])
        if t + n > seq_len:
            raise ValueError(f"examples of {sum(len(e['tokens']) for e in examples)} tokens do not fit in "
                             f"seq_len={seq_len}")
        row["tokens"][t:t + n] = ex["tokens"]
        row["positions"][t:t + n] = np.arange(n)
        row["segment_ids"][t:t + n] = s
        row["loss_mask"][t:t + n] = ex["loss_mask"]
        t += n
    return row


def pack_examples(examples: Sequence[dict], seq_len: int, pad_id: int = 0, *, packing: bool = True) -> dict:
    """First-fit packing of a list (all rows open at once). ``packing=False``: one example per row."""
    packer = FirstFitPacker(seq_len, max(len(examples), 1), pad_id, max_segments=None if packing else 1)
    for i, ex in enumerate(examples):
        if not packer.add(ex):
            raise AssertionError(f"example {i} did not fit")  # unreachable: a new row is always available
    rows = packer.rows()
    return {k: np.stack([r[k] for r in rows]) for k in ROW_KEYS}


def fit_length(example: dict, seq_len: int, overlong: str, where: str = "example") -> dict | None:
    """An example cut to `seq_len` tokens ("truncate": keep the first seq_len), None ("skip"), or an error."""
    n = len(example["tokens"])
    if n <= seq_len:
        return example
    if overlong == "truncate":
        return {"tokens": example["tokens"][:seq_len], "loss_mask": example["loss_mask"][:seq_len]}
    if overlong == "skip":
        return None
    raise ValueError(f"{where}: {n} tokens exceed seq_len={seq_len} (set data.overlong to 'truncate' or 'skip')")


# ------------------------------------------------------------------------------------------- the grain stage
class PackIterDataset(grain.IterDataset):
    """Packs a stream of examples into rows (see the module docstring). ``packing=False``: one example per row."""

    def __init__(self, parent: grain.IterDataset, *, seq_len: int, pad_id: int, num_bins: int = 16,
                 packing: bool = True):
        super().__init__(parent)
        self.seq_len, self.pad_id, self.packing = seq_len, pad_id, packing
        self.num_bins = num_bins if packing else 1

    def __iter__(self) -> "PackIterator":
        return PackIterator(self._parent.__iter__(), self.seq_len, self.pad_id, self.num_bins, self.packing)


class PackIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator, seq_len: int, pad_id: int, num_bins: int, packing: bool):
        super().__init__(parent)
        self.seq_len, self.pad_id, self.num_bins, self.packing = seq_len, pad_id, num_bins, packing
        self.counters: dict[str, int] = {}
        self._rows: list[dict] = []
        self._emitted = 0
        self._window_state = self._parent.get_state()
        self._window_counters: dict[str, int] = {}
        self._carry: tuple[Any, dict] | None = None  # (parent state before it, element) of a window-closing example
        self._exhausted = False

    @property
    def source(self) -> grain.DatasetIterator:
        """The iterator of examples this one packs."""
        return self._parent

    def _count(self, element: dict) -> None:
        for k, v in (element.get("_stats") or {}).items():
            self.counters[k] = self.counters.get(k, 0) + int(v)

    def _fill(self) -> None:
        """Builds the next window from the carried example and the parent."""
        if self._carry is not None:
            self._window_state = self._carry[0]
        else:
            self._window_state = self._parent.get_state()
        self._window_counters = dict(self.counters)
        packer = FirstFitPacker(self.seq_len, self.num_bins, self.pad_id, None if self.packing else 1)
        if self._carry is not None:
            _, ex = self._carry
            self._carry = None
            packer.add(ex)
            self._count(ex)
        while True:
            before = self._parent.get_state()
            try:
                el = next(self._parent)
            except StopIteration:
                self._exhausted = True
                break
            if el.get("_skip"):
                self._count(el)
                continue
            if packer.add(el):
                self._count(el)
            else:
                self._carry = (before, el)
                break
        self._rows = packer.rows()
        self._emitted = 0
        stats = dict(self.counters)
        for r in self._rows:
            r["_stats"] = stats

    def __next__(self) -> dict:
        if self._emitted >= len(self._rows):
            if self._exhausted and self._carry is None:
                raise StopIteration
            self._fill()
            if not self._rows:
                raise StopIteration
        row = self._rows[self._emitted]
        self._emitted += 1
        return row

    def get_state(self) -> dict:
        if self._emitted >= len(self._rows):
            # Between windows: the next one starts at the carried example (not yet counted) or the parent's position.
            parent = self._carry[0] if self._carry is not None else self._parent.get_state()
            return {"parent": copy.deepcopy(parent), "counters": dict(self.counters), "emitted": 0}
        return {"parent": copy.deepcopy(self._window_state), "counters": dict(self._window_counters),
                "emitted": self._emitted}

    def set_state(self, state: dict) -> None:
        self._parent.set_state(state["parent"])
        self.counters = {k: int(v) for k, v in state["counters"].items()}
        self._rows, self._emitted, self._carry, self._exhausted = [], 0, None, False
        if state["emitted"] > 0:
            self._fill()
            if state["emitted"] > len(self._rows):
                raise ValueError(f"packer state: {state['emitted']} rows emitted but the window has "
                                 f"{len(self._rows)}; the data or its configuration changed since the checkpoint")
            self._emitted = state["emitted"]
