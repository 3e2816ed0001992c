"""The episode runner with a scripted environment and user: token-exact segments, tool calls, invalid actions,
thoughts kept out of the agent's context, refusals -> INVALID, turn limits, batching; and a real sampler agent."""

import jax
import numpy as np
import pytest

from mimesis_jax import envs, models
from mimesis_jax.data.chat import generation_prompt, render_messages, render_turn
from mimesis_jax.data.tokenizer import load_tokenizer
from env_helpers import SecretWordEnv
from mimesis_jax.envs import INTERACT_TOOL, parse_tool_call, tool_call_text
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.chat.base import ScriptedChatModel
from mimesis_jax.episodes.agent import EpisodeConfig, EpisodeTask, ScriptedAgent, run_episodes

MARKER = "Zebrafinch"  # appears only in the simulator's private thoughts
THOUGHT = f"The secret is banana but I will only hint. {MARKER} {MARKER}."
USER_REPLY = f"<think>\n{THOUGHT}\n</think>\n\nIt is a yellow fruit."


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def _task(secret="banana", opener="Hi, I have a secret word for you.", **kw):
    msgs = [{"role": "system", "content": "Find the secret word. Use the interact_with_env tool."}]
    if opener is not None:
        msgs.append({"role": "user", "content": opener})
    return EpisodeTask(env=SecretWordEnv(secret, hint="fruit", **kw), agent_messages=msgs,
                       user_messages=[{"role": "system", "content": f"You are a user. Your secret word is {secret}."}])


def _contains(seq, sub):
    n = len(sub)
    return any(seq[i:i + n] == sub for i in range(len(seq) - n + 1))


def test_full_episode_segments_rewards_and_no_thought_leak(tok):
    replies = [tool_call_text("action", "What is the secret?"), "<tool_call>\n{not json}\n</tool_call>",
               tool_call_text("search", "hint"), tool_call_text("answer", "apple"),
               "Let me answer.\n" + tool_call_text("answer", "Banana")]
    agent = ScriptedAgent(tok, replies)
    user = ScriptedChatModel([USER_REPLY])
    [traj] = run_episodes(agent, user, [_task()], EpisodeConfig(max_turns=8))
    assert traj.status == "ok" and traj.invalid_reason is None
    assert traj.turn_rewards == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert traj.meta["end_reason"] == "terminated" and traj.meta["turns"] == 5
    assert traj.user_thoughts == [THOUGHT, None, None, None, None]
    assert traj.user_utterances == ["It is a yellow fruit.", None, None, None, None]
    info = traj.env_info
    assert info[0]["to_user"] == "What is the secret?" and info[0]["choice"] == "action"
    assert info[1]["tool_error"].startswith("tool call is not valid JSON") and info[1]["choice"] is None
    assert info[1]["feedback"] == SecretWordEnv.invalid_action_feedback
    assert info[2]["feedback"] == "Hint: fruit" and info[4]["feedback"] == "Correct!"

    # segments: initial context, then per turn [header, agent, closing, tool turn (, user turn)]
    kinds = [s.kind for s in traj.segments]
    assert kinds[0] == "public" and kinds.count("agent") == 5
    header = generation_prompt(tok, "assistant")
    sys_and_opener = _task().agent_messages
    assert traj.segments[0].tokens == render_messages(tok, sys_and_opener, tools=[INTERACT_TOOL]).ids
    for t, a in enumerate(traj.agent_indices()):
        seg = traj.segments[a]
        assert traj.segments[a - 1].tokens == header
        assert seg.tokens == tok.encode(replies[t]) + [tok.im_end_id] and seg.logprobs is None
        # what the agent was prompted with at turn t is exactly the recorded context before its segment
        assert agent.prompts[t] == [x for s in traj.segments[:a] for x in s.tokens]
    tool0 = render_turn(tok, {"role": "tool", "content": "Your message was delivered to the user.\nReward: 0.0"}).ids
    user0 = render_turn(tok, {"role": "user", "content": "It is a yellow fruit."}).ids
    a0 = traj.agent_indices()[0]
    assert [s.tokens for s in traj.segments[a0 + 1:a0 + 4]] == [tok.encode("\n"), tool0, user0]

    # the thought never reaches the agent: not as text, not as token ids, no think block in the user turns
    thought_ids = tok.encode(THOUGHT)
    for p in agent.prompts:
        assert MARKER not in tok.decode(p) and not _contains(p, thought_ids)
    assert "It is a yellow fruit." in tok.decode(agent.prompts[1])
    assert tok.think_start_id not in user0 and MARKER not in tok.decode(traj.student_tokens())
    # ... while the simulator's own context keeps it (as ThoughtTrace SFT trained it), and sees the agent's message
    assert len(user.calls) == 1
    assert user.calls[0][-1] == {"role": "assistant", "content": "What is the secret?"}
    assert user.calls[0][-2] == {"role": "user", "content": sys_and_opener[-1]["content"]}


def test_simulator_thoughts_stay_in_its_own_context(tok):
    agent = ScriptedAgent(tok, [tool_call_text("action", "Any hint?")])
    user = ScriptedChatModel([USER_REPLY])
    run_episodes(agent, user, [_task()], EpisodeConfig(max_turns=2))
    assert len(user.calls) == 2
    own = user.calls[1][-2]
    assert own == {"role": "user", "content": "It is a yellow fruit.", "reasoning": THOUGHT}


def test_refusal_marks_episode_invalid(tok):
    agent = ScriptedAgent(tok, [tool_call_text("action", "What is the secret?")])
    user = ScriptedChatModel(["As an AI language model, I can't pretend to be a user."])
    [traj] = run_episodes(agent, user, [_task()], EpisodeConfig(max_turns=5))
    assert traj.status == "invalid" and "'as_an_ai'" in traj.invalid_reason
    assert "user turn after agent turn 0" in traj.invalid_reason
    assert traj.turn_rewards == [0.0] and traj.num_agent_turns == 1  # stopped; no reward of 0 invented later
    tool0 = render_turn(tok, {"role": "tool", "content": "Your message was delivered to the user.\nReward: 0.0"}).ids
    assert traj.segments[-1].tokens == tool0  # no user segment was added for the refusing turn
    assert "As an AI" not in tok.decode(traj.student_tokens())


def test_simulator_opener_unclosed_thought_and_user_errors(tok):
    def fail(messages):
        raise TimeoutError("endpoint down")

    agent = ScriptedAgent(tok, [tool_call_text("action", "Hello?")])
    # the simulator writes the opening turn when the agent's messages do not end with a user message
    opener = ScriptedChatModel(["<think>\nI start.\n</think>\n\nI need help finding a word."])
    [traj] = run_episodes(agent, opener, [_task(opener=None)], EpisodeConfig(max_turns=1))
    assert traj.meta["opening_utterance"] == "I need help finding a word."
    assert traj.meta["opening_thought"] == "I start."
    assert "I need help finding a word." in tok.decode(traj.segments[0].tokens)
    assert "I start." not in tok.decode(traj.student_tokens())
    assert opener.calls[0] == [_task().user_messages[0]]

    [bad] = run_episodes(agent, ScriptedChatModel(["thinking forever and never closing"]), [_task()],
                         EpisodeConfig(max_turns=3))
    assert bad.status == "invalid" and "no utterance" in bad.invalid_reason
    assert bad.user_thoughts == ["thinking forever and never closing"] and bad.user_utterances == [None]
    assert "thinking forever" not in tok.decode(bad.student_tokens())
    [err] = run_episodes(agent, ScriptedChatModel(fail), [_task()], EpisodeConfig(max_turns=3))
    assert err.status == "invalid" and "user model error: TimeoutError: endpoint down" in err.invalid_reason


def test_limits_batching_and_user_stop(tok):
    agent = ScriptedAgent(tok, lambda prompt, i: tool_call_text("search", "hint"))
    tasks = [_task(max_steps=2), _task(), _task(), _task()]
    tasks[3].rollout_id, tasks[3].group_id = 42, 7
    cfg = EpisodeConfig(max_turns=3)
    trajs = run_episodes(agent, None, tasks, cfg)
    assert [t.meta["end_reason"] for t in trajs] == ["truncated", "turn_limit", "turn_limit", "turn_limit"]
    assert [t.num_agent_turns for t in trajs] == [2, 3, 3, 3] and all(t.status == "ok" for t in trajs)
    assert agent.batch_sizes == [4, 4, 3]  # every live dialogue's agent turn in one call per round
    assert trajs[3].rollout_id == 42 and trajs[3].group_id == 7
    # default rollout ids never collide, within a call or across calls; a repeated explicit id is an error
    again = run_episodes(agent, None, [_task(), _task()], cfg)
    ids = [t.rollout_id for t in trajs[:3] + again]
    assert len(set(ids)) == 5 and 42 not in ids
    clash = [_task(), _task()]
    clash[0].rollout_id = clash[1].rollout_id = 9
    with pytest.raises(ValueError, match="task 1: rollout id 9 is already used by task 0"):
        run_episodes(agent, None, clash, cfg)
    # the user can end the episode (env.observe_user), and the context limit ends it cleanly
    agent = ScriptedAgent(tok, [tool_call_text("action", "Are we done?")])
    [t] = run_episodes(agent, ScriptedChatModel(["<think>\nbye\n</think>\n\nThanks! ###STOP###"]), [_task()], cfg)
    assert t.meta["end_reason"] == "user_ended" and t.env_info[-1]["user"] == {"user_stopped": True}
    n0 = len(render_messages(tok, _task().agent_messages, tools=[INTERACT_TOOL]).ids)
    [t] = run_episodes(agent, None, [_task()], EpisodeConfig(max_turns=5, agent_max_tokens=10,
                                                               max_context_tokens=n0 + 30))
    assert t.meta["end_reason"] == "context_limit" and t.status == "ok"


class ChattyEnv(SecretWordEnv):
    """Every step addresses the user, so a random agent still gets user turns."""

    def step(self, action_text):
        obs, r, term, trunc, info = super().step(action_text)
        return obs, r, term, trunc, {**info, "to_user": f"(the agent said something at step {self.steps})"}

    def invalid_action(self, reason):
        obs, r, term, trunc, info = super().invalid_action(reason)
        return obs, r, term, trunc, {**info, "to_user": f"(unclear message at step {self.steps})"}


def test_real_sampler_agent_logprobs_match_the_student_sequence(tok):
    """With a real JAX agent the recorded context is token-exact: scoring the student sequence with
    `token_logprobs` gives back the sampler's log-probs at every agent token."""
    from mimesis_jax.algorithms.logprobs import token_logprobs
    from mimesis_jax.chat.local import LocalChatModel
    config = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, initializer_range=0.3)
    params = models.init_params(config, jax.random.key(0))
    agent = LocalChatModel(config, params, tok)
    user = ScriptedChatModel([USER_REPLY])
    tasks = [_task(), _task(secret="cherry")]
    for t in tasks:
        t.env = ChattyEnv(t.env.secret, hint="fruit")
    trajs = run_episodes(agent, user, tasks, EpisodeConfig(max_turns=2, agent_max_tokens=8, seed=1))
    for traj in trajs:
        assert traj.num_agent_turns == 2 and traj.user_utterances[0] == "It is a yellow fruit."
        seq = traj.student_tokens()
        lp = np.asarray(token_logprobs(config, params, np.asarray([seq])))[0]
        pos = 0
        for seg in traj.segments:
            if seg.kind == "agent":
                assert len(seg.logprobs) == len(seg.tokens) > 0
                np.testing.assert_allclose(seg.logprobs, lp[pos - 1:pos - 1 + len(seg.tokens)], atol=1e-5)
            pos += len(seg.tokens)
        assert MARKER not in tok.decode(seq)
    tasks = [_task(), _task(secret="cherry")]
    for t in tasks:
        t.env = ChattyEnv(t.env.secret, hint="fruit")
    again = run_episodes(agent, ScriptedChatModel([USER_REPLY]), tasks,
                         EpisodeConfig(max_turns=2, agent_max_tokens=8, seed=1))
    for a, b in zip(again, trajs):  # same seed, same dialogues
        assert [s.tokens for s in a.segments] == [s.tokens for s in b.segments]


# ------------------------------------------------------------------------------- tool calls and envs
@pytest.mark.parametrize("reply,expected", [
    (tool_call_text("action", "hi"), ("action", "hi", None)),
    ('<tool_call>  {"name": "interact_with_env", "arguments": {"choice": "answer", "content": 42}}  </tool_call>',
     ("answer", "42", None)),
    ('<tool_call>\n{"name": "interact_with_env", "arguments": "{\\"choice\\": \\"search\\", \\"content\\": \\"q\\"}"}\n'
     '</tool_call>', ("search", "q", None)),
    ("<think>\n" + tool_call_text("answer", "x") + "\n</think>\n\n" + tool_call_text("action", "y"),
     ("action", "y", None)),
    ("no call at all", (None, None, "no <tool_call> found")),
    ("<think>\n" + tool_call_text("answer", "x"), (None, None, "no <tool_call> found")),
    (tool_call_text("action", "a") + tool_call_text("action", "b"), (None, None, "expected exactly one")),
    (tool_call_text("finish", "a"), (None, None, "choice must be one of")),
    ('<tool_call>\n{"name": "other_tool", "arguments": {}}\n</tool_call>', (None, None, "unknown tool 'other_tool'")),
    ('<tool_call>\n{"name": "interact_with_env", "arguments": {"choice": "action"}}\n</tool_call>',
     (None, None, "content must be a string")),
])
def test_parse_tool_call(reply, expected):
    call = parse_tool_call(reply)
    assert (call.choice, call.content) == expected[:2]
    assert (call.error is None) if expected[2] is None else call.error.startswith(expected[2])


def test_env_protocol_and_registry():
    env = envs.make("secret_word", secret="kiwi", hint="green", max_steps=3)
    obs, info = env.reset()
    assert "feedback" in obs and info == {"secret_len": 4}
    assert env.step("[search] hint")[0]["feedback"] == "Hint: green"
    assert env.step("hello")[4]["invalid_action"]
    obs, r, term, trunc, _ = env.step("[answer] KIWI")
    assert (r, term, trunc) == (1.0, True, False)
    assert envs.parse_action("[answer]  42 ") == ("answer", "42") and envs.parse_action("answer 42") is None
    assert envs.format_action("search", "q") == "[search] q"
    assert envs.tool_feedback("ok", 0.5) == "ok\nReward: 0.5"
    assert "secret_word" in envs.registered()
    with pytest.raises(envs.EnvError, match="unknown environment 'nope'"):
        envs.make("nope")
    with pytest.raises(envs.EnvError, match="environment 'secret_word': bad arguments"):
        envs.make("secret_word", secrett="x")
    with pytest.raises(envs.EnvError, match="choice must be one of"):
        envs.format_action("finish", "x")
    assert INTERACT_TOOL["function"]["parameters"]["properties"]["choice"]["enum"] == ["action", "answer", "search"]


def test_bad_tasks_are_named(tok):
    with pytest.raises(ValueError, match="task 1: agent_messages is empty"):
        run_episodes(ScriptedAgent(tok, ["x"]), None, [_task(), EpisodeTask(SecretWordEnv("a"), [])])
    with pytest.raises(ValueError, match="max_turns"):
        run_episodes(ScriptedAgent(tok, ["x"]), None, [_task()], EpisodeConfig(max_turns=0))

    class Broken(SecretWordEnv):
        def step(self, action_text):
            raise KeyError("boom")
    t = _task()
    t.env = Broken("a")
    with pytest.raises(RuntimeError, match=r"task 0 \(rollout \d+\), agent turn 0: the environment raised KeyError"):
        run_episodes(ScriptedAgent(tok, [tool_call_text("search", "hint")]), None, [t])


def test_context_limit_bounds_the_recorded_dialogue_exactly(tok):
    """max_context_tokens bounds what is RECORDED: the public segments after an agent turn (closing newline, tool
    result, user turn) are kept only while they fit (the rest is dropped and counted), and the env / simulator still
    see the turn, so its reward is unchanged. Lengths come from an unbounded run of the same dialogue."""
    reply = tool_call_text("action", "What is the secret?")
    A = len(tok.encode(reply)) + 1  # + <|im_end|>
    n0 = len(render_messages(tok, _task().agent_messages, tools=[INTERACT_TOOL]).ids)
    H = len(generation_prompt(tok, "assistant"))

    def run(limit, turns=2):
        cfg = EpisodeConfig(max_turns=turns, agent_max_tokens=A, max_context_tokens=limit)
        [t] = run_episodes(ScriptedAgent(tok, [reply]), ScriptedChatModel([USER_REPLY]), [_task()], cfg)
        return t

    free = run(None, turns=1)  # segments: prompt, header, agent, closing, tool turn, user turn
    assert [len(s.tokens) for s in free.segments[:3]] == [n0, H, A] and len(free.segments) == 6
    c, tool, user = (len(s.tokens) for s in free.segments[3:])
    full = n0 + H + A + c + tool + user
    assert len(free.student_tokens()) == full
    cases = {  # limit -> (recorded tokens, dropped tail tokens)
        full - 1: (full - user, user),  # the user turn does not fit
        n0 + H + A + c + tool: (full - user, user),
        n0 + H + A + c: (n0 + H + A + c, tool + user),
        n0 + H + A: (n0 + H + A, c + tool + user),  # the agent turn fits exactly, nothing after it
    }
    for limit, (kept, dropped) in cases.items():
        t = run(limit)
        assert len(t.student_tokens()) == kept <= limit, limit
        assert t.meta.get("dropped_tail_tokens", 0) == dropped, limit
        assert t.meta["end_reason"] == "context_limit" and t.status == "ok" and t.num_agent_turns == 1
        assert t.turn_rewards == free.turn_rewards and t.user_utterances == free.user_utterances
        assert t.student_tokens() == free.student_tokens()[:kept]
    # a prompt that leaves no room for the first agent turn: an ok dialogue with no turn (the RL loop skips it)
    t = run(n0 + H + A - 1)
    assert (t.status, t.meta["end_reason"], t.num_agent_turns, t.turn_rewards) == ("ok", "context_limit", 0, [])
    assert len(t.student_tokens()) == n0
    # with room for two whole turns nothing is dropped
    t = run(2 * full)
    assert t.num_agent_turns == 2 and "dropped_tail_tokens" not in t.meta
