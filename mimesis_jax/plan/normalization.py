"""bf16 on the CPU backend: the float-normalization copies of a compiled program, read from XLA's dumped buffer
assignment, so the plan can be compared with the rest of the program (plan/compiled.py `program_memory`,
`plan --compiled`; the rule is written below, the figures are in docs/scale-out.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import math
import os
import re
import tempfile

import jax
from jax.experimental.compilation_cache import compilation_cache

from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import ModelConfig


# ------------------------------------------------------------------- bf16 on the CPU: normalization copies
# The CPU backend computes bfloat16 in float32: its float-normalization passes wrap each bf16 op in `convert`s to
# and from f32, and the buffers those converts produce are float32 stand-ins for bf16 values. The rule, applied to
# every value of the temp heap in XLA's buffer assignment (the optimized HLO, its buffer assignment and live
# ranges, dumped with xla_dump_to):
#   a value is a normalization copy when its producer -- the instruction, or a fusion's root followed through
#   bitcasts -- is a `convert` to f32 of a bf16 operand that carries no op_name metadata (jax's own casts,
#   astype / convert_element_type, always carry one; XLA's inserted converts carry none);
#   its excess is all of its bytes while the bf16 operand is a buffer of its own that is still live (a standalone
#   convert's operand, or a fusion's operand read through its parameter; an argument of the program always is):
#   an un-normalized program reads that bf16 buffer and holds no copy; and half of its bytes where the bf16 value
#   is computed inside the fusion, or its buffer has died (the copy stands in for it: the saved-activation stack's
#   float32 copy replaces the bf16 stack through the whole backward), since there an un-normalized program holds
#   that value in bf16.
# A float32 value that is no such convert is a copy too when every reader converts it to bf16 first with such an
# XLA-inserted convert (a standalone one, or in a fusion every use of the parameter it is passed as): the
# normalized op computed a bf16 value in float32 (the MLP dots' float32 outputs); its excess is half its bytes,
# the un-normalized program holding that value in bf16. So is a float32 `broadcast` whose op_name metadata names a
# bf16 broadcast of the program before XLA's optimizations (there the metadata names the instruction it came from,
# where jax's own ops carry jax's op_name paths): the normalization made jax's bf16 broadcast a float32 one (the
# sampler's zero KV cache its prefill loop reads), half its bytes.
# A value of a bf16 argument the program updates in place (aliased to an output in the HLO module's
# input_output_alias: the rollout engine's page pool) is a copy, all its bytes, when it carries that argument: it
# has the argument's element count and is made from the argument or another such value (a convert, a copy, a
# fusion, a scatter or update of it), or it is the tuple element a `tuple`, a `while` (its output, its body's and
# condition's parameter) or a get-tuple-element carries it in. The CPU program round-trips the pool through float32
# (converts it whole, writes it in a float32 loop, converts it back); an un-normalized program updates it in place in
# the argument's allocation, which the compiled total already counts.
# copies = the heap's largest live bytes - the largest live bytes less the live copies' excess, over the
# program's schedule; gaps = the heap's allocated bytes - its largest live bytes (its fragmentation: the plan has
# no such term, and a GPU's heap is laid out by another allocator); rest = compiled - copies - gaps. The rest is an
# estimate of the un-normalized program's peak on the same schedule: other float32 stand-ins (a value also read in
# float32) stay counted in full.
def _dump_options(directory: str) -> dict:
    return {"xla_dump_to": directory, "xla_dump_hlo_as_text": True}


_INST = re.compile(r"^\s+(?:ROOT )?%(\S+) = (\S+) ([\w-]+)\((.*)$", re.M)


@dataclasses.dataclass(frozen=True)
class Normalization:
    temp: int  # the temp heap's allocated bytes (buffer assignment; memory_analysis temp_size_in_bytes)
    peak: int  # the largest live bytes of the heap's values over the schedule (temp less fragmentation)
    rest_peak: int  # the largest live bytes less the live copies' excess over the schedule
    copies: tuple[tuple[str, str, int, str | None], ...]  # (instruction, shape, excess bytes at the peak, the bf16
    # buffer it reads or None) of the copies live at the peak
    hlo: str  # the optimized HLO text the copies name
    charged: tuple[tuple[str, str, int, str | None], ...]  # every copy of the heap, live at the peak or not:
    # (instruction, shape, its charge while its bf16 buffer lives or when it has none, that buffer or None)
    peak_time: int  # the schedule step of the peak (the live-range dump's numbering)
    live: str  # the live-range dump the excesses were read with

    @property
    def extra(self) -> int:
        """The bytes the copies add to the peak: compiled = rest + extra + gaps."""
        return self.peak - self.rest_peak

    @property
    def gaps(self) -> int:
        """The temp heap's fragmentation: its allocated bytes less its largest live bytes."""
        return self.temp - self.peak


def _operand(rest: str, i: int = 0) -> str:
    """The i-th operand's name in an HLO instruction's text after its opcode's parenthesis."""
    return re.findall(r"%([^\s,)]+)", rest.split(")")[0])[i]


def _buffer(name: str, insts: dict) -> str:
    """The live-range key of the buffer instruction `name` reads: through get-tuple-element to its tuple's
    element (`while.4{2}`)."""
    index = []
    while insts.get(name, ("", ""))[1] == "get-tuple-element":
        rest = insts[name][2]
        index.insert(0, re.search(r"index=(\d+)", rest)[1])
        name = _operand(rest)
    return name + "{" + ",".join(index) + "}"


def _inserted_bf16_convert(name: str, insts: dict) -> bool:
    """Whether instruction `name` is a convert to bf16 that XLA inserted (no jax op_name)."""
    shape, op, rest = insts.get(name, ("", "", ""))
    return op == "convert" and shape.startswith("bf16[") and "op_name=" not in rest


def _read_as_bf16(name: str, insts: dict, users: dict, bodies: dict) -> bool:
    """Whether every reader of the value `name` defines converts it to bf16 first (an XLA-inserted convert, in a
    fusion: every use of the parameter it is passed as): the value is bf16 in the un-normalized program."""
    if not users.get(name):
        return False
    for u, positions in users[name]:
        shape, op, rest = insts[u]
        if op == "convert":
            if not _inserted_bf16_convert(u, insts):
                return False
            continue
        if op != "fusion":
            return False
        body = bodies.get(re.search(r"calls=%([^\s,]+)", rest)[1], {})
        params = {int(re.match(r"(\d+)", v[2])[1]): k for k, v in body.items() if v[1] == "parameter"}
        for i in positions:
            uses = users.get(params.get(i), [])
            if not uses or not all(_inserted_bf16_convert(x, insts) for x, _ in uses):
                return False
    return True


def _excess(name: str, insts: dict, bodies: dict, users: dict, jax_bf16: set) -> tuple[int, str | None]:
    """(excess, bf16 buffer) of the value `name` defines (see the rule above): (0, None) if it is no copy; the
    bf16 buffer (a live-range key) when the copy reads one of its own, then the excess is all of its bytes while
    that buffer lives and half after; else the half it always is."""
    shape, op, rest = insts.get(name, ("", "", ""))
    if not shape.startswith("f32["):
        return 0, None
    full = math.prod(int(d) for d in re.match(r"f32\[([\d,]*)\]", shape)[1].split(",") if d) * 4
    ex = _convert_excess(name, full, insts, bodies)
    if ex == (0, None) and (_read_as_bf16(name, insts, users, bodies)
                                 or op == "broadcast" and _normalized_broadcast(rest, jax_bf16)):
        return full // 2, None
    return ex


def _normalized_broadcast(rest: str, jax_bf16: set) -> bool:
    """Whether a float32 `broadcast` is one of jax's bf16 broadcasts, normalized: its op_name metadata names a
    bf16 broadcast of the program before XLA's optimizations (the sampler's zero KV cache); `jax_bf16`: the names
    of that program's bf16 broadcasts."""
    m = re.search(r'op_name="([^"]+)"', rest)
    return m is not None and m[1] in jax_bf16


def _convert_excess(name: str, full: int, insts: dict, bodies: dict) -> tuple[int, str | None]:
    """`_excess` of a value made by a convert of a bf16 value (the first rule above)."""
    shape, op, rest = insts[name]
    if op == "convert":
        src = _operand(rest)
        if "op_name=" in rest or not insts.get(src, ("",))[0].startswith("bf16["):
            return 0, None
        return full, _buffer(src, insts)
    if op != "fusion":
        return 0, None
    body = bodies.get(re.search(r"calls=%([^\s,]+)", rest)[1], {})
    root = next((v for v in body.values() if v[3]), None)
    sliced = False  # a slice of the converted value: the bf16 slice is computed in the fusion (a copy anyway)
    while root is not None and root[1] in ("bitcast", "slice"):
        sliced = sliced or root[1] == "slice"
        root = body.get(_operand(root[2]))
    if root is None or root[1] != "convert" or "op_name=" in root[2]:
        return 0, None
    src = body.get(_operand(root[2]))
    if src is None or not src[0].startswith("bf16["):
        return 0, None
    if src[1] != "parameter" or sliced:
        return full // 2, None
    return full, _buffer(_operand(rest, int(re.match(r"(\d+)", src[2])[1])), insts)


def _elements(shape: str) -> int | None:
    """The element count of an array shape's text (`f32[36,4,128]{2,1,0}`); None for a tuple or a token."""
    m = re.match(r"[a-z]\w*\[([\d,]*)\]", shape)
    return m and math.prod(int(d) for d in m[1].split(",") if d)


def _in_place(hlo: str, insts: dict, entry: dict) -> set:
    """The live-range keys (`while.4{1}`) of the values that carry a bf16 argument the program updates in place (see
    the rule above): from the arguments input_output_alias names, to a fixed point over the module."""
    header = hlo.split("\n", 1)[0]
    aliased = {int(i) for i in re.findall(r"\{[\d,]*\}: \((\d+), \{\}", header)}
    seeds = [k for k, (shape, op, rest) in entry.items() if op == "parameter" and shape.startswith("bf16[")
             and int(re.match(r"(\d+)", rest)[1]) in aliased]
    sizes = {_elements(insts[k][0]) for k in seeds}
    carried = {k + "{}" for k in seeds}
    tuples = {m[1]: (m[2], m[3]) for m in re.finditer(r"^\s+(?:ROOT )?%(\S+) = \([^()]*\) (tuple|while)\((.*)$", hlo,
                                                         re.M)}
    params = {}  # computation -> its tuple-shaped parameter
    current = None
    for line in hlo.splitlines():
        if line.startswith("%") or line.startswith("ENTRY"):
            current = re.match(r"(?:ENTRY )?%(\S+)", line)[1]
        elif m := re.match(r"\s+(?:ROOT )?%(\S+) = \([^()]*\) parameter\(", line):
            params[current] = m[1]
    operands = {k: re.findall(r"%([^\s,)]+)", v[-1].split(")")[0]) for k, v in {**insts, **tuples}.items()}
    while True:
        before = len(carried)
        for k, (op, rest) in tuples.items():
            if op == "tuple":
                carried |= {f"{k}{{{i}}}" for i, o in enumerate(operands[k]) if o + "{}" in carried}
                continue
            init = operands[k][0]
            for key in [c for c in carried if c.startswith(init + "{") and c != init + "{}"]:
                index = key[len(init):]
                carried.add(k + index)
                for c in ("body", "condition"):
                    if computation := re.search(rf"{c}=%([^\s,]+)", rest):
                        carried.add(params.get(computation[1], "") + index)
        for k, (shape, op, rest) in insts.items():
            if op == "get-tuple-element":
                if operands[k][0] + "{" + re.search(r"index=(\d+)", rest)[1] + "}" in carried:
                    carried.add(k + "{}")
            elif _elements(shape) in sizes and any(o + "{}" in carried for o in operands[k]):
                carried.add(k + "{}")
        if len(carried) == before:
            return carried


def normalization_split(directory: str) -> Normalization:
    """The normalization copies of the program dumped to `directory` (the largest module's temp heap when it holds
    several): see the rule above."""
    found = []
    for path in glob.glob(os.path.join(directory, "*-buffer-assignment.txt")):
        base = path.removesuffix("-buffer-assignment.txt")
        text = open(path).read()
        temp = sum(int(m[1]) for m in re.finditer(r"^allocation \d+: size (\d+), preallocated-temp", text, re.M))
        found.append((temp, base, text))
    if not found:
        raise ConfigError(f"no buffer assignment dumped to {directory}")
    temp, base, text = max(found)
    with open(base + "-live-range.txt") as f:
        live = f.read()
    with open(base + ".txt") as f:
        hlo = f.read()
    before = glob.glob(re.sub(r"\.[^.]*after_optimizations$", ".before_optimizations.txt", base))
    jax_bf16 = set()
    for b in before:
        with open(b) as f:
            jax_bf16 |= set(re.findall(r"^\s+(?:ROOT )?%(\S+) = bf16\[\S* broadcast\(", f.read(), re.M))
    insts, bodies, current, entry = {}, {}, None, {}
    for line in hlo.splitlines():
        if line.startswith("%") or line.startswith("ENTRY"):
            current = bodies.setdefault(re.match(r"(?:ENTRY )?%(\S+)", line)[1], {})
            entry = current if line.startswith("ENTRY") else entry
            continue
        m = _INST.match(line)
        if m and current is not None:
            insts[m[1]] = current[m[1]] = (m[2], m[3], m[4], line.lstrip().startswith("ROOT "))
    insts = {k: v[:3] for k, v in insts.items()}
    entry = {k: v[:3] for k, v in entry.items()}
    users = {}  # value -> [(reader, [operand positions])]; HLO names are unique in the module
    for k, (_, _, rest) in insts.items():
        for i, o in enumerate(re.findall(r"%([^\s,)]+)", rest.split(")")[0])):
            uses = users.setdefault(o, [])
            if uses and uses[-1][0] == k:
                uses[-1][1].append(i)
            else:
                uses.append((k, [i]))
    ranges = {m[1]: (int(m[2]), int(m[3])) for m in re.finditer(r"^\s+(\S+\{[\d,]*\}):(\d+)-(\d+)$", live, re.M)}

    def excess_at(t: int, ex: int, src: str | None, held: set) -> int:
        """The excess at step t; `held`: the dead bf16 buffers already stood in for at t (an un-normalized program
        holds each once, however many copies read it)."""
        if src is None or src not in ranges:  # computed in the fusion (always half), or no range: an argument
            return ex
        a, b = ranges[src]
        if a <= t <= b or src in held:
            return ex
        held.add(src)
        return ex // 2

    in_place = _in_place(hlo, insts, entry)
    values = []  # (start, end, offset, size, excess, bf16 buffer, instruction, shape)
    for block in re.split(r"\n(?=allocation \d+:)", text):
        if not re.match(r"allocation \d+: size \d+, preallocated-temp", block):
            continue
        for v in re.finditer(r"value: <\d+ (\S+?)(\{[\d,]*\})?(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (\S+)",
                             block):
            key = v[1] + (v[2] or "{}")
            if key in ranges:
                ex, src = _excess(v[1], insts, bodies, users, jax_bf16) if (v[2] or "{}") == "{}" else (0, None)
                if key in in_place:
                    ex, src = int(v[3]), None
                values.append((*ranges[key], int(v[4]), int(v[3]), ex, src, v[1], v[5]))
    end = max((v[1] for v in values), default=0)
    best_rest, peak, peak_t = 0, -1, 0
    for t in range(end + 1):
        slots, held = {}, set()  # offset -> (bytes, excess): values at one offset live at once share that buffer
        for a, b, off, size, ex, src, _, _ in values:
            if a <= t <= b:
                s, e = slots.get(off, (0, None))
                ex_t = excess_at(t, ex, src, held) if ex else 0
                slots[off] = (max(s, size), ex_t if e is None else min(e, ex_t))
        total = sum(s for s, _ in slots.values())
        best_rest = max(best_rest, total - sum(e for _, e in slots.values()))
        if total > peak:
            peak, peak_t = total, t
    held = set()
    copies = tuple((n, sh, excess_at(peak_t, ex, src, held), src) for a, b, _, _, ex, src, n, sh in values
                   if ex and a <= peak_t <= b)
    charged = tuple(dict.fromkeys((n, sh, ex, src) for _, _, _, _, ex, src, n, sh in values if ex))
    return Normalization(temp, peak, best_rest, copies, hlo, charged, peak_t, live)


def splits(model: ModelConfig) -> bool:
    """Whether the CPU backend's float normalization holds copies in `model`'s programs: bf16 compute on CPU."""
    return jax.default_backend() == "cpu" and model.dtype == "bfloat16"


@contextlib.contextmanager
def without_persistent_cache():
    """jax's persistent compilation cache off for the block: its key leaves the dump options out, so a program
    compiled before (by another test, another `plan --compiled`) would come back from the cache with nothing
    dumped."""
    was = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # the cache's on/off decision is made once; make it again
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", was)
        compilation_cache.reset_cache()


def split_compile(compile_fn, options: dict) -> tuple[int, Normalization]:
    """(compiled bytes, Normalization) of compile_fn(options | a dump of the compiled program), a function that
    compiles one program and returns its `compiled_total` (`lm_step_memory`, `rl_step_memory`)."""
    with tempfile.TemporaryDirectory() as d, without_persistent_cache():
        total = compile_fn(options | _dump_options(d))
        return total, normalization_split(d)
