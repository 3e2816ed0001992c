"""The chat models of both RL stages: the trained policy's sampler, and the frozen models it talks to.

    policy = PolicySampler(model_config, tok, cfg.rollout, params, name="agent", max_tokens=..., in_flight=n,
                           mesh=run.mesh)
    model = policy.model(state["params"])      # what this step's rollouts sample with
    policy.follow(state["params"])             # after the step's updates (the engine keeps its compiled programs)
    m = distributed.rollout_mesh(run.mesh)
    side = build_user_side(cfg.users, mesh=m)  # Stage II: simulator, gym user, judge, coach (UserSide)
    sides, closers = build_sides(cfg.sides, mesh=m)  # Stage I.3: the fixed judge / partner / support agent

The static sampler and the in-process models sample on the rollout mesh: the training mesh on one process, the
process's own devices on several (distributed.rollout_mesh; docs/decisions.md, "Rollouts on the mesh").

With `rollout.engine` the policy samples through one rollout engine for the whole run (inference/engine.py), its
weights following the updates; an in-process Stage II simulator gets its own engine, sized for its longer view
(`simulator_engine_config`). Models are given as specs (chat/specs.py): "tiny", a HF directory, a training
workdir, a remote endpoint, or a rule-based toy (envs/toy.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from mimesis_jax.config.rl import AgentRLConfig, SidesConfig, UserSideConfig, context_budget
from mimesis_jax.envs.domains import SideModels
from mimesis_jax.envs.toy import ToyBehaviourJudge, ToyCoach, ToySupportAgent, ToyUser
from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.chat import engine_chat
from mimesis_jax.inference import sampler
from mimesis_jax.inference.engine_sizing import rollout_sizing
from mimesis_jax.chat.base import SimulatorAsResponder
from mimesis_jax.chat.local import LocalChatModel
from mimesis_jax.chat.batching import BatchedChatModel
from mimesis_jax.chat.specs import ModelSpec, chat_model_from_spec, local_model
from mimesis_jax.train.rl import distributed


# ------------------------------------------------------------------------------------------ the policy
def rollout_engine_config(r, model_config: ModelConfig, dialogues: int, mesh=None):
    """The EngineConfig of `r` (an RL stage's rollout config) for `dialogues` dialogues in flight at once
    (`engine_sizing.rollout_sizing`: the longest dialogue, `rollout.engine_pages` / `engine_states` /
    `engine_memory_gib`). Derived pools hold every dialogue in flight at its longest, each with its state slot
    (Qwen3.5), so none is evicted and recomputed; `rollout.engine_memory_gib` caps them."""
    return rollout_sizing(r, model_config, dialogues, mesh).engine_config()  # mesh: per replica, budget per device


def engine_params(params, config=None, mesh=None):
    """The rollout engine's copy of the parameters. Without a mesh: on one device (the engine runs there),
    gathered from the training shards (several processes: the host copy of distributed.host_params). With the
    training mesh: `distributed.rollout_params` -- as they are on one process, sharded over this process's
    devices on several; the engine places them on its mesh as models.shard_params says."""
    if mesh is None:
        return jax.device_put(distributed.host_params(params), jax.local_devices()[0])
    return distributed.rollout_params(config, params, mesh)


class PolicySampler:
    """What the trained policy samples with. With `rollout.engine` one EngineChatModel for the run, its pool
    sized for `in_flight` dialogues at once, its weights set after every step's updates (`follow`); without it a
    LocalChatModel over the current parameters (`model(params)`, built per rollout call).

    buckets: the static sampler's shape buckets (sampler.Buckets; None: its default ladders), e.g.
    `fixed_buckets` for one sampler program per run (Stage I.3), `ladder_buckets` for one per prompt rung
    (Stage II).

    mesh: the training mesh. The LocalChatModel samples on `distributed.rollout_mesh(mesh)`: on one process the
    training mesh itself (rows split over its batch axes, the params as the learner shards them, no copy); on
    several, this process's devices (`distributed.local_rollout_mesh`), the params gathered to the host once per
    `model` call and sharded there (`distributed.rollout_params`). None: one device (the whole batch there). The
    engine runs on the same `rollout_mesh` (inference/engine.py, "On a mesh" in docs/engine.md: weights as
    models.shard_params lays them out, the page pool and state slots split over heads on `tensor`)."""

    def __init__(self, model_config: ModelConfig, tok, r, params, *, name: str, max_tokens: int, in_flight: int,
                 mesh=None, buckets=None):
        self.model_config, self.tok, self.r, self.name, self.max_tokens = model_config, tok, r, name, max_tokens
        self.mesh, self.buckets = mesh, buckets
        self.engine = None
        if r.engine:
            self.engine = engine_chat.EngineChatModel(model_config, engine_params(params, model_config, mesh), tok,
                                                 max_tokens=max_tokens, mesh=distributed.rollout_mesh(mesh),
                                                 name=name,
                                                 engine_config=rollout_engine_config(
                                                     r, model_config, in_flight, distributed.rollout_mesh(mesh)))

    def model(self, params):
        if self.engine is not None:
            return self.engine
        return LocalChatModel(self.model_config, distributed.rollout_params(self.model_config, params, self.mesh),
                              self.tok, max_tokens=self.max_tokens, name=self.name,
                              max_batch=distributed.process_max_batch(self.r.max_batch),
                              mesh=distributed.rollout_mesh(self.mesh), buckets=self.buckets)

    def follow(self, params) -> None:
        """The next rollouts sample from the updated policy."""
        if self.engine is not None:
            self.engine.set_params(engine_params(params, self.model_config, self.mesh))


PROMPT_RUNGS = (1 / 4, 1 / 2, 3 / 4, 1)  # `ladder_buckets`: fractions of the longest prompt a run may sample from
PROMPT_MULTIPLE = 64  # every rung is rounded up to a multiple of this


def prompt_rungs(longest: int, fractions=PROMPT_RUNGS, multiple: int = PROMPT_MULTIPLE) -> tuple[int, ...]:
    """The prompt lengths of a sampler ladder: `fractions` of `longest`, each rounded up to a multiple of
    `multiple`, ascending, without repeats (the top rung holds `longest`)."""
    if longest < 1 or multiple < 1:
        raise ValueError(f"prompt_rungs: longest={longest} and multiple={multiple} must be >= 1")
    return tuple(sorted({-(-math.ceil(f * longest) // multiple) * multiple for f in fractions}))


def _per_call(r, dialogues: int) -> int:
    cap = distributed.process_max_batch(r.max_batch)  # this process's share of the per-call cap
    return max(1, min(dialogues, cap) if cap else dialogues)


def fixed_buckets(r, max_new: int, dialogues: int) -> sampler.Buckets | None:
    """The static sampler's buckets of an RL run that compile ONE sampler program (sampler.Buckets.fixed): every
    call of at most `dialogues` sequences (this process's, in chunks of its share of rollout.max_batch), prompts padded to the longest the
    context budget lets the runner sample from (context_budget(r) - max_new: a turn is sampled only when its
    prompt + max_new fit), `max_new` new tokens. None without a budget (rollout.row_len = max_context_tokens =
    0: the default ladders). What the simulator RL loop samples with and `plan` lists for it."""
    budget = context_budget(r)
    if not budget or budget <= max_new:
        return None
    return sampler.Buckets.fixed(_per_call(r, dialogues), budget - max_new, max_new)


def ladder_buckets(r, max_new: int, dialogues: int) -> sampler.Buckets | None:
    """The static sampler's buckets of the agent RL loop: `fixed_buckets` with the prompts on `prompt_rungs` of
    the longest the context budget allows (1/4, 1/2, 3/4 and all of it), so a run compiles at most 4 sampler
    programs. A Stage II dialogue grows turn by turn and a call's longest prompt sets its length: padding every
    call to the full budget, as Stage I.3 does, would prefill the early, short turns at the length of the last
    ones. None without a budget (the default ladders). What `plan` lists for agentrl (plan/workload.py)."""
    budget = context_budget(r)
    if not budget or budget <= max_new:
        return None
    return sampler.Buckets.ladder(_per_call(r, dialogues), prompt_rungs(budget - max_new), max_new)


class EngineMeter:
    """Per-step engine metrics of the RL stages: for each engine (prefix -> RolloutEngine, e.g. "engine" for the
    policy's, "sim_engine" for an in-process simulator's), the step's evictions, reused tokens (cached prefix
    tokens not prefilled again), recomputed dialogues and prefill tokens (differences of `engine.stats` since
    `start`), the most pages in use at once during the step, and the pool's pages and state slots. This process's
    engines only (each process runs its own)."""

    COUNTERS = ("evictions", "reused_tokens", "recomputed", "prefill_tokens")

    def __init__(self, engines: dict):
        self.engines = {k: e for k, e in engines.items() if e is not None}
        self._last: dict = {}

    def start(self) -> None:
        for name, e in self.engines.items():
            self._last[name] = {k: e.stats[k] for k in self.COUNTERS}
            e.stats["pages_peak"] = e.pages_in_use()

    def record(self) -> dict:
        rec = {}
        for name, e in self.engines.items():
            last = self._last.get(name, {})
            for k in self.COUNTERS:
                rec[f"{name}/{k}"] = e.stats[k] - last.get(k, 0)
            rec[f"{name}/pages_peak"] = e.stats["pages_peak"]
            rec[f"{name}/pages"] = e.ec.num_pages - 1
            if e.pool.has_state:
                rec[f"{name}/states"] = e.ec.states - 1
        return rec


def engine_of(model):
    """The RolloutEngine a chat model samples through (an EngineChatModel's), else None."""
    return model.engine if isinstance(model, engine_chat.EngineChatModel) else None


# ------------------------------------------------------------------------------------------ Stage II
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
    simulator's own context bound (`simulator_context_tokens`). `rollout.engine_pages`, `engine_states`,
    `engine_slots` and `engine_memory_gib` apply to each engine (the agent's and the simulator's pools are
    separate: two engines take up to twice the budget)."""
    sim_r = dataclasses.replace(cfg.rollout, max_context_tokens=simulator_context_tokens(cfg, sim_config))
    return rollout_engine_config(sim_r, sim_config, dialogues)


class _ReleaseEngine:
    """A UserSide closer that frees every dialogue an engine simulator still holds (the episode runner releases
    each at its episode's end; this covers a run that stopped mid-rollout)."""

    def __init__(self, model):
        self.model = model

    def close(self):
        self.model.engine.release_all()


def build_user_side(u: UserSideConfig, *, engine_config=None, mesh=None) -> UserSide:
    """The simulator, gym user, judge and coach of `u`. engine_config (`rollout.engine=true`): a function from the
    simulator's ModelConfig to its EngineConfig; an in-process model simulator then samples through its own
    rollout engine (inference/engine.py), so each of the runner's user turns prefills only the dialogue's new tokens.
    mesh (the process's rollout mesh, `distributed.rollout_mesh`): an in-process simulator's LocalChatModels (and
    model judges / coaches) sample on it, their frozen params sharded once when built, and the engine simulator
    runs its programs there (params as models.shard_params lays them out, KV pages and Qwen3.5 states split over
    heads on `tensor`: docs/engine.md, "On a mesh"). Remote simulators and the toy user ignore both."""
    key = u.key_env or None
    if u.coach == "toy-coach-shuffled" and u.simulator != "toy-user":
        raise ConfigError("config key 'users.coach': toy-coach-shuffled needs users.simulator=toy-user")
    if u.simulator == "toy-user":  # the rule-based ToyKeyword user (envs/toy.py): CPU toys and tests
        toy = ToyUser()
        if u.coach in ("", "toy-coach", "toy-coach-shuffled"):
            coach, closers = ToyCoach(shuffle_seed=0 if u.coach == "toy-coach-shuffled" else None), []
        else:  # a model as the coach (e.g. the trained tiny simulator, asked as an assistant)
            coach = chat_model_from_spec(ModelSpec(u.coach, model_name=u.coach_model or None, api_key_env=key,
                                                   max_tokens=u.coach_max_tokens), style="assistant", mesh=mesh)
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
        base = local_model(sim_spec, role="user", model_type="qwen3_5", mesh=mesh)
        sim = base
        if engine_config is not None:  # frozen: built once, never set_params
            # on the rollout mesh the engine lays the (already sharded) params out as models.shard_params says and
            # splits its pool over heads; without one, everything on this process's first device
            params = base.params if mesh is not None else jax.device_put(base.params, jax.local_devices()[0])
            sim = engine_chat.EngineChatModel(base.config, params, base.tok,
                                         engine_config=engine_config(base.config), generation_role="user",
                                         enable_thinking=base.enable_thinking, max_tokens=base.max_tokens,
                                         seed=base.seed, name=base.name, mesh=mesh)
        assistant = LocalChatModel(base.config, base.params, base.tok, generation_role="assistant",
                                   max_tokens=u.coach_max_tokens, name=f"{base.name}-assistant", mesh=mesh)
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
        m = chat_model_from_spec(ModelSpec(spec, model_name=model_name or None, api_key_env=key), style="assistant",
                                 mesh=mesh)
        if hasattr(m, "close"):
            closers.append(m)
        return m
    return UserSide(sim, gym_user, other(u.judge, u.judge_model), other(u.coach, u.coach_model), closers)


# ------------------------------------------------------------------------------------------ Stage I.3
def build_sides(s: SidesConfig, *, mesh=None):
    """(SideModels, closers) from the config: toy-judge / toy-agent are the rule-based CPU sides (envs/toy.py).
    mesh: the process's rollout mesh; in-process model sides sample on it (frozen params sharded once)."""
    closers: list = []
    built: dict[tuple, Any] = {}

    def model(spec: str, name: str):
        if spec == "toy-judge":
            return ToyBehaviourJudge()
        if spec == "toy-agent":
            return ToySupportAgent()
        if (spec, name) not in built:
            m = chat_model_from_spec(ModelSpec(spec, model_name=name or None, api_key_env=s.key_env or None,
                                               max_tokens=s.max_tokens), style="assistant", mesh=mesh)
            if hasattr(m, "close"):
                closers.append(m)
            built[(spec, name)] = m
        return built[(spec, name)]
    judge = model(s.judge, s.judge_model)
    agent = model(s.support_agent, s.support_agent_model) if s.support_agent else judge
    partner = model(s.partner, s.partner_model) if s.partner else agent
    return SideModels(judge=judge, partner=partner, support_agent=agent), closers
