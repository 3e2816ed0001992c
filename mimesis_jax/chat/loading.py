"""A trained model as a chat model: `load_chat_model` reads a HF directory or a training workdir (its tokenizer
checked against the one the export recorded). What `serve`, `rollout` and the model specs load models with."""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp

from mimesis_jax import checkpoints, models  # checkpoints as a module: tests patch checkpoints.load_trained
from mimesis_jax.chat.local import LocalChatModel
from mimesis_jax.data.tokenizer import load_tokenizer, read_tokenizer_record
from mimesis_jax.errors import ConfigError


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def dir_tokenizer_spec(model_dir: str) -> str | None:
    """The load_tokenizer spec of the tokenizer files in a HF model directory: ``hf:DIR`` when it has a
    ``tokenizer.json`` or ``tokenizer_config.json``; ``sentencepiece:DIR/tokenizer.model`` when that model is all
    it has (what exports wrote before they wrote a tokenizer.json: AutoTokenizer would read it as another
    tokenizer); None when it has none."""
    if any(os.path.isfile(os.path.join(model_dir, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        return f"hf:{model_dir}"
    if os.path.isfile(os.path.join(model_dir, "tokenizer.model")):
        return f"sentencepiece:{os.path.join(model_dir, 'tokenizer.model')}"
    return None


def check_tokenizer(checkpoint: str, tok, spec: str, default_spec: str | None, vocab_size: int, source: str):
    """The tokenizer `tok` (loaded from `spec`) fits the checkpoint: its ids fit the model's vocabulary, and its
    fingerprint equals the one the export recorded (mimesis_tokenizer.json) or, when `spec` is not the
    checkpoint's own tokenizer `default_spec`, that tokenizer's. A ConfigError naming both otherwise."""
    if tok.vocab_size > vocab_size:
        raise ConfigError(f"tokenizer mismatch: --tokenizer {spec} has {tok.vocab_size} ids, more than the model's "
                          f"vocab_size {vocab_size} ({source})")
    record = read_tokenizer_record(checkpoint) if os.path.isdir(checkpoint) else None
    if record is not None:
        want = (f"{record.get('source')!r} (recorded in {os.path.join(checkpoint, 'mimesis_tokenizer.json')})",
                record.get("vocab_size"), record["fingerprint"])
    elif default_spec is not None and spec != default_spec:
        own = load_tokenizer(default_spec)
        want = (f"{default_spec!r} (the checkpoint's own)", own.vocab_size, own.fingerprint())
    else:
        return
    got = tok.fingerprint()
    if got != want[2]:
        raise ConfigError(f"tokenizer mismatch: --checkpoint {checkpoint} was trained with tokenizer {want[0]}, "
                          f"{want[1]} ids, fingerprint {want[2]}; --tokenizer {spec} has {tok.vocab_size} ids, "
                          f"fingerprint {got}")


def _load_weights(args):
    """(config, params, default tokenizer spec or None, where the weights came from) for --checkpoint: a HF
    directory (config.json + safetensors) or a training workdir's orbax checkpoint at --step
    (checkpoints.load_trained)."""
    ckpt = args.checkpoint
    if not os.path.isdir(ckpt):
        raise ConfigError(f"--checkpoint {ckpt}: not a directory")
    if os.path.isfile(os.path.join(ckpt, "config.json")):
        if args.step is not None:
            raise ConfigError(f"--step {args.step}: {ckpt} is a HF directory (one set of weights); --step selects a "
                              "checkpoint of a training workdir")
        tok = dir_tokenizer_spec(ckpt)
        config, params = models.load_hf(ckpt, dtype=args.dtype)
        return config, params, tok, f"{ckpt}/config.json"
    if os.path.isdir(os.path.join(ckpt, "checkpoints")):
        config, params, step, tok = checkpoints.load_trained(ckpt, args.step)
        if args.dtype != "float32":
            params = jax.tree.map(lambda x: x.astype(jnp.dtype(args.dtype)), params)
            config = config.replace(param_dtype=args.dtype, dtype=args.dtype)
        return config, params, tok, f"{ckpt} step {step}"
    raise ConfigError(f"--checkpoint {ckpt}: neither a HF directory (no config.json) nor a training workdir "
                      "(no checkpoints/)")


def load_chat_model(checkpoint: str, *, step: int | None = None, tokenizer: str | None = None,
                    dtype: str = "float32", generation_role: str = "assistant", enable_thinking: bool = False,
                    max_tokens: int = 512, seed: int = 0, name: str | None = None, mesh=None) -> "LocalChatModel":
    """A LocalChatModel from a HF directory or a training workdir, with the checkpoint's
    tokenizer unless `tokenizer` names one. What `serve` and `rollout` load models with. mesh: the model samples
    on it (its params sharded once, LocalChatModel)."""
    args = argparse.Namespace(checkpoint=checkpoint, step=step, dtype=dtype)
    config, params, default_tok, source = _load_weights(args)
    spec = tokenizer or default_tok
    if spec is None:
        raise ConfigError(f"--checkpoint {checkpoint} holds no tokenizer files ({', '.join(TOKENIZER_FILES)}); "
                          "pass --tokenizer SPEC (e.g. tiny, qwen3, qwen3_5, hf:DIR)")
    tok = load_tokenizer(spec)
    check_tokenizer(checkpoint, tok, spec, default_tok, config.vocab_size, source)
    name = name or os.path.basename(os.path.normpath(checkpoint))
    return LocalChatModel(config, params, tok, generation_role=generation_role, enable_thinking=enable_thinking,
                          max_tokens=max_tokens, seed=seed, name=name, mesh=mesh)
