"""`python -m mimesis_jax export`: a checkpoint written as a HF model directory."""

from __future__ import annotations

import argparse

from mimesis_jax.train.export import export_hf


def add_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--workdir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--dtype", default="float32", help="float32 (exact) or bfloat16")
    return p


def run(args) -> int:
    export_hf(args.workdir, args.out, args.step, args.dtype)
    return 0
