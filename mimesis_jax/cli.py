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
    rehearse --config configs/<paper RL config>.py[:variant] [--engine off|on|both] [--steps N] [--json FILE]
                                    the config at tiny width, paper structure, 1-2 steps here: memory vs plan
    profile  --config configs/<name>.py --what grpo_step|csd_step|sampler|midtrain_step --steps N --out DIR

A config file with variants takes one after a colon (``--config configs/mimesis_simrl.py:9b``; the file's VARIANTS,
the first by default). A training command resumes when DIR already holds a checkpoint. Exit status: 0 on success and after a
SIGTERM-triggered checkpoint; 1 when training stops on a non-finite loss or runs out of data; 2 for a bad
config, argument or checkpoint (the message names the key or file).
Multi-host: add ``--distributed`` (jax.distributed, auto-detected on TPU pods and SLURM) -- see launch/.
"""

from __future__ import annotations

import argparse
import sys

import jax

from mimesis_jax.checkpoints import CheckpointError
from mimesis_jax.commands import (ablate, demo, evalagent, evalsim, export, plan, profile, rehearse, report, rollout,
                                  serve, show_config, theory, train)
from mimesis_jax.data.tokenizer import TokenizerError
from mimesis_jax.errors import ConfigError
from mimesis_jax.sharding import initialize_distributed
from mimesis_jax.train.loop import DataExhaustedError, NonFiniteLossError

# Every command: (its module, help). The module exposes add_args(parser) and run(args) -> exit code.
COMMANDS = {
    "midtrain": (train, "run the midtrain stage"),
    "sft": (train, "run the sft stage"),
    "simrl": (train, "Stage I.3: joint multi-domain RL of the simulator (FoldGRPO, Eq 4)"),
    "agentrl": (train, "Stage II: train the agent against the frozen simulator (GRPO + CSD)"),
    "export": (export, "write a checkpoint as a HF model directory"),
    "demo": (demo, "the tiny end-to-end Stage I job on shipped samples"),
    "serve": (serve, "serve a local model on an OpenAI-compatible /v1/chat/completions"),
    "rollout": (rollout, "run episodes of the UserRL gyms; trajectories to JSONL"),
    "evalagent": (evalagent, "evaluate agents x users x gyms: pass@1, per-gym means, Avg, MR"),
    "evalsim": (evalsim, "evaluate a simulator: USI / USI5, fidelity index, Turing, SOUL-Index"),
    "report": (report, "report.md + plots from training, evaluation and ablation dirs"),
    "ablate": (ablate, "run a grid of runs differing in named switches and tabulate them"),
    "theory": (theory, "check the CSD theory (paper Appendix E) on small finite problems"),
    "plan": (plan, "per-device memory plan of a config on a mesh and device: fits or not"),
    "rehearse": (rehearse, "run a paper RL config narrowed to tiny widths: compiled memory "
                 "vs plan, compilations, seconds, tokens"),
    "profile": (profile, "profile a step: trace with named scopes, HLO, cost analysis, MFU"),
    "config": (show_config, "print the resolved run config as JSON"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mimesis_jax", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = p.add_subparsers(dest="command", required=True, metavar="command")
    for name, (module, help_text) in COMMANDS.items():
        module.add_args(sub.add_parser(name, help=help_text))
    p.set_defaults(distributed=False)  # the commands without --distributed run on one process
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.distributed:
            # CPU processes (tests, CPU clusters) exchange collectives over gloo; GPU/TPU backends ignore this
            jax.config.update("jax_cpu_collectives_implementation", "gloo")

            initialize_distributed(args.coordinator, args.num_processes, args.process_id)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[args.command][0].run(args)
    except (ConfigError, CheckpointError, TokenizerError, FileNotFoundError, NotADirectoryError,
            IsADirectoryError, PermissionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (NonFiniteLossError, DataExhaustedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
