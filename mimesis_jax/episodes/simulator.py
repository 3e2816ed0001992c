"""The role-flipped episode runner: the *simulator* is the sampled, log-probbed policy (Stage I joint RL, Eq 4).

Stage II's runner (episodes/agent.py) samples the agent and asks a frozen simulator for user turns. Here the
simulator is the policy and every other side -- the ABCD support agent, a SOUL task's interlocutor, the judges --
sits inside the environment (envs/sim_env.py). One round for every live episode:

1. **policy turn** -- each live episode's view (its messages, true roles) is rendered with data/chat.py, the
   generation header of the env's ``policy_role`` appended (``user`` for the ABCD customer, ``assistant`` for SOUL
   tasks; the thinking template when ``env.thinking``), and ALL of them go through ONE sampler call. The prompt
   tokens and the sampled tokens with their log-probs are recorded exactly as sampled -- never decoded and
   re-tokenised;
2. **environment step** -- the sample is split into the private thought and the public utterance
   (`thoughts.split_thought`; a thinking turn that never closes ``</think>`` has no utterance) and given to
   ``env.step(thought, utterance)``, concurrently across episodes (envs call their judges / partners there).
   The utterance (with the thought as ``reasoning``, which the chat template keeps or drops as in SFT) and the
   env's messages are appended to the view.

Episodes end when the env says done, at ``min(env.max_policy_turns, config.max_turns)`` policy turns or when the
next prompt would pass ``config.max_context_tokens`` (both then ask ``env.finish(reason)`` for the reward), or
when a fixed side fails (`InvalidEpisode`: status "invalid", reward None -- the RL stage drops it).

Training segments (what FoldGRPO expects, docs/reference/paper.md 3.3): each policy turn is its OWN segment with its own context,
a `Trajectory` of two segments -- ``public`` (the exact prompt tokens) and ``agent`` (the sampled tokens through the
stop token, with log-probs) -- and ``turn_rewards = [r]``, the rollout's final reward. Every segment of a rollout
carries the rollout's id, so `fold_inputs` + ``grpo.group_advantages(..., fold=True)`` count the rollout once
in its group's statistics.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any, Callable, Sequence

from mimesis_jax.data.chat import render_messages
from mimesis_jax.data.trajectory import Segment, Trajectory
from mimesis_jax.envs.agent_env import InvalidEpisode
from mimesis_jax.envs.sim_env import POLICY_ROLES, SimEnv, SimTurn
from mimesis_jax.episodes.agent import ROLLOUT_IDS
from mimesis_jax.episodes.progress import TurnProgress
from mimesis_jax.chat.thoughts import split_thought
from mimesis_jax.inference.protocol import Generator, Sampling, derive_seed
from mimesis_jax import timeline


@dataclasses.dataclass
class SimEpisodeTask:
    """One simulator rollout to run: a fresh env and its bookkeeping."""

    env: SimEnv
    group_id: int = 0
    rollout_id: int | None = None  # default: the next id of the process-wide counter (never reused)
    domain: str | None = None  # default: env.domain
    task: dict[str, Any] = dataclasses.field(default_factory=dict)
    reset_seed: int | None = None


@dataclasses.dataclass
class SimEpisodeConfig:
    max_tokens: int = 1024  # per policy turn
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_turns: int | None = None  # cap on policy turns over every env's own max_policy_turns
    max_context_tokens: int | None = None  # finish (env.finish) before a prompt + max_tokens would exceed this
    seed: int = 0
    env_workers: int = 16  # threads stepping envs at once (their judge / partner calls overlap)
    dialogue_keys: bool = True  # a policy with persistent dialogue state (inference/engine.py, it has `release`)
    # gets the rollout ids as keys: each turn then prefills only what was appended since its last one

    def __post_init__(self):
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"SimEpisodeConfig.max_turns must be >= 1 or None, got {self.max_turns}")
        if self.max_tokens < 1:
            raise ValueError(f"SimEpisodeConfig.max_tokens must be >= 1, got {self.max_tokens}")


@dataclasses.dataclass
class SimRollout:
    """One simulator rollout: its per-turn training segments, reward and record."""

    segments: list[Trajectory]
    domain: str
    group_id: int
    rollout_id: int
    reward: float | None = None  # r_d in [0, 1]; None when invalid
    status: str = "ok"  # ok | invalid
    invalid_reason: str | None = None
    end: str | None = None  # done | turn_limit | context_limit | invalid
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # the final SimTurn's info
    thoughts: list[str | None] = dataclasses.field(default_factory=list)
    utterances: list[str | None] = dataclasses.field(default_factory=list)
    transcript: list[dict] = dataclasses.field(default_factory=list)  # env.transcript() at the end
    task: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(eq=False)
class _Live:
    index: int
    task: SimEpisodeTask
    out: SimRollout
    view: list[dict]
    limit: int
    seed_key: int
    done: bool = False


def _finish(ep: _Live, turn: SimTurn, end: str) -> None:
    ep.done = True
    ep.out.reward, ep.out.end, ep.out.info = float(turn.reward), end, dict(turn.info)
    for seg in ep.out.segments:
        seg.turn_rewards = [ep.out.reward]


def _invalid(ep: _Live, reason: str) -> None:
    ep.done = True
    ep.out.status, ep.out.invalid_reason, ep.out.end = "invalid", reason, "invalid"
    for seg in ep.out.segments:
        seg.status, seg.invalid_reason = "invalid", reason


def _call(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # reported by the caller, in order
        return e


def _pool_map(fn, items: list, workers: int) -> list:
    if workers <= 1 or len(items) <= 1:
        return [fn(*it) for it in items]
    with concurrent.futures.ThreadPoolExecutor(min(workers, len(items))) as pool:
        return list(pool.map(lambda it: fn(*it), items))


def _check_turn(ep: _Live, result, what: str) -> SimTurn | None:
    """The env's SimTurn, or None after marking the episode invalid; a bug in the env is raised with context."""
    if isinstance(result, InvalidEpisode):
        _invalid(ep, f"{what}: {result}")
        return None
    if isinstance(result, Exception):
        raise RuntimeError(f"task {ep.index} (domain {ep.out.domain}, rollout {ep.out.rollout_id}), {what}: the "
                           f"environment raised {type(result).__name__}: {result}") from result
    if not isinstance(result, SimTurn):
        raise TypeError(f"task {ep.index} (domain {ep.out.domain}), {what}: env returned "
                        f"{type(result).__name__}, expected SimTurn")
    return result


def _start(tasks: Sequence[SimEpisodeTask], cfg: SimEpisodeConfig) -> list[_Live]:
    """Checks the tasks' policy roles and rollout ids and opens one live rollout per task (envs not reset yet)."""
    eps: list[_Live] = []
    seen: dict[int, int] = {}
    for i, task in enumerate(tasks):
        env = task.env
        if env.policy_role not in POLICY_ROLES:
            raise ValueError(f"task {i}: env {type(env).__name__}.policy_role must be one of {POLICY_ROLES}, got "
                             f"{env.policy_role!r}")
        rid = next(ROLLOUT_IDS) if task.rollout_id is None else int(task.rollout_id)
        if rid in seen:
            raise ValueError(f"task {i}: rollout id {rid} is already used by task {seen[rid]} of this call")
        seen[rid] = i
        limit = env.max_policy_turns if cfg.max_turns is None else min(env.max_policy_turns, cfg.max_turns)
        out = SimRollout(segments=[], domain=task.domain or env.domain, group_id=task.group_id, rollout_id=rid,
                         task=dict(task.task))
        eps.append(_Live(i, task, out, [], limit, seed_key=i if task.rollout_id is None else rid))
    return eps


def _reset(eps: list[_Live], workers: int) -> None:
    """Resets every env concurrently; each rollout's view starts as its env's opening messages."""
    for ep, view in zip(eps, _pool_map(lambda ep: _call(ep.task.env.reset, ep.task.reset_seed),
                                       [(ep,) for ep in eps], workers)):
        if isinstance(view, InvalidEpisode):
            _invalid(ep, f"reset: {view}")
        elif isinstance(view, Exception):
            raise RuntimeError(f"task {ep.index} (domain {ep.out.domain}): reset raised {type(view).__name__}: "
                               f"{view}") from view
        else:
            ep.view = [dict(m) for m in view]


def _finish_at(eps: list[_Live], reason: str, what: str, workers: int) -> None:
    """Asks each env in `eps` for its reward at a limit (``env.finish(reason)``, concurrently) and ends it."""
    for ep, result in zip(eps, _pool_map(lambda ep: _call(ep.task.env.finish, reason), [(ep,) for ep in eps],
                                         workers)):
        t = _check_turn(ep, result, what)
        if t is not None:
            _finish(ep, t, reason)


def _prompts(eps: list[_Live], cfg: SimEpisodeConfig, tok) -> tuple[list[_Live], list[list[int]]]:
    """The rollouts that take another policy turn with their rendered prompts; those whose prompt + max_tokens
    would pass the context limit are finished first, before sampling what would not fit."""
    live = [ep for ep in eps if not ep.done]
    prompts = [list(render_messages(tok, ep.view, enable_thinking=ep.task.env.thinking, add_generation_prompt=True,
                                    generation_role=ep.task.env.policy_role).ids) for ep in live]
    if cfg.max_context_tokens is not None:
        over = [ep for ep, p in zip(live, prompts) if len(p) + cfg.max_tokens > cfg.max_context_tokens]
        _finish_at(over, "context_limit", "finish at the context limit", cfg.env_workers)
        keep = [(ep, p) for ep, p in zip(live, prompts) if not ep.done]
        live, prompts = [e for e, _ in keep], [p for _, p in keep]
    return live, prompts


def _policy_turn(live: list[_Live], prompts: list[list[int]], policy: Generator, cfg: SimEpisodeConfig, tok,
                 turn: int) -> tuple[list[tuple], int]:
    """One generator call for every live rollout; records each turn's segment, thought and utterance. Returns
    (rollout, thought, utterance) per rollout and the number of tokens sampled."""
    samples = policy.generate(prompts, [Sampling(max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                                                 top_p=cfg.top_p, top_k=cfg.top_k,
                                                 seed=derive_seed(cfg.seed, ep.seed_key, turn)) for ep in live],
                              keys=[ep.out.rollout_id for ep in live] if cfg.dialogue_keys else None)
    steps = []
    for ep, prompt, s in zip(live, prompts, samples):
        body = s.tokens[:-1] if (s.tokens and s.finish_reason == "stop") else s.tokens
        text = tok.decode(body)
        thought, utterance = split_thought(text, thinking=ep.task.env.thinking)
        ep.out.thoughts.append(thought)
        ep.out.utterances.append(utterance)
        ep.out.segments.append(Trajectory(
            segments=[Segment("public", prompt), Segment("agent", s.tokens, s.logprobs, text=text,
                                                                       version=s.version)],
            group_id=ep.out.group_id, rollout_id=ep.out.rollout_id, task=ep.out.task,
            meta={"domain": ep.out.domain, "turn": turn, "finish_reason": s.finish_reason}))
        steps.append((ep, thought, utterance))
    return steps, sum(len(s.tokens) for s in samples)


def _env_turn(steps: list[tuple], cfg: SimEpisodeConfig, turn: int) -> None:
    """The env steps (concurrent): ends the rollouts that are done, appends the utterance and the env's messages
    to the others' views, and finishes those that reached their turn limit."""
    results = _pool_map(lambda ep, th, ut: _call(ep.task.env.step, th, ut), steps, cfg.env_workers)
    finishing = []
    for (ep, thought, utterance), result in zip(steps, results):
        t = _check_turn(ep, result, f"policy turn {turn}")
        if t is None:
            continue
        if t.done:
            _finish(ep, t, "done")
            continue
        own = {"role": ep.task.env.policy_role, "content": utterance or ""}
        if thought is not None and ep.task.env.thinking:
            own["reasoning"] = thought
        ep.view.append(own)
        ep.view.extend(dict(m) for m in t.messages)
        if len(ep.out.segments) >= ep.limit:
            finishing.append(ep)
    _finish_at(finishing, "turn_limit", "finish at the turn limit", cfg.env_workers)


def run_sim_episodes(policy, tasks: Sequence[SimEpisodeTask], config: SimEpisodeConfig | None = None, *,
                     tokenizer=None, progress: Callable[[TurnProgress], None] | None = None) -> list[SimRollout]:
    """Runs every task to its end; one SimRollout per task, in order.

    policy: a Generator (inference/protocol.py: `local.LocalChatModel` over the simulator's weights, or
    `episodes.agent.ScriptedAgent` in tests). With `SimEpisodeConfig.dialogue_keys` it gets the rollout ids as
    dialogue keys (the engine keeps each rollout's pages between turns) and releases them when the rollouts end.
    tokenizer: the policy's tokenizer (default `policy.tok`).
    progress: called after every round with a `episodes.progress.TurnProgress` (rounds so far, of at most the
    largest turn limit of the batch; rollouts still active; policy tokens sampled so far), and once more with 0
    active if the batch ends before a round (context limit); `episodes.progress.TurnReporter` prints it.

    A round is the module docstring's two steps, `_policy_turn` and `_env_turn`; `_start` and `_reset` begin
    the rollouts, `_prompts` (the context limit) and `_env_turn` (done, the turn limit) end them.
    """
    cfg = config or SimEpisodeConfig()
    tok = tokenizer if tokenizer is not None else policy.tok
    eps = _start(tasks, cfg)
    _reset(eps, cfg.env_workers)
    max_rounds = max((ep.limit for ep in eps), default=0)
    sampled, reported_active = 0, None

    def report(rounds: int):
        nonlocal reported_active
        if progress is not None:
            reported_active = sum(not ep.done for ep in eps)
            progress(TurnProgress(turn=rounds, max_turns=max_rounds, active=reported_active, total=len(eps),
                                  sampled_tokens=sampled))

    try:
        turn = 0
        while True:
            live, prompts = _prompts(eps, cfg, tok)
            if not live:
                if reported_active:  # the last report still counted rollouts that the context limit ended
                    report(turn)
                break
            with timeline.span("agent turn", dialogues=len(live)):  # the trained simulator's turn
                steps, n_sampled = _policy_turn(live, prompts, policy, cfg, tok, turn)
            sampled += n_sampled
            with timeline.span("partner reply", dialogues=len(steps)):  # the env answering the trained turn
                _env_turn(steps, cfg, turn)
            turn += 1
            report(turn)
    finally:  # free the engine state (pages, state slots) of every rollout, also when a step raised
        if cfg.dialogue_keys:
            policy.release([ep.out.rollout_id for ep in eps])
    for ep in eps:
        ep.out.transcript = list(ep.task.env.transcript())
    return [ep.out for ep in eps]


def fold_inputs(rollouts: Sequence[SimRollout]) -> tuple[list[Trajectory], list[float], list[int], list[int]]:
    """The valid rollouts' segments with their scores, group ids and rollout ids, ready for
    ``grpo.group_advantages(scores, group_ids, rollout_ids, fold=True)``; invalid rollouts are left out."""
    segs, scores, gids, rids = [], [], [], []
    for r in rollouts:
        if r.status != "ok":
            continue
        for s in r.segments:
            segs.append(s)
            scores.append(float(r.reward))
            gids.append(r.group_id)
            rids.append(r.rollout_id)
    return segs, scores, gids, rids
