"""Measuring compiled programs: XLA's memory analysis and best-of-N wall time, the two numbers every benchmark in
`benchmarks/` reports as ratios against a baseline run in the same process.

* memory: `compiled.memory_analysis()` -- deterministic, independent of machine noise. `temp` is the scratch
  XLA allocates for the program (activations, saved residuals, intermediate logits); `output` the result buffers.
  Backends without the analysis give None.
* time: the minimum over `repeats` calls after one warm-up call, each blocked on its result (the minimum is the
  least noisy estimate on a shared machine; compilation is never timed).
* compilations: `count_compilations()` counts the XLA programs compiled inside a block (to check that a loop
  reuses its compiled programs: a new shape bucket compiles once, the same shapes never again).
* model FLOPs: `pass_flops` (one pass over given tokens, head positions and attention key pairs) and
  `model_flops_per_token` (the conventional 6N + 12 L H Dh c); `PEAK_FLOPS` / `device_for_kind` give the
  dense bf16 peak of a chip for MFU (the `profile` command, commands/profile.py).
* compiled programs: `xla_cost` (XLA's whole-program cost analysis) and `hlo_matmul_flops` (matmul FLOPs per
  jax.named_scope from the optimized HLO text, loop bodies multiplied by their trip counts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mimesis_jax import models
from mimesis_jax.models.layers import is_spec


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


# ---------------------------------------------------------------------------------------- model FLOPs
def matmul_params(config) -> tuple[int, int]:
    """(N_layers, N_head): the weights every token multiplies through the layers, and the LM head's V x D.

    N_layers sums every layer parameter with two or more dimensions per layer (projections, MLP matrices, and the
    depthwise causal conv of the DeltaNet layers, whose multiply-adds per token also equal its size); norms,
    biases and the DeltaNet decay vectors are left out, and so is the embedding (a lookup, not a matmul)."""
    specs = jax.tree.leaves(models.param_specs(config), is_leaf=is_spec)
    n_layers = sum(int(np.prod(s.shape)) for s in specs if s.axes[0] == "layers" and len(s.shape) >= 3)
    return n_layers, config.vocab_size * config.hidden_size


def attention_layers(config) -> int:
    """Layers with softmax attention (all of a Qwen3; every `full_attention` layer of a Qwen3.5)."""
    return sum(t == "full_attention" for t in config.layer_types)


def pass_flops(config, tokens: float, head_positions: float, key_sum: float, train: bool) -> float:
    """Model FLOPs of one pass: mult x (2 N_layers tokens + 2 N_head head_positions + 4 H Dh L_attn key_sum).

    A multiply-add is 2 FLOPs; a forward pass multiplies each token through N_layers weights, each head position
    through the V x D head, and per attention layer and head costs 2 Dh per visible key for q.k and 2 Dh for the
    weighted sum of values. `key_sum` is the number of (query, visible key) pairs. mult = 3 for training (the
    backward pass costs twice the forward: gradients of the activations and of the weights), 1 for a forward-only
    pass (CSD teacher branches, scoring, sampling). Elementwise work, norms, softmax and the DeltaNet recurrence are
    not counted (the usual convention: small against the matmuls)."""
    n_layers, n_head = matmul_params(config)
    attn = 4 * config.num_attention_heads * config.head_dim * attention_layers(config)
    return (3 if train else 1) * (2 * n_layers * tokens + 2 * n_head * head_positions + attn * key_sum)


def model_flops_per_token(config, keys_per_token: float, train: bool = True) -> float:
    """The conventional per-token figure: 6 N + 12 L_attn H Dh c for training (2 N + 4 L_attn H Dh c forward),
    N = N_layers + N_head (`matmul_params`: the head counted on every token), c = keys a token attends to on
    average. PaLM (Chowdhery et al. 2022, app. B) writes 6N + 12 L H Q T with the full row length T; this counts
    the keys each query actually sees (causal, within its packed segment: c = (S + 1) / 2 for one sequence of
    length S)."""
    return pass_flops(config, 1, 1, keys_per_token, train)


# --------------------------------------------------------------------------------------- device peaks
# Dense bf16 matmul peak per chip, FLOP/s, from the vendors' datasheets (no structured sparsity). MFU compares
# with this peak whatever the run's compute dtype (the usual convention: the peak the hardware offers).
PEAK_FLOPS = {
    "a100-40g": 312e12,
    "a100-80g": 312e12,
    "h100-pcie": 756e12,
    "h100-80g": 989e12,  # H100 SXM
    "h200": 989e12,
    "b200": 2250e12,
    "tpu-v4": 275e12,
    "tpu-v5e": 197e12,
    "tpu-v5p": 459e12,
    "tpu-v6e": 918e12,
}
# jax's device_kind strings -> PEAK_FLOPS keys: the first entry whose words all occur in the kind wins
_KIND_RULES = (
    (("H100", "PCIe"), "h100-pcie"), (("H100",), "h100-80g"), (("H200",), "h200"), (("B200",), "b200"),
    (("A100", "40GB"), "a100-40g"), (("A100",), "a100-80g"), (("TPU v4",), "tpu-v4"),
    (("TPU v5 lite",), "tpu-v5e"), (("TPU v5e",), "tpu-v5e"), (("TPU v5",), "tpu-v5p"), (("TPU v6",), "tpu-v6e"),
)


def device_for_kind(kind: str) -> str | None:
    """The PEAK_FLOPS key of a jax device_kind (e.g. "NVIDIA H100 80GB HBM3" -> "h100-80g"), None if unknown."""
    for words, key in _KIND_RULES:
        if all(w in kind for w in words):
            return key
    return None


# ------------------------------------------------------------------------------------ compiled programs
def xla_cost(compiled) -> dict[str, float] | None:
    """XLA's whole-program cost analysis (flops, bytes accessed, transcendentals), None where the backend gives
    none. XLA's HloCostAnalysis counts a while loop's body ONCE, whatever its trip count: programs that scan over
    layers or micro-batches are undercounted (see `hlo_matmul_flops` for a count that multiplies by trip counts)."""
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    if not cost:
        return None
    return {k: float(cost[k]) for k in ("flops", "bytes accessed", "transcendentals") if k in cost}


_HLO_INSTR = re.compile(r"\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_HLO_SHAPE = re.compile(r"\w+\[([\d,]*)\]")
_HLO_CALL = re.compile(r"\b(calls|to_apply|body|true_computation|false_computation)=%?([\w.\-]+)")
_HLO_CALL_LISTS = re.compile(r"(?:branch_computations|called_computations)=\{([^}]*)\}")
_HLO_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_HLO_OP_NAME = re.compile(r'op_name="([^"]*)"')
_HLO_DOT_DIMS = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_HLO_GEMM_DIMS = re.compile(r'"lhs_contracting_dimensions":\[([\d",\s]*)\]')


def _dims(text: str) -> list[int] | None:
    m = _HLO_SHAPE.search(text)
    return None if m is None else [int(d) for d in m.group(1).split(",") if d]


def _balanced(text: str, start: int) -> int:
    """Index just past the parenthesis group opening at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    raise ValueError(f"unbalanced parentheses in HLO line: {text[:200]!r}")


def _parse_hlo(hlo_text: str) -> tuple[dict, str]:
    """{computation: [(name, type, opcode, operands, attributes)]} and the entry computation's name."""
    comps, entry, cur = {}, None, None
    for line in hlo_text.splitlines():
        if not line.strip() or line.startswith(("HloModule", "//")):
            continue
        if not line[0].isspace():
            if line.rstrip().endswith("{"):
                head = line.split("(", 1)[0].split()
                cur = head[-1].lstrip("%")
                comps[cur] = []
                if head[0] == "ENTRY":
                    entry = cur
            continue
        m = _HLO_INSTR.match(line)
        if m is None or cur is None:
            continue
        rest = line[m.end():]
        if rest.startswith("("):
            end = _balanced(rest, 0)
            typ, rest = rest[:end], rest[end:]
        else:
            typ, _, rest = rest.partition(" ")
        op = re.match(r"\s*([\w\-]+)\(", rest)
        if op is None:
            continue
        close = _balanced(rest, op.end() - 1)
        comps[cur].append((m.group(1), typ, op.group(1), rest[op.end():close - 1], rest[close:]))
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return comps, entry


def _matmul_flops(typ: str, opcode: str, operands: str, attrs: str, shapes: dict) -> float:
    """2 x output elements x contracted size of a dot (or a GPU gemm custom call), else 0."""
    if opcode == "dot":
        dims = _HLO_DOT_DIMS.search(attrs)
    elif opcode == "custom-call":
        dims = _HLO_GEMM_DIMS.search(attrs)
    else:
        return 0.0
    if dims is None:
        return 0.0
    first = operands.split(",")[0]
    name = re.search(r"%([\w.\-]+)", first)
    lhs = _dims(first) if _HLO_SHAPE.search(first) else shapes.get(name.group(1) if name else "")
    out = _dims(typ)
    if lhs is None or out is None:
        return 0.0
    contracted = [int(d.strip('" ')) for d in dims.group(1).split(",") if d.strip('" ')]
    return 2.0 * float(np.prod(out)) * float(np.prod([lhs[d] for d in contracted]))


def hlo_matmul_flops(hlo_text: str, scopes: Sequence[str]) -> dict:
    """Matmul FLOPs of a compiled program, per named scope, from its optimized HLO text (`compiled.as_text()`).

    Every `dot` (and GPU gemm custom call) counts 2 x output elements x contracted size, times how often its
    computation runs: a while loop's body runs its `known_trip_count` times (scans over layers, micro-batches,
    vocabulary chunks), fusions and calls once per call. A dot belongs to every scope that appears as a component
    of its `op_name` metadata (jax.named_scope paths: "jit(f)/transpose(jvp(trunk))/attention/dot_general" is in
    trunk and attention), and is backward when the path holds a transpose (the VJP pass; with remat this includes
    the recomputed forward, "rematted_computation"). Conditional branches count once each. A while loop without a
    known trip count (a data-dependent while_loop, e.g. the sampler's decode loop) counts its body once and is
    reported in `unknown_trip_counts`.

    Returns {"total", "backward", "unscoped", "scopes": {scope: {"flops", "backward"}}, "unknown_trip_counts"}.
    """
    comps, entry = _parse_hlo(hlo_text)
    memo: dict[str, dict] = {}
    unknown: set[str] = set()

    def add(acc, other, k):
        for key in ("total", "backward", "unscoped"):
            acc[key] += k * other[key]
        for s in scopes:
            for key in ("flops", "backward"):
                acc["scopes"][s][key] += k * other["scopes"][s][key]

    def walk(comp: str) -> dict:
        if comp in memo:
            return memo[comp]
        acc = {"total": 0.0, "backward": 0.0, "unscoped": 0.0, "scopes": {s: {"flops": 0.0, "backward": 0.0}
                                                                          for s in scopes}}
        instrs = comps.get(comp, [])
        shapes = {name: _dims(typ) for name, typ, *_ in instrs}
        for name, typ, opcode, operands, attrs in instrs:
            f = _matmul_flops(typ, opcode, operands, attrs, shapes)
            if f:
                op_name = _HLO_OP_NAME.search(attrs)
                path = op_name.group(1) if op_name else ""
                parts = set(re.split(r"[/()]", path))
                bwd = "transpose(" in path
                acc["total"] += f
                acc["backward"] += f if bwd else 0.0
                hit = [s for s in scopes if s in parts]
                for s in hit:
                    acc["scopes"][s]["flops"] += f
                    acc["scopes"][s]["backward"] += f if bwd else 0.0
                if not hit:
                    acc["unscoped"] += f
            callees = _HLO_CALL.findall(attrs)
            for group in _HLO_CALL_LISTS.findall(attrs):
                callees += [("call", c.strip().lstrip("%")) for c in group.split(",") if c.strip()]
            for kind, callee in callees:
                k = 1
                if kind == "body":
                    trip = _HLO_TRIP.search(attrs)
                    if trip is None:
                        unknown.add(name)
                    else:
                        k = int(trip.group(1))
                add(acc, walk(callee), k)
        memo[comp] = acc
        return acc

    out = walk(entry)
    return dict(out, unknown_trip_counts=len(unknown))
