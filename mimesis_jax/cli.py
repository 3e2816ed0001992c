"""Command line: ``python -m mimesis_jax <command> ...``

    midtrain --config configs/<name>.py --workdir DIR [--set key=value ...]   Stage I.1 (paper §3.1)
    sft      --config configs/<name>.py --workdir DIR [--set key=value ...]   Stage I.2 (paper §3.2)
    export   --workdir DIR --out HFDIR [--step N] [--dtype float32|bfloat16]  checkpoint -> HF directory
    demo     [--workdir DIR]        the tiny pipeline on a CPU: mid-training -> ThoughtTrace SFT -> joint RL (simrl)
                                    -> export -> load_hf -> agent GRPO and GRPO + CSD with the simulator coaching
    config   --config configs/<name>.py [--set ...]                            print the resolved config
    serve    --checkpoint HFDIR|WORKDIR [--step N] --port P   OpenAI-compatible /v1/chat/completions on localhost
    rollout  --agent SPEC --user SPEC [--tasks FILE ...] --n N --out FILE.jsonl   episodes of the UserRL gyms
    simrl    --config configs/<name>.py --workdir DIR [--set ...]   Stage I.3: joint multi-domain FoldGRPO (Eq 4)
    agentrl  --config configs/<name>.py --workdir DIR [--set ...]   Stage II: GRPO (+ CSD) against the simulator
    evalagent --agent NAME=SPEC ... --user NAME=SPEC ... --out DIR   agents x users x gyms: per-gym, Avg, MR
    evalsim  --conversations F --human F | --judge SPEC | --simulator SPEC --soul-tasks ... --out DIR   simulator metrics
    report   RUN_DIR... [--out DIR]   report.md + PNGs from training / evalagent / evalsim / ablation dirs
    ablate   --matrix configs/ablations/<name>.py --out DIR [--dry-run]   a grid of runs, tabulated
    theory   [--out DIR] [--seed N]   Proposition E.1 / Theorem E.2 on finite problems; exit 0 iff every claim holds
    plan     --config configs/<name>.py [--mesh data=A,fsdp=B,tensor=C] --device a100-80g   memory per device
    profile  --config configs/<name>.py --what grpo_step|csd_step|sampler|midtrain_step --steps N --out DIR

A config file with variants takes one after a colon (``--config configs/mimesis_simrl.py:9b``; the file's VARIANTS,
the first by default). A training command resumes when DIR already holds a checkpoint. Exit status: 0 on success and after a
SIGTERM-triggered checkpoint; 1 when training stops on a non-finite loss or runs out of data; 2 for a bad
config, argument or checkpoint (the message names the key or file).
Multi-host: add ``--distributed`` (jax.distributed, auto-detected on TPU pods and SLURM) -- see launch/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")

# Commands implemented by a module with add_args(parser) and run(args) -> exit code.
MODULE_COMMANDS = {
    "evalagent": ("mimesis_jax.eval.agent", "evaluate agents x users x gyms: pass@1, per-gym means, Avg, MR"),
    "evalsim": ("mimesis_jax.eval.simulator", "evaluate a simulator: USI / USI5, fidelity index, Turing, SOUL-Index"),
    "report": ("mimesis_jax.eval.report", "report.md + plots from training, evaluation and ablation dirs"),
    "ablate": ("mimesis_jax.eval.ablate", "run a grid of runs differing in named switches and tabulate them"),
    "theory": ("mimesis_jax.theory.cli", "check the CSD theory (paper Appendix E) on small finite problems"),
    "plan": ("mimesis_jax.plan", "per-device memory plan of a config on a mesh and device: fits or not"),
    "profile": ("mimesis_jax.profile_cmd", "profile a step: trace with named scopes, HLO, cost analysis, MFU"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mimesis_jax", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = p.add_subparsers(dest="command", required=True, metavar="command")

    def distributed(sp):
        g = sp.add_argument_group("multi-host")
        g.add_argument("--distributed", action="store_true", help="initialise jax.distributed first")
        g.add_argument("--coordinator", default=None, help="host:port of process 0 (auto-detected if omitted)")
        g.add_argument("--num-processes", type=int, default=None)
        g.add_argument("--process-id", type=int, default=None)

    for stage in ("midtrain", "sft"):
        sp = sub.add_parser(stage, help=f"run the {stage} stage")
        sp.add_argument("--config", required=True, help="configs/<name>.py[:variant] defining get_config()")
        sp.add_argument("--workdir", required=True, help="checkpoints, metrics.jsonl, tensorboard/")
        sp.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set train.steps=100 checkpoint.every=10")
        distributed(sp)
    sp = sub.add_parser("simrl", help="Stage I.3: joint multi-domain RL of the simulator (FoldGRPO, Eq 4)")
    sp.add_argument("--config", required=True, help="configs/<name>.py[:variant] defining get_config() -> SimRLConfig")
    sp.add_argument("--workdir", required=True, help="checkpoints, metrics.jsonl, tensorboard/")
    sp.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE")
    distributed(sp)
    sp = sub.add_parser("agentrl", help="Stage II: train the agent against the frozen simulator (GRPO + CSD)")
    sp.add_argument("--config", required=True, help="configs/<name>.py[:variant] defining get_config() -> AgentRLConfig")
    sp.add_argument("--workdir", required=True, help="checkpoints, metrics.jsonl, tensorboard/")
    sp.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE")
    distributed(sp)
    sp = sub.add_parser("export", help="write a checkpoint as a HF model directory")
    sp.add_argument("--workdir", required=True)
    sp.add_argument("--out", required=True)
    sp.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    sp.add_argument("--dtype", default="float32", help="float32 (exact) or bfloat16")
    sp = sub.add_parser("demo", help="the tiny end-to-end Stage I job on shipped samples")
    sp.add_argument("--workdir", default=None, help="default: runs/demo-<timestamp>")
    sp.add_argument("--midtrain-config", default=os.path.join(REPO_CONFIGS, "tiny_midtrain.py"))
    sp.add_argument("--sft-config", default=os.path.join(REPO_CONFIGS, "tiny_sft.py"))
    sp.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                    help="overrides applied to both Stage I runs")
    sp.add_argument("--simrl-steps", type=int, default=6,
                    help="joint multi-domain RL steps of the simulator (0 skips it: the SFT run is exported)")
    sp.add_argument("--agent-steps", type=int, default=20, help="agent RL steps per arm (0 skips Stage II)")
    from mimesis_jax.rollout import serve

    serve.add_args(sub.add_parser("serve", help="serve a local model on an OpenAI-compatible /v1/chat/completions"))
    from mimesis_jax.envs.userrl import run as gym_run

    gym_run.add_args(sub.add_parser("rollout", help="run episodes of the UserRL gyms; trajectories to JSONL"))
    import importlib

    for name, (module, help_text) in MODULE_COMMANDS.items():
        importlib.import_module(module).add_args(sub.add_parser(name, help=help_text))
    sp = sub.add_parser("config", help="print the resolved run config as JSON")
    sp.add_argument("--config", required=True)
    sp.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE")
    return p


def _run_stage(stage: str, cfg, workdir: str):
    from mimesis_jax.train import midtrain, sft

    return {"midtrain": midtrain, "sft": sft}[stage].run(cfg, workdir)


def _demo(args) -> int:
    import numpy as np

    from mimesis_jax import models
    from mimesis_jax.config import load_config
    from mimesis_jax.train.export import export_hf

    root = args.workdir or os.path.join("runs", time.strftime("demo-%Y%m%d-%H%M%S"))
    mid_dir, sft_dir, hf_dir = (os.path.join(root, d) for d in ("midtrain", "sft", "hf"))
    t0 = time.perf_counter()
    results = {}
    for stage, path, wd, extra in (("midtrain", args.midtrain_config, mid_dir, []),
                                   ("sft", args.sft_config, sft_dir, [f"init.from_workdir={mid_dir}"])):
        print(f"=== {stage}: {path} -> {wd}", flush=True)
        cfg = load_config(path, extra + list(args.overrides))
        res = _run_stage(stage, cfg, wd)
        if res.preempted:
            print(f"{stage} interrupted; rerun `python -m mimesis_jax demo --workdir {root}` to resume")
            return 0
        results[stage] = res
    sim_dir = sft_dir
    if args.simrl_steps > 0:
        from mimesis_jax.train.rl import simulator as simulator_stage

        sim_dir = os.path.join(root, "simrl")
        path = os.path.join(REPO_CONFIGS, "tiny_simrl.py")
        print(f"=== simrl: {path} -> {sim_dir}", flush=True)
        _release_stage_memory()
        # 4 micro-batches per update: the same update (the mini-batch's global normalisers are folded into the
        # token weights) in quarters. In one micro-batch, the backward pass of its 2048-token rows through dense
        # attention took this stage to a 7.7 GB peak RSS on a CPU (3.0 GB in four)
        res = simulator_stage.run(simulator_stage.load(path, [f"init.from_workdir={sft_dir}",
                                                        f"train.steps={args.simrl_steps}",
                                                        "rl.num_microbatches=4"]), sim_dir)
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
    n = sum(int(np.prod(x.shape)) for x in __import__("jax").tree.leaves(params))
    print(f"load_hf({hf_dir}): {config.model_type}, {n} parameters, logits finite: {bool(np.isfinite(logits).all())}")
    for stage, res in results.items():
        ls = [res.losses[k] for k in sorted(res.losses)]
        if ls:
            k = max(1, len(ls) // 5)
            print(f"{stage}: loss {np.mean(ls[:k]):.3f} (first {k} steps) -> {np.mean(ls[-k:]):.3f} (last {k}), "
                  f"checkpoint step {res.checkpoint_step}")
    if args.agent_steps > 0:
        _release_stage_memory()
        if _demo_agent_rl(root, sim_dir, args.agent_steps) is None:
            return 0
    print(f"demo done in {time.perf_counter() - t0:.0f} s: {os.path.abspath(root)}")
    return 0


def _release_stage_memory() -> None:
    """Between demo stages that share no compiled program: drops the finished stage's executables and arrays."""
    import gc

    import jax

    gc.collect()
    jax.clear_caches()


def _demo_agent_rl(root: str, simulator_dir: str, steps: int):
    """Stage II of the demo: the frozen tiny simulator (after simrl, else the SFT run) coaches; a tiny agent is
    trained on the toy gym with GRPO and with GRPO + CSD; a table and a PNG of the reward curves go to the workdir."""
    from mimesis_jax.train.rl import agent as agent_stage

    arms = {}
    for arm in ("grpo", "csd"):
        wd = os.path.join(root, f"agent_{arm}")
        print(f"=== agent RL ({arm}): configs/tiny_agentrl.py:{arm} -> {wd}", flush=True)
        cfg = agent_stage.load(os.path.join(REPO_CONFIGS, f"tiny_agentrl.py:{arm}"),
                                 [f"train.steps={steps}", f"users.coach={simulator_dir}"])
        t = time.perf_counter()
        res = agent_stage.run(cfg, wd)
        if res.preempted:
            print(f"agent RL interrupted; rerun `python -m mimesis_jax demo --workdir {root}` to resume")
            return None
        arms[arm] = (_read_metrics(wd), time.perf_counter() - t)
    table = _reward_table(arms)
    print(table)
    with open(os.path.join(root, "agent_rl_summary.md"), "w") as f:
        f.write(table + "\n")
    _reward_plot(arms, os.path.join(root, "agent_rl_rewards.png"))
    print(f"reward curves: {os.path.join(root, 'agent_rl_rewards.png')}")
    return arms


def _read_metrics(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _reward_table(arms: dict) -> str:
    import numpy as np

    rows = ["| arm | steps | reward, first 3 steps | reward, last 3 steps | invalid | coach notes | wall s |",
            "|---|---|---|---|---|---|---|"]
    for arm, (recs, wall) in arms.items():
        r = [x["reward_mean"] for x in recs]
        rows.append(f"| {arm} | {len(recs)} | {np.mean(r[:3]):.3f} | {np.mean(r[-3:]):.3f} | "
                    f"{sum(x['invalid'] for x in recs)} | {sum(x['coach_notes'] for x in recs)} | {wall:.0f} |")
    return "\n".join(rows)


def _reward_plot(arms: dict, path: str) -> None:
    import matplotlib

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


def _check_workdir(workdir: str) -> None:
    """A training workdir must be a directory or creatable as one: say so before any work, naming the path."""
    from mimesis_jax.models.config import ConfigError

    path = os.path.abspath(workdir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--workdir {workdir}: exists and is not a directory")
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ConfigError(f"--workdir {workdir}: cannot be created, {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"--workdir {workdir}: cannot be created, {parent} is not writable")


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from mimesis_jax.models.config import ConfigError

    try:
        if getattr(args, "distributed", False):
            import jax

            from mimesis_jax.sharding import initialize_distributed

            # CPU processes (tests, CPU clusters) exchange collectives over gloo; GPU/TPU backends ignore this
            jax.config.update("jax_cpu_collectives_implementation", "gloo")

            initialize_distributed(args.coordinator, args.num_processes, args.process_id)
        from mimesis_jax.data.tokenizer import TokenizerError
        from mimesis_jax.checkpoints import CheckpointError
        from mimesis_jax.train.loop import DataExhaustedError, NonFiniteLossError
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        if args.command in ("midtrain", "sft", "simrl", "agentrl", "demo") and args.workdir:
            _check_workdir(args.workdir)
        if args.command in ("midtrain", "sft"):
            from mimesis_jax.config import load_config

            cfg = load_config(args.config, args.overrides)
            res = _run_stage(args.command, cfg, args.workdir)
            print(f"{args.command}: step {res.final_step}, checkpoint step {res.checkpoint_step}"
                  f"{' (stopped by signal)' if res.preempted else ''}: {res.workdir}", flush=True)
            return 0
        if args.command == "simrl":
            from mimesis_jax.train.rl import simulator as simulator_stage

            res = simulator_stage.run(simulator_stage.load(args.config, args.overrides), args.workdir)
            print(f"simrl: step {res.final_step}, checkpoint step {res.checkpoint_step}"
                  f"{' (stopped by signal)' if res.preempted else ''}: {res.workdir}", flush=True)
            return 0
        if args.command == "agentrl":
            from mimesis_jax.train.rl import agent as agent_stage

            res = agent_stage.run(agent_stage.load(args.config, args.overrides), args.workdir)
            print(f"agentrl: step {res.final_step}, checkpoint step {res.checkpoint_step}"
                  f"{' (stopped by signal)' if res.preempted else ''}: {res.workdir}", flush=True)
            return 0
        if args.command == "export":
            from mimesis_jax.train.export import export_hf

            export_hf(args.workdir, args.out, args.step, args.dtype)
            return 0
        if args.command == "config":
            from mimesis_jax.config import load_config, to_dict

            print(json.dumps(to_dict(load_config(args.config, args.overrides, kind=object)), indent=2))
            return 0
        if args.command == "demo":
            return _demo(args)
        if args.command == "serve":
            from mimesis_jax.rollout import serve

            return serve.run(args)
        if args.command == "rollout":
            from mimesis_jax.envs.userrl import run as gym_run

            return gym_run.run(args)
        if args.command in MODULE_COMMANDS:
            import importlib

            mod = importlib.import_module(MODULE_COMMANDS[args.command][0])
            return mod.run(args)
    except (ConfigError, CheckpointError, TokenizerError, FileNotFoundError, NotADirectoryError,
            IsADirectoryError, PermissionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (NonFiniteLossError, DataExhaustedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    raise AssertionError(f"unhandled command {args.command!r}")


if __name__ == "__main__":
    sys.exit(main())
