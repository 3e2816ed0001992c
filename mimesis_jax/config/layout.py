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
