"""The training commands: `midtrain` and `sft` (Stage I.1 / I.2), `simrl` (Stage I.3) and `agentrl` (Stage II).
One module serves the four: they take the same flags and `run` picks the stage by `args.command`."""

from __future__ import annotations

import argparse
import os

from mimesis_jax.config import load_config
from mimesis_jax.errors import ConfigError
from mimesis_jax.train import midtrain, sft
from mimesis_jax.train.rl import agent as agent_stage, simulator as simulator_stage

LM_STAGES = {"midtrain": midtrain, "sft": sft}


def add_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--config", required=True, help="configs/<name>.py[:variant] defining get_config()")
    p.add_argument("--workdir", required=True, help="checkpoints, metrics.jsonl, tensorboard/")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.steps=100 checkpoint.every=10")
    g = p.add_argument_group("multi-host")
    g.add_argument("--distributed", action="store_true", help="initialise jax.distributed first")
    g.add_argument("--coordinator", default=None, help="host:port of process 0 (auto-detected if omitted)")
    g.add_argument("--num-processes", type=int, default=None)
    g.add_argument("--process-id", type=int, default=None)
    return p


def check_workdir(workdir: str) -> None:
    """A training workdir must be a directory or creatable as one: say so before any work, naming the path."""
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


def run_lm_stage(stage: str, cfg, workdir: str):
    return LM_STAGES[stage].run(cfg, workdir)


def run(args) -> int:
    check_workdir(args.workdir)
    if args.command in LM_STAGES:
        res = run_lm_stage(args.command, load_config(args.config, args.overrides), args.workdir)
    elif args.command == "simrl":
        res = simulator_stage.run(simulator_stage.load(args.config, args.overrides), args.workdir)
    else:
        res = agent_stage.run(agent_stage.load(args.config, args.overrides), args.workdir)
    print(f"{args.command}: step {res.final_step}, checkpoint step {res.checkpoint_step}"
          f"{' (stopped by signal)' if res.preempted else ''}: {res.workdir}", flush=True)
    return 0
