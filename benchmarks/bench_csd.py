"""CSD cost on a CPU: GRPO step alone vs GRPO + fused CSD vs GRPO + naive CSD (docs/reference/paper.md §4.2, Eq 7-11).

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

Packing report (counts from the packed arrays, no timing; `--packing-only` runs just this): batches of
--packing-dialogues dialogues of the realistic length mix (`realistic_dialogue`, every length uniform in its range:
1-16 agent turns; system prompt 300-1100 tokens; per turn a user/tool message of 20-300 tokens, a 3-token assistant
header and an agent reply of 40-400 tokens; a coach note of 20-80 tokens before the header of each turn but the last
(which has no next user message to learn from) with probability 0.8, the coach answering NONE otherwise) packed
into rows of --packing-row-len tokens (24K), for rows_multiple 1 and 8 (e.g. 8 batch-sharding devices). Reported:
trunk utilisation (real tokens / (rows x row length)), branch padding (1 - branch tokens / (rows x branch row
length)), LM-head padding (1 - agent tokens / head positions, 1 - coached tokens / branch head positions) and the
LM-head positions against all trunk + branch positions; each against the old layout (first fit by trunk length,
rows and branch length on the coarse `bucket` ladder, the head on every position).
Targets (issue "Stage II end to end", item 5): trunk utilisation >= 90%, branch padding <= 15%.
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
from mimesis_jax.algorithms.rl_batch import bucket, pack_trajectories  # noqa: E402
from mimesis_jax.models.config import ModelConfig  # noqa: E402
from mimesis_jax.data.trajectory import Segment, Trajectory  # noqa: E402
from mimesis_jax.train.rl.step import RLConfig, make_rl_step, prepare_batch  # noqa: E402


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


# ------------------------------------------------------------------------------------------ packing
def realistic_dialogue(rng, vocab: int, rollout_id: int = 0, note_prob: float = 0.8) -> Trajectory:
    """One dialogue of the realistic length mix (module docstring); token ids random, no rollout log-probs."""
    def toks(lo, hi):
        return rng.randint(1, vocab, size=rng.randint(lo, hi + 1)).tolist()

    turns = rng.randint(1, 17)
    segs = [Segment("public", toks(300, 1100))]
    for t in range(turns):
        segs.append(Segment("public", toks(20, 300)))
        if t < turns - 1 and rng.rand() < note_prob:
            segs.append(Segment("coach", toks(20, 80)))
        segs.append(Segment("public", toks(3, 3)))
        segs.append(Segment("agent", toks(40, 400)))
    return Trajectory(segs, turn_rewards=[0.0] * turns, group_id=rollout_id // 8, rollout_id=rollout_id)


def old_layout(packed, rows_multiple: int, pad_multiple: int) -> dict:
    """Counts of the previous layout of the same dialogues: first fit by trunk length (longest first), the row
    count and the branch row length on the coarse `bucket` ladder, the LM head on every trunk and branch position."""
    T = packed.arrays["tokens"].shape[1]
    seg, bid = packed.arrays["segment_ids"], packed.arrays["branch_ids"]
    items = []  # (trunk tokens, branch tokens) per trajectory
    for r in range(seg.shape[0]):
        for s in range(1, int(seg[r].max()) + 1):
            trunk_seg = packed.arrays["branch_trunk_segment"][r]
            items.append((int((seg[r] == s).sum()), int(((bid[r] > 0) & (trunk_seg == s)).sum())))
    used_t, used_b = [], []
    for t, b in sorted(items, key=lambda x: -x[0]):
        for r in range(len(used_t)):
            if used_t[r] + t <= T:
                used_t[r] += t
                used_b[r] += b
                break
        else:
            used_t.append(t)
            used_b.append(b)
    B, Tb = bucket(len(used_t), rows_multiple), bucket(max(used_b), pad_multiple)
    return dict(rows=B, T=T, Tb=Tb, trunk_util=sum(used_t) / (B * T), branch_pad=1 - sum(used_b) / (B * Tb),
                head_positions=B * (T - 1 + Tb - 1))


def packing_stats(packed) -> dict:
    """Trunk utilisation, branch and LM-head padding of a packed fused batch, counted from its arrays."""
    a = packed.arrays
    B, T = a["tokens"].shape
    n_agent, n_coached = int(a["agent_mask"].sum()), int(a["coached_mask"].sum())
    return dict(rows=B, T=T, Tb=a["branch_ids"].shape[1], trunk_util=float((a["segment_ids"] > 0).mean()),
                branch_pad=1 - float((a["branch_ids"] > 0).mean()), head_pad=1 - n_agent / a["head_idx"].size,
                branch_head_pad=1 - n_coached / a["branch_head_idx"].size,
                head_positions=a["head_idx"].size + a["branch_head_idx"].size)


def packing_report(args) -> tuple[float, float]:
    """Prints the packing table (module docstring); returns the mean (trunk utilisation, branch padding) at
    rows_multiple 1."""
    print(f"\npacking: {args.packing_batches} batches of {args.packing_dialogues} dialogues (realistic mix), rows of "
          f"{args.packing_row_len} tokens; mean [worst] over the batches")
    print(f"{'rows_mult':>9} {'layout':>6} {'rows':>6} {'Tb':>7} {'trunk util':>15} {'branch pad':>15} "
          f"{'head pad':>8} {'br head pad':>11} {'head positions':>14}")
    out = None
    for rm in (1, 8):
        new, old = [], []
        for b in range(args.packing_batches):
            rng = np.random.RandomState(1000 + b)
            trajs = [realistic_dialogue(rng, 150_000, i) for i in range(args.packing_dialogues)]
            packed = pack_trajectories(trajs, teacher="fused", use_rollout_logprobs=False, rows_multiple=rm,
                                       row_len=args.packing_row_len, pad_multiple=args.pad)
            new.append(packing_stats(packed))
            old.append(old_layout(packed, rm, args.pad))
        for name, rs in (("new", new), ("old", old)):
            m = lambda k: float(np.mean([r[k] for r in rs]))  # noqa: E731
            worst_u, worst_p = min(r["trunk_util"] for r in rs), max(r["branch_pad"] for r in rs)
            head = f"{m('head_pad'):>8.1%} {m('branch_head_pad'):>11.1%}" if name == "new" else f"{'-':>8} {'-':>11}"
            ratio = m("head_positions") / float(np.mean([r["head_positions"] for r in old]))
            print(f"{rm:>9} {name:>6} {m('rows'):>6.1f} {m('Tb'):>7.0f} {m('trunk_util'):>7.1%} [{worst_u:>5.1%}] "
                  f"{m('branch_pad'):>7.1%} [{worst_p:>5.1%}] {head} {ratio:>13.2f}x")
        m_new = {k: float(np.mean([r[k] for r in new])) for k in ("trunk_util", "branch_pad")}
        m_old = {k: float(np.mean([r[k] for r in old])) for k in ("trunk_util", "branch_pad")}
        print(f"{'':>9} new/old: trunk utilisation x{m_new['trunk_util'] / m_old['trunk_util']:.2f}, branch padding "
              f"x{m_new['branch_pad'] / m_old['branch_pad']:.2f}")
        if out is None:
            out = (m_new["trunk_util"], m_new["branch_pad"])
    print("targets: trunk utilisation >= 90%, branch padding <= 15% (rows_multiple 1: what the packer controls; a "
          "row count forced to a multiple of 8 leaves up to 7 rows empty)")
    return out


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
    ap.add_argument("--packing-only", action="store_true", help="only the packing report (no model, no timing)")
    ap.add_argument("--packing-batches", type=int, default=5)
    ap.add_argument("--packing-dialogues", type=int, default=256, help="dialogues per batch in the packing report")
    ap.add_argument("--packing-row-len", type=int, default=24576)
    args = ap.parse_args(argv)
    if not args.packing_only:
        timing_report(args)
    util, pad = packing_report(args)
    print(f"packing: trunk utilisation {util:.1%}, branch padding {pad:.1%}")


def timing_report(args):
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
