"""The three generators behind the generation protocol side by side (issue #45 item 5): decode tokens/s and the
weight sync's seconds per step of the vLLM generator, the paged rollout engine and the static sampler, on the same
model, prompts, seeds and max_tokens, in one run.

    python benchmarks/bench_generators.py                  # a tiny fp32 Qwen3 with head_dim 32 (CPU, about a minute)
    python benchmarks/bench_generators.py --batch 32 --new-tokens 64 --vllm-python /path/to/env/bin/python

The model is a tiny random Qwen3 (models.init_params) with head_dim 32 (vLLM's CPU attention takes 32-512), fp32
on every path. Each generator is built from the same parameters, runs the workload once untimed (compilation,
vLLM's CUDA-graph / kernel warm-up), then --repeats timed calls; the best counts. Tokens/s = generated tokens /
wall time of one `generate` call over all prompts (their prefill included: the same work on every path); stop ids
are off, so every request makes exactly --new-tokens tokens. Sync s/step = the best of --syncs `set_params` calls
with other weights (another init seed), as the RL loop makes after each update: for the two JAX generators that
is handing over the learner's arrays in the same process (the engine also drops its cached dialogues); for vLLM it
is the bucketed transfer over tmpfs into the child and vLLM's in-place reload (inference/vllm_generator.py). Ratios
are against the static sampler. Without the vLLM environment (scripts/vllm_env.sh; --vllm-python names another
interpreter) its row is skipped, and a line says why.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

from mimesis_jax import models
from mimesis_jax.errors import ConfigError
from mimesis_jax.inference.engine_requests import EngineConfig
from mimesis_jax.inference.generators import EngineGenerator, StaticGenerator
from mimesis_jax.inference.protocol import Sampling
from mimesis_jax.inference.vllm_generator import DEFAULT_PYTHON, VLLMGenerator, resolve_python
from mimesis_jax.models.config import ModelConfig

PATHS = ("static", "engine", "vllm")


def tiny_config() -> ModelConfig:
    """A tiny fp32 Qwen3 with head_dim 32, the smallest vLLM's CPU attention takes."""
    return ModelConfig(model_type="qwen3", vocab_size=1024, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                       rope_theta=10_000.0, initializer_range=0.2, max_position_embeddings=256, dtype="float32",
                       param_dtype="float32")


def make_prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.RandomState(seed)
    return [rng.randint(1, vocab, size=rng.randint(lo, hi + 1)).tolist() for _ in range(n)]


def vllm_skip_reason(python: str | None) -> str | None:
    """Why the vLLM row cannot run (no interpreter there, or one without vllm), else None."""
    try:
        path = resolve_python(python)
    except ConfigError as e:
        return str(e)
    import subprocess

    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    if subprocess.run([path, "-c", probe], capture_output=True).returncode != 0:
        return f"{path} does not import vllm (scripts/vllm_env.sh builds an environment that does)"
    return None


def build(path: str, config, params, args):
    if path == "static":
        return StaticGenerator(config, params, stop_ids=(), seed=args.seed)
    if path == "engine":
        pages = -(-(args.prompt_max + args.new_tokens) // args.page_size)
        ec = EngineConfig(slots=args.batch, page_size=args.page_size, num_pages=args.batch * pages + 1,
                          max_pages_per_seq=pages, prefill_chunk=args.prefill_chunk, prefill_rows=args.batch)
        return EngineGenerator(config, params, ec, stop_ids=(), seed=args.seed)
    return VLLMGenerator(config, params, stop_ids=[], seed=args.seed, python=args.vllm_python,
                         max_model_len=args.prompt_max + args.new_tokens, kv_cache_bytes=64 << 20,
                         max_num_seqs=args.batch)


def measure(path: str, config, params, other, prompts, args) -> dict:
    """Build `path`'s generator, warm it up, time --repeats generate calls and --syncs set_params calls."""
    seeds = [Sampling(max_tokens=args.new_tokens, temperature=1.0, seed=1000 + i) for i in range(len(prompts))]
    t0 = time.perf_counter()
    gen = build(path, config, params, args)
    try:
        gen.generate(prompts, seeds)  # warm-up: compiles (JAX) or warms vLLM's kernels
        start_s = time.perf_counter() - t0
        best, out = float("inf"), None
        for _ in range(args.repeats):
            t1 = time.perf_counter()
            out = gen.generate(prompts, seeds)
            best = min(best, time.perf_counter() - t1)
        sync = float("inf")
        for i in range(args.syncs):  # alternate the weights so that every sync changes them
            t1 = time.perf_counter()
            gen.set_params(other if i % 2 == 0 else params, version=i + 1)
            sync = min(sync, time.perf_counter() - t1)
        extra = dict(gen.last_sync) if path == "vllm" else {}
    finally:
        if path == "vllm":
            gen.close()
    generated = sum(len(s.tokens) for s in out)
    return {"wall_s": best, "start_s": start_s, "generated": generated, "tok_s": generated / best,
            "sync_s": sync, "tokens": [s.tokens for s in out], **extra}


def table(rows: dict, skipped: dict) -> list[str]:
    base = rows["static"]
    lines = [f"{'generator':8s} {'tok/s':>9s} {'x static':>9s} {'sync s/step':>12s} {'start s':>8s} "
             f"{'generated':>9s}"]
    for path in PATHS:
        if path in skipped:
            lines.append(f"{path:8s} skipped: {skipped[path]}")
            continue
        r = rows[path]
        lines.append(f"{path:8s} {r['tok_s']:9.1f} {r['tok_s'] / base['tok_s']:8.2f}x {r['sync_s']:12.6f} "
                     f"{r['start_s']:8.1f} {r['generated']:9d}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=16, help="prompts per generate call")
    ap.add_argument("--prompt-min", type=int, default=24)
    ap.add_argument("--prompt-max", type=int, default=48)
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens per request (stop ids off)")
    ap.add_argument("--page-size", type=int, default=16, help="the engine's page size")
    ap.add_argument("--prefill-chunk", type=int, default=64, help="the engine's prefill chunk")
    ap.add_argument("--repeats", type=int, default=3, help="timed generate calls per path (best counts)")
    ap.add_argument("--syncs", type=int, default=3, help="timed set_params calls per path (best counts)")
    ap.add_argument("--vllm-python", default=None, help=f"the vLLM environment's Python (default {DEFAULT_PYTHON})")
    ap.add_argument("--paths", default=",".join(PATHS), help="which generators, comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the numbers to this file")
    args = ap.parse_args(argv)
    for k in ("batch", "prompt_min", "new_tokens", "page_size", "prefill_chunk", "repeats", "syncs"):
        if getattr(args, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1, got {getattr(args, k)}")
    if args.prompt_max < args.prompt_min:
        ap.error(f"--prompt-max ({args.prompt_max}) must be >= --prompt-min ({args.prompt_min})")
    paths = [p for p in args.paths.split(",") if p]
    if "static" not in paths or set(paths) - set(PATHS):
        ap.error(f"--paths takes {','.join(PATHS)} and must include static (the ratios' base), got {args.paths!r}")

    config = tiny_config()
    params = models.init_params(config, jax.random.key(args.seed))
    other = models.init_params(config, jax.random.key(args.seed + 1))
    prompts = make_prompts(args.batch, args.prompt_min, args.prompt_max, config.vocab_size, args.seed)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    print(f"model: qwen3 {n_params / 1e6:.2f}M params, head_dim {config.head_dim}, fp32; batch {args.batch}, "
          f"prompts {args.prompt_min}-{args.prompt_max} tokens, {args.new_tokens} new tokens each; "
          f"jax {jax.default_backend()}", flush=True)
    skipped = {p: "not asked for (--paths)" for p in PATHS if p not in paths}
    if "vllm" in paths:
        reason = vllm_skip_reason(args.vllm_python)
        if reason:
            skipped["vllm"] = reason
            print(f"vllm row skipped: {reason}", flush=True)
    rows = {}
    for path in PATHS:
        if path not in skipped:
            rows[path] = measure(path, config, params, other, prompts, args)
            print(f"{path}: done", flush=True)
    for line in table(rows, skipped):
        print(line)
    if "engine" in rows:
        same = sum(a == b for a, b in zip(rows["engine"]["tokens"], rows["static"]["tokens"]))
        print(f"identical samples, engine vs static: {same}/{args.batch}")
    if "vllm" in rows:
        v = rows["vllm"]
        print(f"vllm sync: {v['bytes']} bytes in {v['buckets']} bucket(s), {v['tensors']} tensors, vLLM's reload "
              f"{v['reload_seconds']:.4f} s of the last one")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": {p: {k: v for k, v in r.items() if k != "tokens"} for p, r in rows.items()},
                       "skipped": skipped, "batch": args.batch, "new_tokens": args.new_tokens,
                       "params": n_params}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
