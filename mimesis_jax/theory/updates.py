"""The policy updates the theory lab compares (docs/reference/paper.md §7, Appendix E).

* Proposition E.1's weighted-likelihood problem, per state s: maximise F(q) = sum_a p(a) w(a) log q(a) over the
  simplex. `closed_form_update` is the proposition's answer p+ = p w / Z (p kept where Z = 0);
  `maximise_weighted_likelihood` finds the maximiser numerically, without using that answer (Newton's method
  on softmax logits), so the two can be compared.
* `covariance`: Cov_{a~p}(w, A) per state, the quantity Proposition E.1 ties the improvement to.
* `AdamW`: decoupled weight decay Adam (the optimiser of the paper's runs), as ascent on an objective, in a
  few lines of NumPy so that one optimiser state can be copied and continued along two arms.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


def closed_form_update(p: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Proposition E.1: p+(a|s) = p(a|s) w(s,a) / Z(s), Z(s) = E_{a~p} w(s,a); p+ = p where Z(s) = 0.

    p, w: [..., n_actions] with w >= 0. Returns p+ of the same shape.
    """
    if np.any(w < 0):
        raise ValueError("Proposition E.1 needs non-negative weights w(s, a)")
    Z = np.sum(p * w, axis=-1, keepdims=True)
    return np.where(Z > 0, p * w / np.where(Z > 0, Z, 1.0), p)


def weighted_log_likelihood(q: np.ndarray, p: np.ndarray, w: np.ndarray) -> np.ndarray:
    """F(q) = sum_a p(a) w(a) log q(a), per state (the objective Proposition E.1 maximises)."""
    c = p * w
    with np.errstate(divide="ignore", invalid="ignore"):  # log 0 = -inf counts only where c > 0
        return np.sum(np.where(c > 0, c * np.log(q), 0.0), axis=-1)


def maximise_weighted_likelihood(p: np.ndarray, w: np.ndarray, *, iters: int = 100,
                                 tol: float = 1e-14) -> np.ndarray:
    """Numerical argmax of F(q) = c . log q over the simplex, c = p w > 0 (one state, 1-D arrays).

    q = softmax(z) with z[-1] = 0 (the free logits z[:-1]); F(z) = c . z - Z logsumexp(z) is strictly concave
    in the free logits. Damped Newton from the uniform distribution: gradient c - Z q, Hessian
    -Z (diag(q) - q q^T) on the free coordinates; steps are halved until F increases while the Newton
    decrement is above 1e-8 (below it the full step is taken: F's rounding then exceeds its change).
    Stops when the gradient norm falls below tol.
    """
    c = np.asarray(p, np.float64) * np.asarray(w, np.float64)
    if c.ndim != 1 or np.any(c <= 0):
        raise ValueError("maximise_weighted_likelihood needs one state with p(a) w(a) > 0 for every action")
    Z = c.sum()

    def objective(z):
        return float(c @ z - Z * (z.max() + np.log(np.sum(np.exp(z - z.max())))))

    z = np.zeros_like(c)
    for _ in range(iters):
        q = np.exp(z - z.max())
        q /= q.sum()
        grad = (c - Z * q)[:-1]
        if np.linalg.norm(grad) < tol:
            break
        hess = Z * (np.diag(q[:-1]) - np.outer(q[:-1], q[:-1]))
        step = np.append(np.linalg.solve(hess, grad), 0.0)
        t = 1.0
        if grad @ step[:-1] > 1e-8:  # outside the quadratic region (Newton decrement): halve until F increases
            f0 = objective(z)
            while t > 1e-12 and objective(z + t * step) < f0:
                t *= 0.5
        z = z + t * step
    q = np.exp(z - z.max())
    return q / q.sum()


def covariance(p: np.ndarray, w: np.ndarray, A: np.ndarray) -> np.ndarray:
    """Cov_{a~p}(w, A) = E_p[w A] - E_p[w] E_p[A], per state (last axis = actions)."""
    return np.sum(p * w * A, axis=-1) - np.sum(p * w, axis=-1) * np.sum(p * A, axis=-1)


@dataclass(frozen=True)
class AdamWState:
    """Step count t and the first/second moment estimates m, v."""

    t: int
    m: np.ndarray
    v: np.ndarray


@dataclass(frozen=True)
class AdamW:
    """AdamW (decoupled weight decay) taking ASCENT directions: loss gradient = -direction.

    m <- b1 m + (1 - b1) g, v <- b2 v + (1 - b2) g^2, theta <- theta - lr (m_hat / (sqrt(v_hat) + eps)
    + wd theta), with g = -direction and bias-corrected m_hat, v_hat (as optax.adamw).
    """

    lr: float
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def init(self, theta: np.ndarray) -> AdamWState:
        return AdamWState(t=0, m=np.zeros_like(theta), v=np.zeros_like(theta))

    def step(self, theta: np.ndarray, direction: np.ndarray, state: AdamWState) -> tuple[np.ndarray, AdamWState]:
        g = -direction
        t = state.t + 1
        m = self.b1 * state.m + (1 - self.b1) * g
        v = self.b2 * state.v + (1 - self.b2) * g * g
        m_hat, v_hat = m / (1 - self.b1 ** t), v / (1 - self.b2 ** t)
        theta = theta - self.lr * (m_hat / (np.sqrt(v_hat) + self.eps) + self.weight_decay * theta)
        return theta, replace(state, t=t, m=m, v=v)
