"""`python -m mimesis_jax theory`: the theory lab -- every claim of docs/reference/paper.md §7 (Appendix E) checked on small
finite problems (theory/claims.py), printed as a table.

    python -m mimesis_jax theory [--out runs/theory] [--seed 0]

Prints claim | setting | measured | expected | pass, writes `theory.json` (every row with its numbers, the
Theorem E.2 sweep and the sampled AdamW curves), `theory_e2_sweep.png` and `theory_adamw.png` to --out.
Exit status: 0 when every claim holds as the paper states it (the "(failure)" rows hold when they show the
documented failure), 1 when one does not, 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from mimesis_jax.eval.metrics import mean_and_se
from mimesis_jax.theory.claims import all_claims

SWEEP_PLOT = "theory_e2_sweep.png"
ADAMW_PLOT = "theory_adamw.png"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=os.path.join("runs", "theory"),
                   help="output folder for theory.json and the plots (created if missing)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random problem (>= 0)")


def format_table(results) -> str:
    """The claims as a text table: claim | setting | measured | expected | pass."""
    head = ("claim", "setting", "measured", "expected", "pass")
    rows = [(r.claim, r.setting, r.measured, r.expected, "yes" if r.passed else "NO") for r in results]
    widths = [max(len(row[i]) for row in [head] + rows) for i in range(len(head))]
    line = lambda row: " | ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
    return "\n".join([line(head), "-+-".join("-" * w for w in widths)] + [line(row) for row in rows])


def plot_sweep(sweep, path: str) -> None:
    """One heat map per step length: share of noise draws where GRPO + alpha CSD beats GRPO, over
    (lambda, epsilon); cells where the alignment inequality holds are outlined."""
    # lazy (b): matplotlib only when plotting
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    n = len(sweep.step_lengths)
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n + 1.0, 3.6), sharey=True, constrained_layout=True)
    for k, ax in enumerate(np.atleast_1d(axes)):
        im = ax.imshow(sweep.wins[:, :, k], cmap="RdYlGn", vmin=0.0, vmax=1.0, origin="lower", aspect="auto")
        for i in range(len(sweep.lambdas)):
            for j in range(len(sweep.epsilons)):
                ax.text(j, i, f"{sweep.wins[i, j, k]:.2f}".rstrip("0").rstrip("."), ha="center", va="center",
                        fontsize=6)
                if sweep.bound[i, j]:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=1.5, ec="black"))
        ax.set_xticks(range(len(sweep.epsilons)), [f"{e:g}" for e in sweep.epsilons], rotation=60, fontsize=7)
        ax.set_yticks(range(len(sweep.lambdas)), [f"{x:g}" for x in sweep.lambdas], fontsize=7)
        ax.set_xlabel("epsilon (RMS of e)")
        ax.set_title(f"|step| = {sweep.step_lengths[k]:g}", fontsize=9)
    np.atleast_1d(axes)[0].set_ylabel("lambda")
    fig.colorbar(im, ax=axes, label="share of draws: GRPO+aCSD gains more")
    fig.suptitle(f"Theorem E.2: exact directions, alpha={sweep.alpha:g}, |g|={sweep.g_norm:.3f} "
                 "(outlined: alignment inequality holds)", fontsize=9)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_adamw(curves, path: str) -> None:
    """Exact J per AdamW step after the shared branch point, mean +/- SE over the sampled runs, per arm."""
    # lazy (b): matplotlib only when plotting
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8), constrained_layout=True)
    steps = np.arange(curves.J.shape[2])
    colours = {"GRPO": "black", "aligned": "tab:green", "misaligned": "tab:red", "noise": "tab:orange"}
    for a, arm in enumerate(curves.arms):
        stats = np.array([mean_and_se(curves.J[a, :, t].tolist()) for t in steps])
        ax.plot(steps, stats[:, 0], label=arm, color=colours.get(arm))
        ax.fill_between(steps, stats[:, 0] - stats[:, 1], stats[:, 0] + stats[:, 1], alpha=0.25,
                        color=colours.get(arm))
    ax.set_xlabel("AdamW steps after the shared state")
    ax.set_ylabel("exact return J")
    ax.set_title(f"Sampled GRPO vs GRPO + alpha CSD ({curves.J.shape[1]} runs, mean +/- SE)", fontsize=9)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args) -> int:
    if args.seed < 0:
        print(f"error: --seed must be >= 0, got {args.seed}", file=sys.stderr)
        return 2
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        print(f"error: --out {args.out} exists and is not a folder", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    results, sweep, curves = all_claims(args.seed)
    plot_sweep(sweep, os.path.join(args.out, SWEEP_PLOT))
    plot_adamw(curves, os.path.join(args.out, ADAMW_PLOT))
    ok = all(r.passed for r in results)
    with open(os.path.join(args.out, "theory.json"), "w") as f:
        json.dump({"seed": args.seed, "all_pass": ok, "claims": [r.to_json() for r in results],
                   "e2_sweep": sweep.to_json(), "adamw_sampled": curves.to_json(),
                   "plots": [SWEEP_PLOT, ADAMW_PLOT]}, f, indent=1)
    print(format_table(results))
    print(f"{sum(r.passed for r in results)}/{len(results)} claims hold as docs/reference/paper.md §7 states them "
          f"({time.perf_counter() - t0:.1f} s) -> {args.out}")
    return 0 if ok else 1
