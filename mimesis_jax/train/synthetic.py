"""A synthetic, learnable token stream with the real iterator contract, for benchmarks and trainer tests.

    data = SyntheticData(vocab_size=64, seq_len=32)
    it = data.make_iterator(None, batch_size=8, seed=0, process_index=0, process_count=1)
    batch = next(it); state = it.get_state(); it.set_state(state)

Every row packs segments of random length; each segment is an arithmetic progression modulo a small
alphabet (start and stride drawn per segment), so after a couple of tokens the next one is predictable and
the loss of a working trainer falls quickly. Batch i of process p depends only on (seed, i, p): the state is
just the batch index, and resuming from it reproduces the stream exactly.

A run config may set `data` to this dataclass (or any object with the same `make_iterator`) instead of the
pipeline's DataConfig; the trainer then needs no tokenizer.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class SyntheticData:
    vocab_size: int = 64
    seq_len: int = 32
    alphabet: int = 16  # tokens used (ids 1..alphabet); must be < vocab_size
    min_segment: int = 6
    pad_fraction: float = 0.1  # expected fraction of each row left as padding (segment id 0)

    def validate(self):
        if not 1 <= self.alphabet < self.vocab_size:
            raise ValueError(f"config key 'data.alphabet': must be in [1, vocab_size={self.vocab_size}), "
                             f"got {self.alphabet}")
        if not 2 <= self.min_segment <= self.seq_len:
            raise ValueError(f"config key 'data.min_segment': must be in [2, seq_len={self.seq_len}], "
                             f"got {self.min_segment}")
        if not 0.0 <= self.pad_fraction < 1.0:
            raise ValueError(f"config key 'data.pad_fraction': must be in [0, 1), got {self.pad_fraction}")

    def make_iterator(self, tokenizer, batch_size: int, seed: int, process_index: int = 0, process_count: int = 1):
        self.validate()
        return SyntheticIterator(self, batch_size, seed, process_index)


class SyntheticIterator:
    def __init__(self, cfg: SyntheticData, batch_size: int, seed: int, process_index: int):
        self.cfg, self.batch_size, self.seed, self.process_index = cfg, batch_size, seed, process_index
        self.index = 0
        self.stats = {"batches": 0}

    def __iter__(self):
        return self

    def _row(self, rng):
        c, T = self.cfg, self.cfg.seq_len
        tokens = np.zeros(T, np.int32)
        positions = np.zeros(T, np.int32)
        seg = np.zeros(T, np.int32)
        mask = np.zeros(T, np.float32)
        used = T - int(rng.binomial(T, c.pad_fraction)) if c.pad_fraction else T
        t, s = 0, 0
        while t < used:
            n = min(used - t, int(rng.randint(c.min_segment, max(c.min_segment, T // 2) + 1)))
            if n < 2:
                break
            s += 1
            start, stride = rng.randint(0, c.alphabet), rng.randint(1, 4)
            tokens[t:t + n] = 1 + (start + stride * np.arange(n)) % c.alphabet
            positions[t:t + n] = np.arange(n)
            seg[t:t + n] = s
            mask[t + 1:t + n] = 1.0  # every token but the segment's first is a target
            t += n
        return tokens, positions, seg, mask

    def __next__(self):
        rng = np.random.RandomState((self.seed * 1_000_003 + self.index * 9_973 + self.process_index) % (2**31 - 1))
        rows = [self._row(rng) for _ in range(self.batch_size)]
        self.index += 1
        self.stats["batches"] = self.index
        tokens, positions, seg, mask = (np.stack(x) for x in zip(*rows))
        return {"tokens": tokens, "positions": positions, "segment_ids": seg, "loss_mask": mask}

    def get_state(self) -> dict:
        return {"index": self.index}

    def set_state(self, state: dict) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("index"), int):
            raise ValueError(f"synthetic data: bad iterator state {state!r}")
        self.index = state["index"]
        self.stats["batches"] = self.index
