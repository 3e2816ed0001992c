"""Multi-turn GRPO (docs/reference/paper.md §4.1, Eq 5-6) and FoldGRPO group statistics (docs/reference/paper.md §3.3).

Host side (NumPy, one function per formula):

* turn credits c_t of a trajectory with turn rewards r_0 .. r_{n-1}:
    ``equalized``  c_t = 1                                          (UserRL "Equalized", the default)
    ``r2g``        c_t = sum_{t' >= t} gamma^(t' - t) r_t'          (return-to-go from turn t)
    ``em``         c_t = EM(r_t) = 0.5 + 0.5 (1 - e^(-2 r_t)) / (1 - e^(-2))
* trajectory scores S:
    ``sum``        S = (1/n) sum_t r_t    (the paper calls the mean of the turn rewards "Sum", as UserRL)
    ``r2g``        S = sum_t gamma^t r_t  (the discounted return-to-go from the first turn)
* group normalisation (FoldGRPO): A_i = (S_i - mean_g) / (std_g + eps), the mean and the unbiased std taken
  over the *unique rollout ids* of group g (the first segment seen for each id); a group with a single rollout
  has mean 0 and std 1; ``divide_std=False`` gives A_i = S_i - mean_g.
* turn advantage A_{i,t} = c_{i,t} x A_i; every agent token of turn t gets it.

Device side (JAX):

* Eq 5-6, the clipped surrogate per token with separate lower / upper clip ranges, and its reduction with
  per-token weights that already hold the normaliser (see `loss_token_weights`): the token-mean normaliser is
  the number of agent tokens in the GLOBAL batch (computed on the host before the batch is split into
  micro-batches or devices), so splitting never changes the loss. User, tool and padding tokens have weight 0.
* the decoupled objective of asynchronous RL (AReaL's decoupled PPO; docs/stage2.md "Off-policy correction"):
  three policies per token -- pi_behav (sampled it: the rollout's log-prob), pi_prox (the parameters at the
  update's start: the recomputed old log-prob) and pi_theta (being trained). The clip of Eq 6 is taken against
  pi_prox, and the per-token surrogate is multiplied by the constant weight
  u = min(pi_prox / pi_behav, cap) (`behaviour_weight`, `decoupled_grpo_loss`). With pi_behav = pi_prox
  (synchronous RL) u = 1 and the loss is `grpo_loss` exactly.

Where UserRL's code differs from the paper text, this module follows the paper (docs/reference/paper.md §4.1): UserRL's "Sum"
is the sum (not the mean) of turn rewards, and it rescales the credits of a trajectory so that their token mean
is 1 before multiplying by the normalised score. Neither is done here.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mimesis_jax.config.choices import CREDIT_METHODS, LOSS_AGGS, SCORE_METHODS


def _rewards(turn_rewards, where: str = "turn_rewards") -> np.ndarray:
    r = np.asarray(turn_rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"{where}: expected a 1-D list of per-turn rewards, got shape {r.shape}")
    if not np.all(np.isfinite(r)):
        raise ValueError(f"{where}: non-finite reward in {r.tolist()}")
    return r


# ------------------------------------------------------------------------------------- turn credits
def credits_equalized(turn_rewards) -> np.ndarray:
    """UserRL "Equalized" turn credit (docs/reference/paper.md §4.1): c_t = 1 for every turn."""
    return np.ones_like(_rewards(turn_rewards))


def credits_r2g(turn_rewards, gamma: float) -> np.ndarray:
    """UserRL "R2G" turn credit (docs/reference/paper.md §4.1): c_t = sum_{t' >= t} gamma^(t' - t) r_t'."""
    r = _rewards(turn_rewards)
    out = np.zeros_like(r)
    acc = 0.0
    for t in range(len(r) - 1, -1, -1):
        acc = r[t] + gamma * acc
        out[t] = acc
    return out


def em_map(r) -> np.ndarray:
    """EM(r) = 0.5 + 0.5 (1 - e^(-2r)) / (1 - e^(-2)) (docs/reference/paper.md §4.1); maps [0, 1] onto [0.5, 1]."""
    r = np.asarray(r, dtype=np.float64)
    return 0.5 + 0.5 * (1.0 - np.exp(-2.0 * r)) / (1.0 - math.exp(-2.0))


def credits_em(turn_rewards) -> np.ndarray:
    """UserRL "EM" turn credit (docs/reference/paper.md §4.1): c_t = EM(r_t)."""
    return em_map(_rewards(turn_rewards))


def turn_credits(turn_rewards, method: str = "equalized", gamma: float = 0.8) -> np.ndarray:
    if method == "equalized":
        return credits_equalized(turn_rewards)
    if method == "r2g":
        return credits_r2g(turn_rewards, gamma)
    if method == "em":
        return credits_em(turn_rewards)
    raise ValueError(f"turn credit method must be one of {CREDIT_METHODS}, got {method!r}")


# -------------------------------------------------------------------------------- trajectory scores
def score_sum(turn_rewards) -> float:
    """UserRL "Sum" trajectory score as the paper states it (docs/reference/paper.md §4.1): the mean of the turn rewards."""
    r = _rewards(turn_rewards)
    if len(r) == 0:
        raise ValueError("trajectory score 'sum': a trajectory with no turn rewards has no score")
    return float(r.mean())


def score_r2g(turn_rewards, gamma: float) -> float:
    """UserRL "R2G" trajectory score (docs/reference/paper.md §4.1): the discounted return from the first turn,
    S = sum_t gamma^t r_t (= the r2g credit of turn 0)."""
    r = _rewards(turn_rewards)
    if len(r) == 0:
        raise ValueError("trajectory score 'r2g': a trajectory with no turn rewards has no score")
    return float(np.sum(r * gamma ** np.arange(len(r))))


def trajectory_score(turn_rewards, method: str = "sum", gamma: float = 0.8) -> float:
    if method == "sum":
        return score_sum(turn_rewards)
    if method == "r2g":
        return score_r2g(turn_rewards, gamma)
    raise ValueError(f"trajectory score method must be one of {SCORE_METHODS}, got {method!r}")


# ----------------------------------------------------------------------- group normalisation (FoldGRPO)
def group_advantages(scores, group_ids, rollout_ids=None, *, fold: bool = False, eps: float = 1e-6,
                     divide_std: bool = True) -> np.ndarray:
    """Group-normalised advantages: plain GRPO, or FoldGRPO (docs/reference/paper.md §3.3) with `fold=True`.

    scores[i], group_ids[i], rollout_ids[i] describe segment i (a trajectory, or one fold of a rollout).
    Per group, the statistics use the FIRST segment seen for each rollout id, so a rollout split into k
    segments counts once: mean and unbiased std (ddof=1) over those scores, mean 0 and std 1 when the group
    has a single rollout. A_i = (S_i - mean) / (std + eps), or S_i - mean when divide_std is False.
    Without `fold`, every segment must be its own rollout: a repeated rollout id is an error naming it (two
    dialogues sharing an id would silently collapse into one member of their group's baseline).
    """
    s = np.asarray(scores, dtype=np.float64)
    g = np.asarray(group_ids)
    n = len(s)
    if s.ndim != 1 or g.shape != (n,):
        raise ValueError(f"scores {s.shape} and group_ids {g.shape} must be 1-D of the same length")
    if not np.all(np.isfinite(s)):
        bad = int(np.flatnonzero(~np.isfinite(s))[0])
        raise ValueError(f"scores[{bad}] is not finite ({s[bad]})")
    r = np.arange(n) if rollout_ids is None else np.asarray(rollout_ids)
    if r.shape != (n,):
        raise ValueError(f"rollout_ids {r.shape} must have the length of scores ({n})")
    if not fold and rollout_ids is not None:
        uniq, counts = np.unique(r, return_counts=True)
        if np.any(counts > 1):
            dup = uniq[counts > 1][0].item()
            where = np.flatnonzero(r == dup).tolist()
            raise ValueError(f"rollout id {dup!r} appears {len(where)} times (segments {where}) but no folding was "
                             "asked for: give every dialogue its own rollout id, or pass fold=True (FoldGRPO) when "
                             "segments of one rollout share it")
    stats: dict = {}
    first: dict = {}
    for i in range(n):
        key = (g[i].item(), r[i].item())
        if key not in first:
            first[key] = i
            stats.setdefault(g[i].item(), []).append(s[i])
    mean_std = {}
    for gid, vals in stats.items():
        if len(vals) == 1:
            mean_std[gid] = (0.0, 1.0)
        else:
            v = np.asarray(vals)
            mean_std[gid] = (float(v.mean()), float(v.std(ddof=1)))
    out = np.empty(n, np.float64)
    for i in range(n):
        m, sd = mean_std[g[i].item()]
        out[i] = (s[i] - m) / (sd + eps) if divide_std else s[i] - m
    return out


def group_normalize(scores, group_ids, *, eps: float = 1e-6, divide_std: bool = True) -> np.ndarray:
    """GRPO z-normalisation of trajectory scores within their groups (every score its own rollout)."""
    return group_advantages(scores, group_ids, None, fold=False, eps=eps, divide_std=divide_std)


def turn_advantages(turn_rewards: Sequence[Sequence[float]], group_ids, rollout_ids=None, *,
                    credit: str = "equalized", score: str = "sum", gamma: float = 0.8, eps: float = 1e-6,
                    divide_std: bool = True, fold: bool = False) -> list[np.ndarray]:
    """A_{i,t} = c_{i,t} x normalised S_i for every trajectory i and agent turn t (docs/reference/paper.md §4.1)."""
    scores = []
    for i, r in enumerate(turn_rewards):
        try:
            scores.append(trajectory_score(r, score, gamma))
        except ValueError as e:
            raise ValueError(f"trajectory {i}: {e}") from None
    adv = group_advantages(scores, group_ids, rollout_ids, fold=fold, eps=eps, divide_std=divide_std)
    return [turn_credits(r, credit, gamma) * a for r, a in zip(turn_rewards, adv)]


def trajectory_turn_advantages(trajectories, *, credit: str = "equalized", score: str = "sum",
                               gamma: float = 0.8, eps: float = 1e-6, divide_std: bool = True,
                               fold: bool = False) -> list[np.ndarray]:
    """`turn_advantages` from `data.trajectory.Trajectory` objects (their turn_rewards, group_id, rollout_id).

    An invalid trajectory (simulator refusal, endpoint failure) is an error here: the caller must drop it
    and report it apart (docs/reference/metrics.md) -- it is not a zero score.
    """
    rewards = []
    for i, tr in enumerate(trajectories):
        if tr.status != "ok":
            raise ValueError(f"trajectory {i} has status {tr.status!r} ({tr.invalid_reason}); drop invalid "
                             "trajectories (and report them) before computing advantages")
        if len(tr.turn_rewards) != tr.num_agent_turns:
            raise ValueError(f"trajectory {i}: {len(tr.turn_rewards)} turn rewards for {tr.num_agent_turns} "
                             "agent turns")
        rewards.append(tr.turn_rewards)
    return turn_advantages(rewards, [t.group_id for t in trajectories], [t.rollout_id for t in trajectories],
                           credit=credit, score=score, gamma=gamma, eps=eps, divide_std=divide_std, fold=fold)


# --------------------------------------------------------------------------- loss normaliser (host)
def loss_token_weights(mask: np.ndarray, sequence_ids: np.ndarray, agg: str = "token-mean") -> np.ndarray:
    """Per-token weights that carry the loss normaliser of the GLOBAL batch (computed before splitting).

    mask [..., T]: 1 on the tokens that are trained on (agent tokens), 0 elsewhere (user, tool, padding).
    sequence_ids [..., T]: which sequence (trajectory) each token belongs to (any integers; ignored where
    mask is 0).
      token-mean: w = mask / (number of masked tokens in the whole batch)
      seq-mean:   w = mask / (tokens of that sequence x number of sequences with at least one masked token)
    The loss is then sum(w x per-token loss) over every micro-batch and device: the normaliser is fixed.
    """
    m = np.asarray(mask, np.float64)
    if agg == "token-mean":
        n = m.sum()
        return (m / n if n > 0 else np.zeros_like(m)).astype(np.float32)
    if agg == "seq-mean":
        sid = np.asarray(sequence_ids)
        if sid.shape != m.shape:
            raise ValueError(f"sequence_ids {sid.shape} must have the shape of mask {m.shape}")
        on = m > 0
        uniq, inv, counts = np.unique(sid[on], return_inverse=True, return_counts=True)
        w = np.zeros_like(m)
        w[on] = 1.0 / (counts[inv] * len(uniq))
        return w.astype(np.float32)
    raise ValueError(f"loss aggregation must be one of {LOSS_AGGS}, got {agg!r}")


# ----------------------------------------------------------------------------------- Eq 5-6 (device)
LOG_RATIO_CLAMP = 20.0


def importance_ratio(logp: jax.Array, old_logp: jax.Array) -> jax.Array:
    """Eq 5: rho = pi_theta(y | ...) / pi_old(y | ...) = exp(log pi_theta - log pi_old), per token.

    The log-ratio is clamped to +-LOG_RATIO_CLAMP (20, as verl does) so that a stale or badly mismatched old
    log-prob cannot overflow exp() in fp32; inside that range this is exactly Eq 5.
    """
    return jnp.exp(jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def clipped_surrogate(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, eps_low: float = 0.2,
                      eps_high: float = 0.2) -> tuple[jax.Array, jax.Array]:
    """Eq 6 per token: ( -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), clipped ).

    `clipped` is 1.0 where the clipped term is the one taken and differs from the unclipped one (the clip
    is active), the usual "clip fraction" numerator.
    """
    rho = importance_ratio(logp, old_logp)
    unclipped = -advantages * rho
    clipped = -advantages * jnp.clip(rho, 1.0 - eps_low, 1.0 + eps_high)
    return jnp.maximum(unclipped, clipped), (clipped > unclipped).astype(jnp.float32)


def grpo_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, weights: jax.Array,
              eps_low: float = 0.2, eps_high: float = 0.2) -> tuple[jax.Array, jax.Array]:
    """Eq 6: L_GRPO = sum_tokens weights x (-min(rho A, clip(rho) A)); returns (loss, per-token clipped).

    `weights` come from `loss_token_weights` (zero on non-agent tokens, the global normaliser folded in).
    Where a weight is 0 the per-token term is masked before the sum (also guarding against inf x 0).
    """
    on = weights != 0
    logp = jnp.where(on, logp, 0.0)  # masked tokens: rho = 1, so no inf/nan can reach the gradient
    old_logp = jnp.where(on, old_logp, 0.0)
    per_tok, clipped = clipped_surrogate(logp, old_logp, advantages, eps_low, eps_high)
    return jnp.sum(weights * per_tok), clipped * on


# ------------------------------------------------------------------------ decoupled objective (device)
def behaviour_weight(prox_logp: jax.Array, behav_logp: jax.Array, cap: float) -> tuple[jax.Array, jax.Array]:
    """The behaviour -> proximal importance weight per token, truncated: (u, capped) with
    u = min(pi_prox / pi_behav, cap) = min(exp(log pi_prox - log pi_behav), cap), and capped = 1.0 where
    pi_prox / pi_behav > cap (the truncation changed the weight).

    Both log-probs are constants of the update (no gradient flows through u). The log-ratio is clamped to
    +-LOG_RATIO_CLAMP before exp() as in `importance_ratio`; cap (>= 1) is below e^20, so the clamp never
    changes a weight the cap lets through.
    """
    log_u = jax.lax.stop_gradient(prox_logp - behav_logp)
    raw = jnp.exp(jnp.clip(log_u, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return jnp.minimum(raw, cap), (raw > cap).astype(jnp.float32)


def decoupled_grpo_loss(logp: jax.Array, prox_logp: jax.Array, behav_logp: jax.Array, advantages: jax.Array,
                        weights: jax.Array, cap: float, eps_low: float = 0.2,
                        eps_high: float = 0.2) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The decoupled Eq 6: L = sum_tokens weights x u x (-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)), with
    r = pi_theta / pi_prox (the clip against the proximal policy) and u = min(pi_prox / pi_behav, cap)
    (`behaviour_weight`). Returns (loss, per-token clipped, per-token capped), both masks zero off the tokens of
    nonzero weight. Masked tokens are zeroed before the ratios as in `grpo_loss`; with behav_logp == prox_logp
    and cap >= 1 every u is 1 and the loss is `grpo_loss(logp, prox_logp, ...)`.
    """
    on = weights != 0
    logp = jnp.where(on, logp, 0.0)
    prox_logp = jnp.where(on, prox_logp, 0.0)
    behav_logp = jnp.where(on, behav_logp, 0.0)
    per_tok, clipped = clipped_surrogate(logp, prox_logp, advantages, eps_low, eps_high)
    u, capped = behaviour_weight(prox_logp, behav_logp, cap)
    return jnp.sum(weights * u * per_tok), clipped * on, capped * on
