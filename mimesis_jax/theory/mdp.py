"""Small finite-horizon MDPs for the theory lab (docs/reference/paper.md §7, Appendix E), evaluated exactly.

The paper's setting: a fixed simulator and task distribution, states s = the public history (with the current
token prefix), actions a = the next token, finitely many tokens, a finite horizon and bounded reward. A
finite-horizon MDP with time-indexed states and full-support policies is that setting in miniature: state
(h, s) at step h, action a, reward R[h, s, a] in [0, 1], transition P[h, s, a, s'], initial distribution mu0.

Everything here is NumPy, float64, and exact: returns, Q, V and advantages by backward dynamic programming,
state visitation by forward propagation, tabular-softmax policy gradients in closed form. `enumerate_return`
sums over every trajectory (a brute-force check of the DP). `sample_group` is the only Monte Carlo piece: it
draws GRPO groups of complete episodes from a policy.

Shapes: policy pi[h, s, a]; tabular softmax logits theta[h, s, a]; V[h, s] (V[H] = 0); Q and A [h, s, a];
visitation d[h, s] (d[0] = mu0, each d[h] sums to 1).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FiniteMDP:
    """P[h, s, a, s'] transition probabilities, R[h, s, a] rewards, mu0[s] initial distribution."""

    P: np.ndarray
    R: np.ndarray
    mu0: np.ndarray

    @property
    def horizon(self) -> int:
        return self.R.shape[0]

    @property
    def n_states(self) -> int:
        return self.R.shape[1]

    @property
    def n_actions(self) -> int:
        return self.R.shape[2]


def random_mdp(rng: np.random.Generator, n_states: int, n_actions: int, horizon: int, *,
               binary_final_reward: bool = False) -> FiniteMDP:
    """A random MDP: Dirichlet(1) transitions and initial distribution, uniform [0, 1] rewards.

    With `binary_final_reward` only the last step pays, 0 or 1 (a task-success reward, as in the gyms),
    so a GRPO group can end with every reward equal.
    """
    P = rng.dirichlet(np.ones(n_states), size=(horizon, n_states, n_actions))
    if binary_final_reward:
        R = np.zeros((horizon, n_states, n_actions))
        R[-1] = rng.integers(0, 2, size=(n_states, n_actions)).astype(np.float64)
    else:
        R = rng.uniform(0.0, 1.0, size=(horizon, n_states, n_actions))
    mu0 = rng.dirichlet(np.ones(n_states))
    return FiniteMDP(P=P, R=R, mu0=mu0)


def softmax(theta: np.ndarray) -> np.ndarray:
    """Tabular softmax policy pi[h, s, a] from logits theta[h, s, a] (normalised over the last axis)."""
    z = theta - theta.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def random_policy(rng: np.random.Generator, mdp: FiniteMDP, scale: float = 1.0) -> np.ndarray:
    """A full-support policy: softmax of N(0, scale^2) logits."""
    return softmax(scale * rng.standard_normal(mdp.R.shape))


@dataclass(frozen=True)
class Evaluation:
    """Exact values of a policy: V[h, s] (with V[H] = 0), Q[h, s, a], A = Q - V, J = mu0 . V[0]."""

    V: np.ndarray
    Q: np.ndarray
    A: np.ndarray
    J: float


def evaluate(mdp: FiniteMDP, pi: np.ndarray) -> Evaluation:
    """Backward dynamic programming: Q_h = R_h + P_h V_{h+1}, V_h = E_{a~pi_h} Q_h, A_h = Q_h - V_h."""
    H, S, _ = mdp.R.shape
    V = np.zeros((H + 1, S))
    Q = np.zeros_like(mdp.R)
    for h in range(H - 1, -1, -1):
        Q[h] = mdp.R[h] + mdp.P[h] @ V[h + 1]
        V[h] = np.sum(pi[h] * Q[h], axis=-1)
    return Evaluation(V=V, Q=Q, A=Q - V[:H, :, None], J=float(mdp.mu0 @ V[0]))


def visitation(mdp: FiniteMDP, pi: np.ndarray) -> np.ndarray:
    """d[h, s] = Pr(s_h = s) under pi, by forward propagation from mu0."""
    H, S, _ = mdp.R.shape
    d = np.zeros((H, S))
    d[0] = mdp.mu0
    for h in range(H - 1):
        d[h + 1] = np.einsum("s,sa,sat->t", d[h], pi[h], mdp.P[h])
    return d


def enumerate_return(mdp: FiniteMDP, pi: np.ndarray) -> float:
    """J(pi) as the probability-weighted sum over every trajectory (s_0, a_0, ..., s_{H-1}, a_{H-1}).

    Exponential in H: for checking `evaluate` on tiny MDPs only.
    """
    H, S, A = mdp.R.shape
    total = 0.0
    for traj in itertools.product(range(S), range(A), repeat=H):
        prob, ret = 1.0, 0.0
        for h in range(H):
            s, a = traj[2 * h], traj[2 * h + 1]
            prob *= (mdp.mu0[s] if h == 0 else mdp.P[h - 1, traj[2 * h - 2], traj[2 * h - 1], s]) * pi[h, s, a]
            ret += mdp.R[h, s, a]
        total += prob * ret
    return total


def weighted_direction(pi: np.ndarray, d: np.ndarray, u: np.ndarray) -> np.ndarray:
    """sum_{h,s,a} d[h,s] pi[h,s,a] u[h,s,a] grad_theta log pi[h,s,a] for tabular softmax logits theta.

    grad_theta[h,s,:] log pi[h,s,a] = onehot(a) - pi[h,s,:], so the component at (h, s, a) is
    d[h,s] pi[h,s,a] (u[h,s,a] - E_{a'~pi} u[h,s,a']): the per-state centring comes for free.
    With u = A^pi this is the exact return gradient (policy-gradient theorem); with u = w the exact CSD
    ascent direction of Theorem E.2.
    """
    centred = u - np.sum(pi * u, axis=-1, keepdims=True)
    return d[..., None] * pi * centred


def return_gradient(mdp: FiniteMDP, theta: np.ndarray) -> np.ndarray:
    """dJ/dtheta for tabular softmax logits: d[h,s] pi[h,s,a] A^pi[h,s,a]."""
    pi = softmax(theta)
    return weighted_direction(pi, visitation(mdp, pi), evaluate(mdp, pi).A)


def score_gradient_bound(pi: np.ndarray) -> float:
    """S = max_{h,s,a} ||grad_theta log pi[h,s,a]||_2 = max ||onehot(a) - pi[h,s,:]||_2 (Theorem E.2's S)."""
    sq = np.sum(pi ** 2, axis=-1, keepdims=True) - 2.0 * pi + 1.0
    return float(np.sqrt(sq.max()))


@dataclass(frozen=True)
class Group:
    """G complete episodes from one initial state: states[i, h], actions[i, h], returns[i]."""

    states: np.ndarray
    actions: np.ndarray
    returns: np.ndarray


def sample_group(rng: np.random.Generator, mdp: FiniteMDP, pi: np.ndarray, s0: int, size: int) -> Group:
    """Monte Carlo: `size` episodes of pi from initial state s0 (a GRPO group shares its task)."""
    H, S, A = mdp.R.shape
    states = np.zeros((size, H), np.int64)
    actions = np.zeros((size, H), np.int64)
    returns = np.zeros(size)
    s = np.full(size, s0)
    for h in range(H):
        a = _draw(rng, pi[h, s])
        states[:, h], actions[:, h] = s, a
        returns += mdp.R[h, s, a]
        if h + 1 < H:
            s = _draw(rng, mdp.P[h, s, a])
    return Group(states=states, actions=actions, returns=returns)


def _draw(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One categorical draw per row of probs [n, k] (inverse CDF of one uniform per row)."""
    u = rng.uniform(size=(probs.shape[0], 1))
    idx = np.sum(np.cumsum(probs, axis=-1) < u, axis=-1)
    return np.minimum(idx, probs.shape[-1] - 1)


def group_direction(pi: np.ndarray, groups: list[Group], weights: list[np.ndarray]) -> np.ndarray:
    """Token-mean sampled direction (1 / #actions) sum_{i,h} weights[i, h] grad_theta log pi[h, s_ih, a_ih].

    weights[g][i, h] is the per-action weight of episode i of group g: a GRPO advantage broadcast over the
    episode's turns (Eq 6 with equalized credit, on-policy so rho = 1), or a centred CSD weight.
    """
    out = np.zeros_like(pi)
    H = pi.shape[0]
    n = 0
    for grp, wt in zip(groups, weights):
        for h in range(H):
            s, a, c = grp.states[:, h], grp.actions[:, h], wt[:, h]
            np.add.at(out[h], (s, a), c)
            np.add.at(out[h], s, -c[:, None] * pi[h, s])
            n += len(s)
    return out / n
