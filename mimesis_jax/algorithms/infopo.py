"""InfoPO turn credit: the Stage II baseline of docs/reference/paper.md §4.3 ("turn-level credit from the information gain between
the follow-up behaviour with the feedback masked and observed; trained with the same MIMESIS-9B user").

The paper gives that one sentence and no formula. This module fixes the definition as follows (InfoPO, Kong et al.
2026, arXiv:2603.00656, is followed where the MIMESIS paper is silent; every other choice is marked *ours*).

**Feedback.** Take the student view of a trajectory (every non-coach segment; a CSD coach note never enters the
IG) with agent turns y_0 .. y_{n-1}. For t < n - 1 the feedback f_t of turn t is every token after y_t and before
the assistant header of turn t + 1 (the public segment right before y_{t+1}). For trajectories of the episode runner
(episodes/agent.py) that is the closing of turn t (``\\n``, or ``<|im_end|>\\n`` after a truncated reply), the tool
response (environment feedback + reward) and, when the user was addressed, the user's utterance turn.

**Information gain of turn t** (per-token mean; InfoPO's choice, so turns of different lengths are comparable):

    IG_t = (1 / |y_{t+1}|) sum_k [ log pi_T(y_{t+1,k} | H_t, y_t, f_t,  h_{t+1}, y_{t+1,<k})
                                 - log pi_T(y_{t+1,k} | H_t, y_t, PH,   h_{t+1}, y_{t+1,<k}) ]

with H_t everything before y_t (earlier feedback stays observed: only f_t is masked), h_{t+1} the assistant header
of turn t + 1, PH a fixed placeholder token sequence that replaces f_t (`placeholder_tokens`: the closing newline
then a tool turn saying `PLACEHOLDER_TEXT`; *ours*: InfoPO overwrites the observation with a fixed text cut or padded
to the observation's length, we keep the chat layout instead), and pi_T = softmax(logits / T) of the CURRENT
(pre-update) parameters at the rollout temperature T = RLConfig.temperature (the policy that sampled y). The log-
ratio at the sampled tokens is a one-sample estimate of KL(pi(. | f_t) || pi(. | PH)) over y_{t+1}, InfoPO's
information gain. IG_t is credited to turn t, the action that elicited f_t (InfoPO's attribution), not to y_{t+1}.

*Undefined* (NaN here, no intrinsic credit): the last turn (no follow-up), a turn whose feedback span is empty, and
a turn whose follow-up y_{t+1} has no tokens.

**Turn advantage** (InfoPO's fusion, simplified; `infopo_advantages`):

    A_{i,t} = A_i + coef * g_{G(i)} * Z_{i,t}

* A_i: the multi-turn GRPO advantage of Eq 5-6's setting with the equalized credit (c_t = 1, as InfoPO's runs) and
  the configured trajectory score: (S_i - mean_G) / (std_G + eps), grpo.trajectory_turn_advantages;
* Z_{i,t}: IG_{i,t} normalised within its GRPO group G: (IG - mean) / (std + eps) over every defined IG of every
  turn of every trajectory of G (each turn counts once; InfoPO pools tokens, *ours*: turns), unbiased std; only
  centred when divide_std is False; 0 where IG is undefined and for a whole group with fewer than two defined IGs
  (no baseline);
* g_G = sigmoid(-std_G(S) / tau): the variance gate (std_G(S) the group's unbiased trajectory-score std, the GRPO
  normaliser; 1 for a one-rollout group as in grpo.group_advantages). A group whose outcomes tie (std 0) gets
  g = 1/2 and the information term carries its signal; a group with clearly different outcomes g -> 0. tau = 0
  turns the gate off (g = 1). InfoPO's extra magnitude cap on the intrinsic term is left out: Z is already
  z-normalised.
* coef = RLConfig.infopo_coef (InfoPO's beta_0, 0.5 by default), tau = RLConfig.infopo_gate_tau (0.05 by default).

**Cost.** One extra no-gradient scoring pass per step (`rl_step_scorer`: the update's own old-log-prob pass,
RLStep.recompute_old_logprobs, on packed rows): the observed trajectories once, plus one masked sequence per defined
turn, cut after y_{t+1} -- at most n - 1 sequences per trajectory, each shorter than the trajectory, scored in calls
of at most `max_per_call` sequences.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from mimesis_jax.algorithms import grpo
from mimesis_jax.algorithms.rl_batch import pack_trajectories, unpack_turns
from mimesis_jax.data.chat import render_turn
from mimesis_jax.data.trajectory import Segment, Trajectory

PLACEHOLDER_TEXT = "(the feedback to this turn is hidden)"

ScoreFn = Callable[[Sequence[Trajectory]], list]  # trajectories -> per trajectory, per agent turn, log-probs


def placeholder_tokens(tok) -> list[int]:
    """PH: the closing newline of the agent's turn, then a tool turn whose content is `PLACEHOLDER_TEXT`, rendered
    with the agent's chat template (data.chat.render_turn), so the masked context keeps the chat layout."""
    return list(tok.encode("\n")) + list(render_turn(tok, {"role": "tool", "content": PLACEHOLDER_TEXT}).ids)


def masked_followups(trajectory: Trajectory, placeholder: Sequence[int]) -> list[tuple[int, list[int], list[int]]]:
    """The counterfactual contexts of one trajectory: [(t, context, y_{t+1})] for every turn t with a defined IG.

    context = student tokens before f_t + placeholder + the header of turn t + 1 (the tokens y_{t+1} is predicted
    after, with f_t masked); see the module docstring for f_t and when IG_t is undefined.
    """
    if not placeholder:
        raise ValueError("the InfoPO placeholder is empty: f_t must be replaced by a fixed, non-empty sequence")
    segs = trajectory.student_segments()
    starts, pos = [], 0
    for s in segs:
        starts.append(pos)
        pos += len(s.tokens)
    tokens = trajectory.student_tokens()
    agents = [i for i, s in enumerate(segs) if s.kind == "agent"]
    out = []
    for t in range(len(agents) - 1):
        a, b = agents[t], agents[t + 1]
        if b - a < 2:  # no header segment between y_t and y_{t+1}: nothing to mask
            continue
        f_start, f_end = starts[a + 1], starts[b - 1]  # f_t: after y_t, before the header of turn t + 1
        follow = segs[b].tokens
        if f_end == f_start or not follow:
            continue
        context = tokens[:f_start] + list(placeholder) + tokens[f_end:starts[b]]
        out.append((t, context, list(follow)))
    return out


def information_gains(trajectories: Sequence[Trajectory], score_fn: ScoreFn, placeholder: Sequence[int]
                      ) -> list[np.ndarray]:
    """IG_t of every agent turn of every trajectory (float64 [n_turns], NaN where undefined), from two scoring
    passes through `score_fn` (e.g. `rl_step_scorer`): the trajectories as they are (observed f_t) and one
    two-segment trajectory (context public, y_{t+1} agent) per defined turn (f_t masked)."""
    plans, masked = [], []
    for i, tr in enumerate(trajectories):
        try:
            items = masked_followups(tr, placeholder)
        except ValueError as e:
            raise ValueError(f"trajectory {i}: {e}") from None
        plans.append([(t, len(masked) + k) for k, (t, _, _) in enumerate(items)])
        masked += [Trajectory([Segment("public", ctx), Segment("agent", y)]) for _, ctx, y in items]
    observed = score_fn(trajectories)
    cf = score_fn(masked) if masked else []
    out = []
    for tr, obs, plan in zip(trajectories, observed, plans):
        ig = np.full(tr.num_agent_turns, np.nan)
        for t, k in plan:
            o, m = np.asarray(obs[t + 1], np.float64), np.asarray(cf[k][0], np.float64)
            ig[t] = float(np.mean(o - m))
        out.append(ig)
    return out


def rl_step_scorer(step_fn, params, *, row_len: int | None = None, max_per_call: int | None = None) -> ScoreFn:
    """`score_fn` for `information_gains` through the update's own scoring pass: the trajectories are packed
    (algorithms/rl_batch.py, student rows only), placed like a training batch (`step_fn.place`) and scored by
    `step_fn.recompute_old_logprobs(params, .)` -- log pi_T at RLConfig.temperature with `params`, sharded on the
    step's mesh. At most `max_per_call` trajectories per call (None: all at once); row_len fixes the row length
    when every sequence of the call fits it (else the packer's bucket of the longest)."""
    def score(trajs: Sequence[Trajectory]) -> list:
        n = len(trajs) if not max_per_call else int(max_per_call)
        out = []
        for i in range(0, len(trajs), n):
            part = trajs[i:i + n]
            longest = max(len(t.student_tokens()) for t in part)
            packed = pack_trajectories(part, teacher="none", use_rollout_logprobs=False,
                                       rows_multiple=step_fn.rows_multiple(),
                                       row_len=row_len if row_len and longest <= row_len else None)
            batch = step_fn.place(packed.microbatches(step_fn.rl.num_microbatches))
            lp = np.asarray(step_fn.recompute_old_logprobs(params, batch)["old_logp"])
            out += unpack_turns(packed, lp)
        return out
    return score


# ------------------------------------------------------------------------------------- the turn advantage
def normalized_gains(igs: Sequence[np.ndarray], group_ids: Sequence, *, eps: float = 1e-6,
                     divide_std: bool = True) -> list[np.ndarray]:
    """Z_{i,t}: IG normalised over the defined IGs of its trajectory's group (module docstring); 0 elsewhere."""
    pooled: dict = {}
    for ig, g in zip(igs, group_ids):
        pooled.setdefault(g, []).extend(np.asarray(ig, np.float64)[np.isfinite(ig)].tolist())
    stats = {g: (float(np.mean(v)), float(np.std(v, ddof=1))) for g, v in pooled.items() if len(v) >= 2}
    out = []
    for ig, g in zip(igs, group_ids):
        ig = np.asarray(ig, np.float64)
        z = np.zeros_like(ig)
        if g in stats:
            m, sd = stats[g]
            on = np.isfinite(ig)
            z[on] = (ig[on] - m) / (sd + eps) if divide_std else ig[on] - m
        out.append(z)
    return out


def variance_gates(scores: Sequence[float], group_ids: Sequence, tau: float) -> list[float]:
    """g per trajectory: sigmoid(-std_G(S) / tau) of its group's unbiased score std (1 for a one-member group);
    1 everywhere when tau == 0 (no gate)."""
    if tau < 0:
        raise ValueError(f"InfoPO gate temperature must be >= 0, got {tau}")
    groups: dict = {}
    for s, g in zip(scores, group_ids):
        groups.setdefault(g, []).append(float(s))
    sd = {g: float(np.std(v, ddof=1)) if len(v) > 1 else 1.0 for g, v in groups.items()}
    if tau == 0:
        return [1.0] * len(scores)
    return [math.exp(-sd[g] / tau) / (1.0 + math.exp(-sd[g] / tau)) for g in group_ids]  # sd >= 0: no overflow


def infopo_advantages(trajectories: Sequence[Trajectory], igs: Sequence[np.ndarray], *, coef: float,
                      gate_tau: float, score: str = "sum", gamma: float = 0.8, eps: float = 1e-6,
                      divide_std: bool = True) -> list[np.ndarray]:
    """A_{i,t} = A_i + coef * g_{G(i)} * Z_{i,t} for every agent turn (module docstring), ready for packing."""
    if len(igs) != len(trajectories):
        raise ValueError(f"{len(igs)} information-gain lists for {len(trajectories)} trajectories")
    for i, (tr, ig) in enumerate(zip(trajectories, igs)):
        if len(ig) != tr.num_agent_turns:
            raise ValueError(f"trajectory {i}: {len(ig)} information gains for {tr.num_agent_turns} agent turns")
    base = grpo.trajectory_turn_advantages(trajectories, credit="equalized", score=score, gamma=gamma, eps=eps,
                                           divide_std=divide_std)
    gids = [t.group_id for t in trajectories]
    z = normalized_gains(igs, gids, eps=eps, divide_std=divide_std)
    gates = variance_gates([grpo.trajectory_score(t.turn_rewards, score, gamma) for t in trajectories], gids,
                           gate_tau)
    return [b + coef * g * zi for b, g, zi in zip(base, gates, z)]
