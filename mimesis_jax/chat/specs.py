"""Models named on the command line: one spec syntax for agents, users (simulators), judges and coaches.

    tiny                      a random tiny model with the tiny tokenizer (smoke tests and demos; it writes noise)
    DIR                       a HF directory (config.json + safetensors) or a training workdir (latest checkpoint)
    http(s)://HOST:PORT/v1    a remote OpenAI-compatible endpoint (model name, key env var and style given apart)

An agent must be token-level (the episode runner hands it token prompts): a local model (`LocalChatModel`), or a
remote `/completions` endpoint (`RemoteCompletionsAgent`, for evaluation: not token-exact). A user model is asked
for the user's reply the way any chat endpoint is (`style="assistant"`); a simulator that writes `user` turns in
its own framing (this project's simulators, `serve --generation-role user`) is wrapped in `SimulatorAsResponder`
(`style="simulator"`, the default for local models).
"""

from __future__ import annotations

import dataclasses

import jax

from mimesis_jax import models
from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.chat.base import ChatModel, SimulatorAsResponder
from mimesis_jax.chat.batching import BatchedChatModel
from mimesis_jax.chat.local import LocalChatModel
from mimesis_jax.chat.remote import OpenAIChatModel, RemoteCompletionsAgent
from mimesis_jax.chat.loading import load_chat_model


@dataclasses.dataclass
class ModelSpec:
    spec: str
    model_name: str | None = None  # remote: the served model id
    tokenizer: str | None = None  # local: override the checkpoint's tokenizer; remote agent: required
    api_key_env: str | None = None  # remote: env var holding the key (None: no auth)
    step: int | None = None  # workdir checkpoint step
    dtype: str = "float32"
    thinking: bool = False  # local: render with the thinking template
    max_tokens: int = 512
    seed: int = 0

    @property
    def remote(self) -> bool:
        return self.spec.startswith(("http://", "https://"))


def tiny_model(model_type: str, seed: int):
    tok = load_tokenizer("tiny")
    vocab = -(-tok.vocab_size // 64) * 64
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, rope_theta=10_000.0, tie_word_embeddings=True,
                  max_position_embeddings=8192, logits_seq_chunk=128, logits_vocab_chunk=512)
    if model_type == "qwen3":
        config = ModelConfig(model_type="qwen3", num_hidden_layers=2, **common)
    else:
        config = ModelConfig(model_type="qwen3_5_text", num_hidden_layers=4, partial_rotary_factor=0.25,
                             attn_output_gate=True, full_attention_interval=4,
                             layer_types=("linear_attention",) * 3 + ("full_attention",),
                             linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                             linear_num_key_heads=2, linear_num_value_heads=4, **common)
    return config, models.init_params(config, jax.random.PRNGKey(seed)), tok


def local_model(s: ModelSpec, *, role: str, model_type: str = "qwen3", mesh=None):
    """A LocalChatModel for `s` generating `role` turns ("assistant" or "user"); DIR is a HF directory or a
    training workdir. mesh: sample on it (the params sharded once here, inputs split over its batch axes)."""
    if s.spec == "tiny":
        config, params, tok = tiny_model(model_type, s.seed)
        return LocalChatModel(config, params, tok, generation_role=role, enable_thinking=s.thinking,
                              max_tokens=s.max_tokens, seed=s.seed, name=f"tiny-{model_type}", mesh=mesh)
    return load_chat_model(s.spec, step=s.step, tokenizer=s.tokenizer, dtype=s.dtype, generation_role=role,
                           enable_thinking=s.thinking, max_tokens=s.max_tokens, seed=s.seed, mesh=mesh)


def agent_from_spec(s: ModelSpec):
    """A token-level agent for the episode runner."""
    if s.remote:
        if not s.tokenizer or not s.model_name:
            raise ConfigError(f"--agent {s.spec}: a remote agent needs --agent-model NAME and --agent-tokenizer SPEC "
                              "(its tokenizer, to decode prompts and encode replies)")
        return RemoteCompletionsAgent(s.spec, s.model_name, load_tokenizer(s.tokenizer), api_key_env=s.api_key_env,
                                      max_tokens=s.max_tokens)
    return local_model(s, role="assistant", model_type="qwen3")


def chat_model_from_spec(s: ModelSpec, *, style: str, batched: bool = True, mesh=None):
    """A ChatModel for a gym's user / judge side. style: "simulator" (the model writes user turns in its own
    framing; wrapped in SimulatorAsResponder) or "assistant" (asked as any chat model). Local models are wrapped
    in a `BatchedChatModel` so the concurrent calls of many envs are sampled together; `mesh`: a local model
    samples on it (`local_model`). Remote models ignore it."""
    if style not in ("simulator", "assistant"):
        raise ConfigError(f"style must be 'simulator' or 'assistant', got {style!r}")
    if s.remote:
        if not s.model_name:
            raise ConfigError(f"{s.spec}: a remote model needs its model name (--user-model / --judge-model)")
        model = OpenAIChatModel(s.spec, s.model_name, api_key_env=s.api_key_env, max_tokens=s.max_tokens)
    else:
        model = local_model(s, role="user" if style == "simulator" else "assistant", model_type="qwen3_5", mesh=mesh)
        if batched:
            model = BatchedChatModel(model)
    return SimulatorAsResponder(model) if style == "simulator" else model


def user_and_judge(user: ModelSpec, judge: ModelSpec | None, *, user_style: str | None = None):
    """A gym's user and judge models. user_style defaults to "simulator" for local models and "assistant" for
    remote ones. Without a judge spec the judge is the user's model asked as an assistant (local weights are
    loaded once and shared)."""
    style = user_style or ("assistant" if user.remote else "simulator")
    if judge is not None:
        return chat_model_from_spec(user, style=style), chat_model_from_spec(judge, style="assistant")
    if user.remote:
        model = chat_model_from_spec(user, style="assistant")
        return (SimulatorAsResponder(model) if style == "simulator" else model), model
    base = local_model(user, role="user" if style == "simulator" else "assistant", model_type="qwen3_5")
    as_judge = LocalChatModel(base.config, base.params, base.tok, generation_role="assistant",
                              max_tokens=user.max_tokens, seed=user.seed, name=f"{base.name}-judge")
    user_model = BatchedChatModel(base)
    return (SimulatorAsResponder(user_model) if style == "simulator" else user_model), BatchedChatModel(as_judge)


def close_models(*models: ChatModel) -> None:
    """Stops the batching threads of local models built here (a SimulatorAsResponder closes its simulator; a
    remote model holds nothing to stop)."""
    for m in models:
        m.close()
