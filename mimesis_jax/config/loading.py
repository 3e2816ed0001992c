"""Loading a run config: a Python file in `configs/`, an optional variant, `--set` overrides, validation.

A config file defines ``get_config()`` returning its config. A file with variants (one base, a few named
differences: model sizes, algorithm arms) lists them in ``VARIANTS`` and defines ``get_config(variant=<default>)``;
the command line picks one with a ``:variant`` suffix, big_vision style:

    python -m mimesis_jax simrl --config configs/mimesis_simrl.py:9b --workdir runs/simrl9b

The command line overrides any leaf with ``--set section.key=value`` (``--set train.steps=10 model.hidden_size=64``).
Values are parsed and type-checked against the dataclass field they land on (int, float, bool, str, Optional,
tuples, dicts, choices); an unknown key, a bad value or a bad variant is a `ConfigError` naming the key or file.

    cfg = load_config("configs/tiny_midtrain.py", ["train.steps=20"])
    cfg.to_dict()                 # JSON-serialisable (stored with every checkpoint)
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import traceback
import types
import typing
from typing import Any, Literal, Sequence

from mimesis_jax.errors import ConfigError
from mimesis_jax.config.sections import RunConfig, validate


def split_variant(arg: str) -> tuple[str, str | None]:
    """'configs/x.py:9b' -> ('configs/x.py', '9b'); 'configs/x.py' -> ('configs/x.py', None)."""
    head, sep, tail = arg.rpartition(":")
    if sep and head.endswith(".py") and tail and "/" not in tail and os.sep not in tail:
        return head, tail
    return arg, None


def config_variants(path: str) -> tuple[str, ...]:
    """The variants a config file offers (its VARIANTS; () for a file without variants)."""
    return tuple(getattr(_import_config_file(split_variant(path)[0]), "VARIANTS", ()))


def load_config(path: str, overrides: Sequence[str] = (), kind: type | tuple = None):
    """Imports `path` (a Python file defining get_config(), optionally `FILE.py:variant`), applies `--set`
    overrides, validates.

    `kind`: the config class(es) expected (default RunConfig, the Stage I training runs; other stages and tools
    pass theirs, e.g. the agent RL stage's config or a gym mixture). A config other than RunConfig is validated
    by its own `validate()` method when it has one."""
    kind = RunConfig if kind is None else kind
    file, variant = split_variant(path)
    module = _import_config_file(file)
    get = getattr(module, "get_config", None)
    if not callable(get):
        raise ConfigError(f"{file}: a config file must define get_config() returning its config")
    variants = tuple(getattr(module, "VARIANTS", ()))
    if variant is None:
        cfg = _call(get, file)
    elif not variants:
        raise ConfigError(f"{file}: has no variants, got ':{variant}' (give the file alone)")
    elif variant not in variants:
        raise ConfigError(f"{file}: unknown variant '{variant}' (valid: {', '.join(variants)})")
    else:
        cfg = _call(get, file, variant)
    if not isinstance(cfg, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ConfigError(f"{path}: get_config() returned {type(cfg).__name__}, expected {names}")
    cfg = apply_overrides(cfg, overrides)
    if isinstance(cfg, RunConfig):
        return validate(cfg)
    check = getattr(cfg, "validate", None)
    return check() if callable(check) else cfg


def _import_config_file(file: str):
    if not os.path.isfile(file):
        raise ConfigError(f"--config {file}: no such file")
    spec = importlib.util.spec_from_file_location(f"_mimesis_config_{abs(hash(os.path.abspath(file)))}", file)
    module = importlib.util.module_from_spec(spec)
    _exec_config_module(spec, module, file)
    return module


def _call(get, file: str, *args):
    """get_config(*args); a ConfigError it raises is named by the file."""
    try:
        return get(*args)
    except ConfigError as e:
        raise ConfigError(f"{file}: {e}") from None


def _exec_config_module(spec, module, path: str) -> None:
    """Runs a config file; its syntax errors and exceptions become one ConfigError naming the file and line."""
    try:
        spec.loader.exec_module(module)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:  # noqa: BLE001 - a user's config file may raise anything; name it in one line
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

