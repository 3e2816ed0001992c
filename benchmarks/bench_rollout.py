"""Multi-turn rollouts: the rollout engine (inference/engine.py) vs today's per-turn `sampler.generate`, in one process.

    python benchmarks/bench_rollout.py                       # 64 dialogues x 8 and x 16 turns (a few minutes)
    python benchmarks/bench_rollout.py --dialogues 8 --turns 2 4 --slots 4    # a quick look

Workload (token level, seeded, identical for both paths): each dialogue starts with a 60-140-token agent system
prompt and a 40-80-token simulator persona; per turn the tiny Qwen3 agent writes a reply of 40-200 tokens, the
environment appends a 20-100-token tool result, and the tiny Qwen3.5 simulator (seeing the agent's reply) writes a
10-60-token user turn that is appended to both contexts (with 3-token turn headers). Reply lengths are fixed per
request (max_tokens, no stop id) so both paths generate exactly the same number of tokens; both sample at
temperature 1 with the same per-request seeds, and the table reports how many sampled tokens agree.

* baseline: every agent / simulator turn is one `sampler.generate` call over all dialogues (re-prefills each
  whole context, pads to the longest prompt, decodes until the longest reply ends). The agent model uses the
  blockwise attention backend (the dense one would build [B, H, T, T] scores for 4k-token contexts).
* engine: one `RolloutEngine` per model, keys = dialogue ids, released at the end of the run.

Compilation is excluded from the timed runs and reported apart: the engine compiles every program shape up front
(`warmup`); a baseline call that compiled (sampler.trace_count() moved) is timed again and the rerun counts.
Reported per turn count: wall time, prefill tokens, decode-slot utilisation (engine: slot-steps that produced a
token / slot-steps run; baseline: generated tokens / (batch rows x decode steps)). The last line is parsed by
other tools: ``rollout speedup: 8 turns X.XXx, 16 turns Y.YYx, slot use Z%``.

Paper-like shapes (issue #43 item 5): ``--mesh data=4,tensor=2 --group 8`` runs both paths on that mesh (8 fake
CPU devices: set XLA_FLAGS=--xla_force_host_platform_device_count=8; the engine's weights and pool split as
RolloutEngine(mesh=) splits them, the sampler's rows over the batch axes) with the dialogues in GRPO groups of 8
that share their task (system prompt and persona), and adds per path decode tokens per device-second (sampled
tokens / (wall x devices)) and the prefill tokens the engine saved (`engine.stats["reused_tokens"]`: prefixes
it did not compute again), so the faster generator is picked by measurement:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/bench_rollout.py \
        --mesh data=4,tensor=2 --group 8 --dialogues 32 --turns 16
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import numpy as np

from mimesis_jax import models, sharding
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.inference import sampler
from mimesis_jax.inference import engine_programs
from mimesis_jax.inference.engine import EngineConfig, RolloutEngine

HEADER, END = [1, 2, 3], [4]


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
            B = sampler.Buckets().batch(len(prompts))
            res.prefill_tokens += B * sampler.Buckets().prompt(max(len(p) for p in prompts))
            res.generated += sum(max_new)
            res.used += sum(max_new)
            res.offered += B * max(max_new)
            return out
        return f

    res.tokens = rollout(plan, turns, call(agent), call(user))
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


def main() -> None:
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
    ap.add_argument("--skip-baseline", action="store_true", help="engine only (no speed-up line)")
    ap.add_argument("--mesh", default="", help="run both paths on this mesh, e.g. data=4,tensor=2 (needs that many "
                    "devices: XLA_FLAGS=--xla_force_host_platform_device_count=8 on a CPU)")
    ap.add_argument("--group", type=int, default=1, help="dialogues per task (a GRPO group shares its prompt)")
    args = ap.parse_args()

    mesh = None
    if args.mesh:
        try:
            axes = {k: int(v) for k, v in (kv.split("=") for kv in args.mesh.split(","))}
        except ValueError:
            ap.error(f"--mesh {args.mesh!r}: expected axis=size pairs, e.g. data=4,tensor=2")
        mesh = sharding.make_mesh(axes)
    devices = 1 if mesh is None else mesh.devices.size
    acfg, ucfg = tiny_configs(args.vocab, args.hidden)
    agent = (acfg, models.init_params(acfg, jax.random.key(0), mesh))
    user = (ucfg, models.init_params(ucfg, jax.random.key(1), mesh))
    max_turns = max(args.turns)
    longest = 140 + max_turns * (2 * len(HEADER) + 200 + 1 + 100 + 60 + 1) + len(HEADER)
    pages_per_seq = -(-longest // args.page_size)
    ec = EngineConfig(slots=args.slots, page_size=args.page_size, num_pages=args.dialogues * pages_per_seq + 1,
                      max_pages_per_seq=pages_per_seq, prefill_chunk=args.prefill_chunk,
                      prefill_rows=args.prefill_rows, decode_steps=args.decode_steps, num_states=args.dialogues + 1)
    print(f"devices: {jax.devices()}  mesh: {args.mesh or 'none'}  dialogues: {args.dialogues} in groups of "
          f"{args.group}  engine: {ec}")
    rows, speed, used, offered = [], {}, 0, 0
    for turns in args.turns:
        plan = make_plan(args.dialogues, turns, args.vocab, group=args.group)
        eng = run_engine(agent, user, plan, turns, ec, mesh)
        used, offered = used + eng.used, offered + eng.offered
        rows.append((f"engine   {turns:2d} turns", eng))
        if not args.skip_baseline:
            base = run_baseline(agent, user, plan, turns, mesh)
            rows.append((f"generate {turns:2d} turns", base))
            same = sum(a == b for a, b in zip(eng.tokens, base.tokens)) / max(len(eng.tokens), 1)
            speed[turns] = base.wall / eng.wall
            print(f"{turns} turns: identical samples {100 * same:.1f}% of requests, speed-up {speed[turns]:.2f}x")
        if eng.late_compiles:
            print(f"{turns} turns: WARNING the engine compiled {eng.late_compiles} programs inside its timed run")
    print(f"{'path':18s} {'wall s':>9s} {'compile s':>10s} {'prefill tok':>12s} {'saved tok':>10s} "
          f"{'generated':>10s} {'tok/dev-s':>10s} {'slot use':>9s} {'evictions':>9s}")
    for name, r in rows:
        print(f"{name:18s} {r.wall:9.2f} {r.compile_s:10.2f} {r.prefill_tokens:12d} {r.reused:10d} "
              f"{r.generated:10d} {r.generated / max(r.wall * devices, 1e-9):10.1f} "
              f"{100 * r.used / max(r.offered, 1):8.1f}% {r.evictions:9d}")
    if speed:
        s8 = speed.get(8, float("nan"))
        s16 = speed.get(16, float("nan"))
        print(f"rollout speedup: 8 turns {s8:.2f}x, 16 turns {s16:.2f}x, slot use {100 * used / max(offered, 1):.0f}%")


if __name__ == "__main__":
    main()
