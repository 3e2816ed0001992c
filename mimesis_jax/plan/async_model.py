"""A discrete-event model of one RL run's wall clock: synchronous vs asynchronous agent RL at equal devices (issue
#44 item 7, third bullet). Pure Python and NumPy: no JAX program runs; the inputs are program times.

    python benchmarks/async_projection.py --config configs/qwen3_8b_agentrl.py:csd

What is simulated (every event at its own time, one seeded RNG for the dialogues):

* **dialogues**, in GRPO groups of `group_size` admitted together: agent turn k prefills the tokens the dialogue
  gained since turn k - 1 (the prompt for turn 0; the cache keeps the rest, as the rollout engine does), decodes
  its reply, then -- unless it was the last turn -- waits for the user's reply (the frozen simulator, an endpoint
  outside the device count) and starts turn k + 1. With CSD every turn that got a user reply gets a coach note
  (algorithms/coach.py `coach_requests`: no note after the last turn), another call to the same endpoint. A
  dialogue's turn count, reply lengths and user-side latencies are drawn up front (`draw_plans`), so every
  schedule runs the same dialogues.
* **rollout replicas** of `replica_devices` devices each, holding at most `replica_slots` dialogues in flight (the
  KV cache of a dialogue stays on its replica from admission to its last reply). A replica decodes all its
  sequences in the decode phase together, one token each per decode step of `decode_step_s + decode_ctx_s x (the
  sum of their contexts)` seconds (the weights read once per step, every sequence's cache read: memory-bound
  decoding). Its prefills run first-in first-out at `prefill_tok_s`, beside the decode (chunked prefill rides on
  the decode steps: the compute-bound and memory-bound halves overlap; an assumption). A turn prefills what its
  dialogue gained since its previous turn; with `reprefill` (the default) a turn that starts with newer weights
  than its dialogue's previous turn prefills the whole context instead (the rollout engine's set_params drops its
  cached dialogues), so re-prefills cost only where a dialogue spans versions (async and shared).
* **the trainer**: a PPO mini-batch of `mini_batch_prompts` whole groups costs `train_token_s` device-seconds per
  row token (prompt, replies and user turns: the rows the update reads), times `csd_factor` with CSD, over the
  training devices. A step is `prompts_per_step` groups (`prompts_per_step / mini_batch_prompts` updates); policy
  version v is the policy after v steps.
* **the user side**: every user reply and coach note holds one of `user_concurrency` workers (0: unbounded) for
  its latency; requests beyond that queue first-in first-out.

The schedules:

* **sync** (today's `train/rl/learner.py` loop): all devices roll out step k's groups with version k, every
  dialogue to its end; then the coach notes of the step (the learner's coach phase); then the step's updates on
  all devices; version k + 1 is read in place (no weight sync). The dialogues of a step run independently of each
  other, so a ratio against it is, on that count, a lower bound.
* **rounds**: sync as the learner runs it (episodes/agent.py `run_episodes`): in rounds, every dialogue of the
  step still going has its user reply to turn k before any starts turn k + 1.
* **async**: `rollout_devices` devices roll out, the rest train. Dialogues are admitted continuously while slots
  are free; group i (in admission order) belongs to step i // prompts_per_step and is admitted only once the
  rollout side has version >= i // prompts_per_step - max_staleness, so every token sampled by version v is trained
  by version <= v + max_staleness (each turn samples with the newest version on the rollout side at its start,
  which is >= the one at admission): the bound holds by holding new dialogues back, never by discarding finished
  ones. The trainer takes a mini-batch as soon as `mini_batch_prompts` whole groups of its current step are
  complete (rollout ended, every coach note back); coach notes are asked as soon as their user reply is in. After
  a step's last update the new weights go to the rollout replicas: for `sync_s` both pools wait (the trainer
  sends, every replica pauses its decoding and prefills), then every turn that starts samples with them (in-flight
  updates: a dialogue may span versions; a turn samples wholly with the version at its start, also one that a sync
  stopped).
* **shared** (asynchronous on shared devices: rollout.devices=0, rl.max_staleness >= 1): all devices roll out and
  train, taking turns. Admission, the staleness bound, the coach notes and the mini-batches are async's: group i
  is admitted once the version is >= i // prompts_per_step - max_staleness, notes are asked as soon as their user
  reply is in, and an update starts as soon as `mini_batch_prompts` whole groups of the trainer's step are
  complete, on all devices (`devices`, as in sync). While an update runs, no replica decodes or prefills (its
  sequences keep their KV caches and their place, and go on from where they stopped); the user side goes on, so
  dialogues waiting on a user reply or a coach note keep waiting through it, and a reply that comes back queues
  its turn. Between the updates of a step decoding resumes with the version the step trains (a version is
  published only after a step's last update); after the last one the new weights are published into the rollout
  engine's copy for `sync_s` (every device waits, as in async), then every turn that starts samples with them.
  With max_staleness 0, zero user and coach latencies (nothing outside the devices takes time) and no re-prefill
  needed (no dialogue spans versions at staleness 0), pausing every replica at once shifts the rest of the step's
  rollouts by the update's length: step k ends exactly (k + 1) x sync_s after sync's (tested).

Measured: the wall time at which each step's version becomes available, trained groups and agent tokens (the
tokens the loss reads) per hour over the steps after `warmup_steps`, the pools' busy fractions over that window
(rollout: a replica decoding or prefilling, averaged over replicas; trainer: running updates; weight syncs are
their own fraction), and staleness = (the step that trains a token) - (the version that sampled it), weighted by
tokens.

Default program times (`programs_for`) come from a device's datasheet figures and stated efficiencies, not from a
measurement at this scale (a CPU's rehearsal is not paper scale): each is an assumption the script prints, and
each has a flag. `rehearse --json` on a device, or the serving benchmarks, give measured values to pass instead.
"""

from __future__ import annotations

import dataclasses
import collections
import heapq
import itertools
import math

import numpy as np

from mimesis_jax.errors import ConfigError
from mimesis_jax.plan.devices import DEVICES

# HBM bandwidth per device, bytes/s (datasheets: A100 80GB SXM 2,039 GB/s; H100 SXM 3.35 TB/s; H200 4.8 TB/s)
HBM_BYTES_S = {"a100-80g": 2.039e12, "a100-40g": 1.555e12, "h100-80g": 3.35e12, "h200": 4.8e12}
NO_BUDGET = 1 << 40  # rollout.max_context_tokens = 0: no context budget
EPS_TOKENS = 1e-6  # a decode counter this close to a sequence's finish has finished it (float rounding)


@dataclasses.dataclass(frozen=True)
class Workload:
    """The step's shape (from the RL config) and the dialogue distributions the paper does not print (assumed)."""
    prompts_per_step: int = 128
    group_size: int = 8
    mini_batch_prompts: int = 16
    max_turns: int = 16
    agent_max_tokens: int = 2048
    max_context_tokens: int = 9344
    max_prompt_tokens: int = 1152
    csd: bool = True
    min_prompt_tokens: int = 300  # prompts uniform in [min, max_prompt_tokens]
    reply_median: float = 250.0  # agent reply tokens per turn: lognormal(median, sigma), cut at agent_max_tokens
    reply_sigma: float = 0.8
    user_tokens_median: float = 80.0  # tokens a user turn (utterance, tool result, reward line) adds to the context
    user_tokens_sigma: float = 0.6
    end_prob: float = 0.08  # the environment ends the dialogue after an agent turn with this chance
    user_median_s: float = 8.0  # a user reply's latency: lognormal(median, sigma) seconds
    user_sigma: float = 0.5
    coach_median_s: float = 3.0  # a coach note's latency, the same way
    coach_sigma: float = 0.5

    @property
    def dialogues_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


@dataclasses.dataclass(frozen=True)
class Programs:
    """Per-program times of one run's devices (see `programs_for` for the defaults' derivation)."""
    devices: int = 16
    replica_devices: int = 2
    replica_slots: int = 128
    decode_step_s: float = 0.0057  # one decode step's fixed part: the replica's weight shards read once
    decode_ctx_s: float = 5.2e-8  # per context token of every sequence in the step (its KV cache read)
    prefill_tok_s: float = 19000.0  # one replica's prefill tokens/s
    train_token_s: float = 6.6e-4  # device-seconds per row token of a GRPO update (old log-probs recomputed)
    csd_factor: float = 1.19  # the fused CSD update over the GRPO one
    sync_s: float = 2.0  # one weight sync to the rollout replicas (async and shared only)
    user_concurrency: int = 0  # user-side calls served at once; 0 = unbounded
    reprefill: int = 1  # 1: a turn after new weights prefills its dialogue's whole context; 0: only what it gained


@dataclasses.dataclass(frozen=True)
class Schedule:
    kind: str = "sync"  # "sync" | "rounds" | "async" | "shared"
    rollout_devices: int = 0  # async: devices that roll out (the rest train); else 0: all devices do both
    max_staleness: int = 0


@dataclasses.dataclass(frozen=True)
class TurnPlan:
    reply_tokens: int
    user_tokens: int = 0  # the user turn after this agent turn (0 after the last)
    user_s: float = 0.0
    coach_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class DialoguePlan:
    prompt_tokens: int
    turns: tuple[TurnPlan, ...]

    @property
    def agent_tokens(self) -> int:
        return sum(t.reply_tokens for t in self.turns)

    @property
    def row_tokens(self) -> int:
        return self.prompt_tokens + sum(t.reply_tokens + t.user_tokens for t in self.turns)


@dataclasses.dataclass
class Projection:
    schedule: Schedule
    step_end_s: list[float]
    window_s: float
    groups_per_hour: float
    tokens_per_hour: float  # agent (trained) tokens
    rollout_tok_dev_s: float  # those tokens per second per rollout device (sync: per device)
    rollout_busy: float
    trainer_busy: float
    sync_fraction: float
    staleness_mean: float
    staleness_max: int
    staleness_tokens: dict[int, int]  # {staleness: trained tokens}


def _dense_params(model) -> int:
    """Parameters of a Qwen3-style dense model (every layer full attention)."""
    d, hd = model.hidden_size, model.head_dim
    attn = d * hd * (2 * model.num_attention_heads + 2 * model.num_key_value_heads)
    mlp = 3 * d * model.intermediate_size
    embed = model.vocab_size * d * (1 if model.tie_word_embeddings else 2)
    return model.num_hidden_layers * (attn + mlp) + embed


def programs_for(model, *, device: str = "a100-80g", devices: int = 16, replica_devices: int = 2,
                 replica_slots: int = 128, decode_bw_eff: float = 0.7, prefill_mfu: float = 0.5,
                 train_mfu: float = 0.4, csd_factor: float = 1.19, sync_s: float = 2.0,
                 user_concurrency: int = 0, reprefill: int = 1) -> Programs:
    """Program times of `model` (a dense Qwen3 ModelConfig) on `device` from its datasheet peak and bandwidth:
    decode step = bf16 weights / (replica's bandwidth x decode_bw_eff) + per context token its bf16 K and V over
    every layer / the same; prefill = the replica's peak x prefill_mfu / 2N FLOPs per token; the update = 10N FLOPs
    per row token (8N forward + backward + full-remat forward, 2N the old-log-prob forward) / (peak x train_mfu)."""
    if device not in HBM_BYTES_S:
        raise ConfigError(f"--device {device!r}: no bandwidth figure; expected one of {sorted(HBM_BYTES_S)}")
    if model.model_type != "qwen3":
        raise ConfigError(f"model.model_type {model.model_type!r}: the projection's program times count a dense "
                          "Qwen3 agent (Stage II)")
    n = _dense_params(model)
    peak, bw = DEVICES[device].peak_bf16_flops, HBM_BYTES_S[device]
    kv_bytes = model.num_hidden_layers * model.num_key_value_heads * model.head_dim * 2 * 2
    rbw = replica_devices * bw * decode_bw_eff
    return Programs(devices=devices, replica_devices=replica_devices, replica_slots=replica_slots,
                    decode_step_s=2 * n / rbw, decode_ctx_s=kv_bytes / rbw,
                    prefill_tok_s=replica_devices * peak * prefill_mfu / (2 * n),
                    train_token_s=10 * n / (peak * train_mfu), csd_factor=csd_factor, sync_s=sync_s,
                    user_concurrency=user_concurrency, reprefill=reprefill)


def workload_from_config(cfg, **assumptions) -> Workload:
    """The step's shape from a Stage II AgentRLConfig; `assumptions` override the distributions' defaults."""
    r = cfg.rollout
    prompt = cfg.gyms.max_prompt_tokens or Workload.max_prompt_tokens  # 0: no prompt filter, the default range
    return Workload(prompts_per_step=r.prompts_per_step, group_size=r.group_size,
                    mini_batch_prompts=r.mini_batch_prompts, max_turns=min(r.max_turns, cfg.gyms.max_turns),
                    agent_max_tokens=r.agent_max_tokens, max_context_tokens=r.max_context_tokens or NO_BUDGET,
                    max_prompt_tokens=prompt, csd=cfg.rl.alpha > 0, **assumptions)


def _lognormal(rng, median, sigma, size):
    return median * np.exp(sigma * rng.standard_normal(size))


def draw_plan(w: Workload, rng: np.random.Generator) -> DialoguePlan:
    """One dialogue: turns until the environment ends it (end_prob per turn), max_turns or the context budget."""
    prompt = int(rng.integers(min(w.min_prompt_tokens, w.max_prompt_tokens), w.max_prompt_tokens + 1))
    ends = rng.random(w.max_turns) < w.end_prob
    n = int(np.argmax(ends)) + 1 if ends.any() else w.max_turns
    replies = np.clip(np.rint(_lognormal(rng, w.reply_median, w.reply_sigma, n)), 1, w.agent_max_tokens)
    users = np.maximum(np.rint(_lognormal(rng, w.user_tokens_median, w.user_tokens_sigma, n)), 1)
    user_s = _lognormal(rng, w.user_median_s, w.user_sigma, n)
    coach_s = _lognormal(rng, w.coach_median_s, w.coach_sigma, n)
    turns, ctx = [], prompt
    for k in range(n):
        reply = int(min(replies[k], w.max_context_tokens - ctx))
        if reply < 1:
            break
        ctx += reply
        last = k == n - 1 or ctx + int(users[k]) >= w.max_context_tokens
        if last:
            turns.append(TurnPlan(reply))
            break
        turns.append(TurnPlan(reply, int(users[k]), float(user_s[k]), float(coach_s[k])))
        ctx += int(users[k])
    return DialoguePlan(prompt, tuple(turns))


def draw_plans(w: Workload, steps: int, seed: int = 0) -> list[list[DialoguePlan]]:
    """`steps` steps' groups of dialogues (a list per group), from one seeded RNG."""
    rng = np.random.default_rng(seed)
    return [[draw_plan(w, rng) for _ in range(w.group_size)] for _ in range(steps * w.prompts_per_step)]


class _Replica:
    def __init__(self, index, slots):
        self.index, self.free = index, slots
        self.active: dict[int, int] = {}  # decoding dialogue -> its context tokens
        self.finish: list[tuple[float, int]] = []  # (decode counter at which it finishes, dialogue)
        self.counter, self.t, self.stamp, self.ctx, self.paused = 0.0, 0.0, 0, 0, False
        self.prefills: collections.deque = collections.deque()  # [dialogue, tokens left], first-in first-out
        self.pt, self.pstamp = 0.0, 0
        self.decode_since = self.prefill_since = None
        self.intervals: list[tuple[float, float]] = []  # decoding or prefilling


class _Dialogue:
    def __init__(self, index, group, plan):
        self.index, self.group, self.plan = index, group, plan
        self.replica = None
        self.turn, self.version, self.notes_out = 0, 0, 0
        self.rolled = False
        self.deferred: list[float] = []  # sync: coach notes asked in the step's coach phase
        self.sampled: list[tuple[int, int]] = []  # (tokens, version) per agent turn


class _Sim:
    """The event loop; `simulate` is its entry."""

    def __init__(self, w: Workload, p: Programs, s: Schedule, plans: list[list[DialoguePlan]]):
        self.w, self.p, self.s = w, p, s
        self.shared, self.rounds = s.kind == "shared", s.kind == "rounds"
        self.asyn = s.kind == "async" or self.shared  # dialogues across steps, mini-batches as groups complete
        self.waiting: list[list[_Dialogue]] = [[] for _ in range(len(plans) // w.prompts_per_step)]
        self.live = [w.dialogues_per_step] * (len(plans) // w.prompts_per_step)  # rounds: dialogues not ended
        rollout_devices = s.rollout_devices if s.kind == "async" else p.devices
        self.train_devices = p.devices - rollout_devices if s.kind == "async" else p.devices
        self.replicas = [_Replica(i, p.replica_slots) for i in range(rollout_devices // p.replica_devices)]
        self.steps = len(plans) // w.prompts_per_step
        self.groups = [[_Dialogue(g * w.group_size + j, g, pl) for j, pl in enumerate(gp)]
                       for g, gp in enumerate(plans)]
        self.group_left = [w.group_size] * len(plans)  # dialogues of the group not yet complete
        self.ready: list[list[int]] = [[] for _ in range(self.steps)]
        self.trained = [0] * self.steps
        self.step_rolled = [0] * self.steps  # sync: dialogues of the step whose rollout ended
        self.step_notes = [0] * self.steps  # sync: coach notes of the step still out
        self.events, self.seq, self.now = [], itertools.count(), 0.0
        self.version, self.train_step, self.admitted, self.trainer_busy = 0, 0, 0, False
        self.workers, self.queue = 0, []
        self.step_end: list[float] = []
        self.update_intervals: list[tuple[float, float]] = []
        self.sync_intervals: list[tuple[float, float]] = []
        self.stale: dict[int, dict[int, int]] = {}  # step -> {staleness: tokens}

    def at(self, t, fn, *args):
        heapq.heappush(self.events, (t, next(self.seq), fn, args))

    def run(self):
        self.admit()
        while self.events and len(self.step_end) < self.steps:
            self.now, _, fn, args = heapq.heappop(self.events)
            fn(*args)
        if len(self.step_end) < self.steps:
            raise RuntimeError(f"the schedule stalled after {len(self.step_end)} of {self.steps} steps")

    # -- rollout side -------------------------------------------------------------------------------------------
    def admit(self):
        """Admits whole groups while the staleness bound and the free slots allow, each dialogue onto the replica
        with the most free slots (the first such)."""
        w = self.w
        limit = min(len(self.groups), (self.version + self.s.max_staleness + 1) * w.prompts_per_step)
        while self.admitted < limit and sum(r.free for r in self.replicas) >= w.group_size:
            for d in self.groups[self.admitted]:
                rep = max(self.replicas, key=lambda r: (r.free, -r.index))
                rep.free -= 1
                d.replica = rep
                self.turn_start(d)
            self.admitted += 1

    def turn_start(self, d):
        """Queues the turn's prefill: what the dialogue gained since its last turn, or with `reprefill` its whole
        context when new weights came since (the engine's set_params drops its cached dialogues)."""
        if d.turn == 0:
            new = d.plan.prompt_tokens
        elif self.p.reprefill and d.version != self.version:
            new = self.context(d)
        else:
            new = d.plan.turns[d.turn - 1].user_tokens
        d.version = self.version
        rep = d.replica
        self.advance_prefill(rep)
        rep.prefills.append([d, float(new)])
        self.reschedule_prefill(rep)

    def advance_prefill(self, rep):
        elapsed = self.now - rep.pt
        if rep.prefills and not rep.paused and elapsed > 0:  # only the queue's head progresses
            rep.prefills[0][1] = max(0.0, rep.prefills[0][1] - elapsed * self.p.prefill_tok_s)
        rep.pt = self.now

    def reschedule_prefill(self, rep):
        rep.pstamp += 1
        running = bool(rep.prefills) and not rep.paused
        if running and rep.prefill_since is None:
            rep.prefill_since = self.now
        elif not running and rep.prefill_since is not None:
            rep.intervals.append((rep.prefill_since, self.now))
            rep.prefill_since = None
        if running:
            self.at(self.now + rep.prefills[0][1] / self.p.prefill_tok_s, self.prefill_done, rep, rep.pstamp)

    def prefill_done(self, rep, stamp):
        if stamp != rep.pstamp:
            return
        self.advance_prefill(rep)
        d, _ = rep.prefills.popleft()
        self.reschedule_prefill(rep)
        self.decode_join(d)

    def pause(self, paused):
        """Stops (paused=True) or restarts every replica's decoding and prefilling: a weight sync, or on shared
        devices an update."""
        for rep in self.replicas:
            if rep.paused != paused:
                self.advance(rep)
                self.advance_prefill(rep)
                rep.paused = paused
                self.reschedule(rep)
                self.reschedule_prefill(rep)

    def context(self, d):
        k = d.turn
        return d.plan.prompt_tokens + sum(t.reply_tokens + t.user_tokens for t in d.plan.turns[:k])

    def advance(self, rep):
        if rep.active and not rep.paused:
            rep.counter += (self.now - rep.t) / (self.p.decode_step_s + self.p.decode_ctx_s * rep.ctx)
        rep.t = self.now

    def reschedule(self, rep):
        rep.stamp += 1
        decoding = bool(rep.active) and not rep.paused
        if decoding and rep.decode_since is None:
            rep.decode_since = self.now
        elif not decoding and rep.decode_since is not None:
            rep.intervals.append((rep.decode_since, self.now))
            rep.decode_since = None
        if decoding:
            left = max(0.0, rep.finish[0][0] - rep.counter)
            self.at(self.now + left * (self.p.decode_step_s + self.p.decode_ctx_s * rep.ctx), self.decode_done,
                    rep, rep.stamp)

    def decode_join(self, d):
        rep = d.replica
        self.advance(rep)
        ctx = self.context(d)
        rep.active[d.index] = ctx
        rep.ctx += ctx
        heapq.heappush(rep.finish, (rep.counter + d.plan.turns[d.turn].reply_tokens, d.index))
        self.reschedule(rep)

    def decode_done(self, rep, stamp):
        if stamp != rep.stamp:
            return
        self.advance(rep)
        done = []
        while rep.finish and rep.finish[0][0] <= rep.counter + EPS_TOKENS:
            f, i = heapq.heappop(rep.finish)
            rep.counter = max(rep.counter, f)
            rep.ctx -= rep.active.pop(i)
            done.append(i)
        self.reschedule(rep)
        for i in done:
            self.turn_done(self.groups[i // self.w.group_size][i % self.w.group_size])

    def turn_done(self, d):
        tp = d.plan.turns[d.turn]
        d.sampled.append((tp.reply_tokens, d.version))
        if d.turn == len(d.plan.turns) - 1:
            d.rolled = True
            d.replica.free += 1
            self.rollout_ended(d)
            self.admit()
        else:
            self.call(tp.user_s, self.user_replied, d)

    def user_replied(self, d):
        tp = d.plan.turns[d.turn]
        if self.w.csd and self.asyn:
            d.notes_out += 1
            self.call(tp.coach_s, self.note_back, d)
        elif self.w.csd:
            d.deferred.append(tp.coach_s)
        d.turn += 1
        if self.rounds:
            step = d.group // self.w.prompts_per_step
            self.waiting[step].append(d)
            self.next_round(step)
        else:
            self.turn_start(d)

    def next_round(self, step):
        """rounds: every dialogue of the step still going has its user reply: all start their next turn."""
        if self.waiting[step] and len(self.waiting[step]) == self.live[step]:
            batch, self.waiting[step] = self.waiting[step], []
            for d in batch:
                self.turn_start(d)

    # -- user side ----------------------------------------------------------------------------------------------
    def call(self, latency, then, d):
        if self.p.user_concurrency and self.workers >= self.p.user_concurrency:
            self.queue.append((latency, then, d))
            return
        self.workers += 1
        self.at(self.now + latency, self.answered, then, d)

    def answered(self, then, d):
        self.workers -= 1
        if self.queue:
            latency, nxt, nd = self.queue.pop(0)
            self.workers += 1
            self.at(self.now + latency, self.answered, nxt, nd)
        then(d)

    def note_back(self, d):
        d.notes_out -= 1
        if self.asyn:
            self.maybe_complete(d)
        else:
            step = d.group // self.w.prompts_per_step
            self.step_notes[step] -= 1
            if self.step_notes[step] == 0:
                self.step_ready(step)

    def rollout_ended(self, d):
        if self.asyn:
            self.maybe_complete(d)
            return
        step = d.group // self.w.prompts_per_step
        self.step_rolled[step] += 1
        if self.rounds:
            self.live[step] -= 1
            self.next_round(step)
        if self.step_rolled[step] < self.w.dialogues_per_step:
            return
        first = step * self.w.prompts_per_step
        batch = [x for g in self.groups[first:first + self.w.prompts_per_step] for x in g]
        self.step_notes[step] = sum(len(x.deferred) for x in batch)
        if self.step_notes[step] == 0:
            self.step_ready(step)
        for x in batch:  # the step's coach phase
            for latency in x.deferred:
                x.notes_out += 1
                self.call(latency, self.note_back, x)

    def maybe_complete(self, d):
        if d.rolled and d.notes_out == 0:
            self.group_left[d.group] -= 1
            if self.group_left[d.group] == 0:
                self.ready[d.group // self.w.prompts_per_step].append(d.group)
                self.try_train()

    def step_ready(self, step):
        first = step * self.w.prompts_per_step
        self.ready[step].extend(range(first, first + self.w.prompts_per_step))
        self.try_train()

    # -- trainer ------------------------------------------------------------------------------------------------
    def try_train(self):
        k, mb = self.train_step, self.w.mini_batch_prompts
        if self.trainer_busy or k >= self.steps or len(self.ready[k]) < mb:
            return
        batch, self.ready[k] = self.ready[k][:mb], self.ready[k][mb:]
        rows = sum(d.plan.row_tokens for g in batch for d in self.groups[g])
        cost = self.p.train_token_s * (self.p.csd_factor if self.w.csd else 1.0)
        end = self.now + rows * cost / self.train_devices
        self.trainer_busy = True
        if self.shared:  # the devices train: no decoding or prefilling until the update ends
            self.pause(True)
        self.update_intervals.append((self.now, end))
        self.at(end, self.update_done, k, batch)

    def update_done(self, k, batch):
        hist = self.stale.setdefault(k, {})
        for g in batch:
            for d in self.groups[g]:
                for tokens, v in d.sampled:
                    hist[k - v] = hist.get(k - v, 0) + tokens
        self.trained[k] += len(batch)
        if self.trained[k] < self.w.prompts_per_step:
            self.trainer_busy = False
            self.pause(False)  # shared: decoding resumes until the next mini-batch is ready
            self.try_train()
        elif self.asyn:  # the new weights to the rollout replicas: every replica waits
            self.sync_intervals.append((self.now, self.now + self.p.sync_s))
            self.pause(True)
            self.at(self.now + self.p.sync_s, self.new_version, k + 1)
        else:
            self.new_version(k + 1)

    def new_version(self, v):
        self.pause(False)
        self.version = self.train_step = v
        self.step_end.append(self.now)
        self.trainer_busy = False
        self.admit()
        self.try_train()


def _covered(intervals, lo, hi) -> float:
    """Seconds of [lo, hi] covered by the union of `intervals`."""
    total, end = 0.0, lo
    for a, b in sorted(intervals):
        a, b = max(a, end), min(b, hi)
        if b > a:
            total += b - a
            end = b
    return total


def check(w: Workload, p: Programs, s: Schedule) -> None:
    """One-line errors naming the setting for a schedule the model cannot run."""
    if s.kind not in ("sync", "rounds", "async", "shared"):
        raise ConfigError(f"--schedule {s.kind!r}: expected sync, rounds, async or shared")
    if w.prompts_per_step % w.mini_batch_prompts:
        raise ConfigError(f"rollout.mini_batch_prompts {w.mini_batch_prompts} must divide rollout.prompts_per_step "
                          f"{w.prompts_per_step}")
    if w.max_prompt_tokens >= w.max_context_tokens:
        raise ConfigError(f"rollout.max_context_tokens {w.max_context_tokens} leaves no room for a reply after a "
                          f"prompt of gyms.max_prompt_tokens {w.max_prompt_tokens}")
    if s.max_staleness < 0:
        raise ConfigError(f"--max-staleness {s.max_staleness}: must be >= 0")
    if s.kind in ("sync", "rounds") and s.max_staleness:
        raise ConfigError(f"--max-staleness {s.max_staleness}: the {s.kind} schedule is synchronous (0)")
    if s.kind == "shared" and s.rollout_devices:
        raise ConfigError(f"--rollout-devices {s.rollout_devices}: the shared schedule rolls out and trains on all "
                          f"{p.devices} devices (rollout.devices=0)")
    if p.reprefill not in (0, 1):
        raise ConfigError(f"--reprefill {p.reprefill}: expected 0 or 1")
    roll = s.rollout_devices if s.kind == "async" else p.devices
    if s.kind == "async" and not 0 < s.rollout_devices < p.devices:
        raise ConfigError(f"--rollout-devices {s.rollout_devices}: the async schedule needs 1 to {p.devices - 1} "
                          f"(the rest of the {p.devices} devices train)")
    if roll % p.replica_devices:
        raise ConfigError(f"--rollout-devices {roll}: not a whole number of replicas of --replica-devices "
                          f"{p.replica_devices}")
    if s.kind == "rounds" and (roll // p.replica_devices) * p.replica_slots < w.dialogues_per_step:
        raise ConfigError(f"--replica-slots {p.replica_slots}: the rounds schedule holds a step's "
                          f"{w.dialogues_per_step} dialogues in flight, {roll // p.replica_devices} replica(s) "
                          f"hold {(roll // p.replica_devices) * p.replica_slots}")
    if (roll // p.replica_devices) * p.replica_slots < w.group_size:
        raise ConfigError(f"--rollout-devices {roll}: {roll // p.replica_devices} replica(s) of "
                          f"--replica-devices {p.replica_devices} with --replica-slots {p.replica_slots} cannot "
                          f"hold one group of {w.group_size} dialogues")


def simulate(w: Workload, p: Programs, s: Schedule, plans: list[list[DialoguePlan]], *,
             warmup_steps: int = 1) -> Projection:
    """Runs the schedule over `plans` (groups in admission order; whole steps of prompts_per_step groups) and
    measures the steps after the first `warmup_steps` (the async pipeline's fill is not its steady state)."""
    check(w, p, s)
    if len(plans) % w.prompts_per_step or not plans:
        raise ValueError(f"{len(plans)} groups are not whole steps of {w.prompts_per_step}")
    sim = _Sim(w, p, s, plans)
    sim.run()
    if not 0 <= warmup_steps < sim.steps:
        raise ValueError(f"warmup_steps {warmup_steps}: the run has {sim.steps} steps")
    lo = sim.step_end[warmup_steps - 1] if warmup_steps else 0.0
    hi = sim.step_end[-1]
    window = hi - lo
    counted = range(warmup_steps * w.prompts_per_step, len(plans))
    tokens = sum(d.plan.agent_tokens for g in counted for d in sim.groups[g])
    hist: dict[int, int] = {}
    for k in range(warmup_steps, sim.steps):
        for st, n in sim.stale[k].items():
            hist[st] = hist.get(st, 0) + n
    total = sum(hist.values())
    rollout_busy = sum(_covered(r.intervals, lo, hi) for r in sim.replicas) / (len(sim.replicas) * window)
    return Projection(schedule=s, step_end_s=sim.step_end, window_s=window,
                      groups_per_hour=len(counted) * 3600.0 / window, tokens_per_hour=tokens * 3600.0 / window,
                      rollout_tok_dev_s=tokens / (window * len(sim.replicas) * p.replica_devices),
                      rollout_busy=rollout_busy, trainer_busy=_covered(sim.update_intervals, lo, hi) / window,
                      sync_fraction=_covered(sim.sync_intervals, lo, hi) / window,
                      staleness_mean=sum(st * n for st, n in hist.items()) / total if total else 0.0,
                      staleness_max=max(hist) if hist else 0, staleness_tokens=dict(sorted(hist.items())))
