"""Stage I, step 3 (docs/reference/paper.md §3.3, Eq 4, Table 7): joint multi-domain GRPO of ONE simulator with FoldGRPO.

    result = run(cfg, workdir)       # cfg: SimRLConfig; resumes when workdir holds a checkpoint
    python -m mimesis_jax simrl --config configs/tiny_simrl.py --workdir runs/simrl [--set ...]

One RL step:
1. draw `rollout.prompts_per_step` (domain, record) prompts with d ~ p(d) (envs/domains.py `DomainSampler`);
2. run `rollout.group_size` rollouts per prompt with the simulator as the sampled policy (rollout/sim_episode.py):
   single-turn domains give one response, multi-turn domains (ABCD behaviour, multi-turn SOUL tasks) run against
   their fixed side; each simulator turn is its own training segment, sharing the rollout's id. The members of a
   group share their environment seed (the ABCD behaviour assigned to a scenario is the same across the group);
3. r_d per rollout (in [0, 1]); INVALID rollouts (a fixed side failed) leave their group and are counted; a group
   with fewer than `rollout.min_valid_per_group` valid rollouts is skipped;
4. **FoldGRPO** advantages (`grpo.group_advantages(..., fold=True)`): every segment's score is its rollout's
   reward, group statistics over unique rollout ids (a rollout with k segments counts once), each segment gets its
   rollout's advantage on all of its tokens. `rollout.fold=False` is the naive per-segment ablation;
5. clipped surrogate (Eq 6), token-mean, no KL, no CSD (rl.alpha must be 0), PPO mini-batches of
   `rollout.mini_batch_prompts` groups with old log-probs fixed for the step (train/rl_run.py).

Checkpoints hold params, optimizer state, the domain sampler, the next rollout id and the per-domain running reward
sums, so a resumed run reproduces the uninterrupted one (fixed sides at temperature 0, every sampling seed derived
from (train.seed, step, rollout id, turn)). SIGTERM finishes the step, saves and returns.
Multi-host (`--distributed`): each process runs the rollouts of its share of the prompts (prompt p on process
p % P with its whole group, so FoldGRPO's group statistics are exact locally; seeds from the global prompt index
and rollout id) and the update trains on the global batch assembled from process-local rows (train/rl_run.py).

Metrics (metrics.jsonl): reward_mean, reward/<d> and its running mean reward_running/<d>, rollouts, segments,
invalid_frac, skipped_groups, meta_narration_rate and reward/behaviour/<id> on the behaviour task,
thought_words_mean, rollout_s / train_s, the update's loss / clip_frac / entropy; `val/<d>` every
`validation.every` steps (temperature 0, one rollout per held-out record).

Ablations (docs/reference/paper.md Appendix C): init.from_workdir = the mid-trained (SFT) checkpoint vs init.from_hf = the
pretrained one; rollout.thinking on/off; domains.behaviour on/off; domains.weights; rollout.fold.
Hand-off: the trained simulator is exported with ``python -m mimesis_jax export --workdir DIR --out HFDIR`` and
loaded (in process, `serve`, or an external engine such as vLLM) by the agent stage (README).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import numpy as np

from mimesis_jax import config as config_lib
# the run config's classes live in mimesis_jax/config/rl.py; re-exported here for the loop's callers
from mimesis_jax.config.rl import (BEHAVIOUR, DomainMixConfig, RLConfig, SidesConfig, SimRLConfig,  # noqa: F401
                                   SimRolloutConfig, SimValidationConfig, context_budget)
from mimesis_jax.envs.base import EnvError
from mimesis_jax.models.config import ConfigError
from mimesis_jax.train import agent_rl_loop, rl_run

STDOUT_KEYS = ("reward_mean", "invalid_frac", "segments", "loss", "clip_frac", "rollout_s", "train_s",
               "rollout_tokens_per_s", "train_tokens_per_s")


# ------------------------------------------------------------------------------------------ config
def load(path: str, overrides=()) -> SimRLConfig:
    try:
        return config_lib.load_config(path, overrides, kind=SimRLConfig)
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{path}: {e}") from None


# ------------------------------------------------------------------------------------------ sides and records
def domain_weights(d: DomainMixConfig) -> dict[str, float]:
    """p(d), unnormalised: domains.weights, or uniform over the 24 domains when it is (); abcd_behaviour gets 0
    with domains.behaviour=false (the ablation)."""
    from mimesis_jax.envs.domains import default_weights

    w = dict(default_weights()) if not d.weights else {str(k): float(v) for k, v in d.weights}
    if not d.behaviour and BEHAVIOUR in w:
        w[BEHAVIOUR] = 0.0
    return w


def build_sides(s: SidesConfig):
    """(SideModels, closers) from the config: toy-judge / toy-agent are the rule-based CPU sides (envs/toy.py)."""
    from mimesis_jax.envs.domains import SideModels
    from mimesis_jax.envs.toy import ToyBehaviourJudge, ToySupportAgent
    from mimesis_jax.rollout.specs import ModelSpec, chat_model_from_spec

    closers: list = []
    built: dict[tuple, Any] = {}

    def model(spec: str, name: str):
        if spec == "toy-judge":
            return ToyBehaviourJudge()
        if spec == "toy-agent":
            return ToySupportAgent()
        if (spec, name) not in built:
            m = chat_model_from_spec(ModelSpec(spec, model_name=name or None, api_key_env=s.key_env or None,
                                               max_tokens=s.max_tokens), style="assistant")
            if hasattr(m, "close"):
                closers.append(m)
            built[(spec, name)] = m
        return built[(spec, name)]
    judge = model(s.judge, s.judge_model)
    agent = model(s.support_agent, s.support_agent_model) if s.support_agent else judge
    partner = model(s.partner, s.partner_model) if s.partner else agent
    return SideModels(judge=judge, partner=partner, support_agent=agent), closers


def _records(pairs, weights: dict[str, float], what: str) -> dict[str, list]:
    from mimesis_jax.envs.domains import domain

    given = {}
    for d, path in pairs:
        if d in given:
            raise ConfigError(f"config key '{what}': domain {d!r} is listed twice")
        given[str(d)] = str(path)
    out = {}
    for d in sorted(set(given) | {k for k, w in weights.items() if w > 0}):
        try:
            dom = domain(d)
            out[d] = dom.load(given[d]) if d in given else dom.samples()
        except EnvError as e:
            raise ConfigError(f"config key '{what}': {e}") from None
    return out


def _env_options(cfg: SimRLConfig, d: str) -> dict:
    from mimesis_jax.envs.abcd_env import BehaviourEnvConfig
    from mimesis_jax.envs.domains import domain

    if d == BEHAVIOUR:
        return {"config": BehaviourEnvConfig(neutral_share=cfg.domains.neutral_share,
                                             max_user_turns=cfg.domains.max_user_turns)}
    if cfg.domains.soul_max_turns and domain(d).multi_turn:
        return {"max_turns": cfg.domains.soul_max_turns}
    return {}


# ------------------------------------------------------------------------------------------ result
@dataclasses.dataclass
class SimRLResult:
    workdir: str
    start_step: int
    final_step: int
    metrics: dict[int, dict]
    preempted: bool
    checkpoint_step: int | None


def _mean(xs) -> float:
    xs = [float(x) for x in xs]
    return float(np.mean(xs)) if xs else 0.0


def fold_advantages(rollouts, *, fold: bool = True, eps: float = 1e-6, divide_std: bool = True):
    """(segments, per-segment advantage lists) of the valid rollouts (FoldGRPO, docs/reference/paper.md 3.3)."""
    from mimesis_jax.algorithms import grpo
    from mimesis_jax.rollout.sim_episode import fold_inputs

    segs, scores, gids, rids = fold_inputs(rollouts)
    if not segs:
        return [], []
    adv = grpo.group_advantages(scores, gids, rids if fold else None, fold=fold, eps=eps, divide_std=divide_std)
    return segs, [[float(a)] for a in adv]


def run(cfg: SimRLConfig, workdir: str, *, sides=None, tokenizer=None,
        handle_signals: bool = True, on_rollouts=None, log=print) -> SimRLResult:
    """Runs (or resumes) the simulator RL stage in `workdir` (module docstring). `sides` (envs.domains.SideModels)
    replaces the configured fixed sides (tests: scripted models); `on_rollouts(step, rollouts)` sees each step's
    rollouts."""
    from mimesis_jax.data.tokenizer import load_tokenizer
    from mimesis_jax.envs.domains import DomainSampler, make_domain_env
    from mimesis_jax.rollout.endpoints import LocalChatModel
    from mimesis_jax.rollout.progress import TurnReporter
    from mimesis_jax.rollout.sim_episode import SimEpisodeConfig, SimEpisodeTask, run_sim_episodes
    from mimesis_jax.train.loop import _StopFlag
    from mimesis_jax.train.metrics import MetricsLogger

    workdir = os.path.abspath(workdir)
    log = rl_run.primary_log(log)
    tok = tokenizer if tokenizer is not None else load_tokenizer(cfg.tokenizer.name)
    cfg = cfg.validate()
    weights = domain_weights(cfg.domains)
    records = _records(cfg.domains.sources, weights, "domains.sources")
    try:
        sampler = DomainSampler(weights, {d: len(v) for d, v in records.items()}, seed=cfg.train.seed)
    except EnvError as e:
        raise ConfigError(f"config key 'domains.weights': {e}") from None
    val_records = {}
    if cfg.validation.every:
        val_records = _records(cfg.validation.sources, {d: 1.0 for d in sampler.names} if not
                               cfg.validation.sources else {}, "validation.sources")
        if cfg.validation.max_records:
            val_records = {d: v[:cfg.validation.max_records] for d, v in val_records.items()}
    run_ = rl_run.setup(cfg, workdir, tok, log)
    cfg, model_config, ckpt = run_.cfg, run_.model_config, run_.ckpt
    running: dict[str, list[float]] = {}
    if run_.latest is not None:
        sampler.restore(run_.data_state["sampler"])
        next_rid = int(run_.data_state["next_rollout_id"])
        running = {k: list(v) for k, v in run_.data_state["running"].items()}
    else:
        next_rid = 0
    start = run_.start
    if start >= cfg.train.steps:
        log(f"nothing to do: checkpoint step {start} >= train.steps={cfg.train.steps}")
        ckpt.close()
        return SimRLResult(workdir, start, start, {}, False, run_.latest)

    own_sides = sides is None
    closers: list = []
    if own_sides:
        sides, closers = build_sides(cfg.sides)
    r = cfg.rollout
    log(f"simrl: {model_config.model_type} | mesh {dict(run_.mesh.shape)} | {r.prompts_per_step} prompts x "
        f"{r.group_size} rollouts per step over {len(sampler.names)} domains | fold {r.fold} | thinking "
        f"{r.thinking} | steps {start}->{cfg.train.steps}")
    logger = MetricsLogger(workdir, total_steps=cfg.train.steps, start_step=start, log_every=cfg.train.log_every,
                           tensorboard=cfg.train.tensorboard, progress_bar=cfg.train.progress_bar, stage="simrl",
                           stdout_keys=STDOUT_KEYS)
    stop = _StopFlag(handle_signals)
    step, saved, preempted = start, run_.latest, False
    history: dict[int, dict] = {}

    engine_policy = None
    if r.engine:  # one engine for the run; its weights follow the updates (set_params below)
        from mimesis_jax.rollout.engine import EngineChatModel

        P = jax.process_count()
        n_val = sum(len(v) for v in val_records.values())
        in_flight = max(-(-r.prompts_per_step // P) * r.group_size, -(-n_val // P))
        engine_policy = EngineChatModel(
            model_config, agent_rl_loop.engine_params(run_.state["params"]), tok, max_tokens=r.max_tokens,
            name="simulator", engine_config=agent_rl_loop.rollout_engine_config(r, model_config, in_flight))

    def rollouts(params, prompts, group_size, temperature, seed, first_group, first_rid, label):
        """The rollouts of this process's share of `prompts` (rl_run.process_share): prompt p is group
        first_group + p with rollout ids first_rid + p * group_size + k and env seed f(seed, p), whatever process
        runs it. With rollout.engine the engine policy samples (its parameters are `params`, set after each
        update)."""
        if engine_policy is not None:
            policy = engine_policy
        else:
            policy = LocalChatModel(model_config, rl_run.rollout_params(params), tok, max_tokens=r.max_tokens,
                                    name="simulator", max_batch=r.max_batch)
        tasks = []
        for p in rl_run.process_share(len(prompts)):
            d, i = prompts[p]
            env_seed = int(np.random.SeedSequence([seed, p]).generate_state(1)[0])
            for k in range(group_size):
                env = make_domain_env(d, records_of[d][i], sides, seed=env_seed, **_env_options(cfg, d))
                env.thinking = r.thinking
                tasks.append(SimEpisodeTask(env, group_id=first_group + p, rollout_id=first_rid + p * group_size + k,
                                            domain=d, task={"domain": d, "record": i}))
        ec = SimEpisodeConfig(max_tokens=r.max_tokens, temperature=temperature, seed=seed,
                              max_context_tokens=context_budget(r) or None,
                              env_workers=r.env_workers)
        progress = TurnReporter(label) if cfg.train.progress_bar and jax.process_index() == 0 else None
        return run_sim_episodes(policy, tasks, ec, tokenizer=tok, progress=progress)

    records_of = records
    try:
        while step < cfg.train.steps:
            t0 = time.perf_counter()
            seed = rl_run.step_seed(cfg.train.seed, step)
            drawn = sampler.draw(r.prompts_per_step)
            outs = rollouts(run_.state["params"], drawn, r.group_size, r.temperature, seed,
                            step * r.prompts_per_step, next_rid, f"simrl step {step + 1} rollout")
            next_rid += len(drawn) * r.group_size  # every process counts the rollouts of all processes
            t1 = time.perf_counter()
            if on_rollouts is not None:
                on_rollouts(step + 1, outs)
            groups: dict[int, list] = {}
            for o in outs:
                groups.setdefault(o.group_id, []).append(o)
            # a valid rollout that finished before its first policy turn (the context limit left no room) has no
            # segment to train on: it does not count towards its group's valid rollouts (metric no_policy_turn)
            kept = [g for _, g in sorted(groups.items())
                    if sum(o.status == "ok" and bool(o.segments) for o in g) >= r.min_valid_per_group]
            skipped = len(groups) - len(kept)
            if jax.process_count() > 1:  # all processes' kept groups in order, [] where another process has it
                mine = {g[0].group_id: g for g in kept}
                kept = [mine.get(gid, []) for gid in rl_run.global_groups(list(mine))]
                skipped = sum(rl_run.gather_list([skipped]))
            ms = []
            if kept:
                chunks = []
                for i in range(0, len(kept), r.mini_batch_prompts):
                    segs, adv = fold_advantages([o for g in kept[i:i + r.mini_batch_prompts] for o in g],
                                                fold=r.fold, eps=cfg.rl.adv_eps, divide_std=cfg.rl.divide_std)
                    chunks.append((segs, adv))
                run_.state, ms = rl_run.ppo_updates(run_, chunks, row_len=r.row_len or None)
                if engine_policy is not None:  # the next rollouts sample from the updated policy
                    engine_policy.set_params(agent_rl_loop.engine_params(run_.state["params"]))
            step += 1
            run_.state["step"] = rl_run.step_array(step, run_.mesh)
            t2 = time.perf_counter()
            rec = step_record(gathered_outcomes(outs), skipped, running, rollout_s=t1 - t0, train_s=t2 - t1,
                              lr=float(run_.schedule(max(0, step * cfg.updates_per_step() - 1))))
            rec.update(rl_run.update_record(ms, t2 - t1))
            if cfg.validation.every and step % cfg.validation.every == 0 and val_records:
                records_of = val_records
                vprompts = [(d, i) for d in sorted(val_records) for i in range(len(val_records[d]))]
                vouts = gathered_outcomes(rollouts(run_.state["params"], vprompts, 1, cfg.validation.temperature,
                                                   12345, 0, 1 << 40, f"simrl step {step} validation"))
                records_of = records
                for d in sorted(val_records):
                    rec[f"val/{d}"] = _mean(o.reward for o in vouts if o.domain == d and o.status == "ok")
                rec["val/invalid"] = sum(o.status != "ok" for o in vouts)
            history[step] = rec
            logger.log(step, rec)
            preempted = stop.is_set()
            if step % cfg.checkpoint.every == 0 or step == cfg.train.steps or preempted:
                ckpt.save(step, run_.state, {"sampler": sampler.state(), "next_rollout_id": next_rid,
                                             "running": running}, run_.run_dict)
                saved = step
                rl_run.abort_if_requested(step, ckpt)
            if preempted:
                logger.write(f"stop requested: checkpoint saved at step {step}; rerun the same command to resume")
                break
    finally:
        stop.restore()
        logger.close()
        ckpt.close()
        for c in closers:
            c.close()
    return SimRLResult(workdir, start, step, history, preempted, saved)


def gathered_outcomes(outs) -> list:
    """What the step metrics read of every process's rollouts (status, reward, domain, segment count, thoughts,
    the behaviour task's info), gathered in rollout-id order: every process logs the same numbers. Lightweight
    stand-ins for SimRollout (one process: the same fields of its own rollouts)."""
    import json
    import types

    def summary(o):
        info = json.loads(json.dumps(o.info, default=str)) if o.domain == BEHAVIOUR else {}
        return {"rid": int(o.rollout_id), "status": o.status, "domain": o.domain, "info": info,
                "reward": None if o.reward is None else float(o.reward), "segments": len(o.segments),
                "thoughts": list(o.thoughts),
                "policy_tokens": sum(len(t.segments[-1].tokens) for t in o.segments)}
    return [types.SimpleNamespace(**dict(e, segments=[None] * e["segments"]))
            for e in sorted(rl_run.gather_list([summary(o) for o in outs]), key=lambda e: e["rid"])]


def _policy_tokens(o) -> int:
    """Tokens the policy sampled in one rollout: its gathered count, or the agent segment of each turn."""
    if hasattr(o, "policy_tokens"):
        return int(o.policy_tokens)
    return sum(len(t.segments[-1].tokens) for t in o.segments)


def step_record(outs, skipped: int, running: dict[str, list[float]], **timing) -> dict:
    """One step's rollout metrics; updates `running` ({domain: [reward sum, count]}) in place."""
    from mimesis_jax.envs.abcd_env import behaviour_report

    valid = [o for o in outs if o.status == "ok"]
    n_invalid = len(outs) - len(valid)
    rec: dict[str, Any] = {
        "reward_mean": _mean(o.reward for o in valid), "rollouts": len(outs),
        "segments": sum(len(o.segments) for o in outs), "invalid": n_invalid,
        "invalid_frac": n_invalid / max(1, len(outs)), "skipped_groups": skipped,
        "no_policy_turn": sum(not o.segments for o in valid),
        "thought_words_mean": _mean(len(t.split()) for o in outs for t in o.thoughts if t is not None),
    }
    rec["segments_per_rollout"] = rec["segments"] / max(1, len(outs))
    if "rollout_s" in timing:  # tokens the policy sampled (every process's rollouts) per second of rollout time
        rec["rollout_tokens_per_s"] = sum(map(_policy_tokens, outs)) / max(timing["rollout_s"], 1e-9)
    for d in sorted({o.domain for o in outs}):
        rs = [o.reward for o in valid if o.domain == d]
        rec[f"reward/{d}"] = _mean(rs)
        tot = running.setdefault(d, [0.0, 0.0])
        tot[0] += float(sum(rs))
        tot[1] += len(rs)
        rec[f"reward_running/{d}"] = tot[0] / max(1.0, tot[1])
    beh = [o.info for o in valid if o.domain == BEHAVIOUR]
    if beh:
        rep = behaviour_report(beh)
        if rep["overall"]["meta_narration_rate"] is not None:  # None when no behaviour rollout was judged
            rec["meta_narration_rate"] = rep["overall"]["meta_narration_rate"]
        for b, row in rep.items():
            if b not in ("behaviours", "overall"):
                rec[f"reward/behaviour/{b}"] = row["mean_reward"]
    rec.update(timing)
    return rec
