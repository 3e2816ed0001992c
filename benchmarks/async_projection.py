"""Synchronous vs asynchronous agent RL at paper scale, projected by the discrete-event model of
mimesis_jax/plan/async_model.py (issue #44 item 7, third bullet): the Stage II CSD config at equal devices.

    python benchmarks/async_projection.py                          # configs/qwen3_8b_agentrl.py:csd, 16x A100-80GB
    python benchmarks/async_projection.py --max-staleness 1 --rollout-devices 4,6,8
    python benchmarks/async_projection.py --user-median-s 1 --train-mfu 0.2 --user-concurrency 64

Every schedule runs the same drawn dialogues (--seed) for --steps steps; throughput counts the steps after
--warmup-steps. The asynchronous schedule on split pools is run for every --rollout-devices split (the rest of the
devices train), and on shared devices (rollout.devices=0: every device rolls out and trains, taking turns); each
is compared with the synchronous schedule (dialogues independent) and with the learner's rounds (every dialogue's
turn k before any turn k + 1); every ratio comes from runs in this process.

The step's shape (prompts, group size, mini-batch, turn and token limits, CSD) is the config's. Everything else is
an assumption, printed first: the dialogue distributions the paper does not give (reply and user-turn lengths,
when the environment ends a dialogue, user and coach latencies) and the program times, derived from the device's
datasheet with stated efficiencies (`programs_for`); a flag per value replaces it, e.g. with a device's measured
decode step (`--decode-step-s`), update cost (`--train-token-s`) or weight sync (`--sync-s`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from mimesis_jax.config import AgentRLConfig, load_config
from mimesis_jax.errors import ConfigError
from mimesis_jax.plan import async_model as am

CONFIG = "configs/qwen3_8b_agentrl.py:csd"
# the Workload fields the config sets; the rest are the distributions' assumptions, each a flag
FROM_CONFIG = ("prompts_per_step", "group_size", "mini_batch_prompts", "max_turns", "agent_max_tokens",
               "max_context_tokens", "max_prompt_tokens", "csd")
DERIVED = ("decode_step_s", "decode_ctx_s", "prefill_tok_s", "train_token_s")  # from --device unless given
DERIVATION = {"device": "a100-80g", "decode_bw_eff": 0.7, "prefill_mfu": 0.5, "train_mfu": 0.4}
WHY = {
    "reply_median": "agent reply tokens per turn (lognormal median; the paper prints only the 2,048-token cap)",
    "end_prob": "the environment ends a dialogue after a turn with this chance (else 16 turns; the paper prints the cap)",
    "user_median_s": "simulator reply latency, median s (MIMESIS-9B thinks first: ~400 tokens at ~50 tok/s served)",
    "coach_median_s": "coach note latency, median s (a note of at most 256 tokens from the same endpoint)",
    "user_concurrency": "user-side calls served at once (0: the endpoint scales with the load; the config's "
                        "rollout.env_workers is 64 per process)",
    "replica_slots": "dialogues in flight per rollout replica (their KV cache: ~140 GB free on 2 x 80 GB at "
                     "147 KB per token holds 128 dialogues of ~7K tokens)",
    "decode_bw_eff": "decode reads weights and KV at this share of the HBM bandwidth",
    "prefill_mfu": "prefill runs at this share of the bf16 peak",
    "train_mfu": "the update runs at this share of the bf16 peak (the project's own MFU, of a 1B model: "
                 "docs/benchmarks.md, On an accelerator)",
    "csd_factor": "fused CSD update / GRPO update (the H200 figure at 8 turns: docs/benchmarks.md, On an "
                  "accelerator)",
    "sync_s": "one weight sync trainer -> rollout pool (16.4 GB of bf16 weights; both pools wait); on shared "
              "devices the publish into the engine's copy, every device waiting (sync: none counted)",
    "reprefill": "1: a turn after new weights prefills its dialogue's whole context (the engine's set_params drops "
                 "its cached dialogues); 0: only what the dialogue gained",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=CONFIG)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup-steps", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-staleness", type=int, default=2)
    p.add_argument("--rollout-devices", default="", help="comma list (default: every multiple of "
                   "--replica-devices that leaves a training device)")
    for name, default in DERIVATION.items():
        p.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    workload = [f for f in dataclasses.fields(am.Workload) if f.name not in FROM_CONFIG]
    for f in workload + list(dataclasses.fields(am.Programs)):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None,
                       help=WHY.get(f.name, f"default {f.default}" if f.name not in DERIVED else "from --device"))
    return p


def _inputs(args):
    cfg = load_config(args.config, kind=AgentRLConfig)
    given = {k: v for k, v in vars(args).items() if v is not None}
    names = {f.name for f in dataclasses.fields(am.Workload)} - set(FROM_CONFIG)
    w = am.workload_from_config(cfg, **{k: given[k] for k in names if k in given})
    pnames = [f.name for f in dataclasses.fields(am.Programs)]
    kept = {k: given[k] for k in pnames if k in given and k not in DERIVED}
    p = am.programs_for(cfg.model, **{k: args.__dict__[k] for k in DERIVATION}, **kept)
    return w, dataclasses.replace(p, **{k: given[k] for k in DERIVED if k in given})


def _splits(args, p: am.Programs) -> list[int]:
    if args.rollout_devices:
        try:
            return [int(x) for x in args.rollout_devices.split(",")]
        except ValueError:
            raise ConfigError(f"--rollout-devices {args.rollout_devices!r}: expected a comma list of integers")
    return list(range(p.replica_devices, p.devices, p.replica_devices))


def _row(name: str, r: am.Projection, base: am.Projection, steps: int) -> str:
    return (f"| {name} | {r.window_s / steps:.0f} | {r.groups_per_hour:.0f} | {r.tokens_per_hour / 1e6:.2f} | "
            f"{r.rollout_tok_dev_s:.0f} | "
            f"{r.rollout_busy:.0%} | {r.trainer_busy:.0%} | {r.sync_fraction:.1%} | {r.staleness_mean:.2f} | "
            f"{r.staleness_max} | **{r.groups_per_hour / base.groups_per_hour:.2f}x** |")


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        w, p = _inputs(args)
        if args.steps < 2 or not 0 <= args.warmup_steps < args.steps:
            raise ConfigError(f"--steps {args.steps} --warmup-steps {args.warmup_steps}: need steps >= 2 and "
                              "0 <= warmup < steps")
        splits = _splits(args, p)
        for r in splits:
            am.check(w, p, am.Schedule("async", r, args.max_staleness))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"config {args.config}: {w.prompts_per_step} prompts x {w.group_size} dialogues per step, "
          f"{w.prompts_per_step // w.mini_batch_prompts} updates per step, <= {w.max_turns} turns, "
          f"context <= {w.max_context_tokens}, CSD {'on' if w.csd else 'off'}; {p.devices} x {args.device}")
    print("assumptions:")
    for k in [f.name for f in dataclasses.fields(am.Workload) if f.name not in FROM_CONFIG]:
        print(f"  {k} = {getattr(w, k)}" + (f"  ({WHY[k]})" if k in WHY else ""))
    for k, v in DERIVATION.items():
        print(f"  {k} = {getattr(args, k)}" + (f"  ({WHY[k]})" if k in WHY else ""))
    for f in dataclasses.fields(am.Programs):
        print(f"  {f.name} = {getattr(p, f.name):.4g}" + (f"  ({WHY[f.name]})" if f.name in WHY else ""))
    plans = am.draw_plans(w, args.steps, args.seed)
    agent = [d.agent_tokens for g in plans for d in g]
    turns = [len(d.turns) for g in plans for d in g]
    print(f"drawn: {len(agent)} dialogues, {sum(turns) / len(turns):.2f} agent turns and {sum(agent) / len(agent):.0f} "
          f"agent tokens per dialogue (seed {args.seed})")
    sync = am.simulate(w, p, am.Schedule("sync"), plans, warmup_steps=args.warmup_steps)
    n = args.steps - args.warmup_steps
    lines = ["| schedule | s/step | groups/h | M tokens/h | tok/rollout-dev-s | rollout busy | trainer busy | sync | "
             "staleness mean | max | vs sync |", "|---|---|---|---|---|---|---|---|---|---|---|",
             _row("sync", sync, sync, n)]
    rounds = None
    try:
        rounds = am.simulate(w, p, am.Schedule("rounds"), plans, warmup_steps=args.warmup_steps)
        lines.append(_row("sync in rounds (the learner's loop)", rounds, sync, n))
    except ConfigError as e:
        print(f"no rounds row: {e}")
    best = None
    for r in splits:
        a = am.simulate(w, p, am.Schedule("async", r, args.max_staleness), plans, warmup_steps=args.warmup_steps)
        lines.append(_row(f"async, rollout.devices={r}, max_staleness={args.max_staleness}", a, sync, n))
        if best is None or a.groups_per_hour > best[1].groups_per_hour:
            best = (r, a)
    shared = am.simulate(w, p, am.Schedule("shared", 0, args.max_staleness), plans, warmup_steps=args.warmup_steps)
    lines.append(_row(f"async on shared devices, rollout.devices=0, max_staleness={args.max_staleness}", shared,
                      sync, n))
    print("\n".join(lines))
    print(_versus(f"best split: rollout.devices={best[0]} of {p.devices}", best[1], sync, rounds))
    print(_versus(f"shared devices: all {p.devices}", shared, sync, rounds))
    print(f"ceiling: {1 / sync.trainer_busy:.2f}x the synchronous schedule's"
          + (f", {1 / rounds.trainer_busy:.2f}x the rounds'" if rounds else "")
          + f" = its step over its updates on all {p.devices} devices (at equal devices no schedule trains a step "
          "faster: split pools train on fewer, shared devices also decode)")
    return 0


def _versus(name: str, a: am.Projection, sync: am.Projection, rounds: am.Projection | None) -> str:
    return (f"{name}: {a.groups_per_hour / sync.groups_per_hour:.2f}x the synchronous schedule's groups per hour"
            + (f", {a.groups_per_hour / rounds.groups_per_hour:.2f}x the rounds'" if rounds else "")
            + f" (staleness histogram, tokens: {a.staleness_tokens})")


if __name__ == "__main__":
    sys.exit(main())
