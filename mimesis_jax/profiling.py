"""Measuring compiled programs: XLA's memory analysis and best-of-N wall time, the two numbers every benchmark in
`benchmarks/` reports as ratios against a baseline run in the same process.

* memory: `compiled.memory_analysis()` -- deterministic, independent of machine noise. `temp` is the scratch
  XLA allocates for the program (activations, saved residuals, intermediate logits); `output` the result buffers.
  Backends without the analysis give None.
* time: the minimum over `repeats` calls after one warm-up call, each blocked on its result (the minimum is the
  least noisy estimate on a shared machine; compilation is never timed).
* compilations: `count_compilations()` counts the XLA programs compiled inside a block (to check that a loop
  reuses its compiled programs: a new shape bucket compiles once, the same shapes never again).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Measurement:
    time: float | None  # best-of-N seconds; None when the run was skipped
    temp_bytes: int | None
    output_bytes: int | None
    out: Any  # the program's result (for agreement checks); None when skipped

    @property
    def peak_bytes(self) -> int | None:
        """Scratch plus results: what one call needs beyond its (already resident) arguments."""
        if self.temp_bytes is None or self.output_bytes is None:
            return None
        return self.temp_bytes + self.output_bytes


def memory_bytes(compiled) -> tuple[int | None, int | None]:
    """(temp, output) bytes of a compiled program, or (None, None) where the backend gives no analysis."""
    mem = compiled.memory_analysis()
    if mem is None:
        return None, None
    return int(mem.temp_size_in_bytes), int(mem.output_size_in_bytes)


def best_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Calls `fn` once to warm up, then `repeats` times blocking on each result; (min seconds, last result)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    out = jax.block_until_ready(fn())
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best, out


def measure(fn: Callable, args: Sequence, repeats: int, *, max_temp_bytes: int | None = None) -> Measurement:
    """Compiles `jax.jit(fn)` for `args`, reads its memory analysis and times it. With `max_temp_bytes`, a program
    whose scratch exceeds it is compiled and reported but not run (time None), so a benchmark can show what a
    dense baseline would need at a size this machine cannot hold."""
    compiled = jax.jit(fn).lower(*args).compile()
    temp, output = memory_bytes(compiled)
    if max_temp_bytes is not None and temp is not None and temp > max_temp_bytes:
        return Measurement(None, temp, output, None)
    t, out = best_time(lambda: compiled(*args), repeats)
    return Measurement(t, temp, output, out)


def max_rel_diff(a, b) -> float:
    """max over leaves of max|a - b| / max|b| (b is the reference)."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    if len(la) != len(lb):
        raise ValueError(f"pytrees differ: {len(la)} vs {len(lb)} leaves")
    return max(float(jnp.abs(x - y).max() / (jnp.abs(y).max() + 1e-30)) for x, y in zip(la, lb))


def fmt_mib(n: int | float | None) -> str:
    return "n/a" if n is None else f"{n / 2 ** 20:9.1f} MiB"


def fmt_ms(t: float | None) -> str:
    return "  not run" if t is None else f"{t * 1e3:9.1f} ms"


# ------------------------------------------------------------------------------------------- compilations
# The event jax records (jax.monitoring) around every XLA backend compilation, with the program's name as
# `fun_name` ("jit(f)" for jax.jit(f)); a persistent-compilation-cache hit is recorded too (it builds a program).
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@dataclasses.dataclass
class Compilations:
    """What `count_compilations` saw: the compiled programs' names, in order, and the seconds they took."""

    names: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def count(self) -> int:
        return len(self.names)

    def count_of(self, fun_name: str) -> int:
        """Programs whose name contains `fun_name` (a jitted function's __name__, e.g. "update" for "jit(update)").
        Eager jax.numpy operations outside any jit compile small programs of their own; this leaves them out."""
        return sum(fun_name in n for n in self.names)


@contextlib.contextmanager
def count_compilations() -> Iterator[Compilations]:
    """Counts XLA compilations inside the block, through jax's public monitoring hooks::

        with count_compilations() as c:
            step(...)
        c.count, c.count_of("update")

    Compilations by other threads during the block are counted too (jax's listeners are process-wide); filter with
    `count_of` by program name where that matters.
    """
    seen = Compilations()
    lock = threading.Lock()

    def listener(event: str, duration: float, **kwargs) -> None:
        if event == BACKEND_COMPILE_EVENT:
            with lock:
                seen.names.append(str(kwargs.get("fun_name", "")))
                seen.seconds += float(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
