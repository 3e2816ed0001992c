"""Dense vs blockwise (flash) attention, forward + backward, on packed causal rows.

    python benchmarks/bench_attention.py                          # T = 1K, 2K, 4K, 8K; B=1, H=4, KVH=2, Dh=32
    python benchmarks/bench_attention.py --seqs 2048 8192 --heads 16 --kv-heads 4 --head-dim 256 --block 512
    python benchmarks/bench_attention.py --seqs 24576 32768 --heads 8 --kv-heads 2 --head-dim 256 --memory-only
                                         # Qwen3.5 attention layer shapes per device (tensor 2), memory only

Both backends (mimesis_jax/models/attention.py `attend`, impl="dense" | "blockwise") run value_and_grad of
sum(o * w) with respect to q, k and v on a row packed with `--segments` equal segments (default 4), then report after
compilation:

* memory: XLA's compiled `memory_analysis().temp_size_in_bytes` (temporary buffers; deterministic);
* wall time: best of `--repeats` runs (block_until_ready on every output);

and the ratios dense / blockwise (> 1 means the blockwise backend is cheaper). A dense run whose compiled
temporaries exceed `--max-dense-mib` is not executed (its memory is still reported); the outputs of the two
backends are compared wherever both ran. CPU numbers are only indicative of accelerator ones.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from mimesis_jax.models.attention import attend
from mimesis_jax.models.masks import causal_spec
from mimesis_jax.profiling import fmt_mib, fmt_ms, max_rel_diff, measure


def make_inputs(batch: int, seq: int, heads: int, kv_heads: int, head_dim: int, segments: int, seed: int = 0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(ks[0], (batch, seq, heads, head_dim))
    k = jax.random.normal(ks[1], (batch, seq, kv_heads, head_dim))
    v = jax.random.normal(ks[2], (batch, seq, kv_heads, head_dim))
    w = jax.random.normal(ks[3], (batch, seq, heads, head_dim))
    seg = jnp.broadcast_to(1 + jnp.arange(seq, dtype=jnp.int32) * segments // seq, (batch, seq))  # equal lengths
    return q, k, v, w, seg


def grad_fn(impl: str, block: int):
    def loss(q, k, v, w, seg):
        o = attend(q, k, v, causal_spec(seg), impl=impl, block_q=block, block_k=block)
        return jnp.sum(o * w)
    return jax.value_and_grad(loss, argnums=(0, 1, 2))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--segments", type=int, default=4, help="packed segments per row (1 = one causal sequence)")
    p.add_argument("--block", type=int, default=512, help="attention_block_q = attention_block_k")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--memory-only", action="store_true", help="compile and report memory; run nothing")
    p.add_argument("--max-dense-mib", type=float, default=3072.0,
                   help="do not run a dense case whose compiled temporaries exceed this")
    a = p.parse_args(argv)

    print(f"backend {jax.default_backend()}, B={a.batch} H={a.heads} KVH={a.kv_heads} Dh={a.head_dim} "
          f"block={a.block}, float32, forward+backward, {a.segments} packed segment(s) per row, best of {a.repeats}")
    print(f"{'T':>6}  {'dense time':>12} {'dense temp':>13}  {'blockwise time':>14} {'blockwise temp':>14}  "
          f"{'time d/b':>8} {'temp d/b':>8}  max rel diff")
    for T in a.seqs:
        args = make_inputs(a.batch, T, a.heads, a.kv_heads, a.head_dim, a.segments)
        b = measure(grad_fn("blockwise", a.block), args, a.repeats,
                    max_temp_bytes=0 if a.memory_only else None)
        d = measure(grad_fn("dense", a.block), args, a.repeats,
                    max_temp_bytes=0 if a.memory_only else int(a.max_dense_mib * 2 ** 20))
        t_ratio = "n/a" if d.time is None or b.time is None else f"{d.time / b.time:.2f}x"
        m_ratio = "n/a" if not (d.temp_bytes and b.temp_bytes) else f"{d.temp_bytes / b.temp_bytes:.1f}x"
        diff = "n/a" if d.out is None else f"{max_rel_diff(b.out, d.out):.1e}"
        print(f"{T:6d}  {fmt_ms(d.time):>12} {fmt_mib(d.temp_bytes):>13}  {fmt_ms(b.time):>14} {fmt_mib(b.temp_bytes):>14}  "
              f"{t_ratio:>8} {m_ratio:>8}  {diff}", flush=True)


if __name__ == "__main__":
    main()
