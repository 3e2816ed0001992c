"""Stage II (docs/reference/paper.md §4): train the agent against the frozen simulator with multi-turn GRPO (+ CSD).

The stage as the shared RL loop's three pieces (train/rl/learner.py `RLLearner`, train/rl/seams.py): `AgentWorld`
(gym tasks, dialogues, group filter, step record, validation), `AgentCluster` (the frozen simulator, judge and
coach, built in train/rl/chat_models.py) and `AgentAlgorithm` (GRPO / InfoPO advantages, the coach's notes).

    result = run(cfg, workdir)        # cfg: AgentRLConfig; resumes when workdir holds a checkpoint
    python -m mimesis_jax agentrl --config configs/tiny_agentrl.py:csd --workdir runs/agent [--set ...]

One RL step:
1. draw `rollout.prompts_per_step` tasks from the gym mixture (envs/userrl/mixture.py, d by weight);
2. run `rollout.group_size` dialogues per task against the frozen simulator (episode runner: the agent samples
   token-exactly in-process; the simulator is in-process or a remote endpoint; gyms ask their user / judge;
   with rollout.engine the agent and an in-process simulator sample through rollout engines; without it the
   agent's static sampler pads each call to one of 4 prompt rungs of its context budget,
   chat_models.ladder_buckets: at most 4 sampler programs per run);
   every dialogue gets a rollout id never used before in the run;
3. drop INVALID episodes (refusal, endpoint failure) from their groups and count them; a group left with fewer
   than `rollout.min_valid_per_group` valid dialogues is skipped and counted -- never given raw-score advantages;
4. turn rewards -> credits and group-normalised advantages (Eq 5-6 setting, algorithms/grpo.py); with
   rl.credit = "infopo" (the §4.3 baseline, algorithms/infopo.py) plus the group-normalised information gain of
   each turn's feedback, from one extra scoring pass with the pre-update parameters (logged: infopo_ig_mean, the
   mean IG over the step's defined turns, infopo_turns, infopo_s);
5. with CSD (rl.alpha > 0): the coach writes hindsight notes for every turn the simulator answered (Eq 7, one
   batched call: `coach_notes_batch` here, the prompts and segments from algorithms/coach.py), inserted before
   each turn's assistant header;
6. the kept groups are split into PPO mini-batches of `rollout.mini_batch_prompts` groups, each packed
   (algorithms/rl_batch.py); old log-probs are fixed once for the whole step (the sampler's, or recomputed with
   the pre-update parameters) BEFORE the first update, so from the second mini-batch on the ratios of Eq 5 move
   away from 1 and clipping (Eq 6) acts;
7. one optimizer update per mini-batch (train/rl/step.py: Eq 6 + alpha Eq 10, global-norm clipping and the LR
   schedule of `optimizer`); metrics.

Checkpoints (checkpoints.py) hold params, optimizer state, step, RNG and the task sampler's state plus the
next rollout id, so a resumed run reproduces the uninterrupted run's per-step metrics (the simulator, judge and
coach run at temperature 0 and every sampling seed derives from (train.seed, step, rollout id)). SIGTERM finishes
the current step, saves, and returns. Validation every `validation.every` steps runs the evaluation tasks at
temperature 0 and logs their UserRL evaluation scores.

Multi-host (`--distributed`, launch/*.sh): every process runs the dialogues of its share of each step's tasks
(task i on process i % P, whole groups; seeds from the task's global index and rollout id, so the union is the
one-process run's episodes), packs its own part of each mini-batch and trains on the global batch assembled from
process-local rows; metrics cover all processes (train/rl/distributed.py). rl.credit = "infopo" is single-process only.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import numpy as np

from mimesis_jax.algorithms import coach, grpo, infopo
# the run config's classes live in mimesis_jax/config/rl.py; re-exported here for the stage's callers
from mimesis_jax.config.rl import (HEADER_TOKENS, AgentRLConfig, RLConfig, RolloutConfig,  # noqa: F401
                                   UserSideConfig, ValidationConfig, context_budget)
from mimesis_jax.data.trajectory import Trajectory
from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.userrl import scoring
from mimesis_jax.episodes.userrl import episode_tasks
from mimesis_jax.envs.userrl.mixture import MixtureConfig, MixtureSampler, build_tasks
from mimesis_jax.errors import ConfigError
from mimesis_jax.episodes.agent import EpisodeConfig, run_episodes
from mimesis_jax.chat.base import ChatModel
from mimesis_jax.chat.base import chat_many
from mimesis_jax.train.rl import distributed
from mimesis_jax.train.rl.chat_models import (UserSide, build_user_side, engine_of, ladder_buckets,
                                              simulator_engine_config)
from mimesis_jax.train.rl.learner import VALIDATION_SEED, RLLearner, RLResult, load_stage_config, mean_or_zero
from mimesis_jax.train.rl.seams import GRPO, Cluster, World

STDOUT_KEYS = ("reward_mean", "invalid_frac", "loss", "clip_frac", "mean_w", "rollout_s", "train_s",
               "rollout_tokens_per_s", "train_tokens_per_s")


# ------------------------------------------------------------------------------------------ config
def load(path: str, overrides=()) -> AgentRLConfig:
    return load_stage_config(path, overrides, AgentRLConfig)


def coach_notes_batch(coach_model: ChatModel, trajectories: Sequence[Trajectory], *,
                      decode: Callable[[list[int]], str] | None = None, task_contexts: Sequence[str] | None = None,
                      max_tokens: int = 256, temperature: float = 0.0) -> list[list[str | None]]:
    """Eq 7 notes for many trajectories through ONE batched call (chat/base.py chat_many): per trajectory,
    per agent turn, the note or None (prompts: algorithms/coach.py `coach_requests`; a coach answer of exactly
    NONE, or nothing, is None). A failed coach call is an error naming the trajectory and the turn, never a silent
    skip."""
    reqs = []  # (trajectory index, turn, messages)
    for i, tr in enumerate(trajectories):
        ctx = None if task_contexts is None else task_contexts[i]
        try:
            reqs += [(i, t, m) for t, m in coach.coach_requests(tr, decode=decode, task_context=ctx)]
        except ValueError as e:
            raise ValueError(f"trajectory {i}: {e}") from None
    responses = chat_many(coach_model, [m for _, _, m in reqs], max_tokens=max_tokens, temperature=temperature)
    notes: list[list[str | None]] = [[None] * tr.num_agent_turns for tr in trajectories]
    for (i, t, _), resp in zip(reqs, responses):
        if resp.finish_reason == "error":
            raise RuntimeError(f"trajectory {i}: coach failed on agent turn {t}: {resp.meta or resp.text!r}")
        notes[i][t] = coach.note_from_reply(resp.text)
    return notes


def coach_notes(coach_model: ChatModel, trajectory: Trajectory, *, decode: Callable[[list[int]], str] | None = None,
                task_context: str | None = None, turns: Sequence[int] | None = None, max_tokens: int = 256,
                temperature: float = 0.0) -> list[str | None]:
    """One Eq 7 note per agent turn of one trajectory (in order), None where there is none (algorithms/coach.py
    `coach_requests`), one chat call per turn.

    The coach answering exactly NONE (or nothing) means no note; a coach reply with finish_reason "error" is an
    error naming the turn, never a silent skip.
    """
    notes: list[str | None] = [None] * trajectory.num_agent_turns
    for t, msgs in coach.coach_requests(trajectory, decode=decode, task_context=task_context, turns=turns):
        resp = coach_model.chat(msgs, max_tokens=max_tokens, temperature=temperature)
        if resp.finish_reason == "error":
            raise RuntimeError(f"coach failed on agent turn {t}: {resp.meta or resp.text!r}")
        notes[t] = coach.note_from_reply(resp.text)
    return notes


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


# ------------------------------------------------------------------------------------------ the stage
class AgentWorld(World):
    """Stage II's tasks: UserRL gym tasks drawn from the gym mixture, dialogues against the cluster's frozen
    simulator (its user, judge), the invalid / no-turn filter, the step record, validation on the evaluation tasks."""

    def read_inputs(self):
        try:  # the task files are read before any model work: a bad file is a config error naming it
            self.tasks, self.dropped = build_tasks(self.cfg.validate().gyms, self.tok)
        except EnvError as e:
            raise ConfigError(f"config key 'gyms': {e}") from None

    def on_setup(self):
        cfg, r = self.cfg, self.cfg.rollout
        if self.dropped:
            self.log(f"gyms: dropped {sum(self.dropped.values())} task(s) with prompts of >= "
                     f"{cfg.gyms.max_prompt_tokens} tokens: {self.dropped}")
        self.sampler = MixtureSampler(self.tasks, cfg.gyms.weight_map() or None, seed=cfg.train.seed)
        self.val_tasks = []
        if cfg.validation.every:
            vcfg = MixtureConfig(sources=cfg.validation.sources, weights=(), gyms=cfg.validation.gyms,
                                 max_prompt_tokens=cfg.gyms.max_prompt_tokens)
            self.val_tasks, _ = build_tasks(vcfg, self.tok)
            if cfg.validation.max_tasks:
                self.val_tasks = self.val_tasks[:cfg.validation.max_tasks]
        self.ecfg = EpisodeConfig(max_turns=min(r.max_turns, cfg.gyms.max_turns), agent_max_tokens=r.agent_max_tokens,
                                  agent_temperature=r.temperature, user_temperature=0.0,
                                  max_context_tokens=context_budget(r) or None,
                                  user_thinking=cfg.users.simulator_thinking,
                                  user_max_tokens=cfg.users.simulator_max_tokens, env_workers=r.env_workers)

    def restore(self, data_state):
        self.sampler.restore(data_state["sampler"])

    def data_state(self):
        return {"sampler": self.sampler.state}

    def num_validation(self):
        return len(self.val_tasks)

    def banner(self, start):
        cfg, r = self.cfg, self.cfg.rollout
        return (f"agentrl: {self.run_state.model_config.model_type} | mesh {dict(self.run_state.mesh.shape)} | "
                f"{r.prompts_per_step} tasks x {r.group_size} dialogues per step, {cfg.updates_per_step()} updates "
                f"per step | credit {cfg.rl.credit} | alpha {cfg.rl.alpha} | steps {start}->{cfg.train.steps}")

    def draw(self, n):
        return self.sampler.sample(n)

    def rollouts(self, model, items, *, group_size, temperature, seed, first_group, first_rid, label,
                 travel_variant=None):
        """The episodes of this process's share of the tasks `items` (task i: group first_group + i, rollout ids
        first_rid + i * group_size + k; the share by the tasks' places in their step, first_group %
        rollout.prompts_per_step + i, so a step rolled in parts shares its tasks as one batch does); travel_variant:
        TravelGym's reward (default rollout.travel_reward_variant)."""
        variant = self.cfg.rollout.travel_reward_variant if travel_variant is None else travel_variant
        side = self.learner.cluster.side
        eps = [e for i in distributed.process_share(len(items), first_group % self.cfg.rollout.prompts_per_step)
               for e in episode_tasks([items[i]], group_size=group_size, first_group=first_group + i,
                                      first_rollout_id=first_rid + i * group_size, seed=seed, user=side.gym_user,
                                      judge=side.judge, gym_options={"TravelGym": {"reward_variant": variant}})]
        ec = dataclasses.replace(self.ecfg, agent_temperature=temperature, seed=seed)
        return run_episodes(model, side.simulator, eps, ec, tokenizer=self.tok, progress=self.progress(label))

    def filter_groups(self, outs):
        kept, n_invalid, skipped, n_no_turn = _group_filter(outs, self.cfg.rollout.min_valid_per_group)
        return kept, {"invalid": n_invalid, "skipped": skipped, "no_turn": n_no_turn, "notes": 0, "gains": []}

    def record(self, outs, kept, counts, times):
        c = counts
        rec = _step_record(outs, kept, c["invalid"], c["skipped"], c["no_turn"], c["notes"], scoring, grpo,
                           self.cfg, rollout_s=times["rollouts"] - times["start"],
                           coach_s=times["prepared"] - times["rollouts"],
                           train_s=times["trained"] - times["advantages"])
        if self.cfg.rl.credit == "infopo":
            rec.update(infopo_ig_mean=mean_or_zero(c["gains"]), infopo_turns=len(c["gains"]),
                       infopo_s=times["advantages"] - times["prepared"])
        return rec

    def validate(self, model, label):
        """The evaluation tasks at validation.temperature, one dialogue each: their UserRL evaluation scores."""
        v = self.cfg.validation
        vt = self.rollouts(model, self.val_tasks, group_size=1, temperature=v.temperature, seed=VALIDATION_SEED,
                           first_group=0, first_rid=1 << 30, label=label, travel_variant=v.travel_reward_variant)
        vs = distributed.gather_list([dataclasses.asdict(scoring.score_trajectory(t)) for t in vt])
        summ = scoring.summarize([scoring.EpisodeScore(**x) for x in vs])
        rec = {f"val/{gym}": s.mean_eval_score for gym, s in summ.items()}
        rec["val/overall"] = scoring.overall_score(summ)
        rec["val/invalid"] = sum(s.invalid for s in summ.values())
        return rec


class AgentCluster(Cluster):
    """Stage II's frozen models: the user side (simulator, gym user, judge, coach; chat_models.build_user_side, or
    the `user_side` given) and the agent sampler's prompt-rung ladder."""

    def __init__(self, user_side: UserSide | None = None):
        self.given_side, self.side = user_side, None

    def open(self, in_flight):
        cfg, r = self.cfg, self.cfg.rollout
        sim_engine = None
        on = distributed.sides_mesh(self.run_state.mesh, r)  # the rollout pool with one (rollout.devices)
        if r.engine:  # an in-process simulator samples through its own engine too, sized for its longer view,
            # per replica of the mesh it runs on: the engine's layout (distributed.layout_of), where its frozen
            # weights are placed once, replicated over the replicas
            on = distributed.rollout_mesh(self.run_state.mesh, r)
            sim_engine = functools.partial(simulator_engine_config, cfg, dialogues=in_flight, mesh=on)
        self.side = self.given_side or build_user_side(cfg.users, engine_config=sim_engine, mesh=on)

    def policy_max_tokens(self):
        return self.cfg.rollout.agent_max_tokens

    def policy_buckets(self, in_flight):
        """The policy's sampler on a fixed ladder (chat_models.ladder_buckets): calls padded to the dialogues in
        flight (chunks of rollout.max_batch) and rollout.agent_max_tokens new tokens, prompts to the smallest of 4
        rungs up to the longest the context budget allows: at most 4 sampler programs per run."""
        return ladder_buckets(self.cfg.rollout, self.cfg.rollout.agent_max_tokens, in_flight)

    def engines(self):
        return {"sim_engine": engine_of(self.side.simulator)} if self.side is not None else {}

    def close(self):
        if self.given_side is None and self.side is not None:
            self.side.close()


class AgentAlgorithm(GRPO):
    """Stage II's credit: GRPO turn advantages, or InfoPO's (rl.credit = "infopo": plus the group-normalised
    information gain of each turn's feedback, scored with the pre-update parameters); with CSD (rl.alpha > 0)
    first the coach's hindsight notes for every turn the simulator answered (the cluster's coach)."""

    def prepare(self, kept, counts):
        """CSD (rl.alpha > 0): the coach's hindsight notes for every turn the simulator answered (one batched call)."""
        cfg = self.cfg
        if cfg.rl.alpha > 0 and kept:
            flat = [t for g in kept for t in g]
            notes = coach_notes_batch(self.learner.cluster.side.coach, flat, decode=self.tok.decode,
                                      max_tokens=cfg.users.coach_max_tokens, temperature=0.0)
            render_note = coach.chat_note_renderer(self.tok)
            for t, ns in zip(flat, notes):
                counts["notes"] += coach.add_coach_notes(t, ns, render_note)

    def advantages(self, chunk, counts):
        rl = self.cfg.rl
        if rl.credit != "infopo":
            return super().advantages(chunk, counts)
        run_ = self.run_state  # IG with the pre-update parameters, before any update of this step
        scorer = infopo.rl_step_scorer(run_.step_fn, self.learner.start_params(),
                                       row_len=self.cfg.rollout.row_len or None, max_per_call=len(chunk))
        igs = infopo.information_gains(chunk, scorer, infopo.placeholder_tokens(self.tok))
        counts["gains"] += [g for ig in igs for g in ig[np.isfinite(ig)]]
        return chunk, infopo.infopo_advantages(chunk, igs, coef=rl.infopo_coef, gate_tau=rl.infopo_gate_tau,
                                               score=rl.score, gamma=rl.gamma, eps=rl.adv_eps,
                                               divide_std=rl.divide_std)


class AgentLearner(RLLearner):
    """Stage II on the shared loop (train/rl/learner.py): AgentWorld, AgentCluster and AgentAlgorithm (module
    docstring)."""

    stage, policy_name, stdout_keys = "agentrl", "agent", STDOUT_KEYS

    def __init__(self, cfg: AgentRLConfig, workdir: str, *, user_side: UserSide | None = None, **kw):
        super().__init__(cfg, workdir, world=AgentWorld(), cluster=AgentCluster(user_side),
                         algorithm=AgentAlgorithm(), **kw)


def run(cfg: AgentRLConfig, workdir: str, *, user_side: UserSide | None = None, tokenizer=None,
        handle_signals: bool = True, on_rollouts=None, log=print) -> RLResult:
    """Runs (or resumes) the agent RL stage in `workdir` (module docstring). `user_side` replaces the configured
    simulator / judge / coach (tests: scripted models); `on_rollouts(step, trajectories)` sees each step's
    dialogues after the coach (debugging, tests, custom logging)."""
    return AgentLearner(cfg, workdir, user_side=user_side, tokenizer=tokenizer, handle_signals=handle_signals,
                        on_rollouts=on_rollouts, log=log).run()


def _step_record(trajs, kept, n_invalid, skipped, n_no_turn, n_notes, scoring, grpo, cfg, **timing) -> dict:
    """One step's rollout-side metrics over the episodes of EVERY process (gathered per episode, in rollout-id
    order, and the counts summed), so all processes log the same numbers; `kept` is already the global list of
    kept groups. The loop adds the update metrics (learner.update_record)."""
    def summary(t):
        ok = t.status == "ok" and t.num_agent_turns > 0  # a dialogue with no agent turn has no score (skipped)
        return {"rid": int(t.rollout_id), "ok": ok, "gym": t.task.get("gym", "?"),
                "score": float(grpo.trajectory_score(t.turn_rewards, cfg.rl.score, cfg.rl.gamma)) if ok else 0.0,
                "train": float(scoring.training_reward([s.get("reward", 0.0) for s in t.env_info])) if ok else 0.0,
                "turns": int(t.num_agent_turns), "cut": int(t.meta.get("dropped_tail_tokens", 0)),
                "agent_tokens": sum(len(s.tokens) for s in t.segments if s.kind == "agent")}
    eps = sorted(distributed.gather_list([summary(t) for t in trajs]), key=lambda e: e["rid"])
    if jax.process_count() > 1:
        n_invalid, skipped, n_no_turn, n_notes = (
            int(x) for x in np.sum(distributed.gather_list([[n_invalid, skipped, n_no_turn, n_notes]]), axis=0))
    valid = [e for e in eps if e["ok"]]
    rec: dict[str, Any] = {
        "reward_mean": mean_or_zero(e["score"] for e in valid),
        "train_reward_mean": mean_or_zero(e["train"] for e in valid),
        "episodes": len(eps), "invalid": n_invalid, "invalid_frac": n_invalid / max(1, len(eps)),
        "skipped_groups": skipped, "trained_groups": len(kept), "coach_notes": n_notes,
        "no_agent_turn": n_no_turn,  # ok dialogues whose prompt left no room for an agent turn (not trained)
        "context_cut": sum(e["cut"] > 0 for e in eps),  # dialogues whose trailing tool/user turn passed the limit
        "context_cut_tokens": sum(e["cut"] for e in eps),
        "turns_mean": mean_or_zero(e["turns"] for e in eps),
    }
    for gym in sorted({e["gym"] for e in eps}):
        rec[f"reward/{gym}"] = mean_or_zero(e["score"] for e in valid if e["gym"] == gym)
    agent_tokens = sum(e["agent_tokens"] for e in eps)
    rec.update(timing)
    rec["rollout_tokens_per_s"] = agent_tokens / max(timing["rollout_s"], 1e-9)
    return rec
