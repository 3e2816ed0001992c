"""The package's one named error type, at the bottom of the import graph so that every layer can raise it.

`ConfigError` (a ValueError) is what a bad configuration value raises: a model config key (models/config.py), a
run config key (config/checks.py `need`), a flag of a command. Its message is one line naming the key or flag; the
command line prints it as ``error: <message>`` and exits with status 2. This module imports nothing of the
package, so models/ (below config/) and config/ both import it from here; `mimesis_jax.config.ConfigError` is the
same class.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad configuration value; the message names the key or flag."""
