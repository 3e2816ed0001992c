"""`python -m mimesis_jax config`: the resolved run config as JSON."""

from __future__ import annotations

import argparse
import json

from mimesis_jax.config import load_config, to_dict


def add_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--config", required=True)
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE")
    return p


def run(args) -> int:
    print(json.dumps(to_dict(load_config(args.config, args.overrides, kind=object)), indent=2))
    return 0
