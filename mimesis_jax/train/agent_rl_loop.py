"""Stage II end to end (docs/reference/paper.md §4): train the agent against the frozen simulator with multi-turn GRPO (+ CSD).

    result = run(cfg, workdir)        # cfg: AgentRLConfig; resumes when workdir holds a checkpoint
    python -m mimesis_jax agentrl --config configs/tiny_agentrl.py:csd --workdir runs/agent [--set ...]

One RL step:
1. draw `rollout.prompts_per_step` tasks from the gym mixture (envs/userrl/mixture.py, d by weight);
2. run `rollout.group_size` dialogues per task against the frozen simulator (episode runner: the agent samples
   token-exactly in-process; the simulator is in-process or a remote endpoint; gyms ask their user / judge;
   with rollout.engine the agent and an in-process simulator sample through rollout engines);
   every dialogue gets a rollout id never used before in the run;
3. drop INVALID episodes (refusal, endpoint failure) from their groups and count them; a group left with fewer
   than `rollout.min_valid_per_group` valid dialogues is skipped and counted -- never given raw-score advantages;
4. turn rewards -> credits and group-normalised advantages (Eq 5-6 setting, algorithms/grpo.py); with
   rl.credit = "infopo" (the §4.3 baseline, algorithms/infopo.py) plus the group-normalised information gain of
   each turn's feedback, from one extra scoring pass with the pre-update parameters (logged: infopo_ig_mean, the
   mean IG over the step's defined turns, infopo_turns, infopo_s);
5. with CSD (rl.alpha > 0): the coach writes hindsight notes for every turn the simulator answered (Eq 7, one
   batched call), inserted before each turn's assistant header;
6. the kept groups are split into PPO mini-batches of `rollout.mini_batch_prompts` groups, each packed
   (algorithms/rl_batch.py); old log-probs are fixed once for the whole step (the sampler's, or recomputed with
   the pre-update parameters) BEFORE the first update, so from the second mini-batch on the ratios of Eq 5 move
   away from 1 and clipping (Eq 6) acts;
7. one optimizer update per mini-batch (train/agent_rl.py: Eq 6 + alpha Eq 10, global-norm clipping and the LR
   schedule of `optimizer`); metrics.

Checkpoints (checkpoints.py) hold params, optimizer state, step, RNG and the task sampler's state plus the
next rollout id, so a resumed run reproduces the uninterrupted run's per-step metrics (the simulator, judge and
coach run at temperature 0 and every sampling seed derives from (train.seed, step, rollout id)). SIGTERM finishes
the current step, saves, and returns. Validation every `validation.every` steps runs the evaluation tasks at
temperature 0 and logs their UserRL evaluation scores.

Multi-host (`--distributed`, launch/*.sh): every process runs the dialogues of its share of each step's tasks
(task i on process i % P, whole groups; seeds from the task's global index and rollout id, so the union is the
one-process run's episodes), packs its own part of each mini-batch and trains on the global batch assembled from
process-local rows; metrics cover all processes (train/rl_run.py). rl.credit = "infopo" is single-process only.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any

import jax
import numpy as np

from mimesis_jax import config as config_lib
# the run config's classes live in mimesis_jax/config/rl.py; re-exported here for the loop's callers
from mimesis_jax.config.rl import (HEADER_TOKENS, AgentRLConfig, RLConfig, RolloutConfig,  # noqa: F401
                                   UserSideConfig, ValidationConfig, context_budget)
from mimesis_jax.envs.base import EnvError
from mimesis_jax.envs.userrl.mixture import MixtureConfig, MixtureSampler, build_tasks
from mimesis_jax.models.config import ConfigError, ModelConfig
from mimesis_jax.train import rl_run

STDOUT_KEYS = ("reward_mean", "invalid_frac", "loss", "clip_frac", "mean_w", "rollout_s", "train_s",
               "rollout_tokens_per_s", "train_tokens_per_s")


# ------------------------------------------------------------------------------------------ config
def rollout_engine_config(r, model_config: ModelConfig, dialogues: int):
    """The EngineConfig of `r` (an RL stage's rollout config) for `dialogues` dialogues in flight at once.

    The page table holds the longest dialogue: `rollout.max_context_tokens` (the runners end a dialogue before a
    prompt + max_tokens would pass it) or, without that limit, the model's max_position_embeddings. The pool
    (`rollout.engine_pages` = 0) holds every dialogue in flight at that length, so no dialogue is evicted and
    recomputed; a smaller explicit pool bounds memory at the price of recomputation (engine.py, pool policy)."""
    from mimesis_jax.rollout.engine import EngineConfig

    max_ctx = r.max_context_tokens or model_config.max_position_embeddings
    per_seq = -(-max_ctx // r.engine_page_size)
    pages = r.engine_pages or max(1, dialogues) * per_seq + 1  # + the trash page
    return EngineConfig(slots=r.engine_slots, page_size=r.engine_page_size, num_pages=pages,
                        max_pages_per_seq=per_seq)


def engine_params(params):
    """The rollout engine's copy of the parameters: on one device (it runs there), gathered from the training
    shards (several processes: the process-local copy of rl_run.rollout_params)."""
    return jax.device_put(rl_run.rollout_params(params), jax.local_devices()[0])


def load(path: str, overrides=()) -> AgentRLConfig:
    try:
        return config_lib.load_config(path, overrides, kind=AgentRLConfig)
    except ValueError as e:  # a config class's own checks (not ConfigError)
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{path}: {e}") from None


# ------------------------------------------------------------------------------------------ sides
@dataclasses.dataclass
class UserSide:
    simulator: Any  # for the runner's own user turn (free-text envs): the simulator in its own framing
    gym_user: Any  # what gyms ask (SimulatorAsResponder around a simulator)
    judge: Any
    coach: Any
    closers: list = dataclasses.field(default_factory=list)

    def close(self):
        for c in self.closers:
            c.close()


def simulator_context_tokens(cfg: AgentRLConfig, sim_config: ModelConfig) -> int:
    """The longest prompt + turn an in-process simulator's rollout engine must hold (its page-table length).

    The simulator's view grows with the dialogue like the agent's: its instructions (the task's user-side prompt,
    not in the agent's context: allowed `gyms.max_prompt_tokens`, the size of a task prompt), every agent reply
    it was shown and its own utterances (both also in the agent's context, <= `rollout.max_context_tokens`), plus
    its thoughts, which the agent never sees (<= `users.simulator_max_tokens` per turn, at most one turn per agent
    turn: the opening + one after each agent turn but the last). Without `rollout.max_context_tokens` the
    simulator's max_position_embeddings bounds it (and always caps it). A longer request is refused by the
    engine (EngineError naming EngineConfig.max_pages_per_seq): the dialogues of that simulator call become
    invalid episodes, counted in `invalid`."""
    r = cfg.rollout
    longest = sim_config.max_position_embeddings
    if not r.max_context_tokens:
        return longest
    turns = min(r.max_turns, cfg.gyms.max_turns)
    bound = cfg.gyms.max_prompt_tokens + r.max_context_tokens + turns * cfg.users.simulator_max_tokens
    return min(longest, bound)


def simulator_engine_config(cfg: AgentRLConfig, sim_config: ModelConfig, dialogues: int):
    """The EngineConfig of an in-process simulator (rollout.engine=true): `rollout_engine_config` with the
    simulator's own context bound (`simulator_context_tokens`). An explicit `rollout.engine_pages` /
    `rollout.engine_slots` applies to each engine (the agent's and the simulator's pools are separate)."""
    sim_r = dataclasses.replace(cfg.rollout, max_context_tokens=simulator_context_tokens(cfg, sim_config))
    return rollout_engine_config(sim_r, sim_config, dialogues)


class _ReleaseEngine:
    """A UserSide closer that frees every dialogue an engine simulator still holds (the episode runner releases
    each at its episode's end; this covers a run that stopped mid-rollout)."""

    def __init__(self, model):
        self.model = model

    def close(self):
        self.model.engine.release_all()


def build_user_side(u: UserSideConfig, *, engine_config=None) -> UserSide:
    """The simulator, gym user, judge and coach of `u`. engine_config (`rollout.engine=true`): a function from the
    simulator's ModelConfig to its EngineConfig; an in-process model simulator then samples through its own
    rollout engine (rollout/engine.py), so each of the runner's user turns prefills only the dialogue's new tokens.
    Remote simulators and the toy user ignore it."""
    from mimesis_jax.rollout.base import SimulatorAsResponder
    from mimesis_jax.rollout.endpoints import LocalChatModel
    from mimesis_jax.rollout.serve import BatchedChatModel
    from mimesis_jax.rollout.specs import ModelSpec, chat_model_from_spec, local_model

    from mimesis_jax.envs.toy import ToyCoach, ToyUser

    key = u.key_env or None
    if u.coach == "toy-coach-shuffled" and u.simulator != "toy-user":
        raise ConfigError("config key 'users.coach': toy-coach-shuffled needs users.simulator=toy-user")
    if u.simulator == "toy-user":  # the rule-based ToyKeyword user (envs/toy.py): CPU toys and tests
        toy = ToyUser()
        if u.coach in ("", "toy-coach", "toy-coach-shuffled"):
            coach, closers = ToyCoach(shuffle_seed=0 if u.coach == "toy-coach-shuffled" else None), []
        else:  # a model as the coach (e.g. the trained tiny simulator, asked as an assistant)
            coach = chat_model_from_spec(ModelSpec(u.coach, model_name=u.coach_model or None, api_key_env=key,
                                                   max_tokens=u.coach_max_tokens),
                                         style="assistant")
            closers = [coach] if hasattr(coach, "close") else []
        return UserSide(toy, SimulatorAsResponder(toy), toy, coach, closers)
    sim_spec = ModelSpec(u.simulator, model_name=u.simulator_model or None, api_key_env=key,
                         max_tokens=u.simulator_max_tokens, thinking=u.simulator_thinking)
    style = u.simulator_style or ("assistant" if sim_spec.remote else "simulator")
    closers = []
    if sim_spec.remote:
        sim = chat_model_from_spec(sim_spec, style="assistant")
        as_assistant = sim
        gym_user = SimulatorAsResponder(sim) if style == "simulator" else sim
    else:
        base = local_model(sim_spec, role="user", model_type="qwen3_5")
        sim = base
        if engine_config is not None:  # frozen: built once, never set_params
            from mimesis_jax.rollout.engine import EngineChatModel

            sim = EngineChatModel(base.config, jax.device_put(base.params, jax.local_devices()[0]), base.tok,
                                  engine_config=engine_config(base.config), generation_role="user",
                                  enable_thinking=base.enable_thinking, max_tokens=base.max_tokens, seed=base.seed,
                                  name=base.name)
        assistant = LocalChatModel(base.config, base.params, base.tok, generation_role="assistant",
                                   max_tokens=u.coach_max_tokens, name=f"{base.name}-assistant")
        # The gyms' own user calls go through the same model: with the engine they are stateless requests (no
        # dialogue key: a gym rebuilds its user conversation per call) sharing the engine's compiled programs and
        # KV pool instead of a second, static sampler. The runner's user turns and the gyms' calls then share one
        # call counter (as they share `base` without the engine); the simulator runs at temperature 0 either way.
        batched_sim, as_assistant = BatchedChatModel(sim), BatchedChatModel(assistant)
        closers += [batched_sim, as_assistant]
        if engine_config is not None:
            closers.append(_ReleaseEngine(sim))  # after batched_sim: its batching thread has stopped
        gym_user = SimulatorAsResponder(batched_sim) if style == "simulator" else batched_sim

    def other(spec, model_name):
        if not spec:
            return as_assistant
        m = chat_model_from_spec(ModelSpec(spec, model_name=model_name or None, api_key_env=key),
                                 style="assistant")
        if hasattr(m, "close"):
            closers.append(m)
        return m
    return UserSide(sim, gym_user, other(u.judge, u.judge_model), other(u.coach, u.coach_model), closers)


# ------------------------------------------------------------------------------------------ result
@dataclasses.dataclass
class AgentRLResult:
    workdir: str
    start_step: int
    final_step: int
    metrics: dict[int, dict]  # step -> the logged record, for the steps run in this call
    preempted: bool
    checkpoint_step: int | None


def _mean(xs):
    xs = [float(x) for x in xs]
    return float(np.mean(xs)) if xs else 0.0


def _group_filter(trajs, min_valid: int):
    """(kept trajectories, invalid count, skipped groups, no-turn count): invalid episodes and ok episodes with no
    agent turn (the prompt left no room for one under the context limit: nothing to train on, no turn reward to
    normalise) leave their group, each counted; a group with fewer than `min_valid` remaining dialogues is
    skipped whole."""
    groups: dict[int, list] = {}
    invalid = no_turn = 0
    for t in trajs:
        if t.status != "ok":
            invalid += 1
            continue
        if t.num_agent_turns == 0:
            no_turn += 1
            continue
        groups.setdefault(t.group_id, []).append(t)
    all_groups = {t.group_id for t in trajs}
    kept, skipped = [], 0
    for g in sorted(all_groups):
        members = groups.get(g, [])
        if len(members) < min_valid:
            skipped += 1
        else:
            kept.append(members)
    return kept, invalid, skipped, no_turn


def _global_minibatch_order(kept: list[list]) -> list[list]:
    """The kept groups of ALL processes in group-id order, this process's groups in their place and [] for the
    groups other processes hold: every process then cuts the same PPO mini-batches (`rollout.mini_batch_prompts`
    consecutive groups) and packs its own part of each. One process: `kept` unchanged."""
    if jax.process_count() == 1:
        return kept
    mine = {g[0].group_id: g for g in kept}
    return [mine.get(gid, []) for gid in rl_run.global_groups(list(mine))]


def run(cfg: AgentRLConfig, workdir: str, *, user_side: UserSide | None = None, tokenizer=None, handle_signals: bool = True, on_rollouts=None, log=print) -> AgentRLResult:
    """Runs (or resumes) the agent RL stage in `workdir` (module docstring). `user_side` replaces the configured
    simulator / judge / coach (tests: scripted models); `on_rollouts(step, trajectories)` sees each step's
    dialogues after the coach (debugging, tests, custom logging)."""
    from mimesis_jax.algorithms import csd, grpo, infopo
    from mimesis_jax.data.tokenizer import load_tokenizer
    from mimesis_jax.envs.userrl import scoring
    from mimesis_jax.envs.userrl.episodes import episode_tasks
    from mimesis_jax.rollout.endpoints import LocalChatModel
    from mimesis_jax.rollout.episode import EpisodeConfig, run_episodes
    from mimesis_jax.rollout.progress import TurnReporter
    from mimesis_jax.train.loop import _StopFlag
    from mimesis_jax.train.metrics import MetricsLogger

    workdir = os.path.abspath(workdir)
    log = rl_run.primary_log(log)
    tok = tokenizer if tokenizer is not None else load_tokenizer(cfg.tokenizer.name)
    try:  # the task files are read before any model work: a bad file is a config error naming it
        tasks, dropped = build_tasks(cfg.validate().gyms, tok)
    except EnvError as e:
        raise ConfigError(f"config key 'gyms': {e}") from None
    run_ = rl_run.setup(cfg, workdir, tok, log)
    cfg, model_config, mesh, ckpt = run_.cfg, run_.model_config, run_.mesh, run_.ckpt
    schedule, latest, state = run_.schedule, run_.latest, run_.state

    if dropped:
        log(f"gyms: dropped {sum(dropped.values())} task(s) with prompts of >= {cfg.gyms.max_prompt_tokens} "
            f"tokens: {dropped}")
    sampler = MixtureSampler(tasks, cfg.gyms.weight_map() or None, seed=cfg.train.seed)
    val_tasks = []
    if cfg.validation.every:
        vcfg = MixtureConfig(sources=cfg.validation.sources, weights=(), gyms=cfg.validation.gyms,
                             max_prompt_tokens=cfg.gyms.max_prompt_tokens)
        val_tasks, _ = build_tasks(vcfg, tok)
        if cfg.validation.max_tasks:
            val_tasks = val_tasks[:cfg.validation.max_tasks]

    if latest is not None:
        sampler.restore(run_.data_state["sampler"])
        next_rid = int(run_.data_state["next_rollout_id"])
    else:
        next_rid = 0
    start = run_.start
    if start >= cfg.train.steps:
        log(f"nothing to do: checkpoint step {start} >= train.steps={cfg.train.steps}")
        ckpt.close()
        return AgentRLResult(workdir, start, start, {}, False, latest)

    r = cfg.rollout
    P = jax.process_count()
    # dialogues in flight at once on this process: a step's share of the groups, or the validation tasks
    in_flight = max(-(-r.prompts_per_step // P) * r.group_size, -(-len(val_tasks) // P))
    own_side = user_side is None
    sim_engine = None
    if r.engine:  # an in-process simulator samples through its own engine too, sized for its longer view
        sim_engine = functools.partial(simulator_engine_config, cfg, dialogues=in_flight)
    side = build_user_side(cfg.users, engine_config=sim_engine) if own_side else user_side
    ecfg = EpisodeConfig(max_turns=min(r.max_turns, cfg.gyms.max_turns), agent_max_tokens=r.agent_max_tokens,
                         agent_temperature=r.temperature, user_temperature=0.0,
                         max_context_tokens=context_budget(r) or None,
                         user_thinking=cfg.users.simulator_thinking, user_max_tokens=cfg.users.simulator_max_tokens,
                         env_workers=r.env_workers)
    log(f"agentrl: {model_config.model_type} | mesh {dict(mesh.shape)} | {r.prompts_per_step} tasks x "
        f"{r.group_size} dialogues per step, {cfg.updates_per_step()} updates per step | credit {cfg.rl.credit} | "
        f"alpha {cfg.rl.alpha} | steps {start}->{cfg.train.steps}")
    logger = MetricsLogger(workdir, total_steps=cfg.train.steps, start_step=start, log_every=cfg.train.log_every,
                           tensorboard=cfg.train.tensorboard, progress_bar=cfg.train.progress_bar, stage="agentrl",
                           stdout_keys=STDOUT_KEYS)
    stop = _StopFlag(handle_signals)
    step, saved, preempted = start, latest, False
    history: dict[int, dict] = {}
    render_note = csd.chat_note_renderer(tok)
    infopo_credit = cfg.rl.credit == "infopo"
    placeholder = infopo.placeholder_tokens(tok) if infopo_credit else None

    engine_agent = None
    if r.engine:  # one engine for the run; its weights follow the updates (set_params below)
        from mimesis_jax.rollout.engine import EngineChatModel

        engine_agent = EngineChatModel(model_config, engine_params(state["params"]), tok,
                                       engine_config=rollout_engine_config(r, model_config, in_flight),
                                       max_tokens=r.agent_max_tokens, name="agent")

    def rollouts(params, task_list, temperature, seed, first_group, first_rid, group_size, travel_variant, label):
        """The episodes of this process's share of `task_list` (rl_run.process_share): task i is group
        first_group + i with rollout ids first_rid + i * group_size + k, whatever process runs it. With
        rollout.engine the engine agent samples (its parameters are `params`, set after each update)."""
        if engine_agent is not None:
            agent = engine_agent
        else:
            agent = LocalChatModel(model_config, rl_run.rollout_params(params), tok, max_tokens=r.agent_max_tokens,
                                   name="agent", max_batch=r.max_batch)
        eps = [e for i in rl_run.process_share(len(task_list))
               for e in episode_tasks([task_list[i]], group_size=group_size, first_group=first_group + i,
                                      first_rollout_id=first_rid + i * group_size, seed=seed, user=side.gym_user,
                                      judge=side.judge, gym_options={"TravelGym": {"reward_variant": travel_variant}})]
        ec = dataclasses.replace(ecfg, agent_temperature=temperature, seed=seed)
        progress = TurnReporter(label) if cfg.train.progress_bar and jax.process_index() == 0 else None
        return run_episodes(agent, side.simulator, eps, ec, tokenizer=tok, progress=progress)

    try:
        while step < cfg.train.steps:
            t0 = time.perf_counter()
            seed = rl_run.step_seed(cfg.train.seed, step)
            drawn = sampler.sample(r.prompts_per_step)
            trajs = rollouts(state["params"], drawn, r.temperature, seed, step * r.prompts_per_step, next_rid,
                             r.group_size, r.travel_reward_variant, f"agentrl step {step + 1} rollout")
            next_rid += len(drawn) * r.group_size  # every process counts the rollouts of all processes
            t1 = time.perf_counter()
            kept, n_invalid, skipped, n_no_turn = _group_filter(trajs, r.min_valid_per_group)
            kept = _global_minibatch_order(kept)
            n_notes = 0
            if cfg.rl.alpha > 0 and kept:
                flat = [t for g in kept for t in g]
                notes = csd.coach_notes_batch(side.coach, flat, decode=tok.decode,
                                              max_tokens=cfg.users.coach_max_tokens, temperature=0.0)
                for t, ns in zip(flat, notes):
                    n_notes += csd.add_coach_notes(t, ns, render_note)
            t2 = time.perf_counter()
            if on_rollouts is not None:
                on_rollouts(step + 1, trajs)
            ms, gains = [], []
            chunks = []
            for i in range(0, len(kept), r.mini_batch_prompts):
                chunk = [t for g in kept[i:i + r.mini_batch_prompts] if g for t in g]
                if infopo_credit:  # IG with the pre-update parameters, before any update of this step
                    scorer = infopo.rl_step_scorer(run_.step_fn, state["params"], row_len=r.row_len or None,
                                                   max_per_call=len(chunk))
                    igs = infopo.information_gains(chunk, scorer, placeholder)
                    gains += [g for ig in igs for g in ig[np.isfinite(ig)]]
                    adv = infopo.infopo_advantages(chunk, igs, coef=cfg.rl.infopo_coef,
                                                   gate_tau=cfg.rl.infopo_gate_tau, score=cfg.rl.score,
                                                   gamma=cfg.rl.gamma, eps=cfg.rl.adv_eps,
                                                   divide_std=cfg.rl.divide_std)
                elif not chunk:  # every group of this mini-batch is on other processes
                    adv = []
                else:
                    adv = grpo.trajectory_turn_advantages(chunk, credit=cfg.rl.credit, score=cfg.rl.score,
                                                          gamma=cfg.rl.gamma, eps=cfg.rl.adv_eps,
                                                          divide_std=cfg.rl.divide_std)
                chunks.append((chunk, adv))
            t_adv = time.perf_counter()
            if chunks:
                run_.state = state
                state, ms = rl_run.ppo_updates(run_, chunks, row_len=r.row_len or None)
                if engine_agent is not None:  # the next rollouts sample from the updated policy
                    engine_agent.set_params(engine_params(state["params"]))
            step += 1
            state["step"] = rl_run.step_array(step, mesh)
            t3 = time.perf_counter()
            rec = _step_record(trajs, kept, n_invalid, skipped, n_no_turn, n_notes, ms, scoring, grpo, cfg,
                               rollout_s=t1 - t0, coach_s=t2 - t1, train_s=t3 - t_adv,
                               lr=float(schedule(max(0, step * cfg.updates_per_step() - 1))))
            if infopo_credit:
                rec.update(infopo_ig_mean=_mean(gains), infopo_turns=len(gains), infopo_s=t_adv - t2)
            if cfg.validation.every and step % cfg.validation.every == 0 and val_tasks:
                vt = rollouts(state["params"], val_tasks, cfg.validation.temperature, 12345, 0, 1 << 30, 1,
                              cfg.validation.travel_reward_variant, f"agentrl step {step} validation")
                vs = rl_run.gather_list([dataclasses.asdict(scoring.score_trajectory(t)) for t in vt])
                summ = scoring.summarize([scoring.EpisodeScore(**x) for x in vs])
                for gym, s in summ.items():
                    rec[f"val/{gym}"] = s.mean_eval_score
                rec["val/overall"] = scoring.overall_score(summ)
                rec["val/invalid"] = sum(s.invalid for s in summ.values())
            history[step] = rec
            logger.log(step, rec)
            preempted = stop.is_set()
            if step % cfg.checkpoint.every == 0 or step == cfg.train.steps or preempted:
                ckpt.save(step, state, {"sampler": sampler.state, "next_rollout_id": next_rid}, run_.run_dict)
                saved = step
                rl_run.abort_if_requested(step, ckpt)
            if preempted:
                logger.write(f"stop requested: checkpoint saved at step {step}; rerun the same command to resume")
                break
    finally:
        stop.restore()
        logger.close()
        ckpt.close()
        if own_side:
            side.close()
    return AgentRLResult(workdir, start, step, history, preempted, saved)


def _step_record(trajs, kept, n_invalid, skipped, n_no_turn, n_notes, ms, scoring, grpo, cfg, **timing) -> dict:
    """One step's metrics over the episodes of EVERY process (gathered per episode, in rollout-id order, and the
    counts summed), so all processes log the same numbers; `kept` is already the global list of kept groups."""
    def summary(t):
        ok = t.status == "ok" and t.num_agent_turns > 0  # a dialogue with no agent turn has no score (skipped)
        return {"rid": int(t.rollout_id), "ok": ok, "gym": t.task.get("gym", "?"),
                "score": float(grpo.trajectory_score(t.turn_rewards, cfg.rl.score, cfg.rl.gamma)) if ok else 0.0,
                "train": float(scoring.training_reward([s.get("reward", 0.0) for s in t.env_info])) if ok else 0.0,
                "turns": int(t.num_agent_turns), "cut": int(t.meta.get("dropped_tail_tokens", 0)),
                "agent_tokens": sum(len(s.tokens) for s in t.segments if s.kind == "agent")}
    eps = sorted(rl_run.gather_list([summary(t) for t in trajs]), key=lambda e: e["rid"])
    if jax.process_count() > 1:
        n_invalid, skipped, n_no_turn, n_notes = (
            int(x) for x in np.sum(rl_run.gather_list([[n_invalid, skipped, n_no_turn, n_notes]]), axis=0))
    valid = [e for e in eps if e["ok"]]
    rec: dict[str, Any] = {
        "reward_mean": _mean(e["score"] for e in valid),
        "train_reward_mean": _mean(e["train"] for e in valid),
        "episodes": len(eps), "invalid": n_invalid, "invalid_frac": n_invalid / max(1, len(eps)),
        "skipped_groups": skipped, "trained_groups": len(kept), "updates": len(ms), "coach_notes": n_notes,
        "no_agent_turn": n_no_turn,  # ok dialogues whose prompt left no room for an agent turn (not trained)
        "context_cut": sum(e["cut"] > 0 for e in eps),  # dialogues whose trailing tool/user turn passed the limit
        "context_cut_tokens": sum(e["cut"] for e in eps),
        "turns_mean": _mean(e["turns"] for e in eps),
    }
    for gym in sorted({e["gym"] for e in eps}):
        rec[f"reward/{gym}"] = _mean(e["score"] for e in valid if e["gym"] == gym)
    agent_tokens = sum(e["agent_tokens"] for e in eps)
    rec.update(timing)
    rec["rollout_tokens_per_s"] = agent_tokens / max(timing["rollout_s"], 1e-9)
    rec.update(rl_run.update_record(ms, timing["train_s"]))
    return rec
