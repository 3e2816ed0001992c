"""The `python -m mimesis_jax` commands that have no home module of their own (training stages, export, config,
demo). Every command module, here or elsewhere, exposes `add_args(parser)` and `run(args)`; cli.py's COMMANDS
table names them."""
