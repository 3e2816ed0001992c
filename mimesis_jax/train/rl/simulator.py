"""Stage I, step 3 (docs/reference/paper.md §3.3, Eq 4, Table 7): joint multi-domain FoldGRPO of ONE simulator.

The stage as the shared RL loop's three pieces (train/rl/learner.py `RLLearner`, train/rl/seams.py): `SimWorld`
(domain prompts, rollouts, group filter, step record, validation), `SimCluster` (the fixed sides, built in
train/rl/chat_models.py) and `FoldGRPO` (seams.py).

    result = run(cfg, workdir)       # cfg: SimRLConfig; resumes when workdir holds a checkpoint
    python -m mimesis_jax simrl --config configs/tiny_simrl.py --workdir runs/simrl [--set ...]

One RL step:
1. draw `rollout.prompts_per_step` (domain, record) prompts with d ~ p(d) (envs/domains.py `DomainSampler`);
2. run `rollout.group_size` rollouts per prompt with the simulator as the sampled policy (episodes/simulator.py):
   single-turn domains give one response, multi-turn domains (ABCD behaviour, multi-turn SOUL tasks) run against
   their fixed side; each simulator turn is its own training segment, sharing the rollout's id. The members of a
   group share their environment seed (the ABCD behaviour assigned to a scenario is the same across the group);
3. r_d per rollout (in [0, 1]); INVALID rollouts (a fixed side failed) leave their group and are counted; a group
   with fewer than `rollout.min_valid_per_group` valid rollouts is skipped;
4. **FoldGRPO** advantages (`grpo.group_advantages(..., fold=True)`): every segment's score is its rollout's
   reward, group statistics over unique rollout ids (a rollout with k segments counts once), each segment gets its
   rollout's advantage on all of its tokens. `rollout.fold=False` is the naive per-segment ablation;
5. clipped surrogate (Eq 6), token-mean, no KL, no CSD (rl.alpha must be 0), PPO mini-batches of
   `rollout.mini_batch_prompts` groups with old log-probs fixed for the step (train/rl/learner.py).

Checkpoints hold params, optimizer state, the domain sampler, the next rollout id and the per-domain running reward
sums, so a resumed run reproduces the uninterrupted one (fixed sides at temperature 0, every sampling seed derived
from (train.seed, step, rollout id, turn)). SIGTERM finishes the step, saves and returns.
Multi-host (`--distributed`): each process runs the rollouts of its share of the prompts (prompt p on process
p % P with its whole group, so FoldGRPO's group statistics are exact locally; seeds from the global prompt index
and rollout id) and the update trains on the global batch assembled from process-local rows (train/rl/distributed.py).

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

import json
import types
from typing import Any

import jax
import numpy as np

# the run config's classes live in mimesis_jax/config/rl.py; re-exported here for the stage's callers
from mimesis_jax.config.rl import (BEHAVIOUR, DomainMixConfig, RLConfig, SidesConfig, SimRLConfig,  # noqa: F401
                                   SimRolloutConfig, SimValidationConfig, context_budget)
from mimesis_jax.envs.abcd.env import BehaviourEnvConfig, behaviour_report
from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.domains import DomainSampler, default_weights, domain, make_domain_env
from mimesis_jax.errors import ConfigError
from mimesis_jax.episodes.simulator import SimEpisodeConfig, SimEpisodeTask, run_sim_episodes
from mimesis_jax.train.rl import distributed
from mimesis_jax.train.rl.chat_models import build_sides, fixed_buckets
from mimesis_jax.train.rl.learner import VALIDATION_SEED, RLLearner, RLResult, load_stage_config, mean_or_zero
from mimesis_jax.train.rl.seams import Cluster, FoldGRPO, World, fold_advantages  # noqa: F401 (re-exported)

STDOUT_KEYS = ("reward_mean", "invalid_frac", "segments", "loss", "clip_frac", "rollout_s", "train_s",
               "rollout_tokens_per_s", "train_tokens_per_s")


# ------------------------------------------------------------------------------------------ config
def load(path: str, overrides=()) -> SimRLConfig:
    return load_stage_config(path, overrides, SimRLConfig)


# ------------------------------------------------------------------------------------------ domains and records
def domain_weights(d: DomainMixConfig) -> dict[str, float]:
    """p(d), unnormalised: domains.weights, or uniform over the 24 domains when it is (); abcd_behaviour gets 0
    with domains.behaviour=false (the ablation)."""
    w = dict(default_weights()) if not d.weights else {str(k): float(v) for k, v in d.weights}
    if not d.behaviour and BEHAVIOUR in w:
        w[BEHAVIOUR] = 0.0
    return w


def _records(pairs, weights: dict[str, float], what: str) -> dict[str, list]:
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
    if d == BEHAVIOUR:
        return {"config": BehaviourEnvConfig(neutral_share=cfg.domains.neutral_share,
                                             max_user_turns=cfg.domains.max_user_turns)}
    if cfg.domains.soul_max_turns and domain(d).multi_turn:
        return {"max_turns": cfg.domains.soul_max_turns}
    return {}


# ------------------------------------------------------------------------------------------ the stage
class SimWorld(World):
    """Stage I.3's tasks: (domain, record) prompts drawn by p(d), rollouts of the simulator against each domain's
    fixed side (the cluster's sides), the valid-rollout filter, the step record with the per-domain running reward
    sums (kept in the data state), validation on the held-out records."""

    def __init__(self):
        self.running = {}

    def read_inputs(self):
        cfg = self.learner.cfg = self.cfg.validate()
        weights = domain_weights(cfg.domains)
        self.records = _records(cfg.domains.sources, weights, "domains.sources")
        try:
            self.sampler = DomainSampler(weights, {d: len(v) for d, v in self.records.items()}, seed=cfg.train.seed)
        except EnvError as e:
            raise ConfigError(f"config key 'domains.weights': {e}") from None
        self.val_records = {}
        if cfg.validation.every:
            self.val_records = _records(cfg.validation.sources, {d: 1.0 for d in self.sampler.names} if not
                                        cfg.validation.sources else {}, "validation.sources")
            if cfg.validation.max_records:
                self.val_records = {d: v[:cfg.validation.max_records] for d, v in self.val_records.items()}

    def restore(self, data_state):
        self.sampler.restore(data_state["sampler"])
        self.running = {k: list(v) for k, v in data_state["running"].items()}

    def data_state(self):
        return {"sampler": self.sampler.state(), "running": self.running}

    def num_validation(self):
        return sum(len(v) for v in self.val_records.values())

    def has_validation(self):
        return bool(self.val_records)

    def banner(self, start):
        cfg, r = self.cfg, self.cfg.rollout
        return (f"simrl: {self.run_state.model_config.model_type} | mesh {dict(self.run_state.mesh.shape)} | "
                f"{r.prompts_per_step} prompts x {r.group_size} rollouts per step over {len(self.sampler.names)} "
                f"domains | fold {r.fold} | thinking {r.thinking} | steps {start}->{cfg.train.steps}")

    def draw(self, n):
        return self.sampler.draw(n)

    def rollouts(self, model, items, *, group_size, temperature, seed, first_group, first_rid, label, records=None):
        """The rollouts of this process's share of the (domain, record index) prompts `items`: prompt p is group
        first_group + p with rollout ids first_rid + p * group_size + k and env seed f(seed, the prompt's place in
        its step: first_group % rollout.prompts_per_step + p, so a step rolled in parts (rl.async_early_updates,
        each part's first_group its own) seeds every prompt as one batch does; validation: first_group 0, so p);
        `records` (default the training records) holds the records the indices point at."""
        cfg, r = self.cfg, self.cfg.rollout
        records = self.records if records is None else records
        sides = self.learner.cluster.sides
        tasks = []
        place = first_group % r.prompts_per_step
        for p in distributed.process_share(len(items), place):  # by place too: a part shares as one batch does
            d, i = items[p]
            env_seed = int(np.random.SeedSequence([seed, place + p]).generate_state(1)[0])
            for k in range(group_size):
                env = make_domain_env(d, records[d][i], sides, seed=env_seed, **_env_options(cfg, d))
                env.thinking = r.thinking
                tasks.append(SimEpisodeTask(env, group_id=first_group + p, rollout_id=first_rid + p * group_size + k,
                                            domain=d, task={"domain": d, "record": i}))
        ec = SimEpisodeConfig(max_tokens=r.max_tokens, temperature=temperature, seed=seed,
                              max_context_tokens=context_budget(r) or None, env_workers=r.env_workers)
        return run_sim_episodes(model, tasks, ec, tokenizer=self.tok, progress=self.progress(label))

    def filter_groups(self, outs):
        groups: dict[int, list] = {}
        for o in outs:
            groups.setdefault(o.group_id, []).append(o)
        # a valid rollout that finished before its first policy turn (the context limit left no room) has no
        # segment to train on: it does not count towards its group's valid rollouts (metric no_policy_turn)
        kept = [g for _, g in sorted(groups.items())
                if sum(o.status == "ok" and bool(o.segments) for o in g) >= self.cfg.rollout.min_valid_per_group]
        skipped = len(groups) - len(kept)
        if jax.process_count() > 1:  # the skipped groups of every process
            skipped = sum(distributed.gather_list([skipped]))
        return kept, {"skipped": skipped}

    def record(self, outs, kept, counts, times):
        return step_record(gathered_outcomes(outs), counts["skipped"], self.running,
                           rollout_s=times["rollouts"] - times["start"], train_s=times["trained"] - times["rollouts"])

    def validate(self, model, label):
        """One rollout per held-out record at validation.temperature: the mean reward per domain."""
        vr = self.val_records
        prompts = [(d, i) for d in sorted(vr) for i in range(len(vr[d]))]
        outs = gathered_outcomes(self.rollouts(model, prompts, group_size=1,
                                               temperature=self.cfg.validation.temperature, seed=VALIDATION_SEED,
                                               first_group=0, first_rid=1 << 40, label=label, records=vr))
        rec = {f"val/{d}": mean_or_zero(o.reward for o in outs if o.domain == d and o.status == "ok") for d in sorted(vr)}
        rec["val/invalid"] = sum(o.status != "ok" for o in outs)
        return rec


class SimCluster(Cluster):
    """Stage I.3's frozen models: each domain's fixed sides (chat_models.build_sides, or the `sides` given) and the
    simulator sampler's one program per run."""

    def __init__(self, sides=None):
        self.sides, self.closers = sides, []

    def open(self, in_flight):
        if self.sides is None:
            self.sides, self.closers = build_sides(self.cfg.sides, mesh=distributed.sides_mesh(self.run_state.mesh,
                                                                                         self.cfg.rollout))

    def policy_max_tokens(self):
        return self.cfg.rollout.max_tokens

    def policy_buckets(self, in_flight):
        """One sampler program for the run (chat_models.fixed_buckets): every policy call pads to the batch of
        the dialogues in flight (chunks of rollout.max_batch), the longest prompt the context budget allows and
        rollout.max_tokens new tokens."""
        return fixed_buckets(self.cfg.rollout, self.cfg.rollout.max_tokens, in_flight)

    def close(self):
        for c in self.closers:
            c.close()


class SimulatorLearner(RLLearner):
    """Stage I.3 on the shared loop (train/rl/learner.py): SimWorld, SimCluster and FoldGRPO (train/rl/seams.py;
    module docstring)."""

    stage, policy_name, stdout_keys = "simrl", "simulator", STDOUT_KEYS

    def __init__(self, cfg: SimRLConfig, workdir: str, *, sides=None, **kw):
        super().__init__(cfg, workdir, world=SimWorld(), cluster=SimCluster(sides), algorithm=FoldGRPO(), **kw)


def run(cfg: SimRLConfig, workdir: str, *, sides=None, tokenizer=None, handle_signals: bool = True,
        on_rollouts=None, log=print) -> RLResult:
    """Runs (or resumes) the simulator RL stage in `workdir` (module docstring). `sides` (envs.domains.SideModels)
    replaces the configured fixed sides (tests: scripted models); `on_rollouts(step, rollouts)` sees each step's
    rollouts."""
    return SimulatorLearner(cfg, workdir, sides=sides, tokenizer=tokenizer, handle_signals=handle_signals,
                            on_rollouts=on_rollouts, log=log).run()


def gathered_outcomes(outs) -> list:
    """What the step metrics read of every process's rollouts (status, reward, domain, segment count, thoughts,
    the behaviour task's info), gathered in rollout-id order: every process logs the same numbers. Lightweight
    stand-ins for SimRollout (one process: the same fields of its own rollouts)."""
    def summary(o):
        info = json.loads(json.dumps(o.info, default=str)) if o.domain == BEHAVIOUR else {}
        return {"rid": int(o.rollout_id), "status": o.status, "domain": o.domain, "info": info,
                "reward": None if o.reward is None else float(o.reward), "segments": len(o.segments),
                "thoughts": list(o.thoughts),
                "policy_tokens": sum(len(t.segments[-1].tokens) for t in o.segments)}
    return [types.SimpleNamespace(**dict(e, segments=[None] * e["segments"]))
            for e in sorted(distributed.gather_list([summary(o) for o in outs]), key=lambda e: e["rid"])]


def step_record(outs, skipped: int, running: dict[str, list[float]], **timing) -> dict:
    """One step's rollout metrics from `gathered_outcomes(...)`; updates `running` ({domain: [reward sum, count]})
    in place."""
    valid = [o for o in outs if o.status == "ok"]
    n_invalid = len(outs) - len(valid)
    rec: dict[str, Any] = {
        "reward_mean": mean_or_zero(o.reward for o in valid), "rollouts": len(outs),
        "segments": sum(len(o.segments) for o in outs), "invalid": n_invalid,
        "invalid_frac": n_invalid / max(1, len(outs)), "skipped_groups": skipped,
        "no_policy_turn": sum(not o.segments for o in valid),
        "thought_words_mean": mean_or_zero(len(t.split()) for o in outs for t in o.thoughts if t is not None),
    }
    rec["segments_per_rollout"] = rec["segments"] / max(1, len(outs))
    if "rollout_s" in timing:  # tokens the policy sampled (every process's rollouts) per second of rollout time
        rec["rollout_tokens_per_s"] = sum(o.policy_tokens for o in outs) / max(timing["rollout_s"], 1e-9)
    for d in sorted({o.domain for o in outs}):
        rs = [o.reward for o in valid if o.domain == d]
        rec[f"reward/{d}"] = mean_or_zero(rs)
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
