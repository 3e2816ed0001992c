"""Config values to and from plain dicts (what is stored with every checkpoint)."""

from __future__ import annotations

import dataclasses
from typing import Any

from mimesis_jax.models.config import model_from_dict  # noqa: F401 (re-exported: config.model_from_dict)


def to_dict(x) -> Any:
    """Dataclasses -> dicts, tuples -> lists, recursively (JSON-serialisable)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: to_dict(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, (list, tuple)):
        return [to_dict(v) for v in x]
    if isinstance(x, dict):
        return {str(k): to_dict(v) for k, v in x.items()}
    return x


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
