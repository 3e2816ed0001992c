"""A timeline of a run that ui.perfetto.dev and chrome://tracing open (issue #44 item 6; docs/stage2.md "Timeline").

With `train.timeline=true` the RL learner records spans -- a step's rollouts, each agent turn (one batched
generation), each wait for the user simulator's replies, the env steps, the coach notes, the packing, every
optimizer update, the weight sync -- and writes them to `<workdir>/timeline.json` in the Chrome trace event format:

    {"traceEvents": [{"name": "update", "ph": "X", "ts": <us>, "dur": <us>, "pid": 1, "tid": 2, "args": {...}},
                     {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "trainer"}}, ...],
     "displayTimeUnit": "ms"}

Tracks. Every span lands on the track of the thread that ran it: the track a `track(name)` block set for that
thread ("rollouts": the producer thread or the inline rollouts; "trainer": the loop's updates and syncs), else the
thread's own name. Spans of one track nest (an agent turn inside its step's rollouts); Perfetto draws them stacked.

Cost. Off (no `recording` block open), `span` and `track` return one shared do-nothing context: a hook costs one
check of a module global. On, a span is two clock reads (time.perf_counter, monotonic) and one append under a lock,
so the hooks may run in any thread. `flush` writes the file whole (a temporary file, then os.replace), so a killed
run leaves the timeline of its last flush, readable; the learner flushes with every metrics flush and at the end.

Busy fractions. A `measuring(kinds)` block (the RL learner opens one for every run, timeline on or off) keeps the
intervals of the spans named in `kinds` -- the same marks the timeline records -- and `Busy.fractions(start, end)`
gives, per kind, the fraction of [start, end] covered by at least one of its spans (`busy_fraction`: the union,
so spans of several threads at once count once); a span still open counts up to `end`. Its cost: one dict look-up
per span, and for a measured span two clock reads and two appends under a lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

PID = 1  # one process per file: the process that recorded it
_NULL = contextlib.nullcontext()


class _Thread(threading.local):
    track: str | None = None  # the track a `track` block set for this thread


_THREAD = _Thread()


class Timeline:
    """The spans recorded so far (thread-safe) and where they go (`path`)."""

    def __init__(self, path: str, process: str = "mimesis"):
        self.path, self.process = path, process
        self._lock = threading.Lock()
        self._events: list[dict] = []
        self._tids: dict[str, int] = {}  # track name -> tid, in order of first use
        self._t0 = time.perf_counter()

    def add(self, name: str, start: float, end: float, track: str, args: dict) -> None:
        """One complete span ("ph": "X") from perf_counter marks `start` to `end` on `track`."""
        with self._lock:
            tid = self._tids.setdefault(track, len(self._tids) + 1)
            self._events.append({"name": name, "ph": "X", "ts": round((start - self._t0) * 1e6, 3),
                                 "dur": round((end - start) * 1e6, 3), "pid": PID, "tid": tid, "args": args})

    def trace(self) -> dict:
        """The Chrome trace of the spans so far: metadata naming the process and each track, then the spans."""
        with self._lock:
            events, tids = list(self._events), dict(self._tids)
        meta = [{"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": self.process}}]
        for track, tid in tids.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": track}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid, "args": {"sort_index": tid}})
        return {"traceEvents": meta + events, "displayTimeUnit": "ms"}

    def write(self) -> None:
        """The trace to `path`, atomically (a reader never sees a half-written file)."""
        tmp = f"{self.path}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.trace(), f)
        os.replace(tmp, self.path)


def busy_fraction(intervals, start: float, end: float) -> float:
    """The fraction of [start, end] covered by the union of `intervals` ((a, b) pairs, any order, overlapping or
    not); 0.0 for an empty window."""
    if end <= start:
        return 0.0
    covered, reach = 0.0, start
    for a, b in sorted((max(a, start), min(b, end)) for a, b in intervals):
        if b <= max(a, reach):  # outside the window, or inside what is counted already
            continue
        covered += b - max(a, reach)
        reach = b
    return covered / (end - start)


class Busy:
    """The intervals of the spans named in `kinds` (module docstring, Busy fractions); thread-safe."""

    def __init__(self, kinds):
        self.kinds = frozenset(kinds)
        self._lock = threading.Lock()
        self._done: dict[str, list[tuple[float, float]]] = {k: [] for k in self.kinds}
        self._open: dict[int, tuple[str, float]] = {}  # id of an open span -> (kind, start)

    def begin(self, kind: str, start: float, token: int) -> None:
        with self._lock:
            self._open[token] = (kind, start)

    def end(self, token: int, end: float) -> None:
        with self._lock:
            kind, start = self._open.pop(token)
            self._done[kind].append((start, end))

    def fractions(self, start: float, end: float) -> dict[str, float]:
        """Per kind, the fraction of [start, end] its spans covered (the open ones up to `end`); forgets the spans
        that ended by `start` (the loop asks for consecutive windows)."""
        with self._lock:
            for kind in self.kinds:
                self._done[kind] = [iv for iv in self._done[kind] if iv[1] > start]
            spans = {k: list(v) for k, v in self._done.items()}
            for kind, a in self._open.values():
                spans[kind].append((a, end))
        return {k: busy_fraction(v, start, end) for k, v in spans.items()}


class _Span:
    __slots__ = ("timeline", "busy", "name", "args", "track", "start")

    def __init__(self, timeline: Timeline | None, busy: Busy | None, name: str, args: dict):
        self.timeline, self.busy, self.name, self.args = timeline, busy, name, args

    def __enter__(self):
        self.track = _THREAD.track or threading.current_thread().name
        self.start = time.perf_counter()
        if self.busy is not None:
            self.busy.begin(self.name, self.start, id(self))

    def __exit__(self, *exc) -> None:
        end = time.perf_counter()
        if self.busy is not None:
            self.busy.end(id(self), end)
        if self.timeline is not None:
            self.timeline.add(self.name, self.start, end, self.track, self.args)


_ACTIVE: Timeline | None = None  # the timeline being recorded; None: every hook is a no-op
_BUSY: Busy | None = None  # the spans being measured (`measuring`); None: none


def span(name: str, **args):
    """A block recorded as one span `name` (with `args`, JSON values) on this thread's track, and measured when
    `name` is a kind of the open `measuring` block; nothing when neither."""
    tl, busy = _ACTIVE, _BUSY
    if busy is not None and name not in busy.kinds:
        busy = None
    if tl is None and busy is None:
        return _NULL
    return _Span(tl, busy, name, args)


@contextlib.contextmanager
def measuring(kinds):
    """Keeps the intervals of the spans named in `kinds` for the block; yields the `Busy` that holds them. One at a
    time per process."""
    global _BUSY
    if _BUSY is not None:
        raise RuntimeError("busy fractions are already being measured; one run per process measures")
    busy = _BUSY = Busy(kinds)
    try:
        yield busy
    finally:
        _BUSY = None


@contextlib.contextmanager
def _on_track(name: str):
    before = _THREAD.track
    _THREAD.track = name
    try:
        yield
    finally:
        _THREAD.track = before


def track(name: str):
    """A block whose spans (in this thread) go to the track `name`; nothing when off."""
    if _ACTIVE is None:
        return _NULL
    return _on_track(name)


def flush() -> None:
    """Writes the timeline being recorded (no-op when off)."""
    tl = _ACTIVE
    if tl is not None:
        tl.write()


@contextlib.contextmanager
def recording(path: str | None, process: str = "mimesis"):
    """Records the hooks' spans for the block and writes them to `path` at its end (also when it raises); with
    path None records nothing. One recording at a time per process."""
    global _ACTIVE
    if path is None:
        yield None
        return
    if _ACTIVE is not None:
        raise RuntimeError(f"a timeline is already being recorded to {_ACTIVE.path}; one run per process records")
    tl = _ACTIVE = Timeline(path, process)
    try:
        yield tl
    finally:
        _ACTIVE = None
        tl.write()
