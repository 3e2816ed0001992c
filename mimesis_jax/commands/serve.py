"""`python -m mimesis_jax serve`: an OpenAI-compatible HTTP server for a local model (e.g. the frozen user simulator)
on localhost -- the command line of serve/server.py's `ChatServer`, which documents the API, the bounds and the
two backends.

    python -m mimesis_jax serve --checkpoint HF_DIR --port 8000 [--tokenizer SPEC] [--generation-role user]
    python -m mimesis_jax serve --checkpoint WORKDIR [--step N] --port 8000  # a training run's checkpoint
    python -m mimesis_jax serve --checkpoint HF_DIR --engine [--engine-slots 16]  # through the rollout engine
"""

from __future__ import annotations

import argparse
import os

from mimesis_jax.errors import ConfigError
from mimesis_jax.chat.local import LocalChatModel
from mimesis_jax.inference.engine import EngineConfig
from mimesis_jax.chat.loading import load_chat_model
from mimesis_jax.serve.server import ChatServer


def add_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--checkpoint", required=True,
                        help="HF model directory (config.json + safetensors); through `python -m mimesis_jax serve` "
                             "also a training workdir (its latest checkpoint, or --step)")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step of a training workdir (default latest)")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer spec for data.tokenizer.load_tokenizer: tiny | qwen3 | qwen3_5 | hf:DIR | "
                             "sentencepiece:FILE (default: the checkpoint's own -- the tokenizer files an export "
                             "wrote, or a workdir's run tokenizer; one whose ids differ from it is an error)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--model-name", default=None, help="the model id reported (default: checkpoint dir name)")
    parser.add_argument("--generation-role", choices=("assistant", "user"), default="assistant",
                        help="role of the generated turn; 'user' serves a simulator in its own framing")
    parser.add_argument("--enable-thinking", action="store_true", help="thinking template by default")
    parser.add_argument("--max-tokens", type=int, default=512, help="default max_tokens of a request")
    parser.add_argument("--max-tokens-limit", type=int, default=32768, help="largest max_tokens accepted")
    parser.add_argument("--max-n", type=int, default=16, help="largest n (choices per request) accepted")
    parser.add_argument("--api-key", action="append", default=[], metavar="KEY",
                        help="a key clients must send (Authorization: Bearer KEY); repeatable; also the "
                             "comma-separated MIMESIS_API_KEY. None: no authentication")
    parser.add_argument("--max-queued", type=int, default=256,
                        help="most choices queued or generating at once; beyond it 429 with Retry-After (0 = no "
                             "limit)")
    parser.add_argument("--max-body-bytes", type=int, default=8 << 20,
                        help="largest request body in bytes; beyond it 413 (0 = no limit)")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine", action="store_true",
                        help="sample through the rollout engine (paged KV cache, continuous batching, one device)")
    parser.add_argument("--engine-slots", type=int, default=16, help="--engine: requests decoded together")
    parser.add_argument("--engine-page-size", type=int, default=16, help="--engine: tokens per KV page")
    parser.add_argument("--engine-max-len", type=int, default=0,
                        help="--engine: longest prompt + completion in tokens (0 = the model's "
                             "max_position_embeddings)")
    parser.add_argument("--engine-decode-steps", type=int, default=4,
                        help="--engine: tokens decoded per compiled burst; a stream delivers tokens in bursts of this "
                             "size and a new request waits at most one burst for a free slot")
    parser.add_argument("--engine-pages", type=int, default=0,
                        help="--engine: KV pool pages (0 = every slot at --engine-max-len, + the trash page)")
    parser.add_argument("--engine-warmup", action="store_true",
                        help="--engine: compile every prefill and decode program before serving (slower start; no "
                             "request then waits for a compilation, e.g. in a load test)")
    return parser


def engine_config_from_args(args, model_config):
    """The EngineConfig of `serve --engine` (errors name the flag)."""
    for flag, v, lo in (("--engine-slots", args.engine_slots, 1), ("--engine-page-size", args.engine_page_size, 1),
                        ("--engine-max-len", args.engine_max_len, 0), ("--engine-pages", args.engine_pages, 0),
                        ("--engine-decode-steps", args.engine_decode_steps, 1)):
        if v < lo:
            raise ConfigError(f"{flag} {v}: must be >= {lo}")
    if args.engine_pages == 1:
        raise ConfigError("--engine-pages 1: must be 0 (sized from the slots) or >= 2 (page 0 is the trash page)")
    max_len = args.engine_max_len or model_config.max_position_embeddings
    per_seq = -(-max_len // args.engine_page_size)
    return EngineConfig(slots=args.engine_slots, page_size=args.engine_page_size, max_pages_per_seq=per_seq,
                        num_pages=args.engine_pages or args.engine_slots * per_seq + 1,
                        decode_steps=args.engine_decode_steps)


def api_keys_from(args) -> list[str]:
    """--api-key values and the comma-separated MIMESIS_API_KEY (empty entries dropped)."""
    env = os.environ.get("MIMESIS_API_KEY", "")
    return [k.strip() for k in list(args.api_key or []) + env.split(",") if k.strip()]


def build_server(args) -> ChatServer:
    for flag, v in (("--max-queued", args.max_queued), ("--max-body-bytes", args.max_body_bytes)):
        if v < 0:
            raise ConfigError(f"{flag} {v}: must be >= 0 (0 = no limit)")
    model = load_chat_model(args.checkpoint, step=args.step, tokenizer=args.tokenizer, dtype=args.dtype,
                            generation_role=args.generation_role, enable_thinking=args.enable_thinking,
                            max_tokens=args.max_tokens, seed=args.seed, name=args.model_name)
    if args.engine:
        model = LocalChatModel(model.config, model.params, model.tok,
                               engine_config=engine_config_from_args(args, model.config),
                               generation_role=model.generation_role, enable_thinking=model.enable_thinking,
                               max_tokens=model.max_tokens, seed=model.seed, name=model.name)
        if args.engine_warmup:
            model.generator.engine.warmup()
    return ChatServer(model, host=args.host, port=args.port, model_name=model.name, max_batch=args.max_batch,
                      batch_wait_ms=args.batch_wait_ms, max_tokens_limit=args.max_tokens_limit,
                      max_n=args.max_n, api_keys=api_keys_from(args), max_queued=args.max_queued,
                      max_body_bytes=args.max_body_bytes)


def run(args) -> int:
    server = build_server(args)
    print(f"serving {server.model_name} on {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0

