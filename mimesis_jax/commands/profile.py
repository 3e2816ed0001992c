"""``python -m mimesis_jax profile``: a jax.profiler trace, the compiled HLO, XLA's cost analysis and an MFU summary
of one compiled program of a run config.

    python -m mimesis_jax profile --config configs/tiny_agentrl.py:csd --what csd_step --steps 5 --out prof/csd
    python -m mimesis_jax profile --config configs/qwen3_8b_agentrl.py:csd --what csd_step --steps 5 \\
        --out prof/csd8b --device h100-80g --set rl.num_microbatches=8
    tensorboard --logdir prof/csd          # or xprof; the *.trace.json.gz also opens in ui.perfetto.dev

What is profiled (`--what`); every batch is synthetic, its token ids random, its shapes those the config gives:
* ``grpo_step`` / ``csd_step``: one Stage II optimizer update (train/rl/step.py, Eq 6 / Eq 11) on one PPO
  mini-batch: `rollout.mini_batch_prompts` x `rollout.group_size` dialogues of min(rollout.max_turns,
  gyms.max_turns) agent turns, packed as the training loop packs them (row_len = rollout.row_len). A dialogue is
  a prompt of --prompt-tokens, then per turn a user message of --user-tokens, a coach note of --note-tokens before
  the header of every turn but the last (csd_step only: the last turn has no next user message to learn from), a
  3-token assistant header and a reply of --reply-tokens (default: rollout.agent_max_tokens, lowered to what fills
  a row_len / max_context_tokens context). grpo_step needs rl.alpha = 0 and csd_step rl.alpha > 0.
* ``midtrain_step``: one Stage I optimizer step (train/step.py) on `train.global_batch` rows of
  `data.seq_len` tokens, each row filled with packed segments of random lengths (a quarter to a whole row).
* ``sampler``: the sampler's compiled program (inference/sampler.py: prefill, then a decode loop) for --batch
  prompts of --prompt-tokens, --new-tokens each (no stop id: every row decodes all of them).

The run: build the step, compile it, run it once (warm-up), then run --steps steps inside a `jax.profiler`
trace (each step a StepTraceAnnotation, blocked on its result and timed). Written to --out:
* ``plugins/profile/<run>/*.xplane.pb`` (TensorBoard / XProf) and ``*.trace.json.gz`` (Perfetto, chrome://tracing);
* ``program.hlo.txt``: the optimized HLO of the profiled program; every op's metadata ``op_name`` holds the
  jax.named_scope path: trunk, csd_branches, attention (the whole attention sub-layer), attention_core
  (scores, softmax, weighted values), deltanet (Qwen3.5 linear-attention sub-layer), mlp, logprob_head, loss,
  optimizer;
* ``cost_analysis.json``: XLA's whole-program cost analysis (flops, bytes accessed: XLA offers no per-scope
  figure and counts a while-loop body once), and the matmul FLOPs per scope counted from the HLO with loop trip
  counts (profiling.hlo_matmul_flops);
* ``summary.md`` / ``summary.json``: step time (best and median), tokens/s, model FLOPs, achieved FLOP/s, MFU.

Model FLOPs (profiling.pass_flops). Per step, summed over the passes the step makes: mult x (2 N_layers tokens
+ 2 V D head positions + 4 H Dh L_attn key pairs), mult 3 for a trained pass and 1 for a forward-only one.
grpo/csd: the trunk trained over its real tokens with the head on the agent tokens; csd adds the teacher branches
forward with the head on the coached tokens (a naive teacher: its rows forward); kl_coef > 0 adds the reference
forward. midtrain: the rows trained, the head on every target. sampler: the prompts forward (head at the last
position) and every decode step forward. Key pairs: each token sees position + 1 keys (causal, within its
segment; a branch token sees its trunk prefix and its branch). FLOPs/token = model FLOPs per step / tokens per
step (trunk tokens; generated tokens for the sampler); the conventional 6N + 12 L_attn H Dh c (the head on every
token; c the mean keys per trunk token) is reported next to it. MFU = model FLOPs per step / median step time /
(peak x devices); the peak is the dense bf16 figure of --device (profiling.PEAK_FLOPS; "auto" reads jax's
device kind) or --peak-flops (per device). The HLO matmul count over model FLOPs shows the work beyond the
model's (remat recompute, padded rows and head positions, masked attention blocks).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from mimesis_jax import config as config_lib, models, profiling, sharding
from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.data.trajectory import Segment, Trajectory
from mimesis_jax.errors import ConfigError
from mimesis_jax.inference import sampler
from mimesis_jax.train.loop import compiled_functions
from mimesis_jax.train.optim import make_optimizer
from mimesis_jax.train.rl import agent as agent_stage
from mimesis_jax.train.rl.step import make_rl_step, prepare_batch
from mimesis_jax.train.state import model_config_for

WHATS = ("grpo_step", "csd_step", "sampler", "midtrain_step")
SCOPES = ("trunk", "csd_branches", "attention", "attention_core", "deltanet", "mlp", "logprob_head", "loss",
          "optimizer")
HEADER_TOKENS = 3  # <|im_start|>assistant\n


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="configs/<name>.py defining get_config()")
    p.add_argument("--what", required=True, help=" | ".join(WHATS))
    p.add_argument("--steps", type=int, default=5, help="profiled steps after the warm-up")
    p.add_argument("--out", required=True, help="output directory (the trace's TensorBoard logdir)")
    p.add_argument("--no-trace", action="store_true",
                   help="time the steps without the jax.profiler trace (no tracing overhead in the step times, no "
                        "trace files; the HLO, cost analysis and summary are still written)")
    p.add_argument("--device", default="auto",
                   help="peak FLOP/s for MFU: auto (from jax's device kind) or one of "
                   + ", ".join(profiling.PEAK_FLOPS))
    p.add_argument("--peak-flops", type=float, default=None, help="peak FLOP/s per device (overrides --device)")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set rollout.row_len=4096")
    g = p.add_argument_group("synthetic batch")
    g.add_argument("--prompt-tokens", type=int, default=64, help="system prompt + task (grpo/csd), prompt (sampler)")
    g.add_argument("--user-tokens", type=int, default=32, help="user message per turn (grpo/csd)")
    g.add_argument("--note-tokens", type=int, default=16, help="coach note per coached turn (csd)")
    g.add_argument("--reply-tokens", type=int, default=None, help="agent reply per turn (default: see above)")
    g.add_argument("--batch", type=int, default=8, help="prompts per call (sampler)")
    g.add_argument("--new-tokens", type=int, default=64, help="generated tokens per prompt (sampler)")
    g.add_argument("--seed", type=int, default=0)


@dataclasses.dataclass
class Built:
    """One compiled program ready to run: `step()` runs it once (returns what to block on)."""

    step: Callable[[], Any]
    compiled: Any  # jax.stages.Compiled
    model_config: Any
    train: bool  # a training step (else forward only: the sampler)
    tokens: int  # throughput count per step
    token_kind: str
    model_flops: float  # per step (profiling.pass_flops summed over the step's passes)
    keys_per_token: float  # mean keys per trunk token (for the 6N + attention figure)
    devices: int
    facts: dict  # shapes and counts for the summary


def _load(path: str, overrides, what: str):
    if what in ("grpo_step", "csd_step"):
        return agent_stage.load(path, overrides)
    if what == "midtrain_step":
        return config_lib.load_config(path, overrides)
    cfg = config_lib.load_config(path, overrides, kind=object)
    if not callable(getattr(cfg, "runtime_model", None)):
        raise ConfigError(f"{path}: --what sampler needs a config with a model (runtime_model()); got "
                          f"{type(cfg).__name__}")
    return cfg


def _model_config(cfg):
    """The runtime model config the run would train (vocabulary from the tokenizer where the config says so)."""
    tok = None
    if cfg.tokenizer.set_model_vocab:
        tok = load_tokenizer(cfg.tokenizer.name)
    return model_config_for(cfg, tok)


def _mesh(cfg):
    try:
        return sharding.make_mesh(cfg.mesh.axes())
    except ValueError as e:
        raise ConfigError(f"config section 'mesh': {e}") from None


def _key_sum(positions: np.ndarray, real: np.ndarray) -> float:
    """(query, visible key) pairs: a real token at position p sees p + 1 keys."""
    return float(((positions.astype(np.float64) + 1) * (real > 0)).sum())


# ------------------------------------------------------------------------------------------ RL step
def synthetic_dialogues(rng: np.random.RandomState, vocab: int, n: int, group_size: int, turns: int, *, prompt: int,
                        user: int, note: int, reply: int, coached: bool) -> list:
    """n dialogues (groups of group_size) of fixed lengths, random ids and rewards, rollout log-probs in [-3, 0]."""
    def toks(k):
        return rng.randint(1, vocab, size=k).tolist()

    out = []
    for i in range(n):
        segs = [Segment("public", toks(prompt))]
        for t in range(turns):
            segs.append(Segment("public", toks(user)))
            if coached and t < turns - 1:
                segs.append(Segment("coach", toks(note)))
            segs.append(Segment("public", toks(HEADER_TOKENS)))
            segs.append(Segment("agent", toks(reply), logprobs=(-3 * rng.rand(reply)).tolist()))
        out.append(Trajectory(segs, turn_rewards=rng.rand(turns).round(2).tolist(), group_id=i // group_size,
                              rollout_id=i))
    return out


def reply_tokens(cfg, args, turns: int) -> int:
    """--reply-tokens, else rollout.agent_max_tokens lowered so that a dialogue fits the configured context."""
    if args.reply_tokens is not None:
        return args.reply_tokens
    r = cfg.rollout
    limit = r.row_len or r.max_context_tokens
    reply = r.agent_max_tokens
    if limit:
        reply = min(reply, (limit - args.prompt_tokens - turns * (args.user_tokens + HEADER_TOKENS)) // turns)
    if reply < 1:
        raise ConfigError(f"--prompt-tokens {args.prompt_tokens} and --user-tokens {args.user_tokens} x {turns} "
                          f"turns leave no room for a reply in a context of {limit} tokens; lower them")
    return reply


def build_rl_step(cfg, args, what: str) -> Built:
    rl, r = cfg.rl, cfg.rollout
    if what == "csd_step" and rl.alpha <= 0:
        raise ConfigError(f"{args.config}: --what csd_step needs rl.alpha > 0 (got {rl.alpha}): use --what "
                          "grpo_step or --set rl.alpha=0.01")
    if what == "grpo_step" and rl.alpha > 0:
        raise ConfigError(f"{args.config}: --what grpo_step needs rl.alpha = 0 (got {rl.alpha}): use --what "
                          "csd_step or --set rl.alpha=0")
    mc = _model_config(cfg)
    mesh = _mesh(cfg)
    tx = make_optimizer(cfg.optimizer, cfg.train.steps * cfg.updates_per_step(), mc)
    step = make_rl_step(mc, tx, mesh, rl)
    turns = min(r.max_turns, cfg.gyms.max_turns)
    reply = reply_tokens(cfg, args, turns)
    trajs = synthetic_dialogues(np.random.RandomState(args.seed), mc.vocab_size, r.mini_batch_prompts * r.group_size,
                                r.group_size, turns, prompt=args.prompt_tokens, user=args.user_tokens,
                                note=args.note_tokens, reply=reply, coached=what == "csd_step")
    try:
        packed = prepare_batch(trajs, rl, rows_multiple=step.rows_multiple(), row_len=r.row_len or None)
    except ValueError as e:
        raise ConfigError(f"synthetic batch: {e} (lower --prompt-tokens / --user-tokens / --reply-tokens)") from None
    batch = step.place(packed)
    params = models.init_params(mc, jax.random.PRNGKey(args.seed), mesh)
    opt_state = step.init_opt_state(params)
    ref = jax.tree.map(jnp.copy, params) if rl.kl_coef > 0 else None
    compiled = step.lower(params, opt_state, batch, ref).compile()
    state = {"params": params, "opt_state": opt_state}

    def run():
        state["params"], state["opt_state"], metrics = compiled(state["params"], state["opt_state"], batch, ref)
        return metrics

    a = packed.arrays
    real, agent = a["segment_ids"] > 0, float(a["agent_mask"].sum())
    tokens, keys = int(real.sum()), _key_sum(a["positions"], real)
    flops = profiling.pass_flops(mc, tokens, agent, keys, train=True)
    teacher = {"tokens": 0}
    if packed.teacher == "fused":
        breal = a["branch_ids"] > 0
        teacher = {"tokens": int(breal.sum()), "keys": _key_sum(a["branch_positions"], breal)}
    elif packed.teacher == "naive":
        nreal = a["naive_segment_ids"] > 0
        teacher = {"tokens": int(nreal.sum()), "keys": _key_sum(a["naive_positions"], nreal)}
    if teacher["tokens"]:
        flops += profiling.pass_flops(mc, teacher["tokens"], float(a["coached_mask"].sum()), teacher["keys"],
                                      train=False)
    if ref is not None:
        flops += profiling.pass_flops(mc, tokens, agent, keys, train=False)
    facts = {"dialogues": len(trajs), "turns": turns, "reply_tokens": reply, "rows": int(a["tokens"].shape[0]),
             "row_len": int(a["tokens"].shape[1]), "microbatches": rl.num_microbatches, "teacher": packed.teacher,
             "agent_tokens": int(agent), "coached_tokens": int(a["coached_mask"].sum()),
             "teacher_tokens": teacher["tokens"], "trunk_utilisation": tokens / real.size}
    if "branch_tokens" in a:
        facts["branch_len"] = int(a["branch_tokens"].shape[1])
    return Built(run, compiled, mc, True, tokens, "trunk tokens", flops, keys / tokens, mesh.size, facts)


# ------------------------------------------------------------------------------------- midtrain step
def synthetic_rows(rng: np.random.RandomState, vocab: int, rows: int, seq_len: int) -> dict:
    """[rows, seq_len] packed rows: segments of random lengths in [seq_len / 4, seq_len] (the last one cut to fit),
    positions restarting per segment, every token a target."""
    seg = np.zeros((rows, seq_len), np.int32)
    pos = np.zeros((rows, seq_len), np.int32)
    for r in range(rows):
        start, s = 0, 1
        while start < seq_len:
            n = min(rng.randint(max(1, seq_len // 4), seq_len + 1), seq_len - start)
            seg[r, start:start + n] = s
            pos[r, start:start + n] = np.arange(n)
            start, s = start + n, s + 1
    return {"tokens": rng.randint(1, vocab, size=(rows, seq_len)).astype(np.int32), "positions": pos,
            "segment_ids": seg, "loss_mask": np.ones((rows, seq_len), np.float32)}


def build_midtrain_step(cfg, args) -> Built:
    mc = _model_config(cfg)
    mesh = _mesh(cfg)
    t = cfg.train
    _, _, _, _, init, step = compiled_functions(mc, cfg.optimizer, t.steps, mesh, t.grad_accum,
                                                t.nonfinite == "skip")
    host = synthetic_rows(np.random.RandomState(args.seed), mc.vocab_size, t.global_batch, cfg.data.seq_len)
    batch = sharding.global_batch(host, mesh, t.global_batch)
    params = models.init_params(mc, jax.random.PRNGKey(args.seed), mesh)
    holder = {"state": init(params, jax.random.fold_in(jax.random.key(args.seed), 1))}
    with sharding.use_mesh(mesh):
        compiled = step.jitted.lower(holder["state"], batch).compile()

    def run():
        holder["state"], metrics = compiled(holder["state"], batch)
        return metrics

    real = host["segment_ids"] > 0
    tokens, keys = int(real.sum()), _key_sum(host["positions"], real)
    seg = host["segment_ids"]
    targets = float(((seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)).sum())
    flops = profiling.pass_flops(mc, tokens, targets, keys, train=True)
    facts = {"rows": t.global_batch, "seq_len": cfg.data.seq_len, "grad_accum": t.grad_accum,
             "segments": int(seg.max(axis=1).sum()), "remat": mc.remat}
    return Built(run, compiled, mc, True, tokens, "tokens", flops, keys / tokens, mesh.size, facts)


# ------------------------------------------------------------------------------------------ sampler
def build_sampler(cfg, args) -> Built:
    mc = _model_config(cfg)
    mesh = _mesh(cfg)
    B, P, N = args.batch, args.prompt_tokens, args.new_tokens
    rng = np.random.RandomState(args.seed)
    full = lambda v, dt: np.full((B,), v, dt)  # noqa: E731
    inputs = (rng.randint(1, mc.vocab_size, size=(B, P)).astype(np.int32),
              np.broadcast_to(np.arange(P, dtype=np.int32), (B, P)).copy(), np.ones((B, P), np.int32),
              full(P, np.int32), full(1.0, np.float32), full(1.0, np.float32), full(0, np.int32),
              full(1.0, np.float32), full(N, np.int32), np.full((B, 4), -1, np.int32), full(args.seed, np.uint32),
              np.arange(B, dtype=np.uint32), full(True, bool))
    params = models.init_params(mc, jax.random.PRNGKey(args.seed), mesh)
    placed = [jax.device_put(x, sharding.batch_sharding(mesh, x.shape, mc)) for x in inputs]
    with sharding.use_mesh(mesh):
        compiled = sampler.generate_bucket.lower(mc, params, N, False, *placed).compile()

    def run():
        return compiled(params, *placed)

    prefill_keys = B * P * (P + 1) / 2
    decode_keys = B * sum(P + i for i in range(1, N))
    flops = (profiling.pass_flops(mc, B * P, B, prefill_keys, train=False)
             + profiling.pass_flops(mc, B * (N - 1), B * (N - 1), decode_keys, train=False))
    facts = {"batch": B, "prompt_tokens": P, "new_tokens": N, "prefill_tokens": B * P}
    keys_per_token = (prefill_keys + decode_keys) / (B * (P + N - 1))
    return Built(run, compiled, mc, False, B * N, "generated tokens", flops, keys_per_token, mesh.size, facts)


# ------------------------------------------------------------------------------------------ the run
def peak_flops(args) -> tuple[float | None, str]:
    """(peak FLOP/s per device or None, where it came from)."""
    if args.peak_flops is not None:
        if not args.peak_flops > 0:
            raise ConfigError(f"--peak-flops must be > 0, got {args.peak_flops}")
        return args.peak_flops, "--peak-flops"
    if args.device == "auto":
        kind = jax.devices()[0].device_kind
        key = profiling.device_for_kind(kind)
        if key is None:
            return None, f"device kind {kind!r} not in the table (give --device or --peak-flops)"
        return profiling.PEAK_FLOPS[key], f"{key} (auto: {kind})"
    if args.device not in profiling.PEAK_FLOPS:
        raise ConfigError(f"--device {args.device!r}: expected auto or one of {', '.join(profiling.PEAK_FLOPS)}")
    return profiling.PEAK_FLOPS[args.device], args.device


def summarize(args, built: Built, times: list[float], cost: dict | None, matmul: dict, memory: tuple,
              peak: tuple[float | None, str]) -> dict:
    """The numbers of summary.json (see the module docstring for each)."""
    median = statistics.median(times)
    achieved = built.model_flops / median
    peak_value, peak_source = peak
    return {
        "what": args.what, "config": args.config, "overrides": list(args.overrides), "steps": len(times),
        "backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind, "devices": built.devices,
        "step_time_s": {"best": min(times), "median": median, "all": times},
        "tokens_per_step": built.tokens, "token_kind": built.token_kind, "tokens_per_s": built.tokens / median,
        "model_flops_per_step": built.model_flops, "model_flops_per_token": built.model_flops / built.tokens,
        "keys_per_token": built.keys_per_token,
        "conventional_flops_per_token": profiling.model_flops_per_token(built.model_config, built.keys_per_token,
                                                                        built.train),
        "achieved_flops_per_s": achieved,
        "peak_flops_per_device": peak_value, "peak_source": peak_source,
        "mfu": None if peak_value is None else achieved / (peak_value * built.devices),
        "hlo_matmul_flops_per_step": matmul["total"],
        "hlo_matmul_over_model_flops": matmul["total"] / built.model_flops,
        "xla_cost_whole_program": cost,
        "memory_bytes": {"temp": memory[0], "output": memory[1]},
        "batch": built.facts,
    }


def _si(x: float | None, unit: str = "") -> str:
    if x is None:
        return "n/a"
    for k, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= k:
            return f"{x / k:.3g} {p}{unit}"
    return f"{x:.3g} {unit}"


def summary_markdown(s: dict, matmul: dict) -> str:
    t = s["step_time_s"]
    mfu = "n/a (no peak: " + s["peak_source"] + ")" if s["mfu"] is None else f"{s['mfu']:.2%} of {s['devices']} x " \
        f"{_si(s['peak_flops_per_device'], 'FLOP/s')} ({s['peak_source']})"
    cost = s["xla_cost_whole_program"]
    lines = [
        f"# Profile: {s['what']} of {s['config']}",
        "",
        f"{s['backend']} ({s['device_kind']}) x {s['devices']}; overrides: {' '.join(s['overrides']) or 'none'}; "
        f"batch: {json.dumps(s['batch'])}",
        "",
        "| quantity | value |",
        "|---|---|",
        f"| step time, best / median of {s['steps']} | {t['best'] * 1e3:.2f} ms / {t['median'] * 1e3:.2f} ms |",
        f"| {s['token_kind']} per step | {s['tokens_per_step']} |",
        f"| {s['token_kind']} / s (median step) | {s['tokens_per_s']:.1f} |",
        f"| model FLOPs per step | {_si(s['model_flops_per_step'], 'FLOP')} |",
        f"| model FLOPs / token (this step's passes) | {_si(s['model_flops_per_token'], 'FLOP')} |",
        f"| conventional {'6N' if 'step' in s['what'] else '2N'} + attention / token (c = "
        f"{s['keys_per_token']:.1f} keys) | {_si(s['conventional_flops_per_token'], 'FLOP')} |",
        f"| achieved model FLOP/s | {_si(s['achieved_flops_per_s'], 'FLOP/s')} |",
        f"| MFU | {mfu} |",
        f"| HLO matmul FLOPs per step / model FLOPs | {_si(s['hlo_matmul_flops_per_step'], 'FLOP')} / "
        f"{s['hlo_matmul_over_model_flops']:.2f}x |",
        "| XLA cost analysis, whole program (while bodies once) | "
        + ("n/a |" if cost is None else f"{_si(cost.get('flops'), 'FLOP')}, "
           f"{_si(cost.get('bytes accessed'), 'B')} accessed |"),
        f"| compiled temp / output memory | {_si(s['memory_bytes']['temp'], 'B')} / "
        f"{_si(s['memory_bytes']['output'], 'B')} |",
        "",
        "## Matmul FLOPs per scope (compiled HLO, loop bodies x trip count; a scope includes the scopes inside it)",
        "",
        "| scope | FLOPs / step | backward share | share of all matmul FLOPs |",
        "|---|---|---|---|",
    ]
    total = matmul["total"] or 1.0
    for name, v in list(matmul["scopes"].items()) + [("(no scope)", {"flops": matmul["unscoped"], "backward": 0})]:
        if v["flops"]:
            bwd = f"{v['backward'] / v['flops']:.0%}" if name != "(no scope)" else "-"
            lines.append(f"| {name} | {_si(v['flops'], 'FLOP')} | {bwd} | {v['flops'] / total:.1%} |")
    if matmul["unknown_trip_counts"]:
        lines += ["", f"{matmul['unknown_trip_counts']} while loop(s) without a known trip count (data-dependent) "
                      "are counted once per call."]
    lines += ["", "Files: plugins/profile/*/ (trace: TensorBoard / XProf; *.trace.json.gz: Perfetto), "
                  "program.hlo.txt, cost_analysis.json, summary.json. "
                  "Definitions: mimesis_jax/commands/profile.py.", ""]
    return "\n".join(lines)


BUILDERS = {"grpo_step": lambda cfg, args: build_rl_step(cfg, args, "grpo_step"),
            "csd_step": lambda cfg, args: build_rl_step(cfg, args, "csd_step"),
            "midtrain_step": build_midtrain_step, "sampler": build_sampler}


def run(args) -> int:
    """Profiles `args.what` (module docstring); returns 0. Bad arguments raise ConfigError naming the flag."""
    if args.what not in WHATS:
        raise ConfigError(f"--what {args.what!r}: expected one of {', '.join(WHATS)}")
    for flag in ("steps", "prompt_tokens", "user_tokens", "note_tokens", "reply_tokens", "batch", "new_tokens"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    peak = peak_flops(args)
    cfg = _load(args.config, args.overrides, args.what)
    built = BUILDERS[args.what](cfg, args)
    os.makedirs(args.out, exist_ok=True)
    jax.block_until_ready(built.step())  # warm-up: the first run of the compiled program
    times = []
    with contextlib.nullcontext() if args.no_trace else jax.profiler.trace(args.out):
        for i in range(args.steps):
            with jax.profiler.StepTraceAnnotation(args.what, step_num=i):
                t0 = time.perf_counter()
                jax.block_until_ready(built.step())
                times.append(time.perf_counter() - t0)
    hlo = built.compiled.as_text()
    with open(os.path.join(args.out, "program.hlo.txt"), "w") as f:
        f.write(hlo)
    cost = profiling.xla_cost(built.compiled)
    matmul = profiling.hlo_matmul_flops(hlo, SCOPES)
    with open(os.path.join(args.out, "cost_analysis.json"), "w") as f:
        json.dump({"xla_whole_program": cost, "per_scope": "not offered by XLA's cost analysis (whole program only); "
                   "hlo_matmul_flops counts the matmuls per scope from the HLO", "hlo_matmul_flops": matmul}, f,
                  indent=2)
    summary = summarize(args, built, times, cost, matmul, profiling.memory_bytes(built.compiled), peak)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(summary_markdown(summary, matmul))
    mfu = "n/a" if summary["mfu"] is None else f"{summary['mfu']:.2%}"
    print(f"profile {args.what}: median step {summary['step_time_s']['median'] * 1e3:.2f} ms, "
          f"{summary['tokens_per_s']:.1f} {built.token_kind}/s, {_si(summary['achieved_flops_per_s'], 'FLOP/s')}, "
          f"MFU {mfu}: {os.path.join(args.out, 'summary.md')}", flush=True)
    return 0
