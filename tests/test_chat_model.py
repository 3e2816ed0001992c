"""The ChatModel base class (chat/base.py) and the server's Backend (serve/openai_api.py): what a subclass must
write, the defaults it inherits, and chat_many's failure handling over them."""

from __future__ import annotations

import pathlib
import threading
import time

import pytest

from mimesis_jax.chat.base import ChatModel, ChatResponse, chat_many
from mimesis_jax.serve.openai_api import Backend, TokenEvent, create_app

API = pathlib.Path(__file__).resolve().parents[1] / "docs" / "api.md"


class Probe(ChatModel):
    """Replies with the last message reversed after `delay` s; records the most calls running at once; a message
    'fail' raises."""

    def __init__(self, limit: int, delay: float = 0.05):
        self.max_concurrency, self.delay = limit, delay
        self.active = self.peak = 0
        self.lock = threading.Lock()

    def chat(self, messages, **kwargs):
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(self.delay)
        with self.lock:
            self.active -= 1
        text = messages[-1]["content"]
        if text == "fail":
            raise ValueError(f"bad {kwargs['temperature']}")
        return ChatResponse(text=text[::-1])


def _convs(texts):
    return [[{"role": "user", "content": t}] for t in texts]


def test_chat_is_the_one_abstract_method():
    with pytest.raises(TypeError, match="abstract"):
        ChatModel()

    class NoChat(ChatModel):
        pass

    with pytest.raises(TypeError, match=r"abstract.*\bchat\b"):
        NoChat()


@pytest.mark.parametrize("limit", [1, 3])
def test_default_chat_batch_keeps_order_runs_max_concurrency_calls_and_reports_each_failure(limit):
    texts = ["ab", "cd", "fail", "ef", "gh", "ij", "kl"]
    m = Probe(limit)
    out = m.chat_batch(_convs(texts), temperature=0.5)
    assert [r.text for r in out] == ["ba", "dc", "", "fe", "hg", "ji", "lk"]
    assert [r.finish_reason for r in out] == ["stop", "stop", "error", "stop", "stop", "stop", "stop"]
    assert out[2].meta == {"error": "ValueError: bad 0.5"}
    assert m.peak == limit


def test_defaults_release_close_and_one_call_at_a_time():
    class Plain(ChatModel):
        def chat(self, messages, **kwargs):
            return ChatResponse(text="x")

    m = Plain()
    assert (m.max_concurrency, m.release(["k"]), m.close()) == (1, None, None)
    assert chat_many(m, []) == []


def test_chat_many_answers_every_conversation_when_the_whole_batch_fails():
    class Down(ChatModel):
        def chat(self, messages, **kwargs):
            raise AssertionError("chat_many goes through chat_batch")

        def chat_batch(self, conversations, **kwargs):
            raise ConnectionError("sampler lost")

    out = chat_many(Down(), _convs(["a", "b"]))
    failed = ("", "error", {"error": "ConnectionError: sampler lost"})
    assert [(r.text, r.finish_reason, r.meta) for r in out] == [failed, failed]


def test_the_docs_chat_model_runs_as_written():
    text = API.read_text(encoding="utf-8")
    block = text.split("## Chat models", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(compile(block, str(API), "exec"), scope)  # noqa: S102 -- the page's own example
    echo = scope["Echo"]()
    assert echo.max_concurrency == 4
    assert [r.text for r in chat_many(echo, _convs(["hi", "there"]))] == ["hi", "there"]


# ------------------------------------------------------------------------------------ the server's Backend
class _Minimal(Backend):
    tok, stop_ids, max_tokens = None, (), 8

    def render(self, messages, enable_thinking=None):
        return [1, 2], False

    async def generate(self, prompt_ids, params):
        yield TokenEvent(3, -0.5, "length")


def test_backend_defaults_and_the_abstract_pair():
    b = _Minimal()
    assert (b.context(), b.health(), b.held()) == ((None, None), None, {})
    with pytest.raises(TypeError, match="abstract"):
        Backend()

    class RenderOnly(Backend):
        def render(self, messages, enable_thinking=None):
            return [], False

    with pytest.raises(TypeError, match=r"abstract.*\bgenerate\b"):
        RenderOnly()


def test_create_app_refuses_a_backend_that_does_not_subclass_backend():
    class Duck:
        def render(self, messages, enable_thinking=None):
            return [], False

    with pytest.raises(TypeError, match="backend must subclass serve.openai_api.Backend, got Duck"):
        create_app(Duck(), "m")
