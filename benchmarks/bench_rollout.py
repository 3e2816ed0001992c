"""Multi-turn rollouts through three generators in one process: the rollout engine (inference/engine.py), the static
sampler (today's per-turn `sampler.generate`) and a plain jitted loop written here.

    python benchmarks/bench_rollout.py                       # 64 dialogues x 8 and x 16 turns
    python benchmarks/bench_rollout.py --dialogues 8 --turns 2 4 --slots 4 --paths engine static   # a quick look

Workload (token level, seeded, identical for every path): each dialogue starts with a 60-140-token agent system
prompt and a 40-80-token simulator persona; per turn the tiny Qwen3 agent writes a reply of 40-200 tokens, the
environment appends a 20-100-token tool result, and the tiny Qwen3.5 simulator (seeing the agent's reply) writes a
10-60-token user turn that is appended to both contexts (with 3-token turn headers). Reply lengths are fixed per
request (max_tokens, no stop id) so every path generates exactly the same number of tokens; all sample at
temperature 1 with the same per-request seeds and the sampler's keys, and the report says how many sampled token
lists agree with the engine's (all of them, up to fp32 rounding of the three programs' different summation orders).

* static: every agent / simulator turn is one `sampler.generate` call over all dialogues (re-prefills each
  whole context padded to its power-of-two prompt bucket, decodes in an in-device while loop until the longest
  reply ends). The agent model uses the blockwise attention backend (the dense one would build [B, H, T, T]
  scores for 4k-token contexts).
* plain: the generator a JAX user writes first (`PlainLoop`): per turn a jitted prefill of every whole context,
  left-padded to the call's longest prompt (no buckets, the least padding), into a fresh KV cache of exactly
  longest prompt + longest reply slots, then a Python loop of jitted one-token decode steps, each step's tokens
  fetched to the host. Same models.extend, same sampling rule and keys as the sampler.
* engine: one `RolloutEngine` per model, keys = dialogue ids, released at the end of the run.

Compilation is excluded from the timed runs and reported apart: the engine compiles every program shape up front
(`warmup`); a static-sampler call that compiled (sampler.trace_count() moved) is timed again and the rerun counts;
the plain loop compiles each new shape ahead of its call (a prefill per call shape, a decode step per cache length).
Reported per path and turn count: wall time, compile time, prefill tokens, prefill tokens saved (the engine's
`reused_tokens`: prompt prefixes it kept from the previous turn; the other two re-prefill everything), sampled
tokens, decode tokens per device-second (sampled tokens / (wall x devices)), decode-slot utilisation (engine:
slot-steps that produced a token / slot-steps run; the others: sampled tokens / (batch rows x decode steps)),
evictions, and engine/x: the engine's tokens per device-second over the path's. The last line is
``rollout speedup: 8 turns X.XXx, 16 turns Y.YYx, slot use Z%`` (engine over the static sampler); the line before
it gives the engine over the plain loop. `--json F` writes every row, sampled tokens included
(tests/test_bench_rollout.py checks the three paths' tokens and prefill counts from it).

Paper-like shapes (issue #43 item 5): ``--mesh data=4,tensor=2 --group 8`` runs every path on that mesh (8 fake
CPU devices: set XLA_FLAGS=--xla_force_host_platform_device_count=8; the engine's weights and pool split as
RolloutEngine(mesh=) splits them, the sampler's and the plain loop's rows over the batch axes) with the dialogues in
GRPO groups of 8 that share their task (system prompt and persona); figures in docs/benchmarks.md:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/bench_rollout.py \
        --mesh data=4,tensor=2 --group 8 --dialogues 32 --turns 16
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from mimesis_jax import models, sharding
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.inference import sampler
from mimesis_jax.inference import engine_programs
from mimesis_jax.inference.engine import EngineConfig, RolloutEngine

HEADER, END = [1, 2, 3], [4]
PATHS = ("engine", "static", "plain")


def tiny_configs(vocab: int, hidden: int) -> tuple[ModelConfig, ModelConfig]:
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=hidden // 4, rope_theta=10000.0, initializer_range=0.2)
    agent = ModelConfig(model_type="qwen3", num_hidden_layers=2, attention_impl="blockwise", attention_block_q=256,
                        attention_block_k=256, **common)
    user = ModelConfig(model_type="qwen3_5_text", num_hidden_layers=4, partial_rotary_factor=0.25,
                       attn_output_gate=True, full_attention_interval=2,
                       layer_types=("linear_attention", "full_attention") * 2, linear_conv_kernel_dim=4,
                       linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                       linear_num_value_heads=4, attention_impl="blockwise", attention_block_q=256,
                       attention_block_k=256, **common)
    return agent, user


@dataclasses.dataclass
class Plan:
    agent_sys: list  # per dialogue: tokens
    user_sys: list
    agent_len: np.ndarray  # [dialogues, turns]
    user_len: np.ndarray
    tools: list  # [dialogue][turn] -> tokens


def make_plan(n: int, turns: int, vocab: int, seed: int = 0, group: int = 1) -> Plan:
    """n dialogues; each run of `group` consecutive ones shares its task (agent system prompt, simulator persona),
    as a GRPO group's rollouts do."""
    rng = np.random.RandomState(seed)
    tok = lambda k: [int(t) for t in rng.randint(5, vocab, size=k)]  # noqa: E731
    tasks = -(-n // group)
    agent_sys = [tok(rng.randint(60, 141)) for _ in range(tasks)]
    user_sys = [tok(rng.randint(40, 81)) for _ in range(tasks)]
    return Plan([agent_sys[i // group] for i in range(n)], [user_sys[i // group] for i in range(n)],
                rng.randint(40, 201, size=(n, turns)), rng.randint(10, 61, size=(n, turns)),
                [[tok(rng.randint(20, 101)) for _ in range(turns)] for _ in range(n)])


@dataclasses.dataclass
class Result:
    wall: float = 0.0
    prefill_tokens: int = 0
    generated: int = 0
    used: int = 0  # slot-steps that produced a token
    offered: int = 0  # slot-steps run
    compile_s: float = 0.0
    late_compiles: int = 0  # engine: programs compiled inside the timed run (warmup missed them)
    reused: int = 0  # engine: prompt tokens found in its cache (not prefilled again)
    evictions: int = 0
    programs: int = 0  # plain loop: programs compiled (one prefill per call shape, one decode per cache length)
    tokens: list = dataclasses.field(default_factory=list)


def rollout(plan: Plan, turns: int, agent_call, user_call) -> list:
    """Runs the token-level dialogues; returns every sampled token list in order (to compare the paths)."""
    n = len(plan.agent_sys)
    actx = [list(s) for s in plan.agent_sys]
    uctx = [list(s) for s in plan.user_sys]
    sampled = []
    for t in range(turns):
        prompts = [c + HEADER for c in actx]
        out = agent_call(prompts, [int(x) for x in plan.agent_len[:, t]], [1000 * i + 2 * t for i in range(n)])
        uprompts = [u + HEADER + s.tokens + END + HEADER for u, s in zip(uctx, out)]
        uout = user_call(uprompts, [int(x) for x in plan.user_len[:, t]], [1000 * i + 2 * t + 1 for i in range(n)])
        for i in range(n):
            actx[i] = prompts[i] + out[i].tokens + END + plan.tools[i][t] + HEADER + uout[i].tokens + END
            uctx[i] = uprompts[i] + uout[i].tokens + END
        sampled += [s.tokens for s in out] + [s.tokens for s in uout]
    return sampled


def run_baseline(agent, user, plan: Plan, turns: int, mesh=None) -> Result:
    res = Result()

    def call(model):
        config, params = model

        def f(prompts, max_new, seeds):
            kw = dict(max_new_tokens=max_new, temperature=1.0, seed=seeds, stop_ids=(), mesh=mesh)
            before = sampler.trace_count()
            t0 = time.perf_counter()
            out = sampler.generate(config, params, prompts, **kw)
            dt = time.perf_counter() - t0
            if sampler.trace_count() != before:  # compiled: time the same call again
                t0 = time.perf_counter()
                out = sampler.generate(config, params, prompts, **kw)
                res.compile_s += dt - (time.perf_counter() - t0)
                dt = time.perf_counter() - t0
            res.wall += dt
            B = sampler.Buckets().batch(len(prompts), sharding.batch_shard_count(mesh, config))
            res.prefill_tokens += B * sampler.Buckets().prompt(max(len(p) for p in prompts))
            res.generated += sum(max_new)
            res.used += sum(max_new)
            res.offered += B * max(max_new)
            return out
        return f

    res.tokens = rollout(plan, turns, call(agent), call(user))
    return res


# ------------------------------------------------------------------------------------- the plain jitted loop
def _pick(config, params, h, cache, seeds, temps, step):
    """The sampler's rule and keys (`sampler.choose_tokens`; row key fold_in(key(seed), 0), step key
    fold_in(row key, step)) on the last position's logits: the same seeds draw the same tokens."""
    keys = jax.vmap(lambda s: jax.random.fold_in(jax.random.fold_in(jax.random.key(s), 0), step))(seeds)
    ones = jnp.ones_like(temps)
    tok, lp = sampler.choose_tokens(models.logits_from_hidden(config, params, h[:, -1]), keys, temps,
                                    jnp.zeros(temps.shape, jnp.int32), ones, 0, ones)
    return tok, lp, cache


@functools.partial(jax.jit, static_argnums=(0, 1))
def plain_prefill(config, cache_len, params, tokens, positions, segments, seeds, temps):
    """The whole (left-padded) prompt through `models.extend` on a fresh cache of `cache_len` slots; the first
    token."""
    cache = sampler._constrain_cache(config, models.init_cache(config, tokens.shape[0], cache_len))  # noqa: SLF001
    h, cache = models.extend(config, params, cache, tokens, positions, segments)
    return _pick(config, params, h, cache, seeds, temps, 0)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
def plain_decode(config, params, cache, tok, lengths, seeds, temps, step):
    """One token per row on top of the cache (donated): the token at position lengths + step - 1 in, the next
    token out."""
    pos = (lengths + step - 1)[:, None]
    h, cache = models.extend(config, params, cache, tok[:, None], pos, jnp.ones_like(pos))
    return _pick(config, params, h, sampler._constrain_cache(config, cache), seeds, temps, step)  # noqa: SLF001


class PlainLoop:
    """The generator a JAX user writes first: per call, a jitted prefill of every whole prompt (left-padded to the
    call's longest, no buckets) into a fresh KV cache of exactly longest prompt + longest reply slots, then a
    Python loop of jitted one-token decode steps over all rows until the longest reply is done, each step's tokens
    fetched to the host (as a loop that checks stop ids must; it also keeps a sharded CPU run from queueing
    collectives). A new shape compiles new programs: compiled ahead of the call, timed apart (`compile_s`), and
    counted (`programs`)."""

    def __init__(self, config, params, mesh, res: Result):
        self.config, self.params, self.mesh, self.res = config, params, mesh, res
        self.shards = sharding.batch_shard_count(mesh, config)
        self.compiled: dict = {}

    def _program(self, key, fn, *args):
        if key not in self.compiled:
            t0 = time.perf_counter()
            self.compiled[key] = fn.lower(self.config, *args).compile()
            self.res.compile_s += time.perf_counter() - t0
        return self.compiled[key]

    def _place(self, x):
        return x if self.mesh is None else jax.device_put(x, sharding.batch_sharding(self.mesh, x.shape, self.config))

    def _inputs(self, prompts, seeds):
        """Left-padded [B, P] tokens / positions / segments, per-row seeds and temperatures, lengths [B]; B is the
        prompts rounded up to the batch shards (filler rows hold one token so their last hidden state is defined)."""
        n = len(prompts)
        B, P = -(-n // self.shards) * self.shards, max(len(p) for p in prompts)
        tokens, positions, segments = (np.zeros((B, P), np.int32) for _ in range(3))
        lengths = np.ones((B,), np.int32)
        for i, p in enumerate(prompts):
            tokens[i, P - len(p):], positions[i, P - len(p):] = p, np.arange(len(p))
            segments[i, P - len(p):], lengths[i] = 1, len(p)
        segments[n:, -1] = 1
        seed_arr = np.asarray([s % (1 << 32) for s in seeds] + [0] * (B - n), np.uint32)
        return [self._place(x) for x in (tokens, positions, segments, seed_arr, np.ones((B,), np.float32),
                                         lengths)]

    def __call__(self, prompts, max_new, seeds):
        tokens, positions, segments, seed_arr, temps, lengths = self._inputs(prompts, seeds)
        (B, P), N = tokens.shape, max(max_new)
        with sharding.use_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext():
            prefill = self._program(("prefill", B, P, N), plain_prefill, P + N, self.params, tokens, positions,
                                    segments, seed_arr, temps)
            t0 = time.perf_counter()
            tok, lp, cache = prefill(self.params, tokens, positions, segments, seed_arr, temps)
            out = [jax.device_get((tok, lp))]
            self.res.wall += time.perf_counter() - t0
            decode = self._program(("decode", B, P + N), plain_decode, self.params, cache, tok, lengths, seed_arr,
                                   temps, np.int32(1))
            t0 = time.perf_counter()
            for i in range(1, N):
                tok, lp, cache = decode(self.params, cache, tok, lengths, seed_arr, temps, np.int32(i))
                out.append(jax.device_get((tok, lp)))
            self.res.wall += time.perf_counter() - t0
        toks, lps = np.stack([t for t, _ in out], 1), np.stack([x for _, x in out], 1)
        self.res.prefill_tokens += B * P
        self.res.generated += sum(max_new)
        self.res.used += sum(max_new)
        self.res.offered += B * N
        return [sampler.Sample([int(t) for t in toks[i, :m]], [float(x) for x in lps[i, :m]], "length", len(p))
                for i, (p, m) in enumerate(zip(prompts, max_new))]


def run_plain(agent, user, plan: Plan, turns: int, mesh=None) -> Result:
    res = Result()
    loops = PlainLoop(*agent, mesh, res), PlainLoop(*user, mesh, res)
    res.tokens = rollout(plan, turns, *loops)
    res.programs = sum(len(loop.compiled) for loop in loops)
    return res


def run_engine(agent, user, plan: Plan, turns: int, ec: EngineConfig, mesh=None) -> Result:
    res = Result()
    engines = []
    t0 = time.perf_counter()
    for config, params in (agent, user):
        eng = RolloutEngine(config, params, ec, mesh=mesh)
        eng.warmup()
        engines.append(eng)
    res.compile_s = time.perf_counter() - t0
    n = len(plan.agent_sys)

    def call(eng):
        def f(prompts, max_new, seeds):
            return eng.generate_tokens(prompts, keys=list(range(n)), max_tokens=max_new, temperature=1.0,
                                       seed=seeds, stop_ids=())
        return f

    programs = (engine_programs.prefill_program, engine_programs.decode_program)
    compiled = sum(p._cache_size() for p in programs)  # noqa: SLF001
    t0 = time.perf_counter()
    res.tokens = rollout(plan, turns, call(engines[0]), call(engines[1]))
    for eng in engines:
        eng.release_all()
    res.wall = time.perf_counter() - t0
    res.late_compiles = sum(p._cache_size() for p in programs) - compiled  # noqa: SLF001
    for eng in engines:
        res.prefill_tokens += eng.stats["prefill_tokens"]
        res.used += eng.stats["slot_steps_used"]
        res.offered += eng.stats["slot_steps_offered"]
        res.reused += eng.stats["reused_tokens"]
        res.evictions += eng.stats["evictions"]
    res.generated = sum(len(t) for t in res.tokens)
    return res


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dialogues", type=int, default=64)
    ap.add_argument("--turns", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--prefill-chunk", type=int, default=128)
    ap.add_argument("--prefill-rows", type=int, default=4)
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS),
                    help="the generators to run (the engine always runs: the ratios are against it)")
    ap.add_argument("--mesh", default="", help="run every path on this mesh, e.g. data=4,tensor=2 (needs that many "
                    "devices: XLA_FLAGS=--xla_force_host_platform_device_count=8 on a CPU)")
    ap.add_argument("--group", type=int, default=1, help="dialogues per task (a GRPO group shares its prompt)")
    ap.add_argument("--json", default="", help="also write every row's figures and sampled tokens to this file")
    args = ap.parse_args(argv)
    args.mesh_axes = None
    if args.mesh:
        try:
            args.mesh_axes = {k: int(v) for k, v in (kv.split("=") for kv in args.mesh.split(","))}
        except ValueError:
            ap.error(f"--mesh {args.mesh!r}: expected axis=size pairs, e.g. data=4,tensor=2")
    if args.dialogues < 1 or args.group < 1 or min(args.turns) < 1:
        ap.error("--dialogues, --group and --turns must be >= 1")
    return args


def engine_config(args) -> EngineConfig:
    """A pool that holds every dialogue at its longest (no evictions: the benchmark times generation, not LRU)."""
    longest = 140 + max(args.turns) * (2 * len(HEADER) + 200 + 1 + 100 + 60 + 1) + len(HEADER)
    pages_per_seq = -(-longest // args.page_size)
    return EngineConfig(slots=args.slots, page_size=args.page_size, num_pages=args.dialogues * pages_per_seq + 1,
                        max_pages_per_seq=pages_per_seq, prefill_chunk=args.prefill_chunk,
                        prefill_rows=args.prefill_rows, decode_steps=args.decode_steps, num_states=args.dialogues + 1)


def run_turns(args, agent, user, ec, mesh, turns: int) -> dict:
    """Every path over the same dialogues of `turns` turns: {path: Result}."""
    plan = make_plan(args.dialogues, turns, args.vocab, group=args.group)
    out = {"engine": run_engine(agent, user, plan, turns, ec, mesh)}
    if "static" in args.paths:
        out["static"] = run_baseline(agent, user, plan, turns, mesh)
    if "plain" in args.paths:
        out["plain"] = run_plain(agent, user, plan, turns, mesh)
    return out


def tok_per_dev_s(r: Result, devices: int) -> float:
    return r.generated / max(r.wall * devices, 1e-9)


def report(results: dict, devices: int) -> list:
    """Prints the comparison lines and the table; returns the JSON rows."""
    rows = []
    for turns, by_path in results.items():
        eng = by_path["engine"]
        line = [f"{turns} turns:"]
        for path, r in by_path.items():
            same = sum(a == b for a, b in zip(eng.tokens, r.tokens)) / max(len(eng.tokens), 1)
            ratio = tok_per_dev_s(eng, devices) / max(tok_per_dev_s(r, devices), 1e-9)
            rows.append(dict(path=path, turns=turns, wall_s=r.wall, compile_s=r.compile_s,
                             prefill_tokens=r.prefill_tokens, saved_tokens=r.reused, generated=r.generated,
                             tok_per_dev_s=tok_per_dev_s(r, devices), slot_use=r.used / max(r.offered, 1),
                             evictions=r.evictions, programs=r.programs, late_compiles=r.late_compiles,
                             same_as_engine=same, engine_ratio=ratio, tokens=r.tokens))
            if path != "engine":
                line.append(f"{path}: identical samples {100 * same:.1f}% of requests, engine/{path} {ratio:.2f}x;")
        print(" ".join(line))
        if eng.late_compiles:
            print(f"{turns} turns: WARNING the engine compiled {eng.late_compiles} programs inside its timed run")
    print(f"{'path':15s} {'wall s':>9s} {'compile s':>10s} {'prefill tok':>12s} {'saved tok':>10s} "
          f"{'generated':>10s} {'tok/dev-s':>10s} {'slot use':>9s} {'evictions':>9s} {'engine/x':>9s}")
    for r in rows:
        print(f"{r['path']:6s} {r['turns']:2d} turns {r['wall_s']:9.2f} {r['compile_s']:10.2f} "
              f"{r['prefill_tokens']:12d} {r['saved_tokens']:10d} {r['generated']:10d} {r['tok_per_dev_s']:10.1f} "
              f"{100 * r['slot_use']:8.1f}% {r['evictions']:9d} {r['engine_ratio']:8.2f}x")
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    mesh = None if args.mesh_axes is None else sharding.make_mesh(args.mesh_axes)
    devices = 1 if mesh is None else mesh.devices.size
    acfg, ucfg = tiny_configs(args.vocab, args.hidden)
    agent = (acfg, models.init_params(acfg, jax.random.key(0), mesh))
    user = (ucfg, models.init_params(ucfg, jax.random.key(1), mesh))
    ec = engine_config(args)
    print(f"devices: {jax.devices()}  mesh: {args.mesh or 'none'}  dialogues: {args.dialogues} in groups of "
          f"{args.group}  engine: {ec}")
    results = {turns: run_turns(args, agent, user, ec, mesh, turns) for turns in args.turns}
    rows = report(results, devices)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(devices=devices, mesh=args.mesh, group=args.group, dialogues=args.dialogues,
                           rows=rows), f)
    used = sum(r["engine"].used for r in results.values())
    offered = sum(r["engine"].offered for r in results.values())
    ratio = {(row["turns"], row["path"]): row["engine_ratio"] for row in rows}
    for path in ("plain", "static"):
        if path in args.paths:
            label = "rollout speedup" if path == "static" else "speedup over the plain loop"
            figures = ", ".join(f"{t} turns {ratio[t, path]:.2f}x" for t in args.turns)
            print(f"{label}: {figures}, slot use {100 * used / max(offered, 1):.0f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
