"""Stage I trainer cost on a CPU: what remat, gradient accumulation and the host loop cost, in one process.

    python benchmarks/bench_train.py                       # tiny Qwen3.5, batch 8 x 256 tokens
    python benchmarks/bench_train.py --model qwen3 --seq 512 --repeats 5

Variants of the same jitted train step (train/step.py) on the same batches, interleaved call by call:
  (a) baseline: remat none, grad_accum 1
  (b) remat full                      -> step time and compiled temp memory vs (a)
  (c) grad_accum 4 (4 micro-batches)  -> temp memory vs (a) (the activation peak of one micro-batch)
and (d) the whole loop (`train.loop.train`: data prefetch thread, host metrics, metrics.jsonl, progress bar,
one checkpoint at the end) over the same number of steps, whose tokens/s is compared with (a)'s bare step:
the ratio is the host-side overhead of the loop. Step time = median of --repeats calls after compilation;
temp memory = XLA's memory_analysis of the compiled step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

from mimesis_jax import models, sharding  # noqa: E402
from mimesis_jax.config import (CheckpointConfig, MeshConfig, OptimizerConfig, RunConfig, TrainConfig,  # noqa: E402
                                qwen3_5_layer_types)
from mimesis_jax.models import ModelConfig  # noqa: E402
from mimesis_jax.train.loop import compiled_functions, train  # noqa: E402
from mimesis_jax.train.metrics import read_metrics  # noqa: E402
from mimesis_jax.train.synthetic import SyntheticData  # noqa: E402


def model_config(args) -> ModelConfig:
    common = dict(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                  num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=args.hidden // 4, logits_seq_chunk=128, logits_vocab_chunk=512)
    if args.model == "qwen3":
        return ModelConfig(model_type="qwen3", **common)
    return ModelConfig(model_type="qwen3_5_text", partial_rotary_factor=0.25, attn_output_gate=True,
                       full_attention_interval=4, layer_types=qwen3_5_layer_types(args.layers, 4),
                       linear_conv_kernel_dim=4, linear_key_head_dim=args.hidden // 4,
                       linear_value_head_dim=args.hidden // 4, linear_num_key_heads=2, linear_num_value_heads=4,
                       **common)


def run_config(args, remat="none", accum=1) -> RunConfig:
    return RunConfig(stage="midtrain", model=model_config(args),
                     data=SyntheticData(vocab_size=args.vocab, seq_len=args.seq, alphabet=64),
                     optimizer=OptimizerConfig(lr=1e-3, schedule="constant"),
                     train=TrainConfig(steps=args.repeats + 1, global_batch=args.batch, grad_accum=accum, remat=remat,
                                       dtype="float32", tensorboard=False, progress_bar=True, log_every=10**6),
                     mesh=MeshConfig(data=1, fsdp=1, tensor=1),
                     checkpoint=CheckpointConfig(every=10**6, keep=1, async_save=True))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["qwen3_5", "qwen3"], default="qwen3_5")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
    data = run_config(args).data.make_iterator(None, args.batch, 0)
    batches = [sharding.global_batch(next(data), mesh) for _ in range(args.repeats + 1)]
    tokens = int(sum(int((b["segment_ids"] > 0).sum()) for b in batches[1:]) / args.repeats)

    variants = {"a: baseline": run_config(args), "b: remat full": run_config(args, remat="full"),
                "c: grad_accum 4": run_config(args, accum=4)}
    runs = {}
    for name, cfg in variants.items():
        tx, _, _, _, init, step = compiled_functions(cfg.runtime_model(), cfg.optimizer, cfg.train.steps, mesh,
                                                     cfg.train.grad_accum, False)
        state = init(models.init_params(cfg.runtime_model(), jax.random.key(0), mesh), jax.random.key(1))
        t0 = time.perf_counter()
        compiled = step.jitted.lower(state, batches[0]).compile()
        mem = compiled.memory_analysis()
        temp = getattr(mem, "temp_size_in_bytes", float("nan")) if mem is not None else float("nan")
        state, m = step(state, batches[0])
        jax.block_until_ready(m)
        runs[name] = dict(step=step, state=state, times=[], temp=temp, compile=time.perf_counter() - t0)
    for i in range(args.repeats):  # interleaved so background load hits every variant alike
        for r in runs.values():
            t0 = time.perf_counter()
            r["state"], m = r["step"](r["state"], batches[1 + i])
            jax.block_until_ready(m)
            r["times"].append(time.perf_counter() - t0)

    with tempfile.TemporaryDirectory() as wd:
        cfg = run_config(args)
        train(cfg, wd, handle_signals=False)  # the compiled step comes from the cache: (a)'s program
        loop_time = statistics.median(r["step_time_s"] for r in read_metrics(wd)[1:])

    base = statistics.median(runs["a: baseline"]["times"])
    print(f"\n{args.model} hidden {args.hidden} x {args.layers} layers, batch {args.batch} x {args.seq} "
          f"({tokens} non-pad tokens/step), {args.repeats} timed steps, {jax.devices()[0].platform}")
    print(f"{'variant':18s} {'step s':>8s} {'tok/s':>9s} {'vs a':>6s} {'temp MB':>9s} {'vs a':>6s} {'compile s':>9s}")
    base_temp = runs["a: baseline"]["temp"]
    for name, r in runs.items():
        t = statistics.median(r["times"])
        print(f"{name:18s} {t:8.3f} {tokens / t:9.0f} {t / base:6.2f} {r['temp'] / 2**20:9.1f} "
              f"{r['temp'] / base_temp:6.2f} {r['compile']:9.1f}")
    print(f"{'d: train() loop':18s} {loop_time:8.3f} {tokens / loop_time:9.0f} {loop_time / base:6.2f}"
          "   (median step of the loop: data, step, host metrics, logging)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
