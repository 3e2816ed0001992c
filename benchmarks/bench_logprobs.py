"""Memory-safe log-probs vs the full-logits path at a real Qwen3 vocabulary (151,936).

Prints compiled peak scratch memory (XLA memory_analysis temp bytes) and best-of-N wall time for
  (a) full logits:  log_softmax(h @ W.T) gathered at the targets, value and gradient;
  (b) chunked:      algorithms.logprobs (sequence x vocab chunks, custom VJP), value and gradient;
and the ratios (a)/(b). Both run in this process on the same inputs; only ratios are meaningful on a noisy machine.

    python benchmarks/bench_logprobs.py [--batch 1 --seq 512 --hidden 128 --vocab 151936]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from mimesis_jax.algorithms.logprobs import chunked_logsumexp
from mimesis_jax.profiling import max_rel_diff, measure


def full_path(h, W, targets):
    logits = jnp.einsum("btd,vd->btv", h, W, preferred_element_type=jnp.float32)
    lp = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), targets[..., None], -1)[..., 0]
    return lp.sum()


def chunked_path(seq_chunk, vocab_chunk):
    def f(h, W, targets):
        tgt = jnp.einsum("btd,btd->bt", h, jnp.take(W, targets, axis=0), preferred_element_type=jnp.float32)
        return (tgt - chunked_logsumexp(h, W, seq_chunk, vocab_chunk)).sum()
    return f


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--seq-chunk", type=int, default=256)
    ap.add_argument("--vocab-chunk", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    rng = np.random.RandomState(0)
    h = jnp.asarray(rng.randn(a.batch, a.seq, a.hidden).astype(np.float32))
    W = jnp.asarray(0.05 * rng.randn(a.vocab, a.hidden).astype(np.float32))
    t = jnp.asarray(rng.randint(0, a.vocab, (a.batch, a.seq)).astype(np.int32))
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; B={a.batch} T={a.seq} D={a.hidden} V={a.vocab} "
          f"chunks: seq {a.seq_chunk} x vocab {a.vocab_chunk}")
    full = measure(jax.value_and_grad(full_path, argnums=(0, 1)), (h, W, t), a.repeats)
    chunked = measure(jax.value_and_grad(chunked_path(a.seq_chunk, a.vocab_chunk), argnums=(0, 1)), (h, W, t),
                      a.repeats)
    mf, tf, (vf, gf) = full.temp_bytes, full.time, full.out
    mc, tc, (vc, gc) = chunked.temp_bytes, chunked.time, chunked.out
    logits_bytes = a.batch * a.seq * a.vocab * 4
    print(f"{'path':<10}{'peak scratch MiB':>18}{'time s':>10}")
    print(f"{'full':<10}{mf / 2**20:>18.1f}{tf:>10.3f}")
    print(f"{'chunked':<10}{mc / 2**20:>18.1f}{tc:>10.3f}")
    print(f"memory ratio full/chunked = {mf / mc:.1f}x   time ratio full/chunked = {tf / tc:.2f}x   "
          f"(one fp32 [B,T,V] logits tensor = {logits_bytes / 2**20:.1f} MiB)")
    dv = abs(float(vf) - float(vc)) / abs(float(vf))
    dg = max_rel_diff(gc, gf)
    print(f"agreement: |value| rel {dv:.1e}, max grad rel {dg:.1e}")


if __name__ == "__main__":
    main()
