"""The OpenAI-compatible server: a real uvicorn server on 127.0.0.1 hit by real HTTP clients (urllib, the official
`openai` client and this project's OpenAIChatModel / RemoteCompletionsAgent), in-process and as
`python -m mimesis_jax serve`. References are independent of the HTTP path: LocalChatModel.chat / generate
(the unbatched sampler) and the model's own scoring of the sampled tokens (algorithms.logprobs.token_logprobs)."""

import concurrent.futures
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import jax
import numpy as np
import openai
import pytest

from helpers import assert_trees_equal, subprocess_env
from mimesis_jax import models
from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.commands import serve as serve_command
from mimesis_jax.serve import server as serve
from mimesis_jax.chat.local import LocalChatModel
from mimesis_jax.chat.remote import OpenAIChatModel
from mimesis_jax.chat.thoughts import split_thought
from mimesis_jax.inference.protocol import derive_seed
from mimesis_jax.inference.generators import EngineGenerator

CONV = [{"role": "system", "content": "You are a customer."}, {"role": "user", "content": "Hello, how can I help?"}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    tok = load_tokenizer("tiny")
    config = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, initializer_range=0.3)
    path = str(tmp_path_factory.mktemp("served"))
    models.save_hf(path, config, models.init_params(config, jax.random.key(0)))
    return path


@pytest.fixture(scope="module")
def server(checkpoint):
    args = serve_command.add_args(__import__("argparse").ArgumentParser()).parse_args(
        ["--checkpoint", checkpoint, "--tokenizer", "tiny", "--port", "0", "--max-tokens", "12",
         "--batch-wait-ms", "200", "--model-name", "tiny-sim"])
    srv = serve_command.build_server(args).start()
    yield srv
    srv.stop()


def _post(url, body, raw=None, route="/chat/completions"):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url + route, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_models_and_health(server):
    with urllib.request.urlopen(server.url + "/models", timeout=10) as r:
        assert json.loads(r.read())["data"][0]["id"] == "tiny-sim"
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=10) as r:
        assert json.loads(r.read()) == {"status": "ok", "active_choices": 0}


def test_completion_equals_the_local_model(server):
    status, body = _post(server.url, {"messages": CONV, "temperature": 0, "max_tokens": 10, "logprobs": True,
                                      "return_token_ids": True})
    assert status == 200 and body["object"] == "chat.completion" and body["model"] == "tiny-sim"
    choice = body["choices"][0]
    direct = LocalChatModel(server.model.config, server.model.params, server.model.tok).chat(
        CONV, max_tokens=10, temperature=0.0)
    assert choice["token_ids"] == direct.token_ids and choice["message"]["content"] == direct.text
    assert [x["logprob"] for x in choice["logprobs"]["content"]] == pytest.approx(direct.logprobs, abs=1e-6)
    assert choice["finish_reason"] == direct.finish_reason
    assert body["usage"]["completion_tokens"] == len(direct.token_ids)
    assert body["usage"]["prompt_tokens"] == len(direct.meta["prompt_ids"])
    # the project's own remote client reads the same answer
    r = OpenAIChatModel(server.url, "tiny-sim", api_key_env=None).chat(CONV, max_tokens=10, temperature=0.0)
    assert r.text == direct.text


def test_concurrent_requests_are_batched_and_independent(server):
    convs = [[{"role": "user", "content": f"Request number {i}: where is my parcel?"}] for i in range(6)]
    before = len(server.engine.batch_sizes)
    client = OpenAIChatModel(server.url, "tiny-sim", api_key_env=None)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda c: client.chat(c, max_tokens=8, temperature=0.0), convs))
    assert max(server.engine.batch_sizes[before:]) > 1, "concurrent requests should share a sampler call"
    local = LocalChatModel(server.model.config, server.model.params, server.model.tok)
    for c, r in zip(convs, got):
        assert r.text == local.chat(c, max_tokens=8, temperature=0.0).text


def test_seed_reproducible_and_thinking_split(server):
    body = {"messages": CONV, "temperature": 1.0, "max_tokens": 10, "seed": 1234}
    a, b = _post(server.url, body)[1], _post(server.url, body)[1]
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    status, t = _post(server.url, {**body, "chat_template_kwargs": {"enable_thinking": True},
                                   "return_token_ids": True})
    msg = t["choices"][0]["message"]
    assert status == 200 and "reasoning_content" in msg
    raw = server.model.tok.decode(t["choices"][0]["token_ids"])
    raw = raw[:-len("<|im_end|>")] if raw.endswith("<|im_end|>") else raw
    thought, utterance = split_thought(raw, thinking=True)
    assert msg["reasoning_content"] == thought and msg["content"] == (utterance or "")


@pytest.mark.parametrize("body,param", [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0]"),
    ({"messages": CONV, "temperature": "hot"}, "temperature"),
    ({"messages": CONV, "max_tokens": 0}, "max_tokens"),
    ({"messages": CONV, "top_p": 1.5}, "top_p"),
    ({"messages": CONV, "n": 0}, "n"),
    ({"messages": CONV, "n": 17}, "n"),  # above --max-n
    ({"messages": CONV, "stream": "yes"}, "stream"),
    ({"messages": CONV, "stream_options": {"include_usage": True}}, "stream_options"),  # without stream
    ({"messages": CONV, "logprobs": True, "top_logprobs": 2}, "top_logprobs"),  # no alternatives computed
    ({"messages": CONV, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": CONV, "stop": [""]}, "stop"),
    ({"messages": CONV, "seed": 1.5}, "seed"),
])
def test_bad_requests_get_400_naming_the_field(server, body, param):
    status, err = _post(server.url, body)
    assert status == 400 and err["error"]["param"] == param and err["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body,param", [
    ({}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, 2, 10 ** 9]}, "prompt"),  # a token id outside the vocabulary
    ({"prompt": "hi", "logprobs": 2}, "logprobs"),
    ({"prompt": "hi", "echo": True}, "echo"),
    ({"prompt": "hi", "best_of": 3}, "best_of"),
    ({"prompt": "hi", "max_tokens": 10 ** 9}, "max_tokens"),
])
def test_bad_completion_requests_get_400_naming_the_field(server, body, param):
    status, err = _post(server.url, body, route="/completions")
    assert status == 400 and err["error"]["param"] == param and err["error"]["type"] == "invalid_request_error"


def test_bad_json_and_unknown_route(server):
    status, err = _post(server.url, None, raw=b"{not json")
    assert status == 400 and "not valid JSON" in err["error"]["message"]
    status, err = _post(server.url, {"input": "x"}, route="/embeddings")
    assert status == 404 and err["error"]["type"] == "not_found_error"


def _feed(det, tokens, finish):
    from mimesis_jax.chat.stream import TokenEvent

    deltas, ids = [], []
    for i, t in enumerate(tokens):
        d, new, lps = det.push(TokenEvent(t, -0.5 - i, finish if i == len(tokens) - 1 else None))
        deltas.append(d)
        ids += new
        assert len(lps) == len(new)
        if det.finish_reason is not None:
            break
    return deltas, ids


def test_detokenizer_stop_strings_stop_token_and_partial_characters():
    """Streamed deltas add up to the final text and never show what a stop string later cuts, nor a partial
    character; the references are plain string operations on the tokenizer's full decode."""
    from mimesis_jax.chat.stream import Detokenizer

    tok = load_tokenizer("tiny")
    stop_ids = (tok.im_end_id, tok.eos_id)
    text = "Hello world, naïve café ☕. User: bye now"
    ids = list(tok.encode(text))
    det = Detokenizer(tok, stop_ids, ["User:", "zzz"])
    deltas, out = _feed(det, ids, "length")
    k = next(k for k in range(1, len(ids) + 1) if "User:" in tok.decode(ids[:k]))  # the token completing the stop
    assert det.finish_reason == "stop" and out == ids[:k] == det.tokens
    assert "".join(deltas) == det.text == text[:text.index("User:")]
    assert all("\ufffd" not in d for d in deltas)
    det = Detokenizer(tok, stop_ids, [])  # ends on the stop token: in the ids, not in the text
    deltas, out = _feed(det, ids + [tok.im_end_id], "stop")
    assert out == ids + [tok.im_end_id] and "".join(deltas) == det.text == tok.decode(ids) == text
    assert all("\ufffd" not in d for d in deltas) and det.finish_reason == "stop"

# ------------------------------------------------------------------------------------ through the openai client
def _client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused-locally", timeout=120, max_retries=0)


def _local(server):
    return LocalChatModel(server.model.config, server.model.params, server.model.tok)


def _stream(server, **kw):
    """{choice index: (joined content, joined reasoning, finish_reason, logprobs, token_ids)}, usage, #role deltas."""
    got, usage, roles = {}, None, 0
    for chunk in _client(server).chat.completions.create(model="tiny-sim", messages=CONV, stream=True,
                                                         stream_options={"include_usage": True}, **kw):
        assert chunk.object == "chat.completion.chunk" and chunk.model == "tiny-sim"
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text, reasoning, finish, lps, ids = got.get(c.index, ("", "", None, [], []))
            assert finish is None, "nothing may follow a choice's finish_reason"
            roles += c.delta.role == "assistant"
            text += c.delta.content or ""
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            lps += [x.logprob for x in (c.logprobs.content if c.logprobs else None) or []]
            got[c.index] = (text, reasoning, c.finish_reason, lps, ids + (getattr(c, "token_ids", None) or []))
    return got, usage, roles


def test_openai_client_stream_equals_the_completion_and_the_local_model(server):
    """stream=True through the official client: a role delta, content deltas that add up to the non-streamed text
    of the same seed, the finish reason last, a usage chunk; both equal the unbatched local model's sample."""
    kw = dict(temperature=1.0, max_tokens=10, seed=7, logprobs=True, top_logprobs=0,
              extra_body={"return_token_ids": True})
    full = _client(server).chat.completions.create(model="tiny-sim", messages=CONV, **kw)
    got, usage, roles = _stream(server, **kw)
    text, _, finish, lps, ids = got[0]
    choice = full.choices[0]
    assert roles == 1 and list(got) == [0]
    assert text == choice.message.content and finish == choice.finish_reason and ids == choice.token_ids
    assert lps == pytest.approx([x.logprob for x in choice.logprobs.content], abs=1e-6)
    assert usage.completion_tokens == full.usage.completion_tokens == len(ids)
    assert usage.prompt_tokens == full.usage.prompt_tokens
    direct = _local(server).chat(CONV, max_tokens=10, temperature=1.0, seed=7)
    assert ids == direct.token_ids and text == direct.text and finish == direct.finish_reason


def test_logprobs_are_the_models_own_scores(server):
    """The served log-probs equal an independent forward pass scoring prompt + sampled tokens (temperature 1)."""
    from mimesis_jax.algorithms.logprobs import token_logprobs

    r = _client(server).chat.completions.create(model="tiny-sim", messages=CONV, temperature=1.0, max_tokens=10,
                                                seed=3, logprobs=True, extra_body={"return_token_ids": True})
    ids = r.choices[0].token_ids
    prompt = _local(server).render(CONV)
    ref = np.asarray(token_logprobs(server.model.config, server.model.params, np.asarray([prompt + ids])))
    np.testing.assert_allclose([x.logprob for x in r.choices[0].logprobs.content], ref[0, len(prompt) - 1:],
                               atol=1e-4)
    assert [x.token for x in r.choices[0].logprobs.content] == [server.model.tok.decode([t]) for t in ids]


def test_n_choices_use_derived_seeds_streamed_or_not(server):
    """n=3: three choices; choice 0 is the n=1 answer of the seed, choice i the local model's sample with the seed
    derived from (seed, i); the streamed choices add up to the same three."""
    kw = dict(temperature=1.0, max_tokens=8, seed=11, n=3, extra_body={"return_token_ids": True})
    r = _client(server).chat.completions.create(model="tiny-sim", messages=CONV, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    local = _local(server)
    for c in r.choices:
        seed = 11 if c.index == 0 else derive_seed(11, c.index)
        assert c.token_ids == local.chat(CONV, max_tokens=8, temperature=1.0, seed=seed).token_ids
    assert len({tuple(c.token_ids) for c in r.choices}) > 1, "differently seeded choices should differ"
    assert r.usage.completion_tokens == sum(len(c.token_ids) for c in r.choices)
    got, _, roles = _stream(server, **kw)
    assert roles == 3 and sorted(got) == [0, 1, 2]
    for c in r.choices:
        assert got[c.index][0] == c.message.content and got[c.index][4] == c.token_ids


def test_stop_strings_streamed_and_not(server):
    """A stop string cuts the text before it and the tokens through it, as the local model does; streamed deltas
    (which hold back a tail that may grow into the stop string) add up to the same text."""
    local = _local(server)
    full = local.chat(CONV, max_tokens=12, temperature=0.0)
    assert len(full.text) >= 6, "the random model should produce some text"
    stop = full.text[3:6]
    want = local.chat(CONV, max_tokens=12, temperature=0.0, stop=[stop])
    kw = dict(temperature=0.0, max_tokens=12, stop=[stop], extra_body={"return_token_ids": True})
    r = _client(server).chat.completions.create(model="tiny-sim", messages=CONV, **kw).choices[0]
    assert r.message.content == want.text and r.token_ids == want.token_ids and r.finish_reason == "stop"
    got, _, _ = _stream(server, **kw)
    assert got[0][0] == want.text and got[0][4] == want.token_ids and got[0][2] == "stop"

def test_thinking_streams_reasoning_then_content(server):
    kw = dict(temperature=1.0, max_tokens=12, seed=5, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    msg = _client(server).chat.completions.create(model="tiny-sim", messages=CONV, **kw).choices[0].message
    got, _, _ = _stream(server, **kw)
    text, reasoning = got[0][0], got[0][1]
    assert reasoning.strip() == msg.reasoning_content and text.strip() == msg.content


def test_text_completions_through_the_client(server):
    """/v1/completions: a text prompt, a batch of token-id prompts with n=2 (choice k*n + i), logprobs=0, stream;
    each equal to the local model sampling the same ids (no chat template)."""
    tok, local = server.model.tok, _local(server)
    client = _client(server)
    r = client.completions.create(model="tiny-sim", prompt="Once upon a time", max_tokens=8, temperature=0.0,
                                  logprobs=0)
    want = local.generate([tok.encode("Once upon a time")], local.sampling(max_tokens=8, temperature=0.0))[0]
    body = want.tokens[:-1] if want.finish_reason == "stop" else want.tokens
    c = r.choices[0]
    assert r.object == "text_completion" and c.text == tok.decode(body) and c.finish_reason == want.finish_reason
    assert c.logprobs.token_logprobs == pytest.approx(want.logprobs, abs=1e-6)
    assert "".join(c.logprobs.tokens) == tok.decode(want.tokens)
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model="tiny-sim", prompt="Once upon a time", max_tokens=8, temperature=0.0, stream=True) if ch.choices)
    assert streamed == c.text
    prompts = [tok.encode("Hello there"), tok.encode("A second, longer prompt")]
    r = client.completions.create(model="tiny-sim", prompt=prompts, n=2, max_tokens=6, temperature=1.0, seed=9,
                                  extra_body={"return_token_ids": True})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for c in r.choices:
        k, i = divmod(c.index, 2)
        seed = 9 if c.index == 0 else derive_seed(9, c.index)
        assert c.token_ids == local.generate([prompts[k]], local.sampling(max_tokens=6, temperature=1.0,
                                                                          seed=seed))[0].tokens
    assert r.usage.prompt_tokens == sum(len(p) for p in prompts)


def test_remote_completions_agent_against_serve(server):
    from mimesis_jax.chat.remote import RemoteCompletionsAgent
    from mimesis_jax.inference.protocol import Sampling

    tok, local = server.model.tok, _local(server)
    prompts = [local.render(CONV), local.render([{"role": "user", "content": "Where is my order?"}])]
    agent = RemoteCompletionsAgent(server.url, "tiny-sim", tok, api_key_env=None, timeout=120)
    got = agent.generate(prompts, Sampling(max_tokens=8, temperature=0.0))
    for p, g in zip(prompts, got):
        want = local.generate([p], local.sampling(max_tokens=8, temperature=0.0))[0]
        assert tok.decode(g.tokens) == tok.decode(want.tokens) and g.finish_reason == want.finish_reason


def test_client_errors_name_the_parameter(server):
    client = _client(server)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny-sim", messages=CONV, logprobs=True, top_logprobs=3)
    assert e.value.status_code == 400 and e.value.param == "top_logprobs" and "top_logprobs" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny-sim", prompt="hi", echo=True)
    assert e.value.param == "echo"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="tiny-sim", input="hi")


def test_async_client_concurrent_streams_are_batched(server):
    """Concurrent streaming requests from openai.AsyncOpenAI share sampler calls and each gets its own answer."""
    import asyncio

    convs = [[{"role": "user", "content": f"Ticket {i}: my parcel is late."}] for i in range(5)]
    before = len(server.engine.batch_sizes)

    async def one(client, conv):
        stream = await client.chat.completions.create(model="tiny-sim", messages=conv, max_tokens=6,
                                                      temperature=0.0, stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def main():
        client = openai.AsyncOpenAI(base_url=server.url, api_key="unused-locally", timeout=120, max_retries=0)
        return await asyncio.gather(*(one(client, c) for c in convs))
    texts = asyncio.run(main())
    assert max(server.engine.batch_sizes[before:]) > 1
    local = _local(server)
    assert texts == [local.chat(c, max_tokens=6, temperature=0.0).text for c in convs]


def test_missing_tokenizer_is_a_named_error(checkpoint):
    args = serve_command.add_args(__import__("argparse").ArgumentParser()).parse_args(["--checkpoint", checkpoint])
    with pytest.raises(ConfigError, match="holds no tokenizer files"):
        serve_command.build_server(args)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A training workdir (orbax checkpoints at steps 1 and 2) whose run config names the tiny tokenizer."""
    from mimesis_jax.config import CheckpointConfig, MeshConfig, OptimizerConfig, RunConfig, TrainConfig
    from mimesis_jax.train.loop import train
    from mimesis_jax.train.synthetic import SyntheticData

    model = ModelConfig(vocab_size=1024, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, logits_seq_chunk=16,
                        logits_vocab_chunk=256)
    cfg = RunConfig(stage="midtrain", model=model, data=SyntheticData(vocab_size=1024, seq_len=16),
                    optimizer=OptimizerConfig(lr=1e-2, warmup_steps=0, schedule="constant"),
                    train=TrainConfig(steps=2, global_batch=2, dtype="float32", progress_bar=False,
                                      tensorboard=False),
                    mesh=MeshConfig(data=1, fsdp=1, tensor=1), checkpoint=CheckpointConfig(every=1, keep=5))
    wd = str(tmp_path_factory.mktemp("trained"))
    train(cfg, wd, handle_signals=False)
    return wd


@pytest.mark.parametrize("kind", ["hf", "workdir"])
def test_cli_serve_command_serves(kind, request):
    """`python -m mimesis_jax serve --checkpoint DIR --port P` as a separate process, DIR a HF directory or a
    training workdir (whose run config supplies the tokenizer): read its URL, query it with a real HTTP client,
    stop it."""
    checkpoint = request.getfixturevalue("checkpoint" if kind == "hf" else "workdir")
    tok = ["--tokenizer", "tiny"] if kind == "hf" else []
    env = subprocess_env()
    proc = subprocess.Popen([sys.executable, "-m", "mimesis_jax", "serve", "--checkpoint", checkpoint, *tok,
                             "--port", "0", "--max-tokens", "6"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving "), f"unexpected first line {line!r}; stderr: {proc.stderr.read()[-2000:]}"
        url = line.split(" on ")[1].strip()
        r = OpenAIChatModel(url, checkpoint, api_key_env=None, timeout=120).chat(CONV, temperature=0.0)
        assert r.finish_reason in ("stop", "length") and isinstance(r.text, str)
        assert r.meta["usage"]["completion_tokens"] >= 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _serve_args(checkpoint, *extra):
    return serve_command.add_args(__import__("argparse").ArgumentParser()).parse_args(
        ["--checkpoint", checkpoint, "--port", "0", "--max-tokens", "6", *extra])


def test_serves_a_training_workdir_at_any_step(workdir):
    from mimesis_jax.checkpoints import load_trained

    srv = serve_command.build_server(_serve_args(workdir)).start()
    try:
        _, want, step, tok_name = load_trained(workdir)
        assert step == 2 and tok_name == "tiny" and srv.model.tok.vocab_size == 1024  # the run's tokenizer
        assert_trees_equal(srv.model.params, want)
        status, body = _post(srv.url, {"messages": CONV, "temperature": 0, "max_tokens": 6})
        direct = LocalChatModel(srv.model.config, want, srv.model.tok).chat(CONV, max_tokens=6, temperature=0.0)
        assert status == 200 and body["choices"][0]["message"]["content"] == direct.text
    finally:
        srv.stop()
    first = serve_command.build_server(_serve_args(workdir, "--step", "1"))
    step1 = load_trained(workdir, 1)[1]
    assert_trees_equal(first.model.params, step1)
    assert not np.array_equal(np.asarray(step1["embed"]), np.asarray(want["embed"]))  # a different checkpoint


def test_checkpoint_kind_errors_are_named(workdir, checkpoint, tmp_path):
    from mimesis_jax.checkpoints import CheckpointError

    with pytest.raises(ConfigError, match="--step 3: .* is a HF directory"):
        serve_command.build_server(_serve_args(checkpoint, "--tokenizer", "tiny", "--step", "3"))
    with pytest.raises(ConfigError, match="neither a HF directory .*nor a training workdir"):
        serve_command.build_server(_serve_args(str(tmp_path)))
    with pytest.raises(CheckpointError, match="no checkpoint at step 7"):
        serve_command.build_server(_serve_args(workdir, "--step", "7"))


# ------------------------------------------------------------------------------------ serve --engine
def test_engine_backend_gives_the_default_backends_completions(checkpoint, server):
    """`serve --engine` (a LocalChatModel over the engine, behind the same API): for fixed seeds the same completions as the default
    backend through the openai client -- n=1 with log-probs, n=2, streamed -- and bad engine flags are named."""
    args = serve_command.add_args(__import__("argparse").ArgumentParser()).parse_args(
        ["--checkpoint", checkpoint, "--tokenizer", "tiny", "--port", "0", "--max-tokens", "12", "--model-name",
         "tiny-sim", "--engine", "--engine-slots", "2", "--engine-page-size", "8", "--engine-max-len", "128"])
    eng = serve_command.build_server(args).start()
    try:
        assert isinstance(eng.model.generator, EngineGenerator)
        for kw in (dict(temperature=1.0, max_tokens=10, seed=7, logprobs=True),
                   dict(temperature=1.0, max_tokens=8, seed=11, n=2), dict(temperature=0.0, max_tokens=6)):
            kw["extra_body"] = {"return_token_ids": True}
            a = _client(server).chat.completions.create(model="tiny-sim", messages=CONV, **kw)
            b = _client(eng).chat.completions.create(model="tiny-sim", messages=CONV, **kw)
            assert len(a.choices) == len(b.choices) == kw.get("n", 1)
            for ca, cb in zip(a.choices, b.choices):
                assert cb.token_ids == ca.token_ids and cb.message.content == ca.message.content
                assert cb.finish_reason == ca.finish_reason
                if kw.get("logprobs"):
                    assert [x.logprob for x in cb.logprobs.content] == pytest.approx(
                        [x.logprob for x in ca.logprobs.content], abs=1e-4)
            got, usage, _ = _stream(eng, **kw)
            assert sorted(got) == [c.index for c in a.choices]
            for c in a.choices:
                assert got[c.index][0] == c.message.content and got[c.index][4] == c.token_ids
        assert eng.model.generator.engine.stats["decode_steps"] > 0  # the engine, not the static sampler, sampled
        assert eng.model.generator.engine.pages_in_use() == 0  # stateless requests keep no pages
    finally:
        eng.stop()
    for flag, value in (("--engine-slots", "0"), ("--engine-pages", "1"), ("--engine-max-len", "-1")):
        bad = _serve_args(checkpoint, "--tokenizer", "tiny", "--engine", flag, value)
        with pytest.raises(ConfigError, match=flag):
            serve_command.build_server(bad)


def test_engine_streams_as_sampled_batches_across_calls_and_cancels(checkpoint):
    """`serve --engine` streams for real: the first chunk of a long completion reaches the client while its request
    is still decoding; a second HTTP call made then joins the running batch (the engine runs both at once) and is
    answered before the long one ends, with the tokens its seed gives alone; closing the long stream cancels its
    engine request, which frees its slot and pages."""
    args = serve_command.add_args(__import__("argparse").ArgumentParser()).parse_args(
        ["--checkpoint", checkpoint, "--tokenizer", "tiny", "--port", "0", "--model-name", "tiny-sim", "--engine",
         "--engine-slots", "2", "--engine-page-size", "8", "--engine-max-len", "512", "--engine-decode-steps", "1"])
    srv = serve_command.build_server(args).start()
    try:
        eng = srv.model.generator.engine
        local = LocalChatModel(srv.model.config, srv.model.params, srv.model.tok)
        prompt = local.render(CONV, False)
        # a seed whose completion runs the full 400 tokens (the weights are fixed: found once, deterministically)
        probe = local.generate([prompt] * 16, [local.sampling(max_tokens=400, temperature=1.0, seed=i) for i in range(16)])
        seed = next(s for s, p in enumerate(probe) if p.finish_reason == "length")
        # the short request's reference, computed before the long stream starts: done later, its compile (seconds
        # on a loaded machine) let the long completion run to its end before the stream was closed
        ref = local.generate([prompt], local.sampling(max_tokens=3, temperature=1.0, seed=seed + 1000))[0]
        client = _client(srv)
        stream = client.chat.completions.create(model="tiny-sim", messages=CONV, max_tokens=400, temperature=1.0,
                                                seed=seed, stream=True, extra_body={"return_token_ids": True})
        ids = []
        for chunk in stream:
            ids += getattr(chunk.choices[0], "token_ids", None) or []
            if ids:
                break
        assert eng.has_work() and 0 < len(ids) < 400  # streamed while the request is still decoding
        peak = []
        done = concurrent.futures.Future()

        def short():
            out = client.chat.completions.create(model="tiny-sim", messages=CONV, max_tokens=3, temperature=1.0,
                                                 seed=seed + 1000, extra_body={"return_token_ids": True})
            done.set_result(out)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(short)
            while not done.done():
                peak.append(sum(s is not None for s in eng._slots))  # noqa: SLF001
        assert max(peak) == 2  # both requests in the decode slots at once
        assert eng.has_work()  # the long one is still running after the short one was answered
        assert done.result().choices[0].token_ids == ref.tokens
        stream.close()  # the client goes away: its request is cancelled
        for _ in range(3000):
            if not eng.has_work():
                break
            __import__("time").sleep(0.01)
        assert not eng.has_work() and eng.pages_in_use() == 0
        assert eng.stats["slot_steps_used"] < 400  # the long completion never ran to its end
    finally:
        srv.stop()


# ------------------------------------------------------------------------------------ bounds and keys
KEYS = ("key-one", "key-two")
ENV_KEYS = "env-key-a, env-key-b"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """A server over a model with a 64-token context, two --api-key keys plus two from MIMESIS_API_KEY,
    --max-queued 2 and --max-body-bytes 4096."""
    tok = load_tokenizer("tiny")
    config = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, initializer_range=0.3,
                         max_position_embeddings=64)
    path = str(tmp_path_factory.mktemp("guarded"))
    models.save_hf(path, config, models.init_params(config, jax.random.key(1)))
    args = serve_command.add_args(__import__("argparse").ArgumentParser()).parse_args(
        ["--checkpoint", path, "--tokenizer", "tiny", "--port", "0", "--max-tokens", "12", "--batch-wait-ms", "5",
         "--model-name", "tiny-sim", "--api-key", KEYS[0], "--api-key", KEYS[1], "--max-queued", "2",
         "--max-body-bytes", "4096"])
    old = os.environ.get("MIMESIS_API_KEY")
    os.environ["MIMESIS_API_KEY"] = ENV_KEYS
    try:
        srv = serve_command.build_server(args).start()
    finally:
        if old is None:
            os.environ.pop("MIMESIS_API_KEY")
        else:
            os.environ["MIMESIS_API_KEY"] = old
    yield srv
    srv.stop()


def _keyed(srv, key):
    return openai.OpenAI(base_url=srv.url, api_key=key, timeout=60, max_retries=0)


def _raw(url, data, headers=None, route="/chat/completions"):
    req = urllib.request.Request(url + route, data=data, headers={"Content-Type": "application/json",
                                                                  **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def test_api_keys_are_required_and_any_configured_key_works(guarded):
    short = [{"role": "user", "content": "Hi"}]
    for key in (*KEYS, "env-key-a", "env-key-b"):  # the flags' keys and MIMESIS_API_KEY's comma-separated ones
        r = _keyed(guarded, key).chat.completions.create(model="tiny-sim", messages=short, max_tokens=3)
        assert r.choices[0].finish_reason in ("stop", "length")
    for key in ("wrong", KEYS[0] + "x", KEYS[0][:-1], "env-key-a, env-key-b"):
        with pytest.raises(openai.AuthenticationError) as e:
            _keyed(guarded, key).chat.completions.create(model="tiny-sim", messages=short, max_tokens=3)
        assert e.value.status_code == 401 and e.value.code == "invalid_api_key" and key not in e.value.message
    with pytest.raises(openai.AuthenticationError):
        _keyed(guarded, "wrong").models.list()
    status, _, err = _raw(guarded.url, json.dumps({"messages": short}).encode())  # no Authorization header
    assert status == 401 and err["error"]["type"] == "invalid_request_error" and err["error"]["param"] is None
    with urllib.request.urlopen(f"http://127.0.0.1:{guarded.port}/health", timeout=10) as r:  # open
        assert json.loads(r.read()) == {"status": "ok", "active_choices": 0}


def test_prompt_plus_max_tokens_beyond_the_context_is_400_before_any_work(guarded):
    """The model's context is 64 tokens: prompt + max_tokens beyond it is refused, naming the field and the
    limit's source, and a stream is refused with the 400 itself (no 200 and error event)."""
    tok, client = guarded.model.tok, _keyed(guarded, KEYS[0])
    local = LocalChatModel(guarded.model.config, guarded.model.params, tok)
    long_conv = [{"role": "user", "content": "where is my parcel " * 20}]
    assert len(local.render(long_conv)) > 64
    short = [{"role": "user", "content": "Hi"}]
    n = len(local.render(short))
    before = len(guarded.engine.batch_sizes)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny-sim", messages=long_conv, stream=stream)
        assert e.value.param == "messages" and "max_position_embeddings" in e.value.message
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny-sim", messages=short, max_tokens=64 - n + 1, stream=stream)
        assert e.value.param == "max_tokens" and f"at most {64 - n}" in e.value.message
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny-sim", messages=short, max_completion_tokens=64 - n + 1,
                                           stream=stream)
        assert e.value.param == "max_completion_tokens"
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="tiny-sim", prompt=tok.encode("where is my parcel " * 20),
                                      max_tokens=1, stream=stream)
        assert e.value.param == "prompt"
    assert len(guarded.engine.batch_sizes) == before  # nothing reached the sampler
    # exactly at the limit it is served; without max_tokens the default (12) is clipped to what fits
    r = client.chat.completions.create(model="tiny-sim", messages=short, max_tokens=64 - n, temperature=0.0)
    assert r.usage.prompt_tokens == n
    near = next(c for c in ([{"role": "user", "content": "parcel " * k}] for k in range(1, 64))
                if 64 - 12 < len(local.render(c)) < 64)
    m = len(local.render(near))
    assert 64 - 12 < m < 64
    r = client.chat.completions.create(model="tiny-sim", messages=near, temperature=0.0,
                                       extra_body={"return_token_ids": True})
    want = local.chat(near, max_tokens=64 - m, temperature=0.0)
    assert r.choices[0].token_ids == want.token_ids and len(r.choices[0].token_ids) <= 64 - m


def test_body_size_queue_bound_and_invalid_text(guarded, server):
    hdr = {"Authorization": f"Bearer {KEYS[1]}"}
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode()
    status, _, err = _raw(guarded.url, big, hdr)
    assert status == 413 and "--max-body-bytes" in err["error"]["message"]
    import http.client  # a chunked body (no Content-Length) is counted as it is read

    conn = http.client.HTTPConnection("127.0.0.1", guarded.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", body=iter([big[:3000], big[3000:]]), encode_chunked=True,
                 headers={**hdr, "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 413 and "--max-body-bytes" in json.loads(resp.read())["error"]["message"]
    conn.close()
    client = _keyed(guarded, KEYS[1])
    short = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.RateLimitError) as e:  # n=3 choices > --max-queued 2
        client.chat.completions.create(model="tiny-sim", messages=short, max_tokens=3, n=3)
    assert e.value.status_code == 429 and e.value.response.headers["retry-after"] == "1"
    assert "--max-queued" in e.value.message
    for _ in range(3):  # the in-flight count goes back to 0 after each request: n=2 fits every time
        assert len(client.chat.completions.create(model="tiny-sim", messages=short, max_tokens=3, n=2).choices) == 2
    assert len(list(client.chat.completions.create(model="tiny-sim", messages=short, max_tokens=3, n=2,
                                                   stream=True))) > 0
    r = client.chat.completions.create(model="tiny-sim", messages=short, max_tokens=3, n=2)
    assert len(r.choices) == 2
    # a lone surrogate is no text: 400 naming the field (raw JSON: the escape reaches the server as is)
    for body, route, param in (
            ('{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "/chat/completions", "messages[0]"),
            ('{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
             "/chat/completions", "messages[0]"),
            ('{"messages": [{"role": "user", "content": "hi"}], "stop": ["\\ud800"]}', "/chat/completions", "stop"),
            ('{"prompt": "x\\ud834"}', "/completions", "prompt")):
        status, _, err = _raw(server.url, body.encode(), route=route)
        assert status == 400 and err["error"]["param"] == param and "surrogate" in err["error"]["message"], err


def test_dropped_stream_cancels_its_generation_on_the_default_backend(server):
    """A client that closes its stream cancels its row of the running sampler call: it stops within a few steps
    instead of decoding all its tokens, and the next request does not wait for it."""
    local = _local(server)
    prompt = local.render(CONV, False)
    probe = local.generate([prompt] * 16, [local.sampling(max_tokens=400, temperature=1.0, seed=i) for i in range(16)])
    seed = next(s for s, p in enumerate(probe) if p.finish_reason == "length")  # runs all 400 tokens
    before, batches = len(server.engine.cancelled_tokens), len(server.engine.batch_sizes)
    stream = _client(server).chat.completions.create(model="tiny-sim", messages=CONV, max_tokens=400,
                                                     temperature=1.0, seed=seed, stream=True)
    next(iter(stream))  # the role delta: the request is in the batcher
    for _ in range(3000):  # its sampler call has started
        if len(server.engine.batch_sizes) > batches:
            break
        __import__("time").sleep(0.01)
    stream.close()
    for _ in range(6000):
        if len(server.engine.cancelled_tokens) > before:
            break
        __import__("time").sleep(0.01)
    assert len(server.engine.cancelled_tokens) == before + 1
    assert 1 <= server.engine.cancelled_tokens[-1] < 400  # stopped early, inside its sampler call (not skipped)
    r = _client(server).chat.completions.create(model="tiny-sim", messages=CONV, max_tokens=5, temperature=0.0,
                                                extra_body={"return_token_ids": True})
    assert r.choices[0].token_ids == local.chat(CONV, max_tokens=5, temperature=0.0).token_ids


def test_non_loopback_without_key_warns(capsys):
    """(No socket is opened on another interface: the check is a function of the bound address.)"""
    assert serve.warn_if_exposed("0.0.0.0", "http://0.0.0.0:1/v1", [])
    assert "no authentication" in capsys.readouterr().err
    assert serve.warn_if_exposed("192.168.1.5", "http://192.168.1.5:1/v1", [])
    assert not serve.warn_if_exposed("0.0.0.0", "http://0.0.0.0:1/v1", ["s3cret"])
    assert not serve.warn_if_exposed("127.0.0.1", "http://127.0.0.1:1/v1", [])
    assert not serve.warn_if_exposed("::1", "http://[::1]:1/v1", [])
    err = capsys.readouterr().err
    assert err.count("no authentication") == 1 and "s3cret" not in err


def test_engine_server_bounds_by_its_flag_and_recovers_from_a_failed_program(checkpoint, monkeypatch):
    """`serve --engine`: prompt + max_tokens beyond --engine-max-len is a 400 naming the flag (a stream too, before
    its first byte). An injected fault (the decode program loses its donated pool and raises) ends the request
    in flight with a 500, and the next request is served as before; while the pool cannot be rebuilt /health
    answers 503 and so do requests."""
    from mimesis_jax.inference import engine_programs

    srv = serve_command.build_server(_serve_args(checkpoint, "--tokenizer", "tiny", "--engine", "--engine-slots", "2",
                                         "--engine-page-size", "8", "--engine-max-len", "64")).start()
    try:
        client, eng = _client(srv), srv.model.generator.engine
        n = len(_local(srv).render(CONV))
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as e:
                client.chat.completions.create(model="tiny-sim", messages=CONV, max_tokens=64 - n + 1, stream=stream)
            assert e.value.param == "max_tokens" and "--engine-max-len" in e.value.message
        assert eng.stats["prefill_calls"] == 0  # refused before any work
        want = _local(srv).chat(CONV, max_tokens=6, temperature=0.0).token_ids
        real, faults = engine_programs.decode_program, {"left": 1}

        def faulty(*args, **kwargs):
            if faults["left"]:
                faults["left"] -= 1
                for x in jax.tree.leaves(args[5]):
                    x.delete()
                raise RuntimeError("injected: RESOURCE_EXHAUSTED while decoding")
            return real(*args, **kwargs)
        monkeypatch.setattr(engine_programs, "decode_program", faulty)
        kw = dict(model="tiny-sim", messages=CONV, max_tokens=6, temperature=0.0,
                  extra_body={"return_token_ids": True})
        with pytest.raises(openai.InternalServerError, match="injected"):
            client.chat.completions.create(**kw)
        assert client.chat.completions.create(**kw).choices[0].token_ids == want  # rebuilt: served again
        assert eng.stats["rebuilds"] == 1
        faults["left"] = 1
        new_pools = eng._new_pools  # noqa: SLF001

        def no_memory():
            raise RuntimeError("injected: no memory for a new pool")
        monkeypatch.setattr(eng, "_new_pools", no_memory)
        with pytest.raises(openai.InternalServerError, match="injected"):
            client.chat.completions.create(**kw)
        health = f"http://127.0.0.1:{srv.port}/health"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(health, timeout=10)
        assert e.value.code == 503 and "could not rebuild" in json.loads(e.value.read())["error"]
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(**kw)
        assert e.value.status_code == 503
        monkeypatch.setattr(eng, "_new_pools", new_pools)
        with urllib.request.urlopen(health, timeout=10) as r:  # looking rebuilds it; the failed call's pages are back
            assert json.loads(r.read()) == {"status": "ok", "active_choices": 0, "pages_in_use": 0}
        assert client.chat.completions.create(**kw).choices[0].token_ids == want
    finally:
        srv.stop()
