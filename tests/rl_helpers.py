"""Random dialogues and tiny models shared by the GRPO / CSD / agent-RL step tests."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from mimesis_jax.models.config import ModelConfig
from mimesis_jax.data.trajectory import Segment, Trajectory


def tiny_config(**kw) -> ModelConfig:
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, rope_theta=10000.0, logits_seq_chunk=16, logits_vocab_chunk=40)
    base.update(kw)
    return ModelConfig(**base)


def random_trajectory(rng: np.random.RandomState, vocab: int, n_turns: int, *, coach_prob: float = 0.6,
                      group_id: int = 0, rollout_id: int = 0, max_len: int = 8) -> Trajectory:
    """System prompt, then per turn: user/tool text, optional coach note, assistant header, agent reply."""
    def toks(lo, hi):
        return rng.randint(1, vocab, size=rng.randint(lo, hi + 1)).tolist()

    segs = [Segment("public", toks(2, 10))]
    for t in range(n_turns):
        segs.append(Segment("public", toks(1, max_len)))
        if rng.rand() < coach_prob:
            segs.append(Segment("coach", toks(1, 6)))
        segs.append(Segment("public", toks(1, 3)))
        reply = toks(1, max_len)
        segs.append(Segment("agent", reply, logprobs=(-rng.rand(len(reply)) * 3).tolist()))
    return Trajectory(segs, turn_rewards=rng.rand(n_turns).round(2).tolist(), group_id=group_id,
                      rollout_id=rollout_id)


def scaled_params(config: ModelConfig, seed: int = 0, scale: float = 5.0):
    """Random parameters with matrices scaled up (std 0.1) so that log-probs vary by O(1) between tokens and
    a coach note visibly moves the teacher away from the student; norms stay at 1. Fresh device buffers on
    every call (safe to donate); the values depend only on the architecture, the seed and the scale."""
    import jax
    import jax.numpy as jnp

    arch = config.replace(remat="none", scan_layers=True)
    return jax.tree.map(jnp.asarray, _host_params(arch, seed, scale))


@functools.lru_cache(maxsize=8)
def _host_params(config: ModelConfig, seed: int, scale: float):
    import jax

    from mimesis_jax import models

    params = models.init_params(config, jax.random.PRNGKey(seed))

    def f(path, x):
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        return np.asarray(x if "norm" in name else x * scale)

    return jax.tree_util.tree_map_with_path(f, params)


def random_batch(seed: int, vocab: int, turns, **kw) -> list[Trajectory]:
    rng = np.random.RandomState(seed)
    return [random_trajectory(rng, vocab, n, group_id=i % 2, rollout_id=i, **kw) for i, n in enumerate(turns)]


def tree_rel_err(a, b) -> float:
    """max over leaves of max|a - b| / max|b| (a relative error that ignores tiny leaves' noise floors)."""
    import jax

    errs = jax.tree.map(lambda x, y: float(np.abs(np.asarray(x) - np.asarray(y)).max()
                                           / max(np.abs(np.asarray(y)).max(), 1e-30)), a, b)
    return max(jax.tree.leaves(errs))


def jaxpr_dims(jaxpr) -> set:
    """Every dimension size of every value in `jaxpr`, nested jaxprs (scan, cond, custom_vjp, ...) included."""
    dims = set()
    for eqn in jaxpr.eqns:
        for v in list(eqn.invars) + list(eqn.outvars):
            dims.update(getattr(getattr(v, "aval", None), "shape", ()))
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (tuple, list)) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    dims |= jaxpr_dims(inner)
    return dims


def loop_carry_float_dtypes(jaxpr) -> list[str]:
    """The dtypes of every floating-point loop carry (while / fori_loop / scan) in a jaxpr, recursing into
    sub-jaxprs (pjit, custom_vjp, cond, pallas_call kernels): the online-softmax accumulators of an attention
    kernel are such carries, so a bf16 accumulator shows up here as 'bfloat16'."""
    out: list[str] = []
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        name, params = eqn.primitive.name, eqn.params
        carries = []
        if name == "while":
            body = params["body_jaxpr"].jaxpr
            carries = body.invars[params["body_nconsts"]:]
        elif name == "scan":
            body = params["jaxpr"].jaxpr
            carries = body.invars[params["num_consts"]:params["num_consts"] + params["num_carry"]]
        for v in carries:
            dt = getattr(v.aval, "dtype", None)
            if dt is not None and jnp.issubdtype(dt, jnp.floating):  # bfloat16 is not a NumPy floating type
                out.append(str(dt))
        for p in params.values():
            for sub in (p if isinstance(p, (tuple, list)) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    out += loop_carry_float_dtypes(inner)
    return out


def np_causal_attention(q, k, v):
    """Causal GQA attention of one segment per row in float64 NumPy (q [B, T, H, D], k/v [B, T, KVH, D], scale
    1/sqrt(D)): the output [B, T, H, D] and the log-sum-exp [B, T, H]."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    T, H, D = q.shape[1], q.shape[2], q.shape[3]
    k, v = np.repeat(k, H // k.shape[2], 2), np.repeat(v, H // v.shape[2], 2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p / l, v), (m + np.log(l))[..., 0].transpose(0, 2, 1)


def check_bf16_long_attention(impl: str) -> None:
    """bf16 q/k/v at T = 1024 (64 key blocks of 16 per late query): the output's mean error against a float64
    NumPy reference on the same bf16-rounded inputs stays at the fp32-accumulation level (measured 1.5e-4: the
    bf16 rounding of p and of the output), well under what a bf16 output accumulator gives (3.8e-4 measured);
    lse within 1e-5 (6e-7 measured; a bf16 running sum is off by ~1e-3). Every float loop carry of the forward and
    backward programs (m, l, acc; dq, dk, dv) is float32 in the jaxpr."""
    import jax
    import jax.numpy as jnp

    from mimesis_jax.models.attention import attend
    from mimesis_jax.models.masks import causal_spec

    B, T, H, KVH, Dh = 1, 1024, 2, 1, 16
    rng = np.random.RandomState(0)
    q, k, v = (jnp.asarray(rng.randn(*s), jnp.bfloat16) for s in ((B, T, H, Dh), (B, T, KVH, Dh), (B, T, KVH, Dh)))
    spec = causal_spec(jnp.ones((B, T), jnp.int32))

    def run(q, k, v):
        return attend(q, k, v, spec, impl=impl, return_lse=True, block_q=64, block_k=16)

    o, lse = jax.jit(run)(q, k, v)
    ref_o, ref_lse = np_causal_attention(q, k, v)
    err = np.abs(np.asarray(o, np.float64) - ref_o)
    assert err.mean() < 2e-4, err.mean()
    assert np.abs(np.asarray(lse, np.float64) - ref_lse).max() < 1e-5

    def loss(q, k, v):
        o, lse = run(q, k, v)
        return jnp.sum(o.astype(jnp.float32) ** 2) + jnp.sum(lse)

    carries = loop_carry_float_dtypes(jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v))
    assert len(carries) >= 6 and set(carries) == {"float32"}, carries  # m, l, acc; dq; dk, dv at least


class ScriptedDraws:
    """Mixin for a scripted RL stage over train/rl/learner.RLLearner (`class S(ScriptedDraws, RLLearner)`): the
    data sampler is a counter of draws (checkpointed as the sampler state, so a resume continues it), the policy
    turn is 8 tokens, and advantages alternate (+0.5, -0.25) / (-0.5, +0.25) by rollout id. Subclasses give
    `rollouts` (and may replace `filter_groups`, `record`, `banner`)."""

    stage, policy_name = "scripted", "agent"

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.drawn = 0

    def restore(self, data_state):
        self.drawn = data_state["sampler"]["drawn"]

    def data_state(self):
        return {"sampler": {"drawn": self.drawn}}

    def policy_max_tokens(self):
        return 8

    def banner(self, start):
        return ""

    def draw(self, n):
        self.drawn += 1
        return list(range(n))

    def filter_groups(self, outs):
        return outs, {}

    def advantages(self, items, counts):
        return items, [[0.5, -0.25] if t.rollout_id % 2 else [-0.5, 0.25] for t in items]

    def record(self, outs, kept, counts, times):
        return {}
