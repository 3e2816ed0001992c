"""Decode throughput of the rollout engine at batch 64 (inference/engine.py), against today's `sampler.generate` over
the same prompts in the same process (issue #16 item 7; run on an accelerator by scripts/device_figures.sh).

    python benchmarks/bench_engine_decode.py                     # the ~1B Qwen3 of configs/qwen3_1b_device.py, bf16
    python benchmarks/bench_engine_decode.py --tiny              # a tiny fp32 Qwen3 on a CPU (smoke run, seconds)
    python benchmarks/bench_engine_decode.py --config configs/qwen3_8b_agentrl.py:grpo --new-tokens 128

Workload (seeded, identical for both paths): --batch prompts of random token ids, lengths uniform in
[--prompt-min, --prompt-max] (a system prompt, a task and a few turns: 600-1,000 tokens by default), each
continued by exactly --new-tokens tokens (no stop id), sampled at temperature 1 with one seed per request (the
engine and the sampler then draw the same tokens, up to the rounding of their different attention paths; the
count of identical samples is printed). Random weights (models.init_params): throughput depends on shapes only.
The parameters are fp32 master weights with the config's compute dtype (train.dtype), as the RL loop hands them to
its engine.

* engine: `RolloutEngine` with `EngineConfig(slots=batch, ...)` (every request decodes at once) and a page pool
  that holds every prompt + its new tokens; one `generate_tokens` call with a dialogue key per prompt, as the RL
  runner calls it. Prefill rounds of --prefill-rows 16 x --prefill-chunk 512 tokens (the RL loop's engine keeps
  EngineConfig's defaults, 4 x 64, which take ~200 rounds for 64 prompts of ~800 tokens: pass those flags to see
  that), decode bursts of --decode-steps 32. Also its decode alone: a call with max_tokens=1 prefills the prompts
  (dialogues kept), then a timed call continuing the same keys (a one-token suffix each) decodes --new-tokens - 1
  tokens per request.
* baseline: one `sampler.generate` call over the same prompts (prompts padded to their bucket, one static
  prefill + decode program).

Compilation is excluded: each path runs the whole workload once untimed (the warm-up compiles every program the
timed run uses; the engine's `warmup()` is not called: it would also compile page-table widths this workload never
reaches), then --repeats timed runs; the best is reported. Tokens/s = generated tokens / wall time of the call (the
prompts' prefill included: the same work on both paths). Slot use = the engine's slot-steps that produced a token /
slot-steps run. The last line is parsed by scripts/device_figures.sh and tests/test_device_script.py:

    engine decode: N tok/s at batch 64 (sampler.generate: M tok/s, ratio R.RRx; decode only D tok/s; slot use U%)
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
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.inference import sampler
from mimesis_jax.inference.engine import EngineConfig, RolloutEngine

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "qwen3_1b_device.py")


def tiny_config() -> ModelConfig:
    """A tiny fp32 Qwen3 (CPU smoke runs): fp32 so that the engine and the sampler draw identical tokens."""
    return ModelConfig(model_type="qwen3", vocab_size=1024, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       rope_theta=10_000.0, initializer_range=0.2)


def model_config(args) -> ModelConfig:
    if args.tiny:
        return tiny_config()
    from mimesis_jax import config as config_lib

    cfg = config_lib.load_config(args.config, args.overrides, kind=object)
    if not callable(getattr(cfg, "runtime_model", None)):
        raise ConfigError(f"{args.config}: needs a config with a model (runtime_model()); got {type(cfg).__name__}")
    mc = cfg.runtime_model()
    return mc.replace(remat="none")  # decoding keeps no activations for a backward


def make_prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.RandomState(seed)
    return [rng.randint(1, vocab, size=rng.randint(lo, hi + 1)).tolist() for _ in range(n)]


def timed(fn, repeats: int):
    """(best seconds of `repeats` calls, the last result); the caller has already run `fn` once untimed."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run_engine(config, params, prompts, seeds, args) -> dict:
    n, N = len(prompts), args.new_tokens
    pages_per_seq = -(-(max(map(len, prompts)) + N) // args.page_size)
    ec = EngineConfig(slots=args.batch, page_size=args.page_size, num_pages=n * pages_per_seq + 1,
                      max_pages_per_seq=pages_per_seq, prefill_chunk=args.prefill_chunk,
                      prefill_rows=args.prefill_rows, decode_steps=args.decode_steps)
    eng = RolloutEngine(config, params, ec)
    t0 = time.perf_counter()
    keys = list(range(n))

    def call():  # one RL-style call: a dialogue key per prompt; released after, so every run starts cold
        out = eng.generate_tokens(prompts, keys=keys, max_tokens=N, temperature=1.0, seed=seeds, stop_ids=())
        eng.release_all()
        return out

    call()  # warm-up run: compiles the programs (page-table widths) this workload uses, and only those
    compile_s = time.perf_counter() - t0
    before = dict(eng.stats)
    wall, out = timed(call, args.repeats)
    used = eng.stats["slot_steps_used"] - before["slot_steps_used"]
    offered = eng.stats["slot_steps_offered"] - before["slot_steps_offered"]
    steps = (eng.stats["decode_steps"] - before["decode_steps"]) / args.repeats

    def prefill_then_decode():
        first = eng.generate_tokens(prompts, keys=keys, max_tokens=1, temperature=1.0, seed=seeds, stop_ids=())
        cont = [p + s.tokens for p, s in zip(prompts, first)]
        t1 = time.perf_counter()
        rest = eng.generate_tokens(cont, keys=keys, max_tokens=N - 1, temperature=1.0, seed=seeds, stop_ids=())
        dt = time.perf_counter() - t1
        eng.release_all()
        return dt, sum(len(s.tokens) for s in rest)

    decode_s, decode_tokens = None, 0
    if N > 1:
        prefill_then_decode()  # warm-up
        decode_s = float("inf")
        for _ in range(args.repeats):
            dt, decode_tokens = prefill_then_decode()
            decode_s = min(decode_s, dt)
    return {"wall_s": wall, "compile_s": compile_s, "tokens": [s.tokens for s in out],
            "generated": sum(len(s.tokens) for s in out), "slot_use": used / max(offered, 1),
            "decode_steps_per_call": steps, "decode_only_s": decode_s, "decode_only_tokens": decode_tokens,
            "engine_config": str(ec)}


def run_sampler(config, params, prompts, seeds, args) -> dict:
    N = args.new_tokens

    def call():
        return sampler.generate(config, params, prompts, max_new_tokens=N, temperature=1.0, seed=seeds, stop_ids=())

    t0 = time.perf_counter()
    call()  # warm-up run: compiles the bucketed program
    compile_s = time.perf_counter() - t0
    wall, out = timed(call, args.repeats)
    B, P = sampler.Buckets().batch(len(prompts)), sampler.Buckets().prompt(max(map(len, prompts)))
    return {"wall_s": wall, "compile_s": compile_s, "tokens": [s.tokens for s in out],
            "generated": sum(len(s.tokens) for s in out), "padded_prefill_tokens": B * P}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="a run config with a model (default: the ~1B one)")
    ap.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE")
    ap.add_argument("--tiny", action="store_true", help="tiny fp32 Qwen3 and short prompts (CPU smoke run)")
    ap.add_argument("--batch", type=int, default=64, help="requests = engine decode slots")
    ap.add_argument("--prompt-min", type=int, default=None, help="shortest prompt (default 600; --tiny 24)")
    ap.add_argument("--prompt-max", type=int, default=None, help="longest prompt (default 1000; --tiny 48)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens per request (default 256; --tiny 12)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--prefill-chunk", type=int, default=None, help="engine prefill chunk (default 512; --tiny 32)")
    ap.add_argument("--prefill-rows", type=int, default=16)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per path after the warm-up (best counts)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the numbers to this file")
    args = ap.parse_args(argv)
    small = {"prompt_min": (600, 24), "prompt_max": (1000, 48), "new_tokens": (256, 12), "prefill_chunk": (512, 32)}
    for k, (full, tiny) in small.items():
        if getattr(args, k) is None:
            setattr(args, k, tiny if args.tiny else full)
    for k in ("batch", "prompt_min", "new_tokens", "page_size", "prefill_chunk", "prefill_rows", "decode_steps",
              "repeats"):
        if getattr(args, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1, got {getattr(args, k)}")
    if args.prompt_max < args.prompt_min:
        ap.error(f"--prompt-max ({args.prompt_max}) must be >= --prompt-min ({args.prompt_min})")

    try:
        config = model_config(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    params = models.init_params(config, jax.random.key(args.seed))
    prompts = make_prompts(args.batch, args.prompt_min, args.prompt_max, config.vocab_size, args.seed)
    seeds = [1000 + i for i in range(args.batch)]
    n_params = sum(x.size for x in jax.tree.leaves(params))
    print(f"devices: {jax.devices()}  model: {config.model_type} {n_params / 1e9:.3f}B params, "
          f"{config.num_hidden_layers} layers, hidden {config.hidden_size}, compute {config.dtype}; batch "
          f"{args.batch}, prompts {args.prompt_min}-{args.prompt_max} tokens, {args.new_tokens} new tokens each",
          flush=True)

    eng = run_engine(config, params, prompts, seeds, args)
    print(f"engine: {eng['engine_config']}", flush=True)
    base = run_sampler(config, params, prompts, seeds, args)
    same = sum(a == b for a, b in zip(eng["tokens"], base["tokens"]))
    e_tps, b_tps = eng["generated"] / eng["wall_s"], base["generated"] / base["wall_s"]
    d_tps = eng["decode_only_tokens"] / eng["decode_only_s"] if eng["decode_only_s"] else float("nan")
    print(f"{'path':16s} {'wall s':>8s} {'compile s':>10s} {'generated':>10s} {'tok/s':>10s}")
    print(f"{'engine':16s} {eng['wall_s']:8.3f} {eng['compile_s']:10.1f} {eng['generated']:10d} {e_tps:10.1f}")
    print(f"{'sampler.generate':16s} {base['wall_s']:8.3f} {base['compile_s']:10.1f} {base['generated']:10d} "
          f"{b_tps:10.1f}")
    print(f"engine decode only (prompts prefilled by a max_tokens=1 call first): {eng['decode_only_tokens']} tokens "
          f"in {eng['decode_only_s'] or float('nan'):.3f} s; {eng['decode_steps_per_call']:.0f} decode steps per call; "
          f"sampler prefill rows x bucket: {base['padded_prefill_tokens']} tokens")
    print(f"identical samples: {same}/{args.batch} requests; generated tokens: engine {eng['generated']}, "
          f"sampler {base['generated']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"batch": args.batch, "new_tokens": args.new_tokens, "prompt_tokens": [args.prompt_min,
                       args.prompt_max], "params": n_params, "dtype": config.dtype,
                       "backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
                       "engine_tok_s": e_tps, "sampler_tok_s": b_tps, "ratio": e_tps / b_tps,
                       "engine_decode_only_tok_s": d_tps, "slot_use": eng["slot_use"],
                       "engine_generated": eng["generated"], "sampler_generated": base["generated"],
                       "identical_samples": same, "engine_wall_s": eng["wall_s"], "sampler_wall_s": base["wall_s"],
                       "engine_compile_s": eng["compile_s"], "sampler_compile_s": base["compile_s"],
                       "engine_config": eng["engine_config"]}, f, indent=2)
    print(f"engine decode: {e_tps:.1f} tok/s at batch {args.batch} (sampler.generate: {b_tps:.1f} tok/s, ratio "
          f"{e_tps / b_tps:.2f}x; decode only {d_tps:.1f} tok/s; slot use {100 * eng['slot_use']:.0f}%)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
