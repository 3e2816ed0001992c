"""The OpenAI-compatible server: a real server on 127.0.0.1 hit by real HTTP clients (urllib and this project's
OpenAIChatModel), in-process and as `python -m mimesis_jax serve`."""

import concurrent.futures
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import jax
import numpy as np
import pytest

from helpers import assert_trees_equal
from mimesis_jax import models
from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.rollout import serve
from mimesis_jax.rollout.endpoints import LocalChatModel, OpenAIChatModel, split_thought

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
    args = serve.add_args(__import__("argparse").ArgumentParser()).parse_args(
        ["--checkpoint", checkpoint, "--tokenizer", "tiny", "--port", "0", "--max-tokens", "12",
         "--batch-wait-ms", "200", "--model-name", "tiny-sim"])
    srv = serve.build_server(args).start()
    yield srv
    srv.stop()


def _post(url, body, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url + "/chat/completions", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_models_and_health(server):
    with urllib.request.urlopen(server.url + "/models", timeout=10) as r:
        assert json.loads(r.read())["data"][0]["id"] == "tiny-sim"
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=10) as r:
        assert json.loads(r.read()) == {"status": "ok"}


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
    ({"messages": CONV, "n": 2}, "n"),
    ({"messages": CONV, "stream": True}, "stream"),
    ({"messages": CONV, "stop": [""]}, "stop"),
    ({"messages": CONV, "seed": 1.5}, "seed"),
])
def test_bad_requests_get_400_naming_the_field(server, body, param):
    status, err = _post(server.url, body)
    assert status == 400 and err["error"]["param"] == param and err["error"]["type"] == "invalid_request_error"


def test_bad_json_and_unknown_route(server):
    status, err = _post(server.url, None, raw=b"{not json")
    assert status == 400 and "not valid JSON" in err["error"]["message"]
    req = urllib.request.Request(server.url + "/completions", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 404


def test_missing_tokenizer_is_a_named_error(checkpoint):
    args = serve.add_args(__import__("argparse").ArgumentParser()).parse_args(["--checkpoint", checkpoint])
    with pytest.raises(SystemExit, match="holds no tokenizer files"):
        serve.build_server(args)


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
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
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
    return serve.add_args(__import__("argparse").ArgumentParser()).parse_args(
        ["--checkpoint", checkpoint, "--port", "0", "--max-tokens", "6", *extra])


def test_serves_a_training_workdir_at_any_step(workdir):
    from mimesis_jax.train.export import load_trained

    srv = serve.build_server(_serve_args(workdir), trained_loader=load_trained).start()
    try:
        _, want, step, tok_name = load_trained(workdir)
        assert step == 2 and tok_name == "tiny" and srv.model.tok.vocab_size == 1024  # the run's tokenizer
        assert_trees_equal(srv.model.params, want)
        status, body = _post(srv.url, {"messages": CONV, "temperature": 0, "max_tokens": 6})
        direct = LocalChatModel(srv.model.config, want, srv.model.tok).chat(CONV, max_tokens=6, temperature=0.0)
        assert status == 200 and body["choices"][0]["message"]["content"] == direct.text
    finally:
        srv.stop()
    first = serve.build_server(_serve_args(workdir, "--step", "1"), trained_loader=load_trained)
    step1 = load_trained(workdir, 1)[1]
    assert_trees_equal(first.model.params, step1)
    assert not np.array_equal(np.asarray(step1["embed"]), np.asarray(want["embed"]))  # a different checkpoint


def test_checkpoint_kind_errors_are_named(workdir, checkpoint, tmp_path):
    from mimesis_jax.train.checkpoint import CheckpointError
    from mimesis_jax.train.export import load_trained

    with pytest.raises(SystemExit, match="--step 3: .* is a HF directory"):
        serve.build_server(_serve_args(checkpoint, "--tokenizer", "tiny", "--step", "3"))
    with pytest.raises(SystemExit, match="neither a HF directory .*nor a training workdir"):
        serve.build_server(_serve_args(str(tmp_path)), trained_loader=load_trained)
    with pytest.raises(SystemExit, match="neither a HF directory"):  # the module's own entry point: HF only
        serve.build_server(_serve_args(workdir))
    with pytest.raises(CheckpointError, match="no checkpoint at step 7"):
        serve.build_server(_serve_args(workdir, "--step", "7"), trained_loader=load_trained)
