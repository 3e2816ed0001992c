"""`python -m mimesis_jax rollout`: N episodes of chosen UserRL gyms with a chosen agent and user; trajectories to
JSONL, a per-gym summary to stdout.

    python -m mimesis_jax rollout --agent runs/agent_hf --user runs/sim_hf --split test --n 64 --out runs/r.jsonl
    python -m mimesis_jax rollout --agent tiny --user tiny --gyms FunctionGym,TurtleGym --n 8 --out /tmp/r.jsonl
    python -m mimesis_jax rollout --agent http://127.0.0.1:8001/v1 --agent-model qwen3-8b --agent-tokenizer qwen3 \\
        --user http://127.0.0.1:8000/v1 --user-model mimesis-9b --user-style simulator --tasks data/test.parquet

Tasks come from `--tasks` files/folders (UserRL's parquet or this project's JSONL) or the shipped split; `--n`
episodes are drawn from them by the mixture sampler (gym weights: UserRL's training row counts for the training
split, task counts otherwise), each repeated `--group` times. The judge defaults to the user's model asked as an
assistant. One JSON record per episode (episodes/userrl.py: token-exact segments, rewards, step info,
invalid reasons, both UserRL scores). Invalid episodes are counted apart, never averaged as zeros.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from tqdm import tqdm

from mimesis_jax.config import load_config
from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.userrl import mixture, scoring
from mimesis_jax.envs.userrl import retriever as r
from mimesis_jax.episodes.agent import EpisodeConfig, run_episodes
from mimesis_jax.episodes.progress import TurnReporter
from mimesis_jax.episodes.userrl import episode_tasks, trajectory_record
from mimesis_jax.errors import ConfigError
from mimesis_jax.chat.specs import ModelSpec, agent_from_spec, close_models, user_and_judge


def add_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--out", required=True, help="trajectories JSONL (one record per episode)")
    src = p.add_argument_group("tasks")
    src.add_argument("--mixture", default=None,
                     help="a mixture config (configs/userrl_{train,eval}_mixture.py); --tasks/--split/--gyms and "
                          "--max-prompt-tokens then come from it")
    src.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                     help="override a mixture config value, e.g. --set sources='(\"data/test.parquet\",)'")
    src.add_argument("--tasks", nargs="+", default=None, help="task files/folders (default: the shipped split)")
    src.add_argument("--split", choices=("train", "test"), default="test", help="shipped split when no --tasks")
    src.add_argument("--gyms", default=None, help="comma-separated UserRL gym names (default: all present)")
    src.add_argument("--n", type=int, default=None, help="tasks to draw (default: every task once, in order)")
    src.add_argument("--group", type=int, default=1, help="episodes per drawn task")
    src.add_argument("--data-dir", default=None, help="gym data files under UserRL's names (default: shipped)")
    src.add_argument("--retriever", default=None, help="SearchGym backend: bm25:CORPUS.jsonl or http(s)://URL")
    src.add_argument("--retriever-key-env", default=None, help="env var holding the search service's key")
    src.add_argument("--max-prompt-tokens", type=int, default=1152, help="drop longer prompts (0: keep all)")
    for who, default_style in (("agent", None), ("user", "simulator"), ("judge", "assistant")):
        g = p.add_argument_group(who)
        g.add_argument(f"--{who}", required=(who != "judge"),
                       help="tiny | HF dir | training workdir | http(s)://host:port/v1" +
                            (" (default: the user's model, asked as an assistant)" if who == "judge" else ""))
        g.add_argument(f"--{who}-model", default=None, help="remote: the served model name")
        g.add_argument(f"--{who}-tokenizer", default=None, help="tokenizer spec (remote agent: required)")
        g.add_argument(f"--{who}-key-env", default=None, help="remote: env var holding the API key")
        g.add_argument(f"--{who}-max-tokens", type=int, default=512)
        if default_style:
            g.add_argument(f"--{who}-style", choices=("simulator", "assistant"), default=None,
                           help=f"how the model is asked (default: {default_style} for local models, assistant "
                                "for remote ones)")
    p.add_argument("--user-thinking", action="store_true", help="local simulator writes <think> thought first")
    p.add_argument("--travel-reward-variant", choices=("eval", "train", "gym"), default="eval",
                   help="TravelGym's reward table (UserRL: eval in evaluation, train in RL)")
    p.add_argument("--max-turns", type=int, default=16, help="agent turns per episode (paper: 16)")
    p.add_argument("--temperature", type=float, default=0.0, help="agent sampling temperature (eval: 0)")
    p.add_argument("--batch", type=int, default=16, help="episodes run together (one sampler call per turn)")
    p.add_argument("--seed", type=int, default=0)
    return p


def _spec(args, who: str, thinking: bool = False):
    return ModelSpec(getattr(args, who), model_name=getattr(args, f"{who}_model"),
                     tokenizer=getattr(args, f"{who}_tokenizer"), api_key_env=getattr(args, f"{who}_key_env"),
                     max_tokens=getattr(args, f"{who}_max_tokens"), seed=args.seed, thinking=thinking)


def run(args) -> int:
    gyms = tuple(g.strip() for g in args.gyms.split(",")) if args.gyms else ()
    try:
        if args.mixture:
            cfg = load_config(args.mixture, args.overrides, kind=mixture.MixtureConfig)
            args.max_prompt_tokens, args.max_turns = cfg.max_prompt_tokens, cfg.max_turns
        else:
            cfg = mixture.MixtureConfig(sources=tuple(args.tasks) if args.tasks else (f"shipped:{args.split}",),
                                        weights=tuple(mixture.USERRL_TRAIN_ROWS.items()) if (
                                            args.split == "train" and not args.tasks and not gyms) else (),
                                        gyms=gyms, max_prompt_tokens=args.max_prompt_tokens)
        mixture.check_gyms(cfg)  # a mistyped gym fails in a second, before the models load
        agent = agent_from_spec(_spec(args, "agent"))
        # the prompt filter needs only the agent's tokenizer: a split it empties fails before the user model loads
        tasks, dropped = mixture.build_tasks(cfg, agent.tok)
        if args.n is not None:
            tasks = mixture.MixtureSampler(tasks, cfg.weight_map() or None, seed=args.seed).sample(args.n)
        judge_spec = None if args.judge is None else _spec(args, "judge")
        user, judge = user_and_judge(_spec(args, "user", thinking=args.user_thinking), judge_spec,
                                     user_style=args.user_style)
        retriever = r.from_option(args.retriever, args.retriever_key_env)
    except (EnvError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if dropped:
        print(f"dropped {sum(dropped.values())} task(s) with prompts of >= {args.max_prompt_tokens} tokens: "
              f"{dropped}", flush=True)
    ecfg = EpisodeConfig(max_turns=args.max_turns, agent_temperature=args.temperature, seed=args.seed,
                         agent_max_tokens=args.agent_max_tokens)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    scores, total = [], len(tasks) * args.group
    t0 = time.perf_counter()
    per_batch = max(1, args.batch // args.group)
    with open(args.out, "w", encoding="utf-8") as f, tqdm(total=total, unit="ep", desc="rollout") as bar:
        for start in range(0, len(tasks), per_batch):
            chunk = tasks[start:start + per_batch]
            ep_tasks = episode_tasks(chunk, group_size=args.group, first_group=start,
                                     first_rollout_id=start * args.group, seed=args.seed, data_dir=args.data_dir,
                                     user=user, judge=judge, retriever=retriever,
                                     gym_options={"TravelGym": {"reward_variant": args.travel_reward_variant}})
            batch_no, batches = start // per_batch + 1, -(-len(tasks) // per_batch)
            for traj in run_episodes(agent, None, ep_tasks, ecfg, tokenizer=agent.tok,
                                     progress=TurnReporter(f"rollout batch {batch_no}/{batches}")):
                rec = trajectory_record(traj)
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                scores.append(scoring.score_trajectory(traj))
            f.flush()
            bar.update(len(ep_tasks))
            bar.set_postfix(ep_per_s=f"{bar.n / (time.perf_counter() - t0):.2f}")
    close_models(user, judge)
    summary = scoring.summarize(scores)
    print(format_summary(summary))
    print(f"{total} episodes in {time.perf_counter() - t0:.1f} s -> {args.out}")
    return 0


def format_summary(summary) -> str:
    def f(x):
        return "-" if x is None else f"{x:.4f}"
    rows = [f"{'gym':<14}{'episodes':>9}{'valid':>7}{'invalid':>8}{'tasks':>7}{'train_reward':>14}{'eval_score':>12}"]
    for s in summary.values():
        rows.append(f"{s.gym:<14}{s.episodes:>9}{s.valid:>7}{s.invalid:>8}{s.unique_tasks:>7}"
                    f"{f(s.mean_train_reward):>14}{f(s.mean_eval_score):>12}")
    rows.append(f"{'overall':<14}{'':>45}{f(scoring.overall_score(summary, 'mean_train_reward')):>14}"
                f"{f(scoring.overall_score(summary)):>12}")
    return "\n".join(rows)
