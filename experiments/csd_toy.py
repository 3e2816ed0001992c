"""The paper's direction on a toy (paper §4.2, Appendix E): GRPO vs GRPO + CSD when the simulator's hindsight is
informative, and the control where it is not. A script, not a test (several minutes on a CPU).

    python experiments/csd_toy.py --out runs/csd_toy [--seeds 0 1 2 3 4 5 6 7] [--steps 20] [--alpha 0.5]

The toy (envs/toy.py, ToyKeyword): the user privately likes replies whose words start with 's'; each agent turn is
rewarded by the fraction of its words that do. The rule-based user's private thought says how the reply matched,
so a coach reading it (Eq 7) can write the right note: "Use many words that start with 's'".

1. **Teach the agent to follow in-context notes** (warm start): a tiny Qwen3 agent is trained with a plain LM
   loss on synthetic dialogues -- with a coach note (rendered exactly as the RL stage inserts notes, a system turn
   before the assistant header; the note names a letter and gives example words) the reply uses the note's
   words; without a note, words of all four note letters. The agent thus has no preference of its own, but
   follows notes (printed as a check).
2. **RL without notes** from that agent, three arms x seeds, everything else equal (configs/tiny_agentrl.py:csd):
   * `grpo`: alpha = 0;
   * `csd`: GRPO + alpha CSD with the informative coach (the note names the user's letter);
   * `csd_shuffled` (control): the same, but each note names a random letter of ToyCoach.NULL_LETTERS ("bdhk":
     never the target, never taught in the warm start) -- hindsight independent of the target.
   Reported per arm: reward curves (mean over seeds), steps to reach the reward threshold (mean with a 95%
   Student-t interval over seeds; runs that never reach it count as steps + 1 and are marked), final reward. Theory (Appendix E) predicts a gain
   only when the note's weights co-vary with the advantage: `csd` faster than `grpo`, `csd_shuffled` no faster.
It prints the table and writes `csd_toy.png` and `csd_toy.json` to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

LETTER = "s"


def word_lists() -> dict[str, list[str]]:
    """The words a note gives for each letter of the note alphabet (envs/toy.py ToyCoach)."""
    from mimesis_jax.envs.toy import ToyCoach

    return {k: list(ToyCoach.NOTE_WORDS[k]) for k in ToyCoach.NOTE_LETTERS}


def warm_start_examples(tok, n: int, rng: random.Random, words: dict[str, list[str]], max_len: int):
    """Synthetic SFT rows (ids, loss mask on the assistant replies): follow a note's letter; random otherwise."""
    from mimesis_jax.algorithms.coach import coach_note_message
    from mimesis_jax.data.chat import render_messages
    from mimesis_jax.envs.toy import TOPICS, ToyCoach

    letters = sorted(words)
    everything = [w for ws in words.values() for w in ws]
    rows = []
    while len(rows) < n:
        msgs = [{"role": "system", "content": "You are a friendly assistant. Reply in one or two sentences."},
                {"role": "user", "content": f"Tell me something about {rng.choice(TOPICS)}."}]
        if rng.random() < 0.5:  # a two-turn variant, as the toy's second turn looks
            msgs += [{"role": "assistant", "content": " ".join(rng.choice(everything) for _ in range(6))},
                     {"role": "user", "content": "Hmm. Tell me more."}]
        if rng.random() < 0.5:
            letter = rng.choice(letters)
            msgs.append(coach_note_message(ToyCoach.note(letter)))
            reply = " ".join(rng.choice(words[letter]) for _ in range(rng.randint(5, 9)))
        else:
            reply = " ".join(rng.choice(everything) for _ in range(rng.randint(5, 9)))
        msgs.append({"role": "assistant", "content": reply.capitalize() + "."})
        r = render_messages(tok, msgs)
        if len(r.ids) > max_len:  # never dropped silently: the padded length must hold every example
            raise ValueError(f"a warm-start example has {len(r.ids)} tokens > max_len={max_len}")
        last = len(msgs) - 1
        rows.append((np.asarray(r.ids, np.int32), r.mask("assistant", turns=[last]).astype(np.float32)))
    return rows


def warm_start(cfg, tok, out_dir: str, steps: int, seed: int, log=print):
    """Trains the tiny agent to follow notes (plain LM loss on the replies) and saves it as a HF directory."""
    import jax
    import jax.numpy as jnp
    import optax

    from mimesis_jax import models
    from mimesis_jax.algorithms.logprobs import token_logprobs
    from mimesis_jax.train.state import model_config_for

    config = model_config_for(cfg, tok).replace(dtype="float32", remat="none")
    rng = random.Random(seed)
    words = word_lists()
    if LETTER not in words:
        raise SystemExit(f"the tiny tokenizer's text has too few words starting with {LETTER!r}")
    L = 224
    rows = warm_start_examples(tok, 2048, rng, words, L)
    ids = np.zeros((len(rows), L), np.int32)
    mask = np.zeros((len(rows), L), np.float32)
    for i, (x, m) in enumerate(rows):
        ids[i, :len(x)], mask[i, :len(m)] = x, m
    params = models.init_params(config, jax.random.PRNGKey(seed))
    tx = optax.adamw(3e-3, weight_decay=0.0)
    opt = tx.init(params)

    @jax.jit
    def step(params, opt, x, m):
        def loss(p):
            lp = token_logprobs(config, p, x)  # predicts x[:, 1:]
            w = m[:, 1:]
            return -jnp.sum(lp * w) / jnp.maximum(jnp.sum(w), 1.0)
        val, g = jax.value_and_grad(loss)(params)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, val

    order = np.random.default_rng(seed)
    for s in range(steps):
        b = order.integers(0, len(rows), 32)
        params, opt, val = step(params, opt, jnp.asarray(ids[b]), jnp.asarray(mask[b]))
        if (s + 1) % 100 == 0:
            log(f"warm start step {s + 1}/{steps}: reply loss {float(val):.3f}")
    models.save_hf(out_dir, config, params)
    return config, params, words


def note_following(config, params, tok, words, seed: int, n: int = 32) -> dict:
    """Mean ToyKeyword reward for the user's letter: without a note, with the right note, with another note."""
    from mimesis_jax.algorithms.coach import coach_note_message
    from mimesis_jax.envs.toy import keyword_reward
    from mimesis_jax.chat.local import LocalChatModel

    agent = LocalChatModel(config, params, tok, max_tokens=24, temperature=1.0, seed=seed)
    base = [{"role": "system", "content": "You are a friendly assistant. Reply in one or two sentences."},
            {"role": "user", "content": "Tell me something about a good book."}]
    other = next(k for k in sorted(words) if k != LETTER)
    out = {}
    from mimesis_jax.envs.toy import ToyCoach

    for name, extra in (("no note", []), (f"note '{LETTER}'", [coach_note_message(ToyCoach.note(LETTER))]),
                        (f"note '{other}'", [coach_note_message(ToyCoach.note(other))])):
        replies = agent.chat_batch([base + extra] * n)
        out[name] = float(np.mean([keyword_reward(r.text, LETTER) for r in replies]))
    return out


def note_covariance(config, params, tok, arm: str, seed: int, groups: int = 8, group_size: int = 8,
                    beta: float = 5.0) -> float:
    """Appendix E's Cov(w, A) on one arm's notes, measured at the warm-started agent (every RL run's start):
    per group, `group_size` sampled replies to one prompt, A = the group-normalised ToyKeyword reward (GRPO's
    advantage), w = the reply's mean Eq 9 weight sigmoid(beta (log pi(y | note) - log pi(y))) over its tokens
    with the arm's note (csd: the user's letter; csd_shuffled: a random NULL_LETTERS letter). A has mean 0 in
    each group, so Cov(w, A) = mean(w * A) over all replies."""
    import jax
    import jax.numpy as jnp

    from mimesis_jax.algorithms.coach import coach_note_message
    from mimesis_jax.algorithms.logprobs import token_logprobs
    from mimesis_jax.data.chat import render_messages
    from mimesis_jax.envs.toy import TOPICS, ToyCoach, keyword_reward
    from mimesis_jax.chat.local import LocalChatModel

    rng = random.Random(seed)
    agent = LocalChatModel(config, params, tok, max_tokens=24, temperature=1.0, seed=seed)
    L = 224
    score = jax.jit(lambda x: token_logprobs(config, params, x))

    def reply_logps(msgs):
        r = render_messages(tok, msgs)
        ids = np.zeros((1, L), np.int32)
        ids[0, :len(r.ids)] = r.ids
        lp = np.asarray(score(jnp.asarray(ids)))[0]  # lp[i] = log p(ids[i + 1])
        where = np.nonzero(r.mask("assistant", turns=[len(msgs) - 1]))[0]
        return lp[where - 1]

    ws, As = [], []
    for g in range(groups):
        base = [{"role": "system", "content": "You are a friendly assistant. Reply in one or two sentences."},
                {"role": "user", "content": f"Tell me something about {TOPICS[g % len(TOPICS)]}."}]
        replies = [x.text for x in agent.chat_batch([base] * group_size)]
        r = np.array([keyword_reward(t, LETTER) for t in replies])
        A = (r - r.mean()) / (r.std() + 1e-6)
        for text, a in zip(replies, A):
            letter = LETTER if arm == "csd" else rng.choice(ToyCoach.NULL_LETTERS)
            reply = {"role": "assistant", "content": text}
            student = reply_logps(base + [reply])
            teacher = reply_logps(base + [coach_note_message(ToyCoach.note(letter)), reply])
            ws.append(float(np.mean(1.0 / (1.0 + np.exp(-beta * (teacher - student))))))
            As.append(float(a))
    return float(np.mean(np.array(ws) * np.array(As)))


def run_arm(arm: str, seed: int, steps: int, alpha: float, warm_dir: str, out: str, tok):
    from mimesis_jax.train.rl import agent as rl_loop

    coach = {"grpo": "toy-coach", "csd": "toy-coach", "csd_shuffled": "toy-coach-shuffled"}[arm]
    sets = [f"train.steps={steps}", f"train.seed={seed}", f"init.from_hf={warm_dir}", "users.simulator=toy-user",
            f"users.coach={coach}", f"rl.alpha={0.0 if arm == 'grpo' else alpha}", "train.progress_bar=false",
            "train.tensorboard=false", "train.log_every=1000", "checkpoint.every=1000", "checkpoint.async_save=false"]
    cfg = rl_loop.load(os.path.join(ROOT, "configs", "tiny_agentrl.py:csd"), sets)
    wd = os.path.join(out, f"{arm}_seed{seed}")
    res = rl_loop.run(cfg, wd, tokenizer=tok, handle_signals=False, log=lambda *a: None)
    return [res.metrics[s]["reward_mean"] for s in sorted(res.metrics)]


def steps_to(curve, threshold):
    for i, r in enumerate(curve):
        if r >= threshold:
            return i + 1, True
    return len(curve) + 1, False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/csd_toy")
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    p.add_argument("--steps", type=int, default=20, help="RL steps per run")
    p.add_argument("--alpha", type=float, default=0.5, help="CSD weight of the two CSD arms (Eq 11)")
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.4, 0.8],
                   help="rewards the steps-to-threshold columns use")
    p.add_argument("--warm-steps", type=int, default=600)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    from mimesis_jax.data.tokenizer import load_tokenizer
    from mimesis_jax.train.rl import agent as rl_loop

    tok = load_tokenizer("tiny")
    cfg = rl_loop.load(os.path.join(ROOT, "configs", "tiny_agentrl.py:csd"))
    warm_dir = os.path.join(args.out, "warm_agent")
    t0 = time.perf_counter()
    config, params, words = warm_start(cfg, tok, warm_dir, args.warm_steps, seed=0)
    check = note_following(config, params, tok, words, seed=0)
    print("note following after the warm start (mean reward for the user's letter): "
          + ", ".join(f"{k}: {v:.3f}" for k, v in check.items()), flush=True)

    cov = {arm: [note_covariance(config, params, tok, arm, seed=s) for s in args.seeds[:3]]
           for arm in ("csd", "csd_shuffled")}
    print("Appendix E Cov(w, A) on each arm's notes at the warm start (3 seeds x 64 replies): "
          + ", ".join(f"{a}: " + " ".join(f"{c:+.4f}" for c in cs) for a, cs in cov.items()), flush=True)

    curves = {}
    for arm in ("grpo", "csd", "csd_shuffled"):
        for seed in args.seeds:
            t = time.perf_counter()
            curves.setdefault(arm, []).append(run_arm(arm, seed, args.steps, args.alpha, warm_dir, args.out, tok))
            print(f"{arm} seed {seed}: reward {curves[arm][-1][0]:.3f} -> {curves[arm][-1][-1]:.3f} "
                  f"({time.perf_counter() - t:.0f} s)", flush=True)

    def ci95(x):  # half-width of the 95% Student-t interval of the mean
        if len(x) < 2:
            return 0.0
        from scipy.stats import t as student_t

        return float(student_t.ppf(0.975, len(x) - 1) * np.std(x, ddof=1) / np.sqrt(len(x)))

    sd = lambda x: float(np.std(x, ddof=1)) if len(x) > 1 else 0.0  # noqa: E731
    rows = ["| arm | seeds | " + " | ".join(f"steps to reward >= {t:.2f} (mean [95% CI], reached)"
                                            for t in args.thresholds) + " | final reward (mean +/- sd) |",
            "|---|---|" + "---|" * len(args.thresholds) + "---|"]
    summary = {}
    for arm, cs in curves.items():
        cells, summary[arm] = [], {"curves": cs}
        for t in args.thresholds:
            hits = [steps_to(c, t) for c in cs]
            n = np.array([h[0] for h in hits], float)
            summary[arm][f"steps_to_{t}"] = n.tolist()
            summary[arm][f"steps_to_{t}_ci95"] = [n.mean() - ci95(n), n.mean() + ci95(n)]
            cells.append(f"{n.mean():.1f} [{n.mean() - ci95(n):.1f}, {n.mean() + ci95(n):.1f}] "
                         f"({sum(h[1] for h in hits)}/{len(hits)})")
        final = np.array([np.mean(c[-3:]) for c in cs])
        rows.append(f"| {arm} | {len(cs)} | " + " | ".join(cells) + f" | {final.mean():.3f} +/- {sd(final):.3f} |")
    table = "\n".join(rows)
    print(table)
    with open(os.path.join(args.out, "csd_toy.json"), "w") as f:
        json.dump({"args": vars(args), "note_following": check, "cov_w_adv": cov, "arms": summary, "table": table}, f, indent=2)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for arm, cs in curves.items():
        c = np.asarray(cs)
        x = np.arange(1, c.shape[1] + 1)
        ax.plot(x, c.mean(0), label=arm)
        ax.fill_between(x, c.min(0), c.max(0), alpha=0.2)
    for t in args.thresholds:
        ax.axhline(t, color="gray", lw=0.8, ls="--")
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean turn reward")
    ax.set_title(f"Toy CSD: {len(args.seeds)} seeds, alpha {args.alpha} (band: min-max)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "csd_toy.png"), dpi=120)
    print(f"wrote {args.out}/csd_toy.png and csd_toy.json in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
