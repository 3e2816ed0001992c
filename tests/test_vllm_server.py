"""The frozen sides (simulator, judge, coach) served by vLLM's OpenAI server through the project's remote chat path
(issue #45 item 4; the recipe is in docs/vllm.md, "The frozen sides on a vLLM server").

Marked `vllm`: it needs the vLLM environment (scripts/vllm_env.sh; MIMESIS_VLLM_PYTHON names another interpreter)
and is skipped, saying so, without it. A tiny Qwen3 (head_dim 32, untied head, fp32) is written by models.save_hf
with the tiny tokenizer (data.tokenizer.save_hf_tokenizer) and a Qwen-layout chat template, vLLM's
`vllm.entrypoints.openai.api_server` serves it, and the user side the RL configs build for a remote simulator
(`users.simulator=http://...`, train/rl/chat_models.build_user_side) asks it. Greedy replies are checked against
this project's own sampler on the same weights and the same rendered prompt (data/chat.py): the prompt's and the
reply's token counts, and the reply's text as the exported tokenizer decodes the sampler's tokens.
"""

import dataclasses
import os
import socket
import subprocess
import time
import urllib.request

import jax
import pytest

from mimesis_jax import models
from mimesis_jax.config import presets
from mimesis_jax.config.rl import UserSideConfig
from mimesis_jax.data.chat import render_messages
from mimesis_jax.data.tokenizer import load_tokenizer, save_hf_tokenizer, tiny_tokenizer
from mimesis_jax.inference import sampler
from mimesis_jax.inference.vllm_generator import DEFAULT_PYTHON
from mimesis_jax.train.rl.chat_models import build_user_side

PYTHON = os.path.expanduser(os.environ.get("MIMESIS_VLLM_PYTHON", DEFAULT_PYTHON))
MAX_TOKENS = 12
START_TIMEOUT_S = 600
# the Qwen3 template's layout for plain messages (data/chat.py): an empty think block after the assistant header
# unless thinking is asked for
CHAT_TEMPLATE = (
    "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if not enable_thinking | default(false) %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")
DIALOGUES = [
    [{"role": "system", "content": "You are a terse user."}, {"role": "user", "content": "hello there, how are you?"}],
    [{"role": "user", "content": "I want to book a table for two."}],
]


def _has_vllm() -> bool:
    if not os.access(PYTHON, os.X_OK):
        return False
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return subprocess.run([PYTHON, "-c", probe], capture_output=True).returncode == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL, tokenizer, config, params) of a vLLM OpenAI server on a saved tiny HF dir; stopped after."""
    if not _has_vllm():
        pytest.skip(f"no vLLM environment at {PYTHON} (scripts/vllm_env.sh builds it; or set MIMESIS_VLLM_PYTHON)")
    root = tmp_path_factory.mktemp("vllm_server")
    tok = tiny_tokenizer()
    config = dataclasses.replace(presets.tiny_qwen3(), head_dim=32, max_position_embeddings=512,
                                 vocab_size=tok.vocab_size, tie_word_embeddings=False, initializer_range=0.2)
    params = models.init_params(config, jax.random.PRNGKey(0))
    model_dir = str(root / "model")
    models.save_hf(model_dir, config, params)
    save_hf_tokenizer(tok, model_dir, source="tiny")
    (root / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    port = _free_port()
    # --enforce-eager: vLLM runs the model's torch ops as they are instead of tracing it with dynamo and compiling
    # it with inductor at start-up (its CPU default); the replies checked here are the same ops' results, and with
    # the KV cache's size given vLLM then skips its warm-up passes too
    cmd = [PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--served-model-name", "tiny",
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "512",
           "--kv-cache-memory-bytes", str(64 << 20), "--max-num-seqs", "8", "--enforce-eager",
           "--chat-template", str(root / "chat_template.jinja")]
    log_path = root / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0"))
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(f"http://127.0.0.1:{port}/health"):
            tail = " | ".join(log_path.read_text(errors="replace").splitlines()[-5:])
            assert proc.poll() is None, f"vLLM's server exited (rc {proc.returncode}): {tail}"
            assert time.monotonic() < deadline, f"vLLM's server did not answer /health in {START_TIMEOUT_S} s: {tail}"
            time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1", tok, load_tokenizer("hf:" + model_dir), config, params
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.vllm
def test_the_frozen_sides_on_a_vllm_server_answer_as_the_projects_sampler(served):
    url, tok, hf_tok, config, params = served
    users = UserSideConfig(simulator=url, simulator_model="tiny", simulator_max_tokens=MAX_TOKENS, judge=url,
                           judge_model="tiny", coach=url, coach_model="tiny")
    side = build_user_side(users)
    try:
        for messages in DIALOGUES:
            ids = list(render_messages(tok, messages, add_generation_prompt=True).ids)
            want = sampler.generate(config, params, [ids], max_new_tokens=MAX_TOKENS, temperature=0.0, seed=0,
                                    stop_ids=(tok.im_end_id,))[0].tokens
            assert len(set(want)) > 3  # the reference is not one repeated token: the comparison can tell
            for name, model in (("simulator", side.simulator), ("judge", side.judge), ("coach", side.coach)):
                got = model.chat(messages, max_tokens=MAX_TOKENS, temperature=0.0)  # judge, coach: 512 by default
                usage = got.meta["usage"]
                assert usage["prompt_tokens"] == len(ids), name  # the served template renders the project's ids
                assert usage["completion_tokens"] == len(want), name
                # the server detokenises with the exported tokenizer.json (byte-fallback pieces become U+FFFD per
                # byte there); the ids are the sentencepiece model's
                assert got.text == hf_tok.decode(want), name
    finally:
        side.close()
