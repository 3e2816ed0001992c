"""The multi-turn episode runner: agent <-> environment <-> frozen user simulator (Eq 2), many dialogues at once.

One round t for every live dialogue (docs/reference/paper.md Eq 2: y_t ~ pi_theta(.|c, H_t); x_{t+1} ~ u_phihat(.|c, H_t, y_t)):

1. **agent turn** -- all live dialogues' prompts (their token context + the assistant header) go through ONE
   sampler call; the agent's tokens and temperature-1 log-probs are recorded exactly as sampled (never decoded
   and re-tokenised);
2. **environment step** -- the reply's `interact_with_env` call (Qwen's `<tool_call>` format, envs/agent_env.py) is
   sent to the env as "[choice] content"; a malformed call gets the env's invalid-action answer (reward 0, the
   episode goes on); the tool result `feedback + "\\nReward: r"` is appended as Qwen's tool-response turn;
3. **user-simulator turn** -- when the env addressed the user (`info["to_user"]`, see envs/agent_env.py) and the
   episode goes on, all such dialogues' simulator views go through one `chat_many` call. The simulator sees the
   conversation with its true roles (system = persona/goal, its own turns as `user`, the agent's messages to it as
   `assistant`). Its output is split into the private thought (inside `<think>`...`</think>`, kept in
   `Trajectory.user_thoughts` for the coach, Eq 7) and the public utterance, the ONLY part that reaches the agent,
   rendered as a fresh user turn.

Episodes end when the env terminates/truncates, the user ends it (`env.observe_user`), the turn limit
(default 16), or the context limit (`EpisodeConfig.max_context_tokens`: the recorded tokens never pass it; a tool
result or user turn that does not fit is dropped from the record and ends the episode). A simulator that refuses its role (chat/refusal.py), fails, or never closes
its thought makes the episode INVALID with the reason -- never a reward of 0.

Recorded segments (data/trajectory.py): the agent's initial context (public); then per agent turn the
assistant header (its own public segment, where a CSD coach note is later inserted before it), the agent segment
(sampled tokens through `<|im_end|>`, with log-probs), and public segments for the turn's closing newline, the
tool response and the user's utterance turn. Per-episode extras go to `trajectory.meta`:
opening thought/utterance, reset feedback/info, end reason, number of turns.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
from typing import Any, Callable, Sequence

import numpy as np

from mimesis_jax.data.chat import generation_prompt, render_messages, render_turn
from mimesis_jax.data.trajectory import Segment, Trajectory
from mimesis_jax.envs.agent_env import (INTERACT_TOOL, Env, InvalidEpisode, ToolCall, format_action, parse_tool_call,
                                        tool_feedback, visible_reply)
from mimesis_jax.episodes.progress import TurnProgress
from mimesis_jax.chat.base import Message
from mimesis_jax.chat.base import chat_many
from mimesis_jax.chat.thoughts import response_thought
from mimesis_jax.inference.protocol import Generator, Sampling, derive_seed
from mimesis_jax.chat.refusal import RefusalDetector
from mimesis_jax.inference.protocol import Sample
from mimesis_jax import timeline


@dataclasses.dataclass
class EpisodeTask:
    """One dialogue to run: a fresh env, the agent's starting messages, the simulator's starting messages."""

    env: Env
    agent_messages: list[Message]  # system prompt (env description) and, optionally, the user's opening message
    user_messages: list[Message] | None = None  # the simulator's view: system = persona / goal. None = no simulator
    group_id: int = 0
    rollout_id: int | None = None  # default: the next id of a process-wide counter (never reused)
    task: dict[str, Any] = dataclasses.field(default_factory=dict)
    reset_seed: int | None = None


@dataclasses.dataclass
class EpisodeConfig:
    max_turns: int = 16  # agent turns per episode (paper Table 13)
    agent_max_tokens: int = 1024
    agent_temperature: float = 1.0
    agent_top_p: float = 1.0
    agent_top_k: int = 0
    agent_thinking: bool = False  # render the agent's turns with the thinking template
    user_max_tokens: int = 512
    user_temperature: float | None = None  # None: the user model's own default
    user_thinking: bool = True  # the simulator writes "<think>thought</think> utterance"
    # The recorded dialogue never passes this: an episode ends (status ok, "context_limit") before an agent turn
    # whose prompt + agent_max_tokens would pass it, and the public segments that follow an agent turn (tool
    # result, user turn) are recorded only while they fit (the rest is dropped, meta["dropped_tail_tokens"]).
    # An episode whose first prompt leaves no room has no agent turn (meta["turns"] == 0; the RL loops skip it).
    max_context_tokens: int | None = None
    seed: int = 0
    tools: tuple = (INTERACT_TOOL,)
    refusal_rules: dict[str, str] | None = None  # None: refusal.DEFAULT_RULES
    check_thought_for_refusal: bool = True
    env_workers: int = 16  # threads stepping envs at once (envs whose step calls a user/judge model overlap)
    dialogue_keys: bool = True  # an agent / simulator with persistent dialogue state (inference/engine.py, it has
    # `release`) gets the rollout ids as keys: each turn then prefills only what was appended since its last one


class ScriptedAgent(Generator):
    """Token-level agent for tests: replies from a list (cycled) or fn(prompt_text, turn_index) -> text.

    The reply text is encoded and `<|im_end|>` appended, as a real agent's sample would end; log-probs are None.
    It has no weights: `set_params` only records the version.
    """

    def __init__(self, tokenizer, replies):
        self.tok, self._replies, self._i = tokenizer, replies, 0
        self.prompts: list[list[int]] = []
        self.batch_sizes: list[int] = []

    def set_params(self, params, version: int) -> None:
        self.version = version

    def generate(self, prompts, sampling, *, keys=None, cancel=None) -> list[Sample]:
        self.batch_sizes.append(len(prompts))
        out = []
        for p in prompts:
            self.prompts.append(list(p))
            text = (self._replies(self.tok.decode(p), self._i) if callable(self._replies)
                    else self._replies[self._i % len(self._replies)])
            self._i += 1
            toks = list(self.tok.encode(text)) + [int(self.tok.im_end_id)]
            out.append(Sample(toks, None, "stop", len(p), self.version))
        return out


@dataclasses.dataclass(eq=False)
class _Live:
    index: int
    task: EpisodeTask
    traj: Trajectory
    context: list[int]
    user_view: list[Message] | None
    done: bool = False
    turns: int = 0
    pending_user: bool = False
    seed_key: int = 0  # the explicit rollout id, else the task's index: identical calls sample identically
    released: bool = False  # its engine state (if any) was freed
    cut: bool = False  # a trailing public segment did not fit max_context_tokens: nothing more is recorded


ROLLOUT_IDS = itertools.count(1 << 40)  # default ids of both runners: far above the ids training drivers assign from 0


def _add(ep: _Live, kind: str, tokens, logprobs=None, text=None, version=None):
    seg = Segment(kind, list(tokens), None if logprobs is None else list(logprobs), text, version)
    ep.traj.segments.append(seg)
    ep.context.extend(seg.tokens)


def _add_tail(ep: _Live, tokens, limit: int | None):
    """Appends a public segment that FOLLOWS an agent turn (closing newline, tool result, user turn) if it fits
    `limit`; else records nothing from here on (the segment and every later one are dropped, counted in
    meta["dropped_tail_tokens"]) and the dialogue ends "context_limit" after this round. Those tokens carry no
    loss and no later agent turn would read them, so the recorded dialogue never outgrows its row, while the env
    and the simulator still see the turn (its rewards are unchanged)."""
    if ep.cut or (limit is not None and len(ep.context) + len(tokens) > limit):
        ep.cut = True
        ep.traj.meta["dropped_tail_tokens"] = ep.traj.meta.get("dropped_tail_tokens", 0) + len(tokens)
        return
    _add(ep, "public", tokens)


def _end(ep: _Live, reason: str, invalid: str | None = None):
    ep.done = True
    ep.traj.meta["end_reason"] = reason
    if invalid is not None:
        ep.traj.status, ep.traj.invalid_reason = "invalid", invalid


def _user_turns(eps: list[_Live], user, cfg: EpisodeConfig, refusal: RefusalDetector, *, opening: bool):
    """One batched simulator call for `eps`; returns the episodes whose utterance was accepted, with it."""
    kwargs: dict[str, Any] = {"max_tokens": cfg.user_max_tokens}
    if cfg.dialogue_keys:
        kwargs["keys"] = [("user", ep.traj.rollout_id) for ep in eps]
    if cfg.user_temperature is not None:
        kwargs["temperature"] = cfg.user_temperature
    with timeline.span("user wait", dialogues=len(eps), opening=opening):  # the simulator's replies
        responses = chat_many(user, [ep.user_view for ep in eps], **kwargs)
    accepted = []
    for ep, r in zip(eps, responses):
        where = "opening user turn" if opening else f"user turn after agent turn {ep.turns - 1}"
        if r.finish_reason == "error":
            _end(ep, "invalid", f"{where}: user model error: {r.meta.get('error', 'unknown')}")
            thought, utterance = None, None
        else:
            thought, utterance = response_thought(r, thinking=cfg.user_thinking)
            reason = refusal.check(utterance, thought)
            if reason is None and not utterance:
                reason = ("user turn has no utterance (the thought was never closed with </think> or the turn is "
                          f"empty; finish_reason={r.finish_reason})")
            if reason is not None:
                _end(ep, "invalid", f"{where}: {reason}")
        if opening:
            ep.traj.meta.update(opening_thought=thought, opening_utterance=utterance)
        else:
            ep.traj.user_thoughts.append(thought)
            ep.traj.user_utterances.append(utterance)
        if not ep.done:  # the simulator's own context keeps its thoughts (as ThoughtTrace SFT trained it)
            own = {"role": "user", "content": utterance}
            if thought is not None and cfg.user_thinking:
                own["reasoning"] = thought
            ep.user_view.append(own)
            accepted.append((ep, utterance))
    return accepted


def _env_step(ep: _Live, call):
    try:
        if call.choice == "text":
            return ep.task.env.step(call.content)
        if call.ok:
            return ep.task.env.step(format_action(call.choice, call.content))
        return ep.task.env.invalid_action(call.error)
    except Exception as e:  # reported by the caller, in order
        return e


def _env_steps(live: list[_Live], calls: list, workers: int) -> list:
    """Each live dialogue's env step; in a thread pool when `workers` > 1 (env steps that wait on remote models
    overlap; a local model shared by several envs serialises its own calls)."""
    if workers <= 1 or len(live) <= 1:
        return [_env_step(ep, c) for ep, c in zip(live, calls)]
    with concurrent.futures.ThreadPoolExecutor(min(workers, len(live))) as pool:
        return list(pool.map(_env_step, live, calls))


@dataclasses.dataclass(frozen=True)
class _Turns:
    """What every turn step of one `run_episodes` call shares: the settings, the tokenizer and its fixed pieces."""

    cfg: EpisodeConfig
    tok: Any
    refusal: RefusalDetector
    tools: list | None
    header: list[int]  # the assistant header every agent turn starts with
    newline: list[int]
    im_end: int

    @classmethod
    def of(cls, cfg: EpisodeConfig, tok) -> "_Turns":
        return cls(cfg, tok, RefusalDetector(cfg.refusal_rules, check_thought=cfg.check_thought_for_refusal),
                   list(cfg.tools) if cfg.tools else None,
                   list(generation_prompt(tok, "assistant", enable_thinking=cfg.agent_thinking)),
                   list(tok.encode("\n")), int(tok.im_end_id))


def _start(tasks: Sequence[EpisodeTask], user) -> list[_Live]:
    """Checks the tasks' rollout ids, resets every env and opens one live dialogue per task (nothing recorded)."""
    eps: list[_Live] = []
    seen_ids: dict[int, int] = {}
    for i, task in enumerate(tasks):
        if not task.agent_messages:
            raise ValueError(f"task {i}: agent_messages is empty (it needs at least the system prompt)")
        rid = next(ROLLOUT_IDS) if task.rollout_id is None else task.rollout_id
        if rid in seen_ids:
            raise ValueError(f"task {i}: rollout id {rid} is already used by task {seen_ids[rid]} of this call")
        seen_ids[rid] = i
        obs, info = task.env.reset(seed=task.reset_seed)
        meta = {"reset_feedback": (obs or {}).get("feedback"), "reset_info": info}
        traj = Trajectory(segments=[], group_id=task.group_id, rollout_id=rid, task=dict(task.task), meta=meta)
        view = None if (user is None or task.user_messages is None) else [dict(m) for m in task.user_messages]
        eps.append(_Live(i, task, traj, [], view, seed_key=i if task.rollout_id is None else int(rid)))
    return eps


def _open(eps: list[_Live], user, t: _Turns) -> None:
    """The opening user turn (given in the agent's messages, or written by the simulator) and each dialogue's
    first recorded segment: the agent's rendered starting messages."""
    openers = [ep for ep in eps if ep.task.agent_messages[-1].get("role") != "user" and ep.user_view is not None]
    given = {id(ep) for ep in eps if ep.task.agent_messages[-1].get("role") == "user"}
    opened = {id(ep): u for ep, u in _user_turns(openers, user, t.cfg, t.refusal, opening=True)} if openers else {}
    for ep in eps:
        msgs = [dict(m) for m in ep.task.agent_messages]
        if id(ep) in opened:
            msgs.append({"role": "user", "content": opened[id(ep)]})
        elif id(ep) in given and ep.user_view is not None:
            ep.user_view.append({"role": "user", "content": msgs[-1]["content"]})
        rendered = render_messages(t.tok, msgs, enable_thinking=t.cfg.agent_thinking, add_generation_prompt=False,
                                   tools=t.tools if ep.task.env.tool_mode else None)
        _add(ep, "public", rendered.ids)


def _live(eps: list[_Live], t: _Turns) -> list[_Live]:
    """The dialogues that take another agent turn: not ended, and (with a context limit) room for a full reply."""
    live = [ep for ep in eps if not ep.done]
    if t.cfg.max_context_tokens is not None:
        for ep in live:
            if len(ep.context) + len(t.header) + t.cfg.agent_max_tokens > t.cfg.max_context_tokens:
                _end(ep, "context_limit")
        live = [ep for ep in live if not ep.done]
    return live


def _agent_turn(live: list[_Live], agent, t: _Turns) -> tuple[list[ToolCall], int]:
    """One sampler call for every live dialogue; records header, reply and closing newline. Returns each
    dialogue's env call and the number of tokens sampled."""
    cfg = t.cfg
    samples = agent.generate(
        [ep.context + t.header for ep in live],
        [Sampling(max_tokens=cfg.agent_max_tokens, temperature=cfg.agent_temperature, top_p=cfg.agent_top_p,
                  top_k=cfg.agent_top_k, seed=derive_seed(cfg.seed, ep.seed_key, ep.turns)) for ep in live],
        keys=[("agent", ep.traj.rollout_id) for ep in live] if cfg.dialogue_keys else None)
    calls = []
    for ep, s in zip(live, samples):
        _add(ep, "public", t.header)
        ended_cleanly = bool(s.tokens) and s.tokens[-1] == t.im_end
        body = s.tokens[:-1] if (s.tokens and s.finish_reason == "stop") else s.tokens
        reply = t.tok.decode(body)
        _add(ep, "agent", s.tokens, s.logprobs, text=reply, version=s.version)
        _add_tail(ep, t.newline if ended_cleanly else [t.im_end] + t.newline, cfg.max_context_tokens)
        ep.turns += 1
        if ep.task.env.tool_mode:
            calls.append(parse_tool_call(reply))
        else:  # a free-text env reads the visible reply itself
            calls.append(ToolCall(choice="text", content=visible_reply(reply)))
    return calls, sum(len(s.tokens) for s in samples)


def _env_turn(live: list[_Live], calls: list[ToolCall], t: _Turns) -> list[_Live]:
    """Every live dialogue's env step (concurrent, since an env may call its own user / judge models, as the
    UserRL gyms do); records rewards, info and the tool result. Returns the dialogues whose user speaks next."""
    results = _env_steps(live, calls, t.cfg.env_workers)
    pending = []
    for ep, call, result in zip(live, calls, results):
        if isinstance(result, InvalidEpisode):  # the env's user/judge refused, failed or never parsed
            ep.traj.turn_rewards.append(0.0)
            ep.traj.env_info.append({"choice": call.choice, "content": call.content, "tool_error": call.error,
                                     "invalid": str(result)})
            ep.traj.user_thoughts.append(None)
            ep.traj.user_utterances.append(None)
            _end(ep, "invalid", f"agent turn {ep.turns - 1}: {result}")
            continue
        if isinstance(result, Exception):
            raise RuntimeError(f"task {ep.index} (rollout {ep.traj.rollout_id}), agent turn {ep.turns - 1}: "
                               f"the environment raised {type(result).__name__}: {result}") from result
        obs, reward, terminated, truncated, info = result
        feedback = str((obs or {}).get("feedback", ""))
        info = dict(info or {})
        to_user = info.pop("to_user", call.content if call.ok and call.choice in ("action", "text") else None)
        ep.traj.env_info.append({**info, "feedback": feedback, "reward": float(reward),
                                 "terminated": bool(terminated), "truncated": bool(truncated),
                                 "choice": call.choice, "content": call.content, "tool_error": call.error,
                                 "to_user": to_user})
        ep.traj.turn_rewards.append(float(reward))
        tool_msg = {"role": "tool", "content": tool_feedback(feedback, reward)}
        _add_tail(ep, render_turn(t.tok, tool_msg).ids, t.cfg.max_context_tokens)
        if terminated or truncated:
            _end(ep, "terminated" if terminated else "truncated")
        elif to_user is not None and ep.user_view is not None:
            ep.user_view.append({"role": "assistant", "content": to_user})
            pending.append(ep)
        if ep not in pending:  # an env that talks to its user itself reports the turn in info
            ep.traj.user_thoughts.append(info.get("user_thought"))
            ep.traj.user_utterances.append(info.get("user_utterance"))
    return pending


def _user_turn(pending: list[_Live], user, t: _Turns) -> None:
    """One batched simulator call for the dialogues whose env addressed the user; the agent sees the utterance
    only, as a plain user turn (no think block of any kind), and the env observes it."""
    for ep, utterance in (_user_turns(pending, user, t.cfg, t.refusal, opening=False) if pending else []):
        _add_tail(ep, render_turn(t.tok, {"role": "user", "content": utterance}, enable_thinking=False).ids,
                  t.cfg.max_context_tokens)
        extra, stop, uinfo = ep.task.env.observe_user(utterance)
        ep.traj.turn_rewards[-1] += float(extra)
        if uinfo:
            ep.traj.env_info[-1]["user"] = dict(uinfo)
        if stop:
            _end(ep, "user_ended")


def _close_round(live: list[_Live], cfg: EpisodeConfig) -> None:
    for ep in live:
        if not ep.done and ep.cut:  # what followed this turn passed the limit: no room for another
            _end(ep, "context_limit")
        if not ep.done and ep.turns >= cfg.max_turns:
            _end(ep, "turn_limit")


def run_episodes(agent, user, tasks: Sequence[EpisodeTask], config: EpisodeConfig | None = None, *,
                 tokenizer=None, progress: Callable[[TurnProgress], None] | None = None) -> list[Trajectory]:
    """Runs every task to its end and returns one Trajectory per task, in order.

    agent: a Generator (inference/protocol.py: `local.LocalChatModel`, a remote `/completions` agent, or
    `ScriptedAgent` in tests). user: any ChatModel, or None. With `EpisodeConfig.dialogue_keys` both get keys
    ("agent" | "user", rollout id), so one with per-dialogue state (the engine) prefills only a turn's new tokens,
    and every key is released when its episode ends. Remote endpoints are called as before.
    tokenizer: the agent's tokenizer (default `agent.tok`); all public segments are rendered with data/chat.py.
    progress: called after every round with a `episodes.progress.TurnProgress` (rounds so far, dialogues still
    active, agent tokens sampled so far), and once more with 0 active if the batch ends before a round (context
    limit); `episodes.progress.TurnReporter` prints it.

    A round is the module docstring's three steps: `_agent_turn`, `_env_turn`, `_user_turn`; `_start` and
    `_open` begin the dialogues, `_live` and `_close_round` end them.
    """
    cfg = config or EpisodeConfig()
    if cfg.max_turns < 1:
        raise ValueError(f"EpisodeConfig.max_turns must be >= 1, got {cfg.max_turns}")
    t = _Turns.of(cfg, tokenizer if tokenizer is not None else agent.tok)
    eps = _start(tasks, user)
    _open(eps, user, t)
    rounds, sampled, reported_active = 0, 0, None

    def report():
        nonlocal reported_active
        if progress is not None:
            reported_active = sum(not ep.done for ep in eps)
            progress(TurnProgress(turn=rounds, max_turns=cfg.max_turns, active=reported_active, total=len(eps),
                                  sampled_tokens=sampled))

    try:
        while True:
            _release([ep for ep in eps if ep.done], agent, user, cfg)  # free ended dialogues' pages early
            live = _live(eps, t)
            if not live:
                if reported_active:  # the last report still counted dialogues that the context limit ended
                    report()
                break
            with timeline.span("agent turn", dialogues=len(live)):  # one batched generation
                calls, n_sampled = _agent_turn(live, agent, t)
            rounds += 1
            sampled += n_sampled
            with timeline.span("env step", dialogues=len(live)):
                pending = _env_turn(live, calls, t)
            _user_turn(pending, user, t)
            _close_round(live, cfg)
            report()
    finally:  # an env that raised leaves no dialogue state behind either
        _release(eps, agent, user, cfg)
    for ep in eps:
        ep.traj.meta["turns"] = ep.turns
        ep.traj.validate()
    return [ep.traj for ep in eps]


def _release(eps: list[_Live], agent, user, cfg: EpisodeConfig) -> None:
    """Frees the engine state of every finished dialogue (pages, state slots) on the agent and the simulator."""
    eps = [ep for ep in eps if not ep.released]
    if not cfg.dialogue_keys or not eps:
        return
    agent.release([("agent", ep.traj.rollout_id) for ep in eps])
    if user is not None:
        user.release([("user", ep.traj.rollout_id) for ep in eps])
    for ep in eps:
        ep.released = True
