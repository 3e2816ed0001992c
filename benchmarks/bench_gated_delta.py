"""Chunked gated delta rule vs the plain per-token recurrence on one long sequence.

    python benchmarks/bench_gated_delta.py                       # 4,096 tokens, forward and forward+backward
    python benchmarks/bench_gated_delta.py --seq 4096 --heads 32 --dk 128 --dv 128   # Qwen3.5-9B head shapes

Both functions (mimesis_jax/models/gated_delta.py) compute the same map; the script checks that they agree,
then reports for each, after compilation:

* wall time: best of `--repeats` runs (block_until_ready on every output);
* memory: XLA's compiled `memory_analysis()` -- temporary buffers plus outputs (the peak a run needs beyond
  its inputs). For forward+backward this is where the recurrence pays for storing one state per token.

and the ratios recurrent / chunked (> 1 means the chunked form is cheaper). Numbers depend on the backend;
the CPU numbers are only indicative of the accelerator ones.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from mimesis_jax.models.gated_delta import chunk_gated_delta_rule, l2_normalize, recurrent_gated_delta_rule
from mimesis_jax.profiling import fmt_mib, max_rel_diff, measure


def make_inputs(batch: int, seq: int, heads: int, dk: int, dv: int, seed: int = 0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 6)
    q = l2_normalize(jax.random.normal(ks[0], (batch, seq, heads, dk))) * dk ** -0.5
    k = l2_normalize(jax.random.normal(ks[1], (batch, seq, heads, dk)))
    v = jax.random.normal(ks[2], (batch, seq, heads, dv))
    g = -jax.random.uniform(ks[3], (batch, seq, heads), minval=0.001, maxval=0.5)  # a mix of slow and fast decay
    beta = jax.random.uniform(ks[4], (batch, seq, heads), minval=0.1, maxval=1.0)
    w = jax.random.normal(ks[5], (batch, seq, heads, dv))  # cotangent weights for the backward benchmark
    return q, k, v, g, beta, w


def forward_fns(chunk: int):
    return {
        "chunked": lambda q, k, v, g, b: chunk_gated_delta_rule(q, k, v, g, b, chunk_size=chunk),
        "recurrent": lambda q, k, v, g, b: recurrent_gated_delta_rule(q, k, v, g, b),
    }


def backward_fns(chunk: int):
    def with_grad(fn):
        def loss(q, k, v, g, b, w):
            o, S = fn(q, k, v, g, b)
            return jnp.sum(o * w) + jnp.sum(S)
        return jax.grad(loss, argnums=(0, 1, 2, 3, 4))
    return {name: with_grad(fn) for name, fn in forward_fns(chunk).items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dk", type=int, default=64)
    p.add_argument("--dv", type=int, default=64)
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-backward", action="store_true", help="forward only")
    a = p.parse_args(argv)

    q, k, v, g, beta, w = make_inputs(a.batch, a.seq, a.heads, a.dk, a.dv)
    print(f"backend {jax.default_backend()}, B={a.batch} T={a.seq} H={a.heads} Dk={a.dk} Dv={a.dv} "
          f"chunk={a.chunk}, float32, best of {a.repeats}")
    suites = [("forward", forward_fns(a.chunk), (q, k, v, g, beta))]
    if not a.no_backward:
        suites.append(("forward+backward", backward_fns(a.chunk), (q, k, v, g, beta, w)))
    for title, fns, args in suites:
        res = {name: measure(fn, args, a.repeats) for name, fn in fns.items()}
        c, r = res["chunked"], res["recurrent"]
        print(f"\n{title}  (outputs agree to max rel diff {max_rel_diff(c.out, r.out):.1e})")
        for name, m in res.items():
            print(f"  {name:10s} {m.time * 1e3:10.1f} ms   {fmt_mib(m.peak_bytes)}")
        mem_ratio = "n/a" if not (c.peak_bytes and r.peak_bytes) else f"{r.peak_bytes / c.peak_bytes:.2f}x"
        print(f"  recurrent / chunked: time {r.time / c.time:.2f}x, memory {mem_ratio}")


if __name__ == "__main__":
    main()
