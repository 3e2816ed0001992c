"""The RL stages' run configs: Stage I.3 joint simulator RL (`SimRLConfig`, paper §3.3) and Stage II agent RL
(`AgentRLConfig`, paper §4), with the sections they share: the update's `RLConfig` and one rollout section
(`RolloutSection`: tasks per step, groups, mini-batches, context budget, sampling, the rollout engine), which each
stage's rollout config extends with its own turn settings. The training loops live in train/rl/agent.py and
train/rl/simulator.py."""

from __future__ import annotations

import dataclasses

from mimesis_jax.config.checks import need as _need
from mimesis_jax.config.choices import (CREDITS, GENERATORS, KL_ESTIMATORS, LOSS_AGGS, NOTE_TOKENS, OLD_LOGPROBS,
                                        SCORE_METHODS)
from mimesis_jax.config.mixture import MixtureConfig
from mimesis_jax.config.sections import (CheckpointConfig, InitConfig, MeshConfig, OptimizerConfig, TokenizerConfig,
                                         TrainConfig)
from mimesis_jax.config.serial import to_dict
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.config.layout import rollout_layout

BEHAVIOUR = "abcd_behaviour"
# <|im_start|>assistant\n (+ <think>\n\n</think>\n\n): a generous bound on the generation header in any tokenizer
HEADER_TOKENS = 16


# ------------------------------------------------------------------------------------------ the update
@dataclasses.dataclass(frozen=True)
class RLConfig:
    """Hyper-parameters of the RL update (train/rl/step.py; defaults: docs/reference/paper.md §4.1 Table 13 and
    UserRL settings). The `rl` section of both RL stages."""

    eps_low: float = 0.2  # Eq 6 lower clip range
    eps_high: float = 0.2  # Eq 6 upper clip range
    loss_agg: str = "token-mean"  # token-mean | seq-mean (grpo.loss_token_weights)
    alpha: float = 0.01  # Eq 11 weight of L_CSD; 0 = plain GRPO
    beta: float = 5.0  # Eq 9 temperature of the CSD weight
    teacher: str = "fused"  # fused (one pass) | naive (reference: separate teacher rows)
    old_logprobs: str = "rollout"  # rollout (Segment.logprobs) | recompute (scoring pass before the update)
    num_microbatches: int = 1
    temperature: float = 1.0  # T of every log-prob of the update: must equal the rollout's sampling temperature
    kl_coef: float = 0.0  # weight of the KL-to-reference term (0 in the paper: no reference); needs ref_params
    kl_estimator: str = "k3"  # k1 | k2 | k3: Schulman's per-token estimator of KL(pi_theta || pi_ref)
    # The decoupled objective of asynchronous RL (docs/stage2.md "Off-policy correction"): 0 = off (Eq 6 as is);
    # c >= 1 = the clip against the proximal policy (the recomputed old log-probs: needs old_logprobs=recompute)
    # and each token's surrogate x min(pi_prox / pi_behav, c), pi_behav the rollout's log-prob (Segment.logprobs)
    behavior_is_cap: float = 0.0
    # advantages (host side: grpo.trajectory_turn_advantages; credit "infopo": algorithms/infopo.py)
    credit: str = "equalized"  # one of CREDITS
    infopo_coef: float = 0.5  # credit "infopo": weight of the normalised information gain (algorithms/infopo.py)
    infopo_gate_tau: float = 0.05  # credit "infopo": variance-gate temperature (0 = no gate)
    score: str = "sum"
    gamma: float = 0.8
    adv_eps: float = 1e-6
    divide_std: bool = True
    # bounded-staleness rollouts (train/rl/async_rollouts.py, docs/stage2.md): a token sampled by policy version v
    # is trained by version at most v + max_staleness; 0 = the synchronous loop (rollouts, then the update)
    max_staleness: int = 0
    # with max_staleness > 0: a fixed version lag (new weights reach the rollouts only between steps) instead of
    # in-flight updates; every step then samples with one version, whatever the timing
    async_deterministic: bool = False
    # with max_staleness > 0: the producer rolls each PPO mini-batch's groups as their own batch and the trainer
    # runs a mini-batch's update as soon as its groups are in (train/rl/learner.py `learn_parts`); false: a step's
    # updates wait for all its dialogues
    async_early_updates: bool = True

    def __post_init__(self):
        def need(cond, key, msg):
            _need(cond, key, msg, got=getattr(self, key), what="RLConfig key")

        need(self.eps_low >= 0 and self.eps_high >= 0, "eps_low", "clip ranges must be >= 0")
        need(self.loss_agg in LOSS_AGGS, "loss_agg", f"must be one of {LOSS_AGGS}")
        need(self.alpha >= 0, "alpha", "must be >= 0")
        need(self.beta > 0, "beta", "must be > 0")
        need(self.teacher in ("fused", "naive"), "teacher", "must be fused or naive")
        need(self.old_logprobs in OLD_LOGPROBS, "old_logprobs", f"must be one of {OLD_LOGPROBS}")
        need(isinstance(self.num_microbatches, int) and self.num_microbatches >= 1, "num_microbatches", ">= 1")
        need(0 < self.temperature < float("inf"), "temperature", "must be a finite value > 0")
        need(0 <= self.kl_coef < float("inf"), "kl_coef", "must be a finite value >= 0")
        need(self.kl_estimator in KL_ESTIMATORS, "kl_estimator", f"must be one of {KL_ESTIMATORS}")
        cap = self.behavior_is_cap
        need(isinstance(cap, (int, float)) and not isinstance(cap, bool) and (cap == 0 or 1 <= cap < float("inf")),
             "behavior_is_cap", "must be 0 (off) or a finite number >= 1 (a cap below 1 would shrink even the "
             "on-policy tokens' weight of 1)")
        need(cap == 0 or self.old_logprobs == "recompute", "behavior_is_cap",
             "> 0 needs old_logprobs=recompute: the decoupled objective clips against the proximal policy, whose "
             "log-probs the update's scoring pass recomputes (the rollout's own are the behaviour log-probs)")
        need(self.credit in CREDITS, "credit", f"must be one of {CREDITS}")
        need(0 <= self.infopo_coef < float("inf"), "infopo_coef", "must be a finite value >= 0")
        need(0 <= self.infopo_gate_tau < float("inf"), "infopo_gate_tau", "must be a finite value >= 0")
        need(self.score in SCORE_METHODS, "score", f"must be one of {SCORE_METHODS}")


# ------------------------------------------------------------------------------------------ rollouts
@dataclasses.dataclass(frozen=True)
class RolloutSection:
    """The rollout settings both RL stages carry (the shared part of their `rollout` section)."""

    prompts_per_step: int = 128  # tasks per RL step (UserRL batch 128; the simulator stage: Table 7's 64)
    group_size: int = 8  # dialogues per task (paper Tables 7 and 13)
    mini_batch_prompts: int = 16  # tasks (whole groups) per optimizer update (UserRL mini-batch 16)
    # a dialogue ends (status ok) before a policy turn would pass this, and what follows a turn is recorded only
    # while it fits (episodes/agent.py, episodes/simulator.py): the recorded dialogue never passes it. 0 = rollout.row_len; both
    # 0 = no limit
    max_context_tokens: int = 0
    temperature: float = 1.0  # policy sampling temperature in training (Tables 7 and 13)
    row_len: int = 0  # packed row length; 0 = bucketed from the batch
    # with row_len set, the row counts a mini-batch is packed to (its step programs, algorithms/rl_batch.py
    # ShapeLadder), as multiples of one row per dialogue (mini_batch_prompts x group_size); () = (1/2, 3/4, 1)
    row_rungs: tuple = ()
    # with row_len set, the LM-head counts per row (head_idx) of the step programs, as fractions of row_len (each
    # rounded up to 64; row_len itself is always one); () = (1,): the head is the whole row
    head_rungs: tuple = ()
    # with row_len set and the fused CSD teacher, the teacher's LM-head counts per row (branch_head_idx) of the step
    # programs, as fractions of each head rung (rounded up to 64, capped at the branch row and the head); () = (1,)
    branch_head_rungs: tuple = ()
    min_valid_per_group: int = 2  # groups with fewer valid dialogues are skipped (no advantage is defined)
    env_workers: int = 16  # env steps run concurrently (gyms and fixed sides wait on their models)
    max_batch: int = 0  # sequences per sampler call (0 = all at once); bounds the rollout's KV cache
    # The policy samples through the rollout engine (inference/engine.py: persistent per-dialogue caches, paged KV
    # pool, continuous batching) instead of the static sampler; so does an in-process model simulator in Stage II
    # (its own frozen engine; a remote simulator is unchanged). Off by default and in the tiny configs: the engine
    # compiles its prefill/decode programs for every page-table width (~40 programs), which tiny CPU runs do not
    # earn back. On in the paper RL configs (configs/qwen3_8b_agentrl.py, configs/mimesis_simrl.py: with
    # rollout.max_batch = 0 and rollout.engine_memory_gib set), where it samples faster than the static sampler
    # (docs/benchmarks.md); `--set rollout.engine=false rollout.max_batch=256` brings the static sampler back there.
    # Same seeds -> the same tokens as the static sampler.
    engine: bool = False
    engine_slots: int = 16  # decode slots (EngineConfig.slots): requests decoded together
    engine_page_size: int = 16  # tokens per KV page (EngineConfig.page_size)
    engine_pages: int = 0  # KV pool pages (EngineConfig.num_pages); 0 = derived (inference/engine_sizing.py)
    # Qwen3.5 state slots (EngineConfig.num_states); 0 = derived: two per dialogue in flight (its state and its
    # snapshot, inference/page_pool.py) + one per decode slot + the trash slot, so no dialogue is evicted for want
    # of a slot
    engine_states: int = 0
    # per-engine cap on the pool's bytes (KV pages + state slots), GiB; 0 = no cap (every dialogue in flight at
    # the longest length). With a cap the pool holds as many longest dialogues as fit; the engine evicts (and
    # logs engine/evictions) only once it is full
    engine_memory_gib: float = 0.0
    # The layout decode runs in, over the same devices of a process as the training mesh: "" (default) = the
    # training layout (one process: the training mesh and its arrays, no copy), except with rollout.engine, whose
    # default is its replica layout "tensor=<the training mesh's tensor>" (config/layout.py engine_layout: the
    # other devices replicas); "replica=R,tensor=T" = R data-
    # parallel replicas (rows split over them, weights replicated) x T-way tensor parallelism (heads, MLP and
    # vocabulary split) with R x T = the devices per process (one axis may be left out: it takes the rest). The
    # weights are resharded into it device to device at every policy update (inference/weight_sync.py), so decode
    # gathers no weight per step; `plan` shows the sync and the rollout programs in it (docs/decisions.md,
    # "Rollout layout").
    mesh: str = ""
    # Who samples the policy's rollouts: "jax" (this project's static sampler, or its rollout engine with
    # rollout.engine) or "vllm" (vLLM in a child process with its own Python, weights synced after every update:
    # inference/vllm_generator.py; its environment: scripts/vllm_env.sh). One process only, for now; with
    # rl.max_staleness > 0 it samples beside the updates (rollout.devices stays 0: vLLM's child is the pool)
    generator: str = "jax"
    vllm_python: str = ""  # the vLLM child's Python; "" = ~/.cache/mimesis_vllm/bin/python (scripts/vllm_env.sh)
    vllm_kv_cache_gib: float = 1.0  # the KV cache vLLM reserves, GiB
    vllm_sync_bucket_mib: int = 256  # the most MiB one weight-sync bucket holds (one tmpfs file at a time)
    # A disjoint rollout pool (train/rl/async_rollouts.py, docs/stage2.md "Split device pools"): 0 = the rollouts
    # sample on the training devices (taking turns with the updates); N > 0 = the LAST N devices of each process
    # sample (the policy and the in-process frozen models), laid out as `rollout.mesh` says, else as replicas x
    # the training mesh's tensor split (config/layout.py engine_layout), and the training mesh is built on the
    # rest; the new weights are copied device to device into the pool after every update. Needs
    # rl.max_staleness > 0: only then do the two pools work at the same time
    devices: int = 0

    # the stage's per-turn token budget (a field of the subclass) and its key, for the context-budget check
    turn_tokens_key = ""

    def check(self, need, *, rl, prompt_tokens: int = 0, prompt_key: str = "", turn_checks=()) -> None:
        """The shared checks (keys `rollout.*`, `rl.temperature`); `turn_checks`: the stage's own (ok, key, msg)
        checks, run after the batch-shape ones."""
        need(self.prompts_per_step >= 1, "rollout.prompts_per_step", "must be >= 1")
        need(self.group_size >= 2, "rollout.group_size", "must be >= 2 (GRPO normalises within a group)")
        need(1 <= self.mini_batch_prompts <= self.prompts_per_step, "rollout.mini_batch_prompts",
             f"must be in [1, rollout.prompts_per_step={self.prompts_per_step}]")
        for ok, key, msg in turn_checks:
            need(ok, key, msg)
        need(_is_int(self.max_batch) and self.max_batch >= 0, "rollout.max_batch",
             "must be an int >= 0 (0 = all sequences in one sampler call)")
        need(self.max_context_tokens >= 0, "rollout.max_context_tokens", "must be >= 0")
        need(isinstance(self.row_rungs, (tuple, list)) and all(
            isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f < float("inf")
            for f in self.row_rungs), "rollout.row_rungs",
             "must be a tuple of finite numbers > 0 (row counts per dialogue; () = (1/2, 3/4, 1))")
        need(isinstance(self.head_rungs, (tuple, list)) and all(
            isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= 1 for f in self.head_rungs),
             "rollout.head_rungs", "must be a tuple of numbers in (0, 1] (fractions of rollout.row_len; () = (1,))")
        need(isinstance(self.branch_head_rungs, (tuple, list)) and all(
            isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= 1 for f in self.branch_head_rungs),
             "rollout.branch_head_rungs",
             "must be a tuple of numbers in (0, 1] (fractions of the LM-head rungs; () = (1,))")
        self.check_engine(need)
        self.check_generator(need)
        need(isinstance(self.mesh, str), "rollout.mesh", "must be a string: '' or 'replica=R,tensor=T'")
        rollout_layout(self.mesh)  # its own one-line ConfigError naming rollout.mesh
        key = f"rollout.{self.turn_tokens_key}"
        self.check_context_budget(need, getattr(self, self.turn_tokens_key), key, prompt_tokens=prompt_tokens,
                                  prompt_key=prompt_key)
        need(self.temperature >= 0, "rollout.temperature", "must be >= 0")
        need(2 <= self.min_valid_per_group <= self.group_size, "rollout.min_valid_per_group",
             f"must be in [2, rollout.group_size={self.group_size}]")
        self.check_staleness(need, rl)
        sampling_t = self.temperature if self.temperature > 0 else 1.0  # greedy rollouts are scored at T = 1
        need(getattr(rl, "temperature", 1.0) == sampling_t, "rl.temperature",
             f"must equal the rollout's sampling temperature {sampling_t} (the update scores the sampled tokens "
             "at the temperature that sampled them)")

    def check_staleness(self, need, rl) -> None:
        """`rl.max_staleness` and `rl.async_deterministic` (train/rl/async_rollouts.py)."""
        n = rl.max_staleness
        need(_is_int(n) and n >= 0, "rl.max_staleness", "must be an int >= 0 (0 = synchronous rollouts)")
        need(isinstance(rl.async_deterministic, bool), "rl.async_deterministic", "must be true or false")
        need(isinstance(rl.async_early_updates, bool), "rl.async_early_updates",
             "must be true or false")
        d = self.devices
        need(_is_int(d) and d >= 0, "rollout.devices", "must be an int >= 0 (0 = the rollouts share the training "
             "devices; N = a rollout pool of each process's last N devices)")
        need(not (d and self.generator == "vllm"), "rollout.devices", "must be 0 with rollout.generator=vllm: vLLM "
             "samples in its own process on its own devices (it is the rollout pool); rl.max_staleness alone runs "
             "it beside the updates")
        need(not (d and not n), "rollout.devices", "> 0 needs rl.max_staleness >= 1: with synchronous rollouts "
             "the pool would idle through every update and the training devices through every rollout")
        layout = rollout_layout(self.mesh)
        need(not (d and layout and -1 not in layout.values() and layout["replica"] * layout["tensor"] != d),
             "rollout.devices", f"must equal the devices rollout.mesh={self.mesh!r} lays out (replica x tensor)")
        need(not (d and layout and any(v > 0 and d % v for v in layout.values())), "rollout.devices",
             f"must be divisible by each axis of rollout.mesh={self.mesh!r}")

    def check_generator(self, need) -> None:
        """The `rollout.generator` and `rollout.vllm_*` keys."""
        need(self.generator in GENERATORS, "rollout.generator", f"must be one of {GENERATORS}")
        need(isinstance(self.vllm_python, str), "rollout.vllm_python", "must be a path string ('' = the default)")
        g = self.vllm_kv_cache_gib
        need(isinstance(g, (int, float)) and not isinstance(g, bool) and 0 < g < float("inf"),
             "rollout.vllm_kv_cache_gib", "must be a finite number of GiB > 0")
        need(_is_int(self.vllm_sync_bucket_mib) and self.vllm_sync_bucket_mib >= 1, "rollout.vllm_sync_bucket_mib",
             "must be an int >= 1")
        if self.generator == "vllm":
            need(not self.engine, "rollout.generator", "vllm needs rollout.engine=false (vLLM is the engine)")
            need(not self.mesh, "rollout.generator", "vllm needs rollout.mesh='' (vLLM lays out its own weights)")

    def check_engine(self, need) -> None:
        """The `rollout.engine*` keys."""
        need(isinstance(self.engine, bool), "rollout.engine", "must be true or false")
        for key, lo in (("engine_slots", 1), ("engine_page_size", 1), ("engine_pages", 0)):
            v = getattr(self, key)
            need(_is_int(v) and v >= lo, f"rollout.{key}", f"must be an int >= {lo}")
        need(self.engine_pages != 1, "rollout.engine_pages", "must be 0 (sized from the rollout) or >= 2 (page 0 "
             "is the engine's trash page)")
        need(_is_int(self.engine_states) and (self.engine_states == 0 or self.engine_states >= 2),
             "rollout.engine_states", "must be an int: 0 (one per dialogue in flight) or >= 2 (slot 0 is the "
             "engine's trash slot)")
        m = self.engine_memory_gib
        need(isinstance(m, (int, float)) and not isinstance(m, bool) and 0 <= m < float("inf"),
             "rollout.engine_memory_gib", "must be a finite number of GiB >= 0 (0 = no cap)")
        need(not (self.engine and self.max_batch), "rollout.max_batch", "must be 0 with rollout.engine=true (the "
             "engine's rollout.engine_slots bound the batch; rollout.engine_pages the KV memory)")

    def check_context_budget(self, need, turn_tokens: int, turn_key: str, *, prompt_tokens: int = 0,
                             prompt_key: str = "") -> None:
        """row_len against the budget a dialogue really needs. The runners bound every recorded dialogue by
        `context_budget(r)` (a turn is sampled only when prompt + its max tokens fit; what follows it is recorded
        only while it fits), so rows of row_len >= that budget always hold it. The budget must leave room for one
        turn of `turn_tokens` (+ the generation header) after the longest prompt (`prompt_tokens`, 0 = unknown),
        else dialogues end with no turn to train on."""
        need(not (self.row_len and self.max_context_tokens and self.row_len < self.max_context_tokens),
             "rollout.row_len",
             f"must be >= rollout.max_context_tokens={self.max_context_tokens} (a whole dialogue fits one row)")
        budget = context_budget(self)
        if budget:
            key = "rollout.max_context_tokens" if self.max_context_tokens else "rollout.row_len"
            first = prompt_tokens + turn_tokens + HEADER_TOKENS
            longest = f"a prompt of {prompt_key}={prompt_tokens} + " if prompt_tokens else ""
            need(budget >= first, key, f"= {budget} leaves no room for a first turn: {longest}{turn_key}="
                 f"{turn_tokens} + {HEADER_TOKENS} header tokens need {first}; raise {key} (or lower {turn_key})")


def context_budget(r) -> int:
    """The tokens a recorded dialogue (agentrl) or policy-turn segment (simrl) may hold: rollout.max_context_tokens,
    else rollout.row_len (a dialogue must fit its row), else 0 = unbounded. The runners never record more."""
    return int(r.max_context_tokens or r.row_len or 0)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_common(cfg, need) -> None:
    """The checks both RL stages make of their train / checkpoint / optimizer / init sections."""
    need(cfg.validation.every >= 0, "validation.every", "must be >= 0")
    need(cfg.train.steps >= 1, "train.steps", "must be >= 1")
    need(cfg.checkpoint.every >= 1, "checkpoint.every", "must be >= 1")
    need(_is_int(cfg.train.metrics_sync_every) and cfg.train.metrics_sync_every >= 1, "train.metrics_sync_every",
         "must be an integer >= 1 (1: fetch the update metrics every step)")
    need(cfg.optimizer.lr > 0, "optimizer.lr", "must be > 0")
    need(cfg.optimizer.warmup_steps <= cfg.train.steps * cfg.updates_per_step(), "optimizer.warmup_steps",
         "counts optimizer updates and must be <= train.steps x updates per step")


class _RLRun:
    """What both RL stage configs offer besides their fields."""

    def replace(self, **kw):
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict:
        return to_dict(self)

    def runtime_model(self) -> ModelConfig:
        return self.model.replace(dtype=self.train.dtype, param_dtype="float32", remat=self.train.remat)

    def updates_per_step(self) -> int:
        return -(-self.rollout.prompts_per_step // self.rollout.mini_batch_prompts)


# ------------------------------------------------------------------------------------------ Stage II
@dataclasses.dataclass(frozen=True)
class UserSideConfig:
    """The frozen sides: the user simulator, the gyms' judge, the CSD coach (spec syntax: chat/specs.py)."""

    simulator: str = "tiny"  # tiny | HF dir | training workdir | http(s)://host:port/v1 | toy-user (envs/toy.py)
    simulator_model: str = ""  # remote: the served model name
    simulator_style: str = ""  # how gyms ask it: simulator | assistant ("" = simulator if local, else assistant)
    simulator_thinking: bool = True  # a local simulator writes <think> thought first (the coach reads it)
    simulator_max_tokens: int = 512
    key_env: str = ""  # remote: env var holding the API key ("" = no auth)
    judge: str = ""  # "" = the simulator's weights (or endpoint) asked as an assistant
    judge_model: str = ""
    # "" = the simulator's weights (or endpoint) as an assistant + the coach prompt; toy-coach(-shuffled) with toy-user
    coach: str = ""
    coach_model: str = ""
    coach_max_tokens: int = 256


@dataclasses.dataclass(frozen=True)
class RolloutConfig(RolloutSection):
    """Stage II's rollout section: the shared settings + the agent's turns."""

    max_turns: int = 16  # agent turns per dialogue (Table 13)
    agent_max_tokens: int = 8192  # per agent turn
    travel_reward_variant: str = "train"  # TravelGym's reward table in training (UserRL: train)

    turn_tokens_key = "agent_max_tokens"


@dataclasses.dataclass(frozen=True)
class ValidationConfig:
    every: int = 0  # steps between validations (0 = never)
    sources: tuple[str, ...] = ("shipped:test",)
    gyms: tuple[str, ...] = ()
    max_tasks: int = 0  # 0 = every task once
    temperature: float = 0.0  # Table 13: validation at temperature 0
    travel_reward_variant: str = "eval"


@dataclasses.dataclass(frozen=True)
class AgentRLConfig(_RLRun):
    """Stage II (paper §4): the agent trained against the frozen simulator (train/rl/agent.py)."""

    model: ModelConfig  # the agent's architecture (checked against init.from_hf / from_workdir weights)
    tokenizer: TokenizerConfig = TokenizerConfig()
    init: InitConfig = InitConfig()
    users: UserSideConfig = UserSideConfig()
    gyms: MixtureConfig = MixtureConfig()
    rl: RLConfig = RLConfig()
    rollout: RolloutConfig = RolloutConfig()
    optimizer: OptimizerConfig = OptimizerConfig(lr=1e-6, schedule="constant", clip_norm=1.0)
    train: TrainConfig = TrainConfig(steps=100)
    mesh: MeshConfig = MeshConfig()
    checkpoint: CheckpointConfig = CheckpointConfig(every=10)
    validation: ValidationConfig = ValidationConfig()
    name: str = ""
    stage: str = "agentrl"

    def validate(self) -> "AgentRLConfig":
        def need(ok, key, msg):
            _need(ok, key, msg, within=self)

        r = self.rollout
        r.check(need, rl=self.rl, prompt_tokens=self.gyms.max_prompt_tokens, prompt_key="gyms.max_prompt_tokens",
                turn_checks=((r.max_turns >= 1, "rollout.max_turns", "must be >= 1"),
                             (r.agent_max_tokens >= 1, "rollout.agent_max_tokens", "must be >= 1")))
        need(r.travel_reward_variant in ("train", "eval", "gym"), "rollout.travel_reward_variant",
             "must be train, eval or gym")
        _check_common(self, need)
        need(not (self.init.from_workdir and self.init.from_hf), "init.from_hf",
             "set at most one of init.from_workdir and init.from_hf")
        self.gyms.validate()
        return self

    def packing_bounds(self) -> dict:
        """What this config bounds per mini-batch, as numbers for the shape ladder (algorithms/rl_batch.py
        `shape_ladder`): dialogues (mini_batch_prompts x group_size); agent tokens of one dialogue = min(row_len - 1,
        turns x agent_max_tokens, the context past the longest prompt); with the fused CSD teacher, one dialogue's
        branch block = its agent tokens + per turn a coach note of users.coach_max_tokens and `NOTE_TOKENS` of
        template (else 0)."""
        r = self.rollout
        agent = min(int(r.row_len) - 1, r.max_turns * r.agent_max_tokens)
        if r.max_context_tokens and self.gyms.max_prompt_tokens:
            agent = min(agent, r.max_context_tokens - self.gyms.max_prompt_tokens)
        csd = self.rl.alpha > 0 and self.rl.teacher == "fused"
        branch = agent + r.max_turns * (self.users.coach_max_tokens + NOTE_TOKENS) if csd else 0
        return {"dialogues": r.mini_batch_prompts * r.group_size, "agent_tokens": agent, "branch_tokens": branch}


# ------------------------------------------------------------------------------------------ Stage I.3
@dataclasses.dataclass(frozen=True)
class SidesConfig:
    """The fixed sides (spec syntax: chat/specs.py; remote endpoints are asked as assistants)."""

    judge: str = "toy-judge"  # toy-judge (rule-based ABCD judge, envs/toy.py) | tiny | HF dir | workdir | http URL
    judge_model: str = ""
    support_agent: str = "toy-agent"  # toy-agent (rule-based, envs/toy.py) | spec; "" = the judge's model
    support_agent_model: str = ""
    partner: str = ""  # multi-turn SOUL interlocutor; "" = the support agent's model
    partner_model: str = ""
    key_env: str = ""  # remote: env var holding the API key
    max_tokens: int = 512


@dataclasses.dataclass(frozen=True)
class DomainMixConfig:
    weights: tuple = ()  # ((domain, weight), ...): p(d) unnormalised; () = uniform over the 24 domains
    sources: tuple = ()  # ((domain, record file), ...); a domain without one uses its shipped samples
    behaviour: bool = True  # ablation: False never draws abcd_behaviour
    neutral_share: float = 1.0 / 3.0  # ABCD: share of neutral customers (docs/reference/paper.md 3.4)
    max_user_turns: int = 8  # ABCD: customer turns per dialogue
    soul_max_turns: int = 0  # multi-turn SOUL tasks' policy turns; 0 = each task's own limit
    # p(d) itself needs the domain registry: train/rl/simulator.domain_weights(cfg.domains)


@dataclasses.dataclass(frozen=True)
class SimRolloutConfig(RolloutSection):
    """Stage I.3's rollout section: the shared settings + the simulator's turns."""

    prompts_per_step: int = 64  # Table 7: 64 x 8 = 512 rollouts per step
    max_tokens: int = 2048  # per simulator turn (thought + utterance)
    thinking: bool = True  # ablation: the simulator reasons before each turn (Table 7: on)
    fold: bool = True  # FoldGRPO statistics over unique rollout ids; False = the naive per-segment ablation

    turn_tokens_key = "max_tokens"


@dataclasses.dataclass(frozen=True)
class SimValidationConfig:
    every: int = 0  # steps between validations (0 = never)
    sources: tuple = ()  # ((domain, held-out record file), ...); () = the weighted domains' shipped samples
    max_records: int = 0  # per domain; 0 = all
    temperature: float = 0.0


@dataclasses.dataclass(frozen=True)
class SimRLConfig(_RLRun):
    """Stage I.3 (paper §3.3, Eq 4): joint multi-domain FoldGRPO of the simulator (train/rl/simulator.py)."""

    model: ModelConfig  # the simulator's architecture (Qwen3.5)
    tokenizer: TokenizerConfig = TokenizerConfig()
    init: InitConfig = InitConfig()
    sides: SidesConfig = SidesConfig()
    domains: DomainMixConfig = DomainMixConfig()
    rl: RLConfig = RLConfig(alpha=0.0)
    rollout: SimRolloutConfig = SimRolloutConfig()
    optimizer: OptimizerConfig = OptimizerConfig(lr=8e-6, schedule="constant", clip_norm=1.0)
    train: TrainConfig = TrainConfig(steps=500)
    mesh: MeshConfig = MeshConfig()
    checkpoint: CheckpointConfig = CheckpointConfig(every=10)
    validation: SimValidationConfig = SimValidationConfig()
    name: str = ""
    stage: str = "simrl"

    def validate(self) -> "SimRLConfig":
        def need(ok, key, msg):
            _need(ok, key, msg, within=self)

        r = self.rollout
        r.check(need, rl=self.rl, turn_checks=((r.max_tokens >= 1, "rollout.max_tokens", "must be >= 1"),))
        need(self.rl.alpha == 0, "rl.alpha", "must be 0: the simulator stage has no coach (CSD is Stage II's)")
        need(self.rl.credit == "equalized", "rl.credit", "must be equalized: every segment of a rollout gets the "
             "rollout's FoldGRPO advantage (turn-level credits are Stage II options)")
        d = self.domains
        need(0.0 <= d.neutral_share <= 1.0, "domains.neutral_share", "must be in [0, 1]")
        need(d.max_user_turns >= 1, "domains.max_user_turns", "must be >= 1")
        need(d.soul_max_turns >= 0, "domains.soul_max_turns", "must be >= 0")
        for key, pairs in (("domains.weights", d.weights), ("domains.sources", d.sources),
                           ("validation.sources", self.validation.sources)):
            for p in pairs:
                _need(isinstance(p, (tuple, list)) and len(p) == 2, key, "entries must be (domain, value) pairs",
                      got=p)
        _check_common(self, need)
        need(not (self.init.from_workdir and self.init.from_hf), "init.from_hf",
             "set at most one of init.from_workdir (mid-trained) and init.from_hf (pretrained)")
        return self

    def packing_bounds(self) -> dict:
        """What this config bounds per mini-batch, as numbers for the shape ladder: rollouts (mini_batch_prompts x
        group_size); policy tokens of one rollout (every policy turn its own segment of at most the context budget)
        = min(row_len - 1, domains.max_user_turns x max_tokens); no branches."""
        r = self.rollout
        return {"dialogues": r.mini_batch_prompts * r.group_size,
                "agent_tokens": min(int(r.row_len) - 1, self.domains.max_user_turns * r.max_tokens), "branch_tokens": 0}
