"""A synthetic, paper-like length mix of RL mini-batches: what `plan` counts the LM head's padding on and what
tests/test_shape_ladders.py packs. Synthetic: the lengths are drawn from fixed distributions shaped after the
paper's setups, not measured from any run.

* Stage II (AgentRLConfig) dialogues (`agent_dialogue`): a prompt of 300 .. gyms.max_prompt_tokens, up to
  rollout.max_turns turns of a user / tool reply (20 .. 300), an optional coach note, a `HEADER`-token assistant
  header and an agent reply (log-normal around 200 tokens, <= rollout.agent_max_tokens), stopping before the
  context limit; `dialogue_sizes` gives the per-dialogue sizes the packer balances.
* Stage I.3 (SimRLConfig) rollouts (`sim_rollout`): each policy turn its own segment.

`head_padding` packs `minibatches` mini-batches of a config's mix to its shape ladder (rl_batch.ladder_shape_key,
no arrays built) and counts the LM-head positions of the programs taken against the real agent tokens.
"""

from __future__ import annotations

import numpy as np

from mimesis_jax.algorithms import rl_batch
from mimesis_jax.config.choices import NOTE_TOKENS
from mimesis_jax.train.rl.ladder import ladder_for_config

HEADER = 3  # assistant-header tokens before each agent turn
COACH_PROB = 0.5  # the chance a Stage II turn has a coach note
SEED = 2025


def agent_dialogue(rng: np.random.RandomState, cfg, coach_prob: float = COACH_PROB) -> list[tuple[str, int]]:
    """One Stage II dialogue's segment lengths [(kind, n)] (module docstring); a coach note of 16 .. the config's
    note bound (users.coach_max_tokens + the template tokens around it)."""
    r = cfg.rollout
    plan = [("public", rng.randint(300, cfg.gyms.max_prompt_tokens + 1))]
    used = plan[0][1]
    for _ in range(rng.randint(1, r.max_turns + 1)):
        env = rng.randint(20, 301)
        agent = int(min(r.agent_max_tokens, max(1, rng.lognormal(np.log(200), 0.8))))
        if used + env + HEADER + agent > r.max_context_tokens:
            break
        used += env + HEADER + agent
        plan.append(("public", env))
        if rng.rand() < coach_prob:
            plan.append(("coach", rng.randint(16, cfg.users.coach_max_tokens + NOTE_TOKENS - HEADER + 1)))
        plan += [("public", HEADER), ("agent", agent)]
    return plan


def dialogue_sizes(plans, fused: bool) -> np.ndarray:
    """Per-dialogue sizes as the packer takes them: [4, N] trunk, branch (coach + header + agent of coached
    turns), agent and coached tokens (fused), else [2, N] trunk and agent tokens."""
    out = []
    for plan in plans:
        trunk = sum(n for k, n in plan if k != "coach")
        agent = sum(n for k, n in plan if k == "agent")
        branch = coached = 0
        for i, (k, n) in enumerate(plan):
            if k == "coach":
                a = plan[i + 2][1]
                branch, coached = branch + n + HEADER + a, coached + a
        out.append((trunk, branch, agent, coached))
    s = np.array(out, np.int64).T
    return s if fused else s[[0, 2]]


def sim_rollout(rng: np.random.RandomState, r, max_user_turns: int) -> list[tuple[int, int]]:
    """One Stage I.3 rollout's segments [(trunk, agent tokens)]: 60% single-turn, else 2 .. max_user_turns policy
    turns; a first prompt of 300 .. 3,000 tokens, each turn's thought + utterance log-normal around 600 tokens
    (<= rollout.max_tokens), its prompt the dialogue so far (+ the partner's reply, 20 .. 300, and 8 template
    tokens per turn), ending before prompt + max_tokens would pass the context budget."""
    turns = 1 if rng.rand() < 0.6 else rng.randint(2, max_user_turns + 1)
    prompt, segs = rng.randint(300, 3001), []
    for _ in range(turns):
        if prompt + r.max_tokens > r.max_context_tokens:
            break
        a = int(min(r.max_tokens, max(1, rng.lognormal(np.log(600), 0.6))))
        segs.append((prompt + a, a))
        prompt += a + rng.randint(20, 301) + 8
    return segs


def minibatch_sizes(rng: np.random.RandomState, cfg, fused: bool) -> np.ndarray:
    """One mini-batch (rollout.mini_batch_prompts x group_size dialogues or rollouts) of the config's stage, as
    sizes the packer takes."""
    r = cfg.rollout
    n = r.mini_batch_prompts * r.group_size
    if not hasattr(cfg, "users"):  # Stage I.3: every policy turn its own segment
        return np.array([s for _ in range(n) for s in sim_rollout(rng, r, cfg.domains.max_user_turns)], np.int64).T
    return dialogue_sizes([agent_dialogue(rng, cfg) for _ in range(n)], fused)


def applies(cfg) -> bool:
    """Whether the mix's lengths fit the config: a context budget (rollout.max_context_tokens) with room for its
    shortest prompt (300 tokens) and one reply, and for Stage II a prompt bound of at least 300 tokens."""
    r = cfg.rollout
    if not hasattr(cfg, "users"):
        return r.max_context_tokens > 3000 + r.max_tokens
    return cfg.gyms.max_prompt_tokens >= 300 and r.max_context_tokens > cfg.gyms.max_prompt_tokens + HEADER + 320


def head_padding(cfg, rows_multiple: int, minibatches: int, seed: int = SEED) -> dict | None:
    """The config's ladder (ladder_for_config) over `minibatches` mini-batches of its synthetic mix:
    head = LM-head positions of the programs taken (rows x head, summed), agent = real agent tokens, programs =
    how many distinct programs were taken; with fused CSD branches (fused: True) also the teacher's head:
    branch_head = its positions (rows x branch_head), coached = real coached tokens. None where the shapes are not
    on a ladder or the mix does not fit the config (`applies`)."""
    ladder = ladder_for_config(cfg, rows_multiple)
    if ladder is None or not applies(cfg):
        return None
    rng = np.random.RandomState(seed)
    head = agent = branch_head = coached = 0
    seen = set()
    for _ in range(minibatches):
        s = minibatch_sizes(rng, cfg, ladder.fused)
        key, _ = rl_batch.ladder_shape_key(s, ladder, rows_multiple)
        seen.add(key)
        head += key[0] * key[2]
        agent += int(s[2 if ladder.fused else 1].sum())
        if ladder.fused:
            branch_head += key[0] * key[4]
            coached += int(s[3].sum())
    return {"head": head, "agent": agent, "programs": len(seen), "minibatches": minibatches,
            "fused": ladder.fused, "branch_head": branch_head, "coached": coached}
