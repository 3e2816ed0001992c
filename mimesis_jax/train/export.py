"""Export of a training checkpoint to a HF model directory (config.json + safetensors [+ tokenizer]).

    python -m mimesis_jax export --workdir DIR --out HFDIR [--step N] [--dtype bfloat16]

The architecture comes from the run config stored with the checkpoint; `models.load_hf(HFDIR)` reads the
result back to the same parameters (exactly, in float32) and transformers loads it.
"""

from __future__ import annotations

import os

from mimesis_jax import models
from mimesis_jax.checkpoints import load_trained
from mimesis_jax.data.tokenizer import load_tokenizer, save_hf_tokenizer
from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import DTYPES


def export_hf(workdir: str, out: str, step: int | None = None, dtype: str = "float32", log=print) -> int:
    """Writes the checkpoint at `step` (latest if None) of `workdir` to `out`; returns the step exported."""
    if dtype not in DTYPES:
        raise ConfigError(f"export: --dtype must be one of {list(DTYPES)}, got {dtype!r}")
    mc, params, step, tok_name = load_trained(workdir, step)
    models.save_hf(out, mc.replace(param_dtype=dtype), params)
    if tok_name:
        _save_tokenizer(tok_name, out, log)
    log(f"export: {workdir} step {step} -> {os.path.abspath(out)} ({mc.model_type}, {dtype})")
    return step


def _save_tokenizer(name: str, out: str, log) -> None:
    """Writes the run's tokenizer next to the weights so that `transformers.AutoTokenizer.from_pretrained(out)`
    and `serve`/`rollout` give the run's ids (data.tokenizer.save_hf_tokenizer: a HF tokenizer directory's files,
    or for a sentencepiece model a tokenizer.json built from it plus the model as tokenizer.model), and records
    the tokenizer's fingerprint in mimesis_tokenizer.json."""
    written = save_hf_tokenizer(load_tokenizer(name), out, source=name)
    log(f"export: tokenizer {name!r}: wrote {', '.join(written)}")
