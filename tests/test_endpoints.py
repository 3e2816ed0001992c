"""Remote endpoint on the `openai` client (retries, backoff, timeouts, key hygiene) against a local fake OpenAI
server; refusal rules; thought splitting; chat_many; the local JAX ChatModel."""

import http.server
import json
import logging
import threading
import time

import jax
import numpy as np
import pytest

from mimesis_jax import models
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.chat.base import ChatResponse, ScriptedChatModel
from mimesis_jax.chat.base import chat_many
from mimesis_jax.chat.local import LocalChatModel
from mimesis_jax.chat.remote import EndpointError, OpenAIChatModel
from mimesis_jax.chat.thoughts import response_thought, split_thought
from mimesis_jax.chat.refusal import DEFAULT_RULES, RefusalDetector

KEY = "sk-test-SECRET-0123456789abcdef"


def _completion(text, reasoning=None, finish="stop"):
    msg = {"role": "assistant", "content": text}
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    return {"id": "x", "object": "chat.completion", "model": "fake",
            "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


class FakeServer:
    """Answers POSTs from a script of (status, body, headers, delay_s); records every request it receives."""

    def __init__(self, script):
        self.script, self.requests = list(script), []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                fake.requests.append({"path": self.path, "headers": headers, "body": json.loads(body)})
                step = fake.script.pop(0) if fake.script else (500, {"error": "script exhausted"}, {}, 0)
                status, payload, headers, delay = step
                time.sleep(delay)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake():
    servers = []

    def make(script):
        servers.append(FakeServer(script))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv("MIMESIS_TEST_KEY", KEY)
    return "MIMESIS_TEST_KEY"


def test_retries_with_backoff_then_succeeds(fake, key_env, caplog):
    """503 then 429 (with the key echoed in its body) are retried by the client, honouring Retry-After; the third
    answer is read; the key travels in the Authorization header only and never reaches a log line."""
    srv = fake([(503, {"error": "busy"}, {"retry-after-ms": "10"}, 0),
                (429, {"error": f"slow down {KEY}"}, {"Retry-After": "0.05"}, 0),
                (200, _completion("hello there"), {}, 0)])
    model = OpenAIChatModel(srv.url, "fake-model", api_key_env=key_env, max_retries=3)
    caplog.set_level(logging.DEBUG)
    t0 = time.monotonic()
    r = model.chat([{"role": "user", "content": "hi"}], max_tokens=7, temperature=0.0, stop=["\n"])
    assert r.text == "hello there" and r.token_ids is None and r.finish_reason == "stop"
    assert r.meta["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert len(srv.requests) == 3
    assert time.monotonic() - t0 >= 0.01 + 0.05  # both server-directed delays were waited
    req = srv.requests[-1]
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["authorization"] == f"Bearer {KEY}"
    assert req["body"] == {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7,
                           "temperature": 0.0, "stop": ["\n"]}
    assert "Retrying request" in caplog.text and KEY not in caplog.text


def test_non_retryable_status_fails_at_once_without_leaking_the_key(fake, key_env, caplog):
    srv = fake([(400, {"error": {"message": f"bad key {KEY}"}}, {}, 0), (200, _completion("never"), {}, 0)])
    model = OpenAIChatModel(srv.url, "m", api_key_env=key_env, max_retries=3)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(EndpointError, match="HTTP 400") as e:
        model.chat([{"role": "user", "content": "hi"}])
    assert e.value.status == 400 and "bad key ***" in str(e.value)
    assert KEY not in str(e.value) and KEY not in repr(model) and KEY not in caplog.text
    assert len(srv.requests) == 1


def test_timeouts_are_retried_then_reported(fake, key_env):
    srv = fake([(200, _completion("late"), {}, 0.6)] * 3)
    model = OpenAIChatModel(srv.url, "m", api_key_env=key_env, timeout=0.2, max_retries=2)
    with pytest.raises(EndpointError, match="giving up after 3 attempts; last error: APITimeoutError"):
        model.chat([{"role": "user", "content": "hi"}])
    assert len(srv.requests) == 3


def test_connection_refused_is_retried(key_env):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens on this port now
    model = OpenAIChatModel(f"http://127.0.0.1:{port}/v1", "m", api_key_env=key_env, max_retries=1)
    with pytest.raises(EndpointError, match="giving up after 2 attempts; last error: APIConnectionError"):
        model.chat([{"role": "user", "content": "hi"}])


def test_missing_key_and_malformed_response(fake, monkeypatch):
    """No key variable: a named error. No auth (api_key_env=None): a dummy bearer, never OPENAI_API_KEY."""
    monkeypatch.delenv("MIMESIS_NO_SUCH_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with pytest.raises(EndpointError, match="MIMESIS_NO_SUCH_KEY is not set"):
        OpenAIChatModel("http://127.0.0.1:1/v1", "m", api_key_env="MIMESIS_NO_SUCH_KEY")
    srv = fake([(200, b"not json", {}, 0), (200, {"choices": []}, {}, 0)])
    model = OpenAIChatModel(srv.url, "m", api_key_env=None, max_retries=0)
    for _ in range(2):
        with pytest.raises(EndpointError, match="malformed completion response"):
            model.chat([{"role": "user", "content": "hi"}])
    assert all(r["headers"]["authorization"] == "Bearer EMPTY" for r in srv.requests)


def test_key_read_per_request_and_extensions_in_the_body(fake, key_env, monkeypatch):
    """The key is read at each request (a rotated key is used at once); non-OpenAI settings go in the body as
    extensions, `enable_thinking` as vLLM's chat_template_kwargs; extra_body is merged into every request."""
    srv = fake([(200, _completion("a"), {}, 0), (200, _completion("b"), {}, 0)])
    model = OpenAIChatModel(srv.url, "m", api_key_env=key_env, extra_body={"repetition_penalty": 1.1})
    model.chat([{"role": "user", "content": "hi"}], seed=3, top_p=0.5, top_k=7, enable_thinking=False)
    monkeypatch.setenv(key_env, "sk-rotated")
    model.chat([{"role": "user", "content": "hi"}])
    first, second = srv.requests
    assert first["headers"]["authorization"] == f"Bearer {KEY}"
    assert second["headers"]["authorization"] == "Bearer sk-rotated"
    assert first["body"] == {"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": 3, "top_p": 0.5,
                             "top_k": 7, "repetition_penalty": 1.1, "chat_template_kwargs": {"enable_thinking": False}}
    assert second["body"] == {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                              "repetition_penalty": 1.1}


def test_reasoning_content_and_chat_many_with_failures(fake):
    srv = fake([(200, _completion("The utterance.", reasoning="private thought"), {}, 0), (404, {"e": 1}, {}, 0)])
    model = OpenAIChatModel(srv.url, "m", api_key_env=None, max_retries=0, max_concurrency=1)
    out = chat_many(model, [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]])
    assert response_thought(out[0]) == ("private thought", "The utterance.")
    assert out[1].finish_reason == "error" and "HTTP 404" in out[1].meta["error"]


def test_split_thought():
    assert split_thought("<think>\nwhy\n</think>\n\nHi there") == ("why", "Hi there")
    assert split_thought("why\n</think>\n\nHi there", thinking=True) == ("why", "Hi there")
    assert split_thought("still thinking, never closed", thinking=True) == ("still thinking, never closed", None)
    assert split_thought("<think>\nunclosed") == ("unclosed", None)
    assert split_thought("  Just talking. ") == (None, "Just talking.")
    r = ChatResponse("thought\n</think>\n\nHello", meta={"thinking": True})
    assert response_thought(r) == ("thought", "Hello")


@pytest.mark.parametrize("text,rule", [
    ("As an AI language model, I cannot do that.", "as_an_ai"),
    ("Sorry, I can't role-play as a customer.", "cannot_roleplay"),
    ("I'm an AI assistant, so I don't have orders.", "i_am_an_ai"),
    ("Hello! How can I assist you today?", "assistant_voice"),
])
def test_refusal_rules_fire(text, rule):
    reason = RefusalDetector().check(text)
    assert reason is not None and repr(rule) in reason and "utterance" in reason


def test_refusal_rules_configurable_and_quiet_on_users():
    d = RefusalDetector()
    for text in ("I want to return my shoes, they are too small.", "Can you help me with my order?",
                 "No, that's not what I asked. Try again."):
        assert d.check(text) is None
    assert "thought" in d.check("Fine.", thought="As an AI I should not pretend")
    assert RefusalDetector(check_thought=False).check("Fine.", thought="As an AI I should not pretend") is None
    custom = RefusalDetector({"nope": r"\bI refuse\b"})
    assert custom.check("I refuse to play along") is not None and custom.check("As an AI") is None
    assert set(DEFAULT_RULES) >= {"as_an_ai", "cannot_roleplay"}
    with pytest.raises(ValueError, match="refusal rule 'bad'"):
        RefusalDetector({"bad": "("})


def test_scripted_model_records_calls():
    m = ScriptedChatModel(["a", "b"])
    out = chat_many(m, [[{"role": "user", "content": str(i)}] for i in range(3)])
    assert [r.text for r in out] == ["a", "b", "a"] and len(m.calls) == 3


# ------------------------------------------------------------------------------------ local model
@pytest.fixture(scope="module")
def local():
    from mimesis_jax.data.tokenizer import load_tokenizer
    tok = load_tokenizer("tiny")
    config = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, initializer_range=0.3)
    return config, models.init_params(config, jax.random.key(0)), tok


def test_local_chat_model_is_token_exact(local):
    """The local model's prompt is the chat renderer's, and its log-probs are those of prompt + reply."""
    from mimesis_jax.algorithms.logprobs import token_logprobs
    from mimesis_jax.data.chat import render_messages
    config, params, tok = local
    m = LocalChatModel(config, params, tok, max_tokens=12, temperature=1.0, seed=3)
    convs = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
             [{"role": "user", "content": "Tell me about your order please"}]]
    out = m.chat_batch(convs)
    again = LocalChatModel(config, params, tok, max_tokens=12, temperature=1.0, seed=3).chat_batch(convs)
    assert [r.token_ids for r in out] == [r.token_ids for r in again]
    for conv, r in zip(convs, out):
        prompt = render_messages(tok, conv, add_generation_prompt=True).ids
        assert r.meta["prompt_ids"] == prompt
        body = r.token_ids[:-1] if r.finish_reason == "stop" else r.token_ids
        assert r.text == tok.decode(body) and len(r.logprobs) == len(r.token_ids)
        ref = np.asarray(token_logprobs(config, params, np.asarray([prompt + r.token_ids])))[0, len(prompt) - 1:]
        np.testing.assert_allclose(r.logprobs, ref, atol=1e-5)


def test_local_chat_model_stop_strings_cut_text_and_tokens(local):
    config, params, tok = local
    m = LocalChatModel(config, params, tok, max_tokens=16, temperature=0.0)
    conv = [{"role": "user", "content": "Hello"}]
    full = m.chat(conv)
    assert len(full.text) >= 4, "the random model should produce some text"
    stop = full.text[2:4]
    cut = m.chat(conv, stop=[stop])
    assert cut.finish_reason == "stop" and cut.text == full.text[:full.text.index(stop)]
    assert cut.token_ids == full.token_ids[:len(cut.token_ids)] and stop in tok.decode(cut.token_ids)
    assert stop not in tok.decode(cut.token_ids[:-1])


def test_local_simulator_framing(local):
    """A simulator generates the next *user* turn after `<|im_start|>user\\n<think>\\n` (data/chat.py's framing)."""
    from mimesis_jax.data.chat import generation_prompt, render_messages
    config, params, tok = local
    sim = LocalChatModel(config, params, tok, generation_role="user", enable_thinking=True, max_tokens=6)
    conv = [{"role": "system", "content": "You are a customer who lost a parcel."},
            {"role": "user", "content": "My parcel is missing.", "reasoning": "I am annoyed."},
            {"role": "assistant", "content": "Sorry to hear that. What is the order number?"}]
    r = sim.chat(conv)
    gp = generation_prompt(tok, "user", enable_thinking=True)
    assert r.meta["prompt_ids"][-len(gp):] == gp and r.meta["thinking"] is True
    assert r.meta["prompt_ids"] == render_messages(tok, conv, enable_thinking=True, add_generation_prompt=True,
                                                   generation_role="user").ids
    assert "I am annoyed." in tok.decode(r.meta["prompt_ids"])  # its own earlier thought stays in its context
    thought, utterance = response_thought(r)
    assert (thought, utterance) == split_thought(r.text, thinking=True)
    if "</think>" not in r.text:  # a reply that never closes its thought has no utterance: nothing reaches the agent
        assert utterance is None and thought == r.text.strip()


# ------------------------------------------------------------------------------------ remote agent
def test_remote_completions_agent_decodes_prompts_and_encodes_replies(fake, key_env):
    """A remote agent for evaluation: the token prompt goes out as text, the reply comes back as ids + <|im_end|>;
    a 503 is retried; the key is sent in the header only."""
    from mimesis_jax.data.tokenizer import load_tokenizer
    from mimesis_jax.chat.remote import RemoteCompletionsAgent
    from mimesis_jax.inference.protocol import Sampling

    tok = load_tokenizer("tiny")
    done = {"choices": [{"index": 0, "text": "I will search now.", "finish_reason": "stop"}]}
    cut = {"choices": [{"index": 0, "text": "I will", "finish_reason": "length"}]}
    srv = fake([(503, {"error": "busy"}, {"retry-after-ms": "10"}, 0), (200, done, {}, 0), (200, cut, {}, 0)])
    agent = RemoteCompletionsAgent(srv.url, "agent-x", tok, api_key_env=key_env, max_concurrency=1)
    prompts = [list(tok.encode("Hello there")), list(tok.encode("Second prompt"))]
    out = agent.generate(prompts, [Sampling(max_tokens=9, temperature=0.0, seed=s) for s in (1, 2)])
    assert out[0].tokens == list(tok.encode("I will search now.")) + [tok.im_end_id]
    assert out[0].finish_reason == "stop" and out[0].logprobs is None and out[0].prompt_len == len(prompts[0])
    assert out[1].tokens == list(tok.encode("I will")) and out[1].finish_reason == "length"
    req = srv.requests[1]
    assert req["path"] == "/v1/completions" and req["headers"]["authorization"] == f"Bearer {KEY}"
    assert req["body"]["prompt"] == tok.decode(prompts[0]) and req["body"]["stop"] == ["<|im_end|>"]
    assert (req["body"]["max_tokens"], req["body"]["temperature"], req["body"]["seed"]) == (9, 0.0, 1)
    srv2 = fake([(200, {"nothing": 1}, {}, 0)])
    bad = RemoteCompletionsAgent(srv2.url, "agent-x", tok, api_key_env=None)
    with pytest.raises(EndpointError, match="malformed completion response"):
        bad.generate([prompts[0]], Sampling(max_tokens=4))


def test_batched_chat_model_samples_concurrent_calls_together(local):
    """Concurrent calls from many threads (envs asking their user) go through one sampler call, each getting
    what an unbatched call with the same seed gives."""
    from mimesis_jax.chat.batching import BatchedChatModel

    config, params, tok = local
    base = LocalChatModel(config, params, tok, max_tokens=6, temperature=1.0)
    batched = BatchedChatModel(base, max_batch=8, batch_wait_ms=300)
    convs = [[{"role": "user", "content": f"Question number {i}"}] for i in range(4)]
    try:
        results = [None] * 4

        def ask(i):
            results[i] = batched.chat(convs[i], seed=100 + i)
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        batched.close()
    assert batched.engine.batch_sizes == [4]
    for i, r in enumerate(results):
        assert r.token_ids == base.chat(convs[i], seed=100 + i).token_ids
