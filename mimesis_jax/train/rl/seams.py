"""The three pieces of an RL stage that the learner (train/rl/learner.py `RLLearner`) runs its loop over
(docs/api.md, "Writing your own RL stage"):

- `World`: the tasks. It reads its task files, draws each step's items, runs their episodes (rollouts), groups
  and filters them, writes the step's rollout-side record, validates, and holds the data state a checkpoint keeps.
- `Cluster`: the models the episodes talk to besides the trained policy (frozen simulator, judge, coach; their
  weights, meshes and rollout engines) and the policy sampler's shapes; opened after setup, closed at the end.
- `Algorithm`: credit assignment. Work on the kept groups (CSD: the coach's notes), then each PPO mini-batch's
  advantages. The loss itself is the run config's `rl` section (GRPO / FoldGRPO / CSD / InfoPO: train/rl/step.py).

    learner = RLLearner(cfg, workdir, world=MyWorld(), cluster=Cluster(), algorithm=GRPO())
    result = learner.run()

A piece is bound to its learner when the learner is built (`bind`) and reads the run through it: `cfg` (the
validated run config once setup has run), `tok`, `run_state` (train/rl/learner.RLRun, after setup), `log`,
`progress(label)` and the other pieces (`learner.world`, `learner.cluster`, `learner.algorithm`). Stage II
(train/rl/agent.py) and Stage I.3 (train/rl/simulator.py) are written as these three pieces.
"""

from __future__ import annotations

from typing import Sequence

from mimesis_jax.algorithms import grpo
from mimesis_jax.episodes.simulator import fold_inputs


class Piece:
    """What the three pieces share: the learner they are bound to and what they read of it."""

    learner = None

    def bind(self, learner):
        self.learner = learner
        return self

    @property
    def cfg(self):
        return self.learner.cfg

    @property
    def tok(self):
        return self.learner.tok

    @property
    def run_state(self):
        return self.learner.run_state

    def log(self, msg: str) -> None:
        self.learner.log(msg)

    def progress(self, label: str):
        return self.learner.progress(label)


class World(Piece):
    """The stage's tasks. `draw` and `rollouts` are what every world writes; the rest have defaults (no task
    files, every group kept, no validation, no data state)."""

    def read_inputs(self) -> None:
        """Reads the task / record files before any model work (a bad file: a ConfigError naming it)."""

    def on_setup(self) -> None:
        """After the training state exists (`cfg` is the validated run config with the runtime model)."""

    def banner(self, start: int) -> str:
        """The run's first console line."""
        rs, cfg = self.run_state, self.cfg
        return (f"{self.learner.stage}: {rs.model_config.model_type} | mesh {dict(rs.mesh.shape)} | "
                f"steps {start}->{cfg.train.steps}")

    def draw(self, n: int) -> list:
        """This step's n prompts / tasks."""
        raise NotImplementedError

    def rollouts(self, model, items: list, *, group_size: int, temperature: float, seed: int, first_group: int,
                 first_rid: int, label: str) -> list:
        """The rollouts of this process's share of `items` (distributed.process_share by the items' places in
        their step, first_group % rollout.prompts_per_step + i: a step rolled in parts, rl.async_early_updates,
        shares its tasks as one batch does) with the policy `model` (a ChatModel): item i is group first_group + i
        with rollout ids first_rid + i * group_size + k, whatever process runs it."""
        raise NotImplementedError

    def filter_groups(self, outs: list) -> tuple[list[list], dict]:
        """(this process's kept groups in group-id order, the counts for the record); default: the rollouts grouped
        by their group_id, every group kept, no counts. With early updates (rl.async_early_updates) it is called
        once per part of a step (whole groups) and the parts' counts are added key by key (numbers, lists)."""
        groups: dict[int, list] = {}
        for o in outs:
            groups.setdefault(o.group_id, []).append(o)
        return [g for _, g in sorted(groups.items())], {}

    def record(self, outs: list, kept: list[list], counts: dict, times: dict) -> dict:
        """The step's rollout-side metrics, with `train_s` (from `times`: perf_counter marks start, rollouts,
        prepared, advantages, trained); the learner adds the update metrics. Default: the rollout and trained
        group counts and the times."""
        return {"rollouts": len(outs), "trained_groups": len(kept), "rollout_s": times["rollouts"] - times["start"],
                "train_s": times["trained"] - times["advantages"]}

    def num_validation(self) -> int:
        """How many validation rollouts one validation pass runs (0: none)."""
        return 0

    def has_validation(self) -> bool:
        """Whether there is anything to validate on (validation runs every `validation.every` steps if so)."""
        return self.num_validation() > 0

    def validate(self, model, label: str) -> dict:
        """The validation metrics (val/...) with the current policy `model`."""
        return {}

    def data_state(self) -> dict:
        """{"sampler": the task sampler's state, **the world's counters}: what a checkpoint keeps (the learner adds
        the next rollout id). Default: nothing (a world whose draws do not depend on the past)."""
        return {"sampler": {}}

    def restore(self, data_state: dict) -> None:
        """The sampler and counters from a resumed checkpoint's data state (`data_state`'s dict)."""


class Cluster(Piece):
    """The models besides the trained policy, and the policy sampler's shapes. Default: none (the policy talks to
    in-code environments only), the sampler's default shape ladders."""

    def open(self, in_flight: int) -> None:
        """Builds the frozen models the rollouts talk to; `in_flight` dialogues run at once on this process."""

    def policy_max_tokens(self) -> int:
        """New tokens per policy call: rollout.agent_max_tokens (Stage II's rollout section) or
        rollout.max_tokens (Stage I.3's)."""
        r = self.cfg.rollout
        return int(getattr(r, "agent_max_tokens", None) or r.max_tokens)

    def policy_buckets(self, in_flight: int):
        """The policy's static-sampler buckets (sampler.Buckets) for `in_flight` dialogues at once; None: the
        sampler's default ladders (prompt length, batch and new tokens each bucketed per call)."""
        return None

    def engines(self) -> dict:
        """The rollout engines of the frozen models (metric prefix -> RolloutEngine); the policy's is logged as
        engine/* by the learner."""
        return {}

    def close(self) -> None:
        """Closes what `open` built."""


class Algorithm(Piece):
    """Credit assignment: `advantages` is what every algorithm writes."""

    def prepare(self, kept: list[list], counts: dict) -> None:
        """Work on all the kept groups (every process's, in group-id order) before any advantage (CSD: the
        coach's notes); with early updates (rl.async_early_updates) on each part's kept groups as it comes in,
        before that part's advantages."""

    def advantages(self, items: list, counts: dict) -> tuple[Sequence, Sequence]:
        """(trajectories or segments, their advantages) of one PPO mini-batch (`items`: its rollouts on this
        process, possibly none)."""
        raise NotImplementedError


class GRPO(Algorithm):
    """Multi-turn GRPO on Trajectory rollouts: per agent turn, the group-normalised credit of rl.credit / score /
    gamma (algorithms/grpo.py `trajectory_turn_advantages`, Eq 5-6 setting)."""

    def advantages(self, items, counts):
        if not items:  # every group of this mini-batch is on other processes
            return items, []
        rl = self.cfg.rl
        return items, grpo.trajectory_turn_advantages(items, credit=rl.credit, score=rl.score, gamma=rl.gamma,
                                                      eps=rl.adv_eps, divide_std=rl.divide_std)


def fold_advantages(rollouts, *, fold: bool = True, eps: float = 1e-6, divide_std: bool = True):
    """(segments, per-segment advantage lists) of the valid rollouts (FoldGRPO, docs/reference/paper.md 3.3)."""
    segs, scores, gids, rids = fold_inputs(rollouts)
    if not segs:
        return [], []
    adv = grpo.group_advantages(scores, gids, rids if fold else None, fold=fold, eps=eps, divide_std=divide_std)
    return segs, [[float(a)] for a in adv]


class FoldGRPO(Algorithm):
    """FoldGRPO on simulator rollouts (episodes/simulator.py SimRollout): every segment gets its rollout's
    group-normalised reward, group statistics over unique rollout ids (rollout.fold=False: per segment)."""

    def advantages(self, items, counts):
        return fold_advantages(items, fold=self.cfg.rollout.fold, eps=self.cfg.rl.adv_eps,
                               divide_std=self.cfg.rl.divide_std)
