"""benchmarks/bench_async_latency.py's pieces, without its RL runs: the loopback delay user answers a real `openai`
client request (through OpenAIChatModel, as the RL run's user side sends it) no sooner than its delay, with a turn
the episode runner accepts from a thinking simulator (a closed thought, then the utterance); other paths get 404;
and an arm's overrides point the configured user side at the endpoint with no key. The speedup itself is a
figure in docs/benchmarks.md, never asserted (timed asserts fail on a busy machine)."""

import os
import time

import pytest

from helpers import ROOT, load_benchmark

from mimesis_jax.chat.remote import EndpointError, OpenAIChatModel
from mimesis_jax.chat.thoughts import split_thought
from mimesis_jax.train.rl import agent
from mimesis_jax.train.rl.chat_models import build_user_side

DELAY = 0.3


def _bench():
    return load_benchmark('bench_async_latency')


B = _bench()


@pytest.fixture
def user():
    with B.DelayUser(DELAY) as u:
        yield u


def test_delay_user_answers_the_openai_client_after_its_delay(user):
    model = OpenAIChatModel(user.url, B.USER_MODEL, api_key_env=None, max_retries=0)
    t0 = time.perf_counter()
    out = model.chat([{"role": "system", "content": "You are a user."}, {"role": "user", "content": "Hi"}],
                     max_tokens=16, enable_thinking=True)
    assert time.perf_counter() - t0 >= DELAY  # a lower bound: sleep guarantees it
    assert out.text == B.USER_REPLY and out.finish_reason == "stop" and out.meta["model"] == B.USER_MODEL
    assert split_thought(out.text, thinking=True) == ("The reply is on topic; I want more.", "Hmm. Tell me more.")
    assert user.requests == 1 == user.peak_in_flight and user.in_flight == 0


def test_delay_user_refuses_other_paths(user):
    model = OpenAIChatModel(user.url.removesuffix("/v1") + "/v2", B.USER_MODEL, api_key_env=None, max_retries=0)
    with pytest.raises(EndpointError) as e:
        model.chat([{"role": "user", "content": "Hi"}])
    assert e.value.status == 404 and user.requests == 0


def test_arm_overrides_point_the_user_side_at_the_endpoint(user):
    cfg = agent.load(os.path.join(ROOT, "configs", "tiny_agentrl.py") + ":grpo",
                     B.arm_overrides(user.url, steps=3, max_staleness=2))
    assert cfg.rl.max_staleness == 2 and cfg.train.steps == 3 and cfg.checkpoint.every > 3
    side = build_user_side(cfg.users)
    try:
        assert isinstance(side.simulator, OpenAIChatModel) and side.simulator.base_url == user.url
        assert side.simulator.model == B.USER_MODEL and side.simulator.api_key_env is None
        # judge and coach fall back to the same endpoint (GRPO asks neither)
        assert side.judge is side.simulator and side.coach is side.simulator
    finally:
        side.close()
