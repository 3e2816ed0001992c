"""Per-round progress of episode batches: the runners' callback gets the exact round / active / token counts of
a scripted batch; TurnReporter writes one line per round on a terminal and at most one per interval otherwise."""

import io

import pytest

from mimesis_jax.data.chat import generation_prompt
from mimesis_jax.data.tokenizer import load_tokenizer
from env_helpers import SecretWordEnv
from mimesis_jax.envs import tool_call_text
from mimesis_jax.episodes.agent import EpisodeConfig, EpisodeTask, ScriptedAgent, run_episodes
from mimesis_jax.episodes.progress import TurnProgress, TurnReporter
from mimesis_jax.episodes.simulator import SimEpisodeConfig, SimEpisodeTask, run_sim_episodes
from test_sim_episode import EchoEnv


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def _task(max_steps=20):
    msgs = [{"role": "system", "content": "Find the secret word. Use the interact_with_env tool."},
            {"role": "user", "content": "Hi, I have a secret word for you."}]
    return EpisodeTask(env=SecretWordEnv("banana", hint="fruit", max_steps=max_steps), agent_messages=msgs)


def _rows(calls):
    return [(p.turn, p.max_turns, p.active, p.total, p.sampled_tokens) for p in calls]


def test_agent_episode_batch_reports_every_round(tok):
    reply = tool_call_text("search", "hint")
    n = len(tok.encode(reply)) + 1  # the scripted sample ends with <|im_end|>
    calls = []
    tasks = [_task(max_steps=1), _task(max_steps=2), _task(), _task()]  # truncated after 1, 2; turn limit 3
    trajs = run_episodes(ScriptedAgent(tok, [reply]), None, tasks, EpisodeConfig(max_turns=3), progress=calls.append)
    assert [t.num_agent_turns for t in trajs] == [1, 2, 3, 3]
    assert _rows(calls) == [(1, 3, 3, 4, 4 * n), (2, 3, 2, 4, 7 * n), (3, 3, 0, 4, 9 * n)]


def test_agent_batch_ended_by_the_context_limit_reports_zero_active(tok):
    reply = tool_call_text("action", "Are we done?")
    n = len(tok.encode(reply)) + 1
    [one] = run_episodes(ScriptedAgent(tok, [reply]), None, [_task()], EpisodeConfig(max_turns=1, agent_max_tokens=n))
    len1 = sum(len(s.tokens) for s in one.segments)  # the whole dialogue after one round
    header = len(generation_prompt(tok, "assistant"))
    calls = []
    # room for one round and all it appends, one token short of a second agent turn: the batch ends at the check
    # before round 2, with no sampler call
    cfg = EpisodeConfig(max_turns=5, agent_max_tokens=n, max_context_tokens=len1 + header + n - 1)
    [t] = run_episodes(ScriptedAgent(tok, [reply]), None, [_task()], cfg, progress=calls.append)
    assert t.meta["end_reason"] == "context_limit" and t.num_agent_turns == 1 and "dropped_tail_tokens" not in t.meta
    assert _rows(calls) == [(1, 5, 1, 1, n), (1, 5, 0, 1, n)]


def test_sim_episode_batch_reports_every_round(tok):
    text = "<think>\nhm\n</think>\n\nstill waiting"
    n = len(tok.encode(text)) + 1
    calls = []
    tasks = [SimEpisodeTask(EchoEnv(max_turns=3), rollout_id=1), SimEpisodeTask(EchoEnv(max_turns=9), rollout_id=2),
             SimEpisodeTask(EchoEnv(fail_at=2), rollout_id=3)]  # limits 3, 4 (config cap), 3; the third fails at 2
    a, b, c = run_sim_episodes(ScriptedAgent(tok, lambda p, i: text), tasks, SimEpisodeConfig(max_turns=4),
                               progress=calls.append)
    assert (len(a.segments), len(b.segments), len(c.segments), c.status) == (3, 4, 2, "invalid")
    assert _rows(calls) == [(1, 4, 3, 3, 3 * n), (2, 4, 2, 3, 6 * n), (3, 4, 1, 3, 8 * n), (4, 4, 0, 3, 9 * n)]


class _Clock:
    def __init__(self, times):
        self.times = list(times)

    def __call__(self):
        return self.times.pop(0)


def test_reporter_off_a_terminal_writes_at_most_one_line_per_interval():
    out = io.StringIO()  # not a terminal: the default interval is 30 s
    rep = TurnReporter("agentrl step 1 rollout", stream=out, clock=_Clock([100.0, 110.0, 131.0, 140.0, 162.0, 170.0]))
    assert rep.interval == 30.0
    for turn, active in ((1, 3), (2, 2), (3, 1), (4, 1), (5, 0)):
        rep(TurnProgress(turn=turn, max_turns=5, active=active, total=3, sampled_tokens=1234 * turn))
    assert out.getvalue().splitlines() == [
        "agentrl step 1 rollout: turn 2/5, 2/3 dialogues active, 2,468 tokens sampled, 31.0 s",
        "agentrl step 1 rollout: turn 4/5, 1/3 dialogues active, 4,936 tokens sampled, 62.0 s",
        "agentrl step 1 rollout: turn 5/5, 0/3 dialogues active, 6,170 tokens sampled, 70.0 s"]
    # a batch that ends within the first interval writes nothing
    quiet = io.StringIO()
    rep = TurnReporter("x", stream=quiet, clock=_Clock([0.0, 5.0, 9.0]))
    rep(TurnProgress(1, 2, 1, 1, 10))
    rep(TurnProgress(2, 2, 0, 1, 20))
    assert quiet.getvalue() == "" and rep.lines == []


def test_reporter_on_a_terminal_writes_every_round():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    rep = TurnReporter("rollout", stream=out, clock=_Clock([0.0, 0.5, 1.25]))
    rep(TurnProgress(1, 15, 16, 16, 4210))
    rep(TurnProgress(2, 15, 12, 16, 8000))
    assert rep.interval == 0.0
    assert out.getvalue().splitlines() == ["rollout: turn 1/15, 16/16 dialogues active, 4,210 tokens sampled, 0.5 s",
                                           "rollout: turn 2/15, 12/16 dialogues active, 8,000 tokens sampled, 1.2 s"]
