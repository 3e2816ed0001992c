"""The role-flipped runner: the simulator is the sampled policy; per-turn segments with exact prompts and sampled
tokens; thoughts kept from the other side; limits, invalid episodes; segments feed FoldGRPO once per rollout."""

import jax
import numpy as np
import pytest

from mimesis_jax import models
from mimesis_jax.algorithms import grpo
from mimesis_jax.data.chat import render_messages
from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.envs.agent_env import InvalidEpisode
from mimesis_jax.envs.sim_env import SimEnv, SimTurn
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.episodes.agent import ScriptedAgent
from mimesis_jax.episodes.simulator import SimEpisodeConfig, SimEpisodeTask, fold_inputs, run_sim_episodes


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


class EchoEnv(SimEnv):
    """Customer-side env: the 'agent' echoes the customer's utterance; reward = turns used / 4 at the end."""

    domain = "echo"
    policy_role = "user"
    thinking = True
    multi_turn = True

    def __init__(self, max_turns=3, fail_at=None, end_word="bye"):
        self.max_policy_turns, self.fail_at, self.end_word = max_turns, fail_at, end_word
        self.seen: list = []

    def reset(self, seed=None):
        self.seen = []
        return [{"role": "system", "content": "You are a customer."}, {"role": "assistant", "content": "Hello!"}]

    def step(self, thought, utterance):
        self.seen.append((thought, utterance))
        if self.fail_at is not None and len(self.seen) == self.fail_at:
            raise InvalidEpisode("support agent endpoint down")
        if utterance and self.end_word in utterance:
            return SimTurn(done=True, reward=len(self.seen) / 4, info={"end": "customer"})
        return SimTurn(done=False, messages=[{"role": "assistant", "content": f"You said: {utterance}"}])

    def finish(self, reason):
        return SimTurn(done=True, reward=len(self.seen) / 4, info={"end": reason})


def test_segments_roles_thoughts_and_rewards(tok):
    replies = ["<think>\nsecret plan\n</think>\n\nmy order is late", "<think>\nstill secret\n</think>\n\nok bye"]
    policy = ScriptedAgent(tok, replies)
    env = EchoEnv()
    [r] = run_sim_episodes(policy, [SimEpisodeTask(env, group_id=5, rollout_id=77)])
    assert r.status == "ok" and r.end == "done" and r.reward == 0.5 and r.info == {"end": "customer"}
    assert env.seen == [("secret plan", "my order is late"), ("still secret", "ok bye")]
    assert len(r.segments) == 2
    # each segment's prompt is exactly the rendered view at that turn, with the user generation header
    view = env.reset()
    expect0 = render_messages(tok, view, enable_thinking=True, add_generation_prompt=True, generation_role="user").ids
    view += [{"role": "user", "content": "my order is late", "reasoning": "secret plan"},
             {"role": "assistant", "content": "You said: my order is late"}]
    expect1 = render_messages(tok, view, enable_thinking=True, add_generation_prompt=True, generation_role="user").ids
    assert r.segments[0].segments[0].tokens == list(expect0)
    assert r.segments[1].segments[0].tokens == list(expect1)
    assert policy.prompts == [list(expect0), list(expect1)]
    for seg, text in zip(r.segments, replies):
        assert [s.kind for s in seg.segments] == ["public", "agent"]
        assert seg.segments[1].tokens == list(tok.encode(text)) + [tok.im_end_id]
        assert (seg.rollout_id, seg.group_id, seg.turn_rewards) == (77, 5, [0.5])
    # the other side never saw the thought: the env's agent replies quote the utterance only
    assert "secret" not in tok.decode(r.segments[1].segments[0].tokens).split("You said:")[1]


def test_turn_limit_context_limit_invalid_and_no_utterance(tok):
    policy = ScriptedAgent(tok, lambda prompt, i: "<think>\nhm\n</think>\n\nstill waiting")
    tasks = [SimEpisodeTask(EchoEnv(max_turns=3), rollout_id=1), SimEpisodeTask(EchoEnv(max_turns=9), rollout_id=2),
             SimEpisodeTask(EchoEnv(fail_at=2), rollout_id=3)]
    a, b, c = run_sim_episodes(policy, tasks, SimEpisodeConfig(max_turns=4))
    assert (a.end, a.reward, len(a.segments)) == ("turn_limit", 0.75, 3)
    assert (b.end, b.reward, len(b.segments)) == ("turn_limit", 1.0, 4)  # config cap 4 < env's 9
    assert c.status == "invalid" and c.reward is None and "support agent endpoint down" in c.invalid_reason
    assert all(s.status == "invalid" for s in c.segments) and len(c.segments) == 2
    # context limit: finish before a prompt that would not fit
    first = len(render_messages(tok, EchoEnv().reset(), enable_thinking=True, add_generation_prompt=True,
                                generation_role="user").ids)
    [d] = run_sim_episodes(policy, [SimEpisodeTask(EchoEnv(max_turns=9))],
                           SimEpisodeConfig(max_tokens=8, max_context_tokens=first + 8 + 5))
    assert (d.end, len(d.segments), d.reward) == ("context_limit", 1, 0.25)
    # a thinking turn that never closes its thought has no utterance; the env gets None
    env = EchoEnv(max_turns=1)
    [e] = run_sim_episodes(ScriptedAgent(tok, ["<think>\nnever closed"]), [SimEpisodeTask(env)])
    assert env.seen == [("never closed", None)] and e.utterances == [None] and e.end == "turn_limit"


def test_fold_inputs_count_each_rollout_once(tok):
    """Two groups; rollouts with 1-3 segments: FoldGRPO statistics use one score per rollout (docs/reference/paper.md 3.3)."""
    ends = {1: 1, 2: 2, 3: 3, 4: 1, 5: 3}  # rollout id -> the policy turn at which it says "bye"

    def policy_reply(prompt, i):
        rid = int(prompt.split("ROLLOUT ")[1].split(".")[0])
        return "<think>\nx\n</think>\n\n" + ("bye" if prompt.count("You said") + 1 >= ends[rid] else "more")

    class Tagged(EchoEnv):
        def __init__(self, rid):
            super().__init__(max_turns=5)
            self.rid = rid

        def reset(self, seed=None):
            super().reset()
            return [{"role": "system", "content": f"ROLLOUT {self.rid}."}, {"role": "assistant", "content": "Hi"}]
    tasks = [SimEpisodeTask(Tagged(rid), group_id=0 if rid <= 3 else 1, rollout_id=rid) for rid in ends]
    rollouts = run_sim_episodes(ScriptedAgent(tok, policy_reply), tasks)
    assert [len(r.segments) for r in rollouts] == [1, 2, 3, 1, 3]
    rewards = [r.reward for r in rollouts]
    assert rewards == [0.25, 0.5, 0.75, 0.25, 0.75]
    segs, scores, gids, rids = fold_inputs(rollouts)
    adv = grpo.group_advantages(scores, gids, rids, fold=True)
    # reference: per group, mean and unbiased std over the rollouts (each once)
    g0, g1 = np.array([0.25, 0.5, 0.75]), np.array([0.25, 0.75])
    ref = {rid: (rw - g.mean()) / (g.std(ddof=1) + 1e-6)
           for g, ids in ((g0, (1, 2, 3)), (g1, (4, 5))) for rid, rw in zip(ids, g)}
    np.testing.assert_allclose(adv, [ref[r] for r in rids], rtol=1e-9)
    assert len(segs) == 10 and rids == [1, 2, 2, 3, 3, 3, 4, 5, 5, 5]
    with pytest.raises(ValueError, match="appears 2 times"):  # without folding the duplicates are refused
        grpo.group_advantages(scores, gids, rids)


def test_real_sampler_policy_logprobs_match_the_segment(tok):
    """With the tiny JAX model as the policy each segment is token-exact: scoring prompt + sampled tokens gives
    back the sampler's log-probs."""
    from mimesis_jax.algorithms.logprobs import token_logprobs
    from mimesis_jax.chat.local import LocalChatModel
    config = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, initializer_range=0.3)
    params = models.init_params(config, jax.random.key(0))
    policy = LocalChatModel(config, params, tok)
    tasks = [SimEpisodeTask(EchoEnv(max_turns=2), rollout_id=i) for i in (10, 11)]
    out = run_sim_episodes(policy, tasks, SimEpisodeConfig(max_tokens=6, seed=3))
    for r in out:
        assert len(r.segments) == 2
        for seg in r.segments:
            prompt, sample = seg.segments
            seq = prompt.tokens + sample.tokens
            lp = np.asarray(token_logprobs(config, params, np.asarray([seq])))[0]
            np.testing.assert_allclose(sample.logprobs, lp[len(prompt.tokens) - 1:len(seq) - 1], atol=1e-5)
    again = run_sim_episodes(policy, [SimEpisodeTask(EchoEnv(max_turns=2), rollout_id=i) for i in (10, 11)],
                             SimEpisodeConfig(max_tokens=6, seed=3))
    assert [[s.segments[1].tokens for s in r.segments] for r in again] == \
        [[s.segments[1].tokens for s in r.segments] for r in out]


def test_bad_tasks_are_named(tok):
    class Bad(EchoEnv):
        policy_role = "judge"
    with pytest.raises(ValueError, match="policy_role must be one of"):
        run_sim_episodes(ScriptedAgent(tok, ["x"]), [SimEpisodeTask(Bad())])
    with pytest.raises(ValueError, match="rollout id 4 is already used by task 0"):
        run_sim_episodes(ScriptedAgent(tok, ["x"]), [SimEpisodeTask(EchoEnv(), rollout_id=4),
                                                     SimEpisodeTask(EchoEnv(), rollout_id=4)])

    class Broken(EchoEnv):
        def step(self, thought, utterance):
            raise KeyError("oops")
    with pytest.raises(RuntimeError, match=r"task 0 \(domain echo.*policy turn 0.*KeyError"):
        run_sim_episodes(ScriptedAgent(tok, ["x"]), [SimEpisodeTask(Broken())])
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        SimEpisodeConfig(max_turns=0)
    with pytest.raises(ValueError, match=r"reward must be in \[0, 1\]"):
        SimTurn(done=True, reward=1.5)
