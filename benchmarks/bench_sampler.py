"""Sampler throughput: tokens/s at several batch sizes with a tiny model, and the speed-up of KV-cache decoding
over re-running the whole sequence through the model at every step (both measured here, in the same process).

    python benchmarks/bench_sampler.py                          # qwen3, batches 1 8 32, prompt 64, 64 new tokens
    python benchmarks/bench_sampler.py --family qwen3_5_text --batches 1 8 --new-tokens 32

Both paths are compiled once before timing (one fixed shape each) and sample with the same `choose_tokens`; the
baseline keeps a [B, prompt + new] buffer, runs the full model over it every step (causal attention, so the
not-yet-written tail never affects the position read) and reads the logits of one position only. Reported: the
best and median wall time of `--repeats` runs after the warm-up, tokens/s = batch * new tokens / best time.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from mimesis_jax import models
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.rollout import sampler


def tiny_config(family: str, layers: int, hidden: int, vocab: int) -> ModelConfig:
    heads, head_dim = 4, hidden // 4
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=2, head_dim=head_dim, rope_theta=10000.0)
    if family == "qwen3":
        return ModelConfig(model_type="qwen3", **common)
    return ModelConfig(model_type="qwen3_5_text", partial_rotary_factor=0.25, attn_output_gate=True,
                       full_attention_interval=2, layer_types=("linear_attention", "full_attention") * (layers // 2),
                       linear_conv_kernel_dim=4, linear_key_head_dim=head_dim, linear_value_head_dim=head_dim,
                       linear_num_key_heads=2, linear_num_value_heads=4, **common)


@functools.partial(jax.jit, static_argnums=(0, 2))
def full_recompute(config, params, n_new, prompts, key):
    """Baseline: each new token re-runs the model over the whole (fixed-size) sequence buffer."""
    B, P = prompts.shape
    buf = jnp.concatenate([prompts, jnp.zeros((B, n_new), jnp.int32)], axis=1)
    ones = jnp.ones((B,), jnp.float32)

    def step(i, carry):
        buf, key = carry
        h, _ = models.hidden_states(config, params, buf)
        last = jax.lax.dynamic_index_in_dim(h, P + i - 1, axis=1, keepdims=False)
        logits = models.logits_from_hidden(config, params, last)
        keys = jax.random.split(jax.random.fold_in(key, i), B)
        tok, _ = sampler.choose_tokens(logits, keys, ones, jnp.zeros((B,), jnp.int32), ones, False)
        return jax.lax.dynamic_update_slice(buf, tok[:, None], (0, P + i)), key

    buf, _ = jax.lax.fori_loop(0, n_new, step, (buf, key))
    return buf[:, P:]


def timed(fn, repeats: int) -> tuple[float, float]:
    fn()  # compile + warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", choices=("qwen3", "qwen3_5_text"), default="qwen3")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-baseline", action="store_true")
    args = p.parse_args(argv)

    config = tiny_config(args.family, args.layers, args.hidden, args.vocab)
    params = models.init_params(config, jax.random.key(0))
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    print(f"{args.family}: {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}, "
          f"{n_params / 1e6:.2f}M params; prompt {args.prompt_len}, {args.new_tokens} new tokens; backend {jax.default_backend()} "
          f"({jax.device_count()} device(s))")
    bk = sampler.Buckets(min_prompt=args.prompt_len, min_new=args.new_tokens)
    rows = []
    for B in args.batches:
        prompts = np.random.RandomState(B).randint(0, args.vocab, size=(B, args.prompt_len)).astype(np.int32)
        plist = [list(r) for r in prompts]

        def cached():
            out = sampler.generate(config, params, plist, max_new_tokens=args.new_tokens, temperature=1.0, seed=0,
                                   buckets=bk)
            assert all(len(s.tokens) == args.new_tokens for s in out)

        best, med = timed(cached, args.repeats)
        row = {"B": B, "cached_best": best, "cached_med": med, "tok_s": B * args.new_tokens / best}
        if not args.skip_baseline:
            key = jax.random.key(0)
            nb, nm = timed(lambda: jax.block_until_ready(
                full_recompute(config, params, args.new_tokens, jnp.asarray(prompts), key)), args.repeats)
            row.update(naive_best=nb, naive_med=nm, naive_tok_s=B * args.new_tokens / nb, speedup=nb / best)
        rows.append(row)
        print(f"  batch {B:3d}: KV cache {best * 1e3:8.1f} ms (median {med * 1e3:8.1f}) = {row['tok_s']:9.1f} tok/s"
              + ("" if args.skip_baseline else
                 f" | full recompute {row['naive_best'] * 1e3:8.1f} ms = {row['naive_tok_s']:9.1f} tok/s"
                 f" | speed-up x{row['speedup']:.2f}"), flush=True)
    base = rows[0]["tok_s"]
    print("throughput relative to batch %d: %s" % (rows[0]["B"], ", ".join(
        f"B={r['B']}: x{r['tok_s'] / base:.2f}" for r in rows)))
    return rows


if __name__ == "__main__":
    main()
