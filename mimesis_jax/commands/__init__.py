"""The `python -m mimesis_jax` command modules, one per command and named after it (train.py: the four training
stages; show_config.py: `config`). Each exposes `add_args(parser)` and `run(args)`; cli.py's COMMANDS table imports
them (the rule: docs/package-map.md, "Command modules")."""
