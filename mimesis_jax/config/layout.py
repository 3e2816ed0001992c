"""`rollout.mesh` read from its text: the rollout layout's axes (sharding.py builds the mesh from them). Here,
beside the config checks, so that config/ validates the key without importing the sharding code."""

from __future__ import annotations

from mimesis_jax.errors import ConfigError

ROLLOUT_AXES = {"replica": "data", "tensor": "tensor"}
_LAYOUT_FORM = "'replica=R,tensor=T' (ints >= 1, one of them may be left out to take the rest of the devices)"


def rollout_layout(text: str) -> dict[str, int] | None:
    """`rollout.mesh` parsed: None for "" (decode in the training layout), else {"replica": R, "tensor": T}, -1
    for an axis left out (it takes the devices the other leaves: `layout_axes`). ConfigError naming the key for
    anything else."""
    if not text:
        return None
    out: dict[str, int] = {}
    for part in str(text).split(","):
        name, eq, size = (s.strip() for s in part.partition("="))
        if name not in ROLLOUT_AXES or name in out or not eq or not size.isdigit() or int(size) < 1:
            raise ConfigError(f"config key 'rollout.mesh': expected {_LAYOUT_FORM} or '' (the training layout) "
                              f"(got {text!r})")
        out[name] = int(size)
    return {a: out.get(a, -1) for a in ROLLOUT_AXES}


def engine_layout(tensor: int) -> dict[str, int]:
    """The rollout engine's layout where `rollout.mesh` is unset: the training mesh's tensor split kept and every
    other device a data-parallel replica (fsdp 1), so each replica decodes with a whole tensor-parallel copy of the
    weights, synced once per policy update, instead of gathering them from the fsdp shards in every program
    (docs/engine.md, "On a mesh")."""
    return {"replica": -1, "tensor": max(1, int(tensor))}


def decode_layout(text: str, engine: bool, tensor: int) -> dict[str, int] | None:
    """The layout decode runs in: `rollout.mesh` parsed (`rollout_layout`) where it is set; else, with
    `rollout.engine`, `engine_layout(tensor)` (tensor: the training mesh's tensor axis); else None (the static
    sampler in the training layout)."""
    layout = rollout_layout(text)
    if layout is None and engine:
        return engine_layout(tensor)
    return layout


def layout_text(layout: dict[str, int] | None) -> str:
    """A layout as `rollout.mesh` would spell it ("" for None; an axis left to take the rest is left out)."""
    return "" if layout is None else ",".join(f"{a}={v}" for a, v in layout.items() if v != -1)
