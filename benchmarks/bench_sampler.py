"""Sampler steady-state decode against a minimal jitted decode loop written here (issue #25 item 9).

    python benchmarks/bench_sampler.py                              # tiny Qwen3, V=151,936, 16 x 64 new tokens
    python benchmarks/bench_sampler.py --top-k 50 --top-p 0.95      # with top-k / top-p filtering
    python benchmarks/bench_sampler.py --temperature 0              # greedy

The model is a tiny Qwen3 (2 layers, hidden 64) with the real Qwen3 vocabulary (151,936), so the LM head and
the sampling over V dominate a decode step as they do at scale. Two paths decode the same prompts with the same
parameters and the same sampling rule (logits / T, top-k, top-p, a Gumbel-max draw with key
fold_in(fold_in(key(seed), row), step), the log-prob at T):

* **sampler**: `rollout.sampler.generate`, the static sampler the RL loops use. Its steady-state decode per token is
  (time(max_new_tokens = N) - time(max_new_tokens = 1)) / (N - 1): both calls run the same compiled bucket (same
  cache length), the second stops right after the prefill, so the difference is N - 1 decode steps and nothing else
  (host preparation, transfers and the prefill cancel out).
* **reference**: a plain decode loop written in this file (its own [L, B, S, KVH, Dh] KV cache in a
  `lax.fori_loop` carry, a Python loop over the layers, the Qwen3 layer math spelt out, no masks beyond
  "slot < filled"), jitted, timed for the same N - 1 decode steps after its own prefill. It keeps each token's
  log-prob as the sampler does (the RL loops need them; a loop that discarded them would let XLA skip the
  log-softmax over V every step and time less work).

Rounds alternate the two paths (the machine may be shared: each path's best round is reported) and the printed
ratio is sampler / reference (goal <= 1.1), in wall time and in this process's CPU time (steadier under load).
`--reference-argmax first` gives the reference the sampler's `first_argmax` (same tokens) to compare the rest of
the step like for like; the default reference uses jnp.argmax / jax.random.categorical as a plain loop would. As
a check that the two paths compute the same thing, the fraction of generated tokens on which they agree is
printed (1.0 up to rare float ties between the two implementations), with the largest log-prob difference on the
agreeing tokens.

`--count-compiles` also prints the XLA compilations (`profiling.count_compilations`) of the warm-up and of each
round, per path: the sampler's two calls and the reference. After the warm-up every round should compile nothing
(the same bucket and the same reference programs); a round that does names the programs it compiled.
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from mimesis_jax import models
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.profiling import count_compilations
from mimesis_jax.inference import sampler


def tiny_qwen3(layers: int, hidden: int, vocab: int) -> ModelConfig:
    return ModelConfig(model_type="qwen3", vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                       rope_theta=10000.0)


# ----------------------------------------------------------------------------- the reference decode loop
def _rms(x, w, eps):
    return w * (x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps))


def _rope(x, pos, theta):
    """Rotate-half RoPE of x [B, T, H, Dh] at integer positions [B, T]."""
    dh = x.shape[-1]
    inv = 1.0 / (theta ** (jnp.arange(0, dh, 2, dtype=jnp.float32) / dh))
    ang = pos.astype(jnp.float32)[..., None] * inv
    cos, sin = jnp.cos(ang)[:, :, None], jnp.sin(ang)[:, :, None]
    x1, x2 = x[..., : dh // 2], x[..., dh // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _layer_step(cfg, lp, x, kc, vc, pos, start, filled):
    """One Qwen3 layer on x [B, T, D] at positions pos [B, T]; writes K/V at slot `start` of kc/vc [B, S, KVH, Dh]
    and attends causally over the slots < filled (+ the query's own offset)."""
    eps = cfg.rms_norm_eps
    B, T, _ = x.shape
    H, KVH, Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    a = lp["attn"]
    h = _rms(x, lp["input_norm"], eps)
    q = _rope(_rms(jnp.einsum("btd,dhk->bthk", h, a["q"]), a["q_norm"], eps), pos, cfg.rope_theta)
    k = _rope(_rms(jnp.einsum("btd,dhk->bthk", h, a["k"]), a["k_norm"], eps), pos, cfg.rope_theta)
    v = jnp.einsum("btd,dhk->bthk", h, a["v"])
    kc = jax.lax.dynamic_update_slice(kc, k, (0, start, 0, 0))
    vc = jax.lax.dynamic_update_slice(vc, v, (0, start, 0, 0))
    S = kc.shape[1]
    qg = q.reshape(B, T, KVH, H // KVH, Dh)
    s = jnp.einsum("btkgd,bskd->bkgts", qg, kc) * (Dh ** -0.5)
    visible = jnp.arange(S)[None, :] <= (start + jnp.arange(T))[:, None]  # [T, S]
    s = jnp.where(visible, s, -jnp.inf)
    o = jnp.einsum("bkgts,bskd->btkgd", jax.nn.softmax(s, axis=-1), vc).reshape(B, T, H, Dh)
    x = x + jnp.einsum("bthk,hkd->btd", o, a["o"])
    h = _rms(x, lp["post_norm"], eps)
    m = lp["mlp"]
    x = x + jnp.einsum("bti,id->btd", jax.nn.silu(h @ m["gate"]) * (h @ m["up"]), m["down"])
    return x, kc, vc


def _forward(cfg, params, cache, tokens, pos, start):
    x = params["embed"][tokens]
    ks, vs = [], []
    for i in range(cfg.num_hidden_layers):
        lp = jax.tree.map(lambda w: w[i], params["layers"])
        x, kc, vc = _layer_step(cfg, lp, x, cache[0][i], cache[1][i], pos, start, None)
        ks.append(kc)
        vs.append(vc)
    x = _rms(x[:, -1], params["final_norm"], cfg.rms_norm_eps)
    head = params["embed"] if cfg.tie_word_embeddings else params["lm_head"]
    return x @ head.T, (jnp.stack(ks), jnp.stack(vs))


def _sample(logits, row_keys, step, temperature, top_k, top_p, argmax="jnp"):
    """The sampler's rule, written out: greedy at T = 0; else logits / T, top-k, top-p (ties kept), Gumbel-max
    (`jax.random.categorical`, as a plain loop writes it). argmax="first" takes every argmax over V with the
    sampler's `first_argmax` instead (same tokens), to compare the rest of the step like for like."""
    lpt = temperature if temperature > 0 else 1.0
    lp_all = jax.nn.log_softmax(logits / lpt, axis=-1)
    if temperature <= 0:
        tok = jnp.argmax(logits, axis=-1) if argmax == "jnp" else sampler.first_argmax(logits)
    else:
        scaled = logits / temperature
        if top_k > 0 or top_p < 1.0:
            k = top_k if top_k > 0 else logits.shape[-1]
            cand = jax.lax.top_k(scaled, k)[0]
            probs = jax.nn.softmax(cand, axis=-1)
            n_keep = jnp.maximum(jnp.sum((jnp.cumsum(probs, -1) - probs) < top_p, -1), 1) if top_p < 1.0 else k
            thr = jnp.take_along_axis(cand, jnp.broadcast_to(n_keep - 1, (cand.shape[0],))[:, None], axis=-1)
            scaled = jnp.where(scaled >= thr, scaled, -jnp.inf)
        keys = jax.vmap(lambda kk: jax.random.fold_in(kk, step))(row_keys)
        if argmax == "jnp":
            tok = jax.vmap(jax.random.categorical)(keys, scaled)
        else:
            tok = sampler.first_argmax(jax.vmap(lambda kk: jax.random.gumbel(kk, scaled.shape[-1:]))(keys) + scaled)
    tok = tok.astype(jnp.int32)
    return tok, jnp.take_along_axis(lp_all, tok[:, None], axis=-1)[:, 0]


@functools.partial(jax.jit, static_argnums=(0, 3, 4, 5, 6, 8))
def reference_prefill(cfg, params, prompts, n_new, temperature, top_k, top_p, seed, argmax):
    B, P = prompts.shape
    shape = (cfg.num_hidden_layers, B, P + n_new, cfg.num_key_value_heads, cfg.head_dim)
    cache = (jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32))
    row_keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.key(seed), r))(jnp.arange(B, dtype=jnp.uint32))
    pos = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
    logits, cache = _forward(cfg, params, cache, prompts, pos, 0)
    tok, lp = _sample(logits, row_keys, 0, temperature, top_k, top_p, argmax)
    return tok, lp, cache, row_keys


@functools.partial(jax.jit, static_argnums=(0, 6, 7, 8, 9, 10))
def reference_decode(cfg, params, tok, cache, row_keys, P, n_new, temperature, top_k, top_p, argmax):
    """Decode steps 1..n_new-1 after the prefill (the token of step 0 is `tok`); returns the tokens and their
    log-probs [B, n_new] (step 0's left 0): the sampler returns both, and a loop that dropped the log-probs would
    let XLA drop their log-softmax over V from every step."""
    B = tok.shape[0]
    out = jnp.zeros((B, n_new), jnp.int32).at[:, 0].set(tok)
    out_lp = jnp.zeros((B, n_new), jnp.float32)

    def body(i, carry):
        tok, cache, out, out_lp = carry
        pos = jnp.full((B, 1), P + i - 1, jnp.int32)
        logits, cache = _forward(cfg, params, cache, tok[:, None], pos, P + i - 1)
        tok, lp = _sample(logits, row_keys, i, temperature, top_k, top_p, argmax)
        return tok, cache, out.at[:, i].set(tok), out_lp.at[:, i].set(lp)

    _, _, out, out_lp = jax.lax.fori_loop(1, n_new, body, (tok, cache, out, out_lp))
    return out, out_lp


# ------------------------------------------------------------------------------------------- timing
def _compiled(c) -> str:
    """`count_compilations`' count, with the programs' names when there are any."""
    return f"{c.count}" + (f" ({', '.join(c.names)})" if c.count else "")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reference-argmax", choices=("jnp", "first"), default="jnp",
                   help="the reference's argmax over V: jnp.argmax / jax.random.categorical (a plain loop), or the "
                        "sampler's first_argmax (same tokens; compares the rest of the step like for like)")
    p.add_argument("--count-compiles", action="store_true",
                   help="also print the XLA compilations of the warm-up and of each round, per path (none expected "
                        "after the warm-up)")
    args = p.parse_args(argv)

    cfg = tiny_qwen3(args.layers, args.hidden, args.vocab)
    params = models.init_params(cfg, jax.random.key(0))
    B, P, N = args.batch, args.prompt_len, args.new_tokens
    prompts = np.random.RandomState(0).randint(0, args.vocab, size=(B, P)).astype(np.int32)
    plist = [list(r) for r in prompts]
    bk = sampler.Buckets(min_prompt=P, min_new=N)
    samp = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, buckets=bk)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    print(f"qwen3 {args.layers} layers, hidden {args.hidden}, vocab {args.vocab} ({n_params / 1e6:.1f}M params); "
          f"{B} sequences x {N} new tokens after a {P}-token prompt; T={args.temperature} top_k={args.top_k} "
          f"top_p={args.top_p}; backend {jax.default_backend()}", flush=True)

    def run_sampler(n):
        t0, c0 = time.perf_counter(), time.process_time()
        out = sampler.generate(cfg, params, plist, max_new_tokens=n, **samp)
        return (time.perf_counter() - t0, time.process_time() - c0), out

    jprompts = jnp.asarray(prompts)
    static = (N, args.temperature, args.top_k, args.top_p)

    def run_reference():
        tok, _, cache, keys = jax.block_until_ready(reference_prefill(cfg, params, jprompts, *static, args.seed,
                                                                      args.reference_argmax))
        t0, c0 = time.perf_counter(), time.process_time()
        out, lp = jax.block_until_ready(reference_decode(cfg, params, tok, cache, keys, P, *static,
                                                         args.reference_argmax))
        return (time.perf_counter() - t0, time.process_time() - c0), (np.asarray(out), np.asarray(lp))

    with count_compilations() as warm:
        t_first, _ = run_sampler(N)
        run_sampler(1)
        run_reference()
    print(f"warm-up (compiles the sampler's bucket program and the reference's two): first sampler call "
          f"{t_first[0]:.2f} s"
          + (f"; compilations: {_compiled(warm)}" if args.count_compiles else ""), flush=True)
    full, short, ref, agree, lp_gap, compiles = [], [], [], [], [], []
    for r in range(args.rounds):
        with count_compilations() as c_samp:
            tf, out = run_sampler(N)
            ts, _ = run_sampler(1)
        with count_compilations() as c_ref:
            tr, (ref_tok, ref_lp) = run_reference()
        compiles.append((c_samp.count, c_ref.count))
        full.append(tf)
        short.append(ts)
        ref.append(tr)
        tf, ts, tr = tf[0], ts[0], tr[0]
        toks = np.array([s.tokens for s in out])
        agree.append(float(np.mean(toks == ref_tok)))
        same = (toks == ref_tok)[:, 1:]  # decode steps whose tokens agree: their log-probs must too
        lp_gap.append(float(np.max(np.abs(np.array([s.logprobs for s in out])[:, 1:] - ref_lp[:, 1:])[same],
                                   initial=0.0)))
        print(f"  round {r + 1}: sampler {N} tokens {tf * 1e3:7.1f} ms, 1 token {ts * 1e3:6.1f} ms "
              f"-> decode {(tf - ts) / (N - 1) * 1e3:6.2f} ms/step | reference decode "
              f"{tr / (N - 1) * 1e3:6.2f} ms/step"
              + (f" | compilations: sampler {_compiled(c_samp)}, reference {_compiled(c_ref)}"
                 if args.count_compiles else ""), flush=True)
    # best round of each path; the sampler's decode is the difference of its two best calls (wall clock, and the
    # CPU seconds of this process, which a shared machine's other load disturbs less)
    samp_step = (min(t[0] for t in full) - min(t[0] for t in short)) / (N - 1)
    ref_step = min(t[0] for t in ref) / (N - 1)
    cpu_ratio = (min(t[1] for t in full) - min(t[1] for t in short)) / min(t[1] for t in ref)
    print(f"sampler steady-state decode: {samp_step * 1e3:.2f} ms/step = {samp_step / B * 1e3:.3f} ms/token "
          f"({B / samp_step:.0f} tok/s); whole call {min(t[0] for t in full) / N / B * 1e3:.3f} ms/token")
    print(f"reference fori_loop decode ({args.reference_argmax} argmax):  {ref_step * 1e3:.2f} ms/step = "
          f"{ref_step / B * 1e3:.3f} ms/token ({B / ref_step:.0f} tok/s)")
    print(f"ratio sampler / reference: {samp_step / ref_step:.3f} wall, {cpu_ratio:.3f} CPU time  (goal <= 1.1); "
          f"tokens agreeing with the reference: {min(agree):.3f}, their log-probs within {max(lp_gap):.1e}")
    return {"sampler_step": samp_step, "reference_step": ref_step, "ratio": samp_step / ref_step,
            "cpu_ratio": cpu_ratio, "agree": min(agree), "logprob_gap": max(lp_gap), "warmup_compiles": warm.count,
            "compiles": compiles}


if __name__ == "__main__":
    main()
