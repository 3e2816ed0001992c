"""Model configuration: one frozen dataclass for every model family.

A `ModelConfig` holds two kinds of fields:

* **architecture** fields, which round-trip through a HF `config.json` (`from_hf_dict` / `to_hf_dict`);
* **runtime** fields (`dtype`, `param_dtype`, `remat`, `scan_layers`, `attention_impl` and its block sizes,
  log-prob chunk sizes), which choose how the same function runs and are never written to a checkpoint.

The config is hashable so it can be a static argument of `jax.jit`. Family-specific architecture fields
(the Qwen3.5 linear-attention dims) live here too, with `None` meaning "not used by this family".
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax.numpy as jnp

from mimesis_jax.errors import ConfigError

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_5_text")
RUNTIME_FIELDS = (
    "dtype",
    "param_dtype",
    "remat",
    "scan_layers",
    "attention_impl",
    "attention_block_q",
    "attention_block_k",
    "logits_seq_chunk",
    "logits_vocab_chunk",
    "sharding_rules",
)
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
ATTENTION_IMPLS = ("dense", "blockwise", "pallas")  # see models/attention.py
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    # ---- architecture (HF config.json) ----
    model_type: str = "qwen3"
    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_hidden_layers: int = 36
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    partial_rotary_factor: float = 1.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = 40960
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    layer_types: tuple[str, ...] = ()
    # Qwen3.5 hybrid (gated DeltaNet) fields; unused by qwen3.
    attn_output_gate: bool = False
    full_attention_interval: int | None = None
    linear_conv_kernel_dim: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    # ---- runtime (never written to config.json) ----
    dtype: str = "float32"  # compute dtype of activations and matmuls
    param_dtype: str = "float32"  # dtype parameters are stored in (fp32 master weights)
    remat: str = "none"  # per-layer rematerialisation policy, one of REMAT_POLICIES
    scan_layers: bool = True  # jax.lax.scan over stacked layers (fast compiles) vs a Python loop
    attention_impl: str = "dense"  # one of ATTENTION_IMPLS: dense reference, blockwise (flash) or pallas kernels
    attention_block_q: int = 512  # blockwise/pallas: queries per block (an upper bound; see blockwise_attention.py)
    attention_block_k: int = 512  # blockwise/pallas: keys per block
    logits_seq_chunk: int = 256  # tokens per chunk in the memory-safe log-prob path
    logits_vocab_chunk: int = 16384  # vocabulary entries per chunk in the memory-safe log-prob path
    # logical axis -> mesh axes; None means mimesis_jax.sharding.DEFAULT_RULES. Part of the (static) config so
    # that a jitted function is re-traced when the rules change.
    sharding_rules: tuple[tuple[str, Any], ...] | None = None

    def __post_init__(self):
        if not self.layer_types and self.model_type == "qwen3_5_text":
            # as transformers' Qwen3_5TextConfig: every `full_attention_interval`-th layer (default 4) is full
            k = self.full_attention_interval or 4
            object.__setattr__(self, "layer_types", tuple(
                "full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(self.num_hidden_layers)))
        elif not self.layer_types:
            object.__setattr__(self, "layer_types", ("full_attention",) * self.num_hidden_layers)
        else:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.sharding_rules is not None:
            object.__setattr__(self, "sharding_rules", tuple(
                (str(k), tuple(v) if isinstance(v, list) else v) for k, v in
                (self.sharding_rules.items() if isinstance(self.sharding_rules, dict) else self.sharding_rules)))
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        def need(cond: bool, key: str, msg: str):
            if not cond:
                raise ConfigError(f"config key '{key}': {msg} (got {getattr(self, key)!r})")

        need(self.model_type in SUPPORTED_MODEL_TYPES, "model_type", f"must be one of {SUPPORTED_MODEL_TYPES}")
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "head_dim"):
            v = getattr(self, key)
            need(isinstance(v, int) and not isinstance(v, bool) and v > 0, key, "must be a positive integer")
        need(self.num_attention_heads % self.num_key_value_heads == 0, "num_key_value_heads",
             f"must divide num_attention_heads={self.num_attention_heads}")
        need(self.rms_norm_eps > 0, "rms_norm_eps", "must be > 0")
        need(self.rope_theta > 0, "rope_theta", "must be > 0")
        need(0 < self.partial_rotary_factor <= 1, "partial_rotary_factor", "must be in (0, 1]")
        rot = self.rotary_dim
        need(rot % 2 == 0 and rot > 0, "partial_rotary_factor",
             f"head_dim * partial_rotary_factor = {self.head_dim * self.partial_rotary_factor} must be a positive even integer")
        need(len(self.layer_types) == self.num_hidden_layers, "layer_types",
             f"must have num_hidden_layers={self.num_hidden_layers} entries")
        allowed = {"qwen3": {"full_attention"}, "qwen3_5_text": {"full_attention", "linear_attention"}}[self.model_type]
        bad = [t for t in self.layer_types if t not in allowed]
        need(not bad, "layer_types", f"entries must be in {sorted(allowed)} for model_type {self.model_type}")
        need(self.dtype in DTYPES, "dtype", f"must be one of {list(DTYPES)}")
        need(self.param_dtype in DTYPES, "param_dtype", f"must be one of {list(DTYPES)}")
        need(self.remat in REMAT_POLICIES, "remat", f"must be one of {REMAT_POLICIES}")
        need(self.attention_impl in ATTENTION_IMPLS, "attention_impl", f"must be one of {ATTENTION_IMPLS}")
        for key in ("attention_block_q", "attention_block_k"):
            v = getattr(self, key)
            need(isinstance(v, int) and not isinstance(v, bool) and v > 0, key, "must be a positive integer")
        need(self.logits_seq_chunk > 0, "logits_seq_chunk", "must be > 0")
        need(self.logits_vocab_chunk > 0, "logits_vocab_chunk", "must be > 0")
        if self.model_type == "qwen3_5_text":
            for key in ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                        "linear_num_key_heads", "linear_num_value_heads"):
                v = getattr(self, key)
                need(isinstance(v, int) and v > 0, key, "must be a positive integer for qwen3_5_text")
            need(self.linear_num_value_heads % self.linear_num_key_heads == 0, "linear_num_value_heads",
                 f"must be a multiple of linear_num_key_heads={self.linear_num_key_heads}")

    # ----------------------------------------------------------------- derived
    @property
    def rotary_dim(self) -> int:
        return int(round(self.head_dim * self.partial_rotary_factor))

    @property
    def compute_dtype(self):
        return DTYPES[self.dtype]

    @property
    def weight_dtype(self):
        return DTYPES[self.param_dtype]

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    # ------------------------------------------------------------ HF round trip
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], *, source: str = "config.json", **runtime) -> "ModelConfig":
        """Builds a config from a HF `config.json` dict. Unknown HF keys are ignored (they configure
        features this project does not model, e.g. `use_cache`); unsupported *values* are errors."""
        d = dict(d)
        model_type = d.get("model_type")
        if model_type == "qwen3_5":  # full multimodal checkpoint: the language model's config is nested
            if "text_config" not in d:
                raise ConfigError(f"{source}: model_type 'qwen3_5' without a 'text_config' entry")
            top = d
            d = dict(d["text_config"])
            d.setdefault("model_type", "qwen3_5_text")
            if "tie_word_embeddings" in top:  # transformers ties the full model's head by the top-level flag
                d["tie_word_embeddings"] = top["tie_word_embeddings"]
            model_type = d["model_type"]
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(f"{source}: config key 'model_type': unsupported value {model_type!r}; "
                              f"supported: {SUPPORTED_MODEL_TYPES + ('qwen3_5',)}")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            raise ConfigError(f"{source}: config key 'rope_parameters.rope_type': unsupported value {rope_type!r} "
                              "(only 'default' RoPE is implemented)")
        theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        prf_default = 0.25 if model_type == "qwen3_5_text" else 1.0  # transformers' defaults per family
        prf = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", prf_default))
        if d.get("use_sliding_window"):
            raise ConfigError(f"{source}: config key 'use_sliding_window': sliding-window attention is not supported")
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"{source}: config key 'hidden_act': only 'silu' is supported, got {d['hidden_act']!r}")
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in RUNTIME_FIELDS or f.name in ("rope_theta", "partial_rotary_factor"):
                continue
            if f.name in d and d[f.name] is not None:
                kw[f.name] = d[f.name]
        if "head_dim" not in d or d["head_dim"] is None:
            try:
                kw["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
            except KeyError as e:
                raise ConfigError(f"{source}: missing config key {e.args[0]!r}") from None
        if d.get("num_key_value_heads") is None and "num_attention_heads" in d:
            kw["num_key_value_heads"] = d["num_attention_heads"]
        if model_type == "qwen3_5_text":
            kw.setdefault("attn_output_gate", True)
        if "layer_types" in kw:
            kw["layer_types"] = tuple(kw["layer_types"])
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if key not in kw:
                raise ConfigError(f"{source}: missing config key '{key}'")
        kw["rope_theta"] = float(theta)
        kw["partial_rotary_factor"] = float(prf)
        try:
            return cls(**kw, **runtime)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        except TypeError as e:
            raise ConfigError(f"{source}: {e}") from None

    def to_hf_dict(self) -> dict[str, Any]:
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        common = dict(
            model_type=self.model_type,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            hidden_act="silu",
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=self.tie_word_embeddings,
            attention_bias=self.attention_bias,
            max_position_embeddings=self.max_position_embeddings,
            initializer_range=self.initializer_range,
            bos_token_id=self.bos_token_id,
            eos_token_id=list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id,
            pad_token_id=self.pad_token_id,
            layer_types=list(self.layer_types),
            rope_parameters=rope,
            attention_dropout=0.0,
            torch_dtype=self.param_dtype,
        )
        if self.model_type == "qwen3":
            common.update(use_sliding_window=False, sliding_window=None, architectures=["Qwen3ForCausalLM"])
        else:
            rope["partial_rotary_factor"] = self.partial_rotary_factor
            if self.full_attention_interval is not None:
                common["full_attention_interval"] = self.full_attention_interval
            common.update(
                architectures=["Qwen3_5ForCausalLM"],
                linear_conv_kernel_dim=self.linear_conv_kernel_dim,
                linear_key_head_dim=self.linear_key_head_dim,
                linear_value_head_dim=self.linear_value_head_dim,
                linear_num_key_heads=self.linear_num_key_heads,
                linear_num_value_heads=self.linear_num_value_heads,
            )
        return common

    @classmethod
    def from_hf_dir(cls, path: str, **runtime) -> "ModelConfig":
        fn = os.path.join(path, "config.json")
        if not os.path.exists(fn):
            raise FileNotFoundError(f"{fn}: no config.json in the checkpoint directory")
        try:
            with open(fn) as f:
                d = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{fn}: not valid JSON ({e})") from None
        return cls.from_hf_dict(d, source=fn, **runtime)


def model_from_dict(d: dict) -> ModelConfig:
    """The `model` section of a stored run config (`config.to_dict` of a ModelConfig) back to a ModelConfig."""
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ConfigError(f"stored model config has unknown key(s) {unknown}")
    return ModelConfig(**d)
