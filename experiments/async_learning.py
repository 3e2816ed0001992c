"""Does bounded staleness hurt learning? (issue #44 item 7, second bullet.) The tiny Stage II GRPO run on the toy
gym, `rl.max_staleness` 0, 1 and 2, several seeds per arm: steps until the step's mean reward first reaches a
threshold. A script, not a test (about half an hour on a CPU for 8 seeds x 3 arms).

    python experiments/async_learning.py --out runs/async_learning [--seeds 0 1 2 3 4 5 6 7] [--max-steps 40]

Every run is configs/tiny_agentrl.py (grpo: tiny random-init Qwen3 agent, toy:16 tasks, rule-based toy user, 8
tasks x 4 dialogues per step, 4 updates per step, LR 3e-3) with `train.seed` = the seed and, in every arm, the
decoupled objective (`rl.old_logprobs=recompute rl.behavior_is_cap=5`, docs/stage2.md "Off-policy correction";
in the synchronous arm behaviour and proximal policy are the same weights, so it is Eq 6). The arms differ only in
`rl.max_staleness`; the asynchronous arms use the fixed lag (`rl.async_deterministic=true`): every token of step s
is sampled by version s - 1 - N (once the run is N steps in), staleness exactly N, the bound's worst case, and a
run's result does not depend on the machine's timing. `--no-correction` runs the arms with Eq 6 as is
(`rl.old_logprobs=rollout`, no cap) instead; `--arms 2` runs only that arm (the table compares with the arm 0 runs
of the same objective in OUT, if any); `--in-flight` runs the asynchronous arms with the default schedule
(`rl.async_deterministic=false`: new weights reach the rollouts as soon as an update ends, so staleness is at
most N and depends on timing).

Per run: the first step whose `reward_mean` (the step's mean dialogue score over its 32 dialogues, no smoothing)
is >= the threshold; a run that never reaches it by --max-steps is censored and counts as max_steps + 1. A run
stops as soon as it reaches the threshold (a stop request, as SIGTERM sends; the step's checkpoint is saved and
deleted). Per arm the table gives the seeds that reached, the mean steps with a 95% Student-t interval, the
difference of means to arm 0 with Welch's 95% interval, and the two-sided exact permutation p-value of the
Mann-Whitney U statistic against arm 0 (all splits of the pooled steps enumerated; censored runs tie at the top,
which is correct for a common censoring step). Every run's result is appended to `OUT/runs.jsonl` as it ends; a
rerun skips the (arm, seed) pairs already there, and `--table` only prints the table of what is there.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import signal
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

ARMS = (0, 1, 2)
IS_CAP = 5.0


# ------------------------------------------------------------------------------------------ statistics
def first_reach(curve, threshold: float, max_steps: int) -> tuple[int, bool]:
    """(1-based step of the first value >= threshold, True), or (max_steps + 1, False) when none of the first
    `max_steps` values reaches it (censored)."""
    for i, r in enumerate(curve[:max_steps]):
        if r >= threshold:
            return i + 1, True
    return max_steps + 1, False


def t_interval(x, level: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean: mean +/- t_{(1+level)/2, n-1} s / sqrt(n), s the n-1 standard deviation;
    the point (mean, mean) for one value, or for values all equal."""
    from scipy.stats import t as student_t

    x = np.asarray(x, float)
    m = float(x.mean())
    if len(x) < 2:
        return m, m
    h = float(student_t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return m - h, m + h


def welch_interval(x, y, level: float = 0.95) -> tuple[float, float, float]:
    """(mean(x) - mean(y), low, high): Welch's interval of the difference, df by Welch-Satterthwaite; with both
    variances 0 the interval is the point."""
    from scipy.stats import t as student_t

    x, y = np.asarray(x, float), np.asarray(y, float)
    d = float(x.mean() - y.mean())
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    if vx + vy == 0:
        return d, d, d
    df = (vx + vy) ** 2 / (vx ** 2 / (len(x) - 1) + vy ** 2 / (len(y) - 1))
    h = float(student_t.ppf((1 + level) / 2, df) * math.sqrt(vx + vy))
    return d, d - h, d + h


def mann_whitney_u(x, y) -> float:
    """U of x: the pairs (a in x, b in y) with a > b, plus half the ties."""
    x, y = np.asarray(x, float)[:, None], np.asarray(y, float)[None, :]
    return float(np.sum(x > y) + 0.5 * np.sum(x == y))


def mann_whitney_p(x, y) -> float:
    """Two-sided exact permutation p-value of U: the share of all C(n+m, n) splits of the pooled values into
    groups of x's and y's sizes whose U is at least as far from n m / 2 as the observed one (ties included)."""
    pooled = np.concatenate([np.asarray(x, float), np.asarray(y, float)])
    n, centre = len(x), len(x) * len(y) / 2
    observed = abs(mann_whitney_u(x, y) - centre)
    hits = total = 0
    for idx in itertools.combinations(range(len(pooled)), n):
        mask = np.zeros(len(pooled), bool)
        mask[list(idx)] = True
        hits += abs(mann_whitney_u(pooled[mask], pooled[~mask]) - centre) >= observed - 1e-9
        total += 1
    return hits / total


def table(results: list[dict], max_steps: int, threshold: float) -> str:
    """The markdown table of the runs in `results` (dicts with arm, seed, steps, reached)."""
    by_arm = {a: sorted((r for r in results if r["arm"] == a), key=lambda r: r["seed"]) for a in ARMS}
    base = [r["steps"] for r in by_arm[0]]
    rows = [f"| max_staleness | seeds reaching {threshold} by step {max_steps} | steps (mean [95% t-CI]) | "
            f"median | difference to 0 (mean [Welch 95% CI]) | Mann-Whitney p vs 0 | steps per seed |",
            "|---|---|---|---|---|---|---|"]
    for a, runs in by_arm.items():
        if not runs:
            continue
        steps = [r["steps"] for r in runs]
        lo, hi = t_interval(steps)
        if a == 0 or len(base) < 2 or len(steps) < 2:
            diff, p = "-", "-"
        else:
            d, dl, dh = welch_interval(steps, base)
            diff, p = f"{d:+.1f} [{dl:+.1f}, {dh:+.1f}]", f"{mann_whitney_p(steps, base):.3f}"
        per_seed = " ".join(f"{r['steps']}" + ("" if r["reached"] else "+") for r in runs)
        rows.append(f"| {a} | {sum(r['reached'] for r in runs)}/{len(runs)} | {np.mean(steps):.1f} "
                    f"[{lo:.1f}, {hi:.1f}] | {np.median(steps):.1f} | {diff} | {p} | {per_seed} |")
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------ runs
def overrides(arm: int, seed: int, max_steps: int, correction: bool, in_flight: bool = False) -> list[str]:
    sets = [f"train.steps={max_steps}", f"train.seed={seed}", f"rl.max_staleness={arm}", "train.progress_bar=false",
            "train.tensorboard=false", "train.log_every=1000", "checkpoint.every=1000", "checkpoint.async_save=false"]
    if correction:
        sets += ["rl.old_logprobs=recompute", f"rl.behavior_is_cap={IS_CAP}"]
    if arm and not in_flight:
        sets.append("rl.async_deterministic=true")
    return sets


def run_one(arm: int, seed: int, max_steps: int, threshold: float, correction: bool, in_flight: bool, out: str,
            tok) -> dict:
    """One training run, stopped at the first step whose mean dialogue score reaches `threshold`."""
    from mimesis_jax.algorithms import grpo
    from mimesis_jax.train.rl import agent as rl_loop

    sets = overrides(arm, seed, max_steps, correction, in_flight)
    cfg = rl_loop.load(os.path.join(ROOT, "configs", "tiny_agentrl.py"), sets)
    wd = os.path.join(out, "work", f"staleness{arm}_seed{seed}")
    shutil.rmtree(wd, ignore_errors=True)  # never resume an earlier run's checkpoint

    def stop_when_reached(step, trajectories):  # the step record's reward_mean (agent.py _step_record)
        scores = [grpo.trajectory_score(t.turn_rewards, cfg.rl.score, cfg.rl.gamma) for t in trajectories
                  if t.status == "ok" and t.num_agent_turns > 0]
        if scores and float(np.mean(scores)) >= threshold:
            os.kill(os.getpid(), signal.SIGTERM)  # the loop's stop flag: it stops after this step

    t0 = time.perf_counter()
    res = rl_loop.run(cfg, wd, tokenizer=tok, handle_signals=True, on_rollouts=stop_when_reached,
                      log=lambda *a: None)
    curve = [float(res.metrics[s]["reward_mean"]) for s in sorted(res.metrics)]
    steps, reached = first_reach(curve, threshold, max_steps)
    if len(curve) < max_steps and not reached:
        raise RuntimeError(f"staleness {arm} seed {seed}: stopped at step {len(curve)} below {threshold}")
    stale = [float(res.metrics[s].get("staleness_max", 0.0)) for s in sorted(res.metrics)]
    # per step, the trained tokens' mean staleness: under the in-flight schedule it shows how fresh they were
    stale_mean = [round(float(res.metrics[s].get("staleness_mean", 0.0)), 4) for s in sorted(res.metrics)]
    shutil.rmtree(wd, ignore_errors=True)
    return {"arm": arm, "seed": seed, "steps": steps, "reached": reached, "curve": curve,
            "staleness_max": max(stale), "staleness_mean": stale_mean, "wall_s": round(time.perf_counter() - t0, 1), "correction": correction,
            "schedule": "in-flight" if in_flight and arm else "fixed"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/async_learning")
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    p.add_argument("--max-steps", type=int, default=40, help="RL steps before a run counts as censored")
    p.add_argument("--threshold", type=float, default=0.8, help="the step mean reward to reach")
    p.add_argument("--no-correction", action="store_true", help="Eq 6 as is instead of the decoupled objective")
    p.add_argument("--in-flight", action="store_true",
                   help="the asynchronous arms with the default in-flight schedule instead of the fixed lag")
    p.add_argument("--arms", type=int, nargs="+", default=list(ARMS), choices=ARMS, help="the max_staleness arms to run")
    p.add_argument("--table", action="store_true", help="only print the table of OUT/runs.jsonl")
    args = p.parse_args(argv)
    if args.max_steps < 1:
        raise SystemExit(f"--max-steps must be >= 1, got {args.max_steps}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "runs.jsonl")
    results = []
    if os.path.exists(path):
        with open(path) as f:
            results = [json.loads(line) for line in f if line.strip()]
    correction = not args.no_correction
    schedule = "in-flight" if args.in_flight else "fixed"
    # the synchronous arm has no schedule: its runs serve both
    results = [r for r in results if r["correction"] == correction and (r["arm"] == 0 or r["schedule"] == schedule)]
    if not args.table:
        from mimesis_jax.data.tokenizer import load_tokenizer

        tok = load_tokenizer("tiny")
        done = {(r["arm"], r["seed"]) for r in results}
        for seed in args.seeds:  # seeds outermost: a partial study has every arm at about the same seeds
            for arm in args.arms:
                if (arm, seed) in done:
                    continue
                r = run_one(arm, seed, args.max_steps, args.threshold, correction, args.in_flight, args.out, tok)
                results.append(r)
                with open(path, "a") as f:
                    f.write(json.dumps(r) + "\n")
                print(f"max_staleness {arm} seed {seed}: {r['steps']}{'' if r['reached'] else '+'} steps "
                      f"(staleness_max {r['staleness_max']:.0f}, {r['wall_s']:.0f} s)", flush=True)
    results = [r for r in results if r["seed"] in args.seeds]
    print(f"steps to a step mean reward >= {args.threshold} (decoupled objective: {correction}, {schedule} "
          "schedule; '+': censored)")
    print(table(results, args.max_steps, args.threshold))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
