"""Per-round progress of an episode batch (episodes/agent.py, episodes/simulator.py), on stderr.

A batch of dialogues can run for minutes with no other output (every round is one sampler call over all live
dialogues), so the runners accept ``progress=``: a callable given a `TurnProgress` after each round.
`TurnReporter` is the one the CLI and the RL stages pass: one line per round on a terminal, e.g.

    agentrl step 3 rollout: turn 3/15, 12/16 dialogues active, 4,210 tokens sampled, 41.2 s

and, when stderr is not a terminal (a log file, CI), at most one line every `interval` seconds plus the line of
the round that ends the batch, so long runs stay readable without filling logs.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Callable, TextIO

from tqdm import tqdm


@dataclasses.dataclass(frozen=True)
class TurnProgress:
    turn: int  # rounds completed so far in this batch (1-based: 1 after the first sampler call)
    max_turns: int  # the most rounds any dialogue of the batch may take
    active: int  # dialogues still running after this round
    total: int  # dialogues in the batch
    sampled_tokens: int  # tokens the policy has sampled in this batch so far (every dialogue, every round)


def format_progress(p: TurnProgress, label: str = "", elapsed_s: float | None = None) -> str:
    head = f"{label}: " if label else ""
    tail = f", {elapsed_s:.1f} s" if elapsed_s is not None else ""
    return (f"{head}turn {p.turn}/{p.max_turns}, {p.active}/{p.total} dialogues active, "
            f"{p.sampled_tokens:,} tokens sampled{tail}")


class TurnReporter:
    """Writes `format_progress` lines to `stream` (default stderr), through tqdm so an open progress bar is
    redrawn below them. interval: the least seconds between two lines (default 0 on a terminal, 30 otherwise);
    the line of the round that ends the batch (no dialogue active) is written whenever an earlier one was.
    clock: seconds (time.monotonic; tests pass a fake one)."""

    def __init__(self, label: str = "", *, stream: TextIO | None = None, interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        if interval is None:
            isatty = getattr(self.stream, "isatty", None)
            interval = 0.0 if (isatty is not None and isatty()) else 30.0
        self.interval = float(interval)
        self.clock = clock
        self._t0 = clock()
        self._last: float | None = None  # when the last line was written
        self.lines: list[str] = []  # every line written (what a caller or a test can read back)

    def __call__(self, p: TurnProgress) -> None:
        now = self.clock()
        due = self._last is None and now - self._t0 >= self.interval
        due = due or (self._last is not None and now - self._last >= self.interval)
        if p.active == 0 and self.lines:
            due = True  # close the batch when anything of it was reported
        if not due:
            return
        self._last = now
        line = format_progress(p, self.label, now - self._t0)
        self.lines.append(line)
        tqdm.write(line, file=self.stream)
