"""`python -m mimesis_jax evalsim`: how human-like a user simulator is (docs/reference/paper.md 5, docs/reference/metrics.md "Simulator fidelity").

    # tau-bench User-Sim Index (19 features, Eq 15 Dice, D1-D4, ECE, Eq 16 USI5) from conversation files
    python -m mimesis_jax evalsim --conversations sim.jsonl --human human.jsonl --out runs/evalsim
    # + RealUserSim fidelity index (Eq 14), SimulatorArena Turing distance and style similarity with a judge
    python -m mimesis_jax evalsim --conversations sim.jsonl --human human.jsonl \\
        --judge http://127.0.0.1:8000/v1 --judge-model judge-llm --out runs/evalsim
    # SOUL-Index: run the simulator on SOUL tasks (shipped or given records) for 3 eval seeds
    python -m mimesis_jax evalsim --simulator runs/sim_hf --soul-tasks hitom,fantom,userllm --seeds 3 \\
        --judge http://127.0.0.1:8000/v1 --judge-model judge-llm --out runs/evalsim
    # SOUL-Index from precomputed per-task per-seed scores ({task: [score per seed, 0-100 or null]})
    python -m mimesis_jax evalsim --soul-scores scores.json --name mimesis-9b --out runs/evalsim

Conversation files: JSONL, one conversation per line (format: `mimesis_jax.eval.conversations`); shipped
invented examples in ``mimesis_jax/eval/data/samples/``. The metrics: `eval.usi` (User-Sim Index),
`eval.sim_judges` (fidelity, Turing, style), `eval.soul_eval` (SOUL-Index). Judge calls and SOUL rollouts whose
judge / partner failed or answered unreadably twice are INVALID: counted and listed apart, never scored 0.

Writes ``OUT/evalsim.json`` -- {"simulator", "usi", "fidelity", "turing", "style", "soul"}, each section present
when computed, each as its module returns it (`usi.usi`, `sim_judges`, `soul_eval.aggregate`; with counts,
invalid lists and the pairing) -- and prints a table.
Exit status 0, or 2 for bad input (the message names the file, line / key and field).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.domains import SideModels, domain
from mimesis_jax.eval import sim_judges, soul_eval, usi
from mimesis_jax.eval.conversations import load_conversations, pair_by_task
from mimesis_jax.eval.usi import DIMENSIONS
from mimesis_jax.errors import ConfigError
from mimesis_jax.chat import specs  # module, not the name: tests patch specs.chat_model_from_spec
from mimesis_jax.chat.specs import ModelSpec, close_models, local_model

JUDGE_EVALS = ("fidelity", "turing", "style")


def add_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--out", required=True, help="output directory (evalsim.json)")
    p.add_argument("--name", default=None,
                   help="the simulator's name in evalsim.json (default: --simulator, else the --conversations file)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the Turing order; the SOUL eval seeds are seed, seed+1, ...")
    g = p.add_argument_group("conversations (User-Sim Index; pairs for the judge metrics)")
    g.add_argument("--conversations", default=None, help="simulator conversations (JSONL)")
    g.add_argument("--human", default=None, help="human conversations of the same tasks (JSONL)")
    g.add_argument("--usi-features", default=None, help="feature definitions (default: the shipped TOML)")
    for who, what in (("judge", "judge for fidelity / Turing / style and the SOUL judge tasks"),
                      ("partner", "SOUL multi-turn tasks' interlocutor (default: the judge's model)")):
        g = p.add_argument_group(who)
        g.add_argument(f"--{who}", default=None,
                       help=f"{what}: tiny | HF dir | training workdir | http(s)://host:port/v1")
        g.add_argument(f"--{who}-model", default=None, help="remote: the served model name")
        g.add_argument(f"--{who}-key-env", default=None, help="remote: env var holding the API key")
        g.add_argument(f"--{who}-max-tokens", type=int, default=1024)
    p.add_argument("--judge-evals", default=",".join(JUDGE_EVALS),
                   help=f"comma-separated judge metrics on the conversation pairs (default: {','.join(JUDGE_EVALS)})")
    p.add_argument("--judge-workers", type=int, default=8, help="judge calls in flight at once")
    g = p.add_argument_group("SOUL-Index")
    g.add_argument("--simulator", default=None, help="the simulator to run on SOUL tasks: tiny | HF dir | workdir")
    g.add_argument("--simulator-tokenizer", default=None, help="override the checkpoint's tokenizer")
    g.add_argument("--simulator-step", type=int, default=None, help="workdir checkpoint step (default: latest)")
    g.add_argument("--simulator-dtype", default="float32")
    g.add_argument("--simulator-max-tokens", type=int, default=1024, help="tokens per policy turn")
    g.add_argument("--thinking", action="store_true", help="the simulator writes a <think> thought first")
    g.add_argument("--soul-tasks", default="all", help="comma-separated SOUL task names (default: all 23)")
    g.add_argument("--soul-records", action="extend", nargs="+", default=[], metavar="TASK=PATH",
                   help="a task's record file (default: its shipped invented samples)")
    g.add_argument("--soul-max-records", type=int, default=None, help="first N records per task")
    g.add_argument("--soul-max-turns", type=int, default=None, help="cap on multi-turn tasks' policy turns")
    g.add_argument("--max-context-tokens", type=int, default=None, help="finish an episode before this length")
    g.add_argument("--seeds", type=int, default=3, help="evaluation seeds (paper: 3)")
    g.add_argument("--soul-scores", default=None,
                   help="aggregate precomputed scores instead: JSON {task: [score per seed, 0-100 or null]}")
    g.add_argument("--soul-axes", default=None, help="task -> axis table (default: the shipped TOML)")
    return p


def _spec(args, who: str):
    return ModelSpec(getattr(args, who), model_name=getattr(args, f"{who}_model"),
                     api_key_env=getattr(args, f"{who}_key_env"), max_tokens=getattr(args, f"{who}_max_tokens"),
                     seed=args.seed)


def _soul_records(args, tasks: list[str]) -> dict[str, list]:
    given: dict[str, str] = {}
    for item in args.soul_records:
        task, sep, path = item.partition("=")
        if not sep or not task or not path:
            raise EnvError(f"--soul-records {item!r}: expected TASK=PATH")
        if task not in tasks:
            raise EnvError(f"--soul-records {item!r}: task {task!r} is not among --soul-tasks {tasks}")
        given[task] = path
    out = {}
    for t in tasks:
        recs = domain(t).load(given[t]) if t in given else domain(t).samples()
        out[t] = recs[:args.soul_max_records] if args.soul_max_records else recs
    return out


def _soul_tasks(args, axes: dict[str, str]) -> list[str]:
    if args.soul_tasks.strip() == "all":
        return sorted(axes)
    tasks = [t.strip() for t in args.soul_tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in axes]
    if unknown or not tasks:
        raise EnvError(f"--soul-tasks: unknown SOUL task(s) {unknown}; tasks: {sorted(axes)}")
    return tasks


def _load_scores(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise EnvError(f"--soul-scores {path} does not exist") from None
    except json.JSONDecodeError as e:
        raise EnvError(f"--soul-scores {path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise EnvError(f"--soul-scores {path}: expected {{task: [score per seed, ...]}}")
    return data


def evaluate(args, log=print) -> dict:
    """Every requested section of evalsim.json (raises EnvError / ConfigError for bad input)."""
    if not (args.conversations or args.human or args.judge or args.simulator or args.soul_scores):
        raise EnvError("nothing to evaluate: give --conversations and --human, --simulator, or --soul-scores")
    if bool(args.conversations) != bool(args.human):
        raise EnvError("--conversations and --human go together (simulator and human conversations of the same "
                       "tasks)")
    if args.simulator and args.soul_scores:
        raise EnvError("--simulator runs the SOUL tasks and --soul-scores aggregates given scores: pick one")
    if args.judge and not args.conversations and not args.simulator:
        raise EnvError("--judge needs conversations (--conversations/--human) or a --simulator to evaluate")
    evals = [e.strip() for e in args.judge_evals.split(",") if e.strip()]
    bad = [e for e in evals if e not in JUDGE_EVALS]
    if bad:
        raise EnvError(f"--judge-evals: unknown metric(s) {bad}; choose from {list(JUDGE_EVALS)}")
    result: dict = {"simulator": args.name or args.simulator or (
        os.path.splitext(os.path.basename(args.conversations))[0] if args.conversations else "simulator")}
    axes = soul_eval.load_axes(args.soul_axes or soul_eval.AXES_PATH) if (args.simulator or args.soul_scores) else {}
    if args.soul_scores:
        result["soul"] = soul_eval.aggregate(_load_scores(args.soul_scores), axes)

    pairs = []
    if args.conversations:
        sim = load_conversations(args.conversations, "simulator")
        hum = load_conversations(args.human, "human")
        fs = usi.load_features(args.usi_features or usi.FEATURES_PATH)
        result["usi"] = usi.usi(sim, hum, fs)
        if args.judge:
            pairs, unpaired = pair_by_task(sim, hum)
            if not pairs:
                raise EnvError(f"{args.conversations} and {args.human} share no task_id: no pairs to judge")
            result["pairs"] = {"n": len(pairs), "unpaired": unpaired}
    if args.simulator:
        tasks = _soul_tasks(args, axes)
        records = _soul_records(args, tasks)

    judge = partner = None
    models = []
    try:
        if args.judge:
            judge = specs.chat_model_from_spec(_spec(args, "judge"), style="assistant")
            models.append(judge)
        if args.partner:
            partner = specs.chat_model_from_spec(_spec(args, "partner"), style="assistant")
            models.append(partner)
        if pairs:
            for e in evals:
                log(f"judging {len(pairs)} pair(s): {e}")
                if e == "turing":
                    result[e] = sim_judges.turing(pairs, judge, seed=args.seed, workers=args.judge_workers)
                else:
                    result[e] = getattr(sim_judges, e)(pairs, judge, workers=args.judge_workers)
        if args.simulator:
            result["soul"] = run_soul(args, tasks, records, axes, judge, partner or judge, log)
    finally:
        close_models(*models)
    return result


def run_soul(args, tasks, records, axes, judge, partner, log) -> dict:
    spec = ModelSpec(args.simulator, tokenizer=args.simulator_tokenizer, step=args.simulator_step,
                     dtype=args.simulator_dtype, thinking=args.thinking, max_tokens=args.simulator_max_tokens)
    if spec.remote:
        raise ConfigError(f"--simulator {args.simulator}: the SOUL-Index runs the simulator as a token-level policy; "
                          "give a local model (tiny, HF dir or training workdir)")
    sides = SideModels(judge=judge, partner=partner)
    soul_eval.check_sides(tasks, sides)
    policy = local_model(spec, role="assistant", model_type="qwen3_5")
    seeds = [args.seed + k for k in range(args.seeds)]
    log(f"SOUL: {len(tasks)} task(s), {sum(len(r) for r in records.values())} record(s), seeds {seeds}")
    run = soul_eval.evaluate(policy, records, sides, seeds,
                             thinking=args.thinking, max_tokens=args.simulator_max_tokens,
                             max_context_tokens=args.max_context_tokens, max_turns=args.soul_max_turns,
                             tokenizer=policy.tok, log=log)
    return soul_eval.soul_section(run, axes)


def _f(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def format_report(result: dict) -> str:
    """The printed table of an evalsim.json result."""
    lines = [f"simulator: {result['simulator']}"]
    u = result.get("usi")
    if u:
        lines.append(f"\ntau-bench User-Sim Index ({u['n_simulator']} simulator / {u['n_human']} human "
                     f"conversations)")
        lines.append(f"  {'feature':<22}{'sim':>10}{'human':>10}{'dice':>8}")
        for dim, feats in DIMENSIONS.items():
            for f in feats:
                v = u["features"][f]
                lines.append(f"  {dim} {f:<19}{v['sim']:>10.3f}{v['human']:>10.3f}{v['dice']:>8.3f}")
        lines.append("  " + "  ".join(f"{d} {_f(s)}" for d, s in u["dimensions"].items()))
        lines.append(f"  ECE {_f(u['ece'], 3)} over {u['n_ece_tasks']} task(s)   USI5 {_f(u['usi5'])}")
    fi = result.get("fidelity")
    if fi:
        dims = "  ".join(f"{d} {_f(s, 1)}" for d, s in fi["dimensions"].items())
        lines.append(f"\nRealUserSim fidelity (Eq 14): FI {_f(fi['fi'], 1)}  [{dims}]  cases {fi['n_cases']}, "
                     f"invalid {fi['n_invalid']}")
    t = result.get("turing")
    if t:
        lines.append(f"Turing: a {_f(t['a'], 1)}  distance {_f(t['distance'], 1)}  pairs {t['n_pairs']}, "
                     f"invalid {t['n_invalid']}")
    s = result.get("style")
    if s:
        lines.append(f"Style similarity (1-5): writing {_f(s['writing'])}  interaction {_f(s['interaction'])}  "
                     f"pairs {s['n_pairs']}, invalid {s['n_invalid']}")
    soul = result.get("soul")
    if soul:
        lines.append(f"\nSOUL ({soul['n_seeds']} seed(s); mean +/- SE)")
        for task, v in soul["tasks"].items():
            inv = f"  invalid {v['n_invalid']}" if v.get("n_invalid") else ""
            lines.append(f"  {task:<20}{_f(v['mean'], 1):>7} +/- {_f(v['se'], 1)}{inv}")
        lines.append("  " + "  ".join(f"{a} {_f(v['mean'], 1)}+/-{_f(v['se'], 1)}" for a, v in soul["axes"].items()))
        idx = soul["index"]
        lines.append(f"  SOUL-Index {_f(idx and idx['mean'], 1)} +/- {_f(idx and idx['se'], 1)}"
                     + (f"  (excluded, a seed without valid rollouts: {soul['excluded_tasks']})"
                        if soul["excluded_tasks"] else ""))
    return "\n".join(lines)


def run(args) -> int:
    try:
        result = evaluate(args)
    except (EnvError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "evalsim.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, ensure_ascii=False)
    os.replace(path + ".tmp", path)
    print(format_report(result))
    print(f"-> {path}")
    return 0
