"""`python -m mimesis_jax demo`: the tiny pipeline on a CPU -- mid-training -> ThoughtTrace SFT -> joint RL
(simrl) -> export -> load_hf -> agent GRPO and GRPO + CSD with the simulator coaching."""

from __future__ import annotations

import argparse
import gc
import os
import time

import jax
import numpy as np

from mimesis_jax import models
from mimesis_jax.commands.train import check_workdir, run_lm_stage
from mimesis_jax.config import load_config
from mimesis_jax.train.export import export_hf
from mimesis_jax.train.metrics import read_metrics
from mimesis_jax.train.rl import agent as agent_stage, simulator as simulator_stage

REPO_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def add_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--workdir", default=None, help="default: runs/demo-<timestamp>")
    p.add_argument("--midtrain-config", default=os.path.join(REPO_CONFIGS, "tiny_midtrain.py"))
    p.add_argument("--sft-config", default=os.path.join(REPO_CONFIGS, "tiny_sft.py"))
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="overrides applied to both Stage I LM runs (midtrain, SFT)")
    p.add_argument("--simrl-set", dest="simrl_overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="overrides of the joint RL run (configs/tiny_simrl.py keys), after the demo's own")
    p.add_argument("--agent-set", dest="agent_overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="overrides of both agent RL arms (configs/tiny_agentrl.py keys), after the demo's own")
    p.add_argument("--simrl-steps", type=int, default=6,
                   help="joint multi-domain RL steps of the simulator (0 skips it: the SFT run is exported)")
    p.add_argument("--agent-steps", type=int, default=20, help="agent RL steps per arm (0 skips Stage II)")
    return p


def run(args) -> int:
    if args.workdir:
        check_workdir(args.workdir)
    root = args.workdir or os.path.join("runs", time.strftime("demo-%Y%m%d-%H%M%S"))
    mid_dir, sft_dir, hf_dir = (os.path.join(root, d) for d in ("midtrain", "sft", "hf"))
    t0 = time.perf_counter()
    results = {}
    for stage, path, wd, extra in (("midtrain", args.midtrain_config, mid_dir, []),
                                   ("sft", args.sft_config, sft_dir, [f"init.from_workdir={mid_dir}"])):
        print(f"=== {stage}: {path} -> {wd}", flush=True)
        cfg = load_config(path, extra + list(args.overrides))
        res = run_lm_stage(stage, cfg, wd)
        if res.preempted:
            print(f"{stage} interrupted; rerun `python -m mimesis_jax demo --workdir {root}` to resume")
            return 0
        results[stage] = res
    sim_dir = sft_dir
    if args.simrl_steps > 0:
        sim_dir = os.path.join(root, "simrl")
        path = os.path.join(REPO_CONFIGS, "tiny_simrl.py")
        print(f"=== simrl: {path} -> {sim_dir}", flush=True)
        release_stage_memory()
        # 4 micro-batches per update: the same update (the mini-batch's global normalisers are folded into the
        # token weights) in quarters, so the backward pass of its 2048-token rows through dense attention holds a
        # quarter of them at a time (peak memory: docs/decisions.md, "The demo's Stage I.3 in four micro-batches")
        res = simulator_stage.run(simulator_stage.load(path, [f"init.from_workdir={sft_dir}",
                                                              f"train.steps={args.simrl_steps}",
                                                              "rl.num_microbatches=4"]
                                                             + list(args.simrl_overrides)), sim_dir)
        if res.preempted:
            print(f"simrl interrupted; rerun `python -m mimesis_jax demo --workdir {root}` to resume")
            return 0
        rw = [res.metrics[k]["reward_mean"] for k in sorted(res.metrics)]
        if rw:
            print(f"simrl: reward {rw[0]:.3f} (step 1) -> {rw[-1]:.3f} (step {len(rw)}), checkpoint step "
                  f"{res.checkpoint_step}")
    print(f"=== export {sim_dir} -> {hf_dir}", flush=True)
    export_hf(sim_dir, hf_dir)
    config, params = models.load_hf(hf_dir)
    ids = np.arange(1, 9, dtype=np.int32)[None] % config.vocab_size
    logits = np.asarray(models.forward(config, params, ids))
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    print(f"load_hf({hf_dir}): {config.model_type}, {n} parameters, logits finite: {bool(np.isfinite(logits).all())}")
    for stage, res in results.items():
        ls = [res.losses[k] for k in sorted(res.losses)]
        if ls:
            k = max(1, len(ls) // 5)
            print(f"{stage}: loss {np.mean(ls[:k]):.3f} (first {k} steps) -> {np.mean(ls[-k:]):.3f} (last {k}), "
                  f"checkpoint step {res.checkpoint_step}")
    if args.agent_steps > 0:
        release_stage_memory()
        if _demo_agent_rl(root, sim_dir, args.agent_steps, list(args.agent_overrides)) is None:
            return 0
    print(f"demo done in {time.perf_counter() - t0:.0f} s: {os.path.abspath(root)}")
    return 0


def release_stage_memory() -> None:
    """Between demo stages that share no compiled program: drops the finished stage's executables and arrays."""
    gc.collect()
    jax.clear_caches()


def _demo_agent_rl(root: str, simulator_dir: str, steps: int, overrides=()):
    """Stage II of the demo: the frozen tiny simulator (after simrl, else the SFT run) coaches; a tiny agent is
    trained on the toy gym with GRPO and with GRPO + CSD; a table and a PNG of the reward curves go to the workdir."""
    arms = {}
    for arm in ("grpo", "csd"):
        wd = os.path.join(root, f"agent_{arm}")
        print(f"=== agent RL ({arm}): configs/tiny_agentrl.py:{arm} -> {wd}", flush=True)
        cfg = agent_stage.load(os.path.join(REPO_CONFIGS, f"tiny_agentrl.py:{arm}"),
                                 [f"train.steps={steps}", f"users.coach={simulator_dir}"] + list(overrides))
        t = time.perf_counter()
        res = agent_stage.run(cfg, wd)
        if res.preempted:
            print(f"agent RL interrupted; rerun `python -m mimesis_jax demo --workdir {root}` to resume")
            return None
        arms[arm] = (read_metrics(wd), time.perf_counter() - t)
    table = _reward_table(arms)
    print(table)
    with open(os.path.join(root, "agent_rl_summary.md"), "w") as f:
        f.write(table + "\n")
    _reward_plot(arms, os.path.join(root, "agent_rl_rewards.png"))
    print(f"reward curves: {os.path.join(root, 'agent_rl_rewards.png')}")
    return arms


def _reward_table(arms: dict) -> str:
    rows = ["| arm | steps | reward, first 3 steps | reward, last 3 steps | invalid | coach notes | wall s |",
            "|---|---|---|---|---|---|---|"]
    for arm, (recs, wall) in arms.items():
        r = [x["reward_mean"] for x in recs]
        rows.append(f"| {arm} | {len(recs)} | {np.mean(r[:3]):.3f} | {np.mean(r[-3:]):.3f} | "
                    f"{sum(x['invalid'] for x in recs)} | {sum(x['coach_notes'] for x in recs)} | {wall:.0f} |")
    return "\n".join(rows)


def _reward_plot(arms: dict, path: str) -> None:
    import matplotlib  # local: the Agg backend is chosen before pyplot loads, and only the demo plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for arm, (recs, _) in arms.items():
        ax.plot([x["step"] for x in recs], [x["reward_mean"] for x in recs], marker="o", label=arm.upper())
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean turn reward (toy gym)")
    ax.set_title("Tiny agent on the toy gym (CSD coach: the frozen tiny simulator)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
