"""The chat models of both RL stages: the trained policy's generator, and the frozen models it talks to.

    policy = policy_model(model_config, tok, cfg.rollout, params, name="agent", max_tokens=..., in_flight=n,
                          mesh=run.mesh, version=step)   # one generator for the run (inference/protocol.py)
    policy.set_params(policy_params(model_config, cfg.rollout, state["params"], run.mesh), version=step + 1)
                                               # after the step's updates (the engine keeps its compiled programs)
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
from mimesis_jax.inference import sampler
from mimesis_jax.inference.generators import EngineGenerator, StaticGenerator
from mimesis_jax.inference.engine_sizing import rollout_sizing
from mimesis_jax.inference.vllm_generator import VLLMGenerator
from mimesis_jax.chat.base import SimulatorAsResponder
from mimesis_jax.chat.local import LocalChatModel, stop_ids
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


def engine_params(params, config=None, mesh=None, rollout=None):
    """The rollout engine's copy of the parameters. Without a mesh: on one device (the engine runs there),
    gathered from the training shards (several processes: the host copy of distributed.host_params). With the
    training mesh: `distributed.rollout_params` -- resharded into the engine's layout (`rollout.mesh`, else its
    default replica layout: distributed.layout_of), the matrices in the compute dtype (`weight_sync.engine_dtype`; the samples
    are unchanged); the engine places them on its mesh as models.shard_params says."""
    if mesh is None:
        return jax.device_put(distributed.host_params(params), jax.local_devices()[0])
    return distributed.rollout_params(config, params, mesh, rollout, engine=True)


def policy_params(model_config: ModelConfig, r, params, mesh=None):
    """The training parameters moved to where the policy's generator samples: the engine's copy
    (`engine_params`) with `rollout.engine`, else the static sampler's (`distributed.rollout_params`: no copy on
    one process, a device-to-device reshard onto this process's devices on several)."""
    if r.generator == "vllm":  # the vLLM generator fetches each tensor itself as it streams them over
        return params
    if r.engine:
        return engine_params(params, model_config, mesh, r)
    return distributed.rollout_params(model_config, params, mesh, r)


def policy_model(model_config: ModelConfig, tok, r, params, *, name: str, max_tokens: int, in_flight: int,
                 mesh=None, buckets=None, version: int = 0) -> LocalChatModel:
    """The trained policy's one generator for the run (inference/protocol.py), as a LocalChatModel: the rollout
    engine with `rollout.engine` (its pool sized for `in_flight` dialogues at once), else the static sampler.
    After every update the learner calls `set_params(policy_params(...), version)`; the engine then drops its
    cached dialogues and keeps its compiled programs.

    buckets: the static sampler's shape buckets (sampler.Buckets; None: its default ladders), e.g.
    `fixed_buckets` for one sampler program per run (Stage I.3), `ladder_buckets` for one per prompt rung
    (Stage II).

    mesh: the training mesh. The generator samples on `distributed.rollout_mesh(mesh, r)`: on one process the
    training mesh itself (rows split over its batch axes, the params as the learner shards them, no copy); on
    several, this process's devices (`distributed.local_rollout_mesh`), the params resharded there device to
    device by `policy_params`; with `rollout.mesh` set, those devices in that layout (tensor-parallel decode in
    data-parallel replicas, docs/decisions.md "Rollout layout"), the params resharded into it. None: one device
    (the whole batch there). The engine runs on the same `rollout_mesh` (inference/engine.py, "On a mesh" in
    docs/engine.md: one data-parallel replica per block of its batch axes, each with its own pages and state
    slots split over heads on `tensor`; sized per replica, `rollout.engine_memory_gib` per device)."""
    if r.generator == "vllm":
        return LocalChatModel(model_config, None, tok, max_tokens=max_tokens, name=name,
                              generator=vllm_policy(model_config, tok, r, params, in_flight, version))
    on = distributed.rollout_mesh(mesh, r)
    placed = policy_params(model_config, r, params, mesh)
    if r.engine:
        generator = EngineGenerator(model_config, placed, rollout_engine_config(r, model_config, in_flight, on),
                                    stop_ids=stop_ids(tok), mesh=on, version=version)
    else:
        generator = StaticGenerator(model_config, placed, stop_ids=stop_ids(tok), mesh=on, buckets=buckets,
                                    max_batch=distributed.process_max_batch(r.max_batch), version=version)
    return LocalChatModel(model_config, None, tok, max_tokens=max_tokens, name=name, mesh=on, generator=generator)


def vllm_policy(model_config: ModelConfig, tok, r, params, in_flight: int, version: int = 0) -> VLLMGenerator:
    """The policy's generator with `rollout.generator = "vllm"`: vLLM in a child process run by
    `rollout.vllm_python` (inference/vllm_generator.py), holding prompts + turns up to the context budget (else the
    model's max_position_embeddings), `in_flight` requests decoded together, `rollout.vllm_kv_cache_gib` of KV
    cache, weights synced in buckets of `rollout.vllm_sync_bucket_mib`. One process only: each process would
    otherwise start its own vLLM on weights it does not hold whole."""
    if jax.process_count() != 1:
        raise ConfigError(f"config key 'rollout.generator': vllm runs on one process, this run has "
                          f"{jax.process_count()}")
    longest = min(context_budget(r) or model_config.max_position_embeddings, model_config.max_position_embeddings)
    return VLLMGenerator(model_config, distributed.host_params(params), stop_ids=stop_ids(tok),
                         python=r.vllm_python or None, max_model_len=longest, max_num_seqs=max(1, in_flight),
                         kv_cache_bytes=int(r.vllm_kv_cache_gib * (1 << 30)),
                         bucket_bytes=int(r.vllm_sync_bucket_mib) << 20, version=version)


def vllm_sync_record(generator) -> dict:
    """The last weight sync of the policy's generator when it is vLLM's (`VLLMGenerator.last_sync`) as step
    metrics: vllm/sync_s (seconds), vllm/sync_bytes (bytes sent, in the rollout dtype), vllm/sync_buckets and
    vllm/sync_version (the policy version it put in vLLM); {} for any other generator or before the first sync.
    The learner passes the generator it built, not the asynchronous loop's wrapper (async_rollouts.Guarded)."""
    if not isinstance(generator, VLLMGenerator) or generator.last_sync is None:
        return {}
    last = generator.last_sync
    return {"vllm/sync_s": last["seconds"], "vllm/sync_bytes": last["bytes"], "vllm/sync_buckets": last["buckets"],
            "vllm/sync_version": last["version"]}


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
            rec[f"{name}/pages"] = (e.ec.num_pages - 1) * e.replicas  # every replica's pool, less its trash page
            if e.pool.has_state:
                rec[f"{name}/states"] = (e.ec.states - 1) * e.replicas
        return rec


def engine_of(model):
    """The RolloutEngine a chat model samples through (a LocalChatModel's EngineGenerator), else None."""
    if isinstance(model, LocalChatModel) and isinstance(model.generator, EngineGenerator):
        return model.generator.engine
    return None


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


def simulator_engine_config(cfg: AgentRLConfig, sim_config: ModelConfig, dialogues: int, mesh=None):
    """The EngineConfig of an in-process simulator (rollout.engine=true): `rollout_engine_config` with the
    simulator's own context bound (`simulator_context_tokens`). `rollout.engine_pages`, `engine_states`,
    `engine_slots` and `engine_memory_gib` apply to each engine (the agent's and the simulator's pools are
    separate: two engines take up to twice the budget). mesh: the simulator engine's mesh (sized per replica)."""
    sim_r = dataclasses.replace(cfg.rollout, max_context_tokens=simulator_context_tokens(cfg, sim_config))
    return rollout_engine_config(sim_r, sim_config, dialogues, mesh)


class _ReleaseEngine:
    """A UserSide closer that frees every dialogue an engine simulator still holds (the episode runner releases
    each at its episode's end; this covers a run that stopped mid-rollout)."""

    def __init__(self, model):
        self.model = model

    def close(self):
        engine_of(self.model).release_all()


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
            closers = [coach]
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
            sim = LocalChatModel(base.config, params, base.tok, engine_config=engine_config(base.config),
                                 generation_role="user", enable_thinking=base.enable_thinking,
                                 max_tokens=base.max_tokens, seed=base.seed, name=base.name, mesh=mesh)
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
            closers.append(m)
            built[(spec, name)] = m
        return built[(spec, name)]
    judge = model(s.judge, s.judge_model)
    agent = model(s.support_agent, s.support_agent_model) if s.support_agent else judge
    partner = model(s.partner, s.partner_model) if s.partner else agent
    return SideModels(judge=judge, partner=partner, support_agent=agent), closers
