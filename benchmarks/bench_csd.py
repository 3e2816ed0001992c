"""CSD cost on a CPU: GRPO step alone vs GRPO + fused CSD vs GRPO + naive CSD (paper.md §4.2, Eq 7-11).

    python benchmarks/bench_csd.py                 # 2, 4, 8, 16 agent turns
    python benchmarks/bench_csd.py --turns 8 --repeats 3

Tiny Qwen3 (fp32), trajectories with realistic proportions: a long shared context (system prompt + task),
then per turn a user message, a coach note (every turn coached), the assistant header and the reply. For
each number of turns the same packed dialogues run through three jitted RL steps built in this process:
  (a) GRPO only (alpha = 0: no teacher work is traced),
  (b) GRPO + fused CSD (one pass: trunk + one teacher branch per coached turn),
  (c) GRPO + naive CSD (every coached turn's teacher sequence as its own row through the plain forward).
Step time = median (and best) of --repeats compiled calls, the variants interleaved call by call (so that load
from other processes hits all alike); peak memory = the compiled step's temp bytes (XLA memory_analysis: scratch
memory beyond inputs and outputs). Ratios are printed against (a) and (b).
Targets (issue #6): (b)/(a) <= 1.4 at 8 turns; (c)/(b) >= 1.7 at 8 turns and >= 2.5 at 16 turns.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from mimesis_jax import models  # noqa: E402
from mimesis_jax.models.config import ModelConfig  # noqa: E402
from mimesis_jax.rollout.trajectory import Segment, Trajectory  # noqa: E402
from mimesis_jax.train.agent_rl import RLConfig, make_rl_step, prepare_batch  # noqa: E402


def bench_config(args) -> ModelConfig:
    return ModelConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                       num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=args.hidden // 4, rope_theta=10000.0, logits_seq_chunk=512,
                       logits_vocab_chunk=1024, remat=args.remat)


def dialogue(rng, vocab: int, turns: int, args, group_id: int, rollout_id: int) -> Trajectory:
    def toks(n):
        n = max(1, int(round(n * rng.uniform(0.75, 1.25))))
        return rng.randint(1, vocab, size=n).tolist()

    segs = [Segment("public", toks(args.context))]
    for _ in range(turns):
        segs.append(Segment("public", toks(args.user)))
        segs.append(Segment("coach", toks(args.note)))
        segs.append(Segment("public", rng.randint(1, vocab, size=3).tolist()))  # <|im_start|>assistant\n
        reply = toks(args.reply)
        segs.append(Segment("agent", reply, logprobs=(-rng.rand(len(reply))).tolist()))
    return Trajectory(segs, turn_rewards=rng.rand(turns).tolist(), group_id=group_id, rollout_id=rollout_id)


class Variant:
    """One compiled RL step on one packed batch; `run()` times a single update."""

    def __init__(self, config, trajectories, rl: RLConfig, pad: int):
        self.step = make_rl_step(config, optax.adamw(1e-6), None, rl)
        self.packed = prepare_batch(trajectories, rl, rows_multiple=self.step.rows_multiple(), pad_multiple=pad)
        self.params = models.init_params(config, jax.random.PRNGKey(0))
        self.opt_state = self.step.init_opt_state(self.params)
        self.batch = self.step.place(self.packed)
        mem = self.step.lower(self.params, self.opt_state, self.batch).compile().memory_analysis()
        self.temp_mb = getattr(mem, "temp_size_in_bytes", float("nan")) / 2 ** 20
        self.run()  # warm-up: compiles the step
        self.times: list[float] = []

    def run(self) -> float:
        t0 = time.perf_counter()
        self.params, self.opt_state, self.metrics = self.step(self.params, self.opt_state, self.batch)
        jax.block_until_ready(self.metrics)
        return time.perf_counter() - t0

    def summary(self) -> dict:
        shape = {k: v.shape[1:] for k, v in self.batch.items() if k in ("tokens", "branch_tokens", "naive_tokens")}
        return dict(median=statistics.median(self.times), best=min(self.times), temp_mb=self.temp_mb,
                    teacher_tokens=self.packed.teacher_tokens,
                    trunk_tokens=int((self.packed.arrays["segment_ids"] > 0).sum()), shapes=shape,
                    loss=float(self.metrics["loss"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--trajectories", type=int, default=2, help="dialogues per step (one row each)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--context", type=int, default=192, help="shared context tokens (system + task)")
    ap.add_argument("--user", type=int, default=40, help="tokens per user message")
    ap.add_argument("--reply", type=int, default=48, help="tokens per agent reply")
    ap.add_argument("--note", type=int, default=24, help="tokens per coach note")
    ap.add_argument("--pad", type=int, default=64, help="pad lengths to a multiple of this (buckets)")
    ap.add_argument("--remat", default="none")
    ap.add_argument("--skip-naive", action="store_true")
    args = ap.parse_args(argv)
    config = bench_config(args)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; Qwen3 L={args.layers} D={args.hidden} "
          f"V={args.vocab} remat={args.remat}; {args.trajectories} dialogues/step; context {args.context}, "
          f"user {args.user}, note {args.note}, reply {args.reply} tokens")
    header = (f"{'turns':>5} {'variant':>8} {'median s':>9} {'best s':>8} {'temp MiB':>9} "
              f"{'teacher tok':>11} {'trunk tok':>9}  shapes")
    print(header)
    summary = []
    for turns in args.turns:
        rng = np.random.RandomState(turns)
        trajs = [dialogue(rng, args.vocab, turns, args, group_id=0, rollout_id=i) for i in range(args.trajectories)]
        variants = [("grpo", RLConfig(alpha=0.0)), ("fused", RLConfig(alpha=0.01, teacher="fused"))]
        if not args.skip_naive:
            variants.append(("naive", RLConfig(alpha=0.01, teacher="naive")))
        built = {name: Variant(config, trajs, rl, args.pad) for name, rl in variants}
        for _ in range(args.repeats):  # interleaved, so that load from other processes hits every variant alike
            for v in built.values():
                v.times.append(v.run())
        res = {}
        for name, v in built.items():
            r = res[name] = v.summary()
            print(f"{turns:>5} {name:>8} {r['median']:>9.3f} {r['best']:>8.3f} {r['temp_mb']:>9.1f} "
                  f"{r['teacher_tokens']:>11} {r['trunk_tokens']:>9}  {r['shapes']}", flush=True)
        if not all(np.isfinite(r["loss"]) for r in res.values()):
            sys.exit("non-finite loss")
        del built
        summary.append((turns, res))
    print("\nratios (median step time; temp memory):")
    print(f"{'turns':>5} {'(b)/(a) time':>13} {'(b)/(a) mem':>12} {'(c)/(b) time':>13} {'(c)/(b) mem':>12} "
          f"{'teacher tok c/b':>16}")
    for turns, res in summary:
        a, b, c = res["grpo"], res["fused"], res.get("naive")
        cb_t = f"{c['median'] / b['median']:.2f}" if c else "-"
        cb_m = f"{c['temp_mb'] / b['temp_mb']:.2f}" if c else "-"
        cb_k = f"{c['teacher_tokens'] / b['teacher_tokens']:.2f}" if c else "-"
        print(f"{turns:>5} {b['median'] / a['median']:>13.2f} {b['temp_mb'] / a['temp_mb']:>12.2f} {cb_t:>13} "
              f"{cb_m:>12} {cb_k:>16}")
    print("targets: (b)/(a) <= 1.4 at 8 turns; (c)/(b) >= 1.7 at 8 turns, >= 2.5 at 16 turns")


if __name__ == "__main__":
    main()
