"""The one validation helper of every run config.

    need(cfg.train.steps >= 1, "train.steps", "must be >= 1", within=cfg)
    # ConfigError: config key 'train.steps': must be >= 1 (got -5)

`ConfigError` (a ValueError, defined in mimesis_jax/errors.py) is the only error config validation raises; its
message is one line naming the full dotted key. The command line prints it as ``error: <message>`` and exits with status 2.
"""

from __future__ import annotations

from mimesis_jax.errors import ConfigError

__all__ = ["need", "lookup"]

_UNSET = object()


def lookup(obj, key: str):
    """The value at dotted `key` under `obj` (None where a part is missing)."""
    for part in key.split("."):
        if part:
            obj = getattr(obj, part, None)
    return obj


def need(ok, key: str, msg: str, *, within=None, got=_UNSET, what: str = "config key") -> None:
    """Raises ConfigError("config key 'KEY': MSG (got VALUE)") unless `ok`.

    The value shown is `got`, else the value at `key` under `within` (a run config), else none is shown. `what`
    names a section checked on its own (RLConfig's fields: "RLConfig key 'alpha'")."""
    if ok:
        return
    if got is _UNSET and within is not None:
        got = lookup(within, key)
    tail = "" if got is _UNSET else f" (got {got!r})"
    raise ConfigError(f"{what} '{key}': {msg}{tail}")
