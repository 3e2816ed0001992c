"""Run configs: typed, nested, frozen dataclasses; one Python file per run in `configs/`.

A config file defines ``get_config() -> RunConfig``. The command line overrides any leaf with
``--set section.key=value`` (``--set train.steps=10 --set model.hidden_size=64``). Values are parsed and
type-checked against the dataclass field they land on (int, float, bool, str, Optional, tuples, dicts,
choices); an unknown key or a bad value is a `ConfigError` that names the full key.

    cfg = load_config("configs/tiny_midtrain.py", ["train.steps=20"])
    cfg.to_dict()                 # JSON-serialisable (stored with every checkpoint)

Sections: `model` (the architecture, a `models.ModelConfig`), `data` (the data pipeline's `DataConfig`),
`tokenizer`, `optimizer`, `train`, `mesh`, `checkpoint`, `init` (where the weights come from).
The model's runtime fields (compute dtype, remat) are set from `train.dtype` / `train.remat`, never in
`model`, so there is one place for each.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import math
import os
import types
import typing
from typing import Any, Literal, Sequence

from mimesis_jax.models.config import REMAT_POLICIES, ConfigError, ModelConfig

STAGES = ("midtrain", "sft")


# ------------------------------------------------------------------------------------------ sections
@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    name: str = "tiny"  # "tiny" | "qwen3" | "qwen3_5" | "hf:DIR" | "sentencepiece:PATH"
    # Tiny runs build the model for the tokenizer: model.vocab_size := len(tokenizer) rounded up to
    # vocab_multiple. Otherwise model.vocab_size is checked to be >= the tokenizer's size.
    set_model_vocab: bool = False
    vocab_multiple: int = 8


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 3e-5  # peak learning rate
    schedule: Literal["cosine", "constant"] = "cosine"  # after linear warmup from 0
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at train.steps
    weight_decay: float = 0.0  # decoupled (AdamW); applied to matrices only, never to norms/biases
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    clip_norm: float = 1.0  # global-norm gradient clipping; 0 disables


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 100  # optimizer steps of the whole run (the schedule's length)
    global_batch: int = 8  # sequences per optimizer step, summed over all processes
    grad_accum: int = 1  # micro-batches per step (global_batch must divide into them)
    seed: int = 0
    remat: str = "none"  # one of models.config.REMAT_POLICIES
    dtype: Literal["bfloat16", "float32"] = "bfloat16"  # compute dtype; weights/optimizer state stay fp32
    nonfinite: Literal["stop", "skip"] = "stop"  # non-finite loss/grad norm: stop the run, or skip the update
    max_consecutive_skips: int = 10  # with nonfinite=skip: stop after this many skipped steps in a row
    log_every: int = 1  # stdout / TensorBoard every N steps (metrics.jsonl always gets every step)
    prefetch: int = 2  # batches prepared ahead on a host thread; 0 = none
    progress_bar: bool = True
    tensorboard: bool = True


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = 1
    fsdp: int = -1  # -1 absorbs the remaining devices
    tensor: int = 1

    def axes(self) -> dict[str, int]:
        return {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every: int = 500  # save every N steps (and always at the end, on SIGTERM and on a non-finite stop)
    keep: int = 3  # keep the N most recent checkpoints
    async_save: bool = True  # write in a background thread while training continues
    fallback: bool = True  # resume from the newest intact step when the latest is corrupt (logged); false: stop


@dataclasses.dataclass(frozen=True)
class InitConfig:
    """Where the initial weights come from (ignored when the workdir already has a checkpoint: resume)."""

    from_workdir: str = ""  # another run's workdir (SFT after mid-training): its checkpoint's params
    from_hf: str = ""  # a HF model directory
    step: int = -1  # with from_workdir: which checkpoint step (-1 = latest)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    stage: str
    model: ModelConfig
    data: Any  # mimesis_jax.data.pipeline.DataConfig (any dataclass: --set walks its fields)
    tokenizer: TokenizerConfig = TokenizerConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    train: TrainConfig = TrainConfig()
    mesh: MeshConfig = MeshConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    init: InitConfig = InitConfig()
    name: str = ""

    def replace(self, **kw) -> "RunConfig":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict:
        return to_dict(self)

    def runtime_model(self) -> ModelConfig:
        """The model config the trainer runs: architecture + train.dtype/remat, fp32 master weights."""
        return self.model.replace(dtype=self.train.dtype, param_dtype="float32", remat=self.train.remat)


# ------------------------------------------------------------------------------------- model presets
def qwen3_5_layer_types(num_layers: int, interval: int) -> tuple[str, ...]:
    """Every `interval`-th layer full attention, the rest gated DeltaNet (HF Qwen3_5TextConfig's rule)."""
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers))


def qwen3_5_model(size: str) -> ModelConfig:
    """Architecture of the paper's simulator backbones (text part), as HF config.json would give it.

    Sources (looked up for this project; re-check against the downloaded config.json, which wins at load time
    because `init.from_hf` refuses a checkpoint whose architecture differs):
    * 9B: transformers 5.x `Qwen3_5TextConfig` defaults, documented there as the "Qwen3.5-9B style
      configuration": hidden 4096, MLP 12288, 32 layers, 16 query / 4 KV heads of 256, gated DeltaNet with
      16 key / 32 value heads of 128, conv kernel 4, untied embeddings, vocab 248,320, partial RoPE 0.25.
    * 4B: the Qwen3.5-4B Megatron preset in THUDM/slime (scripts/models/qwen3.5-4B.sh, checked against the HF
      config by its PR #1721) and public model cards: hidden 2560, MLP 9216, 32 layers, 16 / 4 heads of 256,
      rope theta 1e7, partial RoPE 0.25, vocab 248,320, tied embeddings (no untie flag), an 8 x (3 DeltaNet +
      1 attention) layout (full_attention_interval 4). Its DeltaNet head counts were not found in a primary
      source: the family defaults (16 key / 32 value heads of 128) are assumed.
    """
    common = dict(model_type="qwen3_5_text", vocab_size=248_320, num_hidden_layers=32, num_attention_heads=16,
                  num_key_value_heads=4, head_dim=256, rms_norm_eps=1e-6, rope_theta=10_000_000.0,
                  partial_rotary_factor=0.25, max_position_embeddings=262_144, attn_output_gate=True,
                  full_attention_interval=4, layer_types=qwen3_5_layer_types(32, 4), linear_conv_kernel_dim=4,
                  linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                  linear_num_value_heads=32, eos_token_id=248_046, bos_token_id=None, pad_token_id=None)
    if size == "4b":
        return ModelConfig(hidden_size=2560, intermediate_size=9216, tie_word_embeddings=True, **common)
    if size == "9b":
        return ModelConfig(hidden_size=4096, intermediate_size=12288, tie_word_embeddings=False, **common)
    raise ConfigError(f"qwen3_5_model: unknown size {size!r} (expected '4b' or '9b')")


def qwen3_model(size: str) -> ModelConfig:
    """Architecture of the paper's agent backbone (Qwen3-8B, paper §4), as its HF config.json gives it: hidden
    4096, MLP 12288, 36 layers, 32 query / 8 KV heads of 128, q/k RMSNorm, rope theta 1e6, untied embeddings,
    vocab 151,936, 40,960 positions, eos <|im_end|> = 151,645. The downloaded config.json wins at load time
    (`init.from_hf` refuses a checkpoint whose architecture differs)."""
    if size != "8b":
        raise ConfigError(f"qwen3_model: unknown size {size!r} (expected '8b')")
    return ModelConfig(model_type="qwen3", vocab_size=151_936, hidden_size=4096, intermediate_size=12288,
                       num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                       rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=False,
                       max_position_embeddings=40_960, eos_token_id=151_645, bos_token_id=None, pad_token_id=None)


# ------------------------------------------------------------------------------------------ checks
def validate(cfg: RunConfig) -> RunConfig:
    """Cross-field checks; every error names its key."""
    def need(ok: bool, key: str, msg: str):
        if not ok:
            raise ConfigError(f"config key '{key}': {msg} (got {_get(cfg, key)!r})")

    need(cfg.stage in STAGES, "stage", f"must be one of {STAGES}")
    if not isinstance(cfg.model, ModelConfig):
        raise ConfigError(f"config key 'model': must be a mimesis_jax.models.ModelConfig, "
                          f"got {type(cfg.model).__name__}")
    default = ModelConfig()
    for k in ("dtype", "param_dtype", "remat"):
        need(getattr(cfg.model, k) == getattr(default, k), f"model.{k}",
             f"a runtime field: set train.{'dtype' if k != 'remat' else 'remat'} instead (weights are always fp32)")
    need(cfg.tokenizer.vocab_multiple >= 1, "tokenizer.vocab_multiple", "must be >= 1")
    o = cfg.optimizer
    need(math.isfinite(o.lr) and o.lr > 0, "optimizer.lr", "must be a finite number > 0")
    need(cfg.train.steps >= 1, "train.steps", "must be >= 1")
    need(o.warmup_steps >= 0, "optimizer.warmup_steps", "must be >= 0")
    need(o.warmup_steps <= cfg.train.steps, "optimizer.warmup_steps",
         f"must be <= train.steps={cfg.train.steps}: lower it too, e.g. "
         f"--set optimizer.warmup_steps={max(0, cfg.train.steps // 10)}")
    need(0.0 <= o.min_lr_ratio <= 1.0, "optimizer.min_lr_ratio", "must be in [0, 1]")
    need(o.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0")
    need(0.0 <= o.b1 < 1.0, "optimizer.b1", "must be in [0, 1)")
    need(0.0 <= o.b2 < 1.0, "optimizer.b2", "must be in [0, 1)")
    need(o.eps > 0, "optimizer.eps", "must be > 0")
    need(o.clip_norm >= 0, "optimizer.clip_norm", "must be >= 0 (0 disables clipping)")
    t = cfg.train
    need(t.steps >= 1, "train.steps", "must be >= 1")
    need(t.global_batch >= 1, "train.global_batch", "must be >= 1")
    need(t.grad_accum >= 1, "train.grad_accum", "must be >= 1")
    need(t.global_batch % t.grad_accum == 0, "train.grad_accum",
         f"must divide train.global_batch={t.global_batch}")
    need(t.remat in REMAT_POLICIES, "train.remat", f"must be one of {REMAT_POLICIES}")
    need(t.max_consecutive_skips >= 1, "train.max_consecutive_skips", "must be >= 1")
    need(t.log_every >= 1, "train.log_every", "must be >= 1")
    need(t.prefetch >= 0, "train.prefetch", "must be >= 0")
    for ax in ("data", "fsdp", "tensor"):
        v = getattr(cfg.mesh, ax)
        need(v == -1 or v >= 1, f"mesh.{ax}", "must be >= 1, or -1 to absorb the remaining devices")
    need([cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor].count(-1) <= 1, "mesh", "at most one axis may be -1")
    need(cfg.checkpoint.every >= 1, "checkpoint.every", "must be >= 1")
    need(cfg.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1")
    need(not (cfg.init.from_workdir and cfg.init.from_hf), "init.from_hf",
         "set at most one of init.from_workdir and init.from_hf")
    need(cfg.init.step >= -1, "init.step", "must be >= 0, or -1 for the latest checkpoint")
    check = getattr(cfg.data, "validate", None)
    if callable(check):
        try:
            check()
        except ConfigError:
            raise
        except ValueError as e:
            raise ConfigError(f"config section 'data': {e}") from None
    return cfg


# ------------------------------------------------------------------------------------- serialisation
def to_dict(x) -> Any:
    """Dataclasses -> dicts, tuples -> lists, recursively (JSON-serialisable)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: to_dict(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, (list, tuple)):
        return [to_dict(v) for v in x]
    if isinstance(x, dict):
        return {str(k): to_dict(v) for k, v in x.items()}
    return x


def model_from_dict(d: dict) -> ModelConfig:
    """The `model` section of a stored run config back to a ModelConfig."""
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ConfigError(f"stored model config has unknown key(s) {unknown}")
    return ModelConfig(**d)


def diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Keys whose values differ between two `to_dict` results ('a.b: x -> y')."""
    out = []
    for k in sorted(set(a) | set(b)):
        key = f"{prefix}{k}"
        va, vb = a.get(k, "<missing>"), b.get(k, "<missing>")
        if isinstance(va, dict) and isinstance(vb, dict):
            out += diff(va, vb, key + ".")
        elif va != vb:
            out.append(f"{key}: {va!r} -> {vb!r}")
    return out


# ----------------------------------------------------------------------------------------- loading
def load_config(path: str, overrides: Sequence[str] = (), kind: type | tuple = None):
    """Imports `path` (a Python file defining get_config()), applies `--set` overrides, validates.

    `kind`: the config class(es) expected (default RunConfig, the Stage I training runs; other stages and tools
    pass theirs, e.g. the agent RL stage's config or a gym mixture). A config other than RunConfig is validated
    by its own `validate()` method when it has one."""
    kind = RunConfig if kind is None else kind
    if not os.path.isfile(path):
        raise ConfigError(f"--config {path}: no such file")
    spec = importlib.util.spec_from_file_location(f"_mimesis_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    _exec_config_module(spec, module, path)
    if not callable(getattr(module, "get_config", None)):
        raise ConfigError(f"{path}: a config file must define get_config() returning its config")
    cfg = module.get_config()
    if not isinstance(cfg, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ConfigError(f"{path}: get_config() returned {type(cfg).__name__}, expected {names}")
    cfg = apply_overrides(cfg, overrides)
    if isinstance(cfg, RunConfig):
        return validate(cfg)
    check = getattr(cfg, "validate", None)
    return check() if callable(check) else cfg


def load_sibling(config_file: str, name: str):
    """Imports another config file from the same directory (config files build on each other)."""
    path = os.path.join(os.path.dirname(os.path.abspath(config_file)), name)
    if not os.path.isfile(path):
        raise ConfigError(f"{config_file}: builds on {path}, which does not exist")
    spec = importlib.util.spec_from_file_location(f"_mimesis_config_{os.path.splitext(name)[0]}", path)
    module = importlib.util.module_from_spec(spec)
    _exec_config_module(spec, module, path)
    return module


def _exec_config_module(spec, module, path: str) -> None:
    """Runs a config file; its syntax errors and exceptions become one ConfigError naming the file and line."""
    try:
        spec.loader.exec_module(module)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:  # noqa: BLE001 - a user's config file may raise anything; name it in one line
        import traceback

        frames = [f for f in traceback.extract_tb(e.__traceback__) if os.path.abspath(f.filename)
                  == os.path.abspath(path)]
        where = f"{path}:{frames[-1].lineno}" if frames else path
        raise ConfigError(f"{where}: {type(e).__name__}: {e}") from None


def apply_overrides(cfg, overrides: Sequence[str]):
    """Applies 'a.b.c=value' strings in order; each value is parsed to the type of the field it sets."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"--set {item!r}: empty key")
        cfg = set_value(cfg, key, raw)
    return cfg


def set_value(obj, key: str, raw: str):
    """Returns a copy of dataclass `obj` with the leaf at dotted `key` set to `raw` parsed to its type."""
    return _set(obj, key.split("."), raw, key, "")


def _set(obj, parts: list[str], raw: str, full: str, prefix: str):
    head, rest = parts[0], parts[1:]
    where = prefix.rstrip(".") or "the run config"
    if isinstance(obj, (list, tuple)) and not isinstance(obj, str):
        try:
            i = int(head)
            item = obj[i]
        except (ValueError, IndexError):
            raise ConfigError(f"--set {full}: {where} is a list of {len(obj)} entries; '{head}' is not an index "
                              "into it") from None
        if not rest:
            raise ConfigError(f"--set {full}: set a field of the entry, e.g. {prefix}{head}.<field>=...")
        new = list(obj)
        new[i] = _set(item, rest, raw, full, f"{prefix}{head}.")
        return type(obj)(new) if isinstance(obj, tuple) else new
    if not (dataclasses.is_dataclass(obj) and not isinstance(obj, type)):
        raise ConfigError(f"--set {full}: '{where}' is a value, it has no sub-key '{head}'")
    fields = {f.name: f for f in dataclasses.fields(obj)}
    if head not in fields:
        raise ConfigError(f"--set {full}: unknown key '{prefix}{head}'; {where} has keys {sorted(fields)}")
    hints = _hints(type(obj))
    current = getattr(obj, head)
    if rest:
        value = _set(current, rest, raw, full, f"{prefix}{head}.")
    else:
        if dataclasses.is_dataclass(current) and not isinstance(current, type):
            raise ConfigError(f"--set {full}: '{full}' is a section; set one of its keys "
                              f"{sorted(f.name for f in dataclasses.fields(current))}")
        value = parse_value(raw, hints.get(head, Any), full, current)
    try:
        return dataclasses.replace(obj, **{head: value})
    except ConfigError as e:
        raise ConfigError(f"--set {full}={raw}: {e}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"--set {full}={raw}: {e}") from None


def _hints(cls) -> dict:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # unresolvable annotations: fall back to inferring from the current value
        return {}


_NONE = ("none", "null")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def parse_value(raw: str, tp, key: str, current=None):
    """Parses the string `raw` as type `tp` (an annotation); ConfigError naming `key` if it does not fit."""
    s = raw.strip()
    if tp is Any or tp is None:
        tp = type(current) if current is not None else Any
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and s.lower() in _NONE:
            return None
        errors = []
        for a in (a for a in args if a is not type(None)):
            try:
                return parse_value(s, a, key, None)
            except ConfigError as e:
                errors.append(str(e).split(": ", 1)[-1])
        raise ConfigError(f"--set {key}={raw}: not a valid {_type_name(tp)} ({'; '.join(errors)})")
    if origin is Literal:
        if s not in [str(a) for a in args]:
            raise ConfigError(f"--set {key}={raw}: must be one of {list(args)}")
        return next(a for a in args if str(a) == s)
    if tp is bool:
        if s.lower() in _TRUE:
            return True
        if s.lower() in _FALSE:
            return False
        raise ConfigError(f"--set {key}={raw}: not a boolean (use true/false)")
    if tp is int:
        try:
            return int(s.replace("_", ""), 0) if s.lower().startswith(("0x", "-0x")) else int(s.replace("_", ""))
        except ValueError:
            raise ConfigError(f"--set {key}={raw}: not an integer") from None
    if tp is float:
        try:
            return float(s.replace("_", ""))
        except ValueError:
            raise ConfigError(f"--set {key}={raw}: not a number") from None
    if tp is str:
        if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
            return s[1:-1]
        return s
    if origin in (tuple, list) or tp in (tuple, list):
        v = _literal(s, key)
        if isinstance(v, str):  # not a literal: comma-separated items, brackets optional
            inner = s[1:-1] if s[:1] in "[(" and s[-1:] in "])" else s
            v = [x.strip() for x in inner.split(",")] if inner.strip() else []
        elif not isinstance(v, (list, tuple)):
            v = [v]
        if args and not (len(args) == 2 and args[1] is Ellipsis) and len(args) != len(v):
            raise ConfigError(f"--set {key}={raw}: expected {len(args)} entries, got {len(v)}")
        elem = [args[0]] * len(v) if len(args) == 2 and args[1] is Ellipsis else (list(args) or [Any] * len(v))
        out = [parse_value(json.dumps(x) if not isinstance(x, str) else x, t, f"{key}[{i}]", x)
               for i, (x, t) in enumerate(zip(v, elem))]
        return tuple(out) if (origin or tp) is tuple else out
    if origin is dict or tp is dict:
        v = _literal(s, key)
        if not isinstance(v, dict):
            raise ConfigError(f"--set {key}={raw}: expected a dict, e.g. {{\"a\": 1}}")
        return v
    if tp is Any:
        try:
            return ast.literal_eval(s)
        except (ValueError, SyntaxError):
            return s
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        raise ConfigError(f"--set {key}: is a section; set one of its keys")
    raise ConfigError(f"--set {key}={raw}: cannot parse a value of type {_type_name(tp)}")


def _literal(s: str, key: str):
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(s)
        except (ValueError, SyntaxError):
            continue
    return s


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _get(obj, key: str):
    for part in key.split("."):
        if not part:
            continue
        obj = getattr(obj, part, None)
    return obj
